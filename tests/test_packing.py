"""Padding-free batches: the packer against a plain-Python reference, exact round trips, and packed
log-probs and IGPO probe values equal to the padded ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.logprobs import packed_logprobs, sequence_logprobs
from agentjax.models.qwen import Qwen, QwenConfig, init_params
from agentjax.rl.info_gain import build_probes, probe_keep, score_packed, score_packed_rows
from agentjax.train import packing

from tests.test_info_gain import encode, random_batch


def reference_ffd(lengths, capacity):
  """First-fit-decreasing in plain Python: {trajectory: (row, offset)}; ties keep input order."""
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  fill, place = [], {}
  for i in order:
    if lengths[i] == 0:
      continue
    r = next((r for r, used in enumerate(fill) if used + lengths[i] <= capacity), len(fill))
    if r == len(fill):
      fill.append(0)
    place[i] = (r, fill[r])
    fill[r] += lengths[i]
  return place, len(fill)


def prefix_valid(lengths, width):
  return np.arange(width)[None] < np.asarray(lengths)[:, None]


CASES = {
    "random": ([37, 5, 64, 12, 1, 29, 50, 8, 33, 17, 64, 2], 64),
    "exact": ([64, 64, 10], 64),
    "oversize": ([150, 20, 40, 64], 64),
    "all_equal": ([16] * 9, 64),
    "single": ([23], 64),
    "empty_rows": ([0, 12, 0, 30, 0], 32),
    "all_empty": ([0, 0], 32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_matches_reference(name):
  lengths, pack_tokens = CASES[name]
  width = max(max(lengths), 1) + 3
  keep = prefix_valid(lengths, width)
  plan = packing.plan_packing(keep, pack_tokens, row_multiple=2)
  r, w = plan.shape
  longest = max(lengths)
  assert w == (pack_tokens if longest <= pack_tokens else 256)  # 150 -> 64 * 2^2
  assert plan.oversize == sum(n > pack_tokens for n in lengths)
  place, used = reference_ffd(lengths, w)
  assert plan.rows_used == used and r % 2 == 0 and r >= max(used, 1)
  for i, n in enumerate(lengths):
    if n == 0:
      assert plan.row[i] == -1 and (plan.slot[i] == -1).all()
      continue
    assert (plan.row[i], plan.offset[i]) == place[i]
  # Every kept slot exactly once, in order and contiguous; nothing else packed.
  src = plan.source[plan.source >= 0]
  assert len(src) == len(set(src.tolist())) == sum(lengths) == plan.real_tokens
  np.testing.assert_array_equal(np.sort(src), np.flatnonzero(keep.reshape(-1)))
  for i, n in enumerate(lengths):
    if n:
      cols = plan.offset[i] + np.arange(n)
      np.testing.assert_array_equal(plan.source[plan.row[i], cols], i * width + np.arange(n))
      np.testing.assert_array_equal(plan.slot[i, :n], plan.row[i] * w + cols)
      assert (plan.trajectory[plan.row[i], cols] == i).all()
      seg = plan.segment_ids[plan.row[i], cols]
      assert (seg == seg[0]).all() and seg[0] >= 1
  # Segments 1..k in row order, 0 exactly on padding; no row over its capacity.
  for row in range(r):
    seg = plan.segment_ids[row]
    assert ((seg == 0) == (plan.source[row] < 0)).all()
    runs = [s for j, s in enumerate(seg) if s and (j == 0 or seg[j - 1] != s)]
    assert runs == list(range(1, len(runs) + 1))
  assert plan.efficiency == pytest.approx(sum(lengths) / (r * w))
  assert plan.padded_efficiency == pytest.approx(sum(lengths) / (len(lengths) * width))


def test_ladders():
  ns = (0, 1, 7, 8, 9, 11, 17, 33)
  assert [packing.row_ladder(n, 4) for n in ns] == [1, 1, 7, 8, 10, 12, 20, 40]
  assert [packing.row_ladder(n) for n in ns] == [1, 1, 7, 8, 9, 11, 18, 36]
  assert packing.width_ladder(10, 64) == 64 and packing.width_ladder(65, 64) == 128


def test_pack_unpack_round_trip_and_reductions():
  rng = np.random.RandomState(0)
  lengths = rng.randint(0, 40, size=11)
  keep = prefix_valid(lengths, 48)
  plan = packing.plan_packing(keep, 48, row_multiple=4)
  index = plan.index()
  x = rng.randn(11, 48).astype(np.float32)
  packed = np.asarray(index.pack(jnp.asarray(x)))
  assert packed.shape == plan.shape
  np.testing.assert_array_equal(packed[plan.source < 0], 0)
  real = plan.source >= 0
  np.testing.assert_array_equal(packed[real], x.reshape(-1)[plan.source[real]])
  back = np.asarray(index.unpack(jnp.asarray(packed), fill=-7.0))
  np.testing.assert_array_equal(back, np.where(keep, x, -7.0))
  # Trailing dims ride along.
  x3 = rng.randn(11, 48, 3).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(index.unpack(index.pack(jnp.asarray(x3)))),
                                np.where(keep[..., None], x3, 0))
  # Per-trajectory sums from packed slots; per-segment totals broadcast back to the slots.
  sums = np.asarray(index.trajectory_sums(jnp.asarray(packed)))
  np.testing.assert_allclose(sums, np.where(keep, x, 0).sum(1), rtol=1e-5, atol=1e-5)
  totals = np.asarray(packing.segment_totals(jnp.asarray(packed), index.segment_ids))
  want = np.where(real, sums[np.maximum(plan.trajectory, 0)], 0.0)
  np.testing.assert_allclose(totals[real], want[real], rtol=1e-5, atol=1e-5)


def test_micro_packing_slices_are_plans():
  rng = np.random.RandomState(4)
  lengths = rng.randint(1, 60, size=12)
  order = packing.micro_batch_order(lengths, 3)
  np.testing.assert_array_equal(np.sort(order), np.arange(12))
  loads = [lengths[order[i::3]].sum() for i in range(3)]
  assert max(loads) - min(loads) <= lengths.max()
  keep = prefix_valid(lengths[order], 64)
  plan = packing.plan_micro_packing(keep, 64, 3, row_multiple=2)
  r, w = plan.shape
  assert r % 6 == 0 and plan.real_tokens == lengths.sum()
  split = lambda a, i: a.reshape(a.shape[0] // 3, 3, *a.shape[1:])[:, i]  # noqa: E731
  for i in range(3):  # slice i (microbatch.split's rows i, i + 3, ...) is its own packing
    alone = packing.plan_packing(keep[i::3], 64, row_multiple=2, min_rows=r // 3, min_width=w)
    for name in ("source", "trajectory", "segment_ids", "slot", "row", "offset", "length"):
      np.testing.assert_array_equal(split(getattr(plan, name), i), getattr(alone, name))
  index = plan.index()
  x = jnp.asarray(rng.randn(12, 64).astype(np.float32))
  packed = index.pack(x)
  np.testing.assert_array_equal(np.asarray(index.unpack(packed)), np.where(keep, x, 0))
  arrays = {k: v[1::3] for k, v in index.arrays().items()}  # one slice, as split leaves it
  local = packing.PackIndex.from_arrays(arrays)
  np.testing.assert_array_equal(np.asarray(local.pack(x[1::3])), np.asarray(packed)[1::3])


def test_pack_trajectories_positions_restart():
  lengths = [5, 3, 7, 0]
  valid = prefix_valid(lengths, 8)
  tokens = np.arange(32, dtype=np.int32).reshape(4, 8) + 1
  plan = packing.plan_packing(valid, 16)
  batch = packing.pack_trajectories(tokens, valid, None, plan)
  pos, tok, seg = (np.asarray(x) for x in (batch.positions, batch.tokens, batch.segment_ids))
  for i, n in enumerate(lengths[:3]):
    cols = plan.offset[i] + np.arange(n)
    np.testing.assert_array_equal(pos[plan.row[i], cols], np.arange(n))
    np.testing.assert_array_equal(tok[plan.row[i], cols], tokens[i, :n])
  assert (tok[seg == 0] == 0).all() and (pos[seg == 0] == 0).all()
  assert plan.stats()["packing_efficiency"] == pytest.approx(15 / 16)


@pytest.fixture(scope="module")
def tiny():
  cfg = QwenConfig.preset("tiny")
  params = jax.jit(lambda k: jax.tree.map(lambda x: x * 3.0, init_params(cfg, k)))(
      jax.random.key(0))
  return cfg, Qwen(cfg), params


def test_packed_logprobs_equal_padded(tiny):
  cfg, model, params = tiny
  rng = np.random.RandomState(1)
  lengths = np.array([30, 4, 17, 1, 0, 25])
  valid = prefix_valid(lengths, 32)
  tokens = np.where(valid, rng.randint(0, cfg.vocab_size, valid.shape), 0).astype(np.int32)
  want, want_ent = jax.jit(lambda p, t, v: sequence_logprobs(model, p, t, v, chunk=16,
                                                             with_entropy=True))(
      params, jnp.asarray(tokens), jnp.asarray(valid))
  plan = packing.plan_packing(valid, 32)
  assert plan.shape[0] < len(lengths)  # really packed
  batch = packing.pack_trajectories(tokens, valid, None, plan)
  logp, ent = jax.jit(lambda p, b: packing.packed_sequence_logprobs(model, p, b, chunk=16,
                                                                     with_entropy=True))(
      params, batch)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(want), atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-5)

  # Gradients through the unpack (what an update on packed rows differentiates) match too.
  weight = jnp.asarray(rng.randn(*valid.shape).astype(np.float32))
  g_want = jax.jit(jax.grad(lambda p: jnp.sum(weight * sequence_logprobs(
      model, p, jnp.asarray(tokens), jnp.asarray(valid), chunk=16)[0])))(params)
  g_got = jax.jit(jax.grad(lambda p: jnp.sum(weight * batch.index.unpack(packed_logprobs(
      model, p, batch.tokens, batch.positions, batch.segment_ids, chunk=16)[0]))))(params)
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("alias_mode", ["max"])  # K = 2 aliases: the harder indexing
def test_packed_probe_scores_equal_padded(tiny, alias_mode):
  cfg, model, params = tiny
  rng = np.random.RandomState(3)
  tokens, valid, turn_ends, num_turns = random_batch(rng, cfg, b=4, s=48, t=3)
  golds = [["Orsk", "the city of Orsk"], ["Veltrana"], ["Aldric", "Sir Aldric"], ["Ka"]]
  probes = build_probes(encode, golds, "<answer> {gt} </answer>", alias_mode=alias_mode)
  args = [jnp.asarray(x) for x in (tokens, valid, turn_ends, num_turns, probes.tokens,
                                   probes.score, probes.valid, probes.alias_valid)]
  want = score_packed(model, params, *args, with_entropy=True, chunk=32)
  keep = probe_keep(valid, num_turns, turn_ends.shape[1] - 1, probes.valid)
  plan = packing.plan_packing(keep, 128)
  assert plan.efficiency > plan.padded_efficiency
  got = score_packed_rows(model, params, plan.index(), *args, with_entropy=True, chunk=32)
  for name in ("token_logprobs", "token_entropy", "values", "info_gain"):
    np.testing.assert_allclose(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)),
                               atol=1e-5, err_msg=name)


def test_probe_keep_needs_prefix():
  valid = np.array([[True, False, True]])
  with pytest.raises(ValueError, match="prefix"):
    probe_keep(valid, np.array([1]), 1, np.ones((1, 1, 2), bool))
