"""A²TGPO (agentjax/methods/a2tgpo.py, configs/a2tgpo.py): the estimator against NumPy loops on
edge cases, the turn-level-ratio loss against NumPy, the registry entry and the config file."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.methods import a2tgpo as a2
from agentjax.methods import get_method
from agentjax.rl import advantages as adv_lib
from agentjax.rl import losses as losses_lib
from agentjax.train import config as config_lib
from agentjax.train.config import ConfigError
from agentjax.train.updates import advantage_kwargs, policy_loss_config
from configs import a2tgpo as a2tgpo_config
from configs import base

B, T, L = 12, 4, 24

# One compile per setting tuple; every call below uses the shapes [B, T] / [B, L].
_estimator = jax.jit(a2.a2tgpo_advantages,
                     static_argnames=("gamma", "alpha", "rescale", "scale_by_std", "clip_beta",
                                      "adaptive_clip", "std_estimator", "eps", "collapse_tol"))

SETTINGS = (
    dict(),  # the defaults: gamma 1, alpha 0.3, sqrt_terms, population std + 1e-6
    dict(gamma=0.9, alpha=0.5, rescale="sqrt_discounted", std_estimator="sqrt_var_eps",
         eps=1e-8, clip_beta=0.2),
    dict(gamma=0.8, alpha=1.0, rescale="none", scale_by_std=False, std_estimator="unbiased"),
)


# ---------------------------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------------------------


def layout(num_turns, rng, pad_rows=()):
  """turn_id, loss_mask [B, L]: prompt (-1), per turn 1-3 sampled tokens (mask 1) and, except
  after the last turn, 0-2 observation tokens (mask 0); padding slots (-1) after. Rows in
  pad_rows are all padding."""
  turn_id = np.full((B, L), -1, np.int32)
  mask = np.zeros((B, L), np.float32)
  for i in range(B):
    if i in pad_rows:
      continue
    pos = int(rng.integers(1, 3))
    for k in range(num_turns[i]):
      n = int(rng.integers(1, 4))
      turn_id[i, pos:pos + n], mask[i, pos:pos + n] = k, 1.0
      pos += n
      if k < num_turns[i] - 1:
        n = int(rng.integers(0, 3))
        turn_id[i, pos:pos + n] = k
        pos += n
    assert pos < L  # at least one padding slot per row
  return turn_id, mask


def edge_batch(seed=0):
  """Rows 0-2 (group 0): ties in outcome and in IG, turn 2 reached by row 2 alone; rows 3-5
  (group 1): all equal (outcome, and IG at every turn index reached by two or more); rows 6-8
  (group 2): an IG exactly 0, turns 1 and 2 reached by row 6 alone, a trajectory with no
  non-answer turn (row 8); row 9: a one-turn singleton group; rows 10, 11: padding rows (no
  sampled token), each its own group. Ignored IG entries are NaN."""
  rng = np.random.default_rng(seed)
  group_ids = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 8, 9], np.int32)
  num_turns = np.array([3, 3, 4, 2, 3, 4, 4, 2, 1, 1, 1, 1], np.int32)
  outcome = np.array([1.0, 0.5, 0.5, 0.7, 0.7, 0.7, 1.0, 0.0, 0.25, 0.5, 0.0, 0.0], np.float32)
  ig = np.full((B, T), np.nan, np.float32)
  ig[0, :2] = [0.5, 0.2]
  ig[1, :2] = [0.5, -0.1]       # tie with row 0 at turn 0
  ig[2, :3] = [1.0, -0.1, 0.3]  # tie with row 1 at turn 1
  ig[3, :1] = [2 / 3]
  ig[4, :2] = [2 / 3, 0.1]
  ig[5, :3] = [2 / 3, 0.1, -0.4]
  ig[6, :3] = [0.0, 0.4, -0.3]
  ig[7, :1] = [0.6]
  turn_id, mask = layout(num_turns, rng, pad_rows=(10, 11))
  return dict(ig=ig, outcome=outcome, num_turns=num_turns, group_ids=group_ids,
              turn_id=turn_id, loss_mask=mask)


def random_batch(seed):
  rng = np.random.default_rng(seed)
  group_ids = rng.permutation(np.array([4, 4, 4, 4, 7, 7, 7, 2, 2, 5, 5, 5], np.int32))
  num_turns = rng.integers(1, T + 1, size=B).astype(np.int32)
  outcome = rng.choice(np.array([0.0, 0.5, 1.0, 0.25], np.float32), size=B)
  ig = rng.normal(size=(B, T)).astype(np.float32)
  ig[np.arange(T)[None, :] >= num_turns[:, None] - 1] = 1e3  # ignored entries: garbage
  turn_id, mask = layout(num_turns, rng)
  return dict(ig=ig, outcome=outcome, num_turns=num_turns, group_ids=group_ids,
              turn_id=turn_id, loss_mask=mask)


# ---------------------------------------------------------------------------------------------
# NumPy reference (loops, float64).
# ---------------------------------------------------------------------------------------------


def ref_z(x, pool, scale_by_std, std_estimator, eps):
  pool = np.asarray(pool, np.float64)
  if len(pool) == 1 or pool.max() == pool.min():
    return 0.0
  if not scale_by_std:
    return x - pool.mean()
  if std_estimator == "sqrt_var_eps":
    return (x - pool.mean()) / np.sqrt(np.var(pool) + eps)
  ddof = 1 if std_estimator == "unbiased" else 0
  return (x - pool.mean()) / (np.std(pool, ddof=ddof) + eps)


def ref_a2tgpo(d, gamma=1.0, alpha=0.3, rescale="sqrt_terms", scale_by_std=True, clip_beta=0.3,
               std_estimator="population", eps=1e-6):
  """(token advantages [B, L], per-token clip scale [B, L]) by loops over the paper's formulas."""
  ig, out, nt, g = d["ig"], d["outcome"], d["num_turns"], d["group_ids"]
  (B, T), L = ig.shape, d["loss_mask"].shape[1]  # noqa: N806 (any shapes)
  z = functools.partial(ref_z, scale_by_std=scale_by_std, std_estimator=std_estimator, eps=eps)
  turn_adv = np.zeros((B, T))
  clip = np.ones((B, T))
  for b in range(B):
    group = [j for j in range(B) if g[j] == g[b]]
    a_out = z(out[b], [out[j] for j in group])
    n_ig = nt[b] - 1
    normed = [z(ig[b, k], [ig[j, k] for j in group if k < nt[j] - 1]) for k in range(n_ig)]
    for k in range(n_ig):
      acc = sum(gamma ** (j - k) * normed[j] for j in range(k, n_ig))
      n = n_ig - k
      denom = {"sqrt_terms": np.sqrt(n), "none": 1.0,
               "sqrt_discounted": np.sqrt(sum(gamma ** (2 * i) for i in range(n)))}[rescale]
      turn_adv[b, k] = a_out + alpha * acc / denom
      clip[b, k] = 1 + clip_beta * (2 / (1 + np.exp(-normed[k])) - 1)
    turn_adv[b, n_ig] = a_out
  adv, cs = np.zeros((B, L)), np.zeros((B, L))
  for b in range(B):
    for t in range(L):
      k = d["turn_id"][b, t]
      if d["loss_mask"][b, t] and 0 <= k < T:
        adv[b, t], cs[b, t] = turn_adv[b, k], clip[b, k]
  return adv, cs


def ref_group_fraction(flag, g):
  groups = sorted(set(g.tolist()))
  return np.mean([all(flag[j] for j in range(B) if g[j] == q) for q in groups])


# ---------------------------------------------------------------------------------------------
# The estimator.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", SETTINGS)
def test_estimator_matches_numpy_loops(kw):
  for d in (edge_batch(), random_batch(1), random_batch(2)):
    adv, stats = _estimator(**d, **kw)
    want, clip = ref_a2tgpo(d, **kw)
    np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-5, atol=1e-5)
    mask = d["loss_mask"] > 0
    np.testing.assert_allclose(float(stats["clip_scale_mean"]), clip[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(stats["clip_scale_std"]), clip[mask].std(), atol=1e-5)
    # (iii)'s loss input: each sampled token's turn's scale, 1 on every other slot.
    np.testing.assert_allclose(np.asarray(stats["clip_scale"]), np.where(mask, clip, 1.0),
                               rtol=1e-5)
    g = d["group_ids"]
    same = [d["outcome"][g == g[b]].min() == d["outcome"][g == g[b]].max() for b in range(B)]
    np.testing.assert_allclose(float(stats["collapse_fraction"]), ref_group_fraction(same, g),
                               rtol=1e-6)
    zero = [np.all(np.abs(want[b][mask[b]]) <= 1e-6) for b in range(B)]
    np.testing.assert_allclose(float(stats["zero_adv_fraction"]), ref_group_fraction(zero, g),
                               rtol=1e-6)


def test_edge_cases_by_hand():
  d = edge_batch()
  adv, _ = _estimator(**d)
  adv, mask, tid = np.asarray(adv), d["loss_mask"] > 0, d["turn_id"]
  per_turn = lambda b, k: adv[b][mask[b] & (tid[b] == k)]  # noqa: E731
  # Group 1 (rows 3-5): equal outcomes and equal IG at every turn index reached by two or more;
  # row 5's turn 2 is a pool of one: every advantage is exactly 0.
  np.testing.assert_array_equal(adv[3:6], 0.0)
  # Padding rows and padding/observation slots are 0.
  np.testing.assert_array_equal(adv[10:], 0.0)
  np.testing.assert_array_equal(adv[~mask], 0.0)
  # Row 8 (no non-answer turn) and row 7 (one): the outcome z-score of group 2 {1, 0, 0.25}.
  o = np.array([1.0, 0.0, 0.25])
  z = (o - o.mean()) / (o.std() + 1e-6)
  np.testing.assert_allclose(per_turn(8, 0), z[2], rtol=1e-5)
  np.testing.assert_allclose(per_turn(7, 1), z[1], rtol=1e-5)
  # Row 6's turns 1, 2 are reached by row 6 alone: normalized IG 0 there, so its last IG turn
  # carries the outcome only; its turn 0 (IG exactly 0, pool {0, 0.6}) is -1 / sqrt(3) * 0.3 off.
  np.testing.assert_allclose(per_turn(6, 2), z[0], rtol=1e-5)
  np.testing.assert_allclose(per_turn(6, 1), z[0], rtol=1e-5)
  np.testing.assert_allclose(per_turn(6, 0), z[0] + 0.3 * (-1.0 / np.sqrt(3)), rtol=1e-4)
  # Row 9, a singleton group, gets 0.
  np.testing.assert_array_equal(adv[9], 0.0)


def test_two_rollouts_by_hand():
  # ig [[1, 3], [3, 1]] at turns 0, 1: each turn pool z-scores to (-1, 1) / (1, -1); outcome
  # (1, 0) -> (1, -1). Row 0: D_0 = (-1 + 1) / sqrt(2) = 0, D_1 = 1: turn advantages
  # (1, 1.3, 1); row 1: (-1, -1.3, -1). Pooling all turns (IGPO) would differ.
  d = dict(ig=np.zeros((B, T), np.float32), outcome=np.zeros(B, np.float32),
           num_turns=np.ones(B, np.int32), group_ids=np.arange(B, dtype=np.int32) + 10,
           turn_id=np.full((B, L), -1, np.int32), loss_mask=np.zeros((B, L), np.float32))
  d["ig"][:2, :2] = [[1, 3], [3, 1]]
  d["outcome"][:2] = [1, 0]
  d["num_turns"][:2] = 3
  d["group_ids"][:2] = 0
  for b in range(2):
    d["turn_id"][b, :3] = [0, 1, 2]
    d["loss_mask"][b, :3] = 1
  adv, stats = _estimator(**d)
  np.testing.assert_allclose(np.asarray(adv)[:2, :3], [[1, 1.3, 1], [-1, -1.3, -1]], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(adv)[2:], 0.0)
  c = 0.3 * (2 / (1 + np.exp(-1.0)) - 1)
  np.testing.assert_allclose(float(stats["clip_scale_mean"]), 1.0, atol=1e-6)  # +-c cancel
  np.testing.assert_allclose(float(stats["clip_scale_std"]), np.sqrt(4 * c * c / 6), rtol=1e-4)


def test_unknown_rescale():
  d = random_batch(0)
  with pytest.raises(ValueError, match="unknown rescale 'mean'"):
    a2.a2tgpo_turn_terms(d["ig"], d["outcome"], d["num_turns"], d["group_ids"], rescale="mean")


# ---------------------------------------------------------------------------------------------
# The turn-level-ratio loss (gspo_turn).
# ---------------------------------------------------------------------------------------------


def ref_gspo_turn(logp, old, adv, mask, clip_low, clip_high, scale=None):
  """Loss (token-mean) and d loss / d logp by loops: turns = runs of equal advantage among a
  row's sampled tokens; scale: per-token clip scales c, range [1 - c low, 1 + c high]."""
  scale = np.ones(logp.shape) if scale is None else scale
  n_tok = mask.sum()
  loss, grad = 0.0, np.zeros(logp.shape)
  for b in range(logp.shape[0]):
    pos = [t for t in range(logp.shape[1]) if mask[b, t]]
    runs, cur = [], []
    for t in pos:
      if cur and adv[b, t] != adv[b, cur[-1]]:
        runs.append(cur)
        cur = []
      cur.append(t)
    if cur:
      runs.append(cur)
    for run in runs:
      r = np.exp(np.mean([logp[b, t] - old[b, t] for t in run]))
      for t in run:
        a = adv[b, t]
        c = scale[b, t]
        pg1, pg2 = -a * r, -a * np.clip(r, 1 - c * clip_low, 1 + c * clip_high)
        loss += max(pg1, pg2) / n_tok
        grad[b, t] = (-a * r / n_tok) if pg1 >= pg2 else 0.0
  return loss, grad


def test_gspo_turn_loss_matches_numpy():
  rng = np.random.default_rng(0)
  b, length = 4, 12
  mask = (rng.uniform(size=(b, length)) < 0.8).astype(np.float32)
  mask[3] = 0.0  # a row with no sampled token
  # Turns as advantage runs: row 0 three turns, row 1 two equal adjacent turns (one run), row 2
  # alternating signs.
  adv = np.zeros((b, length), np.float32)
  adv[0] = np.repeat([0.5, -1.2, 0.8], 4)
  adv[1] = 0.7
  adv[2] = np.repeat([1.0, -1.0, 1.0, -1.0], 3)
  adv = np.where(mask > 0, adv, 99.0).astype(np.float32)  # garbage off mask never matters
  logp = rng.normal(-1.0, 0.3, size=(b, length)).astype(np.float32)
  old = (logp + rng.normal(0, 0.1, size=(b, length))).astype(np.float32)
  lo, hi = 0.02, 0.03
  fn = losses_lib.get_policy_loss("gspo_turn")
  (loss, metrics), grad = jax.value_and_grad(
      lambda lp: fn(lp, old, adv, mask, clip_low=lo, clip_high=hi), has_aux=True)(logp)
  want, want_grad = ref_gspo_turn(logp.astype(np.float64), old, adv, mask, lo, hi)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
  assert 0.0 < float(metrics["clip_fraction"]) < 1.0
  # Runs: a change of advantage or (packed rows) of trajectory starts a new turn.
  runs = np.asarray(a2.advantage_runs(adv, mask))
  assert len(set(runs[1][mask[1] > 0].tolist())) == 1
  assert len(set(runs[0][mask[0] > 0].tolist())) == 3
  seg = np.where(np.arange(length) < 6, 1, 2)[None].repeat(b, 0)
  assert len(set(np.asarray(a2.advantage_runs(adv, mask, seg))[1][mask[1] > 0].tolist())) == 2
  # (iii): per-token clip scales (each turn's tokens share one in A²TGPO; here any [B, L]).
  scale = rng.uniform(0.7, 1.3, size=(b, length)).astype(np.float32)
  (loss, _), grad = jax.value_and_grad(
      lambda lp: fn(lp, old, adv, mask, clip_low=lo, clip_high=hi, clip_scale=scale),
      has_aux=True)(logp)
  want, want_grad = ref_gspo_turn(logp.astype(np.float64), old, adv, mask, lo, hi, scale)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)


def ref_ppo(logp, old, adv, mask, clip_low, clip_high, scale):
  """PPO-clip, token-mean, per-token clip range [1 - c low, 1 + c high], by loops."""
  loss, clipped = 0.0, 0
  for b, t in zip(*np.nonzero(mask)):
    r = np.exp(logp[b, t] - old[b, t])
    c = scale[b, t]
    pg1, pg2 = -adv[b, t] * r, -adv[b, t] * np.clip(r, 1 - c * clip_low, 1 + c * clip_high)
    loss += max(pg1, pg2)
    clipped += pg2 > pg1
  return loss / mask.sum(), clipped / mask.sum()


def test_ppo_and_gspo_losses_take_a_per_token_clip_scale():
  rng = np.random.default_rng(1)
  b, length = 4, 10
  mask = (rng.uniform(size=(b, length)) < 0.8).astype(np.float32)
  adv = rng.normal(size=(b, length)).astype(np.float32)
  logp = rng.normal(-1.0, 0.3, size=(b, length)).astype(np.float32)
  old = (logp + rng.normal(0, 0.2, size=(b, length))).astype(np.float32)
  scale = rng.uniform(0.5, 1.5, size=(b, length)).astype(np.float32)
  scale[~(mask > 0)] = np.nan  # slots off the mask never matter
  ppo = losses_lib.get_policy_loss("ppo")
  loss, metrics = ppo(logp, old, adv, mask, clip_low=0.1, clip_high=0.15, clip_scale=scale)
  want, frac = ref_ppo(logp.astype(np.float64), old, adv, mask, 0.1, 0.15, scale)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["clip_fraction"]), frac, rtol=1e-6)
  assert np.isfinite(float(loss))
  # A scale of ones is the fixed range, exactly, in every loss that takes one.
  ones = np.ones((b, length), np.float32)
  for name in ("ppo", "gspo", "gspo_turn"):
    fn = losses_lib.get_policy_loss(name)
    got = fn(logp, old, adv, mask, clip_low=0.1, clip_high=0.15, clip_scale=ones)
    plain = fn(logp, old, adv, mask, clip_low=0.1, clip_high=0.15)
    jax.tree.map(np.testing.assert_array_equal, got, plain)


def test_the_update_objective_passes_the_methods_loss_inputs():
  """train/updates.py: a PolicyLossConfig's inputs reach the loss as keywords, from the minibatch."""
  from agentjax.models.logprobs import sequence_logprobs
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.train.updates import PolicyLossConfig, role_objective
  cfg = QwenConfig.preset("tiny", vocab_size=64)
  model = Qwen(cfg)
  params = init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(2)
  b, length = 2, 8
  tokens = jnp.asarray(rng.integers(0, 64, size=(b, length)), jnp.int32)
  valid = jnp.ones((b, length), bool)
  logp = sequence_logprobs(model, params, tokens, valid)[0]
  mb = dict(tokens=tokens, valid=valid, loss_mask=jnp.ones((b, length), bool).at[:, 0].set(False),
            old_logp=logp + jnp.asarray(rng.normal(0, 0.3, (b, length)), jnp.float32),
            ref_logp=logp, advantages=jnp.asarray(rng.normal(size=(b, length)), jnp.float32),
            clip_scale=jnp.asarray(rng.uniform(0.2, 2.0, (b, length)), jnp.float32))
  kw = (("clip_high", 0.05), ("clip_low", 0.05))
  with_input = role_objective(model, PolicyLossConfig("ppo", kw, inputs=("clip_scale",)))
  without = role_objective(model, PolicyLossConfig("ppo", kw))
  got, _ = with_input(params, mb)
  want, _ = losses_lib.ppo_loss(logp, mb["old_logp"], mb["advantages"], mb["loss_mask"],
                                clip_low=0.05, clip_high=0.05, clip_scale=mb["clip_scale"])
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  assert abs(float(without(params, mb)[0]) - float(got)) > 1e-4  # the scale changed the clip


# ---------------------------------------------------------------------------------------------
# The registry entry and the config file.
# ---------------------------------------------------------------------------------------------


def test_registry_entry_and_config_file():
  config = a2tgpo_config.get_config("demo")
  method = get_method("a2tgpo")
  assert method.estimator == "a2tgpo" and "probes" in method.run_signals(config)
  assert "gspo_turn" in losses_lib.POLICY_LOSSES
  assert advantage_kwargs(config) == dict(gamma=1.0, alpha=0.3, rescale="sqrt_terms",
                                          scale_by_std=True, clip_beta=0.3, adaptive_clip=True,
                                          std_estimator="population", eps=1e-6)
  config_lib.validate(config)
  # (iii): the clip scale is the policy loss's input, unless switched off.
  assert method.loss_inputs_for(config) == ("clip_scale",)
  assert policy_loss_config(config).inputs == ("clip_scale",)
  fixed = a2tgpo_config.get_config("demo")
  fixed.a2tgpo.adaptive_clip = False
  assert method.loss_inputs_for(fixed) == () and policy_loss_config(fixed).inputs == ()
  assert "clip_scale" not in adv_lib.get_advantage_estimator("a2tgpo")(
      **random_batch(4), **advantage_kwargs(fixed))[1]
  # The demo is igpo's demo with the algorithm swapped (plus the a2tgpo section).
  igpo = __import__("configs.igpo", fromlist=["get_config"]).get_config("demo")
  igpo.algorithm, igpo.preset = "a2tgpo", "demo"
  got = config.to_dict()
  got.pop("a2tgpo")
  assert got == igpo.to_dict()
  # The settings through the trainer's path (jitted compute path, static keywords) are accepted.
  d = random_batch(3)
  adv, _ = adv_lib.get_advantage_estimator("a2tgpo")(**d, **advantage_kwargs(config))
  np.testing.assert_allclose(np.asarray(adv), ref_a2tgpo(d)[0], rtol=1e-5, atol=1e-5)

  paper = a2tgpo_config.get_config("qwen3-4b")
  assert (paper.rl.loss, paper.rl.clip_low, paper.rl.clip_high) == ("gspo_turn", 3e-3, 4e-3)
  assert advantage_kwargs(paper)["std_estimator"] == "sqrt_var_eps"
  assert advantage_kwargs(paper)["eps"] == 1e-8
  with pytest.raises(ValueError, match="unknown preset"):
    a2tgpo_config.get_config("qwen2.5-7b")


def test_settings_without_a_section_are_the_defaults_and_bad_ones_fail():
  c = base.get_config("demo")
  c.algorithm = "a2tgpo"
  assert "a2tgpo" not in c
  assert advantage_kwargs(c) == dict(a2.DEFAULTS, std_estimator="population", eps=1e-6)
  config_lib.validate(c)
  for key, value in (("rescale", "mean"), ("gamma", 1.5), ("alpha", -0.1), ("clip_beta", 1.0),
                     ("alpah", 0.3)):
    bad = a2tgpo_config.get_config("demo")
    bad.a2tgpo[key] = value
    with pytest.raises(ConfigError, match=rf"config\.a2tgpo\.{key}="):
      config_lib.validate(bad)


def test_a_loss_that_cannot_take_the_clip_scale_is_refused_naming_rl_loss(monkeypatch):
  def plain_loss(logp, old_logp, advantages, loss_mask, **kwargs):
    raise AssertionError("never called")
  monkeypatch.setitem(losses_lib.POLICY_LOSSES, "plain_test", plain_loss)
  config = a2tgpo_config.get_config("demo")
  config.rl.loss = "plain_test"
  with pytest.raises(ConfigError, match=r"config\.rl\.loss='plain_test'.*clip_scale"):
    config_lib.validate(config)
  config.a2tgpo.adaptive_clip = False  # the fixed range: any loss
  config_lib.validate(config)


def test_a2tgpo_trains_end_to_end_with_and_without_the_adaptive_clip(world_dir, tokenizer,
                                                                     tmp_path):
  """configs/a2tgpo.py through the trainer (the tiny model): the clip scale reaches the loss in
  the minibatches; the first step's rollouts do not depend on it."""
  import json
  import os

  from agentjax.train.trainer import train
  from tests.trainer_fixtures import tiny_config
  rows = {}
  for adaptive in (True, False):
    config = tiny_config(world_dir, tokenizer.name_or_path, str(tmp_path), algorithm="a2tgpo",
                         steps=2)
    config.a2tgpo.adaptive_clip = adaptive
    # One decoder layer (the tiny preset has 2): compiling the layers is most of a run's time,
    # and what is checked (the clip scale's path to the loss) does not depend on depth.
    config.model.shape.num_layers = 1
    # No eval at the end, and no warm-up (it compiles the eval's rollout too): nothing here
    # reads an eval, and the warm-up's own check is tests/test_trainer.py's.
    config.train.final_eval = False
    config.rollout.warm_up = False
    config.train.eval_every = 0
    config.train.eval_at_start = False
    config.train.export_hf = False
    config.data.eval_size = 2
    config.train.eval_batch = 2
    workdir = str(tmp_path / f"adaptive_{adaptive}")
    train(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows[adaptive] = [r for r in map(json.loads, f) if "reward" in r]
  for adaptive, got in rows.items():
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
      assert r["skipped_updates"] == 0 and np.isfinite(r["loss"])
      assert 1.0 - 0.3 <= r["a2tgpo/clip_scale_mean"] <= 1.0 + 0.3
  assert rows[True][0]["reward"] == rows[False][0]["reward"]
  assert rows[True][0]["a2tgpo/clip_scale_mean"] == rows[False][0]["a2tgpo/clip_scale_mean"]
