"""The slot engine (rollout.engine "slots"): multi-turn rollouts without idle decode rows.

The turn-synchronous engine decodes the whole batch until its slowest row of the turn stops,
keeps finished trajectories in every decode step, prefills each prompt group_size times and
leaves the device idle while the retriever answers. Here instead:

  prefill the Q prompts once, rollout.prefill_rows at a time ─► copy a prompt's cache into a
    free slot (shared prefill)
  lanes of slots take turns on the device; for each lane:
    decode its slots (one lax.while_loop) until a share of them stopped (rollout.refill_fraction)
    ─► host: parse the stopped rows' actions; ONE batched search for the lane, while the other
       lanes' decode calls run on the device (JAX dispatch is asynchronous)
    ─► feed observations (+ the next turn's hook text) into those rows only
    ─► a trajectory that ended is copied out and its slot takes the next waiting trajectory
  Mid-turn rows simply continue in the lane's next call; once the queue is empty, a lane whose
  live slots fit a smaller size of its ladder (full, full / f, full / f^2, ..., 1 for
  f = rollout.compact_factor: `lane_sizes`) moves them into a lane of that size.

Decode and feed calls attend over a window of the cache that covers their rows' live context
(RolloutConfig.kv_window_min): the host's bookkeeping (TrajectoryBook.length: each trajectory's
context when its current turn began, feeds included, + GuideBook.extra: a guide's prefix) bounds
where every row of a call ends, with no read of the device. Programs: lane sizes x window sizes
for decode, row buckets x window sizes for feeds.

Every trajectory of the call is sampled with the same parameters (on-policy per RL step);
a trajectory's tokens are sampled with keys of (rng, trajectory, position)
(sampling.slots.decode_slots), so they do not depend on the slot, the lane or the call that
sampled them. Tokens, masks, log-probs and the host-side records are those of the turn engine
(both keep a TrajectoryBook, agentjax/agent/trajectories.py). The schedule is a deterministic
function of the device results, so every process of a multi-host run makes the same calls.

A guide (RolloutEngine.guide, agentjax/agent/guide.py) is honoured per row: a row's plan is asked
for when it is about to take a turn (with its hook text), its prefix fed with its observation;
when its generation stops, the row's GuideStep is applied in its lane (rewind, feed, generate
again in the lane's next call: the row keeps its slot and its turn) and only a finished turn goes
on to the search. A row's k-th generation of a turn samples with the key of trajectory id
traj + k * (trajectories in the rollout), so its first one keys as an unguided turn and the
others (Best-of-N samples, retries) draw other keys.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.agent.feed import NewVersion, newer
from agentjax.agent.guide import GuideBook, GuideStep
from agentjax.agent.trajectories import TrajectoryBatch, TrajectoryBook, slot_positions
from agentjax.parallel import logical_to_sharding
from agentjax.parallel.host import to_device, to_host
from agentjax.sampling import bucket, init_state, kv_window_arg, kv_window_size
from agentjax.sampling.sampler import RUNNING, rewind
from agentjax.sampling.slots import (copy_rows, decode_slots, empty_trajectories, extend_rows,
                                     init_progress, store_rows, take_rows)
from agentjax import watchdog

# The smallest row count of the row-subset programs (extend_rows, copy_rows, store_rows; their
# ladder: row_bucket), so a rollout compiles a few of them.
MIN_ROWS = 4


def lane_sizes(full: int, factor: int) -> list[int]:
  """Every size a lane of `full` slots takes in a rollout (rollout.compact_factor), largest
  first: full, ceil(full / factor), ceil(full / factor^2), ..., 1; [full] for factor 0 (a lane
  never compacts). Each size is a decode program per key window, and a row gather, scatter and
  store per row bucket: the ladder is what bounds them. A compacted lane computes at most
  `factor` times its live rows (rollout_mix's useful row share measures what that costs)."""
  sizes = [full]
  while factor and sizes[-1] > 1:
    sizes.append(-(-full // factor ** len(sizes)))
  return sizes


def key_windows(least_end: int, cache_len: int, minimum: int) -> list[int | None]:
  """Every key window (sampling.kv_window_size) of calls whose rows end anywhere from
  `least_end` to the whole cache: minimum * 2^k rungs from the one holding least_end, then None
  (the whole cache)."""
  out = []
  window = kv_window_size(least_end, cache_len, minimum)
  while window is not None:
    out.append(window)
    window = kv_window_size(window + 1, cache_len, minimum)
  return out + [None]


def lane_size(n: int, full: int, factor: int) -> int:
  """The smallest of lane_sizes(full, factor) that holds n rows (n <= full)."""
  return min(s for s in lane_sizes(full, factor) if s >= n)


def feed_width(config: Any) -> int:
  """The token width of every feed call of the slot engine: an observation's,
  bucket(rollout.max_obs_tokens); a longer feed goes in parts of it (one program)."""
  return bucket(config.max_obs_tokens)


def row_bucket(n: int, size: int, factor: int) -> int:
  """Rows the row-subset programs (feeds, stores, refills) of a lane of `size` slots run for n
  listed rows (rollout.row_bucket_factor f): the smallest MIN_ROWS * f^k >= n, at most the lane's
  size (not below MIN_ROWS); f = 0: the lane's size (one shape per lane size)."""
  cap = max(size, MIN_ROWS)
  rows = MIN_ROWS
  while factor and rows < n:
    rows *= factor
  return cap if not factor else min(rows, cap)


def row_buckets(size: int, factor: int) -> list[int]:
  """Every row_bucket of a lane of `size` slots."""
  return sorted({row_bucket(k, size, factor) for k in range(1, size + 1)})


@dataclasses.dataclass(frozen=True)
class SlotLadder:
  """Every shape the slot engine's programs take in a rollout of `count` trajectories, from the
  settings alone: what SlotRollout.warm_up runs and `launch/precompile.py` compiles.

    prefill   [chunk, prompt_width] prompts (init_state, extend): 1
    decode    decode_slots per lane size x decode window
    feed      per row bucket of each lane size: a gather and a scatter (lane size x rows),
              _extend_tokens per feed window (rows x window: shared by every lane size), a store;
              with one lane size (`fused`) the gather, feed and scatter are one program per
              row bucket x window
    move      take_rows from each lane size to the next
    refill    copy_rows per row bucket of the full lane (refills happen only there)
  """
  count: int
  chunk: int                         # prompts prefilled at once
  prompt_width: int
  cache_len: int
  feed_tokens: int                   # feed_width(config)
  sizes: tuple[int, ...]             # lane_sizes, full first
  row_factor: int                    # rollout.row_bucket_factor (row_buckets)
  decode_windows: tuple[Any, ...]    # key_windows of decode calls (None: the whole cache)
  feed_windows: tuple[Any, ...]

  @classmethod
  def of(cls, config: Any, count: int, cache_len: int, prompt_width: int,
         shortest_prompt: int) -> "SlotLadder":
    """The ladder of a rollout of `count` trajectories (config: a RolloutConfig) whose prompts
    are prefilled at `prompt_width` and are at least `shortest_prompt` tokens long."""
    questions = max(count // config.group_size, 1)
    slots = min(config.slots or count, count)
    per_lane = math.ceil(slots / min(config.lanes, slots))
    windows = lambda least: tuple(key_windows(least, cache_len, config.kv_window_min))  # noqa
    return cls(count=count, chunk=min(config.prefill_rows or questions, questions),
               prompt_width=max(prompt_width, bucket(shortest_prompt)), cache_len=cache_len,
               feed_tokens=feed_width(config), row_factor=config.row_bucket_factor,
               sizes=tuple(lane_sizes(per_lane, config.compact_factor)),
               decode_windows=windows(shortest_prompt + config.max_new_tokens),
               feed_windows=windows(shortest_prompt + 1))

  def row_buckets(self, size: int) -> list[int]:
    return row_buckets(size, self.row_factor)

  @property
  def fused(self) -> bool:
    """Feeds as one program (extend_rows' fused): a lane of one size has nothing to share its
    feed program with, so the gather and scatter need not be programs of their own."""
    return len(self.sizes) == 1

  def program_counts(self) -> dict[str, int]:
    """Programs by kind (the warm-up's list; a run meets a subset of it)."""
    rows = [self.row_buckets(size) for size in self.sizes]
    every = sorted({r for rs in rows for r in rs})
    moves = 0 if self.fused else sum(map(len, rows))
    return {"prefill": 1, "decode": len(self.sizes) * len(self.decode_windows),
            "feed_extend": len(every) * len(self.feed_windows),
            "feed_gather": moves, "feed_scatter": moves,
            "store": sum(map(len, rows)), "move": len(self.sizes) - 1, "refill": len(rows[0])}


def _padded(values: Sequence[int], size: int, pad: int) -> jax.Array:
  out = np.full(size, pad, np.int32)
  out[:len(values)] = values
  return to_device(out)


def _bucketed(rows: Sequence[int]) -> jax.Array:
  """Row indices padded to a row bucket with the last one repeated (a few gather and scatter
  programs per rollout; a repeated row reads, or writes, the same values)."""
  rows = [int(r) for r in rows]
  return to_device(rows + rows[-1:] * (bucket(len(rows), MIN_ROWS) - len(rows)), np.int32)


class _Lane:
  """A group of decode slots with its own device state; host arrays are [n] over its slots."""

  def __init__(self, index: int, state, progress):
    n = state.length.shape[0]
    self.index, self.state, self.progress = index, state, progress
    self.traj = np.full(n, -1, np.int64)   # trajectory in each slot; -1: free
    self.turn = np.zeros(n, np.int32)      # the turn each slot is generating
    self.starting = np.zeros(n, bool)      # slot begins its turn on its next decode call
    self.feeds: dict[int, list[tuple[list[int], int]]] = {}  # slot -> [(ids, turn)] to feed
    self.finishing: list[int] = []         # slots whose trajectory ends once fed
    self.pending = None                    # (active [n], DecodeCall) dispatched, not collected

  @property
  def size(self) -> int:
    return len(self.traj)

  def live(self) -> np.ndarray:
    return np.flatnonzero(self.traj >= 0)


class SlotRollout:
  """One rollout of the slot engine (RolloutEngine.run makes one when rollout.engine="slots")."""

  def __init__(self, engine: Any, params: Any,
               policy_for_turn: Callable[[int], str] | None = None, feed: Any = None,
               version: int = 0):
    """feed, version: RolloutEngine.run's; the feed is read as each lane settles (before its
    feeds and its next decode call)."""
    self.engine, self.config = engine, engine.config
    self.policy_for_turn = policy_for_turn
    self.feed, self.version = feed, version
    self.pick, self.decoder = engine._policies(params, policy_for_turn)
    # (event, lane, detail) in order: ("refill", lane, [(slot, trajectory)]), ("decode", lane,
    # (active rows, lane size)) at each dispatch, ("collect", lane, tokens sampled), ("search",
    # lane, lanes whose decode call was in flight meanwhile), ("compact", lane, new size).
    self.trace: list[tuple[str, int, Any]] = []
    self.work = collections.Counter(dict.fromkeys(
        ("decode_steps", "decode_row_steps", "decode_useful_row_steps", "prefill_tokens",
         "extend_tokens"), 0))
    self.timings = {"generate_s": 0.0, "search_s": 0.0, "extend_s": 0.0, "search_wait_s": 0.0}

  # ------------------------------------------------------------------ the loop

  def run(self, questions: Sequence[str], rng: jax.Array
          ) -> tuple[TrajectoryBatch, dict[str, Any]]:
    engine, cfg = self.engine, self.config
    group = cfg.group_size
    count = len(questions) * group
    self.group_ids = np.repeat(np.arange(len(questions), dtype=np.int32), group)
    prompts, budget = engine._prompts(questions)
    self.book = TrajectoryBook(engine, prompts, self.group_ids, budget)
    self.guides = GuideBook(engine.guide, self.book)
    self.saved: dict[int, jax.Array] = {}  # trajectory -> its logits where its samples start
    self.snap: set[int] = set()  # trajectories whose logits to save once their feeds are in
    self.stop = (engine.stop_table, engine.eos_ids, np.int32(budget))

    # Shared prefill: each question's prompt once, in a cache just long enough for it, in chunks
    # of rollout.prefill_rows prompts (_load_prompts): the first chunk now, the next when its
    # first trajectory takes a slot.
    self.prompt_ids, self.rng = prompts, rng
    self.chunk = min(cfg.prefill_rows or len(questions), len(questions))
    self.prompt_base = -1  # the first question of the chunk in self.prompts
    self._load_prompts(0)

    slots = min(cfg.slots or count, count)
    lanes = min(cfg.lanes, slots)
    per_lane = self.per_lane = math.ceil(slots / lanes)
    self.fused = len(lane_sizes(per_lane, cfg.compact_factor)) == 1  # as SlotLadder.fused
    self.lanes = [_Lane(i, init_state(engine.cfg, per_lane, engine.cache_len, rng,
                                      mesh=engine.mesh),
                        init_progress(per_lane, engine.stop_table, mesh=engine.mesh))
                  for i in range(lanes)]
    self.out = self._empty_out(count)
    self.queue = collections.deque(range(count))

    for lane in self.lanes:
      self._settle(lane)
      self._dispatch(lane)
    while any(lane.pending is not None for lane in self.lanes):
      for lane in self.lanes:
        if lane.pending is None:
          continue
        self._collect(lane)
        watchdog.progress("a lane's decode call of a rollout")
        self._settle(lane)
        self._dispatch(lane)

    out = self.out
    batch = self.book.batch(dict(tokens=out.tokens, valid=out.valid, sampled=out.sampled,
                                 logprobs=out.logprobs, turn_id=out.turn_id,
                                 versions=out.versions))
    searches = [e for e in self.trace if e[0] == "search"]
    metrics = dict(self.timings, **{k: float(v) for k, v in self.work.items()},
                   sampled_tokens=float(self.work["decode_useful_row_steps"]),
                   search_overlapped=float(np.mean([bool(e[2]) for e in searches]))
                   if searches else 0.0,
                   **self.book.metrics())
    return batch, metrics

  def _empty_out(self, count: int):
    """The finished trajectories' buffer, [count, cache], placed by the rules table."""
    out = empty_trajectories(count, self.engine.cache_len)
    if self.engine.mesh is not None:
      axes = jax.tree.map(lambda _: jax.sharding.PartitionSpec("batch", "length"), out)
      out = jax.device_put(out, logical_to_sharding(axes, out, self.engine.mesh))
    return out

  def warm_up(self, count: int, shortest_prompt: int, rng: jax.Array) -> None:
    """Runs once every program a rollout of `count` trajectories can meet (SlotLadder: what
    bounds each list), on inputs that change nothing (no active row, padding rows only), so
    that a run compiles them before its first step and none after (RolloutEngine.warm_up); then
    the finished trajectories' buffer and the batch's positions (TrajectoryBook.batch). Key
    windows below the shortest prompt's are skipped. A guide's programs (Co-ReAct's rewinds and
    saved logits) are not in the list."""
    engine, cfg = self.engine, self.config
    ladder = SlotLadder.of(cfg, count, engine.cache_len, engine.prompt_width, shortest_prompt)
    chunk, feed = ladder.chunk, ladder.feed_tokens
    state = init_state(engine.cfg, chunk, ladder.prompt_width, rng, mesh=engine.mesh)
    prompts = engine._feed(self.pick(0), state, [[]] * chunk, np.full(chunk, -1),
                           width=ladder.prompt_width)

    sizes = ladder.sizes
    state = init_state(engine.cfg, sizes[0], engine.cache_len, rng, mesh=engine.mesh)
    progress = init_progress(sizes[0], engine.stop_table, mesh=engine.mesh)
    out = self._empty_out(count)
    stop = (engine.stop_table, engine.eos_ids,
            np.int32(min(cfg.max_total_tokens, engine.cache_len)))
    model, params = self.decoder(0)
    for i, size in enumerate(sizes):
      if i:
        state, progress = take_rows(state, progress, _padded([], size, sizes[i - 1]))
      idle, zeros = np.zeros(size, bool), np.zeros(size, np.int32)
      for window in ladder.decode_windows:
        state, progress, _ = decode_slots(
            model, params, state, progress, start=idle, turn=zeros, traj=zeros, active=idle,
            sampling=cfg.sampling, max_new=cfg.max_new_tokens, stop=stop,
            exit_after=np.int32(1), version=np.int32(0), **kv_window_arg(window))
      for rows in ladder.row_buckets(size):
        for window in ladder.feed_windows:
          state = extend_rows(engine.model, self.pick(0), state, _padded([], rows, size),
                              np.zeros((rows, feed), np.int32), np.zeros(rows, np.int32),
                              np.zeros((rows, feed), np.int32), fused=ladder.fused,
                              **kv_window_arg(window))
        out = store_rows(out, _padded([], rows, count), state, _padded([], rows, size))
        if i == 0:
          state = copy_rows(state, _padded([], rows, size), prompts, _padded([], rows, 0))
    jax.block_until_ready(slot_positions(out.valid))

  # ------------------------------------------------------------------ one lane's phases

  def _collect(self, lane: _Lane) -> None:
    """Takes the lane's decode results; ends the turns of the rows that stopped: actions, ONE
    search for the lane (the other lanes decode meanwhile), observations, next-turn hook text."""
    book = self.book
    active, call = lane.pending
    lane.pending = None
    t0 = time.perf_counter()
    steps, sampled, num_new, reason, turn_tokens = to_host(
        (call.steps, call.sampled, call.num_new, call.reason, call.turn_tokens))
    self.timings["generate_s"] += time.perf_counter() - t0
    self.work["decode_steps"] += int(steps)
    self.work["decode_row_steps"] += int(steps) * lane.size
    self.work["decode_useful_row_steps"] += int(sampled)
    self.trace.append(("collect", lane.index, int(sampled)))

    stopped = np.flatnonzero(active & (reason != RUNNING))
    ended = self._guide_steps(lane, stopped, turn_tokens, num_new, reason)
    observations: dict[int, list[int]] = {}
    searches: list[tuple[int, str]] = []
    for slot, action in ended:
      b = int(lane.traj[slot])
      query, observations[b] = book.action(b, *action)
      if query is not None:
        searches.append((b, query))
    if searches:
      in_flight = [other.index for other in self.lanes if other.pending is not None]
      self.trace.append(("search", lane.index, in_flight))
      t0 = time.perf_counter()
      observations.update(book.search(searches))
      elapsed = time.perf_counter() - t0
      self.timings["search_s"] += elapsed
      # The device waited only if every other lane's call had finished by the time the answer
      # came (then for at most `elapsed`: an upper bound).
      if all(other.pending[1].steps.is_ready() for other in self.lanes
             if other.pending is not None):
        self.timings["search_wait_s"] += elapsed

    next_turn: dict[int, list[int]] = collections.defaultdict(list)
    for slot, _ in ended:
      b = int(lane.traj[slot])
      lane.feeds.setdefault(slot, []).append((book.observe(b, observations[b]),
                                              int(lane.turn[slot])))
      if book.done[b]:
        lane.finishing.append(slot)
      else:
        next_turn[int(book.num_turns[b])].append(slot)
    for turn, slots in sorted(next_turn.items()):
      self._begin(lane, turn, slots)

  def _begin(self, lane: _Lane, turn: int, slots: Sequence[int]) -> None:
    """The rows in `slots` take `turn` on their next decode call: their hook text and their
    guide's prefix are queued to be fed."""
    trajs = [int(lane.traj[s]) for s in slots]
    for slot, b, ids, (prefix, snapshot) in zip(slots, trajs, self.book.hook(turn, trajs),
                                                self.guides.begin(turn, trajs)):
      lane.feeds.setdefault(slot, []).extend([(ids, turn), (prefix, turn)])
      lane.turn[slot], lane.starting[slot] = turn, True
      if snapshot:
        self.snap.add(b)

  def _guide_steps(self, lane: _Lane, stopped: np.ndarray, turn_tokens: np.ndarray,
                   num_new: np.ndarray, reason: np.ndarray) -> list[tuple[int, tuple]]:
    """The stopped rows' GuideSteps (a plain turn ends at once): rewinds applied now (one call),
    feeds queued, rows that generate again restarted. Returns the (slot, TrajectoryBook.action's
    arguments) of the rows whose turn ended."""
    guides = self.guides
    trajs = [int(lane.traj[slot]) for slot in stopped]
    starts = [guides.context(b) for b in trajs]
    logprobs: list[np.ndarray | None] = [None] * len(stopped)
    want = [i for i, b in enumerate(trajs) if guides.wants_logprobs(b)]
    if want:
      rows = to_host(lane.state.logprobs[_bucketed(stopped[want])])
      for k, i in enumerate(want):
        logprobs[i] = rows[k, starts[i]:starts[i] + num_new[stopped[i]]]
    by_turn: dict[int, list[int]] = collections.defaultdict(list)
    for i, slot in enumerate(stopped):
      by_turn[int(lane.turn[slot])].append(i)
    steps: list[tuple[int, GuideStep]] = []
    for turn, which in sorted(by_turn.items()):
      got = guides.generated(turn, [trajs[i] for i in which],
                             [turn_tokens[stopped[i], :num_new[stopped[i]]] for i in which],
                             [int(reason[stopped[i]]) for i in which],
                             [logprobs[i] for i in which])
      steps += [(int(stopped[i]), step) for i, step in zip(which, got)]
    steps.sort(key=lambda x: x[0])  # slot order, as the rows stopped
    lengths = np.full(lane.size, np.iinfo(np.int32).max, np.int32)
    restore: list[tuple[int, int]] = []  # (slot, trajectory) back to its saved logits
    ended = []
    for slot, step in steps:
      b = step.row
      if step.rewind is not None:
        lengths[slot] = step.rewind
        if step.restore:
          restore.append((slot, b))
      if step.feed:
        lane.feeds.setdefault(slot, []).append((list(step.feed), int(lane.turn[slot])))
      if step.snapshot:
        self.snap.add(b)
      if step.generate:
        lane.starting[slot] = True
      else:
        self.saved.pop(b, None)
        ended.append((slot, step.action))
    if (lengths < np.iinfo(np.int32).max).any():
      logits = None
      if restore:
        slots = [slot for slot, _ in restore]
        saved = [self.saved[b] for _, b in restore]
        saved += saved[-1:] * (bucket(len(saved), MIN_ROWS) - len(saved))
        logits = lane.state.next_logits.at[_bucketed(slots)].set(jnp.stack(saved))
      lane.state = rewind(lane.state, lengths, logits)
    return ended

  def _settle(self, lane: _Lane) -> None:
    """Before the lane's next decode call: read the feed (parameters published since: restart,
    or continue with them, from this feed on), feed what its rows wait for, copy finished
    trajectories out, refill free slots from the queue, compact the lane at the tail."""
    t0 = time.perf_counter()
    new = newer(self.feed, self.version)
    if new is not None:
      if self.config.partial == "restart":
        raise NewVersion(*new)
      self.version = new[1]
      self.pick, self.decoder = self.engine._policies(new[0], None)
    self._feed(lane)
    if lane.finishing:
      slots = lane.finishing
      size = row_bucket(len(slots), lane.size, self.config.row_bucket_factor)
      self.out = store_rows(self.out, _padded(lane.traj[slots], size, len(self.group_ids)),
                            lane.state, _padded(slots, size, lane.size))
      lane.traj[slots] = -1
      lane.starting[slots] = False
      lane.finishing = []
    free = np.flatnonzero(lane.traj < 0)[:len(self.queue)]
    refilled = len(free)
    while len(free):
      # The queue holds trajectories in order, a question's group_size ones together: those of
      # the chunk in self.prompts first (the next chunk is prefilled once they are all out).
      q = int(self.group_ids[self.queue[0]])
      self._load_prompts(q - q % self.chunk)
      t = self.queue[0]  # the queue is trajectories t, t + 1, ..., count - 1
      n = int(np.sum(self.group_ids[t:t + len(free)] < self.prompt_base + self.chunk))
      here, free = free[:n], free[n:]
      trajs = [self.queue.popleft() for _ in here]
      size = row_bucket(len(here), lane.size, self.config.row_bucket_factor)
      lane.state = copy_rows(lane.state, _padded(here, size, lane.size), self.prompts,
                             _padded(self.group_ids[trajs] - self.prompt_base, size, 0))
      lane.traj[here] = trajs
      self.trace.append(("refill", lane.index, list(zip(here.tolist(), trajs))))
      self._begin(lane, 0, [int(slot) for slot in here])
    if refilled:
      self._feed(lane)
    elif not self.queue:
      self._compact(lane)
    self._snapshot(lane)
    self.timings["extend_s"] += time.perf_counter() - t0

  def _snapshot(self, lane: _Lane) -> None:
    """Saves the logits of the lane's rows whose samples start from their context as now fed
    (a guide's TurnPlan.samples > 1): each later sample starts from them again."""
    if not self.snap:
      return
    slots = [slot for slot in lane.live() if int(lane.traj[slot]) in self.snap]
    if not slots:
      return
    logits = lane.state.next_logits[_bucketed(slots)]
    for k, slot in enumerate(slots):
      b = int(lane.traj[slot])
      self.saved[b] = logits[k]
      self.snap.discard(b)

  def _load_prompts(self, first: int) -> None:
    """Prefills questions [first, first + chunk) into self.prompts, unless they are there: a
    [chunk, bucket(longest prompt of the chunk)] state, the last chunk padded with empty rows
    (one program per width). Only the chunk's caches are held (not every question's: 512
    evidence prompts of 8192 tokens for DAC's generator), and each prompt is prefilled once."""
    if first == self.prompt_base:
      return
    t0 = time.perf_counter()
    ids = self.prompt_ids[first:first + self.chunk]
    ids = list(ids) + [[]] * (self.chunk - len(ids))
    # engine.prompt_width (RolloutEngine.warm_up: the run's longest prompt) keeps every chunk at
    # one width, so one prefill and one copy program per row bucket serve the run.
    width = max(bucket(max(len(p) for p in ids)), self.engine.prompt_width)
    state = init_state(self.engine.cfg, self.chunk, width, self.rng, mesh=self.engine.mesh)
    self.prompts, tokens = self.engine._feed(self.pick(0), state, ids, np.full(self.chunk, -1),
                                             count=True, width=width)
    self.prompt_base = first
    self.work["prefill_tokens"] += tokens
    self.timings["extend_s"] += time.perf_counter() - t0

  def _feed(self, lane: _Lane) -> None:
    """Feeds the lane's pending segments (an observation, the next turn's hook text) into their
    rows only: one extend_rows call (per feed_width part), or with several policies one per
    segment round and policy (the policy of the turn a segment belongs to encodes it, as in the
    turn engine)."""
    feeds, lane.feeds = lane.feeds, {}
    if self.policy_for_turn is None:  # one policy: each row's segments in one call
      rounds = [{s: [seg for seg in segs if seg[0]] for s, segs in feeds.items()}]
    else:
      depth = max((len(segs) for segs in feeds.values()), default=0)
      rounds = []
      for r in range(depth):
        by_policy = collections.defaultdict(dict)
        for s, segs in feeds.items():
          if r < len(segs) and segs[r][0]:
            by_policy[self.policy_for_turn(segs[r][1])][s] = [segs[r]]
        rounds += list(by_policy.values())
    width = feed_width(self.config)
    for group in rounds:
      group = {s: segs for s, segs in group.items() if segs}
      if not group:
        continue
      ids = {s: [x for seg, _ in segs for x in seg] for s, segs in group.items()}
      turn_of = {s: [t for seg, t in segs for _ in seg] for s, segs in group.items()}
      # book.length already counts what is fed (observations and hook text) and guides.extra a
      # guide's prefix: where rows end (after every part below).
      trajs = lane.traj[sorted(group)]
      end = int((self.book.length[trajs] + self.guides.extra[trajs]).max())
      window = self.engine.kv_window(end, lane.state.tokens.shape[1])
      # One feed width (an observation's): a longer feed (hook text, a guide's prefix) goes in
      # parts, each part one call over the rows that still have tokens to feed.
      for offset in range(0, max(len(x) for x in ids.values()), width):
        slots = sorted(s for s in group if len(ids[s]) > offset)
        rows = row_bucket(len(slots), lane.size, self.config.row_bucket_factor)
        tokens = np.zeros((rows, width), np.int32)
        turns = np.zeros((rows, width), np.int32)
        lengths = np.zeros(rows, np.int32)
        for i, s in enumerate(slots):
          part = ids[s][offset:offset + width]
          tokens[i, :len(part)] = part
          turns[i, :len(part)] = turn_of[s][offset:offset + width]
          lengths[i] = len(part)
        lane.state = extend_rows(self.engine.model, self.pick(int(turns[0, 0])), lane.state,
                                 _padded(slots, rows, lane.size), tokens, lengths, turns,
                                 fused=self.fused, **kv_window_arg(window))
        self.work["extend_tokens"] += tokens.size

  def _compact(self, lane: _Lane) -> None:
    """Once no trajectory waits: a lane whose live rows fit a smaller size of its ladder
    (`lane_sizes`) moves them into a lane of that size, so decode steps stop computing rows that
    finished. It goes down the ladder one size at a time (a move per size: the moves a run can
    make are the ladder's consecutive pairs, a few programs, not every pair of sizes)."""
    live = lane.live()
    size = lane_size(max(len(live), 1), self.per_lane, self.config.compact_factor)
    if not len(live) or size >= lane.size:
      return
    rows, current = live, lane.size
    for rung in [s for s in lane_sizes(self.per_lane, self.config.compact_factor)
                 if size <= s < lane.size]:
      # current: padding, a free row; after the first move the live rows are the first ones.
      lane.state, lane.progress = take_rows(lane.state, lane.progress,
                                            _padded(rows, rung, current))
      rows, current = np.arange(len(live)), rung
    keep = lambda a, fill: np.concatenate(  # noqa: E731
        [a[live], np.full(size - len(live), fill, a.dtype)])
    lane.traj, lane.turn = keep(lane.traj, -1), keep(lane.turn, 0)
    lane.starting = keep(lane.starting, False)
    self.trace.append(("compact", lane.index, size))

  def _dispatch(self, lane: _Lane) -> None:
    """Starts the lane's next decode call (asynchronously) over its live slots. With several
    policies, the call decodes the rows of the policy most of them are at (ties: the earliest
    turn's); the others wait for a later call."""
    live = lane.live()
    if not len(live):
      return
    active = np.zeros(lane.size, bool)
    turn = int(lane.turn[live].min())
    if self.policy_for_turn is None:
      active[live] = True
    else:
      names = [self.policy_for_turn(int(t)) for t in lane.turn[live]]
      counts = collections.Counter(names)
      name = max(counts, key=lambda n: (counts[n], -min(
          int(t) for t, m in zip(lane.turn[live], names) if m == n)))
      active[live] = [m == name for m in names]
      turn = int(lane.turn[active].min())
    exit_after = max(1, math.ceil(self.config.refill_fraction * int(active.sum())))
    model, params = self.decoder(turn)
    # A row's book.length is its context when its current turn began (the turn's tokens are
    # counted once it ends; guides.extra: a guide's prefix fed since), so its turn ends at or
    # below that + max_new.
    trajs = lane.traj[active]
    end = int((self.book.length[trajs] + self.guides.extra[trajs]).max()) + \
        self.config.max_new_tokens
    # Sampling keys: trajectory id + (its generations of the turn so far) * trajectories.
    live = np.maximum(lane.traj, 0)
    keys = live + self.guides.draws[live] * len(self.group_ids)
    lane.state, lane.progress, call = decode_slots(
        model, params, lane.state, lane.progress, start=lane.starting & active,
        turn=lane.turn, traj=keys.astype(np.int32), active=active, sampling=self.config.sampling,
        max_new=self.config.max_new_tokens, stop=self.stop, exit_after=np.int32(exit_after),
        version=np.int32(self.version),
        **kv_window_arg(self.engine.kv_window(end, lane.state.tokens.shape[1])))
    lane.starting &= ~active
    lane.pending = (active, call)
    self.trace.append(("decode", lane.index, (int(active.sum()), lane.size)))


__all__ = ["SlotRollout"]
