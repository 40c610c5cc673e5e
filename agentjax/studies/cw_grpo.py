r"""The CW-GRPO study (`python launch/compare.py --study=cw_grpo`:
runs/cw_grpo -> docs/results/cw_grpo).

The base size only, from the base SFT export of `make demo` (--sft_from=runs/demo: its world and
SFT export are copied into --root when its SFT settings are the ones the sweep's SFT uses, so it
is the export the IGPO study's layout would train; otherwise it is trained there), the demo RL
settings for --steps steps, no ground-truth probes. The methods differ only in the estimator and
the judge (see CW_METHODS): GRPO; CW-GRPO with SynthWorld's oracle judge (gamma = inf branch,
all-zero fallback "zero"); its controls with random contributions at the oracle's marginal rate,
with the oracle's bits flipped with p = 0.2, and with gamma = 1 (softmax). Its report (--out):
results.md (tables, the paper's claim beside ours), results.json, f1_vs_step.png,
success_vs_step.png (training EM). Every run's result.json records its judge's identity.
"""

from __future__ import annotations

import json
import math

from agentjax.studies.reporting import cell, mean_std, paired_by_step, pm, step_mean
from agentjax.studies.runs import SPLITS


# CW-GRPO's study: the oracle judge (configs/cw_grpo.py:demo) and its controls. "random" draws
# each bit with the judge's own marginal rate in the step; "flip" flips each bit with noise_p.
CW_METHODS = {
    "grpo": ("grpo", {}),
    "cw_grpo": ("cw_grpo", {}),
    "cw_random": ("cw_grpo", {"judge.noise": "random"}),
    "cw_flip": ("cw_grpo", {"judge.noise": "flip", "judge.noise_p": 0.2}),
    "cw_gamma1": ("cw_grpo", {"cw.gamma": 1.0}),
}


CW_PANELS = (("f1", "f1_vs_step", "training F1"),
             ("em", "success_vs_step", "training success rate (EM)"))


def _non_answer_rounds(m: dict) -> float:
  """A step's judged non-answer rounds: every judged trajectory also sends its answer round
  (judge.answer_round, the code's protocol), one a trajectory."""
  return m.get("judge/rounds", 0.0) - m.get("judge/trajectories", 0.0)


def _extra_rounds(m: dict) -> float:
  """sum over a step's judged trajectories of (K - 1), K its non-answer rounds: 0 when none has
  the K >= 2 rounds a Gini needs (trajectories with K = 0 aside)."""
  return max(_non_answer_rounds(m) - m.get("judge/trajectories", 0.0), 0.0)


# Per-step metrics of a CW-GRPO run averaged over its steps: (column, metrics.jsonl key, weight of
# a step or None). The contribution share is a mean over a step's judged non-answer rounds and the
# Gini a mean over its judged trajectories with K >= 2 non-answer rounds, each logged as 0 when it
# has nothing to average: they are averaged over steps weighted by what they average (the Gini by
# the proxy _extra_rounds), so such a step carries no weight. A method whose runs never log a key
# (GRPO) shows "—".
CW_STEP_METRICS = (("judge_calls", "judge/calls", None),
                   ("judge_calls_saved", "judge/calls_saved", None),
                   ("judge_failures", "judge/failures", None),
                   ("judged_trajectories", "judge/trajectories", None),
                   ("contribution_share", "judge/contribution_share", _non_answer_rounds),
                   ("gini", "judge/gini", _extra_rounds),
                   ("fallback_rate", "cw/fallback_rate", None))
# The paper's headline (abstract): CW-GRPO over GRPO; whether points or percent is not stated.
PAPER_CLAIMS = (("Qwen3-8B", 5.0), ("Qwen3-1.7B", 6.3))


def summarize_cw(study: dict) -> dict:
  """Per size and method of the CW-GRPO study: mean ± std over seeds of its figures, and the
  paper's comparison (each method against GRPO) as absolute points and relative %."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    grpo = {r["seed"]: r for r in runs.get("grpo", [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "acc", "per_hop")
                           if k in start[split]} for split in SPLITS},
         "methods": {}, "vs_grpo": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs), "judge": rs[0].get("judge")}
      if any(r.get("judge") != row["judge"] for r in rs):
        row["judge"] = [r.get("judge") for r in rs]  # seeds with different judges: say so
      for split in SPLITS:
        for k in ("f1", "acc"):
          row[f"{split}_{k}"] = mean_std([r[split][k] for r in rs])
        gains = [paired_gain(start[split]["f1_by_id"], r[split]["f1_by_id"]) for r in rs]
        row[f"{split}_gain"] = mean_std([g for g, _ in gains])
        row[f"{split}_acc_gain"] = mean_std([r[split]["acc"] - start[split]["acc"] for r in rs])
      paired = [r for r in rs if r["seed"] in grpo]
      for key in ("f1", "em"):
        row[f"train_{key}_minus_grpo"] = mean_std(
            [paired_by_step(r, grpo[r["seed"]], key) for r in paired]) if paired else None
      for column, key, weight in CW_STEP_METRICS:
        per_run = [step_mean(r["curve"], key, weight) for r in rs]
        per_run = [x for x in per_run if x is not None]
        row[column] = mean_std(per_run) if per_run else None
      # Non-answer rounds per judged trajectory, pooled over a run's steps (what a Gini sees).
      per_run = [sum(map(_non_answer_rounds, r["curve"]))
                 / sum(m["judge/trajectories"] for m in r["curve"]) for r in rs
                 if sum(m.get("judge/trajectories", 0.0) for m in r["curve"])]
      row["rounds_per_judged_trajectory"] = mean_std(per_run) if per_run else None
      row["minutes"] = mean_std([r.get("minutes", 0.0) for r in rs])
      t["methods"][method] = row
      if method == "grpo" or not paired:
        continue
      # The paper's delta, both readings: absolute points (x100) and relative % of GRPO, of the
      # seed means; per seed, the paired per-question test difference (same questions).
      vs = {}
      for k in ("acc", "f1"):
        ours = row[f"test_{k}"][0]
        base = mean_std([r["test"][k] for r in grpo.values()])[0]
        per_seed = [r["test"][k] - grpo[r["seed"]]["test"][k] for r in paired]
        vs[k] = {"ours": ours, "grpo": base, "points": 100 * (ours - base),
                 "relative_pct": 100 * (ours - base) / base if base else float("nan"),
                 "per_seed_points": [round(100 * d, 2) for d in per_seed],
                 "seeds_ahead": sum(d > 0 for d in per_seed), "seeds": len(per_seed)}
      vs["f1"]["per_seed_paired_stderr"] = [
          round(paired_gain(grpo[r["seed"]]["test"]["f1_by_id"], r["test"]["f1_by_id"])[1], 4)
          for r in paired]
      t["vs_grpo"][method] = vs
    table[size] = t
  return table


def markdown_cw(table: dict, steps: int, hardware: str) -> str:
  """results.md of the CW-GRPO study: the method table and the paper's claim beside ours."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, accuracy (EM > 0) "
              f"{st['dev'].get('acc', st['dev']['em']):.3f}; test F1 {st['test']['f1']:.3f}, "
              f"accuracy {st['test'].get('acc', st['test']['em']):.3f}. {steps} RL steps; mean ± "
              f"sample std over seeds.", "",
              "| method | seeds | dev F1 | dev accuracy | test F1 | test accuracy | test F1 gain "
              "vs SFT (paired) | test accuracy gain vs SFT | training F1 − GRPO (paired by step) | "
              "training success − GRPO (paired by step) | judge calls / step | calls saved / step "
              "| judged trajectories / step | non-answer rounds / judged trajectory | "
              "contribution share | Gini of contributions | all-zero fallback rate | minutes |",
              "| --- " * 18 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {r['seeds']} | {pm(r['dev_f1'])} | {pm(r['dev_acc'])} | "
          f"{pm(r['test_f1'])} | {pm(r['test_acc'])} | {pm(r['test_gain'], sign='+')} | "
          f"{pm(r['test_acc_gain'], sign='+')} | {cell(r['train_f1_minus_grpo'], sign='+')} | "
          f"{cell(r['train_em_minus_grpo'], sign='+')} | {cell(r['judge_calls'], 1)} | "
          f"{cell(r['judge_calls_saved'], 1)} | {cell(r['judged_trajectories'], 1)} | "
          f"{cell(r['rounds_per_judged_trajectory'], 2)} | {cell(r['contribution_share'])} | "
          f"{cell(r['gini'])} | {cell(r['fallback_rate'])} | {pm(r['minutes'], 1)} |")
    judges = {m: r["judge"] for m, r in t["methods"].items()}
    lines += ["", "Judges (agentjax.judge.judge_identity, from every run's result.json): "
              + "; ".join(f"{m}: {json.dumps(j, sort_keys=True)}" for m, j in judges.items()), ""]
    if t["vs_grpo"]:
      lines += ["#### The paper's claim beside ours", "",
                "The paper: CW-GRPO over GRPO, "
                + ", ".join(f"+{v} on {m}" for m, v in PAPER_CLAIMS)
                + " (points or percent not stated). Ours: test split, the seed means; points = "
                "100 × (method − GRPO), relative = (method − GRPO) / GRPO. Per seed: the paired "
                "difference with GRPO's run of the same seed, in points.", "",
                "| method | test accuracy (GRPO) | Δ accuracy, points | Δ accuracy, relative | "
                "per seed (points) | test F1 (GRPO) | Δ F1, points | Δ F1, relative | per seed "
                "(points) |", "| --- " * 9 + "|"]
      for method, vs in t["vs_grpo"].items():
        cells = []
        for k in ("acc", "f1"):
          v = vs[k]
          rel = "—" if math.isnan(v["relative_pct"]) else f"{v['relative_pct']:+.1f}%"
          cells += [f"{v['ours']:.3f} ({v['grpo']:.3f})", f"{v['points']:+.1f}", rel,
                    ", ".join(f"{d:+.1f}" for d in v["per_seed_points"])
                    + f" ({v['seeds_ahead']}/{v['seeds']} ahead)"]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
      lines += ["", "| paper | backbone | claim over GRPO |", "| --- | --- | --- |"]
      lines += [f"| CW-GRPO | {m} | +{v} (points or percent not stated) |"
                for m, v in PAPER_CLAIMS]
      lines.append("")
  return "\n".join(lines)
