"""The gap between the policy that sampled a rollout and the one the trainer scores it with: its
metrics (every run) and the corrections of the policy loss (rl.off_policy_correction).

    w, stats = importance_weights(old_logp, behav_logp, loss_mask, "tis", cap=2.0)
    loss, metrics = ppo_loss(logp, old_logp, adv, loss_mask, token_weights=w)
    mismatch_metrics(behav_logp, old_logp, loss_mask)   # "mismatch/*", logged by every step

Three log-probabilities per sampled token, [B, L] each:
  behav_logp  the sampler's (TrajectoryBatch.logprobs: the decode loop's temperature-1 log-prob
              of the token it drew, with the parameters it sampled with)
  old_logp    the trainer's scoring pass with the parameters at the start of the update (the
              "proximal" policy; the PPO ratio's denominator)
  logp        the parameters being updated
On CPU in float32 with the same parameters behav_logp and old_logp agree to rounding; in bf16 on
an accelerator (different kernels for decode and training) or with stale parameters (async) they
do not, and PPO's ratio against old_logp alone ignores that the tokens came from another policy.

Corrections (a per-token weight w on the policy-gradient term, never differentiated; the KL and
entropy terms are not weighted), with r_b = exp(old_logp - behav_logp):
  none       w = 1 (the on-policy PPO every run had before)
  tis        w = min(r_b, cap): truncated importance sampling (verl's rollout-training mismatch
             correction, Yao et al. 2025; cap 2 there)
  decoupled  w = r_b where r_b <= cap, else 0: decoupled PPO (AReaL: the behaviour importance
             weight with the proximal policy's clip; tokens above behav_imp_weight_cap are
             dropped from the loss)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array
CORRECTIONS = ("none", "tis", "decoupled")
# The ratio band whose outside share mismatch_metrics reports.
RATIO_BAND = (0.5, 2.0)


def importance_weights(old_logp: Array, behav_logp: Array, loss_mask: Array, mode: str,
                       cap: float) -> tuple[Array, dict[str, Array]]:
  """[B, L] float32 per-token weights of `mode` (module docstring; 1 off the mask), and
  {"offpolicy/weight_mean", "offpolicy/capped_share"} over the masked tokens (capped: truncated
  by tis, dropped by decoupled)."""
  if mode not in CORRECTIONS:
    raise ValueError(f"rl.off_policy_correction={mode!r}: must be one of {list(CORRECTIONS)}")
  if not cap > 0:
    raise ValueError(f"rl.off_policy_cap must be > 0, got {cap}")
  mask = jnp.asarray(loss_mask).astype(bool)
  log_r = jnp.where(mask, jnp.clip(old_logp.astype(jnp.float32)
                                   - behav_logp.astype(jnp.float32), -20.0, 20.0), 0.0)
  r = jnp.exp(log_r)
  if mode == "none":
    w, capped = jnp.ones_like(r), jnp.zeros_like(mask)
  elif mode == "tis":
    w, capped = jnp.minimum(r, cap), r > cap
  else:
    w, capped = jnp.where(r <= cap, r, 0.0), r > cap
  w = jax.lax.stop_gradient(jnp.where(mask, w, 1.0))
  n = jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)
  stats = {"offpolicy/weight_mean": jnp.sum(jnp.where(mask, w, 0.0)) / n,
           "offpolicy/capped_share": jnp.sum(mask & capped) / n}
  return w, stats


@jax.jit
def mismatch_metrics(behav_logp: Array, old_logp: Array, loss_mask: Array) -> dict[str, Array]:
  """The sampler-vs-trainer gap over the sampled tokens (loss_mask), with d = old_logp -
  behav_logp per token:
    mismatch/abs_logp_diff   mean |d|
    mismatch/kl              mean (exp(d) - 1 - d): the k3 estimate of KL(sampler || trainer)
                             from the sampler's own tokens (>= 0, low variance)
    mismatch/ratio_out_share share of tokens whose ratio exp(d) is outside RATIO_BAND
  All 0 for a batch without sampled tokens."""
  mask = jnp.asarray(loss_mask).astype(bool)
  d = jnp.where(mask, jnp.clip(old_logp.astype(jnp.float32) - behav_logp.astype(jnp.float32),
                               -20.0, 20.0), 0.0)
  n = jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)
  low, high = (math.log(x) for x in RATIO_BAND)
  return {"mismatch/abs_logp_diff": jnp.sum(jnp.abs(d)) / n,
          "mismatch/kl": jnp.sum(jnp.where(mask, jnp.expm1(d) - d, 0.0)) / n,
          "mismatch/ratio_out_share": jnp.sum(mask & ((d < low) | (d > high))) / n}


__all__ = ["CORRECTIONS", "RATIO_BAND", "importance_weights", "mismatch_metrics"]
