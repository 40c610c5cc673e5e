"""The RL step's scoring pass (stage 3): the policy's and the reference's log-probs of every
trajectory token, and IGPO's probes in the same pass as the policy's.

    scored = score_batch(model, params, ref_params, batch, probes)         # old/ref log-probs + IG

Padding-free (rl.pack_tokens > 0; train/packing.py): the passes run on packed rows
(`plan_scoring` on the host, then `score_batch(..., packing=plans)`), with the same numbers as
the padded passes. With `micro_batch` (rl.micro_batch_size x the batch's devices) each pass runs
that many rows per forward (microbatch.py), the same numbers either way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.agent.rollout import TrajectoryBatch
from agentjax.agent.trajectories import SLOT_FIELDS
from agentjax.models import masks
from agentjax.models.logprobs import packed_logprobs, sequence_logprobs
from agentjax.models.qwen import Qwen
from agentjax.parallel.host import to_device
from agentjax.rl.info_gain import Probes, probe_keep, score_packed, score_packed_rows
from agentjax.rl.microbatch import map_micro
from agentjax.train.packing import PackIndex, PackPlan, plan_packing


@flax.struct.dataclass
class ScoredBatch:
  old_logp: jax.Array   # [B, S] current policy's log-probs of the trajectory tokens
  ref_logp: jax.Array   # [B, S] reference policy's (zeros when no reference is used)
  values: jax.Array     # [B, T] ground-truth value at each boundary (IGPO)
  ig: jax.Array         # [B, T] information gain of each non-answer turn


@dataclasses.dataclass(frozen=True)
class ScorePlans:
  """Where the scoring passes put each token when packed (host; `plan_scoring`).

  plain: the trajectories' real tokens (the reference's pass, and the policy's without probes);
  probes: each trajectory followed by the probes of its live boundaries (IGPO's policy pass).
  Either is None when no pass needs it."""

  plain: PackPlan | None
  probes: PackPlan | None

  def stats(self) -> dict[str, float]:
    """score_packing_efficiency: real / computed slots over the packed passes."""
    plans = [p for p in (self.plain, self.probes) if p is not None]
    real = sum(p.real_tokens for p in plans)
    return {"score_packing_efficiency": real / max(sum(p.source.size for p in plans), 1)}


# Room a probe pass's rows get on top of pack_tokens: T * K * A probe slots rounded up to this, so
# that a trajectory of pack_tokens and all its probes share one row (few distinct widths).
PROBE_ROOM_MULTIPLE = 128


def plan_scoring(valid: np.ndarray, num_turns: np.ndarray, num_boundaries: int,
                 probes: Probes | None, pack_tokens: int, *, reference: bool = True,
                 row_multiple: int = 1, steps_per_octave: int = 8) -> ScorePlans:
  """The packed rows of score_batch's passes (host, first-fit-decreasing: packing.plan_packing).

  Args:
    valid: [B, S] bool (host) real tokens, each row's a prefix when probes are given.
    num_turns: [B]; num_boundaries: T = turn_ends.shape[1] - 1.
    probes: IGPO's (None: the policy's pass is plain).
    pack_tokens: tokens per packed row (rl.pack_tokens); the probe pass's rows are wider by
      T * K * A rounded up to PROBE_ROOM_MULTIPLE. A longer item widens its batch's rows to the
      next power-of-two multiple (packing.width_ladder).
    reference: whether a reference pass runs (a plain plan is needed even with probes).
    row_multiple: the number of rows is a multiple of it (the global micro-batch, else the
      devices the rows are sharded over).
    steps_per_octave: the row counts' ladder (rl.pack_rows_per_octave; packing.row_ladder).
  """
  valid = np.asarray(valid, bool)
  plain = plan_packing(valid, pack_tokens, row_multiple=row_multiple,
                       steps_per_octave=steps_per_octave) \
      if probes is None or reference else None
  probe_plan = None
  if probes is not None:
    _, k, a = probes.tokens.shape
    room = -(-(num_boundaries * k * a) // PROBE_ROOM_MULTIPLE) * PROBE_ROOM_MULTIPLE
    keep = probe_keep(valid, np.asarray(num_turns), num_boundaries, probes.valid)
    probe_plan = plan_packing(keep, pack_tokens + room, row_multiple=row_multiple,
                              steps_per_octave=steps_per_octave)
  return ScorePlans(plain=plain, probes=probe_plan)


def score_batch(model: Qwen, params: Any, ref_params: Any | None, batch: TrajectoryBatch,
                probes: Probes | None, mode: str = "log_prob", chunk: int = 256,
                ref_model: Qwen | None = None, micro_batch: int = 0,
                packing: ScorePlans | None = None) -> ScoredBatch:
  """Step 3: the policy's log-probs and IGPO's probes in ONE packed pass; the reference's log-probs
  in a plain pass (no probes needed). Without probes (GRPO family) the policy pass is plain too.

  ref_model: the reference's module when it is not `model` (a LoRA run: the policy is
  Qwen(cfg, lora=...), the reference the bare backbone Qwen(cfg) with the same arrays).
  micro_batch: rows per forward over all devices (microbatch.global_micro; 0: the whole batch
  at once); each pass is one program looping over the slices, the same numbers either way.
  packing: plan_scoring(...) of this batch and probes: every pass runs on packed rows
  (micro_batch then counts packed rows), the same numbers as the padded passes."""
  if packing is not None:
    return _score_packed_batch(model, params, ref_params, batch, probes, mode, chunk,
                               ref_model, micro_batch, packing)
  tokens, valid = batch.tokens, batch.valid
  t = batch.turn_ends.shape[1] - 1
  if probes is not None:
    packed = packed_scores(model, params, tokens, valid, np.asarray(batch.turn_ends),
                           np.asarray(batch.num_turns), np.asarray(probes.tokens),
                           np.asarray(probes.score), np.asarray(probes.valid),
                           np.asarray(probes.alias_valid), mode=mode, chunk=chunk,
                           micro_batch=micro_batch)
    old, values, ig = packed.token_logprobs, packed.values, packed.info_gain
  else:
    old = plain_logprobs(model, params, tokens, valid, chunk, micro_batch)
    values = ig = to_device(np.zeros((tokens.shape[0], t), np.float32))
  ref = plain_logprobs(ref_model or model, ref_params, tokens, valid, chunk, micro_batch) \
      if ref_params is not None else _zeros_like(old)
  return ScoredBatch(old_logp=old, ref_logp=ref, values=values, ig=ig)


def _zeros_like(x: jax.Array) -> jax.Array:
  """Zeros of x's shape and dtype, placed like it: a host array transferred (no program; an
  eager jnp.zeros_like compiled a broadcast and a cast)."""
  return jax.device_put(np.zeros(x.shape, x.dtype), x.sharding)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def plain_logprobs(model, params, tokens, valid, chunk, micro_batch=0):
  return map_micro(lambda t, v: sequence_logprobs(model, params, t, v, chunk=chunk)[0],
                   micro_batch, tokens, valid)


def _score_packed_batch(model, params, ref_params, batch, probes, mode, chunk, ref_model,
                        micro_batch, plans: ScorePlans) -> ScoredBatch:
  """score_batch on the packed rows of `plans`."""
  tokens, valid = batch.tokens, batch.valid
  t = batch.turn_ends.shape[1] - 1
  plain = None if plans.plain is None else plans.plain.index()  # one transfer for both passes
  if probes is not None:
    if plans.probes is None:
      raise ValueError("score_batch: probes given but plan_scoring(...) planned none")
    scores = score_packed_rows(model, params, plans.probes.index(), tokens, valid,
                               np.asarray(batch.turn_ends), np.asarray(batch.num_turns),
                               np.asarray(probes.tokens),
                               np.asarray(probes.score), np.asarray(probes.valid),
                               np.asarray(probes.alias_valid), mode=mode, chunk=chunk,
                               micro_batch=micro_batch)
    old, values, ig = scores.token_logprobs, scores.values, scores.info_gain
  else:
    old = _packedplain_logprobs(model, params, tokens, valid, plain, chunk=chunk,
                                 micro_batch=micro_batch)
    values = ig = to_device(np.zeros((tokens.shape[0], t), np.float32))
  if ref_params is None:
    ref = _zeros_like(old)
  else:
    if plain is None:
      raise ValueError("score_batch: a reference pass but plan_scoring(..., reference=False)")
    ref = _packedplain_logprobs(ref_model or model, ref_params, tokens, valid, plain,
                                 chunk=chunk, micro_batch=micro_batch)
  return ScoredBatch(old_logp=old, ref_logp=ref, values=values, ig=ig)


@functools.partial(jax.jit, static_argnames=("model", "chunk", "micro_batch"))
def _packedplain_logprobs(model, params, tokens, valid, index: PackIndex, *, chunk,
                           micro_batch):
  """sequence_logprobs of [B, S] tokens computed on index's packed rows ([R, W], micro_batch
  rows per forward) -> [B, S]."""
  positions = index.pack(masks.positions_from_padding(valid))
  logp = map_micro(lambda tok, pos, seg: packed_logprobs(model, params, tok, pos, seg,
                                                         chunk=chunk)[0],
                   micro_batch, index.pack(tokens), positions, index.segment_ids)
  return index.unpack(logp)


@functools.partial(jax.jit, static_argnames=("model", "mode", "chunk", "micro_batch"))
def packed_scores(model, params, *rows, mode, chunk, micro_batch):
  """score_packed over [B, ...] rows (tokens, valid, turn_ends, num_turns, probe arrays) in
  slices of micro_batch rows; every output is per row."""
  return map_micro(lambda *r: score_packed(model, params, *r, mode=mode, chunk=chunk),
                   micro_batch, *rows)


def trim(batch: TrajectoryBatch, multiple: int = 128) -> TrajectoryBatch:
  """The batch cut to its longest trajectory, rounded up to `multiple` slots.

  Rollouts fill a KV cache sized for the worst case (a power of two); scoring and updates only
  need the slots some row uses, and rounding keeps the number of compiled shapes small
  (cache_len / multiple at most)."""
  cache_len = batch.tokens.shape[1]
  used = int(np.max(batch.turn_ends)) if batch.turn_ends.size else cache_len
  width = min(cache_len, max(multiple, -(-used // multiple) * multiple))
  if width == cache_len:
    return batch
  return batch.replace(**_cut_slots({f: getattr(batch, f) for f in SLOT_FIELDS}, width))


@functools.partial(jax.jit, static_argnums=1)
def _cut_slots(slots: dict, width: int) -> dict:
  # One program per width for all the slot arrays (eager slicing compiled one per dtype).
  return {k: v[:, :width] for k, v in slots.items()}


__all__ = ["PROBE_ROOM_MULTIPLE", "ScorePlans", "ScoredBatch", "plan_scoring", "score_batch",
           "trim"]
