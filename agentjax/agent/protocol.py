"""Rollout protocols: how an agent asks for a search, how results come back, how it answers.

Two are built in, chosen by name in config:

  search_r1  (default)  <search> query </search>  ->  <information>Doc 1(Title: ...) ...</information>
  tool_call             <tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>
                        -> a user turn holding <tool_response>...</tool_response> (Qwen / DeepResearcher)

Both answer with <answer> ... </answer>. A protocol parses one turn's generated text into an
Action and renders observations as text; it never raises on model output: anything malformed is
an Action of kind "invalid" with the reason, and the agent gets the standard invalid-action
observation. Model text is only parsed, never executed.

This module is agentjax's ONE definition of a well-formed trajectory (`trajectory_error`,
`Protocol.format_error`): the rollout's `format_valid` (hence the format penalty and eval) and
the SFT demonstration checks all use it. The rule, per turn (`Protocol.parse`):

  * a turn is well-formed iff it holds a complete action: a <search>/<tool_call> or an <answer>,
    whichever closes first. The turn ends there (the rollout stops generating at that closing
    tag; what the token that completed it carried past it is ignored).
  * <think> is not required, and free text around the action is allowed (as in Search-R1's own
    action parser): the rule is about what the environment must act on, not about style.
  * a query is cleaned before anything else looks at it (`clean_text`: control characters and
    bidi formatting characters removed, surrounding whitespace stripped) and must then be
    non-empty, at most `max_query_chars` long, valid UTF-8 and free of protocol tags.
  * a tool call is JSON {"name": "search", "arguments": {"query": "<string>"}} ("arguments" may
    itself be a JSON string); any other tool name, or a non-string query (a list included), is
    invalid.
  * an answer is the cleaned content of the first <answer>...</answer>, which must be non-empty
    (whitespace around it is fine) and hold no protocol tags. `<answer></answer>` is an invalid
    action like any other: the trajectory gets the invalid-action message and goes on (it does
    not end with an empty answer scored 0), and counts as a format error.

and per trajectory: every turn is well-formed, and the last turn, only the last, is an answer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from agentjax.answers import normalize_answer
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

# Bidi formatting characters: embeddings and overrides (U+202A-U+202E), isolates (U+2066-U+2069)
# and the marks (U+200E, U+200F, U+061C). They make a logged query read differently from what was
# sent, and mean nothing to a retriever.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
                          "\u200e\u200f\u061c")
# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F. Whitespace controls (tab,
# newline, CR, ...) become a space so the words they separated stay apart; the others are dropped.
_CC = [chr(c) for c in (*range(0x20), *range(0x7f, 0xa0))]
_CLEAN = str.maketrans({**{c: (" " if c.isspace() else None) for c in _CC},
                        **{c: None for c in BIDI_CONTROLS}})


def clean_text(text: str) -> str:
  """Model text as it may reach the retriever (or count as an answer): control characters
  (category Cc) and bidi formatting characters removed, whitespace controls replaced by a space,
  leading and trailing whitespace stripped. Empty when nothing else was there."""
  return text.translate(_CLEAN).strip()


def normalize_text(text: str) -> str:
  """A query, name or answer as they are compared (repeated queries, entity mentions): cleaned
  (clean_text), then normalized as answers are (agentjax.answers.normalize_answer "standard":
  lowercase, punctuation deleted, articles dropped, whitespace collapsed)."""
  return normalize_answer(clean_text(text), "standard")


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
  """Why a (cleaned) query cannot be sent, or None."""
  if not query:
    return "empty query (after removing control and bidi characters)"
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
  can_search: bool = True        # False: a role that only answers (a search action is invalid)

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
    query = clean_text(query)
    why = why or _check_query(query, self.max_query_chars)
    if not why and not self.can_search:
      why = f"the {self.name} protocol cannot search: answer inside <answer> and </answer>"
    return Action(INVALID, why) if why else Action(SEARCH, query)

  def _answer_or_none(self, text: str) -> Action | None:
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    if m is None:
      return None
    before = text[:m.start()]
    if re.search(r"</?(answer|search|tool_call)>", m.group(1)) or \
        before.count(f"<{self.call_tag}>") > before.count(f"</{self.call_tag}>"):
      return Action(INVALID, "nested tags in answer")
    answer = clean_text(m.group(1))
    return Action(ANSWER, answer) if answer else Action(INVALID, "empty answer")

  def _first_close(self, text: str, tags: Sequence[str]) -> str | None:
    """Which of the closing tags comes first in the text."""
    found = [(text.find(f"</{t}>"), t) for t in tags if f"</{t}>" in text]
    return min(found)[1] if found else None

  def format_error(self, turns: Sequence[str]) -> str | None:
    """Why the trajectory whose turns generated these texts is malformed, or None.

    Args:
      turns: each turn's generated text, in order (the model's text only: observations are the
        environment's and are not part of the format).
    Returns:
      None when well-formed, else "turn <n>: <reason>" (n counts from 1) or "no turns".
    """
    found = trajectory_error([self.parse(t) for t in turns])
    if found is None:
      return None
    turn, why = found
    return why if turn < 0 else f"turn {turn + 1}: {why}"

  def observation(self, docs: Sequence[Document]) -> tuple[str, str, str]:
    """(prefix, body, suffix) of a search result; the body is what truncation may cut."""
    return self.observation_prefix, format_documents(docs), self.observation_suffix

  def error_observation(self, reason: str) -> tuple[str, str, str]:
    return self.observation_prefix, f"Search failed: {reason}\n", self.observation_suffix

  def invalid_observation(self) -> str:
    return self.invalid_message


def parse_action(protocol: Protocol, text: str) -> Action:
  """protocol.parse with a last line of defence: model text never raises (any parser failure is
  the model's malformed output, an invalid action)."""
  try:
    return protocol.parse(text)
  except Exception as e:  # noqa: BLE001
    return Action(INVALID, f"unparsable action ({type(e).__name__})")


def trajectory_error(actions: Sequence[Action]) -> tuple[int, str] | None:
  """The well-formedness rule of a whole trajectory, over its turns' parsed actions.

  Well-formed iff there is at least one turn, no turn's action is invalid, and the last turn,
  only the last, is an answer (a trajectory cut off by the token budget or by max_turns never
  answered, so it is malformed).

  Returns:
    None when well-formed, else (index of the first offending turn, or -1 for "no turns", and the
    reason).
  """
  if not actions:
    return -1, "no turns"
  for t, action in enumerate(actions):
    if action.kind == INVALID:
      return t, action.content or "invalid action"
    if action.kind == ANSWER and t < len(actions) - 1:
      return t, "answer before the last turn"
  if actions[-1].kind != ANSWER:
    return len(actions) - 1, "the last turn is not an <answer>"
  return None


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

# One answer from a prompt built elsewhere (the "question" is the whole instruction, e.g. DAC's
# generator prompt: agentjax/dac/roles.py): no search, one turn, stops at </answer>.
ANSWER_ONLY = Protocol(
    name="answer_only",
    instruction="{question}",
    stop_strings=("</answer>",),
    can_search=False,
    observation_prefix="\n\n<information>",
    observation_suffix="</information>\n\n",
    invalid_message=("\nMy previous action is invalid. I should put the final answer between "
                     "<answer> and </answer>.\n"),
)



@dataclasses.dataclass(frozen=True)
class FreeTextProtocol(Protocol):
  """One turn whose whole generated text is the output (Co-ReAct's rubric generator writes
  `N. [w] criterion` lines, not tagged actions): the turn ends at EOS (or max_new_tokens), and
  any non-empty text is an "answer" Action holding the text, whitespace-stripped (the reward
  parses it: agentjax/coreact/rubric.py; a malformed rubric scores 0 there, it is not a format
  error here)."""

  def parse(self, text: str) -> Action:
    text = text.strip()
    return Action(ANSWER, text) if text else Action(INVALID, "empty output")


# Co-ReAct's rubric generator: the "question" is its whole prompt (agentjax/coreact/rubric.py).
RUBRIC = FreeTextProtocol(
    name="rubric",
    instruction="{question}",
    stop_strings=(),
    can_search=False,
    observation_prefix="",
    observation_suffix="",
    invalid_message="",
)

PROTOCOLS = {p.name: p for p in (SEARCH_R1, TOOL_CALL, ANSWER_ONLY, RUBRIC)}


def get_protocol(name: str) -> Protocol:
  if name not in PROTOCOLS:
    raise ValueError(f"rollout.protocol {name!r} is unknown; choose one of {sorted(PROTOCOLS)}")
  return PROTOCOLS[name]
