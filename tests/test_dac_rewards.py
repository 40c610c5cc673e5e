"""Tests of DAC's host side against independent references written here (plain Python / NumPy
that never calls the code under test), on hand-built evidence sets.

  agentjax/dac/rewards.py    labels (S, C, abstention), evidence sets, both roles' rewards,
                             distractor candidates and hard-positive augmentation
  agentjax/dac/warmstart.py  the generator's warm-start demonstrations (a fake retriever)
  agentjax/agent/protocol.py the answer_only protocol (the generator's)
  agentjax/train/config.py   DAC's config checks on the configs/dac.py presets
  agentjax/dac/stage.py      dac_metrics and role_rewards on a hand-built DacBatch

Pure host code: no model, no jit.
"""

from __future__ import annotations

import itertools
import re
import string
import types

import jax
import numpy as np
import pytest

from agentjax.agent.protocol import ANSWER, ANSWER_ONLY, INVALID, SEARCH_R1, get_protocol
from agentjax.dac import rewards as R
from agentjax.dac.roles import DacAgent, DacBatch, DacSettings, generator_prompt
from agentjax.dac.stage import dac_metrics, role_rewards
from agentjax.dac.warmstart import generator_demos
from agentjax.retrieval import Document, SearchResponse, SearchStats
from agentjax.train.config import ConfigError, lora_rates, validate
from agentjax.train.sft import check_demo

ABSTAIN = "insufficient evidence"

# ---------------------------------------------------------------------------------------------
# Independent references.
# ---------------------------------------------------------------------------------------------


def ref_norm(s):
  """SQuAD normalization, character by character: lower, punctuation out, articles out."""
  if s is None:
    return ""
  s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
  words = [w for w in s.split() if w not in ("a", "an", "the")]
  return " ".join(words)


def ref_contains(text, golds, match):
  """A gold's normalized tokens as a contiguous run of the text's tokens ("word"), or the
  normalized gold anywhere in the normalized text ("substring"); empty golds match nothing."""
  golds = [golds] if isinstance(golds, str) else list(golds)
  body = ref_norm(text)
  toks = body.split()
  for g in golds:
    gt = ref_norm(g).split()
    if not gt:
      continue
    if match == "substring":
      if " ".join(gt) in body:
        return True
    elif any(toks[i:i + len(gt)] == gt for i in range(len(toks) - len(gt) + 1)):
      return True
  return False


def ref_sufficient(docs, golds, match="word"):
  return any(ref_contains(d.contents, golds, match) for d in docs)


def ref_abstains(answer, abstain_text=ABSTAIN):
  return answer is not None and ref_norm(answer) == ref_norm(abstain_text)


def ref_correct(answer, golds, abstain_text=ABSTAIN):
  golds = [golds] if isinstance(golds, str) else list(golds)
  if answer is None or ref_abstains(answer, abstain_text) or not ref_norm(answer):
    return False
  return any(ref_norm(answer) == ref_norm(g) for g in golds)


def ref_generator_reward(answered, abstained, is_correct, suff, alpha, penalty, invalid):
  """The module docstring's table, one answer at a time."""
  if not answered:
    return invalid
  if abstained:
    return 0.0 if suff else alpha
  if is_correct:
    return 1.0
  return 0.0 if suff else -penalty


def ref_searcher_reward(suff, answered, abstained, is_correct, mode):
  """One evidence set: S times the mean over its m answers of the mode's indicator."""
  m = len(answered)
  if mode == "sufficient_only":
    return float(suff)
  if mode == "correct":
    return float(suff) * sum(bool(c) for c in is_correct) / m
  took = sum(1 for a, b in zip(answered, abstained) if a and not b)
  return float(suff) * took / m


def ref_distractors(hits_per_query, exclude, golds, match="word"):
  """Rank 1 of every query in query order, then rank 2, ...: unseen ids with no gold."""
  out, seen = [], [d.id for d in exclude]
  for rank in range(max([len(h) for h in hits_per_query] + [0])):
    for hits in hits_per_query:
      if rank >= len(hits):
        continue
      d = hits[rank]
      if d.id in seen or ref_contains(d.contents, golds, match):
        continue
      seen.append(d.id)
      out.append(d)
  return out


def doc(i, title, text=""):
  return Document(str(i), f"{title}\n{text}" if text else title, 0.0)


# ---------------------------------------------------------------------------------------------
# Labels: contains_answer, sufficient, is_abstention, correct.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,golds,word,substring", [
    ("There were 100 people.", "10", False, True),          # gold only inside a longer word
    ("There were 10 people.", "10", True, True),
    ("It sold 10,000 copies", "10000", True, True),         # punctuation deleted, not spaced
    ("It sold 10,000 copies", "10", False, True),
    ("The Beatles played.", "beatles", True, True),          # articles dropped
    ("Beatles played", "The Beatles!", True, True),
    ("He moved to New York City", "new york", True, True),   # multi-word gold
    ("a New Yorker wrote", "New York", False, True),
    ("York, New", "new york", False, False),                 # order matters
    ("Paris is in France", ["Lyon", "paris"], True, True),   # aliases: any one
    ("Paris is in France", ["Lyon", "Marseille"], False, False),
    ("The U.S.A. is big", "USA", True, True),
    ("Anything at all", ["the", "", "  "], False, False),    # golds empty after normalization
    ("", "paris", False, False),
    ("Rock-and-roll", "rock", False, True),                  # the hyphen joins the words
    ("  PARIS\n\tfrance ", "paris france", True, True),      # whitespace collapsed
])
def test_contains_answer_hand_cases(text, golds, word, substring):
  assert ref_contains(text, golds, "word") is word  # the reference agrees with the hand labels
  assert ref_contains(text, golds, "substring") is substring
  assert R.contains_answer(text, golds, "word") is word
  assert R.contains_answer(text, golds, "substring") is substring
  assert R.contains_answer(text, golds) is word  # "word" is the default


def test_contains_answer_matches_reference_on_random_texts():
  rng = np.random.default_rng(0)
  vocab = ["10", "100", "the", "a", "paris", "paris,", "Paris.", "new", "york", "yorker", "an",
           "U.S.", "us", "x-y", "xy", "ab", "abc"]
  for _ in range(400):
    text = " ".join(rng.choice(vocab, rng.integers(0, 8)))
    golds = [" ".join(rng.choice(vocab, rng.integers(1, 3))) for _ in range(rng.integers(1, 3))]
    for match in R.SUFFICIENCY_MATCHES:
      assert R.contains_answer(text, golds, match) == ref_contains(text, golds, match), \
          (text, golds, match)


def test_contains_answer_unknown_match_names_the_field():
  with pytest.raises(ValueError, match="dac.sufficiency_match='exact'"):
    R.contains_answer("paris", "paris", "exact")


def test_sufficient_on_hand_built_evidence_sets():
  golds = ["Marie Curie", "Maria Sklodowska"]
  gold_in_title = [doc(1, "Marie Curie", "A physicist."), doc(2, "Radium", "An element.")]
  gold_in_body = [doc(3, "Radium", "Discovered by Maria Sklodowska in 1898.")]
  insufficient = [doc(4, "Radium", "An element."), doc(5, "Curie (unit)", "Named after her.")]
  inside_word = [doc(6, "Notes", "mariecurie was written as one word")]
  cases = [(gold_in_title, True), (gold_in_body, True), (insufficient, False), ([], False),
           (inside_word, False)]
  for docs, expected in cases:
    assert ref_sufficient(docs, golds) is expected
    assert R.sufficient(docs, golds) is expected
    assert R.sufficient(docs, golds, "substring") is ref_sufficient(docs, golds, "substring")
  assert R.sufficient(inside_word, "marie curie", "substring") is False  # the space matters
  assert R.sufficient(inside_word, "mariecurie", "substring") is True


@pytest.mark.parametrize("answer,expected", [
    ("insufficient evidence", True),
    ("Insufficient Evidence.", True),
    ("  INSUFFICIENT   evidence!! ", True),
    ("The insufficient evidence", True),  # an article is dropped by normalization
    ("insufficient-evidence", False),      # the hyphen joins the words
    ("insufficient", False),
    ("Paris", False),
    ("", False),
    (None, False),
])
def test_is_abstention(answer, expected):
  assert ref_abstains(answer) is expected
  assert R.is_abstention(answer, ABSTAIN) is expected


def test_correct_against_reference():
  golds = ["Paris", "City of Light"]
  cases = [("paris", True), ("Paris.", True), ("the city of light", True), ("City-of Light", False),
           ("Lyon", False), ("", False), (None, False), ("paris france", False), (ABSTAIN, False)]
  for answer, expected in cases:
    assert ref_correct(answer, golds) is expected
    assert R.correct(answer, golds, ABSTAIN) is expected


def test_abstention_is_never_correct_even_when_the_gold_is_the_abstain_text():
  # A gold that normalizes to the abstention ("Insufficient evidence!") must not pay an abstention.
  for answer in ("insufficient evidence", "Insufficient Evidence.", "the insufficient evidence"):
    assert not R.correct(answer, ["Insufficient evidence!"], ABSTAIN)
    assert not R.correct(answer, "insufficient evidence", ABSTAIN)
  # ... while the same words are correct when the abstention is something else.
  assert R.correct("insufficient evidence", "Insufficient evidence!", "i do not know")


# ---------------------------------------------------------------------------------------------
# Evidence sets.
# ---------------------------------------------------------------------------------------------


def test_evidence_set_dedups_by_id_in_retrieval_order():
  a, b, c, d = doc("a", "A"), doc("b", "B"), doc("c", "C"), doc("d", "D")
  b_again = Document("b", "B, as another query ranked it", 9.0)  # same id, other score/contents
  turns = [[b, a], [], [a, c, b_again], [d], []]
  expected, seen = [], set()
  for t in turns:
    for x in t:
      if x.id not in seen:
        seen.add(x.id)
        expected.append(x)
  got = R.evidence_set(turns)
  assert isinstance(got, tuple)
  assert got == tuple(expected) == (b, a, c, d)
  assert got[0] is b  # the first occurrence is the one kept


def test_evidence_set_of_empty_trajectories():
  assert R.evidence_set([]) == ()
  assert R.evidence_set([[], [], []]) == ()  # turns without documents (answers, failures)
  assert R.sufficient(R.evidence_set([[]]), "paris") is False


# ---------------------------------------------------------------------------------------------
# Rewards.
# ---------------------------------------------------------------------------------------------

# The consistent label combinations: correct => answered and not abstained; abstained => answered.
CONSISTENT = [(ans, abst, cor, suff)
              for ans, abst, cor, suff in itertools.product([False, True], repeat=4)
              if (not cor or (ans and not abst)) and (not abst or ans)]


@pytest.mark.parametrize("alpha,penalty,invalid", [(0.3, 0.0, 0.0), (0.1, 0.5, -2.0),
                                                   (0.5, 1.0, -1.0)])
def test_generator_rewards_table(alpha, penalty, invalid):
  ans, abst, cor, suff = (np.array(x) for x in zip(*CONSISTENT))
  got = R.generator_rewards(ans, abst, cor, suff, alpha, penalty, invalid)
  expected = [ref_generator_reward(*row, alpha, penalty, invalid) for row in CONSISTENT]
  assert got.dtype == np.float32 and got.shape == (len(CONSISTENT),)
  np.testing.assert_allclose(got, np.float32(expected))


def test_generator_rewards_named_cells():
  """Each cell of the table once, with a penalty and an invalid reward that are all distinct."""
  #            answered abstained correct sufficient -> reward
  rows = [(True, False, True, True, 1.0),      # answered, C = 1
          (True, False, True, False, 1.0),     # answered, C = 1 on S = 0 (a lucky guess)
          (True, True, False, False, 0.3),     # abstained, S = 0 -> alpha
          (True, True, False, True, 0.0),      # abstained, S = 1
          (True, False, False, True, 0.0),     # wrong, S = 1: no penalty
          (True, False, False, False, -0.7),   # wrong, S = 0: the penalty
          (False, False, False, False, -2.0),  # invalid on S = 0: invalid_reward, not the penalty
          (False, False, False, True, -2.0)]   # invalid on S = 1
  ans, abst, cor, suff, expected = (np.array(x) for x in zip(*rows))
  got = R.generator_rewards(ans, abst, cor, suff, alpha=0.3, insufficient_answer_penalty=0.7,
                            invalid_reward=-2.0)
  np.testing.assert_allclose(got, expected.astype(np.float32))
  # Defaults: no penalty, invalid outputs 0.
  got = R.generator_rewards(ans, abst, cor, suff, alpha=0.3)
  np.testing.assert_allclose(got, np.float32([1, 1, 0.3, 0, 0, 0, 0, 0]))


@pytest.mark.parametrize("mode", R.SEARCHER_REWARDS)
def test_searcher_rewards_against_reference(mode):
  rng = np.random.default_rng(1)
  e, m = 12, 4
  suff = rng.random(e) < 0.6
  answered = rng.random((e, m)) < 0.8
  abstained = answered & (rng.random((e, m)) < 0.4)
  is_correct = answered & ~abstained & (rng.random((e, m)) < 0.5)
  # Ties: a set whose answers all abstain, one all invalid, one all correct, one all wrong.
  answered[0], abstained[0], is_correct[0], suff[0] = True, True, False, True
  answered[1], abstained[1], is_correct[1], suff[1] = False, False, False, True
  answered[2], abstained[2], is_correct[2], suff[2] = True, False, True, True
  answered[3], abstained[3], is_correct[3], suff[3] = True, False, False, False
  got = R.searcher_rewards(suff, answered, abstained, is_correct, mode)
  expected = [ref_searcher_reward(suff[i], answered[i], abstained[i], is_correct[i], mode)
              for i in range(e)]
  assert got.dtype == np.float32 and got.shape == (e,)
  np.testing.assert_allclose(got, np.float32(expected), rtol=1e-6)


def test_searcher_rewards_hand_cases():
  t, f = True, False
  suff = np.array([t, t, t, f, t])
  answered = np.array([[t, t, t, t],    # all answer, 2 correct
                       [t, t, t, t],    # all abstain
                       [t, f, t, f],    # 2 invalid, 1 abstains, 1 answers wrongly
                       [t, t, t, t],    # S = 0: nothing, whatever the answers
                       [f, f, f, f]])   # all invalid
  abstained = np.array([[f, f, f, f], [t, t, t, t], [t, f, f, f], [f, f, f, f], [f, f, f, f]])
  is_correct = np.array([[t, t, f, f], [f, f, f, f], [f, f, f, f], [t, t, t, t], [f, f, f, f]])
  got = {mode: R.searcher_rewards(suff, answered, abstained, is_correct, mode)
         for mode in R.SEARCHER_REWARDS}
  np.testing.assert_allclose(got["sufficient_answered"], [1.0, 0.0, 0.25, 0.0, 0.0])
  np.testing.assert_allclose(got["sufficient_only"], [1.0, 1.0, 1.0, 0.0, 1.0])
  np.testing.assert_allclose(got["correct"], [0.5, 0.0, 0.0, 0.0, 0.0])
  # The default mode is sufficient_answered.
  np.testing.assert_array_equal(R.searcher_rewards(suff, answered, abstained, is_correct),
                                got["sufficient_answered"])
  with pytest.raises(ValueError, match="dac.searcher_reward='bogus'"):
    R.searcher_rewards(suff, answered, abstained, is_correct, "bogus")


# ---------------------------------------------------------------------------------------------
# Distractor candidates and augmentation.
# ---------------------------------------------------------------------------------------------

GOLDS = ["10"]
D_GOLD = doc("g", "Tens", "There are 10 of them.")
D_100 = doc("h", "Hundreds", "There are 100 of them.")  # "10" only inside a word
D = [doc(f"d{i}", f"Doc {i}", f"Filler text number {'abc'[i % 3]}.") for i in range(8)]


def test_distractor_candidates_rank_major_excluding_evidence_and_gold():
  hits = [[D_GOLD, D[1], D[2], D[3]],   # query 1
          [D[4], D[1], D_100],          # query 2: D[1] again (dedup), a "100" document
          [],                           # query 3: no hits (or a failed query)
          [D[5], D_GOLD, D[6], D[7], D[0]]]
  evidence = [D_GOLD, D[2]]
  got = R.distractor_candidates(hits, evidence, GOLDS)
  expected = ref_distractors(hits, evidence, GOLDS)
  assert got == expected == [D[4], D[5], D[1], D_100, D[6], D[3], D[7], D[0]]
  # Substring matching counts "100" as holding the gold: not a distractor then.
  got = R.distractor_candidates(hits, evidence, GOLDS, "substring")
  assert got == ref_distractors(hits, evidence, GOLDS, "substring")
  assert D_100 not in got and len(got) == 7


def test_distractor_candidates_edge_cases():
  assert R.distractor_candidates([], [], GOLDS) == []
  assert R.distractor_candidates([[], []], [D[0]], GOLDS) == []
  assert R.distractor_candidates([[D_GOLD], [D_GOLD]], [], GOLDS) == []  # all hold the answer
  assert R.distractor_candidates([[D[0], D[1]]], [D[0], D[1]], GOLDS) == []  # all in evidence
  # Duplicates within one query's list are dropped too.
  assert R.distractor_candidates([[D[0], D[0], D[1]]], [], GOLDS) == [D[0], D[1]]


def test_augment_adds_the_first_k_and_shuffles():
  evidence = (D_GOLD, D[0])
  candidates = [D[1], D[2], D[3]]
  for k in (0, 1, 2, 3, 5):  # k = 5: fewer candidates than k, all of them are added
    got = R.augment(evidence, candidates, k, np.random.default_rng(7))
    added = candidates[:k]
    assert isinstance(got, tuple) and len(got) == len(evidence) + len(added)
    assert sorted(d.id for d in got) == sorted(d.id for d in (*evidence, *added))
    # Deterministic given the seed: the permutation of evidence + extras the same seed draws.
    docs = [*evidence, *added]
    perm = np.random.default_rng(7).permutation(len(docs))
    assert got == tuple(docs[i] for i in perm)
    assert got == R.augment(evidence, candidates, k, np.random.default_rng(7))
  # Different seeds shuffle differently (some pair of them, at least).
  orders = {R.augment(evidence, candidates, 3, np.random.default_rng(s)) for s in range(20)}
  assert len(orders) > 1
  assert R.augment((), [], 2, np.random.default_rng(0)) == ()
  assert R.augment((), [D[1]], 2, np.random.default_rng(0)) == (D[1],)


def test_augmented_sufficient_set_stays_sufficient_and_gold_free_additions():
  """A hand-built trajectory through the labels and the augmentation, as DacAgent.run does."""
  golds = ["Marie Curie"]
  sufficient_turns = [[doc(1, "Radium", "An element."), doc(2, "Polonium", "Named for Poland.")],
                      [doc(3, "Nobel Prize", "Won by Marie Curie in 1903."), doc(1, "Radium")]]
  insufficient_turns = [[doc(1, "Radium", "An element.")], []]
  hits = [[doc(1, "Radium"), doc(4, "Uranium", "Becquerel's rays.")],
          [doc(3, "Nobel Prize", "Won by Marie Curie."), doc(5, "Curie Institute", "In Paris."),
           doc(6, "Pierre", "Married Marie Curie.")]]
  ev = R.evidence_set(sufficient_turns)
  assert [d.id for d in ev] == ["1", "2", "3"]
  assert R.sufficient(ev, golds) and ref_sufficient(ev, golds)
  assert not R.sufficient(R.evidence_set(insufficient_turns), golds)
  cands = R.distractor_candidates(hits, ev, golds)
  assert [d.id for d in cands] == [d.id for d in ref_distractors(hits, ev, golds)] == ["4", "5"]
  aug = R.augment(ev, cands, 2, np.random.default_rng(3))
  assert sorted(d.id for d in aug) == ["1", "2", "3", "4", "5"]
  assert R.sufficient(aug, golds) and ref_sufficient(aug, golds)  # distractors hold no gold
  assert not any(ref_contains(d.contents, golds, "word") for d in cands)


# ---------------------------------------------------------------------------------------------
# The answer_only protocol (the generator's).
# ---------------------------------------------------------------------------------------------


def test_answer_only_protocol():
  p = get_protocol("answer_only")
  assert p is ANSWER_ONLY and not p.can_search
  assert p.stop_strings == ("</answer>",)
  assert p.prompt("the whole {generator} prompt") == "the whole {generator} prompt"
  a = p.parse("<think> the documents say so </think> <answer> Paris </answer>")
  assert (a.kind, a.content) == (ANSWER, "Paris")
  a = p.parse(f"<answer> {ABSTAIN} </answer>")
  assert (a.kind, a.content) == (ANSWER, ABSTAIN)
  a = p.parse("<search> capital of france </search>")
  assert a.kind == INVALID and "cannot search" in a.content
  a = p.parse("<search> capital of france </search> <answer> Paris </answer>")
  assert a.kind == INVALID  # the search closes first
  assert p.parse("<answer>  </answer>").kind == INVALID
  assert p.parse("Paris").kind == INVALID
  assert p.format_error(["<answer> Paris </answer>"]) is None
  assert p.format_error(["<search> x </search>"]).startswith("turn 1: ")
  # The same search is fine under the searcher's protocol.
  assert SEARCH_R1.parse("<search> capital of france </search>").kind == "search"


# ---------------------------------------------------------------------------------------------
# Generator warm-start demonstrations.
# ---------------------------------------------------------------------------------------------


class FakeBackend:
  """A SearchBackend with fixed results per query; a query in `failing` fails."""

  def __init__(self, table, failing=()):
    self.table, self.failing, self.calls = table, set(failing), []
    self.stats = SearchStats()

  def search(self, queries, topk):
    self.calls.append((list(queries), topk))
    return SearchResponse(
        [[] if q in self.failing else list(self.table.get(q, []))[:topk] for q in queries],
        ["down" if q in self.failing else None for q in queries])


def _search_demo(i, question, golds, queries):
  segments = []
  for q in queries:
    segments.append({"role": "assistant", "text": f"<think> look </think> <search> {q} </search>"})
    segments.append({"role": "observation",
                     "text": "".join(SEARCH_R1.observation([doc(99, "shown")]))})
  segments.append({"role": "assistant", "text": f"<answer> {golds[0]} </answer>"})
  return {"id": str(i), "question": question, "golden_answers": golds, "segments": segments,
          "protocol": "search_r1"}


W_GOLD = doc("w1", "Marie Curie", "A physicist who discovered radium.")
W_GOLD2 = doc("w2", "Nobel Prize", "Awarded to Marie Curie twice.")
W_PLAIN = doc("w3", "Radium", "An element.")
W_PLAIN2 = doc("w4", "Polonium", "Another element.")
W_TABLE = {"who found radium": [W_PLAIN, W_GOLD], "radium discoverer": [W_GOLD, W_GOLD2, W_PLAIN2],
           "polonium": [W_PLAIN2, W_PLAIN], "broken": [W_GOLD]}
W_DEMOS = [
    _search_demo(0, "Who discovered radium?", ["Marie Curie", "Curie"],
                 ["who found radium", "radium discoverer"]),        # sufficient
    _search_demo(1, "Who discovered radium?", ["Marie Curie"], ["polonium"]),  # insufficient
    _search_demo(2, "Who discovered radium?", ["Marie Curie"], []),   # answered without searching
    _search_demo(3, "Who discovered radium?", ["Marie Curie"], ["broken", "polonium"]),  # failure
    _search_demo(4, "Who discovered radium?", ["Marie Curie"], ["radium discoverer"]),  # all gold
]
W_CORPUS = [doc("c1", "Thorium", "Yet another element.")]  # holds no answer


def _ref_evidence(demo, topk, failing=("broken",)):
  """The demo's queries' results, failures skipped, deduplicated by id in order."""
  queries = [re.search(r"<search>(.*?)</search>", s["text"]).group(1).strip()
             for s in demo["segments"] if s["role"] == "assistant" and "<search>" in s["text"]]
  out = []
  for q in queries:
    for d in ([] if q in failing else W_TABLE.get(q, [])[:topk]):
      if d.id not in [x.id for x in out]:
        out.append(d)
  return out


def _ref_stripped(docs, golds):
  """The insufficient variant: gold documents removed; the corpus's only (answer-free)
  document stands in when nothing is left."""
  kept = [d for d in docs if not ref_contains(d.contents, golds, "word")]
  return kept or list(W_CORPUS)


def _check_demo_row(row, demo, docs):
  golds = demo["golden_answers"]
  ok = ref_sufficient(docs, golds)
  answer = golds[0] if ok else ABSTAIN
  assert row["id"] == f"generator_{demo['id']}"
  assert row["protocol"] == "answer_only" and row["sufficient"] is ok
  assert row["golden_answers"] == list(golds)
  assert row["segments"] == [{"role": "assistant", "text": f"<answer> {answer} </answer>"}]
  assert row["question"] == generator_prompt(demo["question"], docs, ABSTAIN)
  # The prompt shows exactly these documents, the question and the abstention instruction.
  q = row["question"]
  assert f"Question: {demo['question']}" in q and f"<answer> {ABSTAIN} </answer>" in q
  for i, d in enumerate(docs):
    assert f"Doc {i + 1}(Title: {d.title}) {d.text}\n" in q
  assert f"Doc {len(docs) + 1}(" not in q
  if not docs:
    assert "(none)" in q
  check_demo(row, ANSWER_ONLY)
  parsed = ANSWER_ONLY.parse(row["segments"][0]["text"])
  assert parsed.kind == ANSWER
  assert ref_abstains(parsed.content) is not ok and ref_correct(parsed.content, golds) is ok
  return ok


def test_generator_demos_targets_follow_the_shown_documents():
  backend = FakeBackend(W_TABLE, failing=("broken",))
  rows = generator_demos(W_DEMOS, backend, topk=2, abstain_text=ABSTAIN, corpus=W_CORPUS,
                         insufficient_share=0.0)
  assert len(rows) == len(W_DEMOS)
  labels = [_check_demo_row(row, demo, _ref_evidence(demo, 2)) for row, demo in zip(rows, W_DEMOS)]
  assert labels == [True, False, False, False, True]  # demo 3: only the failed query had it
  # One batched call per demo that searched, at the given topk.
  assert backend.calls == [(["who found radium", "radium discoverer"], 2), (["polonium"], 2),
                           (["broken", "polonium"], 2), (["radium discoverer"], 2)]
  with pytest.raises(ValueError, match="protocol"):
    check_demo(rows[0], SEARCH_R1)  # the demos are in the generator's protocol


def test_generator_demos_insufficient_share_strips_gold_documents():
  backend = FakeBackend(W_TABLE, failing=("broken",))
  rows = generator_demos(W_DEMOS, backend, topk=2, abstain_text=ABSTAIN, corpus=W_CORPUS,
                         insufficient_share=1.0)
  for row, demo in zip(rows, W_DEMOS):
    docs = _ref_stripped(_ref_evidence(demo, 2), demo["golden_answers"])
    assert _check_demo_row(row, demo, docs) is False
  # Demo 4 saw only gold documents: the corpus document stands in.
  assert "Thorium" in rows[4]["question"]
  # A corpus that holds the answer gives an empty evidence set instead.
  rows = generator_demos(W_DEMOS[4:], FakeBackend(W_TABLE), topk=2, abstain_text=ABSTAIN,
                         corpus=[W_GOLD], insufficient_share=1.0)
  _check_demo_row(rows[0], W_DEMOS[4], [])


def test_generator_demos_mixed_share_is_seeded():
  """With a share in (0, 1) each demo is either its full or its stripped version, the choice
  fixed by the seed."""
  demos = W_DEMOS * 6
  kwargs = dict(topk=3, abstain_text=ABSTAIN, corpus=W_CORPUS, insufficient_share=0.5)
  rows = generator_demos(demos, FakeBackend(W_TABLE, ("broken",)), seed=5, **kwargs)
  assert rows == generator_demos(demos, FakeBackend(W_TABLE, ("broken",)), seed=5, **kwargs)
  stripped = 0
  for row, demo in zip(rows, demos):
    full = _ref_evidence(demo, 3)
    strip = _ref_stripped(full, demo["golden_answers"])
    for docs in (full, strip):
      if row["question"] == generator_prompt(demo["question"], docs, ABSTAIN):
        _check_demo_row(row, demo, docs)
        break
    else:
      raise AssertionError(f"demo {demo['id']}: neither the full nor the stripped evidence")
    stripped += row["question"] != generator_prompt(demo["question"], full, ABSTAIN)
  assert 0 < stripped < len(demos)


# ---------------------------------------------------------------------------------------------
# Config checks (configs/dac.py presets).
# ---------------------------------------------------------------------------------------------


def _dac_config(preset="demo"):
  import configs.dac
  config = configs.dac.get_config(preset)
  config.model.lora.init = ""  # no generator_sft folder here
  return config


def test_dac_presets_validate():
  import configs.dac
  for preset in configs.dac.PRESETS:
    validate(_dac_config(preset))
  assert lora_rates(_dac_config("qwen3-8b")) == {"searcher": 2e-6, "generator": 1e-5}
  assert lora_rates(_dac_config("qwen2.5-7b")) == {"searcher": 1e-6, "generator": 1e-6}
  # With the generator's group by question, one answer per set is fine.
  config = _dac_config()
  config.dac.generator_samples, config.dac.generator_group = 1, "question"
  validate(config)


def _set(config, field, value):
  *path, name = field.split(".")
  for part in path:
    config = config[part]
  config[name] = value


@pytest.mark.parametrize("changes,field", [
    ({"model.lora.adapters": "searcher"}, "model.lora.adapters"),
    ({"model.lora.adapters": "generator,critic"}, "model.lora.adapters"),
    ({"algorithm": "igpo"}, "algorithm"),
    ({"algorithm": "cw_grpo", "judge.backend": "oracle"}, "algorithm"),
    ({"dac.generator_samples": 1, "dac.generator_group": "evidence"}, "dac.generator_samples"),
    ({"dac.generator_samples": 0}, "dac.generator_samples"),
    ({"dac.augment_rate": 1.5}, "dac.augment_rate"),
    ({"dac.augment_rate": -0.1}, "dac.augment_rate"),
    ({"dac.augment_k": -1}, "dac.augment_k"),
    ({"dac.generator_group": "set"}, "dac.generator_group"),
    ({"dac.searcher_reward": "bogus"}, "dac.searcher_reward"),
    ({"dac.sufficiency_match": "bogus"}, "dac.sufficiency_match"),
    ({"dac.abstain_text": "the"}, "dac.abstain_text"),
    ({"dac.abstain_text": " ?! "}, "dac.abstain_text"),
    ({"dac.insufficient_answer_penalty": -1.0}, "dac.insufficient_answer_penalty"),
    ({"dac.generator_max_new_tokens": 768}, "dac.generator_max_total_tokens"),
    ({"dac.generator_max_new_tokens": 800}, "dac.generator_max_total_tokens"),
])
def test_dac_config_errors_name_the_field(changes, field):
  config = _dac_config()
  validate(config)  # the change alone makes it fail
  for k, v in changes.items():
    _set(config, k, v)
  with pytest.raises(ConfigError, match=rf"^config\.{re.escape(field)}="):
    validate(config)


# ---------------------------------------------------------------------------------------------
# dac_metrics and role_rewards on a hand-built DacBatch.
# ---------------------------------------------------------------------------------------------


def _batch(sufficient, augmented, answered, abstained, is_correct, format_valid, turns, n_docs):
  """A DacBatch of E sets with m = len(answered) // E answers each; stand-ins for the
  TrajectoryBatches carry only what the metrics and rewards read."""
  e, em = len(sufficient), len(answered)
  searcher = types.SimpleNamespace(tokens=np.zeros((e, 3), np.int32),
                                   num_turns=np.asarray(turns, np.int32))
  generator = types.SimpleNamespace(tokens=np.zeros((em, 5), np.int32),
                                    answered=np.asarray(answered, bool),
                                    format_valid=np.asarray(format_valid, bool),
                                    answers=[f"a{g}" for g in range(em)])
  evidence = [tuple(doc(f"{b}.{i}", "T") for i in range(n)) for b, n in enumerate(n_docs)]
  return DacBatch(searcher=searcher, generator=generator, evidence=evidence,
                  sufficient=np.asarray(sufficient, bool),
                  distractors=np.asarray(augmented, np.int32) * 2,
                  abstained=np.asarray(abstained, bool), correct=np.asarray(is_correct, bool),
                  retrieved_sufficient=np.asarray(sufficient, bool), metrics={})


def ref_metrics(b, gen_reward, search_reward):
  e = len(b.sufficient)
  m = len(b.abstained) // e
  rows = [dict(s=bool(b.sufficient[g // m]), aug=bool(b.augmented[g // m]),
               ans=bool(b.generator.answered[g]), abst=bool(b.abstained[g]),
               cor=bool(b.correct[g])) for g in range(e * m)]

  def share(num, den):
    d = [r for r in rows if den(r)]
    return sum(1 for r in d if num(r)) / len(d) if d else 0.0

  return {
      "dac/sufficiency_rate": sum(map(bool, b.sufficient)) / e,
      "dac/abstain_rate": sum(r["abst"] for r in rows) / len(rows),
      "dac/abstain_precision": share(lambda r: not r["s"], lambda r: r["abst"]),
      "dac/abstain_recall": share(lambda r: r["abst"], lambda r: not r["s"]),
      "dac/coverage": sum(r["ans"] and not r["abst"] for r in rows) / len(rows),
      "dac/accuracy_answered": share(lambda r: r["cor"], lambda r: r["ans"] and not r["abst"]),
      "dac/accuracy_clean": share(lambda r: r["cor"], lambda r: r["s"] and not r["aug"]),
      "dac/accuracy_augmented": share(lambda r: r["cor"], lambda r: r["s"] and r["aug"]),
      "dac/augmented_rate": sum(map(bool, b.augmented)) / e,
      "dac/evidence_docs": sum(len(x) for x in b.evidence) / e,
      "dac/searcher_turns": sum(int(t) for t in b.searcher.num_turns) / e,
      "dac/searcher_reward": sum(float(x) for x in search_reward) / len(search_reward),
      "dac/generator_reward": sum(float(x) for x in gen_reward) / len(gen_reward),
      "dac/generator_format_error_rate":
          sum(not v for v in b.generator.format_valid) / len(rows),
  }


def _hand_batch():
  t, f = True, False
  # E = 4 sets, m = 3: set 0 sufficient clean, set 1 sufficient augmented, set 2 augmented but
  # insufficient as shown (the prompt budget dropped its gold document), set 3 insufficient with
  # no documents at all (an empty trajectory).
  return _batch(sufficient=[t, t, f, f], augmented=[f, t, t, f],
                answered=[t, t, t, t, t, f, t, t, t, t, f, t],
                abstained=[f, f, t, f, f, f, t, t, f, t, f, t],
                is_correct=[t, f, f, t, t, f, f, f, f, f, f, f],
                format_valid=[t, t, t, t, t, f, t, t, t, t, f, t],
                turns=[2, 3, 1, 0], n_docs=[3, 5, 2, 0])


def test_dac_metrics_against_reference():
  b = _hand_batch()
  # Any numbers: the metrics only average the rewards they are given.
  gen_reward = np.array([1, 0, 0, 1, 0, -2, 0.3, 0.3, -0.5, 0.3, -2, 0.3], np.float32)
  search_reward = np.array([2 / 3, 1 / 3, 0, 0], np.float32)
  got = dac_metrics(b, gen_reward, search_reward)
  expected = ref_metrics(b, gen_reward, search_reward)
  assert set(got) == set(expected)
  for k in expected:
    assert got[k] == pytest.approx(expected[k], rel=1e-6), k
    assert isinstance(got[k], float), k
  # The hand values of the headline ones.
  assert got["dac/abstain_precision"] == pytest.approx(4 / 5)  # 5 abstentions, 4 on S = 0
  assert got["dac/abstain_recall"] == pytest.approx(4 / 6)     # 6 answers on S = 0, 4 abstain
  assert got["dac/coverage"] == pytest.approx(5 / 12)
  assert got["dac/accuracy_clean"] == pytest.approx(1 / 3)
  assert got["dac/accuracy_augmented"] == pytest.approx(2 / 3)
  assert got["dac/accuracy_answered"] == pytest.approx(3 / 5)
  assert got["dac/evidence_docs"] == pytest.approx(2.5)


def test_dac_metrics_all_abstain_and_empty_denominators():
  # Every answer abstains on sufficient sets: no S = 0 answers, nothing answered, nothing augmented.
  b = _batch(sufficient=[True, True], augmented=[False, False], answered=[True] * 4,
             abstained=[True] * 4, is_correct=[False] * 4, format_valid=[True] * 4,
             turns=[1, 1], n_docs=[1, 2])
  got = dac_metrics(b, np.zeros(4, np.float32), np.zeros(2, np.float32))
  expected = ref_metrics(b, np.zeros(4), np.zeros(2))
  for k in expected:
    assert got[k] == pytest.approx(expected[k]), k
  assert got["dac/abstain_precision"] == 0.0 and got["dac/abstain_recall"] == 0.0
  assert got["dac/coverage"] == 0.0 and got["dac/accuracy_answered"] == 0.0
  assert got["dac/accuracy_augmented"] == 0.0 and got["dac/abstain_rate"] == 1.0


def test_dac_batch_eval_views():
  b = _hand_batch()
  assert b.samples == 3
  np.testing.assert_array_equal(b.answered, [True, True, False, False])  # first answer per set
  np.testing.assert_array_equal(b.abstentions, [False, False, True, True])
  np.testing.assert_array_equal(b.format_valid, [True, True, True, True])
  assert b.answers == ["a0", "a3", "a6", "a9"]


@pytest.mark.parametrize("mode", R.SEARCHER_REWARDS)
def test_dac_step_rewards_wiring(mode):
  """role_rewards: generator row g is judged on set g // m; the searcher's [E, m] view."""
  b = _hand_batch()
  settings = DacSettings(alpha=0.25, insufficient_answer_penalty=0.5, searcher_reward=mode)
  for penalize, invalid in ((True, -2.0), (False, 0.0)):
    rl = types.SimpleNamespace(format_penalty=-2.0, penalize_format=penalize)
    gen, search = role_rewards(b, settings, rl)
    m = 3
    exp_gen = [ref_generator_reward(b.generator.answered[g], b.abstained[g], b.correct[g],
                                    b.sufficient[g // m], 0.25, 0.5, invalid) for g in range(12)]
    exp_search = [ref_searcher_reward(b.sufficient[i], b.generator.answered[i * m:(i + 1) * m],
                                      b.abstained[i * m:(i + 1) * m], b.correct[i * m:(i + 1) * m],
                                      mode) for i in range(4)]
    np.testing.assert_allclose(gen, np.float32(exp_gen))
    np.testing.assert_allclose(search, np.float32(exp_search), rtol=1e-6)


@pytest.mark.parametrize("group", ["question", "evidence"])
def test_alpha_acts_on_the_generator_s_advantages_only_when_grouped_by_question(group):
  """The default grouping (question) and the study's (evidence set), through role_rewards and
  agentjax's GRPO advantages, against a NumPy z-score: grouped per evidence set, the generator's
  advantages are the same for every alpha (each group shares S: alpha cancels); grouped by
  question (the default) they change with alpha."""
  from agentjax.rl.advantages import grpo_outcome_advantages
  assert _dac_config().dac.generator_group == "question"  # the default
  b = _hand_batch()
  m, sets = 3, 4
  # Two questions, two evidence sets each (the searcher's group ids), three answers per set;
  # each question has a sufficient set and an insufficient one (sets 0, 1 have S = 1).
  searcher_groups = np.array([0, 1, 0, 1])
  groups = np.repeat(searcher_groups, m) if group == "question" else np.repeat(np.arange(sets), m)
  rl = types.SimpleNamespace(format_penalty=0.0, penalize_format=False)
  out = {}
  for alpha in (0.1, 0.5):
    gen, _ = role_rewards(b, DacSettings(alpha=alpha), rl)
    got = np.asarray(grpo_outcome_advantages(gen, groups))
    want = np.zeros_like(gen)
    for g in np.unique(groups):
      r = gen[groups == g].astype(np.float64)
      want[groups == g] = (r - r.mean()) / (r.std() + 1e-6) if r.std() > 1e-6 else 0.0
    np.testing.assert_allclose(got, want, atol=1e-4)
    out[alpha] = got
  if group == "evidence":  # equal but for the std's epsilon (1e-6 against an alpha-sized std)
    np.testing.assert_allclose(out[0.1], out[0.5], atol=1e-4)
  else:
    assert np.abs(out[0.1] - out[0.5]).max() > 0.05


# ---------------------------------------------------------------------------------------------
# The review's regressions (both failed on the first version of DacAgent.run): DacAgent.run with
# fake engines, host only.
# ---------------------------------------------------------------------------------------------

REVIEW_GOLD = Document("gold", '"Zorvath"\nZorvath was founded by Aldric.', 1.0)
REVIEW_DIST = [Document(f"x{i}", f'"Other{i}"\nOther{i} is a village by the sea.', 1.0) for i in range(3)]


class ReviewBackend:
  def search(self, queries, k):
    return SearchResponse([list(REVIEW_DIST) for _ in queries], [None] * len(queries))


def _review_agent(settings, turns_text="", obs=""):
  """A DacAgent whose engines are fakes: a searcher with one search turn that retrieved REVIEW_GOLD, a
  generator that abstains; prompt_ids = whitespace tokens."""
  agent = object.__new__(DacAgent)
  agent.settings, agent.backend = settings, ReviewBackend()
  turn = types.SimpleNamespace(documents=[REVIEW_GOLD], action=types.SimpleNamespace(content="Zorvath founder"),
                         text=turns_text, observation=obs)

  def s_run(params, questions, rng):
    rows = len(questions)
    return types.SimpleNamespace(group_ids=np.arange(rows), turns=[[turn] for _ in range(rows)]), {}

  shown_texts = []

  def g_run(params, texts, rng):
    shown_texts.extend(texts)
    m = settings.generator_samples
    n = len(texts) * m
    return types.SimpleNamespace(tokens=np.zeros((n, 4)), answers=[settings.abstain_text] * n,
                           answered=np.ones(n, bool)), {}

  agent.searcher = types.SimpleNamespace(run=s_run, search=agent.backend.search)
  agent.generator = types.SimpleNamespace(run=g_run, prompt_ids=lambda t: t.split())
  return agent, shown_texts


def test_review_augmentation_never_removes_the_searchers_evidence_nor_changes_S():
  """A sufficient set (REVIEW_GOLD alone) augmented with 2 distractors; the generator's budget fits the
  prompt with one document only. The budget then drops documents from the END of the shuffled
  set: whenever REVIEW_GOLD is not shuffled to the front, the searcher's own gold document is removed
  and S (hence the searcher's reward) flips to 0 because of the generator-side augmentation."""
  base = generator_prompt("Who founded Zorvath?", [REVIEW_GOLD], "insufficient evidence")
  room = len(base.split())
  s = DacSettings(generator_samples=2, augment_rate=1.0, augment_k=2,
                  generator_max_new_tokens=8, generator_max_total_tokens=room + 8)
  flipped = 0
  for seed in range(12):
    agent, _ = _review_agent(s)
    out, _ = agent.run({"searcher": None, "generator": None}, ["Who founded Zorvath?"],
                       jax.random.key(0), golds=[["Aldric"]], aug_rng=np.random.default_rng(seed))
    flipped += int(not out.sufficient[0])
  assert flipped == 0, f"{flipped}/12 augmented sufficient sets lost the gold document"


def test_review_sees_reasoning_with_long_notes_does_not_crash_the_step():
  """generator_sees_reasoning: the searcher's turns (up to rollout.max_total_tokens) go into the
  generator's prompt whole; only documents are dropped to fit, so long notes raise ValueError
  mid-training instead of being cut."""
  s = DacSettings(generator_samples=2, augment_rate=0.0, sees_reasoning=True,
                  generator_max_new_tokens=8, generator_max_total_tokens=120)
  agent, _ = _review_agent(s, turns_text="think " * 200)
  agent.run({"searcher": None, "generator": None}, ["Who founded Zorvath?"], jax.random.key(0),
            golds=[["Aldric"]])


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_abstention_threshold_makes_answering_and_abstaining_pay_alike(penalty):
  """alpha* from P(S = 0), c_G and the guess accuracy c0: under generator_rewards at alpha*, a
  generator that answers every set and one that abstains on every set earn the same mean reward
  (counted on random labels); just below alpha* answering pays more, just above abstaining does.
  With c0 = penalty = 0 it is the paper's c_G P(S = 1) / P(S = 0)."""
  rng = np.random.default_rng(0)
  n = 4000
  sufficient = rng.random(n) < 0.45
  correct = np.where(sufficient, rng.random(n) < 0.3, rng.random(n) < 0.05)
  p0 = float(np.mean(~sufficient))
  c1, c0 = float(correct[sufficient].mean()), float(correct[~sufficient].mean())
  alpha = R.abstention_threshold(p0, c1, c0, penalty)
  yes, no = np.ones(n, bool), np.zeros(n, bool)

  def mean_reward(abstain, a):
    return float(np.mean(R.generator_rewards(yes, yes if abstain else no,
                                             no if abstain else correct, sufficient, a,
                                             insufficient_answer_penalty=penalty)))

  assert mean_reward(False, alpha) == pytest.approx(mean_reward(True, alpha), abs=1e-6)
  assert mean_reward(False, alpha - 0.05) > mean_reward(True, alpha - 0.05)
  assert mean_reward(False, alpha + 0.05) < mean_reward(True, alpha + 0.05)
  assert R.abstention_threshold(0.55, 0.09) == pytest.approx(0.09 * 0.45 / 0.55)
  assert R.abstention_threshold(0.0, 0.5) == float("inf")
  with pytest.raises(ValueError, match="p_insufficient"):
    R.abstention_threshold(1.5, 0.5)


def test_eval_rows_report_what_the_threshold_reads():
  """evaluation.row_means of an abstaining agent's rows: P(S = 0) and the EM accuracy of the
  answers given on S = 1 and S = 0 evidence, against a NumPy count (abstentions are not
  answers; no answer on one side gives 0)."""
  from agentjax.train.evaluation import row_means
  rng = np.random.default_rng(1)
  rows = []
  for i in range(200):
    s, abst = bool(rng.random() < 0.5), bool(rng.random() < 0.3)
    em = 0.0 if abst else float(rng.random() < (0.6 if s else 0.1))
    rows.append({"answer": None if abst else "x", "em": em, "f1": em, "format_ok": True,
                 "turns": 1, "abstained": abst, "sufficient": s})
  got = row_means(rows)
  s = np.array([r["sufficient"] for r in rows])
  took = np.array([r["answer"] is not None for r in rows])
  em = np.array([r["em"] for r in rows])
  assert got["insufficient_share"] == pytest.approx(np.mean(~s))
  assert got["accuracy_sufficient"] == pytest.approx(np.mean(em[s & took] > 0))
  assert got["accuracy_insufficient"] == pytest.approx(np.mean(em[~s & took] > 0))
  abst = np.array([r["abstained"] for r in rows])
  assert got["abstain_sufficient"] == pytest.approx(np.mean(abst[s]))  # answers lost on S = 1
  for r in rows:
    if not r["sufficient"]:
      r.update(answer=None, abstained=True, em=0.0)
  assert row_means(rows)["accuracy_insufficient"] == 0.0
  for r in rows:  # every set insufficient: no sufficient set to abstain on
    r["sufficient"] = False
  assert row_means(rows)["abstain_sufficient"] == 0.0
