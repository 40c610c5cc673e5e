"""Attention masks and position ids for decoder models.

The model takes a general boolean mask [B, Q, K] (True = query may attend to key), so one module
serves left/right padding, KV-cache decoding and packed sequences (information-gain probes). These
helpers build the common cases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def causal_padding_mask(valid: jax.Array) -> jax.Array:
  """Causal mask restricted to real tokens.

  Args:
    valid: [B, L] bool or 0/1, True on real tokens (left or right padding both work).
  Returns:
    [B, L, L] bool: query i attends to key j iff j <= i and key j is real.
  """
  valid = valid.astype(bool)
  length = valid.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), dtype=bool))
  return causal[None] & valid[:, None, :]


def positions_from_padding(valid: jax.Array) -> jax.Array:
  """Position ids that start at 0 on each row's first real token (as transformers does).

  Args:
    valid: [B, L] bool or 0/1.
  Returns:
    [B, L] int32; padding positions get 0.
  """
  valid = valid.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(valid, axis=-1) - 1, 0) * valid


def cache_mask(key_valid: jax.Array, query_slots: jax.Array) -> jax.Array:
  """Mask of queries written at `query_slots` of a KV cache against all cache slots.

  Args:
    key_valid: [B, S] bool, True on cache slots holding real tokens (after this step's writes).
    query_slots: [B, Q] int32, the cache slot each query token is written to.
  Returns:
    [B, Q, S] bool: slot s is visible iff it is real and s <= the query's own slot.
  """
  slots = jnp.arange(key_valid.shape[-1], dtype=jnp.int32)
  return key_valid[:, None, :] & (slots[None, None, :] <= query_slots[:, :, None])
