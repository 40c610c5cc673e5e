"""The trainer end to end on the tiny preset: configs, validation, RL loop, resume, eval, SFT."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from agentjax.train import config as config_lib
from agentjax.train.checkpoint import CheckpointMismatchError
from agentjax.train.trainer import QuestionStream, eval_benchmarks, train
from tests.trainer_fixtures import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = ("igpo", "grpo", "drgrpo", "rloo", "reinforcepp", "gspo", "sft")
PRESETS = ("demo", "qwen2.5-3b", "qwen2.5-7b", "qwen3-8b")
# Metrics that must be identical between an uninterrupted and a resumed run (timings are not).
TIMING = ("rollout_s", "scoring_s", "update_s", "step_s", "search_s", "tokens_per_s",
          "sampled_tokens_per_s", "eval/seconds", "compiles")


def _config_module(name):
  import importlib
  return importlib.import_module(f"configs.{name}")


@pytest.fixture(scope="module")
def tokenizer_dir(tokenizer):
  return tokenizer.name_or_path


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _tb_events(workdir):
  """Every Event of a run's TensorBoard files in the order they were written (files by their
  first event's wall time), read as TFRecords (8-byte length, 4-byte CRC, payload, 4-byte CRC)
  without TensorFlow."""
  import struct
  from tensorboardX.proto.event_pb2 import Event
  files = []
  for path in glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*")):
    with open(path, "rb") as f:
      data = f.read()
    events, at = [], 0
    while at < len(data):
      (n,) = struct.unpack("<Q", data[at:at + 8])
      events.append(Event.FromString(data[at + 12:at + 12 + n]))
      at += 12 + n + 4
    files.append(events)
  return [e for events in sorted(files, key=lambda es: es[0].wall_time) for e in events]


# ------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("name", CONFIG_FILES)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_config_preset_validates(name, preset):
  config = _config_module(name).get_config(preset)
  config_lib.validate(config)
  if preset != "demo" and name != "sft":
    # The IGPO paper's settings.
    assert config.rollout.group_size == 16 and config.rl.prompts_per_step == 32
    assert config.optimizer.lr == 1e-6 and config.rl.kl_coef == 0.001
    assert config.rl.kl_estimator == "low_var_kl" and config.rollout.max_turns == 10
    assert config.rollout.temperature == 1.0 and config.rl.gamma == 1.0
    if name != "gspo":
      assert config.rl.clip_low == config.rl.clip_high == 0.2
    # Group std of each paper's code: IGPO's sqrt(population var + 1e-8); verl's unbiased
    # std + 1e-6 for the baselines (the paper ran them in its verl code).
    assert (config.rl.std_estimator, config.rl.std_eps) == (
        ("sqrt_var_eps", 1e-8) if name == "igpo" else ("unbiased", 1e-6))
  elif name != "sft":  # the demo keeps the population std + 1e-6 its numbers were measured with
    assert (config.rl.std_estimator, config.rl.std_eps) == ("population", 1e-6)
  if name == "igpo":  # the paper pools IG and outcome rewards; the tiny demo keeps them apart
    assert config.rl.igpo_norm == ("separate" if preset == "demo" else "joint")
    # IG as a log-prob difference: the official train.sh (the paper's §3.2 says probabilities).
    assert config.rl.ig_mode == "log_prob"


def test_unknown_preset_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown preset 'big'.*demo"):
    _config_module("igpo").get_config("big")


@pytest.mark.parametrize("override, message", [
    ({"algorithm": "ppo2"}, "config.algorithm='ppo2': unknown algorithm"),
    ({"algorithm": "cw_grpo"}, "config.algorithm='cw_grpo': needs per-round judge scores"),
    ({"rollout.group_size": 1}, "config.rollout.group_size=1: algorithm 'igpo'"),
    ({"rollout.max_new_tokens": 600, "rollout.max_obs_tokens": 500},
     "config.rollout.max_total_tokens=512: leaves no room"),
    ({"rl.minibatch_size": 48}, "config.rl.minibatch_size=48: must divide"),
    ({"rl.loss": "clip"}, "config.rl.loss='clip': unknown policy loss"),
    ({"data.train": "nq,squad"}, "config.data.train='nq,squad': unknown benchmark 'squad'"),
    ({"retrieval.backend": "http", "retrieval.url": ""}, "config.retrieval.url=''"),
    ({"optimizer.lr": 0.0}, "config.optimizer.lr=0.0: must be a positive number"),
    ({"model.hf_path": "", "model.preset": "qwen9"}, "config.model.preset='qwen9'"),
    ({"mesh.fsdp": 0}, "config.mesh.fsdp=0"),
    ({"rl.igpo_ig_weight": 0.0, "rl.igpo_outcome_weight": 0.0},
     "config.rl.igpo_ig_weight=0.0: with rl.igpo_outcome_weight=0 IGPO has no reward"),
    ({"rl.igpo_outcome_weight": -1.0}, "config.rl.igpo_outcome_weight=-1.0: must be >= 0"),
    ({"rl.std_estimator": "bessel"}, "config.rl.std_estimator='bessel': must be one of"),
    ({"rl.std_eps": -1e-8}, "config.rl.std_eps=-1e-08: must be >= 0"),
    ({"model.param_dtype": "float16"},  # QwenConfig refuses it: caught here, before loading
     "config.model.param_dtype='float16': must be one of ['float32', 'bfloat16']"),
])
def test_bad_config_names_the_field(override, message):
  config = _config_module("igpo").get_config("demo")
  for key, value in override.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config)
  assert message in str(e.value)


def test_validation_and_qwen_config_agree_on_dtypes_and_share_config_error():
  from agentjax.models.qwen import ConfigError, QwenConfig
  config = _config_module("igpo").get_config("demo")
  for dtype in ("float32", "bfloat16", "float16", "int8"):
    config.model.dtype = dtype
    try:
      QwenConfig(dtype=dtype)
    except ConfigError:
      with pytest.raises(ConfigError, match=f"config.model.dtype='{dtype}'"):  # the model's class
        config_lib.validate(config)
    else:
      config_lib.validate(config)
  assert config_lib.ConfigError is ConfigError


def test_reinforcepp_allows_a_group_of_one():
  config = _config_module("reinforcepp").get_config("demo")
  config.rollout.group_size = 1
  config.rl.minibatch_size = 8
  config_lib.validate(config)


def test_launch_fails_on_a_bad_config_before_compiling(tmp_path):
  proc = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/grpo.py:demo",
       f"--workdir={tmp_path}/run", "--config.rollout.group_size=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert "config.rollout.group_size=1: algorithm 'grpo'" in proc.stderr
  assert not os.path.exists(tmp_path / "run")  # nothing loaded, compiled or written


# ------------------------------------------------------------------------------ data order


def test_question_stream_is_a_deterministic_epoch_permutation():
  records = [{"id": str(i)} for i in range(7)]
  stream = QuestionStream(records, seed=3)
  first = [r["id"] for r in stream.take(0, 14)]
  assert sorted(first[:7]) == sorted(first[7:]) == sorted(str(i) for i in range(7))
  assert first[:7] != first[7:]  # a fresh permutation per epoch
  # Any window equals the same slice of the whole sequence: the position alone is the state.
  assert [r["id"] for r in stream.take(5, 6)] == first[5:11]
  assert [r["id"] for r in QuestionStream(records, seed=3).take(0, 14)] == first


# ------------------------------------------------------------------------------ RL runs


@pytest.fixture(scope="module")
def runs(world_dir, tokenizer_dir, tmp_path_factory):
  """Run A: 3 IGPO steps uninterrupted. Run B: the same config preempted after 2 steps, then the
  same call again (it resumes)."""
  tmp = str(tmp_path_factory.mktemp("runs"))
  config = tiny_config(world_dir, tokenizer_dir, tmp)
  a = train(config, os.path.join(tmp, "a"))
  b1 = train(config, os.path.join(tmp, "b"), stop_after=2)
  # What a run killed between checkpoints leaves behind: a step logged past its checkpoint.
  from tensorboardX import SummaryWriter
  with SummaryWriter(os.path.join(tmp, "b", "tensorboard"), filename_suffix=".stray") as stray:
    stray.add_scalar("reward", -1.0, 3)
  b2 = train(config, os.path.join(tmp, "b"))
  return config, tmp, a, b1, b2


def test_run_writes_metrics_tensorboard_checkpoints_evals_and_export(runs):
  config, tmp, a, _, _ = runs
  workdir = os.path.join(tmp, "a")
  rows = [r for r in _metrics(workdir) if "reward" in r]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for key in ("reward", "f1", "em", "format_error_rate", "turns", "ig_mean", "ig_std",
              "collapse_fraction", "kl", "clip_fraction", "entropy", "tokens_per_s",
              "rollout_s", "scoring_s", "update_s", "lr", "skipped_updates"):
    assert all(np.isfinite(r[key]) for r in rows), key
  assert all(r["skipped_updates"] == 0 for r in rows)
  # Compilations are counted: most happen in the first step (later ones only for new bucketed
  # widths and the eval engine at step 2), never one set per step.
  assert rows[-1]["compiles"] - rows[0]["compiles"] < rows[0]["compiles"]
  # The schedule counts optimizer updates: warmup 1 step = 2 updates here, from lr 0.
  assert rows[0]["lr"] == 0.0 and rows[1]["lr"] == pytest.approx(config.optimizer.lr)
  assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[-1]["kl"] > 0  # moved off ref
  assert glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "3"]  # keep 2
  assert sorted(os.listdir(os.path.join(workdir, "eval"))) == ["2.json", "3.json"]
  assert a["step"] == 3 and sorted(a["evals"]) == [2, 3]
  # The export is the final policy.
  from agentjax.models.qwen.checkpoint import load_hf
  _, exported = load_hf(a["hf_export"])
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(exported),
               jax.device_get(a["params"]))


def test_resumed_run_repeats_the_uninterrupted_one(runs):
  _, tmp, a, b1, b2 = runs
  assert b1["step"] == 2 and b1["hf_export"] is None  # preempted: no export yet
  assert b2["step"] == 3
  rows_a = {r["step"]: r for r in _metrics(os.path.join(tmp, "a"))}
  rows_b = {r["step"]: r for r in _metrics(os.path.join(tmp, "b"))}
  assert sorted(rows_a) == sorted(rows_b) == [1, 2, 3]
  for step in (1, 2, 3):
    for key, value in rows_a[step].items():
      if key not in TIMING:
        assert rows_b[step][key] == value, (step, key)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a["params"]),
               jax.device_get(b2["params"]))
  # TensorBoard is told to drop what the preempted run logged past its checkpoint (step 2): a
  # purge marker at step 3 after the stray step-3 event, then the resumed run's own step 3.
  from tensorboardX.proto.event_pb2 import SessionLog
  events = _tb_events(os.path.join(tmp, "b"))
  rewards = [(i, e.step, v.simple_value) for i, e in enumerate(events)
             for v in e.summary.value if v.tag == "reward"]
  purges = [(i, e.step) for i, e in enumerate(events)
            if e.session_log.status == SessionLog.START]
  assert [step for _, step in purges] == [3]
  stray = [i for i, step, value in rewards if step == 3 and value == -1.0]
  kept = [i for i, step, value in rewards if step == 3 and value != -1.0]
  assert len(stray) == len(kept) == 1 and stray[0] < purges[0][0] < kept[0]
  step3 = [r["reward"] for r in _metrics(os.path.join(tmp, "b"))
           if "reward" in r and r["step"] == 3]
  assert step3 == [pytest.approx([value for i, _, value in rewards if i == kept[0]][0])]


def test_incompatible_config_is_refused_naming_the_field(runs):
  config, tmp, _, _, _ = runs
  changed = config.copy_and_resolve_references()
  changed.optimizer.clip_norm = 0.5
  before = sorted(os.listdir(os.path.join(tmp, "a", "checkpoints")))
  with pytest.raises(CheckpointMismatchError, match="optimizer.clip_norm"):
    train(changed, os.path.join(tmp, "a"))
  assert sorted(os.listdir(os.path.join(tmp, "a", "checkpoints"))) == before


def test_eval_from_checkpoint_and_from_export_agree(runs):
  config, tmp, a, _, _ = runs
  from_ckpt = eval_benchmarks(config, workdir=os.path.join(tmp, "a"))
  from_hf = eval_benchmarks(config, hf_path=a["hf_export"])
  with open(os.path.join(tmp, "a", "eval", "3.json")) as f:
    in_training = json.load(f)
  assert from_ckpt["benchmarks"]["synthworld"]["n"] == 4
  answers = lambda r: [q["answer"] for q in r]  # noqa: E731
  assert answers(from_ckpt["per_question"]["synthworld"]) == \
      answers(from_hf["per_question"]["synthworld"]) == answers(in_training["per_question"])
  assert from_ckpt["benchmarks"] == from_hf["benchmarks"]


def test_launch_eval_prints_a_table_and_json(runs):
  config, tmp, _, _, _ = runs
  overrides = [f"--config.{k}={v}" for k, v in {
      "model.hf_path": "", "model.preset": "tiny", "model.tokenizer_path": config.model.tokenizer_path,
      "data.manual_dir": config.data.manual_dir, "data.data_dir": config.data.data_dir,
      "data.eval_size": 2, "retrieval.corpus_path": config.retrieval.corpus_path,
      "retrieval.index_dir": config.retrieval.index_dir, "rollout.max_total_tokens": 512,
      "rollout.max_new_tokens": 24, "rollout.max_obs_tokens": 96, "rollout.max_turns": 2,
      "train.eval_batch": 2}.items()]
  out = os.path.join(tmp, "eval_out.json")
  proc = subprocess.run(
      [sys.executable, "launch/eval.py", "--config=configs/igpo.py:demo",
       f"--hf_path={os.path.join(tmp, 'a', 'hf_export')}", f"--output={out}", *overrides],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[0].split() == ["benchmark", "n", "EM", "F1"] and lines[1].startswith("synthworld")
  last = json.loads(lines[-1])
  assert last["synthworld"]["n"] == 2 and "average" in last
  with open(out) as f:
    assert len(json.load(f)["per_question"]["synthworld"]) == 2


def test_missing_eval_split_names_the_field(runs):
  config, tmp, _, _, _ = runs
  changed = config.copy_and_resolve_references()
  changed.data.eval_split = "validation"
  with pytest.raises(config_lib.ConfigError, match="config.data.eval_split='validation'"):
    eval_benchmarks(changed, hf_path=os.path.join(tmp, "a", "hf_export"))


def test_probe_all_measures_gt_entropy_without_changing_grpo_training(world_dir, tokenizer_dir,
                                                                     tmp_path):
  # rl.probe_all runs IGPO's ground-truth probes in a GRPO run for its metrics only: the
  # training (rollouts, advantages, updates) is the same as without them.
  out = {}
  for probe_all in (False, True):
    config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), algorithm="grpo", steps=2)
    config.rl.probe_all = probe_all
    config.train.eval_every = 0
    config.train.export_hf = False
    workdir = str(tmp_path / f"probe_{probe_all}")
    out[probe_all] = (train(config, workdir)["params"],
                      [r for r in _metrics(workdir) if "reward" in r])
  (p0, rows0), (p1, rows1) = out[False], out[True]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               jax.device_get(p0), jax.device_get(p1))
  for r0, r1 in zip(rows0, rows1):
    assert r0["reward"] == r1["reward"] and r0["turns"] == r1["turns"]
    assert r0["gt_entropy_reduction"] == 0.0 and r0["ig_mean"] == 0.0
    assert np.isfinite(r1["gt_entropy_reduction"])
  # Where some trajectory searched, the reduction is the mean of its summed information gains
  # (telescoping), so both are zero or both are not.
  assert any(r["ig_mean"] != 0.0 for r in rows1) == any(
      r["gt_entropy_reduction"] != 0.0 for r in rows1)


# ------------------------------------------------------------------------------ SFT


def test_sft_trains_exports_and_a_rerun_is_a_no_op(world_dir, tokenizer_dir, tmp_path):
  config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), algorithm="sft")
  out = train(config, str(tmp_path / "sft"))
  assert os.path.isfile(os.path.join(out["hf_export"], "config.json"))
  assert os.path.isfile(os.path.join(out["hf_export"], "tokenizer_config.json"))
  assert [r["step"] for r in _metrics(str(tmp_path / "sft"))] == [1, 2, 3]
  assert train(config, str(tmp_path / "sft"))["skipped"]
