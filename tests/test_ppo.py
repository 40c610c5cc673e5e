"""PPO with a learned critic: the presets, the critic's gradients, a scripted agent learning under
PPO, and the trainer end to end (policy + critic trained, resumed exactly, evaluated, exported)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.models import masks
from agentjax.models.qwen.value import QwenValue, sequence_values, value_params_from_policy
from agentjax.rl import outcome_rewards
from agentjax.sampling import SamplingParams
from agentjax.train import config as config_lib
from agentjax.train.critic import Critic
from agentjax.train.scoring import score_batch
from agentjax.train.updates import (PolicyLossConfig, compute_advantages, make_policy_update,
                                    minibatches)
from agentjax.train.updates import CRITIC_MINIBATCH, POLICY_MINIBATCH
from tests import agent_fixtures as af
from tests.trainer_fixtures import run_metrics, tiny_config

# ------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("preset", ["qwen2.5-3b", "qwen2.5-7b", "qwen3-8b"])
def test_paper_presets_are_igpo_s_but_the_estimator(preset):
  """The IGPO paper's Table 2 ran every algorithm "under the same configuration"."""
  from configs import igpo, ppo
  ours, theirs = ppo.get_config(preset).to_dict(), igpo.get_config(preset).to_dict()
  assert ours.pop("algorithm") == "ppo" and theirs.pop("algorithm") == "igpo"
  assert ours == theirs
  config = ppo.get_config(preset)
  config_lib.validate(config)
  # verl's critic defaults, which the IGPO code's config carries.
  assert (config.critic.lr, config.ppo.value_clip, config.ppo.gamma, config.ppo.lam) == (
      1e-5, 0.5, 1.0, 1.0)
  assert config.critic.warmup_steps == 0 and config.critic.init == "policy"


def test_demo_and_cw_presets_validate():
  from configs import ppo
  for preset in ppo.PRESETS:
    config_lib.validate(ppo.get_config(preset))
  demo = {p: ppo.get_config(p) for p in ("demo", "demo-turn", "demo-round", "demo-ig")}
  assert [c.algorithm for c in demo.values()] == ["ppo", "ppo_turn", "ppo_round", "ppo"]
  assert demo["demo-ig"].ppo.ig_weight == 1.0 and demo["demo"].ppo.ig_weight == 0.0
  cw = ppo.get_config("cw-qwen3-8b")  # run_qwen3-8b_search_multiturn_ppo.sh
  assert (cw.rollout.group_size, cw.rl.prompts_per_step, cw.rl.minibatch_size) == (1, 128, 32)
  assert (cw.critic.lr, cw.critic.lr_warmup_steps, cw.optimizer.warmup_steps) == (1e-5, 3, 56)
  assert cw.judge.backend == "none" and cw.rl.reward_metric == "em"


@pytest.mark.parametrize("override,message", [
    ({"ppo.lam": 1.5}, "config.ppo.lam"),
    ({"critic.lr": 0.0}, "config.critic.lr"),
    ({"critic.init": "/no/such/folder"}, "config.critic.init"),
    ({"critic.warmup_steps": -1}, "config.critic.warmup_steps"),
    ({"ppo.outcome_weight": 0.0}, "config.ppo.outcome_weight"),
    ({"trainer": "dac"}, "config.algorithm"),
])
def test_bad_critic_settings_name_the_field(override, message):
  from configs import ppo
  config = ppo.get_config("demo")
  for key, value in override.items():
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    node[leaf] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(config)


# ------------------------------------------------------------------------------ the critic


def _critic(cfg, value_clip=0.5, optimizer=None):
  return Critic(cfg=cfg, module=QwenValue(cfg), spec=None, backbone=None,
                optimizer=optimizer or optax.sgd(1.0), schedule=optax.constant_schedule(1.0),
                value_clip=value_clip, value_coef=1.0, aggregation="token-mean", warmup_steps=0)


def test_value_head_gradient_is_the_value_loss_s_and_the_policy_update_never_touches_it():
  """The critic's head gradient equals the NumPy gradient of the clipped value loss through the
  trunk's hidden states (the clipped slots give none), and the policy's update leaves the critic
  bit for bit as it was (and the critic's update the policy)."""
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  cfg = QwenConfig.preset("tiny", vocab_size=64)
  policy = init_params(cfg, jax.random.key(0))
  critic = _critic(cfg, value_clip=0.05)
  params = value_params_from_policy(cfg, policy, jax.random.key(1))
  rng = np.random.default_rng(0)
  b, length = 4, 12
  tokens = jnp.asarray(rng.integers(0, 64, (b, length)), jnp.int32)
  valid = jnp.asarray(np.arange(length)[None] < np.array([[12], [10], [7], [12]]))
  mask = valid & jnp.asarray(np.arange(length)[None] >= 3)
  old = np.asarray(critic.values(params, tokens, valid))
  # Targets and a shifted anchor so that both branches of the clip occur.
  returns = jnp.asarray(rng.normal(size=(b, length)), jnp.float32)
  anchor = jnp.asarray(old + rng.choice([0.0, 0.2], size=old.shape), jnp.float32)
  mb = dict(tokens=tokens, valid=valid, old_values=anchor, returns=returns, value_mask=mask)

  # NumPy: d/dw of 0.5 * mean_mask max((v - R)^2, (v_clip - R)^2), v = h . w + b.
  hidden, _ = QwenValue(cfg).apply({"params": params}, tokens,
                                   masks.positions_from_padding(valid),
                                   masks.causal_padding_mask(valid),
                                   method=lambda m, *a: m.model(*a, return_hidden=True))
  h = np.asarray(hidden, np.float64)
  h_prev = np.concatenate([h[:, :1], h[:, :-1]], axis=1)      # value of token t from slot t-1
  v, a, r, m = old.astype(np.float64), np.asarray(anchor, np.float64), np.asarray(returns), \
      np.asarray(mask)
  v_clip = a + np.clip(v - a, -0.05, 0.05)
  use_clipped = (v_clip - r) ** 2 > (v - r) ** 2
  # The clipped branch has zero gradient where the clip is active (|v - a| > 0.05).
  dv = np.where(use_clipped, np.where(np.abs(v - a) <= 0.05, v_clip - r, 0.0), v - r)
  dv = np.where(m, dv, 0.0) / m.sum()
  want_kernel = np.einsum("bl,ble->e", dv, h_prev)[:, None]
  want_bias = np.array([dv.sum()])

  before_policy = jax.tree.map(np.asarray, policy)
  before_critic = jax.tree.map(np.asarray, params)
  new, _, metrics = critic.update(params, critic.optimizer.init(params), mb)   # sgd(1): -grad
  assert int(metrics["skipped"]) == 0 and 0 < float(metrics["critic/value_clip_fraction"]) < 1
  np.testing.assert_allclose(before_critic["score"]["kernel"] - np.asarray(new["score"]["kernel"]),
                             want_kernel, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(before_critic["score"]["bias"] - np.asarray(new["score"]["bias"]),
                             want_bias, rtol=1e-4, atol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, policy), before_policy)

  # The policy's update on the same data: the critic's arrays are not among its inputs, and
  # its own gradient comes from the policy loss alone (the critic's fresh copy is untouched).
  params = value_params_from_policy(cfg, policy, jax.random.key(1))
  update = make_policy_update(Qwen(cfg), optax.sgd(0.5), PolicyLossConfig())
  logp = score_batch(Qwen(cfg), policy, None, _Batch(tokens, valid), None).old_logp
  pmb = dict(tokens=tokens, valid=valid, loss_mask=mask, old_logp=logp, ref_logp=logp,
             advantages=jnp.asarray(rng.normal(size=(b, length)), jnp.float32))
  update(policy, optax.sgd(0.5).init(policy), pmb)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), before_critic)


class _Batch:
  """The fields score_batch reads without probes."""

  def __init__(self, tokens, valid):
    self.tokens, self.valid = tokens, valid
    self.turn_ends = np.zeros((tokens.shape[0], 2), np.int32)
    self.num_turns = np.zeros((tokens.shape[0],), np.int32)


# ------------------------------------------------------------------------------ learning


# ppo_turn's learning is in `make test-all` (its targets, as RLStep wires them, are checked by the
# LoRA run below in the default suite).
@pytest.mark.parametrize("estimator", ["ppo", pytest.param("ppo_turn", marks=pytest.mark.slow)])
def test_ppo_steps_raise_the_reward_of_a_scripted_agent(scripted_world, estimator):
  """As tests/test_rl_step.py does for GRPO and IGPO: the policy decides at "</think>" between
  answering (F1 = 1) and searching; two turns. Under PPO with its critic (values, GAE, policy and
  critic updates on the same minibatches) the reward rises."""
  tok, backend, agent = scripted_world
  engine = RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=12, max_turns=2, max_new_tokens=8, max_obs_tokens=48, max_total_tokens=512,
      topk=2, sampling=SamplingParams(temperature=1.0)))
  params = agent.params(af.SEARCH, af.ANSWER)
  optimizer = optax.sgd(0.3)  # see test_rl_step: Adam blows up this one-hot model's gradients
  update = make_policy_update(engine.model, optimizer, PolicyLossConfig())
  opt_state = optimizer.init(params)
  critic = _critic(agent.cfg, optimizer=optax.adam(1e-2))
  cstate = value_params_from_policy(agent.cfg, params, jax.random.key(3))
  copt = critic.optimizer.init(cstate)
  questions, golds = ["Who founded Zorvath?"] * 2, [["Aldric"]] * 2
  rng = np.random.default_rng(0)
  rewards, losses = [], []
  for step in range(3):
    batch, _ = engine.run(params, questions, jax.random.key(step))
    outcome = outcome_rewards(list(batch.answers), [golds[g] for g in batch.group_ids])
    rewards.append(float(outcome.mean()))
    scored = score_batch(engine.model, params, None, batch, None)
    values = critic.values(cstate, batch.tokens, batch.valid)
    adv, stats = compute_advantages(estimator, batch, outcome, scored.ig,
                                    extra={"values": values})
    targets = dict(old_values=values, returns=stats["returns"], value_mask=stats["value_mask"])
    for mb in minibatches(batch, scored, adv, 12, rng, targets):
      params, opt_state, m = update(params, opt_state, {k: mb[k] for k in POLICY_MINIBATCH})
      assert int(m["skipped"]) == 0
      cstate, copt, cm = critic.update(cstate, copt, {k: mb[k] for k in CRITIC_MINIBATCH})
      assert int(cm["skipped"]) == 0
      losses.append(float(cm["critic/value_loss"]))
  assert rewards[0] <= 0.9 and np.mean(rewards[-2:]) >= 0.95, rewards
  assert np.isfinite(losses).all()


# ------------------------------------------------------------------------------ the trainer


TIMING = ("rollout_s", "scoring_s", "update_s", "step_s", "search_s", "tokens_per_s",
          "sampled_tokens_per_s", "eval/seconds", "compiles")


@pytest.fixture(scope="module")
def ppo_runs(world_dir, tokenizer, tmp_path_factory):
  """configs/ppo.py:demo on the tiny world, one critic-only warm-up step: run A 3 steps; run B
  preempted after 2 steps, then resumed by the same call."""
  from agentjax.train.trainer import train
  tmp = str(tmp_path_factory.mktemp("ppo_runs"))
  config = tiny_config(world_dir, tokenizer.name_or_path, tmp, algorithm="ppo")
  # One decoder layer (the tiny preset has 2), in the policy and its critic: compiling the layers
  # is most of a run's time, and nothing checked here depends on depth (the value model's
  # per-layer export is tests/test_value_model.py's, on the 2-layer preset).
  config.model.shape.num_layers = 1
  config.critic.warmup_steps = 1
  config.train.eval_every = 0
  a = train(config, os.path.join(tmp, "a"))
  b1 = train(config, os.path.join(tmp, "b"), stop_after=2)
  b2 = train(config, os.path.join(tmp, "b"))
  return config, tmp, a, b1, b2


def test_ppo_trains_policy_and_critic_resumes_exactly_and_exports_both(ppo_runs):
  config, tmp, a, b1, b2 = ppo_runs
  rows = [r for r in run_metrics(os.path.join(tmp, "a")) if "reward" in r]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for key in ("critic/value_loss", "critic/explained_variance", "critic/value_mean",
              "critic/return_mean", "critic/value_clip_fraction", "critic/grad_norm"):
    assert all(np.isfinite(r[key]) for r in rows), key
  # Step 1 trains the critic only: the policy is still the initial one at step 2's rollouts.
  assert [r["critic/policy_frozen"] for r in rows] == [1.0, 0.0, 0.0]
  assert rows[0]["loss"] == 0.0 and rows[1]["loss"] != 0.0
  assert all(r["critic/grad_norm"] > 0 for r in rows)
  assert a["evals"][3]["n"] == config.data.eval_size  # evaluated at the end
  # Resume: every metric, the policy and the critic equal the uninterrupted run's.
  assert b1["step"] == 2 and b2["step"] == 3
  rows_b = {r["step"]: r for r in run_metrics(os.path.join(tmp, "b")) if "reward" in r}
  for r in rows:
    for key, value in r.items():
      if key not in TIMING and not key.startswith("sys/"):
        assert rows_b[r["step"]][key] == value, (r["step"], key)
  for x, y in ((a["params"], b2["params"]), (a["critic_params"], b2["critic_params"])):
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(x), jax.device_get(y))
  # The critic's export is the final critic, as a Hugging Face token-classification folder.
  from agentjax.models.qwen.value import load_value_hf
  _, exported = load_value_hf(os.path.join(tmp, "a", "critic_export"))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(exported),
               jax.device_get(a["critic_params"]))


def test_ppo_checkpoint_holds_the_critic_and_eval_restores_the_policy(ppo_runs, monkeypatch):
  config, tmp, a, _, _ = ppo_runs
  from agentjax.parallel import make_mesh
  from agentjax.train.trainer import restore_policy

  def no_critic(*args, **kwargs):
    raise AssertionError("eval built the critic")

  # Eval and serving restore the checkpoint without building (copying, initializing) a critic.
  monkeypatch.setattr(Critic, "init_state", no_critic)
  mesh = make_mesh(1, 1, 1)
  _, params, _, _ = restore_policy(config, os.path.join(tmp, "a"), mesh)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), jax.device_get(a["params"]))
  # A non-PPO config cannot resume a PPO workdir: the estimator is a compat key.
  changed = config.copy_and_resolve_references()
  changed.algorithm = "grpo"
  from agentjax.train.checkpoint import CheckpointMismatchError
  from agentjax.train.trainer import train
  with pytest.raises(CheckpointMismatchError, match="algorithm"):
    train(changed, os.path.join(tmp, "a"))


def test_lora_ppo_trains_a_value_adapter_and_head_on_the_shared_backbone(world_dir, tokenizer,
                                                                          tmp_path, monkeypatch):
  """With model.lora.adapters the critic is a "value" adapter + head on the policy's frozen
  backbone: the checkpoint holds adapters and the head only (no second trunk), both adapters
  train (B moves off 0), and the critic export is the backbone with the value adapter merged."""
  import orbax.checkpoint as ocp
  from agentjax.models import lora as lora_lib
  from agentjax.models.qwen.value import load_value_hf
  from agentjax.parallel import make_mesh
  from agentjax.train.trainer import load_model, train
  config = tiny_config(world_dir, tokenizer.name_or_path, str(tmp_path), algorithm="ppo",
                       steps=2)
  config.algorithm = "ppo_turn"  # and the turn-level critic's targets as the step wires them
  config.model.shape.num_layers = 1  # as in ppo_runs: the checks do not depend on depth
  config.model.lora.adapters = "policy"
  config.model.lora.rank = 4
  config.model.lora.alpha = 8.0
  config.model.lora.lr = "policy=1e-2"
  config.critic.lr = 1e-2
  config.train.eval_every = 0
  seen = []
  update = Critic.update

  def spy(self, trainable, opt_state, minibatch):
    seen.append(jax.device_get({k: minibatch[k] for k in ("valid", "value_mask", "returns")}))
    return update(self, trainable, opt_state, minibatch)

  monkeypatch.setattr(Critic, "update", spy)
  out = train(config, str(tmp_path / "run"))
  # ppo_turn regresses one value per turn: at most max_turns target slots a row, each a real
  # slot, every trajectory with at least one (its first turn's first sampled token).
  assert seen
  for mb in seen:
    per_row = mb["value_mask"].sum(axis=1)
    assert (per_row >= 1).all() and (per_row <= config.rollout.max_turns).all(), per_row
    assert not (mb["value_mask"] & ~mb["valid"]).any()
    assert not mb["returns"][~mb["value_mask"]].any()
  critic = out["critic_params"]
  assert sorted(critic) == ["adapter", "score"] and sorted(out["params"]) == ["policy"]
  moved = lambda tree: max(float(np.abs(np.asarray(x)).max())  # noqa: E731
                           for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
                           if getattr(p[-1], "key", None) == "lora_b")
  assert moved(critic["adapter"]) > 0 and moved(out["params"]["policy"]) > 0
  meta = ocp.StandardCheckpointer().metadata(str(tmp_path / "run" / "checkpoints" / "2" / "state"))
  tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
  paths = [jax.tree_util.keystr(p, simple=True, separator="/")
           for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  critic_paths = [p for p in paths if p.startswith("critic/params/")]
  assert critic_paths and all(p.endswith(("/lora_a", "/lora_b")) or "/score/" in p
                              for p in critic_paths), critic_paths[:5]
  cfg, backbone, _ = load_model(config, make_mesh(-1, 1, 1))
  _, exported = load_value_hf(str(tmp_path / "run" / "critic_export"))
  merged = lora_lib.merge(backbone, critic["adapter"], 2.0)
  merged.pop("lm_head", None)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6),
               exported, {"model": merged, "score": critic["score"]})
