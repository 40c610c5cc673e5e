"""Two training steps with a checkpoint save and restore, on one process or several.

  python -m tests.multihost_train_check --num_processes=2 --process_id=0 --port=P ...  (and 1)
  python -m tests.multihost_train_check --num_processes=1 ...                          (8 devices)

Every process gets 8 / num_processes fake CPU devices, so the global mesh always has 8. Runs
train(stop_after=1) (a checkpoint at step 1, as a preemption would), then train() again, which
restores step 1 and does step 2. Process 0 writes the metrics of both steps and the final
parameters to --out (an .npz) for test_multihost.py to compare across layouts.
"""

from __future__ import annotations

import argparse
import json
import os

from tests.subprocess_env import xla_flags



def main():
  p = argparse.ArgumentParser()
  for name in ("workdir", "world_dir", "tokenizer_dir", "tmp", "out"):
    p.add_argument(f"--{name}", required=True)
  p.add_argument("--num_processes", type=int, default=1)
  p.add_argument("--process_id", type=int, default=0)
  p.add_argument("--port", type=int, default=0)
  # cw_grpo: process 0 judges, every host gets it; igpo_lora: IGPO training two LoRA adapters
  # (the backbone fingerprinted and the PEFT folders exported from sharded arrays); ppo: the
  # policy and its critic
  p.add_argument("--algorithm", default="igpo")
  # > 0: asynchronous RL (train.async_steps), its two threads taking turns on the devices in
  # process 0's order
  p.add_argument("--async_steps", type=int, default=0)
  p.add_argument("--steps", type=int, default=2)  # the stop is after step 1
  args = p.parse_args()
  os.environ["XLA_FLAGS"] = xla_flags(devices=8 // args.num_processes)
  import jax
  if args.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes, args.process_id)
  assert jax.device_count() == 8, jax.devices()
  import numpy as np
  from agentjax.parallel.host import to_host
  from agentjax.train.trainer import train
  from tests.trainer_fixtures import tiny_config

  lora = args.algorithm.endswith("_lora")
  config = tiny_config(args.world_dir, args.tokenizer_dir, args.tmp,
                       algorithm=args.algorithm.removesuffix("_lora"), steps=args.steps)
  config.rl.prompts_per_step = 4   # 8 trajectories: one per device on the data axis
  config.rl.minibatch_size = 8
  config.train.eval_every = 0
  config.train.export_hf = False
  config.train.async_steps = args.async_steps
  if lora:
    config.model.lora.adapters = "policy,other"
    config.model.lora.rank = 4
    config.model.lora.alpha = 8.0
    config.model.lora.lr = "policy=1e-2"
    config.train.export_hf = True  # every process gathers, process 0 writes
  first = train(config, args.workdir, stop_after=1)
  assert first["step"] == 1
  second = train(config, args.workdir)   # restores step 1 from the checkpoint
  assert second["step"] == args.steps
  params = to_host(second["params"])
  if second["critic_params"] is not None:  # ppo: the critic too (its own subtree)
    params = dict(params, critic=to_host(second["critic_params"]))
  if lora and jax.process_index() == 0:  # the exported adapter is the trained one
    from agentjax.models.qwen.peft import load_peft
    from agentjax.train import config as config_lib
    exported = load_peft(os.path.join(args.workdir, "adapters", "policy"), second["cfg"],
                         config_lib.lora_spec(config))
    for got, want in zip(jax.tree.leaves(to_host(exported)), jax.tree.leaves(params["policy"])):
      np.testing.assert_array_equal(got, want)
  if jax.process_index() == 0:
    with open(os.path.join(args.workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(args.out, metrics=json.dumps(rows), **flat)
  print("OK", jax.process_index(), flush=True)


if __name__ == "__main__":
  main()
