"""Multi-host training on loopback: 2 processes x 4 CPU devices == 1 process x 8 devices.

Each layout runs tests/multihost_train_check.py: two RL steps with a checkpoint save (step 1) and
a restore, through jax.distributed.initialize on 127.0.0.1 with gloo CPU collectives.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "multihost_train_check.py")
TIMING = ("rollout_s", "scoring_s", "update_s", "step_s", "search_s", "tokens_per_s",
          "sampled_tokens_per_s", "eval/seconds", "compiles")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(layout: str, num_processes: int, world_dir, tokenizer_dir, tmp_path) -> dict:
  base = tmp_path / layout
  base.mkdir()
  out = str(base / "result.npz")
  args = [f"--workdir={base / 'run'}", f"--world_dir={world_dir}",
          f"--tokenizer_dir={tokenizer_dir}", f"--tmp={base}", f"--out={out}",
          f"--num_processes={num_processes}", f"--port={_free_port()}"]
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  procs = [subprocess.Popen([sys.executable, SCRIPT, *args, f"--process_id={i}"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(num_processes)]
  outputs = [p.communicate(timeout=900) for p in procs]
  for i, (p, (stdout, stderr)) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"{layout} process {i}:\n{stderr[-4000:]}"
    assert f"OK {i}" in stdout
  data = np.load(out)
  return {"metrics": json.loads(str(data["metrics"])),
          "params": {k: data[k] for k in data.files if k != "metrics"}}


def test_two_processes_match_one_process(world_dir, tokenizer, tmp_path):
  tokenizer_dir = tokenizer.name_or_path
  single = _run("single", 1, world_dir, tokenizer_dir, tmp_path)
  multi = _run("multi", 2, world_dir, tokenizer_dir, tmp_path)
  rows_s = {r["step"]: r for r in single["metrics"]}
  rows_m = {r["step"]: r for r in multi["metrics"]}
  assert sorted(rows_s) == sorted(rows_m) == [1, 2]
  for step in (1, 2):
    for key, value in rows_s[step].items():
      if key not in TIMING:
        np.testing.assert_allclose(rows_m[step][key], value, rtol=1e-4, atol=1e-6,
                                   err_msg=f"step {step} {key}")
  assert sorted(single["params"]) == sorted(multi["params"])
  for name, value in single["params"].items():
    np.testing.assert_allclose(multi["params"][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
