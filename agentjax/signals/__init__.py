"""The step's signals: what an advantage estimator reads besides the rollouts and their outcome
rewards, each a plug-in (registry SIGNALS).

    signal = SIGNALS["probes"]          # IGPO's information gain
    signal.provides                     # frozenset({"ig"}): the batch fields it adds
    runner = signal.build(env)          # once per run (a judge client, a corpus index, ...)
    runner.produce(ctx) / runner.prepare(ctx) / runner.collect(ctx)   # see SignalRunner

A method declares the signals it needs (agentjax/methods Method.signals); the step
(agentjax/train/step.py) builds each needed signal once, then runs them around its own work,
in this order:

  produce  after the rollouts and their rewards, before the scoring pass (host work on the
           trajectories and the question records, e.g. a judge's verdicts per round, a reward
           from the documents a search retrieved); may run ahead of the update in an
           asynchronous run.
  prepare  the scoring pass's extra inputs (IGPO's probes: scored in the same forward pass).
  collect  after the scoring pass, with the state being trained (the critic's values, the
           information gain out of the scored probes).

Each hook returns a SignalOutput: batch fields ({name: [B, ...] array}, the first role's rows)
and host metrics. A signal's fields are registered as batch fields (rl.advantages
register_batch_field), so an estimator that does not read one is not handed it.

A signal that needs more of the data than the rollouts carry reads it from the rows' question
records (ctx.questions) and, when a record lacks it, raises MissingData naming the field.

Built in: "probes" (information gain, agentjax/signals/probes.py), "judge" (CW-GRPO's verdicts
per round, judge.py), "critic" (PPO's values, critic.py). A new signal is one module that
registers itself (e.g. agentjax/methods/stepsearch.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Mapping, Sequence

from agentjax.registry import Registry
from agentjax.rl.advantages import register_batch_field


@dataclasses.dataclass
class SignalOutput:
  """fields: {batch field: array} (the first role's rows); metrics: host floats for the log."""
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SignalEnv:
  """What a signal may use to build its runner: the run's config, its mesh, the rollout engine of
  a one-agent stage (its tokenizer: .encode), the trained target, the stage and the run's critic
  (PPO)."""
  config: Any
  mesh: Any
  engine: Any = None
  target: Any = None
  stage: Any = None
  critic: Any = None


@dataclasses.dataclass
class StepContext:
  """One step as the signals see it.

  config, step: the run's config and the step (0-based).
  rollouts: the stage's Rollouts (agent/rollouts.py): batches, rewards, row_questions.
  role: the first role (the rows a signal's fields are for); batch: its TrajectoryBatch.
  state: the train state being updated (collect only): {"params", "opt_state", "critic", ...}.
  scored: the first role's ScoredBatch (collect only).
  prepared: what this signal's prepare returned (collect only).
  """
  config: Any
  step: int
  rollouts: Any
  role: str
  batch: Any
  state: Mapping[str, Any] | None = None
  scored: Any = None
  prepared: Any = None

  @property
  def questions(self) -> Sequence[Mapping[str, Any]]:
    """The first role's rows' question records."""
    return self.rollouts.row_questions


class SignalRunner:
  """A signal's per-run object (Signal.build); each hook is optional (a no-op here)."""

  def produce(self, ctx: StepContext) -> SignalOutput | None:
    del ctx
    return None

  def prepare(self, ctx: StepContext) -> Any:
    del ctx
    return None

  def collect(self, ctx: StepContext) -> SignalOutput | None:
    del ctx
    return None


@dataclasses.dataclass(frozen=True)
class Signal:
  """One signal's registry entry.

  name: its name (what Method.signals lists).
  provides: the batch fields its hooks return.
  build: env -> SignalRunner (once per run).
  validate: (config, fail) -> None, its own config checks (fail(field, value, why) raises the
    ConfigError naming the field).
  absent_metrics: metrics every RL run logs, at these values when it does not run the signal
    (IGPO's ig_mean and the gold's log-probs: the same keys for every run).
  scored: its prepare returns probes (ScoredBatch's probe tokens) that the scoring pass scores
    in the same forward as the first role's log-probs; a stage that cannot carry probes (DAC's
    roles: stage.probes False) runs without the signal.
  check_record: question record -> None, raising MissingData (naming the field) when the record
    lacks what the signal reads (StepSearch's gold documents): every training record is checked
    before the first step (check_records), not when a step samples it.
  """
  name: str
  provides: frozenset
  build: Callable[[SignalEnv], SignalRunner]
  validate: Callable[[Any, Callable[..., None]], None] | None = None
  absent_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
  scored: bool = False
  check_record: Callable[[Mapping[str, Any]], None] | None = None


SIGNALS = Registry("signal")


def absent_metrics() -> dict[str, float]:
  """Every registered signal's absent_metrics (a run's metrics start from these)."""
  return {k: v for s in SIGNALS.values() for k, v in s.absent_metrics.items()}


def register_signal(signal: Signal) -> Signal:
  """Adds `signal` (its fields become batch fields) and returns it."""
  for name in signal.provides:
    register_batch_field(name)
  return SIGNALS.register(signal.name, signal)


class MissingData(ValueError):
  """A question record lacks what a signal needs; the message names the field."""


def check_records(names: Sequence[str], records: Sequence[Mapping[str, Any]], field: str,
                  value: Any) -> None:
  """Every record against the check_record of each signal in `names`; the first record that
  lacks what one reads raises ConfigError "config.{field}={value!r}: {MissingData's message}"
  (the data entry that gave it)."""
  from agentjax.models.qwen.config import ConfigError
  for name in names:
    check = SIGNALS[name].check_record
    for record in records if check is not None else ():
      try:
        check(record)
      except MissingData as e:
        raise ConfigError(f"config.{field}={value!r}: {e}") from None


for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["MissingData", "SIGNALS", "check_records", "Signal", "SignalEnv", "SignalOutput", "SignalRunner",
           "StepContext", "absent_metrics", "register_signal"]
