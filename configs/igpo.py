r"""IGPO: information-gain turn rewards (ground-truth log-prob probes after every turn)
plus the outcome, normalized jointly within each group and discounted over turns (gamma).

  python launch/train.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo
  python launch/train.py --config=configs/igpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/igpo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "igpo"
  return config
