"""IGPO's information gain: how much each turn raised the policy's probability of the truth.

For trajectory b and boundary t (t = 0: the prompt alone; t: the context after turn t-1's
observation) we teacher-force the ground truth, wrapped in the protocol's answer schema, after the
context and score it:

  v[b, t] = mean over the answer's own tokens a_j of log pi(a_j | context_t, a_<j)   ("log_prob")
          or exp of that                                                         ("prob", Eq. 3)
  ig[b, k] = v[b, k + 1] - v[b, k]    for the non-answer turns k < num_turns - 1 (stop-gradient)

The official implementation runs one teacher-forced pass per turn over the whole prefix (T passes,
O(T * L) tokens). Here all probes of a trajectory ride along ONE forward pass:

  row b:  [ trajectory slots 0..S-1 | probe 0 (A slots) | probe 1 | ... | probe P-1 ]

Probe p (boundary t, gold alias k) attends only to the trajectory slots before its boundary and to
its own earlier tokens, with position ids continuing from the boundary; trajectory tokens never
attend to probes. The same pass yields the trajectory's per-token log-probs (the old or reference
log-probs of PPO), so information gain costs little on top of what training computes anyway.

Padding-free (score_packed_rows): each trajectory followed by the probes of its live boundaries
only, several such items per row of train/packing.py; each trajectory and each probe a segment,
a probe's context pair pointing at its trajectory's segment. The same numbers as score_packed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models import masks
from agentjax.models.attention import AttentionMask
from agentjax.models.logprobs import chunked_token_logprobs
from agentjax.models.qwen.model import Qwen
from agentjax.sampling.sampler import bucket
from agentjax.rl.microbatch import map_micro

# The answer schema each protocol's probes use: {gt} is replaced by the gold answer, and only the
# gold answer's own tokens are scored.
ANSWER_TEMPLATES = {
    "search_r1": "<think>Now there's enough information to answer</think>\n<answer> {gt} </answer>",
    "tool_call": "<think>Now there's enough information to answer</think>\n<answer> {gt} </answer>",
}
MODES = ("log_prob", "prob")
ALIAS_MODES = ("first", "max")
# How the gold answer's tokens meet the template's head (rl.ig_probe_tokens). "natural": the
# whitespace that ends the head goes with the gold, so the gold is tokenized as the model writes
# it after "<answer> " (byte-level BPE: "<answer>", " Kef", "urn"); "split": head and gold
# encoded apart (what the studies before this default ran), which leaves a lone " " token the model never saw before
# a word, and a first gold token it never saw after "<answer>" (on the research backbone's
# teacher transcripts the gold's mean log-prob after the searches was -11.4 split, -4.5
# natural, and the searches' summed gain -0.37 split, +2.52 natural).
PROBE_TOKENS = ("natural", "split")


@dataclasses.dataclass(frozen=True)
class Probes:
  """Ground-truth probes of a batch (host arrays).

  tokens [B, K, A] int32: template + gold alias k (K = 1 in "first" mode), right-padded;
  score [B, K, A] bool: the gold answer's own tokens (what v averages over);
  valid [B, K, A] bool: real probe tokens (template included); alias_valid [B, K] bool.
  """

  tokens: np.ndarray
  score: np.ndarray
  valid: np.ndarray
  alias_valid: np.ndarray


def build_probes(encode: Callable[[str], Sequence[int]], golds: Sequence[Sequence[str] | str],
                 template: str = ANSWER_TEMPLATES["search_r1"], alias_mode: str = "first",
                 max_aliases: int = 4, max_answer_tokens: int = 64, tokens: str = "natural",
                 width_multiple: int = 8) -> Probes:
  """Tokenizes the probe of each trajectory's gold answer(s).

  The template's prefix, the gold text and the suffix are encoded separately and concatenated, so
  the scored span is exactly the gold answer's tokens. tokens (PROBE_TOKENS): "natural" moves
  the prefix's trailing whitespace onto the gold text before encoding it (the gold's tokens as
  the model would write them; the whitespace is then scored as part of the gold's first token);
  "split" encodes the prefix as written. width_multiple (rl.probe_width_multiple): the probe
  width A is the longest probe rounded up to a multiple of it.
  """
  if tokens not in PROBE_TOKENS:
    raise ValueError(f"rl.ig_probe_tokens must be one of {PROBE_TOKENS}, got {tokens!r}")
  if alias_mode not in ALIAS_MODES:
    raise ValueError(f"build_probes: alias_mode must be one of {ALIAS_MODES}, got "
                     f"{alias_mode!r}")
  if template.count("{gt}") != 1:  # ANSWER_TEMPLATES[rollout.protocol], or the caller's own
    raise ValueError(f"build_probes: the answer template must contain '{{gt}}' exactly once, "
                     f"got {template!r}")
  head, tail = template.split("{gt}")
  lead = ""
  if tokens == "natural":
    lead = head[len(head.rstrip()):]
    head = head.rstrip()
  head_ids, tail_ids = list(encode(head)), list(encode(tail))
  rows = []
  for gold in golds:
    aliases = [gold] if isinstance(gold, str) else list(gold)
    aliases = [a for a in aliases if a.strip()] or [""]
    aliases = aliases[:1] if alias_mode == "first" else aliases[:max_aliases]
    rows.append([list(encode(lead + a))[:max_answer_tokens] if a else []
                 for a in aliases])
  k = max(len(r) for r in rows)
  # A multiple (8 by default) rather than a power of two: every probe slot costs a forward
  # position at each of T boundaries, and answer lengths vary little, so few shapes occur anyway;
  # a larger multiple makes fewer (each width compiles the scoring pass again).
  longest = max(len(head_ids) + len(a) + len(tail_ids) for r in rows for a in r)
  width = -(-longest // width_multiple) * width_multiple
  b = len(rows)
  tokens = np.zeros((b, k, width), np.int32)
  score = np.zeros((b, k, width), bool)
  valid = np.zeros((b, k, width), bool)
  alias_valid = np.zeros((b, k), bool)
  for i, row in enumerate(rows):
    for j, ans in enumerate(row):
      seq = head_ids + ans + tail_ids
      tokens[i, j, :len(seq)] = seq
      valid[i, j, :len(seq)] = True
      score[i, j, len(head_ids):len(head_ids) + len(ans)] = True
      alias_valid[i, j] = len(ans) > 0
  return Probes(tokens=tokens, score=score, valid=valid, alias_valid=alias_valid)


@flax.struct.dataclass
class PackedScores:
  token_logprobs: jax.Array  # [B, S] log p(token j | tokens < j); 0 at slot 0
  token_entropy: jax.Array   # [B, S] entropy of the distribution predicting slot j (0 if not asked)
  values: jax.Array          # [B, T] v at boundaries 0..T-1 (0 where t >= num_turns)
  info_gain: jax.Array       # [B, T] ig of turn k (0 where k >= num_turns - 1)


def packed_mask(valid: jax.Array, boundaries: jax.Array, probe_valid: jax.Array) -> AttentionMask:
  """Attention mask of the packed sequence [trajectory S slots | P probes of A slots].

  The trajectory is segment 1 (padding 0); probe p is segment 2 + p, causal within itself, and
  reads its trajectory's slots before its boundary through the context pair (AttentionMask).

  Args:
    valid: [B, S] bool, real trajectory tokens.
    boundaries: [B, P] int32, context end (exclusive) of each probe.
    probe_valid: [B, P, A] bool.
  Returns:
    an AttentionMask over S + P*A slots (mask.visible() is the [B, S+P*A, S+P*A] boolean).
  """
  b, s = valid.shape
  _, p, a = probe_valid.shape
  probe_seg = jnp.broadcast_to(2 + jnp.arange(p, dtype=jnp.int32)[None, :, None], (b, p, a))
  k_seg = jnp.concatenate([valid.astype(jnp.int32),
                           jnp.where(probe_valid, probe_seg, 0).reshape(b, p * a)], axis=1)
  q_seg = jnp.concatenate([jnp.ones((b, s), jnp.int32), probe_seg.reshape(b, p * a)], axis=1)
  slots = jnp.broadcast_to(jnp.arange(s + p * a, dtype=jnp.int32), (b, s + p * a))
  ctx_seg = jnp.concatenate([jnp.zeros((b, s), jnp.int32),
                             jnp.ones((b, p * a), jnp.int32)], axis=1)
  ctx_end = jnp.concatenate([jnp.zeros((b, s), jnp.int32),
                             jnp.repeat(boundaries.astype(jnp.int32), a, axis=1)], axis=1)
  return AttentionMask(q_segment=q_seg, q_slot=slots, k_segment=k_seg, k_slot=slots,
                       q_context_segment=ctx_seg, q_context_end=ctx_end)


def information_gain(values: jax.Array, num_turns: jax.Array) -> jax.Array:
  """ig[b, k] = v[b, k+1] - v[b, k] for k < num_turns[b] - 1, else 0. values [B, T]."""
  t = values.shape[1]
  gain = jnp.concatenate([values[:, 1:] - values[:, :-1], jnp.zeros_like(values[:, :1])], axis=1)
  return jnp.where(jnp.arange(t)[None] < (num_turns - 1)[:, None], gain, 0.0)


def _probe_values(logp: jax.Array, probes_score: jax.Array, alias_valid: jax.Array,
                  mode: str) -> jax.Array:
  """[B, T, K, A] log-probs -> v [B, T] (mean over scored tokens, then max over aliases)."""
  score = probes_score[:, None].astype(jnp.float32)                               # [B, 1, K, A]
  mean = jnp.sum(logp * score, -1) / jnp.maximum(jnp.sum(score, -1), 1.0)         # [B, T, K]
  value = jnp.exp(mean) if mode == "prob" else mean
  value = jnp.where(alias_valid[:, None], value, -jnp.inf)
  return jnp.max(value, axis=-1)


def _probe_sequence(tokens: jax.Array, turn_ends: jax.Array, probe_tokens: jax.Array,
                    probe_valid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The sequence [trajectory S slots | P = T*K probes of A slots] of each trajectory.

  Returns seq [B, U] and positions [B, U] (U = S + P*A; probe positions continue from their
  boundary), boundaries [B, P] (p = t*K + k) and the probes' valid [B, P, A]."""
  b, s = tokens.shape
  t = turn_ends.shape[1] - 1
  _, k, a = probe_tokens.shape
  p = t * k
  boundaries = jnp.repeat(turn_ends[:, :t], k, axis=1)                        # [B, P], p = t*K + k
  ptok = jnp.tile(probe_tokens, (1, t, 1))                                    # [B, P, A]
  pval = jnp.tile(probe_valid, (1, t, 1))
  seq = jnp.concatenate([tokens, ptok.reshape(b, p * a)], axis=1)             # [B, S + P*A]
  positions = jnp.concatenate([
      jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)),
      (boundaries[:, :, None] + jnp.arange(a, dtype=jnp.int32)[None, None]).reshape(b, p * a)],
      axis=1)
  return seq, positions, boundaries, pval


def _scores(logp: jax.Array, ent: jax.Array | None, valid: jax.Array, num_turns: jax.Array,
            probe_score: jax.Array, alias_valid: jax.Array, t: int, mode: str) -> PackedScores:
  """PackedScores from the per-slot log-probs (and entropies) [B, S + P*A] of _probe_sequence."""
  b, s = valid.shape
  _, k, a = probe_score.shape
  first = jnp.arange(s)[None] > 0
  token_logprobs = jnp.where(first & valid, logp[:, :s], 0.0)
  token_entropy = (jnp.where(first & valid, ent[:, :s], 0.0) if ent is not None
                   else jnp.zeros_like(token_logprobs))
  values = _probe_values(logp[:, s:].reshape(b, t, k, a), probe_score, alias_valid, mode)
  values = jax.lax.stop_gradient(jnp.where(jnp.arange(t)[None] < num_turns[:, None], values, 0.0))
  return PackedScores(token_logprobs=token_logprobs, token_entropy=token_entropy, values=values,
                      info_gain=information_gain(values, num_turns))


@functools.partial(jax.jit, static_argnames=("model", "mode", "with_entropy", "chunk"))
def score_packed(model: Qwen, params, tokens: jax.Array, valid: jax.Array, turn_ends: jax.Array,
                 num_turns: jax.Array, probe_tokens: jax.Array, probe_score: jax.Array,
                 probe_valid: jax.Array, alias_valid: jax.Array, *, mode: str = "log_prob",
                 with_entropy: bool = False, chunk: int = 256) -> PackedScores:
  """One forward pass: trajectory log-probs and the ground-truth value at every boundary.

  Args:
    tokens, valid: [B, S] trajectory (row b's real tokens are a prefix; slot j has position j).
    turn_ends: [B, T'] context boundaries, T' >= T + 1 turns' worth (TrajectoryBatch.turn_ends);
      the first T = turn_ends.shape[1] - 1 boundaries are probed.
    num_turns: [B].
    probe_tokens, probe_score, probe_valid: [B, K, A] from build_probes; alias_valid [B, K].
  """
  b, s = tokens.shape
  t = turn_ends.shape[1] - 1
  _, k, a = probe_tokens.shape
  p = t * k
  seq, positions, boundaries, pval = _probe_sequence(tokens, turn_ends, probe_tokens, probe_valid)
  mask = packed_mask(valid, boundaries, pval)
  hidden, _ = model.apply({"params": params}, seq, positions, mask, return_hidden=True)

  # What predicts each token: the previous slot of the trajectory; for a probe's first token the
  # last context slot before its boundary, for later probe tokens the previous probe slot.
  traj_h, probe_h = hidden[:, :s], hidden[:, s:].reshape(b, p, a, -1)
  ctx_last = jnp.take_along_axis(traj_h, jnp.maximum(boundaries - 1, 0)[:, :, None], axis=1)
  ctx_last = ctx_last[:, :, None, :]                                           # [B, P, 1, E]
  probe_prev = jnp.concatenate([ctx_last, probe_h[:, :, :-1]], axis=2)         # [B, P, A, E]
  traj_prev = jnp.concatenate([traj_h[:, :1], traj_h[:, :-1]], axis=1)         # [B, S, E]
  prev = jnp.concatenate([traj_prev, probe_prev.reshape(b, p * a, -1)], axis=1)
  logits_fn = functools.partial(model.apply, {"params": params}, method=Qwen.logits)
  logp, ent = chunked_token_logprobs(logits_fn, prev, seq, chunk=chunk, with_entropy=with_entropy)
  return _scores(logp, ent, valid, num_turns, probe_score, alias_valid, t, mode)


# ---------------------------------------------------------------------------------------------
# The same pass on packed rows (agentjax/train/packing.py): each trajectory followed by its own
# probes, several trajectories per row.
# ---------------------------------------------------------------------------------------------


def probe_keep(valid: np.ndarray, num_turns: np.ndarray, num_boundaries: int,
               probe_valid: np.ndarray) -> np.ndarray:
  """The slots of the [B, S + T*K*A] probe sequence worth computing (host): the trajectory's
  real tokens and the real tokens of the probes at boundaries t < num_turns (the others' values
  are 0 anyway). Pass to packing.plan_packing.

  Args:
    valid: [B, S] bool, each row's real tokens a prefix (a ValueError otherwise).
    num_turns: [B]; num_boundaries: T (turn_ends.shape[1] - 1); probe_valid: [B, K, A].
  Returns:
    keep [B, S + T*K*A] bool.
  """
  valid = np.asarray(valid, bool)
  lengths = valid.sum(axis=1)
  if not np.array_equal(valid, np.arange(valid.shape[1])[None] < lengths[:, None]):
    raise ValueError("packed probes need each trajectory's real tokens to be a prefix of its row")
  t = num_boundaries
  live = np.arange(t)[None, :, None, None] < np.asarray(num_turns)[:, None, None, None]
  probes = live & np.asarray(probe_valid, bool)[:, None]                    # [B, T, K, A]
  return np.concatenate([valid, probes.reshape(valid.shape[0], -1)], axis=1)


@flax.struct.dataclass
class ProbeRows:
  """The probe sequences packed into rows: what one forward over [R, W] needs.

  tokens, positions [R, W] int32; mask: the AttentionMask (each trajectory and each of its probes
  a segment of its own; a probe's context pair points at its trajectory's segment and ends at the
  trajectory's offset + boundary); predictor [R, W] int32: the column of the row whose hidden
  state predicts each slot's token (the slot itself where nothing does)."""

  tokens: jax.Array
  positions: jax.Array
  mask: AttentionMask
  predictor: jax.Array


def probe_rows(index, tokens: jax.Array, valid: jax.Array, turn_ends: jax.Array,
               probe_tokens: jax.Array, probe_valid: jax.Array) -> ProbeRows:
  """Packs the probe sequences of score_packed with `index` (packing.PackIndex of
  plan_packing(probe_keep(...))). Arguments as score_packed's."""
  b, s = tokens.shape
  t = turn_ends.shape[1] - 1
  _, k, a = probe_tokens.shape
  p = t * k
  u = s + p * a
  seq, positions, boundaries, pval = _probe_sequence(tokens, turn_ends, probe_tokens, probe_valid)
  src = packed_mask(valid, boundaries, pval)  # the unpacked mask's per-slot arrays [B, U]
  item = index.segment_ids                                                     # [R, W]
  # Segment ids unique within a row: the trajectory in row place i (1-based) takes (i - 1)(P + 1)
  # plus its unpacked ids (1: the trajectory, 2 + p: probe p).
  base = jnp.where(item > 0, (item - 1) * (p + 1), 0)
  shift = lambda x: jnp.where(x > 0, base + x, 0)  # noqa: E731
  q_seg = shift(index.pack(src.q_segment))
  k_seg = shift(index.pack(src.k_segment))
  ctx_seg = shift(index.pack(src.q_context_segment))
  # The trajectory's slot j sits at column offset + j (its real tokens are a prefix), so the
  # context of a probe ends at offset + boundary in the packed row.
  offset = index.pack(jnp.broadcast_to(index.offset[:, None], (b, u)))
  ctx_end = jnp.where(ctx_seg > 0, offset + index.pack(src.q_context_end), 0)
  cols = jnp.broadcast_to(jnp.arange(item.shape[1], dtype=jnp.int32), item.shape)
  mask = AttentionMask(q_segment=q_seg, q_slot=cols, k_segment=k_seg, k_slot=cols,
                       q_context_segment=ctx_seg, q_context_end=ctx_end)

  # Predictors in the unpacked layout (as score_packed): slot j - 1 of the trajectory; for a
  # probe's first token the last context slot before its boundary; else the previous probe slot.
  traj_pred = jnp.broadcast_to(jnp.maximum(jnp.arange(s, dtype=jnp.int32) - 1, 0), (b, s))
  probe_pred = s + jnp.arange(p * a, dtype=jnp.int32).reshape(p, a) - 1       # [P, A]
  probe_pred = jnp.where(jnp.arange(a)[None, None] == 0,
                         jnp.maximum(boundaries - 1, 0)[:, :, None], probe_pred[None])
  pred = jnp.concatenate([traj_pred, probe_pred.reshape(b, p * a)], axis=1)    # [B, U]
  pred_slot = index.pack(jnp.take_along_axis(index.slot, pred, axis=1), fill=-1)
  w = item.shape[1]
  predictor = jnp.where(pred_slot >= 0, pred_slot % w, cols)
  return ProbeRows(tokens=index.pack(seq), positions=index.pack(positions), mask=mask,
                   predictor=predictor)


def rows_logprobs(model: Qwen, params, rows: ProbeRows, *, with_entropy: bool = False,
                  chunk: int = 256) -> tuple[jax.Array, jax.Array | None]:
  """The forward over packed probe rows: log p of each slot's token given its predictor.
  -> logp [R, W], entropy [R, W] or None. Rows are independent: micro-batch over R freely."""
  hidden, _ = model.apply({"params": params}, rows.tokens, rows.positions, rows.mask,
                          return_hidden=True)
  prev = jnp.take_along_axis(hidden, rows.predictor[..., None], axis=1)        # [R, W, E]
  logits_fn = functools.partial(model.apply, {"params": params}, method=Qwen.logits)
  return chunked_token_logprobs(logits_fn, prev, rows.tokens, chunk=chunk,
                                with_entropy=with_entropy)


@functools.partial(jax.jit, static_argnames=("model", "mode", "with_entropy", "chunk",
                                             "micro_batch"))
def score_packed_rows(model: Qwen, params, index, tokens: jax.Array, valid: jax.Array,
                      turn_ends: jax.Array, num_turns: jax.Array, probe_tokens: jax.Array,
                      probe_score: jax.Array, probe_valid: jax.Array, alias_valid: jax.Array, *,
                      mode: str = "log_prob", with_entropy: bool = False,
                      chunk: int = 256, micro_batch: int = 0) -> PackedScores:
  """score_packed with the trajectories and their probes packed into rows (padding-free).

  index: packing.PackIndex of plan_packing(probe_keep(valid, num_turns, T, probe_valid), ...),
  planned on the host from the same arrays. Other arguments and the result ([B, ...] per
  trajectory) as score_packed's: the same numbers, over R x W slots instead of B x (S + T*K*A).
  micro_batch: packed rows per forward (rl/microbatch.map_micro; 0: all R at once).
  """
  t = turn_ends.shape[1] - 1
  rows = probe_rows(index, tokens, valid, turn_ends, probe_tokens, probe_valid)
  logp, ent = map_micro(lambda r: rows_logprobs(model, params, r, with_entropy=with_entropy,
                                                chunk=chunk), micro_batch, rows)
  return _scores(index.unpack(logp), None if ent is None else index.unpack(ent), valid,
                 num_turns, probe_score, alias_valid, t, mode)


@functools.partial(jax.jit, static_argnames=("model", "mode"))
def _score_prefix_batch(model: Qwen, params, seq, valid, score, alias_valid, *, mode):
  """Values of probes placed right after each row's context: seq [B, K, L] (context + probe)."""
  b, k, length = seq.shape
  flat, fvalid = seq.reshape(b * k, length), valid.reshape(b * k, length)
  positions = jnp.maximum(jnp.cumsum(fvalid, axis=-1) - 1, 0)
  mask = masks.causal_padding_mask(fvalid)
  hidden, _ = model.apply({"params": params}, flat, positions, mask, return_hidden=True)
  prev = jnp.concatenate([hidden[:, :1], hidden[:, :-1]], axis=1)
  logits_fn = functools.partial(model.apply, {"params": params}, method=Qwen.logits)
  logp, _ = chunked_token_logprobs(logits_fn, prev, flat)
  return _probe_values(logp.reshape(b, 1, k, length), score, alias_valid, mode)[:, 0]


def score_naive(model: Qwen, params, tokens: np.ndarray, turn_ends: np.ndarray,
                num_turns: np.ndarray, probes: Probes, mode: str = "log_prob") -> np.ndarray:
  """The official-code way: one teacher-forced pass per boundary over the whole prefix (batched
  over trajectories). Same values as score_packed; used by tests and the benchmark. -> v [B, T]."""
  tokens, turn_ends = np.asarray(tokens), np.asarray(turn_ends)
  b, t = turn_ends.shape[0], turn_ends.shape[1] - 1
  _, k, a = probes.tokens.shape
  values = np.zeros((b, t), np.float32)
  for step in range(t):
    live = np.flatnonzero(step < np.asarray(num_turns))
    if not len(live):
      continue
    ends = turn_ends[live, step]
    width = bucket(int(ends.max()) + a)
    seq = np.zeros((len(live), k, width), np.int32)
    valid = np.zeros((len(live), k, width), bool)
    score = np.zeros((len(live), k, width), bool)
    for i, row in enumerate(live):
      n = ends[i]
      seq[i, :, :n] = tokens[row, :n]
      valid[i, :, :n] = True
      seq[i, :, n:n + a] = probes.tokens[row]
      valid[i, :, n:n + a] = probes.valid[row]
      score[i, :, n:n + a] = probes.score[row]
    v = _score_prefix_batch(model, params, jnp.asarray(seq), jnp.asarray(valid), jnp.asarray(score),
                            jnp.asarray(probes.alias_valid[live]), mode=mode)
    values[live, step] = np.asarray(v)
  return values
