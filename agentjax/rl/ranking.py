"""Rankings of a few candidates: average ranks, Spearman, Borda, and agreement measures.

    ranks = average_ranks(scores, descending=True)       # [..., K] 1 = best, ties averaged
    rho = spearman(rubric_ranks, expert_ranks, nan_value=jnp.nan)    # [...]
    expert = borda_to_ranking(borda(judge_rankings))     # [..., J, K] -> [..., K]
    keep = diverse_select(texts, k=4)                    # host: dedup + greedy BM25 diversity

Co-ReAct's reward (arXiv:2605.23590, abstract; the official rubric_rl/reward_fn.py) compares the
ranking a rubric induces over K candidate actions with an expert consensus ranking: J judges rank
the candidates (1 = best, ties allowed, tied candidates get the average of the ranks they span),
Borda sums the judges' ranks (lower is better), and the expert ranking is the average ranks of the
Borda scores, ascending: {A: 4, B: 7.5, C: 10, D: 7.5} -> [1, 2.5, 4, 2.5] (the official
`borda_to_ranking`).

Array functions are jittable jnp, batched over any leading axes, with K (the last axis) small
(4 in the paper): ranks are counted with O(K^2) pairwise comparisons rather than a sort, which is
exact for ties and needs no scatter. `dedup_texts` and `diverse_select` are host-side Python.
"""

from __future__ import annotations

import re
from typing import Sequence

import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------------
# Ranks and correlation (jnp, jittable).
# ---------------------------------------------------------------------------------------------


def average_ranks(x, descending: bool = False):
  """1-based ranks over the last axis, ties given the average of the ranks they span.

  Args:
    x: [..., K] values (any real dtype).
    descending: False: the smallest value gets rank 1 (scipy.stats.rankdata's "average");
      True: the largest gets rank 1.
  Returns:
    [..., K] float32 ranks; each row sums to K (K + 1) / 2.
  """
  x = jnp.asarray(x, jnp.float32)
  if descending:
    x = -x
  xi, xj = x[..., :, None], x[..., None, :]
  # rank_i = 1 + #{j: x_j < x_i} + (#{j != i: x_j == x_i}) / 2; the diagonal counts in `equal`.
  less = jnp.sum(xj < xi, axis=-1).astype(jnp.float32)
  equal = jnp.sum(xj == xi, axis=-1).astype(jnp.float32)
  return 1.0 + less + 0.5 * (equal - 1.0)


def spearman(a, b, nan_value=jnp.nan):
  """Tie-aware Spearman correlation over the last axis: Pearson of the average ranks.

  Equals scipy.stats.spearmanr(a, b).statistic per row. A row where either input is constant
  (zero rank variance, which includes K = 1) has no correlation: scipy's NaN, here `nan_value`.

  Args:
    a, b: [..., K] values (broadcastable leading axes, same K).
  Returns:
    [...] float32 in [-1, 1] (or nan_value).
  """
  ra, rb = average_ranks(a), average_ranks(b)
  ra = ra - jnp.mean(ra, axis=-1, keepdims=True)
  rb = rb - jnp.mean(rb, axis=-1, keepdims=True)
  cov = jnp.sum(ra * rb, axis=-1)
  var = jnp.sum(ra * ra, axis=-1) * jnp.sum(rb * rb, axis=-1)
  # Ranks are multiples of 0.5, so a constant row has exactly zero variance (no epsilon needed);
  # the safe denominator keeps the unused branch of `where` finite under jit / grad.
  ok = var > 0
  rho = cov / jnp.sqrt(jnp.where(ok, var, 1.0))
  return jnp.where(ok, jnp.clip(rho, -1.0, 1.0), jnp.asarray(nan_value, jnp.float32))


def borda(rankings):
  """Borda scores: the sum over judges of their ranks (lower = better).

  Args:
    rankings: [..., J, K] each judge's ranks of the K candidates (1 = best, ties averaged).
  Returns:
    [..., K] float32.
  """
  return jnp.sum(jnp.asarray(rankings, jnp.float32), axis=-2)


def borda_to_ranking(scores):
  """The consensus ranking of Borda scores: average ranks, ascending ([..., K] -> [..., K])."""
  return average_ranks(scores)


def pairwise_accuracy(pred_ranks, expert_ranks, nan_value=jnp.nan):
  """Agreement of two rankings on the expert's strictly ordered pairs (1 = best in both).

  Over the pairs i < j whose expert ranks differ: 1 when pred orders them the same way, 0.5 when
  pred ties them, 0 when it reverses them; the mean over those pairs.

  Args:
    pred_ranks, expert_ranks: [..., K] ranks (or any values where lower = better).
    nan_value: the result for a row with no strictly ordered expert pair (all tied, or K < 2).
  Returns:
    [...] float32 in [0, 1] (or nan_value).
  """
  p = jnp.asarray(pred_ranks, jnp.float32)
  e = jnp.asarray(expert_ranks, jnp.float32)
  dp = jnp.sign(p[..., :, None] - p[..., None, :])
  de = jnp.sign(e[..., :, None] - e[..., None, :])
  k = p.shape[-1]
  upper = jnp.triu(jnp.ones((k, k), bool), 1)
  counted = upper & (de != 0)
  # dp * de: +1 agree, 0 pred tie, -1 reversed  ->  (1 + dp * de) / 2 in {1, 0.5, 0}.
  credit = jnp.where(counted, 0.5 * (1.0 + dp * de), 0.0)
  n = jnp.sum(counted, axis=(-2, -1)).astype(jnp.float32)
  acc = jnp.sum(credit, axis=(-2, -1)) / jnp.maximum(n, 1.0)
  return jnp.where(n > 0, acc, jnp.asarray(nan_value, jnp.float32))


def top1_match(pred_ranks, expert_ranks):
  """The share of pred's best candidates that are among the expert's best.

  |pred's best set ∩ expert's best set| / |pred's best set|, the best set of a ranking being the
  candidates with its minimum rank (several when tied for first).

  Args:
    pred_ranks, expert_ranks: [..., K] ranks (lower = better), K >= 1.
  Returns:
    [...] float32 in [0, 1].
  """
  p = jnp.asarray(pred_ranks, jnp.float32)
  e = jnp.asarray(expert_ranks, jnp.float32)
  p_best = p == jnp.min(p, axis=-1, keepdims=True)
  e_best = e == jnp.min(e, axis=-1, keepdims=True)
  both = jnp.sum(p_best & e_best, axis=-1).astype(jnp.float32)
  return both / jnp.sum(p_best, axis=-1).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Candidate texts (host).
# ---------------------------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
  """A candidate text as dedup compares it: whitespace collapsed, stripped, lowercased."""
  return _SPACES.sub(" ", text).strip().lower()


def dedup_texts(texts: Sequence[str]) -> list[int]:
  """Indices of the first occurrence of each distinct text (normalize_text), in order; texts
  that normalize to "" are dropped."""
  seen: set[str] = set()
  keep = []
  for i, text in enumerate(texts):
    key = normalize_text(text)
    if key and key not in seen:
      seen.add(key)
      keep.append(i)
  return keep


def bm25_similarity(texts: Sequence[str], stopwords: str | None = "en") -> np.ndarray | None:
  """[n, n] symmetric BM25 similarity of texts to each other, or None when nothing is indexable.

  sim[i, j] = (S[i, j] + S[j, i]) / 2 where S[i, j] is bm25s' score (lucene variant, default
  tokenization as agentjax.retrieval.bm25) of text i as a query against text j in an index of
  the n texts themselves: BM25 is asymmetric (document length normalization), the mean makes the
  similarity of a pair independent of which of the two was selected first. A text with no
  token (empty, punctuation only, or only stopwords) scores 0 against everything.
  """
  import bm25s  # imported here: a ranking-only user (the trainer's reward) never needs it

  tokens = bm25s.tokenize(list(texts), stopwords=stopwords, return_ids=False,
                          show_progress=False)
  tokens = [[t for t in row if t] for row in tokens]
  if not any(tokens):
    return None
  retriever = bm25s.BM25(backend="numpy")
  # An empty document is indexed as the empty token (bm25s' create_empty_token), which no query
  # holds: it keeps its row and column at 0.
  retriever.index([row or [""] for row in tokens], show_progress=False)
  n = len(tokens)
  s = np.zeros((n, n), np.float64)
  for i, row in enumerate(tokens):
    if row:
      s[i] = retriever.get_scores(row)
  return 0.5 * (s + s.T)


def diverse_select(texts: Sequence[str], k: int) -> list[int]:
  """Up to k indices into `texts`, deduplicated and greedily diverse under BM25.

  Dedup first (dedup_texts); then start from the first remaining text and repeatedly add the
  remaining text whose maximum BM25 similarity (bm25_similarity) to the texts already selected is
  lowest, ties going to the lowest index. When no text has an indexable token, the first k
  deduplicated texts.

  Returns:
    indices into `texts` in selection order, len = min(k, number of distinct texts).
  """
  if k < 0:
    raise ValueError(f"diverse_select: k must be >= 0, got {k}")
  unique = dedup_texts(texts)
  if len(unique) <= k:
    return unique
  if k == 0:
    return []
  sim = bm25_similarity([texts[i] for i in unique])
  if sim is None:
    return unique[:k]
  chosen = [0]
  closest = sim[0].copy()  # each text's max similarity to the selected set
  remaining = np.ones(len(unique), bool)
  remaining[0] = False
  while len(chosen) < k:
    # argmin returns the first minimum: the lowest index among ties.
    nxt = int(np.argmin(np.where(remaining, closest, np.inf)))
    chosen.append(nxt)
    remaining[nxt] = False
    closest = np.maximum(closest, sim[nxt])
  return [unique[c] for c in chosen]
