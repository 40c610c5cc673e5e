"""Building the (data, fsdp, tensor) device mesh from config, on whatever devices exist."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Mapping, Sequence

import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh

from agentjax.parallel.rules import LOGICAL_AXIS_RULES, LogicalRules

MESH_AXES = ("data", "fsdp", "tensor")


class MeshError(ValueError):
  """A mesh shape that does not fit the devices; the message names the config fields."""


# The config field that sets each axis (configs/base.py): the errors name these.
CONFIG_FIELDS = {axis: f"config.mesh.{axis}" for axis in MESH_AXES}
_SAMPLER_FIELDS = {"data": "the sampler's data axis", "fsdp": "the sampler's fsdp axis",
                   "tensor": "config.mesh.sampler_tensor"}


def _count(n: int, note: str = "") -> str:
  return f"{n} device{'' if n == 1 else 's'}{note}"


def _fitting(sizes: Mapping[str, int], num_devices: int) -> dict[str, int]:
  """The sizes closest to `sizes` that fit `num_devices`: one axis takes the rest (-1: the axis
  already -1, else data); the others, tensor first (they decide what fits in memory), keep the
  largest part of their size that divides the devices left."""
  free = next((a for a, s in sizes.items() if s == -1), "data")
  out, left = {free: -1}, num_devices
  for axis in reversed(MESH_AXES):
    if axis != free:
      out[axis] = math.gcd(sizes[axis], left)
      left //= out[axis]
  return {axis: out[axis] for axis in MESH_AXES}


def _fix(sizes: Mapping[str, int], num_devices: int, fields: Mapping[str, str]) -> str:
  """'on N devices set --config.mesh.x=... (...)': the command-line overrides that fit."""
  fit = _fitting(sizes, num_devices)
  flags = " ".join(f"--{fields[a]}={s}" for a, s in fit.items() if s != sizes[a])
  free = next(a for a, s in fit.items() if s == -1)
  if sizes[free] != -1:
    rest = " (-1: all remaining devices)"
  elif fields[free].startswith("config."):
    rest = f" ({fields[free]}=-1 takes all remaining devices)"
  else:
    rest = ""
  return f"on {_count(num_devices)} set {flags}{rest}"


def mesh_shape(num_devices: int, data: int = -1, fsdp: int = 1, tensor: int = 1, *,
               fields: Mapping[str, str] = CONFIG_FIELDS, devices_note: str = ""
               ) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes; one entry may be -1, 'all remaining devices'.

  A shape that does not fit raises MeshError, one line naming the config fields (`fields`:
  axis -> field) with their values, the device count (`devices_note` follows it, e.g. " (cpu)")
  and overrides that fit. The 7B preset (data=1, fsdp=-1, tensor=4) on one CPU device:
    config.mesh.tensor=4 needs a multiple of 4 devices, but there is 1 device (cpu): on 1 device
    set --config.mesh.tensor=1 (config.mesh.fsdp=-1 takes all remaining devices)
  """
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for axis, size in sizes.items():
    if size != -1 and (type(size) is not int or size < 1):
      raise MeshError(f"{fields[axis]}={size!r}: must be a positive integer, or -1 for all "
                      f"remaining devices")
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise MeshError(" and ".join(f"{fields[a]}=-1" for a in free) + ": at most one axis may be "
                    "-1 (all remaining devices); give the others a size, e.g. "
                    + " ".join(f"--{fields[a]}=1" for a in free[1:]))
  fixed = math.prod(size for size in sizes.values() if size != -1)
  there = f"there {'is' if num_devices == 1 else 'are'} {_count(num_devices, devices_note)}"
  if free and num_devices % fixed:
    named = [f"{fields[a]}={s}" for a, s in sizes.items() if s > 1]
    raise MeshError(f"{' x '.join(named)} need{'s' if len(named) == 1 else ''} a multiple of "
                    f"{fixed} devices, but {there}: {_fix(sizes, num_devices, fields)}")
  if not free and fixed != num_devices:
    named = " x ".join(f"{fields[a]}={s}" for a, s in sizes.items())
    raise MeshError(f"{named} = {fixed} devices, but {there}: "
                    f"{_fix(sizes, num_devices, fields)}")
  if free:
    sizes[free[0]] = num_devices // fixed
  return sizes["data"], sizes["fsdp"], sizes["tensor"]


def _platform(devices: Sequence[jax.Device]) -> str:
  return f" ({devices[0].platform})" if devices else ""


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices (every process's, on a multi-host pod).

  Axis types are Auto: sharding constraints are hints the compiler may propagate, not asserts
  (jax.make_mesh's default, Explicit, turns them into type errors).
  """
  devices = list(devices) if devices is not None else jax.devices()
  shape = mesh_shape(len(devices), data, fsdp, tensor, devices_note=_platform(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def split_meshes(sampler_devices: int, data: int = -1, fsdp: int = 1, tensor: int = 1,
                 sampler_tensor: int = 1, devices: Sequence[jax.Device] | None = None
                 ) -> tuple[Mesh, Mesh]:
  """(trainer mesh, sampler mesh) over disjoint devices (asynchronous RL's split placement):
  the last `sampler_devices` devices sample, as a (data, 1, sampler_tensor) mesh; the others
  train, as the (data, fsdp, tensor) mesh of the config."""
  devices = list(devices) if devices is not None else jax.devices()
  if not 0 < sampler_devices < len(devices):
    raise MeshError(f"config.mesh.sampler_devices={sampler_devices}: must be at least 1 and "
                    f"leave devices to train on, but there {'is' if len(devices) == 1 else 'are'} "
                    f"{_count(len(devices), _platform(devices))}; set "
                    f"--config.mesh.sampler_devices=0 to sample on the training devices")
  cut = len(devices) - sampler_devices
  split = f" left to train ({len(devices)} minus config.mesh.sampler_devices={sampler_devices})"
  trainer = mesh_shape(cut, data, fsdp, tensor, devices_note=split)
  sampler = mesh_shape(sampler_devices, -1, 1, sampler_tensor, fields=_SAMPLER_FIELDS,
                       devices_note=f" to sample on (config.mesh.sampler_devices)")
  return (jax.make_mesh(trainer, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                        devices=devices[:cut]),
          jax.make_mesh(sampler, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                        devices=devices[cut:]))


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> Iterator[Mesh]:
  """Sets the mesh (jax.set_mesh) and the logical rules; inside it, logical constraints apply.

  Under the old `with mesh:` flax's logical constraints silently do nothing, hence this helper.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield mesh
