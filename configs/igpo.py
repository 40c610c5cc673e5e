r"""IGPO: information-gain turn rewards (ground-truth log-prob probes after every turn)
plus the outcome, normalized within each group and discounted over turns (gamma).

The paper presets normalize IG and outcome rewards jointly (as the IGPO paper does). The demo
normalizes them separately (rl.igpo_norm="separate"): with a tiny model most groups answer
wrongly while their searches gain information, and joint normalization then gives every answer
a negative advantage, which erodes the copying of names that the answers depend on
(docs/BENCHMARKS.md, "demo").

The information gain is a difference of the ground truth's mean per-token log-probabilities
before and after a turn (rl.ig_mode="log_prob", the default): the official training script's
setting and the paper's Appendix A. The paper's §3.2 (Eq. 3-4) defines it as a difference of
probabilities; rl.ig_mode="prob" gives that reading.

The group std: the paper presets use the official IGPO code's sqrt(population var + 1e-8)
(rl.std_estimator="sqrt_var_eps", rl.std_eps=1e-8; the paper does not state it). The demo keeps
the base config's population std + 1e-6, with which its numbers were measured.

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
  else:
    config.rl.std_estimator = "sqrt_var_eps"
    config.rl.std_eps = 1e-8
  return config
