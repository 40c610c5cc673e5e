"""Qwen3-Embedding through the Qwen port: the final-norm hidden state of each text's last real
token (last-token pooling), L2-normalized, as the model card computes it; queries carry the card's
instruction, documents nothing.

    cfg, params = load_embedding_hf("models/Qwen3-Embedding-0.6B")
    emb = embed(cfg, params, tokens, valid)     # [B, E]; left or right padding

The checkpoint is a Qwen3Model (tensors without the "model." prefix) or a causal LM folder (with
it; its lm_head is not read): the trunk's params are the causal LM's without lm_head.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from agentjax.models.masks import causal_padding_mask, positions_from_padding
from agentjax.models.qwen import checkpoint
from agentjax.models.qwen.config import QwenConfig
from agentjax.models.qwen.model import Qwen, abstract_params, param_shardings
from agentjax.models.safetensors_io import SafetensorsFolder

# The model card's default task for web search queries.
SEARCH_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def query_text(query: str, instruction: str = SEARCH_INSTRUCTION) -> str:
  """The card's query format: "Instruct: {instruction}\\nQuery:{query}" (documents: as they are)."""
  return f"Instruct: {instruction}\nQuery:{query}"


def trunk_config(cfg: QwenConfig) -> QwenConfig:
  """The config whose params are the trunk alone (a tied model has no lm_head leaf)."""
  return cfg.replace(tie_word_embeddings=True)


@functools.partial(jax.jit, static_argnums=0)
def embed(cfg: QwenConfig, params: Any, tokens: jax.Array, valid: jax.Array) -> jax.Array:
  """tokens, valid [B, L] (each row one run of real tokens, left or right padded) -> [B, E]
  float32: the last real token's final-norm hidden state, L2-normalized."""
  hidden, _ = Qwen(trunk_config(cfg)).apply(
      {"params": params}, tokens, positions_from_padding(valid), causal_padding_mask(valid),
      return_hidden=True)
  length = valid.shape[1]
  last = length - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  out = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)
  return out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


def load_embedding_hf(path: str, mesh: jax.sharding.Mesh | None = None,
                      **config_overrides: Any) -> tuple[QwenConfig, Any]:
  """(config, trunk params) of a Qwen3-Embedding folder (module docstring), placed by the rules
  table on `mesh`; tensors checked first, errors naming them."""
  cfg = QwenConfig.from_hf_folder(path, **config_overrides)
  trunk = trunk_config(cfg)
  folder = SafetensorsFolder(path)
  prefixed = "model.embed_tokens.weight" in set(folder)
  mapping = {ours: (name if prefixed else name.removeprefix("model."), kind)
             for ours, (name, kind) in checkpoint._param_map(trunk).items()}
  abstract = abstract_params(trunk)
  checkpoint.check_tensors(folder, checkpoint.expected_tensors(mapping, abstract),
                           {"lm_head.weight"}, f"{cfg.model_type} embedding model")
  shardings = param_shardings(trunk, mesh) if mesh is not None else None
  return cfg, checkpoint.arrays_from_tensors(mapping, abstract, folder, shardings)
