"""LoRA adapters <-> PEFT folders: peft loads our exports and we load peft's, with equal logits;
merge_lora's full folder loads in transformers; bad adapter folders fail naming the field/tensor.

The reference is peft itself (PeftModel on the transformers model of the same backbone), an
implementation independent of agentjax's adapters and layouts.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from agentjax.models import masks
from agentjax.models.lora import ALL_TARGETS, LoraSpec, attach
from agentjax.models.qwen import Qwen, adapter_abstract
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.models.qwen.merge import merge_lora
from agentjax.models.qwen.peft import (CONFIG_FILE, WEIGHTS_FILE, load_peft, peft_spec,
                                       save_peft)
from agentjax.models.safetensors_io import CheckpointError
from agentjax.parallel import make_mesh
from tests import hf_fixtures

TIED, UNTIED = "qwen2-tied-gqa2", "qwen3-headdim"  # qwen3-headdim: head_dim 24 != 64 / 4
IDS = np.random.RandomState(0).randint(0, 211, (2, 9))
# What the peft-side adapters target: a strict subset, so that targets are checked to match.
PEFT_TARGETS = ("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def _close(ours, ref):
  err = np.abs(np.asarray(ours) - ref).max()
  assert err <= 1e-4 * np.abs(ref).max(), (err, np.abs(ref).max())


def _lora_forward(cfg, spec, full, ids):
  valid = jnp.ones(ids.shape, bool)
  logits, _ = Qwen(cfg, lora=spec).apply({"params": full}, jnp.asarray(ids),
                                         masks.positions_from_padding(valid),
                                         masks.causal_padding_mask(valid))
  return logits


_jit_lora_forward = jax.jit(_lora_forward, static_argnums=(0, 1))


def _ours(cfg, params, spec, adapter):
  return np.asarray(_jit_lora_forward(cfg, spec, attach(params, {spec.names[0]: adapter}, spec,
                                                        spec.names[0]), IDS))


def _random_adapter(cfg, spec, seed):
  """Non-zero A and B (a fresh adapter's B is zero, which would test nothing)."""
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.1, s.shape), jnp.float32),
                      adapter_abstract(cfg, spec))


def _peft_model(hf_model_or_folder, folder):
  from peft import PeftModel
  from transformers import AutoModelForCausalLM

  base = AutoModelForCausalLM.from_pretrained(hf_model_or_folder).eval()  # a fresh copy: peft
  return PeftModel.from_pretrained(base, folder).eval()                  # edits it in place


@pytest.fixture(scope="module")
def exported(hf_checkpoint, tmp_path_factory):
  """Factory: exported(backbone) -> (hf folder, cfg, params, spec, adapter, PEFT folder), our
  random adapter on every projection written by save_peft; cached per backbone."""
  cache = {}

  def build(name):
    if name not in cache:
      folder, _ = hf_checkpoint(name)
      cfg, params = load_hf(folder)
      spec = LoraSpec(names=("policy",), rank=4, alpha=8.0, targets=ALL_TARGETS)
      adapter = _random_adapter(cfg, spec, seed=len(cache))
      out = save_peft(str(tmp_path_factory.mktemp("peft") / name), cfg, spec, adapter,
                      base_model_name_or_path=folder)
      cache[name] = (folder, cfg, params, spec, adapter, out)
    return cache[name]

  return build


@pytest.fixture(scope="module")
def peft_made(hf_checkpoint, tmp_path_factory):
  """An adapter made by peft itself (random A and B, rank 4, alpha 16, PEFT_TARGETS) on the
  untied qwen3 backbone, saved with save_pretrained: (hf folder, PEFT folder, peft model)."""
  import peft
  import torch
  from transformers import AutoModelForCausalLM

  folder, _ = hf_checkpoint(UNTIED)
  torch.manual_seed(3)
  base = AutoModelForCausalLM.from_pretrained(folder).eval()
  model = peft.get_peft_model(base, peft.LoraConfig(
      r=4, lora_alpha=16, target_modules=list(PEFT_TARGETS), init_lora_weights=False,
      task_type="CAUSAL_LM")).eval()
  out = str(tmp_path_factory.mktemp("peft_made"))
  model.save_pretrained(out)
  return folder, out, model


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("name", [TIED, UNTIED])
def test_exported_adapter_loads_in_peft_with_our_logits(exported, hf_checkpoint, name):
  folder, cfg, params, spec, adapter, out = exported(name)
  assert sorted(os.listdir(out)) == [CONFIG_FILE, WEIGHTS_FILE]
  with open(os.path.join(out, CONFIG_FILE)) as f:
    config = json.load(f)
  assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == \
      ("LORA", "CAUSAL_LM", 4, 8)
  assert sorted(config["target_modules"]) == sorted(ALL_TARGETS)
  assert config["base_model_name_or_path"] == folder
  names = safetensors.numpy.load_file(os.path.join(out, WEIGHTS_FILE))
  assert len(names) == 2 * len(ALL_TARGETS) * cfg.num_layers
  # PEFT's layout: q_proj's A [r, E], B [H * D, r] (our lora_b [r, H, D] flattened).
  q_b = names["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
  np.testing.assert_array_equal(
      q_b, np.asarray(adapter["layers_1"]["self_attn"]["q_proj"]["lora_b"]).reshape(4, -1).T)

  ref = hf_fixtures.hf_logits(_peft_model(folder, out), IDS)
  _close(_ours(cfg, params, spec, adapter), ref)
  # The adapter matters: the bare backbone is far from these logits.
  bare = hf_fixtures.hf_logits(hf_checkpoint(name)[1], IDS)
  assert np.abs(bare - ref).max() > 100 * 1e-4 * np.abs(ref).max()


def test_failed_export_leaves_previous_folder_whole(exported, tmp_path, monkeypatch):
  from agentjax.models.qwen import peft as peft_lib

  _, cfg, _, spec, adapter, out = exported(TIED)
  target = str(tmp_path / "policy")
  shutil.copytree(out, target)
  before = {f: open(os.path.join(target, f), "rb").read() for f in os.listdir(target)}

  def crash(path, tensors):
    with open(path, "wb") as f:
      f.write(b"partial")
    raise OSError("disk full")

  monkeypatch.setattr(peft_lib, "write_safetensors", crash)
  with pytest.raises(OSError, match="disk full"):
    save_peft(target, cfg, spec, _random_adapter(cfg, spec, seed=9))
  assert {f: open(os.path.join(target, f), "rb").read() for f in os.listdir(target)} == before
  assert os.listdir(tmp_path) == ["policy"]  # no staging folder left beside it


# --------------------------------------------------------------------------- import


def test_peft_made_adapter_loads_with_peft_logits(peft_made, tmp_path):
  folder, out, model = peft_made
  spec = peft_spec(out)
  assert (spec.rank, spec.alpha, spec.scale) == (4, 16.0, 4.0)
  assert set(spec.targets) == set(PEFT_TARGETS)
  cfg, params = load_hf(folder)
  adapter = load_peft(out, cfg, spec, mesh=make_mesh())
  leaf = adapter["layers_0"]["self_attn"]["o_proj"]["lora_a"]
  assert leaf.shape == (cfg.num_heads, cfg.head_dim, 4)
  assert isinstance(leaf.sharding, jax.sharding.NamedSharding)
  _close(_ours(cfg, params, spec, adapter), hf_fixtures.hf_logits(model, IDS))
  # And back out: save_peft writes exactly peft's tensors.
  again = save_peft(str(tmp_path / "again"), cfg, spec, adapter)
  theirs = safetensors.numpy.load_file(os.path.join(out, WEIGHTS_FILE))
  ours = safetensors.numpy.load_file(os.path.join(again, WEIGHTS_FILE))
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


# --------------------------------------------------------------------------- merge


def test_merged_folder_loads_in_transformers_with_peft_logits(peft_made, tiny_tokenizer_dir,
                                                              tmp_path):
  from transformers import AutoModelForCausalLM

  folder, out, model = peft_made
  base = tmp_path / "base"  # the backbone with a tokenizer beside it, to be copied
  shutil.copytree(folder, base)
  for name in os.listdir(tiny_tokenizer_dir):
    shutil.copy(os.path.join(tiny_tokenizer_dir, name), base)
  merged = merge_lora(str(base), str(out), str(tmp_path / "merged"))
  files = set(os.listdir(merged))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
  assert not any(f.startswith("adapter") for f in files)
  hf = AutoModelForCausalLM.from_pretrained(merged).eval()
  _close(hf_fixtures.hf_logits(hf, IDS), hf_fixtures.hf_logits(model, IDS))


# --------------------------------------------------------------------------- bad folders


def _edit_config(folder, **changes):
  path = os.path.join(folder, CONFIG_FILE)
  with open(path) as f:
    config = json.load(f)
  config.update(changes)
  with open(path, "w") as f:
    json.dump(config, f)


def _rewrite_tensors(folder, edit):
  path = os.path.join(folder, WEIGHTS_FILE)
  tensors = safetensors.numpy.load_file(path)
  edit(tensors)
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
DOWN_B = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"


def test_bad_folders_fail_naming_the_field_or_tensor(exported, tmp_path):
  import peft
  from transformers import AutoModelForCausalLM

  _, cfg, _, spec, _, good = exported(TIED)

  def copy(name):
    dst = str(tmp_path / name)
    shutil.copytree(good, dst)
    return dst

  def fails(folder, pattern, load_spec=spec):
    with pytest.raises(CheckpointError, match=pattern):
      load_peft(folder, cfg, load_spec)

  assert load_peft(good, cfg, spec)  # the unedited folder loads
  # Wrong rank: against the spec, and a config that lies about its tensors.
  fails(good, r"adapter_config.json: r=4, expected rank 8",
        LoraSpec(names=("policy",), rank=8, alpha=8.0))
  lying = copy("lying_rank")
  _edit_config(lying, r=8, lora_alpha=16)
  fails(lying, re.escape(f"adapter_model.safetensors: tensor {Q_A!r} has shape [4, 64], "
                         "expected [8, 64] (rank 8"),
        LoraSpec(names=("policy",), rank=8, alpha=16.0))
  fails(good, r"lora_alpha=8, expected alpha 32", LoraSpec(names=("policy",), rank=4, alpha=32.0))
  fails(good, r"target_modules=.*expected \['q_proj'\]",
        LoraSpec(names=("policy",), rank=4, alpha=8.0, targets=("q_proj",)))
  # A missing target tensor, an unexpected one, an integer one.
  missing = copy("missing")
  _rewrite_tensors(missing, lambda t: t.pop(DOWN_B))
  fails(missing, re.escape(f"tensor {DOWN_B!r} is missing"))
  extra = copy("extra")
  _rewrite_tensors(extra, lambda t: t.update({"base_model.model.lm_head.lora_A.weight":
                                              np.zeros((4, 64), np.float32)}))
  fails(extra, r"unexpected tensor 'base_model.model.lm_head.lora_A.weight'")
  ints = copy("ints")
  _rewrite_tensors(ints, lambda t: t.update({Q_A: t[Q_A].astype(np.int32)}))
  fails(ints, re.escape(f"tensor {Q_A!r} has non-float dtype I32"))
  # Another backbone's adapter (hidden 48, not 64), made by peft.
  other = AutoModelForCausalLM.from_config(hf_fixtures.hf_config("qwen2-untied-mha")).eval()
  other = peft.get_peft_model(other, peft.LoraConfig(r=4, lora_alpha=8,
                                                     target_modules=list(ALL_TARGETS)))
  other.save_pretrained(str(tmp_path / "other"))
  fails(str(tmp_path / "other"), r"tensor 'base_model\.model\.model\.layers\.0\.[a-z_.]+"
                                 r"\.lora_[AB]\.weight' has shape \[\d+, \d+\], expected")
  # Options this model does not compute, each named.
  for field, value in [("use_dora", True), ("use_rslora", True), ("bias", "all"),
                       ("fan_in_fan_out", True), ("modules_to_save", ["lm_head"]),
                       ("layers_to_transform", [0]), ("rank_pattern", {"q_proj": 8}),
                       ("alpha_pattern", {"q_proj": 4}), ("peft_type", "LOHA")]:
    bad = copy(f"opt_{field}")
    _edit_config(bad, **{field: value})
    fails(bad, rf"adapter_config.json: {field}[= ]")
  regex = copy("regex")
  _edit_config(regex, target_modules=r".*\.(q|k|v)_proj")
  fails(regex, r"target_modules is the string .* regular expression")
  # No adapter_config.json, and a config that is not JSON.
  gone = copy("no_config")
  os.remove(os.path.join(gone, CONFIG_FILE))
  fails(gone, r"adapter_config.json: missing")
  garbled = copy("garbled")
  with open(os.path.join(garbled, CONFIG_FILE), "w") as f:
    f.write("{not json")
  fails(garbled, r"adapter_config.json: not valid JSON")
