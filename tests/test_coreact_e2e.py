"""Co-ReAct end to end on a test SynthWorld (make test-all): branch points from an agent, the
rubric generator's warm start and GRPO, then the guided agent with the trained generator, each
stage through the command a user runs, each reading what the previous one wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(script, *args):
  proc = subprocess.run([sys.executable, f"launch/{script}", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # five stages, each compiling its own programs: minutes on 2 cores
def test_collect_train_and_guide_end_to_end(world_dir, tokenizer, tmp_path):
  from tests.trainer_fixtures import tiny_config
  from agentjax.train.trainer import train
  tmp = str(tmp_path)
  # The agent: a few SFT steps of the tiny model on the world's demonstrations.
  sft = tiny_config(world_dir, tokenizer.name_or_path, tmp, algorithm="sft")
  agent = train(sft, os.path.join(tmp, "agent"))["hf_export"]
  world = [f"--config.data.manual_dir={world_dir}", f"--config.data.data_dir={tmp}/tfds",
           f"--config.retrieval.corpus_path={world_dir}/corpus.jsonl",
           f"--config.retrieval.index_dir={tmp}/bm25",
           f"--config.coreact.entities_path={world_dir}/entities.jsonl",
           f"--config.coreact.branches_train={tmp}/train.jsonl",
           f"--config.coreact.branches_dev={tmp}/dev.jsonl"]
  small = ["--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=24",
           "--config.rollout.max_total_tokens=512", "--config.rollout.max_obs_tokens=96"]

  # 1. Branch points of the agent's trajectories, ranked by the oracle judges.
  for split in ("train", "dev"):
    counts = _launch("collect_branches.py", "--config=configs/coreact.py:collect",
                     f"--split={split}", "--questions=3", f"--policy_path={agent}",
                     "--config.coreact.candidate_temperatures=(1.0,)",
                     "--config.coreact.candidates_per_temperature=3", *world, *small)
    assert counts["rows"] >= 1, counts
  # 2. The warm start: random rubrics, SFT of the generator (its own model, from the agent's).
  demos = _launch("coreact_demos.py", "--config=configs/coreact.py:rubric_sft",
                  f"--config.sft.demos={tmp}/demos.jsonl", *world)
  assert demos["n"] >= 2
  rubric_sft = tiny_config(world_dir, tokenizer.name_or_path, tmp, algorithm="coreact")
  _point(rubric_sft, tmp, world_dir, agent)
  import configs.coreact as presets
  warm = presets.get_config("rubric_sft")
  rubric_sft.trainer, rubric_sft.rollout.protocol = warm.trainer, warm.rollout.protocol
  rubric_sft.rollout.max_turns = 1
  rubric_sft.sft.demos = f"{tmp}/demos.jsonl"
  rubric_sft.sft.corpus_path = ""
  # Enough steps for the tiny model to write parseable rubrics (the guided path must run).
  rubric_sft.sft.steps = 200
  rubric_sft.sft.lr = 3e-3
  train(rubric_sft, os.path.join(tmp, "rubric_sft"))
  # 3. GRPO of the generator from its warm start; its export is the trained generator.
  grpo = tiny_config(world_dir, tokenizer.name_or_path, tmp, algorithm="coreact", steps=2)
  _point(grpo, tmp, world_dir, agent)
  grpo.model.hf_path = f"{tmp}/rubric_sft/hf_export"
  grpo.rollout.max_turns = 1
  grpo.rollout.max_new_tokens = 24
  grpo.train.eval_every = 0
  out = train(grpo, os.path.join(tmp, "rubric"))
  assert out["step"] == 2 and "spearman" in out["evals"][2]
  generator = out["hf_export"]
  assert os.path.isfile(os.path.join(generator, "config.json"))
  # 4. The agent guided by the trained generator (rubric suffix, verify and retry).
  result = _launch("eval.py", "--config=configs/coreact.py:agent", f"--hf_path={agent}",
                   "--agent=coreact", f"--rubric_generator={generator}",
                   "--config.coreact.generator_max_new_tokens=160",
                   "--config.data.eval_size=2", "--config.data.eval_split=test",
                   f"--output={tmp}/guided.json", *world, *small)
  assert result["agent"]["name"] == "coreact" and result["synthworld"]["n"] == 2
  with open(f"{tmp}/guided.json") as f:
    agent = json.load(f)["agent"]
  assert agent["stats"]["rubrics"] > 0, agent  # steps after the first were guided


def _point(c, tmp, world_dir, agent):
  """A trainer config of the test world, its branch points and the agent as the backbone."""
  c.model.hf_path = agent
  c.model.tokenizer_path = ""
  c.coreact.branches_train = f"{tmp}/train.jsonl"
  c.coreact.branches_dev = f"{tmp}/dev.jsonl"
  c.coreact.entities_path = f"{world_dir}/entities.jsonl"
