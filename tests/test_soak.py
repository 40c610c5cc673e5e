"""Long runs that do not grow: the sys/* metrics every step records (train/resources.py), their
second-half slopes (growth_report, launch/soak.py's figure), a short soak of the tiny run, and
(slow) the two-process asynchronous soak, whose coordination keys must stay bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from agentjax.train.resources import WATCHED, growth, growth_report, resources
from tests.subprocess_env import subprocess_env
from tests.trainer_fixtures import run_metrics, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_growth_is_the_second_halfs_fitted_slope_against_scipy():
  rng = np.random.default_rng(0)
  steps = np.arange(1, 41)
  flat = 100 + rng.normal(0, 2.0, 40)
  leak = 100 + 0.5 * steps + rng.normal(0, 0.1, 40)
  for values in (flat, leak):
    g = growth(steps, values, floor=1.0)
    fit = stats.linregress(steps[20:], values[20:])  # steps >= the middle one (21)
    assert g["slope_per_step"] == pytest.approx(fit.slope, rel=1e-9)
    assert g["growth_second_half"] == pytest.approx(fit.slope * 19, rel=1e-9)
    residuals = values[20:] - (fit.slope * steps[20:] + fit.intercept)
    assert g["noise"] == pytest.approx(np.std(residuals), rel=1e-6)
    assert (g["first"], g["middle"], g["last"]) == (values[0], values[20], values[-1])
  assert growth(steps, flat, 1.0)["bounded"]  # noise is not growth
  assert not growth(steps, leak, 1.0)["bounded"]  # ~9.5 over the half, noise ~0.1
  # A count that grows by one in the second half is caught; one constant throughout is not;
  # one that shrinks (arrays freed) is fine.
  count = np.full(40, 7.0)
  assert growth(steps, count, 0.5)["bounded"]
  count[30:] = 8.0
  assert not growth(steps, count, 0.5)["bounded"]
  assert growth(steps, 50.0 - steps, 0.5)["bounded"]


def test_growth_report_covers_the_watched_metrics_a_run_has():
  rows = [{"step": s, "sys/threads": 5.0, "compiles": 8.0, "reward": 0.1} for s in range(1, 9)]
  report = growth_report(rows + [{"step": 9, "reward": 0.2}])  # a row without them: skipped
  assert sorted(report) == ["compiles", "sys/threads"]
  assert all(r["bounded"] for r in report.values())
  assert {name for name, _ in WATCHED} >= {"sys/rss_mb", "sys/live_arrays", "sys/live_mb",
                                           "sys/open_fds", "sys/kv_keys"}


def test_resources_counts_this_processs_arrays_threads_and_files(tmp_path):
  import threading

  import jax.numpy as jnp
  before = resources()
  held = [jnp.ones((256, 1024), jnp.float32) for _ in range(3)]  # 1 MiB each
  release = threading.Event()
  thread = threading.Thread(target=release.wait)
  thread.start()
  files = [open(tmp_path / f"f{i}", "w") for i in range(4)]
  try:
    during = resources()
  finally:
    release.set()
    thread.join()
    for f in files:
      f.close()
  assert during["sys/live_arrays"] - before["sys/live_arrays"] == 3
  assert during["sys/live_mb"] - before["sys/live_mb"] == pytest.approx(3.0)
  # Other threads may come and go meanwhile (a previous test's): ours is among those counted.
  assert during["sys/threads"] >= 2
  assert during["sys/open_fds"] - before["sys/open_fds"] == 4
  assert during["sys/rss_mb"] > 0 and "sys/kv_keys" not in during  # one process: no store
  del held


@pytest.fixture(scope="module")
def tokenizer_dir(tokenizer):
  return tokenizer.name_or_path


def test_a_short_soak_holds_the_same_arrays_threads_files_and_programs(world_dir, tokenizer_dir,
                                                                       tmp_path):
  """12 steps of the tiny run: from the middle on, nothing countable grows (memory is left to
  the long soak: 12 steps are too few to tell the allocator's noise from a leak)."""
  from agentjax.train.trainer import train
  config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), steps=12)
  config.train.eval_every = 0
  config.train.final_eval = False
  config.train.export_hf = False
  config.train.checkpoint_every = 3  # writes in the second half too
  train(config, str(tmp_path / "soak"))
  rows = run_metrics(str(tmp_path / "soak"), "sys/rss_mb")
  assert [r["step"] for r in rows] == list(range(1, 13))
  report = growth_report(rows)
  for name in ("sys/live_arrays", "sys/live_mb", "sys/threads", "sys/open_fds", "compiles"):
    assert report[name]["bounded"], (name, report[name])
    assert report[name]["last"] == report[name]["middle"], (name, report[name])


@pytest.mark.slow  # two jax processes for 24 steps: minutes on 2 cores
def test_two_process_async_soak_keeps_its_coordination_keys_bounded(tmp_path):
  """Two processes on loopback with async_steps=1 (device turns through the coordination
  service: tens of keys a step before they were deleted): every watched metric is bounded and
  the keys alive never exceed the turn order's bound."""
  from agentjax.parallel.host import _TurnOrder
  proc = subprocess.run([sys.executable, "launch/soak.py", "--steps=24", "--processes=2",
                         "--async_steps=1", f"--root={tmp_path}", "--stall_timeout_s=300"],
                        cwd=ROOT, env=subprocess_env(PYTHONPATH=ROOT), capture_output=True,
                        text=True, timeout=1800)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["bounded"] and out["steps"] == 24
  keys = [r["sys/kv_keys"] for r in run_metrics(str(tmp_path / "p2_async1"), "sys/kv_keys")]
  assert len(keys) == 24
  bound = _TurnOrder.PRUNE_EVERY + _TurnOrder.ACK_EVERY + 8 + 1
  assert max(keys) <= bound, keys


@pytest.mark.slow  # two jax processes, killed and restarted: minutes on 2 cores
def test_a_killed_process_restarts_to_its_reference(tmp_path):
  """One process-loss trial of launch/soak.py (docs/BENCHMARKS.md has ten): a process SIGKILLed
  during a rollout; the survivor exits (does not hang); both restarted resume from the last
  finalized checkpoint and end with the reference run's parameters, bit for bit."""
  proc = subprocess.run([sys.executable, "launch/soak.py", "--kill_trials=1", "--steps=3",
                         "--stall_timeout_s=60", "--seed=0", f"--root={tmp_path}",
                         "--config.rollout.warm_up=False", "--config.train.final_eval=False"],
                        cwd=ROOT, env=subprocess_env(PYTHONPATH=ROOT), capture_output=True,
                        text=True, timeout=3600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  (trial,) = out["trials"]
  assert trial["point"] == "rollout" and trial["killed"]
  assert trial["survivor_exit"] not in (None, 0)  # it ended, with a failure
  assert trial["restart_exit"] == [0, 0] and trial["max_abs_diff"] == 0.0 and trial["ok"]
