"""PPO's critic (signal "critic"): the value of the state in which each token is sampled, the
field "values" [B, L] (agentjax/train/critic.py; its updates are the step's, beside the
policy's).

  collect  the critic's values of the first role's rows with the state's critic parameters
"""

from __future__ import annotations

from agentjax.signals import Signal, SignalOutput, SignalRunner, register_signal


class CriticRunner(SignalRunner):
  def __init__(self, env):
    if env.critic is None:
      raise ValueError("the critic signal needs the run's critic (Method.critic)")
    self.critic = env.critic

  def collect(self, ctx):
    values = self.critic.values(ctx.state["critic"]["params"], ctx.batch.tokens,
                                ctx.batch.valid)
    return SignalOutput(fields={"values": values})


CRITIC = register_signal(Signal("critic", frozenset({"values"}), CriticRunner))
