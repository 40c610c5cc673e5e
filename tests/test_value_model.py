"""The value model (agentjax/models/qwen/value.py) against transformers' and peft's token
classifiers (verl's critic), the value alignment against a NumPy shift, checkpoint interop and
its faults, and gradients."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from agentjax.models import masks
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import (ConfigError, Qwen, QwenValue, init_value_head, load_value_hf,
                                  save_value_hf, sequence_values, value_abstract,
                                  value_params_from_policy, value_params_with_adapter)
from agentjax.models.qwen import checkpoint as checkpoint_lib
from agentjax.models.qwen import value as value_lib
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.models.qwen.peft import peft_tensors
from agentjax.models.safetensors_io import CheckpointError
from tests import hf_fixtures

UNTIED, TIED_QWEN3 = "qwen2-untied-mha", "qwen3-tied-gqa4"  # the second: tied and qk_norm
# One batch for every forward (one compile per config): a left-padded, a right-padded and a
# full row.
IDS = np.random.RandomState(0).randint(1, 211, (3, 8))
VALID = np.ones((3, 8), bool)
VALID[0, :3] = False
VALID[1, 6:] = False
LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def _per_slot(cfg, params, ids, valid, lora=None):
  valid = jnp.asarray(valid, bool)
  return QwenValue(cfg, lora=lora).apply({"params": params}, jnp.asarray(ids),
                                         masks.positions_from_padding(valid),
                                         masks.causal_padding_mask(valid))


_jit_per_slot = jax.jit(_per_slot, static_argnums=(0, 4))
_jit_sequence_values = jax.jit(sequence_values, static_argnums=0)


def _make_value_checkpoint(name, folder, seed):
  """A random transformers *ForTokenClassification (num_labels 1, no dropout, eval mode) with
  every parameter perturbed (the score bias too), saved as safetensors to `folder`."""
  import torch
  from transformers import AutoModelForTokenClassification

  config = hf_fixtures.hf_config(name)
  config.num_labels, config.classifier_dropout = 1, 0.0
  torch.manual_seed(seed)
  model = AutoModelForTokenClassification.from_config(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.1)
  model.save_pretrained(folder)
  return model


def _hf_values(model, ids, valid):
  """transformers' per-token scores logits[..., 0], with our position ids (0 at each row's first
  real token) so that left-padded rows are comparable."""
  import torch

  positions = np.maximum(np.cumsum(valid, -1) - 1, 0) * valid
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(valid.astype(np.int64)),
                position_ids=torch.tensor(positions))
  return out.logits[..., 0].float().numpy()


def _close(ours, ref, valid, atol=1e-5):
  err = np.abs(np.asarray(ours)[valid] - ref[valid]).max()
  assert err <= atol, (err, np.abs(ref[valid]).max())


@pytest.fixture(scope="module")
def value_checkpoint(tmp_path_factory):
  """Factory: value_checkpoint(name) -> (folder, transformers model), cached per name."""
  cache = {}

  def build(name):
    if name not in cache:
      folder = str(tmp_path_factory.mktemp(f"value-{name}"))
      cache[name] = (folder, _make_value_checkpoint(name, folder, seed=len(cache) + 1))
    return cache[name]

  return build


@pytest.fixture(scope="module")
def policy_critic(hf_checkpoint):
  """(cfg, policy params of the untied causal LM, critic params from them with a random head and
  a non-zero bias)."""
  folder, _ = hf_checkpoint(UNTIED)
  cfg, policy = load_hf(folder)
  critic = value_params_from_policy(cfg, policy, jax.random.key(3))
  critic["score"]["bias"] = jnp.full((1,), 0.37, critic["score"]["bias"].dtype)
  return cfg, policy, critic


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", [UNTIED, TIED_QWEN3])
def test_values_match_transformers_token_classifier(value_checkpoint, name):
  folder, model = value_checkpoint(name)
  cfg, params = load_value_hf(folder)
  assert cfg.tie_word_embeddings == (name == TIED_QWEN3)
  assert abs(float(params["score"]["bias"][0])) > 0.01  # the head's bias is in play
  ours = _jit_per_slot(cfg, params, IDS, VALID, None)
  assert ours.shape == IDS.shape and ours.dtype == jnp.float32
  _close(ours, _hf_values(model, IDS, VALID), VALID)


def test_sequence_values_are_the_previous_slots_values(value_checkpoint):
  folder, _ = value_checkpoint(UNTIED)
  cfg, params = load_value_hf(folder)
  raw = np.asarray(_jit_per_slot(cfg, params, IDS, VALID, None))
  got = np.asarray(_jit_sequence_values(QwenValue(cfg), params, jnp.asarray(IDS),
                                        jnp.asarray(VALID)))
  want = np.zeros_like(raw)
  for b in range(IDS.shape[0]):
    for t in range(1, IDS.shape[1]):
      if VALID[b, t] and VALID[b, t - 1]:
        want[b, t] = raw[b, t - 1]
  np.testing.assert_array_equal(got, want)
  # Each row's first real token and its padding have no value; every other real token has one.
  assert got[0, 3] == 0 and got[0, 4] != 0 and got[2, 0] == 0 and not got[1, 6:].any()


# --------------------------------------------------------------------------- from a policy


def test_trunk_from_causal_lm_folder_and_from_policy_params(hf_checkpoint, policy_critic):
  folder, _ = hf_checkpoint(UNTIED)
  cfg, policy, critic = policy_critic
  assert "lm_head" in policy and "lm_head" not in value_abstract(cfg)["model"]
  cfg2, loaded = load_value_hf(folder)
  assert cfg2 == cfg
  trunk = {k: v for k, v in policy.items() if k != "lm_head"}
  jax.tree.map(np.testing.assert_array_equal, loaded["model"], trunk)
  # The causal LM's head is ignored; the value head comes from rng (default key 0).
  jax.tree.map(np.testing.assert_array_equal, loaded["score"],
               init_value_head(cfg, jax.random.key(0)))
  _, other = load_value_hf(folder, rng=jax.random.key(5))
  jax.tree.map(np.testing.assert_array_equal, other["score"],
               init_value_head(cfg, jax.random.key(5)))
  assert other["score"]["kernel"].shape == (cfg.hidden_size, 1)
  assert np.std(np.asarray(other["score"]["kernel"])) == pytest.approx(0.02, rel=0.5)
  assert not np.asarray(other["score"]["bias"]).any()
  # From the policy's params: equal values in fresh buffers (the policy's get donated later).
  assert set(critic["model"]) == set(trunk)
  for (path, ours), theirs in zip(jax.tree_util.tree_flatten_with_path(critic["model"])[0],
                                  jax.tree.leaves(trunk)):
    np.testing.assert_array_equal(ours, theirs)
    assert ours is not theirs
    assert ours.unsafe_buffer_pointer() != theirs.unsafe_buffer_pointer(), path
  with pytest.raises(ValueError, match="leaf norm/scale is missing"):
    value_params_from_policy(cfg, {k: v for k, v in trunk.items() if k != "norm"},
                             jax.random.key(0))


def test_trunk_without_lm_head_refuses_logits(policy_critic):
  cfg, _, critic = policy_critic
  trunk = Qwen(cfg, with_lm_head=False)
  shapes = jax.eval_shape(
      lambda r: trunk.init(r, *value_lib._dummy_inputs(), return_hidden=True)["params"],
      jax.random.key(0))
  assert "lm_head" not in shapes and "embed_tokens" in shapes
  hidden = jnp.zeros((1, cfg.hidden_size))
  with pytest.raises(ValueError, match="no LM head"):
    trunk.apply({"params": critic["model"]}, hidden, method=Qwen.logits)
  with pytest.raises(ValueError, match="no LM head"):
    trunk.apply({"params": critic["model"]}, hidden, method=Qwen.logits_vocab_major)


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("name", [UNTIED, TIED_QWEN3])
def test_export_loads_in_transformers_and_round_trips(value_checkpoint, policy_critic, tmp_path,
                                                      name):
  from transformers import AutoModelForTokenClassification

  if name == UNTIED:  # a critic made from the policy, with its fresh head
    cfg, _, params = policy_critic
  else:
    cfg, params = load_value_hf(value_checkpoint(name)[0])
  out = save_value_hf(str(tmp_path / "critic"), cfg, params)
  with open(os.path.join(out, "config.json")) as f:
    config = json.load(f)
  arch = "Qwen3ForTokenClassification" if name == TIED_QWEN3 else "Qwen2ForTokenClassification"
  assert config["architectures"] == [arch]
  model = AutoModelForTokenClassification.from_pretrained(out).eval()
  assert type(model).__name__ == arch and model.config.num_labels == 1
  ours = _jit_per_slot(cfg, params, IDS, VALID, None)
  _close(ours, _hf_values(model, IDS, VALID), VALID)
  cfg2, params2 = load_value_hf(out)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def _edited_copy(src, dst, drop=(), replace=None, config=None):
  """A copy of the value folder `src` with tensors dropped or replaced, or config.json edited."""
  shutil.copytree(src, dst)
  weights = os.path.join(dst, "model.safetensors")
  tensors = safetensors.numpy.load_file(weights)
  for name in drop:
    del tensors[name]
  tensors.update(replace or {})
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  if config:
    with open(os.path.join(dst, "config.json")) as f:
      hf = json.load(f)
    hf.update(config)
    with open(os.path.join(dst, "config.json"), "w") as f:
      json.dump(hf, f)
  return str(dst)


def test_bad_value_folders_fail_naming_the_tensor_or_field(value_checkpoint, tmp_path):
  folder, _ = value_checkpoint(UNTIED)
  no_bias = _edited_copy(folder, tmp_path / "no_bias", drop=["score.bias"])
  with pytest.raises(CheckpointError, match="missing tensor 'score.bias'"):
    load_value_hf(no_bias)
  wide = _edited_copy(folder, tmp_path / "wide",
                      replace={"score.weight": np.zeros((2, 48), np.float32)})
  with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'score.weight' has shape "
                                            r"\[2, 48\], expected \[1, 48\]"):
    load_value_hf(wide)
  two = _edited_copy(folder, tmp_path / "two",
                     config={"id2label": {"0": "A", "1": "B"}, "label2id": {"A": 0, "B": 1}})
  with pytest.raises(ConfigError, match="config.json: num_labels is 2"):
    load_value_hf(two)
  seq = _edited_copy(folder, tmp_path / "seq",
                     config={"architectures": ["Qwen2ForSequenceClassification"]})
  with pytest.raises(ConfigError, match="architectures"):
    load_value_hf(seq)


def test_failed_export_leaves_previous_export_intact(policy_critic, tmp_path, monkeypatch):
  cfg, _, params = policy_critic
  out = save_value_hf(str(tmp_path / "critic"), cfg, params)
  before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}

  def crash(path, tensors, *args, **kwargs):  # half a folder written, then the writer dies
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
      f.write(b"partial")
    raise OSError("disk full")

  monkeypatch.setattr(checkpoint_lib, "write_safetensors_folder", crash)
  changed = dict(params, score={"kernel": params["score"]["kernel"] + 1,
                                "bias": params["score"]["bias"]})
  with pytest.raises(OSError, match="disk full"):
    save_value_hf(out, cfg, changed)
  assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
  assert os.listdir(tmp_path) == ["critic"]  # no staging folder left behind


# --------------------------------------------------------------------------- LoRA


def _random_tree(abstract, seed, scale=0.1):
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, scale, s.shape), s.dtype), abstract)


@pytest.fixture(scope="module")
def lora_critic(policy_critic):
  """(cfg, spec, backbone with lm_head, adapter with non-zero A and B, head with a bias)."""
  from agentjax.models.qwen import adapter_abstract

  cfg, policy, critic = policy_critic
  spec = LoraSpec(("value",), rank=4, alpha=8.0, targets=LORA_TARGETS)
  adapter = _random_tree(adapter_abstract(cfg, spec), seed=4)
  return cfg, spec, policy, adapter, critic["score"]


def test_lora_critic_matches_peft_token_classifier(lora_critic, tmp_path):
  import peft
  import torch
  from transformers import AutoModelForTokenClassification

  cfg, spec, backbone, adapter, head = lora_critic
  params = value_params_with_adapter(backbone, adapter, head, spec)
  assert "lm_head" not in params["model"] and int(params["model"]["lora_index"]) == 0
  assert params["model"]["embed_tokens"] is backbone["embed_tokens"]  # shared, not copied
  ours = _jit_per_slot(cfg, params, IDS, VALID, spec)

  # peft's LoRA on transformers' token classifier with the same backbone and head.
  trunk = {k: v for k, v in backbone.items() if k != "lm_head"}
  base = save_value_hf(str(tmp_path / "base"), cfg, {"model": trunk, "score": head})
  model = peft.get_peft_model(
      AutoModelForTokenClassification.from_pretrained(base).eval(),
      peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets),
                      lora_dropout=0.0)).eval()
  state = {name: torch.tensor(arr) for name, arr in peft_tensors(cfg, spec, adapter)}
  result = peft.set_peft_model_state_dict(model, state)
  assert not result.unexpected_keys
  assert not [k for k in result.missing_keys if "lora_" in k]
  ref = _hf_values(model, IDS, VALID)
  _close(ours, ref, VALID)
  # The adapter matters: the bare backbone's values differ.
  bare = _jit_per_slot(cfg, {"model": trunk, "score": head}, IDS, VALID, None)
  assert np.abs(np.asarray(bare)[VALID] - ref[VALID]).max() > 1e-3

  with pytest.raises(ValueError, match=r"LoRA leaves .*merge the adapter"):
    save_value_hf(str(tmp_path / "unmerged"), cfg, params)  # would drop the adapter silently
  assert not os.path.exists(tmp_path / "unmerged")
  with pytest.raises(ValueError, match="one adapter"):
    value_params_with_adapter(backbone, adapter, head,
                              LoraSpec(("value", "other"), rank=4, alpha=8.0))


# --------------------------------------------------------------------------- gradients


def _weighted(values):
  weights = jnp.asarray(np.random.RandomState(7).normal(size=IDS.shape), jnp.float32)
  return jnp.sum(values * weights)


def _nonzero(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): bool(np.abs(np.asarray(g)).max() > 0)
          for path, g in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_gradients_reach_head_trunk_and_adapter(policy_critic, lora_critic):
  cfg, _, params = policy_critic
  ids, valid = jnp.asarray(IDS), jnp.asarray(VALID)

  def full_loss(p):
    return _weighted(sequence_values(QwenValue(cfg), p, ids, valid))

  grads = _nonzero(jax.jit(jax.grad(full_loss))(params))
  # Every leaf but the key biases (a bias added to every key shifts a query's scores by one
  # constant, which softmax ignores: its gradient is zero by construction).
  assert all(ok for name, ok in grads.items() if not name.endswith("k_proj/bias")), grads
  assert grads["score/kernel"] and grads["score/bias"]

  cfg, spec, backbone, adapter, head = lora_critic

  def lora_loss(trainable, backbone):
    p = value_params_with_adapter(backbone, trainable["adapter"], trainable["score"], spec)
    return _weighted(sequence_values(QwenValue(cfg, lora=spec), p, ids, valid))

  grads = jax.jit(jax.grad(lora_loss))({"adapter": adapter, "score": head}, backbone)
  assert set(grads) == {"adapter", "score"}
  flags = _nonzero(grads)
  assert all(flags.values()), flags
  assert any(name.endswith("lora_a") for name in flags) and len(flags) > 2
