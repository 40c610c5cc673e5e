"""The sampler: greedy = argmax of full forwards, exact log-probs, stops, bucketing."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig, abstract_params, init_params
from agentjax.models.tokenizer import load_tokenizer
from agentjax.sampling import (STOP_BUDGET, STOP_EOS, STOP_MAX_NEW, STOP_STRING, SamplingParams,
                               StopTable, extend, generate, init_state, push_and_match,
                               token_byte_table)
from tests import hf_fixtures


def spread_params(cfg, seed):
  """Random params scaled up so that next-token distributions are far from uniform."""
  return jax.tree.map(lambda x: x * 4.0, init_params(cfg, jax.random.key(seed)))


def full_logits(cfg, params, ids, width=64):
  """Logits [len(ids), V] (NumPy) of one full forward (right-padded to `width`: one compilation;
  the slicing is NumPy's, not one eager XLA program per length)."""
  n = len(ids)
  padded = np.zeros((1, width), np.int32)
  padded[0, :n] = ids
  return np.asarray(_forward(cfg, params, jnp.asarray(padded), jnp.arange(width)[None] < n))[0, :n]


def log_softmax(x):
  """NumPy float64 log-softmax over the last axis."""
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg, params, ids, valid):
  return Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                         masks.causal_padding_mask(valid))[0]


def no_stop(cfg, budget, eos=()):
  return (StopTable.build([b""] * cfg.vocab_size, []), jnp.asarray(eos, jnp.int32).reshape(-1),
          jnp.int32(budget))


def fill(state, cfg, params, rows, turn):
  width = max(16, max(len(r) for r in rows))  # prompts up to 16 share one compiled extend
  block = np.zeros((len(rows), width), np.int32)
  for b, r in enumerate(rows):
    block[b, :len(r)] = r
  return extend(Qwen(cfg), params, state, jnp.asarray(block),
                jnp.asarray([len(r) for r in rows], jnp.int32), jnp.full((len(rows),), turn, jnp.int32))


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_greedy_equals_repeated_argmax_of_full_forwards(preset):
  cfg = QwenConfig.preset(preset)
  params = spread_params(cfg, 0)
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(0, cfg.vocab_size, n)) for n in (7, 3, 12)]
  state = fill(init_state(cfg, 3, 64, jax.random.key(0)), cfg, params, prompts, -1)
  state, gen = generate(Qwen(cfg), params, state, jnp.ones(3, bool), jnp.zeros(3, jnp.int32),
                        no_stop(cfg, 64), SamplingParams(greedy=True), 9)
  assert (np.asarray(gen.stop_reason) == STOP_MAX_NEW).all()
  for b, prompt in enumerate(prompts):
    seq = list(prompt)
    for _ in range(9):
      seq.append(int(np.argmax(full_logits(cfg, params, seq)[-1])))
    assert list(np.asarray(gen.new_tokens[b])) == seq[len(prompt):]
    assert list(np.asarray(state.tokens[b, :len(seq)])) == seq


def test_shared_prefix_equals_full_forwards_and_masks_its_padding():
  from agentjax.models.qwen.model import KVCache
  from agentjax.sampling.sampler import shared_prefix

  cfg = QwenConfig.preset("tiny-qwen3")
  params = spread_params(cfg, 1)
  rng = np.random.RandomState(1)
  head = list(rng.randint(0, cfg.vocab_size, 10))
  tails = [list(rng.randint(0, cfg.vocab_size, n)) for n in (5, 1, 9)]
  one = fill(init_state(cfg, 1, 16, jax.random.key(0)), cfg, params, [head], -1)
  prefix = shared_prefix(one)
  assert int(prefix.length) == 10
  # Fault injection: large garbage in the prefix's 6 unused slots must be masked out.
  poison = lambda x, axis: x.at[(slice(None),) * axis + (slice(10, None),)].set(30.0)
  prefix = prefix.replace(cache=KVCache(tuple(poison(k, 3) for k in prefix.cache.keys),
                                        tuple(poison(v, 2) for v in prefix.cache.values)))
  state = init_state(cfg, 3, 32, jax.random.key(0))
  width = 16
  block = np.zeros((3, width), np.int32)
  for b, t in enumerate(tails):
    block[b, :len(t)] = t
  state = extend(Qwen(cfg), params, state, jnp.asarray(block),
                 jnp.asarray([len(t) for t in tails], jnp.int32), jnp.full((3,), -1, jnp.int32),
                 prefix)
  np.testing.assert_array_equal(np.asarray(state.length), [5, 1, 9])  # own slots only
  for b, t in enumerate(tails):
    np.testing.assert_allclose(np.asarray(state.next_logits[b]),
                               full_logits(cfg, params, head + t)[-1], atol=2e-4, rtol=2e-4)
  state, gen = generate(Qwen(cfg), params, state, jnp.ones(3, bool), jnp.zeros(3, jnp.int32),
                        no_stop(cfg, 32), SamplingParams(greedy=True), 6, prefix)
  for b, t in enumerate(tails):
    seq = head + t
    for _ in range(6):
      seq.append(int(np.argmax(full_logits(cfg, params, seq)[-1])))
    assert list(np.asarray(gen.new_tokens[b])) == seq[len(head) + len(t):], b
    assert list(np.asarray(state.tokens[b, :len(seq) - 10])) == seq[10:], b


@pytest.mark.parametrize("tied", [True, False])
def test_decode_layout_copies_only_the_moved_kernels(tied):
  """On CPU the decode layout is out_major_params' tree; the leaves it leaves alone (embedding,
  norms, biases) are the caller's own arrays, not copies."""
  from agentjax.models.qwen.model import out_major_params
  from agentjax.sampling import decode_layout
  if jax.default_backend() != "cpu":
    pytest.skip("the decode layout is the checkpoint layout off CPU")
  cfg = QwenConfig.preset("tiny", tie_word_embeddings=tied)
  rng = np.random.RandomState(0)  # random leaves of init's shapes: no init compile per config
  params = jax.tree.map(lambda x: jnp.asarray(rng.randn(*x.shape).astype(x.dtype)),
                        abstract_params(cfg))
  model, converted = decode_layout(Qwen(cfg), params)
  assert model.out_major and model.cfg == cfg
  chex.assert_trees_all_equal(converted, out_major_params(params))
  shared = jax.tree.map(lambda a, b: a is b, params, converted)
  flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(shared)}
  assert flat["['embed_tokens']"] and flat["['layers_0']['input_layernorm']['scale']"]
  assert flat["['layers_0']['self_attn']['q_proj']['bias']"]
  assert not flat["['layers_0']['mlp']['up_proj']['kernel']"]
  assert sum(flat.values()) == len(flat) - 7 * cfg.num_layers - (not tied)
  assert decode_layout(model, converted)[1] is converted   # already out-major: used as it is


class LogprobTest(chex.TestCase):

  def test_sampled_logprobs_equal_teacher_forced(self):
    """Across prefill, two sampled turns and a fed observation in between, the stored log-prob of
    every sampled token equals the teacher-forced temperature-1 log-prob (the first PPO ratio is 1)."""
    cfg = QwenConfig.preset("tiny-qwen3")
    params = spread_params(cfg, 1)
    rng = np.random.RandomState(1)
    model = Qwen(cfg)
    state = fill(init_state(cfg, 4, 128, jax.random.key(1)), cfg, params,
                 [list(rng.randint(0, cfg.vocab_size, n)) for n in (5, 9, 2, 6)], -1)
    sampling = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
    active = jnp.asarray([True, True, False, True])
    state, _ = generate(model, params, state, active, jnp.zeros(4, jnp.int32), no_stop(cfg, 128),
                        sampling, 6)
    state = fill(state, cfg, params, [list(rng.randint(0, cfg.vocab_size, n)) for n in (3, 0, 4, 5)], 0)
    state, _ = generate(model, params, state, jnp.ones(4, bool), jnp.ones(4, jnp.int32),
                        no_stop(cfg, 128), SamplingParams(temperature=1.3), 5)
    tokens, valid, sampled, logprobs = jax.device_get(
        (state.tokens, state.valid, state.sampled, state.logprobs))
    for b in range(4):
      n = int(valid[b].sum())
      assert valid[b, :n].all() and not valid[b, n:].any()
      ref = log_softmax(full_logits(cfg, params, tokens[b, :n]))
      positions = np.flatnonzero(sampled[b])
      assert len(positions) == (11 if b != 2 else 5)
      want = ref[positions - 1, tokens[b, positions]]
      np.testing.assert_allclose(logprobs[b, positions], want, atol=1e-4)
      assert (logprobs[b, ~sampled[b]] == 0).all()


def test_stop_reasons_eos_and_budget():
  # The shapes of the greedy test above (3 rows, 64 slots, 9 new tokens): one compiled program.
  cfg = QwenConfig.preset("tiny")
  params = spread_params(cfg, 2)
  prompt = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
  model = Qwen(cfg)
  greedy = SamplingParams(greedy=True)

  def run(stop):
    state = fill(init_state(cfg, 3, 64, jax.random.key(0)), cfg, params, prompt, -1)
    return generate(model, params, state, jnp.ones(3, bool), jnp.zeros(3, jnp.int32), stop,
                    greedy, 9)

  _, gen = run(no_stop(cfg, 64))
  assert list(np.asarray(gen.stop_reason)) == [STOP_MAX_NEW] * 3
  first = np.asarray(gen.new_tokens)[:, 2]   # make the 3rd greedy token of each row an EOS
  _, gen = run(no_stop(cfg, 64, eos=first))
  assert list(np.asarray(gen.stop_reason)) == [STOP_EOS] * 3
  assert (np.asarray(gen.num_new) <= 3).all()
  # A budget of 6 slots: rows stop when they fill it (before 9 new tokens), and nothing is
  # written past it.
  state, gen = run(no_stop(cfg, 6))
  assert list(np.asarray(gen.stop_reason)) == [STOP_BUDGET] * 3
  assert list(np.asarray(gen.num_new)) == [3, 4, 2]
  assert list(np.asarray(state.length)) == [6, 6, 6]
  assert not np.asarray(state.valid)[:, 6:].any()


def test_vocab_major_sampling_matches_numpy():
  """The decode loop's [V, B] path: greedy is NumPy's argmax (first index on ties), temperature
  sampling follows softmax(logits / T), log-probs are the temperature-1 log-softmax."""
  from agentjax.sampling import sample_token

  rng = np.random.RandomState(3)
  logits = rng.randn(300, 6).astype(np.float32)
  logits[[7, 40, 299], 2] = 9.0      # a three-way tie for the max: the first index wins
  logits[[0, 5], 4] = 9.0
  logits[299, 5] = 9.0               # the max in the last row
  logits[[11, 20], 1] = np.nan       # NaN counts as the max, as in np.argmax
  ref_logp = logits - np.log(np.exp(logits - logits.max(0)).sum(0)) - logits.max(0)
  tok, logp = jax.jit(lambda k, x: sample_token(k, x, SamplingParams(greedy=True),
                                                vocab_major=True))(jax.random.key(0), logits)
  np.testing.assert_array_equal(np.asarray(tok), np.argmax(logits, axis=0))
  np.testing.assert_allclose(logp, ref_logp[np.argmax(logits, 0), np.arange(6)], atol=1e-5)

  small = np.log(np.array([[0.5, 0.1], [0.3, 0.2], [0.2, 0.7]], np.float32))     # [V=3, B=2]
  temp = 2.0
  draw = jax.jit(lambda k: sample_token(k, jnp.asarray(small), SamplingParams(temperature=temp),
                                        vocab_major=True))
  toks, logps = jax.vmap(draw)(jax.random.split(jax.random.key(1), 20000))
  expect = np.exp(small / temp) / np.exp(small / temp).sum(0)
  for b in range(2):
    freq = np.bincount(np.asarray(toks[:, b]), minlength=3) / 20000
    np.testing.assert_allclose(freq, expect[:, b], atol=0.015)
    np.testing.assert_allclose(logps[:, b], small[np.asarray(toks[:, b]), b], atol=1e-5)


# --------------------------------------------------------------------------- top-k / top-p


def reference_filter(logits, temperature=1.0, top_k=0, top_p=1.0):
  """NumPy (float64) temperature -> top-k -> top-p, in transformers' order.

  Args:
    logits: [B, V].
  Returns:
    kept [B, V] bool, probs [B, V] (the renormalized sampling distribution, 0 off the kept set),
    and margin: the smallest distance between top_p and the mass that decides a kept-by-top-k
    token (so that float32 rounding cannot flip a decision the test relies on).

  Ties go together: top-k keeps every token >= the k-th largest value (transformers'
  TopKLogitsWarper removes `scores < topk(scores, k)[..., -1]`); top-p keeps a token iff the mass
  of strictly more probable tokens is < top_p. Without ties that is TopPLogitsWarper's rule (it
  drops tokens whose ascending cumulative mass is <= 1 - top_p); on a tie at the nucleus boundary
  the whole tie group stays, where TopPLogitsWarper keeps the part torch.sort happens to put last.
  """
  x = np.asarray(logits, np.float64) / temperature
  keep = np.ones(x.shape, bool)
  if top_k:
    kth = -np.sort(-x, axis=-1)[:, [min(top_k, x.shape[-1]) - 1]]   # [B, 1]
    keep &= x >= kth
  margin = np.inf
  if top_p < 1.0:
    p = np.where(keep, np.exp(x - x.max(-1, keepdims=True)), 0.0)
    p /= p.sum(-1, keepdims=True)
    greater = (p[:, None, :] * (x[:, None, :] > x[:, :, None])).sum(-1)  # [B, V]: mass above v
    margin = np.abs(greater - top_p)[keep].min()
    keep &= greater < top_p
  probs = np.where(keep, np.exp(x - x.max(-1, keepdims=True)), 0.0)
  return keep, probs / probs.sum(-1, keepdims=True), margin


FILTERS = [  # (temperature, top_k, top_p)
    (1.0, 5, 1.0), (1.0, 0, 0.9), (1.0, 5, 0.9), (0.7, 5, 0.9), (1.6, 0, 0.9), (2.0, 0, 1.0)]


def filter_logits_cases():
  """[B=12, V=40] float32 logits: two rows built with ties on the k = 5 and p = 0.9 boundaries,
  six on a 0.25 grid (ties everywhere, as bf16 logits have), four continuous (no ties)."""
  rng = np.random.RandomState(7)
  v = 40
  at_k = np.full(v, -3.0)
  at_k[[3, 17, 8, 30]] = [4.0, 3.5, 3.0, 2.5]
  at_k[[1, 12, 39]] = 2.0                 # ranks 5, 6, 7 tie: top-5 keeps all three
  at_p = np.full(v, -30.0)                # probabilities 0.5, 0.32, then four ties of 0.045
  at_p[[9, 2]] = np.log([0.5, 0.32])
  at_p[[0, 20, 21, 33]] = np.log(0.045)   # mass above them 0.82 < 0.9: all four kept
  grid = np.round(rng.randn(6, v) * 1.5 * 4) / 4
  smooth = rng.randn(4, v) * 1.5
  return np.concatenate([at_k[None], at_p[None], grid, smooth]).astype(np.float32)


def test_filter_logits_matches_numpy_reference_with_ties():
  """The kept set and the renormalized distribution of every filter equal the NumPy reference
  exactly, ties at the top-k and nucleus boundaries included; and equal transformers' warpers
  wherever those are well defined (top-k always, top-p without ties)."""
  from agentjax.sampling.sample import filter_logits

  logits = filter_logits_cases()
  params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in FILTERS]
  got = jax.device_get(jax.jit(lambda x: [filter_logits(x, s) for s in params])(logits))
  for (t, k, p), out in zip(FILTERS, got):
    keep, probs, margin = reference_filter(logits, t, k, p)
    # No decision within float32 reach of top_p (a float32 sum of <= 40 terms of <= 1 is off
    # by < 40 * 2**-24 = 2.4e-6).
    assert margin > 1e-5, (t, k, p)
    np.testing.assert_array_equal(np.isfinite(out), keep, err_msg=f"kept set, T={t} k={k} p={p}")
    np.testing.assert_allclose(out[keep], (logits / np.float32(t))[keep], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(out, axis=-1)), probs, atol=1e-6,
                               err_msg=f"renormalized probabilities, T={t} k={k} p={p}")
  # The built rows really test the boundaries: 7 kept by top-5, 6 in the 0.9 nucleus.
  assert reference_filter(logits[:1], 1.0, 5)[0].sum() == 7
  assert reference_filter(logits[1:2], 1.0, 0, 0.9)[0].sum() == 6
  assert np.isfinite(got[0][0]).sum() == 7 and np.isfinite(got[1][1]).sum() == 6

  torch = pytest.importorskip("torch")
  from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                      TopKLogitsWarper, TopPLogitsWarper)
  for (t, k, p), out in zip(FILTERS, got):
    rows = slice(None) if p == 1.0 else slice(8, None)   # TopP is order-dependent on ties
    scores = torch.from_numpy(logits[rows])
    scores = TemperatureLogitsWarper(t)(None, scores)
    scores = TopKLogitsWarper(k)(None, scores) if k else scores
    scores = TopPLogitsWarper(p)(None, scores) if p < 1.0 else scores
    np.testing.assert_array_equal(np.isfinite(out[rows]), np.isfinite(scores.numpy()))


def test_sampled_tokens_follow_the_filtered_distribution():
  """20000 draws per row from fixed keys: every token in the kept set, frequencies consistent
  with the reference distribution (chi-square, p-value > 1e-6: deterministic under the fixed keys,
  and a fair sampler fails it once in a million seeds), temperature-1 log-probs."""
  from scipy import stats

  from agentjax.sampling import sample_token

  logits = filter_logits_cases()[:8]
  params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in FILTERS]
  keys = jax.random.split(jax.random.key(11), 20000)
  draw = jax.jit(lambda ks, x: [jax.vmap(lambda key: sample_token(key, x, s))(ks) for s in params])
  log_softmax = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  for (t, k, p), (toks, logps) in zip(FILTERS, jax.device_get(draw(keys, logits))):
    keep, probs, _ = reference_filter(logits, t, k, p)
    for b in range(len(logits)):
      assert keep[b, toks[:, b]].all(), (t, k, p, b)
      np.testing.assert_allclose(logps[:, b], log_softmax[b, toks[:, b]], atol=1e-5)
      counts = np.bincount(toks[:, b], minlength=logits.shape[1])[keep[b]]
      expect = probs[b, keep[b]] * len(keys)
      small = expect < 5  # pool the rare tokens into one bin, as chi-square needs
      counts = np.append(counts[~small], counts[small].sum())
      expect = np.append(expect[~small], expect[small].sum())
      counts, expect = counts[expect > 0], expect[expect > 0]
      if len(counts) > 1:
        pvalue = stats.chisquare(counts, expect).pvalue
        assert pvalue > 1e-6, (t, k, p, b, pvalue)


def test_top_p_tiny_is_argmax_and_bad_settings_are_refused():
  from agentjax.sampling import sample_token

  logits = np.random.RandomState(0).randn(16, 64).astype(np.float32) * 3
  tok, _ = jax.jit(lambda k, x: sample_token(k, x, SamplingParams(top_p=1e-6)))(
      jax.random.key(1), logits)
  np.testing.assert_array_equal(np.asarray(tok), np.argmax(np.asarray(logits), axis=-1))
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="top_k"):
    SamplingParams(top_k=-1)


# --------------------------------------------------------------------------- stop strings


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  """A byte-level BPE trained on agent text, where tags are split and merged in several ways."""
  return load_tokenizer(hf_fixtures.make_tokenizer_dir(str(tmp_path_factory.mktemp("bpe"))))


def _first_hit(table, ids):
  window = table.empty_window(1)
  step = jax.jit(lambda w, t: push_and_match(table, w, t))
  for i, t in enumerate(ids):
    window, hit = step(window, jnp.asarray([t], jnp.int32))
    if bool(hit[0]):
      return i
  return None


def test_stop_strings_match_on_bytes_however_bpe_splits_them(bpe):
  table_bytes = token_byte_table(bpe, len(bpe))
  table = StopTable.build(table_bytes, ["</search>", "</answer>"])
  vocab = bpe.get_vocab()
  byte_ids = {}
  for piece, i in vocab.items():  # single-byte tokens, to spell text one byte at a time
    if len(table_bytes[i]) == 1:
      byte_ids[table_bytes[i]] = i
  for text in ["<search>capital of Veltrana</search>", "x</search>\n\n<information>",
               "<answer>Orsk</answer>", "a </sea rch> b </search>"]:
    end = min(text.find(s) + len(s) for s in ("</search>", "</answer>") if s in text)
    for ids in (bpe.encode(text, add_special_tokens=False),
                [byte_ids[bytes([c])] for c in text.encode()]):
      # the hit comes at the token whose bytes complete the stop string, not before or after
      spans = np.cumsum([len(table_bytes[i]) for i in ids])
      assert _first_hit(table, ids) == int(np.searchsorted(spans, end)), (text, ids)
  # BPE really does split and merge the tag in these texts
  pieces = [table_bytes[i] for i in bpe.encode("x</search>\n\n", add_special_tokens=False)]
  assert b"</search>" not in pieces
  assert _first_hit(table, bpe.encode("no stop here </searc h>", add_special_tokens=False)) is None


def test_generate_stops_on_a_split_tag(bpe):
  """End to end: a scripted model spells '... </search> ...' in BPE pieces; generation stops at
  the piece that completes the tag and keeps it."""
  from agentjax.models.qwen.scripted import chain, transition_config, transition_params
  from agentjax.sampling import bucket

  ids = bpe.encode("Orsk</search> more", add_special_tokens=False)
  assert len(set(ids)) == len(ids)
  table_bytes = token_byte_table(bpe, bucket(len(bpe), 64))
  cfg = transition_config(bucket(len(bpe), 64))
  params = transition_params(cfg, chain(ids), fallback=ids[0])
  state = fill(init_state(cfg, 1, 64, jax.random.key(0)), cfg, params, [ids[:1]], -1)
  stop = (StopTable.build(table_bytes, ["</search>"]), jnp.zeros((0,), jnp.int32), jnp.int32(64))
  _, gen = generate(Qwen(cfg), params, state, jnp.ones(1, bool), jnp.zeros(1, jnp.int32), stop,
                    SamplingParams(greedy=True), 20)
  out = list(np.asarray(gen.new_tokens[0, :int(gen.num_new[0])]))
  assert int(gen.stop_reason[0]) == STOP_STRING
  spans = np.cumsum([len(table_bytes[i]) for i in ids])
  end = b"".join(table_bytes[i] for i in ids).find(b"</search>") + len(b"</search>")
  assert out == ids[1:int(np.searchsorted(spans, end)) + 1]


@pytest.mark.parametrize("vocab_major", [False, True])
def test_penalize_repeats_equals_transformers_logits_processor(vocab_major):
  """agentjax.sampling.penalize_repeats against transformers' RepetitionPenaltyLogitsProcessor:
  positive, zero and negative logits, repeated context tokens, and invalid (padding or rewound)
  slots, which do not count."""
  import torch
  from transformers import RepetitionPenaltyLogitsProcessor

  from agentjax.sampling.sample import penalize_repeats
  rng = np.random.default_rng(0)
  b, s, v = 3, 9, 17
  logits = rng.standard_normal((b, v)).astype(np.float32)
  logits[:, 0] = 0.0
  tokens = rng.integers(0, v, (b, s)).astype(np.int32)
  tokens[0, :4] = 5  # repeats count once
  valid = rng.random((b, s)) < 0.7
  valid[2] = False  # a row with no context: nothing penalized
  for penalty in (1.2, 0.8):
    want = logits.copy()
    for row in range(b):
      ids = tokens[row][valid[row]]
      if ids.size:
        want[row] = RepetitionPenaltyLogitsProcessor(penalty)(
            torch.tensor(ids[None].astype(np.int64)), torch.tensor(logits[row:row + 1]))[0]
    got = penalize_repeats(jnp.asarray(logits.T if vocab_major else logits),
                           (jnp.asarray(tokens), jnp.asarray(valid)), penalty, vocab_major)
    np.testing.assert_allclose(np.asarray(got.T if vocab_major else got), want, rtol=1e-6)
  with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
    SamplingParams(repetition_penalty=0.0)


def _budget_reference(tokens, ctx, valid, open_id, close_id, budget):
  """NumPy: per row, the valid context in order; a block opened after the last close with at
  least `budget` tokens after it gets close_id."""
  out = tokens.copy()
  for row in range(len(tokens)):
    seq = list(ctx[row][valid[row]])
    opens = [i for i, t in enumerate(seq) if t == open_id]
    closes = [i for i, t in enumerate(seq) if t == close_id]
    if opens and (not closes or opens[-1] > closes[-1]) and len(seq) - 1 - opens[-1] >= budget:
      out[row] = close_id
  return out


def test_close_long_thoughts_equals_a_numpy_reference():
  """The thinking budget on hand-made contexts: no block, a closed block, a block of budget - 1
  and of budget tokens, a block reopened after a close, a block opened in the prompt, invalid
  (rewound or padding) slots inside a block (not counted) and an invalid <think> (not an
  opening); and on random ones. A row already sampling </think> keeps it."""
  from agentjax.sampling.sample import close_long_thoughts
  o, c, budget = 1, 2, 3
  rows = [[5, 6, 7, 8, 9, 5, 6],      # no block
          [1, 6, 7, 8, 9, 2, 6],      # closed
          [5, 5, 5, 1, 6, 7, 0],      # budget - 1 tokens after <think> (slot 6 invalid below)
          [5, 5, 1, 6, 7, 8, 0],      # budget tokens: forced (slot 6 invalid)
          [1, 6, 2, 1, 7, 8, 9],      # reopened after a close: 3 tokens, forced
          [1, 6, 7, 8, 9, 6, 7],      # opened at the start (the prompt), 6 tokens: forced
          [1, 6, 7, 8, 9, 6, 7],      # as above with invalid slots inside: 2 counted
          [9, 1, 6, 7, 8, 9, 9]]      # its <think> invalid: no block
  ctx = np.array(rows, np.int32)
  valid = np.ones_like(ctx, bool)
  valid[2:4, 6] = False
  valid[6, 2:6] = False
  valid[7, 1] = False
  sampled = np.array([4, 4, 4, 4, 4, 4, 4, 2], np.int32)
  params = SamplingParams(max_think_tokens=budget, think_tags=(o, c))
  want = _budget_reference(sampled, ctx, valid, o, c, budget)
  np.testing.assert_array_equal(want, [4, 4, 4, 2, 2, 2, 4, 2])
  got = close_long_thoughts(jnp.asarray(sampled), (jnp.asarray(ctx), jnp.asarray(valid)), params)
  np.testing.assert_array_equal(np.asarray(got), want)
  rng = np.random.default_rng(0)
  for budget in (1, 2, 5):
    ctx = rng.integers(0, 6, (64, 12)).astype(np.int32)
    valid = rng.random(ctx.shape) < 0.8
    sampled = rng.integers(0, 6, 64).astype(np.int32)
    params = SamplingParams(max_think_tokens=budget, think_tags=(o, c))
    got = close_long_thoughts(jnp.asarray(sampled), (jnp.asarray(ctx), jnp.asarray(valid)),
                              params)
    np.testing.assert_array_equal(np.asarray(got),
                                  _budget_reference(sampled, ctx, valid, o, c, budget))
  with pytest.raises(ValueError, match="think_tags"):
    close_long_thoughts(jnp.asarray(sampled), (jnp.asarray(ctx), jnp.asarray(valid)),
                        SamplingParams(max_think_tokens=2))
  for bad in (dict(max_think_tokens=-1), dict(max_think_tokens=1.5),
              dict(max_think_tokens=2, think_tags=(1,)), dict(think_tags=(-1, 2))):
    with pytest.raises(ValueError, match="max_think_tokens|think_tags"):
      SamplingParams(**bad)


def test_sampled_token_under_a_budget_keeps_the_models_log_prob():
  """A forced </think> carries the model's own log-prob of it (what a scoring pass recomputes),
  greedy and sampled, batch-major and vocab-major."""
  from agentjax.sampling.sample import sample_token, sample_token_rows
  logits = jax.random.normal(jax.random.key(0), (2, 11))
  ctx = jnp.asarray([[1, 5, 6, 7], [3, 5, 6, 7]], jnp.int32)
  ctx_valid = (ctx, jnp.ones_like(ctx, bool))
  want_lp = np.asarray(jax.nn.log_softmax(logits, -1))
  for params in (SamplingParams(greedy=True, max_think_tokens=2, think_tags=(1, 2)),
                 SamplingParams(temperature=0.7, max_think_tokens=2, think_tags=(1, 2))):
    for major in (False, True):
      z = logits.T if major else logits
      for tok, lp in (sample_token(jax.random.key(1), z, params, major, ctx_valid),
                      sample_token_rows(jax.random.split(jax.random.key(1), 2), z, params,
                                        major, ctx_valid)):
        tok, lp = np.asarray(tok), np.asarray(lp)
        assert tok[0] == 2
        np.testing.assert_allclose(lp, want_lp[np.arange(2), tok], rtol=1e-5)
