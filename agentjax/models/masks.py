"""Attention masks and position ids for decoder models.

The model takes an `AttentionMask` (agentjax/models/attention.py): segment ids and slots per query
and per key, from which each attention block computes its own piece of the mask; no [B, Q, K]
array is ever built outside a block. One description serves left/right padding, KV-cache
decoding, packed trajectories and IGPO's probes. These helpers build the common cases;
`mask.visible()` materializes the boolean [B, Q, K] (tests, small shapes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentjax.models.attention import AttentionMask


def _slots(shape) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.int32), shape)


def causal_padding_mask(valid: jax.Array) -> AttentionMask:
  """Causal mask restricted to real tokens.

  Args:
    valid: [B, L] bool or 0/1, True on real tokens: one run per row (left or right padding both
      work; the fused kernels rely on it, AttentionMask.kind "causal").
  Returns:
    the mask under which query i attends to key j iff j <= i and key j is real.
  """
  seg = valid.astype(bool).astype(jnp.int32)
  slots = _slots(seg.shape)
  # Padding queries get segment 1 too: they see the real keys before them (their outputs are
  # never used, but stay finite, as with a boolean causal mask).
  return AttentionMask(q_segment=jnp.ones_like(seg), q_slot=slots, k_segment=seg, k_slot=slots,
                       kind="causal")


def packed_segments_mask(segment_ids: jax.Array) -> AttentionMask:
  """Causal attention within each segment of packed rows.

  Args:
    segment_ids: [B, L] int32, the trajectory each slot belongs to (1, 2, ...), 0 on padding.
  """
  seg = segment_ids.astype(jnp.int32)
  slots = _slots(seg.shape)
  return AttentionMask(q_segment=seg, q_slot=slots, k_segment=seg, k_slot=slots, kind="packed")


def positions_from_padding(valid: jax.Array) -> jax.Array:
  """Position ids that start at 0 on each row's first real token (as transformers does).

  Args:
    valid: [B, L] bool or 0/1.
  Returns:
    [B, L] int32; padding positions get 0.
  """
  valid = valid.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(valid, axis=-1) - 1, 0) * valid


def cache_mask(key_valid: jax.Array, query_slots: jax.Array) -> AttentionMask:
  """Mask of queries written at `query_slots` of a KV cache against all cache slots.

  Args:
    key_valid: [B, S] bool, True on cache slots holding real tokens (after this step's writes).
    query_slots: [B, Q] int32, the cache slot each query token is written to.
  Returns:
    the mask under which slot s is visible iff it is real and s <= the query's own slot.
  """
  seg = key_valid.astype(bool).astype(jnp.int32)
  return AttentionMask(q_segment=jnp.ones(query_slots.shape, jnp.int32),
                       q_slot=query_slots.astype(jnp.int32), k_segment=seg,
                       k_slot=_slots(seg.shape))
