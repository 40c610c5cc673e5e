"""Meshes and the rules table; the sharded forward runs on 8 fake devices in a subprocess."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

from agentjax.parallel import MeshError, logical_to_spec, make_mesh, mesh_shape, split_meshes
from tests.subprocess_env import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_fake_devices(module: str, *args: str, devices: int = 8, timeout: int = 600) -> str:
  env = subprocess_env(devices=devices, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout


def test_sharded_forward_on_2x2x2_mesh_equals_single_device(hf_checkpoint):
  folder, _ = hf_checkpoint("qwen3-shardable")
  assert "SHARDED_FORWARD_OK" in run_with_fake_devices("tests.sharded_forward_check", folder)


def test_mesh_shape_resolution_and_errors():
  assert mesh_shape(8) == (8, 1, 1)
  assert mesh_shape(8, data=-1, fsdp=2, tensor=2) == (2, 2, 2)
  assert mesh_shape(8, data=1, fsdp=-1, tensor=4) == (1, 2, 4)
  with pytest.raises(MeshError, match="tensor"):
    mesh_shape(8, tensor=0)
  with pytest.raises(MeshError, match="at most one axis"):
    mesh_shape(8, data=-1, fsdp=-1)
  with pytest.raises(MeshError, match="needs a multiple of 3 devices"):
    mesh_shape(8, tensor=3)
  with pytest.raises(MeshError, match="= 4 devices, but there are 8 devices"):
    mesh_shape(8, data=2, fsdp=2, tensor=1)
  mesh = make_mesh()
  assert mesh.axis_names == ("data", "fsdp", "tensor")


def test_mesh_error_names_the_config_fields_and_a_fix_that_fits():
  # The 7B preset (data=1, fsdp=-1, tensor=4) on one device: the error names the field, its
  # value, the device count and platform, and the override to run anyway.
  from configs import igpo
  mesh = igpo.get_config("qwen2.5-7b").mesh
  with pytest.raises(MeshError) as err:
    make_mesh(mesh.data, mesh.fsdp, mesh.tensor, devices=jax.devices()[:1])
  assert str(err.value) == (
      f"config.mesh.tensor=4 needs a multiple of 4 devices, but there is 1 device "
      f"({jax.devices()[0].platform}): on 1 device set --config.mesh.tensor=1 "
      f"(config.mesh.fsdp=-1 takes all remaining devices)")
  # Every suggested override, applied, fits the devices (and keeps what it can of the rest).
  cases = [(1, 1, -1, 4), (2, 1, -1, 4), (6, 1, -1, 4), (4, 4, -1, 2), (8, 2, 2, 1),
           (1, 2, 2, 1), (8, -1, 1, 3), (12, -1, 8, 2)]
  for n, data, fsdp, tensor in cases:
    with pytest.raises(MeshError) as err:
      mesh_shape(n, data, fsdp, tensor)
    message = str(err.value)
    assert "\n" not in message and f"there {'is' if n == 1 else 'are'} {n} device" in message
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for axis, value in re.findall(r"--config\.mesh\.(\w+)=(-?\d+)", message):
      sizes[axis] = int(value)
    assert sizes != {"data": data, "fsdp": fsdp, "tensor": tensor}, message
    assert math.prod(mesh_shape(n, **sizes)) == n, message
  assert mesh_shape(6, 1, -1, 2) == (1, 3, 2)  # what (6, 1, -1, 4)'s message suggests
  with pytest.raises(MeshError, match=r"config.mesh.data=-1 and config.mesh.fsdp=-1: at most "
                     r"one axis may be -1 .* --config.mesh.fsdp=1"):
    mesh_shape(8, data=-1, fsdp=-1)
  with pytest.raises(MeshError, match=r"config.mesh.tensor=0: must be a positive integer, or -1"):
    mesh_shape(8, tensor=0)
  # The split placement names its own fields.
  with pytest.raises(MeshError, match=r"config.mesh.sampler_devices=1: .* there is 1 device .*"
                     r"--config.mesh.sampler_devices=0"):
    split_meshes(1, devices=jax.devices()[:1])
  fake = [object()] * 4  # mesh_shape's checks come before any device is touched
  with pytest.raises(MeshError, match=r"config.mesh.sampler_tensor=2 needs a multiple of 2 "
                     r"devices, but there is 1 device to sample on"):
    split_meshes(1, sampler_tensor=2, devices=fake)
  with pytest.raises(MeshError, match=r"config.mesh.tensor=2 needs a multiple of 2 devices, but "
                     r"there are 3 devices left to train \(4 minus config.mesh.sampler_devices=1\)"):
    split_meshes(1, tensor=2, devices=fake)


def test_rules_table_and_divisibility_fallback():
  # Without a shape: the table as written. Rules are tried in order and each mesh axis is used
  # once per array, so activations keep embed whole while parameters shard it over fsdp.
  assert logical_to_spec(("batch", "length", "embed")) == P(("data", "fsdp"), None, None)
  assert logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
  assert logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")

  class FakeMesh:  # logical_to_spec only reads mesh.shape
    shape = {"data": 1, "fsdp": 2, "tensor": 4}

  # 2 KV heads cannot split over tensor=4: that dimension is replicated instead.
  assert logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 2, 16), FakeMesh) == P("fsdp", None, None)
  assert logical_to_spec(("embed", "heads", "head_dim"), (64, 8, 16), FakeMesh) == P("fsdp", "tensor", None)
  assert logical_to_spec(("vocab", "embed"), (211, 64), FakeMesh) == P(None, "fsdp")


def test_greedy_sampling_on_8_devices_equals_single_device():
  assert "SHARDED_SAMPLING_OK" in run_with_fake_devices("tests.sharded_sampling_check")
