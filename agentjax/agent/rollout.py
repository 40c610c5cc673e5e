"""Multi-turn search-agent rollouts: think -> search -> information -> ... -> answer.

For a batch of questions, each repeated group_size times:

  prefill prompts ─► per turn: [hook text] ─► generate (one lax.while_loop until a stop string)
                    ─► parse actions (host, text only) ─► ONE batched search call
                    ─► feed observations into the KV cache (never re-running earlier context)

The decode state (KV cache, token buffer, masks, log-probs) stays on the device for the whole
rollout; only each turn's sampled tokens come to the host, as text for the tool, and observation
tokens go back. Trajectory tokens are exactly the ids that were sampled or fed: nothing is ever
re-tokenized from decoded text (re-tokenizing at tool boundaries shifts tokens and spikes the KL).

Extension points for later methods: `before_turn` (a hook that injects text, e.g. rubrics, before
each turn's generation), `policy_for_turn` (which of several parameter sets generates a turn,
e.g. a searcher and a generator adapter) and `_generate_turn` (the step itself, which a subclass
overrides: agentjax/coreact/guided.py's rubric-guided agents).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.agent.protocol import (ANSWER, INVALID, SEARCH, Action, Protocol, get_protocol,
                                     normalize_text, parse_action, trajectory_error)
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.parallel.host import to_host
from agentjax.retrieval import Document, SearchBackend, SearchResponse
from agentjax.retrieval.base import guarded_search
from agentjax.sampling import (STOP_BUDGET, DecodeState, SamplingParams, StopTable, bucket,
                               cache_size,
                               decode_bytes, decode_layout, extend, generate, init_state,
                               kv_window_arg, kv_window_size, token_byte_table)
from agentjax.sampling.eos import eos_token_ids

# before_turn(turn, rows, transcripts) -> text to feed before row's generation (None: nothing).
# The turn engine calls it once per turn with every active row; the slot engine once per lane
# and turn with the rows about to take that turn (each row once per turn, turns in order).
TurnHook = Callable[[int, Sequence[int], Sequence[str]], Sequence[str | None]]


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
    guided agent's persisted rubric; "" if none).
  shadow_text: text shown before the turn's generation and then removed from the context (a
    guided agent's shadow rubric suffix and retry feedback; agentjax/coreact/guided.py); for
    logs: it is in no token of the trajectory.
  """
  text: str
  action: Action
  documents: tuple[Document, ...] = ()
  observation: str = ""
  search_error: str | None = None
  hook_text: str = ""
  shadow_text: str = ""


def encode_text(tokenizer: Any, text: str) -> list[int]:
  """Token ids of plain text (no BOS/EOS added)."""
  return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer: Any, protocol: Protocol, question: str,
               use_chat_template: bool = True) -> list[int]:
  """The ids a trajectory starts from: the protocol's instruction, in a chat turn if asked.
  (Also what SFT demonstrations start from, so both see the same tokens.)"""
  text = protocol.prompt(question)
  if use_chat_template:
    return list(tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
        return_dict=False))
  return encode_text(tokenizer, text)


def observation_ids(tokenizer: Any, prefix: str, body: str, suffix: str,
                    max_tokens: int | None = None) -> list[int]:
  """prefix + body + suffix encoded separately (the body cut so the whole fits max_tokens).

  Separate encoding is the rollout's token boundary: SFT uses the same function so that its
  observations are the very tokens RL will feed."""
  pre, suf = encode_text(tokenizer, prefix), encode_text(tokenizer, suffix)
  ids = encode_text(tokenizer, body)
  if max_tokens is not None:
    ids = ids[:max(0, max_tokens - len(pre) - len(suf))]
  return pre + ids + suf


ENGINES = ("slots", "turns")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  protocol: str = "search_r1"
  group_size: int = 5
  max_turns: int = 4
  max_new_tokens: int = 256     # per turn
  max_obs_tokens: int = 512     # per observation, tags included
  max_total_tokens: int = 4096  # whole trajectory, prompt included (the KV cache budget)
  topk: int = 3
  sampling: SamplingParams = SamplingParams()
  use_chat_template: bool = True
  # The engine (agentjax/agent/slots.py; docs/BENCHMARKS.md rollout_mix). "slots": continuous
  # batching: each question's prompt prefilled once, a fixed set of decode slots refilled in
  # flight as trajectories end, one lane's search overlapped with the other lanes' decoding.
  # "turns": the turn-synchronous engine (every turn waits for the batch's slowest row).
  engine: str = "slots"
  slots: int = 0                 # decode slots (KV-cache rows) in all; 0: every trajectory
  lanes: int = 2                 # slot groups that take turns on the device (1: no overlap)
  refill_fraction: float = 0.125  # a lane's decode call returns once this share of it stopped
  # Decode and feed calls attend over a window of the cache that covers their rows' live
  # context: the smallest of kv_window_min * 2^k slots that does (sampling.kv_window_size; a
  # few programs per call shape), not the whole max_total_tokens budget. 0: the whole cache.
  kv_window_min: int = 256
  # The slot engine's shared prefill runs this many prompts per `extend` call and holds only
  # their caches (the next chunk is prefilled when its first trajectory takes a slot). 0: every
  # prompt at once (a [Q, prompt] cache for the whole rollout: DAC's generator has 512 of them).
  prefill_rows: int = 32

  def __post_init__(self):
    get_protocol(self.protocol)
    if self.prefill_rows < 0:
      raise ValueError("rollout.prefill_rows must be >= 0 (0: every prompt in one call), got "
                       f"{self.prefill_rows}")
    if self.kv_window_min < 0:
      raise ValueError("rollout.kv_window_min must be >= 0 (0: no windows), got "
                       f"{self.kv_window_min}")
    for name in ("group_size", "max_turns", "max_new_tokens", "max_obs_tokens",
                 "max_total_tokens", "topk", "lanes"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
    if self.engine not in ENGINES:
      raise ValueError(f"rollout.engine must be one of {ENGINES}, got {self.engine!r}")
    if self.slots < 0:
      raise ValueError(f"rollout.slots must be >= 0 (0: one per trajectory), got {self.slots}")
    if self.slots % self.lanes:
      raise ValueError(f"rollout.slots={self.slots} must be a multiple of rollout.lanes="
                       f"{self.lanes} (the lanes share the slots equally)")
    if not 0.0 < self.refill_fraction <= 1.0:
      raise ValueError(f"rollout.refill_fraction must be in (0, 1], got {self.refill_fraction}")


@dataclasses.dataclass
class TurnRows:
  """What RolloutEngine._generate_turn sees of the rollout before a turn (host side).

  turn: the 0-based turn about to be generated.
  rows: the active rows' indices.
  group_ids: [B] the question index of every row.
  length: [B] each row's context length before the turn (a copy).
  budget: the slots a row may fill (the token budget).
  records: per row, the TurnRecord fields of its turns so far (dicts, read-only).
  transcripts: per row, the text of its context so far (read-only).
  """
  turn: int
  rows: np.ndarray
  group_ids: np.ndarray
  length: np.ndarray
  budget: int
  records: Sequence[Sequence[dict[str, Any]]]
  transcripts: Sequence[str]

  def history(self, b: int) -> tuple[TurnRecord, ...]:
    """Row b's turns so far as TurnRecords."""
    return tuple(TurnRecord(**r) for r in self.records[b])


@dataclasses.dataclass
class GeneratedTurn:
  """What RolloutEngine._generate_turn returns.

  state: the decode state after the turn's generation (each active row's context now ends with
    its action's ids).
  new_tokens: [B, N] int32 host array; row b's action is new_tokens[b, :num_new[b]] (its exact
    sampled ids).
  num_new: [B] int32; reason: [B] int32 stop reasons (sampler.STOP_*).
  context_added: [B] tokens the turn added to each row's context (injected text kept in the
    context and the action); None: num_new (nothing injected).
  hook_texts: row -> text injected before the action that stays in the context.
  shadow_texts: row -> text shown before the action and then removed from the context.
  sampled_tokens: tokens sampled in the turn in all (discarded proposals included); None:
    num_new.sum().
  """
  state: DecodeState
  new_tokens: np.ndarray
  num_new: np.ndarray
  reason: np.ndarray
  context_added: np.ndarray | None = None
  hook_texts: dict[int, str] = dataclasses.field(default_factory=dict)
  shadow_texts: dict[int, str] = dataclasses.field(default_factory=dict)
  sampled_tokens: int | None = None


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


class _Book:
  """The host-side bookkeeping of a rollout's trajectories (text, actions, outcomes, lengths),
  shared by both engines: everything but the device calls. Trajectory i answers question
  group_ids[i]; `length` mirrors each trajectory's context length on the device."""

  def __init__(self, engine: "RolloutEngine", prompts: Sequence[Sequence[int]],
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
    (tokens, valid, sampled, logprobs, turn_id) [B, S]."""
    cfg = self.engine.config
    self.truncated |= ~self.answered  # ran out of turns (or budget) without answering
    # Boundaries past a row's last turn repeat its final length (convenient for gathers).
    for t in range(1, cfg.max_turns + 1):
      stale = t > self.num_turns
      self.turn_ends[stale, t] = self.turn_ends[stale, t - 1]
    valid = arrays["valid"]
    slots = jnp.arange(valid.shape[1], dtype=jnp.int32)[None]
    return TrajectoryBatch(
        tokens=arrays["tokens"], positions=jnp.where(valid, slots, 0), valid=valid,
        loss_mask=arrays["sampled"], logprobs=arrays["logprobs"], turn_id=arrays["turn_id"],
        turn_ends=self.turn_ends, num_turns=self.num_turns, answered=self.answered,
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


class RolloutEngine:
  """Runs batched multi-turn rollouts of one model against one search backend."""

  def __init__(self, cfg: QwenConfig, tokenizer: Any, backend: SearchBackend,
               config: RolloutConfig, before_turn: TurnHook | None = None,
               mesh: jax.sharding.Mesh | None = None, lora: LoraSpec | None = None):
    """With a mesh, the decode state is sharded by the rules table (batch over data and fsdp,
    KV heads over tensor) and params are expected on the same mesh. With `lora`, params are a
    LoRA model's (models/lora.attach: its lora_index picks the adapter that generates)."""
    self.cfg, self.tokenizer, self.backend, self.config = cfg, tokenizer, backend, config
    self.mesh = mesh
    self.protocol = get_protocol(config.protocol)
    self.model = Qwen(cfg, lora=lora)
    self.before_turn = before_turn
    self.byte_table = token_byte_table(tokenizer, cfg.vocab_size)
    self.eos_ids = jnp.asarray(eos_token_ids(cfg, tokenizer, chat=config.use_chat_template),
                               jnp.int32)
    self.stop_table = StopTable.build(self.byte_table, self.protocol.stop_strings)
    self.cache_len = cache_size(config.max_total_tokens)

  # ------------------------------------------------------------------ text <-> tokens (host)

  def encode(self, text: str) -> list[int]:
    return encode_text(self.tokenizer, text)

  def decode(self, ids: Sequence[int]) -> str:
    return decode_bytes(self.byte_table, ids)

  def prompt_ids(self, question: str) -> list[int]:
    return prompt_ids(self.tokenizer, self.protocol, question, self.config.use_chat_template)

  def observation_ids(self, prefix: str, body: str, suffix: str) -> list[int]:
    return observation_ids(self.tokenizer, prefix, body, suffix, self.config.max_obs_tokens)

  def parse(self, text: str) -> Action:
    """The protocol's parse, with a last line of defence: model text never raises."""
    return parse_action(self.protocol, text)

  def search(self, queries: Sequence[str], topk: int | None = None) -> SearchResponse:
    """One batched call (top `topk`, default rollout.topk); a backend that raises or answers the
    wrong number of results fails every query of the call (each gets an error observation)
    instead of ending the rollout (retrieval.base.guarded_search)."""
    return guarded_search(self.backend, queries, topk or self.config.topk)

  # ------------------------------------------------------------------ device calls

  def kv_window(self, end: int | None, cache_len: int) -> int | None:
    """The key window of a call whose rows end at or below slot `end` (None: unknown, the
    whole cache); see RolloutConfig.kv_window_min."""
    return None if end is None else kv_window_size(end, cache_len, self.config.kv_window_min)

  def _feed(self, params, state, rows_ids: Sequence[Sequence[int]], turn: np.ndarray,
            count: bool = False, end: int | None = None):
    """Feeds each row's ids (possibly none) through one `extend` call, shapes bucketed.
    count: also return the tokens the call computes (rows x bucketed width).
    end: an upper bound of every fed row's length after the feed (host bookkeeping): the call
      then attends over a window of the cache (`kv_window`); None: over all of it."""
    lengths = np.array([len(x) for x in rows_ids], np.int32)
    width = bucket(int(lengths.max()) if len(lengths) else 1)
    block = np.zeros((len(rows_ids), width), np.int32)
    for b, ids in enumerate(rows_ids):
      block[b, :len(ids)] = ids
    state = extend(self.model, params, state, jnp.asarray(block), jnp.asarray(lengths),
                   jnp.asarray(turn, jnp.int32),
                   **kv_window_arg(self.kv_window(end, state.tokens.shape[1])))
    return (state, block.size) if count else state

  def _generate_turn(self, policy: Any, decoder: tuple[Qwen, Any], state: DecodeState,
                     active: np.ndarray, turn_arr: np.ndarray, stop: tuple,
                     rows: "TurnRows") -> "GeneratedTurn":
    """One turn's generation for the active rows: one `generate` call (the ReAct step).

    Subclasses override it to shape the step (agentjax/coreact/guided.py: a rubric fed as a
    temporary suffix, verify and retry, Best-of-N) while run() keeps the parsing, the search and
    the observations.

    Args:
      policy: the turn's parameters in the checkpoint layout (for `extend`).
      decoder: (model, params) in the decode layout (for `generate`).
      state: the decode state, each active row at the end of its context (rows.length).
      active: [B] bool rows that take this turn.
      turn_arr: [B] int32 the turn id recorded for the tokens.
      stop: (StopTable, eos ids, budget) as `generate` takes it.
      rows: the host-side view of the rollout so far (TurnRows).
    """
    del policy
    end = None
    if type(self)._generate_turn is RolloutEngine._generate_turn and active.any():
      # rows.length is each row's context as the device holds it (nothing was fed since): a
      # turn ends at most max_new tokens later. A subclass that shapes the step may have fed
      # more (a rubric suffix) and calls this with the same rows: it reads the whole cache.
      end = int(rows.length[active].max()) + self.config.max_new_tokens
    state, gen = generate(*decoder, state, jnp.asarray(active), jnp.asarray(turn_arr), stop,
                          self.config.sampling, self.config.max_new_tokens,
                          **kv_window_arg(self.kv_window(end, state.tokens.shape[1])))
    new_tokens, num_new, reason = to_host((gen.new_tokens, gen.num_new, gen.stop_reason))
    return GeneratedTurn(state=state, new_tokens=new_tokens, num_new=num_new, reason=reason)

  # ------------------------------------------------------------------ the rollout

  def run(self, params: Any, questions: Sequence[str], rng: jax.Array,
          policy_for_turn: Callable[[int], str] | None = None
          ) -> tuple[TrajectoryBatch, dict[str, Any]]:
    """Rolls out group_size trajectories per question.

    Args:
      params: model parameters, or a mapping name -> parameters when policy_for_turn is given.
      questions: Q question strings; the batch is B = Q * group_size rows, row b answering
        question b // group_size.
      policy_for_turn: turn -> name of the parameters that generate that turn (and encode its
        observation). Default: the single `params` for every turn.
    Returns:
      (TrajectoryBatch, metrics): floats (seconds per phase, counts; "search_queries" is the
      number of queries sent to the retriever; the decode_* / prefill_tokens / extend_tokens /
      search_wait_s work counts of docs/BENCHMARKS.md rollout_mix) and "search_last_error", the
      last error the retriever gave in this rollout (str), or None when it gave none.

    rollout.engine "slots" (agentjax/agent/slots.py: shared prompt prefill, in-flight slot
    refill, search overlapped with decoding) runs it unless a subclass shapes the turn step
    (`_generate_turn`), which the turn-synchronous engine below keeps.
    """
    if self.config.engine == "slots" and len(questions) and \
        type(self)._generate_turn is RolloutEngine._generate_turn:
      from agentjax.agent.slots import SlotRollout
      return SlotRollout(self, params, policy_for_turn).run(questions, rng)
    return self._run_turns(params, questions, rng, policy_for_turn)

  def _policies(self, params: Any, policy_for_turn: Callable[[int], str] | None):
    """(turn -> params, turn -> (model, params) in the decode layout). The decode layout is made
    once per policy and rollout: on CPU each holds a second copy of that policy's projection
    kernels while the rollout runs (extend uses the checkpoint layout); the embedding and norms
    are shared."""
    pick = (lambda turn: params) if policy_for_turn is None else \
        (lambda turn: params[policy_for_turn(turn)])
    decoders = {}

    def decoder(turn):
      name = None if policy_for_turn is None else policy_for_turn(turn)
      if name not in decoders:
        decoders[name] = decode_layout(self.model, pick(turn))
      return decoders[name]
    return pick, decoder

  def _prompts(self, questions: Sequence[str]) -> tuple[list[list[int]], int]:
    """Each question's prompt ids, and the slots a trajectory may fill (the token budget)."""
    budget = min(self.config.max_total_tokens, self.cache_len)
    prompts = [self.prompt_ids(q) for q in questions]
    for i, ids in enumerate(prompts):
      if len(ids) >= budget:
        raise ValueError(f"question {i}: prompt of {len(ids)} tokens does not fit "
                         f"rollout.max_total_tokens={self.config.max_total_tokens}")
    return prompts, budget

  def _run_turns(self, params: Any, questions: Sequence[str], rng: jax.Array,
                 policy_for_turn: Callable[[int], str] | None = None
                 ) -> tuple[TrajectoryBatch, dict[str, Any]]:
    """The turn-synchronous engine (rollout.engine "turns"): every turn decodes the whole batch
    until its last active row stops, then searches, then feeds every observation."""
    cfg = self.config
    pick, decoder = self._policies(params, policy_for_turn)
    rows = len(questions) * cfg.group_size
    group_ids = np.repeat(np.arange(len(questions), dtype=np.int32), cfg.group_size)
    prompts, budget = self._prompts(questions)
    book = _Book(self, prompts, group_ids, budget)
    timings = {"generate_s": 0.0, "search_s": 0.0, "extend_s": 0.0}
    work = dict(decode_steps=0, decode_row_steps=0, decode_useful_row_steps=0,
                prefill_tokens=0, extend_tokens=0)

    t0 = time.perf_counter()
    state = init_state(self.cfg, rows, self.cache_len, rng, mesh=self.mesh)
    state, work["prefill_tokens"] = self._feed(pick(0), state, [prompts[g] for g in group_ids],
                                               np.full(rows, -1), count=True,
                                               end=int(book.length.max()))
    jax.block_until_ready(state.length)
    timings["extend_s"] += time.perf_counter() - t0
    sampled_tokens = 0
    stop = (self.stop_table, self.eos_ids, jnp.int32(budget))

    for turn in range(cfg.max_turns):
      active_rows = np.flatnonzero(~book.done)
      if not len(active_rows):
        break
      turn_arr = np.full(rows, turn, np.int32)
      policy = pick(turn)

      inject = [[] for _ in range(rows)]
      for b, ids in zip(active_rows, book.hook(turn, active_rows)):
        inject[b] = ids
      if any(inject):
        t0 = time.perf_counter()
        # book.length counts the hook text already (as it counts the observations below).
        state, fed = self._feed(policy, state, inject, turn_arr, count=True,
                                end=int(book.length.max()))
        work["extend_tokens"] += fed
        timings["extend_s"] += time.perf_counter() - t0

      t0 = time.perf_counter()
      active = np.zeros(rows, bool)
      active[active_rows] = True
      out = self._generate_turn(policy, decoder(turn), state, active, turn_arr, stop, TurnRows(
          turn=turn, rows=active_rows, group_ids=group_ids, length=book.length.copy(),
          budget=budget, records=book.records, transcripts=book.transcripts))
      state, new_tokens, num_new, reason = out.state, out.new_tokens, out.num_new, out.reason
      timings["generate_s"] += time.perf_counter() - t0
      sampled_tokens += int(num_new.sum()) if out.sampled_tokens is None else out.sampled_tokens
      # The token loop runs until its last active row stops, over every row of the batch.
      steps = int(num_new[active_rows].max())
      work["decode_steps"] += steps
      work["decode_row_steps"] += steps * rows
      work["decode_useful_row_steps"] += int(num_new.sum())

      observations: list[list[int]] = [[] for _ in range(rows)]
      searches: list[tuple[int, str]] = []
      for b in active_rows:
        query, observations[b] = book.action(
            b, new_tokens[b, :num_new[b]], reason[b],
            None if out.context_added is None else int(out.context_added[b]),
            out.hook_texts.get(b, ""), out.shadow_texts.get(b, ""))
        if query is not None:
          searches.append((b, query))
      t0 = time.perf_counter()
      for b, ids in book.search(searches).items():
        observations[b] = ids
      timings["search_s"] += time.perf_counter() - t0
      for b in active_rows:
        observations[b] = book.observe(b, observations[b])

      if any(observations[b] for b in active_rows):
        t0 = time.perf_counter()
        state, fed = self._feed(policy, state, observations, turn_arr, count=True,
                                end=int(book.length.max()))
        work["extend_tokens"] += fed
        jax.block_until_ready(state.length)
        timings["extend_s"] += time.perf_counter() - t0

    batch = book.batch(dict(tokens=state.tokens, valid=state.valid, sampled=state.sampled,
                            logprobs=state.logprobs, turn_id=state.turn_id))
    metrics = dict(timings, **{k: float(v) for k, v in work.items()},
                   search_wait_s=timings["search_s"],  # the device idles while it searches
                   sampled_tokens=float(sampled_tokens), **book.metrics())
    return batch, metrics


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


__all__ = ["GeneratedTurn", "RolloutConfig", "RolloutEngine", "TrajectoryBatch", "TurnHook",
           "TurnRecord", "TurnRows", "search_stats", "transcripts_of"]
