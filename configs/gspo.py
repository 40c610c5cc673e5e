r"""GSPO: GRPO advantages with a sequence-level importance ratio (length-normalized) and its
tight clip range.

Group std: as GRPO's (configs/grpo.py): verl's unbiased std + 1e-6 in the paper presets, the
population std + 1e-6 in the demo.

  python launch/train.py --config=configs/gspo.py:demo --workdir=runs/demo/gspo
  python launch/train.py --config=configs/gspo.py:qwen2.5-7b --workdir=/mnt/shared/runs/gspo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "gspo"
  config.rl.loss = "gspo"
  config.rl.clip_low = 3e-4
  config.rl.clip_high = 4e-4
  config.rl.aggregation = "seq-mean-token-mean"
  return config
