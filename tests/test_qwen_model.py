"""The Qwen port against transformers (PyTorch, float32), and its own invariants."""

from __future__ import annotations

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import masks
from agentjax.models.qwen import KVCache, Qwen, QwenConfig, init_params
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.models.qwen.config import PRESETS
from agentjax.models.qwen.model import out_major_params
from tests import hf_fixtures


def forward(cfg, params, ids, valid=None):
  ids = jnp.asarray(ids)
  valid = jnp.ones(ids.shape, bool) if valid is None else jnp.asarray(valid, bool)
  logits, _ = Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                              masks.causal_padding_mask(valid))
  return logits


# One compiled program per (config, shape); run eagerly, every primitive compiles on its own.
jit_forward = jax.jit(forward, static_argnums=0)


@pytest.mark.parametrize("name", sorted(hf_fixtures.HF_CONFIGS))
def test_logits_match_transformers(hf_checkpoint, name):
  folder, hf_model = hf_checkpoint(name)
  cfg, params = load_hf(folder)
  ids = np.random.RandomState(1).randint(0, cfg.vocab_size, (3, 17))
  ref = hf_fixtures.hf_logits(hf_model, ids)
  ours = np.asarray(jit_forward(cfg, params, ids))
  chex.assert_shape(ours, (3, 17, cfg.vocab_size))
  assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max(), np.abs(ours - ref).max()


@pytest.mark.parametrize("name", ["qwen2-tied-gqa2", "qwen3-headdim"])
def test_left_padded_batch_rows_match_alone(hf_checkpoint, name):
  folder, hf_model = hf_checkpoint(name)
  cfg, params = load_hf(folder)
  rng = np.random.RandomState(2)
  lengths = [9, 4, 6]
  width = max(lengths)
  ids = np.zeros((len(lengths), width), np.int64)
  valid = np.zeros((len(lengths), width), bool)
  rows = [rng.randint(1, cfg.vocab_size, n) for n in lengths]
  for b, row in enumerate(rows):
    ids[b, width - len(row):] = row
    valid[b, width - len(row):] = True
  batched = np.asarray(jit_forward(cfg, params, ids, valid))
  scale = np.abs(batched[valid]).max()
  for b, row in enumerate(rows):
    alone = np.asarray(jit_forward(cfg, params, row[None]))[0]
    np.testing.assert_allclose(batched[b, width - len(row):], alone, atol=1e-5 * scale)
    # and transformers agrees on the row alone
    ref = hf_fixtures.hf_logits(hf_model, row[None])[0]
    assert np.abs(alone - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.parametrize("name", sorted(hf_fixtures.HF_CONFIGS))
def test_out_major_layout_matches_transformers(hf_checkpoint, name):
  """The sampler's decode layout (kernels [out, in], untied lm_head [V, E]) computes the same
  logits, with and without a cache, and every kernel really is transposed."""
  folder, hf_model = hf_checkpoint(name)
  cfg, params = load_hf(folder)
  converted = out_major_params(params)
  layer = converted["layers_0"]
  e, d = cfg.hidden_size, cfg.head_dim
  assert layer["self_attn"]["q_proj"]["kernel"].shape == (cfg.num_heads, d, e)
  assert layer["self_attn"]["o_proj"]["kernel"].shape == (e, cfg.num_heads, d)
  assert layer["mlp"]["down_proj"]["kernel"].shape == (e, cfg.intermediate_size)
  if not cfg.tie_word_embeddings:
    assert converted["lm_head"].shape == (cfg.vocab_size, e)
  abstract = jax.eval_shape(lambda: Qwen(cfg, out_major=True).init(
      jax.random.key(0), *[jnp.zeros((1, 1), jnp.int32)] * 2,
      masks.causal_padding_mask(jnp.ones((1, 1), bool))))
  chex.assert_trees_all_equal_shapes(converted, nn.meta.unbox(abstract["params"]))
  ids = np.random.RandomState(5).randint(0, cfg.vocab_size, (2, 9))
  ref = hf_fixtures.hf_logits(hf_model, ids)
  valid = jnp.ones(ids.shape, bool)
  model = Qwen(cfg, out_major=True)
  logits, _ = model.apply({"params": converted}, jnp.asarray(ids),
                          masks.positions_from_padding(valid), masks.causal_padding_mask(valid))
  assert np.abs(np.asarray(logits) - ref).max() <= 1e-4 * np.abs(ref).max()
  # One token through a cache, projected vocab-major as the decode loop does.
  cache = KVCache.zeros(cfg, 2, 16)
  slots = jnp.tile(jnp.arange(9), (2, 1))
  key_valid = jnp.arange(16)[None] < 9
  hidden, _ = model.apply({"params": converted}, jnp.asarray(ids), slots,
                          masks.cache_mask(jnp.broadcast_to(key_valid, (2, 16)), slots),
                          cache=cache, cache_index=jnp.zeros((2,), jnp.int32), return_hidden=True)
  last = model.apply({"params": converted}, hidden[:, -1], method=Qwen.logits_vocab_major)
  assert np.abs(np.asarray(last).T - ref[:, -1]).max() <= 1e-4 * np.abs(ref).max()


class CacheDecodeTest(chex.TestCase):
  """Prefill + token-by-token decode through the KV cache equals one full forward.

  Jitted only: the same cached path runs eagerly in test_out_major_layout_matches_transformers
  (an eager run here compiled every primitive of 14 steps again, for minutes on 2 cores)."""

  @chex.variants(with_jit=True)
  def test_prefill_then_decode_equals_full_forward(self):
    for preset in ("tiny", "tiny-qwen3"):
      cfg = QwenConfig.preset(preset)
      params = init_params(cfg, jax.random.key(3))
      model = Qwen(cfg)
      rng = np.random.RandomState(3)
      prompt_lens = np.array([5, 2])
      steps, cache_len = 6, 16
      full = rng.randint(0, cfg.vocab_size, (2, 5 + steps))
      b = len(prompt_lens)

      @self.variant
      def step(params, cache, tokens, slots, key_valid):
        mask = masks.cache_mask(key_valid, slots)
        return model.apply({"params": params}, tokens, slots, mask, cache=cache,
                           cache_index=slots[:, 0])

      # Prefill: prompts right-padded into slots [0, len); each row then advances from its own len.
      width = prompt_lens.max()
      prompt = np.where(np.arange(width)[None] < prompt_lens[:, None], full[:, :width], 0)
      key_valid = np.arange(cache_len)[None] < prompt_lens[:, None]
      slots = np.tile(np.arange(width), (b, 1))
      cache = KVCache.zeros(cfg, b, cache_len)
      logits, cache = step(params, cache, jnp.asarray(prompt), jnp.asarray(slots), jnp.asarray(key_valid))
      got = {(r, p): np.asarray(logits[r, p]) for r in range(b) for p in range(prompt_lens[r])}
      for t in range(steps):
        pos = prompt_lens + t
        tokens = np.stack([[full[r, pos[r]]] for r in range(b)])
        key_valid[np.arange(b), pos] = True
        logits, cache = step(params, cache, jnp.asarray(tokens), jnp.asarray(pos[:, None]),
                             jnp.asarray(key_valid))
        for r in range(b):
          got[(r, pos[r])] = np.asarray(logits[r, 0])
      # The reference: one full forward of each row alone (right-padded to the longest: causal
      # attention never looks right, so the padding cannot change the row's logits).
      lens = prompt_lens + steps
      valid = np.arange(full.shape[1])[None] < lens[:, None]
      refs = np.asarray(jit_forward(cfg, params, full, valid))
      for r in range(b):
        n = lens[r]
        ref = refs[r, :n]
        ours = np.stack([got[(r, p)] for p in range(n)])
        chex.assert_trees_all_close(ours, ref, atol=1e-5 * np.abs(ref).max())


def test_bfloat16_compute_close_to_float32(hf_checkpoint):
  folder, _ = hf_checkpoint("qwen3-headdim")
  cfg32, params = load_hf(folder)
  ids = np.random.RandomState(4).randint(0, cfg32.vocab_size, (2, 12))
  ref = np.asarray(jit_forward(cfg32, params, ids))
  for overrides in (dict(dtype="bfloat16"), dict(dtype="bfloat16", param_dtype="bfloat16")):
    cfg16, params16 = load_hf(folder, **overrides)
    leaf = params16["layers_0"]["mlp"]["up_proj"]["kernel"]
    assert leaf.dtype == jnp.dtype(overrides["param_dtype"] if "param_dtype" in overrides else "float32")
    out = np.asarray(jit_forward(cfg16, params16, ids))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    # bfloat16 keeps 8 mantissa bits (~0.4% per rounding); a few layers stay within a few percent.
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err < 3e-2, err
    assert err > 0, "bfloat16 path did not change the numerics: is dtype ignored?"


def test_remat_policies_give_the_same_gradients():
  cfg = QwenConfig.preset("tiny")
  params = init_params(cfg, jax.random.key(5))
  ids = jnp.asarray(np.random.RandomState(5).randint(0, cfg.vocab_size, (2, 8)))

  def loss(params, cfg):
    logits = forward(cfg, params, ids)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  ref = grad(params, cfg)
  for policy in ("full", "dots", "dots_no_batch"):
    got = grad(params, cfg.replace(remat_policy=policy))
    chex.assert_trees_all_close(got, ref, atol=1e-6)


# The released checkpoints, written out independently of the preset table. Shapes: the official
# config.json of each (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim, vocab_size, tie_word_embeddings; "tie embedding" also in the
# Qwen2.5 and Qwen3 technical reports). Counts: the total published on the Hugging Face model page
# (safetensors), and the model card's rounded "Number of Parameters" and "(Non-Embedding)" in
# billions.
RELEASED = {
    "qwen2.5-0.5b": dict(config=(896, 4864, 24, 14, 2, 64, 151936, True),
                         total=494_032_768, card=("0.49", "0.36")),
    "qwen2.5-1.5b": dict(config=(1536, 8960, 28, 12, 2, 128, 151936, True),
                         total=1_543_714_304, card=("1.54", "1.31")),
    "qwen2.5-3b": dict(config=(2048, 11008, 36, 16, 2, 128, 151936, True),
                       total=3_085_938_688, card=("3.09", "2.77")),
    "qwen2.5-7b": dict(config=(3584, 18944, 28, 28, 4, 128, 152064, False),
                       total=7_615_616_512, card=("7.61", "6.53")),
    "qwen3-0.6b": dict(config=(1024, 3072, 28, 16, 8, 128, 151936, True),
                       total=596_049_920, card=("0.6", "0.44")),
    # The page's 2,031,739,904 also counts the copy of the tied embedding that this checkpoint's
    # file stores as lm_head.weight (exactly vocab * hidden more; the card says 1.7B, tied).
    "qwen3-1.7b": dict(config=(2048, 6144, 28, 16, 8, 128, 151936, True),
                       total=2_031_739_904 - 151936 * 2048, card=("1.7", "1.4")),
    "qwen3-4b": dict(config=(2560, 9728, 36, 32, 8, 128, 151936, True),
                     total=4_022_468_096, card=("4.0", "3.6")),
    "qwen3-8b": dict(config=(4096, 12288, 36, 32, 8, 128, 151936, False),
                     total=8_190_735_360, card=("8.2", "6.95")),
    "qwen3-14b": dict(config=(5120, 17408, 40, 40, 8, 128, 151936, False),
                      total=14_768_307_200, card=("14.8", "13.2")),
}


def released_param_count(qwen3, e, f, layers, heads, kv, d, vocab, tied):
  """Parameters of a Qwen2/Qwen3 decoder from its config.json values (embedding once if tied)."""
  attn = e * heads * d + 2 * e * kv * d + heads * d * e          # q, k, v, o projections
  attn += 2 * d if qwen3 else heads * d + 2 * kv * d              # q/k norms, or q/k/v biases
  layer = attn + 3 * e * f + 2 * e                                # SwiGLU MLP, two RMSNorms
  return vocab * e + layers * layer + e + (0 if tied else vocab * e)   # + final norm, lm_head


def count_params(cfg):
  """Parameters that init_params creates for cfg, from jax.eval_shape (nothing allocated)."""
  abstract = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))


def test_presets_are_the_released_models():
  """Every released-model preset has its checkpoint's config.json shapes, and the parameters our
  model code creates for it (counted with jax.eval_shape: nothing allocated) number exactly the
  published total, which the model card's rounded figures confirm."""
  released = sorted(name for name in PRESETS if not name.startswith("tiny"))
  assert released == sorted(RELEASED)   # a new preset needs its published numbers here
  for name in released:
    cfg, want = QwenConfig.preset(name), RELEASED[name]
    assert QwenConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    shapes = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
              cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings)
    assert shapes == want["config"], name
    assert (cfg.model_type == "qwen3") == name.startswith("qwen3")
    assert (cfg.qk_norm, cfg.qkv_bias) == ((True, False) if name.startswith("qwen3") else
                                           (False, True)), name
    # The model's own parameters at 1 and 2 layers give the outer and per-layer counts (a full
    # depth trace takes seconds; the depth itself is checked once below).
    one, two = (count_params(cfg.replace(num_layers=n)) for n in (1, 2))
    counted = one + (cfg.num_layers - 1) * (two - one)
    assert counted == want["total"], (name, counted, want["total"])
    assert released_param_count(name.startswith("qwen3"), *want["config"]) == want["total"], name
    assert cfg.num_params() == want["total"], name
    vocab, hidden, tied = cfg.vocab_size, cfg.hidden_size, cfg.tie_word_embeddings
    non_embedding = want["total"] - vocab * hidden * (1 if tied else 2)
    for value, card in zip((want["total"], non_embedding), want["card"]):
      # The cards round some figures and cut others (7.6156B is "7.61B"): within one last digit.
      assert abs(value / 1e9 - float(card)) < 10.0 ** -len(card.split(".")[1]), (name, value, card)
  assert count_params(QwenConfig.preset("qwen2.5-0.5b")) == RELEASED["qwen2.5-0.5b"]["total"]
