"""What an LLM judge reads and what it must answer: the trace rendering and the verdict parser.

Shared by the judge backends that prompt a language model ("openai", "local"):

  render_trace(request, k)      # "Question: ..." then Agent: / Information: blocks, rounds 0..k
  build_messages(template, request, k)   # the chat messages of round k's judge call
  parse_verdict(reply)          # the judge's reply -> Verdict (a failed Verdict, never an error)

The prompt template (agentjax/judge/prompts/cw_grpo.md, or judge.prompt_path) holds the marker
{{TRACE}} where the rendered trace goes. It is filled by plain string replacement, not
str.format, so the literal braces of a JSON example in the prompt need no escaping.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentjax.agent.protocol import format_documents
from agentjax.agent.trajectories import TurnRecord
from agentjax.judge.base import JudgeRequest, Verdict

TRACE_MARKER = "{{TRACE}}"
# Optional, on a line of its own: what comes before it is the system message, what follows it
# the user message (the official code sends its judge prompt as the system message and
# "Here is the trace:" + the trace as the user message). Without it: one user message.
USER_MARKER = "{{USER}}"

# Chat-template markers the tool_call protocol feeds around its observations
# ("<|im_end|>\n<|im_start|>user\n<tool_response>..."), and the protocols' observation wrappers.
# The judge reads the observation's content, as the official code renders a tool message's content.
_CHAT_MARKERS = re.compile(r"<\|im_start\|>[a-z]*\n?|<\|im_end\|>\n?|<\|endoftext\|>")
_WRAPPERS = re.compile(r"</?(information|tool_response)>")

# The JSON object of a reply: the last ```json fence (the reply's final word, after any example
# or draft), else the reply itself.
_FENCE = re.compile(r"```[ \t]*json[ \t]*\n?(.*?)```", re.S | re.I)
# Replies are bounded by the judge's max_tokens; a longer one is not a judge reply we can trust,
# and the object search below is quadratic in the worst case.
MAX_REPLY_CHARS = 200_000
_MAX_OBJECT_TRIES = 1000   # '{' positions tried when the object is embedded in prose
REWARD_KEYS = ("retrieval_reward", "thinking_reward")


def check_template(template: str, where: str = "judge prompt") -> None:
  """Raises ValueError unless the template has the {{TRACE}} marker."""
  if TRACE_MARKER not in template:
    raise ValueError(f"{where}: the template has no {TRACE_MARKER} marker (where the rendered "
                     "trace goes)")


def _clean(text: str) -> str:
  return _WRAPPERS.sub("", _CHAT_MARKERS.sub("", text)).strip()


def _information(turn: TurnRecord) -> str:
  """What came back after the turn: the observation as fed (the agent saw exactly this, cut by the
  budget if it was), else the documents, else the search error; "" for none (an answer)."""
  if turn.observation.strip():
    return _clean(turn.observation)
  if turn.documents:
    return format_documents(turn.documents).strip()
  if turn.search_error:
    return f"Search failed: {turn.search_error}"
  return ""


def render_trace(request: JudgeRequest, upto: int) -> str:
  """The trace the judge scores round `upto` on: the question, then rounds 0..upto.

  Each round is an "Agent:" block (the text the policy generated: its <think> and its action,
  a tool call inline as generated) followed by an "Information:" block when something came back
  (answer rounds have none). Text injected by a `before_turn` hook is not the agent's and is left
  out.

  Raises:
    ValueError: upto is not a round of the request.
  """
  if not 0 <= upto < len(request.turns):
    raise ValueError(f"render_trace: round {upto} out of range for a trajectory of "
                     f"{len(request.turns)} rounds")
  question = request.question.get("question", "")
  parts = [f"Question: {str(question).strip()}"]
  for turn in request.turns[:upto + 1]:
    parts.append(f"Agent:\n{_clean(turn.text) or '(no output)'}")
    info = _information(turn)
    if info:
      parts.append(f"Information:\n{info}")
  return "\n\n".join(parts)


def build_messages(template: str, request: JudgeRequest, upto: int) -> list[dict[str, str]]:
  """The chat messages of the judge call for round `upto`: the template with the trace in place
  of {{TRACE}}; split at a {{USER}} line into a system and a user message (the official code's
  layout), else one user message."""
  check_template(template)
  trace = render_trace(request, upto)
  if USER_MARKER not in template:  # split before filling: the trace may hold either marker
    return [{"role": "user", "content": template.replace(TRACE_MARKER, trace)}]
  system, user = template.split(USER_MARKER, 1)
  return [{"role": "system", "content": system.strip().replace(TRACE_MARKER, trace) + "\n"},
          {"role": "user", "content": user.strip().replace(TRACE_MARKER, trace) + "\n"}]


def _object_in(text: str) -> tuple[dict[str, Any] | None, str | None]:
  """(the JSON object of text, None) or (None, why there is none).

  Text that is JSON as a whole must be an object. Otherwise the first '{...}' that parses as JSON
  is taken (a reply that wraps the object in prose)."""
  try:
    whole = json.loads(text)
  except (ValueError, RecursionError):
    pass
  else:
    if isinstance(whole, dict):
      return whole, None
    return None, f"the JSON is a {type(whole).__name__}, not an object"
  decoder = json.JSONDecoder()
  start = text.find("{")
  for _ in range(_MAX_OBJECT_TRIES):
    if start < 0:
      break
    try:
      obj, _end = decoder.raw_decode(text, start)
    except (ValueError, RecursionError):
      start = text.find("{", start + 1)
      continue
    return obj, None  # starts at '{': always a dict
  return None, "no JSON object"


def reply_object(reply: Any) -> tuple[dict[str, Any] | None, str | None, str]:
  """(the JSON object of an LLM's reply, None, where it was) or (None, why there is none, where).

  The object is taken from the last ```json fence, or from the bare reply when it has none (see
  _object_in). Never raises. Every JSON-replying caller (judges, Co-ReAct's appliers and
  rankers) reads replies through this."""
  if not isinstance(reply, str):
    return None, f"reply is {type(reply).__name__}, not text", "the reply"
  if len(reply) > MAX_REPLY_CHARS:
    return None, f"reply longer than {MAX_REPLY_CHARS} characters ({len(reply)})", "the reply"
  fences = _FENCE.findall(reply)
  where = "the last ```json fence" if fences else "the reply"
  text = fences[-1].strip() if fences else reply.strip()
  obj, why = _object_in(text)
  if obj is None:
    return None, f"{why} in {where}: {text[:120]!r}", where
  return obj, None, where


def parse_verdict(reply: Any) -> Verdict:
  """The Verdict of a judge's reply. Never raises: anything unusable is Verdict.failed(reason).

  The object is taken from the last ```json fence, or from the bare reply when it has none. It
  must hold "analysis" (a string) and "retrieval_reward", "thinking_reward", each the integer 0
  or 1 (JSON true/false are read as 1/0). Other values (2, 0.5, "1", null) fail: a judge that
  answers off-schema is counted, not guessed at. Extra keys are ignored.
  """
  obj, why, where = reply_object(reply)
  if obj is None:
    return Verdict.failed(why)
  for key in ("analysis", *REWARD_KEYS):
    if key not in obj:
      return Verdict.failed(f"missing key {key!r} in {where} (keys: {sorted(obj)[:8]})")
  rewards = {}
  for key in REWARD_KEYS:
    value = obj[key]
    # bool is a subclass of int; 1.0 and "1" are not accepted.
    if not (isinstance(value, bool) or (type(value) is int and value in (0, 1))):
      return Verdict.failed(f"{key} must be 0 or 1, got {value!r:.40}")
    rewards[key] = int(value)
  if not isinstance(obj["analysis"], str):
    return Verdict.failed(f"analysis must be a string, got {type(obj['analysis']).__name__}")
  return Verdict(retrieval=rewards["retrieval_reward"], thinking=rewards["thinking_reward"],
                 analysis=obj["analysis"])
