"""agentjax/rl/offpolicy.py: the sampler-vs-trainer mismatch metrics and the off-policy
corrections (truncated importance sampling, decoupled PPO), against NumPy references; the
corrected PPO loss and its gradient against a NumPy computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rl.losses import ppo_loss
from agentjax.rl.offpolicy import importance_weights, mismatch_metrics


def _case(seed=0, b=4, length=9):
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 1.0, (b, length)).astype(np.float32)
  behav = (old + rng.normal(0.0, 0.8, (b, length))).astype(np.float32)
  mask = rng.random((b, length)) < 0.7
  mask[-1] = False                     # a row without sampled tokens
  behav[0, 0], mask[0, 0] = old[0, 0] - 30.0, True  # a huge ratio (clamped at e^20)
  old[1, 1], mask[1, 1] = np.nan, False            # garbage off the mask
  return old, behav, mask


def _weights_reference(old, behav, mask, mode, cap):
  r = np.exp(np.clip(np.where(mask, old - behav, 0.0), -20, 20))
  w = {"none": np.ones_like(r), "tis": np.minimum(r, cap),
       "decoupled": np.where(r <= cap, r, 0.0)}[mode]
  capped = (r > cap) & mask if mode != "none" else np.zeros_like(mask)
  return np.where(mask, w, 1.0), w[mask].mean(), capped[mask].mean()


@pytest.mark.parametrize("mode", ["none", "tis", "decoupled"])
def test_importance_weights_equal_numpy(mode):
  old, behav, mask = _case()
  w, stats = importance_weights(jnp.asarray(old), jnp.asarray(behav), jnp.asarray(mask), mode,
                                cap=2.0)
  want, mean, capped = _weights_reference(old, behav, mask, mode, 2.0)
  np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5)
  assert float(stats["offpolicy/weight_mean"]) == pytest.approx(mean, rel=1e-5)
  assert float(stats["offpolicy/capped_share"]) == pytest.approx(capped)
  with pytest.raises(ValueError, match="off_policy_correction"):
    importance_weights(jnp.asarray(old), jnp.asarray(behav), jnp.asarray(mask), "vtrace", 2.0)


def test_mismatch_metrics_equal_numpy_and_vanish_on_policy():
  old, behav, mask = _case(1)
  got = {k: float(v) for k, v in mismatch_metrics(jnp.asarray(behav), jnp.asarray(old),
                                                  jnp.asarray(mask)).items()}
  d = np.clip(old - behav, -20, 20)[mask]
  assert got["mismatch/abs_logp_diff"] == pytest.approx(np.abs(d).mean(), rel=1e-5)
  assert got["mismatch/kl"] == pytest.approx((np.exp(d) - 1 - d).mean(), rel=1e-4)
  assert got["mismatch/ratio_out_share"] == pytest.approx(
      ((np.exp(d) < 0.5) | (np.exp(d) > 2.0)).mean())
  same = mismatch_metrics(jnp.asarray(behav), jnp.asarray(behav), jnp.asarray(mask))
  none = mismatch_metrics(jnp.asarray(behav), jnp.asarray(old), jnp.zeros_like(mask))
  assert all(float(v) == 0.0 for v in list(same.values()) + list(none.values()))


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
def test_corrected_ppo_loss_and_gradient_equal_numpy(mode):
  """The token-mean PPO loss with the correction's weights on its policy-gradient term, and its
  gradient in logp: w * (-A * rho) where the unclipped branch is taken, 0 where clipped; the
  weights themselves carry no gradient."""
  old, behav, mask = _case(2)
  old = np.where(mask, old, 0.0).astype(np.float32)
  rng = np.random.default_rng(3)
  logp = (old + rng.normal(0, 0.3, old.shape)).astype(np.float32)
  adv = rng.normal(0, 1, old.shape).astype(np.float32)
  w, _ = importance_weights(jnp.asarray(old), jnp.asarray(behav), jnp.asarray(mask), mode, 2.0)

  def loss(lp):
    return ppo_loss(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                    clip_low=0.2, clip_high=0.28, token_weights=w)[0]

  rho = np.exp(np.clip(logp - old, -20, 20))
  pg1, pg2 = -adv * rho, -adv * np.clip(rho, 0.8, 1.28)
  wn = np.asarray(w)
  want = (wn * np.maximum(pg1, pg2))[mask].mean()
  assert float(loss(jnp.asarray(logp))) == pytest.approx(want, rel=1e-5)
  grad = np.where(mask & (pg1 >= pg2), wn * pg1, 0.0) / mask.sum()
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(jnp.asarray(logp))), grad, atol=1e-6)


def test_config_fields_are_validated_naming_them():
  from configs.base import get_config
  from agentjax.train.config import ConfigError, validate
  c = get_config("demo")
  validate(c)
  c.rl.off_policy_correction = "vtrace"
  with pytest.raises(ConfigError, match=r"config\.rl\.off_policy_correction="):
    validate(c)
  c.rl.off_policy_correction = "tis"
  c.rl.off_policy_cap = 0.0
  with pytest.raises(ConfigError, match=r"config\.rl\.off_policy_cap="):
    validate(c)


def test_the_minibatch_carries_the_samplers_log_probs_only_with_a_correction():
  """policy_minibatch_keys: what the step cuts and the fit check compiles (the fit check's update
  once lacked behav_logp under a correction and failed with a KeyError)."""
  from configs.base import get_config
  from agentjax.train.updates import POLICY_MINIBATCH, policy_minibatch_keys
  c = get_config("demo")
  assert policy_minibatch_keys(c) == POLICY_MINIBATCH
  c.rl.off_policy_correction = "decoupled"
  assert policy_minibatch_keys(c) == POLICY_MINIBATCH + ("behav_logp",)
