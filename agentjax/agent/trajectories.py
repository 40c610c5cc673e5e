"""A rollout's trajectories: what each turn did (TurnRecord), the finished batch (TrajectoryBatch)
and the host-side bookkeeping both rollout engines share (TrajectoryBook).

Both engines (agentjax/agent/rollout.py, the turn-synchronous one, and agentjax/agent/slots.py,
the slot engine) keep a TrajectoryBook: the text, actions, outcomes and context lengths of every
trajectory, everything but the device calls. A book reads its engine only through the methods
and attributes listed in TrajectoryBook's docstring, so this module imports no engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.agent.protocol import (ANSWER, INVALID, SEARCH, Action, normalize_text,
                                     trajectory_error)
from agentjax.parallel.host import to_host
from agentjax.retrieval import Document
from agentjax.sampling import STOP_BUDGET, decode_bytes


@dataclasses.dataclass(frozen=True)
class TurnRecord:
  """What happened in one turn of one trajectory, as text (host side; for judges and logs).

  text: the text the policy generated in the turn (hook text not included), decoded from the
    exact sampled ids.
  action: the parsed action (an "invalid" Action with the reason when the turn was cut off by the
    token budget or was malformed).
  documents: the documents the search returned ([] for an answer, an invalid action or a failed
    search).
  observation: the observation text fed after the turn, as fed (possibly cut by the budget).
  search_error: the retriever's error for this turn's search, None otherwise.
  hook_text: text injected before the turn that stays in the context (`before_turn`'s text, a
    TurnGuide's kept prefix (agentjax/agent/guide.py), e.g. a persisted rubric; "" if none).
  shadow_text: text shown before the turn's generation and then removed from the context (a
    TurnGuide's prefix with keep=False: Co-ReAct's shadow rubric suffix and retry feedback,
    agentjax/coreact/guided.py); for logs: it is in no token of the trajectory.
  """
  text: str
  action: Action
  documents: tuple[Document, ...] = ()
  observation: str = ""
  search_error: str | None = None
  hook_text: str = ""
  shadow_text: str = ""


@chex.dataclass(frozen=True)
class TrajectoryBatch:
  """A batch of finished trajectories. Arrays are [B, S] over cache slots unless noted.

  Slot j of row b holds the j-th token of that trajectory (position id j); slots past the row's
  length are padding (valid = False).
  """

  tokens: jax.Array        # [B, S] int32
  positions: jax.Array     # [B, S] int32 (0 on padding)
  valid: jax.Array         # [B, S] bool, real tokens
  loss_mask: jax.Array     # [B, S] bool, exactly the tokens the policy sampled
  logprobs: jax.Array      # [B, S] float32, sampling-time log-prob of sampled tokens (temperature 1)
  turn_id: jax.Array       # [B, S] int32, turn of each token (hook text, samples, observation); -1 prompt
  versions: jax.Array      # [B, S] int32, the parameters' version (number of updates) that sampled
                           #   each sampled token (asynchronous RL, rollout.partial); -1 elsewhere
  turn_ends: np.ndarray    # [B, max_turns + 1] int32: context end after the prompt (0) and after
                           #   each turn t's observation (t); entries past num_turns repeat the last
  num_turns: np.ndarray    # [B] int32
  answered: np.ndarray     # [B] bool, ended with an <answer>
  format_valid: np.ndarray # [B] bool, well-formed (agent.protocol.trajectory_error): answered,
                           #   with no invalid action on the way
  truncated: np.ndarray    # [B] bool, hit max_turns or the token budget without answering
  group_ids: np.ndarray    # [B] int32, index of the question
  num_format_errors: np.ndarray    # [B] int32 invalid actions
  num_search_failures: np.ndarray  # [B] int32 searches the retriever failed
  answers: np.ndarray      # [B] object: answer text ("" if none); host-side
  turns: np.ndarray        # [B] object: tuple of num_turns[b] TurnRecords (host-side text)

  def map_slots(self, fn: Any) -> "TrajectoryBatch":
    """fn applied to each [B, S] device array (SLOT_FIELDS), the host fields kept: a cut to
    fewer slots, a move to other devices."""
    return self.replace(**{f: fn(getattr(self, f)) for f in SLOT_FIELDS})


# TrajectoryBatch's [B, S] device arrays, over cache slots.
SLOT_FIELDS = ("tokens", "positions", "valid", "loss_mask", "logprobs", "turn_id", "versions")


@jax.jit
def slot_positions(valid: jax.Array) -> jax.Array:
  """[B, S] each valid slot's index, 0 elsewhere (one program, not three eager ones)."""
  slots = jnp.arange(valid.shape[1], dtype=jnp.int32)[None]
  return jnp.where(valid, slots, 0)


class TrajectoryBook:
  """The host-side bookkeeping of a rollout's trajectories (text, actions, outcomes, lengths),
  shared by both engines: everything but the device calls. Trajectory i answers question
  group_ids[i]; `length` mirrors each trajectory's context length on the device when its current
  turn began (what was fed since counted: observations, hook text).

  engine: the rollout engine (agentjax.agent.rollout.RolloutEngine); the book uses its `config`,
  `protocol`, `before_turn`, `encode`, `decode`, `parse`, `search` and `observation_ids`.
  """

  def __init__(self, engine: Any, prompts: Sequence[Sequence[int]],
               group_ids: np.ndarray, budget: int):
    rows, turns = len(group_ids), engine.config.max_turns
    self.engine, self.group_ids, self.budget = engine, group_ids, budget
    self.length = np.array([len(prompts[g]) for g in group_ids], np.int64)
    self.transcripts = [engine.decode(prompts[g]) for g in group_ids]
    self.turn_ends = np.zeros((rows, turns + 1), np.int32)
    self.turn_ends[:, 0] = self.length
    self.num_turns = np.zeros(rows, np.int32)
    self.done = np.zeros(rows, bool)
    self.answered = np.zeros(rows, bool)
    self.truncated = np.zeros(rows, bool)
    self.format_errors = np.zeros(rows, np.int32)
    self.search_failures = np.zeros(rows, np.int32)
    self.answers = np.array([""] * rows, dtype=object)
    self.actions: list[list[Action]] = [[] for _ in range(rows)]  # each row's parsed turns
    self.records: list[list[dict[str, Any]]] = [[] for _ in range(rows)]  # TurnRecord fields
    self.hook_texts = [""] * rows
    self.search_queries, self.search_calls, self.search_last_error = 0, 0, None

  def hook(self, turn: int, rows: Sequence[int]) -> list[list[int]]:
    """before_turn's text for `rows` about to take `turn`, as ids cut to the budget (one list per
    row, [] for none); the context lengths and transcripts count them as fed."""
    engine = self.engine
    inject: list[list[int]] = [[] for _ in rows]
    if engine.before_turn is None or not len(rows):
      return inject
    rows = [int(b) for b in rows]
    texts = list(engine.before_turn(turn, rows, [self.transcripts[b] for b in rows]))
    if len(texts) != len(rows):
      raise ValueError(f"before_turn returned {len(texts)} texts for the {len(rows)} rows it was "
                       f"given (turn {turn}): one text or None per row")
    for i, (b, text) in enumerate(zip(rows, texts)):
      if text:
        inject[i] = engine.encode(text)[:max(0, self.budget - 1 - int(self.length[b]))]
        self.hook_texts[b] = engine.decode(inject[i])
        self.transcripts[b] += self.hook_texts[b]
        self.length[b] += len(inject[i])
    return inject

  def action(self, b: int, ids: Sequence[int], reason: int, context_added: int | None = None,
             kept: str = "", shadow: str = "") -> tuple[str | None, list[int]]:
    """Records trajectory b's generated turn (its sampled ids, stop reason) and decides what
    follows: (query to search or None, ids of an observation to feed now). A finished
    trajectory (answer, cut off by the budget) is marked done."""
    engine = self.engine
    self.length[b] += len(ids) if context_added is None else context_added
    self.num_turns[b] += 1
    text = engine.decode(ids)
    self.hook_texts[b] += kept
    self.transcripts[b] += kept + text
    self.records[b].append(dict(text=text, hook_text=self.hook_texts[b], shadow_text=shadow))
    self.hook_texts[b] = ""
    if reason == STOP_BUDGET:  # cut off mid-turn: no room left for any action
      self.records[b][-1]["action"] = Action(INVALID, "cut off by the token budget")
      self.truncated[b] = self.done[b] = True
      return None, []
    action = engine.parse(text)
    self.actions[b].append(action)
    self.records[b][-1]["action"] = action
    if action.kind == ANSWER:
      self.answers[b], self.answered[b], self.done[b] = action.content, True, True
    elif action.kind == SEARCH:
      return action.content, []
    else:  # malformed, or the turn ended (EOS / max_new_tokens) without an action
      self.format_errors[b] += 1
      return None, engine.encode(engine.protocol.invalid_observation())
    return None, []

  def search(self, searches: Sequence[tuple[int, str]]) -> dict[int, list[int]]:
    """ONE batched retriever call for (trajectory, query) pairs -> each one's observation ids."""
    engine, out = self.engine, {}
    if not searches:
      return out
    response = engine.search([q for _, q in searches])
    self.search_queries += len(searches)
    self.search_calls += 1
    for (b, _), docs, error in zip(searches, response.documents, response.errors):
      if error is not None:
        self.search_failures[b] += 1
        self.search_last_error = str(error)
        self.records[b][-1]["search_error"] = str(error)
        out[b] = engine.observation_ids(*engine.protocol.error_observation(error))
      else:
        self.records[b][-1]["documents"] = tuple(docs)
        out[b] = engine.observation_ids(*engine.protocol.observation(docs))
    return out

  def observe(self, b: int, ids: list[int]) -> list[int]:
    """Ends trajectory b's turn with the observation `ids` ([] for none): cut to the room left
    (a trajectory with no room to generate after it stops), recorded; returns the ids to feed."""
    room = self.budget - int(self.length[b])
    if ids and len(ids) >= room:  # no room to generate after this observation: keep what fits
      ids = ids[:max(0, room)]
      self.truncated[b] = self.done[b] = True
    observation = self.engine.decode(ids)
    self.transcripts[b] += observation
    self.records[b][-1]["observation"] = observation
    self.length[b] += len(ids)
    self.turn_ends[b, self.num_turns[b]] = self.length[b]
    if self.num_turns[b] >= self.engine.config.max_turns:
      self.done[b] = True
    return ids

  def batch(self, arrays: dict[str, jax.Array]) -> TrajectoryBatch:
    """The TrajectoryBatch of the finished rollout; arrays: the per-slot device arrays
    (tokens, valid, sampled, logprobs, turn_id, versions) [B, S]."""
    cfg = self.engine.config
    self.truncated |= ~self.answered  # ran out of turns (or budget) without answering
    # Boundaries past a row's last turn repeat its final length (convenient for gathers).
    for t in range(1, cfg.max_turns + 1):
      stale = t > self.num_turns
      self.turn_ends[stale, t] = self.turn_ends[stale, t - 1]
    valid = arrays["valid"]
    return TrajectoryBatch(
        tokens=arrays["tokens"], positions=slot_positions(valid), valid=valid,
        loss_mask=arrays["sampled"], logprobs=arrays["logprobs"], turn_id=arrays["turn_id"],
        versions=arrays["versions"], turn_ends=self.turn_ends, num_turns=self.num_turns, answered=self.answered,
        format_valid=np.array([trajectory_error(a) is None for a in self.actions], bool),
        truncated=self.truncated & ~self.answered,
        group_ids=self.group_ids, num_format_errors=self.format_errors,
        num_search_failures=self.search_failures, answers=self.answers,
        turns=_object_array([tuple(TurnRecord(**r) for r in row) for row in self.records]))

  def metrics(self) -> dict[str, Any]:
    return dict(turns_mean=float(self.num_turns.mean()), answered=float(self.answered.mean()),
                format_errors=float(self.format_errors.sum()),
                search_failures=float(self.search_failures.sum()),
                search_queries=float(self.search_queries),
                search_calls=float(self.search_calls),
                search_last_error=self.search_last_error,
                truncated=float((self.truncated & ~self.answered).mean()))


def search_stats(turns: Sequence[TurnRecord]) -> tuple[int, int]:
  """(searches, redundant searches) of one trajectory: a search is redundant when its query,
  normalized (protocol.normalize_text, as the rubric executor compares queries), equals an
  earlier query of the same trajectory."""
  seen, searches, redundant = set(), 0, 0
  for turn in turns:
    if turn.action.kind != SEARCH:
      continue
    query = normalize_text(turn.action.content)
    searches += 1
    redundant += query in seen
    seen.add(query)
  return searches, redundant


def _object_array(items: Sequence[Any]) -> np.ndarray:
  """[len(items)] object array holding each item as it is (np.array would unpack tuples)."""
  out = np.empty(len(items), dtype=object)
  for i, item in enumerate(items):
    out[i] = item
  return out


def transcripts_of(batch: TrajectoryBatch, byte_table: Sequence[bytes]) -> list[str]:
  """Full text of each trajectory, decoded from its exact token ids."""
  tokens, valid = to_host((batch.tokens, batch.valid))
  return [decode_bytes(byte_table, tokens[b][valid[b]]) for b in range(tokens.shape[0])]


__all__ = ["TrajectoryBatch", "TrajectoryBook", "TurnRecord", "search_stats", "transcripts_of"]
