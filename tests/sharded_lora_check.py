"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharded_lora_check

On a 2x2x2 (data, fsdp, tensor) mesh: fresh adapters are created sharded by the rules table (an
adapter's in and out dims like the kernel it adapts), the LoRA forward (adapters attached inside
jit, as the trainer does) equals one device for each adapter and for none, merge_selected keeps
the kernels' sharding, and the backbone's fingerprint does not depend on the mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentjax.models import masks
from agentjax.models.lora import LoraSpec, attach, fingerprint, merge, merge_selected
from agentjax.models.qwen import (Qwen, QwenConfig, adapter_shardings, init_adapters, init_params,
                                  param_shardings)
from agentjax.parallel import make_mesh, use_mesh

# One adapter's leaves on a 2x2x2 mesh: embed over fsdp, heads / kv_heads / mlp over tensor,
# the rank whole.
EXPECTED_ADAPTER_SPECS = {
    ("layers_0", "self_attn", "q_proj", "lora_a"): P("fsdp", None),
    ("layers_0", "self_attn", "q_proj", "lora_b"): P(None, "tensor", None),
    ("layers_0", "self_attn", "k_proj", "lora_b"): P(None, "tensor", None),
    ("layers_0", "self_attn", "o_proj", "lora_a"): P("tensor", None, None),
    ("layers_0", "self_attn", "o_proj", "lora_b"): P(None, "fsdp"),
    ("layers_1", "mlp", "gate_proj", "lora_a"): P("fsdp", None),
    ("layers_1", "mlp", "gate_proj", "lora_b"): P(None, "tensor"),
    ("layers_1", "mlp", "down_proj", "lora_a"): P("tensor", None),
    ("layers_1", "mlp", "down_proj", "lora_b"): P(None, "fsdp"),
}
# The LoRA model's params: the stacked adapters axis whole, lora_index replicated.
EXPECTED_MODEL_SPECS = {
    ("layers_0", "self_attn", "q_proj", "lora_a"): P(None, "fsdp", None),
    ("layers_0", "self_attn", "o_proj", "lora_b"): P(None, None, "fsdp"),
    ("lora_index",): P(),
}


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _check_spec(arr, spec, mesh, path):
  assert arr.sharding.spec == spec, (path, arr.sharding.spec, spec)
  shard = arr.addressable_shards[0].data.shape
  want = tuple(n // (1 if a is None else mesh.shape[a]) for n, a in
               zip(arr.shape, tuple(spec) + (None,) * (arr.ndim - len(spec))))
  assert shard == want, (path, shard, want)


def main() -> None:
  assert jax.device_count() == 8, jax.devices()
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  cfg = QwenConfig.preset("tiny-qwen3")  # untied head, qk_norm; every dim divides 2
  spec = LoraSpec(names=("searcher", "generator"), rank=4, alpha=8.0)
  backbone = init_params(cfg, jax.random.key(0), mesh)
  adapters = init_adapters(cfg, spec, jax.random.key(1), mesh)
  for name in spec.names:
    for path, want in EXPECTED_ADAPTER_SPECS.items():
      _check_spec(_get(adapters[name], path), want, mesh, (name,) + path)
  shardings = param_shardings(cfg, mesh, spec)
  for path, want in EXPECTED_MODEL_SPECS.items():
    assert _get(shardings, path).spec == want, (path, _get(shardings, path).spec, want)

  # Non-zero B (a fresh one is 0), placed like a trained adapter: by adapter_shardings.
  rng = np.random.RandomState(0)
  one = adapter_shardings(cfg, spec, mesh)
  adapters = {name: jax.tree_util.tree_map_with_path(
      lambda p, x, s: jax.device_put(rng.normal(0, 0.5, x.shape).astype(np.float32), s)
      if p[-1].key == "lora_b" else x, tree, one) for name, tree in adapters.items()}
  for name in spec.names:
    for path, want in EXPECTED_ADAPTER_SPECS.items():
      _check_spec(_get(adapters[name], path), want, mesh, (name,) + path)

  ids = rng.randint(0, cfg.vocab_size, (4, 12))
  valid = np.ones((4, 12), bool)
  valid[1, :5] = False  # one left-padded row
  positions = masks.positions_from_padding(jnp.asarray(valid))
  mask = masks.causal_padding_mask(jnp.asarray(valid))

  @jax.jit
  def fwd(backbone, adapters, index, ids, positions, mask):  # the trainer attaches inside jit
    full = attach(backbone, adapters, spec, index)
    return Qwen(cfg, lora=spec).apply({"params": full}, ids, positions, mask)[0]

  @jax.jit
  def bare(params, ids, positions, mask):
    return Qwen(cfg).apply({"params": params}, ids, positions, mask)[0]

  device = jax.devices()[0]
  single = jax.device_put((backbone, adapters), device)
  batch = NamedSharding(mesh, P(("data", "fsdp")))
  args = [jax.device_put(x, batch) for x in (jnp.asarray(ids), positions, mask)]
  outs = {}
  for name in spec.names + (None,):
    index = jnp.int32(spec.index(name))
    ref = np.asarray(fwd(*single, index, jnp.asarray(ids), positions, mask))
    with use_mesh(mesh):
      out = fwd(backbone, adapters, index, *args)
    assert len(out.sharding.device_set) == 8
    out = np.asarray(out)
    err = np.abs(out - ref)[valid].max() / np.abs(ref[valid]).max()
    assert err <= 1e-5, (name, err)
    # The merged backbone on one device: the LoRA forward is W + s A B, sharded or not.
    plain = ref if name is None else np.asarray(bare(
        merge(single[0], single[1][name], spec.scale), jnp.asarray(ids), positions, mask))
    assert np.abs(plain - ref)[valid].max() <= 1e-5 * np.abs(ref[valid]).max(), name
    outs[name] = out
  assert fwd._cache_size() == 2  # one program per placement, whatever the adapter
  assert np.abs(outs["searcher"] - outs["generator"])[valid].max() > 1e-2

  # merge_selected (the sampler's "merge" decode) on sharded params: the merged kernels keep the
  # backbone kernels' sharding (not gathered onto every device) and equal the one-device merge.
  merged = merge_selected(attach(backbone, adapters, spec, "generator"), spec.scale)
  want = merge(single[0], single[1]["generator"], spec.scale)
  for path in (("layers_0", "self_attn", "q_proj", "kernel"),
               ("layers_1", "mlp", "down_proj", "kernel")):
    got = _get(merged, path)
    kernel = _get(backbone, path)
    assert got.sharding.is_equivalent_to(kernel.sharding, got.ndim), (path, got.sharding)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_get(want, path)), rtol=1e-6,
                               atol=1e-6, err_msg=str(path))

  # The backbone's fingerprint: the same on 8 devices, on one, and on another mesh.
  h = fingerprint(backbone)
  other = make_mesh(data=1, fsdp=8, tensor=1)
  resharded = jax.device_put(single[0], param_shardings(cfg, other))
  assert fingerprint(single[0]) == h == fingerprint(resharded), (h, fingerprint(single[0]),
                                                                 fingerprint(resharded))
  print("SHARDED_LORA_OK", h)


if __name__ == "__main__":
  main()
