"""Co-ReAct's rubric generator as an RL task: the rubric protocol, config checks, branch records,
batched rubric rewards, warm-start rubrics, and trainer "rubric" end to end on a tiny model."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from agentjax.agent.protocol import ANSWER, INVALID, RUBRIC, get_protocol  # noqa: E402
from agentjax.models.qwen.config import ConfigError  # noqa: E402
from agentjax.train.config import validate  # noqa: E402


# ============================================================================ protocol, config


def test_rubric_protocol_takes_the_whole_text_as_the_output():
  assert get_protocol("rubric") is RUBRIC and not RUBRIC.can_search
  text = "<think>hm</think>\n1. [0.5] The action searches\n2. [0.5] <search> x </search>"
  action = RUBRIC.parse(text)
  assert action.kind == ANSWER and action.content == text.strip()
  assert RUBRIC.parse(" \n ").kind == INVALID


def _rubric_config():
  from configs import coreact
  return coreact.get_config("demo")


@pytest.mark.parametrize("field,value,expect", [
    ("rollout.protocol", "search_r1", "config.rollout.protocol="),
    ("rollout.max_turns", 2, "config.rollout.max_turns="),
    ("coreact.rank_reward", "ndcg", "config.coreact.rank_reward="),
    ("algorithm", "igpo", "config.algorithm="),
    ("coreact.num_candidates", 1, "config.coreact.num_candidates="),
    ("coreact.min_items", 6, "config.coreact.min_items="),
    ("coreact.best_of_n_select", "judge", "config.coreact.best_of_n_select="),
    ("coreact.branches_train", "", "config.coreact.branches_train="),
    ("coreact.generator_max_think_tokens", -1, "config.coreact.generator_max_think_tokens="),
    ("rollout.max_think_tokens", -1, "config.rollout.max_think_tokens="),
    ("rollout.repetition_penalty", 0.0, "config.rollout.repetition_penalty="),
    ("coreact.value_rollouts", 0, "config.coreact.value_rollouts="),
    ("coreact.value_metric", "bleu", "config.coreact.value_metric="),
    ("coreact.value_temperature", 0.0, "config.coreact.value_temperature="),
])
def test_rubric_config_errors_name_the_field(field, value, expect):
  c = _rubric_config()
  validate(c)
  section, key = field.split(".") if "." in field else (None, field)
  if section:
    c[section][key] = value
  else:
    c[key] = value
  with pytest.raises(ConfigError, match=expect.replace(".", r"\.")):
    validate(c)


def test_the_rubric_protocol_is_the_rubric_trainers_only():
  from configs import base
  c = base.get_config("demo")
  c.rollout.protocol = "rubric"
  with pytest.raises(ConfigError, match=r"config\.rollout\.protocol='rubric'"):
    validate(c)


# ============================================================================ branch records


def _turn(kind, content, docs=()):
  return {"text": f"<think>x</think> <{kind}> {content} </{kind}>",
          "action": {"kind": kind, "content": content},
          "documents": [{"id": str(i), "contents": d} for i, d in enumerate(docs)],
          "observation": "", "search_error": None, "hook_text": ""}


def _branch(i=0, k=3, turns=()):
  return {"id": f"q{i}/0", "question": {"question": f"Where was Bavoli Drensk {i} born?",
                                        "golden_answers": ["Ketrana City"]},
          "turns": list(turns), "max_calls": 4, "protocol": "search_r1",
          "candidates": [f"<search> where was bavoli drensk born {j} </search>" for j in range(k)],
          "expert_ranking": [float(j + 1) for j in range(k)]}


def _write_rows(path, rows):
  with open(path, "w") as f:
    for r in rows:
      f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
  return str(path)


def test_branch_records_are_rubric_prompts_and_bad_rows_name_file_line_and_field(tmp_path):
  from agentjax.coreact.context import BranchContext
  from agentjax.coreact.rubric import rubric_prompt
  from agentjax.coreact.task import branch_records
  rows = [_branch(0), _branch(1, turns=[_turn("search", "bavoli drensk", ["Bavoli Drensk\nx"])])]
  path = _write_rows(tmp_path / "b.jsonl", rows)
  records = branch_records(path, "coreact.branches_train")
  assert [r["id"] for r in records] == ["q0/0", "q1/0"]
  assert records[1]["question"] == rubric_prompt(BranchContext.from_json(rows[1]))
  assert records[1]["branch"] == rows[1]
  bad = [(dict(_branch(), candidates=["a"], expert_ranking=[1.0]), ">= 2 candidates"),
         ({k: v for k, v in _branch().items() if k != "expert_ranking"}, "'expert_ranking'"),
         (dict(_branch(), expert_ranking=[1.0, 2.0]), "same length"),
         (dict(_branch(), turns=[{"text": "x"}]), r"turns\[0\]"),
         ("{not json", "b.jsonl:2")]
  for row, match in bad:
    path = _write_rows(tmp_path / "b.jsonl", [_branch(), row])
    with pytest.raises(ValueError, match=match) as e:
      branch_records(path, "coreact.branches_dev")
    assert "b.jsonl" in str(e.value)
  # Fitted to a token budget (here one token per character): the trajectory is cut first.
  long_turn = _turn("search", "bavoli drensk", ["Bavoli Drensk\n" + "word " * 400])
  path = _write_rows(tmp_path / "b.jsonl", [_branch(0, turns=[long_turn])])
  full = branch_records(path, "coreact.branches_train")[0]["question"]
  fitted = branch_records(path, "coreact.branches_train", len, 600)[0]["question"]
  assert len(fitted) <= 600 < len(full)
  assert fitted.startswith(full[:full.index("Trajectory")]) and fitted.endswith("Rubric:\n")
  with pytest.raises(ValueError, match=r"b\.jsonl.* line 1: the rubric prompt does not fit 50"):
    branch_records(path, "coreact.branches_train", len, 50)
  with pytest.raises(ValueError, match=r"config\.coreact\.branches_dev=.*no such file"):
    branch_records(str(tmp_path / "missing.jsonl"), "coreact.branches_dev")


# ============================================================================ rubric rewards


class _Batch:
  """What RubricRewards reads of a TrajectoryBatch."""

  def __init__(self, texts, group_ids):
    from agentjax.agent.trajectories import TurnRecord
    from agentjax.agent.protocol import RUBRIC
    actions = [RUBRIC.parse(t) for t in texts]
    self.answered = np.array([a.kind == ANSWER for a in actions])
    self.answers = np.array([a.content if a.kind == ANSWER else "" for a in actions], object)
    self.turns = np.empty(len(texts), object)
    for b, (t, a) in enumerate(zip(texts, actions)):
      self.turns[b] = (TurnRecord(text=t, action=a),)
    self.group_ids = np.asarray(group_ids, np.int32)


class _CountingApplier:
  """Ranks by the rubric's first weight's sign (ascending or descending candidate index); fails
  (None) for rubrics whose first criterion says "fail"."""

  def __init__(self):
    self.calls = []

  def rank(self, rubrics, contexts, candidates):
    from agentjax.coreact.rubric import Applied
    self.calls.append(len(rubrics))
    self.items = [i.text for r in rubrics for i in r.items]
    out = []
    for r, c in zip(rubrics, candidates):
      if "fail" in r.items[0].text:
        out.append(None)
        continue
      k = len(c)
      ranks = np.arange(1, k + 1, dtype=float)
      out.append(Applied(ranking=tuple(ranks if r.items[0].weight > 0 else ranks[::-1]),
                         atomic_count=1))
    return out


def test_rubric_rewards_batch_every_rubric_into_one_applier_call():
  from scipy import stats
  from agentjax.coreact.rubric import RewardSettings
  from agentjax.coreact.task import RubricRewards
  good = "1. [0.5] The action searches\n2. [0.3] a\n3. [0.2] b<|im_end|>"  # the EOS as decoded
  reverse = "1. [-0.5] The action searches\n2. [0.5] a\n3. [0.5] b"
  one_item = "1. [1.0] The action searches"
  failing = "1. [0.5] fail\n2. [0.5] a"
  junk = "the the the the the the the the the the"
  texts = [good, reverse, one_item, failing, junk, ""]
  questions = [{"branch": _branch(0, k=4)}, {"branch": _branch(1, k=4)}]
  applier = _CountingApplier()
  rewards, metrics = RubricRewards(applier, RewardSettings(), eos_texts=("<|im_end|>",))(
      _Batch(texts, [0, 0, 1, 1, 0, 1]), questions)
  assert applier.calls == [3]  # one call; rubrics with < 2 items are never sent
  assert "b" in applier.items and not any("im_end" in t for t in applier.items)
  expert = np.arange(1, 5, dtype=float)

  def reference(rho, n, atomic, fmt):
    return 0.75 * (rho + 1) / 2 + 0.15 * atomic / n + 0.10 * fmt

  rho_rev = stats.spearmanr(expert[::-1], expert)[0]
  np.testing.assert_allclose(rewards, [
      reference(1.0, 3, 1, 1.0),
      reference(rho_rev, 3, 1, 1.0),        # 3 items; the positive weights sum to 1
      0.10 * 0.5,                           # one item: format's sum term only (1.0), no count
      0.10 * 0.5,                           # applier failed: format only (2 items, sum 1)
      0.0, 0.0], rtol=1e-6)
  assert metrics["rubric/applier_failures"] == pytest.approx(1 / 6)
  assert metrics["rubric/repetitive"] == pytest.approx(1 / 6)
  assert metrics["rubric/spearman"] == pytest.approx((1.0 + rho_rev) / 6)


# ============================================================================ warm start


def test_warm_start_rubrics_parse_well_formed_and_atomic():
  from agentjax.coreact.executor import CRITERION_PHRASES, criterion_predicates
  from agentjax.coreact.rubric import format_score, parse_rubric
  from agentjax.coreact.warmstart import random_rubric, rubric_demos
  rng = np.random.default_rng(0)
  negatives = 0
  for _ in range(200):
    rubric = parse_rubric(random_rubric(rng, CRITERION_PHRASES))
    positive = [i for i in rubric.items if i.weight > 0]
    assert 3 <= len(rubric.items) <= 5 and len(rubric.items) - len(positive) <= 1
    assert sum(i.weight for i in positive) == pytest.approx(1.0)
    assert all(p is not None for p in criterion_predicates(rubric))
    assert len({i.text for i in rubric.items}) == len(rubric.items)
    negatives += len(rubric.items) > len(positive)
    assert format_score(rubric) == 1.0
  assert 30 < negatives < 100  # negative_rate 0.3
  rows = rubric_demos([_branch(0), _branch(1)], seed=0, per_branch=2)
  assert len(rows) == 4 and {r["protocol"] for r in rows} == {"rubric"}
  assert rows[0]["question"] == rows[1]["question"] != rows[2]["question"]


# ============================================================================ trainer "rubric"


def _synthworld_branches(world_dir, split, n):
  """Branch rows at step 0 over a test world's questions: a search for the subject, the same
  search with other words, an early answer and the gold answer, ranked by hand."""
  rows = []
  with open(os.path.join(world_dir, f"{split}.jsonl")) as f:
    questions = [json.loads(line) for line in f][:n]
  for i, q in enumerate(questions):
    subject = q["chain"][0]
    rows.append({"id": f"{q['id']}/0", "question": q, "turns": [], "max_calls": 4,
                 "protocol": "search_r1",
                 "candidates": [f"<search> {subject} </search>",
                                f"<search> who is {subject} </search>",
                                f"<answer> {q['chain'][1]} </answer>",
                                f"<answer> {q['golden_answers'][0]} </answer>"],
                 "expert_ranking": [1.0, 2.0, 4.0, 3.0] if i % 2 else [1.5, 1.5, 4.0, 3.0]})
  return rows


def test_trainer_rubric_trains_the_generator_on_branch_points(world_dir, tokenizer, tmp_path):
  """Two GRPO steps of a rubric generator (a LoRA adapter on a tiny model) on branch points,
  then the held-out eval: every logged reward is the rubric reward of the text the generator wrote,
  recomputed here with the executor applier."""
  from tests.trainer_fixtures import tiny_config
  from agentjax.coreact.appliers import build_applier
  from agentjax.coreact.context import BranchContext
  from agentjax.coreact.rubric import RewardSettings, parse_rubric, rubric_reward
  from agentjax.train.trainer import train
  tmp = str(tmp_path)
  for split, n in (("train", 4), ("dev", 3)):
    _write_rows(os.path.join(tmp, f"{split}.jsonl"), _synthworld_branches(world_dir, split, n))
  c = tiny_config(world_dir, tokenizer.name_or_path, tmp, algorithm="coreact", steps=2)
  c.rollout.max_turns = 1
  c.rollout.max_new_tokens = 24
  c.model.lora.adapters = "rubric"  # the generator as a LoRA adapter (the e2e test: its own model)
  c.model.lora.rank = 4
  c.coreact.branches_train = os.path.join(tmp, "train.jsonl")
  c.coreact.branches_dev = os.path.join(tmp, "dev.jsonl")
  c.coreact.entities_path = os.path.join(world_dir, "entities.jsonl")
  c.train.eval_every = 0
  c.train.eval_at_start = False
  c.train.export_hf = False
  validate(c)
  workdir = os.path.join(tmp, "run")
  out = train(c, workdir)
  assert out["step"] == 2 and set(out["evals"][2]) >= {"spearman", "reward", "pairwise", "n"}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    steps = [json.loads(line) for line in f if '"rubric/spearman"' in line]
  assert len(steps) == 2 and all(0.0 <= s["reward"] <= 1.0 for s in steps)
  # The held-out eval: each greedy rubric's reward, recomputed independently of the task code.
  with open(os.path.join(workdir, "eval", "2.json")) as f:
    result = json.load(f)
  dev = _synthworld_branches(world_dir, "dev", 3)
  applier, settings = build_applier(c), RewardSettings.from_config(c.coreact)
  expected = []
  for row, got in zip(dev, result["per_question"]):
    rubric = parse_rubric(got["rubric"])
    ctx = BranchContext.from_json(row)
    applied = applier.rank([rubric], [ctx], [tuple(row["candidates"])])[0] \
        if rubric.n >= 2 else None
    expected.append(rubric_reward(got["rubric"], row["expert_ranking"], applied, settings).reward)
    assert got["reward"] == pytest.approx(expected[-1])
  assert result["reward"] == pytest.approx(np.mean(expected)) and result["n"] == 3


def test_branch_rows_with_a_lone_surrogate_are_written_and_read_back(tmp_path):
  """A JSON reply may carry a lone surrogate (an openai generator's candidate): the atomic write
  of the collected rows must not fail on it (it did with UTF-8 output), and reads back equal."""
  from agentjax.coreact.branches import write_rows
  from agentjax.jsonl import iter_json_objects
  row = dict(_branch(0), candidates=["<search> a\ud800b </search>", "<answer> é </answer>"])
  path = write_rows(str(tmp_path / "rows.jsonl"), [row])
  back = [r for _, r in iter_json_objects(path, ValueError)]
  assert back == [row] and not os.path.exists(path + ".tmp")


def test_evaluate_rubrics_scores_every_sample_of_every_branch_point():
  """evaluate_rubrics over an engine that writes a different rubric per sample: the means are
  over (branch point, sample), the padded rows of the last batch are not scored."""
  from agentjax.coreact.rubric import RewardSettings
  from agentjax.coreact.task import RubricRewards, evaluate_rubrics
  texts = {0: "1. [0.5] The action searches\n2. [0.5] a<|im_end|>",
           1: "1. [-0.5] The action searches\n2. [0.5] a\n3. [0.5] b"}
  seen = []

  class Engine:
    def run(self, params, questions, rng):
      import jax
      sample = len(seen) % 2
      seen.append((len(questions), jax.random.key_data(rng).tolist()))
      return _Batch([texts[sample]] * len(questions), list(range(len(questions)))), {}

  records = [{"id": f"b{i}", "question": "p", "branch": _branch(i, k=4)} for i in range(3)]
  rewards = RubricRewards(_CountingApplier(), RewardSettings(), eos_texts=("<|im_end|>",))
  out = evaluate_rubrics(Engine(), None, records, 2, rewards, samples=2)
  assert out["n"] == 3 and out["samples"] == 2 and len(out["per_question"]) == 6
  assert [n for n, _ in seen] == [2, 2, 2, 2]               # 2 batches (the last padded) x 2
  assert len({str(k) for _, k in seen}) == 4                # a different key each run
  assert [(r["id"], r["sample"]) for r in out["per_question"]] == [
      (f"b{i}", s) for i in range(3) for s in range(2)]
  rho = [r["spearman"] for r in out["per_question"]]
  assert rho == [1.0, -1.0] * 3 and out["spearman"] == pytest.approx(0.0)
  assert "im_end" not in out["per_question"][0]["rubric"]


def test_a_rubric_config_gives_its_agent_config():
  """Collection and guided eval run from configs/coreact.py:demo: its agent's settings are the
  agent preset's, with the demo's coreact / data / retrieval sections (overrides included)."""
  from configs import coreact
  demo = coreact.get_config("demo")
  demo.coreact.num_candidates = 3
  demo.data.eval_size = 7
  demo.seed = 5
  agent = coreact.agent_config(demo)
  reference = coreact.get_config("agent")
  assert agent.trainer == "rl" and agent.rollout.to_dict() == reference.rollout.to_dict()
  assert agent.model.hf_path == reference.model.hf_path != demo.model.hf_path
  assert agent.coreact.num_candidates == 3 and agent.data.eval_size == 7 and agent.seed == 5
  validate(agent)
  assert coreact.agent_config(reference) is reference
  demo.coreact.num_candidates = 4  # a copy, not shared
  assert agent.coreact.num_candidates == 3


@pytest.mark.parametrize("temperature,distinct", [(0.0, 1), (0.7, 3)])
def test_sampled_llm_judges_of_one_model_are_each_asked(temperature, distinct):
  """Greedy judges of one model give one reply (asked once, shared); sampled judges (the code's
  0.7) are J draws, each its own backend: sharing one would make the Borda a single ranking."""
  from configs import coreact
  from agentjax.coreact.rankers import build_ranker
  c = coreact.get_config("demo")
  c.coreact.judge_backend = "openai"
  c.judge.temperature = temperature
  ranker = build_ranker(c)
  assert len(ranker.backends) == 3 and len({id(b) for b in ranker.backends}) == distinct
