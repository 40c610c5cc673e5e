r"""The asynchronous-RL study (`python launch/compare.py --study=async`): GRPO and IGPO
with train.async_steps 0, 1 and 2 from the same SFT start, same settings and seeds.

Declared before the runs:
  question        does staleness cost learning per step, and does it pay per hour?
  primary metric  test F1 after the same number of steps, each async arm against the same
                  method's synchronous arm, paired by question and pooled over seeds
                  (reporting.paired_pooled); beside it the wall time of the runs (minutes, steps
                  per hour: the mean step_s of the trainer's steps) and training F1 against
                  wall-clock time (f1_vs_time.png, seed bands).
  runs            the demo's settings (configs/{grpo,igpo}.py:demo: 8 questions x 8, 4 turns)
                  from `make demo`'s SFT export, 3 seeds, colocated on this machine (one CPU
                  device: the rollout and the update overlap).
"""

from __future__ import annotations

import numpy as np

from agentjax.studies.reporting import mean_std, pm
from agentjax.studies.reporting import paired_pooled

ASYNC_STEPS = (0, 1, 2)
ASYNC_METHODS = {f"{m}_a{k}": (m, {"train.async_steps": k} if k else {})
                 for m in ("grpo", "igpo") for k in ASYNC_STEPS}


def _sync_arm(method: str) -> str:
  return method.rsplit("_a", 1)[0] + "_a0"


def _step_s(run: dict) -> float:
  """The run's mean seconds per step after its first (compiling) one."""
  xs = [m["step_s"] for m in run["curve"][1:] if "step_s" in m]
  return float(np.mean(xs)) if xs else float("nan")


def summarize_async(study: dict) -> dict:
  """Per size and arm: test F1 (mean ± sample std over seeds), the paired pooled test-F1
  difference against the same method's synchronous arm, seconds per step and steps per hour
  (mean ± std over seeds), its ratio to the synchronous arm's, and the mean staleness."""
  table = {}
  for size, s in study.items():
    runs, t = s["runs"], {}
    for arm, rs in runs.items():
      step_s = [_step_s(r) for r in rs]
      row = {"seeds": sorted(r["seed"] for r in rs),
             "test_f1": mean_std([r["test"]["f1"] for r in rs]),
             "step_s": mean_std(step_s),
             "steps_per_hour": mean_std([3600.0 / x for x in step_s]),
             "staleness": float(np.mean([m.get("async/staleness", 0.0)
                                         for r in rs for m in r["curve"]]))}
      base = runs.get(_sync_arm(arm), [])
      if arm != _sync_arm(arm) and base:
        ref = {r["seed"]: r["test"]["f1_by_id"] for r in base}
        row["vs_sync"] = paired_pooled(ref, {r["seed"]: r["test"]["f1_by_id"] for r in rs})
        row["speedup"] = float(np.mean([_step_s(r) for r in base]) / np.mean(step_s))
      t[arm] = row
    table[size] = t
  return table


def markdown_async(table: dict, steps: int, hardware: str) -> str:
  lines = ["# Asynchronous RL: GRPO and IGPO with train.async_steps 0, 1, 2", "",
           f"{steps} RL steps a run; {hardware}. Test F1 mean ± sample std over seeds; against "
           "the same method's synchronous arm, paired by question, pooled over seeds (points of "
           "F1, ± standard error, two-sided p); seconds per step after the first.", ""]
  for size, t in table.items():
    lines += [f"## {size}", "",
              "| arm | seeds | test F1 | − synchronous (points, p) | s / step | steps / hour | "
              "speed-up | mean staleness |", "|---|---|---|---|---|---|---|---|"]
    for arm, r in t.items():
      vs = r.get("vs_sync")
      diff = "—" if vs is None else (f"{100 * vs['mean']:+.2f} ± {100 * vs['stderr']:.2f} "
                                     f"(p {vs['p']:.3f})")
      speed = "—" if "speedup" not in r else f"{r['speedup']:.2f}x"
      lines.append(f"| {arm} | {len(r['seeds'])} | {pm(r['test_f1'])} | {diff} | "
                   f"{pm(r['step_s'], 2)} | {pm(r['steps_per_hour'], 0)} | {speed} | "
                   f"{r['staleness']:.2f} |")
    lines.append("")
  return "\n".join(lines)


def plot_f1_vs_time(study: dict, out: str) -> list[str]:
  """Training F1 (moving mean) against cumulative wall-clock seconds, per arm: the mean over
  seeds as a line, min-max as a band, on each seed's own clock interpolated to a common grid."""
  import os

  from agentjax.plots import pyplot, save_figure
  plt = pyplot()
  from agentjax.studies.reporting import WINDOW, moving
  paths = []
  fig, axes = plt.subplots(1, len(study), figsize=(6 * len(study), 4), squeeze=False)
  for ax, (size, s) in zip(axes[0], study.items()):
    for arm, rs in s["runs"].items():
      # Each seed's clock from its first full window on (moving means start there).
      clocks = [np.cumsum([m.get("step_s", 0.0) for m in r["curve"]])[WINDOW - 1:] for r in rs]
      f1s = [np.asarray(moving([m["f1"] for m in r["curve"]])[WINDOW - 1:], np.float64)
             for r in rs]
      if not all(len(c) for c in clocks):
        continue
      grid = np.linspace(max(c[0] for c in clocks), min(c[-1] for c in clocks), 50)
      curves = np.stack([np.interp(grid, c, f) for c, f in zip(clocks, f1s)])
      line, = ax.plot(grid / 60, curves.mean(0), label=f"{arm} ({len(rs)} seeds)")
      ax.fill_between(grid / 60, curves.min(0), curves.max(0), alpha=0.15,
                      color=line.get_color())
    ax.set_title(f"{size}: mean over seeds, band min-max")
    ax.set_xlabel("wall-clock minutes")
    ax.set_ylabel(f"training F1 (moving mean of {WINDOW})")
    ax.legend(fontsize=7)
  path = os.path.join(out, "f1_vs_time.png")
  save_figure(fig, path)
  paths.append(path)
  return paths


__all__ = ["ASYNC_METHODS", "ASYNC_STEPS", "markdown_async", "plot_f1_vs_time",
           "summarize_async"]
