"""Action parsing: malformed model output takes the invalid-action path, never an exception."""

from __future__ import annotations

import json

import pytest

from agentjax.agent import ANSWER, INVALID, SEARCH, SEARCH_R1, TOOL_CALL, format_documents, get_protocol
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
