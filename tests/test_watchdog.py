"""The progress watchdog (agentjax/watchdog.py, train.stall_timeout_s): a stalled run dumps every
thread's stack and exits with code 75; restarted, it resumes to the uninterrupted run's result."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from agentjax.watchdog import STALL_EXIT_CODE, Watchdog, progress
from tests.subprocess_env import subprocess_env
from tests.trainer_fixtures import run_metrics, search_every_turn, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocked_in_a_named_frame(release: threading.Event) -> None:
  release.wait()


def test_a_stall_dumps_every_thread_naming_the_stuck_frame(tmp_path):
  release = threading.Event()
  stuck = threading.Thread(target=_blocked_in_a_named_frame, args=(release,),
                           name="rollouts_0", daemon=True)
  stalls = []
  try:
    with Watchdog(0.6, str(tmp_path), on_stall=stalls.append, poll_s=0.05) as watchdog:
      stuck.start()
      # Progress more often than the timeout, for longer than it: no stall.
      for i in range(12):
        time.sleep(0.1)
        progress(f"turn {i}")
      assert not stalls and not os.listdir(tmp_path)
      t0 = time.monotonic()
      while not stalls and time.monotonic() - t0 < 10:
        time.sleep(0.05)
  finally:
    release.set()
  assert len(stalls) == 1 and watchdog.stalled == stalls[0]
  # It acted after the timeout, not before, and not much after (a poll late at most).
  assert 0.5 <= time.monotonic() - t0 < 5.0
  text = open(stalls[0]).read()
  assert os.path.dirname(stalls[0]) == str(tmp_path)
  assert os.path.basename(stalls[0]).startswith("stall-p0-")
  assert "the last was: turn 11" in text
  assert "--- thread rollouts_0" in text and "_blocked_in_a_named_frame" in text
  assert "--- thread MainThread" in text
  assert "--- thread watchdog" not in text


def test_an_idle_or_disabled_watchdog_does_nothing(tmp_path):
  stalls = []
  with Watchdog(0, str(tmp_path), on_stall=stalls.append) as off:
    progress("anything")  # no watchdog running: a no-op
    time.sleep(0.1)
  assert off._thread is None
  with Watchdog(5.0, str(tmp_path), on_stall=stalls.append, poll_s=0.01) as outer:
    with Watchdog(0.01, str(tmp_path)) as inner:  # nested: the outer one keeps watching
      time.sleep(0.1)
    assert inner._thread is None and outer._thread is not None
    import agentjax.watchdog as watchdog_lib
    assert watchdog_lib._active is outer
  assert not stalls and not os.listdir(tmp_path)
  progress("after")  # none running again


def test_a_compilation_in_flight_is_progress_however_long(tmp_path):
  """jax's compile events (its start, a scalar; its end, a duration) bracket a compilation:
  inside one the watchdog waits past its timeout; after it, the timeout counts again."""
  from agentjax.watchdog import _COMPILE_EVENT
  stalls = []
  with Watchdog(0.4, str(tmp_path), on_stall=stalls.append, poll_s=0.05):
    jax.monitoring.record_scalar(_COMPILE_EVENT, time.time(), fun_name="slow_program")
    time.sleep(1.2)  # three timeouts inside the compilation
    assert not stalls
    jax.monitoring.record_event_duration_secs(_COMPILE_EVENT, 1.2, fun_name="slow_program")
    t0 = time.monotonic()
    while not stalls and time.monotonic() - t0 < 10:
      time.sleep(0.05)
  assert len(stalls) == 1
  assert "the last was: compiled slow_program" in open(stalls[0]).read()


def test_long_busy_work_counts_as_progress_up_to_its_cap(tmp_path):
  """A `busy` block (the export) or a compilation is progress for BUSY_TIMEOUTS timeouts from
  its start, not for ever: a write or compiler that never returns is a hang too."""
  from agentjax.watchdog import busy
  stalls = []
  with Watchdog(0.2, str(tmp_path), on_stall=stalls.append, poll_s=0.02) as watchdog:
    t0 = time.monotonic()
    with busy("the export"):
      while not stalls and time.monotonic() - t0 < 10:
        time.sleep(0.02)
  waited = time.monotonic() - t0
  assert len(stalls) == 1 and "the last was: the export" in open(stalls[0]).read()
  assert waited >= watchdog.BUSY_TIMEOUTS * 0.2 - 0.05  # not before the cap


@pytest.fixture(scope="module")
def tokenizer_dir(tokenizer):
  return tokenizer.name_or_path


def _stalled_run(world_dir, tokenizer_dir, tmp, workdir, async_steps=0, timeout_s=20.0):
  """tests/stall_check.py in a subprocess: 2 steps, the retriever never answers in step 2."""
  args = [f"--workdir={workdir}", f"--world_dir={world_dir}", f"--tokenizer_dir={tokenizer_dir}",
          f"--tmp={tmp}", "--stall_at=1", "--steps=2", f"--timeout_s={timeout_s}",
          f"--async_steps={async_steps}"]
  t0 = time.monotonic()
  proc = subprocess.run([sys.executable, "-m", "tests.stall_check", *args], cwd=ROOT,
                        env=subprocess_env(PYTHONPATH=ROOT), capture_output=True, text=True,
                        timeout=900)
  return proc, time.monotonic() - t0


@pytest.mark.parametrize("async_steps", [
    0,
    # The stall in the rollout producer's thread, the trainer's thread waiting on its result.
    pytest.param(1, marks=pytest.mark.slow),
])
def test_a_retriever_that_never_answers_ends_the_run_and_a_restart_resumes_it(
    world_dir, tokenizer_dir, tmp_path, monkeypatch, async_steps):
  from agentjax.train.trainer import train
  tmp = str(tmp_path)
  workdir = os.path.join(tmp, "stalled")
  proc, _ = _stalled_run(world_dir, tokenizer_dir, tmp, workdir, async_steps)
  assert proc.returncode == STALL_EXIT_CODE, proc.stderr[-4000:]
  assert "FINISHED" not in proc.stdout
  assert "train.stall_timeout_s" in proc.stderr and "exiting with code 75" in proc.stderr
  dumps = glob.glob(os.path.join(workdir, "stall-p0-*.txt"))
  assert len(dumps) == 1
  text = open(dumps[0]).read()
  assert "retriever_never_answers" in text  # the stuck frame, by name
  stuck = "rollouts_0" if async_steps else "MainThread"
  section = text.split(f"--- thread {stuck}")[1].split("--- thread")[0]
  assert "retriever_never_answers" in section
  # Step 1 finished and was checkpointed; step 2 never was.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]
  assert [r["step"] for r in run_metrics(workdir, "reward")] == [1]

  # The restart (the retriever answers now) resumes at step 1 and ends where an uninterrupted
  # run ends. Asynchronous: where a run preempted at step 1 ends (the rollout in flight at a
  # stop is produced again from the restored parameters: test_trainer's async resume test).
  config = tiny_config(world_dir, tokenizer_dir, tmp, steps=2)
  from tests.stall_check import stall_config
  stall_config(config, 20.0, async_steps)
  search_every_turn(monkeypatch.setattr)
  resumed = train(config, workdir)
  if async_steps:
    train(config, os.path.join(tmp, "whole"), stop_after=1)
  whole = train(config, os.path.join(tmp, "whole"))
  assert resumed["step"] == whole["step"] == 2
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["params"]),
               jax.device_get(whole["params"]))
  rows = {r["step"]: r for r in run_metrics(workdir, "reward")}
  for r in run_metrics(os.path.join(tmp, "whole"), "reward"):
    assert rows[r["step"]]["reward"] == r["reward"] and rows[r["step"]]["kl"] == r["kl"]


@pytest.mark.slow  # two jax processes on loopback: minutes on 2 cores
def test_a_collective_a_frozen_process_never_joins_ends_the_other_process(tmp_path):
  """Two processes; process 1 freezes (SIGSTOP: its sockets stay open, so nothing fails) during
  its second update: process 0 waits in a collective with no progress, and its watchdog dumps
  its stacks and exits with code 75 within the timeout."""
  proc = subprocess.run([sys.executable, "launch/soak.py", "--steps=4", "--processes=2",
                         f"--root={tmp_path}", "--stall_timeout_s=30",
                         "--kill=update:2:0.2:STOP", "--kill_process=1"],
                        cwd=ROOT, env=subprocess_env(PYTHONPATH=ROOT), capture_output=True,
                        text=True, timeout=1800)
  assert proc.returncode != 0
  codes = proc.stderr.strip().splitlines()[-1]
  assert codes.startswith("soak: worker exit codes [75, "), proc.stderr[-3000:]
  assert "SIGSTOP to process 1 at update #2" in proc.stdout
  dumps = glob.glob(str(tmp_path / "p2_async0" / "stall-p0-*.txt"))
  assert len(dumps) == 1
  text = open(dumps[0]).read()
  assert text.startswith("no progress for") and "the last was: " in text.splitlines()[0]
  main = text.split("--- thread MainThread")[1].split("--- thread")[0]
  assert "agentjax/train/" in main  # stuck inside the step, in a collective process 1 never joins
