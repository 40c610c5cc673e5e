"""A tiny RL run whose retriever never answers from step --stall_at on: the progress watchdog
(train.stall_timeout_s) must dump every thread's stack to the workdir and exit with code 75.

  python -m tests.stall_check --workdir=W --world_dir=D --tokenizer_dir=T --tmp=P --stall_at=1

--async_steps=1: the stall is in the rollout producer's thread (the trainer's thread waits on
it). Prints "FINISHED" if the run ends instead (the watchdog missed the stall).
"""

from __future__ import annotations

import argparse


def main():
  p = argparse.ArgumentParser()
  for name in ("workdir", "world_dir", "tokenizer_dir", "tmp"):
    p.add_argument(f"--{name}", required=True)
  p.add_argument("--stall_at", type=int, default=1)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--timeout_s", type=float, default=20.0)
  p.add_argument("--async_steps", type=int, default=0)
  args = p.parse_args()
  from agentjax.train.trainer import train
  from tests.trainer_fixtures import search_every_turn, tiny_config
  config = stall_config(tiny_config(args.world_dir, args.tokenizer_dir, args.tmp,
                                    steps=args.steps), args.timeout_s, args.async_steps)
  search_every_turn(setattr, stall_at=args.stall_at)
  train(config, args.workdir)
  print("FINISHED", flush=True)


def stall_config(config, timeout_s: float, async_steps: int = 0):
  """The tiny config as the stall test runs it (no evals or export: fewer programs)."""
  config.train.stall_timeout_s = timeout_s
  config.train.eval_every = 0
  config.train.export_hf = False
  config.train.async_steps = async_steps
  return config


if __name__ == "__main__":
  main()
