"""KV-cache sampling: feed tokens (`extend`) and generate until a stop (`generate`).

All state lives on the device in a `DecodeState` between calls. Each row owns a contiguous run of
cache slots starting at 0, so a token's slot is also its position id and its index in the
trajectory; rows advance independently (`length` [B] is each row's next free slot). Prompts,
observations and injected text are fed with `extend` (one forward pass over the new tokens only:
the earlier context is never re-run); `generate` runs a `lax.while_loop` of one-token decode steps.

Writes beyond a row's budget are dropped (scatter mode="drop"), never clamped onto live slots.
Shapes: B batch, S cache slots, V vocab, T tokens fed in one call, N max new tokens.

A `SharedPrefix` (the cache of a prompt prefix common to every row, prefilled once in one row)
may be passed to `extend` and `generate`: each row then attends to the prefix's visible slots
before its own, and its own slot j holds position prefix.length + j (the state's per-slot
arrays cover the row's own tokens only). Without one, the programs are exactly the plain ones.

Key windows: since every row owns slots [0, length), a call whose rows end below W (after the
tokens it adds) needs only the first W cache slots as attention keys. `extend` and `generate`
take a static `kv_window` (Qwen's) that the host picks per call with `kv_window_size`, from a
ladder of powers of two, so a decode step reads the live context rather than the whole budget
with a handful of programs. kv_window None (the default) reads every slot: today's programs.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from agentjax.models import masks
from agentjax.models.lora import merge_selected
from agentjax.models.qwen.model import KVCache, Qwen, out_major_params
from agentjax.sampling.sample import SamplingParams, sample_token
from agentjax.parallel import logical_to_sharding
from agentjax.sampling.stops import StopTable, push_and_match

# Why a row stopped generating.
RUNNING, STOP_EOS, STOP_STRING, STOP_MAX_NEW, STOP_BUDGET = 0, 1, 2, 3, 4
STOP_REASONS = {RUNNING: "running", STOP_EOS: "eos", STOP_STRING: "stop_string",
                STOP_MAX_NEW: "max_new_tokens", STOP_BUDGET: "budget"}


# The smallest key window `kv_window_size` picks: below it a window saves little next to the
# per-step cost of the weights, and each rung of the ladder is one more program.
KV_WINDOW_MIN = 256


def bucket(n: int, minimum: int = 16) -> int:
  """Smallest power of two >= max(n, minimum): shapes from a few buckets compile a few programs."""
  size = minimum
  while size < n:
    size *= 2
  return size


# KV caches longer than this are a multiple of it (cache_size), not a power of two.
CACHE_MULTIPLE = 512


def cache_size(budget: int) -> int:
  """KV-cache slots for a budget of `budget` tokens: bucket(budget) up to CACHE_MULTIPLE, then
  the next multiple of CACHE_MULTIPLE. A 10240-token budget gets 10240 slots, not the 16384 a
  power of two would (60 % more KV memory and more keys read by every full-cache call); one
  budget is one shape, so this costs no programs. Attention blocks (512) divide it."""
  if budget <= CACHE_MULTIPLE:
    return bucket(budget)
  return -(-budget // CACHE_MULTIPLE) * CACHE_MULTIPLE


def kv_window_size(need: int, cache_len: int, minimum: int = KV_WINDOW_MIN) -> int | None:
  """The key window of a call whose rows all end at or below slot `need` (after the tokens the
  call adds: for `generate`, max(length) + max_new; for `extend`, max(length + fed)).

  The smallest of minimum * 2^k >= need; None (every slot: the plain program) when that reaches
  cache_len or minimum <= 0 (windows off). From 256 to an 8192-slot cache: 6 sizes.
  """
  if minimum <= 0:
    return None
  size = minimum
  while size < need:
    size *= 2
  return size if size < cache_len else None


def kv_window_arg(kv_window: int | None) -> dict:
  """The keyword arguments that pass `kv_window` to extend / generate / decode_slots /
  extend_rows: none for None, so that a call without a window runs the very program of callers
  that never name it (jit keys an explicit kv_window=None apart from an omitted one: a second
  compile of the same program)."""
  return {} if kv_window is None else {"kv_window": kv_window}


@flax.struct.dataclass
class DecodeState:
  cache: KVCache
  tokens: jax.Array       # [B, S] int32 token in each slot
  valid: jax.Array        # [B, S] bool  slot holds a real token (attention keys)
  sampled: jax.Array      # [B, S] bool  token was sampled by the policy (the RL loss mask)
  logprobs: jax.Array     # [B, S] float32 temperature-1 log-prob of sampled tokens, 0 elsewhere
  turn_id: jax.Array      # [B, S] int32 turn a token belongs to; -1 for the prompt
  versions: jax.Array     # [B, S] int32 version of the parameters that sampled each sampled
                          #   token (generate's `version`; asynchronous RL); -1 elsewhere
  length: jax.Array       # [B] int32 next free slot of each row
  next_logits: jax.Array  # [B, V] float32 logits after each row's last token
  rng: jax.Array


@flax.struct.dataclass
class SharedPrefix:
  """A prompt prefix shared by every row of a state: its batch-1 KVCache (keys [1, N, D, P],
  values [1, N, P, D]) and the number of its slots in use (scalar int32; the slots past it are
  not attended, so P may be a bucket)."""
  cache: KVCache
  length: jax.Array

  def attention_args(self) -> dict:
    """The prefix arguments of Qwen.__call__."""
    visible = jnp.arange(self.cache.length, dtype=jnp.int32) < self.length
    return {"prefix": self.cache, "prefix_mask": visible}


def shared_prefix(state: DecodeState) -> SharedPrefix:
  """The prefix fed into a one-row state (its first state.length[0] slots), for other states."""
  if state.length.shape != (1,):
    raise ValueError(
        f"a shared prefix comes from a one-row state, got {state.length.shape[0]} rows")
  return SharedPrefix(cache=state.cache, length=state.length[0])


def state_logical_axes(state: DecodeState) -> DecodeState:
  """Logical axis names of every DecodeState field (the rules table maps them to the mesh)."""
  per_token = P("batch", "length")
  return DecodeState(cache=state.cache.logical_axes(), tokens=per_token, valid=per_token,
                     sampled=per_token, logprobs=per_token, turn_id=per_token,
                     versions=per_token, length=P("batch"), next_logits=P("batch", "vocab"), rng=P())


def init_state(cfg, batch: int, cache_len: int, rng: jax.Array,
               mesh: jax.sharding.Mesh | None = None) -> DecodeState:
  """An empty state; with a mesh, placed by the rules table (batch over data and fsdp).

  One program per shape and mesh, which writes the state where it goes (made eagerly, each
  zeros / full was a program of its own, and the whole cache sat on one device before its
  placement). The state holds a copy of `rng`: extend/generate donate the state, and the
  caller's key must survive that.
  """
  key = (cfg, batch, cache_len, mesh)
  if key not in _STATE_PROGRAMS:
    make = functools.partial(_empty_state, cfg, batch, cache_len)
    shardings = None
    if mesh is not None:
      abstract = jax.eval_shape(make, rng)
      shardings = logical_to_sharding(state_logical_axes(abstract), abstract, mesh)
    _STATE_PROGRAMS[key] = jax.jit(make, out_shardings=shardings)
  if mesh is not None:  # a transfer: the key may sit on one device of the mesh
    rng = jax.device_put(rng, jax.sharding.NamedSharding(mesh, P()))
  return _STATE_PROGRAMS[key](rng)


# (cfg, batch, cache_len, mesh) -> the jitted maker of such states.
_STATE_PROGRAMS: dict = {}


def _empty_state(cfg, batch: int, cache_len: int, rng: jax.Array) -> DecodeState:
  shape = (batch, cache_len)
  return DecodeState(
      cache=KVCache.zeros(cfg, batch, cache_len),
      tokens=jnp.zeros(shape, jnp.int32), valid=jnp.zeros(shape, bool),
      sampled=jnp.zeros(shape, bool), logprobs=jnp.zeros(shape, jnp.float32),
      turn_id=jnp.full(shape, -1, jnp.int32), versions=jnp.full(shape, -1, jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      next_logits=jnp.zeros((batch, cfg.vocab_size), jnp.float32), rng=jax.random.clone(rng))


def _set_rows(buffer: jax.Array, slots: jax.Array, values) -> jax.Array:
  """buffer[b, slots[b, j]] = values[b, j]; out-of-range slots are dropped."""
  rows = jnp.arange(buffer.shape[0])[:, None]
  return buffer.at[rows, slots].set(values, mode="drop")


def _positions(slots: jax.Array, prefix: SharedPrefix | None) -> tuple[jax.Array, dict]:
  """Position ids of own slots [B, T] and the model's prefix arguments."""
  if prefix is None:
    return slots, {}
  return slots + prefix.length, prefix.attention_args()


@functools.partial(jax.jit, static_argnames=("model", "kv_window"), donate_argnums=2)
def extend(model: Qwen, params, state: DecodeState, tokens: jax.Array, lengths: jax.Array,
           turn: jax.Array, prefix: SharedPrefix | None = None,
           kv_window: int | None = None) -> DecodeState:
  """Feeds context tokens (prompt, observation, injected text) into the cache; nothing is sampled.

  Args:
    tokens: [B, T] int32, row b's first lengths[b] entries are fed (the rest is padding).
    lengths: [B] int32, may be 0 (the row is untouched); clipped to the room left in the cache.
    turn: [B] int32 turn id recorded for these tokens.
    prefix: optional SharedPrefix every row's tokens follow (see the module docstring).
    kv_window: static; attend over the first kv_window own cache slots only (`kv_window_size`):
      every row fed here must end at or below it (length + lengths <= kv_window). None: all S.
  """
  return _extend(model, params, state, tokens, lengths,
                 jnp.broadcast_to(turn[:, None], tokens.shape), prefix, kv_window)


def _extend(model: Qwen, params, state: DecodeState, tokens: jax.Array, lengths: jax.Array,
            turn_tokens: jax.Array, prefix: SharedPrefix | None,
            kv_window: int | None = None) -> DecodeState:
  """`extend`'s body (traced inside a caller's jit), with a turn id per token.

  Args:
    tokens, lengths, kv_window: as `extend`. With a window the attention scores are
      [B, N, T*G, kv_window] instead of [B, N, T*G, S]; rows not fed (lengths 0) may lie past it:
      their queries' outputs are discarded.
    turn_tokens: [B, T] int32 turn id recorded for each fed token.
  """
  b, s = state.tokens.shape
  lengths = jnp.minimum(lengths, s - state.length)
  offsets = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  slots = state.length[:, None] + offsets                                   # [B, T]
  write = jnp.where(offsets < lengths[:, None], slots, s)                   # s: dropped
  valid = _set_rows(state.valid, write, True)
  positions, shared = _positions(slots, prefix)
  hidden, cache = model.apply({"params": params}, tokens, positions,
                              masks.cache_mask(valid, slots), cache=state.cache,
                              cache_index=state.length, return_hidden=True, kv_window=kv_window,
                              **shared)
  last = hidden[jnp.arange(b), jnp.maximum(lengths - 1, 0)]                 # [B, E]
  logits = model.apply({"params": params}, last, method=Qwen.logits)       # [B, V] only
  return state.replace(
      cache=cache, tokens=_set_rows(state.tokens, write, tokens), valid=valid,
      turn_id=_set_rows(state.turn_id, write, turn_tokens),
      length=state.length + lengths,
      next_logits=jnp.where((lengths > 0)[:, None], logits, state.next_logits))


@functools.partial(jax.jit, donate_argnums=0)
def rewind(state: DecodeState, lengths: jax.Array,
           next_logits: jax.Array | None = None) -> DecodeState:
  """Moves rows back to an earlier length: their tokens from slot lengths[b] on are forgotten.

  Slots >= the new length are cleared (tokens 0, valid / sampled False, logprobs 0, turn_id and
  versions -1);
  their KV entries stay in the cache but are unreachable (attention masks read `valid`), and the
  next `extend` / `generate` overwrites them slot by slot. A row whose lengths[b] is not below
  its current length is left as it is (rewinding never moves forward).

  Args:
    lengths: [B] int32 target lengths.
    next_logits: optional [B, V] logits after each row's token at slot lengths[b] - 1 (a copy
      saved when the row was at that length; `generate` / `extend` donate the state, so save it
      with jnp.copy). Rows that move back take them. Without it those rows keep the logits of
      their old last token: feed tokens before generating from them (an `extend` sets them).
  """
  lengths = jnp.minimum(lengths.astype(jnp.int32), state.length)
  moved = lengths < state.length
  keep = jnp.arange(state.tokens.shape[1], dtype=jnp.int32)[None] < lengths[:, None]  # [B, S]
  logits = state.next_logits if next_logits is None else \
      jnp.where(moved[:, None], next_logits, state.next_logits)
  return state.replace(
      tokens=jnp.where(keep, state.tokens, 0), valid=state.valid & keep,
      sampled=state.sampled & keep, logprobs=jnp.where(keep, state.logprobs, 0.0),
      turn_id=jnp.where(keep, state.turn_id, -1), versions=jnp.where(keep, state.versions, -1),
      length=lengths, next_logits=logits)


@flax.struct.dataclass
class Generation:
  new_tokens: jax.Array   # [B, N] int32 tokens sampled in this call (row b: first num_new[b])
  num_new: jax.Array      # [B] int32
  stop_reason: jax.Array  # [B] int32, one of STOP_* (RUNNING for rows that were not active)


def decode_layout(model: Qwen, params) -> tuple[Qwen, object]:
  """The model and parameters `generate`'s token loop runs with.

  On CPU, out-major projection kernels: a decode step multiplies B rows by every kernel, which
  XLA:CPU does ~1.5x faster with the kernel [out, in] (docs/BENCHMARKS.md, decode). The copy costs
  one pass over the projection kernels and their size in memory (the embedding and norms are
  shared, not copied). `generate` makes it once per call, outside its loop; a caller that
  generates several times with the same parameters (the turns of a rollout) calls this once and
  passes the result, which `generate` then uses as it is. GPU and TPU matmuls take either layout
  at the same speed, so there the checkpoint layout is kept.

  A LoRA model (model.lora) whose decode mode is "merge" (LoraSpec.decode_mode: "auto" merges on
  CPU with float32 kernels) gets its selected adapter folded into a copy of the kernels
  (models/lora.merge_selected) and then runs the bare model's program: the token loop reads
  exactly the bare model's weights. "unmerged" keeps the adapters beside the kernels (a low-rank
  product per projection per step, no copy of the kernels on GPU/TPU).

  Parameters stored in a wider dtype than the compute dtype (float32 master weights, bfloat16
  compute) are cast once to the compute dtype: every use in the model casts them to it anyway,
  so the tokens are the same, and a memory-bound decode step then reads half the bytes (and an
  FSDP gather of the weights is half the size).
  """
  if model.out_major:
    return model, params
  if model.lora is not None and model.lora.decode_mode(
      jax.default_backend(), model.cfg.param_dtype) == "merge":
    params = merge_selected(params, model.lora.scale)
    model = Qwen(model.cfg)
  if model.cfg.param_dtype != model.cfg.dtype:
    params = compute_dtype_params(params, model.cfg.dtype)
  if jax.default_backend() != "cpu":
    return model, params
  return Qwen(model.cfg, out_major=True, lora=model.lora), out_major_params(params)


@functools.partial(jax.jit, static_argnums=1)
def _cast_floats(params, dtype: str):
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      params)


def compute_dtype_params(params, dtype: str):
  """params with every floating leaf in `dtype` (integer leaves, e.g. LoRA's index, as they
  are); leaves already in it are passed through. Outside jit: one program, shardings kept."""
  leaves = jax.tree.leaves(params)
  if all(not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.dtype(dtype)
         for x in leaves):
    return params
  return _cast_floats(params, dtype)


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_new", "kv_window"),
                   donate_argnums=2)
def generate(model: Qwen, params, state: DecodeState, active: jax.Array, turn: jax.Array,
             stop: tuple[StopTable, jax.Array, jax.Array], sampling: SamplingParams,
             max_new: int, prefix: SharedPrefix | None = None,
             kv_window: int | None = None, version: jax.Array | int = 0
             ) -> tuple[DecodeState, Generation]:
  """Samples up to max_new tokens per active row, each row stopping on its own.

  Args:
    model, params: the checkpoint layout, or what `decode_layout` made of it.
    active: [B] bool rows that generate in this call.
    turn: [B] int32 turn id recorded for the sampled tokens.
    stop: (StopTable, eos_ids [E] int32, budget: scalar int32 max slots a row may fill).
    prefix: optional SharedPrefix every row follows (the one its state was extended with).
    kv_window: static; each step attends over the first kv_window own cache slots only
      (`kv_window_size(max(length of the active rows) + max_new, S)`): every active row must
      end at or below it. None: all S slots (the plain program).
    version: int32 scalar recorded in state.versions for every token sampled (the parameters'
      number of updates, for asynchronous RL; traced: no recompile when it changes).
  A row stops after an EOS id, after a stop string completes (the completing token is kept), at
  max_new tokens, or when it reaches the budget. Every sampled token is fed to the model, so the
  cache always holds the whole trajectory.
  """
  table, eos_ids, budget = stop
  model, params = decode_layout(model, params)
  b, s = state.tokens.shape
  budget = jnp.minimum(budget, s)
  reason0 = jnp.where(active & (state.length >= budget), STOP_BUDGET, RUNNING).astype(jnp.int32)
  active = active & (state.length < budget)

  def cond(carry):
    _, step, active, *_ = carry
    return (step < max_new) & jnp.any(active)

  # Inside the loop the next-token logits are kept vocab-major [V, B] (see
  # Qwen.logits_vocab_major); they are transposed once on entry and once on exit.
  def body(carry):
    state, step, active, new_tokens, num_new, reason, window, logits_vb = carry
    rng, key = jax.random.split(state.rng)
    tok, logp = sample_token(key, logits_vb, sampling, vocab_major=True,
                             context=(state.tokens, state.valid))
    state, logits_vb = _decode_step(model, params, state, logits_vb, tok, logp, active, turn,
                                    prefix, kv_window, version)
    state = state.replace(rng=rng)
    new_tokens = new_tokens.at[:, step].set(jnp.where(active, tok, 0))
    num_new = num_new + active
    window, why = _stop_rules(table, eos_ids, budget, max_new, window, tok, state.length,
                              num_new)
    reason = jnp.where(active, why, reason)
    return (state, step + 1, active & (why == RUNNING), new_tokens, num_new, reason, window,
            logits_vb)

  carry = (state, jnp.int32(0), active, jnp.zeros((b, max_new), jnp.int32),
           jnp.zeros((b,), jnp.int32), reason0, table.empty_window(b), state.next_logits.T)
  state, _, _, new_tokens, num_new, reason, _, logits_vb = jax.lax.while_loop(cond, body, carry)
  state = state.replace(next_logits=logits_vb.T)
  return state, Generation(new_tokens=new_tokens, num_new=num_new, stop_reason=reason)


def _decode_step(model: Qwen, params, state: DecodeState, logits_vb: jax.Array, tok: jax.Array,
                 logp: jax.Array, active: jax.Array, turn: jax.Array,
                 prefix: SharedPrefix | None,
                 kv_window: int | None = None, version: jax.Array | int = 0
                 ) -> tuple[DecodeState, jax.Array]:
  """One step of a token loop: records the sampled tokens of the active rows in their next slot
  and runs the model on them (inactive rows: nothing written, their logits kept).

  Args:
    logits_vb: [V, B] the logits the tokens were sampled from (vocab-major).
    tok, logp: [B] int32 sampled tokens, float32 their temperature-1 log-probs.
    active: [B] bool; turn: [B] int32 turn id recorded for the tokens; version: scalar int32
      recorded in versions for them.
    kv_window: static key window (see `generate`): the attention scores are
      [B, N, G, kv_window]. Inactive rows may lie past it: their logits are discarded.
  Returns:
    the state (length + active) and the next logits [V, B].
  """
  b, s = state.tokens.shape
  rows = jnp.arange(b)
  slot = jnp.where(active, state.length, s)                                 # s: dropped
  valid = state.valid.at[rows, slot].set(True, mode="drop")
  position, shared = _positions(slot[:, None], prefix)
  hidden, cache = model.apply({"params": params}, tok[:, None], position,
                              masks.cache_mask(valid, slot[:, None]), cache=state.cache,
                              cache_index=slot, return_hidden=True, kv_window=kv_window,
                              **shared)
  logits = model.apply({"params": params}, hidden[:, 0], method=Qwen.logits_vocab_major)
  state = state.replace(
      cache=cache, valid=valid,
      tokens=state.tokens.at[rows, slot].set(tok, mode="drop"),
      sampled=state.sampled.at[rows, slot].set(True, mode="drop"),
      logprobs=state.logprobs.at[rows, slot].set(logp, mode="drop"),
      turn_id=state.turn_id.at[rows, slot].set(turn, mode="drop"),
      versions=state.versions.at[rows, slot].set(version, mode="drop"),
      length=state.length + active)
  return state, jnp.where(active[None, :], logits, logits_vb)


def _stop_rules(table: StopTable, eos_ids: jax.Array, budget: jax.Array, max_new: int,
                window: jax.Array, tok: jax.Array, length: jax.Array,
                num_new: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Why each row stops after sampling `tok` (RUNNING: it goes on), first rule first: EOS, a stop
  string completed in the window, the budget (scalar, <= the cache length) reached (length: [B]
  after the token), max_new tokens (num_new: [B] after the token).

  Returns:
    the new window [B, W] and the reasons [B] int32.
  """
  window, hit_stop = push_and_match(table, window, tok)
  hit_eos = jnp.any(tok[:, None] == eos_ids[None, :], axis=-1)
  why = jnp.select([hit_eos, hit_stop, length >= budget, num_new >= max_new],
                   [STOP_EOS, STOP_STRING, STOP_BUDGET, STOP_MAX_NEW], RUNNING)
  return window, why
