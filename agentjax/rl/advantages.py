"""Advantage estimators: outcome-level (GRPO family, RLOO, REINFORCE++), turn-level (IGPO, CW-GRPO).

  estimator = get_advantage_estimator("igpo")
  adv, stats = estimator(outcome=r, group_ids=g, loss_mask=m, ig=ig, num_turns=n, turn_id=t,
                         gamma=1.0, norm_mode="joint")          # adv [B, L], 0 off loss_mask

Shapes: B trajectories, L token slots, T max turns (static). Conventions:
  loss_mask [B, L]  1 exactly on tokens the policy sampled (0 on prompt, observations, padding).
  turn_id   [B, L]  int32, k for tokens of turn k (its sampled tokens and the observation after
                    them), -1 on prompt and padding.
  num_turns [B]     int32 >= 1; turn num_turns-1 is the answer (or truncated) turn, which carries
                    the outcome reward.
  group_ids [B]     int32; rollouts of one question share an id. Groups need not be contiguous:
                    group statistics use a [B, B] same-group matrix (B is small), reduced with
                    elementwise products and sums rather than matmuls, so no reduced-precision
                    matmul (TPU/TF32 defaults) touches the rewards.
  turn_mask [B, T]  arange(T) < num_turns[:, None].

Every registered estimator takes keyword arguments and returns (advantages [B, L] float32,
stats dict of scalars). Through the registry, batch fields an estimator does not use (ig,
turn_id, ... see `BATCH_FIELDS`) are dropped, so a trainer can pass one batch dict to any of
them; unknown configuration keywords still raise.

Group statistics. The group standard deviation is a configuration choice, `std_estimator`
(rl.std_estimator): "population" (ddof 0, + eps; the default), "unbiased" (ddof 1, + eps: verl,
so the Search-R1 and CW-GRPO code) or "sqrt_var_eps" (sqrt(population var + eps): the official
IGPO code, eps 1e-8); see `STD_ESTIMATORS`. Every pool is centred on one of its own members
before it is averaged, so a group whose values are all equal gets exactly 0 in every estimator
whatever the value (0.7 or 2/3 are not exact in float32, and a sum / n mean is then off by an
ulp that a ~1e-7 std would blow up). A group whose spread is within a few float32 ulps of its
magnitude, or that has one member, is collapsed: its members get advantage 0 (in
"reinforce++", which has no group baseline, this holds for a batch whose tokens all carry one
value).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from agentjax.registry import Registry
from agentjax.rl import gae as gae_lib

Array = jax.Array
_F32 = jnp.float32

ADVANTAGE_ESTIMATORS = Registry("advantage estimator")

# Per-batch inputs an estimator may or may not consume; the registry drops the unused ones.
# The step's own fields, and those of the built-in signals (agentjax/signals): a new signal adds
# its own (register_batch_field).
BATCH_FIELDS = {"outcome", "group_ids", "loss_mask", "turn_id", "num_turns", "ig",
                "retrieval_scores", "thinking_scores", "values"}


def register_batch_field(name: str) -> None:
  """Makes `name` a batch field: an estimator that does not take it is not handed it."""
  BATCH_FIELDS.add(name)


def register_advantage(name: str):
  """Decorator: register an estimator under `name` (the function itself is returned unchanged)."""

  def deco(fn: Callable) -> Callable:
    accepted = set(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def call(*args, **kwargs):
      kwargs = {k: v for k, v in kwargs.items() if k in accepted or k not in BATCH_FIELDS}
      return fn(*args, **kwargs)

    ADVANTAGE_ESTIMATORS.register(name, call)
    return fn

  return deco


def get_advantage_estimator(name: str) -> Callable:
  """The registered estimator `name`; a KeyError names the known ones otherwise."""
  return ADVANTAGE_ESTIMATORS[name]


# ---------------------------------------------------------------------------------------------
# Building blocks.
# ---------------------------------------------------------------------------------------------


def same_group(group_ids: Array) -> Array:
  """[B] ids -> [B, B] bool, True where two trajectories answer the same question."""
  group_ids = jnp.asarray(group_ids)
  return group_ids[:, None] == group_ids[None, :]


# Group standard deviations (`std_estimator` of the group-normalizing estimators; rl.std_estimator):
#   "population"    (r - mean) / (std_ddof0 + eps)   (this codebase's historical default)
#   "unbiased"      (r - mean) / (std_ddof1 + eps)   (verl: torch.std; Search-R1, CW-GRPO code)
#   "sqrt_var_eps"  (r - mean) / sqrt(var_ddof0 + eps)   (the official IGPO code, eps 1e-8)
STD_ESTIMATORS = ("population", "unbiased", "sqrt_var_eps")

# A pool whose spread (max - min) is at most this many float32 ulps of its largest magnitude is
# collapsed: its differences are rounding, not signal, and every member gets advantage 0.
_RESOLUTION_ULPS = 4.0
_F32_EPS = float(jnp.finfo(jnp.float32).eps)


def _ddof(std_estimator: str) -> int:
  """The variance's delta degrees of freedom of a std estimator (ValueError if unknown)."""
  if std_estimator not in STD_ESTIMATORS:
    raise ValueError(f"unknown std_estimator {std_estimator!r}; known: {STD_ESTIMATORS}")
  return 1 if std_estimator == "unbiased" else 0


def _pool_moments(values: Array, member: Array, ddof: int) -> dict[str, Array]:
  """Moments of P pools of one value array, centred on a member of each pool.

  Each pool is first shifted by a reference value, one of its own members (its largest): members
  equal to the reference give exactly 0, so a pool of equal values has an exactly zero mean
  deviation and variance whatever its value (a plain sum / n of 0.7s in float32 is off by an
  ulp, and the z-score of that ulp against a ~1e-7 std is O(0.1)).

  Args:
    values: [...] float32; non-members may hold anything, NaN included (selected away).
    member: [P, ...] bool, member[p, m...] when value m... belongs to pool p.
    ddof: 0 (population variance) or 1 (unbiased; a pool of one gets variance 0).
  Returns:
    dict of [P] float32 "ref" (the reference value, 0 for an empty pool), "mean_dev" (mean of
    value - ref) and "var", and [P] bool "collapsed" (spread at most _RESOLUTION_ULPS ulps of
    the largest |value|; true for pools of 0 or 1 member and of equal values).
  """
  axes = tuple(range(1, member.ndim))
  per_pool = (slice(None),) + (None,) * (member.ndim - 1)  # [P] -> [P, 1, ...]
  count = jnp.sum(member, axis=axes).astype(_F32)
  hi = jnp.max(jnp.where(member, values[None], -jnp.inf), axis=axes)
  lo = jnp.min(jnp.where(member, values[None], jnp.inf), axis=axes)
  ref = jnp.where(count > 0, hi, 0.0)
  d = jnp.where(member, values[None] - ref[per_pool], 0.0)
  mean_dev = jnp.sum(d, axis=axes) / jnp.maximum(count, 1.0)
  # Two-pass variance: exact for tightly clustered values, unlike E[x^2] - E[x]^2.
  dev = jnp.where(member, d - mean_dev[per_pool], 0.0)
  var = jnp.sum(dev * dev, axis=axes) / jnp.maximum(count - ddof, 1.0)
  # hi - lo is -inf for an empty pool: collapsed too.
  collapsed = hi - lo <= (_RESOLUTION_ULPS * _F32_EPS) * jnp.maximum(jnp.abs(hi), jnp.abs(lo))
  return dict(ref=ref, mean_dev=mean_dev, var=var, collapsed=collapsed)


def group_normalize(values: Array, valid: Array, group_ids: Array, *, scale_by_std: bool = True,
                    std_estimator: str = "population", eps: float = 1e-6) -> Array:
  """Each valid entry minus the mean of its group's valid entries, over the group's std.

  The pool of trajectory i is every valid entry (j, t) of every trajectory j in i's group.

  Args:
    values: [B, T] float; invalid entries may hold anything.
    valid: [B, T] bool.
    group_ids: [B] int32.
    scale_by_std: divide by the group std (see STD_ESTIMATORS); False only centres (Dr.GRPO).
    std_estimator: one of STD_ESTIMATORS.
    eps: the std's epsilon (added to the std, or to the variance for "sqrt_var_eps").
  Returns:
    [B, T] float32; 0 on every entry of a collapsed group (equal values, a single member, or a
    spread below float resolution). Invalid entries hold unspecified values (callers mask them).
  """
  ddof = _ddof(std_estimator)
  values = jnp.asarray(values).astype(_F32)
  # [B(i), B(j), T]: entry (j, t) is in i's pool.
  member = same_group(group_ids)[:, :, None] & jnp.asarray(valid).astype(bool)[None, :, :]
  m = _pool_moments(values, member, ddof)
  centred = (values - m["ref"][:, None]) - m["mean_dev"][:, None]
  if scale_by_std:
    if std_estimator == "sqrt_var_eps":
      denom = jnp.sqrt(m["var"] + eps)
    else:
      denom = jnp.sqrt(m["var"]) + eps
    # With eps = 0 a non-collapsed pool of subnormal values can underflow to var 0.
    centred = centred / jnp.where(denom > 0, denom, 1.0)[:, None]
  return jnp.where(m["collapsed"][:, None], 0.0, centred)


def turn_to_token(turn_values: Array, turn_id: Array, loss_mask: Array) -> Array:
  """Spread turn-level values to the tokens the policy sampled in each turn.

  Args:
    turn_values: [B, T] value of each turn.
    turn_id: [B, L] int32 turn of each token (-1 on prompt/padding).
    loss_mask: [B, L] bool or 0/1.
  Returns:
    [B, L] float32: turn_values[b, turn_id[b, l]] where loss_mask[b, l] (and 0 <= turn_id < T),
    else 0.
  """
  num_t = turn_values.shape[1]
  turn_id = jnp.asarray(turn_id).astype(jnp.int32)
  picked = jnp.take_along_axis(turn_values.astype(_F32), jnp.clip(turn_id, 0, num_t - 1), axis=1)
  ok = jnp.asarray(loss_mask).astype(bool) & (turn_id >= 0) & (turn_id < num_t)
  return jnp.where(ok, picked, 0.0)


def _broadcast_to_tokens(per_traj: Array, loss_mask: Array) -> Array:
  """[B] -> [B, L]: the trajectory value on every sampled token, 0 elsewhere."""
  return jnp.where(jnp.asarray(loss_mask).astype(bool), per_traj.astype(_F32)[:, None], 0.0)


def masked_mean_std(x: Array, mask: Array) -> tuple[Array, Array]:
  """Mean and population std of x over mask, as scalars (0, 0 for an empty mask): the moments
  of one pool (`_pool_moments`), so equal values give exactly their value and std 0."""
  m = _pool_moments(jnp.asarray(x).astype(_F32), jnp.asarray(mask).astype(bool)[None], 0)
  return m["ref"][0] + m["mean_dev"][0], jnp.sqrt(m["var"][0])


def masked_whiten(x: Array, mask: Array, ddof: int = 1, eps: float = 1e-8) -> Array:
  """(x - mean) * rsqrt(var + eps) over the masked entries of the whole batch (verl's
  masked_whiten: its variance is unbiased, ddof 1); 0 off mask, and 0 everywhere when the masked
  entries are all equal (the pool moments of `_pool_moments`).

  Args:
    x: [B, L] float; mask: [B, L] bool.
  """
  mask = jnp.asarray(mask).astype(bool)
  x = jnp.where(mask, jnp.asarray(x).astype(_F32), 0.0)
  m = _pool_moments(x, mask[None], ddof)
  centred = (x - m["ref"][0]) - m["mean_dev"][0]
  white = jnp.where(m["collapsed"][0], 0.0, centred * jax.lax.rsqrt(m["var"][0] + eps))
  return jnp.where(mask, white, 0.0)


def turn_mask_from(num_turns: Array, num_t: int) -> Array:
  """[B] turn counts -> [B, T] bool, True on the turns a trajectory has."""
  return jnp.arange(num_t)[None, :] < jnp.asarray(num_turns)[:, None]


# ---------------------------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------------------------


def advantage_collapse_fraction(outcome: Array, group_ids: Array, tol: float = 1e-6) -> Array:
  """Fraction of groups whose outcome rewards are all equal (max - min <= tol).

  Such a group gives every member a zero GRPO advantage ("advantage collapse"); a singleton
  group counts as collapsed. Groups are counted once each: trajectory i contributes 1/n_i.
  """
  outcome = jnp.asarray(outcome).astype(_F32)
  same = same_group(group_ids)
  hi = jnp.max(jnp.where(same, outcome[None, :], -jnp.inf), axis=1)
  lo = jnp.min(jnp.where(same, outcome[None, :], jnp.inf), axis=1)
  return _share_of_groups(hi - lo <= tol, same)


def _share_of_groups(flag: Array, same: Array) -> Array:
  """Fraction of groups whose flag is set; flag [B] is a per-group property repeated on each
  member, so trajectory i contributes 1/n_i (each group counts once)."""
  inv_n = 1.0 / jnp.sum(same, axis=1).astype(_F32)
  return jnp.sum(flag.astype(_F32) * inv_n) / jnp.sum(inv_n)


def zero_advantage_fraction(adv: Array, group_ids: Array, loss_mask: Array,
                            tol: float = 1e-6) -> Array:
  """Fraction of groups in which no sampled token of any member gets an advantage above tol.

  The collapse that matters to the update, whatever the estimator: a GRPO group with equal
  outcomes has zero advantages everywhere, an IGPO group with equal outcomes still has IG turn
  advantages when its searches gained differently. Groups are counted once each (trajectory i
  contributes 1/n_i).

  Args:
    adv: [B, L] per-token advantages.
    group_ids: [B] int32.
    loss_mask: [B, L].
  Returns:
    scalar float32.
  """
  live = jnp.where(jnp.asarray(loss_mask).astype(bool), jnp.abs(adv.astype(_F32)), 0.0)
  row_max = jnp.max(live, axis=1)  # [B]
  same = same_group(group_ids)
  group_max = jnp.max(jnp.where(same, row_max[None, :], 0.0), axis=1)
  return _share_of_groups(group_max <= tol, same)


def ig_statistics(ig: Array, num_turns: Array) -> dict[str, Array]:
  """Mean, population std and count of the information gains of valid non-answer turns.

  Args:
    ig: [B, T]; entries at k >= num_turns - 1 are ignored.
    num_turns: [B] int32.
  Returns:
    {"ig_mean", "ig_std", "ig_count"} scalars (mean/std are 0 when there is no such turn).
  """
  valid = turn_mask_from(jnp.asarray(num_turns) - 1, ig.shape[1])
  mean, std = masked_mean_std(ig.astype(_F32), valid)
  return {"ig_mean": mean, "ig_std": std, "ig_count": jnp.sum(valid).astype(_F32)}


def gt_logprob_ends(v: Array, num_turns: Array) -> tuple[Array, Array]:
  """The ground truth's mean per-token log-prob before the searches and after the last one.

  The two ends of gt_entropy_reduction (its definition there): over trajectories with
  K = num_turns - 1 >= 1 non-answer turns, the means of v[b, 0] (right after the prompt) and of
  v[b, K] (after the last search). Their difference is the reduction, so a reduction that falls
  during training can be read as the policy knowing the answer better without searching (the
  first rises) or its searches helping less (the second falls). 0 and 0 if no trajectory
  searched.

  Args:
    v: [B, T + 1] per-boundary ground-truth log-prob values (entries past boundary K ignored).
    num_turns: [B] int32.
  Returns:
    (before, after): scalar float32 each.
  """
  v = v.astype(_F32)
  last = jnp.clip(jnp.asarray(num_turns) - 1, 0, v.shape[1] - 1)
  v_last = jnp.take_along_axis(v, last[:, None], axis=1)[:, 0]
  has = jnp.asarray(num_turns) >= 2
  n = jnp.maximum(jnp.sum(has).astype(_F32), 1.0)
  return jnp.sum(jnp.where(has, v[:, 0], 0.0)) / n, jnp.sum(jnp.where(has, v_last, 0.0)) / n


def gt_entropy_reduction(v: Array, num_turns: Array) -> Array:
  """Mean drop in the ground-truth answer's "entropy" from before turn 0 to after the last search.

  Definition. v[b, k] is the mean per-token log-prob of the ground-truth answer under the policy
  given the context up to boundary k, where boundary 0 is right after the prompt and boundary k
  is right after turn k-1 (its generation and observation). The answer's "entropy" at a boundary
  is H_k = -v[b, k]. A trajectory with K = num_turns - 1 >= 1 non-answer turns has its last
  non-answer boundary at k = K, so its reduction is H_0 - H_K = v[b, K] - v[b, 0]; with
  IG_k = v[b, k+1] - v[b, k] this is the telescoped sum of its information gains. The result is
  the mean over trajectories with K >= 1 (0 if there is none).

  Args:
    v: [B, T + 1] per-boundary ground-truth log-prob values (entries past boundary K ignored).
    num_turns: [B] int32.
  Returns:
    scalar float32.
  """
  before, after = gt_logprob_ends(v, num_turns)
  return after - before


def outcome_stats(outcome: Array, group_ids: Array, adv: Array, loss_mask: Array,
                   collapse_tol: float) -> dict[str, Array]:
  r_mean, r_std = masked_mean_std(outcome.astype(_F32), jnp.ones(outcome.shape, bool))
  a_mean, a_std = masked_mean_std(adv, jnp.asarray(loss_mask).astype(bool))
  return {"reward_mean": r_mean, "reward_std": r_std,
          "collapse_fraction": advantage_collapse_fraction(outcome, group_ids, collapse_tol),
          "zero_adv_fraction": zero_advantage_fraction(adv, group_ids, loss_mask, collapse_tol),
          "adv_mean": a_mean, "adv_std": a_std}


# ---------------------------------------------------------------------------------------------
# Outcome-level estimators.
# ---------------------------------------------------------------------------------------------


def grpo_outcome_advantages(outcome: Array, group_ids: Array, *, scale_by_std: bool = True,
                            std_estimator: str = "population", eps: float = 1e-6) -> Array:
  """[B] GRPO advantage per trajectory: (r - mean_g) / std_g, or r - mean_g (Dr.GRPO).

  std_g is chosen by `std_estimator` (STD_ESTIMATORS) with epsilon `eps`; a collapsed group
  (equal outcomes, a single member) gets exactly 0."""
  outcome = jnp.asarray(outcome).astype(_F32)
  return group_normalize(outcome[:, None], jnp.ones((outcome.shape[0], 1), bool), group_ids,
                         scale_by_std=scale_by_std, std_estimator=std_estimator, eps=eps)[:, 0]


@register_advantage("gspo")  # GSPO changes the loss (sequence ratio), not the advantage.
@register_advantage("grpo")
def grpo_advantages(outcome: Array, group_ids: Array, loss_mask: Array, *,
                    scale_by_std: bool = True, std_estimator: str = "population",
                    eps: float = 1e-6,
                    collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """GRPO: outcome reward z-scored within its group, on every sampled token.

  Args:
    outcome: [B] outcome rewards.
    group_ids: [B] int32.
    loss_mask: [B, L].
    scale_by_std: divide by the group std; False is Dr.GRPO.
    std_estimator: "population" (ddof 0, + eps), "unbiased" (ddof 1, + eps: verl) or
      "sqrt_var_eps" (sqrt(population var + eps): the official IGPO code).
    eps: the std's epsilon.
    collapse_tol: tolerance of the collapse statistic.
  Returns:
    advantages [B, L] float32 (exactly 0 for every member of a collapsed group), stats.
  """
  per_traj = grpo_outcome_advantages(outcome, group_ids, scale_by_std=scale_by_std,
                                     std_estimator=std_estimator, eps=eps)
  adv = _broadcast_to_tokens(per_traj, loss_mask)
  return adv, outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)


@register_advantage("drgrpo")
def drgrpo_advantages(outcome: Array, group_ids: Array, loss_mask: Array, *,
                      collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """Dr.GRPO: r - group mean (no std scaling), on every sampled token."""
  return grpo_advantages(outcome, group_ids, loss_mask, scale_by_std=False,
                         collapse_tol=collapse_tol)


@register_advantage("rloo")
def rloo_advantages(outcome: Array, group_ids: Array, loss_mask: Array, *,
                    collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """RLOO: r_i minus the mean of the other members of its group (0 for a singleton group)."""
  outcome = jnp.asarray(outcome).astype(_F32)
  # r_i - (S - r_i) / (n - 1) = n / (n - 1) * (r_i - S / n): the group-centred outcome, scaled,
  # so equal outcomes give exactly 0 (a float32 S - r_i does not cancel exactly).
  n = jnp.sum(same_group(group_ids), axis=1).astype(_F32)
  centred = grpo_outcome_advantages(outcome, group_ids, scale_by_std=False)
  per_traj = jnp.where(n > 1, centred * (n / jnp.maximum(n - 1.0, 1.0)), 0.0)
  adv = _broadcast_to_tokens(per_traj, loss_mask)
  return adv, outcome_stats(outcome, group_ids, adv, loss_mask, collapse_tol)


def _reinforce_pp(outcome, group_ids, loss_mask, subtract_group_mean, std_estimator, eps,
                  collapse_tol):
  outcome = jnp.asarray(outcome).astype(_F32)
  base = (grpo_outcome_advantages(outcome, group_ids, scale_by_std=False)
          if subtract_group_mean else outcome)
  mask = jnp.asarray(loss_mask).astype(bool)
  # Whitening over every sampled token of the batch: long answers weigh more, as in
  # OpenRLHF/verl's masked_whiten.
  adv = masked_whiten(_broadcast_to_tokens(base, mask), mask, _ddof(std_estimator), eps)
  return adv, outcome_stats(outcome, group_ids, adv, loss_mask, collapse_tol)


@register_advantage("reinforce++")
def reinforce_pp_advantages(outcome: Array, group_ids: Array, loss_mask: Array, *,
                            subtract_group_mean: bool = False, std_estimator: str = "population",
                            eps: float = 1e-8,
                            collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """REINFORCE++: per-token advantage r (or r - group mean), whitened over the batch's tokens.

  With outcome-only rewards and no discount the return of every token is r. The whitening is
  (a - mean) / sqrt(var + eps), mean and var over all sampled tokens of the batch; the variance
  is unbiased (ddof 1, verl's masked_whiten) for std_estimator="unbiased" and population
  otherwise (the form is always sqrt(var + eps), with this estimator's own eps). A batch whose
  tokens all carry the same value gets exactly 0. subtract_group_mean=True is the
  "REINFORCE++-baseline" variant (also registered under "reinforce++_baseline"); it whitens
  after the group baseline, so in a batch that is not all equal a collapsed group's (zero)
  baseline-subtracted value still moves by the batch mean, as in verl and OpenRLHF.
  """
  return _reinforce_pp(outcome, group_ids, loss_mask, subtract_group_mean, std_estimator, eps,
                       collapse_tol)


@register_advantage("reinforce++_baseline")
def reinforce_pp_baseline_advantages(outcome: Array, group_ids: Array, loss_mask: Array, *,
                                     std_estimator: str = "population", eps: float = 1e-8,
                                     collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """REINFORCE++-baseline: r - group mean, whitened over the batch's sampled tokens."""
  return _reinforce_pp(outcome, group_ids, loss_mask, True, std_estimator, eps, collapse_tol)


# ---------------------------------------------------------------------------------------------
# Turn-level estimators.
# ---------------------------------------------------------------------------------------------


def discounted_turn_returns(turn_rewards: Array, turn_mask: Array, gamma: float | Array) -> Array:
  """A_k = r_k + gamma * A_{k+1} over the valid turns, from the last one back.

  Computed as one [T, T] discount matrix D[k, j] = gamma^(j-k) for j >= k (a vectorized reverse
  scan; T is a handful of turns). Invalid turns contribute nothing and get 0.

  Args:
    turn_rewards: [B, T].
    turn_mask: [B, T] bool.
    gamma: discount (Python float or scalar array).
  Returns:
    [B, T] float32.
  """
  num_t = turn_rewards.shape[1]
  k = jnp.arange(num_t)
  ahead = k[None, :] - k[:, None]  # [k, j] = j - k
  disc = jnp.where(ahead >= 0, jnp.power(jnp.asarray(gamma, _F32), jnp.maximum(ahead, 0)), 0.0)
  r = jnp.where(turn_mask, turn_rewards.astype(_F32), 0.0)
  # Elementwise product + sum rather than a matmul, to keep full f32 on every backend.
  out = jnp.sum(disc[None, :, :] * r[:, None, :], axis=-1)
  return jnp.where(turn_mask, out, 0.0)


def igpo_turn_rewards(ig: Array, outcome: Array, num_turns: Array, *, ig_weight: float = 1.0,
                      outcome_weight: float = 1.0) -> tuple[Array, Array, Array, Array]:
  """IGPO's turn rewards: r[b, k] = ig_weight * ig[b, k] on the non-answer turns
  k < num_turns[b] - 1, outcome_weight * outcome[b] on the answer turn k = num_turns[b] - 1.

  Returns:
    (rewards [B, T] float32 (0 past a row's turns), valid [B, T], is_answer [B, T], is_ig [B, T]
    bool masks).
  """
  num_t = ig.shape[1]
  num_turns = jnp.asarray(num_turns).astype(jnp.int32)
  k = jnp.arange(num_t)[None, :]
  last = (num_turns - 1)[:, None]
  valid = k <= last
  is_answer = k == last
  is_ig = k < last
  outcome = jnp.asarray(outcome).astype(_F32)
  rewards = jnp.where(is_answer, outcome_weight * outcome[:, None],
                      jnp.where(is_ig, ig_weight * ig.astype(_F32), 0.0))
  return rewards, valid, is_answer, is_ig


def igpo_turn_advantages(ig: Array, outcome: Array, num_turns: Array, group_ids: Array, *,
                         gamma: float | Array = 1.0, norm_mode: str = "joint",
                         ig_weight: float = 1.0, outcome_weight: float = 1.0,
                         std_estimator: str = "population", eps: float = 1e-6) -> Array:
  """IGPO turn-level advantages [B, T] (see `igpo_advantages`)."""
  rewards, valid, is_answer, is_ig = igpo_turn_rewards(ig, outcome, num_turns,
                                                       ig_weight=ig_weight,
                                                       outcome_weight=outcome_weight)
  norm = functools.partial(group_normalize, group_ids=group_ids, std_estimator=std_estimator,
                           eps=eps)
  if norm_mode == "joint":
    normed = norm(rewards, valid)
  elif norm_mode == "separate":
    normed = jnp.where(is_answer, norm(rewards, is_answer), norm(rewards, is_ig))
  else:
    raise ValueError(f"unknown norm_mode {norm_mode!r}; known: ('joint', 'separate')")
  return discounted_turn_returns(normed, valid, gamma)


@register_advantage("igpo")
def igpo_advantages(ig: Array, outcome: Array, num_turns: Array, group_ids: Array, turn_id: Array,
                    loss_mask: Array, *, gamma: float | Array = 1.0, norm_mode: str = "joint",
                    ig_weight: float = 1.0, outcome_weight: float = 1.0,
                    std_estimator: str = "population", eps: float = 1e-6,
                    collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """IGPO: information-gain turn rewards + outcome, group-normalized, discounted over turns.

  Turn rewards r[b, k] = ig_weight * ig[b, k] for k < num_turns[b] - 1 and
  r[b, num_turns[b] - 1] = outcome_weight * outcome[b] (the weights give the paper's ablations:
  ig_weight=0 is outcome-only, outcome_weight=0 is IG-only). Normalization within each group:
    "joint":    one mean/std over all valid turn rewards (IG and outcome pooled) of all the
                group's rollouts (the IGPO paper);
    "separate": outcomes z-scored among the group's outcomes, IG values among the group's IG
                values (valid non-answer turns), each with its own mean/std.
  z = (r - mean) / std with the std of `std_estimator` (a pool of equal values gives z = 0). Then
  A_k = z_k + gamma * A_{k+1} from the last valid turn back, and A_k goes to the tokens the policy
  sampled in turn k.

  Args:
    ig: [B, T] information gain per turn (entries at k >= num_turns - 1 ignored).
    outcome: [B] outcome rewards.
    num_turns: [B] int32 >= 1.
    group_ids: [B] int32.
    turn_id: [B, L] int32.
    loss_mask: [B, L].
    gamma: turn discount.
    norm_mode: "joint" or "separate".
    ig_weight: scale of the IG turn rewards (0: outcome-only ablation). With "separate" each
      pool is z-scored after the scaling, so only zero vs non-zero matters there.
    outcome_weight: scale of the outcome reward (0: IG-only ablation); the same remark.
    std_estimator: one of STD_ESTIMATORS ("sqrt_var_eps" with eps 1e-8 is the official code).
    eps: the stds' epsilon.
    collapse_tol: tolerance of the outcome-collapse statistic.
  Returns:
    advantages [B, L] float32, stats (reward/adv/IG statistics, "collapse_fraction" of outcomes).
  """
  turn_adv = igpo_turn_advantages(ig, outcome, num_turns, group_ids, gamma=gamma,
                                  norm_mode=norm_mode, ig_weight=ig_weight,
                                  outcome_weight=outcome_weight, std_estimator=std_estimator,
                                  eps=eps)
  adv = turn_to_token(turn_adv, turn_id, loss_mask)
  return adv, outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)


# CW-GRPO's readings of "every contribution is 0" (cw.all_zero_fallback); see
# contribution_weighted_advantages.
CW_FALLBACKS = ("zero", "uniform")


def _cw_round_advantages(adv_outcome: Array, retrieval_scores: Array, thinking_scores: Array,
                         num_turns: Array, gamma: float | Array, inf_threshold: float,
                         all_zero_fallback: str) -> tuple[Array, Array, Array]:
  """`contribution_weighted_advantages` plus, per trajectory, whether the all-zero fallback fired
  and whether it was judged with a positive advantage (A > 0, K >= 1): ([B, T], [B], [B])."""
  if all_zero_fallback not in CW_FALLBACKS:
    raise ValueError(f"unknown cw.all_zero_fallback {all_zero_fallback!r}; known: {CW_FALLBACKS}")
  for name, value in (("cw.gamma", gamma), ("cw.inf_threshold", inf_threshold)):
    if isinstance(value, numbers.Real) and math.isnan(value):
      raise ValueError(f"{name} is NaN")
  num_t = retrieval_scores.shape[1]
  num_k = jnp.asarray(num_turns).astype(jnp.int32) - 1  # [B] non-answer rounds K
  k = jnp.arange(num_t)[None, :]
  rounds = k < num_k[:, None]                            # the K non-answer rounds
  judged = k <= num_k[:, None]                           # ... and the answer round
  c = jnp.where(judged, retrieval_scores.astype(_F32) * thinking_scores.astype(_F32), 0.0)
  c_rounds = jnp.where(rounds, c, 0.0)
  k_f = jnp.maximum(num_k, 1).astype(_F32)[:, None]

  # Both branches are computed and one is selected, so gamma may be traced; the softmax sees a
  # finite stand-in for gamma where the infinite branch is taken (inf * 0 would be NaN).
  gamma = jnp.asarray(gamma, _F32)
  infinite = gamma >= inf_threshold
  logits = jnp.where(rounds, jnp.where(infinite, 0.0, gamma) * c, -jnp.inf)
  top = jnp.max(logits, axis=1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0)  # rows with no round: avoid inf - inf
  e = jnp.where(rounds, jnp.exp(logits - top), 0.0)
  w_soft = e / jnp.maximum(jnp.sum(e, axis=1, keepdims=True), 1e-30)
  # The code's "infinite" branch: its sum runs over every judged round, the answer round's own
  # c included (the judge scores it too), so an answer round with c = 1 lowers the other weights.
  w_inf = c_rounds / jnp.maximum(jnp.sum(c, axis=1, keepdims=True), 1e-6)
  all_zero = ~jnp.any(c_rounds != 0, axis=1)  # [B] no non-answer round contributed
  if all_zero_fallback == "uniform":
    w_inf = jnp.where(all_zero[:, None], rounds / k_f, w_inf)
  w = jnp.where(infinite, w_inf, w_soft)

  a = jnp.asarray(adv_outcome).astype(_F32)
  # A <= 0: the code's uniform weights (K * 1/K = 1), i.e. every round keeps A.
  round_adv = jnp.where(a[:, None] > 0, a[:, None] * k_f * w, a[:, None])
  out = jnp.where(rounds, round_adv, jnp.where(k == num_k[:, None], a[:, None], 0.0))
  positive = (a > 0) & (num_k >= 1)
  return out, positive & infinite & all_zero, positive


def contribution_weighted_advantages(adv_outcome: Array, retrieval_scores: Array,
                                     thinking_scores: Array, num_turns: Array, *,
                                     gamma: float | Array = 100.0, inf_threshold: float = 10.0,
                                     all_zero_fallback: str = "zero") -> Array:
  """CW-GRPO: redistribute a positive outcome advantage over rounds by their contribution.

  The official code's rule (its verl `core_algos.compute_cw_grpo_advantage`). A trajectory has
  K = num_turns - 1 non-answer rounds k = 0..K-1, then its answer round K; c_k = retrieval_k *
  thinking_k (scores are expected in [0, 1], the judge gives {0, 1}). Weights over the
  non-answer rounds:
    gamma <  inf_threshold:  w = softmax(gamma * c) over the K non-answer rounds;
    gamma >= inf_threshold:  w_k = c_k / max(sum_{j <= K} c_j, 1e-6), the code's "infinite"
      gamma (it reads gamma >= 10 so). The sum includes the answer round's own c_K, which the
      code's judge also scores. If every non-answer c is 0 the weights are all 0 ("zero", the
      code: only the answer round is reinforced) or 1/K ("uniform", the softmax's limit), by
      `all_zero_fallback`; this holds even when c_K = 1.
  If A > 0, non-answer round k gets A * K * w_k; if A <= 0 every round gets A (the code's uniform
  weights for A < 0; A = 0 gives 0 either way). The answer round keeps A; with K = 0 the single
  round gets A. Turns past the answer round get 0.

  Args:
    adv_outcome: [B] outcome advantage (e.g. GRPO's).
    retrieval_scores: [B, T] per round; column num_turns - 1 is the answer round's.
    thinking_scores: [B, T].
    num_turns: [B] int32 >= 1.
    gamma: contribution inverse temperature (cw.gamma), a float (inf allowed) or a scalar array.
    inf_threshold: gamma at and above which the "infinite" branch is taken (cw.inf_threshold).
    all_zero_fallback: "zero" or "uniform" (cw.all_zero_fallback), see above.
  Returns:
    [B, T] float32 turn-level advantages.
  """
  return _cw_round_advantages(adv_outcome, retrieval_scores, thinking_scores, num_turns, gamma,
                              inf_threshold, all_zero_fallback)[0]


def contribution_multipliers(positive: Array, retrieval_scores: Array, thinking_scores: Array,
                             num_turns: Array, *, gamma: float | Array = 100.0,
                             inf_threshold: float = 10.0,
                             all_zero_fallback: str = "zero") -> tuple[Array, Array]:
  """CW-GRPO's round weights as multipliers of any turn-level advantage: [B, T] with K * w_k on
  the non-answer rounds of the `positive` [B] bool trajectories (the redistribution
  `contribution_weighted_advantages` applies to a positive outcome advantage), 1 on their answer
  round and on every round of the others (A <= 0 keeps its advantage), 0 past a row's turns;
  and [B] whether the all-zero fallback fired. The same arithmetic: its advantages are these
  multipliers times A on every judged round."""
  sign = jnp.where(jnp.asarray(positive), 1.0, -1.0).astype(_F32)
  out, fired, _ = _cw_round_advantages(sign, retrieval_scores, thinking_scores, num_turns, gamma,
                                       inf_threshold, all_zero_fallback)
  return jnp.abs(out), fired


@register_advantage("cw_grpo")
def cw_grpo_advantages(outcome: Array, group_ids: Array, retrieval_scores: Array,
                       thinking_scores: Array, num_turns: Array, turn_id: Array,
                       loss_mask: Array, *, gamma: float | Array = 100.0,
                       inf_threshold: float = 10.0, all_zero_fallback: str = "zero",
                       scale_by_std: bool = True, std_estimator: str = "population",
                       eps: float = 1e-6,
                       collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """CW-GRPO: GRPO outcome advantage, contribution-weighted over rounds, spread to tokens.

  See `grpo_outcome_advantages` and `contribution_weighted_advantages`. The CW-GRPO code
  (verl) uses std_estimator="unbiased", eps 1e-6, gamma 100 (the "infinite" branch), fallback
  "zero".

  Returns:
    advantages [B, L] float32 and stats: the outcome statistics of every estimator, plus
    "cw_judged_positive" (trajectories with A > 0 and at least one non-answer round: those whose
    contributions move credit) and "cw_fallback_count" (those among them, in the infinite
    branch, whose non-answer contributions are all 0: where `all_zero_fallback` decides).
  """
  a = grpo_outcome_advantages(outcome, group_ids, scale_by_std=scale_by_std,
                              std_estimator=std_estimator, eps=eps)
  turn_adv, fired, positive = _cw_round_advantages(
      a, retrieval_scores, thinking_scores, num_turns, gamma, inf_threshold, all_zero_fallback)
  adv = turn_to_token(turn_adv, turn_id, loss_mask)
  stats = outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)
  stats["cw_fallback_count"] = jnp.sum(fired).astype(_F32)
  stats["cw_judged_positive"] = jnp.sum(positive).astype(_F32)
  return adv, stats


# ---------------------------------------------------------------------------------------------
# Critic-based estimators (PPO with a learned value model; agentjax/train/critic.py).
# ---------------------------------------------------------------------------------------------


def _ppo_stats(outcome, group_ids, adv, loss_mask, returns, value_mask, collapse_tol):
  """The outcome statistics of every estimator plus the critic's regression targets: "returns"
  [B, L] and "value_mask" [B, L] (the slots whose value the critic is trained on). RLStep pops
  these two arrays; every other entry is a scalar."""
  stats = outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)
  stats["returns"] = returns
  stats["value_mask"] = value_mask
  return stats


def _ppo_turn_rewards(outcome, ig, num_turns, turn_id, mask, ig_weight, outcome_weight):
  """(turn rewards [B, T] on the step turns (gae.carry_back: a turn cut off before its first
  sampled token gives its reward to the previous action), each turn's first sampled slot
  [B, T] (-1: none), the step turns [B, T] bool)."""
  num_t = ig.shape[1]
  turn_r = igpo_turn_rewards(ig, outcome, num_turns, ig_weight=ig_weight,
                             outcome_weight=outcome_weight)[0]
  first = gae_lib.turn_first_slots(turn_id, mask, num_t)
  steps = (first >= 0) & turn_mask_from(num_turns, num_t)
  return gae_lib.carry_back(turn_r, steps), first, steps


@register_advantage("ppo")
def ppo_advantages(outcome: Array, ig: Array, num_turns: Array, group_ids: Array,
                   turn_id: Array, loss_mask: Array, values: Array, *, gamma: float = 1.0,
                   lam: float = 1.0, ig_weight: float = 0.0, outcome_weight: float = 1.0,
                   whiten: bool = True, collapse_tol: float = 1e-6
                   ) -> tuple[Array, dict[str, Array]]:
  """PPO, token-level GAE over the sampled tokens (verl's "gae" estimator, observations skipped).

  Turn rewards (`igpo_turn_rewards`): the outcome on the answer turn and, with ig_weight > 0,
  IGPO's information gain on the earlier turns ("PPO + IG turn rewards"); each on its turn's last
  sampled token (gae.rewards_at_turn_ends; a turn cut off before its first sampled token gives its
  reward to the previous action, gae.carry_back). No group normalization: the critic is the
  baseline.
  GAE with (gamma, lam) over the sampled tokens (gae.token_gae), then, with whiten, the
  advantages whitened over every sampled token of the batch (verl's masked_whiten: unbiased
  variance, eps 1e-8). The critic regresses every sampled token's value on its GAE return.

  Args:
    values: [B, L] the critic's value of the state in which each token is sampled
      (agentjax/models/qwen/value.py sequence_values); read on sampled tokens only.
    other batch fields: see the module docstring.
  Returns:
    advantages [B, L] and stats (`_ppo_stats`: returns [B, L], value_mask = loss_mask).
  """
  return _token_ppo(outcome, ig, num_turns, group_ids, turn_id, loss_mask, values, gamma, lam,
                    ig_weight, outcome_weight, whiten, collapse_tol, episodes=None)


def _token_ppo(outcome, ig, num_turns, group_ids, turn_id, loss_mask, values, gamma, lam,
               ig_weight, outcome_weight, whiten, collapse_tol, episodes):
  """ppo / ppo_round: token-level GAE (episodes: None, or turn_id for one episode per turn)."""
  mask = jnp.asarray(loss_mask).astype(bool)
  turn_r = _ppo_turn_rewards(outcome, ig, num_turns, turn_id, mask, ig_weight, outcome_weight)[0]
  rewards = gae_lib.rewards_at_turn_ends(turn_r, turn_id, mask)
  adv, returns = gae_lib.token_gae(rewards, values, mask, gamma, lam, episodes)
  if whiten:
    adv = masked_whiten(adv, mask)
  return adv, _ppo_stats(outcome, group_ids, adv, mask, returns, mask, collapse_tol)


@register_advantage("ppo_turn")
def ppo_turn_advantages(outcome: Array, ig: Array, num_turns: Array, group_ids: Array,
                        turn_id: Array, loss_mask: Array, values: Array, *,
                        gamma: float = 1.0, lam: float = 1.0, ig_weight: float = 0.0,
                        outcome_weight: float = 1.0, whiten: bool = True,
                        collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """Multi-turn PPO with turn-level GAE: one step per turn (AReaL's gae_timestep_unit="turn").
  (The CW-GRPO code's compute_gae_round_advantage_return is `ppo_round`, per token.)

  One step per turn: turn k's value is the critic's value at the turn's first sampled token (the
  state after the previous turn's observation, before the turn's action); its reward as in
  `ppo_advantages`; GAE over the turns (gae.turn_gae); every sampled token of turn k takes turn
  k's advantage (whitened over the batch's sampled tokens with whiten). The critic regresses the
  value at each turn's first sampled token on the turn's return. A turn with no sampled token
  (cut off before its first) is not a step: its reward goes to the previous step
  (gae.carry_back).

  Returns:
    advantages [B, L] and stats (`_ppo_stats`: returns on the turns' first sampled tokens,
    value_mask those slots).
  """
  mask = jnp.asarray(loss_mask).astype(bool)
  turn_r, first, steps = _ppo_turn_rewards(outcome, ig, num_turns, turn_id, mask, ig_weight,
                                           outcome_weight)
  turn_values = jnp.where(steps, jnp.take_along_axis(values.astype(_F32), jnp.maximum(first, 0),
                                                     axis=1), 0.0)
  turn_adv, turn_ret = gae_lib.turn_gae(turn_r, turn_values, steps, gamma, lam)
  adv = turn_to_token(turn_adv, turn_id, mask)
  if whiten:
    adv = masked_whiten(adv, mask)
  # The turn returns back on the slots whose values they regress.
  slots = jnp.arange(mask.shape[1])[None, :, None]
  at_first = (slots == first[:, None, :]) & steps[:, None, :]                 # [B, L, T]
  returns = jnp.sum(jnp.where(at_first, turn_ret[:, None, :], 0.0), axis=-1)
  value_mask = jnp.any(at_first, axis=-1)
  return adv, _ppo_stats(outcome, group_ids, adv, mask, returns, value_mask, collapse_tol)


@register_advantage("ppo_round")
def ppo_round_advantages(outcome: Array, ig: Array, num_turns: Array, group_ids: Array,
                         turn_id: Array, loss_mask: Array, values: Array, *,
                         gamma: float = 1.0, lam: float = 1.0, ig_weight: float = 0.0,
                         outcome_weight: float = 1.0, whiten: bool = True,
                         collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """PPO with the CW-GRPO code's round-level GAE ("gae-round", compute_gae_round_advantage_return):
  token-level GAE inside each turn, each turn an episode of its own (its last sampled token
  bootstraps from 0: gae.token_gae with turn_id). With gamma = lam = 1 a token of turn k gets
  r_k - V_t and the critic regresses every sampled token of turn k on r_k. Rewards, whitening and
  targets as `ppo_advantages` (with outcome-only rewards every non-answer turn's reward is 0:
  the official code pairs it with per-round rewards, here ig_weight > 0).

  Returns:
    advantages [B, L] and stats (`_ppo_stats`: returns [B, L], value_mask = loss_mask).
  """
  return _token_ppo(outcome, ig, num_turns, group_ids, turn_id, loss_mask, values, gamma, lam,
                    ig_weight, outcome_weight, whiten, collapse_tol, episodes=turn_id)


# The estimators that need a critic (RLStep scores the batch with the value model and trains it).
CRITIC_ESTIMATORS = ("ppo", "ppo_turn", "ppo_round")
