"""Tests of agentjax.rl.rewards: answer normalization, EM/F1 against plain-Python references, the
format state machine on valid and malformed trajectories, and outcome rewards."""

from __future__ import annotations

import re
import string
import time
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


def test_outcome_rewards_is_fast():
  rng = np.random.default_rng(0)
  preds = [random_answer(rng) for _ in range(5000)]
  golds = [[random_answer(rng), random_answer(rng)] for _ in range(5000)]
  t0 = time.perf_counter()
  R.outcome_rewards(preds, golds)
  R.outcome_rewards(preds, golds, metric="em", normalization="igpo")
  assert time.perf_counter() - t0 < 5.0  # ~0.07 s here; generous for shared machines


# ---------------------------------------------------------------------------------------------
# Format checks.
# ---------------------------------------------------------------------------------------------

T, S, I, A = "<think>r</think>", "<search>q</search>", "<information>docs</information>", \
    "<answer>x</answer>"

SEARCH_R1_VALID = [
    T + A,
    T + S + I + T + A,
    T + S + I + T + S + I + T + A,
    "  \n" + T + "\n" + S + "\n\n" + I + "\n" + T + "\n" + A + "\n",
    "<think></think><answer></answer>",  # empty think/answer content is allowed
    T + "<search>q</search><information>doc with <think> and <answer>x</answer> inside"
    "</information>" + T + A,  # observations are opaque environment text
    "<think>multi\nline < > thoughts</think>" + A,
    T + "<search>q</search>" + I + T + "<answer>a <b>bold</b></answer>",  # unknown tags are text
]

SEARCH_R1_INVALID = [
    ("", "missing"),
    (A, "expected <think>"),  # missing think
    (S + I + T + A, "expected <think>"),
    (T, "missing final <answer>"),
    (T + S + I + T, "missing final <answer>"),
    (T + A + T, "after </answer>"),  # answer not last
    (T + A + A, "after </answer>"),  # two answers
    (T + A + " trailing", "after </answer>"),
    (T + A + "<|im_end|>", "after </answer>"),
    ("hello " + T + A, "outside tags"),
    (T + "so " + A, "outside tags"),
    (T + S + I + "x" + T + A, "outside tags"),
    ("<think>r" + A, "nested"),  # unclosed think
    ("<think>r<search>q</search></think>" + A, "nested"),
    (T + "<answer>x", "unclosed <answer>"),
    (T + "<search>q" + I + T + A, "nested"),
    (T + "<information>d", "expected <search> or <answer>"),
    (T + S + T + A, "expected <information>"),  # search without information
    (T + S + A, "expected <information>"),
    (T + S + I + A, "expected <think>"),  # no think after information
    (T + I + T + A, "expected <search> or <answer>"),  # information without search
    (T + "<search>   </search>" + I + T + A, "empty search query"),
    (T + S + "<information>d" + T + A, "unclosed <information>"),
    ("</think>" + A, "without an open"),
    (T + T + A, "expected <search> or <answer>"),  # two thinks in a row
    (T + S + S + I + T + A, "expected <information>"),
    (T + "<answer>x<answer>y</answer></answer>", "nested"),
    (T + "<tool_call>{}</tool_call>" + A, "outside tags"),  # other protocol's tag is text
]


@pytest.mark.parametrize("text", SEARCH_R1_VALID)
def test_search_r1_valid(text):
  ok, reason = R.format_reason(text, "search_r1")
  assert ok and reason == "", reason
  assert R.check_format(text, "search_r1")


@pytest.mark.parametrize("text,why", SEARCH_R1_INVALID)
def test_search_r1_invalid(text, why):
  ok, reason = R.format_reason(text, "search_r1")
  assert not ok
  assert why in reason, reason
  assert not R.check_format(text, "search_r1")


CALL = '<tool_call>{"name": "search", "arguments": {"query": "who"}}</tool_call>'
RESP = "<tool_response>docs</tool_response>"
U, AS = R.USER_MARKER, R.ASSISTANT_MARKER

TOOL_VALID = [
    T + A,
    T + CALL + RESP + T + A,
    T + "\n" + CALL + U + RESP + AS + T + "\n" + A,
    T + CALL + U + RESP + AS + T + '<tool_call>\n{"name": "search", "arguments": {"query": '
    '["a", "b"]}}\n</tool_call>' + U + RESP + AS + T + A,
    T + CALL + "\n" + U + "\n" + RESP + "\n" + AS + T + A,
    T + CALL + U + "<tool_response><answer>x</answer> " + U + "</tool_response>" + AS + T + A,
]

TOOL_INVALID = [
    (A, "expected <think>"),
    (T + CALL + T + A, "expected <tool_response>"),
    (T + CALL + RESP + A, "expected <think>"),
    (T + "<tool_call>not json</tool_call>" + RESP + T + A, "not valid JSON"),
    (T + '<tool_call>{"arguments": {"query": "q"}}</tool_call>' + RESP + T + A, "'name'"),
    (T + '<tool_call>{"name": "search", "arguments": {}}</tool_call>' + RESP + T + A, "query"),
    (T + '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>' + RESP + T + A,
     "query"),
    (T + '<tool_call>{"name": "search", "arguments": {"query": []}}</tool_call>' + RESP + T + A,
     "query"),
    (T + '<tool_call>["search"]</tool_call>' + RESP + T + A, "'name'"),
    (T + CALL + AS + RESP + T + A, "unexpected chat marker"),  # wrong marker
    (T + CALL + U + U + RESP + T + A, "unexpected chat marker"),  # marker twice
    (U + T + A, "unexpected chat marker"),
    (T + U + A, "unexpected chat marker"),
    (T + CALL + RESP + AS + T + A + AS, "chat marker after </answer>"),
    (T + CALL + "<|im_end|>\n" + RESP + T + A, "outside tags"),  # partial marker is text
    ("<think>r" + U + "</think>" + A, "chat marker inside"),
    (T + A + A, "after </answer>"),
    (T + "<tool_call>" + RESP, "nested"),
    (T + CALL + RESP + T, "missing final <answer>"),
    (T + "<search>q</search><information>d</information>" + T + A, "outside tags"),
]


@pytest.mark.parametrize("text", TOOL_VALID)
def test_tool_call_valid(text):
  ok, reason = R.format_reason(text, "tool_call")
  assert ok and reason == "", reason


@pytest.mark.parametrize("text,why", TOOL_INVALID)
def test_tool_call_invalid(text, why):
  ok, reason = R.format_reason(text, "tool_call")
  assert not ok
  assert why in reason, reason


def test_format_unknown_protocol_and_extract_answer():
  with pytest.raises(ValueError, match="unknown protocol"):
    R.check_format(T + A, "react")
  assert R.extract_answer(T + "<answer> Paris </answer>") == "Paris"
  assert R.extract_answer("<answer>a</answer><answer>b\nc</answer>") == "b\nc"
  assert R.extract_answer(T) is None


def test_format_check_is_fast():
  text = (T + S + "<information>" + "doc " * 500 + "</information>") * 4 + T + A
  t0 = time.perf_counter()
  for _ in range(2000):
    assert R.check_format(text)
  assert time.perf_counter() - t0 < 5.0  # ~0.06 s here
