r"""RLOO: each rollout's outcome minus the mean of the other rollouts of its question. No std
is used, so rl.std_estimator and rl.std_eps have no effect here.

  python launch/train.py --config=configs/rloo.py:demo --workdir=runs/demo/rloo
  python launch/train.py --config=configs/rloo.py:qwen2.5-7b --workdir=/mnt/shared/runs/rloo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "rloo"
  return config
