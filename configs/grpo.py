r"""GRPO: the outcome reward z-scored within each group, on every sampled token.

Group std: the paper presets divide by verl's unbiased std + 1e-6 (rl.std_estimator="unbiased"),
as the IGPO paper's GRPO baseline ran in verl; the demo by the population std + 1e-6.

  python launch/train.py --config=configs/grpo.py:demo --workdir=runs/demo/grpo
  python launch/train.py --config=configs/grpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/grpo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "grpo"
  return config
