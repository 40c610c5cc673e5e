"""`python launch/bench.py rewards`: host-side outcome rewards against plain Python; the format rule
(bench_rewards)."""

from __future__ import annotations

import re

from agentjax.benchmarks.common import FLAGS, median_seconds


def bench_rewards() -> dict:
  """Host-side scoring of one step: outcome_rewards (F1, 5000 rows of 2 aliases) against a
  plain-Python character-loop F1 (the SQuAD script's), and the protocol's format rule over 2000
  five-turn trajectories (microseconds per trajectory). These were timing asserts in the tests."""
  import string
  from collections import Counter

  import numpy as np

  from agentjax.agent.protocol import SEARCH_R1
  from agentjax.rl.rewards import outcome_rewards

  rng = np.random.default_rng(0)
  words = ["the", "a", "Cat", "dog", "Paris", "U.S.", "it's", "New-York", "1,000", "naïve"]
  answer = lambda: " ".join(rng.choice(words, rng.integers(1, 6)))  # noqa: E731
  preds = [answer() for _ in range(5000)]
  golds = [[answer(), answer()] for _ in preds]

  def ref_f1(pred, gold):
    norm = lambda s: re.sub(r"\b(a|an|the)\b", " ", "".join(  # noqa: E731
        ch for ch in s.lower() if ch not in string.punctuation)).split()
    p, g = norm(pred), norm(gold)
    same = sum((Counter(p) & Counter(g)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))

  ours = lambda: outcome_rewards(preds, golds)  # noqa: E731
  reference = lambda: [max(ref_f1(p, g) for g in gs) for p, gs in zip(preds, golds)]  # noqa: E731
  max_abs_diff = float(np.abs(ours() - np.asarray(reference(), np.float32)).max())
  t_ours, t_ref = median_seconds(ours, FLAGS.repeats), median_seconds(reference, FLAGS.repeats)
  turn = "<think>" + "reasoning " * 50 + "</think>\n<search> capital of Orsk </search>"
  trajectories = [[turn] * 4 + ["<think>so</think>\n<answer> Paris </answer>"]] * 2000
  check = lambda: [SEARCH_R1.format_error(t) for t in trajectories]  # noqa: E731
  if any(check()):
    raise AssertionError("bench trajectories must be well-formed")
  t_format = median_seconds(check, FLAGS.repeats)
  return {"bench": "rewards", "reference_over_ours": round(t_ref / t_ours, 2),
          "rewards_s": round(t_ours, 4), "reference_s": round(t_ref, 4),
          "max_abs_diff": max_abs_diff, "rows": len(preds),
          "format_us_per_trajectory": round(1e6 * t_format / len(trajectories), 2),
          "device": "host (Python)"}
