"""Multi-turn search-agent rollouts: think -> search -> information -> ... -> answer.

For a batch of questions, each repeated group_size times:

  prefill prompts ─► per turn: [hook text] ─► generate (one lax.while_loop until a stop string)
                    ─► parse actions (host, text only) ─► ONE batched search call
                    ─► feed observations into the KV cache (never re-running earlier context)

The decode state (KV cache, token buffer, masks, log-probs) stays on the device for the whole
rollout; only each turn's sampled tokens come to the host, as text for the tool, and observation
tokens go back. Trajectory tokens are exactly the ids that were sampled or fed: nothing is ever
re-tokenized from decoded text (re-tokenizing at tool boundaries shifts tokens and spikes the KL).

Two engines run it (rollout.engine): "slots" (agentjax/agent/slots.py, continuous batching, the
default) and "turns" (the turn-synchronous engine below). Both keep their host-side bookkeeping
in a TrajectoryBook (agentjax/agent/trajectories.py) and honour the same extension points:
`before_turn` (a hook that injects text, e.g. rubrics, before each turn's generation),
`policy_for_turn` (which of several parameter sets generates a turn, e.g. a searcher and a
generator adapter) and `guide` (a TurnGuide, agentjax/agent/guide.py: how each turn's action is
generated: a prefix fed before it and removed after, verify and retry, Best-of-N; Co-ReAct's
rubric-guided agents, agentjax/coreact/guided.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.agent.feed import PARTIAL_MODES, NewVersion, newer
from agentjax.agent.guide import GuideBook, TurnGuide
from agentjax.agent.protocol import Action, Protocol, get_protocol, parse_action
from agentjax.agent.slots import SlotRollout
from agentjax.agent.trajectories import (TrajectoryBatch, TrajectoryBook, TurnRecord,
                                         search_stats, transcripts_of)
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.parallel.host import DEVICE_TURN, to_host
from agentjax.retrieval import SearchBackend, SearchResponse
from agentjax.retrieval.base import guarded_search
from agentjax.sampling import (DecodeState, SamplingParams, StopTable, bucket, cache_size,
                               decode_bytes, decode_layout, extend, generate, init_state,
                               kv_window_arg, kv_window_size, token_byte_table)
from agentjax.sampling.eos import eos_token_ids
from agentjax.sampling.sampler import rewind
from agentjax.sampling.text import with_think_tags
from agentjax.watchdog import progress

# before_turn(turn, rows, transcripts) -> text to feed before row's generation (None: nothing).
# The turn engine calls it once per turn with every active row; the slot engine once per lane
# and turn with the rows about to take that turn (each row once per turn, turns in order).
TurnHook = Callable[[int, Sequence[int], Sequence[str]], Sequence[str | None]]


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
  # Once no trajectory waits, a lane of N slots whose live rows fit N / f^k slots moves them
  # into a lane of that size (f = compact_factor: sizes N, N/f, N/f^2, ..., 1; 0: never), so
  # decode stops computing finished rows. Each size is a few more programs: f bounds them
  # (slots.lane_sizes) at up to f times the live rows computed.
  compact_factor: int = 2
  # The feeds, stores and refills of k rows of a lane run on MIN_ROWS * f^j >= k rows (f =
  # row_bucket_factor; at most the lane's size; 0: always the lane's size): a larger f makes
  # fewer programs and computes up to f times the rows fed (slots.row_bucket).
  row_bucket_factor: int = 2
  # Asynchronous RL: what a rollout in flight does when the trainer publishes newer parameters
  # (agentjax/agent/feed.py): "off" (ends with the parameters it started with), "continue"
  # (samples the rest with the new ones; tokens tagged with their versions) or "restart". Read
  # only when a feed is given to `run` (train.async_steps >= 1).
  partial: str = "off"

  def __post_init__(self):
    get_protocol(self.protocol)
    if self.partial not in PARTIAL_MODES:
      raise ValueError(f"rollout.partial must be one of {PARTIAL_MODES}, got {self.partial!r}")
    if self.prefill_rows < 0:
      raise ValueError("rollout.prefill_rows must be >= 0 (0: every prompt in one call), got "
                       f"{self.prefill_rows}")
    if isinstance(self.compact_factor, bool) or not isinstance(self.compact_factor, int) or \
        self.compact_factor < 0 or self.compact_factor == 1:
      raise ValueError("rollout.compact_factor must be 0 (never compact) or an int >= 2, got "
                       f"{self.compact_factor!r}")
    if isinstance(self.row_bucket_factor, bool) or not isinstance(self.row_bucket_factor, int) \
        or self.row_bucket_factor < 0 or self.row_bucket_factor == 1:
      raise ValueError("rollout.row_bucket_factor must be 0 (a lane's size) or an int >= 2, got "
                       f"{self.row_bucket_factor!r}")
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


class RolloutEngine:
  """Runs batched multi-turn rollouts of one model against one search backend."""

  def __init__(self, cfg: QwenConfig, tokenizer: Any, backend: SearchBackend,
               config: RolloutConfig, before_turn: TurnHook | None = None,
               mesh: jax.sharding.Mesh | None = None, lora: LoraSpec | None = None,
               guide: TurnGuide | None = None):
    """With a mesh, the decode state is sharded by the rules table (batch over data and fsdp,
    KV heads over tensor) and params are expected on the same mesh. With `lora`, params are a
    LoRA model's (models/lora.attach: its lora_index picks the adapter that generates). With a
    `guide` (agentjax/agent/guide.py), it shapes each turn's generation in either engine."""
    # A thinking budget reads the tokenizer's <think> ids (rollout.max_think_tokens).
    config = dataclasses.replace(config, sampling=with_think_tags(
        config.sampling, tokenizer, "rollout.max_think_tokens"))
    self.cfg, self.tokenizer, self.backend, self.config = cfg, tokenizer, backend, config
    self.mesh = mesh
    self.protocol = get_protocol(config.protocol)
    self.model = Qwen(cfg, lora=lora)
    self.before_turn = before_turn
    self.guide = guide
    self.byte_table = token_byte_table(tokenizer, cfg.vocab_size)
    self.eos_ids = jnp.asarray(eos_token_ids(cfg, tokenizer, chat=config.use_chat_template),
                               jnp.int32)
    self.stop_table = StopTable.build(self.byte_table, self.protocol.stop_strings)
    self.cache_len = cache_size(config.max_total_tokens)
    # The slot engine's prompt cache width: at least this (warm_up sets it to the run's longest
    # prompt, bucketed), so that every chunk of prompts runs the same programs.
    self.prompt_width = 0

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
    with DEVICE_TURN.host_wait():  # an asynchronous run's update may use the devices meanwhile
      return guarded_search(self.backend, queries, topk or self.config.topk)

  # ------------------------------------------------------------------ device calls

  def kv_window(self, end: int | None, cache_len: int) -> int | None:
    """The key window of a call whose rows end at or below slot `end` (None: unknown, the
    whole cache); see RolloutConfig.kv_window_min."""
    return None if end is None else kv_window_size(end, cache_len, self.config.kv_window_min)

  def _feed(self, params, state, rows_ids: Sequence[Sequence[int]], turn: np.ndarray,
            count: bool = False, end: int | None = None, width: int = 0):
    """Feeds each row's ids (possibly none) through one `extend` call, shapes bucketed.
    count: also return the tokens the call computes (rows x bucketed width).
    end: an upper bound of every fed row's length after the feed (host bookkeeping): the call
      then attends over a window of the cache (`kv_window`); None: over all of it.
    width: at least this many tokens a row (one program for calls of different lengths)."""
    lengths = np.array([len(x) for x in rows_ids], np.int32)
    width = max(bucket(int(lengths.max()) if len(lengths) else 1), width)
    block = np.zeros((len(rows_ids), width), np.int32)
    for b, ids in enumerate(rows_ids):
      block[b, :len(ids)] = ids
    state = extend(self.model, params, state, block, lengths, np.asarray(turn, np.int32),
                   **kv_window_arg(self.kv_window(end, state.tokens.shape[1])))
    return (state, block.size) if count else state

  def _generate_turn(self, policy: Any, decoder: tuple[Qwen, Any], state: DecodeState,
                     turn: int, rows: np.ndarray, turn_arr: np.ndarray, stop: tuple,
                     guides: GuideBook, work: dict[str, int], version: int = 0
                     ) -> tuple[DecodeState, dict[int, tuple], int]:
    """Turn `turn`'s generation for the active `rows` (their hook text fed): one `generate` call
    (the ReAct step) or, under a guide, the rounds its plans and verdicts ask for (GuideBook:
    prefixes fed, several samples, retries, the chosen action fed again).

    Args:
      policy: the turn's parameters in the checkpoint layout (for `extend`).
      decoder: (model, params) in the decode layout (for `generate`).
      turn_arr: [B] int32 the turn id recorded for the tokens.
      stop: (StopTable, eos ids, budget) as `generate` takes it.
      work: the rollout's work counts (decode_*, extend_tokens), updated.
      version: the parameters' version, recorded for the sampled tokens.
    Returns:
      (state, row -> TrajectoryBook.action's (ids, reason, context_added, kept, shadow) for
      every row of `rows`, tokens sampled (discarded samples included)).
    """
    n, book, max_new = len(turn_arr), guides.book, self.config.max_new_tokens
    feeds: dict[int, list[int]] = {}
    snap = False
    for b, (ids, snapshot) in zip(rows, guides.begin(turn, rows)):
      if ids:
        feeds[int(b)] = ids
      snap |= snapshot
    actions: dict[int, tuple] = {}
    finals: dict[int, list[int]] = {}  # rows to rewind to their turn's start and feed again
    saved, sampled, todo = None, 0, [int(b) for b in rows]
    while todo:
      if feeds:
        state, fed = self._feed(policy, state, [feeds.get(b, []) for b in range(n)], turn_arr,
                                count=True, end=max(guides.context(b) for b in feeds))
        work["extend_tokens"] += fed
        feeds = {}
      if snap:  # the logits samples of the same context start from (generate donates the state)
        saved, snap = jnp.copy(state.next_logits), False
      active = np.zeros(n, bool)
      active[todo] = True
      starts = [guides.context(b) for b in todo]
      # Each row's context is on the device as the host counts it: its turn ends at most max_new
      # tokens later.
      state, gen = generate(*decoder, state, active, np.asarray(turn_arr, np.int32), stop,
                            self.config.sampling, max_new,
                            **kv_window_arg(self.kv_window(max(starts) + max_new,
                                                           state.tokens.shape[1])),
                            version=np.int32(version))
      new_tokens, num_new, reason = to_host((gen.new_tokens, gen.num_new, gen.stop_reason))
      # The token loop runs until its last active row stops, over every row of the batch.
      steps = int(num_new[todo].max())
      work["decode_steps"] += steps
      work["decode_row_steps"] += steps * n
      work["decode_useful_row_steps"] += int(num_new[todo].sum())
      sampled += int(num_new[todo].sum())
      logprobs = None
      if any(guides.wants_logprobs(b) for b in todo):
        lp = to_host(state.logprobs)
        logprobs = [lp[b, s:s + num_new[b]] for b, s in zip(todo, starts)]
      got = guides.generated(turn, todo, [new_tokens[b, :num_new[b]] for b in todo],
                             [int(reason[b]) for b in todo], logprobs)
      rewinds: dict[int, int] = {}
      restore, todo = False, []
      for step in got:
        if step.action is not None:
          actions[step.row] = step.action
          if step.rewind is not None:
            finals[step.row] = step.feed
          continue
        rewinds[step.row] = step.rewind
        restore |= step.restore
        if step.feed:
          feeds[step.row] = step.feed
        snap |= step.snapshot
        todo.append(step.row)
      if rewinds:
        state = _rewind_rows(state, rewinds, saved if restore else None)
    if finals:
      state = _rewind_rows(state, {b: int(book.length[b]) for b in finals})
      if any(finals.values()):
        state, fed = self._feed(policy, state, [finals.get(b, []) for b in range(n)], turn_arr,
                                count=True,
                                end=max(int(book.length[b]) + len(f) for b, f in finals.items()))
        work["extend_tokens"] += fed
    return state, actions, sampled

  # ------------------------------------------------------------------ the rollout

  def run(self, params: Any, questions: Sequence[str], rng: jax.Array,
          policy_for_turn: Callable[[int], str] | None = None, feed: Any = None,
          version: int = 0) -> tuple[TrajectoryBatch, dict[str, Any]]:
    """Rolls out group_size trajectories per question.

    Args:
      params: model parameters, or a mapping name -> parameters when policy_for_turn is given.
      questions: Q question strings; the batch is B = Q * group_size rows, row b answering
        question b // group_size.
      policy_for_turn: turn -> name of the parameters that generate that turn (and encode its
        observation). Default: the single `params` for every turn.
      feed: newer parameters published while the rollout runs (agentjax/agent/feed.py: its
        current() -> (params, version)); read per rollout.partial ("off": never). One policy
        only.
      version: the version of `params`, recorded for every token they sample
        (TrajectoryBatch.versions).
    Returns:
      (TrajectoryBatch, metrics): floats (seconds per phase, counts; "search_queries" is the
      number of queries sent to the retriever; the decode_* / prefill_tokens / extend_tokens /
      search_wait_s work counts of docs/BENCHMARKS.md rollout_mix) and "search_last_error", the
      last error the retriever gave in this rollout (str), or None when it gave none.

    rollout.engine "slots" (agentjax/agent/slots.py: shared prompt prefill, in-flight slot
    refill, search overlapped with decoding) runs it, "turns" the turn-synchronous engine below;
    both honour before_turn and the guide.
    """
    if self.config.partial == "off":
      feed = None
    if feed is not None and policy_for_turn is not None:
      raise ValueError(f"rollout.partial={self.config.partial!r} takes one policy; this rollout "
                       "has a policy per turn")
    new = newer(feed, version)
    if new is not None:  # published before the prompts are fed: start with them (no restart)
      params, version = new
    restarts = 0
    while True:
      try:
        if self.config.engine == "slots" and len(questions):
          batch, metrics = SlotRollout(self, params, policy_for_turn, feed,
                                       version).run(questions, rng)
        else:
          batch, metrics = self._run_turns(params, questions, rng, policy_for_turn, feed,
                                           version)
        break
      except NewVersion as newest:  # rollout.partial "restart": again, from the prompts
        params, version, restarts = newest.params, newest.version, restarts + 1
    if feed is not None:
      metrics["partial_restarts"] = float(restarts)
    return batch, metrics

  def warm_up(self, params: Any, count: int, prompt_lengths: tuple[int, int], rng: jax.Array,
              policy_for_turn: Callable[[int], str] | None = None) -> None:
    """Compiles, before a run's first step, every program its rollouts of `count` trajectories
    can meet (rollout.warm_up: none after step 1), by running each once on inputs that
    change nothing (SlotRollout.warm_up lists them). prompt_lengths: the (shortest, longest)
    prompt of the run in tokens: every prompt chunk is then prefilled at bucket(longest) (one
    program), and key windows below the shortest are skipped. rng: a key like run's (its type
    and placement are part of the programs). The turn engine ("turns") is not warmed."""
    if self.config.engine != "slots" or count < 1:
      return
    self.prompt_width = max(self.prompt_width, bucket(prompt_lengths[1]))
    SlotRollout(self, params, policy_for_turn).warm_up(count, prompt_lengths[0], rng)

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
                 policy_for_turn: Callable[[int], str] | None = None, feed: Any = None,
                 version: int = 0) -> tuple[TrajectoryBatch, dict[str, Any]]:
    """The turn-synchronous engine (rollout.engine "turns"): every turn decodes the whole batch
    until its last active row stops, then searches, then feeds every observation. A feed is
    read at each turn's start (run)."""
    cfg = self.config
    pick, decoder = self._policies(params, policy_for_turn)
    rows = len(questions) * cfg.group_size
    group_ids = np.repeat(np.arange(len(questions), dtype=np.int32), cfg.group_size)
    prompts, budget = self._prompts(questions)
    book = TrajectoryBook(self, prompts, group_ids, budget)
    guides = GuideBook(self.guide, book)
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
    stop = (self.stop_table, self.eos_ids, np.int32(budget))

    for turn in range(cfg.max_turns):
      progress(f"a rollout's turn {turn}")
      active_rows = np.flatnonzero(~book.done)
      if not len(active_rows):
        break
      turn_arr = np.full(rows, turn, np.int32)
      new = newer(feed, version)
      if new is not None:  # parameters published since: restart, or continue with them
        if cfg.partial == "restart":
          raise NewVersion(*new)
        params, version = new
        pick, decoder = self._policies(params, None)
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
      state, actions, sampled = self._generate_turn(policy, decoder(turn), state, turn,
                                                    active_rows, turn_arr, stop, guides, work,
                                                    version)
      timings["generate_s"] += time.perf_counter() - t0
      sampled_tokens += sampled

      observations: list[list[int]] = [[] for _ in range(rows)]
      searches: list[tuple[int, str]] = []
      for b in active_rows:
        query, observations[b] = book.action(b, *actions[b])
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
                            logprobs=state.logprobs, turn_id=state.turn_id,
                            versions=state.versions))
    metrics = dict(timings, **{k: float(v) for k, v in work.items()},
                   search_wait_s=timings["search_s"],  # the device idles while it searches
                   sampled_tokens=float(sampled_tokens), **book.metrics())
    return batch, metrics


def _rewind_rows(state: DecodeState, rows_to: dict[int, int],
                 logits: jax.Array | None = None) -> DecodeState:
  """Rows in rows_to back to their given length (the others unchanged; sampler.rewind)."""
  lengths = np.full(state.length.shape[0], np.iinfo(np.int32).max, np.int32)
  for b, n in rows_to.items():
    lengths[b] = n
  return rewind(state, lengths, logits)


# TrajectoryBatch, TurnRecord, search_stats and transcripts_of live in
# agentjax/agent/trajectories.py; they are re-exported here for older imports.
__all__ = ["ENGINES", "RolloutConfig", "RolloutEngine", "TrajectoryBatch", "TurnHook",
           "TurnRecord", "encode_text", "observation_ids", "prompt_ids", "search_stats",
           "transcripts_of"]
