"""Padding-free batches: trajectories packed into rows of `pack_tokens` slots.

Multi-turn trajectories differ in length by 10x and more; padded to the batch's width, most of a
scoring or update pass computes padding. Packing places several trajectories side by side in one
row, each its own segment (attention stays within a trajectory: masks.packed_segments_mask) with
positions restarting at 0, so a pass over [R, W] packed rows computes few padding slots:

    plan = plan_packing(np.asarray(valid), pack_tokens=4096)     # host: where every token goes
    packed = pack_trajectories(tokens, valid, positions, plan)   # device: [R, W] rows
    logp, _ = packed_sequence_logprobs(model, params, packed)    # [B, S]: sequence_logprobs'
    plan.stats()                                                 # packing_efficiency, ...

Micro-batches (rl/microbatch.py, strided slices): order the minibatch with micro_batch_order,
plan with plan_micro_packing, and every slice of the packed rows is a packing of its own.
IGPO's probe pass on packed rows: rl/info_gain.py probe_keep + score_packed_rows.

The plan is computed on the host (first-fit-decreasing, deterministic) from which source slots
are kept (`keep` [B, U]: a trajectory's real tokens, or for IGPO its tokens and its probes). Every
per-token array moves between the source layout [B, U] and the packed one [R, W] by one gather on
device (`PackIndex.pack` / `unpack`), the same maps for tokens, masks, advantages or log-probs.
Row count R and width W come from short ladders so that few programs compile.

A loss on packed rows aggregates per trajectory through `PackIndex.trajectory` ([R, W]: the source
row b of each slot, -1 on padding; `trajectory_sums`) or per segment within a row
(`segment_totals`), or simply unpacks the per-token log-probs to [B, S] and runs the unchanged
loss (exact: the gather's gradient is a scatter-add into the packed slots).
"""

from __future__ import annotations

import dataclasses
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.parallel.host import to_device
from agentjax.rl.microbatch import num_micro

Array = jax.Array


def row_ladder(n: int, steps_per_octave: int = 8) -> int:
  """The smallest rung >= n of a ladder with `steps_per_octave` rungs per power of two.

  1..2*steps exactly, then e.g. (4 steps) 10, 12, 14, 16, 20, 24, 28, 32, 40, ...: a row count
  rounded up wastes under 1 / steps_per_octave of the rows, and a run sees few distinct counts.
  (8 steps: on the demo's lengths, 0.89 of the packed slots are real against 0.80 with 4.)"""
  n = max(int(n), 1)
  step = 1 << max(0, n.bit_length() - 1 - int(math.log2(steps_per_octave)))
  return -(-n // step) * step


def width_ladder(longest: int, pack_tokens: int) -> int:
  """Row width: pack_tokens, or pack_tokens * 2^k when the longest item is longer (it then gets a
  row of its own at that width, and every row of the batch is that wide)."""
  width = pack_tokens
  while width < longest:
    width *= 2
  return width


@dataclasses.dataclass(frozen=True)
class PackPlan:
  """Where every kept source slot goes (host numpy arrays) and what the packing saves.

  Source layout [B, U] (B trajectories of U slots), packed layout [R, W].
    source     [R, W] int32: flat index b * U + u of the slot's source, -1 on padding.
    trajectory [R, W] int32: b, -1 on padding.
    segment_ids[R, W] int32: 1..k, the trajectory's place in its row (0 on padding).
    slot       [B, U] int32: flat index r * W + c where source slot (b, u) goes, -1 if not kept.
    row, offset, length [B] int32: trajectory b's row, first column and kept slots (an empty
      trajectory has row -1 and is in no row).
  Stats: real_tokens (kept slots), rows_used (rows holding a trajectory) of R rows, oversize
  (trajectories longer than pack_tokens), padded_width (the source's U), efficiency
  = real / (R * W) and padded_efficiency = real / (B * U).
  """

  source: np.ndarray
  trajectory: np.ndarray
  segment_ids: np.ndarray
  slot: np.ndarray
  row: np.ndarray
  offset: np.ndarray
  length: np.ndarray
  pack_tokens: int
  rows_used: int
  oversize: int
  max_segments: int
  num_micro: int = 1  # plan_micro_packing: maps local to each of num_micro strided slices

  @property
  def shape(self) -> tuple[int, int]:
    return self.source.shape

  @property
  def real_tokens(self) -> int:
    return int(self.length.sum())

  @property
  def efficiency(self) -> float:
    """packing_efficiency: real tokens / computed tokens of the packed rows (R x W)."""
    return self.real_tokens / max(self.source.size, 1)

  @property
  def padded_efficiency(self) -> float:
    """The same figure for the padded source batch (B x U)."""
    return self.real_tokens / max(self.slot.size, 1)

  def stats(self) -> dict[str, float]:
    """What a training step logs about its packing."""
    r, w = self.shape
    return {"packing_efficiency": self.efficiency,
            "padded_efficiency": self.padded_efficiency,
            "pack_rows": float(r), "pack_rows_used": float(self.rows_used),
            "pack_width": float(w), "pack_oversize": float(self.oversize),
            "pack_max_segments": float(self.max_segments)}

  def index(self) -> "PackIndex":
    """The maps as device arrays."""
    return PackIndex(num_micro=self.num_micro, source=to_device(self.source),
                     trajectory=to_device(self.trajectory),
                     segment_ids=to_device(self.segment_ids), slot=to_device(self.slot),
                     row=to_device(self.row), offset=to_device(self.offset),
                     length=to_device(self.length))


def plan_packing(keep: np.ndarray, pack_tokens: int, *, row_multiple: int = 1,
                 steps_per_octave: int = 8, min_rows: int = 0, min_width: int = 0) -> PackPlan:
  """First-fit-decreasing packing of each source row's kept slots into rows of pack_tokens.

  Args:
    keep: [B, U] bool (host), the source slots to pack; each row's kept slots stay in order and
      contiguous in the packed row (a trajectory's real tokens: `valid`).
    pack_tokens: capacity of a row. A trajectory longer than that widens every row of the batch
      to pack_tokens * 2^k (width_ladder) and is counted in `oversize`.
    row_multiple: R is a multiple of it (micro-batches, devices); R = row_multiple *
      row_ladder(ceil(rows needed / row_multiple)), the extra rows all padding.
    min_rows, min_width: at least this many rows, this wide (plan_micro_packing: one shape).
  Returns:
    the PackPlan. Deterministic: ties in length keep the source order.
  """
  keep = np.asarray(keep, bool)
  b, u = keep.shape
  lengths = keep.sum(axis=1).astype(np.int64)
  width = max(width_ladder(int(lengths.max(initial=0)), pack_tokens), min_width)
  row = np.full(b, -1, np.int32)
  offset = np.zeros(b, np.int32)
  free = np.empty(b, np.int64)  # free slots of each open row (at most B rows)
  count = np.zeros(b, np.int32)  # trajectories in each open row
  segment = np.zeros(b, np.int32)
  used = 0
  for i in np.argsort(-lengths, kind="stable"):
    n = lengths[i]
    if n == 0:
      break  # sorted: the rest are empty too
    fits = np.flatnonzero(free[:used] >= n)
    r = int(fits[0]) if fits.size else used
    if r == used:
      free[r], used = width, used + 1
    row[i], offset[i] = r, width - free[r]
    free[r] -= n
    count[r] += 1
    segment[i] = count[r]
  rows = max(row_multiple * row_ladder(-(-used // row_multiple), steps_per_octave), min_rows)
  source = np.full((rows, width), -1, np.int32)
  trajectory = np.full((rows, width), -1, np.int32)
  segment_ids = np.zeros((rows, width), np.int32)
  slot = np.full((b, u), -1, np.int32)
  for i in np.flatnonzero(row >= 0):
    kept = np.flatnonzero(keep[i])
    cols = offset[i] + np.arange(kept.size)
    source[row[i], cols] = i * u + kept
    trajectory[row[i], cols] = i
    segment_ids[row[i], cols] = segment[i]
    slot[i, kept] = row[i] * width + cols
  return PackPlan(source=source, trajectory=trajectory, segment_ids=segment_ids, slot=slot,
                  row=row, offset=offset, length=lengths.astype(np.int32),
                  pack_tokens=pack_tokens, rows_used=used,
                  oversize=int(np.sum(lengths > pack_tokens)),
                  max_segments=int(count[:used].max(initial=0)))


def micro_batch_order(lengths: np.ndarray, num_micro: int) -> np.ndarray:
  """An order of a minibatch's trajectories whose micro-batches carry balanced token counts.

  The micro-batches of rl/microbatch.split are strided (slice i: rows i, i + n, ...), so
  trajectory order[j] goes to micro-batch j % n. Longest first, each to the slice with the fewest
  tokens that still has room (B / n trajectories each). -> order [B], a permutation."""
  lengths = np.asarray(lengths)
  b, n = len(lengths), num_micro
  if b % n:
    raise ValueError(f"{n} micro-batches do not divide a minibatch of {b} trajectories")
  groups: list[list[int]] = [[] for _ in range(n)]
  load = np.zeros(n, np.int64)
  for i in np.argsort(-lengths, kind="stable"):
    g = min((g for g in range(n) if len(groups[g]) < b // n), key=lambda g: (load[g], g))
    groups[g].append(int(i))
    load[g] += lengths[i]
  order = np.empty(b, np.int64)
  for g, members in enumerate(groups):
    order[g::n] = sorted(members)
  return order


def plan_micro_packing(keep: np.ndarray, pack_tokens: int, num_micro: int, **kwargs
                       ) -> PackPlan:
  """plan_packing of each micro-batch on its own, in the strided layout of microbatch.split.

  keep [B, U] in micro-batch order (micro_batch_order: row j in micro-batch j % n). Micro-batch i
  is packed into R / n rows of one common width; its packed rows are rows i, i + n, ... of the
  plan, and its maps (source, slot) index its own slice: split every [B, ...] and [R, ...] array
  (the maps included: PackIndex.arrays) with microbatch.split(x, n) and slice i is a complete
  one-micro-batch packing (PackIndex.from_arrays). num_micro = 1 is plan_packing.
  kwargs: plan_packing's (row_multiple: of each micro-batch's rows)."""
  keep = np.asarray(keep, bool)
  n = num_micro
  if n == 1:
    return plan_packing(keep, pack_tokens, **kwargs)
  if keep.shape[0] % n:
    raise ValueError(f"{n} micro-batches do not divide a minibatch of {keep.shape[0]} rows")
  plans = [plan_packing(keep[i::n], pack_tokens, **kwargs) for i in range(n)]
  rows = max(p.shape[0] for p in plans)
  width = max(p.shape[1] for p in plans)
  if any(p.shape != (rows, width) for p in plans):
    plans = [plan_packing(keep[i::n], pack_tokens, min_rows=rows, min_width=width, **kwargs)
             for i in range(n)]

  def interleave(name):  # micro-batch i's k-th entry at k * n + i (split's layout)
    parts = np.stack([getattr(p, name) for p in plans], axis=1)
    return parts.reshape(-1, *parts.shape[2:])

  fields = {f: interleave(f) for f in ("source", "trajectory", "segment_ids", "slot", "row",
                                       "offset", "length")}
  return PackPlan(**fields, pack_tokens=pack_tokens, rows_used=sum(p.rows_used for p in plans),
                  oversize=sum(p.oversize for p in plans),
                  max_segments=max(p.max_segments for p in plans), num_micro=n)


def _gather(x: Array, where: Array, fill) -> Array:
  """out[i, j, ...] = x.flat2d[where[i, j], ...], fill where where < 0: pack and unpack are the
  same gather with the two index maps (x [P, Q, ...] read as [P * Q, ...]; where [I, J] int)."""
  flat = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
  out = jnp.take(flat, jnp.maximum(where, 0), axis=0)
  real = (where >= 0).reshape(where.shape + (1,) * (x.ndim - 2))
  return jnp.where(real, out, jnp.asarray(fill, x.dtype))


@flax.struct.dataclass
class PackIndex:
  """PackPlan's maps on device (fields as in PackPlan); gathers between the two layouts."""

  source: Array       # [R, W]
  trajectory: Array   # [R, W]
  segment_ids: Array  # [R, W]
  slot: Array         # [B, U]
  row: Array          # [B]
  offset: Array       # [B]
  length: Array       # [B]
  # plan_micro_packing's slices: the maps of slice i are rows i, i + n, ... of each array.
  num_micro: int = flax.struct.field(pytree_node=False, default=1)

  def arrays(self) -> dict[str, Array]:
    """The maps as a dict of arrays (to ride in a minibatch and be split with it)."""
    return {f"pack_{k}": getattr(self, k) for k in _INDEX_FIELDS}

  @classmethod
  def from_arrays(cls, arrays: dict[str, Array]) -> "PackIndex":
    """The index of one micro-batch from its slice of `arrays()`."""
    return cls(**{k: arrays[f"pack_{k}"] for k in _INDEX_FIELDS})

  def _slices(self, fn, x: Array) -> Array:
    """fn(local index, local x) over the strided slices of x [B, ...] and the maps; the result's
    rows interleaved back (plan_micro_packing's layout)."""
    n = self.num_micro
    split = lambda a: a.reshape(a.shape[0] // n, n, *a.shape[1:]).swapaxes(0, 1)  # noqa: E731
    local = jax.tree.map(split, self.replace(num_micro=1))
    out = jax.vmap(fn)(local, split(x))
    return out.swapaxes(0, 1).reshape(-1, *out.shape[2:])

  def pack(self, x: Array, fill=0) -> Array:
    """[B, U, ...] source-layout array -> [R, W, ...] packed (padding slots = fill)."""
    if self.num_micro > 1:
      return self._slices(lambda index, y: index.pack(y, fill), x)
    return _gather(x, self.source, fill)

  def unpack(self, y: Array, fill=0) -> Array:
    """[R, W, ...] packed -> [B, U, ...] source layout (slots not kept = fill)."""
    if self.num_micro > 1:
      return self._slices(lambda index, z: index.unpack(z, fill), y)
    return _gather(y, self.slot, fill)

  def trajectory_sums(self, x: Array) -> Array:
    """Per-trajectory sums of a packed per-token array: x [R, W] -> [B] (padding ignored).

    Under micro-batches over rows (a slice of the rows with its slice of `trajectory`), each
    slice's [B] sums are partial (zero for the trajectories elsewhere) and add up."""
    if self.num_micro > 1:
      raise ValueError("trajectory_sums of a plan_micro_packing index: take each slice's")
    b = self.slot.shape[0]
    ids = jnp.where(self.trajectory >= 0, self.trajectory, b)
    return jax.ops.segment_sum(x.reshape(-1), ids.reshape(-1), num_segments=b + 1)[:b]


_INDEX_FIELDS = ("source", "trajectory", "segment_ids", "slot", "row", "offset", "length")


def segment_totals(x: Array, segment_ids: Array) -> Array:
  """Each slot's segment's total, broadcast back: x [R, W], segment_ids [R, W] -> [R, W].

  Works on any slice of rows (no trajectory count needed), e.g. a packed micro-batch: GSPO's
  per-sequence mean log-ratio, or a trajectory's token count for the seq-mean aggregations, as
  per-slot arrays. Padding slots (segment 0) get the total of the row's padding."""
  r, w = segment_ids.shape
  # Segments of a row are contiguous runs: key each slot by the flat index of its run's first slot.
  starts = jnp.concatenate([jnp.ones((r, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
                           axis=1)
  cols = jnp.arange(w, dtype=jnp.int32)[None]
  first = jax.lax.cummax(jnp.where(starts, cols, 0), axis=1)
  keys = (jnp.arange(r, dtype=jnp.int32)[:, None] * w + first).reshape(-1)
  sums = jax.ops.segment_sum(x.reshape(-1), keys, num_segments=r * w)
  return sums[keys].reshape(r, w)


@flax.struct.dataclass
class PackedBatch:
  """Trajectories packed into rows (see the module docstring).

  tokens, positions [R, W] int32 (positions restart at 0 per trajectory; 0 on padding);
  index: the PackIndex (segment_ids [R, W]: 1..k per row, 0 on padding)."""

  tokens: Array
  positions: Array
  index: PackIndex

  @property
  def segment_ids(self) -> Array:
    return self.index.segment_ids


def pack_trajectories(tokens: Array, valid: Array, positions: Array | None,
                      plan: PackPlan) -> PackedBatch:
  """The [B, S] trajectories (real tokens contiguous in each row) as packed rows [R, W].

  plan: plan_packing(valid, ...). positions: the trajectories' position ids [B, S] (None: from
  the padding, masks.positions_from_padding), packed as they are so they restart per trajectory.
  """
  from agentjax.models import masks  # local: keeps this module import-light for the host side

  index = plan.index()
  if positions is None:
    positions = masks.positions_from_padding(jnp.asarray(valid))
  return PackedBatch(tokens=index.pack(jnp.asarray(tokens)),
                     positions=index.pack(jnp.asarray(positions, jnp.int32)), index=index)


def padded_efficiency(lengths: np.ndarray, multiple: int = 128,
                      cache_len: int | None = None) -> float:
  """real tokens / computed tokens of a padded batch trimmed as train/scoring.trim does (every row
  as wide as the longest, rounded up to `multiple`, at most cache_len)."""
  lengths = np.asarray(lengths)
  longest = int(lengths.max(initial=0))
  width = max(multiple, -(-longest // multiple) * multiple)
  if cache_len is not None:
    width = min(width, cache_len)
  return float(lengths.sum()) / max(len(lengths) * width, 1)


def packed_sequence_logprobs(model, params, batch: PackedBatch, chunk: int = 256,
                             with_entropy: bool = False) -> tuple[Array, Array | None]:
  """models/logprobs.sequence_logprobs of the trajectories in `batch`, computed on its packed
  rows and returned in the source layout: logprobs [B, S], entropy [B, S] or None."""
  from agentjax.models.logprobs import packed_logprobs

  logp, ent = packed_logprobs(model, params, batch.tokens, batch.positions, batch.segment_ids,
                              chunk=chunk, with_entropy=with_entropy)
  return batch.index.unpack(logp), (None if ent is None else batch.index.unpack(ent))


# The key of a packed minibatch's segment ids (PackIndex.arrays): its presence selects the packed
# forward in the update.
PACK_SEGMENT_IDS = "pack_segment_ids"
# What MinibatchPacker adds to a minibatch: PackIndex.arrays()'s keys, one per map.
PACK_KEYS = tuple(f"pack_{f.name}" for f in dataclasses.fields(PackIndex)
                  if f.metadata.get("pytree_node", True))


@dataclasses.dataclass
class MinibatchPacker:
  """Plans each minibatch's packed rows on the host (train/packing.py), for `minibatches`.

  valid: [B, S] bool, the batch's real tokens (host: one transfer per step).
  pack_tokens: tokens per packed row (rl.pack_tokens).
  micro_batch: the update's rows per pass (0: one pass): the minibatch is reordered so that its
    strided micro-batches carry balanced token counts (packing.micro_batch_order) and each
    micro-batch is packed on its own (plan_micro_packing), as microbatch.split will cut it.
  row_multiple: each micro-batch's packed row count is a multiple of it (the devices the rows
    are sharded over).
  plans: every plan made, in order (packing_efficiency)."""

  valid: np.ndarray
  pack_tokens: int
  micro_batch: int = 0
  row_multiple: int = 1
  steps_per_octave: int = 8  # the row counts' ladder (row_ladder; rl.pack_rows_per_octave)
  plans: list[PackPlan] = dataclasses.field(default_factory=list)

  def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, dict[str, jax.Array]]:
    """idx [b] (the minibatch's trajectories) -> (idx reordered, the packed rows' maps
    ({PACK_KEYS}: [n * R_m, W] and [b, ...] arrays, split by microbatch.split like the rest))."""
    keep = self.valid[idx]
    n = num_micro(len(idx), self.micro_batch)
    if n > 1:  # the order does not change the loss: every aggregation sums over trajectories
      idx = idx[micro_batch_order(keep.sum(axis=1), n)]
      keep = self.valid[idx]
    plan = plan_micro_packing(keep, self.pack_tokens, n, row_multiple=self.row_multiple,
                              steps_per_octave=self.steps_per_octave)
    self.plans.append(plan)
    return idx, plan.index().arrays()

  def stats(self) -> dict[str, float]:
    """packing_efficiency: real / computed slots over the packed rows of every plan."""
    real = sum(p.real_tokens for p in self.plans)
    return {"packing_efficiency": real / max(sum(p.source.size for p in self.plans), 1)}
