"""Qwen parameters with a scripted next-token rule, for testing and benchmarking the rollout engine.

`transition_params` builds a real Qwen model (run by the same code as any checkpoint) whose next
token depends only on the current token: successors[x] lists the tokens that may follow x, each
equally likely (the rest have probability ~e^-alpha). Greedy decoding picks the first successor.
The construction: one-hot embeddings (hidden_size == vocab_size), attention and MLP outputs
zeroed so the residual stream stays the current token's one-hot, and an LM head that maps it to
its successors. With several successors, sampling branches: e.g. search again or answer.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models.qwen.config import QwenConfig
from agentjax.models.qwen.model import init_params


def transition_config(vocab_size: int, num_layers: int = 1) -> QwenConfig:
  return QwenConfig(model_type="qwen2", vocab_size=vocab_size, hidden_size=vocab_size,
                    intermediate_size=32, num_layers=num_layers, num_heads=4, num_kv_heads=2,
                    head_dim=vocab_size // 4, rope_theta=10000.0, tie_word_embeddings=False,
                    qkv_bias=True, qk_norm=False, max_position_embeddings=1 << 16)


def transition_params(cfg: QwenConfig, successors: Mapping[int, Sequence[int]], fallback: int,
                      alpha: float = 30.0, seed: int = 0):
  """Params of `cfg` (from transition_config) realizing the successor rule; unlisted tokens -> fallback."""
  v = cfg.vocab_size
  if cfg.hidden_size != v or cfg.tie_word_embeddings:
    raise ValueError("transition_params needs hidden_size == vocab_size and an untied head")
  params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(seed)))
  params["embed_tokens"] = np.eye(v, dtype=np.float32)
  head = np.zeros((v, v), np.float32)
  head[:, fallback] = 1.0
  for x, ys in successors.items():
    head[x] = 0.0
    head[x, list(ys)] = 1.0
  # The final RMSNorm scales a one-hot to sqrt(v): divide it out so listed logits equal alpha.
  params["lm_head"] = head * (alpha / np.sqrt(v))
  for i in range(cfg.num_layers):
    layer = params[f"layers_{i}"]
    layer["self_attn"]["o_proj"]["kernel"] = np.zeros_like(layer["self_attn"]["o_proj"]["kernel"])
    layer["mlp"]["down_proj"]["kernel"] = np.zeros_like(layer["mlp"]["down_proj"]["kernel"])
  return jax.tree.map(jnp.asarray, params)


def chain(ids: Sequence[int]) -> dict[int, list[int]]:
  """Successor lists that make the model continue `ids` in order (ids[i] -> ids[i + 1])."""
  out: dict[int, list[int]] = {}
  for a, b in zip(ids[:-1], ids[1:]):
    if b not in out.setdefault(a, []):
      out[a].append(b)
  return out
