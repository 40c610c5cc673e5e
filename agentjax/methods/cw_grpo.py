"""CW-GRPO (contribution-weighted GRPO): the group-normalized outcome advantage spread over the
rounds by a judge's per-round retrieval and thinking verdicts (agentjax/rl/advantages.py
cw_grpo_advantages; agentjax/judge). Also cw_grpo_ig: IGPO's information-gain turn advantages
times CW-GRPO's round weights, in one run (configs/cw_grpo.py:demo-ig)."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from agentjax.methods import Method, register_method, std_settings
from agentjax.rl.advantages import (contribution_multipliers, grpo_outcome_advantages,
                                    igpo_turn_advantages, outcome_stats,
                                    register_advantage, turn_to_token)

Array = jax.Array


def _settings(config: Any) -> dict[str, Any]:
  cw = config.cw
  return dict(gamma=float(cw.gamma), inf_threshold=float(cw.inf_threshold),
              all_zero_fallback=cw.all_zero_fallback, **std_settings(config))


def _metrics(stats: Mapping[str, Any]) -> dict[str, float]:
  """How often the all-zero fallback fired, over the trajectories the judge made positive."""
  count = float(stats["cw_fallback_count"])
  return {"cw/fallback_count": count,
          "cw/fallback_rate": count / max(float(stats["cw_judged_positive"]), 1.0)}


register_method(Method(
    name="cw_grpo", estimator="cw_grpo",
    inputs=frozenset({"outcome", "group_ids", "retrieval_scores", "thinking_scores", "turn_id",
                      "num_turns", "loss_mask"}),
    settings=_settings, signals=("judge",), metrics=_metrics))


# ------------------------------------------------------------------ composition: IG x CW weights


def _composed_settings(config: Any) -> dict[str, Any]:
  """IGPO's turn-reward settings (rl.*) and CW-GRPO's weights (cw.*)."""
  from agentjax.methods.igpo import _settings as igpo_settings
  return {**igpo_settings(config), **{f"cw_{k}": v for k, v in _settings(config).items()
                                      if k in ("gamma", "inf_threshold", "all_zero_fallback")}}


@register_advantage("cw_grpo_ig")
def cw_grpo_ig_advantages(ig: Array, outcome: Array, num_turns: Array, group_ids: Array,
                          turn_id: Array, loss_mask: Array, retrieval_scores: Array,
                          thinking_scores: Array, *, gamma: float = 1.0, norm_mode: str = "joint",
                          ig_weight: float = 1.0, outcome_weight: float = 1.0,
                          std_estimator: str = "population", eps: float = 1e-6,
                          cw_gamma: float = 100.0, cw_inf_threshold: float = 10.0,
                          cw_all_zero_fallback: str = "zero", collapse_tol: float = 1e-6
                          ) -> tuple[Array, dict[str, Array]]:
  """IG turn rewards x CW-GRPO contribution weights (our composition; neither paper runs it).

  A[b, k] = IGPO's turn advantage (igpo_turn_advantages: information-gain turn rewards and the
  outcome, group-normalized, discounted) x CW-GRPO's round multiplier (contribution_multipliers:
  K * w_k on the non-answer rounds of a trajectory whose GRPO outcome advantage is positive, 1
  elsewhere), spread to the turn's sampled tokens. The judge moves credit between the rounds of
  a successful trajectory as in CW-GRPO; IG gives every trajectory its dense turn signal as in
  IGPO. The alternative composition (IG rewards weighted before normalization) is not offered.
  rl.* set IGPO's part (gamma, rl.igpo_norm, weights, rl.std_*), cw.* the weights.
  """
  turn_adv = igpo_turn_advantages(ig, outcome, num_turns, group_ids, gamma=gamma,
                                  norm_mode=norm_mode, ig_weight=ig_weight,
                                  outcome_weight=outcome_weight, std_estimator=std_estimator,
                                  eps=eps)
  a = grpo_outcome_advantages(outcome, group_ids, std_estimator=std_estimator, eps=eps)
  positive = (a > 0) & (jnp.asarray(num_turns) >= 2)
  mult, fired = contribution_multipliers(a > 0, retrieval_scores, thinking_scores, num_turns,
                                         gamma=cw_gamma, inf_threshold=cw_inf_threshold,
                                         all_zero_fallback=cw_all_zero_fallback)
  adv = turn_to_token(turn_adv * mult, turn_id, loss_mask)
  stats = outcome_stats(jnp.asarray(outcome), group_ids, adv, loss_mask, collapse_tol)
  stats["cw_fallback_count"] = jnp.sum(fired).astype(jnp.float32)
  stats["cw_judged_positive"] = jnp.sum(positive).astype(jnp.float32)
  return adv, stats


register_method(Method(
    name="cw_grpo_ig", estimator="cw_grpo_ig",
    inputs=frozenset({"ig", "outcome", "num_turns", "group_ids", "turn_id", "loss_mask",
                      "retrieval_scores", "thinking_scores"}),
    settings=_composed_settings, signals=("probes", "judge"), metrics=_metrics))
