"""Clipped policy-gradient losses: PPO (token-level ratio) and GSPO (sequence-level ratio).

  loss_fn = get_policy_loss("ppo")
  loss, metrics = loss_fn(logp, old_logp, adv, loss_mask, ref_logp=ref, kl_coef=1e-3,
                          clip_high=0.28, aggregation="token-mean")
  grads = jax.grad(lambda lp: loss_fn(lp, old_logp, adv, loss_mask)[0])(logp)

All inputs are [B, L] over the token slots of B trajectories; only tokens with loss_mask count,
anywhere (loss and metrics). Values at masked slots may be garbage (even inf/NaN): they are
selected away with `where` before any arithmetic, so their gradients are exactly 0.

Per token, with log-ratio d = clamp(logp - old_logp, -20, 20) and ratio rho = exp(d) in float32:

  pg   = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
  pg   = min(pg, dual_clip * |A|)         where A < 0 and dual_clip is set (verl's dual clip)
  loss = pg + kl_coef * KL(logp, ref_logp) - entropy_coef * entropy

aggregated by `aggregate_loss`. GSPO replaces rho by the sequence ratio (see `gspo_loss`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32

POLICY_LOSSES: dict[str, Callable] = {}

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")


def register_policy_loss(name: str):
  """Decorator: register a policy loss under `name` (the function is returned unchanged)."""

  def deco(fn: Callable) -> Callable:
    if name in POLICY_LOSSES:
      raise ValueError(f"policy loss {name!r} is already registered")
    POLICY_LOSSES[name] = fn
    return fn

  return deco


def get_policy_loss(name: str) -> Callable:
  """The registered policy loss `name`; a KeyError names the known ones otherwise."""
  try:
    return POLICY_LOSSES[name]
  except KeyError:
    raise KeyError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}") from None


# ---------------------------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------------------------


def aggregate_loss(loss_mat: Array, loss_mask: Array, mode: str = "token-mean",
                   norm_length: int | None = None) -> Array:
  """Reduce a per-token loss [B, L] to a scalar over the sampled tokens (verl's agg_loss).

    "token-mean":              sum(loss * mask) / sum(mask)
    "seq-mean-token-sum":      mean over sequences of sum_t(loss * mask)
    "seq-mean-token-mean":     mean over sequences of sum_t(loss * mask) / sum_t(mask)
    "seq-mean-token-sum-norm": sum(loss * mask) / (B * norm_length), Dr.GRPO's constant
                               normalizer (norm_length defaults to L; B counts every row)

  Sequences with no sampled token are left out of the seq-mean modes; an all-masked batch gives
  0 rather than 0/0.
  """
  mask = jnp.asarray(loss_mask).astype(bool)
  tok = jnp.where(mask, loss_mat, 0.0)
  n_tok = jnp.sum(mask, axis=-1).astype(_F32)  # [B]
  if mode == "token-mean":
    return jnp.sum(tok) / jnp.maximum(jnp.sum(n_tok), 1.0)
  if mode == "seq-mean-token-sum-norm":
    length = loss_mat.shape[-1] if norm_length is None else norm_length
    return jnp.sum(tok) / (loss_mat.shape[0] * length)
  has = n_tok > 0
  n_seq = jnp.maximum(jnp.sum(has).astype(_F32), 1.0)
  seq = jnp.sum(tok, axis=-1)
  if mode == "seq-mean-token-sum":
    return jnp.sum(jnp.where(has, seq, 0.0)) / n_seq
  if mode == "seq-mean-token-mean":
    return jnp.sum(jnp.where(has, seq / jnp.maximum(n_tok, 1.0), 0.0)) / n_seq
  raise ValueError(f"unknown aggregation {mode!r}; known: {AGGREGATIONS}")


def kl_penalty(logp: Array, ref_logp: Array, estimator: str = "low_var_kl") -> Array:
  """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs (verl's kl_penalty).

    "k1":         logp - ref_logp
    "k2":         0.5 * (logp - ref_logp)^2
    "k3":         exp(ref - logp) - (ref - logp) - 1   (unbiased, >= 0)
    "low_var_kl": k3 with ref - logp clamped to [-20, 20] and the result to [-10, 10] (verl)
  """
  logp, ref_logp = logp.astype(_F32), ref_logp.astype(_F32)
  if estimator == "k1":
    return logp - ref_logp
  if estimator == "k2":
    return 0.5 * jnp.square(logp - ref_logp)
  if estimator in ("k3", "low_var_kl"):
    d = ref_logp - logp
    if estimator == "low_var_kl":
      d = jnp.clip(d, -20.0, 20.0)
    k3 = jnp.exp(d) - d - 1.0
    return jnp.clip(k3, -10.0, 10.0) if estimator == "low_var_kl" else k3
  raise ValueError(f"unknown KL estimator {estimator!r}; known: {KL_ESTIMATORS}")


def _masked_mean(x: Array, mask: Array) -> Array:
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask).astype(_F32), 1.0)


def _clipped_objective(ratio, advantages, mask, logp, old_logp, ref_logp, entropy, *, clip_low,
                       clip_high, dual_clip, kl_coef, kl_estimator, entropy_coef, aggregation,
                       norm_length):
  """Shared tail of PPO and GSPO once the per-token ratio [B, L] is known (masked slots: 1)."""
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
  adv = jnp.where(mask, advantages.astype(_F32), 0.0)
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  pg = jnp.maximum(pg1, pg2)
  clipped = mask & (pg2 > pg1)
  dual = jnp.zeros_like(mask)
  if dual_clip is not None:
    pg3 = -adv * dual_clip  # = dual_clip * |A| where A < 0
    dual = mask & (adv < 0) & (pg > pg3)
    pg = jnp.where(adv < 0, jnp.minimum(pg, pg3), pg)
  loss_mat = pg
  metrics = {"pg_loss": aggregate_loss(pg, mask, aggregation, norm_length)}
  if ref_logp is not None:
    kl = kl_penalty(jnp.where(mask, logp, 0.0), jnp.where(mask, ref_logp, 0.0), kl_estimator)
    loss_mat = loss_mat + kl_coef * kl
    metrics["kl"] = _masked_mean(kl, mask)
  elif not isinstance(kl_coef, jax.Array) and kl_coef != 0:
    raise ValueError("kl_coef is set but ref_logp was not given")
  if entropy is not None:
    ent = jnp.where(mask, entropy.astype(_F32), 0.0)
    loss_mat = loss_mat - entropy_coef * ent
    metrics["entropy"] = _masked_mean(ent, mask)
  elif not isinstance(entropy_coef, jax.Array) and entropy_coef != 0:
    raise ValueError("entropy_coef is set but entropy was not given")
  loss = aggregate_loss(loss_mat, mask, aggregation, norm_length)
  metrics.update({
      "clip_fraction": _masked_mean(clipped, mask),
      "dual_clip_fraction": _masked_mean(dual, mask),
      # k1 estimate of KL(pi_old || pi) on the sampled tokens: mean(old_logp - logp).
      "approx_kl": _masked_mean(old_logp - logp, mask),
      "ratio_mean": _masked_mean(ratio, mask),
      "ratio_max": jnp.max(jnp.where(mask, ratio, 0.0)),
  })
  return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def _prepare(logp, old_logp, loss_mask):
  mask = jnp.asarray(loss_mask).astype(bool)
  logp = jnp.where(mask, logp.astype(_F32), 0.0)
  old_logp = jnp.where(mask, old_logp.astype(_F32), 0.0)
  return logp, old_logp, mask


# ---------------------------------------------------------------------------------------------
# Losses.
# ---------------------------------------------------------------------------------------------


@register_policy_loss("ppo")
def ppo_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
             ref_logp: Array | None = None, entropy: Array | None = None,
             clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
             kl_coef: float = 0.0, kl_estimator: str = "low_var_kl", entropy_coef: float = 0.0,
             aggregation: str = "token-mean",
             norm_length: int | None = None) -> tuple[Array, dict[str, Array]]:
  """PPO clipped surrogate with a per-token ratio exp(logp - old_logp).

  Args:
    logp: [B, L] current log-probs of the taken tokens (differentiated).
    old_logp: [B, L] behaviour-policy log-probs.
    advantages: [B, L].
    loss_mask: [B, L] bool or 0/1.
    ref_logp: optional [B, L] reference log-probs; adds kl_coef * KL(logp, ref_logp).
    entropy: optional [B, L] per-token policy entropy; subtracts entropy_coef * entropy.
    clip_low / clip_high: ratio clip range [1 - clip_low, 1 + clip_high] (DAPO: high = 0.28).
    dual_clip: None or c > 1: for A < 0 the loss is capped at c * |A|.
    kl_coef, kl_estimator: see `kl_penalty`.
    entropy_coef: entropy bonus weight.
    aggregation, norm_length: see `aggregate_loss`.
  Returns:
    (loss scalar, metrics): pg_loss, clip_fraction (tokens where the clipped branch was taken),
    dual_clip_fraction, approx_kl = mean(old_logp - logp), ratio_mean, ratio_max, and kl /
    entropy (masked means) when given. All metrics are means over sampled tokens.
  """
  logp, old_logp, mask = _prepare(logp, old_logp, loss_mask)
  ratio = jnp.exp(jnp.clip(logp - old_logp, -20.0, 20.0))
  return _clipped_objective(ratio, advantages, mask, logp, old_logp, ref_logp, entropy,
                            clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                            kl_coef=kl_coef, kl_estimator=kl_estimator,
                            entropy_coef=entropy_coef, aggregation=aggregation,
                            norm_length=norm_length)


@register_policy_loss("gspo")
def gspo_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
              ref_logp: Array | None = None, entropy: Array | None = None,
              clip_low: float = 3e-4, clip_high: float = 4e-4, dual_clip: float | None = None,
              kl_coef: float = 0.0, kl_estimator: str = "low_var_kl", entropy_coef: float = 0.0,
              aggregation: str = "seq-mean-token-mean",
              norm_length: int | None = None) -> tuple[Array, dict[str, Array]]:
  """GSPO: the PPO objective with a sequence-level ratio, in its "GSPO-token" form.

  The sequence ratio s_b = exp(mean over b's sampled tokens of (logp - old_logp)) is applied to
  every token of b, as rho[b, t] = exp(logp[b,t] - sg(logp[b,t]) + sg(log s_b)) (clamped to
  [-20, 20] in log space): its value is s_b, and its gradient flows through each token's own
  logp (d rho / d logp[b,t] = s_b). With an advantage constant over the sequence and the default
  "seq-mean-token-mean" aggregation this is exactly sequence-level GSPO (same value, same
  gradient s_b * A_b / |y_b| per token); with per-token (turn-level) advantages each token keeps
  its own advantage. Clipping is of s_b, so it switches on or off for whole sequences. Default
  clip range is the GSPO paper's (3e-4, 4e-4). Arguments and metrics as in `ppo_loss`.
  """
  logp, old_logp, mask = _prepare(logp, old_logp, loss_mask)
  n_tok = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True).astype(_F32), 1.0)
  seq_log_ratio = jnp.sum(logp - old_logp, axis=-1, keepdims=True) / n_tok  # [B, 1]
  log_ratio = logp - jax.lax.stop_gradient(logp) + jax.lax.stop_gradient(seq_log_ratio)
  ratio = jnp.where(mask, jnp.exp(jnp.clip(log_ratio, -20.0, 20.0)), 1.0)
  return _clipped_objective(ratio, advantages, mask, logp, old_logp, ref_logp, entropy,
                            clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                            kl_coef=kl_coef, kl_estimator=kl_estimator,
                            entropy_coef=entropy_coef, aggregation=aggregation,
                            norm_length=norm_length)


# ---------------------------------------------------------------------------------------------
# The critic (PPO with a learned value model)
# ---------------------------------------------------------------------------------------------


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array, *,
               value_clip: float | None = 0.2, aggregation: str = "token-mean"
               ) -> tuple[Array, dict[str, Array]]:
  """The critic's clipped value loss (verl's compute_value_loss) over the masked slots.

    v_clip = old_v + clip(v - old_v, -value_clip, value_clip)
    loss   = 0.5 * max((v - R)^2, (v_clip - R)^2)        (value_clip None: 0.5 (v - R)^2)

  aggregated by `aggregate_loss`. Masked slots may hold garbage: they are selected away first.

  Args:
    values: [B, N] the critic's values now (N token slots, or turns for a turn-level critic).
    old_values: [B, N] its values when the batch was scored (the clip's anchor).
    returns: [B, N] the GAE returns (agentjax/rl/gae.py), the regression target.
    mask: [B, N] bool, the slots that count (sampled tokens, or turns).
  Returns:
    (loss, {"critic/value_loss", "critic/value_clip_fraction", "critic/value_mean",
    "critic/return_mean", "critic/explained_variance"}) — explained variance 1 - Var(R - v) /
    Var(R) over the masked slots (0 when Var(R) is 0).
  """
  mask = jnp.asarray(mask).astype(bool)
  v = jnp.where(mask, values, 0.0).astype(_F32)
  old = jnp.where(mask, old_values, 0.0).astype(_F32)
  ret = jnp.where(mask, returns, 0.0).astype(_F32)
  unclipped = jnp.square(v - ret)
  if value_clip is None:
    per_slot, clipped_frac = 0.5 * unclipped, jnp.zeros((), _F32)
  else:
    v_clip = old + jnp.clip(v - old, -value_clip, value_clip)
    clipped = jnp.square(v_clip - ret)
    per_slot = 0.5 * jnp.maximum(unclipped, clipped)
    clipped_frac = _masked_mean((clipped > unclipped).astype(_F32), mask)
  loss = aggregate_loss(per_slot, mask, aggregation)
  ret_mean = _masked_mean(ret, mask)
  var_ret = _masked_mean(jnp.square(ret - ret_mean), mask)
  err = ret - v
  var_err = _masked_mean(jnp.square(err - _masked_mean(err, mask)), mask)
  explained = jnp.where(var_ret > 0, 1.0 - var_err / jnp.where(var_ret > 0, var_ret, 1.0), 0.0)
  return loss, {"critic/value_loss": loss, "critic/value_clip_fraction": clipped_frac,
                "critic/value_mean": _masked_mean(v, mask), "critic/return_mean": ret_mean,
                "critic/explained_variance": explained}
