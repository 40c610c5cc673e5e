"""Evaluation (agentjax/train/evaluation.py): accuracy, sample-weighted and macro averages, samples
at a temperature with per-sample rngs, and the cw_grpo_400 benchmark list."""

from __future__ import annotations

import json
import os
import types

import jax
import ml_collections
import numpy as np
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.data.searchqa import BENCHMARK_LISTS, expand_benchmarks
from agentjax.rl.rewards import exact_match, f1_score
from agentjax.sampling import SamplingParams
from agentjax.train import config as config_lib
from agentjax.train.evaluation import eval_questions, evaluate, format_table, mix_scores
from tests import agent_fixtures as af


# ------------------------------------------------------------------------------ scores


def _row(em, f1, turns=1, ok=True):
  return {"em": em, "f1": f1, "turns": turns, "format_ok": ok}


def test_accuracy_sample_weighted_and_macro_against_numpy():
  # Unequal sizes (6, 2 and 4 samples) and a benchmark with nothing correct. em is 0/1 as
  # exact_match gives it; F1 has partial credit, which accuracy must not count.
  per_question = {
      "big": [_row(1, 1.0), _row(0, 0.5), _row(1, 1.0), _row(1, 1.0), _row(0, 0.0),
              _row(0, 0.2)],
      "none": [_row(0, 0.4), _row(0, 0.0)],
      "small": [_row(1, 1.0), _row(0, 0.0), _row(0, 0.0), _row(1, 1.0)],
  }
  em = {k: np.array([r["em"] for r in v], float) for k, v in per_question.items()}
  f1 = {k: np.array([r["f1"] for r in v], float) for k, v in per_question.items()}
  every_em, every_f1 = np.concatenate(list(em.values())), np.concatenate(list(f1.values()))
  overall, average = mix_scores(per_question)
  # Sample-weighted: 5 correct of 12 samples; macro: (3/6 + 0/2 + 2/4) / 3.
  assert overall["accuracy"] == pytest.approx(5 / 12) == pytest.approx(np.mean(every_em > 0))
  assert average["accuracy"] == pytest.approx((3 / 6 + 0 + 2 / 4) / 3)
  assert overall["em"] == pytest.approx(every_em.mean())
  assert overall["f1"] == pytest.approx(every_f1.mean())
  assert average["em"] == pytest.approx(np.mean([v.mean() for v in em.values()]))
  assert average["f1"] == pytest.approx(np.mean([v.mean() for v in f1.values()]))
  assert overall["accuracy"] != average["accuracy"]  # the weighting matters here
  assert sorted(overall) == sorted(average) == ["accuracy", "em", "f1"]


# ------------------------------------------------------------------------------ evaluate


class _DrawEngine:
  """A scripted engine: row i answers its gold (the question text's first word) with
  probability 1/2, drawn from the rng it is given. Records every call's size and rng."""

  def __init__(self):
    self.calls = []

  def run(self, params, questions, rng):
    key = tuple(np.asarray(jax.random.key_data(rng)).ravel().tolist())
    self.calls.append((len(questions), key))
    draw = np.random.default_rng(list(key)).random(len(questions))
    answers = np.array([q.split()[0] if u < 0.5 else "wrong" for q, u in zip(questions, draw)],
                       dtype=object)
    return types.SimpleNamespace(answers=answers, answered=draw < 0.9,
                                 num_turns=np.full(len(questions), 2), format_valid=draw < 0.9), {}


RECORDS = [{"id": f"q{i}", "question": f"gold{i} who?", "golden_answers": [f"gold{i}"],
            "benchmark": "fake"} for i in range(5)]


def _key(seed, batch, sample):
  k = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), batch), sample)
  return tuple(np.asarray(jax.random.key_data(k)).ravel().tolist())


def test_samples_draw_per_sample_rngs_reproducibly_in_padded_batches():
  engine = _DrawEngine()
  out = evaluate(engine, None, RECORDS, batch_size=2, samples=2, seed=7)
  # 3 batches (the last padded to 2 questions) x 2 samples; rng of (batch b, sample s) is
  # fold_in(fold_in(key(7), b), s).
  assert engine.calls == [(2, _key(7, b, s)) for b in range(3) for s in range(2)]
  rows = out["per_question"]
  assert out["n"] == 5 and out["samples"] == 2 and len(rows) == 10
  assert [(r["id"], r["sample"]) for r in rows] == [(f"q{i}", s) for i in range(5)
                                                    for s in range(2)]
  em = np.array([r["em"] for r in rows], float)
  assert out["accuracy"] == pytest.approx(np.mean(em > 0)) and out["em"] == pytest.approx(em.mean())
  assert 0 < out["accuracy"] < 1  # both outcomes occur: the samples are not one draw repeated
  again = evaluate(_DrawEngine(), None, RECORDS, batch_size=2, samples=2, seed=7)
  assert again == out
  other = evaluate(_DrawEngine(), None, RECORDS, batch_size=2, samples=2, seed=8)
  assert [r["answer"] for r in other["per_question"]] != [r["answer"] for r in rows]
  # One sample is the first sample of a longer run: results do not depend on `samples`.
  one = evaluate(_DrawEngine(), None, RECORDS, batch_size=2, samples=1, seed=7)
  assert one["per_question"] == [r for r in rows if r["sample"] == 0]


@pytest.fixture(scope="module")
def scripted(scripted_world):
  tok, backend, agent = scripted_world
  # Sampled: each turn searches or answers "Aldric", uniformly. Greedy: answers "Aldric" (with
  # both branches, greedy would take the lower token id, <search>, every turn).
  params = {"sampled": agent.params(af.SEARCH, af.ANSWER), "greedy": agent.params(af.ANSWER)}

  def engine(sampling):
    return RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
        group_size=1, max_turns=3, max_new_tokens=16, max_obs_tokens=96, max_total_tokens=1024,
        topk=2, sampling=sampling))
  return engine, params


# Gold "Aldric" for even questions only: some correct, some not.
SCRIPTED = [{"id": f"q{i}", "question": f"Who founded place {i}?",
             "golden_answers": ["Aldric" if i % 2 == 0 else "Belisande"]} for i in range(3)]


def test_greedy_one_sample_reproduces_the_previous_eval(scripted):
  engine_of, params = scripted
  engine, params = engine_of(SamplingParams(greedy=True)), params["greedy"]
  out = evaluate(engine, params, SCRIPTED, batch_size=2)
  # The previous eval: one greedy rollout per padded batch with key 0, EM/F1 of each answer.
  want = []
  for start in (0, 2):
    chunk = SCRIPTED[start:start + 2]
    batch, _ = engine.run(params, [r["question"] for r in chunk + [chunk[-1]] * (2 - len(chunk))],
                          jax.random.key(0))
    for i, rec in enumerate(chunk):
      answer = batch.answers[i] if batch.answered[i] else None
      want.append((rec["id"], answer, f1_score(answer, rec["golden_answers"]),
                   exact_match(answer, rec["golden_answers"]), int(batch.num_turns[i]),
                   bool(batch.format_valid[i])))
  got = [(r["id"], r["answer"], r["f1"], r["em"], r["turns"], r["format_ok"])
         for r in out["per_question"]]
  assert got == want
  assert [w[3] for w in want] == [1.0, 0.0, 1.0]  # answers Aldric: right, wrong, right
  assert out["em"] == pytest.approx(np.mean([w[3] for w in want]))
  assert out["f1"] == pytest.approx(np.mean([w[2] for w in want]))


def test_two_samples_at_temperature_one_are_reproducible(scripted):
  engine_of, params = scripted
  engine, params = engine_of(SamplingParams(temperature=1.0)), params["sampled"]
  tokens = []
  real_run = engine.run

  def recording_run(*args):
    batch, metrics = real_run(*args)
    tokens.append(np.asarray(jax.device_get(batch.tokens)))
    return batch, metrics

  engine.run = recording_run
  first = evaluate(engine, params, SCRIPTED, batch_size=2, samples=2, seed=3)
  first_tokens, tokens[:] = list(tokens), []
  second = evaluate(engine, params, SCRIPTED, batch_size=2, samples=2, seed=3)
  assert second == first
  for a, b in zip(first_tokens, tokens):
    np.testing.assert_array_equal(a, b)  # the same trajectories, token for token
  # The two samples of a batch are different draws.
  assert any((first_tokens[2 * b] != first_tokens[2 * b + 1]).any() for b in range(2))
  turns = [r["turns"] for r in first["per_question"]]
  assert len(first["per_question"]) == 6 and len(set(turns)) > 1  # the samples branch


# ------------------------------------------------------------------------------ benchmark list


def test_cw_grpo_400_names_the_paper_mix():
  members = expand_benchmarks("cw_grpo_400")
  assert {n: size for n, size, _ in members} == {
      "musique": 100, "nq": 50, "triviaqa": 50, "popqa": 50, "hotpotqa": 50,
      "2wikimultihopqa": 50, "bamboogle": 50}
  assert sum(size for _, size, _ in members) == 400
  # FlashRAG has no test split for these three: their dev split stands in.
  assert {n for n, _, split in members if split == "dev"} == {"musique", "hotpotqa",
                                                               "2wikimultihopqa"}
  assert expand_benchmarks("nq, hotpotqa") == [("nq", 0, None), ("hotpotqa", 0, None)]
  assert config_lib.benchmark_list("cw_grpo_400", "data.eval") == [n for n, _, _ in members]
  with pytest.raises(config_lib.ConfigError, match=r"config.data.eval='cw_grpo_400,nq': .*'nq'"):
    config_lib.benchmark_list("cw_grpo_400,nq", "data.eval")  # nq twice
  with pytest.raises(config_lib.ConfigError, match="unknown benchmark 'cw_grpo_4000'"):
    config_lib.benchmark_list("cw_grpo_4000", "data.eval")


def test_cw_grpo_400_takes_the_first_questions_of_each_split(tmp_path):
  manual = tmp_path / "manual"
  for name, _, split in BENCHMARK_LISTS["cw_grpo_400"]:
    os.makedirs(manual / name)
    extra = 3 if name == "bamboogle" else 101  # bamboogle shorter than its 50: taken whole
    with open(manual / name / f"{split}.jsonl", "w") as f:
      for i in reversed(range(extra + (0 if name == "bamboogle" else 50))):  # file order reversed
        f.write(json.dumps({"id": f"{split}_{i}", "question": f"{name} {i}?",
                            "golden_answers": [str(i)]}) + "\n")
  config = ml_collections.ConfigDict({"data": {
      "eval": "cw_grpo_400", "eval_split": "test", "eval_size": 0,
      "data_dir": str(tmp_path / "tfds"), "manual_dir": str(manual)}})
  got = eval_questions(config)
  assert list(got) == [n for n, _, _ in BENCHMARK_LISTS["cw_grpo_400"]]
  for name, size, split in BENCHMARK_LISTS["cw_grpo_400"]:
    got_split, records = got[name]
    want = 3 if name == "bamboogle" else size
    assert got_split == split
    assert [r["id"] for r in records] == [f"{split}_{i}" for i in range(want)]
    assert all(r["benchmark"] == name for r in records)
  config.data.eval_size = 2  # a smoke run caps every member
  assert {n: len(r) for n, (_, r) in eval_questions(config).items()} == {
      n: 2 for n, _, _ in BENCHMARK_LISTS["cw_grpo_400"]}


def test_paper_presets_evaluate_each_flashrag_benchmark_on_its_own_split(tmp_path):
  """FlashRAG has no test split for hotpotqa, 2wikimultihopqa and musique: the paper presets'
  eval (data.eval_split='test') takes their dev split, Search-R1's convention, and every other
  benchmark's test split, data.eval_size questions of each."""
  from configs import base, igpo
  paper = igpo.get_config("qwen2.5-7b")
  assert (paper.data.eval, paper.data.eval_split) == (base.FLASHRAG, "test")
  manual = tmp_path / "manual"
  only_dev = {"hotpotqa", "2wikimultihopqa", "musique"}
  for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"):
    os.makedirs(manual / name)
    for split in (("train", "dev") if name in only_dev else
                  ("test",) if name == "bamboogle" else ("train", "dev", "test")):
      with open(manual / name / f"{split}.jsonl", "w") as f:
        for i in range(4):
          f.write(json.dumps({"id": f"{split}_{i}", "question": f"{name} {split} {i}?",
                              "golden_answers": [str(i)]}) + "\n")
  config = ml_collections.ConfigDict({"data": {
      "eval": base.FLASHRAG, "eval_split": "test", "eval_size": 3,
      "data_dir": str(tmp_path / "tfds"), "manual_dir": str(manual)}})
  got = eval_questions(config)
  assert {n: s for n, (s, _) in got.items()} == {
      "nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev",
      "2wikimultihopqa": "dev", "musique": "dev", "bamboogle": "test"}
  for name, (split, records) in got.items():
    assert [r["id"] for r in records] == [f"{split}_{i}" for i in range(3)]
  # The in-training eval is the list's first benchmark, on data.eval_split.
  assert config_lib.benchmark_list(base.FLASHRAG, "data.eval")[0] == "nq"


def test_table_shows_accuracy_overall_and_macro():
  result = {"benchmarks": {"a": {"n": 3, "accuracy": 0.5, "em": 0.5, "f1": 0.6},
                           "b": {"n": 1, "accuracy": 0.0, "em": 0.0, "f1": 0.1}},
            "overall": {"accuracy": 0.375, "em": 0.375, "f1": 0.475},
            "average": {"accuracy": 0.25, "em": 0.25, "f1": 0.35}}
  lines = format_table(result).splitlines()
  assert lines[0].split() == ["benchmark", "n", "acc", "EM", "F1"]
  assert lines[1].split() == ["a", "3", "0.5000", "0.5000", "0.6000"]
  assert lines[3].split() == ["overall", "(samples)", "4", "0.3750", "0.3750", "0.4750"]
  assert lines[4].split() == ["average", "(macro)", "0.2500", "0.2500", "0.3500"]
