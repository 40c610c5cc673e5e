"""The BERT encoder (agentjax/models/bert) against transformers' BertModel on tiny random
checkpoints: hidden states with padding, both poolings, a BertFor* checkpoint's prefixed names,
sentence-transformers' pooling file, blockwise attention, bf16, and errors that name the tensor."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import bert

TINY = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, type_vocab_size=2)


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """(folder, transformers BertModel in eval mode): random, saved as safetensors."""
  import torch
  from transformers import BertConfig, BertModel
  torch.manual_seed(0)
  model = BertModel(BertConfig(**TINY), add_pooling_layer=True).eval()
  folder = str(tmp_path_factory.mktemp("bert"))
  model.save_pretrained(folder, safe_serialization=True)
  return folder, model


def _batch(seed=0, b=3, length=20):
  """Right-padded rows of different lengths (one full, one of 1 token)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, TINY["vocab_size"], (b, length)).astype(np.int32)
  lengths = np.array([length, 7, 1][:b])
  valid = np.arange(length)[None] < lengths[:, None]
  return np.where(valid, tokens, 0).astype(np.int32), valid


def _reference(model, tokens, valid):
  import torch
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(valid, dtype=torch.long))
  return out.last_hidden_state.numpy()


def _pooled_reference(hidden, valid, pooling):
  """sentence-transformers' pooling and torch's normalize, in NumPy."""
  if pooling == "cls":
    out = hidden[:, 0]
  else:
    w = valid[..., None].astype(np.float64)
    out = (hidden * w).sum(1) / w.sum(1)
  return out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_hidden_states_and_embeddings_match_transformers(hf_bert, attention):
  """float32, padding included (every position, as BertModel computes padding queries too):
  within 1e-5 relative; blockwise with 8-token blocks over 20 tokens (several blocks, a
  partial one) is the same."""
  folder, model = hf_bert
  cfg, params = bert.load_hf(folder, attention=attention, attention_block=8)
  tokens, valid = _batch()
  want = _reference(model, tokens, valid)
  got = np.asarray(bert.Bert(cfg).apply({"params": params}, tokens, valid))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  for pooling in bert.POOLINGS:
    emb = np.asarray(bert.encode(bert.BertConfig(**{**cfg.__dict__, "pooling": pooling}),
                                 params, tokens, valid))
    np.testing.assert_allclose(emb, _pooled_reference(want, valid, pooling), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, rtol=1e-6)


def test_prefixed_checkpoint_pooling_file_and_bf16(hf_bert, tmp_path):
  """A BertForMaskedLM checkpoint ("bert." names, an MLM head) loads the same encoder; a
  sentence-transformers folder's 1_Pooling/config.json sets the pooling; bf16 params and
  compute stay close to float32."""
  import torch
  from transformers import BertConfig, BertForMaskedLM
  folder, model = hf_bert
  mlm = BertForMaskedLM(BertConfig(**TINY)).eval()
  mlm.bert.load_state_dict(model.state_dict(), strict=False)
  mlm.save_pretrained(str(tmp_path / "mlm"), safe_serialization=True)
  os.makedirs(tmp_path / "mlm" / "1_Pooling")
  with open(tmp_path / "mlm" / "1_Pooling" / "config.json", "w") as f:
    json.dump({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, f)
  cfg, params = bert.load_hf(str(tmp_path / "mlm"))
  assert cfg.pooling == "cls"
  _, want = bert.load_hf(folder)
  jax.tree.map(np.testing.assert_array_equal, params, want)
  tokens, valid = _batch(1)
  ref = bert.encode(cfg, params, tokens, valid)
  half = bert.BertConfig(**{**cfg.__dict__, "dtype": "bfloat16", "param_dtype": "bfloat16"})
  _, half_params = bert.load_hf(str(tmp_path / "mlm"), dtype="bfloat16", param_dtype="bfloat16")
  assert jax.tree.leaves(half_params)[0].dtype == jnp.bfloat16
  got = np.asarray(bert.encode(half, half_params, tokens, valid))
  assert np.all(np.sum(got * np.asarray(ref), axis=-1) > 0.99)  # cosine to the float32 one
  del torch


def test_errors_name_the_tensor_and_the_field(hf_bert, tmp_path):
  from safetensors.numpy import load_file, save_file
  from agentjax.models.qwen.config import ConfigError
  from agentjax.models.safetensors_io import CheckpointError
  folder, _ = hf_bert
  tensors = load_file(os.path.join(folder, "model.safetensors"))
  del tensors["encoder.layer.1.output.dense.bias"]
  broken = tmp_path / "broken"
  broken.mkdir()
  save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(folder, "config.json")) as f:
    config = json.load(f)
  with open(broken / "config.json", "w") as f:
    json.dump(config, f)
  with pytest.raises(CheckpointError, match="encoder.layer.1.output.dense.bias"):
    bert.load_hf(str(broken))
  with open(broken / "config.json", "w") as f:
    json.dump({**config, "model_type": "roberta"}, f)
  with pytest.raises(ConfigError, match="model_type='roberta'"):
    bert.load_hf(str(broken))
  with pytest.raises(ConfigError, match="pooling='max'"):
    bert.BertConfig(pooling="max")
  cfg, params = bert.load_hf(folder)
  too_long = np.ones((1, TINY["max_position_embeddings"] + 1), np.int32)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    bert.encode(cfg, params, too_long, too_long > 0)


def test_params_carry_logical_axes_for_the_mesh():
  """Every parameter has logical axis names (the rules table maps them to the mesh)."""
  cfg = bert.BertConfig(**{"vocab_size": 97, "hidden_size": 32, "num_layers": 2,
                           "num_heads": 4, "intermediate_size": 48,
                           "max_position_embeddings": 64})
  axes = bert.param_logical_axes(cfg)
  shapes = bert.abstract_params(cfg)
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(flat_axes) == len(jax.tree.leaves(shapes))
  for spec, leaf in zip(flat_axes, jax.tree.leaves(shapes)):
    assert len(spec) == leaf.ndim
  assert axes["layers_0"]["q_proj"]["kernel"] == jax.sharding.PartitionSpec(
      "embed", "heads", "head_dim")
  assert axes["word_embeddings"] == jax.sharding.PartitionSpec("vocab", "embed")


def test_save_hf_round_trips_through_transformers(hf_bert, tmp_path):
  """bert.save_hf writes a folder transformers loads as the same BertModel, and the pooling file
  that load_hf reads back."""
  from transformers import BertModel
  folder, model = hf_bert
  cfg, params = bert.load_hf(folder, pooling="cls")
  out = bert.save_hf(str(tmp_path / "saved"), cfg, params)
  again = BertModel.from_pretrained(out).eval()
  tokens, valid = _batch(2)
  np.testing.assert_allclose(_reference(again, tokens, valid), _reference(model, tokens, valid),
                             rtol=1e-6, atol=1e-6)
  assert bert.load_hf(out)[0].pooling == "cls"
