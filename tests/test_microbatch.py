"""Micro-batched scoring and updates (rl.micro_batch_size) equal their one-pass versions.

The update accumulates each micro-batch's gradient share and applies one step: with SGD the new
params ARE params - lr x the gradient, so a wrong normalizer (a micro-batch's own token or sequence
count in place of the minibatch's) shows in them (Adam's first step would hide a scale factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import Qwen, QwenConfig, init_adapters, init_params
from agentjax.models.qwen.value import QwenValue, value_params_from_policy
from agentjax.rl import losses as L
from agentjax.rl.info_gain import Probes
from agentjax.train import config as config_lib
from agentjax.train.critic import Critic
from agentjax.rl.microbatch import merge, num_micro, split
from agentjax.train.scoring import score_batch
from agentjax.train.updates import PolicyLossConfig, make_policy_update, make_roles_update

B, S, V, CHUNK, LR = 6, 12, 64, 16, 0.1
MICRO = 2  # rows per pass: B = 6 -> 3 micro-batches
CFG = QwenConfig.preset("tiny", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16)


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)  # the update donates params and optimizer state


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _perturbed(tree, seed, scale):
  # On the host: one compiled op per leaf shape would cost more than the tests themselves.
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + scale * rng.normal(size=x.shape),
                                            x.dtype), tree)


def _minibatch(seed: int, b: int = B) -> dict[str, jax.Array]:
  """[b, S] policy-loss arrays: ragged lengths, a row with no sampled token (the seq-mean
  modes must not count it), old log-probs ~ log(1/V) +- 1 so that some ratios clip."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(5, S + 1, b)
  valid = np.arange(S)[None] < lengths[:, None]
  loss_mask = valid & (np.arange(S)[None] >= rng.integers(2, 5, (b, 1)))
  loss_mask[1] = False
  mb = dict(tokens=rng.integers(0, V, (b, S)).astype(np.int32), valid=valid, loss_mask=loss_mask,
            old_logp=(-rng.uniform(3.2, 5.2, (b, S)) * valid).astype(np.float32),
            ref_logp=(-rng.uniform(3.2, 5.2, (b, S)) * valid).astype(np.float32),
            advantages=rng.normal(size=(b, S)).astype(np.float32))
  return {k: jnp.asarray(v) for k, v in mb.items()}


def _loss(name="ppo", aggregation="token-mean"):
  kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_estimator="low_var_kl",
            entropy_coef=0.01, aggregation=aggregation, norm_length=16)
  return PolicyLossConfig(name=name, kwargs=tuple(sorted(kw.items())), entropy=True, chunk=CHUNK)


def _assert_same_step(one, acc):
  """(params, opt_state, metrics) of the one-pass and the accumulated update: equal (params
  within 1e-6: float32 sums in another order; a wrong normalizer moves them by ~lr x grad)."""
  (p1, _, m1), (p2, _, m2) = _host(one), _host(acc)
  assert int(m1["skipped"]) == 0 and int(m2["skipped"]) == 0
  assert set(m1) == set(m2)
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), p2, p1)


def _moved(new, old):
  return max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(_host(new)),
                                                         jax.tree.leaves(_host(old))))


@pytest.fixture(scope="module")
def params():
  return _perturbed(init_params(CFG, jax.random.key(0)), 1, 0.02)


# ------------------------------------------------------------------------------ the pieces


def test_split_keeps_rows_and_merge_inverts_it():
  x = jnp.arange(12 * 3).reshape(12, 3)
  y = split(x, 3)
  assert y.shape == (3, 4, 3)
  np.testing.assert_array_equal(y[1, :, 0], x[1::3, 0])  # strided: spread over the devices
  np.testing.assert_array_equal(merge(y), x)
  assert num_micro(12, 0) == 1 and num_micro(12, 16) == 1 and num_micro(12, 4) == 3
  with pytest.raises(ValueError, match="does not divide"):
    num_micro(12, 5)


@pytest.mark.parametrize("name", ["ppo", "gspo"])
@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
def test_loss_shares_add_up_to_the_minibatch_loss(name, aggregation):
  """Per micro-batch with the minibatch's totals: loss, metrics and d loss / d logp add up to
  the whole minibatch's (every aggregation, both losses, KL and entropy on, dual clip set)."""
  rng = np.random.default_rng(3)
  b, n = 8, 4
  mask = rng.uniform(size=(b, S)) < 0.6
  mask[2] = False
  args = [jnp.asarray(-rng.uniform(0.1, 4, (b, S)), jnp.float32) for _ in range(2)] + [
      jnp.asarray(rng.normal(size=(b, S)), jnp.float32), jnp.asarray(mask)]
  kw = dict(ref_logp=jnp.asarray(-rng.uniform(0.1, 4, (b, S)), jnp.float32),
            entropy=jnp.asarray(rng.uniform(0, 3, (b, S)), jnp.float32), clip_low=0.2,
            clip_high=0.28, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01,
            aggregation=aggregation, norm_length=20)
  fn = L.get_policy_loss(name)
  whole = lambda logp: fn(logp, *args[1:], **kw)  # noqa: E731
  (loss, metrics), grad = jax.value_and_grad(whole, has_aux=True)(args[0])
  totals = L.loss_totals(mask)

  def shares(logp):
    parts = [fn(*(split(a, n)[i] for a in (logp, *args[1:])),
                **dict(kw, ref_logp=split(kw["ref_logp"], n)[i],
                       entropy=split(kw["entropy"], n)[i]), totals=totals) for i in range(n)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *[m for _, m in parts])
    return sum(v for v, _ in parts), L.combine_micro_metrics(stacked)

  (loss_m, metrics_m), grad_m = jax.value_and_grad(shares, has_aux=True)(args[0])
  np.testing.assert_allclose(loss_m, loss, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(grad_m, grad, rtol=1e-6, atol=1e-8)
  assert set(metrics_m) == set(metrics)
  for k in metrics:
    np.testing.assert_allclose(metrics_m[k], metrics[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", ["ppo", "gspo"])
@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
def test_packed_rows_aggregate_like_their_trajectories(name, aggregation):
  """segment_ids (for packed rows): rows 2i and 2i + 1 side by side in one row as ids 1 and 2
  give the unpacked loss, metrics and d loss / d logp (sequences are trajectories, not rows)."""
  rng = np.random.default_rng(4)
  b = 8
  mask = rng.uniform(size=(b, S)) < 0.6
  mask[2] = False
  arrays = dict(logp=-rng.uniform(0.1, 4, (b, S)), old_logp=-rng.uniform(0.1, 4, (b, S)),
                advantages=np.repeat(rng.normal(size=(b, 1)), S, 1), loss_mask=mask,
                ref_logp=-rng.uniform(0.1, 4, (b, S)), entropy=rng.uniform(0, 3, (b, S)))
  pack = lambda x: jnp.asarray(x).reshape(b // 2, 2 * S)  # noqa: E731
  segment_ids = pack(np.repeat([[1], [2]] * (b // 2), S, axis=1))
  kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.1, entropy_coef=0.01,
            aggregation=aggregation, norm_length=20)
  fn = L.get_policy_loss(name)

  def run(logp, other, **extra):
    return fn(logp, other["old_logp"], other["advantages"], other["loss_mask"],
              ref_logp=other["ref_logp"], entropy=other["entropy"], **kw, **extra)

  flat = {k: jnp.asarray(v, jnp.float32 if k != "loss_mask" else bool) for k, v in arrays.items()}
  packed = {k: pack(v) for k, v in flat.items()}
  (loss, metrics), grad = jax.value_and_grad(lambda x: run(x, flat), has_aux=True)(flat["logp"])
  (loss_p, metrics_p), grad_p = jax.value_and_grad(
      lambda x: run(x, packed, segment_ids=segment_ids), has_aux=True)(packed["logp"])
  # (float32 sums in another order: a few ulps; a wrong count is off by a large factor)
  np.testing.assert_allclose(loss_p, loss, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(grad_p).reshape(b, S), grad, rtol=1e-5, atol=1e-8)
  for k in metrics:
    np.testing.assert_allclose(metrics_p[k], metrics[k], rtol=1e-5, atol=1e-7, err_msg=k)
  totals = L.loss_totals(flat["loss_mask"])
  for k, v in L.loss_totals(packed["loss_mask"], segment_ids).items():
    assert float(v) == float(totals[k]), k


# ------------------------------------------------------------------------------ updates


_UPDATES = {}


def _update(name, aggregation, micro_batch):
  """make_policy_update of the tiny model, compiled once per setting for the module."""
  key = (name, aggregation, micro_batch)
  if key not in _UPDATES:
    _UPDATES[key] = make_policy_update(Qwen(CFG), optax.sgd(LR), _loss(name, aggregation),
                                       micro_batch=micro_batch)
  return _UPDATES[key]


# Every aggregation and both losses appear in an update (this one: ppo, token-mean; LoRA's:
# seq-mean-token-sum; the roles': gspo with seq-mean-token-sum-norm, ppo with
# seq-mean-token-mean); test_loss_shares_add_up_to_the_minibatch_loss covers every pair at the
# loss (each update case costs two compiles).
def test_accumulated_update_equals_the_one_pass_update(params):
  opt = optax.sgd(LR)
  mb = _minibatch(0)
  out_one = _update("ppo", "token-mean", 0)(_copy(params), opt.init(params), mb)
  out_acc = _update("ppo", "token-mean", MICRO)(_copy(params), opt.init(params), mb)
  _assert_same_step(out_one, out_acc)
  assert _moved(out_one[0], params) > 1e-3  # not two unchanged trees
  assert 0 < float(out_one[2]["clip_fraction"]) < 1


def test_accumulated_update_skips_a_non_finite_micro_batch(params):
  opt = optax.sgd(LR)
  mb = _minibatch(0)
  mb["advantages"] = mb["advantages"].at[4, 6].set(jnp.nan)
  mb["loss_mask"] = mb["loss_mask"].at[4, 6].set(True)
  new, _, metrics = _update("ppo", "token-mean", MICRO)(_copy(params), opt.init(params), mb)
  assert int(metrics["skipped"]) == 1
  jax.tree.map(np.testing.assert_array_equal, _host(new), _host(params))


@pytest.fixture(scope="module")
def lora():
  spec = LoraSpec(("searcher", "generator"), rank=2, alpha=4.0)
  adapters = _perturbed(init_adapters(CFG, spec, jax.random.key(2)), 3, 0.3)
  return spec, adapters


def test_accumulated_lora_update_equals_the_one_pass_update(params, lora):
  spec, adapters = lora
  opt, mb = optax.sgd(LR), _minibatch(1)
  model = Qwen(CFG, lora=spec)
  loss = _loss("ppo", "seq-mean-token-sum")
  out_one = make_policy_update(model, opt, loss)(_copy(adapters), opt.init(adapters), mb, params)
  out_acc = make_policy_update(model, opt, loss, micro_batch=MICRO)(
      _copy(adapters), opt.init(adapters), mb, params)
  _assert_same_step(out_one, out_acc)
  assert _moved(out_one[0]["searcher"], adapters["searcher"]) > 1e-3


def test_accumulated_roles_update_equals_the_one_pass_update(params, lora):
  """DAC's two roles, minibatches of different sizes (3 and 6 micro-batches)."""
  spec, adapters = lora
  opt = optax.sgd(LR)
  mbs = {"searcher": _minibatch(2), "generator": _minibatch(3, b=2 * B)}
  model = Qwen(CFG, lora=spec)
  losses = {"searcher": _loss("gspo", "seq-mean-token-sum-norm"),
            "generator": _loss("ppo", "seq-mean-token-mean")}
  out_one = make_roles_update(model, opt, losses)(_copy(adapters), opt.init(adapters), mbs, params)
  out_acc = make_roles_update(model, opt, losses, micro_batch=MICRO)(
      _copy(adapters), opt.init(adapters), mbs, params)
  _assert_same_step(out_one, out_acc)
  assert min(_moved(out_one[0][r], adapters[r]) for r in spec.names) > 1e-3


# ------------------------------------------------------------------------------ scoring


class _Batch:
  """What score_batch reads of a TrajectoryBatch."""

  def __init__(self, mb, turn_ends, num_turns):
    self.tokens, self.valid = mb["tokens"], mb["valid"]
    self.turn_ends, self.num_turns = turn_ends, num_turns


def test_scoring_in_micro_batches_equals_one_pass(params):
  """old/ref log-probs and IGPO's probe values and information gain; 4 rows per pass do not
  divide the 6 rows (the last pass is filled with a repeated row; the dividing case is the
  same code without the filling)."""
  rng = np.random.default_rng(5)
  mb = _minibatch(4)
  lengths = np.asarray(mb["valid"]).sum(1)
  turn_ends = np.stack([np.minimum(lengths, 3), np.minimum(lengths, 6), lengths], 1)
  batch = _Batch(mb, turn_ends.astype(np.int32), np.array([2, 2, 1, 2, 2, 1], np.int32))
  k, a = 2, 4
  pvalid = np.arange(a)[None, None] < rng.integers(2, a + 1, (B, k, 1))
  probes = Probes(tokens=rng.integers(0, V, (B, k, a)).astype(np.int32),
                  score=pvalid & (np.arange(a) >= 1), valid=pvalid,
                  alias_valid=np.array([[True, False]] * 3 + [[True, True]] * 3))
  ref = _perturbed(params, 9, 0.02)
  for p in (None, probes):
    one = _host(score_batch(Qwen(CFG), params, ref, batch, p, chunk=CHUNK))
    for micro in (4,):
      got = _host(score_batch(Qwen(CFG), params, ref, batch, p, chunk=CHUNK, micro_batch=micro))
      for field in ("old_logp", "ref_logp", "values", "ig"):
        np.testing.assert_allclose(getattr(got, field), getattr(one, field), rtol=1e-5,
                                   atol=1e-6, err_msg=f"{field} micro={micro}")
    assert np.any(one.ref_logp != one.old_logp)
    if p is not None:
      assert np.any(one.ig != 0) and np.all(np.isfinite(one.values))


# ------------------------------------------------------------------------------ the critic


def _critic(micro_batch):
  return Critic(cfg=CFG, module=QwenValue(CFG), spec=None, backbone=None,
                optimizer=optax.sgd(LR), schedule=optax.constant_schedule(LR), value_clip=0.05,
                value_coef=0.5, aggregation="seq-mean-token-mean", warmup_steps=0,
                micro_batch=micro_batch)


def test_critic_values_and_update_in_micro_batches_equal_one_pass(params):
  rng = np.random.default_rng(6)
  mb = _minibatch(5)
  one, acc = _critic(0), _critic(MICRO)
  vparams = _perturbed(value_params_from_policy(CFG, params, jax.random.key(1)), 7, 0.05)
  values = one.values(vparams, mb["tokens"], mb["valid"])
  np.testing.assert_allclose(_host(acc.values(vparams, mb["tokens"], mb["valid"])),
                             _host(values), rtol=1e-5, atol=1e-6)
  # An anchor off the values and ragged targets: both branches of the clip occur.
  cmb = dict(tokens=mb["tokens"], valid=mb["valid"], value_mask=mb["loss_mask"],
             old_values=values + jnp.asarray(rng.choice([0.0, 0.2], values.shape), jnp.float32),
             returns=jnp.asarray(rng.normal(size=values.shape), jnp.float32))
  out_one = one.update(_copy(vparams), one.optimizer.init(vparams), cmb)
  out_acc = acc.update(_copy(vparams), acc.optimizer.init(vparams), cmb)
  _assert_same_step(out_one, out_acc)
  assert 0 < float(out_one[2]["critic/value_clip_fraction"]) < 1
  assert _moved(out_one[0], vparams) > 1e-3


# ------------------------------------------------------------------------------ config


def test_micro_batch_size_is_validated_naming_the_field():
  from configs.base import get_config
  config = get_config("demo")
  assert config.rl.micro_batch_size == 0
  config_lib.validate(config)
  config.rl.micro_batch_size = config.rl.minibatch_size // 2
  config_lib.validate(config)
  for bad in (3, -1):
    config.rl.micro_batch_size = bad
    with pytest.raises(config_lib.ConfigError, match="rl.micro_batch_size"):
      config_lib.validate(config)
  config.mesh.data, config.rl.micro_batch_size = 2, config.rl.minibatch_size
  with pytest.raises(config_lib.ConfigError, match="rl.micro_batch_size.*data x fsdp"):
    config_lib.validate(config)  # 2 devices x the minibatch: a pass is twice the minibatch
  config.rl.micro_batch_size = config.rl.minibatch_size // 2
  config_lib.validate(config)
  # A config recorded before the key: upgraded to one pass (train/upgrade.py)
  import ml_collections
  from agentjax.train.upgrade import upgrade_recorded
  recorded = config.to_dict()
  del recorded["rl"]["micro_batch_size"]
  upgraded = ml_collections.ConfigDict(upgrade_recorded(recorded))
  assert upgraded.rl.micro_batch_size == 0
  config_lib.validate(upgraded)
