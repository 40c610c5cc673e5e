r"""The research study (issue 32 §3): the methods again on SynthWorld v2 from the research backbone,
under a run protocol that resolves about one point of F1 (`python launch/compare.py
--study=research`; the backbone first: launch/backbone.py).

The protocol, declared before the runs:
  primary metric  test F1 (1000 test questions, greedy), each method against GRPO, paired by
                  question and pooled over seeds (paired_pooled): the mean difference, its
                  standard error over the seed x question pairs, z and a two-sided p (normal).
  runs            100 RL steps (configs/base.py `research`: constant lr after 5 warm-up steps,
                  8 questions x 8 rollouts, top-3 BM25, 6 turns), 3 seeds (5 for the headline
                  pair: `--seeds=0,1,2,3,4 --methods=grpo,igpo`), every run from the same
                  backbone export, the same settings but its method's, checkpointed every 10
                  steps (a sweep resumes where it stopped).

The arms (method: config file and overrides on its `research` preset):
  grpo            configs/grpo.py
  igpo            configs/igpo.py: the paper's pooled (joint) normalization of IG and outcome
                  rewards, the official code's group std
  igpo_separate   the same with IG and outcome rewards normalized separately (the demo's reading)
  cw_grpo         configs/cw_grpo.py: the official script's EM reward and groups of 4 (16
                  questions a step), the oracle judge
  ppo_ig          configs/ppo.py:research-ig: PPO with a critic, IG as the earlier turns' rewards
  cw_grpo_ig      the composition: IGPO's IG turn advantages times CW-GRPO's round weights

The papers' claims beside ours (PAPER_CLAIMS; methods spec): IGPO over GRPO, CW-GRPO over GRPO.
"""

from __future__ import annotations

import math

import numpy as np

RESEARCH_METHODS = {
    "grpo": ("grpo", {}),
    "igpo": ("igpo", {}),
    "igpo_separate": ("igpo", {"rl.igpo_norm": "separate"}),
    "cw_grpo": ("cw_grpo", {}),
    "ppo_ig": ("ppo", {"ppo.ig_weight": 1.0}),
    "cw_grpo_ig": ("cw_grpo", {"algorithm": "cw_grpo_ig"}),
}
REFERENCE = "grpo"
# The floor (100; 150-200 "where the budget allows"): a step of 64 trajectories takes
# 50-90 s on one core of this CPU (GRPO 50-65, IGPO 75-90: docs/results/research/README.md,
# "Budget"), so 150 steps x 22 runs (5 seeds of the headline pair) were ~33 hours of two
# workers, and DAC's and Co-ReAct's studies queue behind them on the same CPU. The lr is
# constant after warm-up, so a run's first 100 steps are the same at any `steps`.
STEPS = 100

# Test F1 / accuracy points over GRPO that the papers report (methods spec; the IGPO paper's
# Table 2 at Qwen2.5-7B averaged over its seven benchmarks, its Table 3 at 3B; CW-GRPO's
# abstract at Qwen3-8B and 1.7B).
PAPER_CLAIMS = {
    "igpo": "+6.8 F1 at Qwen2.5-7B (58.7 vs 51.9, Table 2); +15.3 at Qwen2.5-3B",
    "cw_grpo": "+5.0 accuracy at Qwen3-8B, +6.3 at Qwen3-1.7B",
}


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


def summarize_research(study: dict, target_gain: float) -> dict:
  """The IGPO study's table (agentjax/studies/igpo.summarize) of every arm, with each arm's test
  F1 against GRPO's paired by question and pooled over seeds (`vs_grpo`)."""
  from agentjax.studies.igpo import summarize
  table = summarize(study, target_gain)
  for size, s in study.items():
    ref = {r["seed"]: r["test"]["f1_by_id"] for r in s["runs"].get(REFERENCE, [])}
    for method, rs in s["runs"].items():
      if method == REFERENCE or not ref:
        continue
      table[size]["methods"][method]["vs_grpo"] = paired_pooled(
          ref, {r["seed"]: r["test"]["f1_by_id"] for r in rs})
  return table


def markdown_research(table: dict, steps: int, hardware: str) -> str:
  from agentjax.studies.igpo import markdown
  lines = [markdown(table, steps, hardware), "",
           "## Primary metric: test F1 against GRPO, paired by question, pooled over seeds", "",
           "| size | method | seeds | pairs | test F1 − GRPO (points) | stderr | z | p | "
           "the paper's claim |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for size, t in table.items():
    for method, row in t["methods"].items():
      v = row.get("vs_grpo")
      if v is None:
        continue
      lines.append(f"| {size} | {method} | {row['seeds']} | {v['pairs']} | "
                   f"{100 * v['mean']:+.2f} | {100 * v['stderr']:.2f} | {v['z']:.2f} | "
                   f"{v['p']:.3f} | {PAPER_CLAIMS.get(method, '—')} |")
  return "\n".join(lines) + "\n"


__all__ = ["PAPER_CLAIMS", "REFERENCE", "RESEARCH_METHODS", "STEPS", "markdown_research",
           "paired_pooled", "summarize_research"]
