"""Attention implementations (agentjax/models/attention.py) against the materialized reference.

blockwise must equal xla_attention, forward and gradients, on every mask the project builds;
rows that see no key at all (padding queries) differ by design (0 vs the mean of all values) and
are left out of the comparisons, but must stay finite. Tiny shapes with small blocks, so that
every case runs several query and key blocks with ragged tails.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import attention as attn
from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig, abstract_params
from agentjax.rl.info_gain import packed_mask

F32_TOL = 1e-5    # relative to the largest magnitude, float32
BF16_TOL = 3e-2   # relative, bfloat16 inputs (scores and softmax in float32 in both)


def _inputs(rng, b, n, g, q_len, k_len, d=8, dtype=jnp.float32):
  """qg [B, N, Q*G, D], keys [B, N, D, K], values [B, N, K, D], cotangent weights like qg."""
  def normal(*shape):
    return jnp.asarray(rng.randn(*shape), dtype)
  return (normal(b, n, q_len * g, d), normal(b, n, d, k_len), normal(b, n, k_len, d),
          normal(b, n, q_len * g, d))


def _seeing_rows(mask, g):
  """[B, 1, M, 1] bool: the rows that see at least one key."""
  return jnp.repeat(mask.visible().any(-1), g, axis=1)[:, None, :, None]


def _rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)


def _check(mask, qg, keys, values, w, block, tol=F32_TOL, dtype=jnp.float32):
  """blockwise == xla, forward on the rows that see a key and d/d(qg, keys, values) of
  sum(out * w): over all rows for blockwise (its rows that see nothing are 0, constant: their
  weight must give finite zero gradients), over the seeing rows for xla (whose rows that see
  nothing average all values). One compiled program per case: compiles dominate the time."""
  g = qg.shape[2] // mask.q_slot.shape[1]
  rows = _seeing_rows(mask, g)

  def loss(fn, weights):
    def f(qg, keys, values):
      out = fn(qg, keys, values, mask, dtype)
      return jnp.sum(out.astype(jnp.float32) * weights), out
    return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)

  @jax.jit
  def run(qg, keys, values):
    blockwise = lambda *a: attn.blockwise_attention(*a, block=block)  # noqa: E731
    return (loss(attn.xla_attention, jnp.where(rows, w, 0.0))(qg, keys, values),
            loss(blockwise, w)(qg, keys, values))

  ((_, out_ref), ref_grads), ((_, out), grads) = run(qg, keys, values)
  assert out.dtype == jnp.dtype(dtype)
  assert _rel(jnp.where(rows, out, 0), jnp.where(rows, out_ref, 0)) <= tol
  assert not np.asarray(jnp.where(rows, 0, out)).any()  # rows that see nothing: exactly 0
  for name, a, r in zip(("d_qg", "d_keys", "d_values"), grads, ref_grads):
    assert np.isfinite(np.asarray(a, np.float32)).all(), name
    assert _rel(a, r) <= tol, (name, _rel(a, r))


@pytest.mark.parametrize("g", [1, 7])
def test_left_padded_ragged_gqa(g):
  """Ragged left padding (one row all padding: every query sees nothing), GQA 1 and 7 (GQA 2:
  the other cases), L = 21 with blocks of 8 (3 blocks, a ragged tail)."""
  rng = np.random.RandomState(g)
  valid = np.zeros((3, 21), bool)
  valid[0, 4:] = True
  valid[1, :] = True  # row 2 stays all padding
  qg, keys, values, w = _inputs(rng, 3, 2, g, 21, 21)
  _check(masks.causal_padding_mask(jnp.asarray(valid)), qg, keys, values, w, block=8)


def test_packed_segments_bf16():
  """Packed trajectories (3 segments and tail padding), block 16 over 40 slots, in float32 and
  bfloat16 (stated tolerance BF16_TOL)."""
  seg = np.zeros((2, 40), np.int32)
  seg[0, :11], seg[0, 11:30], seg[0, 30:37] = 1, 2, 3
  seg[1, :25], seg[1, 25:] = 1, 2
  mask = masks.packed_segments_mask(jnp.asarray(seg))
  _check(mask, *_inputs(np.random.RandomState(0), 2, 2, 2, 40, 40), block=16)
  _check(mask, *_inputs(np.random.RandomState(1), 2, 2, 2, 40, 40, dtype=jnp.bfloat16),
         block=16, tol=BF16_TOL, dtype=jnp.bfloat16)


def test_igpo_probe_mask():
  """IGPO's packed probes: each probe sees its trajectory's slots before its boundary (context
  pair) and itself causally."""
  rng = np.random.RandomState(3)
  valid = np.zeros((2, 19), bool)
  valid[0, :19], valid[1, :12] = True, True
  boundaries = np.array([[5, 12, 19], [3, 9, 12]], np.int32)
  probe_valid = np.ones((2, 3, 4), bool)
  probe_valid[1, 2, 3] = False
  mask = packed_mask(jnp.asarray(valid), jnp.asarray(boundaries), jnp.asarray(probe_valid))
  _check(mask, *_inputs(rng, 2, 2, 2, 31, 31), block=8)


def test_cache_extend_and_decode():
  """Keys are the cache's S = 29 slots: an extend of 5 tokens at per-row slots, and a decode
  step (Q = 1); blocks of 8."""
  rng = np.random.RandomState(4)
  key_valid = np.zeros((2, 29), bool)
  key_valid[0, 3:20], key_valid[1, :9] = True, True       # row 0 left-padded prompt
  extend = masks.cache_mask(jnp.asarray(key_valid), jnp.asarray([[15 + i for i in range(5)],
                                                                 [4 + i for i in range(5)]]))
  _check(extend, *_inputs(rng, 2, 2, 2, 5, 29), block=8)
  decode = masks.cache_mask(jnp.asarray(key_valid), jnp.asarray([[19], [8]]))
  _check(decode, *_inputs(rng, 2, 2, 2, 1, 29), block=8)


def test_shared_prefix_forward():
  """A batch-1 prefix of P = 13 slots (3 invisible) before each row's own cache: the prefix's
  keys run as the first blocks of the online softmax."""
  rng = np.random.RandomState(5)
  n, g, d = 2, 2, 8
  key_valid = np.zeros((3, 11), bool)
  key_valid[:, :7] = True
  mask = masks.cache_mask(jnp.asarray(key_valid), jnp.asarray([[4, 5, 6]] * 3))
  qg, keys, values, _ = _inputs(rng, 3, n, g, 3, 11, d)
  visible = np.ones(13, bool)
  visible[[0, 5, 12]] = False
  prefix = (jnp.asarray(rng.randn(1, n, d, 13), jnp.float32),
            jnp.asarray(rng.randn(1, n, 13, d), jnp.float32), jnp.asarray(visible))
  ref, out = jax.jit(lambda *a: (
      attn.xla_attention(*a, mask, jnp.float32, prefix),
      attn.blockwise_attention(*a, mask, jnp.float32, block=4, prefix=prefix)))(qg, keys, values)
  assert _rel(out, ref) <= F32_TOL


def test_numpy_reference_and_one_block():
  """An independent NumPy masked softmax on a probe mask, against xla and against the
  custom_vjp path with a block larger than the sequence (one block, min(block, L))."""
  rng = np.random.RandomState(6)
  valid = np.ones((1, 9), bool)
  mask = packed_mask(jnp.asarray(valid), jnp.asarray([[4, 9]], np.int32),
                     np.ones((1, 2, 3), bool))
  g, d = 3, 8
  qg, keys, values, _ = _inputs(rng, 1, 2, g, 15, 15, d)
  visible = np.repeat(np.asarray(mask.visible()), g, axis=1)[:, None]   # [B, 1, M, K]
  scores = np.einsum("bnmd,bndk->bnmk", qg, keys) / np.sqrt(d)
  scores = np.where(visible, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  ref = np.einsum("bnmk,bnkd->bnmd", probs / probs.sum(-1, keepdims=True), values)
  xla, (out, lse) = jax.jit(lambda *a: (attn.xla_attention(*a, mask, jnp.float32),
                                        attn._blockwise_forward(*a, mask, jnp.float32, 64)))(
                                            qg, keys, values)
  assert _rel(xla, ref) <= F32_TOL
  assert _rel(out, ref) <= F32_TOL
  ref_lse = np.log(np.exp(np.where(visible, scores, -np.inf)).sum(-1))
  assert _rel(lse, ref_lse) <= F32_TOL


def test_choose_implementation():
  """The dispatch table: which implementation attend runs per backend, shape, mask and dtype."""
  choose = attn.choose_implementation
  bf16 = jnp.bfloat16
  long = dict(q_len=2048, k_len=2048, block=512)
  assert choose("xla", backend="gpu", dtype=bf16, kind="causal", **long) == "xla"
  assert choose("auto", backend="cpu", dtype=bf16, **long) == "blockwise"
  assert choose("auto", backend="gpu", dtype=bf16, kind="causal", **long) == "cudnn"
  assert choose("auto", backend="tpu", dtype=bf16, kind="packed", **long) == "splash"
  # Small scores: xla whatever the backend (a decode step; one block of queries and keys).
  assert choose("auto", backend="gpu", q_len=1, k_len=8192, block=512, dtype=bf16,
                kind="causal") == "xla"
  assert choose("auto", backend="tpu", q_len=300, k_len=300, block=512, dtype=bf16,
                kind="causal") == "xla"
  # What cuDNN cannot express: another mask, float32, a prefix, a cache, or no GPU.
  for kind, dtype, prefix, backend in [("general", bf16, False, "gpu"),
                                       ("packed", bf16, False, "gpu"),
                                       ("causal", jnp.float32, False, "gpu"),
                                       ("causal", bf16, True, "gpu"),
                                       ("causal", bf16, False, "cpu"),
                                       ("causal", bf16, False, "tpu")]:
    assert choose("cudnn", backend=backend, dtype=dtype, kind=kind, has_prefix=prefix,
                  **long) == "blockwise"
  assert choose("cudnn", backend="gpu", q_len=64, k_len=4096, block=512, dtype=bf16,
                kind="causal") == "blockwise"
  # Splash: causal or packed self-attention, lengths a multiple of 128.
  assert choose("splash", backend="tpu", dtype=bf16, kind="causal", **long) == "splash"
  assert choose("splash", backend="tpu", q_len=1000, k_len=1000, block=512, dtype=bf16,
                kind="causal") == "blockwise"
  assert choose("splash", backend="tpu", dtype=bf16, kind="general", **long) == "blockwise"
  assert choose("splash", backend="cpu", dtype=bf16, kind="causal", **long) == "blockwise"
  with pytest.raises(ValueError, match="model.attention"):
    choose("flash", backend="cpu", dtype=bf16, **long)
  # window() drops the promise: its keys are no longer the queries' own tokens.
  mask = masks.causal_padding_mask(jnp.ones((1, 8), bool)).replace(kind="causal")
  assert attn.window(mask, 4).kind == "general"


def test_cudnn_layout_and_fallback():
  """cudnn_attention's layout work (heads-major transposes, left padding rotated to right
  padding and back) through jax.nn.dot_product_attention's xla implementation; and
  attend(implementation="cudnn") on CPU falls back to blockwise instead of failing."""
  rng = np.random.RandomState(7)
  valid = np.zeros((2, 20), bool)
  valid[0, 6:], valid[1, :] = True, True
  mask = masks.causal_padding_mask(jnp.asarray(valid)).replace(kind="causal")
  qg, keys, values, _ = _inputs(rng, 2, 2, 3, 20, 20)
  rows = _seeing_rows(mask, 3)
  ref, out, fallback = jax.jit(lambda *a: (
      attn.xla_attention(*a, mask, jnp.float32),
      attn.cudnn_attention(*a, mask, jnp.float32, implementation="xla"),
      attn.attend(*a, mask, dtype=jnp.float32, implementation="cudnn", block=8)))(
          qg, keys, values)
  ref = jnp.where(rows, ref, 0)
  assert _rel(jnp.where(rows, out, 0), ref) <= F32_TOL
  assert _rel(jnp.where(rows, fallback, 0), ref) <= F32_TOL


def test_splash_layout_interpret():
  """splash_attention's layout work (heads-major, q scaled, keys' segments as both segment ids)
  through the Pallas kernel in interpret mode on CPU: rows left-padded (segment 0 first) and
  packed (two segments, tail padding); forward only (the kernel's own vjp does the rest)."""
  seg = np.zeros((2, 128), np.int32)
  seg[0, 40:] = 1
  seg[1, :70], seg[1, 70:110] = 1, 2
  mask = masks.packed_segments_mask(jnp.asarray(seg)).replace(kind="packed")
  qg, keys, values, _ = _inputs(np.random.RandomState(9), 2, 1, 2, 128, 128, d=64)
  rows = _seeing_rows(mask, 2) & jnp.repeat(jnp.asarray(seg) != 0, 2, axis=1)[:, None, :, None]
  ref, out = jax.jit(lambda *a: (
      attn.xla_attention(*a, mask, jnp.float32),
      attn.splash_attention(*a, mask, jnp.float32, block=128, interpret=True)))(qg, keys, values)
  assert _rel(jnp.where(rows, out, 0), jnp.where(rows, ref, 0)) <= F32_TOL


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_qwen_blockwise_equals_xla(preset):
  """The model with attention="blockwise" (blocks of 8 over 19 tokens, remat on; one layer, to
  keep the compile short) equals "xla": logits on real tokens and the parameters' gradients,
  left-padded batch."""
  base = QwenConfig.preset(preset, remat_policy="full", attention_block=8, num_layers=1)
  rng = np.random.RandomState(8)
  # Random parameters of the model's shapes without compiling its initializer (seconds here).
  params = jax.tree.map(lambda x: jnp.asarray(0.2 * rng.randn(*x.shape), x.dtype),
                        abstract_params(base))
  valid = np.ones((2, 19), bool)
  valid[0, :7] = False
  tokens = jnp.asarray(rng.randint(0, base.vocab_size, (2, 19)), jnp.int32)
  valid = jnp.asarray(valid)
  positions, mask = masks.positions_from_padding(valid), masks.causal_padding_mask(valid)

  def run(attention):
    model = Qwen(dataclasses.replace(base, attention=attention))

    def loss(params):
      logits, _ = model.apply({"params": params}, tokens, positions, mask)
      return jnp.sum(jnp.where(valid[..., None], jax.nn.log_softmax(logits), 0.0)[..., :7]), logits
    return jax.jit(jax.grad(loss, has_aux=True))(params)

  (grads_ref, logits_ref), (grads, logits) = run("xla"), run("blockwise")
  assert _rel(jnp.where(valid[..., None], logits, 0), jnp.where(valid[..., None], logits_ref, 0)) \
      <= F32_TOL
  flat_ref = jax.tree.leaves(grads_ref)
  for got, want in zip(jax.tree.leaves(grads), flat_ref):
    assert _rel(got, want) <= F32_TOL, _rel(got, want)
