"""agentjax/train/pipeline.py: which parameters produce which step's rollouts, the rng chain, the
overlap of one step's production with another's update, closing, and faults (a fake RLStep: no
model, no compiles; the trainer runs it for real in tests/test_trainer.py)."""

from __future__ import annotations

import dataclasses
import threading
import time
import types
from typing import Any

import jax
import numpy as np
import pytest

from agentjax.train.pipeline import RolloutPipeline


@dataclasses.dataclass
class _Produced:
  step: int
  version: int
  params: int
  key: np.ndarray
  questions: list
  thread: str
  produce_s: float = 0.0
  out: Any = dataclasses.field(default_factory=lambda: types.SimpleNamespace(engine={}))


class FakeStep:
  """produce records what it was given; consume adds 1 to the params (an update) and records
  the step's rng; params are ints standing for versions."""

  def __init__(self, gate=None):
    self.produced, self.consumed, self.gate = [], [], gate

  def to_sampler(self, params):
    return jax.tree.map(np.copy, params), 0.0

  def produce(self, params, questions, key, step, version):
    if self.gate is not None:
      self.gate(step)
    p = _Produced(step, version, int(np.asarray(params["w"])), np.asarray(jax.random.key_data(key)),
                  questions, threading.current_thread().name)
    self.produced.append(p)
    return p

  def consume(self, state, produced, step, rng, t_step):
    self.consumed.append((step, produced.step, int(np.asarray(state["params"]["w"]))))
    new = {"params": {"w": state["params"]["w"] + 1}, "rng": rng}
    return type("Out", (), {"state": new, "metrics": {}})()


def _sync_keys(rng, steps):
  out = []
  for _ in range(steps):
    rng, rollout = jax.random.split(rng)
    out.append(np.asarray(jax.random.key_data(rollout)))
  return out


@pytest.mark.parametrize("k,start", [(1, 0), (2, 0), (2, 3)])
def test_step_j_is_produced_by_version_max_j_minus_k_start(k, start):
  """Over 6 steps from `start` (a resume when > 0, the state then at version `start`): step j's
  rollout has the parameters of version max(j - k, start), its rollout key is the synchronous
  chain's, its questions are questions_at(j); the trainer consumes steps in order on the state of
  that step; staleness is logged."""
  fake = FakeStep()
  pipeline = RolloutPipeline(fake, lambda j: [f"q{j}"], k)
  rng = jax.random.key(7)
  state = {"params": {"w": np.int32(start)}, "rng": rng}
  metrics = []
  for step in range(start, start + 6):
    out = pipeline.step(state, step)
    state = out.state
    metrics.append(out.metrics)
  pipeline.close()
  by_step = {p.step: p for p in fake.produced}
  keys = _sync_keys(rng, 6)
  for i, step in enumerate(range(start, start + 6)):
    p = by_step[step]
    assert p.version == p.params == max(step - k, start), (step, p)
    np.testing.assert_array_equal(p.key, keys[i])
    assert p.questions == [f"q{step}"] and p.thread.startswith("rollouts")
    assert metrics[i]["async/staleness"] == step - max(step - k, start)
  assert [c[:2] for c in fake.consumed] == [(s, s) for s in range(start, start + 6)]
  assert [c[2] for c in fake.consumed] == list(range(start, start + 6))
  # The rollouts of the steps after the last one were started or dropped, never consumed.
  assert set(by_step) <= set(range(start, start + 6 + k))
  # With the run's end given, none is produced past it.
  fake = FakeStep()
  pipeline = RolloutPipeline(fake, lambda j: [j], k, end=2)
  state = {"params": {"w": np.int32(0)}, "rng": rng}
  for step in range(2):
    state = pipeline.step(state, step).state
  pipeline.close()
  assert sorted(p.step for p in fake.produced) == [0, 1]


def test_production_overlaps_the_update():
  """Step 1's production runs while step 0 updates: it waits until consume(0) has begun, and
  consume(0) waits until it has begun (a sequential pipeline would time out here)."""
  started_produce_1, started_consume_0 = threading.Event(), threading.Event()

  def gate(step):
    if step == 1:
      started_produce_1.set()
      assert started_consume_0.wait(30), "production of step 1 never overlapped update 0"

  fake = FakeStep(gate)
  real = fake.consume

  def consume(state, produced, step, rng, t_step):
    if step == 0:
      started_consume_0.set()
      assert started_produce_1.wait(30), "update 0 never overlapped production of step 1"
    return real(state, produced, step, rng, t_step)

  fake.consume = consume
  pipeline = RolloutPipeline(fake, lambda j: [j], 1)
  state = {"params": {"w": np.int32(0)}, "rng": jax.random.key(0)}
  for step in range(2):
    state = pipeline.step(state, step).state
  pipeline.close()
  assert [c[0] for c in fake.consumed] == [0, 1]


def test_a_failed_production_raises_in_the_trainer_and_close_stops_the_worker():
  def gate(step):
    if step == 1:
      raise RuntimeError("retriever index vanished")

  fake = FakeStep(gate)
  pipeline = RolloutPipeline(fake, lambda j: [j], 1)
  state = {"params": {"w": np.int32(0)}, "rng": jax.random.key(0)}
  state = pipeline.step(state, 0).state
  with pytest.raises(RuntimeError, match="index vanished"):
    pipeline.step(state, 1)
  pipeline.close()
  assert not any(t.name.startswith("rollouts") and t.is_alive() for t in threading.enumerate())
  with pytest.raises(ValueError, match="async_steps"):
    RolloutPipeline(fake, lambda j: [j], 0)


def test_several_processes_refuse_what_would_make_their_trajectories_differ(monkeypatch):
  """On several processes the pipeline runs (its turns in process 0's order: the next test, and
  tests/test_multihost.py), but partial rollouts (a rollout reads published parameters when they
  happen to be there) and the split placement are refused, naming the field."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match="rollout.partial='continue'.*one process"):
    RolloutPipeline(FakeStep(), lambda j: [j], 1, partial="continue")
  split = FakeStep()
  split.sampler_mesh = object()
  with pytest.raises(ValueError, match="mesh.sampler_devices.*one process"):
    RolloutPipeline(split, lambda j: [j], 1)


class _FakeKV:
  """jax.distributed's key-value client, in one process: blocking_key_value_get waits; a get of
  a deleted key fails (the real one would wait for ever); `most`: the most keys held at once."""

  def __init__(self):
    self.values, self.cond = {}, threading.Condition()
    self.deleted, self.most = set(), 0

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.cond:
      assert allow_overwrite or key not in self.values, key  # a turn is published once
      self.values[key] = value
      self.most = max(self.most, len(self.values))
      self.cond.notify_all()

  def blocking_key_value_get(self, key, timeout_in_ms):
    with self.cond:
      assert key not in self.deleted, f"{key} read after it was deleted"
      if not self.cond.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
        raise TimeoutError(key)
      return self.values[key]

  def key_value_try_get(self, key):
    with self.cond:
      if key not in self.values:
        raise KeyError(key)  # jax's raises too (NOT_FOUND)
      return self.values[key]

  def key_value_delete(self, key):
    with self.cond:
      self.values.pop(key, None)
      self.deleted.add(key)


def test_ordered_device_turns_come_in_process_zeros_order_on_every_process():
  """DeviceTurn.ordered: two "processes" (two DeviceTurn objects sharing one key-value store),
  each with the same two threads (an updater: three held segments; a producer: one hold with
  three host waits, a collective inside the second, as PrimarySearch's broadcast): every
  segment's order on process 1 is process 0's, although their threads are timed differently
  (process 1's updater sleeps where process 0's producer does, and the other way round)."""
  import random
  import time

  from agentjax.parallel.host import DeviceTurn
  kv = _FakeKV()
  logs = {0: [], 1: []}

  def run(process, seed):
    turn = DeviceTurn()
    rng = random.Random(seed)
    log = logs[process]
    nap = lambda: time.sleep(rng.uniform(0, 0.01))  # noqa: E731

    def updater():
      for i in range(3):
        nap()
        with turn.hold():
          log.append(f"update {i}")
          nap()

    def producer():
      with turn.hold():
        for i in range(3):
          log.append(f"decode {i}")
          nap()
          with turn.host_wait():
            nap()
            if i == 1:
              with turn.collective():
                log.append("broadcast")
          log.append(f"parse {i}")
      log.append("produced")

    with turn.ordered(kv, "test/turns", leader=process == 0, process=process, processes=2):
      threads = [threading.Thread(target=f, name=name)
                 for f, name in ((updater, "updater"), (producer, "producer"))]
      for t in threads:
        t.start()
      for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert turn._order is None  # left with the block

  for seed in range(5):
    kv.values.clear()
    logs[0].clear()
    logs[1].clear()
    processes = [threading.Thread(target=run, args=(p, 2 * seed + p)) for p in (0, 1)]
    for t in processes:
      t.start()
    for t in processes:
      t.join(120)
    # "produced" is appended after the last turn ends: where it lands is not a turn's order.
    held = {p: [e for e in logs[p] if e != "produced"] for p in (0, 1)}
    assert len(held[0]) == 3 + 3 + 3 + 1, held[0]
    assert held[1] == held[0], (seed, held)
    # 3 updater holds, the producer's hold, 3 takings-back after its host waits, 1 collective
    assert len(kv.values) == 8


def test_ordered_device_turns_keep_a_bounded_number_of_keys():
  """A long run's turns: each key is deleted once every follower has read it (none is read
  after its deletion: the fake fails such a read), so the store holds a bounded number of keys
  however many turns pass (before: one per turn, never deleted), and the order still holds."""
  import random
  import time

  from agentjax.parallel.host import DeviceTurn, _TurnOrder
  kv, turns = _FakeKV(), 600
  logs = {0: [], 1: [], 2: []}
  # Each turn's programs meet the other processes' in their collectives: the n-th turn of every
  # process ends together (what keeps the leader from running far ahead in a real run).
  collective = threading.Barrier(3, timeout=60)

  def run(process):
    turn, rng = DeviceTurn(), random.Random(process)
    nap = lambda: time.sleep(rng.uniform(0, 0.0005))  # noqa: E731

    def updater():
      for i in range(turns // 2):
        with turn.hold():
          logs[process].append(f"u{i}")
          nap()
          collective.wait()

    def producer():
      with turn.hold():
        for i in range(turns // 2):
          with turn.host_wait():
            nap()
          logs[process].append(f"p{i}")
          collective.wait()

    with turn.ordered(kv, "soak/turns", leader=process == 0, process=process, processes=3):
      threads = [threading.Thread(target=f, name=name)
                 for f, name in ((updater, "updater"), (producer, "producer"))]
      for t in threads:
        t.start()
      for t in threads:
        t.join(120)
        assert not t.is_alive()

  processes = [threading.Thread(target=run, args=(p,)) for p in (0, 1, 2)]
  for t in processes:
    t.start()
  for t in processes:
    t.join(300)
  assert logs[1] == logs[0] and logs[2] == logs[0] and len(logs[0]) == turns
  published = turns + 1  # the producer's first hold, then one per host wait and per update
  assert len(kv.deleted) >= published - 2 * _TurnOrder.PRUNE_EVERY
  bound = _TurnOrder.PRUNE_EVERY + _TurnOrder.ACK_EVERY + 2 + 8  # + acks + the leader's lead
  assert kv.most <= bound, (kv.most, bound)


def test_ordered_device_turn_names_the_turn_a_follower_waited_for_in_vain():
  from agentjax.parallel.host import DeviceTurn, _TurnOrder

  class Silent(_FakeKV):
    def blocking_key_value_get(self, key, timeout_in_ms):
      raise TimeoutError("DEADLINE_EXCEEDED")

  turn = DeviceTurn()
  with turn.ordered(Silent(), "run/turns", leader=False):
    with pytest.raises(RuntimeError, match="turn 0 of 'run/turns' was not published"):
      with turn.hold():
        pass
  assert _TurnOrder.TIMEOUT_MS >= 60_000


def test_a_step_produced_again_by_the_trainer_holding_the_devices_does_not_deadlock():
  """The trainer's thread holds the devices for its loop (train/trainer.py). A step produced
  again on it (train.stale="drop") waits for the worker's production in flight, which waits for
  the devices: it lets them go while it waits (before, each waited on the other for ever)."""
  import time

  from agentjax.parallel.host import DEVICE_TURN
  fake = FakeStep()
  pipeline = RolloutPipeline(fake, lambda j: [j], 1)
  pipeline.turns = True  # as on a colocated multi-device mesh
  key, done = jax.random.key(1), threading.Event()

  def trainer():
    with DEVICE_TURN.hold():
      worker = threading.Thread(target=pipeline._produce, args=({"w": 0}, [1], key, 1, 0),
                                daemon=True)
      worker.start()  # takes the production lock, then waits for the devices
      while not pipeline._producing.locked():
        time.sleep(0.001)
      time.sleep(0.05)
      assert not fake.produced  # the worker is waiting for the devices
      pipeline._produce({"w": 1}, [1], key, 1, 1)  # the step produced again
    done.set()

  t = threading.Thread(target=trainer, daemon=True)
  t.start()
  assert done.wait(60), "the trainer and the worker wait on each other"
  pipeline.close()
  assert [(p.step, p.params) for p in fake.produced] == [(1, 0), (1, 1)]


def test_an_ordered_leader_whose_publish_fails_lets_the_devices_go():
  """The coordination service failing under process 0 raises in the thread asking for a turn
  and leaves the devices free (before, they stayed taken and the other thread waited for ever)."""
  from agentjax.parallel.host import DeviceTurn

  class Failing(_FakeKV):
    def key_value_set(self, key, value):
      raise ConnectionError("coordination service down")

  turn = DeviceTurn()
  with turn.ordered(Failing(), "run/turns", leader=True):
    with pytest.raises(ConnectionError):
      with turn.hold():
        pass
  assert not turn._busy
  with turn.hold():
    pass


def test_the_async_benchs_idle_share_counts_time_with_nothing_running():
  """launch/bench.py async's idle share on hand-made timelines: updates and productions are
  busy, a production's injected host waits are not, overlaps count once."""
  from agentjax.benchmarks.async_rl import _Timeline, idle_share
  t = _Timeline()
  t.add("produce", 0.0, 4.0)   # a rollout with a 1 s retriever wait and a 1 s judge wait
  t.add("wait", 1.0, 2.0)
  t.add("wait", 3.0, 4.0)
  assert idle_share(t, (0.0, 4.0)) == pytest.approx(0.5)
  t.add("consume", 1.5, 3.5)   # an update overlapping half of each wait
  assert idle_share(t, (0.0, 4.0)) == pytest.approx(0.25)
  assert idle_share(t, (2.0, 4.0)) == pytest.approx(0.25)  # [3.5, 4] idle in a 2 s window


def test_the_async_benchs_cpu_seconds_count_every_thread():
  """cores_busy's CPU seconds are the process's: a worker thread's own CPU time (the producer's,
  XLA's pool) is in them, not only the calling thread's."""
  from agentjax.benchmarks.async_rl import cpu_seconds
  own = []

  def burn():
    t0 = time.thread_time()
    x = 0
    for i in range(3_000_000):
      x += i * i
    own.append(time.thread_time() - t0)

  before, main_before = cpu_seconds(), time.thread_time()
  worker = threading.Thread(target=burn)
  worker.start()
  worker.join()  # the calling thread sleeps in join: its own CPU time barely moves
  counted = cpu_seconds() - before
  assert own[0] > 0 and counted >= own[0] + (time.thread_time() - main_before) - 0.02


@pytest.mark.slow  # a jax process with 8 fake devices compiling an RL step: minutes on 2 cores
def test_split_placement_samples_on_its_devices_and_trains_on_the_others(world_dir, tokenizer,
                                                                        tmp_path):
  """tests/async_split_check.py on 8 fake devices: rollouts by the sampler's 4 devices, updates on
  the other 4, the weight copy timed, staleness 0 then 1, and the first step's sampler log-probs
  the trainer's (the same float32 programs on other devices: no mismatch)."""
  import json
  import os
  import subprocess
  import sys

  from tests.subprocess_env import subprocess_env
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = subprocess_env(PYTHONPATH=root)
  proc = subprocess.run(
      [sys.executable, "-m", "tests.async_split_check", f"--workdir={tmp_path / 'run'}",
       f"--world_dir={world_dir}", f"--tokenizer_dir={tokenizer.name_or_path}",
       f"--tmp={tmp_path}"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = proc.stdout.strip().splitlines()
  assert "OK" in lines
  rows = json.loads(lines[-1])
  assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
  assert all(r["async/weight_copy_s"] > 0 for r in rows[:1])
  assert rows[0]["mismatch/abs_logp_diff"] < 1e-4  # step 2's rollout is one version old


def test_device_turn_lets_one_thread_hold_the_devices_and_lends_them_during_host_waits():
  """parallel.host.DEVICE_TURN: while the producer holds the devices the updater waits; inside
  the producer's host wait the updater takes them, and the producer gets them back only after;
  a host wait by a thread that does not hold them changes nothing."""
  from agentjax.parallel.host import DeviceTurn
  turn = DeviceTurn()
  events = []
  in_wait, updater_done = threading.Event(), threading.Event()

  def updater():
    assert in_wait.wait(30)
    with turn.hold():
      events.append("update")
    updater_done.set()

  t = threading.Thread(target=updater)
  t.start()
  with turn.hold():
    events.append("decode")
    with turn.host_wait():
      in_wait.set()
      assert updater_done.wait(30)  # the updater got the devices while this thread waited
      events.append("search")
    events.append("decode again")
  t.join(30)
  assert events == ["decode", "update", "search", "decode again"]
  with turn.host_wait():  # not held: a no-op
    with turn.hold():
      pass


@pytest.mark.slow  # 15 RL steps through RLStep (~40 s); the mechanics are in the default suite
def test_a_scripted_agent_learns_with_async_steps_0_1_and_2(scripted_world):
  """RLStep through the pipeline on the scripted agent (one turn: after </think> it answers,
  F1 1, or searches and runs out of turns, 0; GRPO, SGD as tests/test_rl_step.py): with
  async_steps 1 and 2 the reward rises as under the synchronous step, from the same start; the
  first step is the synchronous one in every setting (its rollout by version 0). (Measured:
  rewards 0.5, 1, 1, 1, 1 synchronous; 0.5, 0.54, 1, 1, 1 with k = 1; 0.5, 0.54, 0.62, 1, 1
  with k = 2: each version of staleness delays the climb by about a step on this toy.) Partial
  rollouts too: k = 1 with rollout.partial "continue" and k = 2 with "restart" (one-turn
  trajectories: a rollout reads the feed before its only turn, so both sample by the newest
  parameters published when that turn starts), and k = 2 with train.stale "drop" at
  max_staleness 1."""
  import dataclasses

  import optax

  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.parallel import make_mesh
  from agentjax.sampling import SamplingParams
  from agentjax.train.step import RLStep
  from configs import grpo
  from tests import agent_fixtures as af
  tok, backend, agent = scripted_world
  config = grpo.get_config("demo")
  config.rl.prompts_per_step, config.rl.minibatch_size = 2, 24
  config.rl.kl_coef = config.rl.entropy_coef = 0.0
  engine = RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=12, max_turns=1, max_new_tokens=8, max_obs_tokens=48, max_total_tokens=512,
      topk=2, sampling=SamplingParams(temperature=1.0)))
  optimizer = optax.sgd(0.3)
  rl_step = RLStep.build(config, make_mesh(1, 1, 1, devices=jax.devices()[:1]), engine,
                         optimizer, None)
  questions = [{"id": str(i), "question": "Who founded Zorvath?", "golden_answers": ["Aldric"]}
               for i in range(2)]
  steps, curves = 5, {}
  for k, partial, stale in ((0, "off", "wait"), (1, "off", "wait"), (2, "off", "wait"),
                            (1, "continue", "wait"), (2, "restart", "wait"),
                            (2, "continue", "drop")):
    engine.config = dataclasses.replace(engine.config, partial=partial)
    params = agent.params(af.SEARCH, af.ANSWER)
    state = {"params": params, "opt_state": optimizer.init(params), "rng": jax.random.key(0)}
    pipeline = RolloutPipeline(rl_step, lambda j: questions, k, end=steps, partial=partial,
                               stale=stale, max_staleness=1) if k else None
    rewards, staleness = [], []
    try:
      for t in range(steps):
        out = pipeline.step(state, t) if pipeline else rl_step(state, questions, t)
        state = out.state
        rewards.append(out.metrics["reward"])
        staleness.append(out.metrics.get("async/staleness", 0.0))
    finally:
      if pipeline:
        pipeline.close()
    curves[k if partial == "off" else (k, partial, stale)] = rewards
    assert max(staleness) <= (1 if stale == "drop" else k), (k, partial, stale, staleness)
  for k, rewards in curves.items():
    assert rewards[0] == curves[0][0], curves
    assert rewards[0] <= 0.9 and np.mean(rewards[-2:]) >= 0.95, (k, curves)


@pytest.mark.slow  # two tiny trainer runs (LoRA, DAC's two roles): a minute of compiles
@pytest.mark.parametrize("kind", ["lora", "dac"])
def test_async_steps_train_lora_adapters_and_dacs_roles(world_dir, tokenizer, tmp_path, kind):
  """train.async_steps = 1 with a LoRA policy adapter, and with DAC's searcher and generator
  (the pipeline copies the adapters; the rollouts attach them to the backbone): both steps run,
  the second on a one-version-old rollout, the first's sampler log-probs the trainer's, and
  every trained adapter moves."""
  import json
  import os

  from agentjax.train import config as config_lib
  from agentjax.train.trainer import train
  from tests.test_dac import _dac_config
  from tests.trainer_fixtures import tiny_config
  tmp = str(tmp_path)
  if kind == "dac":
    c = _dac_config(world_dir, tokenizer.name_or_path, tmp)
  else:
    c = tiny_config(world_dir, tokenizer.name_or_path, tmp, steps=2)
    c.model.lora.adapters = "policy"
    c.model.lora.rank = 4
    c.train.eval_every = 0
  c.train.async_steps = 1
  c.train.export_hf = False
  config_lib.validate(c)
  out = train(c, os.path.join(tmp, "run"))
  assert out["step"] == 2
  with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if '"reward"' in line]
  assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
  # Step 1's rollout is by the parameters it is scored with; step 2's by the version before
  # (the gap the mismatch metrics are there to show, and the corrections to weigh).
  assert rows[0]["mismatch/abs_logp_diff"] < 1e-4
  for name, adapter in out["params"].items():
    moved = max(float(np.abs(np.asarray(leaf)).max()) for path, leaf in
                jax.tree_util.tree_flatten_with_path(adapter)[0] if path[-1].key == "lora_b")
    assert moved > 0, name
