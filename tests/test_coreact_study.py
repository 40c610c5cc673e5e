"""agentjax/studies/coreact.py (launch/coreact_study.py): the study's runs (commands, inputs,
resumable scheduling) and its report's aggregation on synthetic results (no model)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from agentjax.studies import coreact as coreact_study  # its flags: the sweep's (--pin_cores ...)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def study():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return coreact_study


def _settings(study, root="/r"):
  return study.Settings(root=root, world="/w", seeds=(0, 1), steps=7, train_questions=150,
                        dev_questions=50, collect_seed=0, eval_size=100)


def _np_spearman(a, b):
  """Pearson on average ranks (independent of agentjax.rl.ranking)."""
  def ranks(x):
    x = np.asarray(x, float)
    return np.array([np.sum(x < v) + (np.sum(x == v) + 1) / 2 for v in x])
  ra, rb = ranks(a), ranks(b)
  if ra.std() == 0 or rb.std() == 0:
    return math.nan
  return float(np.corrcoef(ra, rb)[0, 1])


def test_branch_stats_against_a_numpy_reference(study):
  rows = [
      {"id": "q1/0", "candidates": ["<search> a </search>", "<search> A  </search>",
                                    "<answer> x </answer>", "<search> b </search>"],
       "judge_rankings": [[1, 2, 3, 4], [2, 1, 3, 4], [1, 1, 1, 1]],  # the last: constant
       "expert_ranking": [1, 2, 3, 4], "values": [0.8, 0.6, 0.4, 0.0]},
      {"id": "q1/1", "candidates": ["<search> c </search>", "<answer> y </answer>"],
       "judge_rankings": [[1.5, 1.5], [1, 2], [2, 1]], "expert_ranking": [1.5, 1.5]},
      {"id": "q2/0", "candidates": ["<search> d </search>", "<search> e </search>",
                                    "<search> f </search>"],
       "judge_rankings": [[3, 2, 1], [1, 2, 3], [2, 1, 3]], "expert_ranking": [2, 1.5, 2.5],
       "values": [0.5, 0.5, 0.2]},
  ]
  got = study.branch_stats(rows)
  per_row, undefined, pairs = [], 0, 0
  for r in rows:
    rhos = [_np_spearman(a, b) for a, b in itertools.combinations(r["judge_rankings"], 2)]
    pairs += len(rhos)
    undefined += sum(math.isnan(x) for x in rhos)
    ok = [x for x in rhos if not math.isnan(x)]
    if ok:
      per_row.append(np.mean(ok))
  assert got["rows"] == 3 and got["questions"] == 2 and got["judges"] == 3
  assert got["candidates_mean"] == pytest.approx(3.0)
  assert got["distinct_mean"] == pytest.approx((3 + 2 + 3) / 3)  # "a" and "A  " are one
  assert got["judge_spearman"] == pytest.approx(np.mean(per_row), abs=1e-6)
  assert got["judge_pairs_undefined"] == pytest.approx(undefined / pairs)
  assert got["expert_tie_share"] == pytest.approx(1 / 3)
  assert got["judge_tie_share"] == pytest.approx(2 / 9)
  assert got["answer_share"] == pytest.approx(2 / 9)
  assert got["value_tie_share"] == pytest.approx(1 / 2)  # rows with values only
  ref = np.mean([_np_spearman([1, 2, 3, 4], [-0.8, -0.6, -0.4, 0.0]),
                 _np_spearman([2, 1.5, 2.5], [-0.5, -0.5, -0.2])])
  assert got["expert_vs_values"] == pytest.approx(ref, abs=1e-6)


def test_grpo_summary_pairs_before_and_after_by_seed(study):
  def ev(rho, pair, top, rew):
    return {"spearman": rho, "pairwise": pair, "top1": top, "reward": rew}
  runs = {"listwise": {0: {0: ev(0.1, 0.5, 0.2, 0.5), 10: ev(0.3, 0.6, 0.3, 0.6),
                           20: ev(0.5, 0.7, 0.4, 0.7)},
                       1: {0: ev(0.0, 0.4, 0.1, 0.4), 10: ev(0.1, 0.5, 0.2, 0.5),
                           20: ev(0.4, 0.6, 0.5, 0.6)}}}
  got = study.grpo_summary(runs)["listwise"]
  assert got["steps"] == [0, 10, 20] and got["last_step"] == 20 and got["seeds"] == [0, 1]
  s = got["spearman"]
  assert s["before"][0] == pytest.approx(0.05) and s["after"][0] == pytest.approx(0.45)
  assert s["delta"][0] == pytest.approx(0.4)
  assert s["delta"][1] == pytest.approx(np.std([0.4, 0.4], ddof=1), abs=1e-12)
  assert s["after"][1] == pytest.approx(np.std([0.5, 0.4], ddof=1))
  assert s["curve"][10][0] == pytest.approx(0.2)
  assert s["per_seed"][1] == [0.0, 0.4]
  assert got["repetitive"]["after"] is None  # the evals do not record it
  # Training rows: first vs last WINDOW (5) steps of the sampled rubrics' metrics.
  rows = [{"step": t, "reward": float(t), "rubric/spearman": -float(t)} for t in range(1, 13)]
  got = study.grpo_summary(runs, {"listwise": {0: rows, 1: rows[:6]}})["listwise"]
  assert got["train_reward"]["per_seed"][0] == [pytest.approx(3.0), pytest.approx(10.0)]
  assert got["train_reward"]["per_seed"][1] == [pytest.approx(3.0), pytest.approx(4.0)]
  assert got["train_spearman"]["delta"][0] == pytest.approx(-(7.0 + 1.0) / 2)


def test_redundant_query_rate_pools_queries_within_each_trajectory(study):
  # 6 queries: "a" repeated once in the first (case/space-normalized), "b" in another trajectory
  # is not a repeat of the first's.
  assert study.redundant_query_rate([["a", "B", " A "], ["b"], ["c", "c"]]) == pytest.approx(2 / 6)
  assert math.isnan(study.redundant_query_rate([[], []]))


def test_guided_scores_from_eval_rows(study):
  per_question = [
      {"f1": 1.0, "em": 1.0, "answer": "x", "turns": 3, "queries": ["a", "a"]},
      {"f1": 0.5, "em": 0.0, "answer": "y", "turns": 2, "queries": ["b"]},
      {"f1": 0.0, "em": 0.0, "answer": None, "turns": 4, "queries": ["c", "d", "c"]}]
  agent = {"name": "coreact", "stats": {"verify_checks": 6.0, "verify_retries": 3.0,
                                        "verify_score_mean": 0.4}}
  got = study.guided_scores({"benchmarks": {}, "per_question": {"synthworld": per_question},
                             "agent": agent})
  assert got["f1"] == pytest.approx(0.5) and got["em"] == pytest.approx(1 / 3)
  assert got["redundant_query_rate"] == pytest.approx(2 / 6)
  assert got["steps_to_answer"] == pytest.approx(2.5)  # answered rows only
  assert got["answered"] == pytest.approx(2 / 3)
  assert got["retries_per_step"] == pytest.approx(3 / 9)  # over every turn
  assert got["retry_share"] == pytest.approx(3 / 6) and got["verify_score"] == pytest.approx(0.4)
  # launch/eval.py's per-row counts (searches, redundant_searches) are pooled the same way.
  counted = [dict(r, searches=len(r["queries"]), redundant_searches=n)
             for r, n in zip(per_question, (1, 0, 1))]
  for r in counted:
    del r["queries"]
  assert study.guided_scores({"per_question": counted})["redundant_query_rate"] == \
      pytest.approx(2 / 6)
  # Rows without queries: the rate is unknown (nan), not 0.
  bare = [{k: v for k, v in r.items() if k != "queries"} for r in per_question]
  got = study.guided_scores({"per_question": bare})
  assert math.isnan(got["redundant_query_rate"]) and math.isnan(got["retries_per_step"])
  summary = study.guided_summary({"react": {0: {"per_question": per_question},
                                            1: {"per_question": per_question[:2]}}})["react"]
  assert summary["seeds"] == [0, 1]
  assert summary["f1"][0] == pytest.approx((0.5 + 0.75) / 2)
  assert summary["f1_vs_react"][0] == 0.0
  two = study.guided_summary({"react": {0: {"per_question": per_question}},
                              "bon_self": {0: {"per_question": per_question[:2]},
                                           1: {"per_question": per_question}}})
  assert two["bon_self"]["f1_vs_react"][0] == pytest.approx(0.25)  # seed 0 only


def test_jobs_point_every_run_at_the_study_root(study):
  s = _settings(study)
  jobs = {j.spec: j for j in study.jobs(s)}
  assert len(jobs) == 2 + 2 + 3 * 2 + len(study.DEMO_VARIANTS) * 2
  assert "--questions=150" in jobs["collect/train"].cmd
  assert "--out=/r/branches_dev.jsonl" in jobs["collect/dev"].cmd
  g = jobs["grpo/pairwise/1"]
  for arg in ("--config.coreact.rank_reward=pairwise", "--config.seed=1",
              "--config.train.steps=7", "--config.coreact.branches_dev=/r/branches_dev.jsonl",
              "--workdir=/r/pairwise/seed1", "--config.model.hf_path=/r/rubric_sft/hf_export",
              "--config.retrieval.index_dir=/w/bm25_index"):
    assert arg in g.cmd, arg
  assert sum(a.startswith("--config.model.hf_path=") for a in g.cmd) == 1
  assert "--hf_path=/w/sft/hf_export" in jobs["guided/react/0"].cmd  # the agent
  assert "/r/pairwise/seed1/eval/7.json" in g.done
  assert not any(a.startswith("--config.rollout.temperature") for a in g.cmd)
  t = jobs["guided/coreact_trained_verify/1"]
  assert "--rubric_generator=/r/listwise/seed1/hf_export" in t.cmd
  assert "--config.coreact.verify=True" in t.cmd and "--config.data.eval_size=100" in t.cmd
  assert t.needs == ("/r/listwise/seed1/hf_export/config.json",)
  u = jobs["guided/coreact_untrained/0"]
  assert "--rubric_generator=/r/rubric_sft/hf_export" in u.cmd
  assert not jobs["guided/react/0"].needs
  assert "--config.coreact.best_of_n_select=self" in jobs["guided/bon_self/0"].cmd
  # Another GRPO temperature: its own folders, and the trained generator is that run's.
  cold = {j.spec: j for j in study.jobs(dataclasses.replace(s, grpo_temperature=0.3))}
  g = cold["grpo/top1_t0.3/0"]
  assert "--config.rollout.temperature=0.3" in g.cmd and "--workdir=/r/top1_t0.3/seed0" in g.cmd
  assert "--rubric_generator=/r/listwise_t0.3/seed1/hf_export" in \
      cold["guided/bon_rubric/1"].cmd
  assert study.grpo_names(dataclasses.replace(s, grpo_temperature=0.3)) == [
      "listwise_t0.3", "pairwise_t0.3", "top1_t0.3", "listwise", "pairwise", "top1"]
  # Every run's overrides parse as config fields of its preset.
  import configs.coreact as coreact_configs
  for j in list(jobs.values()) + list(cold.values()):
    preset = next(a for a in j.cmd if a.startswith("--config=")).split(":")[1]
    config = coreact_configs.get_config(preset)
    for a in j.cmd:
      if a.startswith("--config."):
        key = a[len("--config."):].split("=", 1)[0]
        node = config
        for part in key.split("."):
          assert part in node, f"{j.spec}: {key}"
          node = node[part]


def test_research_family_runs_the_research_presets_on_the_backbone(study):
  """--family=research: every run takes configs/coreact.py's research_* preset of its role, the
  world's v2 layout and the backbone shipped in the repository (its tokenizer beside it), the
  collection's branch values from --judge_backend, a guided variant per reward's generator, and
  the runs seed by seed (each seed's generators, then its guided runs); every override is a
  field of its preset, and the agent's preset (agent_config) is the research agent's: top 2,
  6 turns, 1024 tokens."""
  import configs.coreact as coreact_configs
  s = dataclasses.replace(_settings(study), family="research", judge_backend="montecarlo",
                          variants=study.RESEARCH_VARIANTS)
  order = [j.spec for j in study.jobs(s)]
  jobs = {j.spec: j for j in study.jobs(s)}
  backbone = os.path.join(ROOT, "backbones", "research_v2", "final")
  assert order[:4] == ["collect/train", "collect/dev", "sft/demos", "sft/rubric"]
  assert [x.split("/")[-1] for x in order[4:]] == ["0"] * 11 + ["1"] * 11
  assert [x.split("/")[0] for x in order[4:15]] == ["grpo"] * 3 + ["guided"] * 8
  assert "--rubric_generator=/r/pairwise/seed1/hf_export" in \
      jobs["guided/coreact_pairwise_verify/1"].cmd
  assert "--rubric_generator=/r/listwise/seed0/hf_export" in jobs["guided/coreact_trained/0"].cmd
  assert "--config.coreact.verify=False" in jobs["guided/coreact_trained/0"].cmd
  want = {"collect/dev": "research_collect", "sft/demos": "research_rubric_sft",
          "sft/rubric": "research_rubric_sft", "grpo/listwise/0": "research",
          "guided/react/1": "research_agent"}
  for spec, preset in want.items():
    assert f"--config=configs/coreact.py:{preset}" in jobs[spec].cmd, spec
  assert "--config.coreact.judge_backend=montecarlo" in jobs["collect/train"].cmd
  assert not any("judge_backend" in a for a in jobs["grpo/listwise/0"].cmd)
  assert "--config.model.tokenizer_path=" in jobs["sft/rubric"].cmd
  assert f"--config.model.hf_path={backbone}" in jobs["sft/rubric"].cmd
  assert f"--hf_path={backbone}" in jobs["guided/react/0"].cmd
  assert "--config.model.hf_path=/r/rubric_sft/hf_export" in jobs["grpo/top1/1"].cmd
  for j in jobs.values():
    preset = next(a for a in j.cmd if a.startswith("--config=")).split(":")[1]
    config = coreact_configs.get_config(preset)
    for a in j.cmd:
      if a.startswith("--config."):
        node = config
        for part in a[len("--config."):].split("=", 1)[0].split("."):
          assert part in node, f"{j.spec}: {a}"
          node = node[part]
  agent = coreact_configs.agent_config(coreact_configs.get_config("research"))
  assert agent.preset == "research_agent"
  assert (agent.retrieval.topk, agent.rollout.max_turns, agent.rollout.max_total_tokens) == (
      2, 6, 1024)
  with pytest.raises(ValueError, match="family"):
    study.jobs(dataclasses.replace(s, family="v3"))


@flagsaver.flagsaver(pin_cores=False)
def test_schedule_runs_in_dependency_order_and_skips_what_is_done(study, tmp_path):
  root = str(tmp_path)
  a, b, c = (os.path.join(root, n) for n in ("a", "b", "c"))
  write = lambda path, extra="": (sys.executable, "-c",  # noqa: E731
                                  f"open({path!r}, 'w').write('x'){extra}")
  jobs = [study.Job("s/b", "s", write(b), (b,), (a,)),   # listed first, needs a
          study.Job("s/a", "s", write(a), (a,)),
          study.Job("s/fail", "s", write(c, "; raise SystemExit(3)"), (os.path.join(root, "z"),)),
          study.Job("s/never", "s", write(c), (c + "2",), (os.path.join(root, "z"),))]
  status = study.schedule(jobs, root, workers=2)
  assert status["s/a"] == "ok" and status["s/b"] == "ok"
  assert status["s/fail"] == "failed (exit 3)"
  assert status["s/never"].startswith("waiting on")
  with open(os.path.join(root, "logs", "s_b.log")) as f:
    assert f.readline().startswith("$ python -c")
  # A second pass runs nothing that is done.
  status = study.schedule(jobs[:2], root, workers=2)
  assert status == {"s/a": "done", "s/b": "done"}


@flagsaver.flagsaver(pin_cores=False)
def test_report_writes_tables_json_and_plots(study, tmp_path):
  s = dataclasses.replace(_settings(study, str(tmp_path / "runs")), world=str(tmp_path / "w"))
  p = study.paths(s.root)
  os.makedirs(s.root)
  os.makedirs(os.path.join(s.world, "synthworld"))
  with open(os.path.join(s.world, "synthworld", "entities.jsonl"), "w") as f:
    f.write(json.dumps({"name": "Bob"}) + "\n")
  # The answer is valued above the search, and the experts agree: the value ceiling is 1.
  row = {"id": "q/0", "question": {"question": "who?", "golden_answers": ["Bob"]}, "turns": [],
         "max_calls": 4, "candidates": ["<search> a </search>", "<answer> Bob </answer>"],
         "judge_rankings": [[2, 1], [2, 1]], "expert_ranking": [2, 1], "values": [0.5, 0.8]}
  for split in ("train", "dev"):
    with open(p[split], "w") as f:
      f.write(json.dumps(row) + "\n")
  for seed in s.seeds:
    folder = os.path.join(study.grpo_dir(s.root, "listwise", seed), "eval")
    os.makedirs(folder)
    for step in (0, 7):
      with open(os.path.join(folder, f"{step}.json"), "w") as f:
        json.dump({"spearman": 0.1 * step + seed, "pairwise": 0.5, "top1": 0.5, "reward": 0.5},
                  f)
    os.makedirs(os.path.dirname(study.guided_path(s.root, "react", seed)), exist_ok=True)
    with open(study.guided_path(s.root, "react", seed), "w") as f:
      json.dump({"per_question": [{"id": "t/0", "f1": 0.5, "em": 0.0, "answer": "x",
                                   "turns": 2, "queries": ["a"]}]}, f)
  out = str(tmp_path / "out")
  got = study.report(s, out)
  assert got["grpo"]["listwise"]["spearman"]["delta"][0] == pytest.approx(0.7)
  assert got["branches"]["train"]["rows"] == 1
  refs = got["references"]
  assert refs["fixed_rubrics"] == math.comb(9, 3) and refs["value_ceiling_dev"] == 1.0
  # Every fixed rubric that rewards answering over searching agrees with the experts (rho 1).
  assert refs["best_fixed"]["dev"]["spearman"] == pytest.approx(1.0)
  assert os.path.exists(os.path.join(s.root, "references.json"))
  # The categorical policy (one row, phase 0): every arm's greedy rubric; the best single fixed
  # rubric reaches Spearman 1, and the list-wise arm finds one (rewards differ only there).
  cat = got["categorical"]
  assert cat["rubrics"] == math.comb(9, 3) and cat["ceilings_dev"]["best_fixed"] == 1.0
  assert set(cat["arms"]) == {"listwise", "pairwise", "top1"}
  assert cat["arms"]["listwise"]["mean"]["spearman"][0] == pytest.approx(1.0)
  assert os.path.exists(os.path.join(s.root, "categorical.json"))
  with open(os.path.join(out, "results.md")) as f:
    assert "categorical policy (S2b)" in f.read()
  for name in ("results.md", "results.json", "spearman_vs_step.png", "guided_f1.png"):
    assert os.path.exists(os.path.join(out, name)), name
  with open(os.path.join(out, "results.json")) as f:
    saved = json.load(f)
  assert saved["guided"]["react"]["f1"][0] == 0.5
  assert saved["commands"]["grpo/listwise/0"].startswith("python launch/train.py")


@flagsaver.flagsaver(pin_cores=False)
def test_records_make_the_study_durable_and_the_report_reads_them_alone(study, tmp_path):
  """With records: each finished job's record is kept as it ends; on a fresh root the records'
  files are restored and their jobs skipped, except a recorded job whose model export a job still
  to run needs (it runs again); the report reads the records alone (its paired per-question
  tests against NumPy)."""
  from agentjax.studies import records
  out = str(tmp_path / "out")
  s = dataclasses.replace(_settings(study, str(tmp_path / "root")), records=out, seeds=(0, 1),
                          variants=("react", "coreact_listwise_verify"))
  root = s.root
  os.makedirs(root)
  rng = np.random.default_rng(3)
  truth = {}

  def job(spec, rel, text, needs=()):
    """A job writing `text` to each of rel (relative to root); counts its runs in runs.log."""
    paths = tuple(os.path.join(root, r) for r in rel)
    code = "import os,sys\n" + "".join(
        f"os.makedirs(os.path.dirname({p!r}), exist_ok=True); open({p!r}, 'w').write({text!r})\n"
        for p in paths) + f"open({os.path.join(str(tmp_path), 'runs.log')!r}, 'a').write({spec!r} + '\\n')"
    return study.Job(spec, spec.split("/")[0], (sys.executable, "-c", code), paths,
                     tuple(os.path.join(root, n) for n in needs))
  todo = [job("collect/train", ["branches_train.jsonl"], ""),
          job("sft/rubric", ["rubric_sft/config.json", "rubric_sft/metrics.jsonl",
                             "rubric_sft/hf_export/config.json",
                             "rubric_sft/hf_export/model.safetensors"], "{}",
              ["branches_train.jsonl"])]
  for seed in s.seeds:
    wd = f"listwise/seed{seed}"
    todo.append(job(f"grpo/listwise/{seed}", [f"{wd}/hf_export/config.json",
                                              f"{wd}/hf_export/model.safetensors",
                                              f"{wd}/eval/{s.steps}.json", f"{wd}/config.json",
                                              f"{wd}/metrics.jsonl"],
                    '{"spearman": 0.1, "pairwise": 0.5, "top1": 0.5, "reward": 0.5}',
                    ["rubric_sft/hf_export/config.json"]))
    for variant in ("react", "coreact_listwise_verify"):
      f1s = rng.uniform(0, 1, 6).round(3)
      truth[variant, seed] = f1s
      result = json.dumps({"per_question": [{"id": f"t/{i}", "f1": float(f), "em": 0.0,
                                             "answer": "x", "turns": 2} for i, f in
                                            enumerate(f1s)]})
      needs = [] if variant == "react" else [f"{wd}/hf_export/config.json"]
      todo.append(job(f"guided/{variant}/{seed}", [f"guided/{variant}/seed{seed}.json"], result,
                      needs))
  status = study.schedule(todo, root, workers=1, s=s)
  assert set(status.values()) == {"ok"}
  kept = [os.path.relpath(os.path.join(d, n), out) for d, _, ns in os.walk(out) for n in ns]
  assert sorted(kept) == sorted(
      ["runs/collect/train.json.gz", "runs/sft/rubric.json.gz",
       *(f"runs/grpo/listwise/seed{k}.json.gz" for k in (0, 1)),
       *(f"runs/guided/{v}/seed{k}.json.gz" for v in ("react", "coreact_listwise_verify")
         for k in (0, 1))])
  rec = records.read_record(records.files_record_path(out, "grpo/listwise/1"))
  assert sorted(rec["files"]) == ["listwise/seed1/config.json", "listwise/seed1/eval/7.json",
                                  "listwise/seed1/metrics.jsonl"]  # never the export
  assert rec["export_sha256"] and records.read_record(
      records.files_record_path(out, "sft/rubric"))["export_sha256"]
  # A lost machine: a fresh root. Everything recorded is restored and nothing runs ...
  os.rename(root, root + ".lost")
  os.remove(os.path.join(str(tmp_path), "runs.log"))
  status = study.schedule(todo, root, workers=1, s=s)
  assert set(status.values()) == {"done"} and not os.path.exists(str(tmp_path / "runs.log"))
  assert os.path.exists(os.path.join(root, "guided", "react", "seed1.json"))
  # ... but a guided run without a record needs its seed's generator: it and the warm start it
  # reads run again (their records kept), the rest stay done.
  os.remove(records.files_record_path(out, "guided/coreact_listwise_verify/1"))
  os.remove(os.path.join(root, "guided", "coreact_listwise_verify", "seed1.json"))
  status = study.schedule(todo, root, workers=1, s=s)
  with open(tmp_path / "runs.log") as f:
    assert f.read().split() == ["sft/rubric", "grpo/listwise/1",
                                "guided/coreact_listwise_verify/1"]
  assert status["grpo/listwise/0"] == "done" and status["grpo/listwise/1"] == "ok"
  # The report from the records alone (no root): paired per question, pooled over seeds.
  import shutil
  shutil.rmtree(root)
  got = study.report(dataclasses.replace(s, root=str(tmp_path / "gone")), str(tmp_path / "rep"))
  assert not os.path.exists(tmp_path / "gone")
  (pair,) = [c for c in got["guided_paired"] if c["variant"] == "coreact_listwise_verify"]
  d = np.concatenate([truth["coreact_listwise_verify", k] - truth["react", k] for k in (0, 1)])
  assert pair["reference"] == "react" and pair["pooled"]["pairs"] == 12
  assert pair["pooled"]["mean"] == pytest.approx(d.mean())
  assert pair["pooled"]["stderr"] == pytest.approx(d.std(ddof=1) / np.sqrt(12))
  assert pair["by_seed"]["seeds"] == 2
  with open(tmp_path / "rep" / "results.md") as f:
    assert "paired per question" in f.read()


def test_fixed_rubrics_are_well_formed(study):
  from agentjax.coreact.executor import CRITERION_PHRASES
  from agentjax.coreact.rubric import parse_rubric
  texts = study.fixed_rubrics(CRITERION_PHRASES)
  assert len(texts) == math.comb(len(CRITERION_PHRASES), 3) == len(set(texts))
  for t in texts:
    r = parse_rubric(t)
    assert r.n == 3 and abs(r.positive_sum - 1) < 1e-9
