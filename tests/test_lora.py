"""LoRA at the model and sampler level: the adapted projection against a NumPy reference, zero-init
adapters, gradients, several adapters in one program, decode with adapters, sharding, the backbone
fingerprint and LoraSpec's errors. (Training, checkpoints and PEFT interop are tested elsewhere.)
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.compiles import CompileCounter
from agentjax.models import lora as lora_lib
from agentjax.models import masks
from agentjax.models.lora import LoraSpec, attach, fingerprint, merge, merge_selected
from agentjax.models.qwen import Qwen, QwenConfig, adapter_abstract, init_adapters, init_params
from agentjax.models.qwen.model import Linear
from agentjax.sampling import (SamplingParams, StopTable, decode_layout, extend, generate,
                               init_state)
from tests.test_sharding import run_with_fake_devices

SPEC = LoraSpec(names=("searcher", "generator"), rank=4, alpha=8.0)  # scale 2


def leaves_with_paths(tree):
  """[(("layers_0", ..., "lora_a"), leaf)] of a nested dict."""
  return [(tuple(k.key for k in path), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def random_b(adapters, seed, std=0.5):
  """The adapters with every lora_b drawn from N(0, std) (a fresh adapter's B is 0: no effect)."""
  rng = np.random.RandomState(seed)

  def draw(path, x):
    if path[-1].key != "lora_b":
      return x
    return jnp.asarray(rng.normal(0.0, std, x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(draw, adapters)


def batch(cfg, seed=0):
  """ids [2, 10] with row 1 left-padded by 4: (ids, positions, mask, valid)."""
  rng = np.random.RandomState(seed)
  ids = jnp.asarray(rng.randint(0, cfg.vocab_size, (2, 10)), jnp.int32)
  valid = np.ones((2, 10), bool)
  valid[1, :4] = False
  valid = jnp.asarray(valid)
  return ids, masks.positions_from_padding(valid), masks.causal_padding_mask(valid), valid


def forward(model, params, ids, positions, mask):
  return model.apply({"params": params}, ids, positions, mask)[0]


_forward = jax.jit(forward, static_argnums=0)


# --------------------------------------------------------------------------- 1. one projection


def np_linear(x, kernel, bias, a, b, index, scale, in_dims):
  """NumPy float64: y = x . W + bias + scale . (x . A[index]) . B[index] (no delta for index -1).

  x [..., *in]; kernel [*in, *out]; bias [*out] or None; a [A, *in, r]; b [A, r, *out]."""
  x = np.asarray(x, np.float64)
  axes = (list(range(x.ndim - in_dims, x.ndim)), list(range(in_dims)))
  y = np.tensordot(x, np.asarray(kernel, np.float64), axes=axes)
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  if index >= 0:
    xa = np.tensordot(x, np.asarray(a[index], np.float64), axes=axes)            # [..., r]
    y = y + scale * np.tensordot(xa, np.asarray(b[index], np.float64), axes=1)   # [..., *out]
  return y


@pytest.mark.parametrize("out_major", [False, True])
@pytest.mark.parametrize("kind", ["q_proj", "o_proj"])
def test_linear_with_adapters_equals_numpy_reference(kind, out_major):
  # q_proj: [E] -> [H, D] with a bias; o_proj: two contracted dims [H, D] -> [E]. out_major is the
  # CPU decode layout the "unmerged" sampler runs (kernel [*out, *in], adapters as they are).
  e, h, d = 8, 3, 4
  if kind == "q_proj":
    in_shape, features, axes, use_bias = (e,), (h, d), ("embed", "heads", "head_dim"), True
  else:
    in_shape, features, axes, use_bias = (h, d), (e,), ("heads", "head_dim", "embed"), False
  in_dims = len(in_shape)
  spec = LoraSpec(names=("one", "two", "three"), rank=2, alpha=5.0)  # scale 2.5, not 1 or rank
  rng = np.random.RandomState(0)
  kernel = rng.normal(0, 0.3, in_shape + features).astype(np.float32)
  bias = rng.normal(0, 0.3, features).astype(np.float32) if use_bias else None
  a = rng.normal(0, 0.5, (3,) + in_shape + (2,)).astype(np.float32)
  b = rng.normal(0, 0.5, (3, 2) + features).astype(np.float32)
  x = rng.normal(0, 1.0, (2, 5) + in_shape).astype(np.float32)

  layer = Linear(features, axes, in_dims=in_dims, use_bias=use_bias, bias_axes=axes[in_dims:],
                 out_major=out_major, lora=spec)
  stored = np.moveaxis(kernel, tuple(range(in_dims)), tuple(range(-in_dims, 0))) if out_major \
      else kernel
  params = {"kernel": stored, "lora_a": a, "lora_b": b}
  if use_bias:
    params["bias"] = bias
  shapes = nn.meta.unbox(
      jax.eval_shape(lambda: layer.init(jax.random.key(0), x, jnp.int32(0)))["params"])
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(np.shape, params)

  apply = jax.jit(lambda p, x, i: layer.apply({"params": p}, x, i))
  outs = {}
  for index in (-1, 0, 1, 2):
    outs[index] = np.asarray(apply(params, x, jnp.int32(index)))
    want = np_linear(x, kernel, bias, a, b, index, 2.5, in_dims)
    assert outs[index].shape == (2, 5) + features
    np.testing.assert_allclose(outs[index], want, rtol=1e-5, atol=1e-5, err_msg=str(index))
  assert apply._cache_size() == 1  # the index is data
  # The adapters' deltas are large and distinct here, so the comparisons above are not vacuous.
  assert np.abs(outs[0] - outs[1]).max() > 0.1 and np.abs(outs[0] - outs[-1]).max() > 0.1


def test_linear_with_adapters_needs_an_index():
  layer = Linear((4,), ("embed", "mlp"), lora=SPEC, name="up_proj")
  x = jnp.ones((1, 3))
  with pytest.raises(ValueError, match="up_proj.*lora_index"):
    layer.init(jax.random.key(0), x)


# --------------------------------------------------------------------------- 2. zero init


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_fresh_adapters_give_the_bare_backbone_logits(preset):
  cfg = QwenConfig.preset(preset)
  backbone = init_params(cfg, jax.random.key(0))
  adapters = init_adapters(cfg, SPEC, jax.random.key(1))
  assert sorted(adapters) == sorted(SPEC.names)
  for name in SPEC.names:
    for path, leaf in leaves_with_paths(adapters[name]):
      leaf = np.asarray(leaf)
      if path[-1] == "lora_b":
        assert not leaf.any(), path
      else:  # A is PEFT's kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(fan_in)), never all zero
        bound = np.prod(leaf.shape[:-1]) ** -0.5
        assert np.abs(leaf).max() <= bound and leaf.std() > 0.4 * bound, path
  a_q = ("layers_0", "self_attn", "q_proj", "lora_a")
  searcher, generator = (dict(leaves_with_paths(adapters[n]))[a_q] for n in SPEC.names)
  assert searcher.shape == (cfg.hidden_size, SPEC.rank)
  assert not np.array_equal(searcher, generator)  # each adapter its own A

  ids, positions, mask, valid = batch(cfg)
  bare = np.asarray(_forward(Qwen(cfg), backbone, ids, positions, mask))
  lora_model = Qwen(cfg, lora=SPEC)
  valid = np.asarray(valid)
  for name in SPEC.names + (None,):
    out = np.asarray(_forward(lora_model, attach(backbone, adapters, SPEC, name), ids, positions,
                              mask))
    # Equal up to float rounding: the LoRA program fuses differently (~1e-7 on tiny-qwen3).
    err = np.abs(out - bare)[valid].max() / np.abs(bare[valid]).max()
    assert err <= 1e-6, (name, err)


# --------------------------------------------------------------------------- 3. gradients


def test_gradients_reach_the_active_adapter_only():
  cfg = QwenConfig.preset("tiny")
  model = Qwen(cfg, lora=SPEC)
  backbone = init_params(cfg, jax.random.key(0))
  # Non-zero B: with B = 0 the gradient of A is 0 too (dL/dA = x^T . dL/dy . B^T).
  adapters = random_b(init_adapters(cfg, SPEC, jax.random.key(1)), seed=2, std=0.1)
  ids, positions, mask, valid = batch(cfg)
  targets = jnp.roll(ids, -1, axis=1)

  def nll(logits):
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.sum(valid)

  @jax.jit
  def adapter_grads(adapters, backbone, index):  # the trainer's way: the backbone is a constant
    return jax.grad(lambda ad: nll(forward(model, attach(backbone, ad, SPEC, index), ids,
                                           positions, mask)))(adapters)

  @jax.jit
  def full_grads(floats, index):  # every float leaf, backbone included (lora_index is int32)
    return jax.grad(lambda f: nll(forward(model, {**f, lora_lib.INDEX_LEAF: index}, ids,
                                          positions, mask)))(floats)

  grads = adapter_grads(adapters, backbone, jnp.int32(SPEC.index("generator")))
  assert jax.tree.structure(grads) == jax.tree.structure(adapters)
  for path, g in leaves_with_paths(grads["generator"]):
    assert np.abs(np.asarray(g)).max() > 0, path
  for path, g in leaves_with_paths(grads["searcher"]):
    assert not np.asarray(g).any(), path
  none = adapter_grads(adapters, backbone, jnp.int32(-1))
  assert not any(np.asarray(g).any() for g in jax.tree.leaves(none))
  assert adapter_grads._cache_size() == 1

  # The trainable tree holds adapter leaves only, at the paths of the targeted projections.
  targeted = {path[:-1] for path, _ in leaves_with_paths(backbone)
              if path[-1] == "kernel" and path[-2] in SPEC.targets}
  for name in SPEC.names:
    paths = [path for path, _ in leaves_with_paths(adapters[name])]
    assert all(p[-1] in ("lora_a", "lora_b") for p in paths), paths
    assert {p[:-1] for p in paths} == targeted
  assert len(targeted) == cfg.num_layers * 7
  partial = LoraSpec(names=("p",), rank=2, alpha=2.0, targets=("q_proj", "down_proj"))
  assert {p[-2] for p, _ in leaves_with_paths(adapter_abstract(cfg, partial))} == {"q_proj",
                                                                                 "down_proj"}

  # What the backbone would get if it were differentiated: non-zero. The stacked adapter leaves'
  # gradients are the per-adapter ones, stacked.
  full = attach(backbone, adapters, SPEC, "generator")
  floats = {k: v for k, v in full.items() if k != lora_lib.INDEX_LEAF}
  whole = full_grads(floats, full[lora_lib.INDEX_LEAF])
  backbone_part = lora_lib.detach(whole)
  assert jax.tree.structure(backbone_part) == jax.tree.structure(backbone)
  for path, g in leaves_with_paths(backbone_part):
    assert np.abs(np.asarray(g)).max() > 0, path
  stacked = lora_lib.select_like(grads["generator"], whole)
  for (path, s), (_, g) in zip(leaves_with_paths(stacked), leaves_with_paths(grads["generator"])):
    np.testing.assert_allclose(np.asarray(s[1]), np.asarray(g), rtol=1e-4, atol=1e-7,
                               err_msg=str(path))
    assert not np.asarray(s[0]).any(), path


# --------------------------------------------------------------------------- 4. two adapters


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_two_adapters_in_one_program_each_equal_their_merged_backbone(preset):
  cfg = QwenConfig.preset(preset)
  backbone = init_params(cfg, jax.random.key(0))
  adapters = random_b(init_adapters(cfg, SPEC, jax.random.key(1)), seed=3)
  ids, positions, mask, valid = batch(cfg)
  valid = np.asarray(valid)
  f = jax.jit(functools.partial(forward, Qwen(cfg, lora=SPEC)))
  outs = {}
  for name in SPEC.names + (None,):
    outs[name] = np.asarray(f(attach(backbone, adapters, SPEC, name), ids, positions, mask))
    assert f._cache_size() == 1, name
  refs = {name: np.asarray(_forward(Qwen(cfg), merge(backbone, adapters[name], SPEC.scale), ids,
                                    positions, mask)) for name in SPEC.names}
  refs[None] = np.asarray(_forward(Qwen(cfg), backbone, ids, positions, mask))
  scale = np.abs(refs[None][valid]).max()
  for name, out in outs.items():
    err = np.abs(out - refs[name])[valid].max() / scale
    assert err <= 1e-5, (name, err)
  # ... and the adapters change the logits, each in its own way.
  assert np.abs(outs["searcher"] - outs["generator"])[valid].max() > 0.05 * scale
  assert np.abs(outs["searcher"] - outs[None])[valid].max() > 0.05 * scale

  # merge_selected (the sampler's "merge" decode) folds the adapter lora_index selects.
  for name in SPEC.names + (None,):
    plain = merge_selected(attach(backbone, adapters, SPEC, name), SPEC.scale)
    want = backbone if name is None else merge(backbone, adapters[name], SPEC.scale)
    assert jax.tree.structure(plain) == jax.tree.structure(backbone)
    for (path, got), (_, w) in zip(leaves_with_paths(plain), leaves_with_paths(want)):
      np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-6, atol=1e-6,
                                 err_msg=f"{name} {path}")
  # The scale is PEFT's alpha / rank: a merge at scale 1 is another model.
  other = merge(backbone, adapters["searcher"], 1.0)
  q = ("layers_0", "self_attn", "q_proj", "kernel")
  assert not np.allclose(dict(leaves_with_paths(other))[q],
                         dict(leaves_with_paths(merge(backbone, adapters["searcher"],
                                                      SPEC.scale)))[q])


# --------------------------------------------------------------------------- 5. the sampler


def _sample(model, params, cfg, prompts, stop, predecode=False):
  """extend + greedy generate of 8 tokens: (new tokens [B, 8], log-probs [B, S], next logits).

  predecode: as a rollout does, make the decode layout once outside `generate` and pass it."""
  block = np.zeros((len(prompts), 16), np.int32)
  for b, p in enumerate(prompts):
    block[b, :len(p)] = p
  n = len(prompts)
  state = init_state(cfg, n, 48, jax.random.key(0))
  state = extend(model, params, state, jnp.asarray(block),
                 jnp.asarray([len(p) for p in prompts], jnp.int32), jnp.full((n,), -1, jnp.int32))
  decoder = decode_layout(model, params) if predecode else (model, params)
  state, gen = generate(*decoder, state, jnp.ones(n, bool), jnp.zeros(n, jnp.int32), stop,
                        SamplingParams(greedy=True), 8)
  return np.asarray(gen.new_tokens), np.asarray(state.logprobs), np.asarray(state.next_logits)


@pytest.mark.parametrize("decode", ["merge", "unmerged"])
def test_generate_with_an_adapter_equals_the_merged_model_and_switching_compiles_nothing(decode):
  cfg = QwenConfig.preset("tiny")
  spec = LoraSpec(names=SPEC.names, rank=SPEC.rank, alpha=SPEC.alpha, decode=decode)
  # Far-from-uniform next-token distributions (as tests/test_sampling.py), so greedy picks are
  # not near-ties.
  backbone = jax.tree.map(lambda x: x * 4.0, init_params(cfg, jax.random.key(0)))
  # (The adapter trees do not depend on the decode mode: SPEC's initializer serves, compiled once.)
  adapters = random_b(init_adapters(cfg, SPEC, jax.random.key(1)), seed=4, std=1.0)
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(0, cfg.vocab_size, n)) for n in (7, 3, 12)]
  stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32), jnp.int32(48))
  model = Qwen(cfg, lora=spec)
  # "merge" runs the bare model's token loop on merged kernels; "unmerged" keeps the adapters.
  assert (decode_layout(model, attach(backbone, adapters, spec, None))[0].lora is None) == \
      (decode == "merge")

  def check(name):
    plain = backbone if name is None else merge(backbone, adapters[name], spec.scale)
    want = _sample(Qwen(cfg), plain, cfg, prompts, stop)
    full = attach(backbone, adapters, spec, name)
    for predecode in (False, True):
      got = _sample(model, full, cfg, prompts, stop, predecode)
      msg = f"{name} predecode={predecode}"
      np.testing.assert_array_equal(got[0], want[0], err_msg=msg)
      np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4, err_msg=msg)
      np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-4, err_msg=msg)
    return got

  first = check("generator")
  sizes = (extend._cache_size(), generate._cache_size())
  counter = CompileCounter()
  second = check("searcher")  # another lora_index in the same params: the same programs
  none = check(None)  # no adapter: the bare backbone (the KL reference policy)
  assert counter.count == 0, counter.count
  assert (extend._cache_size(), generate._cache_size()) == sizes
  assert np.abs(first[1] - second[1]).max() > 0.01  # the adapters sample differently
  assert np.abs(first[1] - none[1]).max() > 0.01


# --------------------------------------------------------------------------- 6. sharded


def test_sharded_adapters_on_8_devices_equal_one_device():
  out = run_with_fake_devices("tests.sharded_lora_check")
  assert "SHARDED_LORA_OK" in out, out


# --------------------------------------------------------------------------- 7. fingerprint


def test_fingerprint_names_the_backbone():
  cfg = QwenConfig.preset("tiny")
  params = init_params(cfg, jax.random.key(0))
  h = fingerprint(params)
  assert isinstance(h, str) and len(h) == 16
  assert fingerprint(jax.tree.map(lambda x: jnp.array(x, copy=True), params)) == h
  assert fingerprint(init_params(cfg, jax.random.key(1))) != h

  def changed(path, flat_index, delta=1e-3):
    def edit(p, x):
      if tuple(k.key for k in p) != path:
        return x
      return x.reshape(-1).at[flat_index].add(delta).reshape(x.shape)
    return jax.tree_util.tree_map_with_path(edit, params)

  embed = params["embed_tokens"]
  # A 2-d leaf is read on a grid of ~sqrt(1024) = 32 strided rows x 32 strided columns.
  rows, cols = (-(-n // 32) for n in embed.shape)
  assert rows > 1 and cols > 1  # a large leaf: only the grid's values are read
  on_grid = (5 * rows) * embed.shape[1] + 3 * cols
  for path, index in ((("embed_tokens",), 0), (("embed_tokens",), on_grid),
                      (("layers_1", "post_attention_layernorm", "scale"), 7)):
    assert fingerprint(changed(path, index)) != h, path
  # Path, shape and dtype count too: the same values under another name are another backbone.
  renamed = dict(params)
  renamed["lm_head_"] = renamed.pop("embed_tokens")
  assert fingerprint(renamed) != h
  assert fingerprint(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)) != \
      fingerprint(jax.tree.map(lambda x: x.astype(jnp.float32), params)) == h
  # Resharded params (8 devices) hash the same: tests/sharded_lora_check.py.


# --------------------------------------------------------------------------- 8. errors


def test_lora_spec_errors_name_the_problem():
  with pytest.raises(ValueError, match="rank must be a positive integer, got 0"):
    LoraSpec(names=("policy",), rank=0, alpha=8.0)
  with pytest.raises(ValueError, match="rank.*2.5"):
    LoraSpec(names=("policy",), rank=2.5, alpha=8.0)
  with pytest.raises(ValueError, match="alpha must be positive"):
    LoraSpec(names=("policy",), rank=4, alpha=0.0)
  with pytest.raises(ValueError, match=r"\['qkv_proj'\].*q_proj"):
    LoraSpec(names=("policy",), rank=4, alpha=8.0, targets=("q_proj", "qkv_proj"))
  with pytest.raises(ValueError, match="targets"):
    LoraSpec(names=("policy",), rank=4, alpha=8.0, targets=())
  with pytest.raises(ValueError, match="distinct.*'policy', 'policy'"):
    LoraSpec(names=("policy", "policy"), rank=4, alpha=8.0)
  with pytest.raises(ValueError, match="non-empty"):
    LoraSpec(names=(), rank=4, alpha=8.0)
  with pytest.raises(ValueError, match="'my-adapter'.*identifier"):
    LoraSpec(names=("my-adapter",), rank=4, alpha=8.0)
  with pytest.raises(ValueError, match="decode.*'fused'"):
    LoraSpec(names=("policy",), rank=4, alpha=8.0, decode="fused")
  with pytest.raises(KeyError, match="'critic'.*'searcher', 'generator'"):
    SPEC.index("critic")
  assert SPEC.index(None) == -1 and SPEC.index("generator") == 1
  with pytest.raises(KeyError, match=r"\['generator'\]"):
    attach({}, {"searcher": {}}, SPEC, "searcher")
