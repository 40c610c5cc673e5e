"""What one RL step's rollout stage hands to the stages after it (train/step.RLStep): each
role's trajectories and outcome rewards, the run's answer summary and the engine's metrics.

A rollout stage is a callable `stage(config, params, questions, rng, step, trim) -> Rollouts`
with `roles` (the trained roles, in update order), `probes` (whether its first role's rows can
carry IGPO's ground-truth probes), `minibatch_rows(config, role)` and `norm_length(config,
role)`: train/step.AgentRollout (one agent, role "policy"), dac/stage.DacRollout (searcher and
generator).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np


@dataclasses.dataclass
class Rollouts:
  """One step's rollouts.

  batches: {role: TrajectoryBatch}, trimmed to the slots used (train/scoring.trim).
  rewards: {role: [B_role] float32 outcome rewards} (what the advantages read).
  summary: the metrics every RL run logs of what it answers: reward, f1, em, format_error_rate,
    sufficiency_rate, answered, truncated, turns.
  engine: the rollout engine's metrics (search_queries, search_s, sampled_tokens,
    decode_row_steps, decode_useful_row_steps, search_wait_s, search_last_error).
  search_failed: queries of the step that failed.
  metrics: the stage's own metrics (DAC's "dac/...", a task's).
  row_golds: the first role's rows' gold answers (IGPO's probes), None without them.
  row_questions: the first role's rows' question records (the judge reads them), None without.
  """
  batches: Mapping[str, Any]
  rewards: Mapping[str, np.ndarray]
  summary: Mapping[str, float]
  engine: Mapping[str, Any]
  search_failed: int
  metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
  row_golds: Sequence[Any] | None = None
  row_questions: Sequence[Mapping[str, Any]] | None = None


__all__ = ["Rollouts"]
