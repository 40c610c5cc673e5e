"""PPO with a critic: GAE over tokens (ppo), over turns (ppo_turn), or over rounds with the
critic's values at turn ends (ppo_round) (agentjax/rl/advantages.py, agentjax/rl/gae.py,
agentjax/train/critic.py). Optional IG turn rewards (ppo.ig_weight > 0) run the probes."""

from __future__ import annotations

from typing import Any

from agentjax.methods import Method, register_method


def _settings(config: Any) -> dict[str, Any]:
  p = config.ppo
  return dict(gamma=float(p.gamma), lam=float(p.lam), ig_weight=float(p.ig_weight),
              outcome_weight=float(p.outcome_weight), whiten=bool(p.whiten))


def _inputs(config: Any) -> frozenset:
  """The information gain is read only as turn rewards (ppo.ig_weight > 0)."""
  base = {"outcome", "num_turns", "group_ids", "turn_id", "loss_mask", "values"}
  return frozenset(base | ({"ig"} if float(config.ppo.ig_weight) > 0 else set()))


for _name in ("ppo", "ppo_turn", "ppo_round"):
  register_method(Method(
      name=_name, estimator=_name, inputs=_inputs,
      settings=_settings, group=False, critic=True,
      signals=lambda config: ("critic",) + (("probes",) if float(config.ppo.ig_weight) > 0
                                            else ()),
      value_targets=("returns", "value_mask")))
