"""The one table that maps logical axis names to mesh axes, and the helpers that apply it.

Every parameter and main activation in agentjax is annotated with logical names (batch, length,
embed, heads, ...). Which mesh axis each name lands on is decided here and nowhere else, as in
MaxText. The mesh has three axes:

  data    pure data parallelism (parameters replicated),
  fsdp    data parallelism with parameters and optimizer state sharded along `embed` (ZeRO-3),
  tensor  Megatron-style tensor parallelism over heads, mlp and vocab.

Rules are tried in order and a mesh axis is used at most once per array (flax semantics). So an
activation [batch, length, embed] shards batch over (data, fsdp) and leaves embed whole, while a
parameter [embed, mlp] shards embed over fsdp and mlp over tensor.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("length", None),
    ("cache_length", None),
    ("head_dim", None),
    ("norm", None),
    # LoRA: the stacked-adapter axis and the rank are small and stay whole; an adapter's in and
    # out dims follow the kernel's names above (agentjax/models/lora.py).
    ("adapters", None),
    ("lora_rank", None),
)

_log = logging.getLogger(__name__)


def current_rules() -> LogicalRules:
  """The rules in context (`nn.logical_axis_rules(...)`), else the table above."""
  return nn.get_logical_axis_rules() or LOGICAL_AXIS_RULES


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...]) -> jax.Array:
  """Sharding constraint by logical names. A no-op unless a mesh is set with `jax.set_mesh`.

  Mesh axes that do not divide a dimension (batch 1 on 8 devices) are dropped, as for parameters.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh))


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: jax.sharding.Mesh | None = None,
                    rules: LogicalRules | None = None) -> PartitionSpec:
  """PartitionSpec for one array with the given logical axis names.

  With a shape and a mesh, a mesh axis that does not divide its dimension is dropped (that
  dimension is then replicated over it): e.g. Qwen2.5-0.5B's 2 KV heads on a tensor axis of 4.
  """
  mesh_axes = nn.logical_to_mesh_axes(tuple(logical_axes), rules or current_rules())
  if shape is None or mesh is None:
    return PartitionSpec(*mesh_axes)
  fitted = []
  for dim, axes in zip(shape, mesh_axes):
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    kept = []
    for name in names:
      size = mesh.shape[name]
      if size == 1:
        continue
      if dim % (size * math.prod(mesh.shape[n] for n in kept)) == 0:
        kept.append(name)
      else:
        _log.info("dimension %d of an array with axes %s is not divisible by mesh axis %r (%d); "
                  "replicating it over that axis", dim, logical_axes, name, size)
    fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*fitted)


def logical_to_sharding(logical_tree: Any, abstract_tree: Any, mesh: jax.sharding.Mesh,
                        rules: LogicalRules | None = None) -> Any:
  """NamedShardings for a pytree, from a matching tree of logical PartitionSpecs and of arrays
  (or jax.ShapeDtypeStruct) that give the shapes."""

  def one(spec, leaf):
    axes = tuple(spec) if spec is not None else (None,) * len(leaf.shape)
    return NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules))

  return jax.tree.map(one, logical_tree, abstract_tree,
                      is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)

