"""Attention over a mask described per token, never as an [L, L] array.

Every caller of the model (training, scoring, prefill and decode, IGPO's probes, packed rows)
describes what a query may see with an `AttentionMask`: a few int32 arrays per query and per
key. Query q of row b sees key k iff the key is real (k_segment != 0) and

    (k_segment == q_segment          and k_slot <= q_slot)        # causal within its own segment
 or (k_segment == q_context_segment  and k_slot <  q_context_end)  # a probe's context (IGPO)

Slots order the tokens of a row (the index in the row, or the cache slot); segments separate the
trajectories packed into one row (0 = padding: never seen). A probe (information_gain.py) has a
segment of its own and reads its trajectory's slots before its boundary through the context pair.

Implementations (`QwenConfig.attention`, config `model.attention`):
  xla        scores [B, N, M, K] with the mask materialized (the reference; small shapes, and
             decode, whose scores are [B, N, G, S] anyway)
  blockwise  flash-style online softmax over query and key blocks in plain JAX, the mask
             computed per block, a custom_vjp that recomputes the blocks in the backward:
             memory linear in Q and K, on every backend and every mask
  cudnn      jax.nn.dot_product_attention(implementation="cudnn") on GPU, for masks of kind
             "causal" in bf16/fp16 (AttentionMask.kind: a static promise the arrays can't give)
  splash     the Pallas splash-attention kernel on TPU, for masks of kind "causal" or "packed"
  auto       xla where the scores are small (Q = 1, or Q and K within one block), else cudnn on
             GPU, splash on TPU, blockwise elsewhere; blockwise wherever a kernel can't
             (choose_implementation is the table)

Layouts (the model's, see models/qwen/model.py): queries grouped by KV head, qg [B, N, M, D]
with M = Q * G (m = q * G + g); keys [B, N, D, K] (slots minor, as in the KV cache); values
[B, N, K, D]. The mask's per-query arrays are [B, Q] (shared by the G heads of a group).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
_F32 = jnp.float32
_log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "blockwise", "cudnn", "splash")
MASK_KINDS = ("general", "causal", "packed")


@flax.struct.dataclass
class AttentionMask:
  """Per-token description of what each query sees (see the module docstring).

  q_segment, q_slot: [B, Q] int32. k_segment, k_slot: [B, K] int32 (k_segment 0: padding).
  q_context_segment, q_context_end: [B, Q] int32 or None (no query reads another segment).
  """

  q_segment: Array
  q_slot: Array
  k_segment: Array
  k_slot: Array
  q_context_segment: Array | None = None
  q_context_end: Array | None = None
  # A static promise about the arrays' structure, which lets the fused kernels (cudnn, splash)
  # run; the arrays stay the truth for xla and blockwise. One of MASK_KINDS:
  #   "general"  no promise (every mask works with xla and blockwise).
  #   "causal"   self-attention (Q = K, q_slot = k_slot = index in the row), no context pair,
  #              q_segment = 1, each row's real keys one contiguous run (left or right padding):
  #              causal_padding_mask's masks of such rows.
  #   "packed"   self-attention, no context pair, q_segment = k_segment (0 on padding), causal
  #              within each segment: packed_segments_mask's masks.
  # window() and any other change of the keys must reset it to "general".
  kind: str = flax.struct.field(pytree_node=False, default="general")

  @property
  def has_context(self) -> bool:
    return self.q_context_segment is not None

  def visible(self, q_index: Any = slice(None), k_index: Any = slice(None)) -> Array:
    """The boolean mask [B, Q', K'] of the queries q_index and keys k_index (a block of it;
    the whole [B, Q, K] only for small shapes and tests)."""
    qs, qp = self.q_segment[:, q_index, None], self.q_slot[:, q_index, None]
    ks, kp = self.k_segment[:, None, k_index], self.k_slot[:, None, k_index]
    seen = (ks == qs) & (kp <= qp)
    if self.has_context:
      cs, ce = self.q_context_segment[:, q_index, None], self.q_context_end[:, q_index, None]
      seen = seen | ((ks == cs) & (kp < ce))
    return seen & (ks != 0)


def window(mask: AttentionMask, size: int) -> AttentionMask:
  """The mask over the first `size` keys only (a decode program that reads a window of its
  cache: agentjax/sampling)."""
  # Keys are no longer the queries' own tokens: no structure left to promise.
  return mask.replace(k_segment=mask.k_segment[:, :size], k_slot=mask.k_slot[:, :size],
                      kind="general")


def _repeat_groups(x: Array, g: int) -> Array:
  """[B, Q, ...] per-query values -> [B, Q * G, ...] (m = q * G + g)."""
  return jnp.repeat(x, g, axis=1) if g > 1 else x


def xla_attention(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
                  prefix: tuple[Array, Array, Array] | None = None) -> Array:
  """The reference: scores [B, N, M, K] in float32 with the mask materialized. -> [B, N, M, D].

  prefix: optional (keys [1, N, D, P], values [1, N, P, D], visible [P] bool), a cache shared by
  every row and placed before each row's own keys."""
  d = qg.shape[-1]
  g = qg.shape[2] // mask.q_slot.shape[1]
  scores = jnp.einsum("bnmd,bndk->bnmk", qg, keys.astype(dtype),
                      preferred_element_type=_F32) * (d ** -0.5)
  seen = _repeat_groups(mask.visible(), g)                                # [B, M, K]
  scores = jnp.where(seen[:, None], scores, jnp.finfo(_F32).min)
  if prefix is not None:
    return _attend_with_prefix(qg, scores, values, prefix, dtype)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return jnp.einsum("bnmk,bnkd->bnmd", probs, values.astype(dtype))


def _attend_with_prefix(qg: Array, scores: Array, values: Array,
                        prefix: tuple[Array, Array, Array], dtype: Any) -> Array:
  """Attention over a shared prefix's keys followed by each row's own (already masked) keys.

  qg [B, N, M, D] queries; scores [B, N, M, S] their masked scores against the row's own keys;
  values [B, N, S, D]; prefix (keys [1, N, D, P], values [1, N, P, D], visible [P] bool).
  Returns [B, N, M, D]: softmax over the P + S keys, times their values.

  The prefix is one batch-1 cache: its matmuls run per kv head n over all rows' queries at once,
  [B * M, D] x [D, P], so the prefix is read once per call rather than once per row (the rows'
  own caches hold only what follows it). One softmax in two parts: a shared max and sum.
  """
  b, n, m, d = qg.shape
  p_keys, p_values, visible = prefix
  q_n = jnp.swapaxes(qg, 0, 1)                                              # [N, B, M, D]
  s_pre = jnp.einsum("nbmd,ndk->nbmk", q_n, p_keys[0].astype(dtype),
                     preferred_element_type=_F32) * (d ** -0.5)             # [N, B, M, P]
  s_pre = jnp.where(visible, s_pre, jnp.finfo(_F32).min)
  top = jnp.maximum(jnp.swapaxes(jnp.max(s_pre, axis=-1), 0, 1), jnp.max(scores, axis=-1))
  e_pre = jnp.exp(s_pre - jnp.swapaxes(top, 0, 1)[..., None])              # [N, B, M, P]
  e_own = jnp.exp(scores - top[..., None])                                   # [B, N, M, S]
  total = jnp.swapaxes(jnp.sum(e_pre, axis=-1), 0, 1) + jnp.sum(e_own, axis=-1)   # [B, N, M]
  inv = (1.0 / total)[..., None]
  out_pre = jnp.einsum("nbmk,nkd->nbmd", (e_pre * jnp.swapaxes(inv, 0, 1)).astype(dtype),
                       p_values[0].astype(dtype), preferred_element_type=_F32)
  out_own = jnp.einsum("bnmk,bnkd->bnmd", (e_own * inv).astype(dtype), values.astype(dtype),
                       preferred_element_type=_F32)
  return (jnp.swapaxes(out_pre, 0, 1) + out_own).astype(dtype)


# --------------------------------------------------------------------------- blockwise
#
# FlashAttention-2 in plain JAX. Queries are cut into blocks of `bq` tokens (bq * G rows of M) and
# keys into blocks of `bk` slots; a query block runs an online softmax over the key blocks
# (running max `mx`, sum `l`, accumulator `acc`, all float32). The forward keeps only the output
# and the log-sum-exp per row; the backward (custom_vjp) recomputes each block's probabilities
# from them. Every temporary is block-sized: memory is linear in Q and K, also under remat (a
# custom_vjp's forward saves nothing per block).


def _pad_to(x: Array, axis: int, size: int) -> Array:
  """x zero-padded along `axis` to `size` (for mask arrays, 0 is the padding segment)."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def _rows(x: Array, i: Array, size: int, axis: int) -> Array:
  """Block i (traced) of `size` along `axis`."""
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis)


def _geometry(q_len: int, k_len: int, block: int) -> tuple[int, int, int, int]:
  """(bq, bk, nq, nk): block sizes (never above the lengths) and block counts."""
  bq, bk = min(block, q_len), min(block, k_len)
  return bq, bk, -(-q_len // bq), -(-k_len // bk)


def _pad_mask(mask: AttentionMask, q_size: int, k_size: int) -> AttentionMask:
  """The mask over padded queries and keys: padded keys get segment 0 (never seen) and padded
  queries segment 0 and context segment 0 (they see nothing; their rows are cut off after)."""
  pq = lambda x: None if x is None else _pad_to(x, 1, q_size)  # noqa: E731
  return mask.replace(q_segment=pq(mask.q_segment), q_slot=pq(mask.q_slot),
                      q_context_segment=pq(mask.q_context_segment),
                      q_context_end=pq(mask.q_context_end),
                      k_segment=_pad_to(mask.k_segment, 1, k_size),
                      k_slot=_pad_to(mask.k_slot, 1, k_size))


def _q_rows(mask: AttentionMask, i: Array, bq: int) -> AttentionMask:
  """The mask's per-query arrays of query block i (the per-key arrays unchanged)."""
  pq = lambda x: None if x is None else _rows(x, i, bq, 1)  # noqa: E731
  return mask.replace(q_segment=pq(mask.q_segment), q_slot=pq(mask.q_slot),
                      q_context_segment=pq(mask.q_context_segment),
                      q_context_end=pq(mask.q_context_end))


def _block_visible(qmask: AttentionMask, mask: AttentionMask, j: Array, bk: int,
                   g: int) -> Array:
  """[B, bq * G, bk] bool: what the rows of a query block (qmask) see of key block j."""
  sub = qmask.replace(k_segment=_rows(mask.k_segment, j, bk, 1),
                      k_slot=_rows(mask.k_slot, j, bk, 1))
  return _repeat_groups(sub.visible(), g)


def _online_update(carry: tuple[Array, Array, Array], scores: Array, visible: Array,
                   values: Array, dtype: Any, pv: str) -> tuple[Array, Array, Array]:
  """One key block of the online softmax.

  carry: (mx [B, N, R] running max (-inf while nothing was seen), l [B, N, R] running sum,
  acc [B, N, R, D] running numerator), all float32. scores [B, N, R, k] float32; visible
  broadcastable to it; values the block's values for the einsum `pv` ("...k,...kd->...d").
  """
  mx, l, acc = carry
  scores = jnp.where(visible, scores, -jnp.inf)
  new_mx = jnp.maximum(mx, jnp.max(scores, axis=-1))
  # A row that has seen nothing yet keeps max -inf: subtract 0 instead, so that exp gives 0 for
  # its masked scores rather than exp(-inf + inf) = NaN.
  safe = jnp.where(jnp.isneginf(new_mx), 0.0, new_mx)
  probs = jnp.exp(scores - safe[..., None])
  rescale = jnp.exp(mx - safe)
  l = rescale * l + jnp.sum(probs, axis=-1)
  acc = rescale[..., None] * acc + jnp.einsum(pv, probs.astype(dtype), values,
                                              preferred_element_type=_F32)
  return new_mx, l, acc


def _prefix_pass(q: Array, carry: tuple[Array, Array, Array],
                 prefix: tuple[Array, Array, Array], dtype: Any, block: int):
  """The online softmax over a shared prefix's keys, the first blocks of every row.

  q [B, N, R, D]; prefix (keys [1, N, D, P], values [1, N, P, D], visible [P] bool). The prefix
  has batch 1: each block's matmul runs over all rows' queries at once (read once per call).
  """
  p_keys, p_values, visible = prefix
  p_len = visible.shape[0]
  bp, _, n_p, _ = _geometry(p_len, p_len, block)
  keys = _pad_to(p_keys[0], 2, n_p * bp).astype(dtype)       # [N, D, P']
  values = _pad_to(p_values[0], 1, n_p * bp).astype(dtype)   # [N, P', D]
  visible = _pad_to(visible.astype(bool), 0, n_p * bp)       # [P'], padding False
  scale = q.shape[-1] ** -0.5

  def step(carry, j):
    scores = jnp.einsum("bnrd,ndk->bnrk", q, _rows(keys, j, bp, 2),
                        preferred_element_type=_F32) * scale
    return _online_update(carry, scores, _rows(visible, j, bp, 0), _rows(values, j, bp, 1),
                          dtype, "bnrk,nkd->bnrd"), None

  carry, _ = jax.lax.scan(step, carry, jnp.arange(n_p))
  return carry


def _blockwise_forward(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
                       block: int, prefix: tuple[Array, Array, Array] | None = None):
  """-> (out [B, N, M, D] in dtype, lse [B, N, M] float32: the log-sum-exp of each row's visible
  scores, 0 on rows that see no key, whose output is 0)."""
  b, n, m, d = qg.shape
  q_len, k_len = mask.q_slot.shape[1], keys.shape[3]
  g = m // q_len
  bq, bk, nq, nk = _geometry(q_len, k_len, block)
  qg_p = _pad_to(qg, 2, nq * bq * g)
  keys_p = _pad_to(keys, 3, nk * bk).astype(dtype)
  values_p = _pad_to(values, 2, nk * bk).astype(dtype)
  mask_p = _pad_mask(mask, nq * bq, nk * bk)
  scale = d ** -0.5
  r = bq * g  # rows per query block

  def q_block(i):
    q = _rows(qg_p, i, r, 2)                                                 # [B, N, R, D]
    qmask = _q_rows(mask_p, i, bq)
    carry = (jnp.full((b, n, r), -jnp.inf, _F32), jnp.zeros((b, n, r), _F32),
             jnp.zeros((b, n, r, d), _F32))
    if prefix is not None:
      carry = _prefix_pass(q, carry, prefix, dtype, block)

    def k_step(carry, j):
      visible = _block_visible(qmask, mask_p, j, bk, g)                     # [B, R, bk]

      def update(carry):
        scores = jnp.einsum("bnrd,bndk->bnrk", q, _rows(keys_p, j, bk, 3),
                            preferred_element_type=_F32) * scale
        return _online_update(carry, scores, visible[:, None], _rows(values_p, j, bk, 2),
                              dtype, "bnrk,bnkd->bnrd")

      # Skip blocks nothing sees (above the causal diagonal, other segments, padding): about
      # half the work of a causal mask.
      return jax.lax.cond(jnp.any(visible), update, lambda c: c, carry), None

    (mx, l, acc), _ = jax.lax.scan(k_step, carry, jnp.arange(nk))
    seen = l > 0
    l = jnp.where(seen, l, 1.0)
    return (acc / l[..., None]).astype(dtype), jnp.where(seen, mx + jnp.log(l), 0.0)

  out, lse = jax.lax.map(q_block, jnp.arange(nq))        # [nq, B, N, R, D], [nq, B, N, R]
  out = jnp.moveaxis(out, 0, 2).reshape(b, n, nq * r, d)[:, :, :m]
  lse = jnp.moveaxis(lse, 0, 2).reshape(b, n, nq * r)[:, :, :m]
  return out, lse


def _blockwise_backward(qg: Array, keys: Array, values: Array, mask: AttentionMask, out: Array,
                        lse: Array, d_out: Array, dtype: Any, block: int):
  """FlashAttention-2's backward: -> (d_qg, d_keys, d_values) in the inputs' dtypes.

  Per block: P = exp(S - lse) (masked to 0), dV += P^T dO, dP = dO V^T, dS = P (dP - D) with
  D = rowsum(dO * O), dQ += dS K * scale, dK += dS^T Q * scale. The outer scan runs over key
  blocks (their dK, dV accumulate in the inner carry), the inner over query blocks (dQ, [B, N,
  M, D] float32, is updated in place).
  """
  b, n, m, d = qg.shape
  q_len, k_len = mask.q_slot.shape[1], keys.shape[3]
  g = m // q_len
  bq, bk, nq, nk = _geometry(q_len, k_len, block)
  r = bq * g
  qg_p = _pad_to(qg, 2, nq * r).astype(dtype)
  keys_p = _pad_to(keys, 3, nk * bk).astype(dtype)
  values_p = _pad_to(values, 2, nk * bk).astype(dtype)
  mask_p = _pad_mask(mask, nq * bq, nk * bk)
  delta = jnp.sum(d_out.astype(_F32) * out.astype(_F32), axis=-1)          # [B, N, M]
  do_p = _pad_to(d_out.astype(dtype), 2, nq * r)
  lse_p, delta_p = _pad_to(lse, 2, nq * r), _pad_to(delta, 2, nq * r)
  scale = d ** -0.5

  def k_block(dq, j):
    kb, vb = _rows(keys_p, j, bk, 3), _rows(values_p, j, bk, 2)           # [B,N,D,k], [B,N,k,D]

    def q_step(carry, i):
      dq, dk, dv = carry
      visible = _block_visible(_q_rows(mask_p, i, bq), mask_p, j, bk, g)   # [B, R, bk]

      def grads(_):
        q, do = _rows(qg_p, i, r, 2), _rows(do_p, i, r, 2)                 # [B, N, R, D]
        scores = jnp.einsum("bnrd,bndk->bnrk", q, kb, preferred_element_type=_F32) * scale
        # exp of a masked score may overflow; `where` drops it (no autodiff runs through here).
        probs = jnp.where(visible[:, None],
                          jnp.exp(scores - _rows(lse_p, i, r, 2)[..., None]), 0.0)
        d_probs = jnp.einsum("bnrd,bnkd->bnrk", do, vb, preferred_element_type=_F32)
        d_scores = (probs * (d_probs - _rows(delta_p, i, r, 2)[..., None]) * scale).astype(dtype)
        return (jnp.einsum("bnrk,bndk->bnrd", d_scores, kb, preferred_element_type=_F32),
                jnp.einsum("bnrk,bnrd->bndk", d_scores, q, preferred_element_type=_F32),
                jnp.einsum("bnrk,bnrd->bnkd", probs.astype(dtype), do,
                           preferred_element_type=_F32))

      def skip(_):
        return (jnp.zeros((b, n, r, d), _F32), jnp.zeros((b, n, d, bk), _F32),
                jnp.zeros((b, n, bk, d), _F32))

      # The cond returns block-sized increments only, so that skipping never copies dq.
      dq_i, dk_i, dv_i = jax.lax.cond(jnp.any(visible), grads, skip, None)
      dq = jax.lax.dynamic_update_slice_in_dim(dq, _rows(dq, i, r, 2) + dq_i, i * r, 2)
      return (dq, dk + dk_i, dv + dv_i), None

    init = (dq, jnp.zeros((b, n, d, bk), _F32), jnp.zeros((b, n, bk, d), _F32))
    (dq, dk, dv), _ = jax.lax.scan(q_step, init, jnp.arange(nq))
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(k_block, jnp.zeros((b, n, nq * r, d), _F32), jnp.arange(nk))
  dk = jnp.moveaxis(dk, 0, 3).reshape(b, n, d, nk * bk)[..., :k_len]       # from [nk,B,N,D,k]
  dv = jnp.moveaxis(dv, 0, 2).reshape(b, n, nk * bk, d)[:, :, :k_len]      # from [nk,B,N,k,D]
  return (dq[:, :, :m].astype(qg.dtype), dk.astype(keys.dtype), dv.astype(values.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
               block: int) -> Array:
  return _blockwise_forward(qg, keys, values, mask, dtype, block)[0]


def _blockwise_fwd(qg, keys, values, mask, dtype, block):
  out, lse = _blockwise_forward(qg, keys, values, mask, dtype, block)
  # Residuals: the inputs (alive anyway), the output and lse [B, N, M]; nothing per block.
  return out, (qg, keys, values, mask, out, lse)


def _blockwise_bwd(dtype, block, residuals, d_out):
  qg, keys, values, mask, out, lse = residuals
  grads = _blockwise_backward(qg, keys, values, mask, out, lse, d_out, dtype, block)
  # The mask's int32 arrays take no gradient: float0 zeros of their shapes.
  d_mask = jax.tree.map(lambda x: np.zeros(x.shape, jax.dtypes.float0), mask)
  return (*grads, d_mask)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
                        block: int = 512,
                        prefix: tuple[Array, Array, Array] | None = None) -> Array:
  """Flash-style attention, memory linear in Q and K. Same arguments and result as
  `xla_attention` ([B, N, M, D]), except on rows that see no key at all (padding queries): 0
  here (no gradient to anything), the mean of all values there; both finite.

  block: the query and key block length (tokens; clipped to the lengths). Q and K need not be
  multiples of it. With `prefix` the forward is the same online softmax with the prefix's keys
  as its first blocks; that path (sampling with a shared cache) is differentiated by plain
  autodiff through the scans, which saves per-block residuals: don't train through it.
  """
  if prefix is not None:
    return _blockwise_forward(qg, keys, values, mask, dtype, block, prefix)[0]
  # One block (Q, K <= block) needs no special case: the scans run once, as fast as xla's
  # program on CPU (launch/bench.py attention), and the backward saves no [M, K] probabilities.
  return _blockwise(qg, keys, values, mask, jnp.dtype(dtype), block)


# --------------------------------------------------------------------------- fused kernels


def _heads_major(qg: Array, q_len: int) -> Array:
  """qg [B, N, Q * G, D] -> [B, Q, N * G, D] (query head h = n * G + g, the checkpoint's order
  and the one jax.nn.dot_product_attention's GQA assumes)."""
  b, n, m, d = qg.shape
  g = m // q_len
  return qg.reshape(b, n, q_len, g, d).transpose(0, 2, 1, 3, 4).reshape(b, q_len, n * g, d)


def _grouped(out: Array, n: int) -> Array:
  """[B, Q, N * G, D] -> [B, N, Q * G, D] (the inverse of _heads_major)."""
  b, q_len, h, d = out.shape
  g = h // n
  return out.reshape(b, q_len, n, g, d).transpose(0, 2, 1, 3, 4).reshape(b, n, q_len * g, d)


def cudnn_attention(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
                    implementation: str = "cudnn") -> Array:
  """cuDNN's fused flash attention for a mask of kind "causal" (see AttentionMask.kind).

  jax.nn.dot_product_attention takes [B, T, heads, D] with GQA built in and expresses causal
  attention over each row's first `length` tokens (is_causal + sequence lengths: right padding).
  A left-padded row is rotated so that its real run starts at slot 0 and rotated back after:
  positions are already in the rotary embedding, so attention depends on the mask alone.
  Padding queries' outputs are 0 (as with blockwise). -> [B, N, M, D].

  implementation="xla" runs the same code through XLA (tests on CPU).
  """
  n, q_len = keys.shape[1], mask.q_slot.shape[1]
  q = _heads_major(qg, q_len).astype(dtype)
  k = jnp.transpose(keys, (0, 3, 1, 2)).astype(dtype)                     # [B, T, N, D]
  v = jnp.swapaxes(values, 1, 2).astype(dtype)                            # [B, T, N, D]
  real = mask.k_segment != 0                                              # [B, T]
  # max(., 1): an all-padding row must not hand cuDNN an empty sequence.
  length = jnp.maximum(jnp.sum(real, axis=1, dtype=jnp.int32), 1)
  start = jnp.argmax(real, axis=1).astype(jnp.int32)                      # first real slot
  slots = jnp.arange(q_len, dtype=jnp.int32)[None]

  def rotate(x, shift):  # new[t] = x[(t + shift) % T], per row
    return jnp.take_along_axis(x, ((slots + shift[:, None]) % q_len)[:, :, None, None], axis=1)

  out = jax.nn.dot_product_attention(
      rotate(q, start), rotate(k, start), rotate(v, start), is_causal=True,
      query_seq_lengths=length, key_value_seq_lengths=length, implementation=implementation)
  # Padding queries get 0, whatever cuDNN left there: a NaN in their rows would become the next
  # layer's padding values, and 0 * NaN reaches every row's output through P V.
  out = jnp.where(real[:, :, None, None], rotate(out, -start), 0)
  return _grouped(out, n).astype(dtype)


@functools.lru_cache(maxsize=32)
def _splash_kernel(heads: int, length: int, block: int, interpret: bool):
  """A splash-attention kernel (GQA: `heads` query heads over fewer kv heads) with a causal
  mask of [length, length]; built once per shape (the mask's block tables are numpy work)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  causal = sm.MultiHeadMask([sm.CausalMask((length, length)) for _ in range(heads)])
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block)
  return sk.make_splash_mha_single_device(causal, block_sizes=sizes, interpret=interpret)


def splash_attention(qg: Array, keys: Array, values: Array, mask: AttentionMask, dtype: Any,
                     block: int = 512, interpret: bool = False) -> Array:
  """The TPU Pallas splash-attention kernel for a mask of kind "causal" or "packed".

  Splash ANDs its static causal mask with segment-id equality. The keys' segments serve as the
  queries' too: for "packed" masks they are the same; for "causal" ones (q_segment 1 everywhere)
  real queries still see exactly the real keys before them, and padding queries their padding
  keys (never used, but no row is empty, which splash forbids). Splash takes unbatched
  [heads, T, D] (vmapped over rows) and does not scale the scores: q is scaled first.
  Needs T a multiple of 128 (see splash_blocks). -> [B, N, M, D].
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  n, q_len, d = keys.shape[1], mask.q_slot.shape[1], keys.shape[2]
  q = jnp.swapaxes(_heads_major(qg, q_len), 1, 2) * (d ** -0.5)            # [B, H, T, D]
  k = jnp.swapaxes(keys, 2, 3).astype(dtype)                               # [B, N, T, D]
  kernel = _splash_kernel(q.shape[1], q_len, _splash_block(q_len, block), interpret)
  segments = mask.k_segment.astype(jnp.int32)

  def one_row(q, k, v, seg):
    return kernel(q, k, v, segment_ids=sk.SegmentIds(q=seg, kv=seg))

  out = jax.vmap(one_row)(q.astype(dtype), k, values.astype(dtype), segments)  # [B, H, T, D]
  return _grouped(jnp.swapaxes(out, 1, 2), n).astype(dtype)


def _splash_block(length: int, block: int) -> int:
  """The largest multiple of 128 <= block dividing length (splash's tiles are 128-aligned)."""
  size = max(128, block - block % 128)
  while length % size:
    size -= 128
  return size


# --------------------------------------------------------------------------- dispatch


def choose_implementation(implementation: str, *, backend: str, q_len: int, k_len: int,
                          block: int, dtype: Any, kind: str = "general",
                          has_prefix: bool = False) -> str:
  """The implementation `attend` runs: "xla", "blockwise", "cudnn" or "splash".

  backend: jax.default_backend() ("cpu", "gpu", "tpu"). A fused kernel runs only where it
  expresses the mask (AttentionMask.kind, no shared prefix, self-attention), the dtype and the
  shapes; otherwise blockwise. "auto" takes xla where the scores are small anyway (a decode
  step, Q = 1, or queries and keys within one block: xla is fastest there and no larger than a
  block), else the backend's kernel.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"model.attention must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  if implementation == "xla":
    return "xla"
  if implementation == "auto":
    if q_len == 1 or (q_len <= block and k_len <= block):
      return "xla"
    implementation = {"gpu": "cudnn", "tpu": "splash"}.get(backend, "blockwise")
  self_attention = not has_prefix and q_len == k_len
  if (implementation == "cudnn" and backend == "gpu" and self_attention and kind == "causal"
      and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))):
    return "cudnn"
  if (implementation == "splash" and backend == "tpu" and self_attention
      and kind in ("causal", "packed") and q_len % 128 == 0):
    return "splash"
  return "blockwise"


def attend(qg: Array, keys: Array, values: Array, mask: AttentionMask, *, dtype: Any,
           implementation: str = "auto", block: int = 512,
           prefix: tuple[Array, Array, Array] | None = None) -> Array:
  """Attention of grouped queries qg [B, N, M, D] over keys [B, N, D, K] and values [B, N, K, D]
  under `mask` (M = Q * G). -> [B, N, M, D] in dtype. See the module docstring; which
  implementation runs: choose_implementation."""
  chosen = choose_implementation(implementation, backend=jax.default_backend(),
                                 q_len=mask.q_slot.shape[1], k_len=keys.shape[3], block=block,
                                 dtype=dtype, kind=mask.kind, has_prefix=prefix is not None)
  if chosen == "cudnn":
    try:
      return cudnn_attention(qg, keys, values, mask, dtype)
    except (NotImplementedError, RuntimeError, ValueError) as e:
      # cuDNN checks its own limits (version, head_dim, GPU generation) while tracing: a shape
      # it refuses still trains, through blockwise.
      _log.warning("cudnn attention unavailable (%s); using blockwise", e)
      return blockwise_attention(qg, keys, values, mask, dtype, block, prefix)
  if chosen == "splash":
    return splash_attention(qg, keys, values, mask, dtype, block)
  if chosen == "blockwise":
    return blockwise_attention(qg, keys, values, mask, dtype, block, prefix)
  return xla_attention(qg, keys, values, mask, dtype, prefix)
