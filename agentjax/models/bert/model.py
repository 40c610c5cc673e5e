"""Flax (linen) BERT encoder, numerically matching transformers' BertModel (its last hidden
state), and the pooling that makes one embedding per text.

    hidden = Bert(cfg).apply({"params": params}, tokens, valid)   # [B, L, E]
    emb = encode(cfg, params, tokens, valid)                      # [B, E] pooled (normalized)

Shapes: B texts, L tokens (right-padded; valid [B, L] marks the real ones), E hidden, H heads,
D head_dim, I intermediate. Attention is bidirectional over a row's real tokens, through the
same implementations as the decoder (models/attention.py: blockwise is linear in L): every query
sees every real key of its row (q_slot past the row, so the "causal" rule never hides a key).
Parameters are a plain pytree with logical axis names (param_logical_axes) mapped to the mesh by
the rules table, as the policy's.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from agentjax.models import attention as attention_lib
from agentjax.models.attention import AttentionMask
from agentjax.models.bert.config import BertConfig
from agentjax.models.qwen.model import Linear
from agentjax.parallel import constrain, logical_to_sharding

Array = jax.Array
_F32 = jnp.float32


def _embedding(std: float, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


class LayerNorm(nn.Module):
  """torch.nn.LayerNorm (biased variance) in float32, cast back to the input's dtype."""
  eps: float
  param_dtype: Any = _F32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    e = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                       (e,), self.param_dtype)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)),
                      (e,), self.param_dtype)
    x32 = x.astype(_F32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * scale.astype(_F32) + bias.astype(_F32)).astype(x.dtype)


class EncoderLayer(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x: Array, mask: AttentionMask) -> Array:
    cfg = self.cfg
    dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    b, length, _ = x.shape
    h, d = cfg.num_heads, cfg.head_dim

    def proj(name):
      return Linear((h, d), ("embed", "heads", "head_dim"), use_bias=True,
                    bias_axes=("heads", "head_dim"), dtype=dtype, param_dtype=pdtype,
                    name=name)(x)                                    # [B, L, H, D]

    q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    q = constrain(q, ("batch", "length", "heads", "head_dim"))
    # The decoder's layouts with one query per KV head (G = 1): qg [B, H, L, D], keys
    # [B, H, D, L], values [B, H, L, D].
    out = attention_lib.attend(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1),
                               v.transpose(0, 2, 1, 3), mask, dtype=dtype,
                               implementation=cfg.attention, block=cfg.attention_block)
    out = Linear((cfg.hidden_size,), ("heads", "head_dim", "embed"), in_dims=2, use_bias=True,
                 bias_axes=("embed",), dtype=dtype, param_dtype=pdtype,
                 name="o_proj")(out.transpose(0, 2, 1, 3))           # [B, L, E]
    x = LayerNorm(cfg.layer_norm_eps, pdtype, name="attention_norm")(x + out)
    up = Linear((cfg.intermediate_size,), ("embed", "mlp"), use_bias=True, bias_axes=("mlp",),
                dtype=dtype, param_dtype=pdtype, name="up_proj")(x)
    up = constrain(jax.nn.gelu(up, approximate=cfg.tanh_gelu), ("batch", "length", "mlp"))
    down = Linear((cfg.hidden_size,), ("mlp", "embed"), use_bias=True, bias_axes=("embed",),
                  dtype=dtype, param_dtype=pdtype, name="down_proj")(up)
    return LayerNorm(cfg.layer_norm_eps, pdtype, name="output_norm")(x + down)


class Bert(nn.Module):
  """tokens [B, L] int32, valid [B, L] bool (each row's first token real), token_types [B, L]
  int32 or None (all 0) -> the last hidden state [B, L, E] in cfg.dtype."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, tokens: Array, valid: Array, token_types: Array | None = None) -> Array:
    cfg = self.cfg
    dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    b, length = tokens.shape
    if length > cfg.max_position_embeddings:
      raise ValueError(f"bert: {length} tokens exceed max_position_embeddings="
                       f"{cfg.max_position_embeddings}")
    e = cfg.hidden_size
    words = self.param("word_embeddings", _embedding(0.02, ("vocab", "embed")),
                       (cfg.vocab_size, e), pdtype)
    positions = self.param("position_embeddings", _embedding(0.02, ("length", "embed")),
                           (cfg.max_position_embeddings, e), pdtype)
    types = self.param("token_type_embeddings", _embedding(0.02, (None, "embed")),
                       (cfg.type_vocab_size, e), pdtype)
    token_types = jnp.zeros_like(tokens) if token_types is None else token_types
    x = (jnp.take(words, tokens, axis=0).astype(_F32) + positions[None, :length].astype(_F32)
         + jnp.take(types, token_types, axis=0).astype(_F32))
    x = LayerNorm(cfg.layer_norm_eps, pdtype, name="embeddings_norm")(x).astype(dtype)
    x = constrain(x, ("batch", "length", "embed"))
    mask = bidirectional_mask(valid)
    for i in range(cfg.num_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, mask)
      x = constrain(x, ("batch", "length", "embed"))
    return x


def bidirectional_mask(valid: Array) -> AttentionMask:
  """Every query of a row sees every real key of it (padding queries too: their outputs are
  unused, and a query that sees nothing would be 0/0 in the blockwise softmax)."""
  b, length = valid.shape
  slots = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  return AttentionMask(q_segment=jnp.ones((b, length), jnp.int32),
                       q_slot=jnp.full((b, length), length, jnp.int32),
                       k_segment=valid.astype(jnp.int32), k_slot=slots)


def pool(hidden: Array, valid: Array, pooling: str, normalize: bool) -> Array:
  """hidden [B, L, E], valid [B, L] -> [B, E] float32: the mean over real tokens ("mean", as
  sentence-transformers' mean pooling) or the first token's state ("cls"); L2-normalized (as
  torch.nn.functional.normalize, eps 1e-12) when `normalize`."""
  h = hidden.astype(_F32)
  if pooling == "cls":
    out = h[:, 0]
  else:
    w = valid.astype(_F32)[..., None]
    out = jnp.sum(h * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1e-9)
  if normalize:
    out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
  return out


@functools.partial(jax.jit, static_argnums=0)
def encode(cfg: BertConfig, params: Any, tokens: Array, valid: Array) -> Array:
  """One embedding per row: tokens, valid [B, L] -> [B, E] float32 (cfg.pooling, cfg.normalize)."""
  hidden = Bert(cfg).apply({"params": params}, tokens, valid)
  return pool(hidden, valid, cfg.pooling, cfg.normalize)


def _abstract_boxed(cfg: BertConfig) -> Any:
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  valid = jax.ShapeDtypeStruct((1, 1), jnp.bool_)
  return jax.eval_shape(lambda: Bert(cfg).init(jax.random.key(0), jnp.zeros(tokens.shape,
                                                                             tokens.dtype),
                                               jnp.ones(valid.shape, valid.dtype)))["params"]


def param_logical_axes(cfg: BertConfig) -> Any:
  """Pytree (like params) of PartitionSpecs of logical axis names."""
  return nn.get_partition_spec(_abstract_boxed(cfg))


def abstract_params(cfg: BertConfig) -> Any:
  """Pytree of jax.ShapeDtypeStruct with the parameter shapes (nothing allocated)."""
  return nn.meta.unbox(_abstract_boxed(cfg))


def param_shardings(cfg: BertConfig, mesh: jax.sharding.Mesh) -> Any:
  """NamedShardings for the parameters on `mesh`, by the rules table in agentjax/parallel."""
  return logical_to_sharding(param_logical_axes(cfg), abstract_params(cfg), mesh)


def init_params(cfg: BertConfig, rng: Array) -> Any:
  """Random parameters (normal(0.02) embeddings and kernels, unit norms, zero biases)."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  return nn.meta.unbox(jax.jit(lambda r: Bert(cfg).init(r, tokens, tokens == 0))(rng)["params"])
