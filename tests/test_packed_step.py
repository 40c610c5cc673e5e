"""Padding-free scoring and updates (rl.pack_tokens) equal their padded versions.

Scoring: old/ref log-probs, IGPO's probe values and information gain from packed rows (whole, and
micro-batched over rows) equal the padded passes. Updates: one SGD step on packed rows moves the
params as the padded step does (within 1e-6: with SGD the new params are params - lr x grad, so a
wrong unpack or normalizer shows), with and without micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.rl.info_gain import Probes
from agentjax.train import config as config_lib
from agentjax.train.packing import PACK_KEYS, MinibatchPacker
from agentjax.train.scoring import plan_scoring, score_batch
from agentjax.train.updates import PolicyLossConfig, make_policy_update

V, CHUNK, LR = 64, 16, 0.1
CFG = QwenConfig.preset("tiny", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16)


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _perturbed(tree, seed, scale):
  rng = np.random.default_rng(seed)  # on the host: no compile per leaf shape
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + scale * rng.normal(size=x.shape),
                                            x.dtype), tree)


@pytest.fixture(scope="module")
def params():
  return _perturbed(init_params(CFG, jax.random.key(0)), 1, 0.02)


def _arrays(seed, b, s):
  """[b, s] policy-loss arrays with ragged prefix lengths (one row a single token, so its only
  slot has no predictor) and a row with no sampled token."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, s + 1, b)
  lengths[2] = 1
  valid = np.arange(s)[None] < lengths[:, None]
  loss_mask = valid & (np.arange(s)[None] >= rng.integers(1, 4, (b, 1)))
  loss_mask[1] = False
  mb = dict(tokens=np.where(valid, rng.integers(0, V, (b, s)), 0).astype(np.int32), valid=valid,
            loss_mask=loss_mask,
            old_logp=(-rng.uniform(3.2, 5.2, (b, s)) * valid).astype(np.float32),
            ref_logp=(-rng.uniform(3.2, 5.2, (b, s)) * valid).astype(np.float32),
            advantages=rng.normal(size=(b, s)).astype(np.float32))
  return {k: jnp.asarray(v) for k, v in mb.items()}


class _Batch:
  """What score_batch reads of a TrajectoryBatch."""

  def __init__(self, mb, turn_ends, num_turns):
    self.tokens, self.valid = mb["tokens"], mb["valid"]
    self.turn_ends, self.num_turns = turn_ends, num_turns


# ------------------------------------------------------------------------------ scoring


def test_packed_scoring_equals_padded(params):
  """Plain (GRPO) and probe (IGPO) passes with a reference, whole and 1 packed row per pass."""
  rng = np.random.default_rng(5)
  b, s, k, a = 8, 64, 1, 8
  mb = _arrays(4, b, s)
  lengths = np.asarray(mb["valid"]).sum(1)
  turn_ends = np.stack([np.minimum(lengths, 3), np.minimum(lengths, 20), np.minimum(lengths, 40),
                        lengths], 1).astype(np.int32)
  num_turns = rng.integers(1, 4, b).astype(np.int32)
  batch = _Batch(mb, turn_ends, num_turns)
  pvalid = np.arange(a)[None, None] < rng.integers(3, a + 1, (b, k, 1))
  probes = Probes(tokens=rng.integers(0, V, (b, k, a)).astype(np.int32),
                  score=pvalid & (np.arange(a) >= 1), valid=pvalid,
                  alias_valid=np.ones((b, k), bool))
  ref = _perturbed(params, 9, 0.02)
  model = Qwen(CFG)
  for p in (None, probes):
    want = _host(score_batch(model, params, ref, batch, p, chunk=CHUNK))
    for micro in (0, 1):
      plans = plan_scoring(np.asarray(mb["valid"]), num_turns, 3, p, 128,
                           row_multiple=max(micro, 1))
      packed = plans.probes if p is not None else plans.plain
      assert packed.shape[0] < b and packed.rows_used > max(micro, 1)  # packed, several passes
      assert plans.stats()["score_packing_efficiency"] >= np.asarray(mb["valid"]).mean()
      got = _host(score_batch(model, params, ref, batch, p, chunk=CHUNK, micro_batch=micro,
                              packing=plans))
      for field in ("old_logp", "ref_logp", "values", "ig"):
        np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-5,
                                   atol=2e-6, err_msg=f"{field} micro={micro} probes={p}")
    assert np.any(want.ref_logp != want.old_logp)
    if p is not None:
      assert np.any(want.ig != 0) and np.all(np.isfinite(want.values))


# ------------------------------------------------------------------------------ updates


def _loss(name, aggregation):
  kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_estimator="low_var_kl",
            entropy_coef=0.01, aggregation=aggregation, norm_length=16)
  return PolicyLossConfig(name=name, kwargs=tuple(sorted(kw.items())), entropy=True, chunk=CHUNK)


@pytest.mark.parametrize("name, aggregation, micro", [
    ("ppo", "token-mean", 0),
    ("gspo", "seq-mean-token-mean", 2),  # 4 micro-batches of 2 trajectories, each packed alone
])
def test_packed_update_equals_padded(params, name, aggregation, micro):
  b, s = 8, 32
  mb = _arrays(6, b, s)
  packer = MinibatchPacker(np.asarray(mb["valid"]), 64, micro_batch=micro, row_multiple=1)
  idx, maps = packer(np.arange(b))
  plan = packer.plans[0]
  assert plan.num_micro == (b // micro if micro else 1) and plan.shape[0] < b
  assert packer.stats()["packing_efficiency"] >= np.asarray(mb["valid"]).mean()
  packed_mb = {**{k: v[jnp.asarray(idx)] for k, v in mb.items()}, **maps}
  assert set(maps) == set(PACK_KEYS)
  opt = optax.sgd(LR)
  update = make_policy_update(Qwen(CFG), opt, _loss(name, aggregation), micro_batch=micro)
  copy = lambda t: jax.tree.map(jnp.copy, t)  # noqa: E731  (the update donates its params)
  p1, _, m1 = _host(update(copy(params), opt.init(params), mb))
  p2, _, m2 = _host(update(copy(params), opt.init(params), packed_mb))
  assert int(m1["skipped"]) == 0 and int(m2["skipped"]) == 0
  for key in m1:
    np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-6, err_msg=key)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), p2, p1)
  moved = max(float(np.abs(x - np.asarray(y)).max())
              for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(params)))
  assert moved > 1e-3  # not two unchanged trees


# ------------------------------------------------------------------------------ config


def test_pack_tokens_is_validated_naming_the_field():
  from configs.base import get_config
  config = get_config("demo")
  assert config.rl.pack_tokens == 0 and config.rollout.kv_window_min == 256
  config_lib.validate(config)
  config.rl.pack_tokens = 4096
  config_lib.validate(config)
  for bad in (100, -128):
    config.rl.pack_tokens = bad
    with pytest.raises(config_lib.ConfigError, match="rl.pack_tokens"):
      config_lib.validate(config)
  # A config recorded before the key: upgraded to padded rows (train/upgrade.py)
  import ml_collections
  from agentjax.train.upgrade import upgrade_recorded
  recorded = config.to_dict()
  del recorded["rl"]["pack_tokens"]
  upgraded = ml_collections.ConfigDict(upgrade_recorded(recorded))
  assert upgraded.rl.pack_tokens == 0
  config_lib.validate(upgraded)
  config.trainer, config.rl.pack_tokens = "dac", 128  # DAC's roles run padded: refused
  with pytest.raises(config_lib.ConfigError, match="rl.pack_tokens=128: DAC"):
    config_lib.validate(config)
  config.trainer, config.rl.pack_tokens, config.rollout.kv_window_min = "rl", 0, -1
  with pytest.raises(config_lib.ConfigError, match="rollout.kv_window_min"):
    config_lib.validate(config)


# ------------------------------------------------------------------------------ the RL step


@pytest.mark.slow  # two RL steps compiling rollouts, scoring and updates: ~35 s on 2 cores
def test_rl_step_on_packed_rows_equals_padded(scripted_world):
  """RLStep wiring: an IGPO step (probes, reference, 2 micro-batches per minibatch) with
  rl.pack_tokens gives the padded step's params and metrics, and logs both efficiencies; so does
  the packed step on the cache's whole width (rl.trim_batches off) with packed row counts on the
  coarsest ladder (rl.pack_rows_per_octave 1: more padding rows, fewer programs). (The
  scripted trajectories have nearly equal lengths: packing gains little here.)"""
  import importlib

  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.parallel import make_mesh
  from agentjax.sampling import SamplingParams
  from agentjax.train.step import RLStep
  from tests import agent_fixtures as af

  tok, backend, agent = scripted_world
  group, prompts = 4, 2
  engine = RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=group, max_turns=2, max_new_tokens=8, max_obs_tokens=48, max_total_tokens=1024,
      topk=2, sampling=SamplingParams(temperature=1.0)))  # ~400 slots used: trim cuts to 512
  params = agent.params(af.SEARCH, af.ANSWER)
  questions = [{"question": "Who founded Zorvath?", "golden_answers": ["Aldric"]}] * prompts
  out = {}
  for pack, trim, octave in ((0, True, 8), (128, True, 8), (128, False, 1)):
    c = importlib.import_module("configs.igpo").get_config("demo")
    c.rl.trim_batches, c.rl.pack_rows_per_octave = trim, octave
    c.rollout.group_size, c.rollout.max_turns, c.rollout.max_total_tokens = group, 2, 1024
    c.rl.prompts_per_step, c.rl.minibatch_size = prompts, group * prompts
    c.rl.micro_batch_size, c.rl.pack_tokens = group * prompts // 2, pack
    optimizer = optax.sgd(0.3)
    rl_step = RLStep.build(c, make_mesh(-1, 1, 1), engine, optimizer, params)
    p = jax.tree.map(jnp.copy, params)  # the update donates its params
    state = {"params": p, "opt_state": optimizer.init(p), "rng": jax.random.key(0)}
    result = rl_step(state, questions, 0)
    out[pack, trim] = _host(result.state["params"]), result.metrics
  (p0, m0), (p1, m1), (p2, m2) = out[0, True], out[128, True], out[128, False]
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), p1, p0)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), p2, p0)
  for key in ("reward", "turns", "ig_mean", "loss", "kl", "entropy", "grad_norm"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(m2[key], m0[key], rtol=1e-5, atol=1e-6, err_msg=key)
  assert m2["padded_efficiency"] < m0["padded_efficiency"]  # the whole cache's width
  assert m0["packing_efficiency"] == m0["padded_efficiency"] == m1["padded_efficiency"]
  assert m1["packing_efficiency"] >= m1["padded_efficiency"]
  assert 0 < m1["score_packing_efficiency"] <= 1 and "score_packing_efficiency" not in m0
