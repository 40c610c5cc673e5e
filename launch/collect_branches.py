r"""Co-ReAct branch points: candidate next actions of the policy's trajectories, ranked by judges.

  python launch/collect_branches.py --config=configs/coreact.py:collect --split=train
  python launch/collect_branches.py --config=configs/coreact.py:collect --split=dev
  python launch/collect_branches.py --config=configs/base.py:demo --out=/tmp/x.jsonl --questions=4
  # LLM judges behind an OpenAI-compatible endpoint, one model each
  python launch/collect_branches.py --config=configs/coreact.py:collect \
      --config.coreact.judge_backend=openai --config.judge.base_url=http://10.0.0.3:8001/v1 \
      --config.coreact.judge_models=qwen3-32b,llama-3.3-70b,gpt-oss-120b
  # candidates also from another Hugging Face folder and a model behind config.judge's endpoint
  python launch/collect_branches.py --config=configs/coreact.py:collect \
      --config.coreact.extra_generators=~/models/qwen3-8b,openai:qwen3-32b \
      --config.judge.base_url=http://10.0.0.3:8001/v1

The policy is the Hugging Face folder --policy_path (default config.model.hf_path), sampled with
config.rollout's limits at config.coreact.candidate_temperatures; questions are the first
--questions (default config.coreact.collect_questions) of --split (default
config.coreact.collect_split) of config.data.train's benchmarks; the judges are
config.coreact.judge_backend (agentjax/coreact/rankers.py); retrieval is config.retrieval.
config.coreact.extra_generators adds candidates from other models (Hugging Face folders, or
"openai:<model>" behind config.judge's /v1/completions endpoint), each row naming every
candidate's source. See agentjax/coreact/branches.py for the loop and the row format. Rows go
to --out (default config.coreact.branches_train for the train split, branches_dev otherwise),
written atomically at the end. Prints one JSON line last: {"out", "rows", "questions", "steps",
"generators", ...}.
"""

from __future__ import annotations

import json
import logging
import os

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_CONFIG = common.define_config("Config file and preset, e.g. configs/coreact.py:collect.",
                               example="configs/coreact.py:collect")
_SPLIT = flags.DEFINE_string("split", None, "Question split (default: coreact.collect_split).")
_OUT = flags.DEFINE_string("out", None, "Output JSONL (default: coreact.branches_train for the "
                           "train split, coreact.branches_dev otherwise).")
_QUESTIONS = flags.DEFINE_integer("questions", None,
                                  "Questions to collect from (default: coreact.collect_questions; "
                                  "0: the whole split).")
_SEED = flags.DEFINE_integer("seed", None, "Sampling and judge-noise seed (default: config.seed).")
_POLICY = flags.DEFINE_string("policy_path", None, "The policy's Hugging Face folder (default: "
                              "config.model.hf_path).")
_BATCH = flags.DEFINE_integer("batch", 16, "Questions collected together (one decode batch).")

log = logging.getLogger(__name__)  # its INFO lines pass the entry point's quiet logs


def main(_):
  from configs.coreact import agent_config
  config = agent_config(_CONFIG.value)  # a rubric-trainer config (:demo): its agent's settings
  split = _SPLIT.value or config.coreact.collect_split
  questions = config.coreact.collect_questions if _QUESTIONS.value is None else _QUESTIONS.value
  if questions < 0 or _BATCH.value < 1:
    raise common.UserError(f"--questions={questions} --batch={_BATCH.value}: --questions must be "
                           f">= 0 (0: the whole split) and --batch >= 1")
  if _SEED.value is not None:
    config.seed = _SEED.value
  policy = os.path.expanduser(_POLICY.value or config.model.hf_path)
  if not policy or not os.path.isdir(policy):
    raise common.UserError(f"--policy_path / config.model.hf_path={policy!r}: the policy must be "
                           f"a Hugging Face folder (e.g. the SFT run's hf_export)")
  out = _OUT.value or (config.coreact.branches_train if split == "train" else
                       config.coreact.branches_dev)

  from agentjax.coreact.branches import (BranchCollector, CollectSettings, CollectStats,
                                         build_generators, write_rows)
  from agentjax.coreact.rankers import build_ranker
  from agentjax.sampling.complete import Completer
  from agentjax.train.trainer import load_questions, make_search_backend

  settings = CollectSettings.from_config(config)
  names = [n.strip() for n in config.data.train.split(",") if n.strip()]
  records = load_questions(config, names, split, field="coreact.collect_split")
  records = records[:questions] if questions else records
  ranker = build_ranker(config)
  generators = build_generators(config)  # checks every entry before loading a model
  completer = Completer.from_hf(policy, max_total_tokens=settings.max_total_tokens)
  collector = BranchCollector(completer, make_search_backend(config), ranker, settings,
                              generators)
  rows, total = [], CollectStats()
  for start in range(0, len(records), _BATCH.value):
    got, stats = collector.collect(records[start:start + _BATCH.value])
    rows += got
    for key, value in stats.to_json().items():
      setattr(total, key, getattr(total, key) + value)
    log.info("collected %d / %d questions: %d branch points", start + stats.questions,
             len(records), len(rows))
  path = write_rows(out, rows)
  print(json.dumps({"out": path, "split": split, "policy": policy,
                    "judges": [j["model"] for j in ranker.identities()],
                    "generators": [g.name for g in generators], **total.to_json()}))


if __name__ == "__main__":
  common.run(main)
