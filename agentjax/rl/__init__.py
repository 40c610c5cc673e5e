"""RL kernels: outcome rewards (host side), advantage estimators, policy losses.

  rewards     normalize_answer, exact_match, f1_score, outcome_rewards (the format rule itself is
              agentjax.agent.protocol's: TrajectoryBatch.format_valid)
  advantages  ADVANTAGE_ESTIMATORS registry: grpo, drgrpo, gspo, rloo, reinforce++,
              reinforce++_baseline, igpo, cw_grpo; turn_to_token; collapse / IG statistics
  losses      POLICY_LOSSES registry: ppo, gspo; aggregate_loss, kl_penalty
  info_gain   IGPO's ground-truth probes, packed into one forward pass (score_packed)
"""

from __future__ import annotations

from agentjax.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    BATCH_FIELDS,
    advantage_collapse_fraction,
    contribution_weighted_advantages,
    cw_grpo_advantages,
    discounted_turn_returns,
    drgrpo_advantages,
    get_advantage_estimator,
    grpo_advantages,
    grpo_outcome_advantages,
    gt_entropy_reduction,
    gt_logprob_ends,
    ig_statistics,
    igpo_advantages,
    igpo_turn_advantages,
    register_advantage,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    same_group,
    turn_mask_from,
    turn_to_token,
)
from agentjax.rl.info_gain import (
    ALIAS_MODES,
    ANSWER_TEMPLATES,
    PackedScores,
    Probes,
    build_probes,
    information_gain,
    packed_mask,
    score_naive,
    score_packed,
)
from agentjax.rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate_loss,
    get_policy_loss,
    gspo_loss,
    kl_penalty,
    ppo_loss,
    register_policy_loss,
)
from agentjax.rl.rewards import (
    exact_match,
    f1_score,
    normalize_answer,
    outcome_rewards,
)

__all__ = [
    "ALIAS_MODES", "ANSWER_TEMPLATES", "PackedScores", "Probes", "build_probes",
    "information_gain", "packed_mask", "score_naive", "score_packed",
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "BATCH_FIELDS", "KL_ESTIMATORS",
    "POLICY_LOSSES", "advantage_collapse_fraction", "aggregate_loss",
    "contribution_weighted_advantages", "cw_grpo_advantages",
    "discounted_turn_returns", "drgrpo_advantages", "exact_match", "f1_score",
    "get_advantage_estimator", "get_policy_loss", "grpo_advantages",
    "grpo_outcome_advantages", "gspo_loss", "gt_entropy_reduction", "gt_logprob_ends",
    "ig_statistics",
    "igpo_advantages", "igpo_turn_advantages", "kl_penalty", "normalize_answer",
    "outcome_rewards", "ppo_loss", "register_advantage", "register_policy_loss",
    "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "rloo_advantages",
    "same_group", "turn_mask_from", "turn_to_token",
]
