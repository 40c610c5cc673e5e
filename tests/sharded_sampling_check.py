"""Run with 8 fake CPU devices: greedy sampling sharded on a 2x2x2 mesh equals one device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharded_sampling_check
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.parallel import make_mesh, use_mesh
from agentjax.sampling import SamplingParams, StopTable, extend, generate, init_state


def run(cfg, params, prompts, lengths, mesh=None):
  model = Qwen(cfg)
  b = prompts.shape[0]
  stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32), jnp.int32(64))
  state = init_state(cfg, b, 64, jax.random.key(0), mesh=mesh)
  state = extend(model, params, state, jnp.asarray(prompts), jnp.asarray(lengths),
                 jnp.full((b,), -1, jnp.int32))
  state, gen = generate(model, params, state, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                        stop, SamplingParams(greedy=True), 12)
  return state, gen


def main():
  assert jax.device_count() == 8
  cfg = QwenConfig.preset("tiny-qwen3", vocab_size=256)
  single = jax.tree.map(lambda x: x * 4.0, init_params(cfg, jax.random.key(0)))
  rng = np.random.RandomState(0)
  prompts = rng.randint(0, cfg.vocab_size, (8, 16)).astype(np.int32)
  lengths = np.array([16, 3, 9, 12, 5, 16, 7, 1], np.int32)
  _, ref = run(cfg, single, prompts, lengths)

  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  from agentjax.models.qwen import param_shardings
  params = jax.device_put(single, param_shardings(cfg, mesh))
  with use_mesh(mesh):
    state, gen = run(cfg, params, prompts, lengths, mesh=mesh)
  spec = tuple(state.cache.keys[0].sharding.spec)  # [B, N, D, S]: batch and KV heads split
  assert spec[:2] == (("data", "fsdp"), "tensor"), spec
  assert len(gen.new_tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(gen.new_tokens), np.asarray(ref.new_tokens))
  print("SHARDED_SAMPLING_OK")


if __name__ == "__main__":
  main()
