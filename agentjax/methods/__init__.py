"""Methods as plug-ins: one registry entry per RL method (its advantage estimator, the settings
it reads from the config, what it needs of the step, its validation and its metrics).

    from agentjax.methods import get_method
    method = get_method(config.algorithm)
    method.settings(config)        # the estimator's keyword arguments (cw.gamma, ppo.lam, ...)
    method.run_signals(config)     # the signals the step runs for it ("probes", "judge", ...)
    method.critic                  # trains a value model beside the policy

The step, the config validation and the trainer read the entry, never the method's name. Every
module of this package registers its methods when the package is imported (pkgutil below): a new
method is one new module here (its estimator with `agentjax.rl.register_advantage` and its
`register_method(Method(...))`) plus a config file, e.g. configs/a2tgpo.py.

Entries: grpo, drgrpo, gspo, rloo, reinforce++, reinforce++_baseline (outcome.py), igpo
(igpo.py), cw_grpo and cw_grpo_ig (cw_grpo.py), ppo, ppo_turn, ppo_round (ppo.py), a2tgpo
(a2tgpo.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any, Callable, Mapping

from agentjax.registry import Registry
from agentjax.rl.advantages import BATCH_FIELDS, get_advantage_estimator
from agentjax.signals import SIGNALS

# Batch fields the step provides to every estimator; the others come from the signals a method
# declares (agentjax/signals: "ig" from "probes", the judge's verdicts from "judge", the
# critic's values from "critic", ...).
STEP_FIELDS = frozenset({"outcome", "group_ids", "loss_mask", "turn_id", "num_turns"})


def _no_settings(config: Any) -> dict[str, Any]:
  del config
  return {}


def _no_metrics(stats: Mapping[str, Any]) -> dict[str, float]:
  del stats
  return {}


@dataclasses.dataclass(frozen=True)
class Method:
  """One method's registry entry (config.algorithm = name).

  estimator: the advantage estimator's registered name (agentjax/rl/advantages.py registry).
  inputs: the batch fields the estimator reads (a subset of rl.advantages.BATCH_FIELDS), or
    config -> those fields when settings decide (PPO reads "ig" only with ppo.ig_weight > 0):
    the step provides STEP_FIELDS, the method's signals the rest (an input no declared signal
    provides fails at config validation, naming the field).
  signals: the signals the step runs for this method (agentjax/signals registry names), or
    config -> those names (PPO runs "probes" only with ppo.ig_weight > 0).
  settings: config -> the estimator's keyword arguments (its config section and defaults).
  group: compares the rollouts of one question (needs rollout.group_size >= 2).
  outcome_only: per-trajectory outcome advantages from `outcome` and `group_ids` alone: usable
    where there are no turns to credit (DAC's roles, the rubric generator).
  critic: trains a value model (PPO's critic, whose values are the "critic" signal; its targets
    come back as value_targets).
  value_targets: the keys of the estimator's stats that are the critic's regression targets.
  loss_inputs: the keys of the estimator's stats that are [B, L] per-token inputs of the policy
    loss, passed to it as keywords of the same name (A²TGPO's "clip_scale"), or config -> those
    keys; the loss (config.rl.loss) must take them (checked at config validation).
  validate: (config, fail) -> None, the method's own checks; fail(field, value, why) raises the
    ConfigError naming the field.
  metrics: the estimator's stats -> extra host metrics of the step (e.g. CW-GRPO's fallback).
  """

  name: str
  estimator: str
  inputs: frozenset | Callable[[Any], frozenset]
  settings: Callable[[Any], dict[str, Any]] = _no_settings
  signals: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
  group: bool = True
  outcome_only: bool = False
  critic: bool = False
  value_targets: tuple[str, ...] = ()
  loss_inputs: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
  validate: Callable[[Any, Callable[..., None]], None] | None = None
  metrics: Callable[[Mapping[str, Any]], dict[str, float]] = _no_metrics

  def inputs_for(self, config: Any) -> frozenset:
    """The batch fields the estimator reads at `config`'s settings."""
    return frozenset(self.inputs(config) if callable(self.inputs) else self.inputs)

  def loss_inputs_for(self, config: Any) -> tuple[str, ...]:
    """The per-token policy-loss inputs the estimator returns at `config`'s settings."""
    return tuple(self.loss_inputs(config) if callable(self.loss_inputs) else self.loss_inputs)

  def signals_for(self, config: Any) -> tuple[str, ...]:
    """The signals this method reads at `config`'s settings."""
    return tuple(self.signals(config) if callable(self.signals) else self.signals)

  def run_signals(self, config: Any) -> tuple[str, ...]:
    """The signals a run of this method runs: its own, and IGPO's probes with rl.probe_all (for
    the metrics: information gain of any method's searches)."""
    names = self.signals_for(config)
    return names + (("probes",) if config.rl.probe_all and "probes" not in names else ())

  def check(self, config: Any, fail: Callable[..., None]) -> None:
    """The checks every method gets from its entry, then its own `validate`."""
    group = config.rollout.group_size
    if self.group and group < 2:
      fail("rollout.group_size", group, f"algorithm {self.name!r} normalizes within the group "
           "of each question and needs group_size >= 2")
    inputs, signals = self.inputs_for(config), self.signals_for(config)
    unknown = [s for s in signals if s not in SIGNALS]
    if unknown:
      fail("algorithm", self.name, f"declares the unknown signal(s) {unknown}; known: "
           f"{SIGNALS.known()}")
    for name in signals:  # each signal's own checks
      if SIGNALS[name].validate is not None:
        SIGNALS[name].validate(config, fail)
    provided = set(STEP_FIELDS).union(*(SIGNALS[s].provides for s in signals))
    for field in sorted(inputs - provided):
      fail("algorithm", self.name, f"reads the batch field {field!r}, which none of its "
           f"signals {list(signals)} provides")
    if ("critic" in signals) != self.critic:
      fail("algorithm", self.name, "a method that trains a critic reads its values (signal "
           "'critic'), and only such a method does")
    needs = self.loss_inputs_for(config)
    if needs:  # the loss must take them (else a TypeError deep inside the jitted update)
      from agentjax.rl.losses import get_policy_loss
      taken = inspect.signature(get_policy_loss(config.rl.loss)).parameters
      missing = [k for k in needs if k not in taken]
      if missing:
        fail("rl.loss", config.rl.loss, f"algorithm {self.name!r} gives the policy loss the "
             f"per-token input(s) {missing}, which this loss does not take")
    if self.validate is not None:
      self.validate(config, fail)


METHODS = Registry("method")


def register_method(method: Method) -> Method:
  """Adds `method` to the registry (its estimator must be registered; its inputs known)."""
  get_advantage_estimator(method.estimator)  # a KeyError naming the known ones
  unknown = (set() if callable(method.inputs) else set(method.inputs)) - BATCH_FIELDS
  if unknown:
    raise ValueError(f"method {method.name!r}: unknown inputs {sorted(unknown)}; the batch "
                     f"fields are {sorted(BATCH_FIELDS)}")
  return METHODS.register(method.name, method)


def get_method(name: str) -> Method:
  """The registered method `name`; a KeyError names the known ones otherwise."""
  return METHODS[name]


def outcome_methods() -> list[str]:
  """The methods of per-trajectory outcome advantages (Method.outcome_only): what DAC's roles and
  the rubric generator (one reward per rubric) can use."""
  return sorted(name for name, m in METHODS.items() if m.outcome_only)


def section_settings(config: Any, name: str, defaults: Mapping[str, Any],
                     fail: Callable[..., None] | None = None) -> dict[str, Any]:
  """A method's own config section (config.<name>, which the base config does not have: a
  config without it runs `defaults`) over `defaults`. With `fail`, a key the method does not
  know fails naming the field."""
  section = config[name] if name in config else {}
  unknown = sorted(set(section.keys()) - set(defaults))
  if unknown and fail is not None:
    fail(f"{name}.{unknown[0]}", section[unknown[0]],
         f"unknown {name} setting; known: {sorted(defaults)}")
  return {k: section[k] if k in section else v for k, v in defaults.items()}


def std_settings(config: Any) -> dict[str, Any]:
  """rl.std_estimator and rl.std_eps (as `eps`), for estimators that divide by a group std."""
  return dict(std_estimator=config.rl.std_estimator, eps=config.rl.std_eps)


for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "Method", "STEP_FIELDS", "get_method", "outcome_methods",
           "register_method", "section_settings", "std_settings"]
