r"""The studies' sweep (the command line: launch/compare.py): every size x method x seed of a
study (STUDIES: igpo, cw_grpo, lora, dac) run as a subprocess of the command line, then the
study's report.

Layout under --root: synthworld/ tfds/ bm25_index/ (the world of `make demo`, reused when it has
the same settings), {size}/sft/, {size}/start.json (dev + test eval of the SFT export),
{size}/{method}/seed{k}/ (a normal RL workdir + result.json: dev and test eval of the final
policy). A run whose result.json exists is not run again; an interrupted one resumes from its
checkpoint. Several compare.py processes on one machine (e.g. started as cores free up) can work
on one sweep: each run is claimed with a file lock (flock) under {root}/claims (also the
Co-ReAct study's runs: agentjax/studies/coreact.py).

The sweep's flags are defined here (launch/coreact_study.py shares them).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import json
import logging
import os
import queue
import resource
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

from absl import app, flags

from agentjax.studies.cw_grpo import CW_METHODS, CW_PANELS, PAPER_CLAIMS, markdown_cw, summarize_cw
from agentjax.studies.dac import (DAC_ALPHAS, DAC_METHODS, DAC_REFERENCE, DAC_RESEARCH_METHODS,
                                  DAC_RESEARCH_REFERENCE, AlphaStar, augmentation_summary,
                                  augmented_dev_rows, check_generator_start, dac_split,
                                  dac_panels, generator_init, markdown_dac, plot_dac,
                                  resolve_alpha_star, run_generator_sft, summarize_dac)
from agentjax.studies.igpo import IGPO_PANELS, METHODS, markdown, summarize
from agentjax.studies.lora import (LORA_LR, LORA_METHODS, LORA_PANELS, LORA_RANK, markdown_lora,
                                   summarize_lora)
from agentjax.studies.reporting import collect, no_nan, plot_seed_bands, say
from agentjax.studies.async_study import (ASYNC_METHODS, markdown_async, plot_f1_vs_time,
                                          summarize_async)
from agentjax.studies.research import RESEARCH_METHODS, markdown_research, summarize_research
from agentjax.studies.research import PAPER_CLAIMS as RESEARCH_CLAIMS
from agentjax.studies.research import EVAL_QUESTIONS as RESEARCH_EVAL
from agentjax.studies.research import REGIMES as RESEARCH_REGIMES
from agentjax.studies.research import plan as research_plan
from agentjax.studies.research import STEPS as RESEARCH_STEPS
from agentjax.studies import records
from agentjax.studies.runs import (DAC_START, GENERATOR_SFT, SIZES, SPLITS, point_at_world,
                                   read_json, result_path, sft_config, split_result, write_json)


@dataclasses.dataclass(frozen=True)
class Study:
  """One study's methods and defaults (--root, --out, --sizes, --sft_from, --steps when not
  given)."""
  methods: dict
  root: str
  out: str
  sizes: tuple
  probe_all: bool  # the ground-truth probes (IGPO's IG and GT entropy, for every method)
  sft_from: str  # a `make demo` folder whose world and SFT export to reuse ("" = none)
  preset: str = "demo"  # the configs' preset every run starts from
  world: str = "demo"  # the SynthWorld preset under {root}/synthworld (demo_world.WORLDS)
  steps: int = 20  # RL steps of every run
  # What runs before the RL runs of a size, in order ({size}/{stage}/0 each): the SFT start, and
  # for DAC the generator's warm start (generator_sft) and the DAC agent's eval before RL
  # (dac_start, whose alpha* the research DAC study's alpha arms read).
  stages: tuple = ("sft",)
  reference: str = ""  # the arm every other is paired with in the report ("" = the report's own)
  # DAC reports: the alpha ablation's (method, alpha) arms; empty: every DAC arm with its alpha
  # as its runs recorded it (dac_alphas)
  alphas: tuple = ()
  # {size: start}: sizes whose RL runs start from the backbone shipped in the repository
  # (backbones/research_v2/<start>, checked against its manifest) instead of {root}/{size}/sft.
  starts: tuple = ()
  # Each finished run's compact record under {out}/runs (agentjax/studies/records.py): a run with
  # a record is not run again, and the report reads the records alone.
  records: bool = False
  eval_questions: int = 0  # questions of each final eval split (0: the whole split)
  # The RL runs' order, and which seeds each arm takes: specs -> specs (None: seed by seed).
  plan: Any = None
  seeds: tuple = ()  # the seeds when --seeds is not given (empty: 0, 1, 2)
  # ((method, study), ...): arms (or stages, e.g. "sft": the start) whose runs another study of
  # the same root, preset and steps keeps; this study reads their records there (after checking
  # that their configs are the ones it would run: borrowed_mismatch) and never runs them.
  borrow: tuple = ()


STUDIES = {
    "igpo": Study(METHODS, "runs/compare", "docs/results", tuple(SIZES), True, ""),
    "cw_grpo": Study(CW_METHODS, "runs/cw_grpo", "docs/results/cw_grpo", ("base",), False,
                     "runs/demo"),
    "lora": Study(LORA_METHODS, "runs/lora", "docs/results/lora", ("wide",), True, ""),
    "dac": Study(DAC_METHODS, "runs/dac", "docs/results/dac", ("base",), False, "runs/cw_grpo",
                 stages=("sft", GENERATOR_SFT, DAC_START), reference=DAC_REFERENCE,
                 alphas=DAC_ALPHAS),
    # SynthWorld v2 and the research backbone ({root}/backbone/sft/hf_export, made by
    # launch/backbone.py), the run protocol of agentjax/studies/research.py.
    # Two regimes (sizes): the full backbone and its early SFT checkpoint (sparse rewards).
    "research": Study(RESEARCH_METHODS, "runs/research", "docs/results/research",
                      tuple(RESEARCH_REGIMES), True, "", preset="research", world="v2",
                      steps=RESEARCH_STEPS, starts=tuple(RESEARCH_REGIMES.items()),
                      records=True, eval_questions=RESEARCH_EVAL, plan=research_plan,
                      seeds=("0", "1", "2", "3", "4")),
    # DAC on the research backbone (agentjax/studies/dac.py DAC_RESEARCH_METHODS):
    # the same root and protocol as "research" (its GRPO runs are this study's reference), both
    # roles from the backbone, alpha arms around the alpha* of the DAC agent before RL.
    # Its start and its GRPO arm are the research study's (borrow): their records are read from
    # docs/results/research.
    "dac_research": Study(DAC_RESEARCH_METHODS, "runs/research", "docs/results/dac_research",
                          ("backbone",), True, "", preset="research", world="v2",
                          steps=RESEARCH_STEPS, stages=("sft", DAC_START),
                          reference=DAC_RESEARCH_REFERENCE, starts=(("backbone", "final"),),
                          records=True, eval_questions=RESEARCH_EVAL,
                          borrow=(("sft", "research"), ("grpo", "research"))),
    # GRPO and IGPO with train.async_steps 0, 1, 2 (agentjax/studies/async_study.py).
    "async": Study(ASYNC_METHODS, "runs/async", "docs/results/async", ("base",), False,
                   "runs/demo"),
}


_STUDY = flags.DEFINE_enum("study", "igpo", list(STUDIES), "igpo: IGPO vs GRPO (docs/results); "
                          "cw_grpo: CW-GRPO vs GRPO and its judge controls (docs/results/cw_grpo); "
                          "lora: IGPO with LoRA vs full fine-tuning (docs/results/lora); "
                          "dac: DAC's two LoRA roles vs monolithic GRPO (docs/results/dac); "
                          "research: the methods on SynthWorld v2 from the research backbone "
                          "(docs/results/research); dac_research: DAC there, its alpha arms "
                          "around the alpha* measured before RL (docs/results/dac_research); "
                          "async: GRPO and IGPO with train.async_steps "
                          "0, 1, 2 (docs/results/async).")
_ROOT = flags.DEFINE_string("root", "", "Folder of the world and every run (default: the study's, "
                            "runs/compare or runs/cw_grpo).")
_OUT = flags.DEFINE_string("out", "", "Where the tables and plots go (default: the study's, "
                           "docs/results or docs/results/cw_grpo).")
_SIZES = flags.DEFINE_list("sizes", [], "Model sizes (see the docstring; default: the study's).")
_METHODS = flags.DEFINE_list("methods", [], "Methods (see the docstring; default: the study's).")
_SFT_FROM = flags.DEFINE_string("sft_from", None, "A `make demo` folder (synthworld/, tfds/, "
                                "bm25_index/, sft/hf_export) whose world and base SFT export are "
                                "copied into --root when its SFT settings are this study's "
                                "(default: the study's; \"\" = train the SFT here).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (config.seed: data order, rollouts, "
                           "minibatches; default: the study's, research 0-4, else 0, 1, 2).")
_STEPS = flags.DEFINE_integer("steps", 0, "RL steps of every run (0: the study's: 20, "
                              "research 100).")
_WORKERS = flags.DEFINE_integer("workers", 2, "Runs in flight at once (subprocesses).")
_TARGET = flags.DEFINE_float("target_gain", 0.05, "Steps to target: the first step whose full "
                             "5-step moving average of training F1 is this much above the seed's "
                             "start (its first 5 steps, averaged over the methods: every method "
                             "sees the same questions at a step for a seed).")
_PIN = flags.DEFINE_bool("pin_cores", True, "Pin worker k to one CPU core (taskset): on a small "
                         "CPU, two multi-threaded workers mostly contend.")
_FIRST_CORE = flags.DEFINE_integer("first_core", 0, "With --pin_cores: worker k runs on core "
                                   "first_core + k.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only build the report.")
_RUN = flags.DEFINE_string("run", "", "Internal: run one size/method/seed in this process.")
_EVAL_SIZE = flags.DEFINE_integer("eval_size", 0, "Questions of each eval split (0: the whole "
                                  "split); less only for smoke tests.")
_GENERATOR_SFT_STEPS = flags.DEFINE_integer("generator_sft_steps", 0, "dac study: steps of the "
                                            "generator's warm start (0: configs/dac.py:"
                                            "generator_sft's sft.steps); less only for smoke "
                                            "tests.")
_PRIORITY = flags.DEFINE_list("priority_methods", [], "Run order: every method's first seed, "
                              "then these methods' other seeds, then the rest (default: seed by "
                              "seed). For a sweep that may not finish: the main comparison gets "
                              "its seeds first.")
_COMMIT = flags.DEFINE_bool("commit_records", False, "Studies that keep records: git-commit each "
                             "run's record as soon as it is written (only that file: other "
                             "changes of the checkout stay out of the commit).")
_HARDWARE = flags.DEFINE_string("hardware", "", "Where the runs ran, for the report (default: "
                                "this machine's CPU and core count).")


def _study() -> Study:
  return STUDIES[_STUDY.value]


def _seeds() -> list[str]:
  """--seeds when given, else the study's (Study.seeds), else 0, 1, 2."""
  if flags.FLAGS["seeds"].present or not _study().seeds:
    return _SEEDS.value
  return list(_study().seeds)


def _steps() -> int:
  return _STEPS.value or _study().steps


def root_dir() -> str:
  return _ROOT.value or _study().root


def out_dir() -> str:
  """--out, or the study's folder in this checkout (wherever the command runs from)."""
  return _OUT.value or os.path.join(REPO, _study().out)


def _sizes() -> list[str]:
  return _SIZES.value or list(_study().sizes)


def _methods() -> list[str]:
  return _METHODS.value or list(_study().methods)


def rl_config(root: str, size: str, method: str, seed: int, steps: int, study: str = "igpo",
              eval_size: int = 0):
  """The RL config of one run of `study`: the method's config file and overrides on the study's
  preset (demo, or research), the world under `root`, the size's SFT export as the start (and
  with DAC, the generator adapter from the size's warm start, generator_config). eval_size:
  questions of each eval split (0: the whole split)."""
  import importlib
  # DAC's eval before RL: the DAC preset as every DAC arm starts it (no arm's overrides: they
  # may need its alpha*)
  module = "dac" if method == DAC_START else STUDIES[study].methods[method][0]
  config = importlib.import_module(f"configs.{module}").get_config(STUDIES[study].preset)
  point_at_world(config, root, size)
  config.model.hf_path = start_path(root, size, study)
  config.model.tokenizer_path = ""
  config.seed = seed
  config.train.steps = steps
  config.train.eval_every = 0
  config.train.eval_at_start = False  # the SFT export is evaluated once per size (start.json)
  config.data.eval_size = STUDIES[study].eval_questions  # the final eval (0: the whole split)
  config.train.checkpoint_every = 10
  config.train.export_hf = False
  config.train.jax_cache_dir = os.path.join(root, "jax_cache")  # every run of the sweep shares it
  config.rl.probe_all = STUDIES[study].probe_all
  if eval_size:  # smoke tests only: the first eval_size questions of each split
    config.data.eval_size = eval_size
  if config.trainer == "dac" and GENERATOR_SFT in STUDIES[study].stages:
    # the generator adapter starts from this size's warm start
    config.model.lora.init = f"generator={generator_init(root, size)}"
  for key, value in resolved_overrides(root, size, study, method).items():
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    if leaf not in node:  # a typo must not become a new, unread field
      raise KeyError(f"method {method!r}: config has no field {key!r}")
    node[leaf] = value
  return config


def start_path(root: str, size: str, study: str) -> str:
  """The Hugging Face folder a size's RL runs start from: the shipped backbone's start
  (Study.starts) or the size's SFT export under `root`."""
  start = dict(STUDIES[study].starts).get(size)
  if start is None:
    return os.path.join(root, size, "sft", "hf_export")
  from agentjax.studies.backbone import SHIPPED
  return os.path.join(REPO, SHIPPED, start)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolved_overrides(root: str, size: str, study: str, method: str) -> dict:
  """The method's overrides in `study` with every AlphaStar replaced by its value (alpha* of
  the size's dac_start stage, under root or in its record, times its factor)."""
  overrides = {} if method == DAC_START else dict(STUDIES[study].methods[method][1])
  for key, value in overrides.items():
    if isinstance(value, AlphaStar):
      spec = f"{size}/{DAC_START}/0"
      start, where = stage_result(root, spec, study)
      overrides[key] = resolve_alpha_star(value, start, where)
  return overrides


def record_out(spec: str, study: str) -> str:
  """The out folder holding `spec`'s record: the study's own (--out when it is the study being
  run), or for a borrowed method (Study.borrow) the lending study's folder in this checkout."""
  lender = dict(STUDIES[study].borrow).get(spec.split("/")[1])
  if lender is not None:
    return os.path.join(REPO, STUDIES[lender].out)
  if flags.FLAGS.is_parsed() and study == _STUDY.value:
    return out_dir()
  return os.path.join(REPO, STUDIES[study].out)


def stage_result(root: str, spec: str, study: str) -> tuple[dict | None, str]:
  """(result, where it was read) of a finished run or stage: its result.json under `root`, else
  its record (a study with records), else (None, the result's path)."""
  path = result_path(root, spec)
  result = read_json(path)
  if result is None and STUDIES[study].records:
    record = records.record_path(record_out(spec, study), spec)
    kept = records.read_record(record)
    if kept is not None:
      return kept["result"], record
  return result, path


def _field(config, key: str):
  """config's value at a dotted key ("dac.alpha")."""
  node = config
  for name in key.split("."):
    node = node[name]
  return node


def _eval_split(config, root: str, split: str, **source) -> dict:
  """Greedy eval of the whole split, from a checkpoint (workdir=) or HF folder (hf_path=)."""
  from agentjax.train.trainer import eval_benchmarks
  c = config.copy_and_resolve_references()
  c.data.eval_split = split  # the whole split (rl_config's eval_size: smoke tests only)
  rows = eval_benchmarks(c, **source)["per_question"]["synthworld"]
  return split_result(root, split, rows)


def run_one(root: str, spec: str, steps: int, study: str = "igpo", eval_size: int = 0,
            generator_sft_steps: int = 0) -> None:
  """One size/method/seed RL run + its final dev/test eval, or the SFT (+ start eval) of a size.
  A size whose SFT export exists (a finished SFT, or one reused by _reuse_sft) is not trained.
  DAC's study also has the generator's warm start (size/generator_sft/0) and the eval of the DAC
  agent before RL (size/dac_start/0); its DAC runs add the augmentation check."""
  from agentjax.compiles import use_persistent_cache
  from agentjax.judge import judge_identity
  from agentjax.train.trainer import train
  size, method, seed = spec.split("/")
  use_persistent_cache(os.path.join(root, "jax_cache"))  # the evals outside train() too
  if method == GENERATOR_SFT:
    run_generator_sft(root, size, generator_sft_steps)
    return
  if method == DAC_START:  # both roles as RL starts them: the backbone and the warm start
    config = rl_config(root, size, DAC_START, 0, steps, study, eval_size)
    t0 = time.time()
    result = {split: dac_split(config, root, split) for split in SPLITS}
    result["minutes"] = (time.time() - t0) / 60
    result["code"], result["hardware"] = records.code_version(REPO), run_hardware()
    write_json(result_path(root, spec), result)
    return
  if method == "sft" and dict(STUDIES[study].starts).get(size):
    # A shipped start: its files and the world under root checked against its manifest, then
    # its eval and the measurements before RL (research.start_measurements).
    from agentjax.studies.backbone import check_shipped
    from agentjax.studies.research import start_measurements
    rl = rl_config(root, size, next(iter(STUDIES[study].methods)), 0,
                   steps, study, eval_size)
    check_shipped(os.path.dirname(rl.model.hf_path), os.path.join(root, "synthworld"))
    t0 = time.time()
    start = {split: _eval_split(rl, root, split, hf_path=rl.model.hf_path) for split in SPLITS}
    start["measurements"] = start_measurements(rl, rl.model.hf_path)
    start["hf_path"] = os.path.relpath(rl.model.hf_path, REPO)
    start["minutes"] = (time.time() - t0) / 60
    start["code"], start["hardware"] = records.code_version(REPO), run_hardware()
    write_json(result_path(root, spec), start)
    return
  if method == "sft":
    if not os.path.exists(os.path.join(root, size, "sft", "hf_export", "config.json")):
      if STUDIES[study].preset == "research":  # built once, never per study
        raise SystemExit(f"no research backbone at {root}/{size}/sft/hf_export: run "
                         f"python launch/backbone.py --root={root} first")
      train(sft_config(root, size), os.path.join(root, size, "sft"))
    start = os.path.join(root, size, "start.json")
    if not os.path.exists(start):
      rl = rl_config(root, size, next(iter(STUDIES[study].methods)), 0, steps, study,
                     eval_size)
      write_json(start, {split: _eval_split(rl, root, split, hf_path=rl.model.hf_path)
                     for split in SPLITS})
    return
  workdir = os.path.join(root, size, method, f"seed{seed}")
  config = rl_config(root, size, method, int(seed), steps, study, eval_size)
  if config.trainer == "dac" and GENERATOR_SFT in STUDIES[study].stages:
    check_generator_start(config, root, size)
  code = records.code_version(REPO)  # what this invocation runs (a resumed run: its last part)
  t0 = time.time()
  train(config, workdir)
  # The trainer's final eval is the whole dev split (500 questions, greedy); test is added here.
  with open(os.path.join(workdir, "eval", f"{steps}.json")) as f:
    dev_rows = json.load(f)["per_question"]
  result = {"dev": split_result(root, "dev", dev_rows)}
  result["test"] = _eval_split(config, root, "test", workdir=workdir)
  if config.trainer == "dac":  # the generator on dev evidence with distractors vs clean
    result["augmentation_check"] = augmentation_summary(
        augmented_dev_rows(config, workdir), dev_rows)
  result["minutes"] = (time.time() - t0) / 60  # of this invocation (less after a resume)
  result["steps"] = steps
  result["judge"] = judge_identity(config.judge)  # backend, model, prompt hash, study noise
  # What this invocation trained with (an AlphaStar as rl_config resolved it above).
  result["overrides"] = {key: _field(config, key) for key in STUDIES[study].methods[method][1]}
  # Linux reports ru_maxrss in KiB: the peak of this whole process (load, training, both evals),
  # read before train_state_bytes builds a second state.
  result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  result["code"], result["hardware"] = code, run_hardware()
  result["train_state"] = train_state_bytes(config)
  result["checkpoint_bytes"] = _tree_bytes(os.path.join(workdir, "checkpoints", str(steps)))
  write_json(result_path(root, spec), result)


def train_state_bytes(config) -> dict:
  """What a run of `config` trains and keeps between steps, counted from the arrays the trainer
  builds (TrainTarget, init_train_state): the trained params (the whole model, or the adapters),
  the optimizer state (AdamW's two moments + counters), and the frozen backbone a LoRA run reads
  (0 for full fine-tuning, whose params are the trained ones), and a PPO run's critic (its
  params and optimizer state; 0 without one). Bytes as held (float32 here)."""
  import jax
  from agentjax.parallel import make_mesh
  from agentjax.train.trainer import TrainTarget, init_train_state, load_model
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, _ = load_model(config, mesh)
  target = TrainTarget.build(config, cfg, params, mesh)
  _, state = init_train_state(config, cfg, params, mesh, target)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
  return {"trained_params": sum(x.size for x in jax.tree.leaves(state["params"])),
          "trained_bytes": nbytes(state["params"]), "opt_state_bytes": nbytes(state["opt_state"]),
          "frozen_bytes": 0 if target.spec is None else nbytes(target.backbone),
          "critic_bytes": nbytes(state.get("critic", {}))}


def _tree_bytes(folder: str) -> int | None:
  """Bytes of the files under `folder` (a checkpoint step on disk); None when it is missing."""
  if not os.path.isdir(folder):
    return None
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder)
             for f in files)


_FREE_CORES: "queue.Queue[int]" = queue.Queue()


def _claim(spec: str, root: str | None = None) -> int | None:
  """An open file descriptor holding an exclusive flock on claims/<spec> under `root` (default:
  --root), or None when another process holds it (several compare.py processes can share one
  sweep). The kernel drops the lock when every descriptor is closed: the run's subprocess
  inherits it, so a killed orchestrator does not free a run that is still training."""
  folder = os.path.join(root or root_dir(), "claims")
  os.makedirs(folder, exist_ok=True)
  fd = os.open(os.path.join(folder, spec.replace("/", "_")), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  os.ftruncate(fd, 0)
  os.write(fd, str(os.getpid()).encode())  # who holds it, for a reader
  return fd


def free_cores(workers: int) -> None:
  """With --pin_cores: worker k may take core first_core + k (modulo this process's cores)."""
  if _PIN.value:
    cores = sorted(os.sched_getaffinity(0))
    for k in range(workers):
      _FREE_CORES.put(cores[(_FIRST_CORE.value + k) % len(cores)])


def run_claimed(spec: str, done: Sequence[str], cmd: Sequence[str], log: str,
                root: str | None = None) -> tuple[str, int | None, float]:
  """Runs `cmd` (argv) as a subprocess holding the claim of `spec` (_claim), pinned to a free
  core with --pin_cores (free_cores), its output appended to `log`. Nothing is run (rc None)
  when every path of `done` exists, before or after the claim, or another process holds it.
  Returns (spec, exit status or None, seconds)."""
  t0 = time.time()
  finished = lambda: all(os.path.exists(p) for p in done)  # noqa: E731
  fd = None if finished() else _claim(spec, root)
  if fd is None or finished():  # done, or taken
    if fd is not None:
      os.close(fd)
    return spec, None, 0.0
  core = _FREE_CORES.get() if _PIN.value else None
  if core is not None:
    cmd = ["taskset", "-c", str(core)] + list(cmd)
  try:
    with open(log, "a") as f:  # appended: a resumed run keeps the earlier attempt's output
      rc = subprocess.call(list(cmd), stdout=f, stderr=subprocess.STDOUT, pass_fds=(fd,))
  finally:
    os.close(fd)
    if core is not None:
      _FREE_CORES.put(core)
  return spec, rc, time.time() - t0


def _spawn(spec: str) -> tuple[str, int | None, float]:
  root = root_dir()
  # This process's own command line (launch/compare.py), one run in a subprocess.
  cmd = [sys.executable, os.path.abspath(sys.argv[0]), f"--run={spec}", f"--root={root}",
         f"--steps={_steps()}", f"--study={_STUDY.value}", f"--eval_size={_EVAL_SIZE.value}",
         f"--generator_sft_steps={_GENERATOR_SFT_STEPS.value}"]
  return run_claimed(spec, [result_path(root, spec)], cmd,
                     os.path.join(root, spec.replace("/", "_") + ".log"), root)


# Config fields that only say where the world is (use_demo_world), and sections the SFT trainer
# does not read: an SFT export made with the same settings elsewhere differs from ours only there.
_WORLD_PATH_KEYS = ("data.manual_dir", "data.data_dir", "retrieval.corpus_path",
                    "retrieval.index_dir", "model.tokenizer_path", "sft.demos", "sft.corpus_path")
_RL_ONLY_SECTIONS = ("judge.", "cw.")


def _flat(d: dict) -> dict:
  """{"a.b": leaf} of a nested dict (a config's to_dict(), a recorded config.json)."""
  from flax import traverse_util
  return traverse_util.flatten_dict(d, sep=".")


def sft_mismatch(recorded: dict, ours) -> list[str]:
  """Fields (dotted) where a recorded SFT config.json differs from `ours` (a ConfigDict), world
  paths and RL-only sections aside; [] when the export it made is the one we would train."""
  from configs import base
  mine, theirs = _flat_configs(recorded, ours)
  # Fields added to configs/base.py after that run are absent from its record: at their base
  # default they change nothing (e.g. model.lora.* off).
  default = _flat(json.loads(json.dumps(base.get_config("demo").to_dict())))
  added = lambda k: k not in theirs and k in default and mine.get(k) == default[k]  # noqa: E731
  return _differing(mine, theirs, lambda k: (k in _WORLD_PATH_KEYS or added(k)
                                             or k.startswith(_RL_ONLY_SECTIONS)))


def _flat_configs(recorded: dict, ours) -> tuple[dict, dict]:
  """({dotted field: value} of `ours` (a ConfigDict), of a recorded config.json), both as JSON
  holds them (tuples as lists), the record's extras (judge identity, adapters) left out."""
  from agentjax.train.trainer import RECORDED_EXTRAS  # written beside the config, not fields
  return (_flat(json.loads(json.dumps(ours.to_dict()))),
          _flat({k: v for k, v in recorded.items() if k not in RECORDED_EXTRAS}))


def _differing(mine: dict, theirs: dict, skip) -> list[str]:
  """The dotted fields, sorted, whose values differ (a field one side lacks differs), but those
  skip(field) names."""
  return sorted(k for k in set(mine) | set(theirs)
                if not skip(k) and mine.get(k, "<absent>") != theirs.get(k, "<absent>"))


def reuse_sft(root: str, source: str, topk: int) -> str:
  """Copies the world (synthworld/, tfds/, bm25_index/) and the base SFT export of the `make demo`
  folder `source` into `root` when they are the ones this study would build and train: the world
  stamp matches (build_demo_world reuses it) and the SFT config differs only in world paths and
  RL-only sections. The SFT is deterministic on one CPU machine, so training it again would give
  the same export at the cost of the demo's SFT time. Returns what it did."""
  from agentjax.data.demo_world import build_demo_world
  target = os.path.join(root, "base", "sft", "hf_export")
  if os.path.exists(os.path.join(target, "config.json")):
    return f"base SFT export: {target} exists"
  # `make demo`'s layout ({source}/sft) or a study's ({source}/base/sft, with its start.json).
  base = os.path.join(source, "base") if os.path.isdir(os.path.join(source, "base", "sft")) \
      else source
  recorded = read_json(os.path.join(base, "sft", "config.json"))
  export = os.path.join(base, "sft", "hf_export")
  if recorded is None or not os.path.exists(os.path.join(export, "config.json")):
    return f"base SFT: no finished SFT in {base}/sft; trained here"
  for name in ("synthworld", "tfds", "bm25_index"):
    if not os.path.exists(os.path.join(root, name)):
      shutil.copytree(os.path.join(source, name), os.path.join(root, name))
  world = build_demo_world(os.path.join(root, "synthworld"), topk=topk)
  if not world.startswith("SynthWorld and tokenizer: reusing"):
    return f"{world}; base SFT: {source}'s world has other settings, so the SFT is trained here"
  diff = sft_mismatch(recorded, sft_config(root, "base"))
  if diff:
    return (f"base SFT: {source}/sft was trained with other settings ({', '.join(diff)}); "
            "trained here")
  os.makedirs(os.path.dirname(target), exist_ok=True)
  shutil.copytree(export, target + ".tmp", dirs_exist_ok=True)
  shutil.copy(os.path.join(base, "sft", "config.json"),
              os.path.join(root, "base", "sft", "config.json"))
  os.replace(target + ".tmp", target)  # an interrupted copy never looks like an export
  done = f"base SFT export and world: copied from {base} (same world and SFT settings)"
  # A study's eval of that export (start.json: the demo RL config, whole dev and test splits)
  # is the one this study would make: reused too.
  start = os.path.join(base, "start.json")
  if base != source and os.path.exists(start) and not os.path.exists(
      os.path.join(root, "base", "start.json")):
    shutil.copy(start, os.path.join(root, "base", "start.json"))
    done += f"; its start eval {start} too"
  return done


def _run_all() -> None:
  from agentjax.data.demo_world import build_demo_world
  root, study = root_dir(), _STUDY.value
  topk = rl_config(root, "base", next(iter(STUDIES[study].methods)), 0, 1, study).retrieval.topk
  source = _study().sft_from if _SFT_FROM.value is None else _SFT_FROM.value
  if source and "base" in _sizes():
    os.makedirs(root, exist_ok=True)
    say(reuse_sft(root, source, topk))
  say(build_demo_world(os.path.join(root, "synthworld"), topk=topk, world=_study().world))
  # The question dataset (tfds, built from the world on first read) made here, once: runs that
  # start together would each build it and collide renaming it into place.
  from agentjax.train.builders import load_questions
  first = rl_config(root, _sizes()[0], next(iter(STUDIES[study].methods)), 0, 1, study)
  load_questions(first, first.data.train.split(","), "train")
  if any(dict(_study().starts).get(s) for s in _sizes()):
    # The shipped backbone and this world checked against its manifest before any run, also when
    # every start's record exists already (a fresh machine resuming the study).
    from agentjax.studies.backbone import SHIPPED, check_shipped
    check_shipped(os.path.join(REPO, SHIPPED), os.path.join(root, "synthworld"))
  free_cores(_WORKERS.value)
  with concurrent.futures.ThreadPoolExecutor(_WORKERS.value) as pool:
    # The study's stages before RL (Study.stages: the SFT start, DAC's generator warm start and
    # its eval before RL), each once per size; stage "rl" runs only sizes whose stages are done.
    stages = STUDIES[study].stages + ("rl",)
    for i, stage in enumerate(stages):
      if stage != "rl":
        ready = [s for s in _sizes() if all(stage_done(f"{s}/{x}/0") for x in stages[:i])]
        specs = [f"{s}/{stage}/0" for s in ready]
      else:  # only sizes whose SFT start is ready (another process may still be training one)
        sizes = [s for s in _sizes() if all(stage_done(f"{s}/{x}/0") for x in stages[:-1])]
        for s in set(_sizes()) - set(sizes):
          missing = [x for x in stages[:-1] if not stage_done(f"{s}/{x}/0")]
          say(f"size {s}: its {', '.join(missing)} stage is not done (failed, or held by another "
              "process?); its RL runs are skipped")
        specs = [f"{s}/{m}/{k}" for k in _seeds() for s in sizes for m in _methods()]
        if _study().plan is not None and not _PRIORITY.value:
          specs = _study().plan(specs)  # the study's declared order (and seeds per arm)
        elif _PRIORITY.value:
          first = _seeds()[0]
          rank = lambda x: (x.split("/")[2] != first,  # noqa: E731
                            x.split("/")[1] not in _PRIORITY.value)
          specs = sorted(specs, key=rank)  # stable: seed by seed within each group
      for spec in specs:  # finished while no orchestrator could record it (killed, or a failure)
        keep_record(spec)
      check_borrowed([x for x in specs if borrowed(x)])
      specs = [x for x in specs if not stage_done(x) and not borrowed(x)]
      say(f"{len(specs)} run(s): {' '.join(specs)}")
      # As each run ends (not in submission order): its record is written and committed at once.
      futures = [pool.submit(_spawn, spec) for spec in specs]
      for future in concurrent.futures.as_completed(futures):
        spec, rc, secs = future.result()
        if rc is None:
          say(f"  {spec}: done or taken by another compare.py process")
        else:
          say(f"  {spec}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {secs / 60:.1f} min")
          if rc:
            say(f"    log: {os.path.join(root, spec.replace('/', '_') + '.log')}")
        keep_record(spec)


def stage_done(spec: str) -> bool:
  """A finished run or stage: its result under --root, or its record in the repository."""
  return os.path.exists(result_path(root_dir(), spec)) or has_record(spec)


def has_record(spec: str) -> bool:
  """Whether the study keeps records and `spec`'s is in the repository (a finished run; a
  borrowed one in the lending study's folder)."""
  return _study().records and os.path.exists(
      records.record_path(record_out(spec, _STUDY.value), spec))


def borrowed(spec: str) -> bool:
  """Whether `spec`'s method is another study's (Study.borrow): read there, never run here."""
  return spec.split("/")[1] in dict(_study().borrow)


def check_borrowed(specs: Sequence[str]) -> None:
  """Borrowed runs (Study.borrow) this study pairs with: each one not finished by its study is
  said (the report leaves it out); one finished with another config stops the sweep, naming the
  fields."""
  for spec in specs:
    lender = dict(_study().borrow)[spec.split("/")[1]]
    if not stage_done(spec):
      say(f"  {spec}: the {lender} study's run, not finished there (python launch/compare.py "
          f"--study={lender}); this study's report leaves it out")
    elif diff := borrowed_mismatch(spec):
      raise SystemExit(f"{spec}: the {lender} study's run has a config other than this study's "
                       f"in {', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}: it is not "
                       "this study's arm")


def borrowed_mismatch(spec: str) -> list[str]:
  """Config fields (dotted) where a borrowed run's record differs from the config this study
  would run for `spec` ([] when it is the same run; world paths, the compilation cache and the
  checkout the shipped start was read from aside). A borrowed start ("sft") has no config: []."""
  if records.is_stage(spec):
    return []
  size, method, seed = spec.split("/")
  rec = records.read_record(records.record_path(record_out(spec, _STUDY.value), spec))
  if rec is None:  # finished under --root, its record not written yet
    rec = {"config": read_json(os.path.join(os.path.dirname(result_path(root_dir(), spec)),
                                            "config.json"))}
  ours = rl_config(root_dir(), size, method, int(seed), _steps(), _STUDY.value,
                   _EVAL_SIZE.value)
  from agentjax.train.upgrade import upgrade_recorded  # a field added since: what it ran with
  mine, theirs = _flat_configs(upgrade_recorded(rec["config"]), ours)
  skip = set(_WORLD_PATH_KEYS) | {"train.jax_cache_dir"}
  # The shipped start as read from one checkout or another (.../backbones/research_v2/final)
  tail = lambda path: tuple(str(path).split(os.sep)[-3:])  # noqa: E731
  if tail(mine.get("model.hf_path", "")) == tail(theirs.get("model.hf_path", "")):
    skip.add("model.hf_path")
  return _differing(mine, theirs, skip.__contains__)


def keep_record(spec: str) -> None:
  """For a study with records: the record of `spec` written from its finished result under --root
  (when it has one and no record yet), and with --commit_records committed (also a record written
  earlier and left uncommitted). The code version is the one the run recorded when it started
  (result["code"]). A failure is said, not raised: the sweep goes on, and the next sweep retries."""
  root = root_dir()
  if not _study().records or borrowed(spec):  # a borrowed run's study keeps its record
    return
  try:
    path = records.record_path(out_dir(), spec)
    code = {}
    if not os.path.exists(path):
      if not os.path.exists(result_path(root, spec)):
        return
      result = read_json(result_path(root, spec))
      code = result.get("code") or records.code_version(REPO)
      workdir = None if records.is_stage(spec) else os.path.dirname(result_path(root, spec))
      path = records.write_record(out_dir(), spec, result, workdir, code)
      say(f"  {spec}: record {path}")
    if _COMMIT.value:
      code = code or (records.read_record(path) or {}).get("code", {})
      dirty = " (uncommitted changes)" if code.get("dirty") else ""
      if records.commit_record(path, f"{_STUDY.value} study: record of {spec} (code "
                               f"{(code.get('commit') or 'unknown')[:10]}{dirty})"):
        say(f"  {spec}: record committed")
  except (OSError, ValueError, RuntimeError) as e:
    say(f"  {spec}: its record could not be kept ({type(e).__name__}: {e}); the next sweep "
        "retries")


def dac_alphas(root: str, size: str, runs: dict, study: str) -> tuple:
  """(method, alpha) of the study's DAC arms that set dac.alpha alone and of its arm "dac" (the
  preset's alpha), sorted by alpha (an arm that changes more than alpha, e.g. dac_paper, is no
  point of the alpha sweep). An arm's alpha is the one its runs recorded (result.json's
  overrides: an AlphaStar resolved when the run started; the seeds must agree); an arm without
  runs resolves it now, and is left out while the eval before RL is missing."""
  import importlib
  spec, pairs = STUDIES[study], []
  for method, (module, overrides) in spec.methods.items():
    if module != "dac" or ("dac.alpha" not in overrides and method != "dac") \
        or set(overrides) - {"dac.alpha"}:
      continue
    if "dac.alpha" not in overrides:
      alpha = importlib.import_module("configs.dac").get_config(spec.preset).dac.alpha
    elif runs.get(method):
      recorded = {r["overrides"]["dac.alpha"] for r in runs[method]}
      if len(recorded) != 1:
        raise ValueError(f"{method}: its seeds ran with different dac.alpha {sorted(recorded)}")
      alpha = recorded.pop()
    else:
      try:
        alpha = resolved_overrides(root, size, study, method)["dac.alpha"]
      except (FileNotFoundError, ValueError):
        continue
    pairs.append((method, alpha))
  return tuple(sorted(pairs, key=lambda p: p[1]))


def run_hardware() -> str:
  """This process's machine and the cores it may use (a pinned run: one)."""
  import platform
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                 cpu)
  except OSError:
    pass
  return f"{cpu}, {os.cpu_count()} cores, this run on {len(os.sched_getaffinity(0))}"


def recorded_hardware(study: dict) -> str:
  """Where the study's runs ran, as they recorded it (not the machine making the report); the
  machine's own description (hardware) for runs that recorded none, or with --hardware."""
  ran_on = sorted({r["hardware"] for s in study.values() for rs in s["runs"].values()
                   for r in rs if r.get("hardware")})
  if ran_on and not _HARDWARE.value:
    return "; ".join(ran_on) + " (as the runs recorded)"
  return hardware()


def hardware() -> str:
  if _HARDWARE.value:
    return _HARDWARE.value
  import platform
  where = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
  if _PIN.value:
    where += f", {_WORKERS.value} run(s) at a time, each on one core"
  return where


def report() -> None:
  root, out = root_dir(), out_dir()
  steps = _steps()
  study = (records.collect_records(out, _sizes(), _methods(), _seeds(), steps, say,
                                   lambda spec: record_out(spec, _STUDY.value))
           if _study().records else collect(root, _sizes(), _methods(), _seeds(), steps))
  if not study:
    raise SystemExit(f"no finished size under {out if _study().records else root} (run without "
                     "--report_only first)")
  os.makedirs(out, exist_ok=True)
  if _STUDY.value == "cw_grpo":
    table = summarize_cw(study)
    text = markdown_cw(table, steps, hardware())
    saved = {"study": "cw_grpo", "steps": steps, "hardware": hardware(),
             "seed_band": "min-max over seeds", "paper_claims": dict(PAPER_CLAIMS),
             "table": table}
    panels, title = CW_PANELS, "{size} model: mean over seeds, band min-max over seeds"
  elif _STUDY.value == "lora":
    table = summarize_lora(study)
    text = markdown_lora(table, steps, hardware())
    saved = {"study": "lora", "steps": steps, "hardware": hardware(),
             "lora": {"rank": LORA_RANK, "alpha": float(LORA_RANK), "lr": LORA_LR},
             "seed_band": "min-max over seeds", "table": table}
    panels, title = LORA_PANELS, "{size} model, IGPO (mean over seeds; band: min-max)"
  elif _STUDY.value in ("dac", "dac_research"):
    spec = _study()
    dac_start = {size: stage_result(root, f"{size}/{DAC_START}/0", _STUDY.value)[0]
                 for size in study}
    alphas = {size: spec.alphas or dac_alphas(root, size, s["runs"], _STUDY.value)
              for size, s in study.items()}
    generator = ("the warm start" if GENERATOR_SFT in spec.stages else
                 "the SFT model, its adapter at B = 0")
    table = {size: summarize_dac({size: s}, dac_start[size], spec.reference, alphas[size],
                                 generator)[size] for size, s in study.items()}
    where = recorded_hardware(study) if spec.records else hardware()
    text = markdown_dac(table, steps, where)
    saved = {"study": _STUDY.value, "steps": steps, "hardware": where,
             "methods": {m: {"config": f"configs/{c}.py:{spec.preset}",
                             "overrides": {k: repr(v) if isinstance(v, AlphaStar) else v
                                           for k, v in o.items()}}
                         for m, (c, o) in spec.methods.items()},
             "alphas": alphas, "seed_band": "min-max over seeds", "table": table}
    if GENERATOR_SFT in spec.stages:
      saved["generator_sft"] = {size: read_json(result_path(root, f"{size}/{GENERATOR_SFT}/0"))
                                for size in study}
    with open(os.path.join(out, "results.md"), "w") as f:
      f.write(text)
    write_json(os.path.join(out, "results.json"), no_nan(saved))
    sufficiency = None if _STUDY.value == "dac_research" else dac_panels()[1][3]
    paths = plot_dac(study, out, dac_panels(next(iter(alphas.values())), sufficiency))
    say(text)
    say(f"written: {os.path.join(out, 'results.md')}, results.json, "
         + ", ".join(os.path.basename(p) for p in paths))
    return
  elif _STUDY.value == "async":
    table = summarize_async(study)
    text = markdown_async(table, steps, hardware())
    saved = {"study": "async", "steps": steps, "hardware": hardware(),
             "primary_metric": "test F1 vs the same method's synchronous arm, paired by "
             "question, pooled over seeds", "seed_band": "min-max over seeds", "table": table}
    plot_f1_vs_time(study, out)
    panels, title = IGPO_PANELS, "{size}: mean over seeds, band min-max over seeds"
  elif _STUDY.value == "research":
    table = summarize_research(study, _TARGET.value)
    where = recorded_hardware(study)
    text = markdown_research(table, steps, where)
    saved = {"study": "research", "steps": steps, "hardware": where,
             "target_gain": _TARGET.value, "primary_metric": "test F1 vs GRPO, paired by "
             "question, pooled over seeds", "paper_claims": dict(RESEARCH_CLAIMS), "table": table}
    panels, title = IGPO_PANELS, "{size}: mean over seeds, band min-max over seeds"
  else:
    table = summarize(study, _TARGET.value)
    text = markdown(table, steps, hardware())
    saved = {"steps": steps, "hardware": hardware(), "target_gain": _TARGET.value,
             "table": table}
    panels, title = IGPO_PANELS, "{size} model"
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(text)
  write_json(os.path.join(out, "results.json"), no_nan(saved))
  paths = plot_seed_bands(study, out, panels, title)
  say(text)
  say(f"written: {os.path.join(out, 'results.md')}, results.json, "
       + ", ".join(os.path.basename(p) for p in paths))
  say(json.dumps({"compare": {size: {m: round(r["test_f1"][0], 4)
                                      for m, r in t.get("methods", t).items()}
                               for size, t in table.items()}}))


def main(_):
  if _RUN.value:  # a run's log shows its steps (the trainer logs one line per step at INFO)
    logging.getLogger().setLevel(logging.INFO)
    run_one(root_dir(), _RUN.value, _steps(), _STUDY.value, _EVAL_SIZE.value,
            _GENERATOR_SFT_STEPS.value)
    return
  logging.getLogger().setLevel(logging.WARNING)
  for name in _sizes():
    if name not in SIZES:
      raise app.UsageError(f"--sizes: unknown size {name!r}; known: {sorted(SIZES)}")
  for name in _methods():
    if name not in _study().methods:
      raise app.UsageError(f"--methods: unknown method {name!r} in study {_STUDY.value!r}; "
                           f"known: {sorted(_study().methods)}")
  if not _REPORT_ONLY.value:
    _run_all()
  report()
