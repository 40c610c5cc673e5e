"""Tests of agentjax.rl.losses: PPO and GSPO losses, metrics and gradients against plain-loop NumPy
references (values and analytic gradients) written here, with and without jit."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from agentjax.rl import losses as L

SEEDS = (0, 1, 2)
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# ---------------------------------------------------------------------------------------------
# Batches: masked slots hold garbage (NaN, inf, huge) that must not leak anywhere.
# ---------------------------------------------------------------------------------------------


def make_batch(seed, b=6, length=12, extremes=True, seq_adv=False):
  rng = np.random.default_rng(seed)
  mask = (rng.uniform(size=(b, length)) < 0.6).astype(np.float32)
  mask[0] = 0.0  # a row without sampled tokens
  mask[1, :3] = 1.0
  logp = -rng.uniform(0.01, 5.0, size=(b, length))
  diff = rng.normal(0.0, 0.4, size=(b, length))
  diff[rng.uniform(size=(b, length)) < 0.1] *= 5.0  # ratios beyond a dual clip of 3
  if extremes:
    diff[1, 0], diff[1, 1] = 25.0, -25.0  # past the +-20 log-ratio clamp
  old = logp - diff
  if seq_adv:
    adv = np.repeat(rng.normal(size=(b, 1)), length, axis=1)
  else:
    adv = rng.normal(size=(b, length))
  if extremes:
    adv[1, 0] = -1.0  # huge ratio, negative advantage: the dual clip caps it
  ref = logp + rng.normal(0.0, 0.5, size=(b, length))
  if extremes:
    ref[1, 2] = logp[1, 2] + 30.0  # past low_var_kl's clamps
  ent = rng.uniform(0.0, 3.0, size=(b, length))
  garbage = np.array([np.nan, np.inf, -np.inf, 1e30])
  off = mask == 0
  for x in (logp, old, adv, ref, ent):
    x[off] = rng.choice(garbage, size=off.sum())
  f = lambda x: x.astype(np.float32)
  return dict(logp=f(logp), old_logp=f(old), advantages=f(adv), loss_mask=mask, ref_logp=f(ref),
              entropy=f(ent))


# ---------------------------------------------------------------------------------------------
# NumPy reference: per-token loss and its analytic derivative w.r.t. logp, then aggregation.
# ---------------------------------------------------------------------------------------------


def ref_agg_weights(mask, mode):
  b, length = mask.shape
  n_tok = mask.sum(axis=1)
  n_seq = max(int((n_tok > 0).sum()), 1)
  w = np.zeros(mask.shape)
  for i in range(b):
    for t in range(length):
      if not mask[i, t]:
        continue
      if mode == "token-mean":
        w[i, t] = 1.0 / max(mask.sum(), 1)
      elif mode == "seq-mean-token-sum":
        w[i, t] = 1.0 / n_seq
      elif mode == "seq-mean-token-mean":
        w[i, t] = 1.0 / (n_seq * n_tok[i])
      else:
        w[i, t] = 1.0 / (b * length)
  return w


def ref_kl(lp, rf, est):
  """(kl, d kl / d lp) for one token."""
  if est == "k1":
    return lp - rf, 1.0
  if est == "k2":
    return 0.5 * (lp - rf) ** 2, lp - rf
  d = rf - lp
  if est == "k3":
    return np.exp(d) - d - 1.0, 1.0 - np.exp(d)
  inside = -20.0 < d < 20.0
  dc = min(max(d, -20.0), 20.0)
  k = np.exp(dc) - dc - 1.0
  g = (1.0 - np.exp(dc)) if inside else 0.0
  if not -10.0 < k < 10.0:
    k, g = min(max(k, -10.0), 10.0), 0.0
  return k, g


def ref_loss(batch, *, seq_ratio=False, clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0,
             kl_estimator="low_var_kl", entropy_coef=0.0, aggregation="token-mean",
             use_ref=False, use_ent=False):
  lp = batch["logp"].astype(np.float64)
  old = batch["old_logp"].astype(np.float64)
  adv = batch["advantages"].astype(np.float64)
  mask = batch["loss_mask"]
  b, length = mask.shape
  loss_mat, grad_mat = np.zeros((b, length)), np.zeros((b, length))
  clipped, dual, ratios, kls, approx = [], [], [], [], []
  for i in range(b):
    toks = [t for t in range(length) if mask[i, t]]
    if not toks:
      continue
    seq_mean = np.mean([lp[i, t] - old[i, t] for t in toks])
    for t in toks:
      d = seq_mean if seq_ratio else lp[i, t] - old[i, t]
      rho = np.exp(min(max(d, -20.0), 20.0))
      g_rho = rho if -20.0 < d < 20.0 else 0.0  # d rho / d logp[i, t] (token-own path for GSPO)
      a = adv[i, t]
      pg1 = -a * rho
      pg2 = -a * min(max(rho, 1.0 - clip_low), 1.0 + clip_high)
      if pg2 > pg1:
        pg, g, c = pg2, 0.0, 1
      else:
        pg, g, c = pg1, -a * g_rho, 0
      du = 0
      if dual_clip is not None and a < 0 and pg > -a * dual_clip:
        pg, g, du = -a * dual_clip, 0.0, 1
      total = pg
      if use_ref:
        k, gk = ref_kl(lp[i, t], float(batch["ref_logp"][i, t]), kl_estimator)
        total += kl_coef * k
        g += kl_coef * gk
        kls.append(k)
      if use_ent:
        total -= entropy_coef * float(batch["entropy"][i, t])
      loss_mat[i, t], grad_mat[i, t] = total, g
      clipped.append(c)
      dual.append(du)
      ratios.append(rho)
      approx.append(old[i, t] - lp[i, t])
  w = ref_agg_weights(mask, aggregation)
  metrics = {"clip_fraction": np.mean(clipped), "dual_clip_fraction": np.mean(dual),
             "ratio_mean": np.mean(ratios), "ratio_max": np.max(ratios),
             "approx_kl": np.mean(approx)}
  if use_ref:
    metrics["kl"] = np.mean(kls)
  if use_ent:
    metrics["entropy"] = np.mean(batch["entropy"][mask > 0])
  return (loss_mat * w).sum(), grad_mat * w, metrics


def call(loss_fn, batch, use_ref, use_ent):
  kw = dict(batch)
  if not use_ref:
    kw.pop("ref_logp")
  if not use_ent:
    kw.pop("entropy")
  return loss_fn(**kw)


def assert_close(x, y, rtol=1e-4, atol=1e-5):
  np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------------------------


class PolicyLossTest(chex.TestCase):

  def _check(self, name, cfg, seeds=SEEDS, seq_adv=False):
    use_ref = cfg.get("kl_coef", 0.0) != 0.0
    use_ent = cfg.get("entropy_coef", 0.0) != 0.0
    loss_fn = functools.partial(L.get_policy_loss(name), **cfg)
    fwd = self.variant(lambda b: call(loss_fn, b, use_ref, use_ent))
    grad = self.variant(jax.grad(lambda lp, b: call(loss_fn, {**b, "logp": lp}, use_ref,
                                                    use_ent)[0]))
    defaults = {"ppo": dict(clip_low=0.2, clip_high=0.2),
                "gspo": dict(clip_low=3e-4, clip_high=4e-4,
                             aggregation="seq-mean-token-mean")}[name]
    for seed in seeds:
      batch = make_batch(seed, seq_adv=seq_adv)
      loss, metrics = fwd(batch)
      want_loss, want_grad, want_metrics = ref_loss(
          batch, seq_ratio=name == "gspo", use_ref=use_ref, use_ent=use_ent,
          **{**defaults, **cfg})
      assert np.isfinite(float(loss))
      assert_close(loss, want_loss)
      for k, v in want_metrics.items():
        assert_close(metrics[k], v)
      g = np.asarray(grad(batch["logp"], batch))
      assert np.all(np.isfinite(g))
      np.testing.assert_array_equal(g[batch["loss_mask"] == 0], 0.0)
      assert_close(g, want_grad, atol=1e-6)
      assert 0 < want_metrics["clip_fraction"] < 1  # the random cases exercise both branches

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*AGGS)
  def test_ppo_aggregations(self, aggregation):
    self._check("ppo", dict(aggregation=aggregation, clip_high=0.28))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("k1", "k2", "k3", "low_var_kl")
  def test_ppo_kl_entropy_dual_clip(self, kl_estimator):
    self._check("ppo", dict(kl_coef=0.1, kl_estimator=kl_estimator, entropy_coef=0.01,
                            dual_clip=3.0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_ppo_dual_clip_active(self):
    batch = make_batch(0)
    _, _, m = ref_loss(batch, dual_clip=3.0)
    assert m["dual_clip_fraction"] > 0  # the data does reach the dual clip
    _, metrics = self.variant(functools.partial(L.ppo_loss, dual_clip=3.0))(
        batch["logp"], batch["old_logp"], batch["advantages"], batch["loss_mask"])
    assert_close(metrics["dual_clip_fraction"], m["dual_clip_fraction"])
    with pytest.raises(ValueError, match="dual_clip"):
      L.ppo_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["loss_mask"],
                 dual_clip=0.5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("seq-mean-token-mean", "token-mean")
  def test_gspo(self, aggregation):
    self._check("gspo", dict(aggregation=aggregation, clip_low=0.05, clip_high=0.08),
                seeds=(0, 1, 2, 3, 4))

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_kl_and_default_clip(self):
    self._check("gspo", dict(kl_coef=0.05, kl_estimator="k3", entropy_coef=0.01, clip_low=0.05,
                             clip_high=0.08, dual_clip=2.0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_matches_sequence_level_gradient(self):
    # Sequence-level GSPO written directly: s_b = exp(mean_t(logp - old)) differentiated through
    # the mean. With a per-sequence advantage and seq-mean-token-mean it equals GSPO-token.
    def seq_gspo(lp, old, a, mask, lo, hi):
      m = mask > 0
      n = jnp.sum(m, axis=1)
      s = jnp.exp(jnp.sum(jnp.where(m, lp - old, 0.0), axis=1) / jnp.maximum(n, 1))
      a = jnp.sum(jnp.where(m, a, 0.0), axis=1) / jnp.maximum(n, 1)  # constant per row
      per_seq = jnp.maximum(-a * s, -a * jnp.clip(s, 1 - lo, 1 + hi))
      return jnp.sum(jnp.where(n > 0, per_seq, 0.0)) / jnp.sum(n > 0)

    for seed in SEEDS:
      batch = make_batch(seed, extremes=False, seq_adv=True)
      clean = {k: np.where(batch["loss_mask"] > 0, v, 0.0).astype(np.float32)
               for k, v in batch.items()}
      args = (clean["old_logp"], clean["advantages"], clean["loss_mask"])
      g_ref = jax.grad(seq_gspo)(clean["logp"], *args, 0.05, 0.08)
      g = self.variant(jax.grad(lambda lp: L.gspo_loss(lp, *args, clip_low=0.05,
                                                       clip_high=0.08)[0]))(clean["logp"])
      assert_close(g, np.asarray(g_ref), atol=1e-6)
      assert_close(L.gspo_loss(clean["logp"], *args, clip_low=0.05, clip_high=0.08)[0],
                   float(seq_gspo(clean["logp"], *args, 0.05, 0.08)))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("ppo", "gspo")
  def test_first_step_on_policy(self, name):
    batch = make_batch(5)
    lp = batch["logp"]
    mask = batch["loss_mask"]
    fn = self.variant(lambda x: L.get_policy_loss(name)(x, x, batch["advantages"], mask,
                                                        aggregation="token-mean"))
    loss, m = fn(lp)
    assert_close(m["ratio_mean"], 1.0, atol=0)
    assert_close(m["ratio_max"], 1.0, atol=0)
    assert_close(m["clip_fraction"], 0.0, atol=0)
    assert_close(m["dual_clip_fraction"], 0.0, atol=0)
    assert_close(m["approx_kl"], 0.0, atol=0)
    a = np.where(mask > 0, batch["advantages"], 0.0)
    assert_close(loss, -a.sum() / mask.sum())
    # logp == old_logp as separate inputs (the gradient is w.r.t. logp only).
    g = self.variant(jax.grad(lambda x: L.get_policy_loss(name)(
        x, lp, batch["advantages"], mask)[0]))(lp)
    if name == "ppo":
      assert_close(g, -a / mask.sum(), atol=1e-7)
    np.testing.assert_array_equal(np.asarray(g)[mask == 0], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_entropy_gradient(self):
    batch = make_batch(2)
    g = self.variant(jax.grad(lambda e: L.ppo_loss(
        batch["logp"], batch["old_logp"], batch["advantages"], batch["loss_mask"], entropy=e,
        entropy_coef=0.01, aggregation="seq-mean-token-sum")[0]))(batch["entropy"])
    w = ref_agg_weights(batch["loss_mask"], "seq-mean-token-sum")
    assert_close(g, -0.01 * w, atol=1e-8)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*AGGS)
  def test_aggregate_loss(self, mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7)).astype(np.float32)
    mask = (rng.uniform(size=(5, 7)) < 0.5).astype(np.float32)
    mask[2] = 0.0
    got = self.variant(functools.partial(L.aggregate_loss, mode=mode))(x, mask)
    assert_close(got, (x * ref_agg_weights(mask, mode)).sum())
    empty = self.variant(functools.partial(L.aggregate_loss, mode=mode))(x, np.zeros_like(mask))
    assert float(empty) == 0.0

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("k1", "k2", "k3", "low_var_kl")
  def test_kl_penalty(self, est):
    rng = np.random.default_rng(1)
    lp = -rng.uniform(0, 5, size=(4, 6)).astype(np.float32)
    rf = (lp + rng.normal(0, 3, size=(4, 6))).astype(np.float32)
    rf[0, 0] = lp[0, 0] + 25.0
    got = np.asarray(self.variant(functools.partial(L.kl_penalty, estimator=est))(lp, rf))
    want = np.vectorize(lambda a, b: ref_kl(a, b, est)[0])(lp.astype(np.float64),
                                                           rf.astype(np.float64))
    assert_close(got, want, rtol=1e-4, atol=1e-4)
    if est == "low_var_kl":
      assert got.max() <= 10.0


def test_registry_and_errors():
  assert {"ppo", "gspo"} <= set(L.POLICY_LOSSES)
  with pytest.raises(KeyError, match=r"'cispo'.*known: .*'ppo'"):
    L.get_policy_loss("cispo")
  batch = make_batch(0)
  args = (batch["logp"], batch["old_logp"], batch["advantages"], batch["loss_mask"])
  with pytest.raises(ValueError, match="aggregation"):
    L.ppo_loss(*args, aggregation="sum")
  with pytest.raises(ValueError, match="KL estimator"):
    L.ppo_loss(*args, ref_logp=batch["ref_logp"], kl_coef=0.1, kl_estimator="k4")
  with pytest.raises(ValueError, match="ref_logp"):
    L.ppo_loss(*args, kl_coef=0.1)
  with pytest.raises(ValueError, match="entropy"):
    L.ppo_loss(*args, entropy_coef=0.1)
  # bool masks work like float ones.
  a = L.ppo_loss(*args[:3], batch["loss_mask"] > 0)[0]
  b = L.ppo_loss(*args)[0]
  assert float(a) == float(b)
