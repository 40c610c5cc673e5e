"""Rubric-guided agents (agentjax/coreact/guided.py) and the sampler's rewind: the shadow suffix
token for token, verify and retry, Best-of-N selection, the rubric generator."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.agent import (ANSWER, INVALID, SEARCH, RolloutConfig, RolloutEngine, search_stats,
                            transcripts_of)
from agentjax.agent.protocol import Action
from agentjax.coreact.context import BranchContext
from agentjax.coreact.guided import GuidedEngine, GuidedSettings, RubricGenerator
from agentjax.coreact.rubric import (parse_rubric, retry_suffix, rubric_prompt, rubric_suffix,
                                     strip_think)
from agentjax.models.qwen import Qwen, init_params
from agentjax.sampling import SamplingParams, StopTable, extend, generate, init_state
from agentjax.sampling.sampler import rewind
from tests import agent_fixtures as af

QUESTIONS = ["Who founded Zorvath?", "Where is Quellmoor?"]
RUBRIC = parse_rubric("1. [0.6] The action answers\n2. [0.4] The query repeats no earlier query")
FAILED = RUBRIC.items[:1]
SUFFIX = rubric_suffix(RUBRIC)
RETRY = SUFFIX + retry_suffix(RUBRIC, FAILED)


class Source:
  """A rubric source that gives RUBRIC for every context and records the contexts."""

  def __init__(self):
    self.seen: list[BranchContext] = []

  def __call__(self, contexts):
    self.seen += contexts
    return [RUBRIC] * len(contexts)


class RuleApplier:
  """Scores an action by a rule on its parsed kind; records every call."""

  def __init__(self, by_kind):
    self.by_kind, self.calls = by_kind, []

  def score(self, rubrics, contexts, actions):
    self.calls.append(list(actions))
    return [self.by_kind.get(c.parse(a).kind, 0.0) for c, a in zip(contexts, actions)]


def guided(world, settings, sampling=SamplingParams(greedy=True), **kw):
  """The test_rollout.py shapes (2 questions x 2, 1024 slots): the programs compile once."""
  tok, backend, agent = world
  rollout = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
                          max_total_tokens=1024, topk=2, sampling=sampling)
  return GuidedEngine(agent.cfg, tok, backend, rollout, settings, **kw)


def random_params(agent, seed=0):
  """Random weights of the scripted shapes, scaled so the next token depends on the context."""
  return jax.tree.map(lambda x: x * 4.0, init_params(agent.cfg, jax.random.key(seed)))


def observation_of(eng, record):
  """The observation ids a turn's record implies (the engine's own encoders)."""
  p = eng.protocol
  if record.action.kind == SEARCH:
    if record.search_error is not None:
      return eng.observation_ids(*p.error_observation(record.search_error))
    return eng.observation_ids(*p.observation(record.documents))
  if record.action.kind == ANSWER:
    return []
  return eng.encode(p.invalid_observation())


def turn0_ids(batch, b):
  """Row b's turn-0 action: its sampled tokens (turn 0 is never guided)."""
  tokens, mask, turn_id = (np.asarray(x[b]) for x in jax.device_get(
      (batch.tokens, batch.loss_mask, batch.turn_id)))
  return tokens[mask & (turn_id == 0)].tolist()


def contains(row, ids):
  return any(row[i:i + len(ids)] == ids for i in range(len(row) - len(ids) + 1))


# ------------------------------------------------------------------------------ rewind


def test_rewind_is_as_if_the_suffix_was_never_fed(world):
  """prompt, suffix, rewind, action == prompt, action: the same cache-visible tokens and, to
  float tolerance, the same logits then and on every later greedy step; generating right after a
  rewind (with the saved logits) is generating from the prompt alone."""
  _, _, agent = world
  cfg, params = agent.cfg, random_params(agent)
  model = Qwen(cfg)
  prompt = [[5, 17, 30, 2, 9], [40, 41, 42]]
  suffix = [[100, 101, 102, 103], []]       # row 1 gets no suffix: it must be untouched
  action = [[7, 8, 9], [11, 12]]
  stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
          jnp.int32(64))
  greedy = SamplingParams(greedy=True)

  def feed(state, rows, turn):
    block = np.zeros((2, 16), np.int32)
    for b, r in enumerate(rows):
      block[b, :len(r)] = r
    return extend(model, params, state, jnp.asarray(block),
                  jnp.asarray([len(r) for r in rows], jnp.int32), jnp.full((2,), turn, jnp.int32))

  def fresh():
    return feed(init_state(cfg, 2, 64, jax.random.key(0)), prompt, -1)

  plain = feed(fresh(), action, 0)

  shadow = fresh()
  saved = np.asarray(shadow.next_logits)
  before = jnp.copy(shadow.next_logits)
  shadow = feed(shadow, suffix, 0)
  shadow, _ = generate(model, params, shadow, jnp.array([True, False]), jnp.zeros(2, jnp.int32),
                       stop, greedy, 4)  # sampled tokens after the suffix: cleared too
  lengths = jnp.asarray([len(p) for p in prompt], jnp.int32)
  shadow = rewind(shadow, lengths, before)
  tokens, valid, sampled, logprobs, turn_id, length, logits = (np.asarray(x) for x in (
      shadow.tokens, shadow.valid, shadow.sampled, shadow.logprobs, shadow.turn_id,
      shadow.length, shadow.next_logits))
  assert length.tolist() == [5, 3]
  for b, p in enumerate(prompt):
    assert tokens[b, :len(p)].tolist() == p and not tokens[b, len(p):].any()
    assert valid[b].tolist() == [True] * len(p) + [False] * (64 - len(p))
    assert not sampled[b].any() and not logprobs[b].any()
    assert (turn_id[b] == -1).all()
  np.testing.assert_array_equal(logits, saved)  # the logits after the prompt again

  # Generating from the rewound state = generating from the prompt alone.
  direct, gen_a = generate(model, params, fresh(), jnp.array([True, True]),
                           jnp.zeros(2, jnp.int32), stop, greedy, 4)
  shadow2 = fresh()
  keep = jnp.copy(shadow2.next_logits)
  shadow2 = feed(shadow2, suffix, 0)
  shadow2 = rewind(shadow2, lengths, keep)
  shadow2, gen_b = generate(model, params, shadow2, jnp.array([True, True]),
                            jnp.zeros(2, jnp.int32), stop, greedy, 4)
  np.testing.assert_array_equal(np.asarray(gen_a.new_tokens), np.asarray(gen_b.new_tokens))
  np.testing.assert_allclose(np.asarray(shadow2.next_logits), np.asarray(direct.next_logits),
                             rtol=1e-5, atol=1e-5)

  # Re-feeding the action after the rewind = feeding it without the suffix ever seen.
  shadow = feed(shadow, action, 0)
  for name in ("tokens", "valid", "sampled", "turn_id", "length"):
    np.testing.assert_array_equal(np.asarray(getattr(shadow, name)),
                                  np.asarray(getattr(plain, name)), err_msg=name)
  np.testing.assert_allclose(np.asarray(shadow.next_logits), np.asarray(plain.next_logits),
                             rtol=1e-5, atol=1e-5)
  # ... and on the next steps (the KV entries of the suffix are unreachable).
  shadow, gen_s = generate(model, params, shadow, jnp.array([True, True]),
                           jnp.zeros(2, jnp.int32), stop, greedy, 4)
  plain, gen_p = generate(model, params, plain, jnp.array([True, True]), jnp.zeros(2, jnp.int32),
                          stop, greedy, 4)
  np.testing.assert_array_equal(np.asarray(gen_s.new_tokens), np.asarray(gen_p.new_tokens))
  np.testing.assert_allclose(np.asarray(shadow.next_logits), np.asarray(plain.next_logits),
                             rtol=1e-5, atol=1e-5)
  # The suffix did change the model's view while it was there (the test can fail).
  seen = feed(fresh(), suffix, 0)
  assert not np.allclose(np.asarray(seen.next_logits)[0], saved[0], atol=1e-3)


# ------------------------------------------------------------------------------ shadow suffix


@pytest.mark.parametrize("persist", [False, True])
def test_shadow_suffix_context_token_for_token(world, persist):
  """A context-sensitive (random) policy, greedy: after each guided step the row's context is the
  prompt and, per turn, the action's exact sampled ids and its observation; no rubric id anywhere
  (persist=False). persist=True keeps each suffix before its action."""
  tok, backend, agent = world
  params = random_params(agent)
  source = Source()
  eng = guided(world, GuidedSettings(mode="coreact", verify=False, persist=persist),
               rubric_source=source)
  batch, metrics = eng.run(params, QUESTIONS, jax.random.key(0))
  suffix_ids = eng.encode(SUFFIX)
  tokens, valid, loss_mask = (np.asarray(x) for x in jax.device_get(
      (batch.tokens, batch.valid, batch.loss_mask)))
  guided_ids = {(e["turn"], e["row"]): e["ids"] for e in eng.trace}
  assert len(guided_ids) == sum(n - 1 for n in batch.num_turns) > 0
  for b in range(4):
    want = eng.prompt_ids(QUESTIONS[b // 2])
    for t, record in enumerate(batch.turns[b]):
      ids = turn0_ids(batch, b) if t == 0 else guided_ids[(t, b)]
      assert eng.decode(ids) == record.text
      want += (suffix_ids if persist and t > 0 else []) + ids + observation_of(eng, record)
      assert record.hook_text == (SUFFIX if persist and t > 0 else "")
      assert record.shadow_text == ("" if persist or t == 0 else SUFFIX)
    n = int(valid[b].sum())
    assert tokens[b, :n].tolist() == want
    assert list(batch.turn_ends[b])[batch.num_turns[b]] == n
    assert contains(tokens[b, :n].tolist(), suffix_ids) == (persist and batch.num_turns[b] > 1)
    # Turn 0 was sampled in place; shadow-guided actions were fed again (inference only).
    if not persist:
      assert loss_mask[b].sum() == len(turn0_ids(batch, b))
  # The transcript is exactly the records' kept text (shadow text is not in it).
  for b, text in enumerate(transcripts_of(batch, eng.byte_table)):
    prompt = eng.decode(eng.prompt_ids(QUESTIONS[b // 2]))
    assert prompt + "".join(r.hook_text + r.text + r.observation for r in batch.turns[b]) == text
  # No rubric at turn 0; each later step's context is the row's history so far.
  assert [c.step for c in source.seen] == [t for t in range(1, 3) for b in range(4)
                                           if batch.num_turns[b] > t]
  assert all(c.question["question"] in QUESTIONS and "golden_answers" not in c.question
             for c in source.seen)
  assert metrics["guided_rubrics"] == len(source.seen) and metrics["guided_verify_checks"] == 0
  # The suffix mattered: the plain agent's later actions differ (its first ones do not).
  plain = RolloutEngine(agent.cfg, tok, backend, eng.config)
  ref, _ = plain.run(params, QUESTIONS, jax.random.key(0))
  assert [r[0].text for r in ref.turns] == [r[0].text for r in batch.turns]
  assert [r[1].text for r in ref.turns] != [r[1].text for r in batch.turns]


# ------------------------------------------------------------------------------ verify and retry


def test_verify_retries_once_below_threshold_and_accepts_the_retry(world):
  """Sampled search-or-answer policy; the applier scores an answer 1 and a search 0: a step
  whose first action searches is retried exactly once (with the rubric and the feedback shown),
  the retry is accepted unverified; an answering step is not retried. The context holds the
  accepted action only."""
  tok, backend, agent = world
  params = agent.params(af.SEARCH, af.ANSWER, extra_starts=[SUFFIX, RETRY])
  applier = RuleApplier({ANSWER: 1.0, SEARCH: 0.0})
  eng = guided(world, GuidedSettings(mode="coreact", verify=True, verify_threshold=0.6,
                                     max_retries=1), SamplingParams(temperature=1.0),
               rubric_source=Source(), applier=applier,
               feedback=lambda rubric, ctx, text: FAILED)
  batch, metrics = eng.run(params, QUESTIONS, jax.random.key(5))  # on the slot engine
  assert eng.trace
  retried = 0
  for e in eng.trace:
    first = eng.parse(e["actions"][0]).kind
    if first == SEARCH:
      assert e["retries"] == 1 and e["scores"] == [0.0] and e["shown"] == RETRY
      retried += 1
    else:
      assert first == ANSWER and e["retries"] == 0 and e["scores"] == [1.0]
      assert e["shown"] == SUFFIX
    assert eng.decode(e["ids"]) == e["actions"][-1] == batch.turns[e["row"]][e["turn"]].text
    assert batch.turns[e["row"]][e["turn"]].shadow_text == e["shown"]
  assert 0 < retried < len(eng.trace)  # both cases occur with this key
  assert metrics["guided_verify_retries"] == retried
  assert metrics["guided_verify_checks"] == len(eng.trace)  # retries are not verified
  assert sum(len(c) for c in applier.calls) == len(eng.trace)
  assert metrics["guided_verify_score_mean"] == pytest.approx(
      np.mean([e["scores"][0] for e in eng.trace]))
  tokens, valid = (np.asarray(x) for x in jax.device_get((batch.tokens, batch.valid)))
  ids = {(e["turn"], e["row"]): e["ids"] for e in eng.trace}
  for b in range(4):
    want = eng.prompt_ids(QUESTIONS[b // 2])
    for t, record in enumerate(batch.turns[b]):
      want += (turn0_ids(batch, b) if t == 0 else ids[(t, b)]) + observation_of(eng, record)
    assert tokens[b, :int(valid[b].sum())].tolist() == want
    assert not contains(want, eng.encode(SUFFIX))

  high = RuleApplier({ANSWER: 1.0, SEARCH: 1.0})
  eng = guided(world, GuidedSettings(mode="coreact", verify=True), SamplingParams(temperature=1.0),
               rubric_source=Source(), applier=high)
  _, metrics = eng.run(params, QUESTIONS, jax.random.key(0))
  assert metrics["guided_verify_retries"] == 0 and all(e["retries"] == 0 for e in eng.trace)
  assert metrics["guided_verify_checks"] == len(eng.trace) > 0


# ------------------------------------------------------------------------------ Best-of-N


def test_best_of_n_picks_the_argmax_and_keeps_only_it(world):
  """N sampled proposals per step: "self" picks the highest mean sampled log-prob (checked
  against the scripted model's exact log-probs), "rubric" the highest applier score; the context
  holds the chosen action only."""
  tok, backend, agent = world
  # After </think>: an empty search (2 tokens, invalid) or an answer (3), each with prob 1/2; every
  # other token is certain. Mean log-prob: -log 2 / 5 (search) < -log 2 / 6 (answer).
  params = agent.params(af.EMPTY_SEARCH, af.ANSWER)
  branch = set(agent.ids([af.EMPTY_SEARCH[0], af.ANSWER[0]]))
  for select, n_rows_at_turn0 in (("self", 4), ("rubric", 0)):
    applier = RuleApplier({ANSWER: 0.9, INVALID: 0.2})
    eng = guided(world, GuidedSettings(mode="best_of_n", best_of_n=3, best_of_n_select=select),
                 SamplingParams(temperature=1.0), rubric_source=Source(), applier=applier)
    batch, metrics = eng.run(params, QUESTIONS, jax.random.key(0))
    assert sum(e["turn"] == 0 for e in eng.trace) == n_rows_at_turn0
    assert eng.trace and metrics["guided_proposals"] == 3 * len(eng.trace)
    for e in eng.trace:
      lps = [np.asarray(lp, np.float64) for lp in e["logprobs"]]
      for ids, lp in zip(e["ids"], lps):
        want = [-np.log(2.0) if i in branch else 0.0 for i in ids]
        np.testing.assert_allclose(lp, want, atol=1e-4)
      np.testing.assert_allclose(e["self_scores"], [lp.mean() for lp in lps], rtol=1e-6)
      kinds = [eng.parse(a).kind for a in e["actions"]]
      criterion = e["self_scores"] if select == "self" else \
          [applier.by_kind[k] for k in kinds]
      assert e["scores"] == pytest.approx(criterion)
      assert e["chosen"] == int(np.argmax(criterion))
      assert (kinds[e["chosen"]] == ANSWER) == (ANSWER in kinds)
      record = batch.turns[e["row"]][e["turn"]]
      assert record.text == e["actions"][e["chosen"]]
    assert len({len(set(e["actions"])) for e in eng.trace} - {1}) > 0  # proposals differ
    tokens, valid = (np.asarray(x) for x in jax.device_get((batch.tokens, batch.valid)))
    chosen = {(e["turn"], e["row"]): e["ids"][e["chosen"]] for e in eng.trace}
    for b in range(4):
      want = eng.prompt_ids(QUESTIONS[b // 2])
      for t, record in enumerate(batch.turns[b]):
        ids = chosen.get((t, b)) or turn0_ids(batch, b)
        want += ids + observation_of(eng, record)
      assert tokens[b, :int(valid[b].sum())].tolist() == want


# ------------------------------------------------------------------------------ both engines


@pytest.mark.parametrize("mode", ["shadow", "verify_persist", "best_of_n"])
def test_guided_rollouts_on_the_slot_engine_equal_the_turn_engine(world, mode):
  """Greedy: the guide (RolloutEngine.guide, which both engines honour) gives the same
  trajectories token by token, the same decisions and counts on the slot engine (the default;
  with verify, two slots refilled in one lane) as on the turn engine: a shadow suffix, verify
  with retries after a kept suffix, Best-of-N."""
  from tests.test_slot_rollout import assert_same_trajectories
  tok, backend, agent = world
  settings, params, layout = {
      "shadow": (GuidedSettings(mode="coreact", verify=False), random_params(agent), {}),
      "verify_persist": (GuidedSettings(mode="coreact", verify=True, max_retries=1, persist=True),
                         random_params(agent), dict(slots=2, lanes=1)),
      "best_of_n": (GuidedSettings(mode="best_of_n", best_of_n=3, best_of_n_select="self"),
                    agent.params(af.SEARCH, af.ANSWER), {})}[mode]
  runs = {}
  for engine, extra in (("turns", {}), ("slots", layout)):
    config = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
                           max_total_tokens=1024, topk=2, sampling=SamplingParams(greedy=True),
                           engine=engine, **extra)
    eng = GuidedEngine(agent.cfg, tok, backend, config, settings, rubric_source=Source(),
                       applier=RuleApplier({ANSWER: 1.0, SEARCH: 0.0, INVALID: 0.3}))
    batch, metrics = eng.run(params, QUESTIONS, jax.random.key(0))
    trace = sorted(eng.trace, key=lambda e: (e["turn"], e["row"]))
    runs[engine] = batch, metrics, trace
  (want, want_metrics, want_trace), (got, metrics, trace) = runs["turns"], runs["slots"]
  assert_same_trajectories(got, want)
  assert want_trace and repr(trace) == repr(want_trace)  # (repr: log-prob arrays)
  for key in want_metrics:
    if key.startswith("guided_") and key != "guided_verify_score_mean" or \
        key in ("sampled_tokens", "search_queries"):
      assert metrics[key] == want_metrics[key], key
  if mode == "verify_persist":
    assert want_metrics["guided_verify_retries"] > 0


# ------------------------------------------------------------------------------ generator


def test_rubric_generator_prompts_and_parses(chat_model_dir):
  """The generator's prompt is rubric_prompt as a chat user turn; its reply is the Completer's
  greedy completion of it, parsed; a failing completer leaves every row without a rubric."""
  from agentjax.sampling.complete import Completer
  completer = Completer.from_hf(chat_model_dir, max_total_tokens=2048)
  gen = RubricGenerator(completer, max_new_tokens=16)
  ctx = [BranchContext(question={"question": q}, turns=(), max_calls=4) for q in QUESTIONS]
  out = gen(ctx)
  for c, rubric in zip(ctx, out):
    ids = completer.chat_ids([{"role": "user", "content": rubric_prompt(c)}])
    assert gen.prompt_ids(c) == ids
    text = completer.complete([ids], max_new_tokens=16)[0].text
    assert rubric == parse_rubric(strip_think(text))
  assert gen.stats["calls"] == 1 and gen.stats["rubrics"] + gen.stats["empty"] == 2
  # A budget too small for the whole trajectory: the prompt is cut to fit; none fits -> None.
  long_ctx = BranchContext(question={"question": "Who?"}, max_calls=4, turns=tuple(
      af_turn(i) for i in range(12)))
  small = RubricGenerator(types.SimpleNamespace(
      tokenizer=completer.tokenizer, max_total_tokens=600, chat_ids=completer.chat_ids,
      encode=completer.encode), max_new_tokens=16)
  assert len(small.prompt_ids(long_ctx)) <= 600 - 16 < len(gen.prompt_ids(long_ctx))
  tiny = RubricGenerator(types.SimpleNamespace(
      tokenizer=completer.tokenizer, max_total_tokens=40, chat_ids=completer.chat_ids,
      encode=completer.encode, complete=None), max_new_tokens=16)
  assert tiny(ctx) == [None, None] and tiny.stats["too_long"] == 2

  class Broken:
    tokenizer, max_total_tokens = completer.tokenizer, 2048
    chat_ids, encode = completer.chat_ids, completer.encode

    def complete(self, *a, **k):
      raise RuntimeError("out of memory")

  broken = RubricGenerator(Broken(), max_new_tokens=16)
  assert broken(ctx) == [None, None] and broken.stats["failed"] == 2
  # A thinking budget needs one-token <think> tags, which this tokenizer lacks: refused at
  # construction naming the field (not as a failure of every call).
  with pytest.raises(ValueError, match="coreact.generator_max_think_tokens"):
    RubricGenerator(completer, max_new_tokens=16, max_think_tokens=1500)


def af_turn(i):
  from agentjax.agent.trajectories import TurnRecord
  return TurnRecord(text=f"<think>step {i} thinking</think><search>query number {i}</search>",
                    action=Action(SEARCH, f"query number {i}"),
                    observation="<information>" + "words " * 40 + "</information>")


# ------------------------------------------------------------------------------ settings, stats


def test_settings_and_missing_parts_are_refused(world):
  with pytest.raises(ValueError, match="best_of_n_select"):
    GuidedSettings(mode="best_of_n", best_of_n_select="judge")
  with pytest.raises(ValueError, match="mode"):
    GuidedSettings(mode="react")
  with pytest.raises(ValueError, match="rubric source"):
    guided(world, GuidedSettings(mode="coreact"))
  with pytest.raises(ValueError, match="applier"):
    guided(world, GuidedSettings(mode="coreact", verify=True), rubric_source=Source())
  guided(world, GuidedSettings(mode="best_of_n", best_of_n_select="self"))  # needs neither


def test_search_stats_counts_repeated_normalized_queries():
  def turn(kind, content):
    return types.SimpleNamespace(action=Action(kind, content))
  turns = [turn(SEARCH, "Zorvath founder"), turn(INVALID, "x"),
           turn(SEARCH, "the zorvath  Founder!"), turn(SEARCH, "Quellmoor"),
           turn(SEARCH, "zorvath founder"), turn(ANSWER, "Aldric")]
  assert search_stats(turns) == (4, 2)
  assert search_stats([]) == (0, 0)


# ------------------------------------------------------------------------------ eval wiring


def test_make_guided_engine_from_config_and_eval_metrics(world, world_dir):
  """make_guided_engine builds the executor applier (its failed criteria as the feedback) from
  config.coreact; evaluate() of a guided engine reports the redundant-query rate and the steps to
  answer, checked against the trajectories' own records."""
  import os

  from configs import coreact
  from agentjax.coreact.appliers import ExecutorApplier
  from agentjax.coreact.guided import make_guided_engine
  from agentjax.train.evaluation import evaluate
  tok, backend, agent = world
  config = coreact.get_config("demo")
  config.coreact.entities_path = os.path.join(world_dir, "entities.jsonl")
  config.coreact.best_of_n_select = "self"
  rollout = guided(world, GuidedSettings(mode="best_of_n", best_of_n_select="self"),
                   SamplingParams(temperature=1.0)).config
  bon = make_guided_engine(config, agent.cfg, tok, backend, rollout, "best_of_n")
  assert bon.rubric_source is None and bon.applier is None  # "self" needs neither
  eng = make_guided_engine(config, agent.cfg, tok, backend, rollout, "coreact",
                           rubric_source=Source())
  assert isinstance(eng.applier, ExecutorApplier) and eng.feedback is not None
  assert eng.settings.describe() == {"verify": True, "verify_threshold": 0.6, "max_retries": 1,
                                     "persist": False}
  ctx = BranchContext(question={"question": "Who founded Zorvath?"}, turns=(), max_calls=3)
  assert list(eng.feedback(RUBRIC, ctx, "<search>Zorvath founder</search>")) == [RUBRIC.items[0]]
  # A generator folder that is not there (the preset's default, runs/demo/..., may exist in a
  # clone where the guide's commands ran).
  config.coreact.generator_path = os.path.join(world_dir, "no_generator")
  with pytest.raises(ValueError, match="generator_path"):
    make_guided_engine(config, agent.cfg, tok, backend, rollout, "coreact")

  records = [{"id": f"q{i}", "question": q, "golden_answers": ["Aldric"]}
             for i, q in enumerate(QUESTIONS)]
  runs = []
  real_run = eng.run

  def recording_run(*args):
    batch, metrics = real_run(*args)
    runs.append(batch)
    return batch, metrics

  eng.run = recording_run
  params = agent.params(af.SEARCH, af.ANSWER, extra_starts=[SUFFIX, RETRY])
  out = evaluate(eng, params, records, batch_size=2, samples=2, seed=0)
  assert eng.summary()["rubrics"] > 0
  searches = redundant = 0
  answered_turns = []
  for batch in runs:
    for b in (0, 1):  # group_size 2: rows 0, 1 are question 0's; evaluate reads rows 0 and 1
      turns = batch.turns[b]
      queries = [" ".join(t.action.content.lower().split()) for t in turns
                 if t.action.kind == SEARCH]
      searches += len(queries)
      redundant += sum(q in queries[:i] for i, q in enumerate(queries))
      if batch.answered[b]:
        answered_turns.append(len(turns))
  assert searches > 0 and redundant > 0 and answered_turns  # both measures are exercised
  assert out["redundant_query_rate"] == pytest.approx(redundant / searches)
  assert out["steps_to_answer"] == pytest.approx(np.mean(answered_turns))


@pytest.mark.parametrize("args, message", [
    (["--agent=best_of_n", "--select=self"], "needs --temperature"),
    (["--agent=coreact", "--config.coreact.generator_path="], "needs a rubric generator"),
    (["--select=self"], "need --agent=coreact or best_of_n"),
])
def test_eval_agent_flags_are_checked_before_loading(tmp_path, args, message):
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "launch/eval.py", "--config=configs/coreact.py:agent",
                         f"--hf_path={tmp_path}", *args], cwd=root, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
