"""Outcome rewards and format checks for search-agent trajectories (host side, over Python strings).

  ok = check_format(text, "search_r1")   # whole trajectory: generations + observations
  answer = extract_answer(text)          # content of the last <answer>...</answer>
  r = outcome_rewards(answers, golds, metric="f1", format_ok=oks, format_penalty=-2.0)  # [B] f32

Answer matching comes in two normalizations:

  "standard"  SQuAD / Search-R1 / FlashRAG: lowercase, delete punctuation, drop the articles
              a/an/the, collapse whitespace; F1 counts token overlap with multiplicity (Counter).
  "igpo"      the IGPO reference code: lowercase, punctuation replaced by a space, articles kept,
              whitespace collapsed; F1 over word sets (duplicates ignored).

`golds` may be one string or a list of aliases; every metric takes the max over aliases.

Formats are checked by a small lexer of the protocol's tags followed by a state machine (see
`check_format`), so a malformed trajectory gets a precise reason from `format_reason`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from collections import Counter
from typing import Iterable, Sequence, Union

import numpy as np

Golds = Union[str, Sequence[str]]

_NORMALIZATIONS = ("standard", "igpo")
_METRICS = ("f1", "em")

# str.translate tables: one C-level pass per string instead of a Python loop over characters.
_DELETE_PUNCT = str.maketrans("", "", string.punctuation)
_SPACE_PUNCT = str.maketrans(string.punctuation, " " * len(string.punctuation))
_ARTICLES = re.compile(r"\b(a|an|the)\b")


# ---------------------------------------------------------------------------------------------
# Answer normalization and metrics.
# ---------------------------------------------------------------------------------------------


def normalize_answer(s: str | None, normalization: str = "standard") -> str:
  """Normalize an answer string for matching.

  Args:
    s: the answer (None counts as the empty string: a trajectory that never answered).
    normalization: "standard" (SQuAD / Search-R1 / FlashRAG) or "igpo" (see the module docstring).
  Returns:
    the normalized string, tokens separated by single spaces.
  """
  if s is None:
    return ""
  s = s.lower()
  if normalization == "standard":
    # Order as in the SQuAD script: lower, strip punctuation, drop articles, fix whitespace.
    s = _ARTICLES.sub(" ", s.translate(_DELETE_PUNCT))
  elif normalization == "igpo":
    s = s.translate(_SPACE_PUNCT)
  else:
    raise ValueError(f"unknown normalization {normalization!r}; known: {_NORMALIZATIONS}")
  return " ".join(s.split())


def _as_list(golds: Golds) -> list[str]:
  if isinstance(golds, str):
    return [golds]
  golds = list(golds)
  if not golds:
    raise ValueError("golds must hold at least one answer string")
  return golds


def _f1_tokens(pred: list[str], gold: list[str], use_sets: bool) -> float:
  """Token F1 between two already-normalized token lists (0 when either is empty)."""
  if not pred or not gold:
    # An empty prediction or gold matches nothing; SQuAD-v1 and IGPO both score this 0.
    return 0.0
  if use_sets:
    pred_c, gold_c = set(pred), set(gold)
    same = len(pred_c & gold_c)
    n_pred, n_gold = len(pred_c), len(gold_c)
  else:
    same = sum((Counter(pred) & Counter(gold)).values())
    n_pred, n_gold = len(pred), len(gold)
  if same == 0:
    return 0.0
  precision, recall = same / n_pred, same / n_gold
  return 2.0 * precision * recall / (precision + recall)


def exact_match(pred: str | None, golds: Golds, normalization: str = "standard") -> float:
  """1.0 if the normalized prediction equals any normalized gold alias, else 0.0.

  An empty (or None) prediction never matches, even an empty gold.
  """
  p = normalize_answer(pred, normalization)
  if not p:
    return 0.0
  return float(any(p == normalize_answer(g, normalization) for g in _as_list(golds)))


def f1_score(pred: str | None, golds: Golds, normalization: str = "standard") -> float:
  """Token-level F1, max over gold aliases.

  "standard": multiset overlap (Counter &), as in SQuAD. "igpo": word-set overlap. No special
  casing of yes/no answers (plain token overlap already scores "yes" vs "no" as 0).
  """
  use_sets = normalization == "igpo"
  pred_tokens = normalize_answer(pred, normalization).split()
  return max(_f1_tokens(pred_tokens, normalize_answer(g, normalization).split(), use_sets)
             for g in _as_list(golds))


def outcome_rewards(preds: Sequence[str | None], golds: Sequence[Golds], metric: str = "f1",
                    format_ok: Sequence[bool] | np.ndarray | None = None,
                    format_penalty: float = 0.0, normalization: str = "standard") -> np.ndarray:
  """Outcome reward of each trajectory.

  Args:
    preds: B extracted answers (None where the trajectory gave none).
    golds: B gold answers, each a string or a list of aliases.
    metric: "f1" or "em".
    format_ok: optional B bools; where False the reward is `format_penalty` instead of the metric
      (IGPO used -2.0).
    format_penalty: reward of a malformed trajectory.
    normalization: "standard" or "igpo".
  Returns:
    [B] float32.
  """
  if metric not in _METRICS:
    raise ValueError(f"unknown metric {metric!r}; known: {_METRICS}")
  if normalization not in _NORMALIZATIONS:
    raise ValueError(f"unknown normalization {normalization!r}; known: {_NORMALIZATIONS}")
  if len(preds) != len(golds):
    raise ValueError(f"{len(preds)} predictions but {len(golds)} golds")
  fn = f1_score if metric == "f1" else exact_match
  out = np.fromiter((fn(p, g, normalization) for p, g in zip(preds, golds)), dtype=np.float32,
                    count=len(preds))
  if format_ok is not None:
    ok = np.asarray(format_ok, dtype=bool)
    if ok.shape != out.shape:
      raise ValueError(f"format_ok has shape {ok.shape}, expected {out.shape}")
    out = np.where(ok, out, np.float32(format_penalty)).astype(np.float32)
  return out


# ---------------------------------------------------------------------------------------------
# Format checking: lexer + state machine.
# ---------------------------------------------------------------------------------------------

# Chat-template markers the tool_call protocol allows around a tool response (Qwen template:
# the assistant turn ends, the tool result arrives as a user turn, a new assistant turn opens).
USER_MARKER = "<|im_end|>\n<|im_start|>user\n"
ASSISTANT_MARKER = "<|im_end|>\n<|im_start|>assistant\n"


@dataclasses.dataclass(frozen=True)
class _Protocol:
  """A tag grammar: think first; after each closed tag, which tags may open next; answer last."""

  tags: tuple[str, ...]
  follows: dict  # closed tag (None = start) -> tags allowed to open next
  opaque: frozenset  # observation tags: their content is environment text, not parsed
  markers: dict  # closed tag -> the one chat marker allowed between it and the next tag
  final: str = "answer"


_PROTOCOLS = {
    "search_r1": _Protocol(
        tags=("think", "search", "information", "answer"),
        follows={None: ("think",), "think": ("search", "answer"), "search": ("information",),
                 "information": ("think",), "answer": ()},
        opaque=frozenset({"information"}),
        markers={}),
    "tool_call": _Protocol(
        tags=("think", "tool_call", "tool_response", "answer"),
        follows={None: ("think",), "think": ("tool_call", "answer"),
                 "tool_call": ("tool_response",), "tool_response": ("think",), "answer": ()},
        opaque=frozenset({"tool_response"}),
        markers={"tool_call": USER_MARKER, "tool_response": ASSISTANT_MARKER}),
}

_LEXERS = {
    name: re.compile("|".join([re.escape(USER_MARKER), re.escape(ASSISTANT_MARKER)]
                              + [f"</?{t}>" for t in p.tags]))
    for name, p in _PROTOCOLS.items()
}


def _lex(text: str, protocol: str) -> Iterable[tuple[str, str]]:
  """Yields (kind, value): ("text", s), ("open", tag), ("close", tag) or ("marker", s)."""
  pos = 0
  for m in _LEXERS[protocol].finditer(text):
    if m.start() > pos:
      yield "text", text[pos:m.start()]
    tok = m.group(0)
    if tok in (USER_MARKER, ASSISTANT_MARKER):
      yield "marker", tok
    elif tok.startswith("</"):
      yield "close", tok[2:-1]
    else:
      yield "open", tok[1:-1]
    pos = m.end()
  if pos < len(text):
    yield "text", text[pos:]


def _check_content(tag: str, content: str) -> str | None:
  """Reason a block's content is invalid, or None."""
  if tag == "search" and not content.strip():
    return "empty search query"
  if tag == "tool_call":
    try:
      call = json.loads(content)
    except ValueError:
      return "tool_call is not valid JSON"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
      return "tool_call JSON lacks a string 'name'"
    args = call.get("arguments")
    query = args.get("query") if isinstance(args, dict) else None
    # A query is a non-empty string, or a non-empty list of them (batched search tools).
    if isinstance(query, str):
      ok = bool(query.strip())
    elif isinstance(query, list):
      ok = bool(query) and all(isinstance(q, str) and q.strip() for q in query)
    else:
      ok = False
    if not ok:
      return "tool_call JSON lacks a non-empty 'arguments.query'"
  return None


def _snippet(s: str, n: int = 30) -> str:
  s = s.strip()
  return repr(s if len(s) <= n else s[:n] + "...")


def format_reason(text: str, protocol: str = "search_r1") -> tuple[bool, str]:
  """Check a whole trajectory's format; return (ok, reason) with reason "" when ok.

  Grammar (whitespace allowed between blocks; no other text outside blocks):

    search_r1:  think (search information think)* answer
    tool_call:  think (tool_call [USER] tool_response [ASSISTANT] think)* answer

  where each block is <tag>content</tag>. Rules: exactly one answer and it comes last (only
  whitespace after it); a search query must be non-empty; a tool_call holds JSON with a string
  "name" and "arguments.query" (a non-empty string or list of non-empty strings); think and answer
  content may be empty. Inside think/search/tool_call/answer any protocol tag is an error
  (nesting, unclosed block); observation blocks (information, tool_response) are environment text
  and are skipped up to their closing tag. [USER]/[ASSISTANT] are the exact chat-template markers
  `USER_MARKER` / `ASSISTANT_MARKER`, each optional, allowed only at those two places.

  The text must not carry a trailing end-of-turn token (decode without special tokens, or strip
  it): "<|im_end|>" after the answer counts as text outside tags.
  """
  if protocol not in _PROTOCOLS:
    raise ValueError(f"unknown protocol {protocol!r}; known: {tuple(_PROTOCOLS)}")
  spec = _PROTOCOLS[protocol]
  last_closed = None  # the block most recently closed (None before the first)
  inside = None  # the block now open
  content: list[str] = []
  marker_used = False
  for kind, val in _lex(text, protocol):
    if inside is not None:
      if kind == "close" and val == inside:
        if inside not in spec.opaque:
          reason = _check_content(inside, "".join(content))
          if reason:
            return False, reason
        last_closed, inside, content, marker_used = inside, None, [], False
      elif inside in spec.opaque:
        pass  # observation text: environment output, tags included, is not parsed
      elif kind == "text":
        content.append(val)
      elif kind == "open":
        return False, f"<{val}> nested inside <{inside}>"
      elif kind == "close":
        return False, f"</{val}> inside open <{inside}>"
      else:
        return False, f"chat marker inside <{inside}>"
      continue
    # Between blocks.
    if kind == "text":
      if val.strip():
        where = "after </answer>" if last_closed == spec.final else "outside tags"
        return False, f"text {where}: {_snippet(val)}"
    elif kind == "marker":
      if last_closed == spec.final:
        return False, "chat marker after </answer>"
      if spec.markers.get(last_closed) != val or marker_used:
        return False, f"unexpected chat marker after {_closed_name(last_closed)}"
      marker_used = True
    elif kind == "close":
      return False, f"</{val}> without an open <{val}>"
    else:  # open
      allowed = spec.follows[last_closed]
      if val not in allowed:
        if last_closed == spec.final:
          return False, f"<{val}> after </answer> (answer must be the last block)"
        want = " or ".join(f"<{t}>" for t in allowed)
        return False, f"expected {want} after {_closed_name(last_closed)}, got <{val}>"
      inside, content = val, []
  if inside is not None:
    return False, f"unclosed <{inside}>"
  if last_closed != spec.final:
    return False, "missing final <answer>"
  return True, ""


def _closed_name(tag: str | None) -> str:
  return "start" if tag is None else f"</{tag}>"


def check_format(text: str, protocol: str = "search_r1") -> bool:
  """True iff the trajectory text follows `protocol` (see `format_reason` for the grammar)."""
  return format_reason(text, protocol)[0]


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
  """Content (stripped) of the last <answer>...</answer> block, or None if there is none."""
  matches = _ANSWER.findall(text)
  return matches[-1].strip() if matches else None
