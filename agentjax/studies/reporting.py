"""What the studies' reports share: finished runs collected from a study's root, moving averages,
mean ± sample std over seeds, differences paired by step and by question, table cells, and the
figures with a seed band (the mean over seeds as a line, the min-max over seeds as a band)."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from agentjax.studies.runs import read_json, result_path


def say(msg: str) -> None:
  print(msg, flush=True)


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [m for m in map(json.loads, f) if "reward" in m]


WINDOW = 5  # steps per moving average (curves, steps to target, GT entropy windows)


def moving(x: list[float], w: int = WINDOW) -> list[float | None]:
  """Mean of the last w values at each index; None until a full window exists (a partial one
  would let a single noisy step count)."""
  return [sum(x[i - w + 1:i + 1]) / w if i >= w - 1 else None for i in range(len(x))]


def grpo_f1(runs: dict) -> dict:
  """{seed: GRPO's training F1 per step}: what the other methods are paired with, step by step
  (the same seed sees the same questions at a step)."""
  return {r["seed"]: [m["f1"] for m in r["curve"]] for r in runs.get("grpo", [])}


def mean_std(xs: list[float]) -> tuple[float, float]:
  """Mean and sample std (nan for one value)."""
  n = len(xs)
  m = sum(xs) / n
  std = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan")
  return m, std


def collect_runs(sizes, methods, seeds, steps: int, start_of, run_of, say=say) -> dict:
  """Every finished run of `steps` steps, grouped by size and method: {size: {"start", "runs":
  {method: [result + {"seed", "curve"}]}}}. start_of(size): the size's start (None: the size is
  left out); run_of(spec): (result, its steps' metrics, where it was read) or None. A run of
  another step count is left out with a line saying so."""
  out = {}
  for size in sizes:
    start = start_of(size)
    if start is None:
      continue
    runs = {}
    for method in methods:
      for seed in seeds:
        found = run_of(f"{size}/{method}/{seed}")
        if found is None:
          continue
        result, curve, where = found
        if result.get("steps", len(curve)) != steps:
          say(f"{where}: a run of {result.get('steps', len(curve))} steps, not {steps}; left out")
          continue
        runs.setdefault(method, []).append(dict(result, seed=seed, curve=curve))
    out[size] = {"start": start, "runs": runs}
  return out


def collect(root: str, sizes, methods, seeds, steps: int) -> dict:
  """Every finished run of `steps` steps under `root` (collect_runs): result.json and
  metrics.jsonl of each run folder."""
  def run_of(spec):
    path = result_path(root, spec)
    result = read_json(path)
    return None if result is None else (result, read_metrics(os.path.dirname(path)), path)
  return collect_runs(sizes, methods, seeds, steps,
                      lambda size: read_json(result_path(root, f"{size}/sft/0")), run_of)


def pm(ms: tuple[float, float] | None, digits: int = 3, sign: str = "") -> str:
  if ms is None:
    return "—"
  spread = "" if math.isnan(ms[1]) else f" ± {ms[1]:.{digits}f}"  # one seed: no spread
  return f"{ms[0]:{sign}.{digits}f}{spread}"


def plot_seed_bands(study: dict, out: str, panels, title: str = "{size} model"
                    ) -> list[str]:
  """One figure per (metric key, file name, label) of `panels` vs step (moving averages over full
  windows): the mean over seeds as a line, the min-max over seeds as a band. outcome_only's line
  lies under GRPO's (identical runs)."""
  from agentjax.plots import pyplot, save_figure
  plt = pyplot()
  paths = []
  # One colour per method across the panels (the regimes run different arms).
  methods = list(dict.fromkeys(m for s in study.values() for m in s["runs"]))
  for key, name, label in panels:
    fig, axes = plt.subplots(1, len(study), figsize=(6 * len(study), 4), squeeze=False)
    for ax, (size, s) in zip(axes[0], study.items()):
      grpo = grpo_f1(s["runs"])
      for method, rs in s["runs"].items():
        if key == "f1_minus_grpo":  # the per-step question mix cancels out
          rs = [r for r in rs if r["seed"] in grpo]
          values = [[m["f1"] - g for m, g in zip(r["curve"], grpo[r["seed"]])] for r in rs]
        else:
          values = [[m[key] for m in r["curve"]] for r in rs]
        if not values:
          continue
        n = min(len(v) for v in values)
        curves = [moving(v[:n])[WINDOW - 1:] for v in values]
        steps = [m["step"] for m in rs[0]["curve"][WINDOW - 1:n]]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(steps))]
        line, = ax.plot(steps, mean, label=f"{method} ({len(rs)} seeds)",
                        color=f"C{methods.index(method) % 10}")
        ax.fill_between(steps, [min(c[i] for c in curves) for i in range(len(steps))],
                        [max(c[i] for c in curves) for i in range(len(steps))], alpha=0.15,
                        color=line.get_color())
      ax.set_title(title.format(size=size))
      ax.set_xlabel("RL step")
      ax.set_ylabel(f"{label}\n({WINDOW}-step moving average)")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8)
    path = os.path.join(out, f"{name}.png")
    save_figure(fig, path)
    paths.append(path)
  return paths


def step_mean(curve: list[dict], key: str, weight=None) -> float | None:
  """Mean of `key` over the steps that log it (a finite value), weighted by weight(step row) when
  given; None when no step logs it or every weight is 0."""
  rows = [m for m in curve if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
  ws = [weight(m) if weight else 1.0 for m in rows]
  total = sum(ws)
  return sum(w * m[key] for w, m in zip(ws, rows)) / total if total else None


def vs_reference(reference: str, ref: dict, paired: list[dict]) -> dict:
  """A method's runs against the reference method's of the same seeds (`ref`: seed -> run):
  test F1 paired by question (points and the paired standard error) and training F1 paired by
  step."""
  from agentjax.data.demo_world import paired_gain
  per_seed = [paired_gain(ref[r["seed"]]["test"]["f1_by_id"], r["test"]["f1_by_id"])
              for r in paired]
  return {"reference": reference, "seeds": [r["seed"] for r in paired],
          "test_f1_points": [round(100 * d, 2) for d, _ in per_seed],
          "test_f1_stderr_points": [round(100 * e, 2) for _, e in per_seed],
          "train_f1_paired_by_step": mean_std(
              [paired_by_step(r, ref[r["seed"]], "f1") for r in paired])}


def paired_pooled(reference: dict[str, dict[str, float]], other: dict[str, dict[str, float]]
                  ) -> dict[str, float]:
  """Per-question differences other - reference pooled over seeds.

  reference, other: {seed: {question id: score}}; a pair is (seed, question) present in both.
  Returns {"pairs", "mean", "stderr" (sample std of the differences / sqrt(pairs)), "z",
  "p" (two-sided, normal)}; stderr, z and p are nan with fewer than two pairs, and z = 0, p = 1
  when every difference is 0."""
  diffs = [other[s][q] - reference[s][q] for s in sorted(set(reference) & set(other))
           for q in sorted(set(reference[s]) & set(other[s]))]
  n = len(diffs)
  if n == 0:
    return {"pairs": 0, "mean": float("nan"), "stderr": float("nan"), "z": float("nan"),
            "p": float("nan")}
  d = np.asarray(diffs, np.float64)
  mean = float(d.mean())
  if n < 2:
    return {"pairs": n, "mean": mean, "stderr": float("nan"), "z": float("nan"),
            "p": float("nan")}
  stderr = float(d.std(ddof=1) / math.sqrt(n))
  if stderr == 0.0:
    return {"pairs": n, "mean": mean, "stderr": 0.0, "z": 0.0 if mean == 0 else math.inf,
            "p": 1.0 if mean == 0 else 0.0}
  z = mean / stderr
  return {"pairs": n, "mean": mean, "stderr": stderr, "z": z,
          "p": math.erfc(abs(z) / math.sqrt(2.0))}


def paired_by_seed(reference: dict[str, dict[str, float]], other: dict[str, dict[str, float]]
                   ) -> dict[str, float]:
  """The seed-level paired test beside paired_pooled (which treats a seed's questions as
  independent pairs and so leaves the run-to-run variance out of its standard error): each seed's
  mean of other - reference over the questions both have, then over the S seeds present in both
  their mean, sample std / sqrt(S), t and a two-sided p of Student's t with S - 1 degrees of
  freedom. {"seeds", "mean", "stderr", "t", "p"}; stderr, t and p are nan with fewer than two
  seeds (t = 0, p = 1 when every seed's difference is 0; t inf, p 0 when they are equal and not
  0)."""
  means = []
  for s in sorted(set(reference) & set(other)):
    qs = sorted(set(reference[s]) & set(other[s]))
    if qs:
      means.append(float(np.mean([other[s][q] - reference[s][q] for q in qs])))
  n, nan = len(means), float("nan")
  if n == 0:
    return {"seeds": 0, "mean": nan, "stderr": nan, "t": nan, "p": nan}
  mean = float(np.mean(means))
  if n < 2:
    return {"seeds": n, "mean": mean, "stderr": nan, "t": nan, "p": nan}
  stderr = float(np.std(means, ddof=1) / math.sqrt(n))
  if stderr == 0.0:
    return {"seeds": n, "mean": mean, "stderr": 0.0, "t": 0.0 if mean == 0 else math.inf,
            "p": 1.0 if mean == 0 else 0.0}
  from jax.scipy.special import betainc
  t, df = mean / stderr, n - 1
  p = float(betainc(df / 2.0, 0.5, df / (df + t * t)))  # P(|T| >= |t|), T ~ Student(df)
  return {"seeds": n, "mean": mean, "stderr": stderr, "t": t, "p": p}


def paired_by_step(r: dict, other: dict, key: str) -> float:
  """Mean over steps of r's training `key` minus `other`'s at the same step (same seed)."""
  return sum(m[key] - o[key] for m, o in zip(r["curve"], other["curve"])) / len(r["curve"])


def cell(ms, digits: int = 3, sign: str = "") -> str:
  return "—" if ms is None else pm(ms, digits, sign)


def step_seconds(curve: list[dict]) -> tuple[float, float]:
  """(mean step_s over every step, mean over steps 2..n): step 1 holds the first compiles."""
  s = [m["step_s"] for m in curve]
  return sum(s) / len(s), sum(s[1:]) / max(len(s) - 1, 1)


def no_nan(obj):
  """JSON has no NaN or infinity: a one-seed std, or a z of a difference without spread, is
  written as null."""
  if isinstance(obj, dict):
    return {k: no_nan(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [no_nan(v) for v in obj]
  return None if isinstance(obj, float) and not math.isfinite(obj) else obj
