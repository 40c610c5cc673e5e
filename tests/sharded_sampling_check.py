"""Run with 8 fake CPU devices: greedy sampling sharded on a 2x2x2 mesh equals one device, for
`generate` and for the slot engine's programs (copy_rows, extend_rows, decode_slots across calls,
store_rows, take_rows), whose lane state must stay split over the batch.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharded_sampling_check
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.parallel import logical_to_sharding, make_mesh, use_mesh
from agentjax.sampling import (STOP_EOS, SamplingParams, StopTable, copy_rows, decode_slots,
                               empty_trajectories, extend, extend_rows, generate, init_progress,
                               init_state, store_rows, take_rows)
from agentjax.sampling.sampler import RUNNING

# The slot programs' shapes: lane rows, lane cache, prompt cache, tokens per turn, feed width.
N_SLOTS, LANE_LEN, PROMPT_LEN, MAX_NEW, FEED = 8, 32, 16, 8, 4
EOS_COUNT = 3


def run(cfg, params, prompts, lengths, mesh=None):
  model = Qwen(cfg)
  b = prompts.shape[0]
  stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32), jnp.int32(64))
  state = init_state(cfg, b, 64, jax.random.key(0), mesh=mesh)
  state = extend(model, params, state, jnp.asarray(prompts), jnp.asarray(lengths),
                 jnp.full((b,), -1, jnp.int32))
  state, gen = generate(model, params, state, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                        stop, SamplingParams(greedy=True), 12)
  return state, gen


def batch_spec(x: jax.Array):
  """The batch entry of x's partition spec: None if not split over the batch, "one device"
  without a mesh."""
  if isinstance(x.sharding, jax.sharding.SingleDeviceSharding):
    return "one device"
  assert isinstance(x.sharding, jax.sharding.NamedSharding), x.sharding
  return x.sharding.spec[0] if len(x.sharding.spec) else None


def run_slots(cfg, params, prompts, eos, mesh=None):
  """The slot programs' sequence: prefill 2 prompts, copy them into 8 slots, feed 3 rows,
  decode (returning after 2 stops) with 3 rows fed and restarted between calls until every row
  stopped, store the rows, take 4 of them.

  Returns:
    (the host copies of every result, [(program, batch spec of its output's cache or tokens,
    whether its donated input was consumed)]).
  """
  model = Qwen(cfg)
  i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
  table = StopTable.build([b""] * cfg.vocab_size, [])
  # Budget 28 of 32 slots: the rows given a second turn stop on it, the others on EOS / max_new.
  stop = (table, i32(eos), jnp.int32(28))
  placed = []

  def track(program, before, after):
    # A donated input stays alive when XLA could not reuse its buffers (e.g. the output is
    # placed otherwise): the program then copies the whole state each call.
    leaf = lambda s: s.cache.keys[0] if hasattr(s, "cache") else s.tokens  # noqa: E731
    placed.append((program, batch_spec(leaf(after)), leaf(before).is_deleted()))
    return after

  prompt = init_state(cfg, 2, PROMPT_LEN, jax.random.key(1), mesh=mesh)
  prompt = extend(model, params, prompt, i32(prompts[:2]), i32([16, 9]), i32([-1, -1]))
  lane = init_state(cfg, N_SLOTS, LANE_LEN, jax.random.key(2), mesh=mesh)
  lane = track("copy_rows", lane, copy_rows(lane, i32(np.arange(N_SLOTS)), prompt,
                                            i32(np.arange(N_SLOTS) % 2)))
  rng = np.random.RandomState(1)

  def feed(lane, rows, lengths, turn):
    tokens = rng.randint(0, cfg.vocab_size, (3, FEED))
    return track("extend_rows", lane, extend_rows(
        model, params, lane, i32(rows), i32(tokens), i32(lengths), i32(np.full((3, FEED), turn))))

  # Rows 5, 6, 7 get 1, 2, 3 more prompt tokens: 5 distinct greedy continuations.
  lane = feed(lane, [5, 6, 7], [1, 2, 3], -1)
  progress = init_progress(N_SLOTS, table, mesh=mesh)
  start = np.ones(N_SLOTS, bool)
  active = np.ones(N_SLOTS, bool)
  turn = np.zeros(N_SLOTS, np.int32)
  calls, fed = [], False
  while active.any():
    before = lane
    lane, progress, call = decode_slots(model, params, lane, progress, jnp.asarray(start),
                                        i32(turn), i32(np.arange(N_SLOTS)), jnp.asarray(active),
                                        SamplingParams(greedy=True), MAX_NEW, stop, i32(2))
    track("decode_slots", before, lane)
    call = jax.device_get(call)
    calls.append(call)
    start[:] = False
    active = call.reason == RUNNING
    stopped = np.flatnonzero(call.reason != RUNNING)
    if not fed and len(stopped) >= 3:
      # A second turn for 3 stopped rows: an observation fed into them alone, then decoded.
      rows = stopped[:3]
      lane = feed(lane, rows, [4, 2, 3], 1)
      start[rows] = active[rows] = True
      turn[rows] = 1
      fed = True
    assert len(calls) <= 2 * N_SLOTS, "decode_slots does not stop"
  out = empty_trajectories(N_SLOTS, LANE_LEN)
  if mesh is not None:  # placed as the engine places it
    axes = jax.tree.map(lambda _: jax.sharding.PartitionSpec("batch", "length"), out)
    out = jax.device_put(out, logical_to_sharding(axes, out, mesh))
  # Trajectory 8 (== T) is padding: row 3 is not stored.
  out = track("store_rows", out, store_rows(out, i32([2, 5, 0, 8, 1, 3, 6, 7]), lane,
                                            i32(np.arange(N_SLOTS))))
  # Row 8 (== N) is a free row.
  taken, part = take_rows(lane, progress, i32([6, 1, 8, 3]))
  host = lambda s: jax.device_get(s.replace(rng=jax.random.key_data(s.rng)))  # noqa: E731
  return dict(calls=calls, lane=host(lane), progress=jax.device_get(progress),
              out=jax.device_get(out), taken=host(taken), part=jax.device_get(part)), placed


def assert_tree_equal(got, want, what, errors):
  """Every leaf equal: floats (cache, logits, log-probs) within 1e-4, the rest exact. The
  sharded matmuls sum in another order: ~1e-5 differences, which the x4 weights grow to ~5e-5
  in the log-probs. Records each float leaf's largest difference in `errors`."""
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    a, b, name = np.asarray(a), np.asarray(b), what + jax.tree_util.keystr(path)
    assert a.shape == b.shape, (name, a.shape, b.shape)
    if a.dtype.kind == "f":
      errors[name] = float(np.max(np.abs(a - b), initial=0.0))
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=name)


def check_slots(cfg, single, params, prompts, mesh):
  """The slot programs on the mesh equal one device, and the lane stays split over the batch."""
  # EOS ids the greedy rows meet at different steps (from a run without EOS): rows stop at
  # different times, so the decode calls return with other rows still running.
  probe, _ = run_slots(cfg, single, prompts, [-1] * EOS_COUNT)
  first = probe["calls"][0].turn_tokens
  eos = [int(first[5, 1]), int(first[6, 3]), int(first[1, 5])]
  ref, _ = run_slots(cfg, single, prompts, eos)
  assert len(ref["calls"]) >= 3 and any((c.reason == STOP_EOS).any() for c in ref["calls"]), (
      "the sequence no longer spans several decode calls with EOS stops", ref["calls"])
  compiles = []  # the function names of the XLA compilations from here on
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, fun_name="", **kw: compiles.append(fun_name)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  with use_mesh(mesh):
    got, placed = run_slots(cfg, params, prompts, eos, mesh=mesh)
  # One program each on the mesh: a call whose inputs (the previous call's outputs) are placed
  # unlike the first call's compiles again.
  programs = ("copy_rows", "_gather_rows", "_extend_tokens", "_scatter_rows", "decode_slots",
              "store_rows", "take_rows")  # extend_rows: _gather_rows, _extend_tokens, _scatter_rows
  compiled = {name: sum(f.endswith(f"{name})") for f in compiles) for name in programs}
  assert all(n == 1 for n in compiled.values()), f"programs compiled on the mesh: {compiled}"
  print("slot programs: (program, batch spec of the output, donated input consumed):", placed)
  for program, spec, consumed in placed:
    assert spec not in (None, "one device"), (
        f"the output of {program} is not split over the batch: {spec}")
    assert consumed, f"{program} did not reuse its donated input (its output is placed otherwise?)"
  assert len(got["calls"]) == len(ref["calls"]), (len(got["calls"]), len(ref["calls"]))
  errors = {}
  for i, (a, b) in enumerate(zip(got["calls"], ref["calls"])):
    assert_tree_equal(a, b, f"decode call {i}: ", errors)
  for name in ("lane", "progress", "out", "taken", "part"):
    assert_tree_equal(got[name], ref[name], name, errors)
  print("slot programs, largest float differences:",
        {k: f"{v:.1e}" for k, v in errors.items() if "cache" not in k or "keys[0]" in k})


def main():
  assert jax.device_count() == 8
  cfg = QwenConfig.preset("tiny-qwen3", vocab_size=256)
  single = jax.tree.map(lambda x: x * 4.0, init_params(cfg, jax.random.key(0)))
  rng = np.random.RandomState(0)
  prompts = rng.randint(0, cfg.vocab_size, (8, 16)).astype(np.int32)
  lengths = np.array([16, 3, 9, 12, 5, 16, 7, 1], np.int32)
  _, ref = run(cfg, single, prompts, lengths)

  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  from agentjax.models.qwen import param_shardings
  params = jax.device_put(single, param_shardings(cfg, mesh))
  with use_mesh(mesh):
    state, gen = run(cfg, params, prompts, lengths, mesh=mesh)
  spec = tuple(state.cache.keys[0].sharding.spec)  # [B, N, D, S]: batch and KV heads split
  assert spec[:2] == (("data", "fsdp"), "tensor"), spec
  assert len(gen.new_tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(gen.new_tokens), np.asarray(ref.new_tokens))
  check_slots(cfg, single, params, prompts, mesh)
  print("SHARDED_SAMPLING_OK")


if __name__ == "__main__":
  main()
