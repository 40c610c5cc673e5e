"""The launch scripts run end to end (as `make demo` runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_runs_and_reports():
  proc = subprocess.run([sys.executable, "launch/demo.py", "--config=configs/base.py:tiny-qwen3",
                         "--config.model.dtype=bfloat16"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last["demo"] == "forward" and last["logits_shape"] == [4, 16, 512]


def test_demo_rejects_unknown_preset():
  proc = subprocess.run([sys.executable, "launch/demo.py", "--config=configs/base.py:qwen9-1t"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "unknown model preset 'qwen9-1t'" in proc.stderr
