"""DAC's rollout stage of the RL step (train/step.RLStep): the two-role rollout, its labels and
both roles' rewards, and the "dac/..." metrics.

    stage = DacRollout(agent)                       # agent: roles.DacAgent
    rl_step = RLStep.build(config, mesh, stage, optimizer, ref_params, target, ref_model)

RLStep runs the rest as for any method, per role: each role's old and reference log-probs (the
reference: the backbone, no adapter), its advantages with config.algorithm (the searcher's
grouped by question, the generator's by evidence set or by question: dac.generator_group), and
one update of both adapters per pair of minibatches (train/updates.make_roles_update: each epoch
splits the searcher's E trajectories into E / rl.minibatch_size minibatches and the generator's
E * m answers into as many), each adapter with its own AdamW, rate and gradient clip.

Per step, here:
  1. rollouts: the searcher (group_size per question), hard-positive augmentation, the generator
     (dac.generator_samples answers per evidence set); roles/DacAgent
  2. labels S, C, abstention and the rewards of both roles (host; dac/rewards.py)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from agentjax.agent.rollouts import Rollouts
from agentjax.dac import rewards as R
from agentjax.dac.roles import ROLES, DacAgent, DacBatch, DacSettings
from agentjax.rl import outcome_rewards


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


def role_rewards(out: DacBatch, settings: DacSettings, rl: Any) -> tuple[np.ndarray, np.ndarray]:
  """(generator rewards [E * m], searcher rewards [E]) of a rollout (dac/rewards.py)."""
  m = out.samples
  gen = R.generator_rewards(out.generator.answered, out.abstained, out.correct,
                            np.repeat(out.sufficient, m), settings.alpha,
                            settings.insufficient_answer_penalty,
                            rl.format_penalty if rl.penalize_format else 0.0)
  search = R.searcher_rewards(out.sufficient, out.generator.answered.reshape(-1, m),
                              out.abstained.reshape(-1, m), out.correct.reshape(-1, m),
                              settings.searcher_reward)
  return gen, search


@dataclasses.dataclass
class DacRollout:
  """The rollout stage of a DAC run: two roles, "searcher" and "generator" (LoRA adapters of one
  backbone). agent None: a stage that only describes the roles (the fit check's programs)."""
  agent: DacAgent | None
  roles = ROLES
  probes = False  # outcome advantages per role (config validation: Method.outcome_only)

  def minibatch_rows(self, config: Any, role: str) -> int:
    """A minibatch's trajectories: the generator's pair has m answers per evidence set."""
    m = config.dac.generator_samples
    return config.rl.minibatch_size * (m if role == "generator" else 1)

  def norm_length(self, config: Any, role: str) -> int:
    """Dr.GRPO's constant normalizer: each role's own token budget."""
    return config.dac.generator_max_total_tokens if role == "generator" \
        else config.rollout.max_total_tokens

  def __call__(self, config: Any, params: Mapping[str, Any], questions: Sequence[Mapping],
               rng: jax.Array, step: int, trim: Any) -> Rollouts:
    """Both roles' rollouts (augmentation draws seeded by the step: resumable) and rewards."""
    golds = [q["golden_answers"] for q in questions]
    out, _ = self.agent.run(params, [q["question"] for q in questions], rng, golds=golds,
                            aug_rng=np.random.default_rng([config.seed, step, 2]))
    m = out.samples
    # The generator's width in coarser steps: the update compiles once per pair of widths.
    batches = {"searcher": trim(out.searcher), "generator": trim(out.generator, 256)}
    gen_reward, search_reward = role_rewards(out, self.agent.settings, config.rl)
    if self.agent.settings.generator_group == "question":  # one group per question
      batches["generator"] = batches["generator"].replace(
          group_ids=np.repeat(out.searcher.group_ids, m))
    sb, gb = out.searcher, out.generator
    answers = [a if ok and not ab else None
               for a, ok, ab in zip(gb.answers, gb.answered, out.abstained)]
    row_golds = [golds[g] for g in np.repeat(sb.group_ids, m)]
    f1 = outcome_rewards(answers, row_golds, metric="f1")
    em = outcome_rewards(answers, row_golds, metric="em")
    engine = {k[len("searcher_"):]: v for k, v in out.metrics.items() if k.startswith("searcher_")}
    for k in ("sampled_tokens", "decode_row_steps", "decode_useful_row_steps", "search_wait_s"):
      engine[k] = float(out.metrics.get(f"searcher_{k}", 0.0)) \
          + float(out.metrics.get(f"generator_{k}", 0.0))
    return Rollouts(
        batches=batches, rewards={"searcher": search_reward, "generator": gen_reward},
        # The keys every RL run logs: reward is the generator's, f1/em its answers' (an
        # abstention scores 0), turns the searcher's; sufficiency_rate is S of everything the
        # searcher retrieved (dac/sufficiency_rate: of what the generator was shown).
        summary={"reward": float(gen_reward.mean()), "f1": float(f1.mean()),
                 "em": float(em.mean()),
                 "format_error_rate": float(1.0 - gb.format_valid.mean()),
                 "sufficiency_rate": float(out.retrieved_sufficient.mean()),
                 "answered": float(gb.answered.mean()), "truncated": float(sb.truncated.mean()),
                 "turns": float(sb.num_turns.mean())},
        engine=engine, search_failed=int(sb.num_search_failures.sum()),
        metrics={"dac/searcher_format_error_rate": float(1.0 - sb.format_valid.mean()),
                 "dac/augment_failures": out.metrics["augment_failures"],
                 **dac_metrics(out, gen_reward, search_reward)})


__all__ = ["DacRollout", "dac_metrics", "role_rewards"]
