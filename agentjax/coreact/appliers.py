"""Rubric appliers: a rubric ranks K candidate actions (training reward) or scores one (verify).

    applier = build_applier(config, mesh=mesh)                 # config.coreact.applier
    applied = applier.rank(rubrics, contexts, candidates)     # [Applied | None] per rubric
    scores = applier.score(rubrics, contexts, actions)         # [float in [0, 1] | None]

Backends (registry APPLIERS, config.coreact.applier):

  executor  SynthWorld's deterministic predicate vocabulary (agentjax/coreact/executor.py) over
            the entity names of config.coreact.entities_path. Never fails.
  openai    an LLM applying the rubric, as the official code's judge does: config.judge's
            endpoint and model, with its retries (agentjax/judge/chat.py OpenAIChat).
  local     the same prompts to a local model (config.judge.hf_path; chat.LocalChat).

The LLM appliers' prompts (English, ours; the official prompt is not reproduced): the rubric's
criteria, the question, the trajectory so far (rubric.render_trajectory: `<think>` stripped,
documents cut), and the candidates lettered A, B, C, ... each cut to its first action with
`<think>` stripped, an answer's content replaced by the placeholder "[final answer]" (the
applier judges the action against the rubric, not whether the answer is right). Replies are JSON
(the last ```json fence or the bare reply, agentjax.judge.render.reply_object):

  rank   {"ranking": [rank of A, rank of B, ...], "atomic_count": m}: K numbers in [1, K],
         1 = best, ties allowed (re-ranked with average ranks, so [1, 1, 2, 3] reads as
         [1.5, 1.5, 3, 4]); m an integer >= 0 (the reward clamps it to N).
  score  {"score": x} with x a number in [0, 1].

A reply that does not hold these (or no reply: the server down, a prompt too long) is None for
that rubric: rank() and score() never raise on a fault of the model or its server.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import string
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from agentjax.agent.protocol import ANSWER, get_protocol
from agentjax.coreact import build_named
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import (Applied, Rubric, format_items, render_trajectory,
                                     strip_think)
from agentjax.judge.base import prompt_sha256
from agentjax.judge.render import reply_object
from agentjax.rl import ranking

log = logging.getLogger(__name__)

ANSWER_PLACEHOLDER = "[final answer]"
# Characters of one candidate shown to an LLM (after cutting it to its first action).
CANDIDATE_CHARS = 600


@runtime_checkable
class RubricApplier(Protocol):
  """rank(): one Applied per rubric over its candidates; score(): one weighted score in [0, 1]
  per (rubric, action). Batched (every call of a batch in flight together); None = that call
  failed. Never raises on a fault of a model or server."""

  def rank(self, rubrics: Sequence[Rubric], contexts: Sequence[BranchContext],
           candidates: Sequence[Sequence[str]]) -> list[Applied | None]: ...

  def score(self, rubrics: Sequence[Rubric], contexts: Sequence[BranchContext],
            actions: Sequence[str]) -> list[float | None]: ...

  def identity(self) -> dict[str, str]: ...


def _check_lengths(**named: Sequence[Any]) -> None:
  sizes = {k: len(v) for k, v in named.items()}
  if len(set(sizes.values())) > 1:
    raise ValueError(f"applier: batch lengths differ: {sizes}")


# ---------------------------------------------------------------------------------------------
# executor
# ---------------------------------------------------------------------------------------------


class ExecutorApplier:
  """SynthWorld's predicate-vocabulary executor (agentjax/coreact/executor.py)."""

  def __init__(self, entities: frozenset[str], source: str = ""):
    self.entities, self.source = frozenset(entities), source

  @classmethod
  def from_path(cls, path: str) -> "ExecutorApplier":
    import os

    from agentjax.coreact.executor import load_entities
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
      raise ValueError(f"config.coreact.entities_path={path!r}: no such file (SynthWorld writes "
                       f"entities.jsonl beside its corpus)")
    return cls(load_entities(path), source=path)

  def identity(self) -> dict[str, str]:
    from agentjax.coreact import executor
    return {"backend": "executor", "model": "synthworld-predicates",
            "prompt_sha256": prompt_sha256("\n".join(executor.CRITERION_PHRASES))}

  def rank(self, rubrics, contexts, candidates):
    from agentjax.coreact.executor import apply_rubric
    _check_lengths(rubrics=rubrics, contexts=contexts, candidates=candidates)
    return [apply_rubric(r, c, list(k), self.entities)
            for r, c, k in zip(rubrics, contexts, candidates)]

  def score(self, rubrics, contexts, actions):
    from agentjax.coreact.executor import verify_score
    _check_lengths(rubrics=rubrics, contexts=contexts, actions=actions)
    return [verify_score(r, c, a, self.entities) for r, c, a in zip(rubrics, contexts, actions)]


# ---------------------------------------------------------------------------------------------
# LLM prompts (shared with the LLM rankers, agentjax/coreact/rankers.py)
# ---------------------------------------------------------------------------------------------


def letters(k: int) -> list[str]:
  """Candidate labels A, B, C, ... (K <= 26)."""
  if not 0 <= k <= 26:
    raise ValueError(f"at most 26 candidates can be lettered, got {k}")
  return list(string.ascii_uppercase[:k])


def first_action(ctx: BranchContext, text: str, hide_answer: bool = False) -> str:
  """A candidate as an LLM is shown it: `<think>` stripped, cut after its first action (the
  earliest of the protocol's stop strings: what the rollout would have stopped at), an
  answer's content replaced by ANSWER_PLACEHOLDER when hide_answer, whitespace collapsed, at most
  CANDIDATE_CHARS characters."""
  text = strip_think(text)
  ends = [i + len(s) for s in get_protocol(ctx.protocol).stop_strings
          for i in [text.find(s)] if i >= 0]
  if ends:
    text = text[:min(ends)]
  if hide_answer and ctx.parse(text).kind == ANSWER:
    start, end = text.find("<answer>"), text.find("</answer>")
    if 0 <= start < end:
      text = text[:start + len("<answer>")] + ANSWER_PLACEHOLDER + text[end:]
  text = " ".join(text.split())
  if len(text) > CANDIDATE_CHARS:
    text = text[:CANDIDATE_CHARS - 3] + "..."
  return text or "(empty)"


def candidates_block(ctx: BranchContext, candidates: Sequence[str],
                     hide_answer: bool = False) -> str:
  return "\n".join(f"{letter}. {first_action(ctx, c, hide_answer)}"
                   for letter, c in zip(letters(len(candidates)), candidates))


def context_block(ctx: BranchContext) -> str:
  """The question and the trajectory so far."""
  trajectory = render_trajectory(ctx) or "(no steps yet)"
  return (f"Question: {ctx.question.get('question', '')}\n"
          f"Trajectory so far:\n{trajectory}")


def _rubric_lines(rubric: Rubric) -> str:
  return format_items(rubric).rstrip("\n")


RANK_INSTRUCTION = (
    "You apply a rubric to candidate next actions of a search agent. Each rubric criterion has a "
    "weight; a positive weight rewards an action that meets the criterion, a negative weight "
    "penalizes it. Score each candidate by the weighted criteria it meets and rank the "
    "candidates: 1 = best, equal candidates may share a rank. Also count the atomic criteria: "
    "those that can be checked from the action alone. Final answers are hidden as "
    f"\"{ANSWER_PLACEHOLDER}\": judge the decision to answer, not its content.")
SCORE_INSTRUCTION = (
    "You apply a rubric to the next action of a search agent. Each rubric criterion has a weight; "
    "a positive weight rewards an action that meets the criterion, a negative weight penalizes "
    "it. Give the action a score between 0 and 1: the weights of the criteria it meets, summed, "
    "divided by the sum of the positive weights. Final answers are hidden as "
    f"\"{ANSWER_PLACEHOLDER}\": judge the decision to answer, not its content.")


def rank_messages(rubric: Rubric, ctx: BranchContext,
                  candidates: Sequence[str]) -> list[dict[str, str]]:
  labels = letters(len(candidates))
  example = ", ".join(f"<rank of {x}>" for x in labels)
  text = (f"{RANK_INSTRUCTION}\n\nRubric:\n{_rubric_lines(rubric)}\n\n{context_block(ctx)}\n\n"
          f"Candidate next actions:\n{candidates_block(ctx, candidates, hide_answer=True)}\n\n"
          f"Reply with JSON only: {{\"ranking\": [{example}], \"atomic_count\": <number of atomic "
          f"criteria>}}")
  return [{"role": "user", "content": text}]


def score_messages(rubric: Rubric, ctx: BranchContext, action: str) -> list[dict[str, str]]:
  text = (f"{SCORE_INSTRUCTION}\n\nRubric:\n{_rubric_lines(rubric)}\n\n{context_block(ctx)}\n\n"
          f"Next action:\n{first_action(ctx, action, hide_answer=True)}\n\n"
          f"Reply with JSON only: {{\"score\": <a number between 0 and 1>}}")
  return [{"role": "user", "content": text}]


def _number(value: Any) -> float | None:
  """A finite JSON number (bool and strings refused), else None."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def parse_ranking(obj: Mapping[str, Any], k: int) -> tuple[tuple[float, ...] | None, str | None]:
  """(K average ranks, None) from obj["ranking"], or (None, why it is unusable)."""
  raw = obj.get("ranking")
  if not isinstance(raw, list) or len(raw) != k:
    return None, f"'ranking' must be a list of {k} ranks, got {str(raw)[:80]}"
  values = [_number(v) for v in raw]
  if any(v is None or not 1 <= v <= k for v in values):
    return None, f"'ranking' entries must be numbers in [1, {k}], got {str(raw)[:80]}"
  # Re-ranked: ties averaged whatever numbers the model used for them.
  ranks = np.asarray(ranking.average_ranks(np.asarray(values, np.float32)))
  return tuple(float(r) for r in ranks), None


def parse_applied(reply: str | None, k: int) -> tuple[Applied | None, str | None]:
  """(Applied, None) from a rank reply, or (None, why)."""
  obj, why, _ = reply_object(reply)
  if obj is None:
    return None, why
  ranks, why = parse_ranking(obj, k)
  if ranks is None:
    return None, why
  m = _number(obj.get("atomic_count"))
  if m is None or m < 0 or m != int(m):
    return None, f"'atomic_count' must be an integer >= 0, got {obj.get('atomic_count')!r:.40}"
  return Applied(ranks, int(m)), None


def parse_score(reply: str | None) -> tuple[float | None, str | None]:
  """(score in [0, 1], None) from a score reply, or (None, why)."""
  obj, why, _ = reply_object(reply)
  if obj is None:
    return None, why
  x = _number(obj.get("score"))
  if x is None or not 0 <= x <= 1:
    return None, f"'score' must be a number in [0, 1], got {obj.get('score')!r:.40}"
  return x, None


# ---------------------------------------------------------------------------------------------
# LLM appliers
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ApplierStats:
  """Counters over an LLM applier's calls: calls made, calls that gave None."""
  calls: int = 0
  failures: int = 0


class LLMApplier:
  """A rubric applier over a chat backend (agentjax.judge.chat: OpenAIChat or LocalChat)."""

  def __init__(self, backend: Any):
    self.backend = backend
    self.stats = ApplierStats()

  def identity(self) -> dict[str, str]:
    return {**self.backend.identity(),
            "prompt_sha256": prompt_sha256(RANK_INSTRUCTION + SCORE_INSTRUCTION)}

  def _ask(self, messages: list, parse: Callable[[int, str], tuple[Any, str | None]]
           ) -> list[Any]:
    """parse(i, reply text) of each conversation's reply; None where it failed."""
    replies = self.backend.chat(messages) if messages else []
    out, first = [], None
    for i, reply in enumerate(replies):
      value, why = parse(i, reply.text) if reply.ok else (None, reply.error)
      first = first or why
      out.append(value)
    failed = sum(v is None for v in out)
    self.stats.calls += len(out)
    self.stats.failures += failed
    if failed:
      log.warning("rubric applier: %d of %d calls failed; first: %s", failed, len(out), first)
    return out

  def rank(self, rubrics, contexts, candidates):
    _check_lengths(rubrics=rubrics, contexts=contexts, candidates=candidates)
    messages = [rank_messages(r, c, list(k)) for r, c, k in zip(rubrics, contexts, candidates)]
    return self._ask(messages, lambda i, text: parse_applied(text, len(candidates[i])))

  def score(self, rubrics, contexts, actions):
    _check_lengths(rubrics=rubrics, contexts=contexts, actions=actions)
    return self._ask([score_messages(r, c, a) for r, c, a in zip(rubrics, contexts, actions)],
                     lambda i, text: parse_score(text))


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def _executor(config: Any, mesh: Any = None) -> ExecutorApplier:
  del mesh
  return ExecutorApplier.from_path(config.coreact.entities_path)


def _llm(backend: str) -> Callable[..., LLMApplier]:
  def make(config: Any, mesh: Any = None) -> LLMApplier:
    from agentjax.judge.chat import build_chat
    return LLMApplier(build_chat(config.judge, mesh=mesh, backend=backend))
  return make


APPLIERS: dict[str, Callable[..., RubricApplier]] = {
    "executor": _executor, "openai": _llm("openai"), "local": _llm("local")}


def build_applier(config: Any, mesh: Any = None) -> RubricApplier:
  """The applier named by config.coreact.applier (LLM ones take config.judge's connection)."""
  return build_named(APPLIERS, "coreact.applier", config, mesh)
