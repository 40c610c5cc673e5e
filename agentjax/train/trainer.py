r"""The train loops behind launch/train.py: RL (IGPO / GRPO family) and the SFT warm start.

    python launch/train.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo

An RL run, top to bottom (`train_rl`):

  validate config ─► mesh, tokenizer, model (HF folder or preset), frozen reference = initial params
  ─► train questions (tfds), dev questions, search backend, rollout engines (sampling and greedy eval)
  ─► train state {params, opt_state, rng} + data position: restored from {workdir}/checkpoints
     if there is one, else fresh
  ─► per step (`RLStep`, agentjax/train/step.py): 1. rollouts (group_size per question)
               2. rewards (host: EM/F1, format)   3. one teacher-forced scoring pass: old and
               reference log-probs, IGPO's probes   4. advantages (registry, by config.algorithm)
               5. PPO-clip minibatch updates   6. metrics (progress bar, TensorBoard, metrics.jsonl)
               with what the process holds (sys/*: memory, live arrays, threads, files;
               agentjax/train/resources.py)
     then the fault rules (`FaultWatch`): train.max_skipped_updates consecutive non-finite
     updates, or retrieval.max_failed_steps steps in a row whose failed-query share is above
     retrieval.max_failure_rate, checkpoint the step and stop the run with an error
     every train.checkpoint_every steps, before every eval, at exit and on SIGTERM: checkpoint
     every train.eval_every steps (after that step's checkpoint): greedy eval on the dev split
     (eval/{step}.json; a run stopped during it evaluates that step again on resume)
     no progress (a turn, a compile, a step) for train.stall_timeout_s: every thread's stack to
     {workdir}/stall-*.txt and exit code 75, for the scheduler to restart it (agentjax/watchdog.py)
  ─► Hugging Face export at {workdir}/hf_export

Re-running the same command resumes from the latest checkpoint; the data position, RNG state and
minibatch shuffles (seeded by the step number) make a resumed run repeat the uninterrupted one.
A half-written last line of metrics.jsonl (a kill mid-append) is dropped on resume, with a
warning naming the line; a previous Hugging Face export survives a crash of the next one.

Workdir layout: checkpoints/<step>/, config.json, metrics.jsonl (one JSON line per step),
eval/<step>.json (per-question results), tensorboard/ (event files), hf_export/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import math
import os
import signal
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.bars import progress_bar
from agentjax.compiles import CompileCounter, cache_folder, use_persistent_cache
from agentjax.jsonl import iter_json_objects
from agentjax.judge import judge_identity
from agentjax.models.qwen import QwenConfig, init_params, param_shardings
from agentjax.models.qwen.checkpoint import load_hf, recover_export
from agentjax.models.tokenizer import load_tokenizer
from agentjax.parallel import make_mesh, split_meshes, use_mesh
from agentjax.parallel.host import (DEVICE_TURN, any_process, broadcast_from_primary,
                                    primary_first)
from agentjax.retrieval import SearchBackend, make_backend
from agentjax.retrieval.shared import PrimarySearch
from agentjax.sampling import SamplingParams
from agentjax.signals import check_records
from agentjax.train import config as config_lib
from agentjax.train.adapters import TrainTarget
from agentjax.train.checkpoint import Checkpointer, abstract_state, check_before_loading
from agentjax.train.critic import CRITIC_EXPORT_DIR, Critic, needs_critic
from agentjax.train.kinds import trainer_kind
from agentjax.train.pipeline import RolloutPipeline
from agentjax.train.resources import resources
from agentjax.train.step import AgentRollout, RLStep, StepOutput, schedule_args, updates_per_step
from agentjax.train.builders import (COMPAT_KEYS, EXPORT_DIR, QuestionStream,
                                     RECORDED_EXTRAS, SFT_COMPAT_KEYS, init_train_state,
                                     load_model, load_questions, make_agents, make_checkpointer,
                                     make_search_backend, opt_state_shardings, restore_policy,
                                     restore_trainable, rollout_config)
from agentjax.watchdog import Watchdog, progress
from agentjax.watchdog import busy as watchdog_busy

log = logging.getLogger(__name__)

# ============================================================================ metrics


class MetricsWriter:
  """metrics.jsonl + TensorBoard event files (process 0), and a console progress bar."""

  def __init__(self, workdir: str, total_steps: int, start_step: int, prefix: str):
    self.primary = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb = self.bar = None
    if not self.primary:
      return
    os.makedirs(workdir, exist_ok=True)
    self._truncate_after(start_step)
    from tensorboardX import SummaryWriter
    # purge_step: TensorBoard drops the events of steps > start_step that a preempted run wrote
    # after its last checkpoint (a SessionLog.START at that step), as metrics.jsonl does; also
    # when it was preempted before its first checkpoint (start_step 0, old event files).
    tb_dir = os.path.join(workdir, "tensorboard")
    rerun = start_step > 0 or bool(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    # The suffix keeps a restart within the same second from reusing (truncating) a file name.
    self.tb = SummaryWriter(tb_dir, purge_step=start_step + 1 if rerun else None,
                            filename_suffix=f".{os.getpid()}.from{start_step}")
    # A bar on a terminal, a line every ~30 s or 10% of the run otherwise (agentjax/bars.py).
    self.bar = progress_bar(total_steps, prefix, initial=start_step)

  def _truncate_after(self, step: int) -> None:
    """A resumed run rewrites history past its checkpoint (those steps are done again).

    Lines that do not parse (a process killed mid-append leaves half a line) are dropped, each
    named in a warning: losing one log line must not block the restart."""
    if not os.path.exists(self.path):
      return
    on_error = lambda _, message: log.warning("dropping an unreadable metrics line: %s", message)  # noqa: E731
    keep = [json.dumps(row) + "\n"
            for _, row in iter_json_objects(self.path, ValueError, on_error=on_error)
            if row.get("step", 0) <= step]
    with open(self.path + ".tmp", "w") as f:
      f.writelines(keep)
    os.replace(self.path + ".tmp", self.path)

  def write(self, step: int, metrics: Mapping[str, float], postfix: Sequence[str] = ()) -> None:
    if not self.primary:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({**metrics, "step": step}) + "\n")
    for k, v in metrics.items():
      if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
        self.tb.add_scalar(k, v, step)
    self.tb.flush()
    if self.bar is not None:
      if postfix:  # an eval's row keeps the last step's postfix
        self.bar.set_postfix_str(" ".join(f"{k.split('/')[-1]} {metrics[k]:.3g}"
                                          for k in postfix if k in metrics), refresh=False)
      self.bar.update(step - self.bar.n)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    if self.tb is not None:
      self.tb.close()


class _Preemption:
  """SIGTERM (what TPU/GPU schedulers send before preempting) asks the loop to checkpoint and
  stop at the end of the current step."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      self._previous = None
    return self

  def _handle(self, *_):
    log.warning("SIGTERM: checkpointing at the end of this step, then stopping")
    self.requested = True

  def __exit__(self, *_):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _exists_on_primary(path: str) -> bool:
  """Whether `path` exists, as process 0 sees it, on every process (a collective): process 0
  writes the workdir's files, and a decision taken from them must be the same everywhere."""
  return bool(broadcast_from_primary(os.path.exists(path) if jax.process_index() == 0 else None))


def _recover_export(path: str) -> bool:
  """recover_export (process 0, the others wait), then whether the export exists."""
  with primary_first("recover-export"):
    recover_export(path)
  return _exists_on_primary(path)


def _read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, obj: Any) -> None:
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(path + ".tmp", path)


# ============================================================================ RL


def train(config: Any, workdir: str, *, stop_after: int | None = None) -> dict[str, Any]:
  """Runs config.trainer (train/kinds.py: "rl", "dac", "rubric" or "sft") in `workdir`; see
  train_rl / train_sft."""
  config_lib.validate(config)
  config_lib.check_paths(config)
  # A resume that cannot work is refused now, not after the model and the retriever loaded.
  supervised = trainer_kind(config).supervised
  check_before_loading(workdir, dict(config.to_dict(), **TrainTarget.of(config).recorded()),
                       COMPAT_KEYS + (SFT_COMPAT_KEYS if supervised else ()))
  use_persistent_cache(cache_folder(config.train.jax_cache_dir, os.path.expanduser(workdir)))
  if supervised:
    return train_sft(config, workdir, stop_after=stop_after)
  return train_rl(config, workdir, stop_after=stop_after)


class TrainingDivergedError(RuntimeError):
  """train.max_skipped_updates consecutive updates had a non-finite loss or gradient."""


class RetrieverUnavailableError(RuntimeError):
  """The retriever failed more than retrieval.max_failure_rate of a step's queries for
  retrieval.max_failed_steps steps in a row."""


@dataclasses.dataclass
class FaultWatch:
  """The two rules that stop a run that cannot go on, and their counters.

  A non-finite update is skipped (params kept); `max_skipped_updates` consecutive skips, across
  steps, mean the run diverged. A retriever fault is an error observation for its query; a step
  whose failed-query share exceeds `max_failure_rate`, `max_failed_steps` times in a row, means
  the retriever is down. A step that sends no query leaves the retriever count as it is. The
  counters travel in the checkpoint's data state, so a resume keeps counting (a run stopped for
  divergence and resumed unchanged stops again at its next skipped update).

  Why not optax.apply_if_finite (which counts consecutive non-finite updates in the optimizer
  state): the guarded step (optim.make_guarded_step) also refuses a non-finite loss and updated
  parameters that overflow, which apply_if_finite does not see, and apply_if_finite gives up
  after its limit and applies the non-finite update, where a run should stop instead. The count
  here is of the guard's own verdicts, one per update, carried across steps and resumes.
  """
  max_skipped_updates: int
  max_failure_rate: float
  max_failed_steps: int
  backend: str
  skipped_streak: int = 0
  failed_steps: int = 0

  @classmethod
  def from_config(cls, config: Any, data_state: Mapping[str, Any] | None = None) -> "FaultWatch":
    r = config.retrieval
    backend = (f"http retriever {r.url}" if r.backend == "http"
               else f"{r.backend} retriever over {r.corpus_path}")
    saved = (data_state or {}).get("faults", {})
    return cls(config.train.max_skipped_updates, r.max_failure_rate, r.max_failed_steps, backend,
               int(saved.get("skipped_streak", 0)), int(saved.get("failed_steps", 0)))

  def state(self) -> dict[str, int]:
    return {"skipped_streak": self.skipped_streak, "failed_steps": self.failed_steps}

  def observe(self, out: StepOutput, step: int) -> Exception | None:
    """Counts step `step`'s faults; the error that must stop the run, or None."""
    for skipped in out.update_skipped:
      self.skipped_streak = self.skipped_streak + 1 if skipped else 0
    if out.search_queries:
      failing = out.search_failed / out.search_queries > self.max_failure_rate
      self.failed_steps = self.failed_steps + 1 if failing else 0
    if self.max_skipped_updates and self.skipped_streak >= self.max_skipped_updates:
      return TrainingDivergedError(
          f"step {step}: {self.skipped_streak} consecutive updates were skipped (non-finite loss "
          f"or gradient; train.max_skipped_updates={self.max_skipped_updates}). The checkpoint "
          f"of step {step} holds the last good parameters; lower optimizer.lr or check the "
          f"rewards before resuming (the count is resumed too: an unchanged run stops again at "
          f"its next skipped update).")
    if self.max_failed_steps and self.failed_steps >= self.max_failed_steps:
      return RetrieverUnavailableError(
          f"step {step}: the {self.backend} failed {out.search_failed} of {out.search_queries} "
          f"queries, the {self.failed_steps}th step in a row above "
          f"retrieval.max_failure_rate={self.max_failure_rate} "
          f"(retrieval.max_failed_steps={self.max_failed_steps}); last error: "
          f"{out.search_last_error}. The run is checkpointed at step {step}: re-run the command "
          f"once the retriever is back.")
    return None


@dataclasses.dataclass
class RLParts:
  """What an RL run is made of (`build_rl`), before any checkpoint is restored."""
  mesh: Any
  cfg: QwenConfig
  tokenizer: Any
  target: TrainTarget  # the whole model, or LoRA adapters on a frozen backbone
  task: Any  # a task that scores its own rollouts (the rubric generator's), or None for QA
  stream: QuestionStream  # the train questions, in the seed's order
  dev: list  # the dev questions (data.eval_size of them when set)
  eval_name: str
  eval_engine: RolloutEngine  # greedy
  state: dict  # the fresh train state {params, opt_state, rng, ...}
  rl_step: RLStep
  sampler_mesh: Any = None  # the split placement's sampler devices (train.async_steps)
  prompt_lengths: tuple[int, int] = (1, 1)  # the shortest and longest prompt (train and dev)


def build_rl(config: Any) -> RLParts:
  """Mesh, model, data, rollout engines, train state and the step of an RL run."""
  sampler_mesh = None
  if config.mesh.sampler_devices:
    mesh, sampler_mesh = split_meshes(config.mesh.sampler_devices, config.mesh.data,
                                      config.mesh.fsdp, config.mesh.tensor,
                                      config.mesh.sampler_tensor)
  else:
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, tokenizer = load_model(config, mesh)
  log.info("model %s (%s, %s parameters) on mesh %s", config.model.hf_path or config.model.preset,
           cfg.model_type, f"{sum(x.size for x in jax.tree.leaves(params)):,}", dict(mesh.shape))
  target = TrainTarget.build(config, cfg, params, mesh)
  # The KL reference: a frozen copy of the initial params (updates donate the policy's), or with
  # LoRA the backbone itself run without adapters (no copy).
  ref_params, ref_model = target.reference(config.rl.kl_coef)

  kind = trainer_kind(config)  # what this trainer rolls out, on which records (train/kinds.py)
  if kind.load_data is not None:  # e.g. Co-ReAct's rubric generator: branch points
    train_records, dev, eval_name = kind.load_data(config, tokenizer)
  else:
    train_names = config_lib.benchmark_list(config.data.train, "data.train")
    eval_name = config_lib.benchmark_list(config.data.eval, "data.eval")[0]
    train_records = load_questions(config, train_names, "train")
    dev = load_questions(config, [eval_name], config.data.eval_split, "data.eval_split")
  stream = QuestionStream(train_records, config.seed)
  if config.data.eval_size:
    dev = dev[:config.data.eval_size]
  # A dense index lives where the rollouts run (the sampler's devices with the split placement).
  backend = make_search_backend(config, sampler_mesh or mesh)
  engine, eval_engine = make_agents(config, cfg, tokenizer, backend, mesh, target.spec,
                                    train_mesh=sampler_mesh)
  task = kind.make_task(config, mesh, engine) if kind.make_task is not None else None
  searcher = kind.prompt_agent(engine)
  lengths = [len(searcher.prompt_ids(r["question"])) for r in stream.records + dev]
  longest = max(lengths)
  if longest + config.rollout.max_new_tokens >= config.rollout.max_total_tokens:
    raise config_lib.ConfigError(
        f"config.rollout.max_total_tokens={config.rollout.max_total_tokens}: a {longest}-token "
        f"prompt plus one turn (max_new_tokens={config.rollout.max_new_tokens}) does not fit")

  optimizer, state = init_train_state(config, cfg, params, mesh, target)
  # The rollout stage: the kind's (DAC's two roles, both adapters updated by every step), or
  # one agent.
  stage = (kind.rollout_stage(engine) if kind.rollout_stage is not None
           else AgentRollout(engine, task))
  rl_step = RLStep.build(config, mesh, stage, optimizer, ref_params, target=target,
                         ref_model=ref_model, sampler_mesh=sampler_mesh)
  # A training record that lacks what a signal reads is refused now, not at the step sampling it.
  check_records(rl_step.signal_names, train_records, "data.train", config.data.train)
  return RLParts(mesh, cfg, tokenizer, target, task, stream, dev, eval_name, eval_engine, state,
                 rl_step, sampler_mesh, prompt_lengths=(min(lengths), longest))


def warm_up_rollouts(config: Any, parts: RLParts, state: dict) -> None:
  """rollout.warm_up: every program of the run's rollouts compiled now (RolloutEngine.warm_up),
  the training rollouts' with the parameters, key and mesh a step gives them (RLStep.warm_up)
  and the QA eval's (one eval_batch, the key `evaluate` makes, under the eval's mesh); a task's
  own eval and DAC's two roles are not warmed."""
  parts.rl_step.warm_up(state, parts.prompt_lengths)
  if parts.task is not None or not isinstance(parts.eval_engine, RolloutEngine):
    return
  with use_mesh(parts.mesh):
    parts.eval_engine.warm_up(
        parts.target.rollout_params(state["params"]),
        config.train.eval_batch * parts.eval_engine.config.group_size, parts.prompt_lengths,
        eval_key(0, 0, 0))  # made as evaluate makes it, under the same mesh


class RLEvals:
  """The run's greedy evals: every train.eval_every steps and at the end, on the dev split (or,
  for a task, its own held-out scores), written to eval/<step>.json and logged as eval/*."""

  def __init__(self, config: Any, workdir: str, parts: RLParts, writer: MetricsWriter):
    self.config, self.workdir, self.parts, self.writer = config, workdir, parts, writer
    self.results: dict[int, dict[str, Any]] = {}

  def due(self, at_step: int) -> bool:
    every = self.config.train.eval_every
    return bool(every) and at_step % every == 0 and 0 < at_step < self.config.train.steps

  def path(self, at_step: int) -> str:
    return os.path.join(self.workdir, "eval", f"{at_step}.json")

  def __call__(self, at_step: int, params: Any) -> dict[str, Any]:
    p, c = self.parts, self.config
    t0 = time.perf_counter()
    with use_mesh(p.mesh):
      if p.task is not None:
        result = p.task.evaluate(p.eval_engine, p.target.rollout_params(params), p.dev,
                                 c.train.eval_batch)
      else:
        result = evaluate(p.eval_engine, p.target.rollout_params(params), p.dev,
                          c.train.eval_batch)
    if p.task is not None:
      _write_json(self.path(at_step), dict(result, step=at_step, benchmark=p.eval_name))
      metrics = {f"eval/{k}": result[k] for k in p.task.eval_scores}
      log.info("eval at step %d on %s", at_step, p.task.describe(result))
    else:
      _write_json(self.path(at_step), dict(result, step=at_step, benchmark=p.eval_name,
                                           split=c.data.eval_split))
      metrics = {f"eval/{k}": result[k] for k in ("f1", "em", "format_ok", "turns")}
      # DAC: coverage, accuracy when answered, abstention rate
      metrics.update({f"eval/{k}": result[k] for k in ABSTENTION_SCORES if k in result})
      log.info("eval at step %d on %s/%s (%d questions): F1 %.4f EM %.4f", at_step, p.eval_name,
               c.data.eval_split, result["n"], result["f1"], result["em"])
    metrics["eval/seconds"] = time.perf_counter() - t0
    self.writer.write(at_step, metrics)
    self.results[at_step] = result
    return result

  def final(self, params: Any, finished_before: bool, ckpt: Checkpointer) -> None:
    """The last step's eval, unless a finished run is re-run (process 0 wrote its file)."""
    steps = self.config.train.steps
    if steps in self.results:
      return
    if finished_before and _exists_on_primary(self.path(steps)):
      self.results[steps] = broadcast_from_primary(
          _read_json(self.path(steps)) if jax.process_index() == 0 else None)
    else:
      ckpt.wait()  # the last checkpoint is on disk before an eval that may crash
      self(steps, params)

  def summary(self) -> dict[int, dict[str, Any]]:
    """Each eval's headline scores (a task's eval_scores, else F1 and EM) and its size."""
    keys = (tuple(self.parts.task.eval_scores) if self.parts.task is not None
            else ("f1", "em")) + ("n",)
    return {k: {key: v[key] for key in keys} for k, v in self.results.items()}


def _rollout_pipeline(config: Any, rl_step: RLStep, stream: QuestionStream, step: int,
                      position: int, stop_after: int | None) -> RolloutPipeline:
  """train.async_steps: rollouts of the next steps overlap this step's update."""
  per_step = config.rl.prompts_per_step
  steps = config.train.steps
  return RolloutPipeline(
      rl_step, lambda j: stream.take(position + (j - step) * per_step, per_step),
      config.train.async_steps, end=steps if stop_after is None else min(steps, stop_after),
      partial=config.rollout.partial, stale=config.train.stale,
      max_staleness=config.train.max_staleness)


def _log_step(config: Any, step: int, metrics: Mapping[str, float], out: StepOutput,
              faults: FaultWatch, postfix: Sequence[str]) -> None:
  if metrics["skipped_updates"]:
    log.warning("step %d: %d update(s) skipped (non-finite loss or gradient); params kept "
                "(%d in a row)", step, int(metrics["skipped_updates"]), faults.skipped_streak)
  if out.search_failed:
    log.warning("step %d: the retriever failed %d of %d queries; last error: %s", step,
                out.search_failed, out.search_queries, out.search_last_error)
  if config.train.log_every and step % config.train.log_every == 0:
    log.info("step %d/%d " + " ".join(f"{k} %.4g" for k in postfix), step, config.train.steps,
             *[metrics[k] for k in postfix])


def _export_rl(config: Any, workdir: str, parts: RLParts, state: dict) -> str | None:
  """The finished run's exports: the critic (PPO), each adapter as a PEFT folder (LoRA) and the
  Hugging Face model (the policy adapter merged); returns the HF export's path."""
  critic = getattr(parts.rl_step, "critic", None)
  if critic is not None and config.train.export_hf:  # before hf_export, which marks the end
    log.info("export critic: %s", critic.export(os.path.join(workdir, CRITIC_EXPORT_DIR),
                                               state["critic"]["params"], parts.tokenizer))
  written = parts.target.export(workdir, state["params"], parts.tokenizer,
                                os.path.join(workdir, EXPORT_DIR) if config.train.export_hf
                                else None)
  for what, path in written.items():
    log.info("export %s: %s", what, path)
  return written.get("hf_export")


def train_rl(config: Any, workdir: str, *, stop_after: int | None = None) -> dict[str, Any]:
  """The RL loop (module docstring). stop_after: stop (with a checkpoint) once that many steps
  are done, as a preemption would; re-running resumes. Returns a summary dict.

  Raises TrainingDivergedError / RetrieverUnavailableError (after checkpointing the step) when a
  FaultWatch rule stops the run."""
  workdir = os.path.expanduser(workdir)
  exported = _recover_export(os.path.join(workdir, EXPORT_DIR))
  parts = build_rl(config)
  state, rl_step, stream, steps = parts.state, parts.rl_step, parts.stream, config.train.steps

  ckpt = make_checkpointer(config, workdir, parts.target)
  restored = ckpt.restore_or_none(abstract_state(state))
  step, position, data_state = 0, 0, None
  if restored is not None:
    state, data_state, step = restored
    position = int(data_state["position"])
    log.info("resumed from %s at step %d (question position %d)", ckpt.step_dir(step), step,
             position)
  finished_before = restored is not None and restored[2] == steps
  faults = FaultWatch.from_config(config, data_state)
  writer = MetricsWriter(workdir, steps, step, prefix=config.algorithm)
  evals = RLEvals(config, workdir, parts, writer)
  postfix = parts.task.progress if parts.task is not None else \
      ("reward", "f1", "format_error_rate", "turns", "ig_mean", "kl", "step_s")
  save = lambda at, force: ckpt.save(  # noqa: E731
      at, state, {"position": position, "faults": faults.state()}, force=force)

  # No progress (a step, a rollout's turn, a compile, a checkpoint write) for
  # train.stall_timeout_s: every thread's stack to the workdir and exit (agentjax/watchdog.py).
  with Watchdog(config.train.stall_timeout_s, workdir):
    if config.rollout.warm_up and step < steps:  # the rollouts' programs now, none after step 1
      warm, t0 = CompileCounter(), time.perf_counter()
      warm_up_rollouts(config, parts, state)
      log.info("rollout warm-up: %d programs compiled in %.1f s", warm.count,
               time.perf_counter() - t0)
    compiles = CompileCounter()  # programs compiled by this process since the loop started
    with _Preemption() as preempt, contextlib.ExitStack() as stack:
      if config.train.eval_at_start and step == 0:
        evals(0, state["params"])
      if evals.due(step) and not _exists_on_primary(evals.path(step)):
        evals(step, state["params"])  # the run stopped during this step's eval: do it again
      pipeline = None
      if config.train.async_steps:
        pipeline = _rollout_pipeline(config, rl_step, stream, step, position, stop_after)
        stack.callback(pipeline.close)  # also when the loop raises: no thread left running
        if pipeline.turns:
          # This thread holds the devices for the loop (evals, checkpoints and collectives
          # included) but while it waits for a rollout (pipeline.step lets them go then).
          stack.enter_context(DEVICE_TURN.hold())
      while step < steps and not any_process(preempt.requested):
        out = pipeline.step(state, step) if pipeline is not None else \
            rl_step(state, stream.take(position, config.rl.prompts_per_step), step)
        state = out.state
        step += 1
        position += config.rl.prompts_per_step
        fault = faults.observe(out, step)
        metrics = dict(out.metrics, position=position, compiles=float(compiles.count),
                       **resources())
        writer.write(step, metrics, postfix)
        _log_step(config, step, metrics, out, faults, postfix)
        progress(f"step {step}")

        # Checkpoint before eval: an eval that crashes (OOM, kill) never costs the step.
        stopping = (fault is not None or any_process(preempt.requested)
                    or (stop_after is not None and step >= stop_after))
        save(step, force=stopping or evals.due(step) or step == steps)
        progress(f"step {step}'s checkpoint save (after the previous write)")
        if fault is not None:
          ckpt.close()
          writer.close()
          raise fault
        if stopping:
          break
        if evals.due(step):
          ckpt.wait()  # the step's checkpoint is on disk before an eval that may crash or be killed
          progress(f"step {step}'s checkpoint written")
          evals(step, state["params"])
      if step < steps:
        log.warning("stopping at step %d with a checkpoint; re-run the command to resume", step)

    if step >= steps and config.train.final_eval:
      evals.final(state["params"], finished_before, ckpt)
    save(step, force=True)
    ckpt.close()
    progress("the final checkpoint written")
    writer.close()
    export = None
    if step >= steps and not (finished_before and exported):
      with watchdog_busy("the Hugging Face export"):  # a large model's: minutes of writing
        export = _export_rl(config, workdir, parts, state)
    elif step >= steps and exported:
      export = os.path.join(workdir, EXPORT_DIR)
  return {"step": step, "workdir": workdir, "hf_export": export,
          "tensorboard": os.path.join(workdir, "tensorboard"), "evals": evals.summary(),
          "params": state["params"], "cfg": parts.cfg,
          "critic_params": state["critic"]["params"] if "critic" in state else None}

# ============================================================================ eval

# Evaluation lives in agentjax/train/evaluation.py; its names stay importable from here (the RL
# loop calls `evaluate` through this module's namespace, so tests can patch trainer.evaluate).
from agentjax.train.evaluation import (ABSTENTION_SCORES, eval_benchmarks, eval_key,  # noqa: E402,F401
                                       evaluate, format_table)


# ============================================================================ SFT


def train_sft(config: Any, workdir: str, *, stop_after: int | None = None) -> dict[str, Any]:
  """SFT warm start on config.sft.demos, then a Hugging Face export at {workdir}/hf_export.

  Preemptible like RL: checkpoints every sft.checkpoint_every steps, on SIGTERM and at
  `stop_after` steps; the same command resumes (same batches, same losses on one machine). The
  export is written at the end without ever losing a previous one; a workdir that already has
  one is a finished run and is not trained again (re-running the command is a no-op)."""
  from agentjax.train.sft import pack_text, run_sft
  workdir = os.path.expanduser(workdir)
  export = os.path.join(workdir, EXPORT_DIR)
  if _recover_export(export):
    log.info("%s exists: this SFT run is finished", export)
    return {"workdir": workdir, "hf_export": export, "skipped": True}
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, tokenizer = load_model(config, mesh)
  s = config.sft
  try:
    demos = [row for _, row in iter_json_objects(os.path.expanduser(s.demos), ValueError,
                                                 what="demonstrations")]
  except ValueError as e:
    raise config_lib.ConfigError(f"config.sft.demos={s.demos!r}: {e}") from None
  extra = []
  if s.corpus_path:  # language-model text mixed in (see sft.pack_text)
    from agentjax.retrieval import load_corpus
    extra = pack_text(tokenizer, (r["contents"] for r in load_corpus(
        os.path.expanduser(s.corpus_path))), s.max_len)
    log.info("SFT: %d demonstrations + %d packed corpus sequences", len(demos), len(extra))
  target = TrainTarget.build(config, cfg, params, mesh)  # the whole model, or LoRA adapters
  ckpt = make_checkpointer(config, workdir, target)
  writer = MetricsWriter(workdir, s.steps, ckpt.latest_step() or 0, prefix="sft")

  def callback(i: int, record: Mapping[str, float]) -> None:
    writer.write(i + 1, record, ("loss", "accuracy", "lr"))
    progress(f"SFT step {i + 1}")

  with _Preemption() as preempt, use_mesh(mesh), Watchdog(config.train.stall_timeout_s, workdir):
    stop = lambda done: any_process(preempt.requested) or (  # noqa: E731
        stop_after is not None and done >= stop_after)
    params, history = run_sft(
        cfg, params, tokenizer, demos, steps=s.steps, batch_size=s.batch_size, max_len=s.max_len,
        lr=s.lr, seed=config.seed, b2=config.optimizer.b2,
        final_lr_ratio=config.optimizer.final_lr_ratio,
        weight_decay=config.optimizer.weight_decay, clip_norm=config.optimizer.clip_norm or None,
        protocol=_protocol(config), use_chat_template=config.rollout.use_chat_template,
        log_every=config.train.log_every or 0, callback=callback, extra_examples=extra,
        checkpointer=ckpt, stop=stop, micro_batches=s.micro_batches,
        length_buckets=tuple(s.length_buckets), target=target,
        also_protocols=_sft_protocols(config))
  done = ckpt.latest_step() or 0
  ckpt.close()
  writer.close()
  if done < s.steps:
    return {"workdir": workdir, "hf_export": None, "step": done, "params": params, "cfg": cfg}
  target.export(workdir, params, tokenizer, export)  # adapters (LoRA) first, hf_export last
  last = history[-1] if history else {"loss": float("nan"), "accuracy": float("nan")}
  log.info("SFT done: loss %.4f accuracy %.3f; Hugging Face export %s", last["loss"],
           last["accuracy"], export)
  return {"workdir": workdir, "hf_export": export, "step": done, "final_loss": last["loss"],
          "final_accuracy": last["accuracy"], "params": params, "cfg": cfg}


def _protocol(config: Any):
  from agentjax.agent.protocol import get_protocol
  return get_protocol(config.rollout.protocol)


def _sft_protocols(config: Any) -> list:
  """The protocols sft.protocols lets a demonstration name besides rollout.protocol."""
  from agentjax.agent.protocol import get_protocol
  from agentjax.train.fields import names
  return [get_protocol(n) for n in names(config.sft.protocols, "sft.protocols")]
