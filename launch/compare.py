r"""The SynthWorld studies: IGPO vs GRPO (docs/results/, issue 6) and CW-GRPO vs GRPO
(docs/results/cw_grpo/, issue 16), chosen by --study.

    python launch/compare.py                          # every size x method x seed, then the report
    python launch/compare.py --sizes=base --seeds=0   # a subset (finished runs are reused)
    python launch/compare.py --report_only            # tables + plots from the finished runs

Every method starts from the same SFT warm start of its model size and runs the demo RL settings
(configs/base.py `_demo`: 8 questions x 8 rollouts a step, lr 3e-5, top-1 BM25, 4 turns) for
--steps steps; only the advantage estimator (and its reward) differs:

  igpo          configs/igpo.py:demo (IG turn rewards + outcome, separate normalization)
  outcome_only  the same with rl.igpo_ig_weight=0 (IGPO's F1-only ablation; with separate
                normalization and gamma 1 its advantages are exactly GRPO's, see METHODS)
  ig_only       the same with rl.igpo_outcome_weight=0 (IGPO's IG-only ablation)
  grpo, rloo, reinforcepp   configs/{grpo,rloo,reinforcepp}.py:demo
  ppo           configs/ppo.py:demo (a critic from the SFT start, token-level GAE)
  ppo_turn      the same with turn-level GAE (algorithm ppo_turn)
  ppo_ig        the same as ppo with IGPO's information gain as turn rewards (ppo.ig_weight=1)

The PPO rows (issue 20) were run on the base size beside GRPO and IGPO from the current base SFT
start (the CW-GRPO and DAC studies' one), reported in docs/results/ppo:

    python launch/compare.py --sizes=base --methods=grpo,igpo,ppo,ppo_turn,ppo_ig \
        --root=runs/ppo --sft_from=runs/cw_grpo --out=docs/results/ppo

Every run computes the ground-truth probes (rl.probe_all) so that the IG and ground-truth entropy
of GRPO-family policies are measured the same way as IGPO's. Sizes (trained from scratch by SFT on
the demo's hasty-teacher demonstrations, configs/sft.py:demo):

  base   the demo model: hidden 128, 2 layers, 4 heads of 32 (2 KV), MLP 384
  wide   hidden 256, 2 layers, 8 heads of 32 (4 KV), MLP 768

Layout under --root: synthworld/ tfds/ bm25_index/ (the world of `make demo`, reused when it has
the same settings), {size}/sft/, {size}/start.json (dev + test eval of the SFT export),
{size}/{method}/seed{k}/ (a normal RL workdir + result.json: dev and test eval of the final
policy). A run whose result.json exists is not run again; an interrupted one resumes from its
checkpoint. Several compare.py processes on one machine (e.g. started as cores free up) can work
on one sweep: each run is claimed with a file lock (flock) under {root}/claims. The
report (--out): results.md (tables), results.json, f1_vs_step.png, f1_minus_grpo_vs_step.png,
collapse_vs_step.png, gt_entropy_vs_step.png.

    python launch/compare.py --study=cw_grpo          # runs/cw_grpo -> docs/results/cw_grpo

The CW-GRPO study (issue 16 section 5): the base size only, from the base SFT export of `make demo`
(--sft_from=runs/demo: its world and SFT export are copied into --root when its SFT settings are
the ones this script's SFT uses, so it is the export the IGPO study's layout would train; otherwise
it is trained here), the demo RL settings for --steps steps, no ground-truth probes. The methods
differ only in the estimator and the judge (see CW_METHODS): GRPO; CW-GRPO with SynthWorld's
oracle judge (gamma = inf branch, all-zero fallback "zero"); its controls with random contributions
at the oracle's marginal rate, with the oracle's bits flipped with p = 0.2, and with gamma = 1
(softmax). Its report
(--out): results.md (tables, the paper's claim beside ours), results.json, f1_vs_step.png,
success_vs_step.png (training EM). Every run's result.json records its judge's identity.

    python launch/compare.py --study=lora             # runs/lora -> docs/results/lora

The LoRA study (issue 17 section 5): the wide size, its SFT start trained here, IGPO
(configs/igpo.py:demo, the igpo study's `igpo` method, ground-truth probes included) with full
fine-tuning (full_ft) against LoRA rank 32, alpha 32 (scale 1) on all 7 projections of the frozen
backbone at lr LORA_LR (lora_r32); nothing else differs. Every run's result.json also records the
process's peak RSS and the bytes of its train state (trained params + optimizer state, counted from
the arrays the trainer builds). Its report (--out): results.md (dev/test F1 with per-hop, the paired
per-seed test difference, step time, memory), results.json, f1_vs_step.png.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import json
import logging
import math
import os
import queue
import resource
import shutil
import subprocess
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

from absl import app, flags  # noqa: E402

SIZES = {
    "base": {},  # the demo preset's shape
    "wide": dict(hidden_size=256, intermediate_size=768, num_heads=8, num_kv_heads=4),
}
# method: (config file, config overrides by dotted key). Under the demo's separate normalization
# with gamma = 1, outcome_only gives exactly GRPO's advantages (every IG pool is all zero, so z =
# 0): it is kept as the paper's ablation and as a check that the IGPO path reproduces GRPO.
METHODS = {
    "igpo": ("igpo", {}),
    "grpo": ("grpo", {}),
    "outcome_only": ("igpo", {"rl.igpo_ig_weight": 0.0}),
    "ig_only": ("igpo", {"rl.igpo_outcome_weight": 0.0}),
    "rloo": ("rloo", {}),
    "reinforcepp": ("reinforcepp", {}),
    # PPO with a learned critic (configs/ppo.py:demo): token-level GAE, turn-level GAE, and
    # token-level GAE with IGPO's information gain as turn rewards.
    "ppo": ("ppo", {}),
    "ppo_turn": ("ppo", {"algorithm": "ppo_turn"}),
    "ppo_ig": ("ppo", {"ppo.ig_weight": 1.0}),
}
# CW-GRPO's study: the oracle judge (configs/cw_grpo.py:demo) and its controls. "random" draws
# each bit with the judge's own marginal rate in the step; "flip" flips each bit with noise_p.
CW_METHODS = {
    "grpo": ("grpo", {}),
    "cw_grpo": ("cw_grpo", {}),
    "cw_random": ("cw_grpo", {"judge.noise": "random"}),
    "cw_flip": ("cw_grpo", {"judge.noise": "flip", "judge.noise_p": 0.2}),
    "cw_gamma1": ("cw_grpo", {"cw.gamma": 1.0}),
}


# LoRA's study: the same IGPO run with the backbone frozen and rank-32 adapters trained on every
# projection. alpha = rank (scale 1); lr 10x full fine-tuning's demo 3e-5 (LoRA's usual ratio; not
# tuned here, see docs/results/lora/README.md).
LORA_RANK = 32
LORA_LR = 3e-4
LORA_METHODS = {
    "full_ft": ("igpo", {}),
    "lora_r32": ("igpo", {"model.lora.adapters": "policy", "model.lora.rank": LORA_RANK,
                          "model.lora.alpha": float(LORA_RANK),
                          "model.lora.lr": f"policy={LORA_LR:g}"}),
}


# DAC's study (issue 18 section 4): the monolithic policy by GRPO with full fine-tuning and with
# one LoRA adapter (the LoRA study's rank, alpha and rate: separates "decomposition" from "LoRA"),
# against DAC (configs/dac.py:demo, two LoRA roles) and its ablations: the searcher rewarded by S
# alone (no abstention term), no hard-positive augmentation, alpha 0.1 / 0.5 (dac is 0.3).
DAC_METHODS = {
    "grpo_full": ("grpo", {}),
    "grpo_lora": ("grpo", LORA_METHODS["lora_r32"][1]),
    "dac": ("dac", {}),
    "dac_sufficient_only": ("dac", {"dac.searcher_reward": "sufficient_only"}),
    "dac_no_aug": ("dac", {"dac.augment_rate": 0.0}),
    "dac_alpha0.1": ("dac", {"dac.alpha": 0.1}),
    "dac_alpha0.5": ("dac", {"dac.alpha": 0.5}),
    # alpha where it can act: the generator's advantages grouped by question (with groups per
    # evidence set, GRPO's z-score cancels alpha exactly; docs/results/dac/README.md).
    "dacq_alpha0.1": ("dac", {"dac.alpha": 0.1, "dac.generator_group": "question"}),
    "dacq_alpha0.3": ("dac", {"dac.generator_group": "question"}),
    "dacq_alpha0.5": ("dac", {"dac.alpha": 0.5, "dac.generator_group": "question"}),
}
DAC_START = "dac_start"  # pseudo-method: the DAC agent before RL (the generator's warm start)
GENERATOR_SFT = "generator_sft"  # {root}/{size}/generator_sft: the generator's warm start


@dataclasses.dataclass(frozen=True)
class Study:
  """One study's methods and defaults (--root, --out, --sizes, --sft_from when not given)."""
  methods: dict
  root: str
  out: str
  sizes: tuple
  probe_all: bool  # the ground-truth probes (IGPO's IG and GT entropy, for every method)
  sft_from: str  # a `make demo` folder whose world and SFT export to reuse ("" = none)


STUDIES = {
    "igpo": Study(METHODS, "runs/compare", "docs/results", tuple(SIZES), True, ""),
    "cw_grpo": Study(CW_METHODS, "runs/cw_grpo", "docs/results/cw_grpo", ("base",), False,
                     "runs/demo"),
    "lora": Study(LORA_METHODS, "runs/lora", "docs/results/lora", ("wide",), True, ""),
    "dac": Study(DAC_METHODS, "runs/dac", "docs/results/dac", ("base",), False, "runs/cw_grpo"),
}
SPLITS = ("dev", "test")

_STUDY = flags.DEFINE_enum("study", "igpo", list(STUDIES), "igpo: IGPO vs GRPO (docs/results); "
                          "cw_grpo: CW-GRPO vs GRPO and its judge controls (docs/results/cw_grpo); "
                          "lora: IGPO with LoRA vs full fine-tuning (docs/results/lora); "
                          "dac: DAC's two LoRA roles vs monolithic GRPO (docs/results/dac).")
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
                           "minibatches).")
_STEPS = flags.DEFINE_integer("steps", 20, "RL steps of every run.")
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
_HARDWARE = flags.DEFINE_string("hardware", "", "Where the runs ran, for the report (default: "
                                "this machine's CPU and core count).")


def _say(msg: str) -> None:
  print(msg, flush=True)


def _study() -> Study:
  return STUDIES[_STUDY.value]


def _root() -> str:
  return _ROOT.value or _study().root


def _out() -> str:
  return _OUT.value or _study().out


def _sizes() -> list[str]:
  return _SIZES.value or list(_study().sizes)


def _methods() -> list[str]:
  return _METHODS.value or list(_study().methods)


def result_path(root: str, spec: str) -> str:
  """Where a finished size/method/seed run (or size/sft/0: the SFT start's eval) leaves its
  result; a run whose result exists is not run again."""
  size, method, seed = spec.split("/")
  if method == "sft":
    return os.path.join(root, size, "start.json")
  if method == GENERATOR_SFT:
    return os.path.join(root, size, GENERATOR_SFT, "result.json")
  return os.path.join(root, size, method, f"seed{seed}", "result.json")


def _point_at_world(config, root: str, size: str) -> None:
  """Paths of a demo config moved under `root`, and the model shape of `size`."""
  from agentjax.data.demo_world import use_demo_world
  use_demo_world(config, root)
  for k, v in SIZES[size].items():
    config.model.shape[k] = v


def sft_config(root: str, size: str):
  from configs import sft
  config = sft.get_config("demo")
  _point_at_world(config, root, size)
  return config


def rl_config(root: str, size: str, method: str, seed: int, steps: int, study: str = "igpo",
              eval_size: int = 0):
  """The RL config of one run of `study`: the method's config file and overrides on the demo
  preset, the world under `root`, the size's SFT export as the start (and with DAC, the
  generator adapter from the size's warm start, generator_config). eval_size: questions of each
  eval split (0: the whole split)."""
  import importlib
  module, overrides = STUDIES[study].methods[method]
  config = importlib.import_module(f"configs.{module}").get_config("demo")
  _point_at_world(config, root, size)
  config.model.hf_path = os.path.join(root, size, "sft", "hf_export")
  config.model.tokenizer_path = ""
  config.seed = seed
  config.train.steps = steps
  config.train.eval_every = 0
  config.train.eval_at_start = False  # the SFT export is evaluated once per size (start.json)
  config.data.eval_size = 0  # the final eval: the whole dev split
  config.train.checkpoint_every = 10
  config.train.export_hf = False
  config.rl.probe_all = STUDIES[study].probe_all
  if eval_size:  # smoke tests only: the first eval_size questions of each split
    config.data.eval_size = eval_size
  if config.trainer == "dac":  # the generator adapter starts from this size's warm start
    config.model.lora.init = f"generator={generator_init(root, size)}"
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    if leaf not in node:  # a typo must not become a new, unread field
      raise KeyError(f"method {method!r}: config has no field {key!r}")
    node[leaf] = value
  return config


def generator_init(root: str, size: str) -> str:
  """The PEFT folder of the generator's warm start of `size` (DAC runs' model.lora.init)."""
  return os.path.join(root, size, GENERATOR_SFT, "adapters", "generator")


def generator_config(root: str, size: str, steps: int = 0):
  """configs/dac.py:generator_sft on the world under `root`, from the size's SFT export: LoRA SFT
  of the "generator" adapter on generator demonstrations written under {root}/{size}/
  generator_sft/ (agentjax/dac/warmstart.py). steps: 0 keeps the preset's sft.steps."""
  from configs import dac
  config = dac.get_config(GENERATOR_SFT)
  corpus = config.sft.corpus_path  # the preset's ("": demonstrations only); use_demo_world sets it
  _point_at_world(config, root, size)
  config.sft.corpus_path = corpus
  config.sft.demos = os.path.join(root, size, GENERATOR_SFT, "generator_demos.jsonl")
  config.model.hf_path = os.path.join(root, size, "sft", "hf_export")
  config.model.tokenizer_path = ""
  if steps:
    config.sft.steps = steps
  return config


def _split_result(root: str, split: str, rows: list[dict]) -> dict:
  """Eval rows ({"id", "f1", "em", ...} a question) as the report reads them; acc is the CW-GRPO
  code's accuracy, the share of questions whose EM is > 0."""
  from agentjax.data.demo_world import f1_by_hops, hops_by_id
  n = len(rows)
  hops = hops_by_id(os.path.join(root, "synthworld", f"{split}.jsonl"))
  return {"f1": sum(q["f1"] for q in rows) / n, "em": sum(q["em"] for q in rows) / n,
          "acc": sum(q["em"] > 0 for q in rows) / n, "n": n,
          "per_hop": {f"{h}-hop": f1 for h, f1 in f1_by_hops(rows, hops).items()},
          "f1_by_id": {q["id"]: q["f1"] for q in rows},
          "em_by_id": {q["id"]: q["em"] for q in rows}, **answer_scores(rows)}


def answer_scores(rows: list[dict]) -> dict:
  """Coverage (share of questions answered: not abstained, not invalid), accuracy when answered
  (EM > 0) and, for an agent that may abstain (rows with "abstained" and "sufficient": DAC), the
  abstention rate and its precision P(S = 0 | abstained) and recall P(abstained | S = 0)
  (evaluation.row_means); a monolithic agent never abstains (rate 0, no precision or recall)."""
  from agentjax.train.evaluation import ABSTENTION_SCORES, row_means
  if rows and all("abstained" in q for q in rows):
    means = row_means(rows)
    return {k: means[k] for k in ABSTENTION_SCORES}
  answered = [q for q in rows if q["answer"] is not None]
  return {"coverage": len(answered) / len(rows) if rows else 0.0,
          "accuracy_answered": (sum(q["em"] > 0 for q in answered) / len(answered)
                                if answered else 0.0), "abstain_rate": 0.0}


def _eval_split(config, root: str, split: str, **source) -> dict:
  """Greedy eval of the whole split, from a checkpoint (workdir=) or HF folder (hf_path=)."""
  from agentjax.train.trainer import eval_benchmarks
  c = config.copy_and_resolve_references()
  c.data.eval_split = split  # the whole split (rl_config's eval_size: smoke tests only)
  rows = eval_benchmarks(c, **source)["per_question"]["synthworld"]
  return _split_result(root, split, rows)


def run_one(root: str, spec: str, steps: int, study: str = "igpo", eval_size: int = 0,
            generator_sft_steps: int = 0) -> None:
  """One size/method/seed RL run + its final dev/test eval, or the SFT (+ start eval) of a size.
  A size whose SFT export exists (a finished SFT, or one reused by _reuse_sft) is not trained.
  DAC's study also has the generator's warm start (size/generator_sft/0) and the eval of the DAC
  agent before RL (size/dac_start/0); its DAC runs add the augmentation check."""
  from agentjax.judge import judge_identity
  from agentjax.train.trainer import train
  size, method, seed = spec.split("/")
  if method == GENERATOR_SFT:
    run_generator_sft(root, size, generator_sft_steps)
    return
  if method == DAC_START:  # both roles as RL starts them: the backbone and the warm start
    config = rl_config(root, size, "dac", 0, steps, study, eval_size)
    t0 = time.time()
    result = {split: _dac_split(config, root, split) for split in SPLITS}
    result["minutes"] = (time.time() - t0) / 60
    os.makedirs(os.path.dirname(result_path(root, spec)), exist_ok=True)
    _write(result_path(root, spec), result)
    return
  if method == "sft":
    if not os.path.exists(os.path.join(root, size, "sft", "hf_export", "config.json")):
      train(sft_config(root, size), os.path.join(root, size, "sft"))
    start = os.path.join(root, size, "start.json")
    if not os.path.exists(start):
      rl = rl_config(root, size, next(iter(STUDIES[study].methods)), 0, steps, study,
                     eval_size)
      _write(start, {split: _eval_split(rl, root, split, hf_path=rl.model.hf_path)
                     for split in SPLITS})
    return
  workdir = os.path.join(root, size, method, f"seed{seed}")
  config = rl_config(root, size, method, int(seed), steps, study, eval_size)
  if config.trainer == "dac":
    check_generator_start(config, root, size)
  t0 = time.time()
  train(config, workdir)
  # The trainer's final eval is the whole dev split (500 questions, greedy); test is added here.
  with open(os.path.join(workdir, "eval", f"{steps}.json")) as f:
    dev_rows = json.load(f)["per_question"]
  result = {"dev": _split_result(root, "dev", dev_rows)}
  result["test"] = _eval_split(config, root, "test", workdir=workdir)
  if config.trainer == "dac":  # the generator on dev evidence with distractors vs clean
    result["augmentation_check"] = augmentation_summary(
        augmented_dev_rows(config, workdir), dev_rows)
  result["minutes"] = (time.time() - t0) / 60  # of this invocation (less after a resume)
  result["steps"] = steps
  result["judge"] = judge_identity(config.judge)  # backend, model, prompt hash, study noise
  result["overrides"] = STUDIES[study].methods[method][1]
  # Linux reports ru_maxrss in KiB: the peak of this whole process (load, training, both evals),
  # read before train_state_bytes builds a second state.
  result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  result["train_state"] = train_state_bytes(config)
  result["checkpoint_bytes"] = _tree_bytes(os.path.join(workdir, "checkpoints", str(steps)))
  _write(result_path(root, spec), result)


def run_generator_sft(root: str, size: str, steps: int = 0) -> None:
  """DAC's generator warm start of `size` (configs/dac.py:generator_sft, generator_config): its
  demonstrations written from the world's searcher demonstrations, then LoRA SFT of the
  "generator" adapter; every DAC method and seed starts its generator adapter from the PEFT
  export. Writes {root}/{size}/generator_sft/result.json (the demos' counts, the last SFT step's
  loss and token accuracy, minutes)."""
  from agentjax.dac.warmstart import write_generator_demos
  from agentjax.jsonl import iter_json_objects
  from agentjax.train.trainer import train
  config = generator_config(root, size, steps)
  workdir = os.path.join(root, size, GENERATOR_SFT)
  t0 = time.time()
  if not os.path.exists(config.sft.demos):
    write_generator_demos(config)
  demos = [row for _, row in iter_json_objects(config.sft.demos, ValueError, what="demos")]
  train(config, workdir)
  if not os.path.isdir(generator_init(root, size)):
    raise RuntimeError(f"{workdir}: the warm start left no PEFT folder {generator_init(root, size)}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    last = [m for m in map(json.loads, f) if "loss" in m][-1]
  _write(result_path(root, f"{size}/{GENERATOR_SFT}/0"), {
      "demos": len(demos), "sufficient": sum(bool(r["sufficient"]) for r in demos),
      "steps": config.sft.steps, "batch_size": config.sft.batch_size, "lr": config.sft.lr,
      "last_loss": last["loss"], "last_accuracy": last["accuracy"],
      "minutes": (time.time() - t0) / 60})


def check_generator_start(config, root: str, size: str) -> None:
  """A DAC run's generator must start from a warm start that learned the run's abstention
  answer and labels: configs/dac.py may change between the warm start and a run."""
  recorded = _read_json(os.path.join(root, size, GENERATOR_SFT, "config.json"))
  if recorded is None:
    raise FileNotFoundError(f"{root}/{size}/{GENERATOR_SFT}: no generator warm start")
  for key in ("abstain_text", "sufficiency_match"):
    if recorded["dac"][key] != config.dac[key]:
      raise ValueError(
          f"dac.{key}: the run has {config.dac[key]!r} but the generator warm start in "
          f"{root}/{size}/{GENERATOR_SFT} was trained with {recorded['dac'][key]!r}; delete that "
          "folder to train it again")


def _dac_split(config, root: str, split: str) -> dict:
  """Greedy eval of the DAC agent before RL on `split`: the searcher adapter at its init (B = 0:
  the backbone) and the generator adapter from the warm start (the params RL starts from)."""
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  from agentjax.train.evaluation import eval_questions, evaluate
  from agentjax.train.trainer import TrainTarget, load_model, make_agents, make_search_backend
  c = config.copy_and_resolve_references()
  c.data.eval_split = split
  mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  cfg, params, tokenizer = load_model(c, mesh)
  target = TrainTarget.build(c, cfg, params, mesh)
  _, agent = make_agents(c, cfg, tokenizer, make_search_backend(c), mesh, target.spec,
                         eval_only=True)
  name = config_lib.benchmark_list(c.data.eval, "data.eval")[0]
  _, records = eval_questions(c)[name]
  with use_mesh(mesh):
    rows = evaluate(agent, target.rollout_params(target.trainable), records,
                    c.train.eval_batch)["per_question"]
  return _split_result(root, split, rows)


def augmented_dev_rows(config, workdir: str) -> list[dict]:
  """The augmentation check's rollouts (issue 18 section 4, methods spec 5.9): the run's final
  searcher and generator, greedy, one answer per evidence set, on the dev questions the trainer's
  final eval used, with dac.augment_rate = 1: every sufficient evidence set gets augment_k hard
  distractors (answer-free retriever hits for the searcher's own queries) shuffled in, as in
  training. Batches as the trainer's eval (train.eval_batch, the last padded), so the searcher's
  greedy trajectories are the eval's; the augmentation rng of batch b is
  default_rng([config.seed, b]). Returns per question {"id", "answer", "sufficient",
  "augmented", "distractors", "abstained", "correct"}."""
  import jax
  import numpy as np
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  from agentjax.train.evaluation import eval_questions
  from agentjax.train.trainer import make_agents, make_search_backend, restore_trainable
  c = config.copy_and_resolve_references()
  c.dac.augment_rate = 1.0
  mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  cfg, target, trainable, tokenizer, _ = restore_trainable(c, workdir, mesh,
                                                           purpose="check augmentation")
  _, agent = make_agents(c, cfg, tokenizer, make_search_backend(c), mesh, target.spec,
                         eval_only=True)
  name = config_lib.benchmark_list(c.data.eval, "data.eval")[0]
  _, records = eval_questions(c)[name]
  params, size, rows = target.rollout_params(trainable), c.train.eval_batch, []
  with use_mesh(mesh):
    for b, start in enumerate(range(0, len(records), size)):
      chunk = list(records[start:start + size])
      real = len(chunk)
      chunk += [chunk[-1]] * (size - real)  # the eval's padding: one compiled shape
      out, _ = agent.run(params, [r["question"] for r in chunk], jax.random.key(0),
                         golds=[r["golden_answers"] for r in chunk],
                         aug_rng=np.random.default_rng([int(c.seed), b]))
      for i, rec in enumerate(chunk[:real]):
        rows.append({"id": rec["id"], "answer": out.answers[i] if out.answered[i] else None,
                     "sufficient": bool(out.sufficient[i]), "augmented": bool(out.augmented[i]),
                     "distractors": int(out.distractors[i]), "abstained": bool(out.abstained[i]),
                     "correct": bool(out.correct[i])})
  return rows


def augmentation_summary(augmented_rows: list[dict], clean_rows: list[dict]) -> dict:
  """The augmentation check from the augmented pass's rows (augmented_dev_rows) and the clean
  eval's rows of the same questions (the trainer's final dev eval: "id", "answer", "em",
  "abstained", "sufficient"): on the questions whose evidence was sufficient in both passes and
  got distractors in the augmented one, the generator's accuracy (EM > 0; an abstention is
  wrong) and abstention rate with distractors vs clean (paired: same questions, same searcher
  trajectories). consistency: the share of the other questions (nothing added) whose answer is
  the clean eval's, a check that both passes saw the same searcher trajectories (1.0 expected)."""
  clean = {r["id"]: r for r in clean_rows}
  both = [r for r in augmented_rows if r["augmented"] and r["sufficient"]
          and clean[r["id"]]["sufficient"]]
  rest = [r for r in augmented_rows if not r["augmented"]]
  share = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
  acc_aug = share([r["correct"] for r in both])
  acc_clean = share([clean[r["id"]]["em"] > 0 for r in both])
  return {
      "n_augmented_sufficient": len(both),
      "n_sufficient": sum(r["sufficient"] for r in augmented_rows),
      "distractors_per_set": share([r["distractors"] for r in both]),
      "accuracy_augmented": acc_aug, "accuracy_clean": acc_clean,
      "accuracy_drop": None if acc_aug is None else acc_clean - acc_aug,
      "abstain_rate_augmented": share([r["abstained"] for r in both]),
      "abstain_rate_clean": share([clean[r["id"]]["abstained"] for r in both]),
      "consistency": share([r["answer"] == clean[r["id"]]["answer"] for r in rest])}


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


def _write(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f)
  os.replace(tmp, path)  # a killed run never leaves a half-written result


_FREE_CORES: "queue.Queue[int]" = queue.Queue()


def _claim(spec: str, root: str | None = None) -> int | None:
  """An open file descriptor holding an exclusive flock on claims/<spec> under `root` (default:
  --root), or None when another process holds it (several compare.py processes can share one
  sweep). The kernel drops the lock when every descriptor is closed: the run's subprocess
  inherits it, so a killed orchestrator does not free a run that is still training."""
  folder = os.path.join(root or _root(), "claims")
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
  root = _root()
  cmd = [sys.executable, os.path.abspath(__file__), f"--run={spec}", f"--root={root}",
         f"--steps={_STEPS.value}", f"--study={_STUDY.value}", f"--eval_size={_EVAL_SIZE.value}",
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
  from agentjax.train.trainer import RECORDED_EXTRAS  # written beside the config, not fields
  mine = _flat(json.loads(json.dumps(ours.to_dict())))  # tuples as JSON lists, as recorded
  theirs = _flat({k: v for k, v in recorded.items() if k not in RECORDED_EXTRAS})
  # Fields added to configs/base.py after that run are absent from its record: at their base
  # default they change nothing (e.g. model.lora.* off).
  default = _flat(json.loads(json.dumps(base.get_config("demo").to_dict())))
  added = lambda k: k not in theirs and k in default and mine.get(k) == default[k]  # noqa: E731
  keep = lambda k: (k not in _WORLD_PATH_KEYS and not k.startswith(_RL_ONLY_SECTIONS)  # noqa: E731
                    and not added(k))
  return sorted(k for k in set(mine) | set(theirs)
                if keep(k) and mine.get(k, "<absent>") != theirs.get(k, "<absent>"))


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
  recorded = _read_json(os.path.join(base, "sft", "config.json"))
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
  root, study = _root(), _STUDY.value
  topk = rl_config(root, "base", next(iter(STUDIES[study].methods)), 0, 1, study).retrieval.topk
  source = _study().sft_from if _SFT_FROM.value is None else _SFT_FROM.value
  if source and "base" in _sizes():
    os.makedirs(root, exist_ok=True)
    _say(reuse_sft(root, source, topk))
  _say(build_demo_world(os.path.join(root, "synthworld"), topk=topk))
  free_cores(_WORKERS.value)
  with concurrent.futures.ThreadPoolExecutor(_WORKERS.value) as pool:
    # DAC's study: the generator's warm start after the SFT, and the DAC agent's eval before RL
    # beside the RL runs (stage "rl" runs only sizes whose earlier stages are done).
    stages = ("sft", GENERATOR_SFT, "rl") if study == "dac" else ("sft", "rl")
    for i, stage in enumerate(stages):
      if stage != "rl":
        ready = [s for s in _sizes() if all(os.path.exists(result_path(root, f"{s}/{x}/0"))
                                            for x in stages[:i])]
        specs = [f"{s}/{stage}/0" for s in ready]
      else:  # only sizes whose SFT start is ready (another process may still be training one)
        sizes = [s for s in _sizes() if all(os.path.exists(result_path(root, f"{s}/{x}/0"))
                                            for x in stages[:-1])]
        for s in set(_sizes()) - set(sizes):
          _say(f"size {s}: its SFT start is not ready (held by another process?); skipped")
        specs = [f"{s}/{m}/{k}" for k in _SEEDS.value for s in sizes for m in _methods()]
        if _PRIORITY.value:
          first = _SEEDS.value[0]
          rank = lambda x: (x.split("/")[2] != first,  # noqa: E731
                            x.split("/")[1] not in _PRIORITY.value)
          specs = sorted(specs, key=rank)  # stable: seed by seed within each group
        if study == "dac":
          specs = [f"{s}/{DAC_START}/0" for s in sizes] + specs
      specs = [x for x in specs if not os.path.exists(result_path(root, x))]
      _say(f"{len(specs)} run(s): {' '.join(specs)}")
      for spec, rc, secs in pool.map(_spawn, specs):
        if rc is None:
          _say(f"  {spec}: done or taken by another compare.py process")
          continue
        _say(f"  {spec}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {secs / 60:.1f} min")
        if rc:
          _say(f"    log: {os.path.join(root, spec.replace('/', '_') + '.log')}")


# ============================================================================ report


def _metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [m for m in map(json.loads, f) if "reward" in m]


WINDOW = 5  # steps per moving average (curves, steps to target, GT entropy windows)


def _moving(x: list[float], w: int = WINDOW) -> list[float | None]:
  """Mean of the last w values at each index; None until a full window exists (a partial one
  would let a single noisy step count)."""
  return [sum(x[i - w + 1:i + 1]) / w if i >= w - 1 else None for i in range(len(x))]


def _grpo_f1(runs: dict) -> dict:
  """{seed: GRPO's training F1 per step}: what the other methods are paired with, step by step
  (the same seed sees the same questions at a step)."""
  return {r["seed"]: [m["f1"] for m in r["curve"]] for r in runs.get("grpo", [])}


def _mean_std(xs: list[float]) -> tuple[float, float]:
  """Mean and sample std (nan for one value)."""
  n = len(xs)
  m = sum(xs) / n
  std = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan")
  return m, std


def _read_json(path: str):
  """The JSON object in `path`, or None when there is no such file (a run not finished)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def collect(root: str, sizes, methods, seeds, steps: int) -> dict:
  """Every finished run of `steps` steps: curves and evals, grouped by size and method."""
  out = {}
  for size in sizes:
    start = _read_json(result_path(root, f"{size}/sft/0"))
    if start is None:
      continue
    runs = {}
    for method in methods:
      for seed in seeds:
        path = result_path(root, f"{size}/{method}/{seed}")
        result = _read_json(path)
        if result is None:
          continue
        curve = _metrics(os.path.dirname(path))
        if result.get("steps", len(curve)) != steps:
          _say(f"{path}: a run of {result.get('steps', len(curve))} steps, not {steps}; left out")
          continue
        runs.setdefault(method, []).append(dict(result, seed=seed, curve=curve))
    out[size] = {"start": start, "runs": runs}
  return out


def summarize(study: dict, target_gain: float) -> dict:
  """Per size and method: mean ± std over seeds of every reported figure."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs = s["runs"]
    # Every method sees the same questions at a given step of a seed, so a seed's start (its
    # first WINDOW steps' training F1, averaged over the methods) is a common baseline.
    by_seed = {}
    for rs in runs.values():
      for r in rs:
        by_seed.setdefault(r["seed"], []).append(
            sum(m["f1"] for m in r["curve"][:WINDOW]) / WINDOW)
    targets = {seed: sum(v) / len(v) + target_gain for seed, v in by_seed.items()}
    grpo = _grpo_f1(runs)
    table[size] = {"start": {split: {k: s["start"][split][k] for k in ("f1", "em", "per_hop")}
                             for split in SPLITS},
                   "target_train_f1": targets, "methods": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs)}
      for split in SPLITS:
        row[f"{split}_f1"] = _mean_std([r[split]["f1"] for r in rs])
        for hop in rs[0][split]["per_hop"]:
          row[f"{split}_{hop}"] = _mean_std([r[split]["per_hop"][hop] for r in rs])
        gains = [paired_gain(s["start"][split]["f1_by_id"], r[split]["f1_by_id"]) for r in rs]
        row[f"{split}_gain"] = _mean_std([g for g, _ in gains])
        row[f"{split}_gain_stderr_per_seed"] = [round(e, 4) for _, e in gains]
      reached = []
      for r in rs:
        avg = _moving([m["f1"] for m in r["curve"]])
        hit = [m["step"] for m, a in zip(r["curve"], avg)
               if a is not None and a >= targets[r["seed"]]]
        reached.append(hit[0] if hit else None)
      row["steps_to_target"] = reached
      # Training F1 minus GRPO's at the same step of the same seed (same questions), averaged
      # over the steps: sample efficiency with the question-to-question variance paired out.
      paired = [sum(m["f1"] - g for m, g in zip(r["curve"], grpo[r["seed"]])) / len(r["curve"])
                for r in rs if r["seed"] in grpo]
      row["train_f1_minus_grpo"] = _mean_std(paired) if paired else None
      row["collapse_fraction"] = _mean_std(
          [sum(m["collapse_fraction"] for m in r["curve"]) / len(r["curve"]) for r in rs])
      # Groups whose every sampled token got a zero advantage (the estimator's own collapse;
      # runs made before the trainer logged it are left out).
      zero = [sum(m["zero_adv_fraction"] for m in r["curve"]) / len(r["curve"]) for r in rs
              if all("zero_adv_fraction" in m for m in r["curve"])]
      row["zero_adv_fraction"] = _mean_std(zero) if zero else None
      # Ground-truth entropy reduction of the policy's own searches (nats per answer token, from
      # before the first turn to after the last search), first WINDOW steps and last WINDOW.
      for name, window in (("first", slice(0, WINDOW)), ("last", slice(-WINDOW, None))):
        row[f"gt_entropy_reduction_{name}"] = _mean_std(
            [sum(m["gt_entropy_reduction"] for m in r["curve"][window])
             / len(r["curve"][window]) for r in rs])
      row["minutes"] = _mean_std([r.get("minutes", 0.0) for r in rs])
      # PPO's critic: how much of the returns' variance its values explain, as scored.
      if all("critic/explained_variance" in m for r in rs for m in r["curve"]):
        for name, window in (("first", slice(0, WINDOW)), ("last", slice(-WINDOW, None))):
          for key in ("explained_variance", "value_loss"):
            row[f"critic_{key}_{name}"] = _mean_std(
                [sum(m[f"critic/{key}"] for m in r["curve"][window]) / len(r["curve"][window])
                 for r in rs])
      table[size]["methods"][method] = row
  return table


def _pm(ms: tuple[float, float] | None, digits: int = 3, sign: str = "") -> str:
  if ms is None:
    return "—"
  spread = "" if math.isnan(ms[1]) else f" ± {ms[1]:.{digits}f}"  # one seed: no spread
  return f"{ms[0]:{sign}.{digits}f}{spread}"


def markdown(table: dict, steps: int, hardware: str) -> str:
  """The tables of results.md: one per model size, a row per method (mean ± std over seeds)."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    hops = sorted(st["dev"]["per_hop"])
    per_hop = {split: ", ".join(f"{h} {st[split]['per_hop'][h]:.3f}" for h in hops)
               for split in SPLITS}
    targets = ", ".join(f"seed {k} {v:.3f}" for k, v in sorted(t["target_train_f1"].items()))
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f} "
              f"({per_hop['dev']}), test F1 {st['test']['f1']:.3f} ({per_hop['test']}). "
              f"Target training F1 ({WINDOW}-step average): {targets}.", "",
              "| method | seeds | dev F1 | " + " | ".join(f"dev {h}" for h in hops)
              + " | test F1 | " + " | ".join(f"test {h}" for h in hops)
              + " | test gain vs SFT | steps to target | training F1 − GRPO (paired by step) "
              f"| outcome-collapse fraction | zero-advantage fraction | GT entropy reduction, "
              f"first {WINDOW} → last {WINDOW} steps |",
              "| --- " * (10 + 2 * len(hops)) + "|"]
    for method, r in t["methods"].items():
      hit = [s for s in r["steps_to_target"] if s is not None]
      steps_txt = (f"{sum(hit) / len(hit):.1f} ({len(hit)}/{r['seeds']} reached)" if hit
                   else f"not in {steps} (0/{r['seeds']})")
      lines.append(
          f"| {method} | {r['seeds']} | {_pm(r['dev_f1'])} | "
          + " | ".join(_pm(r[f"dev_{h}"]) for h in hops) + f" | {_pm(r['test_f1'])} | "
          + " | ".join(_pm(r[f"test_{h}"]) for h in hops)
          + f" | {_pm(r['test_gain'], sign='+')} | {steps_txt} | "
          f"{_pm(r['train_f1_minus_grpo'], sign='+')} | {_pm(r['collapse_fraction'])} | "
          f"{_pm(r['zero_adv_fraction'])} | "
          f"{r['gt_entropy_reduction_first'][0]:.3f} → {r['gt_entropy_reduction_last'][0]:.3f} |")
    lines.append("")
    if any("critic_explained_variance_first" in r for r in t["methods"].values()):
      lines += [f"The critics (mean ± std over seeds of each run's first / last {WINDOW} steps; "
                "explained variance of the returns by the values the batch was scored with):", "",
                f"| method | critic explained variance, first {WINDOW} → last {WINDOW} steps | "
                f"critic value loss, first {WINDOW} → last {WINDOW} steps |", "| --- " * 3 + "|"]
      for method, r in t["methods"].items():
        if "critic_explained_variance_first" in r:
          lines.append(f"| {method} | " + " | ".join(
              f"{_pm(r[f'critic_{k}_first'])} → {_pm(r[f'critic_{k}_last'])}"
              for k in ("explained_variance", "value_loss")) + " |")
      lines.append("")
  return "\n".join(lines)


IGPO_PANELS = (("f1", "f1_vs_step", "training F1"),
               ("f1_minus_grpo", "f1_minus_grpo_vs_step", "training F1 − GRPO, paired by step"),
               ("collapse_fraction", "collapse_vs_step", "outcome-collapse fraction"),
               ("gt_entropy_reduction", "gt_entropy_vs_step", "GT entropy reduction (nats)"))
CW_PANELS = (("f1", "f1_vs_step", "training F1"),
             ("em", "success_vs_step", "training success rate (EM)"))


def plot(study: dict, out: str, panels=IGPO_PANELS, title: str = "{size} model") -> list[str]:
  """One figure per (metric key, file name, label) of `panels` vs step (moving averages over full
  windows): the mean over seeds as a line, the min-max over seeds as a band. outcome_only's line
  lies under GRPO's (identical runs)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  paths = []
  for key, name, label in panels:
    fig, axes = plt.subplots(1, len(study), figsize=(6 * len(study), 4), squeeze=False)
    for ax, (size, s) in zip(axes[0], study.items()):
      grpo = _grpo_f1(s["runs"])
      for method, rs in s["runs"].items():
        if key == "f1_minus_grpo":  # the per-step question mix cancels out
          rs = [r for r in rs if r["seed"] in grpo]
          values = [[m["f1"] - g for m, g in zip(r["curve"], grpo[r["seed"]])] for r in rs]
        else:
          values = [[m[key] for m in r["curve"]] for r in rs]
        if not values:
          continue
        n = min(len(v) for v in values)
        curves = [_moving(v[:n])[WINDOW - 1:] for v in values]
        steps = [m["step"] for m in rs[0]["curve"][WINDOW - 1:n]]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(steps))]
        line, = ax.plot(steps, mean, label=f"{method} ({len(rs)} seeds)")
        ax.fill_between(steps, [min(c[i] for c in curves) for i in range(len(steps))],
                        [max(c[i] for c in curves) for i in range(len(steps))], alpha=0.15,
                        color=line.get_color())
      ax.set_title(title.format(size=size))
      ax.set_xlabel("RL step")
      ax.set_ylabel(f"{label}\n({WINDOW}-step moving average)")
      ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  return paths


# ============================================================================ CW-GRPO report



def _non_answer_rounds(m: dict) -> float:
  """A step's judged non-answer rounds: every judged trajectory also sends its answer round
  (judge.answer_round, the code's protocol), one a trajectory."""
  return m.get("judge/rounds", 0.0) - m.get("judge/trajectories", 0.0)


def _extra_rounds(m: dict) -> float:
  """sum over a step's judged trajectories of (K - 1), K its non-answer rounds: 0 when none has
  the K >= 2 rounds a Gini needs (trajectories with K = 0 aside)."""
  return max(_non_answer_rounds(m) - m.get("judge/trajectories", 0.0), 0.0)


# Per-step metrics of a CW-GRPO run averaged over its steps: (column, metrics.jsonl key, weight of
# a step or None). The contribution share is a mean over a step's judged non-answer rounds and the
# Gini a mean over its judged trajectories with K >= 2 non-answer rounds, each logged as 0 when it
# has nothing to average: they are averaged over steps weighted by what they average (the Gini by
# the proxy _extra_rounds), so such a step carries no weight. A method whose runs never log a key
# (GRPO) shows "—".
CW_STEP_METRICS = (("judge_calls", "judge/calls", None),
                   ("judge_calls_saved", "judge/calls_saved", None),
                   ("judge_failures", "judge/failures", None),
                   ("judged_trajectories", "judge/trajectories", None),
                   ("contribution_share", "judge/contribution_share", _non_answer_rounds),
                   ("gini", "judge/gini", _extra_rounds),
                   ("fallback_rate", "cw/fallback_rate", None))
# The paper's headline (abstract): CW-GRPO over GRPO; whether points or percent is not stated.
PAPER_CLAIMS = (("Qwen3-8B", 5.0), ("Qwen3-1.7B", 6.3))


def _step_mean(curve: list[dict], key: str, weight=None) -> float | None:
  """Mean of `key` over the steps that log it (a finite value), weighted by weight(step row) when
  given; None when no step logs it or every weight is 0."""
  rows = [m for m in curve if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
  ws = [weight(m) if weight else 1.0 for m in rows]
  total = sum(ws)
  return sum(w * m[key] for w, m in zip(ws, rows)) / total if total else None


def _vs_reference(reference: str, ref: dict, paired: list[dict]) -> dict:
  """A method's runs against the reference method's of the same seeds (`ref`: seed -> run):
  test F1 paired by question (points and the paired standard error) and training F1 paired by
  step."""
  from agentjax.data.demo_world import paired_gain
  per_seed = [paired_gain(ref[r["seed"]]["test"]["f1_by_id"], r["test"]["f1_by_id"])
              for r in paired]
  return {"reference": reference, "seeds": [r["seed"] for r in paired],
          "test_f1_points": [round(100 * d, 2) for d, _ in per_seed],
          "test_f1_stderr_points": [round(100 * e, 2) for _, e in per_seed],
          "train_f1_paired_by_step": _mean_std(
              [_paired_by_step(r, ref[r["seed"]], "f1") for r in paired])}


def _paired_by_step(r: dict, other: dict, key: str) -> float:
  """Mean over steps of r's training `key` minus `other`'s at the same step (same seed)."""
  return sum(m[key] - o[key] for m, o in zip(r["curve"], other["curve"])) / len(r["curve"])


def summarize_cw(study: dict) -> dict:
  """Per size and method of the CW-GRPO study: mean ± std over seeds of its figures, and the
  paper's comparison (each method against GRPO) as absolute points and relative %."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    grpo = {r["seed"]: r for r in runs.get("grpo", [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "acc", "per_hop")
                           if k in start[split]} for split in SPLITS},
         "methods": {}, "vs_grpo": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs), "judge": rs[0].get("judge")}
      if any(r.get("judge") != row["judge"] for r in rs):
        row["judge"] = [r.get("judge") for r in rs]  # seeds with different judges: say so
      for split in SPLITS:
        for k in ("f1", "acc"):
          row[f"{split}_{k}"] = _mean_std([r[split][k] for r in rs])
        gains = [paired_gain(start[split]["f1_by_id"], r[split]["f1_by_id"]) for r in rs]
        row[f"{split}_gain"] = _mean_std([g for g, _ in gains])
        row[f"{split}_acc_gain"] = _mean_std([r[split]["acc"] - start[split]["acc"] for r in rs])
      paired = [r for r in rs if r["seed"] in grpo]
      for key in ("f1", "em"):
        row[f"train_{key}_minus_grpo"] = _mean_std(
            [_paired_by_step(r, grpo[r["seed"]], key) for r in paired]) if paired else None
      for column, key, weight in CW_STEP_METRICS:
        per_run = [_step_mean(r["curve"], key, weight) for r in rs]
        per_run = [x for x in per_run if x is not None]
        row[column] = _mean_std(per_run) if per_run else None
      # Non-answer rounds per judged trajectory, pooled over a run's steps (what a Gini sees).
      per_run = [sum(map(_non_answer_rounds, r["curve"]))
                 / sum(m["judge/trajectories"] for m in r["curve"]) for r in rs
                 if sum(m.get("judge/trajectories", 0.0) for m in r["curve"])]
      row["rounds_per_judged_trajectory"] = _mean_std(per_run) if per_run else None
      row["minutes"] = _mean_std([r.get("minutes", 0.0) for r in rs])
      t["methods"][method] = row
      if method == "grpo" or not paired:
        continue
      # The paper's delta, both readings: absolute points (x100) and relative % of GRPO, of the
      # seed means; per seed, the paired per-question test difference (same questions).
      vs = {}
      for k in ("acc", "f1"):
        ours = row[f"test_{k}"][0]
        base = _mean_std([r["test"][k] for r in grpo.values()])[0]
        per_seed = [r["test"][k] - grpo[r["seed"]]["test"][k] for r in paired]
        vs[k] = {"ours": ours, "grpo": base, "points": 100 * (ours - base),
                 "relative_pct": 100 * (ours - base) / base if base else float("nan"),
                 "per_seed_points": [round(100 * d, 2) for d in per_seed],
                 "seeds_ahead": sum(d > 0 for d in per_seed), "seeds": len(per_seed)}
      vs["f1"]["per_seed_paired_stderr"] = [
          round(paired_gain(grpo[r["seed"]]["test"]["f1_by_id"], r["test"]["f1_by_id"])[1], 4)
          for r in paired]
      t["vs_grpo"][method] = vs
    table[size] = t
  return table


def _cell(ms, digits: int = 3, sign: str = "") -> str:
  return "—" if ms is None else _pm(ms, digits, sign)


def markdown_cw(table: dict, steps: int, hardware: str) -> str:
  """results.md of the CW-GRPO study: the method table and the paper's claim beside ours."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, accuracy (EM > 0) "
              f"{st['dev'].get('acc', st['dev']['em']):.3f}; test F1 {st['test']['f1']:.3f}, "
              f"accuracy {st['test'].get('acc', st['test']['em']):.3f}. {steps} RL steps; mean ± "
              f"sample std over seeds.", "",
              "| method | seeds | dev F1 | dev accuracy | test F1 | test accuracy | test F1 gain "
              "vs SFT (paired) | test accuracy gain vs SFT | training F1 − GRPO (paired by step) | "
              "training success − GRPO (paired by step) | judge calls / step | calls saved / step "
              "| judged trajectories / step | non-answer rounds / judged trajectory | "
              "contribution share | Gini of contributions | all-zero fallback rate | minutes |",
              "| --- " * 18 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {r['seeds']} | {_pm(r['dev_f1'])} | {_pm(r['dev_acc'])} | "
          f"{_pm(r['test_f1'])} | {_pm(r['test_acc'])} | {_pm(r['test_gain'], sign='+')} | "
          f"{_pm(r['test_acc_gain'], sign='+')} | {_cell(r['train_f1_minus_grpo'], sign='+')} | "
          f"{_cell(r['train_em_minus_grpo'], sign='+')} | {_cell(r['judge_calls'], 1)} | "
          f"{_cell(r['judge_calls_saved'], 1)} | {_cell(r['judged_trajectories'], 1)} | "
          f"{_cell(r['rounds_per_judged_trajectory'], 2)} | {_cell(r['contribution_share'])} | "
          f"{_cell(r['gini'])} | {_cell(r['fallback_rate'])} | {_pm(r['minutes'], 1)} |")
    judges = {m: r["judge"] for m, r in t["methods"].items()}
    lines += ["", "Judges (agentjax.judge.judge_identity, from every run's result.json): "
              + "; ".join(f"{m}: {json.dumps(j, sort_keys=True)}" for m, j in judges.items()), ""]
    if t["vs_grpo"]:
      lines += ["#### The paper's claim beside ours", "",
                "The paper: CW-GRPO over GRPO, "
                + ", ".join(f"+{v} on {m}" for m, v in PAPER_CLAIMS)
                + " (points or percent not stated). Ours: test split, the seed means; points = "
                "100 × (method − GRPO), relative = (method − GRPO) / GRPO. Per seed: the paired "
                "difference with GRPO's run of the same seed, in points.", "",
                "| method | test accuracy (GRPO) | Δ accuracy, points | Δ accuracy, relative | "
                "per seed (points) | test F1 (GRPO) | Δ F1, points | Δ F1, relative | per seed "
                "(points) |", "| --- " * 9 + "|"]
      for method, vs in t["vs_grpo"].items():
        cells = []
        for k in ("acc", "f1"):
          v = vs[k]
          rel = "—" if math.isnan(v["relative_pct"]) else f"{v['relative_pct']:+.1f}%"
          cells += [f"{v['ours']:.3f} ({v['grpo']:.3f})", f"{v['points']:+.1f}", rel,
                    ", ".join(f"{d:+.1f}" for d in v["per_seed_points"])
                    + f" ({v['seeds_ahead']}/{v['seeds']} ahead)"]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
      lines += ["", "| paper | backbone | claim over GRPO |", "| --- | --- | --- |"]
      lines += [f"| CW-GRPO | {m} | +{v} (points or percent not stated) |"
                for m, v in PAPER_CLAIMS]
      lines.append("")
  return "\n".join(lines)


# ============================================================================ LoRA report


def _step_seconds(curve: list[dict]) -> tuple[float, float]:
  """(mean step_s over every step, mean over steps 2..n): step 1 holds the first compiles."""
  s = [m["step_s"] for m in curve]
  return sum(s) / len(s), sum(s[1:]) / max(len(s) - 1, 1)


def summarize_lora(study: dict, reference: str = "full_ft") -> dict:
  """Per size and method of the LoRA study: mean ± std over seeds of dev/test F1 (per hop), the
  test gain over the SFT start, step time and memory; and each method against `reference` (full
  fine-tuning) seed by seed: the paired per-question test F1 difference and its standard error
  (same questions), and the training F1 difference paired by step (same questions a step)."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    ref = {r["seed"]: r for r in runs.get(reference, [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "per_hop")}
                   for split in SPLITS}, "methods": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs), "overrides": rs[0].get("overrides")}
      for split in SPLITS:
        row[f"{split}_f1"] = _mean_std([r[split]["f1"] for r in rs])
        for hop in rs[0][split]["per_hop"]:
          row[f"{split}_{hop}"] = _mean_std([r[split]["per_hop"][hop] for r in rs])
        row[f"{split}_gain"] = _mean_std(
            [paired_gain(start[split]["f1_by_id"], r[split]["f1_by_id"])[0] for r in rs])
      steps = [_step_seconds(r["curve"]) for r in rs]
      row["step_s"] = _mean_std([a for a, _ in steps])
      row["step_s_after_first"] = _mean_std([b for _, b in steps])
      row["minutes"] = _mean_std([r.get("minutes", 0.0) for r in rs])
      if all("peak_rss_mib" in r for r in rs):
        row["peak_rss_mib"] = _mean_std([r["peak_rss_mib"] for r in rs])
      if all("train_state" in r for r in rs):
        row["train_state"] = rs[0]["train_state"]  # the same arrays for every seed
        row["checkpoint_bytes"] = [r.get("checkpoint_bytes") for r in rs]
      paired = [r for r in rs if r["seed"] in ref]
      if method != reference and paired:
        row["vs_reference"] = dict(
            _vs_reference(reference, ref, paired),
            dev_f1_points=[round(100 * (r["dev"]["f1"] - ref[r["seed"]]["dev"]["f1"]), 2)
                           for r in paired])
      t["methods"][method] = row
    table[size] = t
  return table


def _mib(n: float) -> str:
  return f"{n / 2**20:.1f} MiB"


def markdown_lora(table: dict, steps: int, hardware: str) -> str:
  """results.md of the LoRA study: F1 table, the paired comparison with full fine-tuning, and
  step time and memory."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    hops = sorted(st["dev"]["per_hop"])
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, test F1 "
              f"{st['test']['f1']:.3f}. IGPO, {steps} RL steps; mean ± sample std over seeds.", "",
              "| method | seeds | dev F1 | " + " | ".join(f"dev {h}" for h in hops)
              + " | test F1 | " + " | ".join(f"test {h}" for h in hops)
              + " | test gain vs SFT |", "| --- " * (5 + 2 * len(hops)) + "|"]
    for method, r in t["methods"].items():
      lines.append(f"| {method} | {r['seeds']} | {_pm(r['dev_f1'])} | "
                   + " | ".join(_pm(r[f"dev_{h}"]) for h in hops) + f" | {_pm(r['test_f1'])} | "
                   + " | ".join(_pm(r[f"test_{h}"]) for h in hops)
                   + f" | {_pm(r['test_gain'], sign='+')} |")
    vs = {m: r["vs_reference"] for m, r in t["methods"].items() if "vs_reference" in r}
    if vs:
      lines += ["", "Against full fine-tuning, seed by seed (same seed: same training questions; "
                "test: the same 500 questions, paired per question, ± its standard error):", "",
                "| method | seeds | Δ test F1 per seed, points | Δ dev F1 per seed, points | "
                "training F1 − full_ft (paired by step) |", "| --- " * 5 + "|"]
      for m, v in vs.items():
        cells = ", ".join(f"{d:+.1f} ± {e:.1f}" for d, e in
                          zip(v["test_f1_points"], v["test_f1_stderr_points"]))
        lines.append(f"| {m} | {', '.join(v['seeds'])} | {cells} | "
                     + ", ".join(f"{d:+.1f}" for d in v["dev_f1_points"])
                     + f" | {_pm(v['train_f1_paired_by_step'], sign='+')} |")
    lines += ["", "Cost (step_s: the trainer's seconds per RL step, metrics.jsonl; peak RSS: "
              "ru_maxrss of the run's process, which also loads the model and runs both evals; "
              "train state: bytes of the trained params + optimizer state from the arrays, "
              "float32):", "",
              "| method | step s (all steps) | step s (steps 2+) | minutes a run | peak RSS "
              "| trained params | trained params bytes | optimizer state bytes | train state "
              "(params + optimizer) | frozen backbone | checkpoint on disk |",
              "| --- " * 11 + "|"]
    for method, r in t["methods"].items():
      ts = r.get("train_state")
      mem = ["—"] * 6
      if ts:
        disk = [b for b in r["checkpoint_bytes"] if b is not None]
        mem = [f"{ts['trained_params']:,}", _mib(ts["trained_bytes"]),
               _mib(ts["opt_state_bytes"]), _mib(ts["trained_bytes"] + ts["opt_state_bytes"]),
               _mib(ts["frozen_bytes"]) if ts["frozen_bytes"] else "— (trained)",
               _mib(sum(disk) / len(disk)) if disk else "—"]
      rss = f"{_pm(r['peak_rss_mib'], 0)} MiB" if "peak_rss_mib" in r else "—"
      lines.append(f"| {method} | {_pm(r['step_s'], 2)} | {_pm(r['step_s_after_first'], 2)} | "
                   f"{_pm(r['minutes'], 1)} | {rss} | " + " | ".join(mem) + " |")
    lines.append("")
  return "\n".join(lines)


LORA_PANELS = (("f1", "f1_vs_step", "training F1"),)


# ============================================================================ DAC report

# The monolithic baseline every method is paired with; the alpha ablation's methods by alpha.
DAC_REFERENCE = "grpo_full"
DAC_ALPHAS = (("dac_alpha0.1", 0.1), ("dac", 0.3), ("dac_alpha0.5", 0.5))
# Per split of result.json: (column, key); precision and recall only exist for an agent that
# abstains (DAC), and "—" is shown for the others.
DAC_SPLIT_KEYS = ("f1", "em", "coverage", "accuracy_answered", "abstain_rate",
                  "abstain_precision", "abstain_recall")
# Training metrics (metrics.jsonl) averaged over a run's last WINDOW steps.
DAC_TRAIN_KEYS = (("train_f1", "f1"), ("sufficiency_rate", "sufficiency_rate"),
                  ("train_abstain_rate", "dac/abstain_rate"),
                  ("train_abstain_precision", "dac/abstain_precision"),
                  ("train_abstain_recall", "dac/abstain_recall"),
                  ("searcher_reward", "dac/searcher_reward"),
                  ("generator_reward", "dac/generator_reward"))
AUG_KEYS = ("accuracy_clean", "accuracy_augmented", "accuracy_drop", "abstain_rate_clean",
            "abstain_rate_augmented", "n_augmented_sufficient", "consistency")


def _ms(xs: list) -> tuple[float, float] | None:
  """Mean ± sample std of the values that exist (None when none does)."""
  xs = [x for x in xs if x is not None]
  return _mean_std(xs) if xs else None


def insufficient_share(split: dict) -> float | None:
  """P(S = 0) of a split's evidence sets from its abstention figures: P(abstained and S = 0) /
  P(abstained | S = 0) = rate * precision / recall (None without abstentions): the precision a
  generator abstaining at random would have."""
  rate, recall = split.get("abstain_rate"), split.get("abstain_recall")
  if not rate or not recall or split.get("abstain_precision") is None:
    return None
  return rate * split["abstain_precision"] / recall


def _last_mean(curve: list[dict], key: str, w: int = WINDOW) -> float | None:
  """Mean of `key` over the last w steps that log it (None: never logged)."""
  xs = [m[key] for m in curve if key in m][-w:]
  return sum(xs) / len(xs) if xs else None


def _dac_train_accuracy(curve: list[dict]) -> dict[str, float | None]:
  """The generator's training accuracy on sufficient evidence sets without / with distractors,
  over every step, each step weighted by its share of such sets (dac/accuracy_* is a per-step
  share, logged 0 when the step has no such set): clean sets ~ dac/sufficiency_rate -
  dac/augmented_rate (augmented sets are sufficient), augmented ~ dac/augmented_rate."""
  clean = lambda m: max(m["dac/sufficiency_rate"] - m["dac/augmented_rate"], 0.0)  # noqa: E731
  if not all("dac/augmented_rate" in m for m in curve):
    return {"accuracy_clean": None, "accuracy_augmented": None}
  return {"accuracy_clean": _step_mean(curve, "dac/accuracy_clean", clean),
          "accuracy_augmented": _step_mean(curve, "dac/accuracy_augmented",
                                           lambda m: m["dac/augmented_rate"])}


def summarize_dac(study: dict, dac_start: dict | None = None,
                  reference: str = DAC_REFERENCE) -> dict:
  """Per size and method of DAC's study: mean ± sample std over seeds of dev and test F1 / EM
  (an abstention is wrong), coverage, accuracy when answered, abstention rate, precision and
  recall against S = 0; training figures over the last WINDOW steps (F1, the sufficiency rate of
  the searcher's retrieved documents, abstention); the sufficiency rate's rise (last WINDOW steps
  minus first WINDOW); the generator's training accuracy on clean / augmented sufficient sets;
  the augmentation check of each DAC run (augmentation_summary); each method against `reference`
  seed by seed (paired per-question test F1 difference ± its standard error, training F1
  paired by step); and the alpha ablation (DAC_ALPHAS). dac_start: the DAC agent's eval before
  RL ({"dev", "test"}), reported as is."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    ref = {r["seed"]: r for r in runs.get(reference, [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "acc") if k in start[split]}
                   for split in SPLITS}, "methods": {}, "alpha": []}
    if dac_start:
      t["dac_start"] = {split: {**{k: dac_start[split].get(k) for k in DAC_SPLIT_KEYS},
                                "insufficient": insufficient_share(dac_start[split])}
                        for split in SPLITS}
    for method, rs in runs.items():
      row = {"seeds": len(rs), "overrides": rs[0].get("overrides")}
      for split in SPLITS:
        for k in DAC_SPLIT_KEYS:
          row[f"{split}_{k}"] = _ms([r[split].get(k) for r in rs])
        row[f"{split}_insufficient"] = _ms([insufficient_share(r[split]) for r in rs])
        # (the start's questions that the run was evaluated on: all of them but in smoke tests)
        row[f"{split}_gain"] = _ms([paired_gain(
            {q: f for q, f in start[split]["f1_by_id"].items() if q in r[split]["f1_by_id"]},
            r[split]["f1_by_id"])[0] for r in rs])
      for column, key in DAC_TRAIN_KEYS:
        row[column] = _ms([_last_mean(r["curve"], key) for r in rs])
      rise = [_last_mean(r["curve"], "sufficiency_rate")
              - sum(m["sufficiency_rate"] for m in r["curve"][:WINDOW]) / WINDOW
              for r in rs if all("sufficiency_rate" in m for m in r["curve"])]
      row["sufficiency_rise"] = _ms(rise)
      accs = [_dac_train_accuracy(r["curve"]) for r in rs]
      for k in ("accuracy_clean", "accuracy_augmented"):
        row[f"train_{k}"] = _ms([a[k] for a in accs])
      checks = [r["augmentation_check"] for r in rs if r.get("augmentation_check")]
      if checks:
        row["augmentation_check"] = {k: _ms([c[k] for c in checks]) for k in AUG_KEYS}
        row["augmentation_check"]["per_seed"] = checks
      row["step_s"] = _mean_std([_step_seconds(r["curve"])[1] for r in rs])
      row["minutes"] = _mean_std([r.get("minutes", 0.0) for r in rs])
      paired = [r for r in rs if r["seed"] in ref]
      if method != reference and paired:
        vs = _vs_reference(reference, ref, paired)
        row["vs_reference"] = dict(
            vs, seeds_ahead=sum(d > 0 for d in vs["test_f1_points"]),
            sufficiency_paired_by_step=_ms(
                [_paired_by_step(r, ref[r["seed"]], "sufficiency_rate") for r in paired
                 if all("sufficiency_rate" in m for m in r["curve"] + ref[r["seed"]]["curve"])]))
      t["methods"][method] = row
    for method, alpha in DAC_ALPHAS:
      if method in t["methods"]:
        r = t["methods"][method]
        t["alpha"].append({"alpha": alpha, "method": method, "seeds": r["seeds"],
                           **{k: r[k] for k in ("dev_abstain_rate", "dev_abstain_precision",
                                                "dev_insufficient",
                                                "dev_abstain_recall", "dev_coverage",
                                                "dev_accuracy_answered", "test_abstain_rate",
                                                "test_abstain_precision", "test_abstain_recall",
                                                "test_f1", "train_abstain_rate")}})
    table[size] = t
  return table


def _pct(ms, digits: int = 1) -> str:
  """A share as percent, mean ± std ("—" when absent)."""
  if ms is None:
    return "—"
  return _pm((100 * ms[0], 100 * ms[1]), digits)


def _num(x: float | None, digits: int = 3) -> str:
  return "—" if x is None else f"{x:.{digits}f}"


def markdown_dac(table: dict, steps: int, hardware: str) -> str:
  """results.md of DAC's study: the method table (dev and test), training figures, the paired
  comparison with full fine-tuning, the alpha ablation and the augmentation check."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (monolithic, greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, EM "
              f"{st['dev']['em']:.3f}; test F1 {st['test']['f1']:.3f}, EM "
              f"{st['test']['em']:.3f}."]
    if "dac_start" in t:
      d = t["dac_start"]
      lines.append(
          "DAC before RL (searcher = the SFT model, its adapter at B = 0; generator = the warm "
          f"start): dev F1 {d['dev']['f1']:.3f} (coverage {d['dev']['coverage']:.3f}, abstention "
          f"{d['dev']['abstain_rate']:.3f}, precision {d['dev']['abstain_precision']:.3f} "
          f"against P(S = 0) = {_num(d['dev']['insufficient'])}"
          f", recall {d['dev']['abstain_recall']:.3f}); test F1 {d['test']['f1']:.3f} (coverage "
          f"{d['test']['coverage']:.3f}, abstention {d['test']['abstain_rate']:.3f}).")
    lines += ["", f"{steps} RL steps; mean ± sample std over seeds; whole dev and test splits "
              "(500 questions each), greedy. An abstention counts as wrong in F1 and EM. Coverage: "
              "share of questions answered (not abstained, not invalid); accuracy when answered: "
              "EM > 0 among those. Abstention precision P(S = 0 | abstained) and recall "
              "P(abstained | S = 0), S the sufficiency of the evidence the generator was shown.",
              "", "| method | seeds | dev F1 | dev EM | test F1 | test EM | test F1 gain vs SFT "
              "(paired) | coverage (test) | accuracy when answered (test) | abstention rate "
              "(test) | abstention precision (test) | abstention recall (test) |",
              "| --- " * 12 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {r['seeds']} | {_pm(r['dev_f1'])} | {_pm(r['dev_em'])} | "
          f"{_pm(r['test_f1'])} | {_pm(r['test_em'])} | {_cell(r['test_gain'], sign='+')} | "
          f"{_cell(r['test_coverage'])} | {_cell(r['test_accuracy_answered'])} | "
          f"{_cell(r['test_abstain_rate'])} | {_cell(r['test_abstain_precision'])} | "
          f"{_cell(r['test_abstain_recall'])} |")
    lines += ["", "Dev split, abstention (DAC methods):", "",
              "| method | dev coverage | dev accuracy when answered | dev abstention rate | dev "
              "abstention precision | P(S = 0) (a random abstainer's precision) | dev abstention "
              "recall |", "| --- " * 7 + "|"]
    for method, r in t["methods"].items():
      if r["dev_abstain_precision"] is not None:
        lines.append(f"| {method} | {_cell(r['dev_coverage'])} | "
                     f"{_cell(r['dev_accuracy_answered'])} | {_cell(r['dev_abstain_rate'])} | "
                     f"{_cell(r['dev_abstain_precision'])} | {_cell(r['dev_insufficient'])} | "
                     f"{_cell(r['dev_abstain_recall'])} |")
    lines += ["", f"Training (metrics.jsonl; \"last {WINDOW}\": the mean over the last {WINDOW} "
              "steps). Training F1: of the trajectories' answers (monolithic) or of the "
              "generator's answers (DAC, m per evidence set), abstentions 0. Sufficiency rate: "
              "the share of searcher trajectories whose retrieved documents hold a gold answer "
              f"(every retrieved document; rise: last {WINDOW} steps minus first {WINDOW}). "
              "Generator accuracy on sufficient sets, clean / with distractors: over all steps, "
              "each step weighted by its number of such sets.", "",
              f"| method | training F1 (last {WINDOW}) | sufficiency rate (last {WINDOW}) | "
              "sufficiency rise | abstention rate (last 5) | abstention precision (last 5) | "
              "abstention recall (last 5) | generator accuracy, clean sufficient sets | "
              "generator accuracy, augmented sets | step s (steps 2+) | minutes a run |",
              "| --- " * 11 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {_cell(r['train_f1'])} | {_cell(r['sufficiency_rate'])} | "
          f"{_cell(r['sufficiency_rise'], sign='+')} | {_cell(r['train_abstain_rate'])} | "
          f"{_cell(r['train_abstain_precision'])} | {_cell(r['train_abstain_recall'])} | "
          f"{_cell(r['train_accuracy_clean'])} | {_cell(r['train_accuracy_augmented'])} | "
          f"{_pm(r['step_s'], 1)} | {_pm(r['minutes'], 1)} |")
    vs = {m: r["vs_reference"] for m, r in t["methods"].items() if "vs_reference" in r}
    if vs:
      lines += ["", f"Against {DAC_REFERENCE} (monolithic, full fine-tuning), seed by seed (same "
                "seed: same training questions at every step; test: the same 500 questions, "
                "paired per question, ± its standard error):", "",
                "| method | seeds | Δ test F1 per seed, points | seeds ahead | training F1 − "
                f"{DAC_REFERENCE} (paired by step) | sufficiency rate − {DAC_REFERENCE} (paired "
                "by step) |", "| --- " * 6 + "|"]
      for m, v in vs.items():
        cells = ", ".join(f"{d:+.1f} ± {e:.1f}" for d, e in
                          zip(v["test_f1_points"], v["test_f1_stderr_points"]))
        lines.append(f"| {m} | {', '.join(v['seeds'])} | {cells} | {v['seeds_ahead']}/"
                     f"{len(v['seeds'])} | {_pm(v['train_f1_paired_by_step'], sign='+')} | "
                     f"{_cell(v['sufficiency_paired_by_step'], sign='+')} |")
    if t["alpha"]:
      lines += ["", "The α ablation (generator reward α for abstaining on insufficient evidence; "
                "the paper's trade-off predicts more abstention as α rises):", "",
                "| α | method | seeds | dev abstention rate | dev precision | dev P(S = 0) | dev "
                "recall | dev "
                "coverage | dev accuracy when answered | test abstention rate | test precision | "
                "test recall | test F1 | training abstention rate (last 5) |",
                "| --- " * 14 + "|"]
      for a in t["alpha"]:
        lines.append(
            f"| {a['alpha']:g} | {a['method']} | {a['seeds']} | {_cell(a['dev_abstain_rate'])} | "
            f"{_cell(a['dev_abstain_precision'])} | {_cell(a['dev_insufficient'])} | "
            f"{_cell(a['dev_abstain_recall'])} | "
            f"{_cell(a['dev_coverage'])} | {_cell(a['dev_accuracy_answered'])} | "
            f"{_cell(a['test_abstain_rate'])} | {_cell(a['test_abstain_precision'])} | "
            f"{_cell(a['test_abstain_recall'])} | {_cell(a['test_f1'])} | "
            f"{_cell(a['train_abstain_rate'])} |")
    checks = {m: r["augmentation_check"] for m, r in t["methods"].items()
              if "augmentation_check" in r}
    if checks:
      lines += ["", "The augmentation check (each DAC run's final searcher and generator, greedy, "
                "dev questions): on the questions whose evidence is sufficient and got hard "
                "distractors (augment_k answer-free retriever hits for the searcher's own "
                "queries, shuffled in), the generator's accuracy (EM > 0) and abstention rate "
                "with the distractors vs on the same evidence clean (the final dev eval: same "
                "searcher trajectories). Consistency: the share of the other questions whose "
                "answer equals the clean eval's (1 = the two passes saw the same trajectories).",
                "", "| method | questions checked | accuracy clean | accuracy with distractors | "
                "drop (clean − augmented) | abstention clean | abstention with distractors | "
                "consistency |", "| --- " * 8 + "|"]
      for m, c in checks.items():
        lines.append(
            f"| {m} | {_cell(c['n_augmented_sufficient'], 0)} | {_cell(c['accuracy_clean'])} | "
            f"{_cell(c['accuracy_augmented'])} | {_cell(c['accuracy_drop'], sign='+')} | "
            f"{_cell(c['abstain_rate_clean'])} | {_cell(c['abstain_rate_augmented'])} | "
            f"{_cell(c['consistency'])} |")
    lines.append("")
  return "\n".join(lines)


# (metric key, file name, label, methods plotted: None = every method that logs the key)
DAC_PANELS = (("f1", "f1_vs_step", "training F1", None),
              ("sufficiency_rate", "sufficiency_vs_step", "sufficiency rate of retrieved docs",
               ("grpo_full", "grpo_lora", "dac", "dac_sufficient_only", "dac_no_aug")),
              ("dac/abstain_rate", "abstain_vs_step", "training abstention rate",
               tuple(m for m, _ in DAC_ALPHAS)))


def plot_dac(study: dict, out: str) -> list[str]:
  """DAC_PANELS vs step ({WINDOW}-step moving averages over full windows): the mean over seeds as
  a line, the min-max over seeds as a band; a method whose runs do not log the key is left out."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  paths = []
  for key, name, label, methods in DAC_PANELS:
    fig, axes = plt.subplots(1, len(study), figsize=(7 * len(study), 4.5), squeeze=False)
    for ax, (size, s) in zip(axes[0], study.items()):
      for method, rs in s["runs"].items():
        if methods is not None and method not in methods:
          continue
        values = [[m[key] for m in r["curve"]] for r in rs
                  if all(key in m for m in r["curve"])]
        if not values or min(len(v) for v in values) < WINDOW:
          continue
        n = min(len(v) for v in values)
        curves = [_moving(v[:n])[WINDOW - 1:] for v in values]
        steps = [m["step"] for m in rs[0]["curve"][WINDOW - 1:n]]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(steps))]
        style = "--" if method.startswith("grpo") else "-"
        line, = ax.plot(steps, mean, style, label=f"{method} ({len(values)} seeds)")
        ax.fill_between(steps, [min(c[i] for c in curves) for i in range(len(steps))],
                        [max(c[i] for c in curves) for i in range(len(steps))], alpha=0.15,
                        color=line.get_color())
      ax.set_title(f"{size} model: mean over seeds, band min-max over seeds")
      ax.set_xlabel("RL step")
      ax.set_ylabel(f"{label}\n({WINDOW}-step moving average)")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  return paths


def _hardware() -> str:
  if _HARDWARE.value:
    return _HARDWARE.value
  import platform
  where = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
  if _PIN.value:
    where += f", {_WORKERS.value} run(s) at a time, each on one core"
  return where


def _no_nan(obj):
  """JSON has no NaN: a one-seed std is written as null."""
  if isinstance(obj, dict):
    return {k: _no_nan(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_no_nan(v) for v in obj]
  return None if isinstance(obj, float) and math.isnan(obj) else obj


def report() -> None:
  root, out = _root(), _out()
  study = collect(root, _sizes(), _methods(), _SEEDS.value, _STEPS.value)
  if not study:
    raise SystemExit(f"no finished size under {root} (run without --report_only first)")
  os.makedirs(out, exist_ok=True)
  if _STUDY.value == "cw_grpo":
    table = summarize_cw(study)
    text = markdown_cw(table, _STEPS.value, _hardware())
    saved = {"study": "cw_grpo", "steps": _STEPS.value, "hardware": _hardware(),
             "seed_band": "min-max over seeds", "paper_claims": dict(PAPER_CLAIMS),
             "table": table}
    panels, title = CW_PANELS, "{size} model: mean over seeds, band min-max over seeds"
  elif _STUDY.value == "lora":
    table = summarize_lora(study)
    text = markdown_lora(table, _STEPS.value, _hardware())
    saved = {"study": "lora", "steps": _STEPS.value, "hardware": _hardware(),
             "lora": {"rank": LORA_RANK, "alpha": float(LORA_RANK), "lr": LORA_LR},
             "seed_band": "min-max over seeds", "table": table}
    panels, title = LORA_PANELS, "{size} model, IGPO (mean over seeds; band: min-max)"
  elif _STUDY.value == "dac":
    dac_start = {size: _read_json(result_path(root, f"{size}/{DAC_START}/0")) for size in study}
    table = {size: summarize_dac({size: s}, dac_start[size])[size] for size, s in study.items()}
    text = markdown_dac(table, _STEPS.value, _hardware())
    saved = {"study": "dac", "steps": _STEPS.value, "hardware": _hardware(),
             "methods": {m: {"config": f"configs/{c}.py:demo", "overrides": o}
                         for m, (c, o) in DAC_METHODS.items()},
             "generator_sft": {size: _read_json(result_path(root, f"{size}/{GENERATOR_SFT}/0"))
                               for size in study},
             "seed_band": "min-max over seeds", "table": table}
    with open(os.path.join(out, "results.md"), "w") as f:
      f.write(text)
    _write(os.path.join(out, "results.json"), _no_nan(saved))
    paths = plot_dac(study, out)
    _say(text)
    _say(f"written: {os.path.join(out, 'results.md')}, results.json, "
         + ", ".join(os.path.basename(p) for p in paths))
    return
  else:
    table = summarize(study, _TARGET.value)
    text = markdown(table, _STEPS.value, _hardware())
    saved = {"steps": _STEPS.value, "hardware": _hardware(), "target_gain": _TARGET.value,
             "table": table}
    panels, title = IGPO_PANELS, "{size} model"
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(text)
  _write(os.path.join(out, "results.json"), _no_nan(saved))
  paths = plot(study, out, panels, title)
  _say(text)
  _say(f"written: {os.path.join(out, 'results.md')}, results.json, "
       + ", ".join(os.path.basename(p) for p in paths))
  _say(json.dumps({"compare": {size: {m: round(r["test_f1"][0], 4)
                                      for m, r in t["methods"].items()}
                               for size, t in table.items()}}))


def main(_):
  if _RUN.value:  # a run's log shows its steps (the trainer logs one line per step at INFO)
    logging.getLogger().setLevel(logging.INFO)
    run_one(_root(), _RUN.value, _STEPS.value, _STUDY.value, _EVAL_SIZE.value,
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


if __name__ == "__main__":
  app.run(main)
