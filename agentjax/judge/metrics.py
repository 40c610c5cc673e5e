"""The trainer's judge metrics (logged under "judge/..."), from a step's [B, T] verdict arrays.

    m = judge_metrics(retrieval, thinking, judged, num_turns, answer_round_judged=True)
    m.update(agreement(ret, think, oracle_ret, oracle_think, judged))

Rounds: round t of row b exists for t < num_turns[b]; its answer round is t = num_turns[b] - 1.
`judged` marks the rounds that got a verdict. With answer_round_judged the judged rounds of a
row include its answer round (config judge.answer_round, the CW-GRPO code's protocol), which then
counts in the per-round means but never in the contribution metrics: a contribution
c = retrieval * thinking is defined for the K non-answer rounds only (the official CW-GRPO code,
verl/trainer/ppo/core_algos.py `compute_cw_grpo_advantage`; the paper gives no formula). Without
it, every judged round is a non-answer round.

Concentration of credit within a trajectory (CW-GRPO, arXiv:2604.14267, abstract: successful
trajectories concentrate their contributions in specific rounds; the paper names no metric, the
Gini coefficient is our reading) is the Gini coefficient of its c over its K non-answer rounds:
for binary c with m ones, (K - m) / K when m > 0: 0 when every round contributed, 1 - 1/K when
one round carries it all.
"""

from __future__ import annotations

import numpy as np


def gini(c: np.ndarray) -> float:
  """The Gini coefficient sum_i sum_j |c_i - c_j| / (2 n^2 mean(c)) of a nonnegative vector.

  0 for a vector of length <= 1, of equal entries, or of zeros (no credit is not concentrated).
  Computed from the sorted values: sum_ij |c_i - c_j| = 2 sum_i (2i - n - 1) c_(i), i = 1..n.
  """
  c = np.asarray(c, np.float64)
  if c.ndim != 1:
    raise ValueError(f"gini: expected a 1-D vector, got shape {c.shape}")
  if np.any(c < 0) or not np.all(np.isfinite(c)):
    raise ValueError("gini: entries must be finite and nonnegative")
  n, total = c.size, c.sum()
  if n <= 1 or total == 0:
    return 0.0
  i = np.arange(1, n + 1)
  return float(np.sum((2 * i - n - 1) * np.sort(c)) / (n * total))


def _round_masks(judged: np.ndarray, num_turns: np.ndarray, answer_round_judged: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
  """([B, T] judged rounds, [B, T] judged non-answer rounds), validated against num_turns."""
  judged = np.asarray(judged, bool)
  num_turns = np.asarray(num_turns)
  if judged.ndim != 2 or num_turns.shape != judged.shape[:1]:
    raise ValueError(f"judge metrics: judged must be [B, T] and num_turns [B], got "
                     f"{judged.shape} and {num_turns.shape}")
  t = np.arange(judged.shape[1])[None, :]
  if np.any(judged & (t >= num_turns[:, None])):
    rows = np.flatnonzero(np.any(judged & (t >= num_turns[:, None]), axis=1))
    raise ValueError(f"judge metrics: rows {rows.tolist()} have judged rounds at or beyond "
                     f"num_turns (padding)")
  non_answer = judged
  if answer_round_judged:
    non_answer = judged & (t != num_turns[:, None] - 1)
  return judged, non_answer


def judge_metrics(retrieval: np.ndarray, thinking: np.ndarray, judged: np.ndarray,
                  num_turns: np.ndarray, answer_round_judged: bool) -> dict[str, float]:
  """The step's judge metrics (keys without the "judge/" prefix, which the trainer adds).

  Args:
    retrieval, thinking: [B, T] 0/1 bits (read only where judged).
    judged: [B, T] bool rounds with a verdict (none at t >= num_turns[b]).
    num_turns: [B] rounds per row; row b's answer round is num_turns[b] - 1.
    answer_round_judged: whether the judged rounds include each judged row's answer round.
  Returns:
    "rounds": judged rounds; "retrieval_mean", "thinking_mean": means over judged rounds;
    "contribution_share": share of judged non-answer rounds with c = 1; "gini": mean over
    judged rows with K >= 2 judged non-answer rounds of gini(c over those rounds). Every mean
    is 0 when it has nothing to average.
  """
  judged, non_answer = _round_masks(judged, num_turns, answer_round_judged)
  ret = np.asarray(retrieval) != 0
  think = np.asarray(thinking) != 0
  if ret.shape != judged.shape or think.shape != judged.shape:
    raise ValueError(f"judge metrics: retrieval {ret.shape} and thinking {think.shape} must "
                     f"match judged {judged.shape}")
  contribution = ret & think
  n = judged.sum()
  n_non_answer = non_answer.sum()
  ginis = [gini(contribution[b][non_answer[b]].astype(np.float64))
           for b in range(judged.shape[0]) if non_answer[b].sum() >= 2]
  return {
      "rounds": float(n),
      "retrieval_mean": float(ret[judged].mean()) if n else 0.0,
      "thinking_mean": float(think[judged].mean()) if n else 0.0,
      "contribution_share": float(contribution[non_answer].mean()) if n_non_answer else 0.0,
      "gini": float(np.mean(ginis)) if ginis else 0.0,
  }


def agreement(a_ret: np.ndarray, a_think: np.ndarray, b_ret: np.ndarray, b_think: np.ndarray,
              judged: np.ndarray) -> dict[str, float]:
  """Share of judged rounds where two judges' bits agree (e.g. a judge against the oracle).

  All arrays [B, T]; returns {"agreement_retrieval", "agreement_thinking"} (0 when nothing is
  judged, like the other means).
  """
  judged = np.asarray(judged, bool)
  arrays = {"a_ret": a_ret, "a_think": a_think, "b_ret": b_ret, "b_think": b_think}
  for name, x in arrays.items():
    if np.shape(x) != judged.shape:
      raise ValueError(f"agreement: {name} has shape {np.shape(x)}, judged {judged.shape}")
  if not judged.any():
    return {"agreement_retrieval": 0.0, "agreement_thinking": 0.0}
  same_ret = (np.asarray(a_ret) != 0) == (np.asarray(b_ret) != 0)
  same_think = (np.asarray(a_think) != 0) == (np.asarray(b_think) != 0)
  return {"agreement_retrieval": float(same_ret[judged].mean()),
          "agreement_thinking": float(same_think[judged].mean())}
