"""Configuration of the Qwen2 / Qwen2.5 / Qwen3 decoder family.

`QwenConfig` is a frozen dataclass: hashable, so it can be a static argument of a jitted function.
It is built from a preset name (`QwenConfig.preset("qwen2.5-0.5b")`) or from a Hugging Face
config.json (`QwenConfig.from_hf_dict(json.load(...))`), and written back with `to_hf_dict()`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")
DTYPES = ("float32", "bfloat16")
# Remat policies by name; see agentjax/models/qwen/model.py for what each saves.
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# Attention implementations by name; see agentjax/models/attention.py.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "blockwise", "cudnn", "splash")


class ConfigError(ValueError):
  """A config agentjax cannot run; the message names the field.

  The one class for model configs (a preset, a config.json) and run configs (configs/*.py, checked
  by agentjax.train.config.validate, which re-exports it): catching it catches both.
  """


@dataclasses.dataclass(frozen=True)
class QwenConfig:
  """Shapes and numerics of one Qwen decoder.

  Qwen2/2.5 use biases on the q/k/v projections; Qwen3 drops them and adds a per-head RMSNorm on
  q and k (qk_norm), with an explicit head_dim that may differ from hidden_size / num_heads.
  """

  model_type: str = "qwen2"
  vocab_size: int = 151936
  hidden_size: int = 896
  intermediate_size: int = 4864
  num_layers: int = 24
  num_heads: int = 14
  num_kv_heads: int = 2
  head_dim: int = 64
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  qkv_bias: bool = True
  qk_norm: bool = False
  max_position_embeddings: int = 32768
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  # Numerics: parameters are stored in param_dtype, matmuls run in dtype. Norms, softmax, RoPE and
  # the LM-head accumulation stay in float32 whatever dtype is.
  param_dtype: str = "float32"
  dtype: str = "float32"
  # Gradient checkpointing of each decoder layer: none | full | dots | dots_no_batch.
  remat_policy: str = "none"
  # Attention implementation (agentjax/models/attention.py): auto | xla | blockwise | cudnn |
  # splash, and the query/key block of the blockwise one (memory ~ block^2 per head, not L^2).
  attention: str = "auto"
  attention_block: int = 512

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ConfigError(
          f"model_type {self.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
          f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in DTYPES:
        raise ConfigError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
    if self.remat_policy not in REMAT_POLICIES:
      raise ConfigError(f"remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ConfigError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, "
                        f"got {self.attention!r}")
    if not isinstance(self.attention_block, int) or self.attention_block <= 0:
      raise ConfigError(f"attention_block must be a positive integer, got {self.attention_block!r}")

  @property
  def num_groups(self) -> int:
    """Query heads per KV head (GQA group size)."""
    return self.num_heads // self.num_kv_heads

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, int):
      return (self.eos_token_id,)
    return tuple(self.eos_token_id)

  def replace(self, **changes: Any) -> "QwenConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Parameter count (the embedding counted once when tied)."""
    e, m, d = self.hidden_size, self.intermediate_size, self.head_dim
    attn = e * d * (self.num_heads * 2 + self.num_kv_heads * 2)
    if self.qkv_bias:
      attn += d * (self.num_heads + 2 * self.num_kv_heads)
    if self.qk_norm:
      attn += 2 * d
    layer = attn + 3 * e * m + 2 * e
    head = 0 if self.tie_word_embeddings else self.vocab_size * e
    return self.num_layers * layer + self.vocab_size * e + head + e

  # ---------------------------------------------------------------- presets

  @classmethod
  def preset(cls, name: str, **overrides: Any) -> "QwenConfig":
    """A named preset with the real shapes of the released checkpoints (weights not included)."""
    if name not in PRESETS:
      raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return cls(**{**PRESETS[name], **overrides})

  # ---------------------------------------------------------------- Hugging Face config.json

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> "QwenConfig":
    """Builds a config from a Hugging Face config.json dict (transformers 4 or 5 layout).

    Raises ConfigError naming the field when the checkpoint uses a feature this port does not
    implement (another model_type, sliding-window attention, scaled RoPE, another activation).
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ConfigError(
          f"config.json: model_type {model_type!r} is not supported; "
          f"expected one of {SUPPORTED_MODEL_TYPES}")

    def need(key: str) -> Any:
      if key not in hf or hf[key] is None:
        raise ConfigError(f"config.json: required field {key!r} is missing")
      return hf[key]

    if hf.get("hidden_act", "silu") != "silu":
      raise ConfigError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    if hf.get("use_sliding_window", False):
      raise ConfigError("config.json: use_sliding_window=true is not supported")
    # transformers 5 keeps rope_theta in rope_parameters; transformers 4 at the top level.
    rope = hf.get("rope_parameters") or {}
    legacy_scaling = hf.get("rope_scaling")
    rope_type = rope.get("rope_type", (legacy_scaling or {}).get("rope_type", "default"))
    if rope_type != "default" or (legacy_scaling and legacy_scaling.get("type", "default") != "default"):
      raise ConfigError(f"config.json: rope_parameters.rope_type {rope_type!r} is not supported "
                        "(only 'default' RoPE)")
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    if model_type == "qwen3" and hf.get("attention_bias", False):
      # transformers then also adds an o_proj bias, which this port does not have.
      raise ConfigError("config.json: attention_bias=true is not supported for qwen3")

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    head_dim = hf.get("head_dim") or hidden // heads
    is_qwen3 = model_type == "qwen3"
    eos = hf.get("eos_token_id")
    fields = dict(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rope_theta=float(rope_theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        # Qwen2 hard-codes bias=True on q/k/v; Qwen3 has none (see the attention_bias check).
        qkv_bias=not is_qwen3,
        qk_norm=is_qwen3,
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    )
    return cls(**{**fields, **overrides})

  @classmethod
  def from_hf_folder(cls, path: str, **overrides: Any) -> "QwenConfig":
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
      raise ConfigError(f"{config_path}: no config.json in the checkpoint folder")
    with open(config_path) as f:
      try:
        hf = json.load(f)
      except json.JSONDecodeError as e:
        raise ConfigError(f"{config_path}: not valid JSON ({e})") from None
    return cls.from_hf_dict(hf, **overrides)

  def to_hf_dict(self) -> dict[str, Any]:
    """A config.json that transformers 5 (and 4) loads as Qwen2ForCausalLM / Qwen3ForCausalLM."""
    is_qwen3 = self.model_type == "qwen3"
    hf = {
        "architectures": ["Qwen3ForCausalLM" if is_qwen3 else "Qwen2ForCausalLM"],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": self.max_position_embeddings,
        "rms_norm_eps": self.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "rope_theta": self.rope_theta,  # for transformers 4 readers
        "tie_word_embeddings": self.tie_word_embeddings,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "dtype": self.param_dtype,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
    }
    if is_qwen3:
      if self.qkv_bias:
        raise ConfigError("qkv_bias=True cannot be exported as qwen3 (no attention_bias support)")
      hf["head_dim"] = self.head_dim
      hf["attention_bias"] = False
    elif self.head_dim != self.hidden_size // self.num_heads:
      raise ConfigError(f"qwen2 requires head_dim == hidden_size / num_heads, got {self.head_dim}")
    return hf


def _qwen25(hidden, inter, layers, heads, kv, tied, vocab=151936):
  return dict(model_type="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
              num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
              rope_theta=1_000_000.0, tie_word_embeddings=tied, qkv_bias=True, qk_norm=False,
              max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645)


def _qwen3(hidden, inter, layers, heads, kv, tied):
  return dict(model_type="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
              num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128,
              rope_theta=1_000_000.0, tie_word_embeddings=tied, qkv_bias=False, qk_norm=True,
              max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645)


PRESETS: dict[str, dict[str, Any]] = {
    # Tests and the demo: a few hundred thousand parameters, Qwen2 layout (q/k/v bias).
    "tiny": dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=192,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                 tie_word_embeddings=True, qkv_bias=True, qk_norm=False,
                 max_position_embeddings=4096),
    "tiny-qwen3": dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=192,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0,
                       tie_word_embeddings=False, qkv_bias=False, qk_norm=True,
                       max_position_embeddings=4096),
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-3b": _qwen25(2048, 11008, 36, 16, 2, tied=True),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, tied=False, vocab=152064),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 8, tied=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 8, tied=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, tied=False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, 8, tied=False),   # Co-ReAct's 14B trainer
}
