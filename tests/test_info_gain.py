"""Packed information-gain probes against the naive one-pass-per-prefix computation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.rl.info_gain import (build_probes, information_gain, packed_mask, score_naive,
                                   score_packed)


def encode(text):
  """A stand-in tokenizer: one id per character (probes need only ids)."""
  return [3 + ord(c) % 200 for c in text]


def random_batch(rng, cfg, b=3, s=64, t=4):
  """Ragged trajectories: num_turns in 1..t, increasing boundaries, real tokens a prefix."""
  num_turns = rng.randint(1, t + 1, size=b)
  num_turns[0] = t
  turn_ends = np.zeros((b, t + 1), np.int32)
  tokens = np.zeros((b, s), np.int32)
  valid = np.zeros((b, s), bool)
  for i in range(b):
    cuts = np.sort(rng.choice(np.arange(4, s - 8), size=num_turns[i] + 1, replace=False))
    turn_ends[i, :num_turns[i] + 1] = cuts
    turn_ends[i, num_turns[i] + 1:] = cuts[-1]
    tokens[i, :cuts[-1]] = rng.randint(0, cfg.vocab_size, cuts[-1])
    valid[i, :cuts[-1]] = True
  return tokens, valid, turn_ends, num_turns


def _row_logprobs(cfg, params, seq, width=128):
  """log_softmax of one full forward over seq alone (right-padded: one compilation)."""
  ids = np.zeros((1, width), np.int32)
  ids[0, :len(seq)] = seq
  return _forward_logp(cfg, params, jnp.asarray(ids), jnp.arange(width)[None] < len(seq))[0]


@functools.partial(jax.jit, static_argnums=0)
def _forward_logp(cfg, params, ids, valid):
  logits, _ = Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                              masks.causal_padding_mask(valid))
  return jax.nn.log_softmax(logits, axis=-1)


def reference_values(cfg, params, tokens, turn_ends, num_turns, golds, template, mode, alias_mode,
                     probe_tokens="split"):
  """Independent: for every (trajectory, boundary, alias), one full forward of context + probe.
  probe_tokens "natural": the head's trailing spaces are encoded with the gold (and scored)."""
  head, tail = template.split("{gt}")
  lead = ""
  if probe_tokens == "natural":
    lead = head[len(head.rstrip()):]
    head = head.rstrip()
  b, t = turn_ends.shape[0], turn_ends.shape[1] - 1
  out = np.zeros((b, t))
  for i in range(b):
    aliases = golds[i][:1] if alias_mode == "first" else golds[i]
    for step in range(num_turns[i]):
      best = -np.inf
      for alias in aliases:
        ctx = list(tokens[i, :turn_ends[i, step]])
        seq = ctx + encode(head) + encode(lead + alias) + encode(tail)
        logp = np.asarray(_row_logprobs(cfg, params, seq))
        start = len(ctx) + len(encode(head))
        scored = [logp[j - 1, seq[j]] for j in range(start, start + len(encode(lead + alias)))]
        v = float(np.mean(scored))
        best = max(best, np.exp(v) if mode == "prob" else v)
      out[i, step] = best
  return out


@pytest.mark.parametrize("mode,alias_mode,preset,probe_tokens", [
    ("log_prob", "first", "tiny", "natural"), ("prob", "max", "tiny-qwen3", "split")])
def test_packed_equals_naive_per_prefix(mode, alias_mode, preset, probe_tokens):
  cfg = QwenConfig.preset(preset)
  params = jax.tree.map(lambda x: x * 3.0, init_params(cfg, jax.random.key(0)))
  rng = np.random.RandomState(0 if mode == "log_prob" else 1)
  tokens, valid, turn_ends, num_turns = random_batch(rng, cfg)
  golds = [["Orsk", "the city of Orsk"], ["Veltrana"], ["Aldric", "Sir Aldric"]]
  template = "<answer> {gt} </answer>"
  probes = build_probes(encode, golds, template, alias_mode=alias_mode, tokens=probe_tokens)
  model = Qwen(cfg)
  out = score_packed(model, params, jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(turn_ends),
                     jnp.asarray(num_turns), jnp.asarray(probes.tokens), jnp.asarray(probes.score),
                     jnp.asarray(probes.valid), jnp.asarray(probes.alias_valid), mode=mode,
                     with_entropy=True, chunk=32)
  ref = reference_values(cfg, params, tokens, turn_ends, num_turns, golds, template, mode, alias_mode,
                         probe_tokens)
  live = np.arange(4)[None] < num_turns[:, None]
  np.testing.assert_allclose(np.asarray(out.values)[live], ref[live], atol=1e-5)
  assert (np.asarray(out.values)[~live] == 0).all()
  naive = score_naive(model, params, tokens, turn_ends, num_turns, probes, mode=mode)
  np.testing.assert_allclose(np.asarray(out.values), naive, atol=1e-5)
  # information gain of the non-answer turns
  want_ig = np.where(np.arange(4)[None] < (num_turns - 1)[:, None],
                     np.diff(np.pad(ref, ((0, 0), (0, 1))), axis=1), 0.0)
  np.testing.assert_allclose(np.asarray(out.info_gain), want_ig, atol=2e-5)

  # The same pass gives the trajectory's own log-probs and entropies.
  ones = jnp.asarray(valid)
  logits, _ = model.apply({"params": params}, jnp.asarray(tokens), masks.positions_from_padding(ones),
                          masks.causal_padding_mask(ones))
  logp = jax.nn.log_softmax(logits, axis=-1)
  want = np.zeros(tokens.shape)
  want[:, 1:] = np.take_along_axis(np.asarray(logp)[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  want = np.where(valid & (np.arange(tokens.shape[1]) > 0), want, 0.0)
  # rtol too: log-probs of -8 differ in float32 by 1.5e-5 when summed in another order.
  np.testing.assert_allclose(np.asarray(out.token_logprobs), want, atol=1e-5, rtol=1e-5)
  ent = -(np.exp(np.asarray(logp)) * np.asarray(logp)).sum(-1)
  np.testing.assert_allclose(np.asarray(out.token_entropy)[:, 1:][valid[:, 1:]],
                             ent[:, :-1][valid[:, 1:]], atol=1e-4)


def test_packed_mask_structure():
  valid = jnp.asarray([[True, True, True, False]])
  boundaries = jnp.asarray([[1, 3]])
  probe_valid = jnp.asarray([[[True, True], [True, False]]])
  m = np.asarray(packed_mask(valid, boundaries, probe_valid).visible())[0]
  assert m.shape == (8, 8)
  assert not m[:4, 4:].any()                     # trajectory never sees probes
  np.testing.assert_array_equal(m[4, :4], [1, 0, 0, 0])   # probe 0 sees its 1-token prefix
  np.testing.assert_array_equal(m[5, :], [1, 0, 0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(m[6, :], [1, 1, 1, 0, 0, 0, 1, 0])  # probe 1, not probe 0
  np.testing.assert_array_equal(m[7, 6:], [1, 0])  # padded probe token is never a key


def test_gradients_flow_to_logprobs_not_values():
  cfg = QwenConfig.preset("tiny")
  params = init_params(cfg, jax.random.key(1))
  rng = np.random.RandomState(2)
  tokens, valid, turn_ends, num_turns = random_batch(rng, cfg, s=32, t=2)
  probes = build_probes(encode, [["a"], ["bb"], ["c"]], "<answer> {gt} </answer>")
  args = [jnp.asarray(x) for x in (tokens, valid, turn_ends, num_turns, probes.tokens, probes.score,
                                   probes.valid, probes.alias_valid)]
  model = Qwen(cfg)
  g_values = jax.grad(lambda p: score_packed(model, p, *args).values.sum())(params)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(g_values))
  g_logp = jax.grad(lambda p: score_packed(model, p, *args).token_logprobs.sum())(params)
  leaves = jax.tree.leaves(g_logp)
  assert all(bool(jnp.isfinite(x).all()) for x in leaves) and any(float(jnp.abs(x).max()) > 0 for x in leaves)


def test_information_gain_masks_answer_turn():
  v = jnp.asarray([[0.1, 0.5, 0.2, 9.0], [1.0, 2.0, 0.0, 0.0]])
  np.testing.assert_allclose(information_gain(v, jnp.asarray([3, 1])),
                             [[0.4, -0.3, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], atol=1e-7)
  with pytest.raises(ValueError, match="alias_mode"):
    build_probes(encode, ["x"], alias_mode="all")


def test_sequence_logprobs_matches_full_forward_with_left_padding():
  from agentjax.models.logprobs import sequence_logprobs

  cfg = QwenConfig.preset("tiny-qwen3")
  params = jax.tree.map(lambda x: x * 3.0, init_params(cfg, jax.random.key(4)))
  rng = np.random.RandomState(4)
  tokens = rng.randint(0, cfg.vocab_size, (2, 20)).astype(np.int32)
  valid = np.ones((2, 20), bool)
  valid[1, :7] = False  # left padding
  logp, ent = jax.jit(sequence_logprobs, static_argnums=(0, 4, 5))(
      Qwen(cfg), params, jnp.asarray(tokens), jnp.asarray(valid), 8, True)
  for b, start in ((0, 0), (1, 7)):
    ref = np.asarray(_row_logprobs(cfg, params, list(tokens[b, start:])))
    want = ref[np.arange(19 - start), tokens[b, start + 1:]]
    np.testing.assert_allclose(np.asarray(logp)[b, start + 1:], want, atol=1e-5)
    assert (np.asarray(logp)[b, :start + 1] == 0).all()
    ent_ref = -(np.exp(ref) * ref).sum(-1)[:19 - start]
    np.testing.assert_allclose(np.asarray(ent)[b, start + 1:], ent_ref, atol=1e-4)


def test_probe_tokens_natural_keeps_the_gold_as_the_model_writes_it():
  """rl.ig_probe_tokens: with a tokenizer whose pieces carry their leading space (byte-level
  BPE's "Ġword"), "natural" gives the filled template's own tokenization, the gold's pieces
  scored; "split" leaves a lone " " before the gold's space-less pieces (the old probes)."""
  import re
  vocab: dict[str, int] = {}

  def encode(text):  # a piece is a word with its leading space, or a lone space
    return [vocab.setdefault(p, len(vocab) + 1) for p in re.findall(r" ?[^ ]+| ", text)]

  template = "<answer> {gt} </answer>"
  gold = "Kefurn Robotics"
  natural = build_probes(encode, [[gold]], template, tokens="natural")
  filled = encode(template.replace("{gt}", gold))
  n = len(filled)
  np.testing.assert_array_equal(natural.tokens[0, 0, :n], filled)
  assert natural.valid[0, 0].sum() == n
  np.testing.assert_array_equal(natural.tokens[0, 0][natural.score[0, 0]],
                                encode(" " + gold))  # " Kefurn", " Robotics"
  split = build_probes(encode, [[gold]], template, tokens="split")
  np.testing.assert_array_equal(split.tokens[0, 0][split.score[0, 0]], encode(gold))
  head = encode("<answer> ")
  assert split.tokens[0, 0, len(head) - 1] == vocab[" "]  # the lone space
  assert not np.array_equal(natural.tokens, split.tokens)
  with pytest.raises(ValueError, match="ig_probe_tokens"):
    build_probes(encode, [[gold]], template, tokens="joined")


def test_probe_width_multiple_pads_the_same_probes():
  """rl.probe_width_multiple: the probe width is the longest probe rounded up to a multiple of it
  (8 by default); a wider multiple only adds padding (invalid, unscored, zero tokens), so batches
  of other gold lengths keep one width (one scoring program)."""
  encode = lambda text: [ord(c) for c in text]  # noqa: E731  (a token per character)
  template = "<a>{gt}</a>"
  golds = [["Orsk"], ["Kefurn Robotics"], ["x"]]
  base = build_probes(encode, golds, template)
  longest = len("<a>Kefurn Robotics</a>")  # 22 characters
  assert base.tokens.shape[-1] == 24 == -(-longest // 8) * 8
  for multiple, width in ((1, 22), (32, 32), (48, 48)):
    wide = build_probes(encode, golds, template, width_multiple=multiple)
    assert wide.tokens.shape == (3, 1, width)
    n = min(width, 24)
    for name in ("tokens", "score", "valid"):
      np.testing.assert_array_equal(getattr(wide, name)[..., :n], getattr(base, name)[..., :n])
      assert not getattr(wide, name)[..., n:].any()
    np.testing.assert_array_equal(wide.alias_valid, base.alias_valid)
  short = build_probes(encode, [["Orsk"]], template, width_multiple=32)
  assert short.tokens.shape[-1] == 32  # another batch, the same width
