"""Partial rollouts (rollout.partial; agentjax/agent/feed.py): a rollout in flight reads the
parameters the trainer publishes, and continues with them or restarts; every sampled token
records its version. Both engines, on the scripted agent (a bigram policy, so the turn after a
switch is exactly the new script's), and the pipeline's publishing with a fake step."""

from __future__ import annotations

import dataclasses
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.agent.feed import ParamsFeed
from agentjax.sampling import SamplingParams
from agentjax.train.pipeline import RolloutPipeline, version_stats
from agentjax.train.step import Produced
from tests import agent_fixtures as af
from tests.test_rollout import QUESTIONS


@pytest.fixture(scope="module")
def world(scripted_world):
  tok, backend, agent = scripted_world
  return tok, backend, agent, agent.params(af.SEARCH), agent.params(af.ANSWER)


def make(world, **overrides):
  tok, backend, agent = world[:3]
  kw = dict(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
            max_total_tokens=1024, topk=2, sampling=SamplingParams(greedy=True), lanes=1)
  return RolloutEngine(agent.cfg, tok, backend, RolloutConfig(**{**kw, **overrides}))


class BumpFeed:
  """(old, 0) for the first `reads` reads, then (new, 1); counts its reads."""

  def __init__(self, old, new, reads):
    self.old, self.new, self.reads, self.count = old, new, reads, 0

  def current(self):
    self.count += 1
    return (self.old, 0) if self.count <= self.reads else (self.new, 1)


def host(batch):
  return {k: np.asarray(v) for k, v in jax.device_get(dict(
      tokens=batch.tokens, loss_mask=batch.loss_mask, turn_id=batch.turn_id,
      versions=batch.versions)).items()}


@pytest.mark.parametrize("engine", ["turns", "slots"])
def test_continue_samples_the_turns_after_a_publish_with_the_new_parameters(world, engine):
  """The feed changes after the rollout's first two reads (before its prompts, and at turn 0 or
  as the slot engine's one lane settles for its first decode call, every row's turn 0): turn 0
  searches (the old script), turn 1 answers (the new one); turn 0's sampled tokens carry
  version 0, turn 1's version 1, every other slot -1."""
  _, _, agent, search, answer = world
  batch, metrics = make(world, engine=engine, partial="continue").run(
      search, QUESTIONS, jax.random.key(0), feed=BumpFeed(search, answer, 2), version=0)
  h = host(batch)
  np.testing.assert_array_equal(batch.num_turns, 2)
  assert batch.answered.all() and list(batch.answers) == ["Aldric"] * 4
  first = [t.text for t in batch.turns[0]]
  assert "<search>" in first[0] and "<answer>" in first[1], first
  want = np.where(h["loss_mask"], h["turn_id"], -1)  # version = turn here: 0 then 1
  np.testing.assert_array_equal(h["versions"], want)
  assert (h["versions"][h["loss_mask"]] >= 0).all() and (h["versions"] == 1).any()
  assert metrics["partial_restarts"] == 0.0


@pytest.mark.parametrize("engine", ["turns", "slots"])
@pytest.mark.parametrize("reads, restarts", [(1, 1.0), (0, 0.0)])
def test_restart_rolls_out_again_with_the_new_parameters(world, engine, reads, restarts):
  """rollout.partial="restart": the batch is exactly the new parameters' own rollout (same key),
  every token of version 1. A feed that changes after the rollout's first read (before its
  prompts are fed) restarts it once at its first turn; one already newer at that first read is
  taken from the start (its prompts fed by it too) and counts no restart."""
  _, _, agent, search, answer = world
  eng = make(world, engine=engine, partial="restart")
  got, metrics = eng.run(search, QUESTIONS, jax.random.key(0),
                         feed=BumpFeed(search, answer, reads), version=0)
  want, _ = eng.run(answer, QUESTIONS, jax.random.key(0), version=1)
  g, w = host(got), host(want)
  for key in ("tokens", "loss_mask", "turn_id", "versions"):
    np.testing.assert_array_equal(g[key], w[key], err_msg=key)
  np.testing.assert_array_equal(g["versions"], np.where(g["loss_mask"], 1, -1))
  assert metrics["partial_restarts"] == restarts


def test_off_ignores_the_feed_and_tags_the_given_version(world):
  _, _, agent, search, answer = world
  feed = BumpFeed(search, answer, 0)
  batch, metrics = make(world, engine="slots").run(search, QUESTIONS, jax.random.key(0),
                                                   feed=feed, version=5)
  h = host(batch)
  assert feed.count == 0 and "partial_restarts" not in metrics
  np.testing.assert_array_equal(h["versions"], np.where(h["loss_mask"], 5, -1))
  assert not batch.answered.any()  # the search script throughout


def test_a_feed_with_a_policy_per_turn_is_refused(world):
  _, _, agent, search, answer = world
  with pytest.raises(ValueError, match="one policy"):
    make(world, partial="continue").run({"a": search}, QUESTIONS, jax.random.key(0),
                                        policy_for_turn=lambda t: "a",
                                        feed=ParamsFeed(search, 0))
  with pytest.raises(ValueError, match="rollout.partial must be one of"):
    make(world, partial="sometimes")


def test_params_feed_publishes_in_order_and_maps_once_per_version():
  feed = ParamsFeed("p0", 0)
  calls = []
  view = feed.map(lambda p: calls.append(p) or p.upper())
  assert view.current() == ("P0", 0) and view.current() == ("P0", 0) and calls == ["p0"]
  feed.publish("p1", 1)
  assert view.current() == ("P1", 1) and calls == ["p0", "p1"]
  with pytest.raises(ValueError, match="older"):
    feed.publish("p0", 0)


def test_version_stats_against_numpy():
  rng = np.random.default_rng(0)
  versions = rng.integers(3, 7, (6, 9)).astype(np.int32)
  mask = rng.random((6, 9)) < 0.5
  mask[2] = False                       # a row with no sampled token
  versions[4] = 5                       # a row of one version
  mask[4, :3] = True
  oldest, mean, mixed = version_stats(np.where(mask, versions, -1), mask)
  rows = [b for b in range(6) if mask[b].any()]
  assert oldest == min(versions[b][mask[b]].min() for b in rows)
  assert mean == pytest.approx(versions[mask].mean())
  assert mixed == pytest.approx(np.mean([len(set(versions[b][mask[b]])) > 1 for b in rows]))
  assert version_stats(np.full((2, 3), -1), np.zeros((2, 3), bool)) is None


def _run(pipeline, steps, after=lambda step: None):
  """`steps` pipeline steps from version 0 (params {"w": 0}); the metrics of each; closed."""
  state = {"params": {"w": np.int32(0)}, "rng": jax.random.key(0)}
  metrics = []
  for step in range(steps):
    out = pipeline.step(state, step)
    state = out.state
    metrics.append(out.metrics)
    after(step)
  pipeline.close()
  return metrics


class FeedStep:
  """A fake RLStep whose production records the feed's version when it starts and tags its
  tokens with it (a [1, 2] batch); consume adds 1 to the params."""

  def __init__(self):
    self.stage = types.SimpleNamespace(roles=("policy",), partial=True)
    self.seen, self.lock = [], threading.Lock()

  def to_sampler(self, params):
    return jax.tree.map(np.copy, params), 0.0

  def produce(self, params, questions, key, step, version, feed=None):
    latest, v = feed.current()
    with self.lock:
      self.seen.append((step, version, v, int(np.asarray(latest["w"]))))
    batch = types.SimpleNamespace(versions=np.array([[version, v]], np.int32),
                                  loss_mask=np.ones((1, 2), bool))
    return types.SimpleNamespace(out=types.SimpleNamespace(batches={"policy": batch}, engine={}),
                                 version=version, produce_s=0.0)

  def consume(self, state, produced, step, rng, t_step):
    new = {"params": {"w": state["params"]["w"] + 1}, "rng": rng}
    return types.SimpleNamespace(state=new, metrics={})


def test_the_pipeline_publishes_after_every_update_and_logs_token_staleness():
  """After step t's update the feed holds version t + 1 (the state's params); every production
  gets the feed; a step's staleness is t minus its oldest token's version."""
  fake = FeedStep()
  pipeline = RolloutPipeline(fake, lambda j: [j], 1, partial="continue")

  def published(step):
    params, version = pipeline.feed.current()
    assert version == step + 1 and int(params["w"]) == step + 1

  metrics = _run(pipeline, 4, after=published)
  for step, version, v, w in fake.seen:
    assert v == w and v >= version  # the feed is at least as new as the submission
  for step, m in enumerate(metrics):
    started = max(step - 1, 0)
    assert m["async/staleness"] == step - started
    assert 0.0 <= m["async/partial_share"] <= 1.0
  with pytest.raises(ValueError, match="rollout.partial"):
    bad = FeedStep()
    bad.stage.partial = False
    RolloutPipeline(bad, lambda j: [j], 1, partial="restart")


@dataclasses.dataclass
class _Batch:
  versions: jax.Array
  loss_mask: jax.Array

  def replace(self, **kw):
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass
class _Out:
  batches: dict
  engine: dict = dataclasses.field(default_factory=dict)


class DropStep:
  """A fake RLStep for train.stale="drop": the first production of step j tags row r's tokens
  with OLDEST[j][r]; a second production of the same step (the pipeline's re-production) tags
  every token with the version it is given. consume records the loss mask it trains on; each
  production takes 50 ms and counts how many run at once."""

  OLDEST = {0: [0, 0], 1: [0, 1], 2: [0, 2], 3: [1, 1], 4: [3, 4]}

  def __init__(self):
    self.stage = types.SimpleNamespace(roles=("policy",), partial=True)
    self.calls, self.masks = [], {}
    self.lock, self.running, self.most = threading.Lock(), 0, 0

  def to_sampler(self, params):
    return jax.tree.map(np.copy, params), 0.0

  def produce(self, params, questions, key, step, version, feed=None):
    with self.lock:
      self.running += 1
      self.most = max(self.most, self.running)
    time.sleep(0.05)
    with self.lock:
      self.running -= 1
    again = any(s == step for s, _ in self.calls)
    self.calls.append((step, version))
    rows = [version, version] if again else self.OLDEST[step]
    versions = np.repeat(np.asarray(rows, np.int32)[:, None], 3, axis=1)
    batch = _Batch(jnp.asarray(versions), jnp.ones((2, 3), bool))
    return Produced(out=_Out({"policy": batch}), fields={}, metrics={},
                    rollout_s=0.0, produce_s=0.0, version=version)

  def consume(self, state, produced, step, rng, t_step):
    self.masks[step] = np.asarray(produced.out.batches["policy"].loss_mask)
    new = {"params": {"w": state["params"]["w"] + 1}, "rng": rng}
    return types.SimpleNamespace(state=new, metrics={})


def test_drop_leaves_stale_trajectories_out_and_produces_an_all_stale_step_again():
  """async_steps 2, max_staleness 1: at step t a trajectory whose oldest token is older than
  t - 1 gets no loss mask (counted in async/dropped_share; staleness is the kept ones'); a step
  with none left is produced again by the step's own parameters (async/reproduced)."""
  fake = DropStep()
  metrics = _run(RolloutPipeline(fake, lambda j: [j], 2, end=5, partial="continue",
                                 stale="drop", max_staleness=1), 5)
  kept = {t: fake.masks[t].all(axis=1).tolist() for t in range(5)}
  assert kept == {0: [True, True], 1: [True, True], 2: [False, True], 3: [True, True],
                  4: [True, True]}
  assert [m["async/dropped_share"] for m in metrics] == [0.0, 0.0, 0.5, 0.0, 0.0]
  assert [m["async/reproduced"] for m in metrics] == [0.0, 0.0, 0.0, 1.0, 0.0]
  assert (3, 3) in fake.calls  # step 3 again, by version 3
  assert fake.most == 1  # the re-production waited for the worker's production in flight
  assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 0.0, 0.0, 1.0]
  with pytest.raises(ValueError, match="train.stale must be one of"):
    RolloutPipeline(DropStep(), lambda j: [j], 1, stale="never")

