"""Flax (linen) port of the Qwen2 / Qwen2.5 / Qwen3 decoder, numerically matching transformers.

One module serves training and sampling:

  logits, cache = Qwen(cfg).apply({"params": params}, tokens, positions, mask)            # training
  hidden, cache = Qwen(cfg).apply(..., cache=cache, cache_index=index, return_hidden=True)  # sampling
  logits = Qwen(cfg).apply({"params": params}, hidden_at_some_positions, method=Qwen.logits)

Shapes: B batch, Q query tokens in this call, K keys (= Q without a cache, = S cache slots with
one), E hidden, H query heads, N kv heads, G = H / N, D head_dim, V vocab.

The KV cache is an explicit pytree (`KVCache`) passed in and returned, with a per-sequence write
position `cache_index` [B], so rows of a batch advance independently. Parameters are a plain
pytree (no flax boxes); their logical axis names come from `param_logical_axes(cfg)`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from agentjax.models import attention as attention_lib
from agentjax.models import lora as lora_lib
from agentjax.models.attention import AttentionMask
from agentjax.models.lora import INDEX_LEAF, LoraSpec, lora_delta
from agentjax.models.qwen.config import QwenConfig
from agentjax.parallel import constrain, logical_to_sharding

Array = jax.Array
_F32 = jnp.float32

_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _dtype(name: str):
  return jnp.dtype(name)


def _init(std: float, axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


@flax.struct.dataclass
class KVCache:
  """Per-layer key buffers [B, N, D, S] and value buffers [B, N, S, D].

  Heads before slots: a decode step's attention is a batched matmul over (b, n) with no per-step
  transpose of the cache. Keys are stored transposed (slots minor) because q . K^T then runs as
  a plain [G, D] x [D, S] product per (b, n): on XLA:CPU a decode step's attention (0.5B shape,
  batch 16, 512 slots) took 0.75 ms a layer this way against 1.4 ms with keys [S, D]. Values
  stay [S, D] for probs . V.
  """

  keys: tuple[Array, ...]
  values: tuple[Array, ...]

  KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_length")
  VALUE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")

  @classmethod
  def zeros(cls, cfg: QwenConfig, batch: int, length: int, dtype: Any = None) -> "KVCache":
    n, d = cfg.num_kv_heads, cfg.head_dim
    dtype = dtype or _dtype(cfg.dtype)
    return cls(keys=tuple(jnp.zeros((batch, n, d, length), dtype) for _ in range(cfg.num_layers)),
               values=tuple(jnp.zeros((batch, n, length, d), dtype)
                            for _ in range(cfg.num_layers)))

  @property
  def length(self) -> int:
    return self.values[0].shape[2]

  def logical_axes(self) -> "KVCache":
    key_spec = jax.sharding.PartitionSpec(*self.KEY_AXES)
    value_spec = jax.sharding.PartitionSpec(*self.VALUE_AXES)
    return KVCache(keys=tuple(key_spec for _ in self.keys),
                   values=tuple(value_spec for _ in self.values))


class Linear(nn.Module):
  """y = x . kernel (+ bias), contracting x's last `in_dims` dims with the kernel's in-dims.

  kernel [*in_shape, *features] and bias [*features] carry logical axis names. (Our own layer
  rather than nn.DenseGeneral, which initializes a flattened kernel that cannot take per-dim
  logical names once a mesh is set.)

  out_major=True takes the kernel as [*features, *in_shape] (see `out_major_params`) and computes
  kernel . x^T, the layout in which XLA:CPU multiplies a few rows (a decode step) ~1.5x faster.

  lora: stacked low-rank adapters beside the kernel (agentjax/models/lora.py): lora_a
  [A, *in_shape, r], lora_b [A, r, *features]; `lora_index` (scalar int32) picks one, -1 none.
  """

  features: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  in_dims: int = 1
  use_bias: bool = False
  bias_axes: tuple[str, ...] = ()
  dtype: Any = _F32
  param_dtype: Any = _F32
  out_major: bool = False
  lora: LoraSpec | None = None

  @nn.compact
  def __call__(self, x: Array, lora_index: Array | None = None) -> Array:
    in_shape = x.shape[x.ndim - self.in_dims:]
    features = tuple(self.features)
    x_in = tuple(range(x.ndim - self.in_dims, x.ndim))
    x = x.astype(self.dtype)
    if self.out_major:
      axes = self.kernel_axes[self.in_dims:] + self.kernel_axes[:self.in_dims]
      kernel = self.param("kernel", _init(0.02, axes), features + in_shape, self.param_dtype)
      k_in = tuple(range(len(features), kernel.ndim))
      y = lax.dot_general(kernel.astype(self.dtype), x, ((k_in, x_in), ((), ())))  # [*F, *batch]
      y = jnp.moveaxis(y, tuple(range(len(features))), tuple(range(-len(features), 0)))
    else:
      kernel = self.param("kernel", _init(0.02, self.kernel_axes), in_shape + features,
                          self.param_dtype)
      y = lax.dot_general(x, kernel.astype(self.dtype),
                          ((x_in, tuple(range(self.in_dims))), ((), ())))
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                        tuple(self.features), self.param_dtype)
      y = y + bias.astype(self.dtype)
    if self.lora is not None:
      y = y + self._lora(x, in_shape, features, lora_index)
    return y

  def _lora(self, x: Array, in_shape: tuple[int, ...], features: tuple[int, ...],
            lora_index: Array | None) -> Array:
    spec = self.lora
    n, r = len(spec.names), spec.rank
    in_axes, out_axes = self.kernel_axes[:self.in_dims], self.kernel_axes[self.in_dims:]
    # PEFT's kaiming_uniform(a=sqrt(5)) on A: uniform(+-1/sqrt(fan_in)), fan_in = prod(in_shape)
    # (variance_scaling's uniform limit is sqrt(3 * scale / fan_in)). Adapters stay float32
    # whatever param_dtype is: Adam's small steps on a bf16 adapter would round away.
    init_a = nn.initializers.variance_scaling(
        1 / 3, "fan_in", "uniform", in_axis=tuple(range(1, 1 + self.in_dims)), out_axis=-1,
        batch_axis=(0,))
    a = self.param("lora_a", nn.with_logical_partitioning(
        init_a, ("adapters",) + in_axes + ("lora_rank",)), (n,) + in_shape + (r,), _F32)
    b = self.param("lora_b", nn.with_logical_partitioning(
        nn.initializers.zeros, ("adapters", "lora_rank") + out_axes), (n, r) + features, _F32)
    if lora_index is None:
      raise ValueError(f"{self.name}: a LoRA model needs lora_index (see models/lora.attach)")
    return lora_delta(x, a, b, lora_index, spec.scale, self.in_dims, self.dtype)


class RMSNorm(nn.Module):
  """RMSNorm in float32, scaled after casting back (as transformers' Qwen2RMSNorm)."""

  eps: float
  axis_name: str = "norm"
  param_dtype: Any = _F32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(_F32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * y.astype(x.dtype)


def rope_cos_sin(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
  """Rotary tables for explicit positions. positions [B, Q] -> cos, sin [B, Q, D] in float32."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=_F32) / head_dim))
  freqs = positions.astype(_F32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotate-half RoPE. x [B, Q, heads, D]; cos, sin [B, Q, D]."""
  x32 = x.astype(_F32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
  return out.astype(x.dtype)


def _write_cache(buffer: Array, new: Array, index: Array, slot_axis: int) -> Array:
  """Writes new [B, Q, N, D] into a cache buffer at slots index[b] + q along `slot_axis`
  (values [B, N, S, D]: 2; keys [B, N, D, S]: 3).

  A scatter rather than dynamic_update_slice: slots past the end are dropped, where
  dynamic_update_slice would clamp the start and overwrite live slots of a full row.
  """
  slots = index[:, None] + jnp.arange(new.shape[1], dtype=index.dtype)[None]   # [B, Q]
  where = [jnp.arange(buffer.shape[0])[:, None], slice(None), slice(None), slice(None)]
  where[slot_axis] = slots  # (rows, slots) index [B, Q]; the sliced N, D dims follow: [B, Q, N, D]
  return buffer.at[tuple(where)].set(new.astype(buffer.dtype), mode="drop")


def _lora_for(lora: LoraSpec | None, name: str) -> LoraSpec | None:
  """The spec for projection `name`: the model's, if it is one of its targets."""
  return lora if lora is not None and name in lora.targets else None


class Attention(nn.Module):
  cfg: QwenConfig
  out_major: bool = False
  lora: LoraSpec | None = None

  @nn.compact
  def __call__(self, x: Array, cos: Array, sin: Array, mask: AttentionMask,
               kv: tuple[Array, Array] | None, cache_index: Array | None,
               prefix: tuple[Array, Array, Array] | None = None,
               lora_index: Array | None = None, kv_window: int | None = None):
    """mask: what each query sees (models/attention.py; keys = this call's tokens, or the cache
    slots). prefix: optional (keys [1, N, D, P], values [1, N, P, D], visible [P] bool), a cache
    shared by every row and placed before each row's own keys (see Qwen.__call__). kv_window:
    attend over the first kv_window cache slots only (the rest must be invisible)."""
    cfg = self.cfg
    dtype, pdtype = _dtype(cfg.dtype), _dtype(cfg.param_dtype)
    b, q_len, _ = x.shape
    n, g, d = cfg.num_kv_heads, cfg.num_groups, cfg.head_dim

    def proj(heads, name, heads_axis):
      return Linear((heads, d), ("embed", heads_axis, "head_dim"), use_bias=cfg.qkv_bias,
                    bias_axes=(heads_axis, "head_dim"), dtype=dtype, param_dtype=pdtype,
                    out_major=self.out_major, lora=_lora_for(self.lora, name),
                    name=name)(x, lora_index)

    q = proj(cfg.num_heads, "q_proj", "heads")    # [B, Q, H, D]
    k = proj(n, "k_proj", "kv_heads")             # [B, Q, N, D]
    v = proj(n, "v_proj", "kv_heads")
    if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, before RoPE
      q = RMSNorm(cfg.rms_norm_eps, "head_dim", pdtype, name="q_norm")(q)
      k = RMSNorm(cfg.rms_norm_eps, "head_dim", pdtype, name="k_norm")(k)
    q = constrain(apply_rope(q, cos, sin), ("batch", "length", "heads", "head_dim"))
    k = apply_rope(k, cos, sin)

    if kv is not None:
      keys = constrain(_write_cache(kv[0], k, cache_index, 3), KVCache.KEY_AXES)      # [B,N,D,S]
      values = constrain(_write_cache(kv[1], v, cache_index, 2), KVCache.VALUE_AXES)  # [B,N,S,D]
      new_kv = (keys, values)
      if kv_window is not None and kv_window < keys.shape[3]:
        # Decode reads only the live context: a static window of the first slots (the host
        # picks it from a short ladder, so a handful of programs cover every length).
        keys, values = keys[..., :kv_window], values[:, :, :kv_window]
        mask = attention_lib.window(mask, kv_window)
    else:  # the cache layouts, over this call's tokens: keys [B, N, D, Q], values [B, N, Q, D]
      keys, values, new_kv = jnp.transpose(k, (0, 2, 3, 1)), jnp.swapaxes(v, 1, 2), None

    # GQA without repeating K/V: the G query heads sharing a KV head become rows of one batched
    # matmul per (b, n), m = q * G + g. With the cache layouts this needs no transpose of the
    # cache (decode reads it once).
    qg = q.reshape(b, q_len, n, g, d).transpose(0, 2, 1, 3, 4).reshape(b, n, q_len * g, d)
    out = attention_lib.attend(qg, keys, values, mask, dtype=dtype,
                               implementation=cfg.attention, block=cfg.attention_block,
                               prefix=prefix)                               # [B, N, Q*G, D]
    out = out.reshape(b, n, q_len, g, d).transpose(0, 2, 1, 3, 4).reshape(b, q_len, n * g, d)
    out = Linear((cfg.hidden_size,), ("heads", "head_dim", "embed"), in_dims=2, dtype=dtype,
                 param_dtype=pdtype, out_major=self.out_major,
                 lora=_lora_for(self.lora, "o_proj"), name="o_proj")(out, lora_index)
    return out, new_kv


class MLP(nn.Module):
  cfg: QwenConfig
  out_major: bool = False
  lora: LoraSpec | None = None

  @nn.compact
  def __call__(self, x: Array, lora_index: Array | None = None) -> Array:
    cfg = self.cfg
    dtype, pdtype = _dtype(cfg.dtype), _dtype(cfg.param_dtype)

    def dense(features, name, axes):
      return functools.partial(Linear((features,), axes, dtype=dtype, param_dtype=pdtype,
                                      out_major=self.out_major,
                                      lora=_lora_for(self.lora, name), name=name),
                               lora_index=lora_index)

    gate = dense(cfg.intermediate_size, "gate_proj", ("embed", "mlp"))(x)
    up = dense(cfg.intermediate_size, "up_proj", ("embed", "mlp"))(x)
    h = constrain(nn.silu(gate) * up, ("batch", "length", "mlp"))
    return dense(cfg.hidden_size, "down_proj", ("mlp", "embed"))(h)


class DecoderLayer(nn.Module):
  cfg: QwenConfig
  out_major: bool = False
  lora: LoraSpec | None = None

  @nn.compact
  def __call__(self, x, cos, sin, mask, kv, cache_index, prefix=None, lora_index=None,
               kv_window=None):
    cfg = self.cfg
    pdtype = _dtype(cfg.param_dtype)
    h, new_kv = Attention(cfg, self.out_major, self.lora, name="self_attn")(
        RMSNorm(cfg.rms_norm_eps, "norm", pdtype, name="input_layernorm")(x),
        cos, sin, mask, kv, cache_index, prefix, lora_index, kv_window)
    x = x + h
    x = x + MLP(cfg, self.out_major, self.lora, name="mlp")(
        RMSNorm(cfg.rms_norm_eps, "norm", pdtype, name="post_attention_layernorm")(x),
        lora_index)
    return constrain(x, ("batch", "length", "embed")), new_kv


class Qwen(nn.Module):
  """The Qwen causal LM. See the module docstring for the calling conventions.

  out_major=True takes parameters in the layout `out_major_params` gives (projection kernels
  [out, in]); the sampler's decode loop uses it. The default is the checkpoint layout.

  lora: named low-rank adapters on the projections in lora.targets (agentjax/models/lora.py);
  the params then also hold the stacked lora_a / lora_b leaves and the scalar int32
  `lora_index`, the adapter every call uses (-1: the bare backbone). Build them with
  `lora.attach(backbone, adapters, spec, name)`.

  with_lm_head=False: the decoder alone (no `lm_head` param, `logits` refused), the trunk of a
  value model (agentjax/models/qwen/value.py) that reads only the hidden states.
  """

  cfg: QwenConfig
  out_major: bool = False
  lora: LoraSpec | None = None
  with_lm_head: bool = True

  def setup(self):
    cfg = self.cfg
    pdtype = _dtype(cfg.param_dtype)
    self.embed_tokens = self.param("embed_tokens", _init(0.02, ("vocab", "embed")),
                                   (cfg.vocab_size, cfg.hidden_size), pdtype)
    if self.lora is not None:
      self.lora_index = self.param(
          INDEX_LEAF, nn.with_logical_partitioning(lambda *_: jnp.int32(0), ()), ())
    layer_cls = DecoderLayer
    if cfg.remat_policy != "none":
      # kv_window (argument 9, counting the module) is a Python int: static.
      layer_cls = nn.remat(DecoderLayer, policy=_REMAT_POLICIES[cfg.remat_policy],
                           static_argnums=(9,))
    self.layers = [layer_cls(cfg, self.out_major, self.lora, name=f"layers_{i}")
                   for i in range(cfg.num_layers)]
    self.norm = RMSNorm(cfg.rms_norm_eps, "norm", pdtype)
    if not self.with_lm_head or cfg.tie_word_embeddings:
      return  # no head matrix: a trunk, or a tied model whose head is the embedding
    if self.out_major:
      self.lm_head = self.param("lm_head", _init(0.02, ("vocab", "embed")),
                                (cfg.vocab_size, cfg.hidden_size), pdtype)
    else:
      self.lm_head = self.param("lm_head", _init(0.02, ("embed", "vocab")),
                                (cfg.hidden_size, cfg.vocab_size), pdtype)

  def __call__(self, tokens: Array, positions: Array, attention_mask: AttentionMask,
               cache: KVCache | None = None, cache_index: Array | None = None,
               return_hidden: bool = False, prefix: KVCache | None = None,
               prefix_mask: Array | None = None,
               kv_window: int | None = None) -> tuple[Array, KVCache | None]:
    """Runs the decoder.

    Args:
      tokens: [B, Q] int32 token ids.
      positions: [B, Q] int32 position ids (RoPE), explicit so that padding and packing are free.
      attention_mask: an AttentionMask (agentjax/models/masks.py builds them): per-query [B, Q]
        and per-key [B, K] segments and slots; K = Q without a cache, K = cache length S with one.
      cache: optional KVCache (keys [B, N, D, S], values [B, N, S, D]); this call's keys/values are written into it.
      cache_index: [B] int32, the slot where each row's first token of this call is written.
      return_hidden: return the final-norm hidden states [B, Q, E] instead of logits, so that a
        sampler projects only the positions it samples from (see `logits`).
      prefix: optional KVCache of batch 1 (keys [1, N, D, P], values [1, N, P, D]) shared by
        every row: each query attends to its visible slots, then to its own K keys (a prompt
        prefix common to a batch, read once for all rows; `positions` must count it).
      prefix_mask: [P] bool, the prefix slots every query sees (required with `prefix`).
      kv_window: with a cache, attend over its first kv_window slots only (static; every slot
        a query sees must lie below it): decode reads the live context, not the whole budget.
    Returns:
      (logits [B, Q, V] float32, or hidden [B, Q, E]), and the updated cache (None without one).
    """
    cfg = self.cfg
    if cache is not None and cache_index is None:
      raise ValueError("cache_index [B] is required when a cache is given")
    if not isinstance(attention_mask, AttentionMask):
      raise TypeError("attention_mask must be an AttentionMask (agentjax/models/masks.py: "
                      f"causal_padding_mask, cache_mask, ...), got {type(attention_mask).__name__}")
    if (prefix is None) != (prefix_mask is None):
      raise ValueError("prefix and prefix_mask [P] must be given together")
    # mode="clip": an out-of-range id (padding garbage) must not put NaN into the row, since
    # masked attention still multiplies its value by 0.
    x = jnp.take(self.embed_tokens, tokens, axis=0, mode="clip").astype(_dtype(cfg.dtype))
    x = constrain(x, ("batch", "length", "embed"))
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    keys, values = [], []
    for i, layer in enumerate(self.layers):
      kv = None if cache is None else (cache.keys[i], cache.values[i])
      shared = None if prefix is None else (prefix.keys[i], prefix.values[i], prefix_mask)
      x, new_kv = layer(x, cos, sin, attention_mask, kv, cache_index, shared,
                        self.lora_index if self.lora is not None else None, kv_window)
      if new_kv is not None:
        keys.append(new_kv[0])
        values.append(new_kv[1])
    hidden = self.norm(x)
    new_cache = KVCache(tuple(keys), tuple(values)) if cache is not None else None
    if return_hidden:
      return hidden, new_cache
    return self.logits(hidden), new_cache

  def _head(self) -> tuple[Array, str]:
    """The LM head matrix and its einsum letters: "ve" for [V, E] (tied embeddings, or the
    out-major lm_head), "ev" for the checkpoint's untied [E, V]."""
    if not self.with_lm_head:
      raise ValueError("Qwen(with_lm_head=False) has no LM head: it returns hidden states only "
                       "(call it with return_hidden=True)")
    if self.cfg.tie_word_embeddings:
      return self.embed_tokens, "ve"
    return self.lm_head, "ve" if self.out_major else "ev"

  def logits(self, hidden: Array) -> Array:
    """LM head: hidden [..., E] -> logits [..., V] in float32 (accumulated in float32)."""
    dtype = _dtype(self.cfg.dtype)
    head, letters = self._head()
    return jnp.einsum(f"...e,{letters}->...v", hidden.astype(dtype), head.astype(dtype),
                      preferred_element_type=_F32)

  def logits_vocab_major(self, hidden: Array) -> Array:
    """LM head for a few rows, vocab-major: hidden [B, E] -> logits [V, B] float32.

    The decode loop uses this layout: on CPU the [V, E] x [E, B] product streams the vocabulary
    matrix once at near copy speed, while the [B, V] product runs ~40% slower.
    """
    dtype = _dtype(self.cfg.dtype)
    head, letters = self._head()
    return jnp.einsum(f"{letters},be->vb", head.astype(dtype), hidden.astype(dtype),
                      preferred_element_type=_F32)


# --------------------------------------------------------------------------- parameters


def out_major_params(params: Any) -> Any:
  """Parameters for Qwen(cfg, out_major=True): every projection kernel [*in, *out] becomes
  [*out, *in] (o_proj has two in-dims, heads and head_dim), an untied lm_head [E, V] becomes
  [V, E]; every other leaf is returned as it is (the same array, not a copy), so call this
  outside jit: a jit output is a fresh buffer even when it equals an input, and the tied
  embedding alone is 0.5 GB for the 0.5B model. The converted leaves are made by one program
  (_transpose_kernels; eagerly, one per kernel shape).

  A decode step multiplies a few rows by each kernel; XLA:CPU does that ~1.5x faster with the
  kernel out-major (measured in launch/bench.py decode). The sampler converts once per `generate`
  call, outside its token loop (`sampling.decode_layout`).
  """

  def in_dims(path) -> int:  # 0: kept as it is; -1: lm_head's transpose
    names = [getattr(k, "key", None) for k in path]
    if names[-1] == "lm_head":
      return -1
    if names[-1] != "kernel":
      return 0
    return 2 if "o_proj" in names else 1  # each Linear's in_dims (see Attention, MLP)

  paths, treedef = jax.tree_util.tree_flatten_with_path(params)
  dims = tuple(in_dims(path) for path, _ in paths)
  leaves = [leaf for _, leaf in paths]
  moved = iter(_transpose_kernels(tuple(x for x, d in zip(leaves, dims) if d),
                                  tuple(d for d in dims if d)))
  return jax.tree_util.tree_unflatten(treedef, [next(moved) if d else x
                                                for x, d in zip(leaves, dims)])


@functools.partial(jax.jit, static_argnums=1)
def _transpose_kernels(kernels: tuple, dims: tuple[int, ...]) -> tuple:
  """Each kernel with its first dims[i] axes moved last (dims -1: a transpose), in one program."""
  return tuple(x.T if d < 0 else jnp.moveaxis(x, tuple(range(d)), tuple(range(-d, 0)))
               for x, d in zip(kernels, dims))


def _dummy_inputs():
  tokens = jnp.zeros((1, 1), jnp.int32)
  one = jnp.ones((1, 1), jnp.int32)
  return tokens, tokens, AttentionMask(q_segment=one, q_slot=tokens, k_segment=one, k_slot=tokens)


def _abstract_boxed(cfg: QwenConfig, lora: LoraSpec | None = None):
  return jax.eval_shape(lambda r: Qwen(cfg, lora=lora).init(r, *_dummy_inputs())["params"],
                        jax.random.key(0))


def param_logical_axes(cfg: QwenConfig, lora: LoraSpec | None = None) -> Any:
  """Pytree (like params) of PartitionSpecs of logical axis names (with `lora`: of the LoRA
  model's params, stacked adapters and lora_index included)."""
  return nn.get_partition_spec(_abstract_boxed(cfg, lora))


def abstract_params(cfg: QwenConfig, lora: LoraSpec | None = None) -> Any:
  """Pytree of jax.ShapeDtypeStruct with the parameter shapes (nothing allocated)."""
  return nn.meta.unbox(_abstract_boxed(cfg, lora))


def param_shardings(cfg: QwenConfig, mesh: jax.sharding.Mesh,
                    lora: LoraSpec | None = None) -> Any:
  """NamedShardings for the parameters on `mesh`, by the rules table in agentjax/parallel."""
  return logical_to_sharding(param_logical_axes(cfg, lora), abstract_params(cfg, lora), mesh)


def init_params(cfg: QwenConfig, rng: Array, mesh: jax.sharding.Mesh | None = None) -> Any:
  """Random parameters (normal(0.02) matrices, unit norms, zero biases), created sharded."""
  return _jitted_init(cfg, mesh)(rng)


@functools.lru_cache(maxsize=None)
def _jitted_init(cfg: QwenConfig, mesh: jax.sharding.Mesh | None):
  """One compiled initializer per (config, mesh): a new jit per call would recompile every time."""

  def init(r):
    return nn.meta.unbox(Qwen(cfg).init(r, *_dummy_inputs())["params"])

  shardings = param_shardings(cfg, mesh) if mesh is not None else None
  return jax.jit(init, out_shardings=shardings)


# --------------------------------------------------------------------------- adapters


def adapter_abstract(cfg: QwenConfig, lora: LoraSpec) -> Any:
  """One adapter's tree of ShapeDtypeStructs: lora_a [*in, r], lora_b [r, *out] per target."""
  return lora_lib.adapter_template(abstract_params(cfg, lora))


def adapter_shardings(cfg: QwenConfig, lora: LoraSpec, mesh: jax.sharding.Mesh) -> Any:
  """NamedShardings of one adapter's tree: in/out dims sharded like the kernels they adapt."""
  axes = lora_lib.adapter_logical_axes(param_logical_axes(cfg, lora))
  return logical_to_sharding(axes, adapter_abstract(cfg, lora), mesh)


def init_adapters(cfg: QwenConfig, lora: LoraSpec, rng: Array,
                  mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Fresh adapters {name: tree} (A uniform(+-1/sqrt(fan_in)), B zero), created sharded.

  The LoRA model's initializer runs under jit with only the adapter leaves as outputs, so the
  backbone's initialization is dead code and is never allocated."""
  return _jitted_adapter_init(cfg, lora, mesh)(rng)


@functools.lru_cache(maxsize=None)
def _jitted_adapter_init(cfg: QwenConfig, lora: LoraSpec, mesh: jax.sharding.Mesh | None):
  template = adapter_abstract(cfg, lora)

  def init(r):
    full = nn.meta.unbox(Qwen(cfg, lora=lora).init(r, *_dummy_inputs())["params"])
    stacked = lora_lib.select_like(template, full)  # the lora leaves only
    return {name: jax.tree.map(lambda x, i=i: x[i], stacked)
            for i, name in enumerate(lora.names)}

  shardings = None
  if mesh is not None:
    one = adapter_shardings(cfg, lora, mesh)
    shardings = {name: one for name in lora.names}
  return jax.jit(init, out_shardings=shardings)
