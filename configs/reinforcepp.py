r"""REINFORCE++: outcome advantages normalized over the whole batch (no group baseline), with
the KL to the reference policy in the loss. The whitening divides by sqrt(var + 1e-8); the
paper presets take the unbiased variance (rl.std_estimator="unbiased", verl's masked_whiten),
the demo the population one. rl.std_eps does not apply (the 1e-8 is verl's).

  python launch/train.py --config=configs/reinforcepp.py:demo --workdir=runs/demo/reinforcepp
  python launch/train.py --config=configs/reinforcepp.py:qwen2.5-7b --workdir=/mnt/shared/runs/reinforcepp-7b

Presets: see configs/base.py (demo, qwen2.5-3b, qwen2.5-7b, qwen3-8b).
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.algorithm = "reinforce++"
  return config
