"""Rollout protocols: how an agent asks for a search, how results come back, how it answers.

Two are built in, chosen by name in config:

  search_r1  (default)  <search> query </search>  ->  <information>Doc 1(Title: ...) ...</information>
  tool_call             <tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>
                        -> a user turn holding <tool_response>...</tool_response> (Qwen / DeepResearcher)

Both answer with <answer> ... </answer>. A protocol parses one turn's generated text into an
Action and renders observations as text; it never raises on model output: anything malformed is
an Action of kind "invalid" with the reason, and the agent gets the standard invalid-action
observation. Model text is only parsed, never executed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from agentjax.retrieval import Document

SEARCH, ANSWER, INVALID = "search", "answer", "invalid"

# Search-R1's instruction (prompt template of the official code).
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, you "
    "can call a search engine by <search> query </search> and it will return the top searched "
    "results between <information> and </information>. You can search as many times as your "
    "want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n")

TOOL_CALL_INSTRUCTION = (
    "Answer the given question. Think inside <think> and </think> before every action. To look "
    "something up, call the search tool:\n<tool_call>\n{{\"name\": \"search\", \"arguments\": "
    "{{\"query\": \"...\"}}}}\n</tool_call>\nThe results come back inside <tool_response> and "
    "</tool_response>. When you know the answer, give it inside <answer> and </answer>, for "
    "example <answer> Beijing </answer>. Question: {question}\n")


@dataclasses.dataclass(frozen=True)
class Action:
  kind: str          # SEARCH | ANSWER | INVALID
  content: str = ""  # the query, the answer, or why the action is invalid


def format_documents(docs: Sequence[Document]) -> str:
  """Search-R1's passage rendering: 'Doc i(Title: <first line>) <rest>' one per line."""
  return "".join(f"Doc {i + 1}(Title: {d.title}) {d.text}\n" for i, d in enumerate(docs))


_BAD_TEXT = "\ufffd"  # what invalid UTF-8 decodes to


def _json_query(body: str) -> tuple[str, str | None]:
  """(query, None) from a search tool call in JSON, or ("", why it is unusable)."""
  try:
    call = json.loads(body)
  except (ValueError, RecursionError):  # ValueError also covers over-long integer literals
    return "", "tool call is not valid JSON"
  if not isinstance(call, dict) or call.get("name") != "search":
    return "", "tool call must name the 'search' tool"
  args = call.get("arguments")
  if isinstance(args, str):  # some models emit arguments as a JSON string
    try:
      args = json.loads(args)
    except (ValueError, RecursionError):
      return "", "tool call arguments are not valid JSON"
  query = args.get("query") if isinstance(args, dict) else None
  if not isinstance(query, str):
    return "", "tool call needs a string arguments.query"
  return query, None


def _check_query(query: str, max_chars: int) -> str | None:
  """Why a query cannot be sent, or None."""
  if not query.strip():
    return "empty query"
  if len(query) > max_chars:
    return f"query longer than {max_chars} characters"
  if _BAD_TEXT in query:
    return "query is not valid UTF-8"
  if re.search(r"</?(search|answer|information|think|tool_call|tool_response)>", query):
    return "nested tags in query"
  return None


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Tags and templates of one rollout protocol. Instances are immutable and shareable."""

  name: str
  instruction: str
  stop_strings: tuple[str, ...]
  observation_prefix: str
  observation_suffix: str
  invalid_message: str
  call_tag: str = "search"       # the action tag that carries a search: <search> or <tool_call>
  query_in_json: bool = False    # tool-call style: the tag holds {"name": "search", "arguments": ...}
  max_query_chars: int = 1000

  def prompt(self, question: str) -> str:
    return self.instruction.format(question=question)

  def parse(self, text: str) -> Action:
    """The action of one turn's generated text (which ends at the first stop string, if any)."""
    call, open_tag, close_tag = self.call_tag, f"<{self.call_tag}>", f"</{self.call_tag}>"
    first = self._first_close(text, (call, "answer"))
    if first is None:
      return Action(INVALID, f"no complete {open_tag} or <answer> action")
    if first == "answer":
      return self._answer_or_none(text) or Action(INVALID, "unmatched </answer>")
    head = text[:text.find(close_tag)]
    start = head.rfind(open_tag)
    if start < 0:
      return Action(INVALID, f"{close_tag} without {open_tag}")
    if head[:start].count(open_tag) > head[:start].count(close_tag):
      return Action(INVALID, f"nested {open_tag} tags")
    body = head[start + len(open_tag):]
    query, why = _json_query(body) if self.query_in_json else (body, None)
    why = why or _check_query(query, self.max_query_chars)
    return Action(INVALID, why) if why else Action(SEARCH, query.strip())

  def _answer_or_none(self, text: str) -> Action | None:
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    if m is None:
      return None
    before = text[:m.start()]
    if re.search(r"</?(answer|search|tool_call)>", m.group(1)) or \
        before.count(f"<{self.call_tag}>") > before.count(f"</{self.call_tag}>"):
      return Action(INVALID, "nested tags in answer")
    return Action(ANSWER, m.group(1).strip())

  def _first_close(self, text: str, tags: Sequence[str]) -> str | None:
    """Which of the closing tags comes first in the text."""
    found = [(text.find(f"</{t}>"), t) for t in tags if f"</{t}>" in text]
    return min(found)[1] if found else None

  def observation(self, docs: Sequence[Document]) -> tuple[str, str, str]:
    """(prefix, body, suffix) of a search result; the body is what truncation may cut."""
    return self.observation_prefix, format_documents(docs), self.observation_suffix

  def error_observation(self, reason: str) -> tuple[str, str, str]:
    return self.observation_prefix, f"Search failed: {reason}\n", self.observation_suffix

  def invalid_observation(self) -> str:
    return self.invalid_message


SEARCH_R1 = Protocol(
    name="search_r1",
    instruction=SEARCH_R1_INSTRUCTION,
    stop_strings=("</search>", "</answer>"),
    observation_prefix="\n\n<information>",
    observation_suffix="</information>\n\n",
    invalid_message=(
        "\nMy previous action is invalid. If I want to search, I should put the query between "
        "<search> and </search>. If I want to give the final answer, I should put the answer "
        "between <answer> and </answer>. Let me try again.\n"),
)

TOOL_CALL = Protocol(
    name="tool_call",
    instruction=TOOL_CALL_INSTRUCTION,
    stop_strings=("</tool_call>", "</answer>"),
    call_tag="tool_call",
    query_in_json=True,
    observation_prefix="<|im_end|>\n<|im_start|>user\n<tool_response>\n",
    observation_suffix="\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    invalid_message=(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nMy previous action is invalid. To "
        "search, I should write <tool_call>{\"name\": \"search\", \"arguments\": {\"query\": "
        "\"...\"}}</tool_call>. To give the final answer, I should put it between <answer> and "
        "</answer>. Let me try again.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
)

PROTOCOLS = {p.name: p for p in (SEARCH_R1, TOOL_CALL)}


def get_protocol(name: str) -> Protocol:
  if name not in PROTOCOLS:
    raise ValueError(f"rollout.protocol {name!r} is unknown; choose one of {sorted(PROTOCOLS)}")
  return PROTOCOLS[name]
