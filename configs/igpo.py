r"""IGPO: information-gain turn rewards (ground-truth log-prob probes after every turn)
plus the outcome, normalized within each group and discounted over turns (gamma).

The paper presets normalize IG and outcome rewards jointly (as the IGPO paper does). The demo
normalizes them separately (rl.igpo_norm="separate"): with a tiny model most groups answer
wrongly while their searches gain information, and joint normalization then gives every answer
a negative advantage, which erodes the copying of names that the answers depend on
(docs/BENCHMARKS.md, "demo").

  python launch/train.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo
  python launch/train.py --config=configs/igpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/igpo-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "igpo"
  if arg == "demo":
    config.rl.igpo_norm = "separate"
  return config
