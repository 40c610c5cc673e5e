"""Per-token log-probabilities (and entropies) from hidden states, without [B, L, V] logits.

A trajectory batch of 16 x 4096 tokens over Qwen's 151,936-token vocabulary would need 40 GB of
float32 logits. We project a chunk of positions at a time (lax.map over chunks), keep only the
log-prob of the target token and, when asked, the entropy of the distribution.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def chunked_token_logprobs(logits_fn: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                           targets: jax.Array, chunk: int = 256, with_entropy: bool = False
                           ) -> tuple[jax.Array, jax.Array | None]:
  """log p(targets[b, l] | hidden[b, l]) for every position.

  Args:
    logits_fn: hidden [..., E] -> logits [..., V] (float32), e.g. the model's LM head.
    hidden: [B, L, E], the state that predicts each target (i.e. already shifted).
    targets: [B, L] int32.
    chunk: positions per LM-head call; L is padded up to a multiple of it.
  Returns:
    logprobs [B, L] float32, and entropy [B, L] float32 (or None).
  """
  b, length, e = hidden.shape
  chunk = min(chunk, length)
  pad = -length % chunk
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  n = hidden.shape[1] // chunk
  hs = hidden.reshape(b, n, chunk, e).swapaxes(0, 1)      # [n, B, C, E]
  ts = targets.reshape(b, n, chunk).swapaxes(0, 1)         # [n, B, C]

  def one(args):
    h, t = args
    logits = logits_fn(h).astype(jnp.float32)              # [B, C, V]
    lse = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
      return logp, jnp.zeros_like(logp)
    probs = jnp.exp(logits - lse[..., None])
    return logp, lse - jnp.sum(probs * logits, axis=-1)

  # Rematerialized per chunk: without it the backward of lax.map keeps every chunk's [B, C, V]
  # logits (the whole [B, L, V] this function exists to avoid); with it only the hidden chunk.
  logp, ent = jax.lax.map(jax.checkpoint(one), (hs, ts))
  logp = logp.swapaxes(0, 1).reshape(b, -1)[:, :length]
  ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :length]
  return logp, (ent if with_entropy else None)


def sequence_logprobs(model, params, tokens: jax.Array, valid: jax.Array, chunk: int = 256,
                      with_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """Teacher-forced log p(tokens[b, j] | tokens[b, <j]) of padded sequences (one forward).

  Args:
    model: a Qwen module (anything with the same __call__(..., return_hidden=True) and .logits).
    tokens, valid: [B, L]; real tokens may be left- or right-padded.
  Returns:
    logprobs [B, L] (0 at each row's first real token and on padding), entropy [B, L] or None.
  """
  from agentjax.models import masks  # local: masks is tiny, this keeps the module import-light

  hidden, _ = model.apply({"params": params}, tokens, masks.positions_from_padding(valid),
                          masks.causal_padding_mask(valid), return_hidden=True)
  # A token has a predictor only if the slot before it is real.
  has_prev = jnp.concatenate([jnp.zeros_like(valid[:, :1]), valid[:, :-1]], axis=1) & valid
  return _next_token_logprobs(model, params, hidden, tokens, has_prev, chunk, with_entropy)


def packed_logprobs(model, params, tokens: jax.Array, positions: jax.Array,
                    segment_ids: jax.Array, chunk: int = 256, with_entropy: bool = False
                    ) -> tuple[jax.Array, jax.Array | None]:
  """sequence_logprobs on packed rows (agentjax/train/packing.py): several trajectories per row.

  Args:
    model: as in sequence_logprobs.
    tokens, positions, segment_ids: [R, W] int32; segment k of a row is one trajectory (its slots
      contiguous, positions restarting at 0), 0 is padding. Attention stays within a segment.
  Returns:
    logprobs [R, W] (0 at each trajectory's first token and on padding), entropy [R, W] or None:
    unpacked (PackIndex.unpack), exactly sequence_logprobs of the trajectories.
  """
  from agentjax.models import masks

  segment_ids = segment_ids.astype(jnp.int32)
  hidden, _ = model.apply({"params": params}, tokens, positions,
                          masks.packed_segments_mask(segment_ids), return_hidden=True)
  # The slot before a trajectory's first token belongs to another trajectory (or is padding).
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
  has_prev = jnp.concatenate([jnp.zeros_like(same[:, :1]), same], axis=1)
  return _next_token_logprobs(model, params, hidden, tokens, has_prev, chunk, with_entropy)


def _next_token_logprobs(model, params, hidden: jax.Array, tokens: jax.Array,
                         has_prev: jax.Array, chunk: int, with_entropy: bool
                         ) -> tuple[jax.Array, jax.Array | None]:
  """log p(tokens[:, j]) from hidden[:, j - 1] where has_prev [B, L] (0 elsewhere)."""
  prev = jnp.concatenate([hidden[:, :1], hidden[:, :-1]], axis=1)
  logits_fn = lambda h: model.apply({"params": params}, h, method=type(model).logits)  # noqa: E731
  logp, ent = chunked_token_logprobs(logits_fn, prev, tokens, chunk=chunk,
                                     with_entropy=with_entropy)
  logp = jnp.where(has_prev, logp, 0.0)
  return logp, (jnp.where(has_prev, ent, 0.0) if with_entropy else None)
