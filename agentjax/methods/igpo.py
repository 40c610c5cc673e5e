"""IGPO (information gain-based policy optimization): turn rewards from the ground-truth probes'
information gain plus the outcome, discounted turn returns normalized within the group
(agentjax/rl/advantages.py igpo_advantages; IGPO, arXiv:2510.14967, §3.2, Eq. 3-4)."""

from __future__ import annotations

from typing import Any, Callable

from agentjax.methods import Method, register_method, std_settings


def _settings(config: Any) -> dict[str, Any]:
  rl = config.rl
  return dict(gamma=rl.gamma, norm_mode=rl.igpo_norm, ig_weight=rl.igpo_ig_weight,
              outcome_weight=rl.igpo_outcome_weight, **std_settings(config))


def _validate(config: Any, fail: Callable[..., None]) -> None:
  rl = config.rl
  if not (rl.igpo_ig_weight or rl.igpo_outcome_weight):
    fail("rl.igpo_ig_weight", rl.igpo_ig_weight,
         "with rl.igpo_outcome_weight=0 IGPO has no reward at all")


register_method(Method(
    name="igpo", estimator="igpo",
    inputs=frozenset({"ig", "outcome", "num_turns", "group_ids", "turn_id", "loss_mask"}),
    settings=_settings, signals=("probes",), validate=_validate))
