"""Supervised warm start (agentjax.train.sft) on SynthWorld demonstrations with a trained tokenizer.

Demo layout and loss mask, batch packing, the loss against a NumPy cross-entropy from full
logits, the optimizer schedule, the non-finite guard, and a short run that learns.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.agent.protocol import SEARCH_R1, TOOL_CALL
from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.models.tokenizer import load_tokenizer
from agentjax.train import sft
from agentjax.train.sft import (make_optimizer, make_schedule, make_sft_step, pack_batch,
                                run_sft, sft_loss, tokenize_demo)


@pytest.fixture(scope="module")
def demos(world_dir):
  with open(os.path.join(world_dir, "demos.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def cfg(tokenizer):
  return QwenConfig.preset("tiny", vocab_size=-(-len(tokenizer) // 64) * 64)


def _encode(tokenizer, text):
  return tokenizer.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------ tokenize_demo / pack_batch


def test_tokenize_demo_lays_out_prompt_segments_and_eos(tokenizer, demos):
  demo = next(d for d in demos if d["hops"] == 3)  # 3 searches: 7 segments
  ids, mask = tokenize_demo(tokenizer, demo)
  assert len(ids) == len(mask)
  prompt = tokenizer.apply_chat_template(
      [{"role": "user", "content": SEARCH_R1.prompt(demo["question"])}],
      add_generation_prompt=True, tokenize=True, return_dict=False)
  assert ids[:len(prompt)] == list(prompt) and not any(mask[:len(prompt)])
  pos = len(prompt)
  roles = []
  for seg in demo["segments"]:
    seg_ids = _encode(tokenizer, seg["text"])
    assert ids[pos:pos + len(seg_ids)] == seg_ids  # encoded on its own, as the rollout feeds it
    expected = seg["role"] == "assistant"
    assert all(m == expected for m in mask[pos:pos + len(seg_ids)])
    pos += len(seg_ids)
    roles.append(seg["role"])
  assert roles == ["assistant", "observation"] * 3 + ["assistant"]
  im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  assert pos == len(ids) - 1 and ids[-1] == im_end and mask[-1]
  assert ids[-2] == tokenizer.convert_tokens_to_ids("</answer>")
  # The observation tokens are exactly the encoded observation text, and masked 0.
  obs = [i for i, m in zip(ids[len(prompt):-1], mask[len(prompt):-1]) if not m]
  assert obs == sum((_encode(tokenizer, s["text"]) for s in demo["segments"]
                     if s["role"] == "observation"), [])


@pytest.mark.parametrize("which", ["trained", "hf_fixture"])
def test_tokenize_demo_matches_what_the_rollout_engine_feeds(which, tokenizer, demos,
                                                             tiny_tokenizer_dir):
  """Prompt and observation ids are the engine's own (observations as prefix, body and suffix
  encoded separately), with a tags-as-added-tokens tokenizer and with one without them."""
  from agentjax.agent.rollout import RolloutConfig, RolloutEngine
  tok = tokenizer if which == "trained" else load_tokenizer(tiny_tokenizer_dir)
  engine = RolloutEngine(QwenConfig.preset("tiny", vocab_size=-(-len(tok) // 64) * 64), tok,
                         None, RolloutConfig(max_obs_tokens=1 << 20))
  pre, suf = SEARCH_R1.observation_prefix, SEARCH_R1.observation_suffix
  for demo in demos[:10]:
    expected = engine.prompt_ids(demo["question"])
    for seg in demo["segments"]:
      if seg["role"] == "assistant":
        expected += engine.encode(seg["text"])
      else:
        obs = engine.observation_ids(pre, seg["text"][len(pre):-len(suf)], suf)
        expected += obs
    expected.append(tok.convert_tokens_to_ids("<|im_end|>"))
    assert tokenize_demo(tok, demo)[0] == expected


def test_tokenize_demo_without_chat_template_and_protocol_check(tokenizer, demos):
  demo = demos[0]
  ids, mask = tokenize_demo(tokenizer, demo, use_chat_template=False)
  prompt = _encode(tokenizer, SEARCH_R1.prompt(demo["question"]))
  assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
  assert ids[-1] == tokenizer.eos_token_id and mask[-1]
  with pytest.raises(ValueError, match="protocol 'search_r1', not 'tool_call'"):
    tokenize_demo(tokenizer, demo, protocol=TOOL_CALL)


def _edited(demo, k=None, field="text", value=None, **top):
  """A deep copy of the demo with segments[k][field] = value and top-level fields replaced."""
  out = json.loads(json.dumps(demo))
  if k is not None:
    out["segments"][k][field] = value
  out.update(top)
  return out


def test_malformed_demos_are_refused_by_the_protocols_rule(tokenizer, demos):
  """SFT demos obey the one format rule (agent.protocol, as rollouts and the format penalty do);
  the error names the demo and the field."""
  for i, demo in enumerate(demos):  # every generated demo is well-formed
    sft.check_demo(demo, SEARCH_R1, index=i)
  demo = next(d for d in demos if d["hops"] == 2)  # search, obs, search, obs, answer
  name = f"id {demo['id']!r}"
  think = "<think>t</think>\n"
  cases = [
      (_edited(demo, 4, value=think + "<answer> \u202e\t</answer>"),
       r"segments\[4\]\.text \(turn 3\).*empty answer"),
      (_edited(demo, 2, value=think + "<search>\x00\x1b\u2066\u2069</search>"),
       r"segments\[2\]\.text \(turn 2\).*empty query"),
      (_edited(demo, 0, value=think + "<answer>Orsk</answer>"),
       r"segments\[0\]\.text \(turn 1\).*answer before the last turn"),
      (_edited(demo, 0, value=think + "I will look it up."),
       r"segments\[0\]\.text \(turn 1\).*no complete <search> or <answer>"),
      (_edited(demo, segments=demo["segments"][:3]),
       r"segments\[2\]\.text \(turn 2\).*last turn is not an <answer>"),
      (_edited(demo, segments=demo["segments"][:4]), r"field 'segments' ends with an observation"),
      (_edited(demo, 1, field="role", value="assistant"), r"segments\[1\]\.role is 'assistant'"),
      (_edited(demo, 3, value="Doc 1(Title: x) y"), r"segments\[3\]\.text is not a search_r1"),
      (_edited(demo, question=" "), r"field 'question'"),
      (_edited(demo, segments=[]), r"field 'segments'"),
  ]
  for bad, why in cases:
    with pytest.raises(ValueError, match=f"demo \\({name}\\): {why}"):
      tokenize_demo(tokenizer, bad)
  # Over a list, the error names the demo's index too.
  with pytest.raises(ValueError, match=rf"demo 1 \({name}\): segments\[4\]"):
    sft.tokenize_demos(tokenizer, [demo, cases[0][0]])


def test_hook_segments_are_fed_before_their_turn_and_never_learned(tokenizer, demos):
  """A "hook" segment (a per-turn hook's text, e.g. Co-ReAct's rubric suffix) is encoded on its
  own, as the guided engine feeds it, right before its assistant segment, with loss 0; the rest
  of the layout is the plain demo's."""
  demo = next(d for d in demos if d["hops"] == 2)
  hook = "\n[Rubric for the next step]\n1. [1] The action searches\n"
  hooked = _edited(demo, segments=demo["segments"][:2] + [{"role": "hook", "text": hook}] +
                   demo["segments"][2:])
  ids, mask = tokenize_demo(tokenizer, hooked)
  plain_ids, plain_mask = tokenize_demo(tokenizer, demo)
  prompt = len(sft.prompt_ids(tokenizer, SEARCH_R1, demo["question"], True))
  cut = prompt + sum(len(_encode(tokenizer, s["text"])) for s in demo["segments"][:2])
  hook_ids = _encode(tokenizer, hook)
  assert ids == plain_ids[:cut] + hook_ids + plain_ids[cut:]
  assert mask == plain_mask[:cut] + [False] * len(hook_ids) + plain_mask[cut:]
  name = f"id {demo['id']!r}"
  for segments, why in [
      ([{"role": "hook", "text": hook}] + demo["segments"], r"segments\[0\] is a hook"),
      (demo["segments"][:1] + [{"role": "hook", "text": hook}] + demo["segments"][1:],
       r"segments\[1\] is a hook"),
      (demo["segments"] + [{"role": "hook", "text": hook}], r"segments\[5\] is a hook"),
      (demo["segments"][:2] + [{"role": "hook", "text": 3}] + demo["segments"][2:],
       r"segments\[2\] must be")]:
    with pytest.raises(ValueError, match=f"demo \\({name}\\): {why}"):
      tokenize_demo(tokenizer, _edited(demo, segments=segments))
  # A malformed turn after a hook is named by its own index.
  bad = _edited(hooked, 3, value="<think>t</think>\n<answer>x</answer>")
  with pytest.raises(ValueError, match=r"segments\[3\]\.text \(turn 2\).*answer before"):
    tokenize_demo(tokenizer, bad)


def test_a_mixed_corpus_tokenizes_each_row_in_its_own_protocol(tokenizer, demos):
  """tokenize_demos(also=...) lets a row name another protocol (its prompt and format rule);
  a row naming one not allowed is refused, naming the row."""
  from agentjax.agent.protocol import ANSWER_ONLY
  other = {"id": "g0", "question": "Doc 1: Orsk is in Vell. Where is Orsk?",
           "protocol": "answer_only", "golden_answers": ["Vell"],
           "segments": [{"role": "assistant", "text": "<answer> Vell </answer>"}]}
  rows = sft.tokenize_demos(tokenizer, [demos[0], other], SEARCH_R1, also=[ANSWER_ONLY])
  assert rows[0] == tokenize_demo(tokenizer, demos[0])
  assert rows[1] == tokenize_demo(tokenizer, other, ANSWER_ONLY)
  assert rows[1][0][:len(sft.prompt_ids(tokenizer, ANSWER_ONLY, other["question"], True))] == \
      sft.prompt_ids(tokenizer, ANSWER_ONLY, other["question"], True)
  with pytest.raises(ValueError, match=r"demo 1 \(id 'g0'\): field 'protocol'.*answer_only"):
    sft.tokenize_demos(tokenizer, [demos[0], other], SEARCH_R1)


def test_pack_batch_pads_right_and_truncates():
  examples = [([5, 6, 7], [False, True, True]), ([8, 9, 10, 11, 12], [False] * 2 + [True] * 3)]
  batch = pack_batch(examples, max_len=4, pad_id=0)
  np.testing.assert_array_equal(batch["tokens"], [[5, 6, 7, 0], [8, 9, 10, 11]])
  np.testing.assert_array_equal(batch["loss_mask"], [[0, 1, 1, 0], [0, 0, 1, 1]])
  np.testing.assert_array_equal(batch["valid"], [[1, 1, 1, 0], [1, 1, 1, 1]])
  assert batch["tokens"].dtype == np.int32 and batch["valid"].dtype == bool
  with pytest.raises(ValueError, match="2 ids but 1 loss-mask"):
    pack_batch([([1, 2], [True])], 4)


def test_pack_micro_batches_sorts_by_length_and_pads_each_to_its_bucket():
  lengths = [5, 2, 7, 3, 9, 1]
  examples = [(list(range(10 * i + 1, 10 * i + 1 + n)), [k % 2 == 1 for k in range(n)])
              for i, n in enumerate(lengths)]
  parts = sft.pack_micro_batches(examples, max_len=8, pad_id=0, micro_batches=3,
                                 length_buckets=(4, 20))
  # Sorted (stable) by length, the 9-token example truncated to max_len: rows 5, 1 | 3, 0 | 2, 4,
  # padded to the shortest of (4, 8) that holds each micro-batch's longest (20 > max_len is out).
  for part, rows, length in zip(parts, ([5, 1], [3, 0], [2, 4]), (4, 8, 8)):
    expected = pack_batch([examples[i] for i in rows], max_len=length, pad_id=0)
    assert part["tokens"].shape == (2, length)
    for key in ("tokens", "loss_mask", "valid"):
      np.testing.assert_array_equal(part[key], expected[key])
  # One micro-batch: pack_batch itself, order kept.
  (whole,) = sft.pack_micro_batches(examples, max_len=8, length_buckets=(4,))
  for key, value in pack_batch(examples, max_len=8).items():
    np.testing.assert_array_equal(whole[key], value)
  with pytest.raises(ValueError, match="micro_batches=4 must be >= 1 and divide the batch size 6"):
    sft.pack_micro_batches(examples, 8, micro_batches=4)
  for bad in ((0,), (True,), (2.5,)):
    with pytest.raises(ValueError, match="length_buckets must be positive ints"):
      sft.pack_micro_batches(examples, 8, micro_batches=2, length_buckets=bad)


def test_micro_batch_config_is_checked():
  from agentjax.train import config as config_lib
  from configs import sft as sft_config
  config = sft_config.get_config("demo")
  config_lib.validate(config)  # the demo's 4 micro-batches of its 16 examples
  config.sft.batch_size = 6
  with pytest.raises(config_lib.ConfigError, match=r"sft.micro_batches=4: .*divides "
                     r"sft.batch_size=6"):
    config_lib.validate(config)
  config.sft.batch_size, config.sft.length_buckets = 16, (256, 0)
  with pytest.raises(config_lib.ConfigError, match=r"sft.length_buckets=\(256, 0\)"):
    config_lib.validate(config)


# ------------------------------------------------------------------ loss


def _numpy_reference(logits, tokens, weight):
  """Masked next-token cross-entropy and argmax accuracy in float64, from full logits [B, L, V]."""
  logits = np.asarray(logits, np.float64)[:, :-1]
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  targets = np.asarray(tokens)[:, 1:]
  w = np.asarray(weight, np.float64)[:, 1:]
  target_logp = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  hits = logits.argmax(-1) == targets
  return -(target_logp * w).sum() / w.sum(), (hits * w).sum() / w.sum(), w.sum()


def _perturbed_params(cfg):
  """Random weights plus noise: logits far from uniform, so a loss tests the targets it reads."""
  params = init_params(cfg, jax.random.key(1))
  noise = jax.random.split(jax.random.key(2), len(jax.tree.leaves(params)))
  return jax.tree.unflatten(jax.tree.structure(params), [
      p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(jax.tree.leaves(params), noise)])


def test_sft_loss_matches_numpy_cross_entropy(cfg, tokenizer, demos):
  model = Qwen(cfg)
  params = _perturbed_params(cfg)
  examples = [tokenize_demo(tokenizer, d) for d in demos[:3]]
  batch = pack_batch(examples, max_len=400, pad_id=tokenizer.pad_token_id)
  forward = jax.jit(lambda t, v: model.apply({"params": params}, t, masks.positions_from_padding(v),
                                             masks.causal_padding_mask(v))[0])
  loss_fn = jax.jit(lambda t, m, v: sft_loss(model, params, t, m, v, chunk=96))
  valid = jnp.asarray(batch["valid"])
  # Random weights predict nothing right; make each row's last token (the end of turn, a loss
  # token) the model's own argmax at the position before, so the accuracy has hits to count.
  # Causality: that prediction does not depend on the token it predicts.
  logits = np.asarray(forward(jnp.asarray(batch["tokens"]), valid))
  last = batch["valid"].sum(1) - 1
  for b, j in enumerate(last):
    batch["tokens"][b, j] = logits[b, j - 1].argmax()
  tokens, loss_mask = jnp.asarray(batch["tokens"]), jnp.asarray(batch["loss_mask"])
  logits = forward(tokens, valid)

  # Assistant tokens only (observations are inputs, never targets).
  loss, metrics = loss_fn(tokens, loss_mask, valid)
  ref_loss, ref_acc, ref_n = _numpy_reference(logits, tokens, batch["loss_mask"] & batch["valid"])
  assert abs(float(loss) - ref_loss) <= 1e-5 * max(1.0, ref_loss)
  assert float(metrics["loss"]) == float(loss)
  assert abs(float(metrics["accuracy"]) - ref_acc) < 1e-6
  assert float(metrics["tokens"]) == ref_n == sum(sum(m[1:400]) for _, m in examples)
  assert ref_acc > 0  # the accuracy check compares something

  # Every real token as a target: another value, still the reference.
  all_loss, _ = loss_fn(tokens, valid, valid)
  ref_all, _, _ = _numpy_reference(logits, tokens, batch["valid"])
  assert abs(float(all_loss) - ref_all) <= 1e-5 * max(1.0, ref_all)
  assert abs(float(all_loss) - float(loss)) > 1e-2

  # Padding content is ignored: as inputs (masked out of attention) and as targets.
  garbage = jnp.where(valid, tokens, 7)
  np.testing.assert_allclose(float(loss_fn(garbage, loss_mask | ~valid, valid)[0]), float(loss),
                             rtol=1e-6)

  # Nothing to learn: loss 0, not NaN.
  empty, metrics = loss_fn(tokens, jnp.zeros_like(loss_mask), valid)
  assert float(empty) == 0.0 and float(metrics["tokens"]) == 0.0


def test_micro_batch_loss_and_gradient_are_the_whole_batch_ones(cfg, tokenizer, demos):
  cfg = cfg.replace(num_layers=1)  # compiles faster; the sums do not depend on depth
  model = Qwen(cfg)
  params = _perturbed_params(cfg)
  examples = [tokenize_demo(tokenizer, d) for d in demos[:12]]
  whole = pack_batch(examples, max_len=400, pad_id=tokenizer.pad_token_id)
  forward = jax.jit(lambda t, v: model.apply({"params": params}, t, masks.positions_from_padding(v),
                                             masks.causal_padding_mask(v))[0])
  # Make each example's last token its own argmax prediction, so that the accuracy counts hits.
  logits = np.asarray(forward(whole["tokens"], whole["valid"]))
  examples = [(ids[:n - 1] + [int(logits[b, n - 2].argmax())], mask[:n]) for b, (ids, mask), n
              in zip(range(len(examples)), examples, whole["valid"].sum(1))]
  whole = pack_batch(examples, max_len=400, pad_id=tokenizer.pad_token_id)
  parts = sft.pack_micro_batches(examples, 400, tokenizer.pad_token_id, micro_batches=4,
                                 length_buckets=(288, 384))
  assert len({p["tokens"].shape[1] for p in parts}) >= 3  # lengths differ between micro-batches

  ref_loss, ref_acc, ref_n = _numpy_reference(forward(whole["tokens"], whole["valid"]),
                                              whole["tokens"], whole["loss_mask"] & whole["valid"])
  loss, metrics = jax.jit(lambda p: sft.sft_micro_batch_loss(model, p, parts, chunk=96))(params)
  assert abs(float(loss) - ref_loss) <= 1e-5 * max(1.0, ref_loss)
  assert float(metrics["accuracy"]) == pytest.approx(ref_acc, abs=1e-6) and ref_acc > 0
  assert float(metrics["tokens"]) == ref_n

  # The gradient the step applies: the whole batch's, up to rounding (atol for the entries near 0,
  # summed in another order: 1.4e-7 apart with the suite's unoptimized CPU code).
  grad = jax.jit(jax.grad(lambda p, b: sft.sft_micro_batch_loss(model, p, b)[0]))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-7),
               grad(params, parts), grad(params, whole))


# ------------------------------------------------------------------ optimizer, step, guard


def test_schedule_warms_up_then_decays():
  sched = make_schedule(1e-3, warmup_steps=10, total_steps=110, final_lr_ratio=0.1)
  assert float(sched(0)) == 0.0
  assert abs(float(sched(5)) - 5e-4) < 1e-9
  assert abs(float(sched(10)) - 1e-3) < 1e-9
  assert abs(float(sched(60)) - 5.5e-4) < 1e-8  # half way down the cosine
  assert abs(float(sched(110)) - 1e-4) < 1e-9 and abs(float(sched(500)) - 1e-4) < 1e-9


def test_non_finite_step_is_skipped_and_leaves_state_unchanged(cfg):
  cfg = cfg.replace(num_layers=1)  # compiles faster; the guard does not depend on depth
  model = Qwen(cfg)
  rng = np.random.RandomState(0)
  tokens = rng.randint(3, cfg.vocab_size, (2, 32)).astype(np.int32)
  batch = {"tokens": tokens, "loss_mask": np.ones((2, 32), bool), "valid": np.ones((2, 32), bool)}
  # One compiled step for both cases: adam's first update is lr * sign(grad), so this lr sends
  # the weights to ~1e38, still finite, and the next forward overflows.
  optimizer = make_optimizer(1e38, 0, 10, clip_norm=None)
  step = make_sft_step(model, optimizer)

  def copy(tree):
    return jax.tree.map(np.array, tree)

  def assert_same(tree, expected):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), tree, expected)

  # A NaN in one weight: NaN loss and gradients.
  params = init_params(cfg, jax.random.key(0))
  params["layers_0"]["mlp"]["up_proj"]["kernel"] = \
      params["layers_0"]["mlp"]["up_proj"]["kernel"].at[0, 0].set(jnp.nan)
  opt_state = optimizer.init(params)
  before_p, before_s = copy(params), copy(opt_state)
  params, opt_state, metrics = step(params, opt_state, batch)
  assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["loss"]))
  assert_same(params, before_p)
  assert_same(opt_state, before_s)

  # A huge learning rate: the first step applies (finite), the second overflows and is skipped.
  params = init_params(cfg, jax.random.key(0))
  opt_state = optimizer.init(params)
  params, opt_state, metrics = step(params, opt_state, batch)
  assert int(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))
  assert float(jnp.abs(params["embed_tokens"]).max()) > 1e37
  before_p, before_s = copy(params), copy(opt_state)
  params, opt_state, metrics = step(params, opt_state, batch)
  assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["loss"]))
  assert_same(params, before_p)
  assert_same(opt_state, before_s)  # the optimizer's step count included


# ------------------------------------------------------------------ training


def test_run_sft_reduces_the_loss(cfg, tokenizer, demos):
  params = init_params(cfg, jax.random.key(0))
  seen = []
  # Two micro-batches of 4, both at max_len: the micro-batch path at one compile.
  params, history = run_sft(cfg, params, tokenizer, demos[:32], steps=20, batch_size=8,
                            max_len=384, lr=1e-2, seed=0, warmup_steps=3,
                            callback=lambda i, m: seen.append(i), micro_batches=2)
  losses = [h["loss"] for h in history]
  assert len(history) == 20 and seen == list(range(20))
  assert not any(h["skipped"] for h in history)
  assert np.mean(losses[-5:]) < 0.7 * losses[0], losses
  assert history[-1]["accuracy"] > history[0]["accuracy"]
  assert history[0]["lr"] == 0.0 and max(h["lr"] for h in history) == pytest.approx(1e-2)
  assert all(np.isfinite(x) for x in jax.tree.leaves(jax.tree.map(lambda p: p.sum(), params)))


def test_pack_text_packs_passages_with_eos_and_full_loss(tokenizer):
  from agentjax.train.sft import pack_text
  texts = ["Alpha beta gamma.", "Delta epsilon.", "Zeta eta theta iota kappa."] * 5
  encoded = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]
             for t in texts]
  max_len = 2 * max(len(e) for e in encoded)
  packed = pack_text(tokenizer, texts, max_len)
  # Concatenated, the sequences are every text followed by EOS, in order; none exceeds max_len,
  # and no text is split across two sequences.
  assert [t for ids, _ in packed for t in ids] == [t for e in encoded for t in e]
  assert all(len(ids) <= max_len and all(mask) and len(mask) == len(ids) for ids, mask in packed)
  assert all(ids[-1] == tokenizer.eos_token_id for ids, _ in packed)
  assert len(packed) < len(texts)


def test_micro_batched_step_is_the_one_batch_step_and_compiles_per_micro_batch_shape(cfg):
  """make_sft_step accumulates the gradient one micro-batch at a time: its SGD update of a
  batch given as length-bucketed micro-batches equals the update of the same batch as one
  (sums, then one division), and a run whose batches draw many tuples of bucket lengths
  compiles one program per micro-batch shape plus the sum and the update (the fused step
  compiled one per tuple: 15 for the research SFT's 4 micro-batches over 3 buckets)."""
  import optax

  from agentjax.compiles import CompileCounter
  cfg = cfg.replace(num_layers=1)
  model = Qwen(cfg)
  rng = np.random.RandomState(0)
  pool = []
  for n in rng.randint(2, 17, 40):
    ids = rng.randint(3, cfg.vocab_size, n).tolist()
    pool.append((ids, (rng.rand(n) < 0.6).tolist()))
  params0 = init_params(cfg, jax.random.key(0))
  copy = lambda tree: jax.tree.map(jnp.array, tree)  # noqa: E731  (the step donates its params)

  batch = pool[:6]
  whole = make_sft_step(model, optax.sgd(0.5))
  p_whole, _, m_whole = whole(copy(params0), optax.sgd(0.5).init(params0),
                              pack_batch(batch, max_len=16))
  step = make_sft_step(model, optax.sgd(0.5))
  parts = sft.pack_micro_batches(batch, 16, micro_batches=3, length_buckets=(4, 8))
  p_parts, _, m_parts = step(copy(params0), optax.sgd(0.5).init(params0), parts)
  np.testing.assert_allclose(float(m_parts["loss"]), float(m_whole["loss"]), rtol=1e-5)
  assert float(m_parts["tokens"]) == float(m_whole["tokens"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
               p_parts, p_whole)

  fresh = make_sft_step(model, optax.sgd(0.5))
  counter = CompileCounter()
  params, opt_state, tuples = copy(params0), optax.sgd(0.5).init(params0), set()
  for _ in range(12):
    picked = [pool[i] for i in rng.choice(len(pool), 6, replace=False)]
    parts = sft.pack_micro_batches(picked, 16, micro_batches=3, length_buckets=(4, 8))
    tuples.add(tuple(p["tokens"].shape[1] for p in parts))
    params, opt_state, _ = fresh(params, opt_state, parts)
  shapes = {length for t in tuples for length in t}
  assert len(tuples) >= 6, tuples  # the fused step would have compiled this many updates
  assert counter.count <= len(shapes) + 2, (counter.count, tuples)
