"""Outcome-reward methods: one advantage per trajectory from its outcome and its group
(agentjax/rl/advantages.py): GRPO, Dr.GRPO, GSPO (GRPO's advantages; its loss is rl.loss=gspo),
RLOO, REINFORCE++ (batch whitening, no group) and REINFORCE++ with a group baseline."""

from __future__ import annotations

from typing import Any

from agentjax.methods import Method, register_method, std_settings

_OUTCOME = frozenset({"outcome", "group_ids", "loss_mask"})


def _reinforce_settings(config: Any) -> dict[str, Any]:
  # The batch whitening's variance only; its eps stays verl's 1e-8.
  return dict(std_estimator=config.rl.std_estimator)


for _name, _settings, _group in [("grpo", std_settings, True), ("gspo", std_settings, True),
                                 ("drgrpo", None, True), ("rloo", None, True),
                                 ("reinforce++", _reinforce_settings, False),
                                 ("reinforce++_baseline", _reinforce_settings, True)]:
  register_method(Method(name=_name, estimator=_name, inputs=_OUTCOME, group=_group,
                         outcome_only=True,
                         **({"settings": _settings} if _settings is not None else {})))
