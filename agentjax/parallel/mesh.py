"""Building the (data, fsdp, tensor) device mesh from config, on whatever devices exist."""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh

from agentjax.parallel.rules import LOGICAL_AXIS_RULES, LogicalRules

MESH_AXES = ("data", "fsdp", "tensor")


class MeshError(ValueError):
  """A mesh shape that does not fit the devices; the message names the axis."""


def mesh_shape(num_devices: int, data: int = -1, fsdp: int = 1, tensor: int = 1) -> tuple[int, int, int]:
  """Resolves one -1 entry to 'all remaining devices' and checks the product."""
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  free = [name for name, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise MeshError(f"mesh: at most one axis may be -1, got {free}")
  for name, size in sizes.items():
    if size != -1 and (not isinstance(size, int) or size < 1):
      raise MeshError(f"mesh.{name} must be a positive integer or -1, got {size!r}")
  fixed = 1
  for name, size in sizes.items():
    if size != -1:
      fixed *= size
  if free:
    if num_devices % fixed:
      raise MeshError(f"mesh: {num_devices} devices are not divisible by the fixed axes {sizes}")
    sizes[free[0]] = num_devices // fixed
  total = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  if total != num_devices:
    raise MeshError(f"mesh: data*fsdp*tensor = {total} but there are {num_devices} devices ({sizes})")
  return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices (every process's, on a multi-host pod).

  Axis types are Auto: sharding constraints are hints the compiler may propagate, not asserts
  (jax.make_mesh's default, Explicit, turns them into type errors).
  """
  devices = list(devices) if devices is not None else jax.devices()
  shape = mesh_shape(len(devices), data, fsdp, tensor)
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def split_meshes(sampler_devices: int, data: int = -1, fsdp: int = 1, tensor: int = 1,
                 sampler_tensor: int = 1, devices: Sequence[jax.Device] | None = None
                 ) -> tuple[Mesh, Mesh]:
  """(trainer mesh, sampler mesh) over disjoint devices (asynchronous RL's split placement):
  the last `sampler_devices` devices sample, as a (data, 1, sampler_tensor) mesh; the others
  train, as the (data, fsdp, tensor) mesh of the config."""
  devices = list(devices) if devices is not None else jax.devices()
  if not 0 < sampler_devices < len(devices):
    raise MeshError(f"mesh.sampler_devices={sampler_devices}: must leave devices to train on "
                    f"(there are {len(devices)})")
  cut = len(devices) - sampler_devices
  return (make_mesh(data, fsdp, tensor, devices=devices[:cut]),
          make_mesh(-1, 1, sampler_tensor, devices=devices[cut:]))


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> Iterator[Mesh]:
  """Sets the mesh (jax.set_mesh) and the logical rules; inside it, logical constraints apply.

  Under the old `with mesh:` flax's logical constraints silently do nothing, hence this helper.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield mesh
