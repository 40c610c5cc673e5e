"""Choosing the next token: greedy, temperature, top-k, top-p."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings (hashable: a jit static argument).

  greedy ignores the others. top_k = 0 and top_p = 1.0 disable those filters.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False

  def __post_init__(self):
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 (or greedy=True), got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def _argmax_vocab_major(x: jax.Array) -> jax.Array:
  """argmax over axis 0 of [V, B] (the first index of the maximum, as jnp.argmax) -> [B] int32.

  As a max, then the smallest index holding it: two plain reductions that XLA:CPU vectorizes,
  ~4x faster than its variadic argmax reduce over the major axis (5.7 ms a decode step at V =
  151936, B = 16). A NaN counts as the maximum, as in jnp.argmax.
  """
  top = jnp.max(x, axis=0)
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
  hit = (x == top[None]) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, index, x.shape[0]), axis=0)


def sample_token(rng: jax.Array, logits: jax.Array, params: SamplingParams,
                 vocab_major: bool = False) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row.

  Args:
    logits: [B, V] float32 next-token logits, or [V, B] with vocab_major=True (the decode loop's
      layout; greedy and plain temperature sampling then need no transpose).
  Returns:
    tokens [B] int32, and their log-probabilities [B] under the temperature-1 distribution
    (the policy's own probability, which the PPO ratio compares against).
  """
  logits = logits.astype(jnp.float32)
  if vocab_major:
    if params.greedy:
      tokens = _argmax_vocab_major(logits)
    elif params.top_k > 0 or params.top_p < 1.0:
      return sample_token(rng, logits.T, params)  # the filters work on [B, V]
    else:  # Gumbel-max, as jax.random.categorical does, with the faster argmax
      tokens = _argmax_vocab_major(logits / params.temperature
                                   + jax.random.gumbel(rng, logits.shape, jnp.float32))
    chosen = logits[tokens, jnp.arange(logits.shape[1])]
    return tokens, chosen - jax.nn.logsumexp(logits, axis=0)
  if params.greedy:
    tokens = jnp.argmax(logits, axis=-1)
  else:
    scaled = logits.astype(jnp.float32) / params.temperature
    neg = jnp.finfo(jnp.float32).min
    if params.top_k > 0 or params.top_p < 1.0:
      # Work on the top candidates only: sorting a 150k vocabulary every step is expensive.
      k = params.top_k if params.top_k > 0 else scaled.shape[-1]
      top_vals, top_idx = jax.lax.top_k(scaled, min(k, scaled.shape[-1]))  # sorted descending
      if params.top_p < 1.0:
        probs = jax.nn.softmax(top_vals, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly better candidates
        top_vals = jnp.where(before < params.top_p, top_vals, neg)
      choice = jax.random.categorical(rng, top_vals, axis=-1)
      tokens = jnp.take_along_axis(top_idx, choice[:, None], axis=-1)[:, 0]
    else:
      tokens = jax.random.categorical(rng, scaled, axis=-1)
  tokens = tokens.astype(jnp.int32)
  # log p(token) = logit - logsumexp: avoids materializing a [B, V] log-softmax every step.
  chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
  return tokens, chosen - jax.nn.logsumexp(logits, axis=-1)
