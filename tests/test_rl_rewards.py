"""Tests of agentjax.rl.rewards: answer normalization, EM/F1 against plain-Python references, and
outcome rewards. (The format rule is the protocol's: tests/test_protocol.py.)"""

from __future__ import annotations

import re
import string
from collections import Counter

import numpy as np
import pytest

from agentjax.rl import rewards as R

# ---------------------------------------------------------------------------------------------
# Independent references (character loops, as in the SQuAD script and the IGPO code).
# ---------------------------------------------------------------------------------------------


def ref_normalize_standard(s):
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def ref_normalize_igpo(s):
  s = s.lower()
  for p in string.punctuation:
    s = s.replace(p, " ")
  return re.sub(r"\s+", " ", s).strip()


def ref_f1_standard(pred, gold):
  p, g = ref_normalize_standard(pred).split(), ref_normalize_standard(gold).split()
  if not p or not g:
    return 0.0
  common = Counter(p) & Counter(g)
  same = sum(common.values())
  if same == 0:
    return 0.0
  prec, rec = same / len(p), same / len(g)
  return 2 * prec * rec / (prec + rec)


def ref_f1_igpo(pred, gold):
  p, g = set(ref_normalize_igpo(pred).split()), set(ref_normalize_igpo(gold).split())
  if not p or not g:
    return 0.0
  same = len(p & g)
  if same == 0:
    return 0.0
  prec, rec = same / len(p), same / len(g)
  return 2 * prec * rec / (prec + rec)


_WORDS = ["the", "a", "an", "cat", "Cat", "dog", "Paris", "paris", "U.S.", "it's", "New-York",
          "1,000", "x", "x", "theory", "another", "(born", "1990)", "“quoted”", "naïve", "\t",
          "..."]


def random_answer(rng):
  n = rng.integers(0, 6)
  seps = [" ", "  ", ",", ".", "!", "-", "\n"]
  out = ""
  for _ in range(n):
    out += str(rng.choice(_WORDS)) + str(rng.choice(seps))
  return out


# ---------------------------------------------------------------------------------------------
# Normalization and metrics.
# ---------------------------------------------------------------------------------------------


def test_normalize_hand_cases():
  assert R.normalize_answer("The  Eiffel Tower!") == "eiffel tower"
  assert R.normalize_answer("U.S.A.") == "usa"
  assert R.normalize_answer("an apple, a pear") == "apple pear"
  assert R.normalize_answer("theory") == "theory"  # articles only as whole words
  assert R.normalize_answer(None) == ""
  assert R.normalize_answer("U.S.A.", "igpo") == "u s a"
  assert R.normalize_answer("The  Eiffel-Tower!", "igpo") == "the eiffel tower"
  with pytest.raises(ValueError, match="unknown normalization"):
    R.normalize_answer("x", "squad2")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_normalize_and_metrics_match_reference(seed):
  rng = np.random.default_rng(seed)
  for _ in range(300):
    pred = random_answer(rng)
    golds = [random_answer(rng) for _ in range(rng.integers(1, 4))]
    assert R.normalize_answer(pred) == ref_normalize_standard(pred)
    assert R.normalize_answer(pred, "igpo") == ref_normalize_igpo(pred)
    np.testing.assert_allclose(R.f1_score(pred, golds),
                               max(ref_f1_standard(pred, g) for g in golds))
    np.testing.assert_allclose(R.f1_score(pred, golds, "igpo"),
                               max(ref_f1_igpo(pred, g) for g in golds))
    p_std = ref_normalize_standard(pred)
    em_std = float(bool(p_std) and any(p_std == ref_normalize_standard(g) for g in golds))
    assert R.exact_match(pred, golds) == em_std
    p_igpo = ref_normalize_igpo(pred)
    em_igpo = float(bool(p_igpo) and any(p_igpo == ref_normalize_igpo(g) for g in golds))
    assert R.exact_match(pred, golds, "igpo") == em_igpo


def test_metric_hand_cases():
  assert R.exact_match("The Cat", "cat") == 1.0
  assert R.exact_match("The Cat", "cat", "igpo") == 0.0  # igpo keeps articles
  assert R.exact_match("dog", ["cat", "Dog."]) == 1.0
  assert R.exact_match("", "") == 0.0 and R.exact_match(None, "x") == 0.0
  # Multiset vs set overlap: pred "x x y", gold "x y".
  np.testing.assert_allclose(R.f1_score("x x y", "x y"), 0.8)
  np.testing.assert_allclose(R.f1_score("x x y", "x y", "igpo"), 1.0)
  np.testing.assert_allclose(R.f1_score("paris france", ["lyon", "Paris"]), 2 / 3)
  assert R.f1_score("the", "a") == 0.0  # both normalize to empty
  assert R.f1_score(None, "x") == 0.0
  with pytest.raises(ValueError):
    R.f1_score("x", [])


def test_outcome_rewards():
  preds = ["The Cat", "dog house", None, "cat"]
  golds = [["cat"], "dog", "x", "cat"]
  f1 = R.outcome_rewards(preds, golds)
  assert f1.dtype == np.float32 and f1.shape == (4,)
  np.testing.assert_allclose(f1, [1.0, 2 / 3, 0.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(R.outcome_rewards(preds, golds, metric="em"), [1, 0, 0, 1])
  out = R.outcome_rewards(preds, golds, format_ok=[True, True, False, False], format_penalty=-2.0)
  np.testing.assert_allclose(out, [1.0, 2 / 3, -2.0, -2.0], rtol=1e-6)
  np.testing.assert_allclose(R.outcome_rewards(["the cat"], ["cat"], metric="em",
                                               normalization="igpo"), [0.0])
  with pytest.raises(ValueError, match="unknown metric"):
    R.outcome_rewards(preds, golds, metric="acc")
  with pytest.raises(ValueError):
    R.outcome_rewards(preds, golds[:2])
  with pytest.raises(ValueError):
    R.outcome_rewards(preds, golds, format_ok=[True])


def test_outcome_rewards_match_reference_on_a_random_batch():
  """The batched rewards (one np.fromiter pass, aliases, format penalty) equal the per-row
  references. Its speed is measured by `python launch/bench.py rewards`, not asserted here."""
  rng = np.random.default_rng(0)
  preds = [random_answer(rng) for _ in range(400)] + [None]
  golds = [[random_answer(rng), random_answer(rng)] for _ in range(len(preds))]
  ok = rng.random(len(preds)) < 0.8
  out = R.outcome_rewards(preds, golds, format_ok=ok, format_penalty=-2.0)
  want = [max(ref_f1_standard(p or "", g) for g in gs) if k else -2.0
          for p, gs, k in zip(preds, golds, ok)]
  np.testing.assert_allclose(out, want, rtol=1e-6)
  em = R.outcome_rewards(preds, golds, metric="em", normalization="igpo")
  want_em = [float(bool(ref_normalize_igpo(p or "")) and any(
      ref_normalize_igpo(p or "") == ref_normalize_igpo(g) for g in gs))
      for p, gs in zip(preds, golds)]
  np.testing.assert_array_equal(em, want_em)
