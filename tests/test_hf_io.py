"""Hugging Face folder interop: sharded/bf16 loading, export, tokenizers, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy

from agentjax.models.qwen import ConfigError, QwenConfig, init_params
from agentjax.models.qwen.checkpoint import load_hf, save_hf
from agentjax.models import safetensors_io
from agentjax.models.safetensors_io import CheckpointError, SafetensorsFolder
from agentjax.models.tokenizer import TokenizerError, load_tokenizer
from tests import hf_fixtures
from tests.test_qwen_model import forward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _export_logits_match(cfg, params, tmp_path, **save_kwargs):
  from transformers import AutoModelForCausalLM

  out = save_hf(str(tmp_path / "export"), cfg, params, **save_kwargs)
  model = AutoModelForCausalLM.from_pretrained(out).eval()
  ids = np.random.RandomState(6).randint(0, cfg.vocab_size, (2, 10))
  ref = hf_fixtures.hf_logits(model, ids)
  ours = np.asarray(forward(cfg, params, ids))
  assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()
  return out


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_export_then_transformers_loads_same_logits(tmp_path, preset):
  cfg = QwenConfig.preset(preset)
  params = init_params(cfg, jax.random.key(7))
  out = _export_logits_match(cfg, params, tmp_path)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  # and back into agentjax, bit-exact
  cfg2, params2 = load_hf(out)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_sharded_export_and_overwrite_keeps_folder_whole(tmp_path):
  cfg = QwenConfig.preset("tiny-qwen3")
  params = init_params(cfg, jax.random.key(8))
  out = _export_logits_match(cfg, params, tmp_path, max_shard_bytes=100_000)
  files = os.listdir(out)
  assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
  # Exporting again over the folder replaces it whole; no staging folders are left behind.
  params_b = init_params(cfg, jax.random.key(9))
  _export_logits_match(cfg, params_b, tmp_path)
  assert sorted(os.listdir(tmp_path)) == ["export"]


@pytest.fixture(scope="module")
def tiny_model():
  """(config, params) of the tiny preset, initialized once for the export fault tests."""
  cfg = QwenConfig.preset("tiny")
  return cfg, init_params(cfg, jax.random.key(10))


def test_failed_export_leaves_previous_export_intact(tmp_path, tiny_model):
  cfg, params = tiny_model
  out = save_hf(str(tmp_path / "export"), cfg, params)
  before = open(os.path.join(out, "model.safetensors"), "rb").read()
  broken = dict(params)
  del broken["norm"]  # a params tree missing a leaf fails half way through writing
  with pytest.raises(KeyError):
    save_hf(out, cfg, broken)
  assert open(os.path.join(out, "model.safetensors"), "rb").read() == before
  assert sorted(os.listdir(tmp_path)) == ["export"]


def _replace_then(action, out):
  """os.replace/os.rename that performs `action` right after moving the export `out` aside."""
  real = os.replace

  def replace(src, dst, **kwargs):
    real(src, dst, **kwargs)
    if os.path.abspath(src) == out:
      action()

  return replace


def test_export_interrupted_between_renames_keeps_previous_export(tmp_path, monkeypatch,
                                                                  tiny_model):
  cfg, params = tiny_model
  out = save_hf(str(tmp_path / "export"), cfg, params)
  before = open(os.path.join(out, "model.safetensors"), "rb").read()

  def interrupt():
    raise KeyboardInterrupt("interrupted with only the backup on disk")

  for name in ("replace", "rename"):
    monkeypatch.setattr(os, name, _replace_then(interrupt, out))
  with pytest.raises(KeyboardInterrupt):
    save_hf(out, cfg, params, dtype=np.float16)
  monkeypatch.undo()
  assert open(os.path.join(out, "model.safetensors"), "rb").read() == before
  assert sorted(os.listdir(tmp_path)) == ["export"]


# Runs an export of different bytes (float16) over `out` and dies (os._exit: no handler runs) right
# after the previous export is moved aside: the moment only a backup of it exists.
_KILLED_EXPORT = """
import os, sys
from agentjax.models.qwen import checkpoint
out = sys.argv[1]
cfg, params = checkpoint.load_hf(out)
real = os.replace
def replace(src, dst, **kwargs):
  real(src, dst, **kwargs)
  if os.path.abspath(src) == out:
    os._exit(9)
os.replace = os.rename = replace
checkpoint.save_hf(out, cfg, params, dtype="float16")
"""


def test_export_killed_between_renames_is_recovered(tmp_path, tiny_model):
  from agentjax.models.qwen.checkpoint import recover_export

  cfg, params = tiny_model
  first = tmp_path / "run1"
  out = save_hf(str(first / "export"), cfg, params)
  before = open(os.path.join(out, "model.safetensors"), "rb").read()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", _KILLED_EXPORT, out], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 9, proc.stderr[-3000:]
  assert not os.path.exists(out) and len(os.listdir(first)) >= 2  # the backup and the new one
  second = tmp_path / "run2"
  shutil.copytree(first, second)

  # At start-up (the trainer calls this), the backup is restored and the dead write removed.
  assert recover_export(out) == out
  assert open(os.path.join(out, "model.safetensors"), "rb").read() == before
  assert sorted(os.listdir(first)) == ["export"]
  recover_export(out)  # a complete export is never touched
  assert open(os.path.join(out, "model.safetensors"), "rb").read() == before

  # save_hf recovers first too: a failing export after the crash still leaves the first one.
  out2 = str(second / "export")
  broken = dict(params)
  del broken["norm"]
  with pytest.raises(KeyError):
    save_hf(out2, cfg, broken)
  assert open(os.path.join(out2, "model.safetensors"), "rb").read() == before
  assert sorted(os.listdir(second)) == ["export"]


def test_recover_export_restores_the_backup_of_earlier_versions(tmp_path):
  from agentjax.models.qwen.checkpoint import recover_export

  # What earlier versions of save_hf left when killed between their renames: only <path>.old.
  legacy = tmp_path / "export.old"
  legacy.mkdir()
  (legacy / "config.json").write_text("{}")
  out = recover_export(str(tmp_path / "export"))
  assert sorted(os.listdir(tmp_path)) == ["export"] and os.listdir(out) == ["config.json"]


def test_load_sharded_and_bfloat16_checkpoints(tmp_path, hf_checkpoint):
  folder, hf_model = hf_checkpoint("qwen2-gqa8", max_shard_size="40KB")
  assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
  cfg, params = load_hf(folder)
  ids = np.random.RandomState(11).randint(0, cfg.vocab_size, (2, 9))
  ref = hf_fixtures.hf_logits(hf_model, ids)
  assert np.abs(np.asarray(forward(cfg, params, ids)) - ref).max() <= 1e-4 * np.abs(ref).max()

  import torch

  bf16_dir = str(tmp_path / "bf16")
  hf_model.to(torch.bfloat16).save_pretrained(bf16_dir)
  hf_model.to(torch.float32)
  cfg16, params16 = load_hf(bf16_dir)
  want = hf_model.model.layers[0].self_attn.o_proj.weight.detach().to(torch.bfloat16).float().numpy()
  got = np.asarray(params16["layers_0"]["self_attn"]["o_proj"]["kernel"])
  np.testing.assert_array_equal(got.reshape(-1, got.shape[-1]).T, want)


def test_tokenizer_with_chat_template(tiny_tokenizer_dir):
  tok = load_tokenizer(tiny_tokenizer_dir)
  ids = tok.apply_chat_template([{"role": "user", "content": "capital of Veltrana?"}],
                                add_generation_prompt=True, tokenize=True, return_dict=False)
  text = tok.decode(ids)
  assert text.startswith("<|im_start|>user\ncapital of Veltrana?<|im_end|>")
  assert text.endswith("<|im_start|>assistant\n")


def test_tokenizer_without_chat_template_fails(tmp_path):
  folder = hf_fixtures.make_tokenizer_dir(str(tmp_path / "tok"), chat_template=None)
  with pytest.raises(TokenizerError, match="chat_template"):
    load_tokenizer(folder)
  assert load_tokenizer(folder, require_chat_template=False) is not None
  with pytest.raises(TokenizerError, match="does not exist"):
    load_tokenizer(str(tmp_path / "nowhere"))


# ----------------------------------------------------------------------------- bad checkpoints


def _copy(folder, tmp_path):
  dst = str(tmp_path / "ckpt")
  shutil.copytree(folder, dst)
  return dst


def _edit_tensors(folder, edit):
  path = os.path.join(folder, "model.safetensors")
  tensors = safetensors.numpy.load_file(path)
  edit(tensors)
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


def _edit_config(folder, edit):
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    hf = json.load(f)
  edit(hf)
  with open(path, "w") as f:
    json.dump(hf, f)


BAD_TENSORS = {
    "missing": (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
                "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
    "extra": (lambda t: t.__setitem__("model.layers.9.mlp.up_proj.weight", np.zeros(3, np.float32)),
              "unexpected tensor 'model.layers.9.mlp.up_proj.weight'"),
    "misshaped": (lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight",
                                          np.zeros((3, 64), np.float32)),
                  r"tensor 'model.layers.0.self_attn.k_proj.weight' has shape \[3, 64\], expected \[32, 64\]"),
    "integer": (lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight",
                                        np.zeros((32, 64), np.int32)),
                "tensor 'model.layers.0.self_attn.k_proj.weight' has non-float dtype I32"),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_bad_tensor_names_the_tensor(hf_checkpoint, tmp_path, monkeypatch, case):
  folder, _ = hf_checkpoint("qwen2-tied-gqa2")
  bad = _copy(folder, tmp_path)
  edit, message = BAD_TENSORS[case]
  _edit_tensors(bad, edit)

  def read(*args):
    raise AssertionError("tensor data read before the headers were validated")

  monkeypatch.setattr(safetensors_io.Tensor, "__getitem__", read)
  with pytest.raises(CheckpointError, match=message):
    load_hf(bad)


def test_index_naming_a_file_outside_the_folder_is_refused(hf_checkpoint, tmp_path):
  folder, _ = hf_checkpoint("qwen2-tied-gqa2")
  bad = _copy(folder, tmp_path)
  with open(os.path.join(bad, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {"model.norm.weight": "../ckpt/model.safetensors"}}, f)
  with pytest.raises(CheckpointError, match="'../ckpt/model.safetensors', not a file name"):
    load_hf(bad)


BAD_CONFIGS = {
    "model_type": (lambda c: c.__setitem__("model_type", "llama"), "model_type 'llama' is not supported"),
    "sliding": (lambda c: c.__setitem__("use_sliding_window", True), "use_sliding_window"),
    "rope": (lambda c: c.__setitem__("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
             "rope_type 'yarn'"),
    "missing_field": (lambda c: c.pop("hidden_size"), "required field 'hidden_size'"),
    "heads": (lambda c: c.__setitem__("num_key_value_heads", 3), "num_kv_heads"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_names_the_field(hf_checkpoint, tmp_path, case):
  folder, _ = hf_checkpoint("qwen2-tied-gqa2")
  bad = _copy(folder, tmp_path)
  edit, message = BAD_CONFIGS[case]
  _edit_config(bad, edit)
  with pytest.raises(ConfigError, match=message):
    load_hf(bad)


def test_qwen3_attention_bias_is_refused():
  hf = QwenConfig.preset("tiny-qwen3").to_hf_dict()
  with pytest.raises(ConfigError, match="attention_bias"):
    QwenConfig.from_hf_dict({**hf, "attention_bias": True})


def _raw_safetensors(header, data: bytes, header_len: int | None = None) -> bytes:
  """A file built byte by byte: 8-byte little-endian header length, header, data."""
  blob = header if isinstance(header, bytes) else json.dumps(header).encode()
  return struct.pack("<Q", len(blob) if header_len is None else header_len) + blob + data


_F32x2 = {"dtype": "F32", "shape": [2]}
# Files the safetensors library refuses. The hand-written parser this project used before accepted
# the first three: overlapping tensors, a negative offset (it returned the header's own bytes as
# weights) and unused bytes between tensors.
HOSTILE_FILES = {
    "overlapping": lambda: _raw_safetensors(
        {"a": {**_F32x2, "data_offsets": [0, 8]}, "b": {**_F32x2, "data_offsets": [4, 12]}},
        b"\0" * 12),
    "negative_offset": lambda: _raw_safetensors({"w": {**_F32x2, "data_offsets": [-8, 0]}}, b""),
    "gap_between_tensors": lambda: _raw_safetensors(
        {"a": {**_F32x2, "data_offsets": [0, 8]}, "b": {**_F32x2, "data_offsets": [12, 20]}},
        b"\0" * 20),
    "truncated": lambda: _raw_safetensors({"w": {**_F32x2, "data_offsets": [0, 8]}}, b"\0" * 4),
    "header_longer_than_file": lambda: _raw_safetensors(
        {"w": {**_F32x2, "data_offsets": [0, 8]}}, b"\0" * 8, header_len=1 << 20),
    "non_json_header": lambda: _raw_safetensors(b"{not json}", b""),
    "entry_without_shape": lambda: _raw_safetensors({"w": {"dtype": "F32", "data_offsets": [0, 4]}},
                                                    b"\0" * 4),
    "shorter_than_length_field": lambda: b"\1\0\0",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_hostile_safetensors_file_is_refused_naming_the_file(tmp_path, case):
  folder = tmp_path / "ckpt"
  folder.mkdir()
  path = folder / "model.safetensors"
  path.write_bytes(HOSTILE_FILES[case]())
  with pytest.raises(CheckpointError, match=re.escape(f"{path}: not a valid safetensors file")):
    tensors = SafetensorsFolder(str(folder))
    for name in tensors:  # a reader that accepted the header must not hand out any data either
      np.asarray(tensors[name][:])


def test_corrupt_and_pickle_only_folders(hf_checkpoint, tmp_path):
  folder, _ = hf_checkpoint("qwen2-tied-gqa2")
  bad = _copy(folder, tmp_path)
  with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
    f.truncate(1000)
  with pytest.raises(CheckpointError, match="model.safetensors"):
    load_hf(bad)
  os.remove(os.path.join(bad, "model.safetensors"))
  open(os.path.join(bad, "pytorch_model.bin"), "wb").close()
  with pytest.raises(CheckpointError, match="pickle"):
    load_hf(bad)
