"""One RL step for every method and role, as the trainer loop calls it:

    rl_step = RLStep.build(config, mesh, stage, optimizer, ref_params)   # stage: an engine too
    out = rl_step(state, questions, step)   # state {"params", "opt_state", "rng"} -> out.state

  1. rollouts and rewards: the rollout stage (agent/rollouts.py): AgentRollout here (one agent,
     role "policy", outcome rewards or a task's own), dac/stage.DacRollout (two roles)
  2. the signals' produce hooks (agentjax/signals: e.g. CW-GRPO's judge, a reward from the
     retrieved documents)
  3. scoring per role (old and reference log-probs, with the signals' scoring inputs: IGPO's
     probes), then the signals' collect hooks (the information gain, the critic's values)
  4. advantages per role with the method's estimator and settings (agentjax/methods)
  5. PPO-clip updates: minibatch k of every role in update k (one role: make_policy_update;
     several: make_roles_update), with a critic its update on the same minibatch
  6. metrics: the same keys for every run, plus the signals', the method's and the stage's own

The step reads the method's registry entry (its estimator and signals), never its name, and runs
whatever signals it names. The loop (agentjax/train/trainer.py) keeps what is not the step: data
order, checkpoints, eval, preemption and the fault rules.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentjax.agent import RolloutEngine
from agentjax.agent.rollouts import Rollouts
from agentjax.agent.trajectories import TrajectoryBatch
from agentjax.methods import get_method
from agentjax.models.qwen import param_shardings
from agentjax.parallel import use_mesh
from agentjax.parallel.host import to_host
from agentjax.rl import outcome_rewards
from agentjax.rl.evidence import evidence_set, sufficient
from agentjax.rl.offpolicy import mismatch_metrics
from agentjax.signals import SIGNALS, SignalEnv, StepContext, absent_metrics
from agentjax.train.adapters import TrainTarget
from agentjax.train.critic import Critic
from agentjax.rl.microbatch import global_micro
from agentjax.train.optim import make_schedule
from agentjax.train.packing import PACK_KEYS, MinibatchPacker
from agentjax.train.scoring import plan_scoring, score_batch, trim
from agentjax.train.updates import (CRITIC_MINIBATCH, advantage_kwargs,
                                    compute_advantages, make_policy_update, make_roles_update,
                                    minibatches, policy_loss_config, policy_minibatch_keys,
                                    summarize)


def updates_per_step(config: Any) -> int:
  """Optimizer updates in one RL step (the schedule counts updates; config counts steps)."""
  if config.trainer not in ("rl", "dac", "rubric"):
    return 1
  batch = config.rl.prompts_per_step * config.rollout.group_size
  return config.rl.ppo_epochs * (batch // config.rl.minibatch_size)


def micro_batch_rows(config: Any, mesh: jax.sharding.Mesh) -> int:
  """Trajectories per forward/backward over all of `mesh`'s devices: rl.micro_batch_size (per
  device) x the data x fsdp devices the batch is sharded over; 0: whole minibatches at once.
  A ConfigError naming rl.micro_batch_size unless it divides rl.minibatch_size."""
  from agentjax.train.config import ConfigError
  micro = config.rl.micro_batch_size
  rows = global_micro(micro, mesh)
  if rows and config.rl.minibatch_size % rows:
    raise ConfigError(f"config.rl.micro_batch_size={micro!r}: x the mesh's data x fsdp devices "
                      f"= {rows} trajectories per pass must divide "
                      f"rl.minibatch_size={config.rl.minibatch_size}")
  return rows


def schedule_args(config: Any) -> tuple[float, int, int, float]:
  """(lr, warmup, total, final_lr_ratio) of the schedule, counted in optimizer updates."""
  k = updates_per_step(config)
  o = config.optimizer
  return o.lr, o.warmup_steps * k, config.train.steps * k, o.final_lr_ratio


@functools.partial(jax.jit, static_argnums=0)
def _rate(schedule: optax.Schedule, count: int) -> jax.Array:
  """A schedule's value at `count` updates, in one program (an optax schedule called eagerly
  runs ~10 small ones)."""
  return schedule(count)


@jax.jit
def _split_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """jax.random.split(key) as two keys, in one program (eagerly: a split and an unstack)."""
  first, second = jax.random.split(key)
  return first, second


@jax.jit
def _stamp(loss_mask: jax.Array, version: jax.Array) -> jax.Array:
  """[B, L] versions of a batch sampled by one parameter version: `version` on its sampled
  tokens, -1 elsewhere (one program; eagerly a cast and a where)."""
  return jnp.where(loss_mask, version, -1).astype(jnp.int32)


@jax.jit
def _batch_sums(behav_logp, old_logp, loss_mask, valid) -> dict[str, jax.Array]:
  """mismatch_metrics and the valid-token count of one role's batch, in one program."""
  return {**mismatch_metrics(behav_logp, old_logp, loss_mask),
          "valid_tokens": jnp.sum(valid, dtype=jnp.int32)}


@dataclasses.dataclass
class StepOutput:
  """What one step hands back to the loop.

  state: the new {"params", "opt_state", "rng"} (and "critic": {"params", "opt_state"} of a PPO
    run).
  metrics: host floats, logged as they are (metrics.jsonl, TensorBoard).
  update_skipped: one 0/1 per optimizer update of the step, in order (1: non-finite loss or
    gradient, the update was not applied); the loop counts consecutive ones across steps.
  search_queries / search_failed: queries sent to the retriever and how many of them failed.
  search_last_error: the last retriever error of the step's rollouts (None if none failed).
  """
  state: dict[str, Any]
  metrics: dict[str, float]
  update_skipped: list[int]
  search_queries: int
  search_failed: int
  search_last_error: str | None


@dataclasses.dataclass
class Produced:
  """What RLStep.produce hands to RLStep.consume: the stage's rollouts and rewards, the fields
  and metrics of the signals' produce hooks (CW-GRPO's per-round verdicts), the seconds of the
  rollout and of the whole production, and `version`: the number of updates the rollout's
  parameters had had when it began. `token_versions`: with rollout.partial, (versions [B, S],
  sampled [B, S]) of the first role's batch on the host, which the pipeline fills and reads
  (train/pipeline.py)."""
  out: Rollouts
  fields: Mapping[str, jax.Array]
  metrics: Mapping[str, float]
  rollout_s: float
  produce_s: float
  version: int
  token_versions: tuple[np.ndarray, np.ndarray] | None = None


@dataclasses.dataclass
class AgentRollout:
  """The rollout stage of one agent (role "policy"): `engine.run`, then the outcome rewards
  against the gold answers, or a task's own reward (Co-ReAct's rubric generator)."""
  engine: RolloutEngine
  # rewards(batch, questions) -> ([B] rewards, metrics) in place of EM/F1 against gold answers.
  task_rewards: Callable[..., tuple[np.ndarray, dict[str, float]]] | None = None
  roles = ("policy",)
  probes = True
  partial = True  # reads a ParamsFeed (rollout.partial): one agent, one policy

  def minibatch_rows(self, config: Any, role: str) -> int:
    del role
    return config.rl.minibatch_size

  def norm_length(self, config: Any, role: str) -> int:
    del role
    return config.rollout.max_total_tokens

  def __call__(self, config: Any, params: Any, questions: Sequence[Mapping[str, Any]],
               rng: jax.Array, step: int, trim: Callable, feed: Any = None,
               version: int = 0) -> Rollouts:
    """feed, version: RolloutEngine.run's (rollout.partial; asynchronous RL)."""
    del step
    rl = config.rl
    partial = {} if feed is None else {"feed": feed, "version": version}
    batch, engine_metrics = self.engine.run(params, [q["question"] for q in questions], rng,
                                            **partial)
    batch = trim(batch)  # score and update only the cache slots some trajectory uses
    golds = [q["golden_answers"] for q in questions]
    row_golds = [golds[g] for g in batch.group_ids]
    answers = [a if ok else None for a, ok in zip(batch.answers, batch.answered)]
    task_metrics = {}
    if self.task_rewards is not None:  # the task's own reward; no gold answers to score against
      outcome, task_metrics = self.task_rewards(batch, questions)
      f1 = em = np.zeros(len(answers), np.float32)
    else:  # each answer scored once; the reward is one of the two (and the format penalty)
      f1 = outcome_rewards(answers, row_golds, metric="f1")
      em = outcome_rewards(answers, row_golds, metric="em")
      outcome = {"f1": f1, "em": em}[rl.reward_metric]
      if rl.penalize_format:
        outcome = np.where(np.asarray(batch.format_valid, bool), outcome,
                           np.float32(rl.format_penalty)).astype(np.float32)
    is_sufficient = np.array([
        sufficient(evidence_set([t.documents for t in turns]), g, config.dac.sufficiency_match)
        for turns, g in zip(batch.turns, row_golds)], bool)
    summary = {
        "reward": float(outcome.mean()), "f1": float(f1.mean()), "em": float(em.mean()),
        "format_error_rate": float(1.0 - batch.format_valid.mean()),
        # The share of trajectories whose retrieved documents hold a gold answer (DAC's label S
        # of the evidence, for any agent: DAC's study compares it with its searcher's).
        "sufficiency_rate": float(is_sufficient.mean()),
        # ... and of those, the share whose outcome reward is <= 0 (a search that found the
        # answer and got no credit for it: what DAC's searcher reward gives back).
        "sufficient_unrewarded": float(np.mean(np.asarray(outcome)[is_sufficient] <= 0))
        if is_sufficient.any() else 0.0,
        "answered": float(batch.answered.mean()), "truncated": float(batch.truncated.mean()),
        "turns": float(batch.num_turns.mean())}
    return Rollouts(batches={"policy": batch}, rewards={"policy": outcome}, summary=summary,
                    engine=engine_metrics, search_failed=int(batch.num_search_failures.sum()),
                    metrics=task_metrics, row_golds=row_golds,
                    row_questions=[questions[g] for g in batch.group_ids])


@dataclasses.dataclass
class RLStep:
  """The RL step of one run; `build` once (it holds the compiled update), call once per step."""
  config: Any
  mesh: jax.sharding.Mesh
  stage: Any                         # the rollout stage (agent/rollouts.py)
  update: Callable
  ref_params: Any
  schedule: optax.Schedule
  adv_kwargs: Mapping[str, Any]
  # The signals the run's method reads (agentjax/signals), in run order; `signals` builds their
  # runners on first use (the fit check builds a step without running it).
  signal_env: SignalEnv | None = None
  signal_names: tuple[str, ...] = ()
  _runners: dict[str, Any] | None = None
  target: TrainTarget | None = None  # what is trained: the whole model, or LoRA adapters
  ref_model: Any = None              # the reference's module when not the policy's (LoRA)
  # PPO's value model (Method.critic; its state is state["critic"]).
  critic: Critic | None = None
  # Trajectories per forward/backward over all devices (micro_batch_rows; 0: one pass).
  micro_batch: int = 0
  # rl.pack_tokens: scoring and the policy's updates on packed rows of this many tokens (0: padded
  # rows). The critic's passes stay padded.
  pack_tokens: int = 0
  # rl.pack_rows_per_octave: the packed row counts' ladder (packing.row_ladder).
  pack_rows_per_octave: int = 8
  role_schedules: Mapping[str, optax.Schedule] | None = None  # several roles: each one's rate
  # Asynchronous RL's split placement: the sampler's devices (produce runs there, on a copy of
  # the parameters: to_sampler); None: the rollouts run on `mesh`.
  sampler_mesh: jax.sharding.Mesh | None = None

  @property
  def engine(self) -> RolloutEngine | None:
    """The rollout engine of a one-agent stage (None for a stage of several roles)."""
    return getattr(self.stage, "engine", None)

  @property
  def multi_role(self) -> bool:
    return len(self.stage.roles) > 1

  @property
  def signals(self) -> dict[str, Any]:
    """{name: runner} of the run's signals, built on first use."""
    if self._runners is None:
      self._runners = {n: SIGNALS[n].build(self.signal_env) for n in self.signal_names}
    return self._runners

  @classmethod
  def build(cls, config: Any, mesh: jax.sharding.Mesh, stage: Any,
            optimizer: optax.GradientTransformation, ref_params: Any,
            target: TrainTarget | None = None, ref_model: Any = None,
            rewards: Callable | None = None,
            sampler_mesh: jax.sharding.Mesh | None = None) -> "RLStep":
    """stage: a rollout stage (agent/rollouts.py), or a RolloutEngine (then AgentRollout of it
    with `rewards`, a task's reward in place of the outcome reward; the fit check passes a
    stand-in with the engine's .model and .cfg). target: what the run trains
    (agentjax/train/adapters.py; None: the whole model, state params are the model's).
    ref_model: the reference's module when it is not the policy's."""
    if not hasattr(stage, "roles"):  # an engine (anything with .model, .cfg and .run)
      stage = AgentRollout(stage, rewards)
    rl = config.rl
    method = get_method(config.algorithm)
    # One agent: its engine's model (LoRA: with the adapters); several roles: the target's.
    model = stage.engine.model if len(stage.roles) == 1 else target.model
    target = target or TrainTarget(stage.engine.cfg, None, None, None)
    micro = micro_batch_rows(config, mesh)
    # Accumulated gradients live in the trainable params' shardings (LoRA: the adapters').
    grad_shardings = (target.shardings(mesh) or param_shardings(target.cfg, mesh)) \
        if micro else None
    # A method's per-token loss inputs come with the first role's advantages (one agent's).
    losses = {role: policy_loss_config(config, stage.norm_length(config, role))
              for role in stage.roles}
    losses = {role: loss if role == stage.roles[0] else dataclasses.replace(loss, inputs=())
              for role, loss in losses.items()}
    if len(stage.roles) == 1:
      update = make_policy_update(model, optimizer, losses[stage.roles[0]], micro_batch=micro,
                                  grad_shardings=grad_shardings)
    else:  # one update of every role's adapter on its own minibatch
      update = make_roles_update(model, optimizer, losses, micro_batch=micro,
                                 grad_shardings=grad_shardings)
    critic = Critic.build(config, target, updates_per_step(config), micro, mesh) \
        if method.critic else None
    # A stage that cannot carry probes (DAC's roles) runs without the signals scored with them.
    names = tuple(n for n in method.run_signals(config) if not SIGNALS[n].scored or stage.probes)
    env = SignalEnv(config, mesh, engine=getattr(stage, "engine", None), target=target,
                    stage=stage, critic=critic)
    role_schedules = {role: make_schedule(rate, *schedule_args(config)[1:])
                      for role, rate in target.learning_rates(config.optimizer.lr).items()
                      if role in stage.roles} if len(stage.roles) > 1 else None
    return cls(config=config, mesh=mesh, stage=stage, update=update, ref_params=ref_params,
               schedule=make_schedule(*schedule_args(config)),  # the optimizer's, for logging
               adv_kwargs=advantage_kwargs(config), signal_env=env, signal_names=names,
               target=target, ref_model=ref_model, critic=critic,
               micro_batch=micro, pack_tokens=rl.pack_tokens,
               pack_rows_per_octave=rl.pack_rows_per_octave,
               role_schedules=role_schedules, sampler_mesh=sampler_mesh)

  def __call__(self, state: Mapping[str, Any], questions: Sequence[Mapping[str, Any]],
               step: int) -> StepOutput:
    """Step `step` (0-based: the number of steps done before it) on `questions`: its rollouts
    with the state's own parameters (produce), then its update (consume).

    state: {"params", "opt_state", "rng"}, and {"critic": {"params", "opt_state"}} with a
    critic."""
    t_step = time.perf_counter()
    rng, rollout_rng = _split_key(state["rng"])
    produced = self.produce(state["params"], questions, rollout_rng, step, version=step)
    return self.consume(state, produced, step, rng, t_step)

  def warm_up(self, state: Mapping[str, Any], prompt_lengths: tuple[int, int]) -> None:
    """Compiles the rollout's programs before step 1 (rollout.warm_up; RolloutEngine.warm_up)
    with the parameters, key and mesh `produce` gives them. One-agent stages only (DAC's two
    roles are not warmed). prompt_lengths: the run's (shortest, longest) prompt in tokens."""
    if self.engine is None:
      return
    mesh = self.sampler_mesh or self.mesh
    params = state["params"] if self.sampler_mesh is None else self.to_sampler(state["params"])[0]
    rollout_rng = self._on_sampler(_split_key(state["rng"])[1])
    with use_mesh(mesh):
      self.engine.warm_up(self.target.rollout_params(params),
                          self.config.rl.prompts_per_step * self.engine.config.group_size,
                          prompt_lengths, rollout_rng)

  def _on_sampler(self, key: jax.Array) -> jax.Array:
    """A key from the trainer's state, replicated on the sampler's devices (split placement)."""
    if self.sampler_mesh is None:
      return key
    return jax.device_put(key, jax.sharding.NamedSharding(self.sampler_mesh,
                                                          jax.sharding.PartitionSpec()))

  def to_sampler(self, params: Any) -> tuple[Any, float]:
    """(the parameters a later step's rollout runs with, seconds): a copy of `params` (the
    update donates its own), on the sampler's devices with the split placement (the weight
    copy, waited for and timed there)."""
    t0 = time.perf_counter()
    if self.sampler_mesh is None:
      return jax.tree.map(jnp.copy, params), 0.0
    copied = jax.block_until_ready(jax.device_put(
        params, param_shardings(self.target.cfg, self.sampler_mesh)))
    return copied, time.perf_counter() - t0

  def _to_trainer(self, out: Rollouts) -> Rollouts:
    """The split placement: the rollouts' device arrays moved from the sampler's devices to the
    trainer's (replicated there: the scoring pass shards what it needs)."""
    if self.sampler_mesh is None:
      return out
    everywhere = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    moved = {role: b.map_slots(lambda x: jax.device_put(x, everywhere))
             for role, b in out.batches.items()}
    return dataclasses.replace(out, batches=moved)

  def produce(self, params: Any, questions: Sequence[Mapping[str, Any]], rollout_rng: jax.Array,
              step: int, version: int, feed: Any = None) -> Produced:
    """Stages 1-2 of step `step`: the rollouts of `questions` by `params` (the trained tree, as
    state["params"]; `version`: the number of updates they have had) and their rewards, then the
    judge's verdicts: everything before the scoring pass, on the device and on the host. An
    asynchronous run (train/pipeline.py) calls it for a later step while this one updates.

    feed: with rollout.partial, the trained trees the run publishes meanwhile (a ParamsFeed;
    stages with `partial` only): the rollout continues with (or restarts from) the newest.
    Every sampled token's version is in the batches' `versions`."""
    config, mesh = self.config, self.sampler_mesh or self.mesh
    rollout_rng = self._on_sampler(rollout_rng)
    # 1. rollouts and rewards (the stage's; host rewards)
    t0 = time.perf_counter()
    with use_mesh(mesh):
      rollout_params = self.target.rollout_params(params)  # {role: ...} with several roles
      if feed is None:  # one version samples everything
        out = self.stage(config, rollout_params, questions, rollout_rng, step, self._trim)
        out = dataclasses.replace(out, batches={
            role: b.replace(versions=_stamp(b.loss_mask, np.int32(version)))
            for role, b in out.batches.items()})
      else:
        out = self.stage(config, rollout_params, questions, rollout_rng, step, self._trim,
                         feed=feed.map(self.target.rollout_params), version=version)
    t_rollout = time.perf_counter() - t0

    # 2. the signals' work on the rollouts (CW-GRPO's judge: every call of the step at once)
    fields, metrics = {}, {}
    ctx = self._context(out, step)
    for runner in self.signals.values():
      got = runner.produce(ctx)
      if got is not None:
        fields.update(got.fields)
        metrics.update(got.metrics)
    return Produced(out=out, fields=fields, metrics=metrics, rollout_s=t_rollout,
                    produce_s=time.perf_counter() - t0, version=version)

  def _context(self, out: Rollouts, step: int, **more: Any) -> StepContext:
    """The step as the signals see it (its first role's rows)."""
    first = self.stage.roles[0]
    return StepContext(config=self.config, step=step, rollouts=out, role=first,
                       batch=out.batches[first], **more)

  def consume(self, state: Mapping[str, Any], produced: Produced, step: int, rng: jax.Array,
              t_step: float) -> StepOutput:
    """Stages 3-6 of step `step` on what produce made: scoring with the state's parameters and
    the signals, advantages, the PPO-clip updates, the metrics. rng: the new state's key;
    t_step: when the step began (step_s counts from there)."""
    out = self._to_trainer(produced.out)
    t0 = time.perf_counter()
    ctx = self._context(out, step, state=state)
    prepared = {name: runner.prepare(ctx) for name, runner in self.signals.items()}
    probes = next((prepared[n] for n in self.signals if SIGNALS[n].scored), None)
    scored, packer, pack_stats = self._score(state, out, probes)
    fields, signal_metrics = dict(produced.fields), dict(produced.metrics)
    for name, runner in self.signals.items():
      got = runner.collect(dataclasses.replace(ctx, scored=scored[ctx.role],
                                               prepared=prepared[name]))
      if got is not None:
        fields.update(got.fields)
        signal_metrics.update(got.metrics)
    adv, adv_stats, per_token, critic_targets = self._advantages(out, scored, fields)
    t_score = time.perf_counter() - t0

    t0 = time.perf_counter()
    new_state, upd, crit, skipped = self._update(state, out, scored, adv, per_token,
                                                 critic_targets, packer, step)
    new_state["rng"] = rng
    t_update = time.perf_counter() - t0
    timing = {"rollout_s": produced.rollout_s, "scoring_s": t_score, "update_s": t_update,
              "step_s": time.perf_counter() - t_step}
    metrics = self._metrics(out, scored, adv_stats, upd, crit, skipped, step, pack_stats,
                            packer, timing, {**signal_metrics, **out.metrics})
    return StepOutput(state=new_state, metrics=metrics, update_skipped=skipped,
                      search_queries=int(out.engine["search_queries"]),
                      search_failed=out.search_failed,
                      search_last_error=out.engine.get("search_last_error"))

  def _score(self, state: Mapping[str, Any], out: Rollouts, probes: Any
             ) -> tuple[dict[str, Any], MinibatchPacker | None, dict[str, float]]:
    """Stage 3: one scoring pass per role with the state's parameters: old (and reference)
    log-probs, and on the first role's rows the probes' scores. With rl.pack_tokens, the packed
    rows of the scoring and of the updates are planned first (one transfer of `valid`).
    Returns ({role: ScoredBatch}, the updates' MinibatchPacker or None, packing stats)."""
    roles, first, mesh = self.stage.roles, self.stage.roles[0], self.mesh
    with use_mesh(mesh):
      params = self.target.rollout_params(state["params"])  # the scoring pass's (this version)
    role_params = params if self.multi_role else {first: params}
    packer, score_plans, pack_stats = None, None, {}
    if self.pack_tokens:
      batch = out.batches[first]
      host_valid = np.asarray(to_host(batch.valid), bool)
      devices = global_micro(1, mesh)  # the packed rows are sharded over data x fsdp too
      score_plans = plan_scoring(host_valid, batch.num_turns, batch.turn_ends.shape[1] - 1,
                                 probes, self.pack_tokens, reference=self.ref_params is not None,
                                 row_multiple=self.micro_batch or devices,
                                 steps_per_octave=self.pack_rows_per_octave)
      packer = MinibatchPacker(host_valid, self.pack_tokens, micro_batch=self.micro_batch,
                               row_multiple=devices, steps_per_octave=self.pack_rows_per_octave)
      pack_stats = score_plans.stats()
    model = self.target.model if self.multi_role else self.engine.model
    with use_mesh(mesh):
      scored = {role: score_batch(model, role_params[role], self.ref_params, out.batches[role],
                                  probes if role == first else None, mode=self.config.rl.ig_mode,
                                  chunk=self.config.rl.chunk, ref_model=self.ref_model,
                                  micro_batch=self.micro_batch,
                                  packing=score_plans if role == first else None)
                for role in roles}
    return scored, packer, pack_stats

  def _advantages(self, out: Rollouts, scored: Mapping[str, Any], fields: Mapping[str, Any]
                  ) -> tuple[dict, dict, dict, dict]:
    """Stage 4: each role's advantages by the method's estimator, the signals' fields on the
    first role's rows. Returns ({role: [B, L]}, {role: stats}, the first role's per-token policy
    loss inputs (A²TGPO's clip scale), the critic's targets {old_values, returns, value_mask}
    ({} without a critic))."""
    method = get_method(self.config.algorithm)
    first = self.stage.roles[0]
    adv, stats = {}, {}
    with use_mesh(self.mesh):
      for role in self.stage.roles:
        extra = {k: v for k, v in fields.items() if k != "ig"} if role == first else {}
        ig = fields.get("ig", scored[role].ig) if role == first else scored[role].ig
        adv[role], stats[role] = compute_advantages(method.estimator, out.batches[role],
                                                    out.rewards[role], ig, extra=extra,
                                                    **self.adv_kwargs)
      per_token = {k: stats[first].pop(k) for k in method.loss_inputs_for(self.config)}
      targets = {}
      if self.critic is not None:  # the critic's regression targets and the slots they are on
        targets = dict(old_values=fields["values"],
                       **{k: stats[first].pop(k) for k in method.value_targets})
      jax.block_until_ready(adv)
    return adv, stats, per_token, targets

  def _update(self, state: Mapping[str, Any], out: Rollouts, scored: Mapping[str, Any],
              adv: Mapping[str, Any], per_token: Mapping[str, Any],
              critic_targets: Mapping[str, Any], packer: MinibatchPacker | None, step: int
              ) -> tuple[dict[str, Any], dict[str, float], dict[str, Any], list[int]]:
    """Stage 5: PPO-clip minibatch updates (minibatch shuffles seeded by the step: resumable).
    Update k trains every role on its minibatch k; with a critic, its update on the same
    minibatch (during critic.warmup_steps only the critic's). Returns (the new state without
    its rng, the policy updates' summary, {"summary", "per_update", "fit"} of the critic's, one
    skipped flag per update)."""
    config, roles, first = self.config, self.stage.roles, self.stage.roles[0]
    trainable, opt_state = state["params"], state["opt_state"]
    critic_state = dict(state["critic"]) if self.critic is not None else None
    train_policy = self.critic is None or step >= self.critic.warmup_steps
    frozen = self.target.frozen  # LoRA: the backbone, read by the update, never written
    update_metrics, critic_metrics = [], []
    shuffle = np.random.default_rng([config.seed, step])
    keys = policy_minibatch_keys(config)
    # The first role's minibatches also carry the method's per-token inputs and the critic's.
    first_keys = keys + tuple(per_token) + (CRITIC_MINIBATCH if critic_state is not None else ())
    with use_mesh(self.mesh):
      critic_fit = self.critic.batch_metrics(**critic_targets) if critic_targets else {}
      for _ in range(config.rl.ppo_epochs):
        per_role = [minibatches(out.batches[r], scored[r], adv[r],
                                self.stage.minibatch_rows(config, r), shuffle,
                                {**critic_targets, **per_token} if r == first else None,
                                packer=packer if r == first else None,
                                keys=first_keys if r == first else keys)
                    for r in roles]
        for mbs in zip(*per_role):
          if train_policy:
            mb = {r: {k: m[k] for k in keys + tuple(per_token) + PACK_KEYS if k in m}
                  for r, m in zip(roles, mbs)}
            trainable, opt_state, m = self.update(
                trainable, opt_state, mb if self.multi_role else mb[first], *frozen)
            update_metrics.append(m)
          if critic_state is not None:
            critic_state["params"], critic_state["opt_state"], m = self.critic.update(
                critic_state["params"], critic_state["opt_state"],
                {k: mbs[0][k] for k in CRITIC_MINIBATCH})
            critic_metrics.append(m)
    update_metrics, critic_metrics, critic_fit = to_host(  # one transfer
        (update_metrics, critic_metrics, critic_fit))
    # One entry per minibatch: skipped when the policy's or the critic's update was not applied.
    skipped = [int(max(a, b)) for a, b in itertools.zip_longest(
        [m["skipped"] for m in update_metrics], [m["skipped"] for m in critic_metrics],
        fillvalue=0)]
    new_state = {"params": trainable, "opt_state": opt_state}
    if critic_state is not None:
      new_state["critic"] = critic_state
    crit = {"summary": summarize(critic_metrics), "per_update": critic_metrics,
            "fit": critic_fit, "policy_frozen": not train_policy}
    return new_state, summarize(update_metrics), crit, skipped

  def _trim(self, batch: TrajectoryBatch, *multiple: int) -> TrajectoryBatch:
    """The stages' cut of a batch to its used slots (scoring.trim, with its multiple), or the
    batch as it is with rl.trim_batches off (one width for every step: fewer programs)."""
    return trim(batch, *multiple) if self.config.rl.trim_batches else batch

  def _metrics(self, out: Rollouts, scored: Mapping[str, Any], adv_stats: Mapping[str, Any],
               upd: Mapping[str, float], crit: Mapping[str, Any], skipped: list[int], step: int,
               pack_stats: dict[str, float], packer: MinibatchPacker | None,
               timing: Mapping[str, float], own: Mapping[str, float]) -> dict[str, float]:
    """Stage 6: the same keys for every run (several roles: the mean over the roles, and each
    role's as "<role>/<name>"), then the critic's, the signals' and the stage's (`own`), and the
    method's."""
    config, roles, first = self.config, self.stage.roles, self.stage.roles[0]
    batches, engine = out.batches, out.engine
    # One program per role and width: the valid tokens and the sampler-vs-trainer gap.
    sums = to_host([_batch_sums(batches[r].logprobs, scored[r].old_logp, batches[r].loss_mask,
                                batches[r].valid) for r in roles])
    valid_tokens = float(sum(s.pop("valid_tokens") for s in sums))
    # Real tokens / computed tokens: of the trimmed padded batch, and of what the policy's
    # update computed (its packed rows; the padded batch when rl.pack_tokens is 0).
    padded_efficiency = valid_tokens / max(sum(batches[r].valid.size for r in roles), 1)
    if packer is not None and packer.plans:
      pack_stats.update(packer.stats())
    pack_stats.setdefault("packing_efficiency", padded_efficiency)
    queries, failed = int(engine["search_queries"]), out.search_failed
    updates = step * updates_per_step(config)

    def across_roles(name: str) -> float:
      if not self.multi_role:
        return upd.get(name, 0.0)
      return float(np.mean([upd.get(f"{r}/{name}", 0.0) for r in roles]))

    metrics = {
        **out.summary, **absent_metrics(),
        "search_queries": float(queries), "search_failures": float(failed),
        "search_failure_rate": failed / queries if queries else 0.0,
        "collapse_fraction": float(np.mean([adv_stats[r]["collapse_fraction"] for r in roles])),
        "zero_adv_fraction": float(np.mean([adv_stats[r]["zero_adv_fraction"] for r in roles])),
        "adv_std": float(np.mean([adv_stats[r].get("adv_std", 0.0) for r in roles])),
        "kl": across_roles("kl"), "approx_kl": across_roles("approx_kl"),
        "clip_fraction": across_roles("clip_fraction"), "entropy": across_roles("entropy"),
        "loss": upd.get("loss", 0.0), "grad_norm": upd.get("grad_norm", 0.0),
        "skipped_updates": float(sum(skipped)), "lr": float(_rate(self.schedule, updates)),
        "sampled_tokens_per_s": engine["sampled_tokens"] / max(timing["rollout_s"], 1e-9),
        "tokens_per_s": valid_tokens / max(timing["step_s"], 1e-9), **timing,
        "search_s": engine["search_s"],
        # the rollout engine's decode efficiency (docs/BENCHMARKS.md rollout_mix)
        "useful_row_share": engine["decode_useful_row_steps"]
        / max(engine["decode_row_steps"], 1.0),
        "search_wait_s": engine["search_wait_s"],
        "padded_efficiency": padded_efficiency, **pack_stats, **own}
    if self.multi_role:
      for r in roles:
        metrics.update({f"{r}/{k}": upd.get(f"{r}/{k}", 0.0)
                        for k in ("kl", "approx_kl", "clip_fraction", "entropy", "loss")})
        metrics[f"{r}/lr"] = float(_rate(self.role_schedules[r], updates)) \
            if r in self.role_schedules else metrics["lr"]
    if self.critic is not None:
      metrics.update(self._critic_metrics(crit, updates))
    metrics.update(get_method(config.algorithm).metrics(adv_stats[first]))  # CW-GRPO's fallback
    # The sampler's log-probs against the trainer's scoring pass (agentjax/rl/offpolicy.py):
    # ~0 on CPU in float32; what bf16 kernels or stale parameters open up.
    metrics.update({k: float(np.mean([s[k] for s in sums])) for k in sums[0]})
    if config.rl.off_policy_correction != "none":
      metrics.update({k: across_roles(k) for k in ("offpolicy/weight_mean",
                                                     "offpolicy/capped_share")})
    return metrics

  def _critic_metrics(self, crit: Mapping[str, Any], updates: int) -> dict[str, float]:
    """The critic's update loss and clip fraction (mean over minibatches), its values' fit as
    scored, its gradient norm, rate and skipped updates."""
    summary = crit["summary"]
    return {"critic/value_loss": summary.get("critic/value_loss", 0.0),
            "critic/value_clip_fraction": summary.get("critic/value_clip_fraction", 0.0),
            **{k: float(v) for k, v in crit["fit"].items()},
            "critic/grad_norm": summary.get("grad_norm", 0.0),
            "critic/lr": float(self.critic.schedule(updates)),
            "critic/skipped_updates": float(sum(int(m["skipped"]) for m in crit["per_update"])),
            "critic/policy_frozen": float(crit["policy_frozen"])}
