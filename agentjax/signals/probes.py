"""IGPO's information gain (signal "probes"): the gold answer's log-prob after each turn, scored
in the policy's own scoring pass (agentjax/rl/info_gain.py), its per-turn gain the field "ig".

  prepare  the probes of each row's gold answers (host: tokenization; rl.ig_probe_tokens)
  collect  "ig" [B, T] out of the scored batch; the metrics every run logs: ig_mean, ig_std, the
           gold's log-prob before the searches and after them and their difference (the
           reduction IGPO's paper plots), and on questions with a gold chain (SynthWorld) IG of
           each search against "it retrieved a new gold document", as sums a study pools.

A run without the signal logs the same keys at 0 (ABSENT).
"""

from __future__ import annotations

import jax
import numpy as np

from agentjax.judge.oracle import gold_chain, ig_gold_sums, ig_pairs
from agentjax.parallel.host import to_host
from agentjax.rl.advantages import gt_logprob_ends, ig_statistics
from agentjax.rl.info_gain import ANSWER_TEMPLATES, build_probes
from agentjax.signals import Signal, SignalOutput, SignalRunner, register_signal

# The keys a run without probes logs (at 0): every RL run logs the same keys.
ABSENT = {"ig_mean": 0.0, "ig_std": 0.0, "gt_logprob_before": 0.0, "gt_logprob_after": 0.0,
          "gt_entropy_reduction": 0.0}


class ProbesRunner(SignalRunner):
  def __init__(self, env):
    if env.engine is None:
      raise ValueError("the probes signal needs a one-agent rollout stage (its tokenizer)")
    self.encode = env.engine.encode
    self.template = ANSWER_TEMPLATES[env.config.rollout.protocol]
    self.tokens = env.config.rl.ig_probe_tokens
    self.width_multiple = env.config.rl.probe_width_multiple

  def prepare(self, ctx):
    return build_probes(self.encode, ctx.rollouts.row_golds, template=self.template,
                        tokens=self.tokens, width_multiple=self.width_multiple)

  def collect(self, ctx):
    scored, num_turns = ctx.scored, np.asarray(ctx.batch.num_turns, np.int32)
    ig, ends = to_host(_probe_statistics(scored.ig, scored.values, num_turns))
    before, after = map(float, ends)
    metrics = {"ig_mean": float(ig["ig_mean"]), "ig_std": float(ig["ig_std"]),
               "gt_logprob_before": before, "gt_logprob_after": after,
               "gt_entropy_reduction": after - before}
    if any(gold_chain(q)[1] is None for q in ctx.questions):
      metrics.update(ig_gold_sums(*ig_pairs(np.asarray(to_host(scored.ig)), num_turns,
                                            ctx.questions, ctx.batch.turns)))
    return SignalOutput(fields={"ig": scored.ig}, metrics=metrics)


@jax.jit
def _probe_statistics(ig, values, num_turns):
  """ig_statistics and gt_logprob_ends of a step in one program (eager, ~40 small ones)."""
  return ig_statistics(ig, num_turns), gt_logprob_ends(values, num_turns)


PROBES = register_signal(Signal("probes", frozenset({"ig"}), ProbesRunner,
                                absent_metrics=ABSENT, scored=True))
