r"""The main job on the embedded default (`make demo`).

    python launch/demo.py --config=configs/base.py:tiny

For now (the trainer is a later issue) it builds the model from the config, places it on a mesh
over every local device, runs a jitted forward pass and a greedy next-token step, checks the
output is finite, and says so. It becomes SynthWorld -> SFT -> IGPO -> eval when the trainer lands.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags

from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.parallel import make_mesh, use_mesh

_CONFIG = config_flags.DEFINE_config_file("config", "configs/base.py:tiny", "Config file and preset.")


def main(_):
  start = time.time()
  config = _CONFIG.value
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  numerics = dict(param_dtype=config.model.param_dtype, dtype=config.model.dtype,
                  remat_policy=config.model.remat_policy)
  if config.model.hf_path:
    cfg, params = load_hf(config.model.hf_path, mesh=mesh, **numerics)
  else:
    cfg = QwenConfig.preset(config.model.preset, **numerics)
    params = init_params(cfg, jax.random.key(config.seed), mesh=mesh)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  print(f"model: {config.model.hf_path or config.model.preset} ({cfg.model_type}, "
        f"{n_params:,} parameters, {cfg.dtype}) on mesh {dict(mesh.shape)}")

  batch, length = 4, 16
  ids = jax.random.randint(jax.random.key(1), (batch, length), 0, cfg.vocab_size)
  valid = jnp.ones((batch, length), bool).at[1, :5].set(False)  # one left-padded row

  @jax.jit
  def next_token(params, ids, valid):
    logits, _ = Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                                masks.causal_padding_mask(valid))
    return logits, jnp.argmax(logits[:, -1], axis=-1)

  with use_mesh(mesh):
    logits, greedy = next_token(params, ids, valid)
  logits = np.asarray(logits)
  assert logits.shape == (batch, length, cfg.vocab_size) and np.isfinite(logits).all()
  print(f"forward pass: logits {logits.shape}, finite; greedy next tokens {np.asarray(greedy).tolist()}")
  print("The RL trainer is not built yet: this demo becomes SynthWorld -> SFT -> IGPO -> eval "
        "when it lands.")
  print(json.dumps({"demo": "forward", "preset": config.model.preset, "params": n_params,
                    "logits_shape": list(logits.shape), "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
  app.run(main)
