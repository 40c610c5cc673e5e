"""DAC (Divide and Cooperate): a searcher and a generator as two LoRA roles on one backbone, the
generator's abstention in the searcher's reward (DAC, arXiv:2606.10684, which has no public
code; configs/dac.py).

  rewards.py  labels (sufficiency, correctness, abstention), both roles' rewards, augmentation
  roles.py    the two-role rollout (DacAgent): searcher -> evidence set -> generator
  stage.py    the rollout stage of the RL step (DacRollout): both roles, their rewards, metrics
"""

from agentjax.dac.rewards import (augment, contains_answer, correct, distractor_candidates,
                                  evidence_set, generator_rewards, is_abstention,
                                  searcher_rewards, sufficient)
from agentjax.dac.roles import ROLES, DacAgent, DacBatch, DacSettings, generator_prompt

__all__ = ["ROLES", "DacAgent", "DacBatch", "DacSettings", "augment", "contains_answer",
           "correct", "distractor_candidates", "evidence_set", "generator_prompt",
           "generator_rewards", "is_abstention", "searcher_rewards", "sufficient"]
