"""Hugging Face BERT safetensors folders (BertModel's tensor names, with or without the "bert."
prefix of a BertFor* checkpoint) into the encoder's params, through the decoder's loader
(models/qwen/checkpoint.py: the same layout kinds, block-by-block reads onto the mesh)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax

from agentjax.models.bert.config import BertConfig
from agentjax.models.bert.model import abstract_params, param_shardings
from agentjax.models.qwen.checkpoint import (ParamMap, arrays_from_tensors, check_tensors,
                                             expected_tensors, tensors_of, write_hf_folder)
from agentjax.models.safetensors_io import SafetensorsFolder

# Tensors a BERT checkpoint may carry that the encoder does not use: the pooler (dense + tanh
# over [CLS], not what e5 or bge embed with), an MLM head, the position_ids buffer.
_UNUSED = ("pooler.", "cls.", "embeddings.position_ids")


def param_map(cfg: BertConfig, prefix: str = "") -> ParamMap:
  """Our param path -> (Hugging Face tensor name, layout kind; models/qwen/checkpoint.py)."""
  p = prefix
  out = {("word_embeddings",): (f"{p}embeddings.word_embeddings.weight", "copy"),
         ("position_embeddings",): (f"{p}embeddings.position_embeddings.weight", "copy"),
         ("token_type_embeddings",): (f"{p}embeddings.token_type_embeddings.weight", "copy"),
         ("embeddings_norm", "scale"): (f"{p}embeddings.LayerNorm.weight", "copy"),
         ("embeddings_norm", "bias"): (f"{p}embeddings.LayerNorm.bias", "copy")}
  for i in range(cfg.num_layers):
    ours, hf = f"layers_{i}", f"{p}encoder.layer.{i}"
    for proj, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
      out[(ours, proj, "kernel")] = (f"{hf}.attention.self.{name}.weight", "heads")
      out[(ours, proj, "bias")] = (f"{hf}.attention.self.{name}.bias", "hbias")
    out[(ours, "o_proj", "kernel")] = (f"{hf}.attention.output.dense.weight", "o")
    out[(ours, "o_proj", "bias")] = (f"{hf}.attention.output.dense.bias", "copy")
    out[(ours, "attention_norm", "scale")] = (f"{hf}.attention.output.LayerNorm.weight", "copy")
    out[(ours, "attention_norm", "bias")] = (f"{hf}.attention.output.LayerNorm.bias", "copy")
    out[(ours, "up_proj", "kernel")] = (f"{hf}.intermediate.dense.weight", "T")
    out[(ours, "up_proj", "bias")] = (f"{hf}.intermediate.dense.bias", "copy")
    out[(ours, "down_proj", "kernel")] = (f"{hf}.output.dense.weight", "T")
    out[(ours, "down_proj", "bias")] = (f"{hf}.output.dense.bias", "copy")
    out[(ours, "output_norm", "scale")] = (f"{hf}.output.LayerNorm.weight", "copy")
    out[(ours, "output_norm", "bias")] = (f"{hf}.output.LayerNorm.bias", "copy")
  return out


def _prefix(names: Any) -> str:
  """"bert." when the checkpoint is a BertFor* model's, "" for a BertModel's."""
  return "bert." if "bert.embeddings.word_embeddings.weight" in names else ""


def params_from_tensors(cfg: BertConfig, tensors: Mapping[str, Any],
                        shardings: Any | None = None) -> Any:
  """Params from {Hugging Face name: array} (a SafetensorsFolder, or a transformers state_dict
  as numpy), placed by `shardings` (default: the first device)."""
  return arrays_from_tensors(param_map(cfg, _prefix(tensors)), abstract_params(cfg), tensors,
                             shardings)


def load_hf(path: str, mesh: jax.sharding.Mesh | None = None, **config_overrides: Any
            ) -> tuple[BertConfig, Any]:
  """A Hugging Face BERT folder (config.json, safetensors; a sentence-transformers folder's
  1_Pooling/config.json for the pooling) -> (config, params), placed by the rules table on
  `mesh` (default: the first local device). Tensors are checked first: a missing, misshapen or
  unexpected one is an error naming it."""
  cfg = BertConfig.from_hf_folder(path, **config_overrides)
  folder = SafetensorsFolder(path)
  prefix = _prefix(set(folder))
  mapping = param_map(cfg, prefix)
  unused = {n for n in folder if n.startswith(tuple(prefix + u for u in _UNUSED) + _UNUSED)}
  check_tensors(folder, expected_tensors(mapping, abstract_params(cfg)), unused, "BERT encoder")
  shardings = param_shardings(cfg, mesh) if mesh is not None else None
  return cfg, arrays_from_tensors(mapping, abstract_params(cfg), folder, shardings)


def save_hf(path: str, cfg: BertConfig, params: Any, tokenizer: Any = None) -> str:
  """A Hugging Face folder transformers loads as BertModel (config.json, safetensors, the
  tokenizer), with sentence-transformers' 1_Pooling/config.json naming the pooling; written
  crash-safely (models/qwen/checkpoint.write_hf_folder). Returns its absolute path."""
  pooling = {"word_embedding_dimension": cfg.hidden_size,
             "pooling_mode_cls_token": cfg.pooling == "cls",
             "pooling_mode_mean_tokens": cfg.pooling == "mean"}
  return write_hf_folder(path, tensors_of(param_map(cfg), params), cfg.to_hf_dict(), tokenizer,
                         extra_json={os.path.join("1_Pooling", "config.json"): pooling})
