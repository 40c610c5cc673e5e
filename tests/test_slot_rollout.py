"""The slot engine (agentjax/agent/slots.py) against the turn-synchronous engine, on the scripted
agent: refill of freed slots, shared prompt prefill, search overlapped with decoding, tail
compaction. Shapes as tests/test_rollout.py (2 questions x 2, 1024-slot cache)."""

from __future__ import annotations

import collections
import math

import jax
import numpy as np
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.agent.slots import SlotRollout
from agentjax.models.logprobs import sequence_logprobs
from agentjax.sampling import SamplingParams
from tests import agent_fixtures as af
from tests import retrieval_fixtures
from tests.test_rollout import QUESTIONS, assert_consistent, assert_turn_records

SAMPLED = SamplingParams(temperature=1.0)


def make(world, backend=None, **overrides):
  tok, default_backend, agent = world
  kw = dict(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
            max_total_tokens=1024, topk=2, sampling=SamplingParams(greedy=True))
  return RolloutEngine(agent.cfg, tok, backend or default_backend,
                       RolloutConfig(**{**kw, **overrides}))


def host(batch):
  return {k: np.asarray(v) for k, v in jax.device_get(dict(
      tokens=batch.tokens, valid=batch.valid, loss_mask=batch.loss_mask,
      turn_id=batch.turn_id, logprobs=batch.logprobs)).items()}


def assert_same_trajectories(a, b, logprob_atol=1e-5):
  """Two TrajectoryBatches hold the same trajectories, token by token."""
  ha, hb = host(a), host(b)
  for key in ("tokens", "valid", "loss_mask", "turn_id"):
    np.testing.assert_array_equal(ha[key], hb[key], err_msg=key)
  np.testing.assert_allclose(ha["logprobs"], hb["logprobs"], atol=logprob_atol)
  for key in ("turn_ends", "num_turns", "answered", "truncated", "format_valid", "answers"):
    np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
  assert [tuple(r) for r in a.turns] == [tuple(r) for r in b.turns]


def slot_history(trace):
  """lane -> slot -> the trajectories it held, in order (from the "refill" events)."""
  held = collections.defaultdict(lambda: collections.defaultdict(list))
  for event, lane, detail in trace:
    if event == "refill":
      for slot, traj in detail:
        held[lane][slot].append(traj)
  return held


def test_greedy_outcomes_equal_the_turn_engine(world):
  """A deterministic scripted policy: the slot engine's trajectories are the turn engine's,
  token by token, with one lane or two; the prompt is prefilled once per question."""
  tok, backend, agent = world
  params = agent.params(af.SEARCH)
  want, want_metrics = make(world, engine="turns").run(params, QUESTIONS, jax.random.key(0))
  for lanes in (1, 2):
    got, metrics = make(world, engine="slots", lanes=lanes).run(params, QUESTIONS,
                                                                jax.random.key(0))
    assert_same_trajectories(got, want)
    assert metrics["sampled_tokens"] == want_metrics["sampled_tokens"]
    # Shared prefill: one prompt row per question instead of one per trajectory.
    assert metrics["prefill_tokens"] * 2 == want_metrics["prefill_tokens"]
    assert metrics["search_queries"] == want_metrics["search_queries"]


def test_repetition_penalty_acts_alike_in_both_engines(world):
  """Greedy under a repetition penalty (transformers' definition over each trajectory's whole
  context: prompt, actions and observations): the slot engine's trajectories are the turn
  engine's token by token, and they differ from the unpenalized ones (a random model's flat
  logits: its greedy choices are steered away from tokens already in its context). The
  log-probs stay the model's own: those of the unpenalized logits, as a scoring pass recomputes
  them."""
  from agentjax.models.qwen import init_params
  tok, backend, agent = world
  params = init_params(agent.cfg, jax.random.key(1))
  penalized = SamplingParams(greedy=True, repetition_penalty=3.0)
  plain, _ = make(world, engine="turns").run(params, QUESTIONS, jax.random.key(0))
  want, _ = make(world, engine="turns", sampling=penalized).run(params, QUESTIONS,
                                                                jax.random.key(0))
  got, _ = make(world, engine="slots", sampling=penalized).run(params, QUESTIONS,
                                                               jax.random.key(0))
  assert_same_trajectories(got, want)
  assert not np.array_equal(host(want)["tokens"], host(plain)["tokens"])
  h = host(want)
  engine = make(world, engine="turns", sampling=penalized)
  ref = np.asarray(sequence_logprobs(engine.model, params, want.tokens, want.valid)[0])
  mask = h["loss_mask"]
  np.testing.assert_allclose(h["logprobs"][mask], ref[mask], atol=1e-4)


def test_thinking_budget_acts_alike_in_both_engines(world):
  """rollout's max_think_tokens on a scripted agent whose turns think 5 words before they
  search: every think block is cut to the budget and closed, the action follows
  as the policy continues from </think>, and the slot engine's trajectories are the turn
  engine's token by token, the forced tokens' log-probs the model's own."""
  from agentjax.models.qwen.scripted import chain, transition_params
  tok, backend, agent = world
  think, close = agent.ids(["<think>"])[0], agent.ids(["</think>"])[0]
  search = agent.ids(af.SEARCH)
  succ = chain([think] + af.mix_words(agent, 5) + [close, search[0]])  # 5 words of thought
  succ.update(chain(search))
  for last in agent.turn_starts():
    succ[last] = [think]
  params = transition_params(agent.cfg, succ, fallback=tok.eos_token_id)
  budget = 2
  cut = SamplingParams(greedy=True, max_think_tokens=budget)
  plain, _ = make(world, engine="turns").run(params, QUESTIONS, jax.random.key(0))
  want, _ = make(world, engine="turns", sampling=cut).run(params, QUESTIONS, jax.random.key(0))
  got, _ = make(world, engine="slots", sampling=cut).run(params, QUESTIONS, jax.random.key(0))
  assert_same_trajectories(got, want)
  h, hp = host(want), host(plain)
  blocks = 0
  for row in range(len(h["tokens"])):
    seq, own = list(h["tokens"][row]), h["loss_mask"][row]
    for i, t in enumerate(seq):
      if t == think and own[i]:  # a generated opening (the prompt's instructions name the tags)
        assert seq[i + 1 + budget] == close, (row, seq)
        blocks += 1
  assert blocks >= len(h["tokens"]) and not np.array_equal(h["tokens"], hp["tokens"])
  np.testing.assert_array_equal(want.num_turns, plain.num_turns)  # the actions still follow
  engine = make(world, engine="turns", sampling=cut)
  ref = np.asarray(sequence_logprobs(engine.model, params, want.tokens, want.valid)[0])
  np.testing.assert_allclose(h["logprobs"][h["loss_mask"]], ref[h["loss_mask"]], atol=1e-4)
  with pytest.raises(ValueError, match="rollout.max_think_tokens"):
    no_tags = type("NoTags", (), {"encode": lambda self, t, add_special_tokens=False: [1, 2]})()
    from agentjax.sampling.text import with_think_tags
    with_think_tags(cut, no_tags, "rollout.max_think_tokens")


HOOK_RUBRIC = [f"Rubric {t}: cite a document." for t in range(3)]
HOOK_BUDGETS = (45, 60, 200)  # cut mid-turn, cut at an observation, room for every turn


def hook_gives_even_rows_text(turn, rows, transcripts):
  return [HOOK_RUBRIC[turn] if b % 2 == 0 else None for b in rows]


def searcher_then_answerer(t):
  return "searcher" if t < 2 else "answerer"


@pytest.fixture(scope="module")
def hooked_turn_runs(world):
  """(policies, {budget: (engine kwargs, the turn engine's trajectories)}) for the hooks test:
  the reference does not depend on the slot layout, so both layouts compare to one run of it
  per budget instead of each running it again."""
  tok, backend, agent = world
  policies = {"searcher": agent.params(af.SEARCH, extra_starts=HOOK_RUBRIC),
              "answerer": agent.params(af.ANSWER, extra_starts=HOOK_RUBRIC)}
  prompt = len(make(world).prompt_ids(QUESTIONS[0]))
  runs = {}
  for extra in HOOK_BUDGETS:
    kw = dict(max_total_tokens=prompt + extra, max_obs_tokens=24)
    turns = make(world, engine="turns", **kw)
    turns.before_turn = hook_gives_even_rows_text
    want, _ = turns.run(policies, QUESTIONS, jax.random.key(0),
                        policy_for_turn=searcher_then_answerer)
    runs[extra] = (kw, want)
  return policies, runs


@pytest.mark.parametrize("layout", [dict(lanes=1, slots=2), dict(lanes=2, slots=2)])
def test_hooks_two_policies_and_budget_cuts_equal_the_turn_engine(world, hooked_turn_runs,
                                                                  layout):
  """Greedy, with a hook that gives text to some rows only, a policy that changes after two
  turns, and a budget that cuts trajectories in the middle of a turn and at an observation while
  others go on: token for token the turn engine's trajectories, with refilled slots."""
  policies, runs = hooked_turn_runs
  for extra in HOOK_BUDGETS:
    kw, want = runs[extra]
    slots = make(world, engine="slots", **layout, **kw)
    slots.before_turn = hook_gives_even_rows_text
    got, _ = slots.run(policies, QUESTIONS, jax.random.key(0),
                       policy_for_turn=searcher_then_answerer)
    assert_same_trajectories(got, want)
    assert_consistent(got)
    assert_turn_records(got, slots)
    # 45: rows cut at their first or second observation; 60: a cut hook text ends a turn
    assert want.answered.all() if extra == 200 else want.truncated.all()


def test_refill_reuses_a_finished_trajectorys_slot(world):
  """Two slots for four sampled trajectories of 1 to 3 turns: a slot that frees up takes the
  next trajectory; every trajectory is token for token the one the engine samples with a slot
  per trajectory (keys are per trajectory and position), its masks exact, its sampling-time
  log-probs the teacher-forced ones."""
  tok, backend, agent = world
  params = agent.params(af.SEARCH, af.ANSWER)
  engine = make(world, sampling=SAMPLED, slots=2, lanes=1)
  runner = SlotRollout(engine, params)
  got, metrics = runner.run(QUESTIONS, jax.random.key(3))
  held = slot_history(runner.trace)[0]
  assert sorted(t for ts in held.values() for t in ts) == [0, 1, 2, 3]
  assert max(len(ts) for ts in held.values()) >= 2  # a slot was reused
  assert len(held) == 2
  assert len(set(got.num_turns.tolist())) > 1, got.num_turns  # ragged: some ended early
  want, _ = make(world, sampling=SAMPLED, slots=0, lanes=2).run(params, QUESTIONS,
                                                                jax.random.key(3))
  assert_same_trajectories(got, want)
  assert_consistent(got)
  assert_turn_records(got, engine)
  h = host(got)
  teacher = np.asarray(sequence_logprobs(engine.model, params, got.tokens, got.valid)[0])
  np.testing.assert_allclose(teacher[h["loss_mask"]], h["logprobs"][h["loss_mask"]], atol=1e-4)
  assert (h["logprobs"][~h["loss_mask"]] == 0).all()
  assert metrics["decode_useful_row_steps"] == h["loss_mask"].sum()


def test_slow_search_does_not_stall_the_other_lane(world):
  """Two lanes: while one lane's rows wait for a slow retriever, the other lane's decode call is
  in flight and samples tokens (it was dispatched before the search and is collected after)."""
  tok, backend, agent = world
  slow = retrieval_fixtures.SlowBackend(backend, 0.05)
  engine = make(world, backend=slow, lanes=2)
  runner = SlotRollout(engine, agent.params(af.SEARCH))
  batch, metrics = runner.run(QUESTIONS, jax.random.key(0))
  searches = [(i, e) for i, e in enumerate(runner.trace) if e[0] == "search"]
  assert len(searches) == slow.calls >= 4
  overlapped = 0
  for i, (_, lane, in_flight) in searches:
    for other in in_flight:
      # the other lane's call in flight during this search is collected after it, with tokens
      collected = next(e for e in runner.trace[i + 1:] if e[0] == "collect" and e[1] == other)
      assert collected[2] > 0
      overlapped += 1
  # Every search but the last lane's final ones overlaps the other lane's decoding.
  assert overlapped >= len(searches) - 2
  assert metrics["search_overlapped"] >= 0.5
  one_lane = SlotRollout(make(world, backend=slow, lanes=1), agent.params(af.SEARCH))
  same, one_metrics = one_lane.run(QUESTIONS, jax.random.key(0))
  assert one_metrics["search_overlapped"] == 0.0
  assert_same_trajectories(batch, same)


def test_tail_compaction_keeps_trajectories(world):
  """Eight slots in one lane; as trajectories end with nothing left to refill, the live rows move
  into smaller lanes (sizes on slots.lane_sizes' ladder): the same trajectories as without
  compaction, fewer decode row-steps, the log-probs the teacher-forced ones."""
  from agentjax.agent import slots
  tok, backend, agent = world
  questions = QUESTIONS * 2
  params = agent.params(af.SEARCH, af.ANSWER)
  engine = make(world, sampling=SAMPLED, lanes=1, max_turns=4)
  runner = SlotRollout(engine, params)
  got, metrics = runner.run(questions, jax.random.key(0))
  sizes = [e[2] for e in runner.trace if e[0] == "compact"]
  assert sizes and sizes == sorted(sizes, reverse=True) and sizes[0] < 8, got.num_turns
  assert set(sizes) <= set(slots.lane_sizes(8, engine.config.compact_factor))
  assert_consistent(got)
  assert metrics["decode_row_steps"] < 8 * metrics["decode_steps"]
  uncompacted = SlotRollout(make(world, sampling=SAMPLED, lanes=1, max_turns=4,
                                 compact_factor=0), params)  # lanes never compact
  want, want_metrics = uncompacted.run(questions, jax.random.key(0))
  assert not any(e[0] == "compact" for e in uncompacted.trace)
  assert want_metrics["decode_row_steps"] == 8 * want_metrics["decode_steps"]
  assert_same_trajectories(got, want)
  h = host(got)
  teacher = np.asarray(sequence_logprobs(engine.model, params, got.tokens, got.valid)[0])
  np.testing.assert_allclose(teacher[h["loss_mask"]], h["logprobs"][h["loss_mask"]], atol=1e-4)


def test_prefill_in_chunks_keeps_trajectories(world, monkeypatch):
  """rollout.prefill_rows: the prompts prefilled a chunk at a time, each once, in question order
  (chunks of 1, of 3 over 6 questions: a short last chunk padded), hold only the chunk's caches
  and give the trajectories of one prefill of every prompt, token by token (sampled: keys of
  (rng, trajectory, position)); with small lanes, refills cross chunk boundaries."""
  tok, backend, agent = world
  params = agent.params(af.SEARCH, af.ANSWER)
  questions = (QUESTIONS * 3)[:6]
  loads = []
  original = SlotRollout._load_prompts

  def load(self, first):
    if first != self.prompt_base:
      loads.append((self.chunk, first))
    original(self, first)
    assert self.prompts.tokens.shape[0] == self.chunk

  monkeypatch.setattr(SlotRollout, "_load_prompts", load)
  want, want_metrics = make(world, sampling=SAMPLED, slots=4, prefill_rows=0).run(
      params, questions, jax.random.key(3))
  assert loads == [(6, 0)]
  for rows in (1, 3):
    loads.clear()
    # One lane of 4 slots: the first refill (questions 0 and 1) spans two chunks of 1.
    got, metrics = make(world, sampling=SAMPLED, slots=4, lanes=1, prefill_rows=rows).run(
        params, questions, jax.random.key(3))
    assert_same_trajectories(got, want)
    assert loads == [(rows, q) for q in range(0, 6, rows)]
    assert metrics["sampled_tokens"] == want_metrics["sampled_tokens"]
  with pytest.raises(ValueError, match="rollout.prefill_rows"):
    RolloutConfig(prefill_rows=-1)


def test_cache_size_rounds_long_budgets_to_512():
  from agentjax.sampling import bucket, cache_size
  assert [cache_size(n) for n in (1, 100, 512, 513, 4096, 8192, 10240, 10241)] == \
      [16, 128, 512, 1024, 4096, 8192, 10240, 10752]
  for n in range(1, 20000, 37):
    c = cache_size(n)
    assert n <= c <= bucket(n) and (c == bucket(n) or c % 512 == 0) and c - n < max(512, n)


def test_lane_size_ladder():
  """rollout.compact_factor's ladder: full / f^k rounded up, down to 1; a lane's rows go to the
  smallest size that holds them (a reference by brute force over k)."""
  from agentjax.agent.slots import lane_size, lane_sizes
  assert lane_sizes(32, 2) == [32, 16, 8, 4, 2, 1]
  assert lane_sizes(24, 2) == [24, 12, 6, 3, 2, 1]
  assert lane_sizes(32, 4) == [32, 8, 2, 1]
  assert lane_sizes(5, 3) == [5, 2, 1]
  assert lane_sizes(32, 0) == [32] and lane_sizes(1, 2) == [1]
  for full in (1, 2, 7, 24, 32, 100):
    for factor in (0, 2, 3, 4):
      ladder = sorted({full} | ({math.ceil(full / factor ** k) for k in range(40)}
                               if factor else set()))
      for n in range(1, full + 1):
        assert lane_size(n, full, factor) == min(s for s in ladder if s >= n), (full, factor, n)
  with pytest.raises(ValueError, match="rollout.compact_factor"):
    RolloutConfig(compact_factor=1)


def test_row_bucket_ladder():
  """rollout.row_bucket_factor: k rows of a lane run on the smallest 4 * f^j >= k, capped at the
  lane's size (never below 4); f = 0: the lane's size (a reference by brute force over j)."""
  from agentjax.agent.slots import row_bucket, row_buckets
  assert row_buckets(32, 2) == [4, 8, 16, 32] and row_buckets(32, 4) == [4, 16, 32]
  assert row_buckets(50, 2) == [4, 8, 16, 32, 50] and row_buckets(32, 0) == [32]
  assert row_buckets(2, 2) == [4] and row_buckets(3, 0) == [4]
  for size in (1, 3, 8, 24, 50, 64):
    for factor in (0, 2, 3, 4):
      rungs = [4 * factor ** j for j in range(12)] if factor else []
      for k in range(1, size + 1):
        want = min([r for r in rungs if r >= k] + [max(size, 4)])
        assert row_bucket(k, size, factor) == want, (size, factor, k)
  with pytest.raises(ValueError, match="rollout.row_bucket_factor"):
    RolloutConfig(row_bucket_factor=1)


def test_engine_config_errors():
  with pytest.raises(ValueError, match="rollout.engine"):
    RolloutConfig(engine="paged")
  with pytest.raises(ValueError, match="rollout.slots"):
    RolloutConfig(slots=-1)
  with pytest.raises(ValueError, match="rollout.lanes"):
    RolloutConfig(lanes=0)
  with pytest.raises(ValueError, match="rollout.refill_fraction"):
    RolloutConfig(refill_fraction=0.0)


def test_the_trainer_rolls_out_with_the_slot_engine_by_default():
  from agentjax.train.trainer import rollout_config
  from configs import base
  config = base.get_config()
  train = rollout_config(config)
  # the demo preset: 64 slots (its eval runs on the training's lanes), 2 lanes
  assert (train.engine, train.slots, train.lanes) == ("slots", 64, 2)
  assert rollout_config(config, greedy=True).engine == "slots"
  config.rollout.engine = "turns"
  assert rollout_config(config).engine == "turns"


def test_model_programs_are_bounded_across_rollouts(world):
  """Rollouts with other keys compact through other lane sizes and feed other row counts: the
  programs that run the model stay a bounded set (decode: one per lane size on the ladder; feeds:
  one per row bucket, at one width), whatever the schedule."""
  from agentjax.sampling import slots as programs
  tok, backend, agent = world
  params = agent.params(af.SEARCH, af.ANSWER)
  engine = make(world, sampling=SAMPLED, lanes=1, max_turns=4)
  decode0 = programs.decode_slots._cache_size()
  feed0 = programs._extend_tokens._cache_size()
  for seed in range(3):
    engine.run(params, QUESTIONS * 2, jax.random.key(10 + seed))
  # lane sizes 8, 6, 4, 3, 2, 1; feeds of 1-8 rows in buckets 4 and 8, all at width 128
  assert programs.decode_slots._cache_size() - decode0 <= 6
  assert programs._extend_tokens._cache_size() - feed0 <= 2


def test_warm_up_compiles_every_program_a_rollout_meets(world):
  """RolloutEngine.warm_up (rollout.warm_up: before a run's first step) runs every program of the
  slot engine's list once: rollouts with other keys, other questions and other schedules (lane
  sizes compacted through, row counts fed, key windows) then compile nothing, and give the
  trajectories of an engine that was never warmed (the prompts prefilled at the run's longest
  prompt's width)."""
  from agentjax.compiles import CompileLog
  tok, backend, agent = world
  params = agent.params(af.SEARCH, af.ANSWER)
  questions = QUESTIONS * 2
  # One lane of 8 slots: the deepest ladder (8, 4, 2, 1); then one lane shape, feeds on the
  # whole lane (rollout.compact_factor and row_bucket_factor 0): the same trajectories.
  for ladder in ({}, {"compact_factor": 0, "row_bucket_factor": 0}):
    jax.clear_caches()  # nothing compiled before the warm-up: it alone must cover the runs
    engine = make(world, sampling=SAMPLED, lanes=1, max_turns=4, kv_window_min=64, **ladder)
    lengths = [len(engine.prompt_ids(q)) for q in questions]
    engine.warm_up(params, len(questions) * 2, (min(lengths), max(lengths)), jax.random.key(9))
    with CompileLog() as log:
      runs = [engine.run(params, questions[k:] + questions[:k], jax.random.key(20 + k))
              for k in range(3)]
    assert not log.programs, (ladder, list(zip(log.programs, log.sources)))
    if not ladder:
      want = runs[0][0]  # the default ladder's trajectories: the one-shape ladder's must equal
    assert_same_trajectories(runs[0][0], want)
