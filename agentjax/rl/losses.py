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

Micro-batches: every loss takes an optional `totals` (`loss_totals` of the WHOLE minibatch's
mask). Given it, a loss over a micro-batch returns that micro-batch's share: the loss and every
metric sum over the micro-batches to the whole minibatch's value, except MAX_METRICS (combined by
max) and the critic's explained variance (`combine_micro_metrics` rebuilds it from moments). Each
aggregation is a per-token weighted sum, sum(loss * w), with w built from the token's own row
(its sequence's token count) and minibatch-wide counts (tokens, sequences, rows): that is what
makes the shares exact.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agentjax.registry import Registry

Array = jax.Array
_F32 = jnp.float32

POLICY_LOSSES = Registry("policy loss")

# Metrics whose micro-batch values combine by max (every other one is a share: they add up).
MAX_METRICS = frozenset({"ratio_max"})

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")


def register_policy_loss(name: str):
  """Decorator: register a policy loss under `name` (the function is returned unchanged)."""
  return POLICY_LOSSES.decorator(name)


def get_policy_loss(name: str) -> Callable:
  """The registered policy loss `name`; a KeyError names the known ones otherwise."""
  return POLICY_LOSSES[name]


# ---------------------------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------------------------


def sequence_sum(x: Array, segment_ids: Array | None = None) -> Array:
  """Per token, the sum of x [B, L] over the token's sequence: its row ([B, 1], broadcasting),
  or with segment_ids [B, L] (several trajectories packed in a row; 0 = none, ids < L) the
  tokens of its row with its id ([B, L])."""
  if segment_ids is None:
    return jnp.sum(x, axis=-1, keepdims=True)
  b, length = x.shape
  ids = (segment_ids + length * jnp.arange(b)[:, None]).reshape(-1)  # unique per (row, id)
  sums = jax.ops.segment_sum(x.reshape(-1), ids, num_segments=b * length)
  return sums[ids].reshape(b, length)


def loss_totals(loss_mask: Array, segment_ids: Array | None = None) -> dict[str, Array]:
  """The minibatch-wide counts the aggregations and the metrics divide by (float32 scalars).

    tokens:    sampled tokens (token-mean, every masked mean)
    sequences: sequences with at least one sampled token (seq-mean-*)
    rows:      every sequence (Dr.GRPO's seq-mean-token-sum-norm counts B rows)

  A sequence is a row, or with segment_ids [B, L] a nonzero id of a row (packed rows; `rows`
  then counts the ids present). Computed once from the whole minibatch's loss_mask [B, L]
  before it is cut into micro-batches, then passed to each micro-batch's loss as `totals`."""
  mask = jnp.asarray(loss_mask).astype(bool)
  if segment_ids is None:
    n_tok = jnp.sum(mask, axis=-1).astype(_F32)  # [B]
    return {"tokens": jnp.sum(n_tok), "sequences": jnp.sum(n_tok > 0).astype(_F32),
            "rows": jnp.asarray(n_tok.shape[0], _F32)}
  b, length = mask.shape
  ids = (segment_ids + length * jnp.arange(b)[:, None]).reshape(-1)
  real = (segment_ids > 0).reshape(-1)
  count = lambda x: jax.ops.segment_sum(x.astype(_F32), ids, num_segments=b * length)  # noqa
  return {"tokens": jnp.sum(mask).astype(_F32),
          "sequences": jnp.sum(count(mask.reshape(-1) & real) > 0).astype(_F32),
          "rows": jnp.sum(count(real) > 0).astype(_F32)}


def aggregate_loss(loss_mat: Array, loss_mask: Array, mode: str = "token-mean",
                   norm_length: int | None = None, totals: dict[str, Array] | None = None,
                   segment_ids: Array | None = None) -> Array:
  """Reduce a per-token loss [B, L] to a scalar over the sampled tokens (verl's agg_loss).

    "token-mean":              sum(loss * mask) / sum(mask)
    "seq-mean-token-sum":      mean over sequences of sum_t(loss * mask)
    "seq-mean-token-mean":     mean over sequences of sum_t(loss * mask) / sum_t(mask)
    "seq-mean-token-sum-norm": sum(loss * mask) / (B * norm_length), Dr.GRPO's constant
                               normalizer (norm_length defaults to L; B counts every row)

  Sequences with no sampled token are left out of the seq-mean modes; an all-masked batch gives
  0 rather than 0/0. totals: `loss_totals` of a larger minibatch this [B, L] is a micro-batch
  of; the result is then this micro-batch's share of the minibatch's loss (the shares add up).
  segment_ids: [B, L] trajectory ids of packed rows (`loss_totals`); sequences are then those.
  """
  mask = jnp.asarray(loss_mask).astype(bool)
  totals = loss_totals(mask, segment_ids) if totals is None else totals
  tok = jnp.where(mask, loss_mat, 0.0)
  if mode == "token-mean":
    return jnp.sum(tok) / jnp.maximum(totals["tokens"], 1.0)
  if mode == "seq-mean-token-sum-norm":
    length = loss_mat.shape[-1] if norm_length is None else norm_length
    return jnp.sum(tok) / (totals["rows"] * length)
  n_seq = jnp.maximum(totals["sequences"], 1.0)
  if segment_ids is not None:  # per token: its share of its own sequence's mean
    if mode == "seq-mean-token-sum":
      return jnp.sum(tok) / n_seq
    if mode == "seq-mean-token-mean":
      n_tok = sequence_sum(mask.astype(_F32), segment_ids)  # [B, L]
      return jnp.sum(tok / jnp.maximum(n_tok, 1.0)) / n_seq
  n_tok = jnp.sum(mask, axis=-1).astype(_F32)  # [B], this row's own count
  has = n_tok > 0
  seq = jnp.sum(tok, axis=-1)
  if mode == "seq-mean-token-sum":
    return jnp.sum(jnp.where(has, seq, 0.0)) / n_seq
  if mode == "seq-mean-token-mean":
    return jnp.sum(jnp.where(has, seq / jnp.maximum(n_tok, 1.0), 0.0)) / n_seq
  raise ValueError(f"unknown aggregation {mode!r}; known: {AGGREGATIONS}")


def combine_micro_metrics(metrics: dict[str, Array],
                          totals: dict[str, Array] | None = None) -> dict[str, Array]:
  """The whole minibatch's metrics from its micro-batches' ([n] per key, computed with the
  minibatch's `totals`): shares summed, MAX_METRICS maxed; the critic's explained variance
  from its moment shares (value_loss with totals; needs `totals` with "return_var")."""
  out = {k: jnp.max(v, axis=0) if k in MAX_METRICS else jnp.sum(v, axis=0)
         for k, v in metrics.items() if not k.startswith("critic/_")}
  if "critic/_err_mean" in metrics:
    err_mean = jnp.sum(metrics["critic/_err_mean"], axis=0)
    var_err = jnp.maximum(jnp.sum(metrics["critic/_err_sq_mean"], axis=0)
                          - jnp.square(err_mean), 0.0)
    out["critic/explained_variance"] = _explained_variance(var_err, totals["return_var"])
  return out


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


def _masked_mean(x: Array, mask: Array, totals: dict[str, Array] | None = None) -> Array:
  """Mean of x [B, L] over the masked slots (totals: a micro-batch's share of the minibatch's)."""
  count = jnp.sum(mask).astype(_F32) if totals is None else totals["tokens"]
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1.0)


def _explained_variance(var_err: Array, var_ret: Array) -> Array:
  return jnp.where(var_ret > 0, 1.0 - var_err / jnp.where(var_ret > 0, var_ret, 1.0), 0.0)


def _clipped_objective(ratio, advantages, mask, logp, old_logp, ref_logp, entropy, *, clip_low,
                       clip_high, dual_clip, kl_coef, kl_estimator, entropy_coef, aggregation,
                       norm_length, totals, segment_ids, clip_scale=None, token_weights=None):
  """Shared tail of PPO and GSPO once the per-token ratio [B, L] is known (masked slots: 1).
  clip_scale: None, or [B, L] per-token scales c of the clip range: the ratio is clipped to
  [1 - c clip_low, 1 + c clip_high] (A²TGPO's adaptive turn-level clip).
  token_weights: None, or [B, L] weights of the policy-gradient term (an off-policy correction,
  agentjax/rl/offpolicy.py; not differentiated, the KL and entropy terms unweighted)."""
  totals = loss_totals(mask, segment_ids) if totals is None else totals
  agg = lambda x: aggregate_loss(x, mask, aggregation, norm_length, totals,  # noqa: E731
                                 segment_ids)
  mean = lambda x: _masked_mean(x, mask, totals)  # noqa: E731
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
  adv = jnp.where(mask, advantages.astype(_F32), 0.0)
  pg1 = -adv * ratio
  low, high = 1.0 - clip_low, 1.0 + clip_high
  if clip_scale is not None:
    scale = jnp.where(mask, jnp.asarray(clip_scale).astype(_F32), 1.0)
    low, high = 1.0 - clip_low * scale, 1.0 + clip_high * scale
  pg2 = -adv * jnp.clip(ratio, low, high)
  pg = jnp.maximum(pg1, pg2)
  clipped = mask & (pg2 > pg1)
  dual = jnp.zeros_like(mask)
  if dual_clip is not None:
    pg3 = -adv * dual_clip  # = dual_clip * |A| where A < 0
    dual = mask & (adv < 0) & (pg > pg3)
    pg = jnp.where(adv < 0, jnp.minimum(pg, pg3), pg)
  if token_weights is not None:
    pg = pg * jax.lax.stop_gradient(jnp.where(mask, jnp.asarray(token_weights).astype(_F32), 0.0))
  loss_mat = pg
  metrics = {"pg_loss": agg(pg)}
  if ref_logp is not None:
    kl = kl_penalty(jnp.where(mask, logp, 0.0), jnp.where(mask, ref_logp, 0.0), kl_estimator)
    loss_mat = loss_mat + kl_coef * kl
    metrics["kl"] = mean(kl)
  elif not isinstance(kl_coef, jax.Array) and kl_coef != 0:
    raise ValueError("kl_coef is set but ref_logp was not given")
  if entropy is not None:
    ent = jnp.where(mask, entropy.astype(_F32), 0.0)
    loss_mat = loss_mat - entropy_coef * ent
    metrics["entropy"] = mean(ent)
  elif not isinstance(entropy_coef, jax.Array) and entropy_coef != 0:
    raise ValueError("entropy_coef is set but entropy was not given")
  loss = agg(loss_mat)
  metrics.update({
      "clip_fraction": mean(clipped),
      "dual_clip_fraction": mean(dual),
      # k1 estimate of KL(pi_old || pi) on the sampled tokens: mean(old_logp - logp).
      "approx_kl": mean(old_logp - logp),
      "ratio_mean": mean(ratio),
      "ratio_max": jnp.max(jnp.where(mask, ratio, 0.0)),
  })
  return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def policy_objective(ratio_fn: Callable[..., Array], logp: Array, old_logp: Array,
                     advantages: Array, loss_mask: Array, *, segment_ids: Array | None = None,
                     **settings) -> tuple[Array, dict[str, Array]]:
  """The clipped policy objective every registered policy loss is, given its ratio:
  ratio_fn(logp, old_logp, mask, advantages, segment_ids) -> [B, L] (1 off the mask), on the
  masked float32 log-probs; `settings` are the loss's keywords (`ppo_loss`'s arguments). A new
  policy loss is a ratio function and a signature that names its defaults (e.g. A²TGPO's
  gspo_turn in agentjax/methods/a2tgpo.py)."""
  mask = jnp.asarray(loss_mask).astype(bool)
  logp = jnp.where(mask, logp.astype(_F32), 0.0)
  old_logp = jnp.where(mask, old_logp.astype(_F32), 0.0)
  ratio = ratio_fn(logp, old_logp, mask, advantages, segment_ids)
  return _clipped_objective(ratio, advantages, mask, logp, old_logp,
                            settings.pop("ref_logp", None), settings.pop("entropy", None),
                            segment_ids=segment_ids, **settings)


def token_ratio(logp: Array, old_logp: Array, mask: Array, advantages: Array,
                segment_ids: Array | None) -> Array:
  """PPO's per-token ratio exp(logp - old_logp) (clamped to [-20, 20] in log space)."""
  del mask, advantages, segment_ids
  return jnp.exp(jnp.clip(logp - old_logp, -20.0, 20.0))


def sequence_ratio(logp: Array, old_logp: Array, mask: Array, advantages: Array,
                   segment_ids: Array | None) -> Array:
  """GSPO's sequence ratio (grouped_ratio over each trajectory: a row, or a packed segment)."""
  del advantages
  return grouped_ratio(logp, old_logp, mask, segment_ids)


# ---------------------------------------------------------------------------------------------
# Losses.
# ---------------------------------------------------------------------------------------------


@register_policy_loss("ppo")
def ppo_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
             ref_logp: Array | None = None, entropy: Array | None = None,
             clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
             kl_coef: float = 0.0, kl_estimator: str = "low_var_kl", entropy_coef: float = 0.0,
             aggregation: str = "token-mean", norm_length: int | None = None,
             totals: dict[str, Array] | None = None,
             segment_ids: Array | None = None,
             clip_scale: Array | None = None,
             token_weights: Array | None = None) -> tuple[Array, dict[str, Array]]:
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
    totals: `loss_totals` of the minibatch this is a micro-batch of (None: of this batch); the
      loss and metrics are then this micro-batch's shares (module docstring).
    segment_ids: optional [B, L] trajectory ids of packed rows (0: none); the seq-mean
      aggregations (and GSPO's ratio) then count trajectories, not rows (`loss_totals`).
    clip_scale: optional [B, L] per-token scale c of the clip range, [1 - c clip_low,
      1 + c clip_high] (a method's loss input: A²TGPO's adaptive turn-level clip).
    token_weights: optional [B, L] weights of the policy-gradient term (an off-policy
      correction: agentjax/rl/offpolicy.importance_weights); not differentiated.
  Returns:
    (loss scalar, metrics): pg_loss, clip_fraction (tokens where the clipped branch was taken),
    dual_clip_fraction, approx_kl = mean(old_logp - logp), ratio_mean, ratio_max, and kl /
    entropy (masked means) when given. All metrics are means over sampled tokens.
  """
  return policy_objective(token_ratio, **locals())  # every argument, as the loss was called


def grouped_ratio(logp: Array, old_logp: Array, mask: Array,
                  groups: Array | None = None) -> Array:
  """The GSPO-token ratio of token groups: rho = exp(logp - sg(logp) + sg(log s_g)), with s_g =
  exp(mean over the group's sampled tokens of (logp - old_logp)) (clamped to [-20, 20] in log
  space): value s_g, gradient through each token's own logp; 1 off the mask. groups: [B, L] ids
  (0: none; sequence_sum's segments), None: each row one group (GSPO's sequence)."""
  n_tok = jnp.maximum(sequence_sum(mask.astype(_F32), groups), 1.0)
  group_log_ratio = sequence_sum(logp - old_logp, groups) / n_tok  # [B, 1] or [B, L]
  log_ratio = logp - jax.lax.stop_gradient(logp) + jax.lax.stop_gradient(group_log_ratio)
  return jnp.where(mask, jnp.exp(jnp.clip(log_ratio, -20.0, 20.0)), 1.0)


@register_policy_loss("gspo")
def gspo_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
              ref_logp: Array | None = None, entropy: Array | None = None,
              clip_low: float = 3e-4, clip_high: float = 4e-4, dual_clip: float | None = None,
              kl_coef: float = 0.0, kl_estimator: str = "low_var_kl", entropy_coef: float = 0.0,
              aggregation: str = "seq-mean-token-mean", norm_length: int | None = None,
              totals: dict[str, Array] | None = None,
              segment_ids: Array | None = None,
              clip_scale: Array | None = None,
              token_weights: Array | None = None) -> tuple[Array, dict[str, Array]]:
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
  return policy_objective(sequence_ratio, **locals())  # every argument, as the loss was called


# ---------------------------------------------------------------------------------------------
# The critic (PPO with a learned value model)
# ---------------------------------------------------------------------------------------------


def value_totals(returns: Array, mask: Array) -> dict[str, Array]:
  """`loss_totals` of a critic minibatch plus the variance of its returns over the masked slots
  ("return_var", for the explained variance of its micro-batches; the returns do not change
  during the update)."""
  mask = jnp.asarray(mask).astype(bool)
  ret = jnp.where(mask, returns, 0.0).astype(_F32)
  ret_mean = _masked_mean(ret, mask)
  return dict(loss_totals(mask), return_var=_masked_mean(jnp.square(ret - ret_mean), mask))


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array, *,
               value_clip: float | None = 0.2, aggregation: str = "token-mean",
               totals: dict[str, Array] | None = None) -> tuple[Array, dict[str, Array]]:
  """The critic's clipped value loss (verl's compute_value_loss) over the masked slots.

    v_clip = old_v + clip(v - old_v, -value_clip, value_clip)
    loss   = 0.5 * max((v - R)^2, (v_clip - R)^2)        (value_clip None: 0.5 (v - R)^2)

  aggregated by `aggregate_loss`. Masked slots may hold garbage: they are selected away first.

  Args:
    values: [B, N] the critic's values now (N token slots, or turns for a turn-level critic).
    old_values: [B, N] its values when the batch was scored (the clip's anchor).
    returns: [B, N] the GAE returns (agentjax/rl/gae.py), the regression target.
    mask: [B, N] bool, the slots that count (sampled tokens, or turns).
    totals: `value_totals` of the minibatch this is a micro-batch of: the loss and metrics are
      then this micro-batch's shares, and the explained variance is replaced by the moment
      shares "critic/_err_mean", "critic/_err_sq_mean" (`combine_micro_metrics` rebuilds it).
  Returns:
    (loss, {"critic/value_loss", "critic/value_clip_fraction", "critic/value_mean",
    "critic/return_mean", "critic/explained_variance"}) — explained variance 1 - Var(R - v) /
    Var(R) over the masked slots (0 when Var(R) is 0).
  """
  mask = jnp.asarray(mask).astype(bool)
  v = jnp.where(mask, values, 0.0).astype(_F32)
  old = jnp.where(mask, old_values, 0.0).astype(_F32)
  ret = jnp.where(mask, returns, 0.0).astype(_F32)
  mean = lambda x: _masked_mean(x, mask, totals)  # noqa: E731
  unclipped = jnp.square(v - ret)
  if value_clip is None:
    per_slot, clipped_frac = 0.5 * unclipped, jnp.zeros((), _F32)
  else:
    v_clip = old + jnp.clip(v - old, -value_clip, value_clip)
    clipped = jnp.square(v_clip - ret)
    per_slot = 0.5 * jnp.maximum(unclipped, clipped)
    clipped_frac = mean((clipped > unclipped).astype(_F32))
  loss = aggregate_loss(per_slot, mask, aggregation, totals=totals)
  err = ret - v
  metrics = {"critic/value_loss": loss, "critic/value_clip_fraction": clipped_frac,
             "critic/value_mean": mean(v), "critic/return_mean": mean(ret)}
  if totals is not None:  # a micro-batch: the variance of the errors needs the whole minibatch
    metrics.update({"critic/_err_mean": mean(err), "critic/_err_sq_mean": mean(jnp.square(err))})
    return loss, metrics
  var_ret = _masked_mean(jnp.square(ret - metrics["critic/return_mean"]), mask)
  var_err = _masked_mean(jnp.square(err - _masked_mean(err, mask)), mask)
  metrics["critic/explained_variance"] = _explained_variance(var_err, var_ret)
  return loss, metrics
