"""The studies (agentjax/studies; launch/compare.py): every method's config, and the report (tables,
figures) from run folders."""

from __future__ import annotations

import json
import re
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from agentjax.studies import cw_grpo as cw_study
from agentjax.studies import dac as dac_study
from agentjax.studies import igpo as igpo_study
from agentjax.studies import lora as lora_study
from agentjax.studies import reporting, sweep
from agentjax.studies import runs as study_runs
from agentjax.train import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("method", ["igpo", "grpo", "outcome_only", "ig_only", "rloo",
                                    "reinforcepp", "ppo", "ppo_turn", "ppo_ig"])
@pytest.mark.parametrize("size", ["base", "wide"])
def test_every_run_config_validates_and_differs_only_in_the_method(method, size):
  config = sweep.rl_config("/r", size, method, seed=2, steps=7)
  config_lib.validate(config)
  reference = sweep.rl_config("/r", size, "igpo", seed=2, steps=7)
  assert config.seed == 2 and config.train.steps == 7 and config.rl.probe_all
  assert config.model.hf_path == f"/r/{size}/sft/hf_export"
  assert config.data.manual_dir == "/r/synthworld"
  # Identical hyperparameters: everything but the estimator, IGPO's own settings and the
  # critic's (PPO's, which the other methods do not read).
  flat = lambda c: {k: v for k, v in sweep._flat(c.to_dict()).items()  # noqa: E731
                    if k not in ("algorithm", "rl.igpo_ig_weight", "rl.igpo_outcome_weight",
                                 "rl.igpo_norm", "critic.lr", "ppo.ig_weight")}
  assert flat(config) == flat(reference)
  if method.startswith("ppo"):
    assert config.algorithm == ("ppo_turn" if method == "ppo_turn" else "ppo")
    assert config.critic.lr == 1e-4 and config.critic.warmup_steps == 0
    assert config.ppo.ig_weight == (1.0 if method == "ppo_ig" else 0.0)
  weights = (config.rl.igpo_ig_weight, config.rl.igpo_outcome_weight)
  assert weights == {"outcome_only": (0.0, 1.0), "ig_only": (1.0, 0.0)}.get(method, (1.0, 1.0))
  if size == "wide":
    assert config.model.shape.hidden_size == 256 and config.model.shape.num_heads == 8
  sft = study_runs.sft_config("/r", size)
  config_lib.validate(sft)
  assert sft.model.shape.to_dict() == config.model.shape.to_dict()


def _write_world(root):
  """A 4-question world per split (2 one-hop, 2 two-hop): what the reports read of it."""
  world = os.path.join(root, "synthworld")
  os.makedirs(world)
  for split in ("dev", "test"):
    with open(os.path.join(world, f"{split}.jsonl"), "w") as f:
      for i in range(4):
        f.write(json.dumps({"id": f"{split}_{i}", "hops": 1 + i // 2}) + "\n")


def _write_study(root, rng):
  """Two methods x 2 seeds of fake finished runs on a 4-question world (2 one-hop, 2 two-hop)."""
  _write_world(root)

  def split_result(split, f1s):
    return {"f1": float(np.mean(f1s)), "em": 0.0, "n": 4, "per_hop": {
        "1-hop": float(np.mean(f1s[:2])), "2-hop": float(np.mean(f1s[2:]))},
        "f1_by_id": {f"{split}_{i}": float(f) for i, f in enumerate(f1s)}}

  os.makedirs(os.path.join(root, "base"))
  start = {s: split_result(s, [0.5, 0.0, 0.25, 0.0]) for s in ("dev", "test")}
  with open(os.path.join(root, "base", "start.json"), "w") as f:
    json.dump(start, f)
  truth = {}
  for method in ("igpo", "grpo"):
    for seed in ("0", "1"):
      wd = os.path.join(root, "base", method, f"seed{seed}")
      os.makedirs(wd)
      f1s = rng.uniform(0, 1, 4).round(3)
      curve = [{"step": s + 1, "reward": 0.0, "f1": float(x), "collapse_fraction": float(c),
                "gt_entropy_reduction": float(g), "zero_adv_fraction": float(c) / 2}
               for s, (x, c, g) in enumerate(zip(rng.uniform(0.1, 0.5, 12),
                                                 rng.uniform(0, 1, 12), rng.normal(0, 1, 12)))]
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        for row in curve:
          f.write(json.dumps(row) + "\n")
          f.write(json.dumps({"step": row["step"], "eval/f1": 0.1}) + "\n")  # eval rows skipped
      with open(os.path.join(wd, "result.json"), "w") as f:
        json.dump({"dev": split_result("dev", f1s), "test": split_result("test", f1s[::-1]),
                   "minutes": 1.0}, f)
      truth[method, seed] = (f1s, curve)
  return start, truth


def test_report_figures_against_a_direct_computation(tmp_path):
  rng = np.random.default_rng(0)
  root = str(tmp_path / "runs")
  start, truth = _write_study(root, rng)
  study = reporting.collect(root, ["base", "wide"], ["igpo", "grpo", "rloo"], ["0", "1", "2"],
                          steps=12)
  assert list(study) == ["base"] and sorted(study["base"]["runs"]) == ["grpo", "igpo"]
  table = igpo_study.summarize(study, target_gain=0.05)["base"]
  # Per seed: the first 5 steps' training F1, averaged over the methods, + the target gain.
  targets = {s: np.mean([np.mean([r["f1"] for r in truth[m, s][1][:5]])
                         for m in ("igpo", "grpo")]) + 0.05 for s in ("0", "1")}
  assert table["target_train_f1"] == pytest.approx(targets)
  for method in ("igpo", "grpo"):
    row = table["methods"][method]
    seeds = [truth[method, s] for s in ("0", "1")]
    dev = [f.mean() for f, _ in seeds]
    assert row["dev_f1"][0] == pytest.approx(np.mean(dev))
    assert row["dev_f1"][1] == pytest.approx(np.std(dev, ddof=1))
    assert row["dev_2-hop"][0] == pytest.approx(np.mean([f[2:].mean() for f, _ in seeds]))
    test_gain = [np.mean(f[::-1] - np.array([0.5, 0.0, 0.25, 0.0])) for f, _ in seeds]
    assert row["test_gain"][0] == pytest.approx(np.mean(test_gain))
    want_steps = []
    for seed, (_, curve) in zip(("0", "1"), seeds):
      x = np.array([r["f1"] for r in curve])
      hit = [i + 1 for i in range(4, len(x)) if x[i - 4:i + 1].mean() >= targets[seed]]
      want_steps.append(hit[0] if hit else None)
    assert row["steps_to_target"] == want_steps
    paired = [np.mean([r["f1"] for r in truth[method, s][1]])
              - np.mean([r["f1"] for r in truth["grpo", s][1]]) for s in ("0", "1")]
    assert row["train_f1_minus_grpo"][0] == pytest.approx(np.mean(paired))
    assert row["collapse_fraction"][0] == pytest.approx(
        np.mean([np.mean([r["collapse_fraction"] for r in c]) for _, c in seeds]))
    assert row["zero_adv_fraction"][0] == pytest.approx(
        np.mean([np.mean([r["collapse_fraction"] / 2 for r in c]) for _, c in seeds]))
    assert row["gt_entropy_reduction_last"][0] == pytest.approx(
        np.mean([np.mean([r["gt_entropy_reduction"] for r in c[-5:]]) for _, c in seeds]))
    assert row["gt_entropy_reduction_first"][0] == pytest.approx(
        np.mean([np.mean([r["gt_entropy_reduction"] for r in c[:5]]) for _, c in seeds]))
    assert math.isfinite(row["minutes"][0])
  assert table["methods"]["grpo"]["train_f1_minus_grpo"][0] == 0.0
  text = igpo_study.markdown(igpo_study.summarize(study, 0.05), 12, "test CPU")
  assert "| igpo | 2 |" in text and "| grpo | 2 |" in text and "test CPU" in text
  paths = igpo_study.plot(study, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      "f1_vs_step.png", "f1_minus_grpo_vs_step.png", "collapse_vs_step.png",
      "gt_entropy_vs_step.png"]
  assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)
  # Runs of another length are left out of a report of `steps` steps.
  assert reporting.collect(root, ["base"], ["igpo"], ["0"], steps=30)["base"]["runs"] == {}


def test_report_critic_figures_against_a_direct_computation(tmp_path):
  """A PPO method's runs log critic/* metrics: the report's critic columns are their first and
  last 5-step means, averaged over seeds; methods without a critic get none."""
  rng = np.random.default_rng(3)
  root = str(tmp_path / "runs")
  _write_study(root, rng)
  curves = {}
  for seed in ("0", "1"):
    wd = os.path.join(root, "base", "ppo", f"seed{seed}")
    shutil.copytree(os.path.join(root, "base", "grpo", f"seed{seed}"), wd)
    rows = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]
    curve = []
    for row in rows:
      if "f1" in row:
        row["critic/explained_variance"] = float(rng.uniform(-1, 1))
        row["critic/value_loss"] = float(rng.uniform(0, 1))
        curve.append(row)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    curves[seed] = curve
  study = reporting.collect(root, ["base"], ["grpo", "ppo"], ["0", "1"], steps=12)
  table = igpo_study.summarize(study, target_gain=0.05)["base"]["methods"]
  assert "critic_explained_variance_first" not in table["grpo"]
  for key in ("explained_variance", "value_loss"):
    for name, window in (("first", slice(0, 5)), ("last", slice(-5, None))):
      want = np.mean([np.mean([r[f"critic/{key}"] for r in curves[s][window]]) for s in "01"])
      assert table["ppo"][f"critic_{key}_{name}"][0] == pytest.approx(want)
  text = igpo_study.markdown(igpo_study.summarize(study, 0.05), 12, "cpu")
  assert "critic explained variance" in text and "| ppo | " in text


def test_steps_to_target_needs_a_full_window():
  # One lucky step crosses the target inside the first (partial) window; the first full
  # 5-step window that reaches it ends at step 9.
  f1 = [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.5, 0.5, 0.5, 0.5]
  run = {"seed": "0", "dev": None, "curve": [
      {"step": i + 1, "f1": x, "collapse_fraction": 0.0, "gt_entropy_reduction": 0.0}
      for i, x in enumerate(f1)]}
  split = {"f1": 0.0, "em": 0.0, "n": 1, "per_hop": {"1-hop": 0.0}, "f1_by_id": {"q": 0.0}}
  run.update(dev=split, test=split)
  study = {"base": {"start": {"dev": split, "test": split}, "runs": {"igpo": [run]}}}
  # start = mean(f1[:5]) = 0.26; target 0.26 + 0.06 = 0.32; windows: ..., step 9 -> 0.34.
  row = igpo_study.summarize(study, target_gain=0.06)["base"]["methods"]["igpo"]
  assert row["steps_to_target"] == [9]
  assert row["train_f1_minus_grpo"] is None  # no GRPO run to pair with
  assert row["zero_adv_fraction"] is None  # not logged by this (older) run
  assert math.isnan(row["dev_f1"][1])  # one seed: no spread
  assert "| igpo | 1 | 0.000 |" in igpo_study.markdown(igpo_study.summarize(study, 0.06), 10, "cpu")


def test_report_only_cli_writes_the_tables_and_plots(tmp_path):
  _write_study(str(tmp_path / "runs"), np.random.default_rng(1))
  out = tmp_path / "results"
  proc = subprocess.run(
      [sys.executable, "launch/compare.py", "--report_only", f"--root={tmp_path}/runs",
       f"--out={out}", "--sizes=base", "--methods=igpo,grpo", "--steps=12",
       "--hardware=test CPU"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == ["collapse_vs_step.png", "f1_minus_grpo_vs_step.png",
                                     "f1_vs_step.png", "gt_entropy_vs_step.png", "results.json",
                                     "results.md"]
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  saved = json.load(open(out / "results.json"))
  assert saved["hardware"] == "test CPU" and saved["steps"] == 12
  assert "NaN" not in open(out / "results.json").read()
  for method in ("igpo", "grpo"):
    assert last["compare"]["base"][method] == pytest.approx(
        saved["table"]["base"]["methods"][method]["test_f1"][0], abs=1e-4)


def test_unknown_method_is_refused(tmp_path):
  proc = subprocess.run([sys.executable, "launch/compare.py", "--methods=igpo,ppo9",
                         f"--root={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode != 0 and "--methods: unknown method 'ppo9'" in proc.stderr


def test_demo_world_statistics_against_numpy(tmp_path):
  from agentjax.data.demo_world import f1_by_hops, hops_by_id, paired_gain
  split = tmp_path / "dev.jsonl"
  split.write_text("".join(json.dumps({"id": f"q{i}", "hops": 1 + i % 3}) + "\n"
                           for i in range(9)))
  hops = hops_by_id(str(split))
  assert hops == {f"q{i}": 1 + i % 3 for i in range(9)}
  rng = np.random.default_rng(2)
  before, after = rng.uniform(0, 1, 9), rng.uniform(0, 1, 9)
  rows = [{"id": f"q{i}", "f1": float(f)} for i, f in enumerate(after)]
  assert f1_by_hops(rows, hops) == pytest.approx({h: after[h - 1::3].mean() for h in (1, 2, 3)})
  gain, stderr = paired_gain({f"q{i}": float(f) for i, f in enumerate(before)},
                             {f"q{i}": float(f) for i, f in enumerate(after)})
  d = after - before
  assert gain == pytest.approx(d.mean()) and stderr == pytest.approx(d.std(ddof=1) / 3)
  # The demo's per-hop table: F1 per hop count, and answers given within `hops` turns.
  from agentjax.data.demo_world import hop_table
  turns = [1 + i % 4 for i in range(9)]
  table = hop_table(str(split), [{"id": f"q{i}", "f1": float(f), "turns": 9} for i, f in
                                 enumerate(before)],
                    [dict(r, turns=t) for r, t in zip(rows, turns)])
  early = {h: sum(turns[i] <= h for i in range(9) if 1 + i % 3 == h) for h in (1, 2, 3)}
  assert table == [f"{h}-hop (3 questions): F1 {before[h - 1::3].mean():.3f}, answered early 0 "
                   f"-> F1 {after[h - 1::3].mean():.3f}, answered early {early[h]}"
                   for h in (1, 2, 3)]


# ============================================================================ CW-GRPO study


@pytest.mark.parametrize("method", ["grpo", "cw_grpo", "cw_random", "cw_flip", "cw_gamma1"])
def test_cw_study_configs_differ_only_in_the_estimator_and_judge(method):
  config = sweep.rl_config("/r", "base", method, seed=1, steps=20, study="cw_grpo")
  config_lib.validate(config)
  reference = sweep.rl_config("/r", "base", "grpo", seed=1, steps=20, study="cw_grpo")
  assert config.model.hf_path == "/r/base/sft/hf_export" and not config.rl.probe_all
  diff = {k: v for k, v in sweep._flat(config.to_dict()).items()
          if sweep._flat(reference.to_dict())[k] != v}
  cw = {"algorithm": "cw_grpo", "judge.backend": "oracle"}
  assert diff == {"grpo": {}, "cw_grpo": cw, "cw_random": dict(cw, **{"judge.noise": "random"}),
                  "cw_flip": dict(cw, **{"judge.noise": "flip", "judge.noise_p": 0.2}),
                  "cw_gamma1": dict(cw, **{"cw.gamma": 1.0})}[method]
  assert config.cw.gamma >= config.cw.inf_threshold or method == "cw_gamma1"
  assert config.cw.all_zero_fallback == "zero"


def test_dotted_overrides_reach_their_field_and_a_typo_is_refused(monkeypatch):
  monkeypatch.setitem(igpo_study.METHODS, "typo", ("grpo", {"judge.noise_pp": 0.2}))
  monkeypatch.setitem(igpo_study.METHODS, "noisy", ("grpo", {"judge.noise": "flip",
                                                          "judge.noise_p": 0.2, "cw.gamma": 1.0}))
  config = sweep.rl_config("/r", "base", "noisy", seed=0, steps=3)
  assert (config.judge.noise, config.judge.noise_p, config.cw.gamma) == ("flip", 0.2, 1.0)
  with pytest.raises(KeyError, match="'typo'.*'judge.noise_pp'"):
    sweep.rl_config("/r", "base", "typo", seed=0, steps=3)


def test_the_demo_sft_export_is_reused_only_when_its_settings_are_ours(tmp_path):
  from agentjax.data.demo_world import DEMO_WORLD
  source, root = tmp_path / "demo", str(tmp_path / "study")
  for name in ("synthworld", "tfds", "bm25_index", "sft/hf_export"):
    os.makedirs(source / name)
  # The stamp build_demo_world writes for these settings (so it reuses the copied world).
  (source / "synthworld" / "demo_settings.json").write_text(json.dumps(dict(
      DEMO_WORLD, vocab_size=1024, topk=1, first_query="question",
      hop_weights=list(DEMO_WORLD["hop_weights"]), stop_early_rate=0.5)))
  (source / "sft" / "hf_export" / "config.json").write_text("{}")
  recorded = study_runs.sft_config(str(source), "base").to_dict()  # its own paths, as recorded
  recorded["judge"] = {}  # an older run: RL-only sections absent
  recorded["optimizer"]["lr"] *= 2
  (source / "sft" / "config.json").write_text(json.dumps(recorded))
  said = sweep.reuse_sft(root, str(source), topk=1)
  assert "optimizer.lr" in said and "trained here" in said
  assert not os.path.exists(os.path.join(root, "base", "sft", "hf_export"))
  recorded["optimizer"]["lr"] /= 2
  (source / "sft" / "config.json").write_text(json.dumps(recorded))
  assert "copied from" in sweep.reuse_sft(root, str(source), topk=1)
  assert os.path.exists(os.path.join(root, "base", "sft", "hf_export", "config.json"))
  assert "exists" in sweep.reuse_sft(root, str(source), topk=1)


def _write_cw_study(root, rng):
  """grpo and cw_grpo x 2 seeds of fake finished runs (4 questions a split, 6 steps)."""
  _write_world(root)

  def split_result(split, f1s, ems):
    ids = [f"{split}_{i}" for i in range(4)]
    return {"f1": float(np.mean(f1s)), "em": float(np.mean(ems)), "acc": float(np.mean(ems > 0)),
            "n": 4, "per_hop": {"1-hop": 0.0}, "f1_by_id": dict(zip(ids, map(float, f1s))),
            "em_by_id": dict(zip(ids, map(float, ems)))}

  os.makedirs(os.path.join(root, "base"))
  start = {s: split_result(s, np.array([0.5, 0.0, 0.25, 0.0]), np.array([0., 0, 0, 1]))
           for s in ("dev", "test")}
  json.dump(start, open(os.path.join(root, "base", "start.json"), "w"))
  truth = {}
  for method in ("grpo", "cw_grpo"):
    for seed in ("0", "1"):
      wd = os.path.join(root, "base", method, f"seed{seed}")
      os.makedirs(wd)
      f1s, ems = rng.uniform(0, 1, 4).round(3), rng.integers(0, 2, 4).astype(float)
      curve = [{"step": s + 1, "reward": 0.0, "f1": float(rng.uniform()),
                "em": float(rng.uniform())} for s in range(6)]
      if method == "cw_grpo":
        for row in curve:
          n, k = rng.integers(1, 4), rng.integers(1, 3)  # judged trajectories, rounds each
          row.update({"judge/calls": float(n * (k + 1)), "judge/rounds": float(n * (k + 1)),
                      "judge/trajectories": float(n), "judge/calls_saved": 1.0,
                      "judge/failures": 0.0, "judge/contribution_share": float(rng.uniform()),
                      "judge/gini": float(rng.uniform()), "cw/fallback_rate": 0.25})
        curve[2].update({"judge/calls": 0.0, "judge/rounds": 0.0, "judge/trajectories": 0.0,
                         "judge/gini": 0.0, "judge/contribution_share": 0.0})  # nothing judged
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in curve)
      json.dump({"dev": split_result("dev", f1s, ems),
                 "test": split_result("test", f1s[::-1], ems[::-1]), "minutes": 1.0,
                 "steps": 6, "judge": {"backend": "oracle" if method != "grpo" else "none"}},
                open(os.path.join(wd, "result.json"), "w"))
      truth[method, seed] = (f1s[::-1], ems[::-1], curve)
  return truth


def test_cw_report_against_a_direct_computation(tmp_path):
  root = str(tmp_path / "runs")
  truth = _write_cw_study(root, np.random.default_rng(3))
  study = reporting.collect(root, ["base"], ["grpo", "cw_grpo"], ["0", "1"], steps=6)
  t = cw_study.summarize_cw(study)["base"]
  cw, grpo = t["methods"]["cw_grpo"], t["methods"]["grpo"]
  seeds = ("0", "1")
  acc = {m: np.array([np.mean(truth[m, s][1] > 0) for s in seeds]) for m in ("grpo", "cw_grpo")}
  f1 = {m: np.array([truth[m, s][0].mean() for s in seeds]) for m in ("grpo", "cw_grpo")}
  assert cw["test_acc"] == pytest.approx((acc["cw_grpo"].mean(), acc["cw_grpo"].std(ddof=1)))
  assert cw["test_acc_gain"][0] == pytest.approx(acc["cw_grpo"].mean() - 0.25)
  assert cw["test_gain"][0] == pytest.approx(f1["cw_grpo"].mean() - 0.1875)
  em_paired = [np.mean([a["em"] - b["em"] for a, b in zip(truth["cw_grpo", s][2],
                                                          truth["grpo", s][2])]) for s in seeds]
  assert cw["train_em_minus_grpo"][0] == pytest.approx(np.mean(em_paired))
  def avg(s, key, weight):  # over steps, each weighted by what its value averages
    rows = truth["cw_grpo", s][2]
    return np.average([r[key] for r in rows], weights=[weight(r) for r in rows])
  k = lambda r: r["judge/rounds"] - r["judge/trajectories"]  # noqa: E731  K summed over rows
  gini = [avg(s, "judge/gini", lambda r: k(r) - r["judge/trajectories"]) for s in seeds]
  assert cw["gini"][0] == pytest.approx(np.mean(gini))
  share = [avg(s, "judge/contribution_share", k) for s in seeds]
  assert cw["contribution_share"][0] == pytest.approx(np.mean(share))
  per_traj = [sum(map(k, truth["cw_grpo", s][2]))
              / sum(r["judge/trajectories"] for r in truth["cw_grpo", s][2]) for s in seeds]
  assert cw["rounds_per_judged_trajectory"][0] == pytest.approx(np.mean(per_traj))
  assert cw["judge_calls"][0] == pytest.approx(
      np.mean([np.mean([r["judge/calls"] for r in truth["cw_grpo", s][2]]) for s in seeds]))
  assert grpo["gini"] is None and grpo["train_f1_minus_grpo"] == (0.0, 0.0)
  assert cw["judge"] == {"backend": "oracle"}
  vs = t["vs_grpo"]["cw_grpo"]
  d = acc["cw_grpo"].mean() - acc["grpo"].mean()
  assert vs["acc"]["points"] == pytest.approx(100 * d)
  assert vs["acc"]["relative_pct"] == pytest.approx(100 * d / acc["grpo"].mean())
  assert vs["f1"]["per_seed_points"] == pytest.approx(100 * (f1["cw_grpo"] - f1["grpo"]), abs=0.01)
  text = cw_study.markdown_cw(cw_study.summarize_cw(study), 6, "test CPU")
  assert "| cw_grpo | 2 |" in text and "+6.3 on Qwen3-1.7B" in text and "test CPU" in text
  assert f"{100 * d:+.1f}" in text


def test_cw_report_cli_writes_its_files(tmp_path):
  _write_cw_study(str(tmp_path / "runs"), np.random.default_rng(4))
  out = tmp_path / "results"
  proc = subprocess.run(
      [sys.executable, "launch/compare.py", "--study=cw_grpo", "--report_only",
       f"--root={tmp_path}/runs", f"--out={out}", "--methods=grpo,cw_grpo", "--seeds=0,1",
       "--steps=6", "--hardware=test CPU"], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == ["f1_vs_step.png", "results.json", "results.md",
                                     "success_vs_step.png"]
  saved = json.loads((out / "results.json").read_text())
  assert saved["study"] == "cw_grpo" and "NaN" not in (out / "results.json").read_text()
  assert saved["table"]["base"]["vs_grpo"]["cw_grpo"]["acc"]["seeds"] == 2


def test_lora_report_against_a_direct_computation(tmp_path):
  """The LoRA study's figures (F1, paired differences with full fine-tuning, step time, memory)
  from fake runs, against NumPy."""
  root = str(tmp_path / "runs")
  _write_world(root)
  rng = np.random.default_rng(5)

  def split(name, f1s):
    return {"f1": float(np.mean(f1s)), "em": 0.0, "n": 4,
            "f1_by_id": {f"{name}_{i}": float(f) for i, f in enumerate(f1s)},
            "per_hop": {"1-hop": float(np.mean(f1s[:2])), "2-hop": float(np.mean(f1s[2:]))}}
  os.makedirs(os.path.join(root, "wide"))
  json.dump({s: split(s, np.zeros(4)) for s in ("dev", "test")},
            open(os.path.join(root, "wide", "start.json"), "w"))
  truth = {}
  for method in ("full_ft", "lora_r32"):
    for seed in ("0", "1"):
      wd = os.path.join(root, "wide", method, f"seed{seed}")
      os.makedirs(wd)
      f1s, step_s, train = rng.uniform(0, 1, 4), rng.uniform(1, 9, 3), rng.uniform(0, 1, 3)
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps({"step": i + 1, "reward": 0.0, "f1": float(x), "step_s": float(t)})
                     + "\n" for i, (x, t) in enumerate(zip(train, step_s)))
      state = {"trained_params": 10, "trained_bytes": 40, "opt_state_bytes": 88,
               "frozen_bytes": 0 if method == "full_ft" else 400}
      json.dump({"dev": split("dev", f1s[::-1]), "test": split("test", f1s), "steps": 3,
                 "minutes": 1.0, "peak_rss_mib": 100.0 + int(seed), "train_state": state,
                 "checkpoint_bytes": 2**20}, open(os.path.join(wd, "result.json"), "w"))
      truth[method, seed] = (f1s, step_s, train)
  study = reporting.collect(root, ["wide"], ["full_ft", "lora_r32"], ["0", "1"], steps=3)
  t = lora_study.summarize_lora(study)["wide"]
  lora = t["methods"]["lora_r32"]
  test = [truth["lora_r32", s][0].mean() for s in "01"]
  assert lora["test_f1"] == pytest.approx((np.mean(test), np.std(test, ddof=1)))
  assert lora["step_s"][0] == pytest.approx(np.mean([truth["lora_r32", s][1].mean() for s in "01"]))
  assert lora["step_s_after_first"][0] == pytest.approx(
      np.mean([truth["lora_r32", s][1][1:].mean() for s in "01"]))
  assert lora["peak_rss_mib"] == pytest.approx((100.5, np.std([100, 101], ddof=1)))
  vs = lora["vs_reference"]
  d = [truth["lora_r32", s][0] - truth["full_ft", s][0] for s in "01"]
  assert vs["test_f1_points"] == pytest.approx([100 * x.mean() for x in d], abs=0.01)
  assert vs["test_f1_stderr_points"] == pytest.approx(
      [100 * x.std(ddof=1) / 2 for x in d], abs=0.01)
  assert vs["train_f1_paired_by_step"][0] == pytest.approx(
      np.mean([(truth["lora_r32", s][2] - truth["full_ft", s][2]).mean() for s in "01"]))
  assert "vs_reference" not in t["methods"]["full_ft"]
  text = lora_study.markdown_lora(lora_study.summarize_lora(study), 3, "test CPU")
  assert "| lora_r32 | 2 |" in text and "— (trained)" in text and "test CPU" in text


def test_sft_mismatch_ignores_fields_added_since_at_their_default(tmp_path):
  """An SFT config.json recorded before model.lora existed (and one recorded since, with the
  trainer's "lora" record beside the config) is still the export this study would train; a
  LoRA SFT is not."""
  ours = study_runs.sft_config(str(tmp_path), "base")
  recorded = json.loads(json.dumps(ours.to_dict()))
  older = {k: v for k, v in recorded.items()}
  older["model"] = {k: v for k, v in recorded["model"].items() if k != "lora"}
  assert sweep.sft_mismatch(older, ours) == []
  assert sweep.sft_mismatch(dict(recorded, lora=None, judge_identity={}), ours) == []
  lora = json.loads(json.dumps(recorded))
  lora["model"]["lora"]["adapters"] = "policy"
  assert sweep.sft_mismatch(lora, ours) == ["model.lora.adapters"]


@pytest.mark.parametrize("method", ["grpo_full", "grpo_lora", "dac", "dac_sufficient_only",
                                    "dac_no_aug", "dac_alpha0.1", "dac_alpha0.5",
                                    "dacq_alpha0.1", "dacq_alpha0.3"])
def test_dac_study_configs(method, tmp_path):
  """DAC's study: every run validates; the generator starts from the study's warm start; each
  ablation differs from dac only in its field, and grpo_lora from grpo_full only in model.lora."""
  root = str(tmp_path)
  os.makedirs(dac_study.generator_init(root, "base"))  # lora.init must name a folder
  config = sweep.rl_config(root, "base", method, seed=1, steps=3, study="dac")
  config_lib.validate(config)
  assert config.train.steps == 3 and not config.train.export_hf and config.data.eval_size == 0
  assert config.model.hf_path == f"{root}/base/sft/hf_export"
  flat = lambda c: sweep._flat(c.to_dict())  # noqa: E731
  if method.startswith("dac"):
    assert config.trainer == "dac"
    assert config.model.lora.init == f"generator={root}/base/generator_sft/adapters/generator"
    diff = {k for k, v in flat(config).items()
            if v != flat(sweep.rl_config(root, "base", "dac", 1, 3, study="dac"))[k]}
    assert diff == {"dac_sufficient_only": {"dac.searcher_reward"},
                    "dac_no_aug": {"dac.augment_rate"}, "dac_alpha0.1": {"dac.alpha"},
                    "dac_alpha0.5": {"dac.alpha"},
                    "dacq_alpha0.1": {"dac.alpha", "dac.generator_group"},
                    "dacq_alpha0.3": {"dac.generator_group"}}.get(method, set())
  else:
    full = flat(sweep.rl_config(root, "base", "grpo_full", 1, 3, study="dac"))
    diff = {k for k, v in flat(config).items() if v != full[k]}
    assert diff == (set() if method == "grpo_full" else
                    {"model.lora.adapters", "model.lora.alpha", "model.lora.lr"})
  gen = dac_study.generator_config(root, "base", steps=7)
  config_lib.validate(gen)
  assert gen.trainer == "sft" and gen.sft.steps == 7 and gen.sft.corpus_path == ""
  assert gen.sft.demos == f"{root}/base/generator_sft/generator_demos.jsonl"


def test_dac_augmentation_summary_against_hand_counts():
  """Hand-built clean and augmented passes: q0, q1 sufficient in both and augmented (checked);
  q4 augmented but insufficient in the clean pass (left out); q2, q3 not augmented (consistency:
  q2's answer is the clean one, q3's is not)."""
  clean = [{"id": "q0", "answer": "a", "em": 1.0, "abstained": False, "sufficient": True},
           {"id": "q1", "answer": None, "em": 0.0, "abstained": True, "sufficient": True},
           {"id": "q2", "answer": None, "em": 0.0, "abstained": True, "sufficient": False},
           {"id": "q3", "answer": "b", "em": 1.0, "abstained": False, "sufficient": True},
           {"id": "q4", "answer": "x", "em": 0.0, "abstained": False, "sufficient": False}]
  aug = [{"id": "q0", "answer": "z", "sufficient": True, "augmented": True, "distractors": 2,
          "abstained": False, "correct": False},
         {"id": "q1", "answer": "c", "sufficient": True, "augmented": True, "distractors": 1,
          "abstained": False, "correct": True},
         {"id": "q2", "answer": None, "sufficient": False, "augmented": False, "distractors": 0,
          "abstained": True, "correct": False},
         {"id": "q3", "answer": "c", "sufficient": True, "augmented": False, "distractors": 0,
          "abstained": False, "correct": False},
         {"id": "q4", "answer": "x", "sufficient": True, "augmented": True, "distractors": 2,
          "abstained": False, "correct": True}]
  got = dac_study.augmentation_summary(aug, clean)
  assert got == {"n_augmented_sufficient": 2, "n_sufficient": 4, "distractors_per_set": 1.5,
                 "accuracy_augmented": 0.5, "accuracy_clean": 0.5, "accuracy_drop": 0.0,
                 "abstain_rate_augmented": 0.0, "abstain_rate_clean": 0.5, "consistency": 0.5}
  none = dac_study.augmentation_summary([dict(r, augmented=False) for r in aug], clean)
  assert none["n_augmented_sufficient"] == 0 and none["accuracy_augmented"] is None
  # A monolithic agent's eval rows: coverage and accuracy when answered, no abstention.
  rows = [{"answer": "a", "em": 1.0}, {"answer": None, "em": 0.0}, {"answer": "b", "em": 0.0}]
  assert study_runs.answer_scores(rows) == {"coverage": 2 / 3, "accuracy_answered": 0.5,
                                         "abstain_rate": 0.0}


def test_dac_report_against_a_direct_computation(tmp_path):
  """DAC's study figures from fake runs (two seeds of grpo_full and dac), against NumPy: dev/test
  means, last-5 training means, the sufficiency rise, the step-weighted generator accuracy, the
  paired comparison with grpo_full, the alpha table; and the tables and plots render."""
  root = str(tmp_path / "runs")
  _write_world(root)
  rng = np.random.default_rng(7)
  ids = lambda s: [f"{s}_{i}" for i in range(4)]  # noqa: E731

  def split(name, f1s, dac):
    out = {"f1": float(np.mean(f1s)), "em": float(np.mean(f1s > 0.5)), "n": 4,
           "f1_by_id": dict(zip(ids(name), map(float, f1s))), "coverage": 0.75,
           "accuracy_answered": 0.5, "abstain_rate": 0.25 if dac else 0.0}
    if dac:
      out.update(abstain_precision=float(f1s[0]), abstain_recall=float(f1s[1]),
                 abstained_by_id=dict(zip(ids(name), map(float, f1s < 0.5))),
                 sufficient_by_id=dict(zip(ids(name), map(float, f1s > 0.2))))
    return out
  os.makedirs(os.path.join(root, "base"))
  json.dump({s: split(s, np.zeros(4), False) for s in ("dev", "test")},
            open(os.path.join(root, "base", "start.json"), "w"))
  truth, steps = {}, 6
  for method in ("grpo_full", "dac"):
    for seed in ("0", "1"):
      wd = os.path.join(root, "base", method, f"seed{seed}")
      os.makedirs(wd)
      f1s, curve = rng.uniform(0, 1, 4), []
      for i in range(steps):
        m = {"step": i + 1, "reward": 0.0, "f1": float(rng.uniform()), "step_s": 1.0 + i,
             "sufficiency_rate": float(rng.uniform(0.5, 1))}
        if method == "dac":
          m.update({"dac/abstain_rate": float(rng.uniform()),
                    "dac/sufficiency_rate": m["sufficiency_rate"],
                    "dac/augmented_rate": float(rng.uniform(0, 0.4)),
                    "dac/accuracy_clean": float(rng.uniform()),
                    "dac/accuracy_augmented": float(rng.uniform())})
        curve.append(m)
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in curve)
      result = {s: split(s, f1s, method == "dac") for s in ("dev", "test")}
      result.update(steps=steps, minutes=1.0)
      if method == "dac":
        result["augmentation_check"] = {k: float(rng.uniform()) for k in dac_study.AUG_KEYS}
      json.dump(result, open(os.path.join(wd, "result.json"), "w"))
      truth[method, seed] = (f1s, curve, result)
  study = reporting.collect(root, ["base"], ["grpo_full", "dac"], ["0", "1"], steps=steps)
  start = {s: split(s, np.array([0.1, 0.3, 0.6, 0.9]), True) for s in ("dev", "test")}
  assert dac_study.summarize_dac(study, start)["base"]["threshold"] is None  # older evals
  # The warm start's figures predict alpha* = c_G P(S = 1) / P(S = 0) = 0.2 * 0.6 / 0.4 = 0.3
  # (+ c0 = 0.1: 0.4), so the arm at alpha 0.3 sits below it: "answer".
  start["dev"].update(insufficient_share=0.4, accuracy_sufficient=0.2, accuracy_insufficient=0.1)
  t = dac_study.summarize_dac(study, start)
  t = t["base"]
  assert t["threshold"]["alpha_star_paper"] == pytest.approx(0.3)
  assert t["threshold"]["alpha_star"] == pytest.approx(0.4)
  assert t["alpha"][0]["predicted"] == "answer"
  assert [dac_study.predicted_side(a, 0.4) for a in (0.1, 0.4000001, 1.2)] == [
      "answer", "indifferent", "abstain"] and dac_study.predicted_side(0.3, None) is None
  # The research study's alpha arms: alpha* (0.4 here) / 3, alpha*, 3 alpha*, resolved from
  # that eval; without one, or where it predicts no threshold, an error names the eval.
  arms = {m: o["dac.alpha"] for m, (_, o) in dac_study.DAC_RESEARCH_METHODS.items()
          if "dac.alpha" in o}
  assert {m: dac_study.resolve_alpha_star(v, start, "x") for m, v in arms.items()} == {
      "dac_astar0.33": pytest.approx(0.4 / 3, abs=1e-6), "dac_astar1": 0.4, "dac_astar3": 1.2,
      "dac_paper": 0.4}
  with pytest.raises(FileNotFoundError, match="x: no eval of the DAC agent before RL"):
    dac_study.resolve_alpha_star(arms["dac_astar1"], None, "x")
  with pytest.raises(ValueError, match="x: the eval before RL has no"):
    dac_study.resolve_alpha_star(arms["dac_astar1"],
                                 {s: split(s, np.ones(4), True) for s in ("dev", "test")}, "x")
  no_answer = {"dev": dict(start["dev"], insufficient_share=0.0)}
  with pytest.raises(ValueError, match="not a positive number"):
    dac_study.resolve_alpha_star(arms["dac_astar1"], no_answer, "x")
  dac, grpo = t["methods"]["dac"], t["methods"]["grpo_full"]
  runs = [truth["dac", s] for s in "01"]
  test = [f.mean() for f, _, _ in runs]
  assert dac["test_f1"] == pytest.approx((np.mean(test), np.std(test, ddof=1)))
  assert dac["test_abstain_precision"][0] == pytest.approx(np.mean([f[0] for f, _, _ in runs]))
  assert grpo["test_abstain_precision"] is None and grpo["train_abstain_rate"] is None
  # P(S = 0) from rate * precision / recall: abstain_rate 0.25, precision f1s[0], recall f1s[1]
  assert dac["dev_insufficient"][0] == pytest.approx(
      np.mean([0.25 * f[0] / f[1] for f, _, _ in runs]))
  col = lambda c, k: np.array([m[k] for m in c])  # noqa: E731
  assert dac["sufficiency_rate"][0] == pytest.approx(
      np.mean([col(c, "sufficiency_rate")[-5:].mean() for _, c, _ in runs]))
  assert dac["sufficiency_rise"][0] == pytest.approx(np.mean(
      [col(c, "sufficiency_rate")[-5:].mean() - col(c, "sufficiency_rate")[:5].mean()
       for _, c, _ in runs]))
  w = [col(c, "dac/augmented_rate") for _, c, _ in runs]
  assert dac["train_accuracy_augmented"][0] == pytest.approx(np.mean(
      [np.average(col(c, "dac/accuracy_augmented"), weights=x) for (_, c, _), x in zip(runs, w)]))
  wc = [np.maximum(col(c, "sufficiency_rate") - col(c, "dac/augmented_rate"), 0)
        for _, c, _ in runs]
  assert dac["train_accuracy_clean"][0] == pytest.approx(np.mean(
      [np.average(col(c, "dac/accuracy_clean"), weights=x) for (_, c, _), x in zip(runs, wc)]))
  assert dac["step_s"][0] == pytest.approx(np.mean(np.arange(2, steps + 1)))
  assert dac["augmentation_check"]["accuracy_drop"][0] == pytest.approx(
      np.mean([r["augmentation_check"]["accuracy_drop"] for _, _, r in runs]))
  vs = dac["vs_reference"]
  d = [truth["dac", s][0] - truth["grpo_full", s][0] for s in "01"]
  assert vs["test_f1_points"] == pytest.approx([100 * x.mean() for x in d], abs=0.01)
  assert vs["sufficiency_paired_by_step"][0] == pytest.approx(np.mean(
      [(col(truth["dac", s][1], "sufficiency_rate")
        - col(truth["grpo_full", s][1], "sufficiency_rate")).mean() for s in "01"]))
  assert "vs_reference" not in grpo
  # The primary metric: test F1 - grpo_full over every (seed, question) pair
  pooled = np.concatenate(d)
  assert dac["vs_pooled"]["pairs"] == 8
  assert dac["vs_pooled"]["mean"] == pytest.approx(pooled.mean())
  assert dac["vs_pooled"]["stderr"] == pytest.approx(pooled.std(ddof=1) / np.sqrt(8))
  assert dac["vs_by_seed"]["mean"] == pytest.approx(np.mean([x.mean() for x in d]))
  # The prediction tested: abstentions after RL minus before (the start's, every seed), on
  # every question and on those sufficient both before and after
  before = start["dev"]["f1_by_id"]
  ab0 = {q: float(f < 0.5) for q, f in before.items()}
  su0 = {q: f > 0.2 for q, f in before.items()}
  diffs, on_sufficient = [], []
  for s in "01":
    after = truth["dac", s][2]["dev"]["f1_by_id"]
    for q, f in after.items():
      diffs.append(float(f < 0.5) - ab0[q])
      if f > 0.2 and su0[q]:
        on_sufficient.append(float(f < 0.5) - ab0[q])
  (a,) = t["alpha"]
  assert a["abstain_change"]["mean"] == pytest.approx(np.mean(diffs))
  assert a["abstain_change"]["pairs"] == 8
  assert a["abstain_sufficient_change"]["pairs"] == len(on_sufficient)
  assert a["abstain_sufficient_change"]["mean"] == pytest.approx(np.mean(on_sufficient))
  assert a["observed"] in ("abstain", "answer", "neither")
  assert [a["alpha"] for a in t["alpha"]] == [0.3]
  assert t["dac_start"]["dev"]["f1"] == pytest.approx(0.475)
  text = dac_study.markdown_dac({"base": t}, steps, "test CPU")
  assert "| dac | 2 |" in text and "| 0.3 | answer | dac | 2 |" in text and "test CPU" in text
  assert "α* = 0.400" in text and "Primary metric: test F1" in text
  assert "The prediction tested" in text
  paths = dac_study.plot_dac(study, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      "f1_vs_step.png", "sufficiency_vs_step.png", "abstain_vs_step.png"]
  assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)


# ============================================================================ research study


@pytest.mark.parametrize("method", list(sweep.STUDIES["research"].methods))
def test_research_arms_share_the_protocol_and_differ_in_their_method(method):
  """Every arm of both regimes: the research preset (v2, the shipped backbone's start, constant
  lr after warm-up, top-2 BM25, 6 turns, 500 eval questions, packed rows, the sweep's shared
  compilation cache), the probes on; only the method's own fields differ from GRPO's, and
  CW-GRPO's arms take the official EM reward and groups of 4 (16 questions, the same 64
  trajectories a step)."""
  for regime, start in (("backbone", "final"), ("backbone_early", "early")):
    config = sweep.rl_config("/r", regime, method, seed=1, steps=30, study="research")
    assert config.model.hf_path == os.path.join(ROOT, "backbones", "research_v2", start)
  config_lib.validate(config)
  grpo = sweep.rl_config("/r", "backbone_early", "grpo", seed=1, steps=30, study="research")
  assert config.train.steps == 30 and config.optimizer.lr == 1e-4
  assert config.rl.pack_tokens == 1024 and config.train.jax_cache_dir == "/r/jax_cache"
  assert config.rl.ig_probe_tokens == "natural"  # the gold's tokens as the model writes them
  assert config.data.manual_dir == "/r/synthworld" and config.data.eval_size == 500
  assert config.retrieval.topk == 2 and config.rollout.max_turns == 6 and config.rl.probe_all
  assert config.optimizer.final_lr_ratio == 1.0 and config.model.shape.num_layers == 4
  own = {"algorithm", "rl.igpo_norm", "rl.std_estimator", "rl.std_eps", "critic.lr",
         "ppo.ig_weight", "judge.backend", "cw.gamma", "cw.inf_threshold", "cw.all_zero_fallback",
         "rl.reward_metric", "rollout.group_size", "rl.prompts_per_step", "preset"}
  flat = lambda c: {k: v for k, v in sweep._flat(c.to_dict()).items()  # noqa: E731
                    if k not in own and not k.startswith("a2tgpo.")}
  assert flat(config) == flat(grpo)
  want = {"grpo": ("grpo", 8, "f1"), "igpo": ("igpo", 8, "f1"),
          "igpo_separate": ("igpo", 8, "f1"), "cw_grpo": ("cw_grpo", 4, "em"),
          "ppo_ig": ("ppo", 8, "f1"), "cw_grpo_ig": ("cw_grpo_ig", 4, "em"),
          "a2tgpo": ("a2tgpo", 8, "f1")}[method]
  assert (config.algorithm, config.rollout.group_size, config.rl.reward_metric) == want
  assert config.rollout.group_size * config.rl.prompts_per_step == 64
  assert config.rl.igpo_norm == ("separate" if method == "igpo_separate" else "joint")
  assert config.ppo.ig_weight == (1.0 if method == "ppo_ig" else 0.0)


def test_research_sweep_checks_the_shipped_backbone_against_the_world(tmp_path):
  """A start's stage first checks the shipped backbone's files and the world under --root
  against the manifest: a world that is not the backbone's is refused, naming the file."""
  world = tmp_path / "synthworld"
  world.mkdir()
  with pytest.raises(ValueError, match=re.escape(str(world / "corpus.jsonl")) + ": missing"):
    sweep.run_one(str(tmp_path), "backbone/sft/0", 40, study="research")
  from agentjax.studies.backbone import WORLD_FILES
  for name in WORLD_FILES:
    (world / name).write_text("{}\n")
  with pytest.raises(ValueError, match="not the one the backbone was trained on"):
    sweep.run_one(str(tmp_path), "backbone/sft/0", 40, study="research")
  assert sweep.STUDIES["research"].world == "v2"


def test_dac_research_arms_start_from_the_backbone_with_alpha_from_the_eval_before_rl(
    tmp_path, monkeypatch):
  """The research DAC study: the research protocol, both roles from the backbone (no generator
  warm start), GRPO identical to the research study's arm (whose records it borrows, with the
  start's); its alpha arms read alpha* from the eval before RL, {root}/backbone/dac_start/0 or
  its record (an error naming the file until one exists), then differ from the DAC preset only in
  dac.alpha, which a run's result records resolved; dac_paper differs in the paper's settings."""
  root, out = str(tmp_path / "root"), str(tmp_path / "out")
  monkeypatch.setattr(sweep, "record_out", lambda spec, study: out)
  study = sweep.STUDIES["dac_research"]
  assert study.stages == ("sft", "dac_start") and study.root == sweep.STUDIES["research"].root
  assert dict(study.borrow) == {"sft": "research", "grpo": "research"} and study.records
  assert list(study.methods) == ["grpo", "grpo_lora", "dac_astar0.33", "dac_astar1",
                                 "dac_astar3", "dac_paper"]
  flat = lambda c: sweep._flat(c.to_dict())  # noqa: E731
  assert flat(sweep.rl_config(root, "backbone", "grpo", 1, 150, study="dac_research")) == flat(
      sweep.rl_config(root, "backbone", "grpo", 1, 150, study="research"))
  dac = sweep.rl_config(root, "backbone", "dac_start", 1, 150, study="dac_research")
  config_lib.validate(dac)
  assert dac.trainer == "dac" and dac.model.lora.init == "" and dac.dac.generator_group == "question"
  assert dac.model.hf_path == os.path.join(ROOT, "backbones", "research_v2", "final")
  assert dac.train.steps == 150 and dac.data.eval_size == 500
  assert dac.dac.abstain_text == "insufficient evidence" and dac.retrieval.topk == 2
  # the generator sees every document of a 4-hop chain's searches (at 8, 4-hop F1 was 0)
  assert dac.dac.max_evidence_docs == 4 * dac.retrieval.topk and dac.rl.pack_tokens == 0
  start = os.path.join(root, "backbone", "dac_start", "seed0", "result.json")
  assert sweep.result_path(root, "backbone/dac_start/0") == start
  with pytest.raises(FileNotFoundError, match=re.escape(start)):
    sweep.rl_config(root, "backbone", "dac_astar1", 1, 150, study="dac_research")
  # P(S = 0) 0.5, c_G 0.6, c0 0: alpha* = 0.6; kept as the stage's record (no run folder)
  from agentjax.studies import records
  records.write_record(out, "backbone/dac_start/0", {"dev": {
      "insufficient_share": 0.5, "accuracy_sufficient": 0.6, "accuracy_insufficient": 0.0}},
      None, {"commit": "x"})
  assert os.path.exists(os.path.join(out, "runs", "backbone", "dac_start.json.gz"))
  for method, alpha in (("dac_astar0.33", 0.2), ("dac_astar1", 0.6), ("dac_astar3", 1.8)):
    config = sweep.rl_config(root, "backbone", method, 1, 150, study="dac_research")
    config_lib.validate(config)
    assert {k for k, v in flat(config).items() if v != flat(dac)[k]} == {"dac.alpha"}
    assert config.dac.alpha == pytest.approx(alpha, abs=1e-6)
    assert sweep.resolved_overrides(root, "backbone", "dac_research", method) == {
        "dac.alpha": pytest.approx(alpha, abs=1e-6)}
  paper = sweep.rl_config(root, "backbone", "dac_paper", 1, 150, study="dac_research")
  config_lib.validate(paper)
  assert {k for k, v in flat(paper).items() if v != flat(dac)[k]} == {
      "dac.alpha", "dac.sufficiency_match", "model.lora.lr", "optimizer.b2",
      "optimizer.weight_decay"}
  assert paper.dac.alpha == pytest.approx(0.6, abs=1e-6)
  assert config_lib.lora_rates(paper) == {"searcher": 3e-4, "generator": 1.5e-3}
  assert (paper.optimizer.b2, paper.optimizer.weight_decay) == (0.999, 0.01)  # the paper's
  # The report's alpha arms: each at the alpha its runs recorded (here 0.25, not this start's
  # 0.6 x 3), the others resolved from the start, sorted by alpha; dac_paper is not one.
  runs = {"dac_astar3": [{"overrides": {"dac.alpha": 0.25}}] * 2}
  assert sweep.dac_alphas(root, "backbone", runs, "dac_research") == (
      ("dac_astar0.33", pytest.approx(0.2, abs=1e-6)), ("dac_astar3", 0.25),
      ("dac_astar1", pytest.approx(0.6, abs=1e-6)))
  with pytest.raises(ValueError, match="different dac.alpha"):
    sweep.dac_alphas(root, "backbone", {"dac_astar1": [{"overrides": {"dac.alpha": 0.1}},
                                                        {"overrides": {"dac.alpha": 0.2}}]},
                     "dac_research")
  os.remove(os.path.join(out, "runs", "backbone", "dac_start.json.gz"))
  assert sweep.dac_alphas(root, "backbone", runs, "dac_research") == (("dac_astar3", 0.25),)
  assert sweep.STUDIES["dac"].alphas == dac_study.DAC_ALPHAS  # the demo study's fixed table


def test_paired_pooled_against_a_direct_computation():
  from agentjax.studies.reporting import paired_pooled
  rng = np.random.default_rng(0)
  ref = {s: {f"q{i}": float(rng.random()) for i in range(50)} for s in ("0", "1", "2")}
  other = {s: {q: v + 0.02 + 0.1 * float(rng.standard_normal()) for q, v in qs.items()}
           for s, qs in ref.items()}
  del other["2"]["q7"]  # a question missing from one seed's run is left out of the pairs
  other["3"] = {"q0": 1.0}  # a seed without a reference run too
  d = np.array([other[s][q] - ref[s][q] for s in ("0", "1", "2") for q in ref[s]
                if q in other[s]])
  got = paired_pooled(ref, other)
  assert got["pairs"] == 149 == d.size
  assert got["mean"] == pytest.approx(d.mean())
  assert got["stderr"] == pytest.approx(d.std(ddof=1) / np.sqrt(d.size))
  z = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
  assert got["z"] == pytest.approx(z)
  from scipy import stats
  assert got["p"] == pytest.approx(2 * stats.norm.sf(abs(z)))
  # Edge cases: identical runs, one pair, none.
  assert paired_pooled(ref, ref) | {} == {"pairs": 150, "mean": 0.0, "stderr": 0.0, "z": 0.0,
                                          "p": 1.0}
  one = paired_pooled({"0": {"a": 0.5}}, {"0": {"a": 1.0}})
  assert one["pairs"] == 1 and one["mean"] == 0.5 and np.isnan(one["p"])
  assert paired_pooled({"0": {"a": 0.5}}, {"1": {"a": 1.0}})["pairs"] == 0


# ============================================================================ async study


@pytest.mark.parametrize("arm", ["grpo_a1", "igpo_a2"])
def test_async_arms_differ_from_their_synchronous_arm_in_async_steps_only(arm):
  config = sweep.rl_config("/r", "base", arm, seed=1, steps=20, study="async")
  config_lib.validate(config)
  sync = sweep.rl_config("/r", "base", arm[:-1] + "0", seed=1, steps=20, study="async")
  assert config.train.async_steps == int(arm[-1]) and sync.train.async_steps == 0
  flat = lambda c: {k: v for k, v in sweep._flat(c.to_dict()).items()  # noqa: E731
                    if k != "train.async_steps"}
  assert flat(config) == flat(sync)


def test_async_report_against_a_direct_computation(tmp_path):
  """summarize_async on fake runs: test F1 over seeds, the pooled paired difference against the
  same method's synchronous arm, seconds per step after the first, the speed-up, staleness; the
  table and the F1-vs-time plot render."""
  from agentjax.studies import async_study
  from agentjax.studies.reporting import paired_pooled
  rng = np.random.default_rng(4)
  ids = [f"q{i}" for i in range(5)]

  def run(seed, step_s, staleness):
    f1 = dict(zip(ids, map(float, rng.uniform(0, 1, 5))))
    curve = [{"step": i + 1, "f1": float(rng.uniform()), "step_s": step_s * (3 if i == 0 else 1),
              "async/staleness": float(min(i, staleness))} for i in range(8)]
    return {"seed": seed, "test": {"f1": float(np.mean(list(f1.values()))), "f1_by_id": f1},
            "curve": curve}

  runs = {"grpo_a0": [run(s, 10.0, 0) for s in "01"], "grpo_a1": [run(s, 8.0, 1) for s in "01"]}
  table = async_study.summarize_async({"base": {"start": {}, "runs": runs}})["base"]
  a1 = table["grpo_a1"]
  assert a1["test_f1"][0] == pytest.approx(np.mean([r["test"]["f1"] for r in runs["grpo_a1"]]))
  want = paired_pooled({r["seed"]: r["test"]["f1_by_id"] for r in runs["grpo_a0"]},
                       {r["seed"]: r["test"]["f1_by_id"] for r in runs["grpo_a1"]})
  assert a1["vs_sync"] == want
  assert a1["step_s"][0] == pytest.approx(8.0) and a1["speedup"] == pytest.approx(10.0 / 8.0)
  assert a1["steps_per_hour"][0] == pytest.approx(450.0)
  assert a1["staleness"] == pytest.approx(7 / 8)
  assert "vs_sync" not in table["grpo_a0"]
  text = async_study.markdown_async({"base": table}, 8, "test CPU")
  assert "| grpo_a1 | 2 |" in text and "1.25x" in text
  paths = async_study.plot_f1_vs_time({"base": {"runs": runs}}, str(tmp_path))
  assert open(paths[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_async_report_cli_writes_its_files_and_last_line(tmp_path):
  """launch/compare.py --study=async --report_only: results.md, results.json, the plots, and a
  last line of JSON with every arm's test F1 (the async table has no "methods" level: its last
  line raised a KeyError after writing the files, 2026-11-26)."""
  root = str(tmp_path / "runs")
  _write_study(root, np.random.default_rng(5))
  for old, new in (("grpo", "grpo_a0"), ("igpo", "grpo_a1")):
    os.rename(os.path.join(root, "base", old), os.path.join(root, "base", new))
    for seed in ("0", "1"):
      path = os.path.join(root, "base", new, f"seed{seed}", "metrics.jsonl")
      rows = [json.loads(line) for line in open(path)]
      with open(path, "w") as f:
        f.writelines(json.dumps(dict(r, step_s=2.0) if "f1" in r else r) + "\n" for r in rows)
  out = tmp_path / "results"
  proc = subprocess.run(
      [sys.executable, "launch/compare.py", "--study=async", "--report_only", f"--root={root}",
       f"--out={out}", "--methods=grpo_a0,grpo_a1", "--seeds=0,1", "--steps=12",
       "--hardware=test CPU"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert {"results.md", "results.json", "f1_vs_time.png"} <= set(os.listdir(out))
  saved = json.loads((out / "results.json").read_text())
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last["compare"]["base"] == {
      arm: pytest.approx(saved["table"]["base"][arm]["test_f1"][0], abs=1e-4)
      for arm in ("grpo_a0", "grpo_a1")}

