"""Whether retrieved evidence holds a gold answer (host side, over strings and documents): the
label S that DAC's rewards use and that every RL run logs as `sufficiency_rate` (the share of
trajectories whose retrieved documents contain a gold answer).

  sufficient(docs, golds, match)   S: some document contains a gold answer after normalization
  evidence_set(documents_per_turn) a trajectory's documents, deduplicated, in retrieval order
"""

from __future__ import annotations

import re
from typing import Sequence

from agentjax.answers import normalize_answer
from agentjax.retrieval import Document

SUFFICIENCY_MATCHES = ("word", "substring")


def _golds(golds: str | Sequence[str]) -> list[str]:
  golds = [golds] if isinstance(golds, str) else list(golds)
  return [g for g in (normalize_answer(x) for x in golds) if g]


def contains_answer(text: str, golds: str | Sequence[str], match: str = "word") -> bool:
  """Whether `text` contains a gold answer after normalization (the standard one: lowercase,
  punctuation and articles removed, whitespace collapsed). "word": as whole words (the gold's
  tokens appear consecutively); "substring": anywhere, inside words too. An empty gold matches
  nothing."""
  if match not in SUFFICIENCY_MATCHES:
    raise ValueError(f"dac.sufficiency_match={match!r}: must be one of {SUFFICIENCY_MATCHES}")
  body = normalize_answer(text)
  for gold in _golds(golds):
    if match == "substring":
      if gold in body:
        return True
    elif re.search(rf"(?:^| ){re.escape(gold)}(?: |$)", body):
      return True
  return False


def sufficient(docs: Sequence[Document], golds: str | Sequence[str], match: str = "word") -> bool:
  """S: some document (title and text) contains a gold answer."""
  return any(contains_answer(d.contents, golds, match) for d in docs)


def evidence_set(documents_per_turn: Sequence[Sequence[Document]]) -> tuple[Document, ...]:
  """The documents of a searcher trajectory, deduplicated by id, in retrieval order."""
  seen, out = set(), []
  for docs in documents_per_turn:
    for d in docs:
      if d.id not in seen:
        seen.add(d.id)
        out.append(d)
  return tuple(out)


__all__ = ["SUFFICIENCY_MATCHES", "contains_answer", "evidence_set", "sufficient"]
