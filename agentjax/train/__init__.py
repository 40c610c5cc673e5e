"""Training: the loop (trainer: data order, checkpoints, eval, faults), the RL step (step: the
rollouts, the signals, scoring, advantages, updates; its pieces in scoring, updates, packing),
the SFT warm start (sft), optimizer and guarded update (optim), orbax checkpointing (checkpoint),
the config's validation (config) and the upgrade of recorded configs (upgrade)."""

from agentjax.train.checkpoint import CheckpointError, CheckpointMismatchError, Checkpointer
from agentjax.train.optim import make_guarded_step, make_optimizer, make_schedule

__all__ = ["CheckpointError", "CheckpointMismatchError", "Checkpointer", "make_guarded_step",
           "make_optimizer", "make_schedule"]
