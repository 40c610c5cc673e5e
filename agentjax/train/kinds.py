"""Trainer kinds as registry entries: what config.trainer runs, read by validation and the loop.

    kind = trainer_kind(config)       # TRAINER_KINDS[config.trainer]
    kind.validate(config)             # its own fields (config.validate calls it)
    kind.roles                        # the LoRA adapters one run trains (DAC's two), or None

| kind   | trains                                   | reads          | rollout stage            |
|--------|------------------------------------------|----------------|--------------------------|
| rl     | one search agent on questions, any method | rl.*, algorithm | the agent (AgentRollout) |
| sft    | warm start on demonstrations             | sft.*          | none (train/sft.py)      |
| dac    | DAC's searcher and generator, two adapters | dac.*          | dac.stage.DacRollout     |
| rubric | Co-ReAct's rubric generator on branch points | coreact.*    | the agent, task rewards  |

The loop (train/trainer.py), the builders, evaluation and config validation read the entry, never
the name. A new kind is one entry here whose hooks live in its own package (as DAC's in
agentjax/dac and the rubric generator's in agentjax/coreact/task.py); its hooks are imported when
called, so this module (read by config validation) loads no model code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from agentjax.agent.protocol import PROTOCOLS
from agentjax.dac.roles import ROLES
from agentjax.methods import get_method, outcome_methods
from agentjax.registry import Registry
from agentjax.train.fields import ConfigError, fail, get, names, non_negative, positive


@dataclasses.dataclass(frozen=True)
class TrainerKind:
  """One config.trainer value's entry.

  supervised: trains on demonstrations (train/sft.py): no RL fields, retriever or judge.
  validate: config -> None, its own fields (ConfigError naming the field).
  roles: the LoRA adapters every step trains, each a role (DAC's searcher and generator); None:
    one policy. A run with roles has no single policy to export or restore without naming one.
  critic: may train with a critic method (PPO).
  protocol: the rollout protocol it requires, and that only it may use ("rubric").
  make_agent: (config, cfg, tokenizer, backend, rollout, mesh, lora, samples) -> the rollout
    agent (samples: None when training, 1 for eval); None: agent.RolloutEngine.
  rollout_stage: (engine) -> the step's rollout stage (agent/rollouts.py Rollouts producer);
    None: train/step.AgentRollout over the engine and the task.
  prompt_agent: engine -> the agent whose prompts the token budget must hold.
  load_data: (config, tokenizer) -> (train records, dev records, eval name); None: the
    questions of config.data.train / data.eval.
  make_task: (config, mesh, engine) -> the rewards of a task that is not question answering
    (its object scores rollouts, RLStep's `task`); None: outcome rewards on answers.
  evaluate: launch/eval.py's scores of a checkpoint, (config, engine, params, tokenizer, mesh,
    source, samples, temperature) -> result dict; None: the benchmarks of config.data.eval.
  """
  name: str
  doc: str
  supervised: bool = False
  validate: Callable[[Any], None] | None = None
  roles: tuple[str, ...] | None = None
  critic: bool = False
  protocol: str | None = None
  make_agent: Callable[..., Any] | None = None
  rollout_stage: Callable[[Any], Any] | None = None
  prompt_agent: Callable[[Any], Any] = lambda engine: engine
  load_data: Callable[[Any, Any], tuple[list, list, str]] | None = None
  make_task: Callable[[Any, Any, Any], Any] | None = None
  evaluate: Callable[..., dict[str, Any]] | None = None


TRAINER_KINDS = Registry("trainer kind")


def register_trainer_kind(kind: TrainerKind) -> TrainerKind:
  return TRAINER_KINDS.register(kind.name, kind)


def trainer_kind(config: Any) -> TrainerKind:
  """config.trainer's entry (ConfigError naming the field when unknown)."""
  name = get(config, "trainer")
  if name not in TRAINER_KINDS:
    fail("trainer", name, f"unknown trainer; known: {list(TRAINER_KINDS)}")
  return TRAINER_KINDS[name]


# ---------------------------------------------------------------------------------------- sft


def _validate_sft(config: Any) -> None:
  positive(config, "sft.steps", "sft.batch_size", "sft.max_len", "sft.lr")
  non_negative(config, "sft.checkpoint_every")
  micro, batch = get(config, "sft.micro_batches"), get(config, "sft.batch_size")
  if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1 or batch % micro:
    fail("sft.micro_batches", micro, f"must be an int >= 1 that divides sft.batch_size={batch}")
  if any(isinstance(b, bool) or not isinstance(b, int) or b < 1
         for b in get(config, "sft.length_buckets")):
    fail("sft.length_buckets", get(config, "sft.length_buckets"), "must be positive ints")
  if not get(config, "sft.demos"):
    fail("sft.demos", "", "needs the demonstrations JSONL (SynthWorld writes demos.jsonl)")
  for name in names(get(config, "sft.protocols"), "sft.protocols"):
    if name not in PROTOCOLS:
      fail("sft.protocols", get(config, "sft.protocols"),
           f"names an unknown protocol {name!r}; known: {sorted(PROTOCOLS)}")


# ---------------------------------------------------------------------------------------- dac


def _validate_dac(config: Any) -> None:
  from agentjax.answers import normalize_answer
  from agentjax.dac.rewards import SEARCHER_REWARDS, SUFFICIENCY_MATCHES
  adapters = names(get(config, "model.lora.adapters"), "model.lora.adapters")
  missing = [r for r in ROLES if r not in adapters]
  if missing:
    fail("model.lora.adapters", get(config, "model.lora.adapters"),
         f"trainer 'dac' trains the LoRA adapters {list(ROLES)} on one backbone: add {missing}")
  if get(config, "train.export_hf"):
    fail("train.export_hf", True, "a DAC run has two roles: each is exported as a PEFT folder "
         "({workdir}/adapters/<role>/); merge one into a Hugging Face folder with "
         "launch/merge_lora.py")
  protocol = get(config, "rollout.protocol")
  if protocol in PROTOCOLS and not PROTOCOLS[protocol].can_search:
    fail("rollout.protocol", protocol, "is the searcher's protocol: it must be able to search "
         "(the generator's answer_only protocol is DAC's own)")
  algorithm = get(config, "algorithm")
  if algorithm not in outcome_methods():
    fail("algorithm", algorithm, f"DAC's roles take per-trajectory outcome advantages: one of "
         f"{outcome_methods()}")
  for f in ("dac.generator_samples", "dac.max_evidence_docs", "dac.generator_max_new_tokens",
            "dac.generator_max_total_tokens", "dac.augment_depth"):
    v = get(config, f)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      fail(f, v, "must be an int >= 1")
  k = get(config, "dac.augment_k")
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    fail("dac.augment_k", k, "must be an int >= 0")
  m, group = get(config, "dac.generator_samples"), get(config, "dac.generator_group")
  if group not in ("evidence", "question"):
    fail("dac.generator_group", group, "must be 'evidence' or 'question'")
  if group == "evidence" and m < 2 and get_method(algorithm).group:
    fail("dac.generator_samples", m, f"the generator's advantages are grouped by evidence set "
         f"(dac.generator_group='evidence'): {algorithm!r} needs >= 2 answers per set")
  if get(config, "dac.generator_max_new_tokens") >= get(config, "dac.generator_max_total_tokens"):
    fail("dac.generator_max_total_tokens", get(config, "dac.generator_max_total_tokens"),
         "must exceed dac.generator_max_new_tokens (the prompt needs room)")
  rate = get(config, "dac.augment_rate")
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
    fail("dac.augment_rate", rate, "must be a share in [0, 1]")
  for f in ("dac.alpha", "dac.insufficient_answer_penalty"):
    v = get(config, f)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      fail(f, v, "must be a number")
  non_negative(config, "dac.insufficient_answer_penalty")
  if get(config, "dac.searcher_reward") not in SEARCHER_REWARDS:
    fail("dac.searcher_reward", get(config, "dac.searcher_reward"),
         f"must be one of {list(SEARCHER_REWARDS)}")
  if get(config, "dac.sufficiency_match") not in SUFFICIENCY_MATCHES:
    fail("dac.sufficiency_match", get(config, "dac.sufficiency_match"),
         f"must be one of {list(SUFFICIENCY_MATCHES)}")
  text = get(config, "dac.abstain_text")
  if not isinstance(text, str) or not normalize_answer(text):
    fail("dac.abstain_text", text, "must be text that is not empty after normalization")
  if not isinstance(get(config, "dac.generator_sees_reasoning"), bool):
    fail("dac.generator_sees_reasoning", get(config, "dac.generator_sees_reasoning"),
         "must be True or False")


def _dac_agent(config, cfg, tokenizer, backend, rollout, mesh, lora, samples):
  """DacAgent: the searcher and the generator on one backbone (eval: one answer per set)."""
  from agentjax.dac.roles import DacAgent, DacSettings
  return DacAgent(cfg, tokenizer, backend, rollout, DacSettings.from_config(config), mesh=mesh,
                  lora=lora, samples=samples)


def _dac_stage(engine: Any) -> Any:
  from agentjax.dac.stage import DacRollout
  return DacRollout(engine)


# ------------------------------------------------------------------------------------- rubric


def _validate_rubric(config: Any) -> None:
  if get(config, "rollout.protocol") != "rubric":
    fail("rollout.protocol", get(config, "rollout.protocol"), "trainer 'rubric' trains the "
         "rubric generator: its one-turn output is the rubric (protocol 'rubric')")
  if get(config, "rollout.max_turns") != 1:
    fail("rollout.max_turns", get(config, "rollout.max_turns"),
         "trainer 'rubric' is a single-turn task: must be 1")
  algorithm = get(config, "algorithm")
  if algorithm not in outcome_methods():
    fail("algorithm", algorithm, f"the rubric generator gets one outcome reward per rubric: "
         f"one of {outcome_methods()}")
  for f in ("coreact.branches_train", "coreact.branches_dev"):
    if not get(config, f):
      fail(f, "", "trainer 'rubric' needs branch points (launch/collect_branches.py)")


def _rubric_data(config: Any, tokenizer: Any) -> tuple[list, list, str]:
  """Branch points (coreact.branches_train / branches_dev), not questions."""
  from agentjax.coreact.task import fitted_branch_records
  try:
    train = fitted_branch_records(config, tokenizer, "coreact.branches_train")
    dev = fitted_branch_records(config, tokenizer, "coreact.branches_dev")
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return train, dev, "branches"


def _rubric_task(config: Any, mesh: Any, engine: Any) -> Any:
  """The applier's rewards; the rubric scored is the text without its EOS."""
  from agentjax.coreact.task import RubricRewards
  return RubricRewards.from_config(config, mesh=mesh, engine=engine)


def _rubric_eval(*args: Any) -> dict[str, Any]:
  from agentjax.coreact.task import evaluate_generator
  return evaluate_generator(*args)


register_trainer_kind(TrainerKind(
    "rl", "one search agent's policy on questions, with any method", critic=True))
register_trainer_kind(TrainerKind(
    "sft", "warm start on demonstrations (train/sft.py)", supervised=True, validate=_validate_sft))
register_trainer_kind(TrainerKind(
    "dac", "DAC's searcher and generator, two LoRA adapters on one backbone (agentjax/dac)",
    validate=_validate_dac, roles=ROLES, make_agent=_dac_agent,
    rollout_stage=_dac_stage, prompt_agent=lambda engine: engine.searcher))
register_trainer_kind(TrainerKind(
    "rubric", "Co-ReAct's rubric generator on branch points (agentjax/coreact/task.py)",
    validate=_validate_rubric, protocol="rubric", load_data=_rubric_data, make_task=_rubric_task,
    evaluate=_rubric_eval))


__all__ = ["TRAINER_KINDS", "TrainerKind", "register_trainer_kind", "trainer_kind"]
