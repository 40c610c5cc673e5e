"""One RL step end to end: a scripted agent learns that answering beats searching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.rl import build_probes, outcome_rewards
from agentjax.sampling import SamplingParams
from agentjax.train.scoring import score_batch
from agentjax.train.updates import (PolicyLossConfig, compute_advantages, make_policy_update,
                                    minibatches, summarize)
from tests import agent_fixtures as af


def make_engine(world, max_turns):
  """Every test samples 2 questions x 12 in a 512-slot cache: extend, generate and the scoring
  pass compile once for the module (max_turns is a host-side loop bound)."""
  tok, backend, agent = world
  return RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=12, max_turns=max_turns, max_new_tokens=8, max_obs_tokens=48,
      max_total_tokens=512, topk=2, sampling=SamplingParams(temperature=1.0)))


@pytest.fixture(scope="module")
def update(world):
  """(optimizer, jitted policy update), shared: the update does not depend on the estimator."""
  # Plain SGD: Adam's per-parameter normalization turns the near-zero gradients of this
  # one-hot scripted model into full-size steps and destabilizes it.
  optimizer = optax.sgd(0.3)
  return optimizer, make_policy_update(make_engine(world, 1).model, optimizer, PolicyLossConfig(
      name="ppo", kwargs=(("kl_coef", 1e-3), ("kl_estimator", "low_var_kl"))))


@pytest.mark.parametrize("estimator", ["grpo", "igpo"])
def test_rl_steps_raise_the_reward(world, update, estimator):
  tok, backend, agent = world
  # One turn: after </think> the policy either answers (F1 = 1) or searches and runs out of turns.
  engine = make_engine(world, max_turns=2 if estimator == "igpo" else 1)
  params = agent.params(af.SEARCH, af.ANSWER)
  ref_params = jax.tree.map(lambda x: x.copy(), params)
  optimizer, update = update
  opt_state = optimizer.init(params)
  questions, golds = ["Who founded Zorvath?"] * 2, [["Aldric"]] * 2
  probes_fn = lambda rows: build_probes(engine.encode, [golds[g] for g in rows])  # noqa: E731
  rng = np.random.default_rng(0)
  rewards = []
  for step in range(3):
    batch, _ = engine.run(params, questions, jax.random.key(step))
    outcome = outcome_rewards(list(batch.answers), [golds[g] for g in batch.group_ids])
    rewards.append(float(outcome.mean()))
    probes = probes_fn(batch.group_ids) if estimator == "igpo" else None
    scored = score_batch(engine.model, params, ref_params, batch, probes)
    # The scoring pass reproduces the sampler's own log-probs: the first PPO ratio is 1.
    sampled = np.asarray(batch.loss_mask)
    np.testing.assert_allclose(np.asarray(scored.old_logp)[sampled],
                               np.asarray(batch.logprobs)[sampled], atol=1e-4)
    adv, stats = compute_advantages(estimator, batch, outcome, scored.ig)
    metrics = []
    for mb in minibatches(batch, scored, adv, 12, rng):
      params, opt_state, m = update(params, opt_state, mb)
      metrics.append(m)
    summary = summarize(metrics)
    assert summary["skipped"] == 0 and np.isfinite(summary["loss"])
    if step == 0:  # the first minibatch runs on the sampling policy itself
      first = jax.device_get(metrics[0])
      assert float(first["clip_fraction"]) == 0.0 and abs(float(first["approx_kl"])) < 1e-4
  # Before: a coin flip at every "</think>" (grpo: 1 turn, ~0.5; igpo: 2 turns, ~0.75).
  assert rewards[0] <= 0.9 and np.mean(rewards[-2:]) >= 0.95, rewards


def test_non_finite_update_is_skipped(world, update):
  tok, backend, agent = world
  engine = make_engine(world, max_turns=1)
  params = agent.params(af.SEARCH, af.ANSWER)
  batch, _ = engine.run(params, ["q", "r"], jax.random.key(0))
  scored = score_batch(engine.model, params, params, batch, None)
  adv = np.full(batch.tokens.shape, np.nan, np.float32)  # a NaN advantage on sampled tokens
  optimizer, update = update
  opt_state = optimizer.init(params)
  before = jax.tree.map(np.asarray, params)
  mb = minibatches(batch, scored, adv, 12, np.random.default_rng(0))[0]
  params, opt_state, m = update(params, opt_state, mb)
  assert float(m["skipped"]) == 1.0
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), before)


def test_off_policy_correction_scales_the_update_by_its_weights(world):
  """One SGD update with rl.off_policy_correction = "tis" on the sampler's own log-probs (the
  step's minibatch carries them as behav_logp), one compiled program: with every sampled
  token's behaviour log-prob equal to the scoring pass's the weights are 1 (the uncorrected
  update); with it log 4 above (ratio 1/4) the update is exactly 1/4 of that (no KL, no entropy:
  the loss is linear in the weights). Decoupled's dropping and every weight: tests/test_offpolicy.py."""
  tok, backend, agent = world
  engine = make_engine(world, max_turns=1)
  params = agent.params(af.SEARCH, af.ANSWER)
  batch, _ = engine.run(params, ["q", "r"], jax.random.key(0))
  scored = score_batch(engine.model, params, None, batch, None)
  adv = np.where(np.asarray(batch.loss_mask), 1.0, 0.0).astype(np.float32)
  adv[::2] *= -1.0
  optimizer = optax.sgd(0.3)
  mb = minibatches(batch, scored, jnp.asarray(adv), 24, np.random.default_rng(0))[0]
  assert "behav_logp" in mb
  upd = make_policy_update(engine.model, optimizer, PolicyLossConfig(
      name="ppo", correction="tis", correction_cap=2.0))

  def delta(behav_shift):
    m = dict(mb, behav_logp=mb["old_logp"] - behav_shift)
    new, _, metrics = upd(jax.tree.map(jnp.copy, params), optimizer.init(params), m)
    return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new, params), metrics

  plain, metrics = delta(0.0)
  assert float(metrics["offpolicy/weight_mean"]) == pytest.approx(1.0, abs=1e-4)
  assert any(np.any(x != 0) for x in jax.tree.leaves(plain))
  quarter, metrics = delta(-np.log(4.0))
  assert float(metrics["offpolicy/weight_mean"]) == pytest.approx(0.25, rel=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, 0.25 * b, atol=1e-6), quarter, plain)


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_lora_update_moves_the_adapter_uphill_with_the_backbone_frozen(loss):
  """A LoRA policy update (each policy loss): gradients reach the adapter only, the update raises
  the advantage-weighted log-likelihood of its minibatch, the backbone is never written, and the
  KL reference is the backbone run without the adapter. (A random tiny model: the scripted
  agent above decides in its LM head at a one-hot residual whose only live direction the final
  RMSNorm projects out, so no adapter on the projections can move it.)"""
  from agentjax.models import lora as lora_lib
  from agentjax.models.qwen import Qwen, QwenConfig, init_adapters, init_params
  cfg = QwenConfig.preset("tiny", vocab_size=64)
  spec = lora_lib.LoraSpec(("policy", "other"), rank=4, alpha=8.0)
  backbone = init_params(cfg, jax.random.key(0))
  before = jax.tree.map(np.asarray, backbone)
  adapters = init_adapters(cfg, spec, jax.random.key(1))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, (4, 16)), jnp.int32)
  valid = jnp.ones((4, 16), bool)
  loss_mask = jnp.asarray(np.arange(16)[None] >= 6).repeat(4, 0)
  adv = jnp.asarray(np.repeat(rng.normal(size=(4, 1)), 16, 1), jnp.float32)
  model = Qwen(cfg, lora=spec)
  old = score_batch(model, lora_lib.attach(backbone, adapters, spec, "policy"), None,
                    _Batch(tokens, valid), None).old_logp
  ref = score_batch(Qwen(cfg), backbone, None, _Batch(tokens, valid), None).old_logp
  np.testing.assert_allclose(np.asarray(old), np.asarray(ref), atol=1e-6)  # B = 0: policy == ref
  mb = dict(tokens=tokens, valid=valid, loss_mask=loss_mask, old_logp=old, ref_logp=ref,
            advantages=adv)
  optimizer = optax.sgd(0.5)
  update = make_policy_update(model, optimizer, PolicyLossConfig(
      name=loss, kwargs=(("kl_coef", 1e-3), ("kl_estimator", "low_var_kl"))))
  other_before = jax.tree.map(np.asarray, adapters["other"])
  adapters, _, m = update(adapters, optimizer.init(adapters), mb, backbone)
  assert float(m["skipped"]) == 0 and float(m["grad_norm"]) > 0
  new = score_batch(model, lora_lib.attach(backbone, adapters, spec, "policy"), None,
                    _Batch(tokens, valid), None).old_logp
  gain = float(jnp.sum(jnp.where(loss_mask, adv * (new - old), 0.0)))
  assert gain > 0, gain
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, backbone), before)
  # The inactive adapter gets no gradient (plain SGD: it does not move at all).
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, adapters["other"]),
               other_before)


class _Batch:
  """The two fields score_batch reads without probes."""

  def __init__(self, tokens, valid):
    self.tokens, self.valid = tokens, valid
    self.turn_ends = np.zeros((tokens.shape[0], 2), np.int32)
    self.num_turns = np.zeros((tokens.shape[0],), np.int32)
