"""Meshes and the rules table; the sharded forward runs on 8 fake devices in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from jax.sharding import PartitionSpec as P

from agentjax.parallel import MeshError, logical_to_spec, make_mesh, mesh_shape
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
  with pytest.raises(MeshError, match="not divisible"):
    mesh_shape(8, tensor=3)
  with pytest.raises(MeshError, match="8 devices"):
    mesh_shape(8, data=2, fsdp=2, tensor=1)
  mesh = make_mesh()
  assert mesh.axis_names == ("data", "fsdp", "tensor")


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
