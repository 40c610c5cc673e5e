"""Device programs of the slot engine (continuous batching): decode slots across calls, feed or
copy a few rows, store finished trajectories, compact the live rows.

The engine (agentjax/agent/slots.py) keeps a fixed set of N decode slots, the rows of one
`DecodeState`. A slot holds one trajectory at a time; when it finishes, its per-slot arrays go
to a `Trajectories` buffer (`store_rows`) and a waiting trajectory takes the slot: its prompt
state is copied in from a state where each prompt was prefilled once (`copy_rows`), and its
observations are fed into its row alone (`extend_rows`). `decode_slots` runs the token loop of
`generate` over all N slots but returns to the host as soon as a given number of rows stopped,
so the host can refill them while the turn of every other row goes on in the next call: the
per-turn progress (tokens sampled so far, the stop-string window, the stop reason) lives on the
device in a `SlotProgress` between calls.

Sampling keys are per trajectory and position (fold_in(fold_in(state.rng, traj), length)): a
trajectory samples the same tokens whichever slot, batch and decode call it runs in.

Shapes: N slots, S cache slots, V vocab, W the stop-string window, K rows of a row-wise call,
T tokens fed per row, M max new tokens per turn.

`decode_slots` and `extend_rows` take a static key window `kv_window` (sampler.kv_window_size;
None: all S slots) so that they read the live context only: the host knows where each row's turn
began.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from agentjax.models.qwen.model import KVCache, Qwen
from agentjax.parallel import logical_to_sharding
from agentjax.parallel.host import to_device
from agentjax.sampling.sample import SamplingParams, sample_token_rows
from agentjax.sampling.sampler import (RUNNING, STOP_BUDGET, STOP_MAX_NEW, DecodeState,
                                       _decode_step, _extend, _stop_rules, decode_layout)
from agentjax.sampling.stops import StopTable


@flax.struct.dataclass
class SlotProgress:
  """Per-slot progress of the turn being generated, on the device across decode calls. [N] slots."""
  traj: jax.Array     # [N] int32 trajectory id in the slot (keys its sampling); -1 free
  turn: jax.Array     # [N] int32 turn id recorded for the sampled tokens
  num_new: jax.Array  # [N] int32 tokens sampled so far in the current turn
  window: jax.Array   # [N, W] uint8 the stop-string window of the current turn
  reason: jax.Array   # [N] int32 STOP_* of the current turn (RUNNING while it goes on)


def init_progress(slots: int, table: StopTable,
                  mesh: jax.sharding.Mesh | None = None) -> SlotProgress:
  """Progress of `slots` free slots: traj -1, turn 0, nothing sampled, reason RUNNING. With a
  mesh, placed by the rules table like init_state's rows (batch over data and fsdp), so that a
  decode call's progress comes back placed as it went in and every call runs one program."""
  # Made on the host and transferred: no program per slot count.
  progress = SlotProgress(
      traj=to_device(np.full((slots,), -1, np.int32)), turn=to_device(np.zeros(slots, np.int32)),
      num_new=to_device(np.zeros(slots, np.int32)),
      window=to_device(np.zeros((slots, table.window_size), np.uint8)),
      reason=to_device(np.full((slots,), RUNNING, np.int32)))
  if mesh is None:
    return progress
  axes = SlotProgress(traj=P("batch"), turn=P("batch"), num_new=P("batch"),
                      window=P("batch", None), reason=P("batch"))
  return jax.device_put(progress, logical_to_sharding(axes, progress, mesh))


@flax.struct.dataclass
class DecodeCall:
  """What `decode_slots` reports (small: the host reads all of it)."""
  steps: jax.Array        # scalar int32 loop iterations
  sampled: jax.Array      # scalar int32 tokens sampled in this call (useful row-steps)
  num_new: jax.Array      # [N] int32 (= progress.num_new after the call)
  reason: jax.Array       # [N] int32 (= progress.reason after the call)
  turn_tokens: jax.Array  # [N, M] int32 each active row's tokens of its current turn (row b: the
                          #   first num_new[b], from this call and the earlier ones; 0 after).
                          #   Rows not active in this call: all 0.


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_new", "kv_window"),
                   donate_argnums=(2, 3))
def decode_slots(model: Qwen, params, state: DecodeState, progress: SlotProgress,
                 start: jax.Array, turn: jax.Array, traj: jax.Array, active: jax.Array,
                 sampling: SamplingParams, max_new: int,
                 stop: tuple[StopTable, jax.Array, jax.Array],
                 exit_after: jax.Array,
                 kv_window: int | None = None, version: jax.Array | int = 0
                 ) -> tuple[DecodeState, SlotProgress, DecodeCall]:
  """Decodes the active slots until they all stopped or `exit_after` of them stopped.

  On a mesh, give it a progress placed like the state's rows (init_progress(mesh=...)).

  The step is `generate`'s (the same model step, stop rules and reasons, vocab-major logits),
  with two differences: a turn may span several calls (max_new counts the tokens of the turn,
  progress.num_new, and the stop-string window carries over), and row b samples with the key
  fold_in(fold_in(state.rng, traj[b]), state.length[b]) (state.rng is never split).

  Args:
    model, params: the checkpoint layout, or what `decode_layout` made of it.
    state: [N] rows (donated). Its next_logits are each row's logits after its last token, and
      are again after the call.
    progress: [N] the slots' turn progress (donated).
    start: [N] bool rows that begin a turn now: num_new 0, empty window, reason RUNNING,
      progress.turn := turn, progress.traj := traj.
    turn, traj: [N] int32, read where start.
    active: [N] bool rows that decode in this call; only rows whose turn is running (reason
      RUNNING) or starts are taken. The others are untouched (state rows and progress).
    sampling, max_new: static sampling settings and the per-turn token limit.
    stop: (StopTable, eos_ids [E] int32, budget: scalar int32 max slots a row may fill).
    exit_after: scalar int32: return once this many active rows stopped in this call (a row
      already at its budget or at max_new stops at once and counts).
    kv_window: static key window (sampler.kv_window_size; None: all S slots). Every active row
      must end at or below it: its length when its turn began + max_new (a turn never exceeds
      max_new tokens), or its budget.
    version: int32 scalar recorded in state.versions for the tokens sampled (generate's).
  Returns:
    (state, progress, DecodeCall).
  """
  table, eos_ids, budget = stop
  model, params = decode_layout(model, params)
  n, s = state.tokens.shape
  budget = jnp.minimum(budget, s)
  progress = SlotProgress(
      traj=jnp.where(start, traj, progress.traj), turn=jnp.where(start, turn, progress.turn),
      num_new=jnp.where(start, 0, progress.num_new),
      window=jnp.where(start[:, None], jnp.zeros_like(progress.window), progress.window),
      reason=jnp.where(start, RUNNING, progress.reason))
  active = active & (progress.reason == RUNNING)
  reason0 = jnp.select([state.length >= budget, progress.num_new >= max_new],
                       [STOP_BUDGET, STOP_MAX_NEW], RUNNING)
  progress = progress.replace(reason=jnp.where(active, reason0, progress.reason))
  running = active & (reason0 == RUNNING)
  stopped = jnp.sum(active & ~running, dtype=jnp.int32)
  # The trajectory part of the keys is fixed for the call: folded in once, outside the loop.
  row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(state.rng, progress.traj)
  turn_ids = progress.turn
  length0 = state.length

  def cond(carry):
    _, _, running, stopped, _, _ = carry
    return jnp.any(running) & (stopped < exit_after)

  # As in generate, the next-token logits stay vocab-major [V, N] inside the loop.
  def body(carry):
    state, progress, running, stopped, steps, logits_vb = carry
    keys = jax.vmap(jax.random.fold_in)(row_keys, state.length)
    tok, logp = sample_token_rows(keys, logits_vb, sampling, vocab_major=True,
                                  context=(state.tokens, state.valid))
    state, logits_vb = _decode_step(model, params, state, logits_vb, tok, logp, running,
                                    turn_ids, None, kv_window, version)
    num_new = progress.num_new + running
    window, why = _stop_rules(table, eos_ids, budget, max_new, progress.window, tok,
                              state.length, num_new)
    progress = progress.replace(
        num_new=num_new, window=jnp.where(running[:, None], window, progress.window),
        reason=jnp.where(running, why, progress.reason))
    stop_now = running & (why != RUNNING)
    return (state, progress, running & ~stop_now, stopped + jnp.sum(stop_now, dtype=jnp.int32),
            steps + 1, logits_vb)

  carry = (state, progress, running, stopped, jnp.int32(0), state.next_logits.T)
  state, progress, _, _, steps, logits_vb = jax.lax.while_loop(cond, body, carry)
  state = state.replace(next_logits=logits_vb.T)
  # The turn's tokens are the last num_new slots of the row (a turn is never interleaved with
  # fed tokens): one gather per call instead of a [N, M] carry written every step.
  offsets = jnp.arange(max_new, dtype=jnp.int32)[None]
  first = state.length - progress.num_new
  turn_tokens = jnp.take_along_axis(state.tokens, first[:, None] + offsets, axis=1, mode="fill",
                                    fill_value=0)
  turn_tokens = jnp.where(active[:, None] & (offsets < progress.num_new[:, None]), turn_tokens, 0)
  return state, progress, DecodeCall(
      steps=steps, sampled=jnp.sum(state.length - length0, dtype=jnp.int32),
      num_new=progress.num_new, reason=progress.reason, turn_tokens=turn_tokens)


def _take(x: jax.Array, rows: jax.Array) -> jax.Array:
  """x[rows] along axis 0; out-of-range rows (padding) read the last row (clipped)."""
  return jnp.take(x, rows, axis=0, mode="clip")


def _put(x: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
  """x[rows] := values along axis 0; out-of-range rows (padding) are dropped."""
  return x.at[rows].set(values, mode="drop")


def extend_rows(model: Qwen, params, state: DecodeState, rows: jax.Array, tokens: jax.Array,
                lengths: jax.Array, turn: jax.Array, kv_window: int | None = None,
                fused: bool = False) -> DecodeState:
  """`extend` of K listed rows only: the model runs on K x T tokens, not N x T.

  Three programs: gather the K rows, extend them (the model's program: its shapes are K and T
  only, so lanes of every size share it), scatter them back; fused: one program doing all
  three (_extend_rows_fused: per N, K and window; fewer programs where lanes have one size).

  Args:
    state: [N] rows (donated).
    rows: [K] int32 distinct row ids; rows[k] == N (out of range) is padding: nothing written.
    tokens: [K, T] int32, row rows[k] is fed the first lengths[k] of tokens[k].
    lengths: [K] int32 (clipped to the room left in the row's cache).
    turn: [K, T] int32 turn id recorded for each token.
    kv_window: static key window (sampler.kv_window_size; None: all S slots); every listed row
      must end at or below it after the feed.
  """
  if fused:
    return _extend_rows_fused(model, params, state, rows, tokens, lengths, turn,
                              kv_window=kv_window)
  sub = _extend_tokens(model, params, _gather_rows(state, rows), tokens, lengths, turn,
                       kv_window=kv_window)
  return _scatter_rows(state, rows, sub)


@jax.jit
def _gather_rows(state: DecodeState, rows: jax.Array) -> DecodeState:
  """The K listed rows of a state (padding rows read a copy of the last row); its rng kept."""
  return jax.tree.map(lambda x: _take(x, rows), state.replace(rng=None)).replace(rng=state.rng)


@functools.partial(jax.jit, donate_argnums=0)
def _scatter_rows(state: DecodeState, rows: jax.Array, sub: DecodeState) -> DecodeState:
  """state rows[k] := sub row k (padding rows dropped); state's rng kept."""
  return jax.tree.map(lambda x, y: _put(x, rows, y), state.replace(rng=None),
                      sub.replace(rng=None)).replace(rng=state.rng)


@functools.partial(jax.jit, static_argnames=("model", "kv_window"), donate_argnums=2)
def _extend_rows_fused(model: Qwen, params, state: DecodeState, rows: jax.Array,
                       tokens: jax.Array, lengths: jax.Array, turn: jax.Array,
                       kv_window: int | None = None) -> DecodeState:
  """extend_rows' gather, feed and scatter in one program (the jitted functions it calls are
  traced into it: no program of their own)."""
  sub = _extend(model, params, _gather_rows(state, rows), tokens, lengths, turn, None, kv_window)
  return _scatter_rows(state, rows, sub)


@functools.partial(jax.jit, static_argnames=("model", "kv_window"), donate_argnums=2)
def _extend_tokens(model: Qwen, params, state: DecodeState, tokens: jax.Array,
                   lengths: jax.Array, turn: jax.Array,
                   kv_window: int | None = None) -> DecodeState:
  """`extend` with a turn id per token ([B, T])."""
  return _extend(model, params, state, tokens, lengths, turn, None, kv_window)


@functools.partial(jax.jit, donate_argnums=0)
def copy_rows(dst: DecodeState, dst_rows: jax.Array, src: DecodeState,
              src_rows: jax.Array) -> DecodeState:
  """dst row dst_rows[k] := src row src_rows[k] (a prompt prefilled once, copied into each of
  its group's slots).

  src's cache length P must be <= dst's S: the first P cache slots of the row are copied (the
  rest are unreachable: their `valid` is False), the per-slot arrays are src's padded to S with
  the empty values (tokens 0, valid / sampled False, logprobs 0, turn_id and versions -1); length and
  next_logits are copied; dst's rng is kept.

  Args:
    dst: [N] rows (donated).
    dst_rows: [K] int32; dst_rows[k] == N (out of range) is padding: dropped.
    src: [Q] rows; src_rows: [K] int32 in [0, Q).
  """
  p, s = src.tokens.shape[1], dst.tokens.shape[1]
  if p > s:
    raise ValueError(f"copy_rows: the source cache length {p} exceeds the destination's {s}")

  def cache(d, x, axis):  # d[dst_rows, ..., :P, ...] := x[src_rows] (slots on `axis`)
    index = (dst_rows,) + (slice(None),) * (axis - 1) + (slice(0, p),)
    return d.at[index].set(_take(x, src_rows), mode="drop")

  def slots(d, x, empty):
    x = jnp.pad(_take(x, src_rows), ((0, 0), (0, s - p)), constant_values=empty)
    return _put(d, dst_rows, x)

  return dst.replace(
      cache=KVCache(keys=tuple(cache(d, x, 3) for d, x in zip(dst.cache.keys, src.cache.keys)),
                    values=tuple(cache(d, x, 2)
                                 for d, x in zip(dst.cache.values, src.cache.values))),
      tokens=slots(dst.tokens, src.tokens, 0), valid=slots(dst.valid, src.valid, False),
      sampled=slots(dst.sampled, src.sampled, False),
      logprobs=slots(dst.logprobs, src.logprobs, 0.0),
      turn_id=slots(dst.turn_id, src.turn_id, -1),
      versions=slots(dst.versions, src.versions, -1),
      length=_put(dst.length, dst_rows, _take(src.length, src_rows)),
      next_logits=_put(dst.next_logits, dst_rows, _take(src.next_logits, src_rows)))


@flax.struct.dataclass
class Trajectories:
  """The finished trajectories' per-slot arrays, [T, S] (T trajectories, S cache slots)."""
  tokens: jax.Array    # [T, S] int32
  valid: jax.Array     # [T, S] bool
  sampled: jax.Array   # [T, S] bool
  logprobs: jax.Array  # [T, S] float32
  turn_id: jax.Array   # [T, S] int32
  versions: jax.Array  # [T, S] int32


@functools.partial(jax.jit, static_argnums=(0, 1))
def empty_trajectories(count: int, cache_len: int) -> Trajectories:
  """`count` empty trajectories of `cache_len` slots (the empty values of a DecodeState)."""
  shape = (count, cache_len)
  return Trajectories(tokens=jnp.zeros(shape, jnp.int32), valid=jnp.zeros(shape, bool),
                      sampled=jnp.zeros(shape, bool), logprobs=jnp.zeros(shape, jnp.float32),
                      turn_id=jnp.full(shape, -1, jnp.int32),
                      versions=jnp.full(shape, -1, jnp.int32))


@functools.partial(jax.jit, donate_argnums=0)
def store_rows(out: Trajectories, traj: jax.Array, state: DecodeState,
               rows: jax.Array) -> Trajectories:
  """out[traj[k]] := state row rows[k] (its per-slot arrays).

  Args:
    out: [T, S] (donated).
    traj: [K] int32 trajectory ids; traj[k] == T (out of range) is padding: dropped.
    state: [N, S] rows; rows: [K] int32 in [0, N).
  """
  if state.tokens.shape[1] != out.tokens.shape[1]:
    raise ValueError(f"store_rows: the state's cache length {state.tokens.shape[1]} differs "
                     f"from the trajectories' {out.tokens.shape[1]}")
  return jax.tree.map(lambda o, x: _put(o, traj, _take(x, rows)), out,
                      Trajectories(tokens=state.tokens, valid=state.valid, sampled=state.sampled,
                                   logprobs=state.logprobs, turn_id=state.turn_id,
                                   versions=state.versions))


@jax.jit
def take_rows(state: DecodeState, progress: SlotProgress,
              rows: jax.Array) -> tuple[DecodeState, SlotProgress]:
  """A K-row state and progress made of the listed rows (tail compaction of the live slots).

  Args:
    rows: [K] int32. rows[k] == N (out of range) makes a free row: its progress as
      init_progress's (traj -1, turn 0, num_new 0, empty window, RUNNING); its state is a copy of
      row N - 1, which a free slot never reads (a refill overwrites it whole).
  Returns:
    (state [K], progress [K]); the state keeps its rng.
  """
  n = state.tokens.shape[0]
  taken = jax.tree.map(lambda x: _take(x, rows), state.replace(rng=None)).replace(rng=state.rng)
  free = rows >= n
  part = jax.tree.map(lambda x: _take(x, rows), progress)
  part = SlotProgress(traj=jnp.where(free, -1, part.traj), turn=jnp.where(free, 0, part.turn),
                      num_new=jnp.where(free, 0, part.num_new),
                      window=jnp.where(free[:, None], jnp.zeros_like(part.window), part.window),
                      reason=jnp.where(free, RUNNING, part.reason))
  return taken, part
