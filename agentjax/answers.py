"""Answer-string normalization, shared by outcome rewards (agentjax.rl.rewards) and judges
(agentjax.judge.oracle): one definition below both.

  "standard"  SQuAD / Search-R1 / FlashRAG: lowercase, delete punctuation, drop the articles
              a/an/the, collapse whitespace.
  "igpo"      the IGPO reference code: lowercase, punctuation replaced by a space, articles kept,
              whitespace collapsed.
"""

from __future__ import annotations

import re
import string

NORMALIZATIONS = ("standard", "igpo")

# str.translate tables: one C-level pass per string instead of a Python loop over characters.
_DELETE_PUNCT = str.maketrans("", "", string.punctuation)
_SPACE_PUNCT = str.maketrans(string.punctuation, " " * len(string.punctuation))
_ARTICLES = re.compile(r"\b(a|an|the)\b")


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
    raise ValueError(f"unknown normalization {normalization!r}; known: {NORMALIZATIONS}")
  return " ".join(s.split())
