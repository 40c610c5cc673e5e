r"""Dr.GRPO: outcome minus the group mean (no std scaling), and a constant length
normalizer in the loss (no per-sequence length bias). No std is used, so rl.std_estimator
and rl.std_eps have no effect here.

  python launch/train.py --config=configs/drgrpo.py:demo --workdir=runs/demo/drgrpo
  python launch/train.py --config=configs/drgrpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/drgrpo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "drgrpo"
  config.rl.aggregation = "seq-mean-token-sum-norm"
  return config
