"""DAC's labels, rewards and hard-positive augmentation (host side, over strings and documents).

The paper (DAC, arXiv:2606.10684, its appendix on EM-based verification) fixes only the two
labels, both "EM-based after basic normalization":

  sufficiency  S(E) = 1 iff some document of the evidence set E contains a gold answer as an
               exact string (`sufficient`; whole words by default, see `contains_answer`)
  correctness  C(a) = 1 iff the answer equals a gold answer (`exact_match`); the abstention
               answer is never correct (`is_abstention`)

The reward tables are our reading (the paper is silent; config.dac.alpha,
insufficient_answer_penalty, searcher_reward in configs/base.py), per generator answer g of
evidence set e (m answers per set) and per searcher trajectory e:

  generator   answered, C = 1            -> 1
              abstained, S = 0           -> alpha
              abstained, S = 1           -> 0
              answered wrongly, S = 1    -> 0
              answered wrongly, S = 0    -> -insufficient_answer_penalty
              no valid answer            -> invalid_reward (rl.format_penalty when penalized)
  searcher    "sufficient_answered"  S_e * mean_g 1[g answered, not an abstention]
              "sufficient_only"      S_e
              "correct"              S_e * mean_g C_g   (the monolithic credit, as a control)

Hard-positive augmentation (training only; the paper names it, its details are our reading:
config.dac.augment_rate, augment_k, augment_depth): a share of the sufficient evidence sets gets
k documents that the retriever returned for the searcher's own queries but that hold no gold
answer (the top-ranked ones: "hard"), and the set is shuffled.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agentjax.answers import normalize_answer
from agentjax.retrieval import Document
# The evidence labels live in rl/ (every run logs sufficiency_rate); DAC's names for them.
from agentjax.rl.evidence import (SUFFICIENCY_MATCHES, contains_answer, evidence_set,  # noqa: F401
                                  sufficient)
from agentjax.rl.rewards import exact_match

SEARCHER_REWARDS = ("sufficient_answered", "sufficient_only", "correct")


def is_abstention(answer: str | None, abstain_text: str) -> bool:
  """Whether the answer is the abstention answer (equal after normalization)."""
  return answer is not None and normalize_answer(answer) == normalize_answer(abstain_text)


def correct(answer: str | None, golds: str | Sequence[str], abstain_text: str) -> bool:
  """C: exact match with a gold answer; an abstention never counts (even against a gold that
  normalizes to the same words)."""
  return answer is not None and not is_abstention(answer, abstain_text) and \
      exact_match(answer, golds) > 0


def generator_rewards(answered: np.ndarray, abstained: np.ndarray, is_correct: np.ndarray,
                      is_sufficient: np.ndarray, alpha: float,
                      insufficient_answer_penalty: float = 0.0,
                      invalid_reward: float = 0.0) -> np.ndarray:
  """[N] float32 generator rewards (module docstring).

  Args:
    answered: [N] bool, the generator gave a valid <answer> (an abstention included).
    abstained: [N] bool, that answer is the abstention answer.
    is_correct: [N] bool, C of the answer (False for abstentions and non-answers).
    is_sufficient: [N] bool, S of the evidence set the answer was given on.
  """
  answered, abstained = np.asarray(answered, bool), np.asarray(abstained, bool)
  is_correct, is_sufficient = np.asarray(is_correct, bool), np.asarray(is_sufficient, bool)
  r = np.where(is_correct, 1.0, np.where(is_sufficient, 0.0, -insufficient_answer_penalty))
  r = np.where(abstained, np.where(is_sufficient, 0.0, alpha), r)
  return np.where(answered, r, invalid_reward).astype(np.float32)


def abstention_threshold(p_insufficient: float, accuracy_sufficient: float,
                         accuracy_insufficient: float = 0.0,
                         insufficient_answer_penalty: float = 0.0) -> float:
  """alpha*: the abstention reward at which a generator that cannot tell S = 0 from S = 1 is
  indifferent between answering everything and abstaining on everything (generator_rewards):
  answering earns c1 P(S = 1) + (c0 - (1 - c0) penalty) P(S = 0), abstaining alpha P(S = 0). With
  c0 = penalty = 0 it is the paper's trade-off c_G P(S = 1) / P(S = 0) (DAC, arXiv:2606.10684,
  the appendix's abstention threshold: alpha against gamma c_G(1)); above it abstention pays more
  than answering wherever the generator is no surer than average, below it answering does.

  Args:
    p_insufficient: P(S = 0) of the evidence sets the generator is given.
    accuracy_sufficient: c1 = c_G, its accuracy (EM) when it answers on S = 1 sets.
    accuracy_insufficient: c0, its accuracy when it answers on S = 0 sets (lucky guesses).
  Returns:
    alpha* (inf when every set is sufficient).
  """
  p0 = float(p_insufficient)
  if not 0.0 <= p0 <= 1.0:
    raise ValueError(f"p_insufficient must be in [0, 1], got {p0}")
  if p0 == 0.0:
    return float("inf")
  c0 = float(accuracy_insufficient)
  answer = accuracy_sufficient * (1.0 - p0) + (c0 - (1.0 - c0) * insufficient_answer_penalty) * p0
  return float(answer / p0)


def searcher_rewards(is_sufficient: np.ndarray, answered: np.ndarray, abstained: np.ndarray,
                     is_correct: np.ndarray, mode: str = "sufficient_answered") -> np.ndarray:
  """[E] float32 searcher rewards, one per evidence set (module docstring).

  Args:
    is_sufficient: [E] bool.
    answered, abstained, is_correct: [E, m] bool, the m generator answers of each set.
  """
  if mode not in SEARCHER_REWARDS:
    raise ValueError(f"dac.searcher_reward={mode!r}: must be one of {SEARCHER_REWARDS}")
  s = np.asarray(is_sufficient, np.float32)
  if mode == "sufficient_only":
    return s
  if mode == "correct":
    return (s * np.asarray(is_correct, np.float32).mean(axis=1)).astype(np.float32)
  took = np.asarray(answered, bool) & ~np.asarray(abstained, bool)
  return (s * took.astype(np.float32).mean(axis=1)).astype(np.float32)


def distractor_candidates(hits_per_query: Sequence[Sequence[Document]], exclude: Sequence[Document],
                          golds: str | Sequence[str], match: str = "word") -> list[Document]:
  """The retriever's hits for a trajectory's queries that are not in the evidence set and hold no
  gold answer, hardest first: rank 1 of every query (in query order), then rank 2, ...;
  deduplicated by id."""
  seen = {d.id for d in exclude}
  out = []
  depth = max((len(h) for h in hits_per_query), default=0)
  for rank in range(depth):
    for hits in hits_per_query:
      if rank < len(hits):
        d = hits[rank]
        if d.id not in seen and not contains_answer(d.contents, golds, match):
          seen.add(d.id)
          out.append(d)
  return out


def augment(evidence: Sequence[Document], candidates: Sequence[Document], k: int,
            rng: np.random.Generator) -> tuple[Document, ...]:
  """The evidence set with the first k candidates added, the whole set shuffled by `rng`."""
  docs = list(evidence) + list(candidates[:k])
  return tuple(docs[i] for i in rng.permutation(len(docs)))


__all__ = ["SEARCHER_REWARDS", "SUFFICIENCY_MATCHES", "augment", "contains_answer", "correct",
           "distractor_candidates", "evidence_set", "generator_rewards", "is_abstention",
           "searcher_rewards", "sufficient"]
