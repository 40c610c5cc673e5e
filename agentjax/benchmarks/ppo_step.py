"""`python launch/bench.py ppo_step`: what PPO's critic adds to an RL step (scoring + update)
(bench_ppo_step)."""

from __future__ import annotations

import statistics
import time

from agentjax.benchmarks.common import FLAGS, device_name, ppo_minibatch, tree_bytes


def bench_ppo_step() -> dict:
  """What PPO's critic adds to an RL step, against the same step without it (GRPO's), same model
  shape and minibatch: the scoring pass (the policy's teacher-forced log-probs, + the critic's
  values) and one minibatch update (the policy's PPO-clip update, + the critic's value-loss
  update), each timed as a median over --repeats rounds after a warm-up (compiles excluded), and
  the train state held between steps (params + AdamW state; the critic: a full value model, or
  with LoRA a rank --lora_rank value adapter + head), counted from the arrays' shapes.

  Settings as train/step.py builds them from configs/ppo.py:qwen2.5-3b (loss: PPO clip 0.2,
  low_var_kl 0.001, token-mean, entropy computed; AdamW, clip 1.0; the critic verl's: lr 1e-5,
  value clip 0.5). `ratio` = (policy + critic) / policy time of scoring + one update.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from configs import ppo as ppo_config
  from agentjax.models.logprobs import sequence_logprobs
  from agentjax.models.lora import LoraSpec
  from agentjax.models.qwen import Qwen, QwenConfig, adapter_abstract, init_params
  from agentjax.models.qwen.value import value_abstract, value_params_from_policy
  from agentjax.train.adapters import TrainTarget
  from agentjax.train.critic import Critic
  from agentjax.train.optim import make_optimizer
  from agentjax.train.updates import make_policy_update, policy_loss_config

  config = ppo_config.get_config("qwen2.5-3b")
  rl, o = config.rl, config.optimizer
  loss = policy_loss_config(config)
  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  b, length = FLAGS.batch or 4, FLAGS.length or 256
  total = 1000
  policy_opt = make_optimizer(o.lr, o.warmup_steps, total, o.weight_decay, o.clip_norm or None,
                              o.final_lr_ratio, o.b2)
  update = make_policy_update(Qwen(cfg), policy_opt, loss)
  critic = Critic.build(config, TrainTarget(cfg, None, None, None), updates_per_step=1)
  mb = ppo_minibatch(cfg.vocab_size, b, length)
  rng = np.random.RandomState(1)
  cmb = {"tokens": mb["tokens"], "valid": mb["valid"], "value_mask": mb["loss_mask"],
         "old_values": jnp.asarray(0.1 * rng.randn(b, length), jnp.float32),
         "returns": jnp.asarray(rng.rand(b, 1) * mb["loss_mask"], jnp.float32)}
  score = jax.jit(lambda p, t, v: sequence_logprobs(Qwen(cfg), p, t, v, chunk=rl.chunk)[0])

  params = init_params(cfg, jax.random.key(0))
  state = {"policy": (params, policy_opt.init(params))}
  cparams = value_params_from_policy(cfg, params, jax.random.key(1))
  state["critic"] = (cparams, critic.optimizer.init(cparams))

  def run_score(name):
    p = state[name][0]
    out = score(p, mb["tokens"], mb["valid"]) if name == "policy" else \
        critic.values(p, mb["tokens"], mb["valid"])
    return jax.block_until_ready(out)

  def run_update(name):
    p, s = state[name]
    if name == "policy":
      p, s, m = update(p, s, mb)
    else:
      p, s, m = critic.update(p, s, cmb)
    jax.block_until_ready(p)
    state[name] = (p, s)
    return int(m["skipped"])

  start = time.perf_counter()
  for name in ("policy", "critic"):  # warm-up: compiles
    run_score(name)
    run_update(name)
  compile_s = time.perf_counter() - start
  times = {f"{phase}_{name}": [] for phase in ("score", "update") for name in ("policy", "critic")}
  skipped = 0
  for _ in range(FLAGS.repeats):
    for name in ("policy", "critic"):
      t0 = time.perf_counter()
      run_score(name)
      times[f"score_{name}"].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      skipped += run_update(name)
      times[f"update_{name}"].append(time.perf_counter() - t0)
  med = {k: statistics.median(v) for k, v in times.items()}

  nbytes = tree_bytes
  spec = LoraSpec(names=("value",), rank=FLAGS.lora_rank or 32,
                  alpha=FLAGS.lora_alpha or float(FLAGS.lora_rank or 32))
  lora_params = {"adapter": adapter_abstract(cfg, spec), "score": value_abstract(cfg)["score"]}
  lora_state = nbytes(lora_params) + nbytes(jax.eval_shape(critic.optimizer.init, lora_params))
  policy_state = nbytes(state["policy"])
  critic_state = nbytes(state["critic"])
  base = med["score_policy"] + med["update_policy"]
  return {
      "bench": "ppo_step", "preset": FLAGS.preset, "dtype": FLAGS.dtype, "batch": b,
      "length": length, "repeats": FLAGS.repeats, "compile_s": round(compile_s, 1),
      **{f"{k}_s": round(v, 4) for k, v in med.items()},
      "score_ratio": round((med["score_policy"] + med["score_critic"]) / med["score_policy"], 3),
      "update_ratio": round((med["update_policy"] + med["update_critic"])
                            / med["update_policy"], 3),
      "policy_state_gb": round(policy_state / 1e9, 3),
      "critic_state_gb": round(critic_state / 1e9, 3),
      "lora_critic_state_gb": round(lora_state / 1e9, 4), "lora_rank": spec.rank,
      "state_ratio": round((policy_state + critic_state) / policy_state, 3),
      "lora_state_ratio": round((policy_state + lora_state) / policy_state, 4),
      "skipped_updates": skipped, "device": device_name(),
      "ratio": round((base + med["score_critic"] + med["update_critic"]) / base, 3)}
