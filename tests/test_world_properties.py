"""agentjax/studies/world_properties.py: which turns retrieve a new gold document, the IG pairs,
rounds per correct trajectory and the correlation, on hand-made trajectories (the measurement
itself runs the backbone: launch/backbone.py --stages=properties)."""

from __future__ import annotations

import numpy as np
import pytest

from agentjax.agent.protocol import Action
from agentjax.agent.trajectories import TurnRecord
from agentjax.retrieval import Document
from agentjax.studies import world_properties as wp

# 2 hops: Alpha Corp -> Bob Smith -> (answer) Paris
Q = {"question": "Where was the founder of Alpha Corp born?", "golden_answers": ["Paris"],
     "chain": ["Alpha Corp", "Bob Smith", "Paris"], "hops": 2}


def _doc(title, i=0):
  return Document(id=f"{title}{i}", contents=f'"{title}"\n{title} text.', score=1.0)


def _search(*titles):
  return TurnRecord(text="", action=Action("search", "q"), documents=tuple(map(_doc, titles)))


ANSWER = TurnRecord(text="", action=Action("answer", "Paris"))


def test_new_gold_marks_the_turns_that_resolve_a_hop_first():
  turns = [_search("Zed"), _search("Alpha Corp"), _search("Alpha Corp", "Zed"),
           _search("Bob Smith", "Alpha Corp"), ANSWER]
  assert wp.new_gold_per_turn(Q, turns).tolist() == [False, True, False, True, False]
  assert not wp.new_gold_per_turn({"question": "?"}, turns).any()  # no gold chain


def test_ig_pairs_rounds_and_correlation_against_numpy():
  rows = [[_search("Alpha Corp"), _search("Bob Smith"), ANSWER],   # 2 useful rounds, correct
          [_search("Zed"), _search("Alpha Corp"), ANSWER],         # 1 useful of 2, wrong
          [_search("Zed"), _search("Zed")],                        # truncated: 2 rounds
          [ANSWER]]                                                # no round, correct
  num_turns = np.array([len(r) for r in rows])
  ig = np.array([[0.5, 0.7, 9.0], [-0.1, 0.4, 9.0], [0.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
  gains, hits = wp.ig_pairs(ig, num_turns, [Q] * 4, rows)
  # non-answer turns k < num_turns - 1: row 0 k=0,1; row 1 k=0,1; row 2 k=0 (its last turn has
  # no IG, as IGPO reads it); row 3 none.
  assert gains == [0.5, 0.7, -0.1, 0.4, 0.0]
  assert hits == [True, True, False, True, False]
  assert wp.correlation(gains, hits) == pytest.approx(np.corrcoef(gains, hits)[0, 1])
  assert np.isnan(wp.correlation([1.0, 2.0], [True, True]))
  correct = np.array([True, False, False, True])
  assert wp.rounds_per_correct(rows, correct) == pytest.approx((2 + 0) / 2)
  assert np.isnan(wp.rounds_per_correct(rows, np.zeros(4, bool)))


def test_fallback_reasons_mirror_the_cw_estimators_all_zero_rule():
  """Against the estimator itself: the trajectories where fallback_reasons says the all-zero
  fallback fires are those advantages._cw_round_advantages flags (positive advantage, K >= 1,
  no contributing non-answer round), and the reasons split them."""
  import jax.numpy as jnp
  from agentjax.rl.advantages import _cw_round_advantages
  rng = np.random.default_rng(0)
  b, t = 40, 4
  num_turns = rng.integers(1, t + 1, b)
  judged = np.arange(t)[None, :] < num_turns[:, None]
  retrieval = (rng.random((b, t)) < 0.4) & judged
  thinking = (rng.random((b, t)) < 0.5) & judged
  correct = rng.random(b) < 0.5
  got = wp.fallback_reasons(retrieval, thinking, judged, num_turns, correct)
  adv = np.where(correct, 1.0, -1.0)
  _, fires, positive = _cw_round_advantages(jnp.asarray(adv), jnp.asarray(retrieval, jnp.int32),
                                            jnp.asarray(thinking, jnp.int32),
                                            jnp.asarray(num_turns), 100.0, 10.0, "uniform")
  fires, positive = np.asarray(fires), np.asarray(positive)
  assert got["fallback_share"] == pytest.approx(fires.sum() / positive.sum())
  assert got["judged_correct"] == correct.sum()
  assert got["no_round_share"] == pytest.approx(np.mean(num_turns[correct] == 1))
  k = np.arange(t)[None, :] < (num_turns - 1)[:, None]
  nothing = ~(retrieval & k).any(1)
  assert got["of_which_nothing_retrieved"] == pytest.approx(nothing[fires].mean())
  assert got["of_which_thinking_zero"] == pytest.approx(1 - nothing[fires].mean())


def test_chunked_rows_give_the_whole_batchs_entropy_reduction_and_bits():
  """measure() rolls out in chunks whose turn axes differ: pad_concat stacks them, and the
  reduction of the stacked chunks is the NumPy mean over all rows with K >= 1 of
  v[b, K] - v[b, 0]; a row's entries at or past its num_turns are never read."""
  from agentjax.rl.advantages import gt_entropy_reduction
  rng = np.random.default_rng(1)
  chunks = [(rng.normal(size=(3, 4)), np.array([1, 3, 4])),
            (rng.normal(size=(2, 2)), np.array([2, 1])), (rng.normal(size=(1, 5)), np.array([5]))]
  v = wp.pad_concat([c[0] for c in chunks])
  num_turns = np.concatenate([c[1] for c in chunks])
  assert v.shape == (6, 5)
  np.testing.assert_array_equal(v[3:5, 2:], 0.0)
  want = np.mean([c[0][b, n - 1] - c[0][b, 0] for c in chunks for b, n in enumerate(c[1])
                  if n >= 2])
  assert float(gt_entropy_reduction(v, num_turns)) == pytest.approx(want, rel=1e-6)
  bits = wp.pad_concat([np.ones((2, 3), bool), np.ones((1, 1), bool)])
  assert bits.dtype == bool and bits.sum() == 7 and not bits[2, 1:].any()
