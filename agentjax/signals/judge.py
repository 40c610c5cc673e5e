"""CW-GRPO's judge (signal "judge"): a verdict per round (did it retrieve what the question
needs, did its thinking advance it), every call of the step at once (agentjax/judge/stage.py),
the fields "retrieval_scores" and "thinking_scores" [B, T] and the judge's metrics.

  produce  the judge pass on the first role's rows (after the rewards: it skips the rows the
           outcome rules out), its rng seeded by (seed, step, 1)

A run whose config names a judge backend runs it whatever its method (the CW-GRPO study's GRPO
arms log the judge's metrics beside CW-GRPO's).
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import numpy as np

from agentjax.judge import build_judge
from agentjax.judge.stage import JudgePass
from agentjax.parallel.host import DEVICE_TURN
from agentjax.signals import Signal, SignalOutput, SignalRunner, register_signal


class JudgeRunner(SignalRunner):
  def __init__(self, env):
    self.seed = env.config.seed
    self.judge_pass = JudgePass(build_judge(env.config.judge, mesh=env.mesh), env.config.judge)

  def produce(self, ctx):
    batch, rewards = ctx.batch, ctx.rollouts.rewards[ctx.role]
    local = self.judge_pass.identity["backend"] == "local"  # it runs on the devices
    with contextlib.nullcontext() if local else DEVICE_TURN.host_wait():
      scores = self.judge_pass(batch.turns, batch.num_turns, batch.group_ids, rewards,
                               ctx.questions, num_t=batch.turn_ends.shape[1] - 1,
                               rng=np.random.default_rng([self.seed, ctx.step, 1]))
    return SignalOutput(fields={"retrieval_scores": jnp.asarray(scores.retrieval),
                                "thinking_scores": jnp.asarray(scores.thinking)},
                        metrics=scores.metrics)


JUDGE = register_signal(Signal("judge", frozenset({"retrieval_scores", "thinking_scores"}),
                               JudgeRunner))
