"""Outcome rewards of search-agent trajectories (host side, over Python strings).

  r = outcome_rewards(batch.answers, golds, metric="f1", format_ok=batch.format_valid,
                      format_penalty=-2.0)  # [B] f32

The answers and the format verdict come from the rollout, which parses each turn with the
protocol: agentjax/agent/protocol.py holds the one definition of a well-formed trajectory (and of
what an answer is); nothing here re-parses trajectory text.

Answer matching comes in two normalizations:

  "standard"  SQuAD / Search-R1 / FlashRAG: lowercase, delete punctuation, drop the articles
              a/an/the, collapse whitespace; F1 counts token overlap with multiplicity (Counter).
  "igpo"      the IGPO reference code: lowercase, punctuation replaced by a space, articles kept,
              whitespace collapsed; F1 over word sets (duplicates ignored).

`golds` may be one string or a list of aliases; every metric takes the max over aliases.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence, Union

import numpy as np

from agentjax.answers import NORMALIZATIONS as _NORMALIZATIONS
from agentjax.answers import normalize_answer

Golds = Union[str, Sequence[str]]

_METRICS = ("f1", "em")


# ---------------------------------------------------------------------------------------------
# Answer metrics (the normalization lives in agentjax/answers.py, shared with the judges).
# ---------------------------------------------------------------------------------------------


def _as_list(golds: Golds) -> list[str]:
  if isinstance(golds, str):
    return [golds]
  golds = list(golds)
  if not golds:
    raise ValueError("golds must hold at least one answer string")
  return golds


def _f1_tokens(pred: list[str], gold: list[str], use_sets: bool) -> float:
  """Token F1 between two already-normalized token lists (0 when either is empty)."""
  if not pred or not gold:
    # An empty prediction or gold matches nothing; SQuAD-v1 and IGPO both score this 0.
    return 0.0
  if use_sets:
    pred_c, gold_c = set(pred), set(gold)
    same = len(pred_c & gold_c)
    n_pred, n_gold = len(pred_c), len(gold_c)
  else:
    same = sum((Counter(pred) & Counter(gold)).values())
    n_pred, n_gold = len(pred), len(gold)
  if same == 0:
    return 0.0
  precision, recall = same / n_pred, same / n_gold
  return 2.0 * precision * recall / (precision + recall)


def exact_match(pred: str | None, golds: Golds, normalization: str = "standard") -> float:
  """1.0 if the normalized prediction equals any normalized gold alias, else 0.0.

  An empty (or None) prediction never matches, even an empty gold.
  """
  p = normalize_answer(pred, normalization)
  if not p:
    return 0.0
  return float(any(p == normalize_answer(g, normalization) for g in _as_list(golds)))


def f1_score(pred: str | None, golds: Golds, normalization: str = "standard") -> float:
  """Token-level F1, max over gold aliases.

  "standard": multiset overlap (Counter &), as in SQuAD. "igpo": word-set overlap. No special
  casing of yes/no answers (plain token overlap already scores "yes" vs "no" as 0).
  """
  use_sets = normalization == "igpo"
  pred_tokens = normalize_answer(pred, normalization).split()
  return max(_f1_tokens(pred_tokens, normalize_answer(g, normalization).split(), use_sets)
             for g in _as_list(golds))


def outcome_rewards(preds: Sequence[str | None], golds: Sequence[Golds], metric: str = "f1",
                    format_ok: Sequence[bool] | np.ndarray | None = None,
                    format_penalty: float = 0.0, normalization: str = "standard") -> np.ndarray:
  """Outcome reward of each trajectory.

  Args:
    preds: B extracted answers (None where the trajectory gave none).
    golds: B gold answers, each a string or a list of aliases.
    metric: "f1" or "em".
    format_ok: optional B bools (TrajectoryBatch.format_valid: agent.protocol's rule); where False
      the reward is `format_penalty` instead of the metric (IGPO used -2.0).
    format_penalty: reward of a malformed trajectory.
    normalization: "standard" or "igpo".
  Returns:
    [B] float32.
  """
  if metric not in _METRICS:
    raise ValueError(f"unknown metric {metric!r}; known: {_METRICS}")
  if normalization not in _NORMALIZATIONS:
    raise ValueError(f"unknown normalization {normalization!r}; known: {_NORMALIZATIONS}")
  if len(preds) != len(golds):
    raise ValueError(f"{len(preds)} predictions but {len(golds)} golds")
  fn = f1_score if metric == "f1" else exact_match
  out = np.fromiter((fn(p, g, normalization) for p, g in zip(preds, golds)), dtype=np.float32,
                    count=len(preds))
  if format_ok is not None:
    ok = np.asarray(format_ok, dtype=bool)
    if ok.shape != out.shape:
      raise ValueError(f"format_ok has shape {ok.shape}, expected {out.shape}")
    out = np.where(ok, out, np.float32(format_penalty)).astype(np.float32)
  return out
