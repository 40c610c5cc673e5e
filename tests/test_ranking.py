"""Tests of agentjax.rl.ranking against scipy and plain-Python references written here."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from agentjax.rl import ranking

# scipy warns on the constant rows these tests include on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")

# One jit of each kernel, reused across tests (tiny shapes; a new shape retraces, cheaply).
JIT = {name: jax.jit(getattr(ranking, name), static_argnames=names)
       for name, names in (("average_ranks", ("descending",)), ("spearman", ()), ("borda", ()),
                           ("borda_to_ranking", ()), ("pairwise_accuracy", ()),
                           ("top1_match", ()))}


def both(name):
  """The eager function and its jit, for parametrizing."""
  return [getattr(ranking, name), JIT[name]]


def ref_average_ranks(row, descending=False):
  """Average 1-based ranks by sorting (ties: mean of the positions they occupy)."""
  row = [-v for v in row] if descending else list(row)
  order = sorted(range(len(row)), key=lambda i: row[i])
  ranks = [0.0] * len(row)
  pos = 0
  while pos < len(order):
    end = pos
    while end + 1 < len(order) and row[order[end + 1]] == row[order[pos]]:
      end += 1
    for q in range(pos, end + 1):
      ranks[order[q]] = (pos + end) / 2 + 1
    pos = end + 1
  return ranks


def ref_pairwise(pred, expert):
  credit = []
  for i, j in itertools.combinations(range(len(pred)), 2):
    if expert[i] == expert[j]:
      continue
    expert_says_i = expert[i] < expert[j]
    if pred[i] == pred[j]:
      credit.append(0.5)
    else:
      credit.append(1.0 if (pred[i] < pred[j]) == expert_says_i else 0.0)
  return sum(credit) / len(credit) if credit else None


def ref_top1(pred, expert):
  p_best = {i for i, v in enumerate(pred) if v == min(pred)}
  e_best = {i for i, v in enumerate(expert) if v == min(expert)}
  return len(p_best & e_best) / len(p_best)


# ---------------------------------------------------------------------------------------------
# average_ranks, spearman.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", both("average_ranks"))
@pytest.mark.parametrize("descending", [False, True])
def test_average_ranks_match_scipy_and_reference(fn, descending):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 3, size=(5, 3, 6)).astype(np.float32)  # many ties
  got = np.asarray(fn(x, descending=descending))
  assert got.shape == x.shape and got.dtype == np.float32
  sign = -1 if descending else 1
  np.testing.assert_allclose(got, scipy.stats.rankdata(sign * x, axis=-1))
  for idx in np.ndindex(x.shape[:-1]):
    np.testing.assert_allclose(got[idx], ref_average_ranks(x[idx].tolist(), descending))


def test_average_ranks_doc_example():
  np.testing.assert_allclose(ranking.average_ranks(np.array([4, 7.5, 10, 7.5])),
                             [1, 2.5, 4, 2.5])
  np.testing.assert_allclose(ranking.average_ranks(np.array([4, 7.5, 10, 7.5]), descending=True),
                             [4, 2.5, 1, 2.5])


@pytest.mark.parametrize("fn", both("spearman"))
def test_spearman_matches_scipy_with_ties(fn):
  rng = np.random.default_rng(1)
  for k in (2, 3, 4, 5, 8):
    a = rng.integers(0, 3, size=(40, k)).astype(np.float32)
    b = rng.integers(0, 4, size=(40, k)).astype(np.float32)
    got = np.asarray(fn(a, b, -7.0))
    assert got.shape == (40,)
    for row in range(40):
      ref = scipy.stats.spearmanr(a[row], b[row]).statistic
      if np.isnan(ref):
        assert got[row] == -7.0, (k, a[row], b[row])
      else:
        assert got[row] == pytest.approx(ref, abs=1e-5), (k, a[row], b[row])


def test_spearman_constant_input_is_nan_value():
  assert math.isnan(float(ranking.spearman(np.ones(4), np.arange(4.0))))
  assert float(ranking.spearman(np.ones(4), np.arange(4.0), nan_value=0.25)) == 0.25
  assert float(ranking.spearman(np.arange(4.0), np.full(4, 2.5), nan_value=0.0)) == 0.0
  assert float(ranking.spearman(np.ones(1), np.ones(1), nan_value=0.5)) == 0.5  # K = 1
  # Perfect agreement / reversal are exactly +-1.
  assert float(ranking.spearman(np.array([1, 2.5, 4, 2.5]), np.array([1, 2.5, 4, 2.5]))) == 1.0
  assert float(ranking.spearman(np.arange(4.0), -np.arange(4.0))) == -1.0


def test_spearman_batched_shapes_and_broadcast():
  rng = np.random.default_rng(2)
  a = rng.normal(size=(2, 3, 4))
  b = rng.normal(size=(3, 4))  # broadcast over the leading axis
  got = np.asarray(JIT["spearman"](a, b))
  assert got.shape == (2, 3)
  for i, j in np.ndindex(2, 3):
    assert got[i, j] == pytest.approx(scipy.stats.spearmanr(a[i, j], b[j]).statistic, abs=1e-5)


def test_spearman_under_vmap_and_nan_value_traced():
  a = jnp.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
  b = jnp.array([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
  got = jax.jit(jax.vmap(ranking.spearman, in_axes=(0, 0, None)))(a, b, jnp.float32(0.5))
  np.testing.assert_allclose(got, [-1.0, 0.5])


# ---------------------------------------------------------------------------------------------
# Borda.
# ---------------------------------------------------------------------------------------------


def numpy_borda_ranking(rankings):
  """Reference: Borda sums by loops, then the expert ranking through scipy's rankdata."""
  rankings = np.asarray(rankings, np.float64)
  *lead, j, k = rankings.shape
  out = np.zeros((*lead, k))
  for idx in np.ndindex(*lead):
    sums = [sum(rankings[idx][judge][c] for judge in range(j)) for c in range(k)]
    out[idx] = scipy.stats.rankdata(sums, method="average")
  return out


def test_borda_doc_example():
  # The official example: Borda scores {A: 4, B: 7.5, C: 10, D: 7.5} -> [1, 2.5, 4, 2.5].
  np.testing.assert_allclose(ranking.borda_to_ranking(np.array([4, 7.5, 10, 7.5])),
                             [1, 2.5, 4, 2.5])
  judges = np.array([[1, 2.5, 4, 2.5], [1, 3, 4, 2], [2, 1, 3, 4]], np.float32)
  np.testing.assert_allclose(ranking.borda(judges), [4, 6.5, 11, 8.5])
  np.testing.assert_allclose(ranking.borda_to_ranking(ranking.borda(judges)), [1, 2, 4, 3])


@pytest.mark.parametrize("fn", [lambda r: ranking.borda_to_ranking(ranking.borda(r)),
                                jax.jit(lambda r: ranking.borda_to_ranking(ranking.borda(r)))])
def test_borda_against_numpy_reference(fn):
  rng = np.random.default_rng(3)
  # Judges' rankings with ties: average ranks of small random integers.
  raw = rng.integers(0, 3, size=(6, 2, 3, 4))
  judges = scipy.stats.rankdata(raw, axis=-1)
  got = np.asarray(fn(judges.astype(np.float32)))
  assert got.shape == (6, 2, 4)
  np.testing.assert_allclose(got, numpy_borda_ranking(judges))


# ---------------------------------------------------------------------------------------------
# pairwise_accuracy, top1_match.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", both("pairwise_accuracy"))
def test_pairwise_accuracy_against_brute_force(fn):
  rng = np.random.default_rng(4)
  pred = scipy.stats.rankdata(rng.integers(0, 3, size=(60, 4)), axis=-1).astype(np.float32)
  expert = scipy.stats.rankdata(rng.integers(0, 3, size=(60, 4)), axis=-1).astype(np.float32)
  expert[0] = 2.5  # all tied: no ordered pair
  pred[1] = 2.5  # pred ties everything: 0.5 on every ordered pair
  got = np.asarray(fn(pred, expert, -1.0))
  assert got.shape == (60,)
  for row in range(60):
    ref = ref_pairwise(pred[row].tolist(), expert[row].tolist())
    assert got[row] == pytest.approx(-1.0 if ref is None else ref), (pred[row], expert[row])
  assert got[0] == -1.0
  if ref_pairwise(pred[1].tolist(), expert[1].tolist()) is not None:
    assert got[1] == 0.5


def test_pairwise_accuracy_hand_cases():
  assert float(ranking.pairwise_accuracy([1, 2, 3, 4], [1, 2, 3, 4])) == 1.0
  assert float(ranking.pairwise_accuracy([4, 3, 2, 1], [1, 2, 3, 4])) == 0.0
  # Expert pairs: (0,1) (0,2) (0,3) ordered, (1,2) (1,3) ordered, (2,3) tied -> 5 pairs.
  # pred [1, 1, 3, 4]: (0,1) pred tie -> 0.5; others agree -> (0.5 + 4) / 5.
  assert float(ranking.pairwise_accuracy([1, 1, 3, 4], [1, 2, 3.5, 3.5])) == pytest.approx(0.9)
  assert math.isnan(float(ranking.pairwise_accuracy([1, 2], [1.5, 1.5])))


@pytest.mark.parametrize("fn", both("top1_match"))
def test_top1_match_against_brute_force(fn):
  rng = np.random.default_rng(5)
  pred = scipy.stats.rankdata(rng.integers(0, 3, size=(60, 4)), axis=-1).astype(np.float32)
  expert = scipy.stats.rankdata(rng.integers(0, 3, size=(60, 4)), axis=-1).astype(np.float32)
  pred[0] = expert[0] = 2.5  # all equal in both: every candidate is best in both
  got = np.asarray(fn(pred, expert))
  for row in range(60):
    assert got[row] == pytest.approx(ref_top1(pred[row].tolist(), expert[row].tolist()))
  assert got[0] == 1.0
  # Hand cases: pred's best set {0, 1}, expert's {1} -> 1/2; disjoint -> 0.
  assert float(ranking.top1_match([1.5, 1.5, 3, 4], [2, 1, 3, 4])) == 0.5
  assert float(ranking.top1_match([1, 2, 3, 4], [2, 1, 3, 4])) == 0.0


# ---------------------------------------------------------------------------------------------
# dedup_texts, diverse_select (host).
# ---------------------------------------------------------------------------------------------


def test_dedup_texts_normalizes_and_drops_empty():
  texts = ["<search> where was Bavoli born </search>", "  <search>  where was BAVOLI\tborn "
           "</search>\n", "", "   ", "<answer> Ketrana City </answer>",
           "<answer> ketrana city </answer>", "<search> where was Bavoli born</search>"]
  assert ranking.dedup_texts(texts) == [0, 4, 6]
  assert ranking.dedup_texts([]) == []


def test_diverse_select_picks_the_most_dissimilar():
  texts = [
      "<search> where was Bavoli Drensk born </search>",              # 0: the start
      "<search> where was Bavoli Drensk born </search>",              # 1: duplicate of 0
      "<search> Bavoli Drensk birthplace born city </search>",        # 2: close to 0
      "<search> which country is Ketrana located in </search>",       # 3: unrelated to 0
      "<answer> Ketrana </answer>",                                   # 4: shares Ketrana with 3
      "<search> Bavoli Drensk born where </search>",                  # 5: very close to 0
  ]
  sim = ranking.bm25_similarity([texts[i] for i in (0, 2, 3, 4, 5)])
  np.testing.assert_allclose(sim, sim.T)
  # The greedy choice computed from the similarity matrix by hand: the second pick minimizes the
  # similarity to text 0, the third minimizes the max similarity to the two picked.
  cands = {2: 1, 3: 2, 4: 3, 5: 4}  # text index -> row of sim
  second = min(cands, key=lambda t: (sim[0, cands[t]], t))
  third = min((t for t in cands if t != second),
              key=lambda t: (max(sim[0, cands[t]], sim[cands[second], cands[t]]), t))
  got = ranking.diverse_select(texts, 3)
  assert got == [0, second, third]
  assert 1 not in got and 5 not in got  # the duplicate and the near-duplicate stay out
  assert second in (3, 4)  # no shared word with text 0 ("search" aside): the least similar


def test_diverse_select_sizes_and_fallbacks():
  texts = ["<answer> Bavoli </answer>", "<answer>   bavoli </answer>", "", "<search> Ketrana City "
           "</search>", "<search> Ketrana </search>"]
  every = ranking.dedup_texts(texts)
  assert ranking.diverse_select(texts, 10) == every  # k >= n: all deduplicated, in order
  assert ranking.diverse_select(texts, len(every)) == every
  assert len(ranking.diverse_select(texts, 2)) == 2
  assert ranking.diverse_select(texts, 2)[0] == 0
  assert ranking.diverse_select(texts, 0) == []
  assert ranking.diverse_select([], 3) == []
  # Nothing indexable (punctuation, stopwords only): the first k deduplicated.
  assert ranking.diverse_select(["?!", "the of", "a", ".."], 2) == [0, 1]
  with pytest.raises(ValueError, match="k must be"):
    ranking.diverse_select(texts, -1)


def test_diverse_select_ties_go_to_lowest_index():
  # Texts 1..3 share nothing with text 0 nor each other: all at similarity 0 -> index order.
  texts = ["alpha beta", "gamma delta", "epsilon zeta", "eta theta"]
  assert ranking.diverse_select(texts, 3) == [0, 1, 2]
