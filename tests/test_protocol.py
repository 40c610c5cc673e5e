"""Action parsing and the one format rule: malformed model output takes the invalid-action path,
never an exception; a trajectory is well-formed iff every turn holds a valid action and only the
last one answers (agentjax/agent/protocol.py, used by rollouts, the format penalty, eval and SFT
demo checks).

The trajectory cases come from the second tag grammar that rl/rewards.py used to carry (now
deleted), re-judged by the surviving rule. Where the verdicts differ, the rule decides:
  * whitespace around an answer or a query is fine ("<answer> Paris </answer>" answers "Paris");
  * <think> is not required, and free text around the action is allowed (Search-R1's own action
    parser); what the last token carried past the closing tag is ignored (the rollout stops there);
  * an empty answer ("<answer></answer>", or only whitespace / control characters) is invalid;
  * a tool call must name the "search" tool (an unknown name such as "lookup" is invalid) and
    carry one string query (a list of queries is invalid);
  * observations and chat markers are the environment's text, rendered by the protocol itself,
    so they are not part of the model's format (the grammar's marker cases have no counterpart).
"""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest

from agentjax.agent import ANSWER, INVALID, SEARCH, SEARCH_R1, TOOL_CALL, format_documents, get_protocol
from agentjax.agent.protocol import Action, clean_text, trajectory_error
from agentjax.retrieval import Document
from agentjax.sampling import decode_bytes


def test_search_r1_valid_actions():
  assert SEARCH_R1.parse("<think>hm</think>\n<search> capital of Orsk </search>") == (
      SEARCH_R1.parse("<search>capital of Orsk</search>"))
  action = SEARCH_R1.parse("<think>x</think><search> capital of Orsk </search>\n")
  assert (action.kind, action.content) == (SEARCH, "capital of Orsk")
  action = SEARCH_R1.parse("<think>done</think><answer> Orsk </answer>")
  assert (action.kind, action.content) == (ANSWER, "Orsk")


INVALID_SEARCH_R1 = {
    "no action": "<think>I am thinking and never act",
    "unclosed search": "<think>x</think><search>capital of",
    "unclosed answer": "<answer>Orsk",
    "close without open": "capital</search>",
    "empty query": "<search>   </search>",
    "nested search": "<search>a <search>b</search>",
    "tag in query": "<search>a <answer>b</search>",
    "answer inside search": "<search>a <answer>b</answer>",
    "nested answer": "<answer>a <answer>b</answer>",
    "long query": "<search>" + "x" * 10_000 + "</search>",
    "invalid utf-8": "<search>" + decode_bytes([b"caf", b"\xc3", b"(", b"\xff"], [0, 1, 2, 3]) + "</search>",
}


@pytest.mark.parametrize("case", sorted(INVALID_SEARCH_R1))
def test_search_r1_malformed_is_invalid(case):
  action = SEARCH_R1.parse(INVALID_SEARCH_R1[case])
  assert action.kind == INVALID and action.content, (case, action)


def test_tool_call_actions():
  call = json.dumps({"name": "search", "arguments": {"query": "capital of Orsk"}})
  action = TOOL_CALL.parse(f"<think>x</think>\n<tool_call>\n{call}\n</tool_call>")
  assert (action.kind, action.content) == (SEARCH, "capital of Orsk")
  as_string = json.dumps({"name": "search", "arguments": json.dumps({"query": "q"})})
  assert TOOL_CALL.parse(f"<tool_call>{as_string}</tool_call>").kind == SEARCH
  assert TOOL_CALL.parse("<answer>Orsk</answer>").content == "Orsk"


INVALID_TOOL_CALL = {
    "broken json": '<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
    "not an object": "<tool_call>[1, 2]</tool_call>",
    "other tool": '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
    "no query": '<tool_call>{"name": "search", "arguments": {}}</tool_call>',
    "query not a string": '<tool_call>{"name": "search", "arguments": {"query": 3}}</tool_call>',
    "empty query": '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>',
    "unclosed": '<tool_call>{"name": "search"',
    "nested": '<tool_call><tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>',
    "deep json": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "huge integer": "<tool_call>" + "1" * 5000 + "</tool_call>",
    "long query": '<tool_call>{"name": "search", "arguments": {"query": "' + "y" * 10_000 + '"}}</tool_call>',
}


@pytest.mark.parametrize("case", sorted(INVALID_TOOL_CALL))
def test_tool_call_malformed_is_invalid(case):
  action = TOOL_CALL.parse(INVALID_TOOL_CALL[case])
  assert action.kind == INVALID and action.content, (case, action)


def test_observation_format_is_search_r1s():
  docs = [Document(id="1", contents='"Orsk"\nOrsk is a city.', score=2.0),
          Document(id="2", contents='"Veltrana"\nA country.\nSecond line.', score=1.0)]
  assert format_documents(docs) == ('Doc 1(Title: "Orsk") Orsk is a city.\n'
                                    'Doc 2(Title: "Veltrana") A country.\nSecond line.\n')
  prefix, body, suffix = SEARCH_R1.observation(docs)
  assert (prefix, suffix) == ("\n\n<information>", "</information>\n\n")
  with pytest.raises(ValueError, match="rollout.protocol 'react'"):
    get_protocol("react")


# ------------------------------------------------------------------ queries and answers are cleaned

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def ref_clean(text):
  """Independent reference: Cc whitespace -> space, other Cc and bidi controls dropped, strip."""
  out = []
  for ch in text:
    if unicodedata.category(ch) == "Cc":
      out.append(" " if ch in "\t\n\v\f\r\x1c\x1d\x1e\x1f\x85" else "")
    elif ch not in BIDI:
      out.append(ch)
  return "".join(out).strip()


def test_clean_text_matches_reference():
  rng = np.random.default_rng(0)
  pool = ["a", "Z", " ", "é", "\u05d0", "\u00a0", "\u200b", "\ufeff", "\u2028"] + \
      [chr(c) for c in (*range(0x20), *range(0x7f, 0xa0))] + list(BIDI)
  for _ in range(500):
    text = "".join(rng.choice(pool, size=rng.integers(0, 12)))
    assert clean_text(text) == ref_clean(text), repr(text)


@pytest.mark.parametrize("proto", [SEARCH_R1, TOOL_CALL])
def test_control_and_bidi_characters_never_reach_the_retriever(proto):
  def call(query):
    if proto is TOOL_CALL:
      return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": query}}) + \
          "</tool_call>"
    return f"<search>{query}</search>"

  action = proto.parse(call("\u202ecapital\x00 of\tOrsk\u2066\x1b[2J\u2069\n"))
  assert (action.kind, action.content) == (SEARCH, "capital of Orsk[2J")
  for junk in ["\x00\x07", "\u202e\u202d", "\t\n\r ", "\u2066 \u2069\x7f\x9f"]:
    action = proto.parse(call(junk))
    assert action.kind == INVALID and "empty query" in action.content, (junk, action)
  # A tag split by a control character is still a tag once cleaned.
  assert proto.parse(call("a </ans\x00wer> b")).kind == INVALID


@pytest.mark.parametrize("proto", [SEARCH_R1, TOOL_CALL])
def test_empty_answer_is_a_format_error(proto):
  for empty in ["", "   ", "\n\t", "\x00\u202e"]:
    action = proto.parse(f"<think>x</think><answer>{empty}</answer>")
    assert action == Action(INVALID, "empty answer"), (empty, action)
    assert proto.format_error([f"<answer>{empty}</answer>"]) == "turn 1: empty answer"
  assert proto.parse("<answer> Paris\u200f </answer>") == Action(ANSWER, "Paris")


# ------------------------------------------------------------------ whole trajectories

T = "<think>r</think>"
S, A = "<search>q</search>", "<answer>x</answer>"
CALL = '<tool_call>{"name": "search", "arguments": {"query": "who"}}</tool_call>'


def test_trajectory_rule_over_actions():
  s, a, bad = Action(SEARCH, "q"), Action(ANSWER, "x"), Action(INVALID, "why")
  assert trajectory_error([a]) is None and trajectory_error([s, s, a]) is None
  assert trajectory_error([]) == (-1, "no turns")
  assert trajectory_error([s, bad, a]) == (1, "why")
  assert trajectory_error([a, a]) == (0, "answer before the last turn")
  assert trajectory_error([s, s]) == (1, "the last turn is not an <answer>")


# Each case is one trajectory's turns (the model's generated text, one string per turn).
SEARCH_R1_VALID = [
    [T + A],
    [T + S, T + A],
    [T + S, T + S, T + A],
    ["  \n" + T + "\n" + S + "\n", "\n" + T + "\n" + A + "\n"],
    [T + "<answer> Paris </answer>"],  # whitespace around the answer is fine
    ["<answer> Paris </answer>"],      # <think> is not required
    ["<think></think>" + A],           # empty think is fine
    ["<think>multi\nline < > thoughts</think>" + A],
    [T + S, T + "<answer>a <b>bold</b></answer>"],  # unknown tags are answer text
    ["hello " + T + A], [T + "so " + A], ["<think>r" + A], ["</think>" + A],  # free text
    [T + A + " trailing"], [T + A + "<|im_end|>"],  # past the closing tag: ignored
    [S, T + A],
    ["<think>r<search>q</search>", T + A],  # the turn ends at the first closing tag
    [T + "<tool_call>{}</tool_call>" + A],  # the other protocol's tag is plain text
]

SEARCH_R1_INVALID = [
    ([], "no turns"),
    ([""], "turn 1: no complete <search> or <answer> action"),
    ([T], "turn 1: no complete"),
    ([T + S, T], "turn 2: no complete"),
    ([T + S], "turn 1: the last turn is not an <answer>"),
    ([T + A, T], "turn 1: answer before the last turn"),
    ([T + A, T + A], "turn 1: answer before the last turn"),
    ([T + "<answer>x"], "turn 1: no complete"),
    ([T + "<search>q" + "<information>d</information>" + T + A], "turn 1: nested tags in answer"),
    ([T + "<search>   </search>", T + A], "turn 1: empty query"),
    ([T + "<answer></answer>"], "turn 1: empty answer"),
    (["<think></think><answer></answer>"], "turn 1: empty answer"),
    ([T + "<answer>x<answer>y</answer></answer>"], "turn 1: nested tags in answer"),
    ([T + "q</search>", T + A], "turn 1: </search> without <search>"),
    ([T + "<search>a <search>b</search>", T + A], "turn 1: nested <search> tags"),
]


TOOL_VALID = [
    [T + A],
    [T + CALL, T + A],
    [T + "\n" + CALL, T + "\n" + A],
    ['<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}\n</tool_call>', A],
    [T + '<tool_call>{"name": "search", "arguments": {"query": " who "}}</tool_call>', A],
]

TOOL_INVALID = [
    ([T + "<tool_call>not json</tool_call>", T + A], "turn 1: tool call is not valid JSON"),
    ([T + '<tool_call>{"arguments": {"query": "q"}}</tool_call>', T + A],
     "turn 1: tool call must name the 'search' tool"),
    ([T + '<tool_call>{"name": "lookup", "arguments": {"query": "q"}}</tool_call>', T + A],
     "turn 1: tool call must name the 'search' tool"),  # unknown tool names are invalid
    ([T + '<tool_call>{"name": "search", "arguments": {}}</tool_call>', T + A],
     "turn 1: tool call needs a string arguments.query"),
    ([T + '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>', T + A],
     "turn 1: empty query"),
    ([T + '<tool_call>{"name": "search", "arguments": {"query": ["a", "b"]}}</tool_call>', T + A],
     "turn 1: tool call needs a string arguments.query"),  # one query per call
    ([T + '<tool_call>["search"]</tool_call>', T + A],
     "turn 1: tool call must name the 'search' tool"),
    ([T + CALL, T + A + A, T], "turn 2: answer before the last turn"),
    ([T + "<tool_call>" + CALL], "turn 1: nested <tool_call> tags"),
    ([T + CALL, T], "turn 2: no complete <tool_call> or <answer> action"),
    ([T + "<search>q</search>", T + A], "turn 1: no complete <tool_call>"),  # other protocol's
]


@pytest.mark.parametrize("proto,turns", [(SEARCH_R1, t) for t in SEARCH_R1_VALID]
                         + [(TOOL_CALL, t) for t in TOOL_VALID])
def test_well_formed_trajectories(proto, turns):
  assert proto.format_error(turns) is None


@pytest.mark.parametrize("proto,turns,why", [(SEARCH_R1, *c) for c in SEARCH_R1_INVALID]
                         + [(TOOL_CALL, *c) for c in TOOL_INVALID])
def test_malformed_trajectories(proto, turns, why):
  reason = proto.format_error(turns)
  assert reason is not None and reason.startswith(why), reason
