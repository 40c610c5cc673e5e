"""launch/fit.py, the compile-only fit check, at the tiny shape on 2 fake CPU devices (a
subprocess: XLA_FLAGS must be set before jax is imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.subprocess_env import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo's IGPO settings, smaller: every program kind still compiles (rollout prefill, decode
# and feed, the scoring pass with probes, the update), each in a second or two.
SMALL = ["--config=configs/igpo.py:demo", "--model_preset=tiny", "--devices=2",
         "--config.rl.prompts_per_step=2", "--config.rollout.group_size=2",
         "--config.rl.minibatch_size=4", "--config.rollout.max_turns=2",
         "--config.rollout.max_total_tokens=256", "--config.rollout.max_obs_tokens=64",
         "--config.rollout.max_new_tokens=32", "--prompt_tokens=64",
         "--config.mesh.data=1", "--config.mesh.fsdp=2"]


def _fit(*args: str) -> tuple[int, str, dict]:
  env = subprocess_env(JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "launch/fit.py", *SMALL, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  lines = proc.stdout.strip().splitlines()
  assert lines, proc.stderr[-3000:]
  return proc.returncode, proc.stdout, json.loads(lines[-1])


def test_fit_check_fits_at_a_generous_limit_with_sharded_update_outputs():
  rc, out, result = _fit("--device_memory_gb=80", "--config.rl.kl_coef=0.001")
  assert rc == 0, out
  assert result["fits"] is True and result["device_memory_gb"] == 80.0
  assert result["devices"] == 2 and result["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1}
  names = set(result["programs"])
  assert {"rollout/prefill", "rollout/decode", "rollout/feed", "score/policy",
          "score/reference", "update"} <= names, names
  for name, row in result["programs"].items():
    assert row["peak_gb"] > 0, (name, row)
    assert row["total_gb"] >= row["peak_gb"], (name, row)
    assert abs(row["peak_gb"] - (row["argument_gb"] + row["output_gb"] + row["temp_gb"]
                                 - row["alias_gb"])) < 2e-3, (name, row)
  assert result["peak_gb"] == max(r["total_gb"] for r in result["programs"].values())
  # FSDP over 2 devices: the update's new params and Adam moments come out sharded as they went
  # in (no replicated gradients); with KL the frozen reference is a second copy of the params.
  assert result["problems"] == {}, result["problems"]
  assert result["state_gb"]["reference"] == result["state_gb"]["params"]


def test_fit_check_fails_at_a_tiny_limit_naming_the_program():
  rc, out, result = _fit("--device_memory_gb=0.001", "--programs=rollout/decode")
  assert rc == 1
  assert result["fits"] is False and result["too_big"] == ["rollout/decode"]
  assert list(result["programs"]) == ["rollout/decode"]
  assert "DOES NOT FIT in 0.001 GB: rollout/decode" in out


def test_fit_check_extrapolates_two_depths_to_the_models_own():
  """--extrapolate=1,2: each program's total at the model's depth from its totals at 1 and 2
  layers, on a straight line; `fits` judges the extrapolated totals."""
  # KL on as in the first test: its 2-layer update (the tiny preset's depth) is then the same
  # program, read back from the compilation cache the suite shares with its subprocesses.
  rc, out, result = _fit("--device_memory_gb=80", "--extrapolate=1,2",
                         "--programs=rollout/prefill,update", "--config.rl.kl_coef=0.001")
  assert rc == 0, out
  depth = result["model"]["layers"]
  assert result["how"] == f"extrapolated from 1 and 2 layers to {depth}"
  assert set(result["programs"]) == {"rollout/prefill", "update"}
  for name, row in result["programs"].items():
    a, b = row["total_gb_1"], row["total_gb_2"]
    assert a > 0 and b > 0, (name, row)
    assert abs(row["per_layer_gb"] - (b - a)) < 1e-3, (name, row)
    assert abs(row["total_gb"] - (a + (depth - 1) * (b - a))) < 1e-2, (name, row)
  assert result["fits"] is True
  assert result["peak_gb"] == max(r["total_gb"] for r in result["programs"].values())


def _ladder(full: int, factor: int) -> list[int]:
  """Lane sizes by brute force: full / factor^k rounded up, down to 1 (factor 0: full only)."""
  return sorted({full} | ({-(-full // factor ** k) for k in range(40)} if factor else set()),
                reverse=True)


def test_precompile_lists_every_shape_of_the_slot_ladder():
  """launch/precompile.py (fit with --ladders) on 2 fake devices: the training and the eval
  rollouts' programs are exactly the ladder's, by a reference written here (lane sizes, key
  windows of 128 * 2^k below the 256-slot cache then the whole cache, rows on powers of two from 4
  capped at the lane), each compiled with its memory; scoring and the update as fit has them."""
  env = subprocess_env(JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "launch/precompile.py", *SMALL, "--config.rollout.lanes=1",
       "--config.rollout.kv_window_min=128", "--config.train.eval_batch=6",
       "--config.rollout.compact_factor=2", "--config.rollout.row_bucket_factor=2"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  lines = proc.stdout.strip().splitlines()
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  result = json.loads(lines[-1])
  assert result["device_memory_gb"] is None and result["fits"] is True  # a CPU: no limit
  windows = ["128", "all"]
  want = set()
  for prefix, count in (("rollout", 4), ("eval_rollout", 6)):  # lanes=1: one lane of `count`
    sizes = _ladder(count, 2)
    rows = {size: sorted({min(max(4, 2 ** (k - 1).bit_length()), max(size, 4))
                          for k in range(1, size + 1)}) for size in sizes}
    want.add(f"{prefix}/prefill")
    want |= {f"{prefix}/move[{a}->{b}]" for a, b in zip(sizes, sizes[1:])}
    want |= {f"{prefix}/decode[{s},{w}]" for s in sizes for w in windows}
    want |= {f"{prefix}/{kind}[{s},{r}]" for s in sizes for r in rows[s]
             for kind in ("gather", "scatter", "store")}
    want |= {f"{prefix}/refill[{r}]" for r in rows[sizes[0]]}
    want |= {f"{prefix}/feed[{r},{w}]" for r in set().union(*rows.values()) for w in windows}
  got = set(result["programs"])
  assert {n for n in got if "rollout" in n} == want, sorted(got ^ want)
  assert {"score/policy", "update"} <= got and result["num_programs"] == len(got)
  for name in want:
    row = result["programs"][name]
    assert row["compile_s"] >= 0 and row["total_gb"] > 0, (name, row)
  assert f"{len(got)} programs" in proc.stdout


def test_precompile_fuses_the_feed_of_a_one_size_lane():
  """rollout.compact_factor=0 (one lane size): each row bucket's gather, feed and scatter are
  one program per key window (SlotLadder.fused), listed as feed[lane,rows,window]."""
  env = subprocess_env(JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "launch/precompile.py", *SMALL, "--config.rollout.lanes=1",
       "--config.rollout.kv_window_min=64", "--config.rollout.compact_factor=0",
       "--config.rollout.row_bucket_factor=2", "--config.train.eval_batch=6",
       "--programs=rollout/feed,rollout/gather,rollout/scatter,eval_rollout/feed"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  lines = proc.stdout.strip().splitlines()
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  got = set(json.loads(lines[-1])["programs"])
  windows = ["64", "128", "all"]
  assert got == {f"rollout/feed[4,4,{w}]" for w in windows} | \
      {f"eval_rollout/feed[6,{r},{w}]" for r in (4, 6) for w in windows}, sorted(got)
