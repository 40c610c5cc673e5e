"""BertConfig: what the encoder needs of a Hugging Face BERT config.json (and of a
sentence-transformers folder's pooling settings)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from agentjax.models.qwen.config import ConfigError

# How a text's token states become its embedding: the mean over its real tokens (e5) or the
# first token's state ([CLS]: bge).
POOLINGS = ("mean", "cls")
_ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}  # name -> tanh approx.


@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  dtype: str = "float32"        # compute
  param_dtype: str = "float32"  # storage
  attention: str = "auto"       # models/attention.py's implementations
  attention_block: int = 512
  pooling: str = "mean"         # POOLINGS
  normalize: bool = True        # L2-normalized embeddings (inner product = cosine)

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ConfigError(f"bert hidden_size={self.hidden_size} is not a multiple of "
                        f"num_attention_heads={self.num_heads}")
    if self.pooling not in POOLINGS:
      raise ConfigError(f"bert pooling={self.pooling!r}: must be one of {list(POOLINGS)}")
    if self.hidden_act not in _ACTIVATIONS:
      raise ConfigError(f"bert hidden_act={self.hidden_act!r}: must be one of "
                        f"{sorted(_ACTIVATIONS)}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in ("float32", "bfloat16"):
        raise ConfigError(f"bert {name}={getattr(self, name)!r}: must be one of "
                          "['float32', 'bfloat16']")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def tanh_gelu(self) -> bool:
    return _ACTIVATIONS[self.hidden_act]

  def to_hf_dict(self) -> dict[str, Any]:
    """A config.json transformers loads as BertModel."""
    return {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size, "layer_norm_eps": self.layer_norm_eps,
            "hidden_act": self.hidden_act, "position_embedding_type": "absolute",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> "BertConfig":
    """From a config.json's dict; errors name the field."""
    if hf.get("model_type", "bert") != "bert":
      raise ConfigError(f"config.json model_type={hf.get('model_type')!r}: the encoder reads "
                        "'bert' (e5, bge); Qwen3-Embedding goes through the Qwen port")
    if hf.get("position_embedding_type", "absolute") != "absolute":
      raise ConfigError(f"config.json position_embedding_type="
                        f"{hf.get('position_embedding_type')!r}: only 'absolute' is supported")
    fields = dict(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                  num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
                  intermediate_size=hf["intermediate_size"],
                  max_position_embeddings=hf.get("max_position_embeddings", 512),
                  type_vocab_size=hf.get("type_vocab_size", 2),
                  layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                  hidden_act=hf.get("hidden_act", "gelu"))
    return cls(**{**fields, **overrides})

  @classmethod
  def from_hf_folder(cls, path: str, **overrides: Any) -> "BertConfig":
    """From a folder's config.json; the pooling from sentence-transformers' 1_Pooling/config.json
    when the folder has one (its pooling_mode_cls_token / pooling_mode_mean_tokens), else
    overrides' or the default (mean)."""
    hf = _read_json(os.path.join(path, "config.json"))
    pooling_path = os.path.join(path, "1_Pooling", "config.json")
    if "pooling" not in overrides and os.path.exists(pooling_path):
      modes = _read_json(pooling_path)
      if modes.get("pooling_mode_cls_token"):
        overrides = {**overrides, "pooling": "cls"}
      elif modes.get("pooling_mode_mean_tokens"):
        overrides = {**overrides, "pooling": "mean"}
      else:
        raise ConfigError(f"{pooling_path}: neither pooling_mode_cls_token nor "
                          "pooling_mode_mean_tokens is set (the encoder pools by mean or [CLS])")
    return cls.from_hf_dict(hf, **overrides)


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    raise ConfigError(f"{path}: not found")
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ConfigError(f"{path}: not valid JSON ({e})") from None
