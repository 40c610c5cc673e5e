"""SynthWorld's rubric applier: criteria written in a small predicate vocabulary, executed.

    entities = load_entities(config.coreact.entities_path)
    applied = apply_rubric(rubric, ctx, candidates, entities)   # rubric.Applied: ranks, atomic m
    s = verify_score(rubric, ctx, candidate, entities)          # in [0, 1]
    feedback = failed_items(rubric, ctx, candidate, entities)   # what a retry is told

The official code has an LLM apply a rubric to the candidate actions (Co-ReAct's
rubric_rl/rubric_judge.py `rank_actions_by_rubric`; the paper does not say who applies it); on
SynthWorld a deterministic executor does (our reading, config.coreact.applier = "executor"):
each criterion is read as one predicate over the candidate action, and a candidate's score is
the weighted sum of the predicates it meets.

Matching a criterion. The criterion text is normalized (lowercase, every non-alphanumeric
character replaced by a space, whitespace collapsed) and compared with the canonical phrases of
CRITERIA in order: the first phrase the text contains as whole words picks the predicate, so
"3. [0.3] The query repeats no earlier query (no loops)" is the "the query repeats no earlier
query" criterion. A criterion that contains no phrase is not atomic: it scores 0 for every
candidate and does not count in the atomic count m.

The vocabulary (phrase: the candidate action meets it iff ...):

  the query repeats no earlier query            it searches and its query (normalized) is not
                                                  one the trajectory already searched
  the query repeats an earlier query            it searches and its query is one already searched
                                                  (for negative weights)
  the query names the question entity           it searches and the query mentions an entity the
                                                  question mentions
  the query names an entity from the latest documents
                                                it searches and the query mentions an entity that
                                                  the most recent turn with documents retrieved
                                                  and the question does not mention (a bridge
                                                  entity just read)
  the answer names an entity from the documents it answers and the answer mentions an entity
                                                  that some retrieved document mentions
  the action answers after a search             it answers and some earlier search retrieved
                                                  documents
  the action searches                           it is a search
  the action answers                            it is an answer
  the action is well formed                     it is not invalid (the agent protocol's parse)

Entities are SynthWorld's entity names (entities.jsonl "name", load_entities), normalized like
answers (agentjax.answers.normalize_answer "standard" after protocol.clean_text: lowercase,
punctuation deleted, articles dropped). A text mentions an entity when the normalized name occurs
in the normalized text as whole words; documents are read whole (title and body). Queries are
compared normalized the same way. Nothing here reads the question's gold chain: a rubric and its
applier see only what the agent sees.

CRITERION_PHRASES is the vocabulary in its fixed order; a demo criterion is a phrase with its
first letter capitalized ("The query repeats no earlier query").
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Iterable, Sequence

import jax
import numpy as np

from agentjax.agent.protocol import ANSWER, INVALID, SEARCH, Action, normalize_text
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import Applied, Rubric, RubricItem
from agentjax.jsonl import iter_json_objects
from agentjax.rl import ranking

# ---------------------------------------------------------------------------------------------
# Entities and normalization.
# ---------------------------------------------------------------------------------------------


def load_entities(path: str) -> frozenset[str]:
  """The normalized entity names of an entities.jsonl file (one {"name": ...} object a line).

  Names that normalize to "" (e.g. only an article) are left out: they cannot be mentioned.
  Raises ValueError naming the file and line for a missing or non-string "name".
  """
  names = set()
  for lineno, row in iter_json_objects(path, ValueError, required=("name",),
                                       what="entities file"):
    if not isinstance(row["name"], str):
      raise ValueError(f"{path}:{lineno}: 'name' must be a string, got {row['name']!r}")
    name = normalize_text(row["name"])
    if name:
      names.add(name)
  return frozenset(names)


@functools.lru_cache(maxsize=16)
def _max_words(entities: frozenset[str]) -> int:
  return max((len(name.split()) for name in entities), default=0)


def entities_in(text: str, entities: frozenset[str]) -> frozenset[str]:
  """The entities (normalized names) that `text` mentions as whole words."""
  words = normalize_text(text).split()
  found = set()
  for n in range(1, min(_max_words(entities), len(words)) + 1):
    for i in range(len(words) - n + 1):
      gram = " ".join(words[i:i + n])
      if gram in entities:
        found.add(gram)
  return frozenset(found)


# ---------------------------------------------------------------------------------------------
# What the predicates read of a branch point (computed once per context).
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Facts:
  """A branch point as the predicates read it."""
  entities: frozenset[str]
  earlier_queries: frozenset[str]       # normalized queries of the trajectory's searches
  question_entities: frozenset[str]
  latest_doc_entities: frozenset[str]  # of the latest turn with documents, minus the question's
  doc_entities: frozenset[str]         # of every retrieved document
  found_documents: bool                # some search retrieved documents


def _compute_facts(ctx: BranchContext, entities: frozenset[str]) -> Facts:
  question = entities_in(str(ctx.question.get("question", "")), entities)
  queries = frozenset(normalize_text(t.action.content) for t in ctx.turns if t.action.kind == SEARCH)
  with_docs = [t for t in ctx.turns if t.documents]
  latest = frozenset()
  if with_docs:
    latest = frozenset().union(*(entities_in(d.contents, entities)
                                 for d in with_docs[-1].documents)) - question
  every = frozenset().union(*(entities_in(d.contents, entities)
                              for t in with_docs for d in t.documents))
  return Facts(entities, queries, question, latest, every, bool(with_docs))


# One entry: the predicates of one branch point are evaluated over its K candidates in a row.
# The entry holds ctx and entities themselves, so an `is` hit can never be a recycled id.
_last_facts: tuple = (None, None, None)


def facts_of(ctx: BranchContext, entities: frozenset[str]) -> Facts:
  global _last_facts
  cached_ctx, cached_entities, facts = _last_facts
  if cached_ctx is ctx and cached_entities is entities:
    return facts
  facts = _compute_facts(ctx, entities)
  _last_facts = (ctx, entities, facts)
  return facts


# ---------------------------------------------------------------------------------------------
# The vocabulary.
# ---------------------------------------------------------------------------------------------

Predicate = Callable[[BranchContext, Action, frozenset], bool]


def _query_is_new(ctx, action, entities):
  return (action.kind == SEARCH and
          normalize_text(action.content) not in facts_of(ctx, entities).earlier_queries)


def _query_repeats(ctx, action, entities):
  return (action.kind == SEARCH and
          normalize_text(action.content) in facts_of(ctx, entities).earlier_queries)


def _query_names_question_entity(ctx, action, entities):
  return (action.kind == SEARCH and
          bool(entities_in(action.content, entities) & facts_of(ctx, entities).question_entities))


def _query_names_latest_doc_entity(ctx, action, entities):
  return (action.kind == SEARCH and
          bool(entities_in(action.content, entities) &
               facts_of(ctx, entities).latest_doc_entities))


def _answer_names_doc_entity(ctx, action, entities):
  return (action.kind == ANSWER and
          bool(entities_in(action.content, entities) & facts_of(ctx, entities).doc_entities))


def _answers_after_search(ctx, action, entities):
  return action.kind == ANSWER and facts_of(ctx, entities).found_documents


def _searches(ctx, action, entities):
  del ctx, entities
  return action.kind == SEARCH


def _answers(ctx, action, entities):
  del ctx, entities
  return action.kind == ANSWER


def _well_formed(ctx, action, entities):
  del ctx, entities
  return action.kind != INVALID


# Order matters: the first phrase a criterion contains wins, so a phrase that contains another
# ("the action answers after a search" contains "the action answers") comes before it.
CRITERIA: dict[str, Predicate] = {
    "the query repeats no earlier query": _query_is_new,
    "the query repeats an earlier query": _query_repeats,
    "the query names the question entity": _query_names_question_entity,
    "the query names an entity from the latest documents": _query_names_latest_doc_entity,
    "the answer names an entity from the documents": _answer_names_doc_entity,
    "the action answers after a search": _answers_after_search,
    "the action searches": _searches,
    "the action answers": _answers,
    "the action is well formed": _well_formed,
}
CRITERION_PHRASES: tuple[str, ...] = tuple(CRITERIA)

_NON_ALNUM = re.compile(r"[\W_]+")


def normalize_criterion(text: str) -> str:
  """Lowercase, every run of non-alphanumeric characters a single space, stripped."""
  return _NON_ALNUM.sub(" ", text.lower()).strip()


def criterion_phrase(text: str) -> str | None:
  """The vocabulary phrase a criterion text names (the first in CRITERIA order), or None."""
  padded = f" {normalize_criterion(text)} "
  return next((phrase for phrase in CRITERIA if f" {phrase} " in padded), None)


def criterion_predicates(rubric: Rubric) -> list[Predicate | None]:
  """Each item's predicate, None for a criterion outside the vocabulary (not atomic)."""
  out = []
  for item in rubric.items:
    phrase = criterion_phrase(item.text)
    out.append(None if phrase is None else CRITERIA[phrase])
  return out


# ---------------------------------------------------------------------------------------------
# Applying a rubric.
# ---------------------------------------------------------------------------------------------

_average_ranks_desc = jax.jit(functools.partial(ranking.average_ranks, descending=True))


def _as_entities(entities: Iterable[str]) -> frozenset[str]:
  return entities if isinstance(entities, frozenset) else frozenset(entities)


def _met(rubric: Rubric, ctx: BranchContext, action: Action, entities: frozenset[str]
         ) -> list[bool | None]:
  """Per item: whether the action meets it, None when the item is not atomic."""
  return [None if pred is None else bool(pred(ctx, action, entities))
          for pred in criterion_predicates(rubric)]


def _weighted(rubric: Rubric, met: Sequence[bool | None]) -> float:
  return float(sum(item.weight for item, m in zip(rubric.items, met) if m))


def apply_rubric(rubric: Rubric, ctx: BranchContext, candidates: Sequence[str],
                 entities: Iterable[str]) -> Applied:
  """Ranks K candidate action texts by the rubric.

  score_k = sum_i w_i * pred_i(candidate k) over the atomic criteria (each candidate parsed with
  ctx.parse); the ranking is the average ranks of the scores, descending (rank 1 = highest
  score, ties averaged). Scores are rounded to 9 decimals first, so that two sets of met criteria
  with equal weight sums tie whatever the float summation order.

  Returns:
    Applied(ranking, atomic_count = the number of criteria in the vocabulary, scores).
  """
  entities = _as_entities(entities)
  atomic = sum(p is not None for p in criterion_predicates(rubric))
  scores = [round(_weighted(rubric, _met(rubric, ctx, ctx.parse(c), entities)), 9)
            for c in candidates]
  if not scores:
    return Applied((), atomic, ())
  ranks = np.asarray(_average_ranks_desc(np.asarray(scores, np.float32)))
  return Applied(tuple(float(r) for r in ranks), atomic, tuple(scores))


def verify_score(rubric: Rubric, ctx: BranchContext, candidate: str,
                 entities: Iterable[str]) -> float:
  """The weighted score of one action: sum_i w_i pred_i / sum of the positive weights (all
  items, atomic or not: an unverifiable criterion counts as unmet), clipped to [0, 1]; 0 when the
  rubric has no positive weight."""
  positive = rubric.positive_sum
  if positive <= 0:
    return 0.0
  met = _met(rubric, ctx, ctx.parse(candidate), _as_entities(entities))
  return float(np.clip(_weighted(rubric, met) / positive, 0.0, 1.0))


def failed_items(rubric: Rubric, ctx: BranchContext, candidate: str,
                 entities: Iterable[str]) -> list[RubricItem]:
  """The retry feedback: the atomic positive-weight items the action does not meet and the
  negative-weight items it meets, in rubric order (items outside the vocabulary are left out:
  the executor cannot say the action failed them)."""
  met = _met(rubric, ctx, ctx.parse(candidate), _as_entities(entities))
  return [item for item, m in zip(rubric.items, met)
          if m is not None and ((item.weight > 0 and not m) or (item.weight < 0 and m))]
