"""The trainer end to end on the tiny preset: configs, validation, RL loop, resume, eval, SFT."""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.train import config as config_lib
from agentjax.train.checkpoint import CheckpointMismatchError
from agentjax.train.trainer import QuestionStream, eval_benchmarks, train
from agentjax.train import trainer as trainer_module
from tests.trainer_fixtures import run_metrics, tiny_config

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


@pytest.mark.parametrize("preset", ["demo", "qwen3-8b", "qwen3-1.7b"])
def test_cw_grpo_presets_follow_the_official_script(preset):
  config = _config_module("cw_grpo").get_config(preset)
  config_lib.validate(config)
  assert config.algorithm == "cw_grpo" and config.cw.all_zero_fallback == "zero"
  assert config.cw.gamma >= config.cw.inf_threshold  # gamma 100: the code's "infinite" branch
  if preset == "demo":
    assert config.judge.backend == "oracle" and config.rl.reward_metric == "f1"
    return
  # run_qwen3-8b_search_multiturn_cw-grpo.sh (verl 0.6.1)
  assert config.rl.reward_metric == "em" and config.judge.backend == "openai"
  assert (config.rollout.group_size, config.rl.prompts_per_step) == (4, 32)
  assert config.optimizer.lr == 1e-6 and config.optimizer.warmup_steps == int(0.285 * 200)
  assert config.optimizer.final_lr_ratio == 1.0 and config.train.steps == 200
  batch = config.rl.prompts_per_step * config.rollout.group_size
  assert batch // config.rl.minibatch_size == 4 and config.rl.ppo_epochs == 1
  assert (config.rl.kl_coef, config.rl.kl_estimator, config.rl.entropy_coef) == (
      0.001, "low_var_kl", 0.0)
  assert config.rollout.max_turns == 10 and config.rollout.temperature == 1.0
  assert (config.rl.std_estimator, config.rl.std_eps) == ("unbiased", 1e-6)
  assert (config.judge.temperature, config.judge.max_retries) == (0.0, 3)
  assert config.judge.max_tokens == 0 and config.rollout.protocol == "tool_call"
  assert config.model.hf_path.endswith("Qwen3-1.7B" if preset == "qwen3-1.7b" else "Qwen3-8B")


def test_unknown_preset_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown preset 'big'.*demo"):
    _config_module("igpo").get_config("big")


@pytest.mark.parametrize("override, message", [
    ({"algorithm": "ppo2"}, "config.algorithm='ppo2': unknown algorithm"),
    ({"algorithm": "cw_grpo"}, "config.judge.backend='none': algorithm 'cw_grpo' needs per-round"),
    ({"judge.noise": "shuffle"}, "config.judge.noise='shuffle': must be one of"),
    ({"cw.all_zero_fallback": "half"}, "config.cw.all_zero_fallback='half': must be one of"),
    ({"judge.backend": "oracle"}, "config.judge.backend='oracle': algorithm 'igpo' does not read"),
    ({"algorithm": "cw_grpo", "judge.backend": "openai", "judge.base_url": "localhost:8001"},
     "config.judge.base_url='localhost:8001': the openai judge needs an http"),
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
    ({"train.max_skipped_updates": -1}, "config.train.max_skipped_updates=-1: must be an int"),
    ({"train.stall_timeout_s": -1.0}, "config.train.stall_timeout_s=-1.0: must be a number"),
    ({"retrieval.max_failure_rate": 1.0}, "config.retrieval.max_failure_rate=1.0: must be in"),
    ({"retrieval.max_failed_steps": -2}, "config.retrieval.max_failed_steps=-2: must be an"),
    ({"rollout.partial": "sometimes"}, "config.rollout.partial='sometimes': must be one of"),
    ({"rollout.partial": "continue"},
     "config.rollout.partial='continue': reads parameters published during a rollout: needs "
     "train.async_steps >= 1"),
    ({"train.stale": "drop"}, "config.train.max_staleness=-1: train.stale='drop' leaves out"),
    ({"train.stale": "drop", "train.async_steps": 2, "train.max_staleness": 1},
     "config.rollout.partial='off': train.stale='drop' needs rollout.partial='continue'"),
    ({"train.max_staleness": -3}, "config.train.max_staleness=-3: must be an int >= 0"),
    ({"rl.ig_probe_tokens": "joined"}, "config.rl.ig_probe_tokens='joined': must be one of"),
    ({"rl.pack_rows_per_octave": 3}, "config.rl.pack_rows_per_octave=3: must be a power of two"),
    ({"rollout.compact_factor": 1}, "config.rollout.compact_factor=1: must be 0"),
    ({"rollout.row_bucket_factor": 1}, "config.rollout.row_bucket_factor=1: must be 0"),
    ({"rl.probe_width_multiple": 0}, "config.rl.probe_width_multiple=0: must be"),
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
  # ... and half a metrics line: the process was killed in the middle of an append.
  with open(os.path.join(tmp, "b", "metrics.jsonl"), "a") as f:
    f.write('{"reward": 0.5, "st')
  records = []
  handler = logging.Handler()
  handler.emit = lambda record: records.append(record.getMessage())
  logging.getLogger("agentjax.train.trainer").addHandler(handler)
  try:
    b2 = train(config, os.path.join(tmp, "b"))
  finally:
    logging.getLogger("agentjax.train.trainer").removeHandler(handler)
  b2["log_warnings"] = records
  return config, tmp, a, b1, b2


def test_run_writes_metrics_tensorboard_checkpoints_evals_and_export(runs):
  config, tmp, a, _, _ = runs
  workdir = os.path.join(tmp, "a")
  rows = [r for r in run_metrics(workdir) if "reward" in r]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for key in ("reward", "f1", "em", "format_error_rate", "turns", "ig_mean", "ig_std",
              "collapse_fraction", "kl", "clip_fraction", "entropy", "tokens_per_s",
              "rollout_s", "scoring_s", "update_s", "lr", "skipped_updates",
              "mismatch/abs_logp_diff", "mismatch/kl", "mismatch/ratio_out_share",
              "sufficient_unrewarded"):
    assert all(np.isfinite(r[key]) for r in rows), key
  assert all(0.0 <= r["sufficient_unrewarded"] <= 1.0 for r in rows)
  assert all(r["skipped_updates"] == 0 for r in rows)
  # The sampler's log-probs are the scoring pass's on CPU in float32 (rl/offpolicy.py).
  assert all(r["mismatch/abs_logp_diff"] < 1e-4 and r["mismatch/ratio_out_share"] == 0.0
             for r in rows)
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
  rows_a = {r["step"]: r for r in run_metrics(os.path.join(tmp, "a"))}
  rows_b = {r["step"]: r for r in run_metrics(os.path.join(tmp, "b"))}
  assert sorted(rows_a) == sorted(rows_b) == [1, 2, 3]
  for step in (1, 2, 3):
    for key, value in rows_a[step].items():
      if key not in TIMING and not key.startswith("sys/"):
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
  step3 = [r["reward"] for r in run_metrics(os.path.join(tmp, "b"))
           if "reward" in r and r["step"] == 3]
  assert step3 == [pytest.approx([value for i, _, value in rewards if i == kept[0]][0])]


def test_async_steps_overlap_rollouts_and_restart_them_on_resume(runs):
  """train.async_steps = 1 on run A's config: step 1 is run A's (its rollout by the same
  version-0 parameters), step 2's rollout is by version 0 (staleness 1, logged) so the run goes
  its own way. Stopped after step 2 and resumed, the in-flight rollout restarts from the
  restored parameters: the resumed step 3 is then exactly a synchronous step 3 from the same
  checkpoint (staleness 0)."""
  import shutil
  config, tmp, _, _, _ = runs
  rows_a = {r["step"]: r for r in run_metrics(os.path.join(tmp, "a")) if "reward" in r}
  c = config.copy_and_resolve_references()
  c.train.async_steps = 1
  config_lib.validate(c)
  out = train(c, os.path.join(tmp, "async"), stop_after=2)
  assert out["step"] == 2
  rows = {r["step"]: r for r in run_metrics(os.path.join(tmp, "async")) if "reward" in r}
  assert [rows[s]["async/staleness"] for s in (1, 2)] == [0.0, 1.0]
  for key in ("reward", "f1", "turns", "ig_mean", "search_queries", "kl", "loss"):
    assert rows[1][key] == rows_a[1][key], key
  assert all(rows[s]["async/wait_s"] >= 0 and np.isfinite(rows[s]["loss"]) for s in (1, 2))
  shutil.copytree(os.path.join(tmp, "async"), os.path.join(tmp, "async_sync"))
  resumed = train(c, os.path.join(tmp, "async"))
  c.train.async_steps = 0
  synced = train(c, os.path.join(tmp, "async_sync"))
  assert resumed["step"] == synced["step"] == 3
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["params"]),
               jax.device_get(synced["params"]))
  last = [r for r in run_metrics(os.path.join(tmp, "async")) if r.get("step") == 3 and "reward" in r]
  assert last[-1]["async/staleness"] == 0.0


def test_incompatible_config_is_refused_naming_the_field(runs, monkeypatch):
  config, tmp, _, _, _ = runs
  changed = config.copy_and_resolve_references()
  changed.optimizer.clip_norm = 0.5
  before = sorted(os.listdir(os.path.join(tmp, "a", "checkpoints")))

  def no_loading(*args, **kwargs):
    raise AssertionError("the model was loaded before the mismatch was found")

  # Refused before the model loads (minutes at 7B), not at restore.
  monkeypatch.setattr(trainer_module, "load_model", no_loading)
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
       f"--hf_path={os.path.join(tmp, 'a', 'hf_export')}", f"--output={out}", "--samples=2",
       "--temperature=1.0", *overrides],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[0].split() == ["benchmark", "n", "acc", "EM", "F1"]
  assert lines[1].startswith("synthworld")
  last = json.loads(lines[-1])
  assert last["synthworld"]["n"] == 2 and "average" in last and "overall" in last
  assert last["samples"] == 2 and last["temperature"] == 1.0 and last["judge"]["backend"]
  with open(out) as f:
    saved = json.load(f)
  assert len(saved["per_question"]["synthworld"]) == 4  # 2 questions x 2 samples
  assert saved["judge"] == last["judge"]


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
                      [r for r in run_metrics(workdir) if "reward" in r])
  (p0, rows0), (p1, rows1) = out[False], out[True]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               jax.device_get(p0), jax.device_get(p1))
  for r0, r1 in zip(rows0, rows1):
    assert r0["reward"] == r1["reward"] and r0["turns"] == r1["turns"]
    assert r0["gt_entropy_reduction"] == 0.0 and r0["ig_mean"] == 0.0
    assert np.isfinite(r1["gt_entropy_reduction"])
    assert r1["gt_entropy_reduction"] == pytest.approx(
        r1["gt_logprob_after"] - r1["gt_logprob_before"])
  # Where some trajectory searched, the reduction is the mean of its summed information gains
  # (telescoping), so both are zero or both are not.
  assert any(r["ig_mean"] != 0.0 for r in rows1) == any(
      r["gt_entropy_reduction"] != 0.0 for r in rows1)
  # SynthWorld questions carry a gold chain: with the probes, each step logs IG against "this
  # turn retrieved a new gold document" as sums over the same non-answer turns ig_mean averages.
  assert not any("ig_gold/turns" in r for r in rows0)
  for r in rows1:
    assert 0 <= r["ig_gold/new_gold"] <= r["ig_gold/turns"]
    if r["ig_gold/turns"]:
      assert r["ig_gold/sum_ig"] / r["ig_gold/turns"] == pytest.approx(r["ig_mean"], abs=1e-5)


# ------------------------------------------------------------------------------ faults


def _fault_config(world_dir, tokenizer_dir, tmp, algorithm="grpo", steps=2):
  """The tiny preset without evals or export: the cheapest run that exercises the loop."""
  config = tiny_config(world_dir, tokenizer_dir, str(tmp), algorithm=algorithm, steps=steps)
  config.train.eval_every = 0
  config.train.export_hf = False
  config.train.checkpoint_every = 10  # checkpoints only where a rule or the run's end asks
  config.data.eval_size = 2
  config.train.eval_batch = 2
  return config


def test_resume_drops_a_half_written_metrics_line(runs):
  # The `runs` fixture appends half a line to run b's metrics.jsonl (a kill mid-append) before
  # resuming it; the resume must drop it, say so naming the file and line, and go on.
  _, tmp, _, _, b2 = runs
  assert b2["step"] == 3
  warnings = b2["log_warnings"]
  path = os.path.join(tmp, "b", "metrics.jsonl")
  assert any(f"{path}:" in w and "dropping an unreadable metrics line" in w for w in warnings)
  assert all(line.strip() for line in open(path))
  assert run_metrics(os.path.join(tmp, "b"))  # every line parses again


def test_eval_runs_after_the_checkpoint_of_its_step(world_dir, tokenizer_dir, tmp_path,
                                                    monkeypatch):
  from agentjax.train import trainer
  config = _fault_config(world_dir, tokenizer_dir, tmp_path, steps=5)
  config.train.eval_every = 2
  config.train.checkpoint_every = 5  # only the evals force checkpoints at steps 2 and 4
  workdir = str(tmp_path / "eval_faults")
  real_evaluate = trainer.evaluate
  ckpts = lambda: sorted(os.listdir(os.path.join(workdir, "checkpoints")))  # noqa: E731

  def crash(*args, **kwargs):
    raise RuntimeError("injected: out of memory during eval")

  monkeypatch.setattr(trainer, "evaluate", crash)
  with pytest.raises(RuntimeError, match="injected"):
    train(config, workdir)
  assert ckpts() == ["2"]  # the eval of step 2 crashed after the step was saved

  sigterm_at = []

  def sigterm_during_eval(engine, params, records, batch_size):
    if len(sigterm_at) == 1:  # the 2nd eval of this run: step 4's
      os.kill(os.getpid(), signal.SIGTERM)  # the scheduler preempts while eval runs
    sigterm_at.append(None)
    return real_evaluate(engine, params, records, batch_size)

  monkeypatch.setattr(trainer, "evaluate", sigterm_during_eval)
  out = train(config, workdir)  # resumes at 2, redoes step 2's eval, trains 3-4, stops in eval 4
  assert out["step"] == 4 and sorted(out["evals"]) == [2, 4]
  assert ckpts() == ["2", "4"]  # SIGTERM during the eval: the step's checkpoint is there
  assert os.path.exists(os.path.join(workdir, "eval", "4.json"))
  monkeypatch.setattr(trainer, "evaluate", real_evaluate)
  out = train(config, workdir)
  assert out["step"] == 5 and sorted(out["evals"]) == [5]  # eval 4 finished: not redone
  assert [r["step"] for r in run_metrics(workdir) if "reward" in r] == [1, 2, 3, 4, 5]


def test_a_streak_of_non_finite_updates_stops_the_run_with_a_checkpoint(
    world_dir, tokenizer_dir, tmp_path, monkeypatch):
  from agentjax.train import step as step_lib
  from agentjax.train.trainer import TrainingDivergedError
  config = _fault_config(world_dir, tokenizer_dir, tmp_path, steps=4)
  config.train.max_skipped_updates = 3  # 2 updates a step: the 2nd step ends the streak
  real = step_lib.compute_advantages

  def nan_advantages(*args, **kwargs):
    adv, stats = real(*args, **kwargs)
    return adv * jnp.nan, stats

  monkeypatch.setattr(step_lib, "compute_advantages", nan_advantages)
  workdir = str(tmp_path / "nan")
  with pytest.raises(TrainingDivergedError, match="train.max_skipped_updates=3"):
    train(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
  rows = [r for r in run_metrics(workdir) if "reward" in r]
  assert [(r["step"], r["skipped_updates"]) for r in rows] == [(1, 2.0), (2, 2.0)]
  # The checkpoint holds the last good parameters: here the initial ones (nothing was applied).
  from agentjax.parallel import make_mesh
  from agentjax.train.checkpoint import abstract_state
  from agentjax.train.trainer import init_train_state, load_model, make_checkpointer
  mesh = make_mesh(1, -1, 1)
  cfg, initial, _ = load_model(config, mesh)
  _, state = init_train_state(config, cfg, jax.tree.map(jnp.copy, initial), mesh)
  ckpt = make_checkpointer(config, workdir)
  saved, data_state, step = ckpt.restore_or_none(abstract_state(state))
  ckpt.close()
  assert step == 2 and data_state["faults"]["skipped_streak"] == 4
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(saved["params"]),
               jax.device_get(initial))


class _FlakyBackend:
  """The run's real retriever behind a switch: while `down`, every query fails."""

  def __init__(self, inner):
    self.inner, self.down, self.calls = inner, False, 0

  def search(self, queries, topk):
    from agentjax.retrieval.base import SearchResponse
    self.calls += 1
    if self.down:
      return SearchResponse.failed(len(queries), "injected: connection refused")
    return self.inner.search(queries, topk)


def _search_every_turn(monkeypatch, down_at_steps):
  """Every action is a search (so every step queries the retriever), and the retriever is down
  during the steps in `down_at_steps` (0-based). Returns the backend."""
  from agentjax.agent.protocol import Action
  from agentjax.agent.rollout import RolloutEngine
  from agentjax.train import step as step_lib
  from agentjax.train import trainer
  monkeypatch.setattr(RolloutEngine, "parse", lambda self, text: Action("search", "zorvath"))
  made = []
  real_backend = trainer.make_search_backend
  monkeypatch.setattr(trainer, "make_search_backend",
                      lambda config, mesh=None: made.append(_FlakyBackend(
                          real_backend(config, mesh))) or made[-1])
  real_call = step_lib.RLStep.__call__

  def call(self, state, questions, step):
    made[-1].down = step in down_at_steps
    return real_call(self, state, questions, step)

  monkeypatch.setattr(step_lib.RLStep, "__call__", call)
  return made


def test_a_retriever_that_stays_down_stops_the_run_naming_it(world_dir, tokenizer_dir, tmp_path,
                                                             monkeypatch):
  from agentjax.train.trainer import RetrieverUnavailableError
  config = _fault_config(world_dir, tokenizer_dir, tmp_path, steps=4)
  config.retrieval.max_failed_steps = 2
  made = _search_every_turn(monkeypatch, down_at_steps=range(4))
  workdir = str(tmp_path / "down")
  with pytest.raises(RetrieverUnavailableError) as err:
    train(config, workdir)
  assert "bm25 retriever over" in str(err.value)
  assert "injected: connection refused" in str(err.value)
  assert "retrieval.max_failed_steps=2" in str(err.value)
  assert made[-1].calls > 0
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
  rows = [r for r in run_metrics(workdir) if "reward" in r]
  assert [r["search_failure_rate"] for r in rows] == [1.0, 1.0]


def test_a_retriever_that_comes_back_within_the_window_costs_nothing(
    world_dir, tokenizer_dir, tmp_path, monkeypatch):
  config = _fault_config(world_dir, tokenizer_dir, tmp_path, steps=3)
  config.retrieval.max_failed_steps = 2
  _search_every_turn(monkeypatch, down_at_steps={0, 2})
  out = train(config, str(tmp_path / "flaky"))
  assert out["step"] == 3
  rows = [r for r in run_metrics(str(tmp_path / "flaky")) if "reward" in r]
  assert [r["search_failure_rate"] for r in rows] == [1.0, 0.0, 1.0]
  assert all(r["search_queries"] > 0 for r in rows)


# ------------------------------------------------------------------------------ SFT


def test_sft_trains_exports_and_a_rerun_is_a_no_op(world_dir, tokenizer_dir, tmp_path):
  config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), algorithm="sft")
  out = train(config, str(tmp_path / "sft"))
  assert os.path.isfile(os.path.join(out["hf_export"], "config.json"))
  assert os.path.isfile(os.path.join(out["hf_export"], "tokenizer_config.json"))
  assert [r["step"] for r in run_metrics(str(tmp_path / "sft"))] == [1, 2, 3]
  assert train(config, str(tmp_path / "sft"))["skipped"]


def test_sft_preempted_and_resumed_repeats_the_uninterrupted_run(world_dir, tokenizer_dir,
                                                                 tmp_path):
  config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), algorithm="sft")
  config.sft.checkpoint_every = 0  # only the preemption checkpoints
  whole = train(config, str(tmp_path / "whole"))
  cut = train(config, str(tmp_path / "cut"), stop_after=2)
  assert cut["hf_export"] is None and cut["step"] == 2
  assert sorted(os.listdir(str(tmp_path / "cut" / "checkpoints"))) == ["2"]
  resumed = train(config, str(tmp_path / "cut"))
  assert resumed["step"] == 3 and resumed["hf_export"]
  rows = lambda d: [{k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
                    for r in run_metrics(str(tmp_path / d))]
  assert rows("cut") == rows("whole")  # same batches, identical losses (one machine, CPU)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(whole["params"]),
               jax.device_get(resumed["params"]))


def test_fault_watch_counts_streaks_across_steps():
  from agentjax.train.step import StepOutput
  from agentjax.train.trainer import (FaultWatch, RetrieverUnavailableError,
                                      TrainingDivergedError)

  def out(skipped=(0, 0), queries=4, failed=0, error=None):
    return StepOutput(state={}, metrics={}, update_skipped=list(skipped), search_queries=queries,
                      search_failed=failed, search_last_error=error)

  w = FaultWatch(max_skipped_updates=3, max_failure_rate=0.5, max_failed_steps=2, backend="b")
  assert w.observe(out(skipped=(0, 1)), 1) is None and w.skipped_streak == 1
  assert w.observe(out(skipped=(1, 0)), 2) is None and w.skipped_streak == 0  # an applied update
  assert w.observe(out(skipped=(0, 1)), 3) is None
  assert isinstance(w.observe(out(skipped=(1, 1)), 4), TrainingDivergedError)  # 3 across steps
  w = FaultWatch(max_skipped_updates=0, max_failure_rate=0.5, max_failed_steps=2, backend="b")
  assert w.observe(out(skipped=(1,) * 10), 1) is None  # 0: never stop
  # Exactly at the rate is not above it; a step without queries leaves the count as it is.
  assert w.observe(out(failed=2), 1) is None and w.failed_steps == 0
  assert w.observe(out(failed=3, error="e1"), 2) is None and w.failed_steps == 1
  assert w.observe(out(queries=0), 3) is None and w.failed_steps == 1
  err = w.observe(out(failed=4, error="e2"), 4)
  assert isinstance(err, RetrieverUnavailableError) and "last error: e2" in str(err)
  # The counters go through the checkpoint's data state.
  again = FaultWatch.from_config(_config_module("grpo").get_config("demo"),
                                 {"position": 0, "faults": w.state()})
  assert again.state() == w.state() == {"skipped_streak": 0, "failed_steps": 2}


def test_partial_rollouts_are_refused_with_several_roles():
  """rollout.partial reads one policy's published parameters: DAC's two roles are refused at
  validation, naming the field."""
  config = _config_module("dac").get_config("demo")
  config.train.async_steps, config.rollout.partial = 1, "continue"
  config.model.lora.init = ""  # the demo's warm start (a folder this test does not build)
  with pytest.raises(config_lib.ConfigError, match=r"config\.rollout\.partial='continue'.*"
                     "several roles"):
    config_lib.validate(config)


@pytest.mark.parametrize("async_steps,questions", [(0, 3), (1, 5)])
def test_a_run_compiles_no_program_after_its_first_step(world_dir, tokenizer_dir, tmp_path,
                                                        async_steps, questions):
  """rollout.warm_up runs the rollouts' programs (training and eval) before step 1: a run then
  compiles nothing after step 1, evals included, synchronous and asynchronous. Each
  case has batch sizes no other test uses (lanes of 3 and 5 slots), so that no rollout program
  of another test is reused. Scoring and updates keep one width here (rl.trim_batches off;
  trimmed widths and packed row counts are ladders of their own, not warmed)."""
  config = tiny_config(world_dir, tokenizer_dir, str(tmp_path), algorithm="grpo", steps=4)
  config.rl.prompts_per_step = questions
  config.train.eval_batch = questions
  config.rl.trim_batches = False
  config.train.async_steps = async_steps
  config.train.export_hf = False
  config.train.checkpoint_every = 10
  config.rollout.warm_up = True
  workdir = str(tmp_path / "run")
  train(config, workdir)
  compiles = [r["compiles"] for r in run_metrics(workdir, "reward")]
  assert len(compiles) == 4 and compiles == compiles[:1] * 4, compiles  # an eval after step 2
  assert os.path.isfile(os.path.join(workdir, "eval", "2.json"))
