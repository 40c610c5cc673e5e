r"""Base config: the model, its numerics and the device mesh. Algorithm configs build on it.

Presets (the part after the colon) name a model shape: tiny, tiny-qwen3, qwen2.5-{0.5b,1.5b,3b,7b},
qwen3-{0.6b,1.7b,4b,8b}.

  python launch/demo.py --config=configs/base.py:tiny
  python launch/demo.py --config=configs/base.py:qwen2.5-0.5b --config.model.dtype=bfloat16
"""

import ml_collections


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.model = ml_collections.ConfigDict()
  config.model.preset = arg
  # A Hugging Face checkpoint folder; when set, shapes come from its config.json instead.
  config.model.hf_path = ""
  config.model.param_dtype = "float32"
  config.model.dtype = "float32"
  config.model.remat_policy = "none"

  # Device mesh: -1 takes the remaining devices. See agentjax/parallel/rules.py for what each
  # axis shards.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1
  config.mesh.fsdp = 1
  config.mesh.tensor = 1
  return config
