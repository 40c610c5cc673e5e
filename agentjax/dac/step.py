"""One DAC step: two-role rollouts -> labels and rewards -> scoring -> per-role advantages -> one
update of both adapters per minibatch pair -> metrics.

    dac_step = DacStep.build(config, mesh, agent, optimizer, ref_params, target, ref_model)
    out = dac_step(state, questions, step)   # the same StepOutput as train/step.RLStep

The trainer loop (agentjax/train/trainer.py) is the RL loop: data order, checkpoints, eval,
preemption and the fault rules are the same; only the step differs. Per step:

  1. rollouts: the searcher (group_size per question), hard-positive augmentation, the generator
     (dac.generator_samples answers per evidence set); roles/DacAgent
  2. labels S, C, abstention and the rewards of both roles (host; dac/rewards.py)
  3. old and reference log-probs of each role's tokens (the reference: the backbone, no adapter)
  4. advantages per role with config.algorithm: the searcher's grouped by question, the
     generator's by evidence set (dac.generator_group="evidence") or by question
  5. updates: each epoch splits the searcher's E trajectories into E / rl.minibatch_size
     minibatches and the generator's E * m answers into as many; update k trains both adapters
     on pair k (train/rl.make_roles_update), each with its own AdamW, rate and gradient clip
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import optax

from agentjax.dac import rewards as R
from agentjax.dac.roles import ROLES, DacAgent, DacBatch
from agentjax.parallel import use_mesh
from agentjax.parallel.host import to_host
from agentjax.rl import outcome_rewards
from agentjax.train.adapters import TrainTarget
from agentjax.train.optim import make_schedule
from agentjax.train.rl import (advantage_kwargs, compute_advantages, make_roles_update,
                               minibatches, policy_loss_config, score_batch, summarize, trim)
from agentjax.train.step import StepOutput, micro_batch_rows, schedule_args, updates_per_step


def _share(num: np.ndarray, den: np.ndarray) -> float:
  """sum(num & den) / sum(den), 0 when den is empty."""
  den = np.asarray(den, bool)
  return float((np.asarray(num, bool) & den).sum() / den.sum()) if den.any() else 0.0


def dac_metrics(out: DacBatch, gen_reward: np.ndarray, search_reward: np.ndarray
                ) -> dict[str, float]:
  """The "dac/..." metrics of one two-role rollout (host floats).

  Rates over evidence sets (E) or generator answers (E * m); shares with an empty denominator
  are 0. abstain_precision = P(S = 0 | abstained), abstain_recall = P(abstained | S = 0);
  accuracy_clean / accuracy_augmented: EM accuracy of answers on sufficient sets without / with
  distractors; coverage: the share of answers that are not abstentions (or invalid)."""
  m = out.samples
  suff = np.repeat(out.sufficient, m)
  aug = np.repeat(out.augmented, m)
  answered = out.generator.answered & ~out.abstained
  return {
      "dac/sufficiency_rate": float(out.sufficient.mean()),
      "dac/abstain_rate": float(out.abstained.mean()),
      "dac/abstain_precision": _share(~suff, out.abstained),
      "dac/abstain_recall": _share(out.abstained, ~suff),
      "dac/coverage": float(answered.mean()),
      "dac/accuracy_answered": _share(out.correct, answered),
      "dac/accuracy_clean": _share(out.correct, suff & ~aug),
      "dac/accuracy_augmented": _share(out.correct, suff & aug),
      "dac/augmented_rate": float(out.augmented.mean()),
      "dac/evidence_docs": float(np.mean([len(e) for e in out.evidence])),
      "dac/searcher_turns": float(out.searcher.num_turns.mean()),
      "dac/searcher_reward": float(search_reward.mean()),
      "dac/generator_reward": float(gen_reward.mean()),
      "dac/generator_format_error_rate": float(1.0 - out.generator.format_valid.mean()),
  }


@dataclasses.dataclass
class DacStep:
  """The DAC step of one run; `build` once (it holds the compiled update), call once per step."""
  config: Any
  mesh: jax.sharding.Mesh
  agent: DacAgent
  update: Callable
  ref_params: Any
  ref_model: Any
  schedule: optax.Schedule
  adv_kwargs: Mapping[str, Any]
  target: TrainTarget
  role_schedules: Mapping[str, optax.Schedule]  # each role's learning rate (for logging)
  micro_batch: int = 0  # trajectories per forward/backward over all devices (0: one pass)

  @classmethod
  def build(cls, config: Any, mesh: jax.sharding.Mesh, agent: DacAgent,
            optimizer: optax.GradientTransformation, ref_params: Any, target: TrainTarget,
            ref_model: Any = None) -> "DacStep":
    # Dr.GRPO's constant normalizer: each role's own token budget.
    micro = micro_batch_rows(config, mesh)
    update = make_roles_update(target.model, optimizer, {
        "searcher": policy_loss_config(config, config.rollout.max_total_tokens),
        "generator": policy_loss_config(config, config.dac.generator_max_total_tokens)},
        micro_batch=micro, grad_shardings=target.shardings(mesh) if micro else None)
    return cls(config=config, mesh=mesh, agent=agent, update=update, ref_params=ref_params,
               ref_model=ref_model, schedule=make_schedule(*schedule_args(config)),
               adv_kwargs=advantage_kwargs(config), target=target,
               role_schedules={role: make_schedule(rate, *schedule_args(config)[1:])
                               for role, rate in target.learning_rates(config.optimizer.lr).items()
                               if role in ROLES},
               micro_batch=micro)

  def rewards(self, out: DacBatch) -> tuple[np.ndarray, np.ndarray]:
    """(generator rewards [E * m], searcher rewards [E]) of a rollout (dac/rewards.py)."""
    s, rl = self.agent.settings, self.config.rl
    m = out.samples
    gen = R.generator_rewards(out.generator.answered, out.abstained, out.correct,
                              np.repeat(out.sufficient, m), s.alpha,
                              s.insufficient_answer_penalty,
                              rl.format_penalty if rl.penalize_format else 0.0)
    search = R.searcher_rewards(out.sufficient, out.generator.answered.reshape(-1, m),
                                out.abstained.reshape(-1, m), out.correct.reshape(-1, m),
                                s.searcher_reward)
    return gen, search

  def __call__(self, state: Mapping[str, Any], questions: Sequence[Mapping[str, Any]],
               step: int) -> StepOutput:
    """Step `step` (0-based) on `questions`."""
    config, rl, mesh = self.config, self.config.rl, self.mesh
    t_step = time.perf_counter()
    golds = [q["golden_answers"] for q in questions]
    rng, rollout_rng = jax.random.split(state["rng"])

    # 1. rollouts of both roles (augmentation draws seeded by the step: resumable)
    t0 = time.perf_counter()
    with use_mesh(mesh):
      params = self.target.rollout_params(state["params"])  # {role: backbone + its adapter}
      out, _ = self.agent.run(params, [q["question"] for q in questions], rollout_rng, golds=golds,
                              aug_rng=np.random.default_rng([config.seed, step, 2]))
      # The generator's width in coarser steps: the update compiles once per pair of widths.
      batches = {"searcher": trim(out.searcher), "generator": trim(out.generator, 256)}
    t_rollout = time.perf_counter() - t0
    m = out.samples

    # 2. rewards (host)
    gen_reward, search_reward = self.rewards(out)
    rewards = {"searcher": search_reward, "generator": gen_reward}
    if self.agent.settings.generator_group == "question":  # one group per question
      batches["generator"] = batches["generator"].replace(
          group_ids=np.repeat(out.searcher.group_ids, m))

    # 3. scoring and 4. advantages, per role
    t0 = time.perf_counter()
    scored, adv = {}, {}
    with use_mesh(mesh):
      for role in ROLES:
        b = batches[role]
        scored[role] = score_batch(self.target.model, params[role], self.ref_params, b, None,
                                   chunk=rl.chunk, ref_model=self.ref_model,
                                   micro_batch=self.micro_batch)
        adv[role], _ = compute_advantages(config.algorithm, b, rewards[role], scored[role].ig,
                                          **self.adv_kwargs)
      jax.block_until_ready(adv)
    t_score = time.perf_counter() - t0

    # 5. updates: minibatch k of each role in update k (shuffles seeded by the step)
    t0 = time.perf_counter()
    adapters, opt_state = state["params"], state["opt_state"]
    shuffle = np.random.default_rng([config.seed, step])
    update_metrics = []
    with use_mesh(mesh):
      for _ in range(rl.ppo_epochs):
        pairs = zip(*(minibatches(batches[r], scored[r], adv[r], rl.minibatch_size * (
            m if r == "generator" else 1), shuffle) for r in ROLES))
        for mbs in pairs:
          adapters, opt_state, mets = self.update(adapters, opt_state, dict(zip(ROLES, mbs)),
                                                  *self.target.frozen)
          update_metrics.append(mets)
    update_metrics = to_host(update_metrics)
    upd = summarize(update_metrics)
    skipped = [int(x["skipped"]) for x in update_metrics]
    t_update = time.perf_counter() - t0

    # 6. metrics
    sb, gb = out.searcher, out.generator
    answers = [a if ok and not ab else None
               for a, ok, ab in zip(gb.answers, gb.answered, out.abstained)]
    row_golds = [golds[g] for g in np.repeat(sb.group_ids, m)]
    f1 = outcome_rewards(answers, row_golds, metric="f1")
    em = outcome_rewards(answers, row_golds, metric="em")
    queries = int(out.metrics["searcher_search_queries"])
    failed = int(sb.num_search_failures.sum())
    step_s = time.perf_counter() - t_step
    sampled = out.metrics["searcher_sampled_tokens"] + out.metrics["generator_sampled_tokens"]
    per_role = {f"dac/{role}_{k}": upd.get(f"{role}/{k}", 0.0)
                for role in ROLES for k in ("kl", "clip_fraction", "entropy", "loss")}
    metrics = {
        # The keys every RL run logs, for the loop's progress line and cross-method plots:
        # reward is the generator's, f1/em its answers' (an abstention scores 0), turns the
        # searcher's.
        "reward": float(gen_reward.mean()), "f1": float(f1.mean()), "em": float(em.mean()),
        "format_error_rate": float(1.0 - gb.format_valid.mean()),
        # S of everything the searcher retrieved (as RLStep logs it for a monolithic agent);
        # dac/sufficiency_rate is S of what the generator was shown (the rewards' label).
        "sufficiency_rate": float(out.retrieved_sufficient.mean()),
        "answered": float(gb.answered.mean()), "truncated": float(sb.truncated.mean()),
        "turns": float(sb.num_turns.mean()),
        "search_queries": float(queries), "search_failures": float(failed),
        "search_failure_rate": failed / queries if queries else 0.0,
        "ig_mean": 0.0,
        "kl": float(np.mean([upd.get(f"{r}/kl", 0.0) for r in ROLES])),
        "clip_fraction": float(np.mean([upd.get(f"{r}/clip_fraction", 0.0) for r in ROLES])),
        "loss": upd.get("loss", 0.0), "grad_norm": upd.get("grad_norm", 0.0),
        "skipped_updates": float(sum(skipped)),
        "lr": float(self.schedule(step * updates_per_step(config))),
        "sampled_tokens_per_s": sampled / max(t_rollout, 1e-9),
        "rollout_s": t_rollout, "scoring_s": t_score, "update_s": t_update, "step_s": step_s,
        "search_s": out.metrics["searcher_search_s"],
        "dac/searcher_format_error_rate": float(1.0 - sb.format_valid.mean()),
        "dac/augment_failures": out.metrics["augment_failures"],
        **{f"dac/{role}_lr": float(schedule(step * updates_per_step(config)))
           for role, schedule in self.role_schedules.items()},
        **dac_metrics(out, gen_reward, search_reward), **per_role}
    return StepOutput(state={"params": adapters, "opt_state": opt_state, "rng": rng},
                      metrics=metrics, update_skipped=skipped, search_queries=queries,
                      search_failed=failed,
                      search_last_error=out.metrics.get("searcher_search_last_error"))


__all__ = ["DacStep", "dac_metrics"]
