"""The rubric generator's warm start on the demo (ours; configs/coreact.py:rubric_sft).

    rows = rubric_demos(branch_rows, seed=0, per_branch=2)   # SFT rows, protocol "rubric"

A from-scratch demo model has never written a rubric, so GRPO could never sample one that parses.
Each demonstration answers a branch point's rubric prompt (rubric.rubric_prompt, the prompt the RL
task and the guided agent build) with a rubric drawn at random from the executor's criterion
vocabulary (executor.CRITERION_PHRASES): 3 to 5 distinct criteria in all, positive weights in steps
of 0.05 summing to 1, and with probability `negative_rate` one of them with a negative weight
instead (every demonstration has the full format score). The rubrics are well formed and uninformed
by the context: the warm-started generator writes parseable rubrics whose rankings agree with the
experts' only by chance, which is what GRPO then has to make discriminative.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from agentjax.agent.protocol import RUBRIC
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import rubric_prompt


def random_rubric(rng: np.random.Generator, phrases: tuple[str, ...], min_items: int = 3,
                  max_items: int = 5, negative_rate: float = 0.3) -> str:
  """A rubric text: `N. [w] Criterion` lines (module docstring)."""
  negative = rng.random() < negative_rate and min_items + 1 <= min(max_items, len(phrases))
  # The positive items, leaving room for the negative one within max_items.
  n = int(rng.integers(min_items - int(negative) if negative else min_items,
                       max_items - int(negative) + 1))
  picked = rng.choice(len(phrases), size=min(n + int(negative), len(phrases)), replace=False)
  # n positive weights in 0.05 steps summing to 1 (each >= 0.05).
  cuts = np.sort(rng.choice(np.arange(1, 20), size=n - 1, replace=False))
  parts = np.diff(np.concatenate([[0], cuts, [20]])) * 0.05
  weights = [float(w) for w in parts]
  if negative:
    weights.append(-float(rng.choice([0.1, 0.2, 0.3])))
  lines = []
  for i, (p, w) in enumerate(zip(picked, weights)):
    text = phrases[int(p)]
    lines.append(f"{i + 1}. [{w:.2f}] {text[0].upper()}{text[1:]}")
  return "\n".join(lines)


def rubric_demos(branches: Iterable[Mapping[str, Any]], seed: int = 0, per_branch: int = 2,
                 negative_rate: float = 0.3) -> list[dict[str, Any]]:
  """SFT rows (agentjax/train/sft.py format, protocol "rubric": the "question" is the whole
  prompt) with `per_branch` random rubrics for each branch point's context."""
  from agentjax.coreact.executor import CRITERION_PHRASES
  rng = np.random.default_rng(seed)
  out = []
  for row in branches:
    prompt = rubric_prompt(BranchContext.from_json(row))
    for j in range(per_branch):
      out.append({"id": f"rubric_{row.get('id', len(out))}_{j}", "question": prompt,
                  "golden_answers": [], "protocol": RUBRIC.name,
                  "segments": [{"role": "assistant", "text": random_rubric(
                      rng, CRITERION_PHRASES, negative_rate=negative_rate)}]})
  return out


def write_rubric_demos(config: Any, per_branch: int = 2) -> str:
  """rubric_demos of config.coreact.branches_train written to config.sft.demos (atomically)."""
  from agentjax.jsonl import iter_json_objects, write_jsonl_atomic
  src = os.path.expanduser(config.coreact.branches_train)
  rows = [row for _, row in iter_json_objects(src, ValueError, what="branch points")]
  demos = rubric_demos(rows, seed=config.seed, per_branch=per_branch)
  return write_jsonl_atomic(config.sft.demos, demos)
