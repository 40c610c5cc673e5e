"""The research study's durable evidence: run records kept in the repository, a report
rebuilt from them alone, each record committed alone; the start measurements and the
mechanisms the report pools (all-equal groups, IG against a new gold retrieval)."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from agentjax.judge.oracle import IG_GOLD_SUMS, ig_gold_summary, ig_gold_sums
from agentjax.studies import records
from agentjax.studies.world_properties import equal_groups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _split(split, f1s):
  n = len(f1s)
  return {"f1": float(np.mean(f1s)), "em": float(np.mean(np.asarray(f1s) == 1.0)), "n": n,
          "per_hop": {"1-hop": float(np.mean(f1s[:n // 2])),
                      "2-hop": float(np.mean(f1s[n // 2:]))},
          "f1_by_id": {f"{split}_{i}": float(f) for i, f in enumerate(f1s)},
          "em_by_id": {f"{split}_{i}": float(f == 1.0) for i, f in enumerate(f1s)}}


def _write_records(out, rng, steps=6, questions=8):
  """Records only (no run folder): 2 regimes' starts, GRPO and IGPO x 2 seeds each; returns the
  runs' test F1 per question {(regime, method, seed): array}."""
  truth = {}
  for regime in ("backbone", "backbone_early"):
    start = {s: _split(s, rng.uniform(0, 1, questions).round(3)) for s in ("dev", "test")}
    start["measurements"] = {"collapse": {"f1": 0.5, "em": 0.625}, "rounds_per_correct": 2.2}
    path = records.write_record(str(out), f"{regime}/sft/0", start, None,
                                {"commit": "abc", "dirty": False})
    assert path == os.path.join(out, "runs", regime, "start.json.gz")
    for method in ("grpo", "igpo"):
      for seed in ("0", "1"):
        wd = out.parent / "wd" / regime / method / seed
        wd.mkdir(parents=True)
        (wd / "config.json").write_text(json.dumps({"algorithm": method, "seed": int(seed)}))
        with open(wd / "metrics.jsonl", "w") as f:
          for s in range(steps):
            row = {"step": s + 1, "reward": 0.1, "f1": float(rng.uniform()),
                   "collapse_fraction": float(rng.uniform()), "zero_adv_fraction": 0.2,
                   "gt_entropy_reduction": 0.3}
            row.update(ig_gold_sums(rng.normal(size=5), rng.uniform(size=5) < 0.5))
            f.write(json.dumps(row) + "\n")
        f1s = rng.uniform(0, 1, questions).round(3)
        result = {"dev": _split("dev", f1s[::-1]), "test": _split("test", f1s), "steps": steps,
                  "minutes": 1.5}
        records.write_record(str(out), f"{regime}/{method}/{seed}", result, str(wd),
                             {"commit": "abc", "dirty": False})
        truth[regime, method, seed] = f1s
  return truth


def test_the_report_rebuilds_from_the_records_alone(tmp_path):
  """--report_only with no run folder at all: the tables, the paired test (against NumPy on the
  records' per-question F1), the mechanisms and the plots, from {out}/runs."""
  out = tmp_path / "results"
  truth = _write_records(out, np.random.default_rng(0))
  proc = subprocess.run(
      [sys.executable, "launch/compare.py", "--study=research", "--report_only",
       f"--root={tmp_path}/no_such_root", f"--out={out}", "--methods=grpo,igpo",
       "--seeds=0,1", "--steps=6", "--hardware=test CPU"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert not (tmp_path / "no_such_root").exists()
  saved = json.load(open(out / "results.json"))
  for regime in ("backbone", "backbone_early"):
    d = np.concatenate([truth[regime, "igpo", s] - truth[regime, "grpo", s] for s in "01"])
    got = saved["table"][regime]["methods"]["igpo"]["vs_grpo"]
    assert got["pairs"] == d.size
    assert got["mean"] == pytest.approx(d.mean())
    assert got["stderr"] == pytest.approx(d.std(ddof=1) / math.sqrt(d.size))
    assert saved["table"][regime]["start_measurements"]["collapse"]["f1"] == 0.5
  text = open(out / "results.md").read()
  assert "| backbone_early | igpo | 2 |" in text and "IG vs new gold" in text
  assert os.path.exists(out / "f1_vs_step.png")
  # A run of another length is left out, and says so.
  proc = subprocess.run(
      [sys.executable, "launch/compare.py", "--study=research", "--report_only",
       f"--out={out}", "--methods=grpo,igpo", "--seeds=0,1", "--steps=7"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert "a run of 6 steps, not 7; left out" in proc.stdout


def test_a_record_keeps_the_run_and_a_corrupt_one_is_named(tmp_path):
  out = tmp_path / "results"
  _write_records(out, np.random.default_rng(1), steps=3, questions=4)
  rec = records.read_record(records.record_path(str(out), "backbone/igpo/1"))
  assert rec["spec"] == "backbone/igpo/1" and rec["code"] == {"commit": "abc", "dirty": False}
  assert rec["config"] == {"algorithm": "igpo", "seed": 1} and len(rec["metrics"]) == 3
  assert rec["result"]["test"]["n"] == 4
  assert records.read_record(str(out / "missing.json.gz")) is None
  path = records.record_path(str(out), "backbone/grpo/0")
  with open(path, "r+b") as f:  # truncated mid-write by a killed process
    data = f.read()
    f.seek(0)
    f.truncate()
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match="not a readable run record"):
    records.read_record(path)
  assert os.path.exists(path)  # evidence is never removed


def test_a_record_over_the_bound_is_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(records, "MAX_RECORD_BYTES", 10)
  with pytest.raises(ValueError, match="over 10"):
    records.write_record(str(tmp_path), "backbone/sft/0", {"dev": {"f1": 0.5}}, None, {})
  assert not os.listdir(os.path.join(tmp_path, "runs", "backbone"))


def test_commit_record_commits_that_file_alone(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  repo.mkdir()
  git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True,  # noqa: E731
                                  capture_output=True, text=True).stdout
  git("init", "-q")
  git("config", "user.email", "t@t")
  git("config", "user.name", "t")
  (repo / "code.py").write_text("a = 1\n")
  git("add", "code.py")
  git("commit", "-q", "-m", "code")
  (repo / "code.py").write_text("a = 2\n")  # work in progress, staged
  git("add", "code.py")
  (repo / "other.txt").write_text("untracked\n")
  path = records.write_record(str(repo / "results"), "backbone/sft/0", {"dev": {"f1": 0.5}},
                              None, records.code_version(str(repo)))
  assert records.code_version(str(repo))["dirty"] is True
  assert records.commit_record(path, "record")
  assert git("show", "--name-only", "--format=", "HEAD").split() == [
      "results/runs/backbone/start.json.gz"]
  assert "M  code.py" in git("status", "--porcelain")  # still staged, not committed
  assert not records.commit_record(path, "again")  # unchanged: nothing to commit
  # A path relative to the working directory (the sweep's default --out is one).
  monkeypatch.chdir(repo)
  rel = os.path.relpath(records.write_record("results", "backbone/grpo/0", {"test": {}}, None, {}))
  assert records.commit_record(rel, "relative")
  assert git("show", "--name-only", "--format=", "HEAD").split() == [
      "results/runs/backbone/grpo/seed0.json.gz"]
  with gzip.open(path, "rt") as f:
    assert json.load(f)["result"] == {"dev": {"f1": 0.5}}


def test_ig_gold_summary_pools_steps_as_numpy_does():
  rng = np.random.default_rng(3)
  gains = [rng.normal(size=n) for n in (7, 0, 12, 5)]
  hits = [rng.uniform(size=g.size) < 0.4 for g in gains]
  rows = [ig_gold_sums(g, h) for g, h in zip(gains, hits)]
  x, y = np.concatenate(gains), np.concatenate(hits)
  got = ig_gold_summary(rows)
  assert got["turns"] == x.size and got["new_gold_share"] == pytest.approx(y.mean())
  assert got["r"] == pytest.approx(np.corrcoef(x, y.astype(float))[0, 1])
  assert got["ig_new_gold"] == pytest.approx(x[y].mean())
  assert got["ig_other"] == pytest.approx(x[~y].mean())
  # Edge cases: no turns; every turn a new gold (r undefined); a constant IG (r undefined).
  assert ig_gold_summary([])["turns"] == 0 and math.isnan(ig_gold_summary([])["r"])
  every = ig_gold_summary([ig_gold_sums([0.1, 0.5], [True, True])])
  assert math.isnan(every["r"]) and math.isnan(every["ig_other"])
  assert every["ig_new_gold"] == pytest.approx(0.3)
  assert math.isnan(ig_gold_summary([ig_gold_sums([0.2, 0.2, 0.2], [True, False, True])])["r"])
  assert set(rows[0]) == set(IG_GOLD_SUMS)


def test_equal_groups_against_numpy():
  rng = np.random.default_rng(4)
  group_ids = np.repeat(np.arange(6), 4)
  rewards = rng.uniform(size=24)
  rewards[0:4] = 0.0           # all zero: collapsed
  rewards[4:8] = 1.0           # all one: collapsed
  rewards[8:12] = [0.5, 0.5, 0.5, 0.5 + 1e-9]  # within the tolerance
  rewards[12:16] = [0.0, 0.0, 0.0, 1.0]        # one differs
  singleton = np.append(group_ids, 6)
  want = sum(np.ptp(rewards[group_ids == g]) <= 1e-6 for g in range(6))
  assert equal_groups(rewards, group_ids) == (want, 6) == (3, 6)
  assert equal_groups(np.append(rewards, 0.3), singleton) == (4, 7)  # a singleton is equal


def test_ship_and_check_name_the_file_that_differs(tmp_path):
  """The shipped backbone's manifest pins every shipped file and the world's files: a changed
  weight file or another world is refused, naming the file."""
  from agentjax.studies.backbone import WORLD_FILES, check_shipped, ship
  export, world, sft = tmp_path / "export", tmp_path / "world", tmp_path / "sft"
  for folder in (export, world, sft):
    folder.mkdir()
  (export / "model.safetensors").write_bytes(b"\0" * 64)
  (export / "config.json").write_text("{}")
  for name in WORLD_FILES:
    (world / name).write_text(name)
  (sft / "config.json").write_text(json.dumps({"sft": {"steps": 3}}))
  dest = tmp_path / "shipped"
  manifest = ship({"final": str(export), "early": str(export)}, str(dest), world_dir=str(world),
                  sft_dir=str(sft), record={"gate": {"passed": True}})
  assert sorted(manifest["files"]) == ["early/config.json", "early/model.safetensors",
                                       "final/config.json", "final/model.safetensors"]
  assert check_shipped(str(dest), str(world))["sft_config"] == {"sft": {"steps": 3}}
  (world / "dev.jsonl").write_text("another world")
  with pytest.raises(ValueError, match="dev.jsonl: sha256 .* not the one the backbone"):
    check_shipped(str(dest), str(world))
  (dest / "early" / "model.safetensors").write_bytes(b"\1" * 64)
  with pytest.raises(ValueError, match=r"early/model.safetensors: sha256"):
    check_shipped(str(dest))
  (dest / "early" / "model.safetensors").write_bytes(b"\0" * 64)
  os.remove(dest / "final" / "config.json")
  with pytest.raises(ValueError, match=r"final/config.json: missing"):
    check_shipped(str(dest))


def test_the_plan_runs_the_headline_pair_first_and_seeds_per_arm():
  """The declared order: the headline pair's 5 seeds in the sparse regime, then in the full one,
  then CW-GRPO's 3 seeds in both, then the rest's 3 in the sparse regime (the full regime's left
  out by the budget: LEFT_OUT); nothing else and nothing twice."""
  from agentjax.studies import sweep
  from agentjax.studies.research import RESEARCH_METHODS, plan
  study = sweep.STUDIES["research"]
  assert study.seeds == ("0", "1", "2", "3", "4") and study.plan is plan
  specs = [f"{r}/{m}/{k}" for k in study.seeds for r in ("backbone", "backbone_early")
           for m in RESEARCH_METHODS]
  got = plan(specs)
  assert len(got) == len(set(got)) == 2 * (2 * 5 + 3) + 4 * 3
  assert got[:10] == [f"backbone_early/{m}/{k}" for k in range(5) for m in ("grpo", "igpo")]
  assert got[10:20] == [f"backbone/{m}/{k}" for k in range(5) for m in ("grpo", "igpo")]
  assert [s.split("/")[1] for s in got[20:26]] == ["cw_grpo"] * 6
  assert {s.split("/")[1] for s in got[26:]} == {"igpo_separate", "ppo_ig", "cw_grpo_ig",
                                                 "a2tgpo"}
  assert {s.split("/")[0] for s in got[26:]} == {"backbone_early"}  # the rest: sparse only
  assert max(int(s.split("/")[2]) for s in got[20:]) == 2


def test_paired_by_seed_against_scipy():
  """The seed-level test: per-seed mean differences, Student's t on S - 1 degrees of freedom."""
  from scipy import stats
  from agentjax.studies.reporting import paired_by_seed
  rng = np.random.default_rng(5)
  ref = {s: {f"q{i}": float(rng.random()) for i in range(30)} for s in "01234"}
  other = {s: {q: v + 0.03 + 0.2 * float(rng.standard_normal()) for q, v in qs.items()}
           for s, qs in ref.items()}
  del other["3"]["q2"]  # a question one run lacks: out of that seed's mean
  other["9"] = {"q0": 1.0}  # a seed without a reference run: out
  means = [np.mean([other[s][q] - ref[s][q] for q in ref[s] if q in other[s]]) for s in "01234"]
  want = stats.ttest_1samp(means, 0.0)
  got = paired_by_seed(ref, other)
  assert got["seeds"] == 5 and got["mean"] == pytest.approx(np.mean(means))
  assert got["t"] == pytest.approx(want.statistic) and got["p"] == pytest.approx(want.pvalue,
                                                                                 rel=1e-4)
  assert got["stderr"] == pytest.approx(np.std(means, ddof=1) / np.sqrt(5))
  assert paired_by_seed(ref, ref)["p"] == 1.0  # identical runs
  shifted = {s: {q: v + 0.1 for q, v in qs.items()} for s, qs in ref.items()}
  assert paired_by_seed(ref, shifted)["p"] == 0.0  # the same nonzero difference every seed
  assert math.isnan(paired_by_seed({"0": ref["0"]}, {"0": other["0"]})["p"])  # one seed
  assert paired_by_seed({"0": {}}, {"1": {}})["seeds"] == 0


def test_a_finished_run_without_a_record_gets_one_with_the_code_it_ran(tmp_path):
  """keep_record, as the sweep calls it before choosing what to run: a result under --root
  without a record (its orchestrator was killed) gets its record, with the code version the run
  recorded when it started; a spec without a result is left alone."""
  from absl import flags
  from agentjax.studies import sweep
  root, out = tmp_path / "root", tmp_path / "out"
  wd = root / "backbone" / "grpo" / "seed0"
  wd.mkdir(parents=True)
  (wd / "config.json").write_text("{}")
  (wd / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
  code = {"commit": "0123456789abcdef", "dirty": False}
  (wd / "result.json").write_text(json.dumps({"test": {"f1": 0.5}, "code": code}))
  flags.FLAGS(["compare", "--study=research", f"--root={root}", f"--out={out}"])
  try:
    sweep.keep_record("backbone/grpo/0")
    sweep.keep_record("backbone/igpo/0")  # not finished: nothing
  finally:
    flags.FLAGS.unparse_flags()
  rec = records.read_record(records.record_path(str(out), "backbone/grpo/0"))
  assert rec["code"] == code and rec["metrics"] == [{"step": 1, "reward": 0.5}]
  assert not os.path.exists(records.record_path(str(out), "backbone/igpo/0"))


def test_the_shipped_backbone_matches_its_manifest_and_the_research_preset():
  """backbones/research_v2: every file's sha256 as its manifest says, both starts of the research
  preset's shape, the final one past the gate; safetensors only (no pickle)."""
  from agentjax.studies.backbone import GATE, SHIPPED, STARTS, check_shipped
  from configs import base
  folder = os.path.join(ROOT, SHIPPED)
  manifest = check_shipped(folder)
  shape = base.get_config("research").model.shape
  for start in STARTS:
    files = sorted(os.listdir(os.path.join(folder, start)))
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pkl"))
                                                    for f in files)
    with open(os.path.join(folder, start, "config.json")) as f:
      hf = json.load(f)
    assert (hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"]) == (
        shape.hidden_size, shape.num_layers, shape.intermediate_size)
  assert manifest["gate"]["passed"] and manifest["gate"]["f1_by_hops"]["1"] >= GATE["f1_1hop"]
  assert manifest["starts"]["early"]["sft_step"] < manifest["starts"]["final"]["sft_step"]
  assert sum(os.path.getsize(os.path.join(folder, f)) for f in manifest["files"]) < 16 << 20


def test_write_json_makes_its_folder(tmp_path):
  """A shipped start's result goes to {root}/{size}/start.json, a folder nothing else made (the
  first sweep lost both starts' 20 minutes of measurements to this)."""
  from agentjax.studies.runs import read_json, write_json
  path = str(tmp_path / "root" / "backbone_early" / "start.json")
  write_json(path, {"dev": {"f1": 0.2}})
  assert read_json(path) == {"dev": {"f1": 0.2}}


def test_a_borrowed_arm_is_read_from_its_study_and_its_config_checked(tmp_path, monkeypatch):
  """dac_research borrows the research study's start and GRPO runs (Study.borrow): their records
  are found in the research study's folder (so the sweep neither runs nor re-records them), the
  report's collection reads them there, and a borrowed run whose config is not the one this
  study would run (here another lr) stops the sweep naming the field; the shipped start read
  from another checkout is the same start."""
  import dataclasses
  from absl import flags
  from agentjax.studies import sweep
  root, out, lent = tmp_path / "root", tmp_path / "dac_out", tmp_path / "research_out"
  monkeypatch.setitem(sweep.STUDIES, "research",
                      dataclasses.replace(sweep.STUDIES["research"], out=str(lent)))
  config = sweep.rl_config(str(root), "backbone", "grpo", 0, 30, study="research").to_dict()
  config = json.loads(json.dumps(config))
  config["model"]["hf_path"] = "/another/checkout/backbones/research_v2/final"
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
  code = {"commit": "abc", "dirty": False}

  def lend(cfg):
    (wd / "config.json").write_text(json.dumps(cfg))
    records.write_record(str(lent), "backbone/grpo/0", {"test": _split("test", [0.5, 1.0]),
                                                        "dev": _split("dev", [0.5, 1.0]),
                                                        "steps": 30}, str(wd), code)
  lend(config)
  records.write_record(str(lent), "backbone/sft/0", {"test": _split("test", [0.0, 1.0]),
                                                     "dev": _split("dev", [0.0, 1.0])}, None, code)
  flags.FLAGS(["compare", "--study=dac_research", f"--root={root}", f"--out={out}"])
  try:
    assert sweep.borrowed("backbone/grpo/0") and not sweep.borrowed("backbone/dac_astar1/0")
    assert sweep.stage_done("backbone/grpo/0") and sweep.stage_done("backbone/sft/0")
    assert not sweep.stage_done("backbone/grpo/1")
    assert sweep.borrowed_mismatch("backbone/grpo/0") == []
    sweep.check_borrowed(["backbone/grpo/0", "backbone/grpo/1"])  # a missing one is said
    sweep.keep_record("backbone/grpo/0")  # the research study keeps it: nothing written here
    assert not os.path.exists(out)
    study = records.collect_records(str(out), ["backbone"], ["grpo", "dac_astar1"], ["0"], 30,
                                    out_of=lambda spec: sweep.record_out(spec, "dac_research"))
    assert study["backbone"]["start"]["test"]["f1"] == 0.5
    assert [r["test"]["f1"] for r in study["backbone"]["runs"]["grpo"]] == [0.75]
    config["optimizer"]["lr"] = 3e-4
    lend(config)
    assert sweep.borrowed_mismatch("backbone/grpo/0") == ["optimizer.lr"]
    with pytest.raises(SystemExit, match="backbone/grpo/0: the research study's run has a "
                       "config other than this study's in optimizer.lr"):
      sweep.check_borrowed(["backbone/grpo/0"])
  finally:
    flags.FLAGS.unparse_flags()
