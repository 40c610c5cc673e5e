"""A²TGPO (Agentic Turn-Group Policy Optimization with Adaptive Turn-level Clipping; Chen et al.
2026, arXiv 2605.06200; official code github.com/CuSO4-Chen/A-TGPO, verl_atgpo/verl/trainer/ppo/
core_algos.py `compute_igpo_step_advantage`, info_gain_norm_mode="turn-group-v1d").

IGPO's information gain (IG) of each non-answer turn, re-normalized, re-accumulated and (in the
paper) consumed by a per-turn clip range:

  (i)   turn-group normalization: the IG of turn k is z-scored among the IG values of turn k of
        the rollouts of the same question (pool = (prompt, turn index)), not among all turns:
            g[b, k] = (ig[b, k] - mean_{j in G(b), k < K_j} ig[j, k]) / std(same pool)
        (K_j = num_turns[j] - 1 non-answer turns; a pool of one member, or of equal values, gives
        exactly 0, as the code's std=1 for a pool of one gives ig - mean = 0).
  (ii)  variance-rescaled discounted accumulation: over the K_b non-answer turns of a trajectory
            D[b, k] = sum_{j=k}^{K_b - 1} gamma^(j-k) g[b, j],   n[b, k] = K_b - k terms,
            A[b, k] = outcome_adv[b] + alpha * D[b, k] / sqrt(n[b, k])     (k < K_b)
            A[b, K_b] = outcome_adv[b]                                   (the answer turn)
        outcome_adv = the GRPO z-score of the outcome within the question's group. The outcome
        enters every turn undiscounted and is not part of D (the code: `final_adv = alpha *
        ig_discounted + outcome_val`; alpha = adv_rescale_alpha, 0.3 in the official script).
        A[b, k] goes to the tokens the policy sampled in turn k (`turn_to_token`).
  (iii) adaptive turn-level clipping: the clip range of turn k's tokens is scaled by
            c[b, k] = 1 + beta * (2 sigmoid(g[b, k]) - 1)  in (1 - beta, 1 + beta), beta = 0.3,
        and 1 on the answer turn, i.e. ratio clipped to [1 - c eps_low, 1 + c eps_high]; the
        official loss (`compute_policy_loss_gspo_turn`, dynamic_clip=True) also uses a
        TURN-level importance ratio exp(mean over the turn's tokens of log pi - log pi_old).

What is in: (i) and (ii) as the advantage estimator "a2tgpo"; (iii) as the estimator's per-token
loss input "clip_scale" (the registry entry's loss_inputs: the step cuts it into minibatches and
the policy loss clips the ratio of each token to [1 - c clip_low, 1 + c clip_high]; the losses
ppo, gspo and gspo_turn take it; a2tgpo.adaptive_clip=False runs the fixed range); the turn-level
importance ratio as the policy loss "gspo_turn" (rl.loss="gspo_turn"). The metrics
a2tgpo/clip_scale_mean and _std are c over the sampled tokens (what the official code prints).

Settings (config.a2tgpo.*, DEFAULTS below; the base config has no such section, so a config
without one runs these defaults; configs/a2tgpo.py writes the section). The group std of both
z-scores is rl.std_estimator / rl.std_eps, as for every method that divides by one (the official
code: sqrt(population var + 1e-8), then + 1e-6: "sqrt_var_eps" with 1e-8 in the paper preset).

  gamma         1.0   turn discount of D (the official script's IGPO_GAMMA)
  alpha         0.3   weight of the IG term (the official script's IGPO_ADV_RESCALE_ALPHA; the
                      code's default is 1.0)
  rescale  "sqrt_terms"  what D is divided by: "sqrt_terms" sqrt(n), n the number of accumulated
                      terms whatever gamma (the code and the paper's "square root of accumulated
                      terms"); "sqrt_discounted" sqrt(sum_{j<n} gamma^(2j)), the std of a
                      gamma-discounted sum of n independent unit-variance terms (our alternative
                      reading, equal for gamma = 1); "none": no rescaling (the ablation, IGPO's
                      plain discounted sum of the turn-group-normalized IG)
  scale_by_std  True  divide by the group stds (the code's norm_adv_by_std_in_grpo); False only
                      centres (Dr.GRPO-like)
  clip_beta     0.3   half-width of (iii)'s clip scale (the code's constant)
  adaptive_clip True  (iii) applied: the loss clips each token's ratio with its turn's scale c
                      (our reading: the paper's method; whether the official script turns the
                      code's dynamic_clip on is not in its public files); False: the fixed range

Our readings where the paper and code leave room:
  - Every non-answer turn is an IG turn, IG exactly 0 included. The code marks IG turns by a
    non-zero reward at the turn's last token, so a turn whose IG is exactly 0.0 is skipped (its
    tokens join the next turn's segment and the later turns' indices shift down); its own
    `_compute_turn_level_advantage` calls that heuristic a bug. There is no override for it.
  - The answer (or truncated) turn num_turns - 1 carries the outcome and no IG, as in igpo
    (agentjax/rl/advantages.py igpo_turn_rewards); a trajectory with no non-answer turn gets the
    outcome advantage only.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from agentjax.methods import Method, register_method, section_settings, std_settings
from agentjax.rl.advantages import (masked_mean_std, discounted_turn_returns,
                                    grpo_outcome_advantages, group_normalize,
                                    igpo_turn_rewards, outcome_stats, register_advantage,
                                    turn_to_token)
from agentjax.rl.losses import grouped_ratio, policy_objective, register_policy_loss

Array = jax.Array
_F32 = jnp.float32

RESCALES = ("sqrt_terms", "sqrt_discounted", "none")
DEFAULTS = dict(gamma=1.0, alpha=0.3, rescale="sqrt_terms", scale_by_std=True, clip_beta=0.3,
                adaptive_clip=True)


# ---------------------------------------------------------------------------------------------
# The advantage estimator: (i) + (ii).
# ---------------------------------------------------------------------------------------------


def turn_group_normalize(values: Array, valid: Array, group_ids: Array, *,
                         scale_by_std: bool = True, std_estimator: str = "population",
                         eps: float = 1e-6) -> Array:
  """(i): each valid entry (b, k) z-scored among the valid entries of column k of b's group.

  `group_normalize` applied to each turn index separately (its pools, collapse rule and std
  forms): a (group, turn) pool of one member or of equal values gives exactly 0.

  Args:
    values: [B, T] float (invalid entries may hold anything, NaN included).
    valid: [B, T] bool.
    group_ids: [B] int32.
  Returns:
    [B, T] float32, 0 on invalid entries.
  """
  norm = functools.partial(group_normalize, group_ids=group_ids, scale_by_std=scale_by_std,
                           std_estimator=std_estimator, eps=eps)
  valid = jnp.asarray(valid).astype(bool)
  per_turn = jax.vmap(lambda v, m: norm(v[:, None], m[:, None])[:, 0], in_axes=1, out_axes=1)
  return jnp.where(valid, per_turn(jnp.asarray(values).astype(_F32), valid), 0.0)


def adaptive_clip_scale(normed_ig: Array, is_ig: Array, beta: float = 0.3) -> Array:
  """(iii)'s per-turn clip scale 1 + beta (2 sigmoid(g) - 1) on IG turns, 1 elsewhere [B, T]."""
  return jnp.where(is_ig, 1.0 + beta * (2.0 * jax.nn.sigmoid(normed_ig) - 1.0), 1.0)


def a2tgpo_turn_terms(ig: Array, outcome: Array, num_turns: Array, group_ids: Array, *,
                      gamma: float = 1.0, alpha: float = 0.3, rescale: str = "sqrt_terms",
                      scale_by_std: bool = True, clip_beta: float = 0.3,
                      std_estimator: str = "population", eps: float = 1e-6) -> dict[str, Array]:
  """The turn-level quantities of A²TGPO (module docstring).

  Returns:
    dict of [B, T] float32 "turn_adv" (0 past a row's turns), "normed_ig" (g, 0 off the IG
    turns), "ig_term" (D / sqrt(n), 0 off the IG turns), "clip_scale" (c, 1 off the IG turns),
    [B, T] bool "valid", and [B] "outcome_adv".
  """
  if rescale not in RESCALES:
    raise ValueError(f"unknown rescale {rescale!r}; known: {RESCALES}")
  _, valid, _, is_ig = igpo_turn_rewards(ig, outcome, num_turns)
  kw = dict(scale_by_std=scale_by_std, std_estimator=std_estimator, eps=eps)
  normed = turn_group_normalize(ig, is_ig, group_ids, **kw)
  outcome_adv = grpo_outcome_advantages(outcome, group_ids, **kw)
  acc = discounted_turn_returns(normed, is_ig, gamma)                     # D
  if rescale == "none":
    term = acc
  else:
    ones = jnp.ones(is_ig.shape, _F32)
    # n terms (discount 1), or the sum of the squared discounts gamma^(2j), j < n.
    count = discounted_turn_returns(ones, is_ig, 1.0 if rescale == "sqrt_terms" else
                                    jnp.square(jnp.asarray(gamma, _F32)))
    term = acc / jnp.sqrt(jnp.maximum(count, 1.0))
  term = jnp.where(is_ig, term, 0.0)
  turn_adv = jnp.where(valid, outcome_adv[:, None] + alpha * term, 0.0)
  return dict(turn_adv=turn_adv, normed_ig=normed, ig_term=term, valid=valid,
              clip_scale=adaptive_clip_scale(normed, is_ig, clip_beta), outcome_adv=outcome_adv)


@register_advantage("a2tgpo")
def a2tgpo_advantages(ig: Array, outcome: Array, num_turns: Array, group_ids: Array,
                      turn_id: Array, loss_mask: Array, *, gamma: float = 1.0, alpha: float = 0.3,
                      rescale: str = "sqrt_terms", scale_by_std: bool = True,
                      clip_beta: float = 0.3, adaptive_clip: bool = True,
                      std_estimator: str = "population", eps: float = 1e-6,
                      collapse_tol: float = 1e-6) -> tuple[Array, dict[str, Array]]:
  """A²TGPO advantages: turn-group-normalized IG, variance-rescaled discounted accumulation, plus
  the group-normalized outcome (module docstring), on the tokens the policy sampled.

  Args:
    ig: [B, T] information gain per turn (entries at k >= num_turns - 1 ignored, NaN allowed).
    outcome: [B] outcome rewards.
    num_turns: [B] int32 >= 1.
    group_ids: [B] int32.
    turn_id: [B, L] int32.
    loss_mask: [B, L].
    gamma, alpha, rescale, scale_by_std, clip_beta, adaptive_clip: the settings (module
      docstring).
    std_estimator, eps: the group std (agentjax/rl/advantages.py STD_ESTIMATORS).
    collapse_tol: tolerance of the collapse statistics.
  Returns:
    advantages [B, L] float32 (0 off loss_mask), stats: outcome/advantage/IG statistics
    ("collapse_fraction", "zero_adv_fraction", ...), "clip_scale_mean" / "clip_scale_std",
    (iii)'s scale over the sampled tokens, and with adaptive_clip "clip_scale": [B, L] float32,
    each sampled token's turn's scale c (1 elsewhere), the policy loss's input (Method
    loss_inputs: the step passes it to the loss as clip_scale=).
  """
  terms = a2tgpo_turn_terms(ig, outcome, num_turns, group_ids, gamma=gamma, alpha=alpha,
                            rescale=rescale, scale_by_std=scale_by_std, clip_beta=clip_beta,
                            std_estimator=std_estimator, eps=eps)
  adv = turn_to_token(terms["turn_adv"], turn_id, loss_mask)
  stats = outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)
  mask = jnp.asarray(loss_mask).astype(bool) & (jnp.asarray(turn_id) >= 0)
  scale = jnp.where(mask, turn_to_token(terms["clip_scale"], turn_id, mask), 1.0)  # [B, L]
  clip_mean, clip_std = masked_mean_std(scale, mask)
  stats.update(clip_scale_mean=clip_mean, clip_scale_std=clip_std)
  if adaptive_clip:
    stats["clip_scale"] = scale
  return adv, stats


# ---------------------------------------------------------------------------------------------
# The turn-level importance ratio (the official recipe's loss), clipped per turn by (iii).
# ---------------------------------------------------------------------------------------------


def advantage_runs(advantages: Array, mask: Array, segment_ids: Array | None = None) -> Array:
  """[B, L] int32: the index (0, 1, ...) of each sampled token's turn within its row, turns
  inferred as the official loss does: a new turn starts at a sampled token whose advantage
  differs from the previous sampled token's in the row (or, with segment_ids of packed rows,
  whose trajectory differs). Two adjacent turns with equal advantages are one turn (as in the
  code). Entries off mask are unspecified."""
  mask = jnp.asarray(mask).astype(bool)
  b, length = mask.shape
  pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (b, length))
  seen = jax.lax.cummax(jnp.where(mask, pos, -1), axis=1)    # last sampled position <= l
  prev = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), seen[:, :-1]], axis=1)
  at_prev = lambda x: jnp.take_along_axis(x, jnp.maximum(prev, 0), axis=1)  # noqa: E731
  adv = jnp.where(mask, jnp.asarray(advantages).astype(_F32), 0.0)
  new = (prev < 0) | (adv != at_prev(adv))
  if segment_ids is not None:
    new = new | (segment_ids != at_prev(segment_ids))
  return jnp.cumsum(mask & new, axis=1, dtype=jnp.int32) - 1


@register_policy_loss("gspo_turn")
def gspo_turn_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
                   ref_logp: Array | None = None, entropy: Array | None = None,
                   clip_low: float = 3e-3, clip_high: float = 4e-3,
                   dual_clip: float | None = None, kl_coef: float = 0.0,
                   kl_estimator: str = "low_var_kl", entropy_coef: float = 0.0,
                   aggregation: str = "token-mean", norm_length: int | None = None,
                   totals: dict[str, Array] | None = None,
                   segment_ids: Array | None = None,
                   clip_scale: Array | None = None) -> tuple[Array, dict[str, Array]]:
  """The PPO objective with a turn-level ratio (the official A²TGPO code's
  `compute_policy_loss_gspo_turn`): every sampled token of a turn gets r_turn = exp(mean over the
  turn's sampled tokens of (logp - old_logp)), in the GSPO-token form rho = exp(logp - sg(logp) +
  sg(log r_turn)) (value r_turn, gradient through each token's own logp), clipped to
  [1 - c clip_low, 1 + c clip_high]: c = clip_scale, (iii)'s per-turn scale on each of the turn's
  tokens (dynamic_clip=True), or 1 without it (the fixed range, dynamic_clip=False). Turns are
  inferred from the advantages (`advantage_runs`), as the code does. Defaults: the official
  script's clip range (3e-3, 4e-3). Arguments and metrics as agentjax/rl/losses.py `ppo_loss`.
  """
  return policy_objective(turn_ratio, **locals())  # every argument, as the loss was called


def turn_ratio(logp: Array, old_logp: Array, mask: Array, advantages: Array,
               segment_ids: Array | None) -> Array:
  """The turn-level ratio of `gspo_turn_loss`: grouped_ratio over the turns inferred from the
  advantages (`advantage_runs`)."""
  runs = jnp.where(mask, advantage_runs(advantages, mask, segment_ids), 0)
  return grouped_ratio(logp, old_logp, mask, runs)


# ---------------------------------------------------------------------------------------------
# The registry entry.
# ---------------------------------------------------------------------------------------------


def _section(config: Any) -> dict[str, Any]:
  """config.a2tgpo over DEFAULTS (a config without the section gets the defaults)."""
  return section_settings(config, "a2tgpo", DEFAULTS)


def _settings(config: Any) -> dict[str, Any]:
  s = _section(config)
  return dict(gamma=float(s["gamma"]), alpha=float(s["alpha"]), rescale=str(s["rescale"]),
              scale_by_std=bool(s["scale_by_std"]), clip_beta=float(s["clip_beta"]),
              adaptive_clip=bool(s["adaptive_clip"]), **std_settings(config))


def _validate(config: Any, fail: Callable[..., None]) -> None:
  s = section_settings(config, "a2tgpo", DEFAULTS, fail)
  checks = (("gamma", 0.0 <= s["gamma"] <= 1.0, "must be in [0, 1]"),
            ("alpha", s["alpha"] >= 0.0, "must be >= 0 (0: the outcome advantage alone)"),
            ("rescale", s["rescale"] in RESCALES, f"must be one of {list(RESCALES)}"),
            ("scale_by_std", isinstance(s["scale_by_std"], bool), "must be a bool"),
            ("adaptive_clip", isinstance(s["adaptive_clip"], bool), "must be a bool"),
            ("clip_beta", 0.0 <= s["clip_beta"] < 1.0, "must be in [0, 1)"))
  for key, ok, why in checks:
    if not ok:
      fail(f"a2tgpo.{key}", s[key], why)


def _loss_inputs(config: Any) -> tuple[str, ...]:
  """(iii): the per-token clip scale goes to the policy loss (clip_scale=) unless switched off."""
  return ("clip_scale",) if _section(config)["adaptive_clip"] else ()


def _metrics(stats: Mapping[str, Any]) -> dict[str, float]:
  """(iii)'s clip scale over the sampled tokens (what the official code prints)."""
  return {"a2tgpo/clip_scale_mean": float(stats["clip_scale_mean"]),
          "a2tgpo/clip_scale_std": float(stats["clip_scale_std"])}


register_method(Method(
    name="a2tgpo", estimator="a2tgpo",
    inputs=frozenset({"ig", "outcome", "num_turns", "group_ids", "turn_id", "loss_mask"}),
    settings=_settings, signals=("probes",), validate=_validate, metrics=_metrics,
    loss_inputs=_loss_inputs))
