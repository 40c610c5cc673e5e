r"""Learning curves of a run as PNG files, from what the trainer writes in its workdir.

    paths = plot_run("runs/demo/igpo")        # -> runs/demo/igpo/plots/reward.png, ...
    paths = plot_runs(["runs/igpo", "runs/grpo"], "runs/plots")   # the runs overlaid
    python launch/plot.py --workdir=runs/demo/igpo --workdir=runs/demo/grpo

Reads {workdir}/metrics.jsonl (one JSON object per step; an eval's scores are a row of their own
at the step they were taken) and, for the error bars of the dev scores, {workdir}/eval/<step>.json
(per-question results). Writes, beside the TensorBoard logs in {workdir}/plots/ (each figure only
when a run logs one of its keys):

  RL runs (rows with "reward")
    reward.png     training reward per step (the mean over the step's rollouts) and its smoothed
                   line
    eval.png       dev F1 and EM (greedy) at each eval, error bars ±1 standard error over the
                   questions
    rollouts.png   training F1, turns per rollout, format error rate
    loss.png       policy loss and token entropy
    step_time.png  seconds per step
  SFT runs (rows with "loss" and no "reward")
    sft_loss.png   cross-entropy per target token and token accuracy

Per-step series are drawn thin, with a smoothed line over them: the debiased exponential moving
average TensorBoard draws (`smooth`), its weight chosen from the number of steps
(`default_weight`: a span of 2% of the run, between 5 and 20 steps) unless given. A value that
is NaN or infinite (a skipped update's loss) leaves a gap in the per-step line and is left out
of the smoothed one; a row without a key is not a point of that key's series; a series of one
step is drawn as a dot.

Errors: a workdir without metrics.jsonl raises FileNotFoundError, one whose metrics.jsonl holds
no rows (a run that has not finished a step) raises ValueError; each names the file. A
half-written last line (a run killed mid-append) is skipped with a warning. matplotlib is
imported only when a figure is drawn (the Agg backend: no display needed); without it, an
ImportError says how to install it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any, Sequence

import numpy as np

from agentjax.jsonl import iter_json_objects

log = logging.getLogger(__name__)

PLOTS_DIR = "plots"  # {workdir}/plots: plot_run's default output folder


@dataclasses.dataclass(frozen=True)
class Panel:
  key: str  # the metrics.jsonl key
  label: str  # the y axis
  smooth: bool = True  # a smoothed line over the per-step one (evals are points, not smoothed)
  stderr: str | None = None  # the per-question field of eval/<step>.json for error bars


@dataclasses.dataclass(frozen=True)
class Figure:
  name: str  # {name}.png
  title: str
  kind: str  # the runs it draws: "rl" or "sft" (the "loss" key means a different loss in each)
  panels: tuple[Panel, ...]


FIGURES = (
    Figure("reward", "Training reward", "rl",
           (Panel("reward", "reward (mean over the step's rollouts)"),)),
    Figure("eval", "Dev evaluation (greedy)", "rl",
           (Panel("eval/f1", "dev F1 (±1 std. error over questions)", smooth=False, stderr="f1"),
            Panel("eval/em", "dev EM (±1 std. error over questions)", smooth=False, stderr="em"))),
    Figure("rollouts", "Training rollouts", "rl",
           (Panel("f1", "training F1"), Panel("turns", "turns per rollout"),
            Panel("format_error_rate", "format error rate"))),
    Figure("loss", "Policy update", "rl",
           (Panel("loss", "policy loss"), Panel("entropy", "token entropy (nats)"))),
    Figure("step_time", "Time per step", "rl", (Panel("step_s", "seconds per step"),)),
    Figure("sft_loss", "SFT loss", "sft",
           (Panel("loss", "loss (cross-entropy per target token, nats)"),
            Panel("accuracy", "token accuracy"))),
)


# ============================================================================ data


@dataclasses.dataclass
class Run:
  """One workdir's metrics: {key: (steps, values)} sorted by step (the last row of a step wins)."""
  workdir: str
  kind: str  # "rl", "sft" or "" (neither)
  series: dict[str, tuple[np.ndarray, np.ndarray]]


def _number(value: Any) -> float | None:
  """A metric value as a float (NaN for a non-finite one), or None when it is not a number."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  return float(value) if math.isfinite(value) else float("nan")


def read_run(workdir: str) -> Run:
  """{workdir}/metrics.jsonl as a Run. FileNotFoundError without the file, ValueError when it
  holds no rows."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such file (is {workdir!r} a run's workdir? the trainer "
                            f"writes metrics.jsonl after the run's first step)")
  on_error = lambda _, message: log.warning("skipping an unreadable metrics line: %s", message)  # noqa: E731
  points: dict[str, dict[int, float]] = {}
  rows = 0
  for _, row in iter_json_objects(path, ValueError, what="metrics", on_error=on_error):
    step = _number(row.get("step"))
    if step is None or math.isnan(step):
      continue
    rows += 1
    for key, value in row.items():
      number = _number(value)
      if key != "step" and number is not None:
        points.setdefault(key, {})[int(step)] = number
  if not rows:
    raise ValueError(f"{path}: no metric rows yet (the run has not finished a step); nothing "
                     f"to plot")
  series = {k: (np.asarray(sorted(v), np.int64), np.asarray([v[s] for s in sorted(v)],
                                                            np.float64))
            for k, v in points.items()}
  rl = "reward" in series or any(k.startswith("eval/") for k in series)
  kind = "rl" if rl else "sft" if "loss" in series else ""
  return Run(workdir, kind, series)


def eval_stderr(workdir: str, step: int, field: str) -> float | None:
  """The standard error of `field` over eval/<step>.json's per-question rows (sample std /
  sqrt(n)), or None when the file or the field is not there."""
  path = os.path.join(workdir, "eval", f"{step}.json")
  try:
    with open(path) as f:
      rows = json.load(f).get("per_question")
  except (OSError, ValueError, AttributeError):
    return None
  if not isinstance(rows, list):
    return None
  values = [v for v in (_number(r.get(field)) for r in rows if isinstance(r, dict))
            if v is not None and not math.isnan(v)]
  if len(values) < 2:
    return None
  return float(np.std(values, ddof=1) / math.sqrt(len(values)))


# ============================================================================ smoothing


def default_weight(n: int) -> float:
  """The smoothing weight for a series of n steps: a span of n / 50 steps, kept in [5, 20]
  (the demo's 30 RL steps: 0.8; its 1000 SFT steps: 0.95). A longer span would lag a fast
  early fall of the loss."""
  span = min(20, max(5, n // 50))
  return 1.0 - 1.0 / span


def smooth(values: Sequence[float], weight: float) -> np.ndarray:
  """The debiased exponential moving average of `values` (TensorBoard's smoothing).

  Over the finite values x_1..x_k seen so far, s_k = sum_j weight^(k-j) x_j / sum_j
  weight^(k-j): the first point is x_1 itself, not pulled towards 0. A non-finite value is
  skipped (its position carries the previous smoothed value; NaN before any finite one).
  weight 0 returns the values (gaps carried). [n] -> [n] float64."""
  if not 0.0 <= weight < 1.0:
    raise ValueError(f"smoothing weight={weight!r}: must be in [0, 1) (0: no smoothing)")
  out = np.full(len(values), np.nan)
  total = norm = 0.0
  for i, x in enumerate(values):
    if math.isfinite(x):
      total = weight * total + (1.0 - weight) * x
      norm = weight * norm + (1.0 - weight)
    if norm > 0:
      out[i] = total / norm
  return out


# ============================================================================ figures


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display); an ImportError that says how
  to install it when matplotlib is missing."""
  try:
    import matplotlib
  except ImportError:
    raise ImportError("plotting needs matplotlib (an agentjax dependency): pip install "
                      "matplotlib") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 110) -> str:
  """Lays `fig` out, writes it to `path` (a PNG) and frees it; returns `path`."""
  import matplotlib.pyplot as plt
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


def _labels(workdirs: Sequence[str]) -> list[str]:
  """Short names for the runs' legends: each workdir's last folder, or its path when two runs
  share one."""
  paths = [os.path.normpath(w) for w in workdirs]
  names = [os.path.basename(p) or p for p in paths]
  return names if len(set(names)) == len(names) else paths


def _draw_panel(ax, panel: Panel, runs: Sequence[Run], labels: Sequence[str],
                weight: float | None) -> bool:
  """Draws `panel` for every run that logs its key; whether any did."""
  drawn = False
  for index, (run, label) in enumerate(zip(runs, labels)):
    if panel.key not in run.series:
      continue
    steps, values = run.series[panel.key]
    color = f"C{index % 10}"
    one = len(runs) == 1
    if panel.stderr is not None:
      errors = [eval_stderr(run.workdir, int(s), panel.stderr) for s in steps]
      yerr = np.asarray([np.nan if e is None else e for e in errors])
      ax.errorbar(steps, values, yerr=None if np.isnan(yerr).all() else yerr, color=color,
                  marker="o", markersize=4, capsize=3, label=None if one else label)
    elif panel.smooth:
      w = default_weight(len(values)) if weight is None else weight
      ax.plot(steps, values, color=color, alpha=0.35, linewidth=1,
              marker="o" if len(values) <= 60 else None, markersize=2.5,
              label="per step" if one else None)
      ax.plot(steps, smooth(values, w), color=color, linewidth=2,
              marker="o" if len(values) == 1 else None,  # one step: a dot, not an empty line
              label=f"smoothed (EMA, weight {w:.2f})" if one else label)
    else:
      ax.plot(steps, values, color=color, marker="o", markersize=4,
              label=None if one else label)
    drawn = True
  if drawn:
    ax.set_ylabel(panel.label)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  return drawn


def plot_runs(workdirs: Sequence[str], out_dir: str, *,
              smoothing: float | None = None) -> list[str]:
  """The FIGURES of the runs in `workdirs`, overlaid (one colour per run), as {out_dir}/*.png;
  returns the paths written. smoothing: the EMA weight in [0, 1) (None: default_weight per
  series). A figure none of the runs has a key of is not written."""
  if not workdirs:
    raise ValueError("plot_runs needs at least one workdir")
  if smoothing is not None:
    smooth([], smoothing)  # the weight's check, before any file is read
  runs = [read_run(w) for w in workdirs]
  labels = _labels(workdirs)
  plt = None
  written = []
  for figure in FIGURES:
    chosen = [(r, label) for r, label in zip(runs, labels) if r.kind == figure.kind]
    panels = [p for p in figure.panels if any(p.key in r.series for r, _ in chosen)]
    if not panels:
      continue
    if plt is None:
      plt = pyplot()
      from matplotlib.ticker import MaxNLocator
      os.makedirs(out_dir, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
      _draw_panel(ax, panel, [r for r, _ in chosen], [label for _, label in chosen], smoothing)
      ax.set_xlabel({"rl": "RL step", "sft": "SFT step"}[figure.kind])
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5 on a short run
      low, high = ax.get_xlim()
      if high - low < 2:  # one step: ticks at the neighbouring steps, not at 0.995, 1.005
        middle = round((low + high) / 2)
        ax.set_xlim(middle - 1, middle + 1)
    fig.suptitle(f"{figure.title}: {chosen[0][1]}" if len(chosen) == 1 else figure.title)
    written.append(save_figure(fig, os.path.join(out_dir, f"{figure.name}.png")))
  return written


def plot_run(workdir: str, out_dir: str | None = None, *,
             smoothing: float | None = None) -> list[str]:
  """The learning curves of one run (module docstring) in `out_dir` (default {workdir}/plots);
  returns the PNG paths written."""
  return plot_runs([workdir], out_dir or os.path.join(workdir, PLOTS_DIR), smoothing=smoothing)


def default_out_dir(workdirs: Sequence[str]) -> str:
  """plots/ in the one workdir, or in the folder the workdirs share (the current folder when
  they share none)."""
  if len(workdirs) == 1:
    return os.path.join(workdirs[0], PLOTS_DIR)
  paths = [os.path.normpath(w) for w in workdirs]
  if len({os.path.isabs(p) for p in paths}) > 1:  # some relative, some absolute
    paths = [os.path.abspath(p) for p in paths]
  common = os.path.commonpath(paths)
  return os.path.join(common if common not in ("", os.sep) else ".", PLOTS_DIR)

