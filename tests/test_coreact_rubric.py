"""Tests of agentjax.coreact.rubric (parser, reward, prompts) and agentjax.coreact.executor (the
SynthWorld predicate vocabulary), against independent references written here: the reward is a
direct transcription of the official formula (Co-ReAct's rubric_rl/reward_fn.py `compute_score`)
using scipy.stats.spearmanr."""

from __future__ import annotations

import itertools
import json
import math
import random
import re

import numpy as np
import pytest
import scipy.stats

from agentjax.agent.protocol import Action
from agentjax.agent.trajectories import TurnRecord
from agentjax.coreact import executor as ex
from agentjax.coreact import rubric as rb
from agentjax.coreact.context import BranchContext
from agentjax.retrieval import Document
from configs import base as base_config

pytestmark = pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")

# ---------------------------------------------------------------------------------------------
# References (independent of the module: index scanning, Counter, scipy, brute force).
# ---------------------------------------------------------------------------------------------

OFFICIAL_ITEM = r"\d+\.\s*\[([-\d.]+)\]\s*(.+)"


def ref_strip_think(text):
  out = []
  pos = 0
  while True:
    start = text.find("<think>", pos)
    if start < 0:
      out.append(text[pos:])
      break
    out.append(text[pos:start])
    end = text.find("</think>", start + len("<think>"))
    if end < 0:  # unclosed: drop the rest
      break
    pos = end + len("</think>")
  return "".join(out).replace("</think>", "")


def ref_items(raw):
  items = []
  for m in re.finditer(OFFICIAL_ITEM, ref_strip_think(raw)):
    try:
      w = float(m.group(1))
    except ValueError:
      continue
    if w != w or w in (float("inf"), float("-inf")):
      continue
    items.append((w, m.group(2).strip()))
  return items


def ref_repeat_rate(text, n):
  words = re.findall(r"\w+", text.lower())
  if len(words) < n + 1:
    return 0.0
  grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
  return 1 - len(set(grams)) / len(grams)


def ref_pairwise(pred, expert):
  credit = []
  for i, j in itertools.combinations(range(len(pred)), 2):
    if expert[i] != expert[j]:
      if pred[i] == pred[j]:
        credit.append(0.5)
      else:
        credit.append(float((pred[i] < pred[j]) == (expert[i] < expert[j])))
  return sum(credit) / len(credit) if credit else float("nan")


def ref_top1(pred, expert):
  p = {i for i, v in enumerate(pred) if v == min(pred)}
  e = {i for i, v in enumerate(expert) if v == min(expert)}
  return len(p & e) / len(p)


def ref_reward(raw, expert, ranking, atomic_count, s):
  """The official compute_score, transcribed; ranking None = the judge call failed."""
  if ref_repeat_rate(raw, s.repeat_ngram) > s.repeat_threshold:
    return 0.0
  items = ref_items(raw)
  n = len(items)
  if n == 0:
    fmt = 0.0
  else:
    pos = sum(w for w, _ in items if w > 0)
    fmt = 0.5 * (s.min_items <= n <= s.max_items) + 0.5 * (abs(pos - 1) < s.weight_tol)
  if ranking is None or len(ranking) != len(expert) or n < 2:
    s_rank = s_atom = 0.0
  else:
    if s.rank_reward == "listwise":
      rho = scipy.stats.spearmanr(ranking, expert).statistic
      s_rank = s.nan_score if math.isnan(rho) else (rho + 1) / 2
    elif s.rank_reward == "pairwise":
      acc = ref_pairwise(ranking, expert)
      s_rank = s.nan_score if math.isnan(acc) else acc
    else:
      s_rank = ref_top1(ranking, expert)
    s_atom = min(max(atomic_count, 0), n) / n
  return s.spearman_weight * s_rank + s.atomic_weight * s_atom + s.format_weight * fmt


# ---------------------------------------------------------------------------------------------
# Parser.
# ---------------------------------------------------------------------------------------------


def test_parse_rubric_hand_cases():
  text = ("<think>1. [0.9] hidden</think>Here is the rubric:\n1. [0.5] The action searches\n"
          "2.[0.3]   The query names the question entity  \n3. [-0.2] The action answers\n"
          "4. [abc] skipped\n5. [1.2.3] skipped\n6. [-] skipped\n</think>7. [0.2] kept")
  r = rb.parse_rubric(text)
  assert [(i.weight, i.text) for i in r.items] == [
      (0.5, "The action searches"), (0.3, "The query names the question entity"),
      (-0.2, "The action answers"), (0.2, "kept")]
  assert r.n == 4 and r.positive_sum == pytest.approx(1.0) and r.raw == text
  assert rb.parse_rubric("1. [0.5] a\n<think> 2. [0.5] b").n == 1  # unclosed think drops the rest
  assert rb.parse_rubric("1. [" + "9" * 400 + "] inf\n2. [0.5] b").items == (
      rb.RubricItem(0.5, "b"),)
  for junk in ("", "no rubric", "[nan]", "1. [nan] x", "1. [1e309] x", "1. [inf] x", None, 3,
               b"1. [0.5] bytes"):
    assert rb.parse_rubric(junk).items == ()


def junk_strings(count, seed=0):
  rng = random.Random(seed)
  pieces = ["1.", "2. ", "[", "]", "0.5", "-0.3", "[nan]", "[1e309]", "[" + "9" * 400 + "]",
            "<think>", "</think>", "\n", "-", "..", "١٢", "[-]", "[.]", "\u0000", "\ud800",
            "\U0001f600", "criterion", " ", "\t", "[0.2] x", "3.\n[0.1] y", "\\d+", "(.+)",
            "é", "\u202e", "10. [0.25] The action searches"]
  out = []
  for _ in range(count):
    kind = rng.randrange(3)
    if kind == 0:  # random bytes, decoded leniently
      data = bytes(rng.randrange(256) for _ in range(rng.randrange(60)))
      out.append(data.decode(rng.choice(["latin-1", "utf-8"]), errors="replace"))
    elif kind == 1:  # random code points, lone surrogates included
      out.append("".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(40))))
    else:  # rubric-like fragments
      out.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 25))))
  return out


def test_parser_and_reward_never_raise_on_junk():
  settings = rb.RewardSettings()
  rng = np.random.default_rng(0)
  for text in junk_strings(1500):
    r = rb.parse_rubric(text)
    assert all(math.isfinite(i.weight) and isinstance(i.text, str) for i in r.items)
    assert [(i.weight, i.text) for i in r.items] == ref_items(text), repr(text)
    applied = None if rng.random() < 0.3 else rb.Applied(
        tuple(scipy.stats.rankdata(rng.integers(0, 3, 4))), int(rng.integers(-1, 6)))
    score = rb.rubric_reward(text, [1, 2.5, 4, 2.5], applied, settings)
    assert 0.0 <= score.reward <= 1.0
    rb.rubric_suffix(r)
    rb.retry_suffix(r, r.items)


def test_strip_think_matches_reference():
  for text in junk_strings(300, seed=1) + ["a<think>b</think>c<think>d", "</think>x",
                                           "<think><think>a</think>b</think>c"]:
    assert rb.strip_think(text) == ref_strip_think(text), repr(text)


def test_repeat_rate_and_gate():
  rng = random.Random(2)
  vocab = ["the", "action", "searches", "Bavoli", "query"]
  for _ in range(200):
    text = " ".join(rng.choice(vocab) for _ in range(rng.randrange(12)))
    for n in (1, 2, 4):
      assert rb.repeat_rate(text, n) == pytest.approx(ref_repeat_rate(text, n))
  assert rb.repeat_rate("a b c d", 4) == 0.0  # fewer than n + 1 words
  # 8 words, 5 4-grams, 2 distinct ("a b a b", "b a b a"): rate 0.6 > 0.4.
  assert rb.repeat_rate("a b a b a b a b") == pytest.approx(0.6)
  assert rb.is_repetitive("a b a b a b a b") and not rb.is_repetitive("a b c d e f g h")
  # The gate is strict (rate > threshold): a rate equal to the threshold passes.
  text = "a b c d e a b c d e"  # 7 4-grams, 5 distinct: rate 2/7
  assert not rb.is_repetitive(text, 4, threshold=2 / 7)
  assert rb.is_repetitive(text, 4, threshold=2 / 7 - 1e-9)


def test_format_score():
  def rub(*weights):
    return rb.Rubric(tuple(rb.RubricItem(w, "x") for w in weights))
  assert rb.format_score(rub()) == 0.0
  assert rb.format_score(rub(0.5, 0.3, 0.2)) == 1.0
  assert rb.format_score(rub(0.5, 0.3, 0.2, -0.4)) == 1.0  # negatives do not count in the sum
  assert rb.format_score(rub(0.5, 0.5)) == 0.5  # N = 2
  assert rb.format_score(rub(0.4, 0.3, 0.1)) == 0.5  # |0.8 - 1| = 0.2 >= 0.15
  assert rb.format_score(rub(*[0.2] * 6)) == 0.0
  assert rb.format_score(rub(0.5, 0.5), min_items=2) == 1.0


# ---------------------------------------------------------------------------------------------
# Reward.
# ---------------------------------------------------------------------------------------------


def random_response(rng):
  """A generator response: a rubric with random items, sometimes junk or a repetitive text."""
  kind = rng.random()
  if kind < 0.1:
    return "step " * int(rng.integers(5, 30))  # repetitive
  if kind < 0.15:
    return junk_strings(1, seed=int(rng.integers(1 << 30)))[0]
  n = int(rng.integers(0, 7))
  lines = []
  for i in range(n):
    w = float(np.round(rng.normal(0.25, 0.3), 2))
    lines.append(f"{i + 1}. [{w}] {rng.choice(ex.CRITERION_PHRASES)} number {i} {rng.random()}")
  text = "\n".join(lines)
  if rng.random() < 0.2:
    text = "<think>1. [0.5] hidden</think>" + text
  return text


SETTINGS = [rb.RewardSettings(),
            rb.RewardSettings(rank_reward="pairwise"),
            rb.RewardSettings(rank_reward="top1"),
            rb.RewardSettings(spearman_weight=0.5, atomic_weight=0.3, format_weight=0.2,
                              repeat_threshold=0.2, repeat_ngram=2, min_items=2, max_items=4,
                              weight_tol=0.05, nan_score=0.25)]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.rank_reward)
def test_rubric_reward_matches_official_formula(settings):
  rng = np.random.default_rng(3)
  seen = {"nan_rho": 0, "failed": 0, "small": 0, "repetitive": 0, "full": 0}
  for _ in range(300):
    k = int(rng.integers(2, 6))
    raw = random_response(rng)
    expert = scipy.stats.rankdata(rng.integers(0, 3, k)).tolist()
    if rng.random() < 0.1:
      expert = [(k + 1) / 2] * k  # all tied: rho NaN
    roll = rng.random()
    if roll < 0.15:
      applied, ranking = None, None
    elif roll < 0.2:  # wrong length: a failed applier
      applied, ranking = rb.Applied(tuple(range(1, k + 2)), 2), None
    else:
      ranking = scipy.stats.rankdata(rng.integers(0, 3, k)).tolist()
      applied = rb.Applied(tuple(ranking), int(rng.integers(-2, 8)))
    score = rb.rubric_reward(raw, expert, applied, settings)
    ref = ref_reward(raw, expert, ranking, applied.atomic_count if applied else 0, settings)
    assert score.reward == pytest.approx(ref, abs=1e-6), (raw, expert, applied)
    assert score.n_items == len(ref_items(raw))
    assert score.applier_ok == (ranking is not None)
    assert score.repetitive == (ref_repeat_rate(raw, settings.repeat_ngram) >
                                settings.repeat_threshold)
    if ranking is not None and not score.repetitive:
      rho = scipy.stats.spearmanr(ranking, expert).statistic
      assert (math.isnan(rho) and math.isnan(score.rho)) or score.rho == pytest.approx(rho, 1e-6)
      seen["nan_rho"] += math.isnan(rho) and score.n_items >= 2
    seen["failed"] += ranking is None
    seen["small"] += score.n_items < 2
    seen["repetitive"] += score.repetitive
    seen["full"] += ranking is not None and score.n_items >= 2 and not score.repetitive
  assert all(v > 0 for v in seen.values()), seen  # every branch of the formula was exercised


def test_rubric_reward_hand_case():
  raw = "1. [0.5] The action searches\n2. [0.3] The query repeats no earlier query\n3. [0.2] z"
  score = rb.rubric_reward(raw, [1, 2.5, 4, 2.5], rb.Applied((1, 2, 4, 3), 2), rb.RewardSettings())
  rho = scipy.stats.spearmanr([1, 2, 4, 3], [1, 2.5, 4, 2.5]).statistic
  assert score.rho == pytest.approx(rho, abs=1e-6)
  assert score.reward == pytest.approx(0.75 * (rho + 1) / 2 + 0.15 * 2 / 3 + 0.10, abs=1e-6)
  # NaN rho -> 0.5; N < 2 -> rank and atomic terms 0; failed applier -> both 0.
  nan = rb.rubric_reward(raw, [2.5] * 4, rb.Applied((1, 2, 4, 3), 3), rb.RewardSettings())
  assert nan.rank_term == 0.5 and nan.reward == pytest.approx(0.75 * 0.5 + 0.15 + 0.1)
  one = rb.rubric_reward("1. [1.0] The action searches", [1, 2], rb.Applied((1, 2), 1),
                         rb.RewardSettings())
  assert (one.rank_term, one.atomic_term, one.format_term) == (0.0, 0.0, 0.5)
  failed = rb.rubric_reward(raw, [1, 2, 3], None, rb.RewardSettings())
  assert not failed.applier_ok and failed.reward == pytest.approx(0.1)
  for bad in ([], [[1, 2]], [1, float("nan")]):
    with pytest.raises(ValueError, match="expert_ranking"):
      rb.rubric_reward(raw, bad, None, rb.RewardSettings())


def test_reward_settings_from_config():
  c = base_config.get_config("demo").coreact
  s = rb.RewardSettings.from_config(c)
  assert s == rb.RewardSettings()  # the config holds the official constants
  c.rank_reward = "pairwise"
  c.spearman_weight = 0.6
  assert rb.RewardSettings.from_config(c).rank_reward == "pairwise"
  assert rb.RewardSettings.from_config(c).spearman_weight == 0.6
  c.rank_reward = "bogus"
  with pytest.raises(ValueError, match="rank_reward"):
    rb.RewardSettings.from_config(c)
  with pytest.raises(ValueError, match="nan_score"):
    rb.RewardSettings.from_config(type("C", (), {f.name: 1 for f in
                                                 rb.dataclasses.fields(rb.RewardSettings)
                                                 if f.name != "nan_score"})())


# ---------------------------------------------------------------------------------------------
# Phase, trajectory, prompt, suffixes.
# ---------------------------------------------------------------------------------------------


def test_phase_of():
  for max_calls in range(1, 12):
    for calls in range(max_calls + 1):
      want = ("late" if calls >= max_calls - 1 else
              "early" if 3 * calls < max_calls else "middle")
      assert rb.phase_of(calls, max_calls) == want, (calls, max_calls)
  assert [rb.phase_of(c, 4) for c in range(5)] == ["early", "early", "middle", "late", "late"]
  assert set(rb.PHASE_HINTS) == {"early", "middle", "late"}
  assert "answer" not in rb.PHASE_HINTS["early"].replace("answering yet", "")


QUESTION = {"question": "In which country was Bavoli Drensk born?", "golden_answers": ["Vorla"],
            "chain": ["Bavoli Drensk", "Ketrana City", "Vorla"], "hops": 2}
DOC_BAVOLI = Document("e1", '"Bavoli Drensk"\nBavoli Drensk was born in Ketrana City. Bavoli '
                      "Drensk works for Zhen Labs.", 3.0)
DOC_KETRANA = Document("e2", '"Ketrana City"\nKetrana City is a city located in Vorla.', 2.0)
ENTITY_NAMES = ["Bavoli Drensk", "Ketrana City", "Vorla", "Zhen Labs", "Trosk", "The Omni"]


def turn(kind, content, docs=(), error=None, think="I should look this up."):
  body = {"search": f"<search> {content} </search>",
          "answer": f"<answer> {content} </answer>"}.get(kind, content)
  return TurnRecord(text=f"<think>{think}</think>\n{body}", action=Action(kind, content),
                    documents=tuple(docs), observation="", search_error=error)


def context(*turns, max_calls=4, protocol="search_r1"):
  return BranchContext(question=QUESTION, turns=tuple(turns), max_calls=max_calls,
                       protocol=protocol)


def test_render_trajectory_and_prompt():
  long_doc = Document("e9", '"Trosk"\n' + "Trosk word " * 200, 1.0)
  ctx = context(turn("search", "where was Bavoli Drensk born", [DOC_BAVOLI, long_doc],
                     think="SECRET plan"),
                turn("search", "Ketrana City", error="retriever timed out"),
                turn("invalid", "no action found", think="x"))
  text = rb.render_trajectory(ctx, doc_chars=100)
  assert "SECRET" not in text and "<think>" not in text
  assert "Step 1: <search> where was Bavoli Drensk born </search>" in text
  assert "- Bavoli Drensk: Bavoli Drensk was born in Ketrana City." in text
  trosk_line = next(line for line in text.splitlines() if line.startswith("- Trosk"))
  assert len(trosk_line) <= len("- Trosk: ") + 100
  assert "Search failed: retriever timed out" in text and "Invalid action" in text
  prompt = rb.rubric_prompt(ctx)
  for part in ("3 to 5 criteria", "`N. [w] criterion`", QUESTION["question"],
               rb.PHASE_HINTS["middle"], "2 of 4 searches", "Step 3"):
    assert part in prompt, part
  assert prompt.endswith("Rubric:\n")
  empty = rb.rubric_prompt(context())
  assert "(no steps yet)" in empty and rb.PHASE_HINTS["early"] in empty


def test_rubric_prompt_cut_from_the_front():
  turns = [turn("search", f"query number {i} about Bavoli Drensk", [DOC_BAVOLI]) for i in range(8)]
  ctx = context(*turns, max_calls=10)
  full = rb.rubric_prompt(ctx, max_chars=100_000)
  assert "Step 1:" in full and "omitted" not in full
  cut = rb.rubric_prompt(ctx, max_chars=900)
  assert len(cut) <= 900
  assert QUESTION["question"] in cut and rb.PHASE_HINTS["middle"] in cut
  assert "Step 8: <search> query number 7" in cut and "Step 1:" not in cut
  assert "earlier steps omitted" in cut
  # Even the latest step alone does not fit: its end is kept.
  tiny = rb.rubric_prompt(ctx, max_chars=len(rb.rubric_prompt(context(), 10_000)) + 40)
  assert QUESTION["question"] in tiny and tiny.endswith("Rubric:\n")
  assert len(tiny) <= len(rb.rubric_prompt(context(), 10_000)) + 40


def test_suffixes():
  r = rb.parse_rubric("1. [0.25] The action searches\n2. [0.75] The query repeats no earlier query"
                      "\n3. [-0.5] The action answers")
  suffix = rb.rubric_suffix(r)
  assert suffix.startswith("\n[Rubric for the next step]\n") and suffix.endswith("\n")
  assert rb.parse_rubric(suffix).items == r.items  # the agent reads the same rubric
  assert rb.rubric_suffix(rb.parse_rubric("junk")) == ""
  feedback = rb.retry_suffix(r, [r.items[1], r.items[2]])
  assert "2. [0.75] The query repeats no earlier query (not met)" in feedback
  assert "3. [-0.5] The action answers (met, but should be avoided)" in feedback
  assert "1. [0.25]" not in feedback
  assert "scored low" in rb.retry_suffix(r, [])
  # Items from another parse of the same text are numbered too.
  again = rb.parse_rubric(r.raw)
  assert "2. [0.75]" in rb.retry_suffix(r, [again.items[1]])


# ---------------------------------------------------------------------------------------------
# Executor.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def entities(tmp_path_factory):
  path = tmp_path_factory.mktemp("world") / "entities.jsonl"
  path.write_text("".join(json.dumps({"id": f"e{i}", "name": n, "type": "x"}) + "\n"
                          for i, n in enumerate(ENTITY_NAMES)) + "\n")
  return ex.load_entities(str(path))


def test_load_entities(entities, tmp_path):
  # Normalized like answers: lowercase, articles dropped ("The Omni" -> "omni").
  assert entities == frozenset({"bavoli drensk", "ketrana city", "vorla", "zhen labs", "trosk",
                                "omni"})
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"name": "Vorla"}\n{"id": "x"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field 'name'"):
    ex.load_entities(str(bad))
  bad.write_text('{"name": 3}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:1: 'name' must be a string"):
    ex.load_entities(str(bad))
  with pytest.raises(ValueError, match="cannot open entities file"):
    ex.load_entities(str(tmp_path / "missing.jsonl"))


def test_entities_in(entities):
  assert ex.entities_in("Where was BAVOLI  Drensk born? Ketrana-City", entities) == {
      "bavoli drensk"}  # "Ketrana-City" normalizes to "ketranacity": not a mention
  assert ex.entities_in("Ketrana City, Vorla and the Zhen Labs", entities) == {
      "ketrana city", "vorla", "zhen labs"}
  assert ex.entities_in("Vorlan Bavoli", entities) == frozenset()  # whole words only


def test_criterion_phrases_vocabulary():
  assert ex.CRITERION_PHRASES == tuple(ex.CRITERIA)
  for phrase in ex.CRITERION_PHRASES:
    demo = phrase[0].upper() + phrase[1:]
    assert ex.criterion_phrase(demo) == phrase  # each phrase picks its own predicate
    assert ex.criterion_phrase(f"  {demo.upper()}!! (important)") == phrase
  assert ex.criterion_phrase("The action is well-formed.") == "the action is well formed"
  assert ex.criterion_phrase("Be thorough") is None
  assert ex.criterion_phrase("The actions searches") is None
  r = rb.parse_rubric("1. [0.5] The action searches\n2. [0.3] Be thorough\n3. [0.2] The action "
                      "answers after a search")
  preds = ex.criterion_predicates(r)
  assert preds[0] is ex.CRITERIA["the action searches"] and preds[1] is None
  assert preds[2] is ex.CRITERIA["the action answers after a search"]
  assert "the query names an entity from the latest documents" in ex.__doc__


# Two turns: a search that read Bavoli Drensk's passage (bridge: Ketrana City), then a failed
# search. The latest turn WITH documents is the first.
CTX = context(turn("search", "where was Bavoli Drensk born", [DOC_BAVOLI]),
              turn("search", "Ketrana", error="timeout"))

CANDIDATES = {
    "new_bridge": "<think>a</think>\n<search> which country is Ketrana City located in </search>",
    "repeat": "<search>  Where was Bavoli Drensk born? </search>",
    "question_entity": "<search> Bavoli Drensk employer </search>",
    "repeat_failed": "<search> ketrana </search>",
    "answer_doc": "<answer> Ketrana City </answer>",
    "answer_other": "<answer> Vorla </answer>",
    "invalid": "I think the answer is Vorla",
}

# phrase -> the candidates that meet it (all others do not).
EXPECTED = {
    "the action searches": {"new_bridge", "repeat", "question_entity", "repeat_failed"},
    "the action answers": {"answer_doc", "answer_other"},
    "the action is well formed": set(CANDIDATES) - {"invalid"},
    "the query repeats no earlier query": {"new_bridge", "question_entity"},
    "the query repeats an earlier query": {"repeat", "repeat_failed"},
    "the query names the question entity": {"repeat", "question_entity"},
    "the query names an entity from the latest documents": {"new_bridge"},
    "the answer names an entity from the documents": {"answer_doc"},
    "the action answers after a search": {"answer_doc", "answer_other"},
}


def test_each_predicate(entities):
  assert set(EXPECTED) == set(ex.CRITERIA)
  for phrase, want in EXPECTED.items():
    pred = ex.CRITERIA[phrase]
    got = {name for name, text in CANDIDATES.items() if pred(CTX, CTX.parse(text), entities)}
    assert got == want, phrase


def test_predicates_on_other_contexts(entities):
  start = context()  # step 1: nothing searched, no documents
  answer = start.parse("<answer> Ketrana City </answer>")
  assert not ex.CRITERIA["the action answers after a search"](start, answer, entities)
  assert not ex.CRITERIA["the answer names an entity from the documents"](start, answer, entities)
  bridge = start.parse("<search> Ketrana City </search>")
  assert not ex.CRITERIA["the query names an entity from the latest documents"](
      start, bridge, entities)
  assert ex.CRITERIA["the query repeats no earlier query"](start, bridge, entities)
  # The latest documents are the last turn's that has any: the newest read wins.
  two = context(turn("search", "Bavoli Drensk", [DOC_BAVOLI]),
                turn("search", "Ketrana City", [DOC_KETRANA]))
  pred = ex.CRITERIA["the query names an entity from the latest documents"]
  assert pred(two, two.parse("<search> capital of Vorla </search>"), entities)
  assert not pred(two, two.parse("<search> Zhen Labs founder </search>"), entities)
  # An entity of the question is not a bridge even when the latest documents name it.
  assert pred(CTX, CTX.parse("<search> Bavoli Drensk Zhen Labs </search>"), entities)
  assert not pred(CTX, CTX.parse("<search> Bavoli Drensk </search>"), entities)
  # The tool_call protocol parses candidates its own way.
  tc = context(turn("search", "where was Bavoli Drensk born", [DOC_BAVOLI]), protocol="tool_call")
  call = ('<tool_call>\n{"name": "search", "arguments": {"query": "Ketrana City country"}}\n'
          "</tool_call>")
  assert pred(tc, tc.parse(call), entities)
  assert not ex.CRITERIA["the action is well formed"](tc, tc.parse("<search> x </search>"),
                                                      entities)


def ref_apply(items, met_table):
  """Scores and ranks by hand: met_table[k][i] = candidate k meets item i (None: not atomic)."""
  scores = [sum(w for (w, _), m in zip(items, row) if m) for row in met_table]
  return scores, scipy.stats.rankdata([-round(s, 9) for s in scores]).tolist()


def met_table_by_expected(items, names):
  table = []
  for name in names:
    row = []
    for _, text in items:
      phrase = ex.criterion_phrase(text)
      row.append(None if phrase is None else name in EXPECTED[phrase])
    table.append(row)
  return table


def test_apply_rubric_against_reference(entities):
  rng = random.Random(4)
  names = list(CANDIDATES)
  phrases = list(ex.CRITERION_PHRASES) + ["be precise", "cite sources"]
  for _ in range(60):
    n = rng.randrange(0, 6)
    items = [(rng.choice([0.1, 0.2, 0.3, 0.5, -0.2, -0.4]),
              rng.choice(phrases).capitalize() + rng.choice(["", ".", " (important)"]))
             for _ in range(n)]
    r = rb.parse_rubric("\n".join(f"{i + 1}. [{w}] {t}" for i, (w, t) in enumerate(items)))
    cand_names = rng.sample(names, rng.randrange(1, 5))
    applied = ex.apply_rubric(r, CTX, [CANDIDATES[c] for c in cand_names], entities)
    scores, ranks = ref_apply(items, met_table_by_expected(items, cand_names))
    assert applied.atomic_count == sum(ex.criterion_phrase(t) is not None for _, t in items)
    np.testing.assert_allclose(applied.scores, scores, atol=1e-9)
    assert list(applied.ranking) == ranks, (items, cand_names)


def test_apply_rubric_ties_and_atomic_count(entities):
  r = rb.parse_rubric("1. [0.6] The action searches\n2. [0.4] The query repeats no earlier query\n"
                      "3. [0.2] Be insightful\n4. [-0.3] The action answers")
  cands = [CANDIDATES[c] for c in ("new_bridge", "question_entity", "repeat", "answer_doc")]
  applied = ex.apply_rubric(r, CTX, cands, entities)
  assert applied.atomic_count == 3
  assert applied.scores == (1.0, 1.0, 0.6, -0.3)
  assert applied.ranking == (1.5, 1.5, 3.0, 4.0)
  # Equal weight sums of different criteria tie (0.1 + 0.2 vs 0.3 in floats).
  r2 = rb.parse_rubric("1. [0.1] The action searches\n2. [0.2] The query repeats no earlier query"
                       "\n3. [0.3] The action answers")
  applied2 = ex.apply_rubric(r2, CTX, [CANDIDATES["new_bridge"], CANDIDATES["answer_doc"]],
                             entities)
  assert applied2.ranking == (1.5, 1.5)
  assert ex.apply_rubric(r, CTX, [], entities) == rb.Applied((), 3, ())
  none = ex.apply_rubric(rb.parse_rubric(""), CTX, cands, entities)
  assert none.ranking == (2.5,) * 4 and none.atomic_count == 0
  # The executor's output feeds the reward.
  score = rb.rubric_reward(r.raw, [1, 2, 3, 4], applied, rb.RewardSettings())
  assert score.applier_ok and score.atomic_term == pytest.approx(3 / 4)


def test_verify_score_bounds_and_negative_weights(entities):
  rng = random.Random(5)
  phrases = list(ex.CRITERION_PHRASES) + ["be precise"]
  for _ in range(100):
    items = [(rng.choice([0.1, 0.25, 0.5, 0.9, -0.3, -1.0]), rng.choice(phrases).capitalize())
             for _ in range(rng.randrange(0, 6))]
    r = rb.parse_rubric("\n".join(f"{i + 1}. [{w}] {t}" for i, (w, t) in enumerate(items)))
    for name, text in CANDIDATES.items():
      got = ex.verify_score(r, CTX, text, entities)
      assert 0.0 <= got <= 1.0
      positive = sum(w for w, _ in items if w > 0)
      met = met_table_by_expected(items, [name])[0]
      want = 0.0 if positive <= 0 else min(max(
          sum(w for (w, _), m in zip(items, met) if m) / positive, 0.0), 1.0)
      assert got == pytest.approx(want), (items, name)
  r = rb.parse_rubric("1. [0.5] The action searches\n2. [0.5] Be precise\n3. [-0.9] The query "
                      "repeats an earlier query")
  assert ex.verify_score(r, CTX, CANDIDATES["new_bridge"], entities) == 0.5  # "be precise": unmet
  assert ex.verify_score(r, CTX, CANDIDATES["repeat"], entities) == 0.0  # 0.5 - 0.9 < 0: clipped
  only_negative = rb.parse_rubric("1. [-0.5] The action answers")
  assert ex.verify_score(only_negative, CTX, CANDIDATES["new_bridge"], entities) == 0.0


def test_failed_items(entities):
  r = rb.parse_rubric("1. [0.4] The query repeats no earlier query\n2. [0.3] The query names an "
                      "entity from the latest documents\n3. [0.3] Be precise\n4. [-0.5] The "
                      "query repeats an earlier query\n5. [0] The action answers")
  assert ex.failed_items(r, CTX, CANDIDATES["new_bridge"], entities) == []
  assert ex.failed_items(r, CTX, CANDIDATES["repeat"], entities) == [
      r.items[0], r.items[1], r.items[3]]
  # Zero weights and criteria outside the vocabulary never count as failed.
  assert r.items[2] not in ex.failed_items(r, CTX, CANDIDATES["invalid"], entities)
  assert r.items[4] not in ex.failed_items(r, CTX, CANDIDATES["answer_doc"], entities)
  feedback = rb.retry_suffix(r, ex.failed_items(r, CTX, CANDIDATES["repeat"], entities))
  assert "4. [-0.5] The query repeats an earlier query (met, but should be avoided)" in feedback
