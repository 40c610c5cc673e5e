r"""The Co-ReAct study on SynthWorld (ours: the claims of Co-ReAct, arXiv:2605.23590, abstract and
Fig. 3-4, tested at CPU scale): branch points, the rubric generator's warm start and its GRPO
under three ranking rewards, and rubric-guided agents.

    python launch/coreact_study.py                    # every stage, then the report
    python launch/coreact_study.py --stage=grpo       # one stage (its inputs must exist)
    python launch/coreact_study.py --report_only      # tables + plots from the finished runs
    # SynthWorld v2 and the research backbone shipped in the repository: the
    # research settings (coreact.RESEARCH_DEFAULTS: runs/research/coreact, Monte-Carlo branch
    # values, ...), each finished job's record kept in docs/results/coreact_research/runs and
    # committed as it ends; the report from those records alone
    python launch/coreact_study.py --family=research --commit_records
    python launch/coreact_study.py --family=research --report_only

Everything runs from the `make demo` world, BM25 index and SFT agent (--world=runs/demo:
synthworld/, tfds/, bm25_index/, sft/hf_export) into --root (runs/coreact), each run a subprocess
of the repo's own launchers (the command is in its log, {root}/logs/<spec>.log):

  collect  launch/collect_branches.py (configs/coreact.py:collect): branch points from
           --train_questions SynthWorld train questions and --dev_questions dev questions (the
           held-out rows), seed --collect_seed -> {root}/branches_{train,dev}.jsonl
  sft      launch/coreact_demos.py -> {root}/rubric_demos.jsonl, then launch/train.py
           (configs/coreact.py:rubric_sft) -> {root}/rubric_sft: the warm start; its
           hf_export is the "untrained" rubric generator
  grpo     launch/train.py (configs/coreact.py:demo) with coreact.rank_reward = listwise |
           pairwise | top1, seeds --seeds, --steps steps (held-out eval every 10 incl. step 0)
           -> {root}/{reward}/seed{s}
  guided   launch/eval.py (configs/coreact.py:agent, the demo SFT agent sampled at 0.7) on
           --eval_size SynthWorld test questions, agent seeds --seeds, for each of VARIANTS
           -> {root}/guided/{variant}/seed{s}.json
  report   --out (docs/results/coreact): results.md, results.json, spearman_vs_step.png,
           guided_f1.png (README.md is written by hand around results.md's tables)

A stage's run is skipped when its outputs exist (re-running resumes: the trainers resume from
their checkpoints); each run is claimed with a file lock under {root}/claims (the sweep's claims,
as launch/compare.py's), so several coreact_study.py processes can share the work. At most
--workers runs at once, worker k pinned to core first_core + k (--pin_cores). A run waits for its
inputs (the trained generator of its seed, ...), so `--stage=all` overlaps stages where it can.

The study's jobs, scheduler and report: agentjax/studies/coreact.py; the sweep's flags it shares
(--root --out --seeds --steps --workers --pin_cores ...): agentjax/studies/sweep.py.
"""

from __future__ import annotations

import difflib
import logging
import os

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.studies import sweep  # the sweep's flags: --root --out --seeds --steps --workers ...
from agentjax.studies.coreact import (DEMO_VARIANTS, FAMILIES, RESEARCH_DEFAULTS, REWARDS,
                                      STAGES, VARIANTS, Settings, jobs, prepare_world, report,
                                      schedule)

FLAGS = flags.FLAGS

_STAGE = flags.DEFINE_enum("stage", "all", ("all",) + STAGES, "Which stage to run (all: every "
                           "stage whose inputs are ready, then the report).")
_WORLD = flags.DEFINE_string("world", "runs/demo", "The `make demo` folder: synthworld/, tfds/, "
                             "bm25_index/ and the SFT agent sft/hf_export.")
_FAMILY = flags.DEFINE_enum("family", "demo", FAMILIES, "demo: the `make demo` world and agent "
                            "(configs/coreact.py's demo presets); research: SynthWorld v2 and "
                            "the research backbone in --world (launch/backbone.py's --root), "
                            "the research_* presets.")
_JUDGE = flags.DEFINE_string("judge_backend", "", "The collection's branch values "
                             "(coreact.judge_backend: oracle | montecarlo; empty: the preset's).")
_TRAIN_Q = flags.DEFINE_integer("train_questions", 150, "SynthWorld train questions collected.")
_DEV_Q = flags.DEFINE_integer("dev_questions", 50, "SynthWorld dev questions collected (the "
                              "held-out branch points).")
_COLLECT_SEED = flags.DEFINE_integer("collect_seed", 0, "Seed of the branch-point collection.")
_REWARDS = flags.DEFINE_list("rewards", list(REWARDS), "GRPO rank rewards (coreact.rank_reward).")
_VARIANTS = flags.DEFINE_list("variants", list(DEMO_VARIANTS), "Guided-inference variants "
                              "(the research family's default: RESEARCH_VARIANTS).")
_BEST_OF_N = flags.DEFINE_integer("best_of_n", 4, "Best-of-N: actions sampled per step.")
_GRPO_T = flags.DEFINE_float("grpo_temperature", 0.0, "The rubric generator's rollout "
                             "temperature in GRPO (runs under {reward}_t{T}); <= 0: the preset's "
                             "1.0 (runs under {reward}).")

flags.FLAGS.set_default("root", "runs/coreact")
flags.FLAGS.set_default("out", "docs/results/coreact")
flags.FLAGS.set_default("steps", 40)  # configs/coreact.py:demo's train.steps
flags.FLAGS.set_default("eval_size", 100)  # SynthWorld test questions of the guided eval


def _flag(name: str):
  """A flag's value; with --family=research, the research study's setting when the flag is not
  given (RESEARCH_DEFAULTS)."""
  if _FAMILY.value == "research" and not FLAGS[name].present and name in RESEARCH_DEFAULTS:
    return RESEARCH_DEFAULTS[name]
  return FLAGS[name].value


def settings() -> Settings:
  research = _FAMILY.value == "research"
  return Settings(root=_flag("root"), world=_flag("world"),
                  seeds=tuple(int(x) for x in FLAGS.seeds), steps=_flag("steps"),
                  train_questions=_flag("train_questions"),
                  dev_questions=_flag("dev_questions"),
                  collect_seed=_COLLECT_SEED.value, eval_size=_flag("eval_size"),
                  rewards=tuple(_REWARDS.value), variants=tuple(_flag("variants")),
                  best_of_n=_BEST_OF_N.value,
                  grpo_temperature=_GRPO_T.value if _GRPO_T.value > 0 else None,
                  family=_FAMILY.value, judge_backend=_flag("judge_backend"),
                  # the research study keeps each finished job's record in its results folder
                  records=_flag("out") if research else "",
                  commit_records=FLAGS.commit_records)


def _unknown(flag: str, noun: str, given: tuple[str, ...], known) -> None:
  """UserError naming the first of `given` (a list flag's values) not in `known`."""
  for value in given:
    if value not in known:
      close = difflib.get_close_matches(value, list(known), n=1)
      raise common.UserError(f"--{flag}={','.join(given)}: no {noun} {value!r}; " + (
          f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"))


def main(_):
  if not common.VERBOSE.value:  # the scheduler's own lines, not agentjax's INFO logs
    logging.getLogger().setLevel(logging.WARNING)
  s = settings()
  _unknown("rewards", "reward", s.rewards, REWARDS)
  _unknown("variants", "variant", s.variants, VARIANTS)
  if not os.path.exists(os.path.join("configs", "coreact.py")):
    raise common.UserError(f"{os.getcwd()}: no configs/coreact.py; run from the repository root "
                           "(the runs' commands name configs/ and launch/ by relative path)")
  os.makedirs(s.root, exist_ok=True)
  # --report_only (agentjax/studies/sweep.py's flag, as launch/compare.py's studies take it): the
  # report stage alone.
  stage = "report" if FLAGS.report_only else _STAGE.value
  if stage != "report":
    prepare_world(s)
    todo = [j for j in jobs(s) if stage == "all" or j.stage == stage]
    schedule(todo, s.root, FLAGS.workers, s)
  if stage in ("all", "report"):
    report(s, _flag("out"))


if __name__ == "__main__":
  common.run(main)
