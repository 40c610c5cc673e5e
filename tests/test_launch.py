"""launch/demo.py (what `make demo` runs) end to end, shortened: every stage runs and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_pipeline_runs_every_stage_and_reports(tmp_path):
  root = tmp_path / "demo"
  # A relative --root, as `make demo` passes (runs/demo): every writer must cope (orbax does not).
  proc = subprocess.run(
      [sys.executable, "launch/demo.py", f"--root={os.path.relpath(root, ROOT)}",
       "--sft_config.sft.steps=3",
       "--sft_config.sft.batch_size=2", "--sft_config.sft.micro_batches=1",
       "--rl_config.train.steps=1",
       "--rl_config.rl.prompts_per_step=2", "--rl_config.rollout.group_size=2",
       "--rl_config.rl.minibatch_size=4", "--rl_config.data.eval_size=4",
       "--rl_config.train.eval_batch=4"],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = proc.stdout.strip().splitlines()
  last = json.loads(lines[-1])
  assert set(last) == {"demo", "sft_dev_f1", "rl_dev_f1", "dev_n", "gain_stderr", "minutes"}
  assert last["demo"] == "igpo" and last["dev_n"] == 4
  text = proc.stdout
  for stage in ("[1/4] SynthWorld", "[2/4] SFT", "[3/4] IGPO", "[4/4] dev F1", "TensorBoard:",
                "Checkpoints:", "1-hop (", "2-hop ("):
    assert stage in text, stage
  with open(root / "synthworld" / "world.json") as f:
    assert json.load(f)["stop_early_rate"] == 0.5  # the hasty teacher of the demo's SFT data
  assert os.path.isfile(root / "igpo" / "hf_export" / "config.json")
  assert os.path.isdir(root / "igpo" / "checkpoints" / "1")


def test_demo_rejects_a_bad_config_before_running(tmp_path):
  proc = subprocess.run([sys.executable, "launch/demo.py", f"--root={tmp_path}/d",
                         "--rl_config.algorithm=ppo9"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode != 0 and "config.algorithm='ppo9': unknown algorithm" in proc.stderr
  assert not os.path.exists(tmp_path / "d" / "synthworld")
