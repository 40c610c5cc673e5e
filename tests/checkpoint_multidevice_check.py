"""Run with 8 fake CPU devices: an FSDP-sharded train state restores into the target shardings.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python -m tests.checkpoint_multidevice_check DIR

Saves params (sharded per param_shardings on a 2x2x2 mesh), adamw state, step and a typed key;
restores into the same layout and into another mesh (fsdp=4, tensor=2), as a resumed job on a
differently shaped slice would, and checks every leaf's sharding and value.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from agentjax.models.qwen import QwenConfig, abstract_params, init_params, param_shardings
from agentjax.parallel import make_mesh
from agentjax.train import Checkpointer


def abstract_state(cfg, mesh, tx):
  """The target a trainer builds before restoring: shapes from eval_shape, FSDP shardings."""
  replicated = NamedSharding(mesh, PartitionSpec())
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_params(cfg), param_shardings(cfg, mesh))
  adam, *rest = jax.eval_shape(tx.init, params)
  adam = adam._replace(count=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
                       mu=params, nu=params)
  return {"params": params, "opt_state": (adam, *rest),
          "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
          "rng": jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)}


def check(restored, target, original):
  leaves = jax.tree_util.tree_flatten_with_path(restored)[0]
  targets = jax.tree.leaves(target)
  originals = jax.tree.leaves(original)
  assert len(leaves) == len(targets) == len(originals), (len(leaves), len(targets))
  for (path, got), want, orig in zip(leaves, targets, originals):
    name = jax.tree_util.keystr(path)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (name, got.sharding,
                                                                    want.sharding)
    if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
      got, orig = jax.random.key_data(got), jax.random.key_data(orig)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(orig), err_msg=name)


def main(workdir: str):
  assert jax.device_count() == 8
  cfg = QwenConfig.preset("tiny")
  tx = optax.adamw(1e-3)
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  params = init_params(cfg, jax.random.key(0), mesh=mesh)
  opt_state = jax.jit(tx.init)(params)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  updates, opt_state = jax.jit(tx.update)(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  replicated = NamedSharding(mesh, PartitionSpec())
  state = {"params": params, "opt_state": opt_state,
           "step": jax.device_put(jnp.int32(7), replicated),
           "rng": jax.device_put(jax.random.key(3), replicated)}
  assert state["params"]["embed_tokens"].addressable_shards[0].data.shape != (512, 64)

  with Checkpointer(workdir, save_every=7, keep=2) as ckpt:
    assert ckpt.maybe_save(7, state, {"position": 7})

  for other in (mesh, make_mesh(data=1, fsdp=4, tensor=2)):
    target = abstract_state(cfg, other, tx)
    with Checkpointer(workdir, save_every=7, keep=2) as ckpt:
      restored, data_state, step = ckpt.restore_or_none(target)
    assert (step, data_state) == (7, {"position": 7}), (step, data_state)
    check(restored, target, state)
    emb = restored["params"]["embed_tokens"]
    assert emb.addressable_shards[0].data.shape != emb.shape, "embed_tokens not sharded"
    mu = restored["opt_state"][0].mu["layers_0"]["mlp"]["up_proj"]
    want = param_shardings(cfg, other)["layers_0"]["mlp"]["up_proj"]
    assert mu["kernel"].sharding.spec == want["kernel"].spec, (mu["kernel"].sharding, want)
  print("CHECKPOINT_SHARDED_OK")


if __name__ == "__main__":
  main(sys.argv[1])
