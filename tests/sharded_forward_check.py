"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharded_forward_check DIR

Loads the checkpoint in DIR onto a 2x2x2 (data, fsdp, tensor) mesh, checks every parameter's
sharding against the rules table, and checks the sharded forward against one device; then the
same for the value model (PPO's critic) built from it.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentjax.models import masks
from agentjax.models.qwen import (Qwen, QwenValue, load_value_hf, sequence_values,
                                  value_params_from_policy, value_shardings)
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.parallel import make_mesh, use_mesh

# What the rules table must give on a 2x2x2 mesh when every dimension divides.
EXPECTED_SPECS = {
    ("embed_tokens",): P("tensor", "fsdp"),
    ("lm_head",): P("fsdp", "tensor"),
    ("norm", "scale"): P(None),
    ("layers_0", "self_attn", "q_proj", "kernel"): P("fsdp", "tensor", None),
    ("layers_0", "self_attn", "k_proj", "kernel"): P("fsdp", "tensor", None),
    ("layers_0", "self_attn", "o_proj", "kernel"): P("tensor", None, "fsdp"),
    ("layers_0", "self_attn", "q_norm", "scale"): P(None),
    ("layers_1", "mlp", "gate_proj", "kernel"): P("fsdp", "tensor"),
    ("layers_1", "mlp", "down_proj", "kernel"): P("tensor", "fsdp"),
}


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def main(folder: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  cfg, params = load_hf(folder, mesh=mesh)
  for path, spec in EXPECTED_SPECS.items():
    arr = _get(params, path)
    assert arr.sharding.spec == spec, (path, arr.sharding.spec, spec)
    shard = arr.addressable_shards[0].data.shape
    want = tuple(n // (1 if a is None else mesh.shape[a]) for n, a in
                 zip(arr.shape, tuple(spec) + (None,) * (arr.ndim - len(spec))))
    assert shard == want, (path, shard, want)

  rng = np.random.RandomState(0)
  ids = rng.randint(0, cfg.vocab_size, (4, 12))
  valid = np.ones((4, 12), bool)
  valid[1, :5] = False  # one left-padded row
  positions = masks.positions_from_padding(jnp.asarray(valid))
  mask = masks.causal_padding_mask(jnp.asarray(valid))

  def fwd(params, ids, positions, mask):
    return Qwen(cfg).apply({"params": params}, ids, positions, mask)[0]

  single = jax.device_put(params, jax.devices()[0])
  ref = np.asarray(jax.jit(fwd)(single, ids, positions, mask))
  with use_mesh(mesh):
    batch = NamedSharding(mesh, P(("data", "fsdp")))
    args = [jax.device_put(x, batch) for x in (jnp.asarray(ids), positions, mask)]
    out = jax.jit(fwd)(params, *args)
  assert len(out.sharding.device_set) == 8
  out = np.asarray(out)
  err = np.abs(out - ref)[valid].max() / np.abs(ref[valid]).max()
  assert err < 1e-5, err
  # A batch that does not divide the (data, fsdp) axes still runs: the constraint drops them.
  with use_mesh(mesh):
    out3 = np.asarray(jax.jit(fwd)(params, jnp.asarray(ids[:3]), positions[:3],
                                          jax.tree.map(lambda x: x[:3], mask)))
  assert np.abs(out3 - ref[:3])[valid[:3]].max() < 1e-5 * np.abs(ref[valid]).max()
  _check_value_model(folder, mesh, cfg, params, ids, valid)
  print("SHARDED_FORWARD_OK", err)


def _check_value_model(folder, mesh, cfg, params, ids, valid):
  """The critic loaded from the causal-LM folder and copied from the policy's params: trunk
  sharded like the policy's, head kernel over fsdp by ("embed", None); sharded values equal one
  device's."""
  _, loaded = load_value_hf(folder, mesh=mesh, rng=jax.random.key(1))
  copied = value_params_from_policy(cfg, params, jax.random.key(1), mesh)
  want = value_shardings(cfg, mesh)
  for tree in (loaded, copied):
    assert jax.tree.structure(tree) == jax.tree.structure(want)
    for arr, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(want)):
      assert arr.sharding == sharding, (arr.sharding, sharding)
    assert tree["score"]["kernel"].sharding.spec == P("fsdp", None)
    for path, spec in EXPECTED_SPECS.items():
      if path != ("lm_head",):
        assert _get(tree["model"], path).sharding.spec == spec, path
  jax.tree.map(np.testing.assert_array_equal, copied, loaded)
  values = jax.jit(lambda p, t, v: sequence_values(QwenValue(cfg), p, t, v))
  ref = np.asarray(values(jax.device_put(loaded, jax.devices()[0]), jnp.asarray(ids),
                          jnp.asarray(valid)))
  with use_mesh(mesh):
    batch = NamedSharding(mesh, P(("data", "fsdp")))
    out = values(loaded, *(jax.device_put(jnp.asarray(x), batch) for x in (ids, valid)))
  assert len(out.sharding.device_set) == 8
  assert np.abs(np.asarray(out) - ref).max() < 1e-5 * np.abs(ref).max()
  assert np.abs(ref).max() > 0


if __name__ == "__main__":
  main(sys.argv[1])
