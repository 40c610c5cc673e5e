"""Asynchronous RL with the split placement on 8 fake CPU devices (4 sample, 4 train).

  python -m tests.async_split_check --workdir=W --world_dir=D --tokenizer_dir=T --tmp=X

Runs two RL steps with train.async_steps = 1 and mesh.sampler_devices = 4: every rollout's
parameters live on the last 4 devices (the sampler's), the trained parameters on the first 4, the
weight copy is timed, the second step's rollout is one version old; then the same colocated on all
8 devices (the two threads taking turns on them). Prints "OK" and one JSON line of the split
run's step metrics the test reads.
"""

from __future__ import annotations

import argparse
import json
import os

from tests.subprocess_env import xla_flags


def main():
  p = argparse.ArgumentParser()
  for name in ("workdir", "world_dir", "tokenizer_dir", "tmp"):
    p.add_argument(f"--{name}", required=True)
  args = p.parse_args()
  os.environ["XLA_FLAGS"] = xla_flags(devices=8)
  import jax
  assert jax.device_count() == 8, jax.devices()
  from agentjax.agent.rollout import RolloutEngine
  from agentjax.train import config as config_lib
  from agentjax.train.trainer import train
  from tests.trainer_fixtures import tiny_config

  config = tiny_config(args.world_dir, args.tokenizer_dir, args.tmp, algorithm="igpo", steps=2)
  config.rl.prompts_per_step = 4   # 8 trajectories
  config.rl.minibatch_size = 8
  config.train.eval_every = 0
  config.train.export_hf = False
  config.train.async_steps = 1
  config.mesh.sampler_devices = 4
  config_lib.validate(config)
  devices = jax.devices()
  rollout_devices = []
  real_run = RolloutEngine.run

  def run(self, params, questions, rng, *a, **k):
    rollout_devices.append(sorted({d.id for leaf in jax.tree.leaves(params)
                                   for d in leaf.sharding.device_set}))
    return real_run(self, params, questions, rng, *a, **k)

  RolloutEngine.run = run
  out = train(config, args.workdir)
  assert out["step"] == 2
  trained = sorted({d.id for leaf in jax.tree.leaves(out["params"])
                    for d in leaf.sharding.device_set})
  sampler = sorted(d.id for d in devices[4:])
  # The two training rollouts, then the final eval's (greedy, on the trainer's devices).
  assert rollout_devices == [sampler, sampler, trained], rollout_devices
  assert trained == sorted(d.id for d in devices[:4]), trained
  with open(os.path.join(args.workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if '"reward"' in line]
  # Colocated on all 8 devices: the producer and the updater take turns on them (without, two
  # threads' SPMD programs deadlock in their collectives).
  config.mesh.sampler_devices = 0
  RolloutEngine.run = real_run
  colocated = train(config, args.workdir + "_colocated")
  assert colocated["step"] == 2
  print("OK")
  print(json.dumps([{k: r[k] for k in ("step", "reward", "loss", "async/staleness",
                                       "async/weight_copy_s", "mismatch/abs_logp_diff")}
                    for r in rows]))


if __name__ == "__main__":
  main()
