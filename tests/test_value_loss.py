"""The critic's clipped value loss and metrics against NumPy (masked slots hold garbage)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentjax.rl.losses import value_loss


def _np_value_loss(v, old, ret, mask, clip):
  m = mask.astype(bool)
  v, old, ret = v[m].astype(np.float64), old[m].astype(np.float64), ret[m].astype(np.float64)
  un = (v - ret) ** 2
  if clip is None:
    per, frac = 0.5 * un, 0.0
  else:
    vc = old + np.clip(v - old, -clip, clip)
    cl = (vc - ret) ** 2
    per, frac = 0.5 * np.maximum(un, cl), float(np.mean(cl > un))
  ev = 1 - np.var(ret - v) / np.var(ret) if np.var(ret) > 0 else 0.0
  return per.mean(), frac, v.mean(), ret.mean(), ev


@pytest.mark.parametrize("clip", [0.2, 0.05, None])
def test_value_loss_and_metrics_match_numpy(clip):
  rng = np.random.default_rng(0)
  shape = (4, 12)
  v, old, ret = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
  mask = rng.random(shape) < 0.6
  garbage = np.where(mask, v, np.nan).astype(np.float32)  # masked slots never leak
  loss, m = value_loss(garbage, old, ret, mask, value_clip=clip)
  ref = _np_value_loss(v, old, ret, mask, clip)
  got = (loss, m["critic/value_clip_fraction"], m["critic/value_mean"], m["critic/return_mean"],
         m["critic/explained_variance"])
  np.testing.assert_allclose([float(x) for x in got], ref, rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda x: value_loss(x, old, ret, mask, value_clip=clip)[0])(garbage)
  assert np.all(np.isfinite(np.asarray(grad))) and not np.asarray(grad)[~mask].any()
  if clip is not None:
    assert 0 < float(m["critic/value_clip_fraction"]) < 1  # both branches were exercised


def test_explained_variance_is_one_for_a_perfect_critic_and_zero_for_constant_returns():
  ret = np.array([[1.0, 2.0, 3.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1, 0]], bool)
  _, m = value_loss(ret, ret, ret, mask)
  assert float(m["critic/explained_variance"]) == pytest.approx(1.0)
  _, m = value_loss(ret, ret, np.full_like(ret, 2.0), mask)
  assert float(m["critic/explained_variance"]) == 0.0
