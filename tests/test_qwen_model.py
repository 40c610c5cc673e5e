"""The Qwen port against transformers (PyTorch, float32), and its own invariants."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import masks
from agentjax.models.qwen import KVCache, Qwen, QwenConfig, abstract_params, init_params
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.models.qwen.model import out_major_params
from tests import hf_fixtures


def forward(cfg, params, ids, valid=None):
  ids = jnp.asarray(ids)
  valid = jnp.ones(ids.shape, bool) if valid is None else jnp.asarray(valid, bool)
  logits, _ = Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                              masks.causal_padding_mask(valid))
  return logits


@pytest.mark.parametrize("name", sorted(hf_fixtures.HF_CONFIGS))
def test_logits_match_transformers(hf_checkpoint, name):
  folder, hf_model = hf_checkpoint(name)
  cfg, params = load_hf(folder)
  ids = np.random.RandomState(1).randint(0, cfg.vocab_size, (3, 17))
  ref = hf_fixtures.hf_logits(hf_model, ids)
  ours = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, ids))
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
  batched = np.asarray(forward(cfg, params, ids, valid))
  scale = np.abs(batched[valid]).max()
  for b, row in enumerate(rows):
    alone = np.asarray(forward(cfg, params, row[None]))[0]
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
      jax.random.key(0), *[jnp.zeros((1, 1), jnp.int32)] * 2, jnp.ones((1, 1, 1), bool)))
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
  """Prefill + token-by-token decode through the KV cache equals one full forward."""

  @chex.variants(with_jit=True, without_jit=True)
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
      for r in range(b):
        n = prompt_lens[r] + steps
        ref = np.asarray(forward(cfg, params, full[r:r + 1, :n]))[0]
        ours = np.stack([got[(r, p)] for p in range(n)])
        chex.assert_trees_all_close(ours, ref, atol=1e-5 * np.abs(ref).max())


def test_bfloat16_compute_close_to_float32(hf_checkpoint):
  folder, _ = hf_checkpoint("qwen3-headdim")
  cfg32, params = load_hf(folder)
  ids = np.random.RandomState(4).randint(0, cfg32.vocab_size, (2, 12))
  ref = np.asarray(forward(cfg32, params, ids))
  for overrides in (dict(dtype="bfloat16"), dict(dtype="bfloat16", param_dtype="bfloat16")):
    cfg16, params16 = load_hf(folder, **overrides)
    leaf = params16["layers_0"]["mlp"]["up_proj"]["kernel"]
    assert leaf.dtype == jnp.dtype(overrides["param_dtype"] if "param_dtype" in overrides else "float32")
    out = np.asarray(forward(cfg16, params16, ids))
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

  ref = jax.grad(loss)(params, cfg)
  for policy in ("full", "dots", "dots_no_batch"):
    got = jax.jit(jax.grad(loss), static_argnums=1)(params, cfg.replace(remat_policy=policy))
    chex.assert_trees_all_close(got, ref, atol=1e-6)


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
                                    "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"])
def test_presets_have_the_released_shapes(preset):
  """Each preset, written as config.json, builds a transformers model with the same parameter
  count as ours (on the meta device: no memory), and reads back to the same config."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM

  cfg = QwenConfig.preset(preset)
  assert QwenConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
  hf_cfg = AutoConfig.for_model(**cfg.to_hf_dict())
  with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(hf_cfg)
  assert model.num_parameters() == cfg.num_params()
  sizes = jax.tree.leaves(jax.tree.map(lambda x: int(np.prod(x.shape)), abstract_params(cfg)))
  assert sum(sizes) == cfg.num_params()
