"""Training pieces: SFT warm start (sft), one RL step (rl), optimizer and guarded update (optim),
orbax checkpointing (checkpoint). The train loop and launchers come with the trainer issue."""

from agentjax.train.checkpoint import CheckpointError, CheckpointMismatchError, Checkpointer
from agentjax.train.optim import make_guarded_step, make_optimizer, make_schedule

__all__ = ["CheckpointError", "CheckpointMismatchError", "Checkpointer", "make_guarded_step",
           "make_optimizer", "make_schedule"]
