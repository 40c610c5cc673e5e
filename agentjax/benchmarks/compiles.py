"""`python launch/bench.py compiles --config=configs/igpo.py:demo`: the programs an RL run
compiles, by name: while it is built, at each step, and in one eval (bench_compiles).

    python launch/bench.py compiles --config=configs/igpo.py:demo --steps=10
    python launch/bench.py compiles --config=configs/igpo.py:research --steps=10 \
        --compile_root=runs/research --compile_model=backbones/research_v2/final

The run is the trainer's own (train.trainer.build_rl, the rollouts' warm-up when rollout.warm_up
is on, and its RLStep, on this machine's devices), without checkpoints: steps and one eval of --compile_eval dev questions. --compile_root: a folder
with the world (synthworld/, tfds/, bm25_index/, as launch/demo.py and the studies lay it out);
default: the demo world built in a temporary folder. --compile_model: an HF folder to start from
(default: the config's; a random model of its preset when it names none). The reference is the
target, not another implementation: programs after step 1 should be 0.
"""

from __future__ import annotations

import collections
import os
import tempfile
import time

from absl import flags

from agentjax.benchmarks.common import FLAGS, device_name

flags.DEFINE_string("compile_root", "", "compiles: a folder holding the world (synthworld/, "
                    "tfds/, bm25_index/); default: the demo world in a temporary folder.")
flags.DEFINE_string("compile_model", "", "compiles: HF folder of the start (default: the "
                    "config's model).")
flags.DEFINE_integer("compile_eval", 16, "compiles: dev questions of the eval after the steps.")


def _by_name(programs: list[tuple[str, float]]) -> dict[str, int]:
  return dict(collections.Counter(name for name, _ in programs).most_common())


def _by_source(programs: list[tuple[str, float]], sources: list[str]) -> dict[str, int]:
  """Counts of "<program> @ <the agentjax line that asked for it>"."""
  return dict(collections.Counter(
      f"{name} @ {where}" for (name, _), where in zip(programs, sources)).most_common())


def bench_compiles() -> dict:
  from agentjax.compiles import CompileLog
  from agentjax.data.demo_world import build_demo_world, use_demo_world
  from agentjax.parallel import use_mesh
  from agentjax.train import config as config_lib
  from agentjax.train.evaluation import evaluate
  from agentjax.train.trainer import build_rl, warm_up_rollouts
  if FLAGS.config is None:
    raise SystemExit("compiles: give --config=configs/<method>.py:<preset>")
  config = FLAGS.config
  root = FLAGS.compile_root or tempfile.mkdtemp(prefix="bench_compiles_")
  if not FLAGS.compile_root:
    build_demo_world(os.path.join(root, "synthworld"), topk=config.retrieval.topk)
  use_demo_world(config, root)
  if FLAGS.compile_model:
    config.model.hf_path = os.path.abspath(FLAGS.compile_model)
    config.model.tokenizer_path = ""
  config.train.jax_cache_dir = ""  # every program compiled here, none read back
  config_lib.validate(config)
  steps = FLAGS.steps
  per_step = config.rl.prompts_per_step
  with CompileLog() as log:
    t0 = time.perf_counter()
    parts = build_rl(config)
    built = log.take()
    if config.rollout.warm_up:  # as the trainer does before step 1
      warm_up_rollouts(config, parts, parts.state)
    warmed = log.take()
    built += warmed
    state, step_programs, step_seconds = parts.state, [], []
    for step in range(steps):
      t = time.perf_counter()
      out = parts.rl_step(state, parts.stream.take(step * per_step, per_step), step)
      state = out.state
      step_programs.append(log.take())
      step_seconds.append(time.perf_counter() - t)
    with use_mesh(parts.mesh):
      evaluate(parts.eval_engine, parts.target.rollout_params(state["params"]),
               parts.dev[:FLAGS.compile_eval], config.train.eval_batch)
    evaluated = log.take()
    seconds = time.perf_counter() - t0
  after_first = [p for s in step_programs[1:] for p in s]
  start = config.model.hf_path or f"a random {config.model.preset} model"
  first_after = len(built) + len(step_programs[0]) if steps else len(built)
  first = step_programs[0] if steps else []
  every = built + [p for s in step_programs for p in s] + evaluated
  return {
      "bench": "compiles", "config": f"{config.algorithm} ({start}, {config.rollout.engine} engine)",
      "device": device_name(), "steps": steps,
      "programs_build": len(built) - len(warmed), "programs_warm_up": len(warmed),
      "warm_up_seconds": round(sum(s for _, s in warmed), 2),
      "programs_per_step": [len(s) for s in step_programs],
      "programs_by_step_1": first_after,
      "programs_after_step_1": len(after_first), "programs_eval": len(evaluated),
      "programs_total": len(every),
      "compile_seconds_total": round(sum(s for _, s in every), 2),
      "compile_seconds_per_step": [round(sum(s for _, s in p), 2) for p in step_programs],
      "step_seconds": [round(s, 2) for s in step_seconds], "wall_seconds": round(seconds, 1),
      "after_step_1_by_name": _by_name(after_first),
      "after_step_1_by_source": _by_source(after_first, log.sources[first_after:]),
      "step_1_by_name": _by_name(first),
      "step_1_by_source": _by_source(first, log.sources[len(built):first_after]),
      "by_name": dict(list(_by_name(every).items())[:25]),
      "reference": "the target: 0 programs after step 1"}
