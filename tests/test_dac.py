"""DAC's model and trainer levels: the two-role update, per-adapter clipping, the two-role rollout
(DacAgent) on a scripted model, a 2-step DAC run (both adapters train, exact resume, PEFT
exports, metrics, eval with coverage) and the config check.

Shapes are tiny and compiled programs are shared: the rollout tests run one scripted LoRA model
through one module fixture, the trainer tests one module fixture of three short runs.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.compiles import CompileCounter
from agentjax.dac.roles import ROLES, DacAgent, DacSettings, generator_prompt
from agentjax.models.logprobs import sequence_logprobs
from agentjax.models.lora import LoraSpec, attach
from agentjax.models.qwen import Qwen, QwenConfig, init_adapters, init_params
from agentjax.retrieval import Document, SearchResponse, SearchStats
from agentjax.rl.losses import ppo_loss
from agentjax.sampling import SamplingParams
from agentjax.train import config as config_lib
from agentjax.train.optim import make_adapter_optimizer
from agentjax.train.updates import PolicyLossConfig, make_roles_update
from tests import agent_fixtures as af
from tests.retrieval_fixtures import corpus_rows
from tests.trainer_fixtures import run_metrics, tiny_config

TIMING = ("rollout_s", "scoring_s", "update_s", "step_s", "search_s", "tokens_per_s",
          "sampled_tokens_per_s", "eval/seconds", "compiles")


def _copy(tree):
  # The guarded update donates params and optimizer state: hand it copies.
  return jax.tree.map(jnp.copy, tree)


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


# ============================================================================ the two-role update

LOSS_KW = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_estimator="low_var_kl",
               entropy_coef=0.01, aggregation="token-mean")
CHUNK = 32
LR = 0.5


@pytest.fixture(scope="module")
def lora_qwen():
  """A one-layer random Qwen with two adapters whose B is random (B = 0 would leave A without a
  gradient, so half the leaves would go untested)."""
  cfg = QwenConfig.preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=48,
                          num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
  spec = LoraSpec(ROLES, rank=2, alpha=4.0)
  backbone = init_params(cfg, jax.random.key(0))
  adapters = init_adapters(cfg, spec, jax.random.key(1))
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  leaves = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return cfg, spec, backbone, jax.tree.unflatten(treedef, leaves)


def _minibatch(seed: int, vocab: int, b: int = 2, s: int = 8) -> dict[str, jax.Array]:
  """[b, s] arrays of a policy-loss minibatch: row 1 padded, the first 3 slots a prompt, old
  log-probs ~ log(1/64) +- 1 so that some ratios clip."""
  rng = np.random.default_rng(seed)
  valid = np.ones((b, s), bool)
  valid[1, 6:] = False
  mb = dict(tokens=rng.integers(0, vocab, (b, s)).astype(np.int32), valid=valid,
            loss_mask=valid & (np.arange(s) >= 3),
            old_logp=(-rng.uniform(3.2, 5.2, (b, s)) * valid).astype(np.float32),
            ref_logp=(-rng.uniform(3.2, 5.2, (b, s)) * valid).astype(np.float32),
            advantages=rng.normal(size=(b, s)).astype(np.float32))
  return {k: jnp.asarray(v) for k, v in mb.items()}


@pytest.fixture(scope="module")
def role_reference(lora_qwen):
  """jax.grad of one role's PPO loss written here (attach + sequence_logprobs + ppo_loss): the
  adapter index is data, so both roles share one compiled program."""
  cfg, spec, backbone, _ = lora_qwen
  model = Qwen(cfg, lora=spec)

  def loss(adapters, index, mb):
    params = attach(backbone, adapters, spec, index)
    logp, ent = sequence_logprobs(model, params, mb["tokens"], mb["valid"], chunk=CHUNK,
                                  with_entropy=True)
    value, _ = ppo_loss(logp, mb["old_logp"], mb["advantages"], mb["loss_mask"],
                        ref_logp=mb["ref_logp"], entropy=ent, **LOSS_KW)
    return value

  value_and_grad = jax.jit(jax.value_and_grad(loss))
  return lambda adapters, role, mb: value_and_grad(adapters, jnp.int32(spec.index(role)), mb)


@pytest.fixture(scope="module")
def roles_update(lora_qwen):
  cfg, spec, _, _ = lora_qwen
  loss = PolicyLossConfig(name="ppo", kwargs=tuple(sorted(LOSS_KW.items())), entropy=True,
                          chunk=CHUNK)
  return make_roles_update(Qwen(cfg, lora=spec), optax.sgd(LR), {role: loss for role in ROLES})


def test_each_adapter_gets_its_own_roles_gradient(lora_qwen, role_reference, roles_update):
  """SGD through make_roles_update == each adapter minus lr x the gradient of its role's loss
  alone; the other role's minibatch does not touch it."""
  cfg, _, backbone, adapters = lora_qwen
  mbs = {"searcher": _minibatch(0, cfg.vocab_size), "generator": _minibatch(1, cfg.vocab_size)}
  new, _, metrics = roles_update(_copy(adapters), optax.sgd(LR).init(adapters), mbs, backbone)
  metrics = _host(metrics)
  assert metrics["skipped"] == 0
  total = 0.0
  for role in ROLES:
    other = ROLES[1 - ROLES.index(role)]
    value, grads = role_reference(adapters, role, mbs[role])
    # The reference itself: a role's loss has no gradient on the other adapter.
    assert all(not np.any(g) for g in jax.tree.leaves(_host(grads[other])))
    want = jax.tree.map(lambda p, g: p - LR * g, adapters[role], grads[role])
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                 _host(new[role]), _host(want))
    np.testing.assert_allclose(metrics[f"{role}/loss"], float(value), rtol=1e-5, atol=1e-6)
    assert f"{role}/kl" in metrics and f"{role}/clip_fraction" in metrics
    total += float(value)
  np.testing.assert_allclose(metrics["loss"], total, rtol=1e-5, atol=1e-6)
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
      jax.tree.leaves(_host(new)), jax.tree.leaves(_host(adapters))))
  assert moved > 1e-3  # the comparison is not between two unchanged trees

  # Another generator minibatch: the searcher's update is the same, bit for bit.
  mbs2 = dict(mbs, generator=_minibatch(7, cfg.vocab_size))
  new2, _, _ = roles_update(_copy(adapters), optax.sgd(LR).init(adapters), mbs2, backbone)
  jax.tree.map(np.testing.assert_array_equal, _host(new2["searcher"]), _host(new["searcher"]))
  assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-6 for a, b in zip(
      jax.tree.leaves(_host(new2["generator"])), jax.tree.leaves(_host(new["generator"]))))


def test_a_non_finite_role_skips_the_whole_update(lora_qwen, roles_update):
  cfg, _, backbone, adapters = lora_qwen
  bad = _minibatch(1, cfg.vocab_size)
  bad["advantages"] = bad["advantages"].at[0, 4].set(jnp.nan)
  mbs = {"searcher": _minibatch(0, cfg.vocab_size), "generator": bad}
  new, _, metrics = roles_update(_copy(adapters), optax.sgd(LR).init(adapters), mbs, backbone)
  assert int(metrics["skipped"]) == 1
  jax.tree.map(np.testing.assert_array_equal, _host(new), _host(adapters))


# ============================================================================ per-adapter clipping


def _adam_reference(grad_steps, lr, clip, per_adapter, b1=0.9, b2=0.95, eps=1e-8):
  """NumPy Adam (constant lr, no decay) on {adapter: {leaf: array}} from zeros, after clipping
  the gradients by their global norm: each adapter by its own, or all of them jointly."""
  params = {a: {k: np.zeros_like(g) for k, g in t.items()} for a, t in grad_steps[0].items()}
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)

  def norm(trees):
    return np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for t in trees
                       for g in t.values()))

  for t, grads in enumerate(grad_steps, start=1):
    joint = norm(grads.values())
    for a, tree in grads.items():
      factor = min(1.0, clip / (norm([tree]) if per_adapter else joint))
      for k, g in tree.items():
        g = g * factor
        m[a][k] = b1 * m[a][k] + (1 - b1) * g
        v[a][k] = b2 * v[a][k] + (1 - b2) * g * g
        mhat, vhat = m[a][k] / (1 - b1 ** t), v[a][k] / (1 - b2 ** t)
        params[a][k] = params[a][k] - lr * mhat / (np.sqrt(vhat) + eps)
  return params


def test_clip_each_clips_every_adapter_by_its_own_norm():
  """Known gradients whose norms cross the clip in turn (searcher 5, 0.2, 3; generator 0.3, 4,
  0.1): clip_each=True is the per-adapter reference, clip_each=False the joint one, and the two
  references differ (a joint clip shrinks the small adapter's step by the large one's norm)."""
  rng = np.random.default_rng(0)
  scales = {"searcher": (5.0, 0.2, 3.0), "generator": (0.3, 4.0, 0.1)}
  shapes = {"lora_a": (3, 2), "lora_b": (2, 4)}
  steps = []
  for i in range(3):
    step = {}
    for a, s in scales.items():
      raw = {k: rng.normal(size=shape) for k, shape in shapes.items()}
      n = np.sqrt(sum(np.sum(x ** 2) for x in raw.values()))
      step[a] = {k: (x * s[i] / n).astype(np.float32) for k, x in raw.items()}
    steps.append(step)
  lr = 1e-2
  refs = {each: _adam_reference(steps, lr, 1.0, per_adapter=each) for each in (True, False)}
  gap = max(np.abs(refs[True][a][k] - refs[False][a][k]).max() for a in scales for k in shapes)
  assert gap > 1e-3
  for each in (True, False):
    opt = make_adapter_optimizer({a: lr for a in scales}, 0, 10, weight_decay=0.0, clip_norm=1.0,
                                 final_lr_ratio=1.0, b2=0.95, clip_each=each)
    params = {a: {"x": {k: jnp.zeros(s, jnp.float32) for k, s in shapes.items()}}
              for a in scales}
    state = opt.init(params)
    for grads in steps:
      tree = {a: {"x": {k: jnp.asarray(g) for k, g in t.items()}} for a, t in grads.items()}
      updates, state = opt.update(tree, state, params)
      params = optax.apply_updates(params, updates)
    for a in scales:
      for k in shapes:
        np.testing.assert_allclose(np.asarray(params[a]["x"][k]), refs[each][a][k], rtol=2e-5,
                                   atol=1e-7, err_msg=f"clip_each={each} {a}/{k}")


def test_dac_run_clips_each_role(world_dir, tokenizer, tmp_path):
  """The trainer's optimizer for a DAC config clips per adapter (TrainTarget.optimizer_with):
  a huge searcher gradient leaves the generator's steps as they are alone (a constant gradient
  under Adam: exactly -lr per step), where a joint clip would shrink its first gradient."""
  from agentjax.train.adapters import TrainTarget
  config = tiny_config(world_dir, tokenizer.name_or_path, str(tmp_path), algorithm="dac")
  spec = config_lib.lora_spec(config)
  target = TrainTarget(None, spec, None, None, roles=config_lib.trained_roles(config))
  assert target.trained == ROLES
  lr = 1e-2
  opt = target.optimizer_with(lr, 0, 10, 0.0, 1.0, 1.0, 0.95)  # constant lr, clip 1
  params = {r: {"x": jnp.zeros((2, 2))} for r in ROLES}
  state = opt.init(params)
  for g in (1e3, 1.0):  # the generator's gradient is 0.1 everywhere (norm 0.2): never clipped
    grads = {"searcher": {"x": jnp.full((2, 2), g)}, "generator": {"x": jnp.full((2, 2), 0.1)}}
    updates, state = opt.update(grads, state, params)
  np.testing.assert_allclose(np.asarray(updates["generator"]["x"]), -lr, rtol=1e-5)


# ============================================================================ the two-role rollout

DOCS = [Document(r["id"], r["contents"], 1.0) for r in corpus_rows()]
QUESTIONS = ["Who founded Zorvath?", "Who founded Ostravane?"]
# Zorvath's founder is in the evidence the fake retriever gives; Ostravane's (Delphine) is not.
GOLDS = [["Aldric"], ["Delphine"]]
AUG_DEPTH = 7  # the augmentation call's depth: unlike the searcher's topk (2)


class FakeBackend:
  """The searcher's call of turn t returns ROUNDS[t] for every query (the same documents twice,
  then in another order: the evidence set dedups them in order); the augmentation call (depth
  AUG_DEPTH) returns `augment`, or fails as `fault` says."""

  ROUNDS = ([DOCS[0], DOCS[1]], [DOCS[1], DOCS[2]])

  def __init__(self, augment=(), fault=None):
    self.augment, self.fault = list(augment), fault
    self.stats = SearchStats()
    self.calls = []

  def search(self, queries, topk):
    self.calls.append((list(queries), topk))
    n = len(queries)
    if topk == AUG_DEPTH:
      if self.fault == "raise":
        raise ConnectionError("retriever down")
      if self.fault == "errors":
        return SearchResponse.failed(n, "timeout")
      if self.fault == "short":
        return SearchResponse([list(self.augment)], [None])
      return SearchResponse([list(self.augment) for _ in range(n)], [None] * n)
    # Every row searches in each of the searcher's 2 turns: one call per turn, 2 per rollout.
    turn = (sum(1 for _, k in self.calls if k != AUG_DEPTH) - 1) % len(self.ROUNDS)
    docs = self.ROUNDS[turn]
    return SearchResponse([list(docs) for _ in range(n)], [None] * n)


EVIDENCE = (DOCS[0], DOCS[1], DOCS[2])  # ROUNDS deduplicated in retrieval order


@pytest.fixture(scope="module")
def scripted_dac(scripted_world):
  """(agent-maker, params, tokenizer): a scripted searcher that thinks then searches every turn
  (greedy), as a LoRA model whose two adapters have B = 0 (both roles behave as the backbone:
  the generator's turn is a search the answer-only protocol rejects, which is all these tests
  need of it)."""
  tok, _, agent = scripted_world
  spec = LoraSpec(ROLES, rank=2, alpha=4.0)
  backbone = agent.params(af.SEARCH)
  adapters = init_adapters(agent.cfg, spec, jax.random.key(0))
  from agentjax.agent import RolloutConfig
  # One lane: the greedy rows move in lockstep, so FakeBackend gets one call per turn.
  searcher = RolloutConfig(group_size=2, max_turns=2, max_new_tokens=16, max_obs_tokens=96,
                           max_total_tokens=1024, topk=2, sampling=SamplingParams(greedy=True),
                           lanes=1)

  def make(backend, **settings):
    s = DacSettings(**{**dict(generator_samples=2, generator_max_new_tokens=16,
                              generator_max_total_tokens=1024, augment_depth=AUG_DEPTH,
                              augment_rate=0.0), **settings})
    return DacAgent(agent.cfg, tok, backend, searcher, s, lora=spec)

  def params(adapters=adapters):
    return {r: attach(backbone, adapters, spec, r) for r in ROLES}

  return make, params, adapters


def _prompt_text(dac, batch, g):
  return dac.generator.decode(np.asarray(batch.generator.tokens[g, :batch.generator.turn_ends[g,
                                                                                               0]]))


@pytest.fixture(scope="module")
def plain_run(scripted_dac):
  make, params, _ = scripted_dac
  dac = make(FakeBackend())
  out, metrics = dac.run(params(), QUESTIONS, jax.random.key(0), golds=GOLDS)
  return dac, out, metrics


def test_generator_sees_the_question_and_the_evidence_only(plain_run):
  dac, out, metrics = plain_run
  e, m = 4, 2  # 2 questions x group_size 2 evidence sets, 2 answers each
  assert out.searcher.tokens.shape[0] == e and out.generator.tokens.shape[0] == e * m
  assert out.samples == m
  np.testing.assert_array_equal(out.generator.group_ids, np.repeat(np.arange(e), m))
  assert list(out.searcher.num_turns) == [2] * e  # searched twice: the evidence has 2 rounds
  for b in range(e):
    assert out.evidence[b] == EVIDENCE  # deduplicated by id, first retrieval first
  for g in range(e * m):
    b = g // m
    question = QUESTIONS[out.searcher.group_ids[b]]
    want = generator_prompt(question, EVIDENCE, dac.settings.abstain_text)
    prompt = list(np.asarray(out.generator.tokens[g, :out.generator.turn_ends[g, 0]]))
    assert prompt == dac.generator.prompt_ids(want)  # exactly that text, chat-templated
    text = _prompt_text(dac, out, g)
    assert question in text and all(d.contents.split("\n")[1] in text for d in EVIDENCE)
    # Nothing of the searcher's turns: its thoughts, queries and observations stay behind.
    assert "Let me look." not in text and "<search>" not in text
    assert "<information>" not in text and "Notes from the search" not in text
  # S on the documents shown: Aldric (Zorvath) is in them, Delphine (Ostravane) is not.
  np.testing.assert_array_equal(out.sufficient, [True, True, False, False])
  assert not out.augmented.any() and not out.distractors.any()
  assert set(metrics) >= {"searcher_search_queries", "generator_sampled_tokens"}
  assert metrics["searcher_search_queries"] == 2 * e and metrics["generator_search_queries"] == 0


def test_generator_sees_the_searchers_turns_when_asked(scripted_dac, plain_run):
  make, params, _ = scripted_dac
  dac = make(FakeBackend(), sees_reasoning=True, max_evidence_docs=2)
  out, _ = dac.run(params(), QUESTIONS, jax.random.key(0), golds=GOLDS)
  for g in range(out.generator.tokens.shape[0]):
    b = g // out.samples
    assert out.evidence[b] == EVIDENCE[:2]  # max_evidence_docs: the first retrieved kept
    notes = "".join(t.text for t in out.searcher.turns[b])  # its own text, not the documents
    question = QUESTIONS[out.searcher.group_ids[b]]
    want = generator_prompt(question, EVIDENCE[:2], dac.settings.abstain_text, notes)
    assert _prompt_text(dac, out, g) == dac.generator.decode(dac.generator.prompt_ids(want))
    text = _prompt_text(dac, out, g)
    assert "Notes from the search:" in text and "<search>Zorvath founder</search>" in text
    assert "Let me look." in text and "<information>" not in text


def test_documents_are_dropped_from_the_end_to_fit_the_budget(scripted_dac):
  make, _, _ = scripted_dac
  long_docs = [Document(f"d{i}", f"\"T{i}\"\n" + " ".join(["word"] * 40 + [f"tail{i}"]), 1.0)
               for i in range(4)]
  probe = make(FakeBackend())
  sizes = [len(probe.generator.prompt_ids(generator_prompt(QUESTIONS[0], long_docs[:k],
                                                           probe.settings.abstain_text)))
           for k in range(5)]
  assert sizes == sorted(sizes) and len(set(sizes)) == 5
  new = 16
  # Room for two documents and the answer, not three.
  dac = make(FakeBackend(), generator_max_new_tokens=new, generator_max_total_tokens=sizes[2] + new)
  assert dac.fit(QUESTIONS[0], long_docs, None) == (tuple(long_docs[:2]), None)
  assert dac.fit(QUESTIONS[0], long_docs[:1], None) == (tuple(long_docs[:1]), None)
  # Notes that do not fit are cut to their end (the searcher's latest text) before failing.
  notes = " ".join(f"note{i}" for i in range(400))
  docs, cut = dac.fit(QUESTIONS[0], long_docs[:1], notes)
  assert docs == () and cut and notes.endswith(cut) and len(cut) < len(notes)
  dac = make(FakeBackend(), generator_max_new_tokens=new,
             generator_max_total_tokens=sizes[0] + new - 1)
  with pytest.raises(ValueError, match="generator_max_total_tokens"):
    dac.fit(QUESTIONS[0], long_docs, None)


def test_augmentation_adds_answer_free_hits_of_the_searchers_queries(scripted_dac):
  make, params, _ = scripted_dac
  # The augmentation hits, best first: an evidence document, one outside the evidence that holds
  # Zorvath's answer, then three answer-free ones (the first two are added).
  answer = Document("aldric", "\"Aldric\"\nAldric founded a fortress.", 1.0)
  hits = [DOCS[1], answer, DOCS[3], DOCS[4], DOCS[5]]
  backend = FakeBackend(augment=hits)
  dac = make(backend, augment_rate=1.0, augment_k=2)
  out, _ = dac.run(params(), QUESTIONS, jax.random.key(0), golds=GOLDS,
                   aug_rng=np.random.default_rng(0))
  aug_calls = [c for c in backend.calls if c[1] == AUG_DEPTH]
  # One batched call: the 2 queries of each of the 2 sufficient sets.
  assert len(aug_calls) == 1 and aug_calls[0][0] == ["Zorvath founder"] * 4
  np.testing.assert_array_equal(out.augmented, [True, True, False, False])
  np.testing.assert_array_equal(out.distractors, [2, 2, 0, 0])
  for b in range(2):
    assert sorted(d.id for d in out.evidence[b]) == sorted(
        d.id for d in EVIDENCE + (DOCS[3], DOCS[4]))
  assert out.evidence[2] == out.evidence[3] == EVIDENCE
  assert out.sufficient[:2].all()  # distractors hold no answer: the set stays sufficient


@pytest.mark.parametrize("fault", ["raise", "errors", "short"])
def test_a_failing_augmentation_call_leaves_the_sets_as_they_are(scripted_dac, fault):
  make, params, _ = scripted_dac
  backend = FakeBackend(augment=[DOCS[3], DOCS[4]], fault=fault)
  dac = make(backend, augment_rate=1.0, augment_k=2)
  out, _ = dac.run(params(), QUESTIONS, jax.random.key(0), golds=GOLDS,
                   aug_rng=np.random.default_rng(0))
  assert [c[1] for c in backend.calls].count(AUG_DEPTH) == 1  # it was asked, and failed
  assert not out.augmented.any() and not out.distractors.any()
  assert all(e == EVIDENCE for e in out.evidence)
  np.testing.assert_array_equal(out.sufficient, [True, True, False, False])


def test_roles_switch_adapters_without_compiling(scripted_dac, plain_run):
  """A second run whose generator adapter is another (random B), and one with the roles'
  adapters swapped, compile nothing: the adapter index is data. The searcher's rollout is
  unchanged by the generator's adapter, and the generator's is changed: each role runs its own."""
  make, params, adapters = scripted_dac
  dac, first, _ = plain_run
  other = dict(adapters)
  leaves, treedef = jax.tree.flatten(adapters["generator"])
  keys = jax.random.split(jax.random.key(5), len(leaves))
  other["generator"] = jax.tree.unflatten(treedef, [
      x + 30.0 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
  counter = CompileCounter()
  out, _ = dac.run(params(other), QUESTIONS, jax.random.key(0), golds=GOLDS)
  assert counter.count == 0
  np.testing.assert_array_equal(np.asarray(out.searcher.tokens), np.asarray(first.searcher.tokens))
  assert not np.array_equal(np.asarray(out.generator.tokens), np.asarray(first.generator.tokens))
  # The roles' adapters swapped (both B = 0: the same trajectories, only the index differs).
  same = params()
  counter = CompileCounter()
  out, _ = dac.run({"searcher": same["generator"], "generator": same["searcher"]}, QUESTIONS,
                   jax.random.key(0), golds=GOLDS)
  assert counter.count == 0
  np.testing.assert_array_equal(np.asarray(out.generator.tokens),
                                np.asarray(first.generator.tokens))


# ============================================================================ the trainer

SEARCHER_LR, GENERATOR_LR = 1e-2, 1e-4


def _dac_config(world_dir, tokenizer_dir, tmp):
  c = tiny_config(world_dir, tokenizer_dir, tmp, algorithm="dac", steps=2)
  # One decoder layer (the tiny preset has 2): compiling the layers is most of a run's time, and
  # nothing checked here depends on depth (the adapters' per-layer PEFT names and their mapping
  # are tests/test_lora_peft.py's, on the 2-layer presets).
  c.model.shape.num_layers = 1
  c.model.lora.init = ""
  c.model.lora.rank = 4
  # The generator 100x slower than the searcher: the rates must reach their adapters.
  c.model.lora.lr = f"searcher={SEARCHER_LR:g},generator={GENERATOR_LR:g}"
  c.train.eval_every = 0  # the final eval still runs
  c.dac.generator_samples = 2
  c.dac.generator_max_new_tokens = 16
  c.dac.generator_max_total_tokens = 512
  c.dac.max_evidence_docs = 2
  c.dac.augment_rate = 1.0
  return c


def _metrics(workdir, key="reward"):
  return run_metrics(workdir, key)


@pytest.fixture(scope="module")
def dac_runs(world_dir, tokenizer, tmp_path_factory):
  """A: 2 DAC steps uninterrupted. B: the same stopped after 1 step, then resumed. Then
  eval_benchmarks on A's workdir (its result is the fifth item)."""
  from agentjax.train.evaluation import eval_benchmarks
  from agentjax.train.trainer import train
  tmp = str(tmp_path_factory.mktemp("dac_runs"))
  config = _dac_config(world_dir, tokenizer.name_or_path, tmp)
  # Each train() jits its update anew (jit's in-memory cache misses): the resumed runs read the
  # first run's programs from the suite's persistent compilation cache (tests/conftest.py).
  a = train(config, os.path.join(tmp, "a"))
  train(config, os.path.join(tmp, "b"), stop_after=1)
  b = train(config, os.path.join(tmp, "b"))
  evaluated = eval_benchmarks(config, workdir=os.path.join(tmp, "a"))
  return config, tmp, a, b, evaluated


def _largest_b(adapter) -> float:
  """max |lora_b| of an adapter: B starts at 0, so this is how far the adapter moved."""
  flat = jax.tree_util.tree_flatten_with_path(_host(adapter))[0]
  return max(float(np.abs(x).max()) for p, x in flat if p[-1].key == "lora_b")


def test_both_adapters_train_each_at_its_rate_on_a_frozen_backbone(dac_runs):
  _, tmp, a, _, _ = dac_runs
  assert a["step"] == 2 and sorted(a["params"]) == sorted(ROLES)
  # The train state holds the adapters only: the backbone is never an optimizer's.
  leaves = jax.tree_util.tree_flatten_with_path(a["params"])[0]
  assert leaves and all(getattr(p[-1], "key", None) in ("lora_a", "lora_b") for p, _ in leaves)
  recorded = json.load(open(os.path.join(tmp, "a", "config.json")))["lora"]
  assert recorded["adapters"] == list(ROLES)
  moved = {r: _largest_b(a["params"][r]) for r in ROLES}
  assert moved["generator"] > 0 and moved["searcher"] > 0
  # Adam's steps are ~lr each: 100x apart in rate, far apart in movement.
  assert moved["searcher"] > 10 * moved["generator"], moved
  assert moved["generator"] < 10 * GENERATOR_LR, moved


def test_resumed_dac_run_repeats_the_uninterrupted_one(dac_runs):
  _, tmp, a, b, _ = dac_runs
  rows_a, rows_b = _metrics(os.path.join(tmp, "a")), _metrics(os.path.join(tmp, "b"))
  assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [1, 2]
  evals_a = _metrics(os.path.join(tmp, "a"), "eval/f1")
  evals_b = _metrics(os.path.join(tmp, "b"), "eval/f1")
  assert len(evals_a) == len(evals_b) == 1
  for ra, rb in zip(rows_a + evals_a, rows_b + evals_b):
    assert set(ra) == set(rb)
    for key, value in ra.items():
      if key not in TIMING and not key.startswith("sys/"):
        assert rb[key] == value, (ra["step"], key)
  jax.tree.map(np.testing.assert_array_equal, _host(a["params"]), _host(b["params"]))


def test_metrics_hold_both_roles(dac_runs):
  _, tmp, _, _, _ = dac_runs
  rows = _metrics(os.path.join(tmp, "a"))
  want = {"dac/sufficiency_rate", "dac/abstain_rate", "dac/abstain_precision",
          "dac/abstain_recall", "dac/coverage", "dac/accuracy_answered", "dac/augmented_rate",
          "dac/evidence_docs", "dac/searcher_turns"}
  want |= {f"dac/{r}_reward" for r in ROLES}
  # Each role's update as "<role>/<name>" (train/step.RLStep, as for any run of several roles),
  # and the keys every RL run logs (their means over the roles).
  want |= {f"{r}/{k}" for r in ROLES for k in ("kl", "clip_fraction", "entropy", "loss", "lr")}
  want |= {"kl", "entropy", "clip_fraction", "collapse_fraction", "zero_adv_fraction",
           "tokens_per_s", "search_wait_s", "useful_row_share", "mismatch/abs_logp_diff",
           "mismatch/kl", "mismatch/ratio_out_share"}
  for row in rows:
    assert want <= set(row), sorted(want - set(row))
    # Both roles' sampler log-probs are the scoring pass's (CPU, float32): no gap.
    assert row["mismatch/abs_logp_diff"] < 1e-4 and row["mismatch/ratio_out_share"] == 0.0
    assert all(np.isfinite(row[k]) for k in want)
    assert 0.0 <= row["dac/sufficiency_rate"] <= 1.0 and row["skipped_updates"] == 0
    assert row["reward"] == row["dac/generator_reward"]
  # Step 1 starts at B = 0 (policy == backbone == reference); by step 2 both roles have moved.
  assert rows[0]["searcher/kl"] == pytest.approx(0.0, abs=1e-7)
  assert rows[1]["searcher/kl"] > 0 and rows[1]["generator/kl"] > 0
  assert rows[1]["kl"] == pytest.approx((rows[1]["searcher/kl"] + rows[1]["generator/kl"]) / 2)


def test_adapters_are_exported_as_peft_folders(dac_runs):
  from agentjax.models.qwen.peft import load_peft
  config, tmp, a, _, _ = dac_runs
  assert a["hf_export"] is None  # one merged model would hold one role only
  cfg = a["cfg"]
  spec = config_lib.lora_spec(config)
  assert sorted(os.listdir(os.path.join(tmp, "a", "adapters"))) == sorted(ROLES)
  for role in ROLES:
    loaded = load_peft(os.path.join(tmp, "a", "adapters", role), cfg, spec)
    jax.tree.map(np.testing.assert_array_equal, _host(loaded), _host(a["params"][role]))


def test_eval_benchmarks_scores_abstention_on_the_dac_workdir(dac_runs):
  """eval_benchmarks on the workdir restores both adapters: it repeats the run's own final eval
  (greedy, the same dev questions) and reports coverage and the abstention scores."""
  from agentjax.train.evaluation import ABSTENTION_SCORES
  config, tmp, _, _, result = dac_runs
  (name, bench), = result["benchmarks"].items()
  assert set(ABSTENTION_SCORES) <= set(bench)
  rows = result["per_question"][name]
  assert len(rows) == bench["n"] == config.data.eval_size
  assert all({"abstained", "sufficient"} <= set(r) for r in rows)
  assert bench["coverage"] == np.mean([r["answer"] is not None for r in rows])
  assert bench["abstain_rate"] == np.mean([r["abstained"] for r in rows])
  assert not any(r["abstained"] and r["answer"] is not None for r in rows)
  with open(os.path.join(tmp, "a", "eval", "2.json")) as f:
    during = json.load(f)
  for key in ("f1", "em", "format_ok", "turns") + ABSTENTION_SCORES:
    assert bench[key] == during[key], key
  assert [r["answer"] for r in rows] == [r["answer"] for r in during["per_question"]]
  final = _metrics(os.path.join(tmp, "a"), "eval/f1")[-1]
  assert {f"eval/{k}" for k in ABSTENTION_SCORES} <= set(final)


# ============================================================================ config


def test_dac_needs_both_role_adapters(world_dir, tokenizer, tmp_path):
  config = tiny_config(world_dir, tokenizer.name_or_path, str(tmp_path), algorithm="dac")
  config.model.lora.init = ""  # the demo's warm start folder is not built here
  config_lib.validate(config)  # the preset itself is valid
  config.model.lora.adapters = "searcher"
  with pytest.raises(config_lib.ConfigError, match=r"model\.lora\.adapters.*generator"):
    config_lib.validate(config)
