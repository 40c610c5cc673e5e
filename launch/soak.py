r"""Soak: a training run of hundreds of steps that records, every step, what the process holds
(the sys/* metrics: resident memory, live device arrays and their bytes, threads, open files, the
coordination service's keys; agentjax/train/resources.py) and the programs compiled, then reports
each one's slope over the run's second half: a long run must not grow in any of them.

    python launch/soak.py --steps=300                                   # tiny shape, synchronous
    python launch/soak.py --steps=300 --async_steps=1                   # a rollout thread beside
    python launch/soak.py --steps=300 --processes=2 --async_steps=1     # two processes, loopback
    python launch/soak.py --shape=config --config=configs/igpo.py:demo  # the demo's own shape
                                                                        # (after `make demo`)

--shape=tiny (default): the tiny model from scratch on a SynthWorld built in {root}/synthworld,
two questions of two trajectories a step, two turns; what a week-long run does thousands of
times in a few minutes. --shape=config: the config as given.

Losing a process (--kill_trials=N): a two-process asynchronous run on loopback, in which one
process (chosen at random) SIGKILLs itself at a random point of a chosen kind: during a rollout,
during an update, during a checkpoint write (the write in flight), or at a device-turn
hand-over. Each trial records whether the survivor exited within --stall_timeout_s plus a poll
(it must not hang: the watchdog's exit code 75, or jax's own detection of the lost peer), which
checkpoints were on disk (finalized step folders; a write that died leaves only orbax's
temporary folder, never a half-written step), and then restarts both processes: the run must
resume from the last checkpoint and finish with the parameters of a run preempted at that same
checkpoint (for step 0: the uninterrupted run; an asynchronous run produces the rollout in flight
at a stop again from the restored parameters, so "preempted at step c" is the run a restart
from step c must equal). Exit code 1 unless every trial passes.

    python launch/soak.py --kill_trials=10 --steps=4

A metric is bounded when its growth over the second half is within its bound
(agentjax/train/resources.py `growth_report`). Prints a table, then (last line) one JSON object;
exit code 1 when a metric is not bounded. Each run starts fresh in
{root}/p{processes}_async{async_steps}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_CONFIG = common.define_config("The RL config.", default="configs/igpo.py:demo")
_SHAPE = flags.DEFINE_enum("shape", "tiny", ["tiny", "config"], "tiny: the tiny model on a "
                           "SynthWorld of its own (the docstring); config: the config as given.")
_ROOT = flags.DEFINE_string("root", "runs/soak", "Folder for the world and the run.")
_STEPS = flags.DEFINE_integer("steps", 300, "RL steps.")
_ASYNC = flags.DEFINE_integer("async_steps", 0, "train.async_steps.")
_PROCESSES = flags.DEFINE_integer("processes", 1, "Processes on loopback (jax.distributed, gloo "
                                  "collectives), one CPU device each.")
_WORKER = flags.DEFINE_integer("worker", -1, "Internal: this worker's process index of "
                               "--processes > 1 (-1: the soak itself).")
_PORT = flags.DEFINE_integer("port", 0, "Internal: the coordinator's port.")
_STALL = flags.DEFINE_float("stall_timeout_s", 300.0, "train.stall_timeout_s: a hang ends the "
                            "soak with the stacks instead of holding it.")
_KILL_TRIALS = flags.DEFINE_integer("kill_trials", 0, "Process-loss trials instead of a soak "
                                    "(the docstring); implies --processes=2, --async_steps=1.")
_SEED = flags.DEFINE_integer("seed", 0, "The kill trials' random choices.")
_KILL = flags.DEFINE_string("kill", "", "Internal: point:occurrence:delay_s (the victim's "
                            "self-kill).")
_KILL_PROCESS = flags.DEFINE_integer("kill_process", 1, "Internal: the process --kill applies to.")
_STOP_AFTER = flags.DEFINE_integer("stop_after", 0, "Internal: train(stop_after=) (a preemption).")
_PARAMS_OUT = flags.DEFINE_string("params_out", "", "Internal: process 0 writes the final "
                                  "parameters here (.npz).")

def soak_config(config, root: str, steps: int, async_steps: int, shape: str, processes: int):
  """The config a soak runs: `config` with the run's length, and for shape "tiny" the tiny model
  on the world under `root` with small batches."""
  config.train.steps = steps
  config.train.async_steps = async_steps
  config.train.stall_timeout_s = _STALL.value
  config.train.export_hf = False
  config.train.eval_every = 0  # the final eval only
  config.train.checkpoint_every = max(1, steps // 4)  # a few writes, as a long run has
  if shape == "tiny":
    from agentjax.data.demo_world import build_demo_world, use_demo_world
    print(build_demo_world(os.path.join(root, "synthworld"), topk=config.retrieval.topk),
          flush=True)
    use_demo_world(config, root)
    config.model.hf_path = ""
    config.model.preset = "tiny"
    config.data.eval_size = 4
    config.train.eval_batch = 4
    config.rollout.group_size = 2
    config.rollout.max_turns = 2
    config.rollout.max_new_tokens = 24
    config.rollout.max_obs_tokens = 96
    config.rollout.max_total_tokens = 512
    config.rl.prompts_per_step = 2 * processes  # a row per device on the data axis at least
    config.rl.minibatch_size = 2 * processes
  return config


def report(workdir: str, seconds: float) -> dict:
  from agentjax.train.resources import growth_report
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in rows if "sys/rss_mb" in r]  # the training steps (not the eval rows)
  if len(rows) < 16:  # a second half of a few points fits any line exactly: no noise to judge by
    raise SystemExit(f"soak: {len(rows)} step rows in {workdir}/metrics.jsonl; a slope needs "
                     ">= 16 steps (--steps)")
  out = growth_report(rows)
  print(f"{'metric':18s} {'first':>10s} {'middle':>10s} {'last':>10s} {'per step':>10s} "
        f"{'growth':>9s} {'bound':>8s}  ok")
  for name, g in out.items():
    print(f"{name:18s} {g['first']:10.1f} {g['middle']:10.1f} {g['last']:10.1f} "
          f"{g['slope_per_step']:10.4f} {g['growth_second_half']:9.2f} {g['bound']:8.2f}  "
          f"{'yes' if g['bounded'] else 'NO'}")
  steps = [r.get("step_s") for r in rows[len(rows) // 2:] if r.get("step_s") is not None]
  return {"steps": len(rows), "seconds": round(seconds, 1),
          "step_s_second_half": round(sum(steps) / len(steps), 3) if steps else None,
          "metrics": out, "bounded": all(g["bounded"] for g in out.values())}


KILL_POINTS = ("rollout", "update", "checkpoint", "handover")


def _arm_kill(spec: str) -> None:
  """This process SIGKILLs itself (`point:occurrence:delay_s`; `...:STOP`: SIGSTOP) `delay_s`
  after the `occurrence`-th (1-based) start of `point`:
  a rollout (RLStep.produce), an update (RLStep.consume), a checkpoint write (Checkpointer.save:
  orbax writes it in the background meanwhile) or a device-turn hand-over (DeviceTurn._release,
  at once)."""
  import signal
  import threading

  from agentjax.parallel.host import DeviceTurn
  from agentjax.train.checkpoint import Checkpointer
  from agentjax.train.step import RLStep
  point, occurrence, delay, *how = spec.split(":")
  occurrence, delay = int(occurrence), float(delay)
  # STOP: the process freezes instead (SIGSTOP: its sockets stay open, so the others' next
  # collective waits on it for ever; what a hung host looks like, unlike a dead one).
  sig = signal.SIGSTOP if how == ["STOP"] else signal.SIGKILL
  owner, name = {"rollout": (RLStep, "produce"), "update": (RLStep, "consume"),
                 "checkpoint": (Checkpointer, "save"), "handover": (DeviceTurn, "_release")}[point]
  real, seen = getattr(owner, name), [0]
  die = lambda: os.kill(os.getpid(), sig)  # noqa: E731

  def wrapped(*args, **kwargs):
    seen[0] += 1
    if seen[0] == occurrence:
      print(f"soak: {sig.name} to process {_WORKER.value} at {point} #{occurrence} "
            f"+{delay:.2f} s", flush=True)
      if delay <= 0:
        die()
      threading.Timer(delay, die).start()
    return real(*args, **kwargs)

  setattr(owner, name, wrapped)


def _worker(workdir: str) -> None:
  """One process of the run (all of it, or one of --processes on loopback)."""
  import jax
  if _PROCESSES.value > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{_PORT.value}", _PROCESSES.value, _WORKER.value)
  from agentjax.train.trainer import train
  config = soak_config(_CONFIG.value, _ROOT.value, _STEPS.value, _ASYNC.value, _SHAPE.value,
                       _PROCESSES.value)
  if _KILL.value and _WORKER.value == _KILL_PROCESS.value:
    _arm_kill(_KILL.value)
  out = train(config, workdir, stop_after=_STOP_AFTER.value or None)
  if _PARAMS_OUT.value:
    import numpy as np
    from agentjax.parallel.host import to_host
    params = to_host(out["params"])  # every process: a collective for sharded arrays
    if jax.process_index() == 0:
      flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
              for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
      np.savez(_PARAMS_OUT.value, **flat)


def _spawn(workdir_args: list[str], extra: list[list[str]]) -> list[subprocess.Popen]:
  """--processes workers of this script on loopback; extra[i]: process i's own flags."""
  from agentjax.parallel.host import free_port
  port = free_port()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      os.environ.get("PYTHONPATH")])))
  return [subprocess.Popen([sys.executable, os.path.abspath(__file__), *workdir_args,
                            f"--worker={i}", f"--port={port}", *extra[i]], env=env)
          for i in range(len(extra))]


def _finalized(workdir: str) -> tuple[list[int], list[str]]:
  """(the step folders a run left in its checkpoints, anything else there: orbax's temporary
  folders of a write that did not finish)."""
  folder = os.path.join(workdir, "checkpoints")
  names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
  return sorted(int(n) for n in names if n.isdigit()), [n for n in names if not n.isdigit()]


def _run_both(args: list[str], extra: list[list[str]], timeout_s: float) -> list[int | None]:
  """The workers' exit codes; None for one still running after timeout_s (then killed)."""
  procs = _spawn(args, extra)
  deadline = time.monotonic() + timeout_s
  codes = []
  try:
    for p in procs:
      try:
        codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
      except subprocess.TimeoutExpired:
        codes.append(None)  # hung: the trial records it rather than ending every trial
    return codes
  finally:
    for p in procs:
      p.kill()


def _share_world(root: str, runs: str) -> None:
  """`runs` (a fresh folder) sees root's world and index: every run reads the same."""
  os.makedirs(runs)
  for shared in ("synthworld", "bm25_index"):  # (tfds: each run prepares its own)
    os.symlink(os.path.abspath(os.path.join(root, shared)), os.path.join(runs, shared))


def kill_trials(trials: int) -> dict:
  """The process-loss trials (module docstring); returns their record."""
  import random

  import numpy as np
  root, steps, timeout = _ROOT.value, _STEPS.value, _STALL.value
  base = [a for a in sys.argv[1:] if not a.startswith(("--kill_trials", "--processes",
                                                       "--async_steps", "--root"))]
  # Every run reads its programs back from one compilation cache: the trials' runs have the same
  # shapes, and compiling them again each time would be most of a trial.
  base += ["--processes=2", "--async_steps=1",
           f"--config.train.jax_cache_dir={os.path.abspath(os.path.join(root, 'jax_cache'))}"]
  if _SHAPE.value == "tiny":
    from agentjax.data.demo_world import build_demo_world
    build_demo_world(os.path.join(root, "synthworld"), topk=_CONFIG.value.retrieval.topk)
  long = 20 * 60  # a run that is not killed: its whole length, generously

  def reference(c: int) -> dict:
    """The final parameters of the run preempted at step c (0: uninterrupted), cached."""
    out = os.path.join(root, "refs", f"c{c}.npz")
    if not os.path.exists(out):
      runs = os.path.join(root, "refs", f"c{c}")
      shutil.rmtree(runs, ignore_errors=True)
      args = base + [f"--root={runs}"]
      _share_world(root, runs)
      if c:
        codes = _run_both(args, [[f"--stop_after={c}"]] * 2, long)
        assert codes == [0, 0], f"reference c={c}: preempted run exit codes {codes}"
      codes = _run_both(args, [[f"--params_out={out}"], []], long)
      assert codes == [0, 0], f"reference c={c}: exit codes {codes}"
    return dict(np.load(out))

  rng = random.Random(_SEED.value)
  records = []
  for trial in range(trials):
    point = KILL_POINTS[trial % len(KILL_POINTS)]
    victim = rng.randrange(2)
    # rollouts and updates: one per step (+1 produced ahead); checkpoint writes: one per step;
    # hand-overs: two or more a step (the tiny run's rollout is one turn of the devices with
    # two host waits; the update one)
    occurrence = {"rollout": rng.randint(2, steps), "update": rng.randint(1, steps - 1),
                  "checkpoint": rng.randint(1, steps - 1),
                  "handover": rng.randint(3, 2 * steps)}[point]
    delay = 0.0 if point == "handover" else round(rng.uniform(0.0, 1.5), 2)
    runs = os.path.join(root, "trials", str(trial))
    shutil.rmtree(runs, ignore_errors=True)
    _share_world(root, runs)
    args = base + [f"--root={runs}"]
    workdir = os.path.join(runs, "p2_async1")
    kill = [[], []]
    kill[victim] = [f"--kill={point}:{occurrence}:{delay}", f"--kill_process={victim}"]
    t0 = time.monotonic()
    procs = _spawn(args, kill)
    record = {"trial": trial, "point": point, "occurrence": occurrence, "delay_s": delay,
              "victim": victim}
    try:
      code = procs[victim].wait(timeout=long)
      killed_at = time.monotonic()
      record["victim_exit"] = code
      survivor = procs[1 - victim]
      try:
        record["survivor_exit"] = survivor.wait(timeout=timeout + 120)
        record["survivor_s"] = round(time.monotonic() - killed_at, 1)
      except subprocess.TimeoutExpired:
        record["survivor_exit"], record["survivor_s"] = None, None  # hung
    finally:
      for p in procs:
        p.kill()
    record["killed"] = record["victim_exit"] == -9
    steps_on_disk, other = _finalized(workdir)
    record.update(checkpoints=steps_on_disk, leftovers=other,
                  stall_dumps=sorted(os.path.basename(f) for f in os.listdir(workdir)
                                     if f.startswith("stall-")) if os.path.isdir(workdir) else [])
    resumed_from = steps_on_disk[-1] if steps_on_disk else 0
    out = os.path.join(runs, "final.npz")
    codes = _run_both(args, [[f"--params_out={out}"], []], long)
    record["restart_exit"] = codes
    record["resumed_from"] = resumed_from
    if codes == [0, 0]:
      got, want = dict(np.load(out)), reference(resumed_from)
      record["max_abs_diff"] = float(max(np.max(np.abs(got[k] - want[k])) for k in want))
      record["same_names"] = sorted(got) == sorted(want)
    record["seconds"] = round(time.monotonic() - t0, 1)
    record["ok"] = bool(record["killed"] and record["survivor_exit"] is not None
                        and record["survivor_exit"] != 0 and codes == [0, 0]
                        and record.get("same_names") and record.get("max_abs_diff") == 0.0)
    records.append(record)
    print(json.dumps(record), flush=True)
  return {"trials": records, "passed": sum(r["ok"] for r in records), "steps": steps,
          "stall_timeout_s": timeout}


def main(argv):
  del argv
  if _KILL_TRIALS.value and _WORKER.value < 0:
    out = kill_trials(_KILL_TRIALS.value)
    print(json.dumps(out))
    sys.exit(0 if out["passed"] == len(out["trials"]) else 1)
  root = _ROOT.value
  workdir = os.path.join(root, f"p{_PROCESSES.value}_async{_ASYNC.value}")
  if _WORKER.value >= 0:
    _worker(workdir)
    return
  if os.path.exists(workdir):
    shutil.rmtree(workdir)  # a soak measures a run from its start
  t0 = time.perf_counter()
  if _PROCESSES.value == 1:
    _worker(workdir)
  else:
    if _SHAPE.value == "tiny":  # built once, before the workers read it
      from agentjax.data.demo_world import build_demo_world
      build_demo_world(os.path.join(root, "synthworld"), topk=_CONFIG.value.retrieval.topk)
    procs = _spawn(sys.argv[1:], [[] for _ in range(_PROCESSES.value)])
    try:
      # Until all end, or one fails: the others may then wait for it for ever (a frozen one
      # never exits; its peers' watchdogs end them).
      while (any(p.poll() is None for p in procs)
             and not any(p.poll() for p in procs if p.poll() is not None)):
        time.sleep(1.0)
      for p in procs:
        if p.poll() is None and any(q.poll() for q in procs if q.poll() is not None):
          try:
            p.wait(timeout=_STALL.value + 10)  # its own watchdog's turn to end it
          except subprocess.TimeoutExpired:
            pass
    finally:  # one that failed must not leave the other waiting in a collective
      for p in procs:
        p.kill()
    codes = [p.wait() for p in procs]
    if any(codes):
      raise SystemExit(f"soak: worker exit codes {codes}")
  out = report(workdir, time.perf_counter() - t0)
  out.update(processes=_PROCESSES.value, async_steps=_ASYNC.value, shape=_SHAPE.value)
  print(json.dumps(out))
  if not out["bounded"]:
    sys.exit(1)


if __name__ == "__main__":
  common.run(main)
