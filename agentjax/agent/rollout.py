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
                               decode_bytes, decode_layout, extend, generate, init_state,
                               token_byte_table)
from agentjax.sampling.eos import eos_token_ids

# before_turn(turn, rows, transcripts) -> text to feed before row's generation (None: nothing).
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

  def __post_init__(self):
    get_protocol(self.protocol)
    for name in ("group_size", "max_turns", "max_new_tokens", "max_obs_tokens",
                 "max_total_tokens", "topk"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")


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
    self.cache_len = bucket(config.max_total_tokens)

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

  def _feed(self, params, state, rows_ids: Sequence[Sequence[int]], turn: np.ndarray):
    """Feeds each row's ids (possibly none) through one `extend` call, shapes bucketed."""
    lengths = np.array([len(x) for x in rows_ids], np.int32)
    width = bucket(int(lengths.max()) if len(lengths) else 1)
    block = np.zeros((len(rows_ids), width), np.int32)
    for b, ids in enumerate(rows_ids):
      block[b, :len(ids)] = ids
    return extend(self.model, params, state, jnp.asarray(block), jnp.asarray(lengths),
                  jnp.asarray(turn, jnp.int32))

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
    del policy, rows
    state, gen = generate(*decoder, state, jnp.asarray(active), jnp.asarray(turn_arr), stop,
                          self.config.sampling, self.config.max_new_tokens)
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
      number of queries sent to the retriever) and "search_last_error", the last error the
      retriever gave in this rollout (str), or None when it gave none.
    """
    cfg = self.config
    pick = (lambda turn: params) if policy_for_turn is None else \
        (lambda turn: params[policy_for_turn(turn)])
    # policy name -> (model, params) in the decode layout, made once per rollout. On CPU each
    # holds a second copy of that policy's projection kernels while the rollout runs (extend
    # uses the checkpoint layout); the embedding and norms are shared.
    decoders = {}

    def decoder(turn):
      name = None if policy_for_turn is None else policy_for_turn(turn)
      if name not in decoders:
        decoders[name] = decode_layout(self.model, pick(turn))
      return decoders[name]

    group = cfg.group_size
    rows = len(questions) * group
    group_ids = np.repeat(np.arange(len(questions), dtype=np.int32), group)
    budget = min(cfg.max_total_tokens, self.cache_len)

    prompts = [self.prompt_ids(q) for q in questions]
    for i, ids in enumerate(prompts):
      if len(ids) >= budget:
        raise ValueError(f"question {i}: prompt of {len(ids)} tokens does not fit "
                         f"rollout.max_total_tokens={cfg.max_total_tokens}")
    transcripts = [self.decode(prompts[g]) for g in group_ids]
    timings = {"generate_s": 0.0, "search_s": 0.0, "extend_s": 0.0}

    t0 = time.perf_counter()
    state = init_state(self.cfg, rows, self.cache_len, rng, mesh=self.mesh)
    state = self._feed(pick(0), state, [prompts[g] for g in group_ids], np.full(rows, -1))
    jax.block_until_ready(state.length)
    timings["extend_s"] += time.perf_counter() - t0

    length = np.array([len(prompts[g]) for g in group_ids], np.int64)
    turn_ends = np.zeros((rows, cfg.max_turns + 1), np.int32)
    turn_ends[:, 0] = length
    num_turns = np.zeros(rows, np.int32)
    done = np.zeros(rows, bool)
    answered = np.zeros(rows, bool)
    truncated = np.zeros(rows, bool)
    format_errors = np.zeros(rows, np.int32)
    search_failures = np.zeros(rows, np.int32)
    answers = np.array([""] * rows, dtype=object)
    actions: list[list[Action]] = [[] for _ in range(rows)]  # each row's parsed turns
    records: list[list[dict[str, Any]]] = [[] for _ in range(rows)]  # TurnRecord fields
    hook_texts = [""] * rows
    sampled_tokens = 0
    search_queries, search_last_error = 0, None
    stop = (self.stop_table, self.eos_ids, jnp.int32(budget))

    for turn in range(cfg.max_turns):
      active_rows = np.flatnonzero(~done)
      if not len(active_rows):
        break
      turn_arr = np.full(rows, turn, np.int32)
      policy = pick(turn)

      if self.before_turn is not None:
        texts = self.before_turn(turn, list(active_rows), [transcripts[b] for b in active_rows])
        inject = [[] for _ in range(rows)]
        for b, text in zip(active_rows, texts):
          if text:
            inject[b] = self.encode(text)[:max(0, budget - 1 - int(length[b]))]
            hook_texts[b] = self.decode(inject[b])
            transcripts[b] += hook_texts[b]
        if any(inject):
          t0 = time.perf_counter()
          state = self._feed(policy, state, inject, turn_arr)
          length += [len(x) for x in inject]
          timings["extend_s"] += time.perf_counter() - t0

      t0 = time.perf_counter()
      active = np.zeros(rows, bool)
      active[active_rows] = True
      out = self._generate_turn(policy, decoder(turn), state, active, turn_arr, stop, TurnRows(
          turn=turn, rows=active_rows, group_ids=group_ids, length=length.copy(), budget=budget,
          records=records, transcripts=transcripts))
      state, new_tokens, num_new, reason = out.state, out.new_tokens, out.num_new, out.reason
      timings["generate_s"] += time.perf_counter() - t0
      sampled_tokens += int(num_new.sum()) if out.sampled_tokens is None else out.sampled_tokens
      length += num_new if out.context_added is None else out.context_added
      num_turns[active_rows] += 1

      observations: list[list[int]] = [[] for _ in range(rows)]
      searches: list[tuple[int, str]] = []
      for b in active_rows:
        text = self.decode(new_tokens[b, :num_new[b]])
        kept = out.hook_texts.get(b, "")
        hook_texts[b] += kept
        transcripts[b] += kept + text
        records[b].append(dict(text=text, hook_text=hook_texts[b],
                               shadow_text=out.shadow_texts.get(b, "")))
        hook_texts[b] = ""
        if reason[b] == STOP_BUDGET:  # cut off mid-turn: no room left for any action
          records[b][-1]["action"] = Action(INVALID, "cut off by the token budget")
          truncated[b] = done[b] = True
          continue
        action = self.parse(text)
        actions[b].append(action)
        records[b][-1]["action"] = action
        if action.kind == ANSWER:
          answers[b], answered[b], done[b] = action.content, True, True
        elif action.kind == SEARCH:
          searches.append((b, action.content))
        else:  # malformed, or the turn ended (EOS / max_new_tokens) without an action
          format_errors[b] += 1
          observations[b] = self.encode(self.protocol.invalid_observation())

      if searches:
        t0 = time.perf_counter()
        response = self.search([q for _, q in searches])
        timings["search_s"] += time.perf_counter() - t0
        search_queries += len(searches)
        for (b, _), docs, error in zip(searches, response.documents, response.errors):
          if error is not None:
            search_failures[b] += 1
            search_last_error = str(error)
            records[b][-1]["search_error"] = str(error)
            observations[b] = self.observation_ids(*self.protocol.error_observation(error))
          else:
            records[b][-1]["documents"] = tuple(docs)
            observations[b] = self.observation_ids(*self.protocol.observation(docs))

      for b in active_rows:
        room = budget - int(length[b])
        if observations[b] and len(observations[b]) >= room:
          # No room to generate after this observation: keep what fits and stop.
          observations[b] = observations[b][:max(0, room)]
          truncated[b] = done[b] = True
        observation = self.decode(observations[b])
        transcripts[b] += observation
        records[b][-1]["observation"] = observation

      if any(observations[b] for b in active_rows):
        t0 = time.perf_counter()
        state = self._feed(policy, state, observations, turn_arr)
        jax.block_until_ready(state.length)
        timings["extend_s"] += time.perf_counter() - t0
      length += [len(x) for x in observations]
      turn_ends[active_rows, turn + 1] = length[active_rows]
    truncated |= ~done  # ran out of turns without answering
    # Boundaries past a row's last turn repeat its final length (convenient for gathers).
    for t in range(1, cfg.max_turns + 1):
      stale = t > num_turns
      turn_ends[stale, t] = turn_ends[stale, t - 1]

    slots = jnp.arange(self.cache_len, dtype=jnp.int32)[None]
    batch = TrajectoryBatch(
        tokens=state.tokens, positions=jnp.where(state.valid, slots, 0), valid=state.valid,
        loss_mask=state.sampled, logprobs=state.logprobs, turn_id=state.turn_id,
        turn_ends=turn_ends, num_turns=num_turns, answered=answered,
        format_valid=np.array([trajectory_error(a) is None for a in actions], bool),
        truncated=truncated & ~answered,
        group_ids=group_ids, num_format_errors=format_errors,
        num_search_failures=search_failures, answers=answers,
        turns=_object_array([tuple(TurnRecord(**r) for r in row) for row in records]))
    metrics = dict(timings, sampled_tokens=float(sampled_tokens),
                   turns_mean=float(num_turns.mean()), answered=float(answered.mean()),
                   format_errors=float(format_errors.sum()),
                   search_failures=float(search_failures.sum()),
                   search_queries=float(search_queries), search_last_error=search_last_error,
                   truncated=float(batch.truncated.mean()))
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
