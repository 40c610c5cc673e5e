"""The RL step's advantages and updates (stages 4 and 5): the estimator of config.algorithm on
a scored batch, the minibatches, and the PPO-clip update of one policy (make_policy_update) or of
several LoRA roles at once (make_roles_update).

    adv, stats = compute_advantages("igpo", batch, outcome, scored.ig)     # advantages [B, S]
    for mb in minibatches(batch, scored, adv, size, rng):                  # PPO-clip minibatches
      params, opt_state, m = update(params, opt_state, mb)

The update skips a step whose loss or gradient is not finite and leaves params and optimizer
state untouched. With `micro_batch` the update sums the micro-batches' gradients and applies one
step (microbatch.py). Packed minibatches (`minibatches(..., packer=MinibatchPacker(...))`,
train/packing.py) carry the maps of their packed rows: the update's forward runs on them and
unpacks the log-probs to [b, S] before the unchanged loss, so loss, metrics and gradients are the
padded update's (the unpack's gradient is a scatter-add).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentjax.agent.rollout import TrajectoryBatch
from agentjax.methods import get_method
from agentjax.models import masks
from agentjax.models.logprobs import packed_logprobs, sequence_logprobs
from agentjax.models.lora import attach, frozen_backbone
from agentjax.models.qwen import Qwen
from agentjax.parallel.host import to_host
from agentjax.rl.advantages import get_advantage_estimator
from agentjax.rl.losses import get_policy_loss, loss_totals
from agentjax.rl.microbatch import accumulate
from agentjax.rl.offpolicy import importance_weights
from agentjax.train.optim import make_guarded_step
from agentjax.train.packing import PACK_SEGMENT_IDS, MinibatchPacker, PackIndex
from agentjax.train.scoring import ScoredBatch


def compute_advantages(name: str, batch: TrajectoryBatch, outcome: np.ndarray, ig: jax.Array,
                       extra: Mapping[str, jax.Array] | None = None,
                       **kwargs: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Step 4: per-token advantages [B, S] with the estimator named in config (registry).

  extra: more per-batch fields from earlier stages (CW-GRPO's retrieval_scores and
  thinking_scores [B, T] from the judge pass); an estimator that does not take one ignores it.
  One jitted program per (estimator, settings, shapes), not one eager op per primitive."""
  # NumPy fields go in as they are: jnp.asarray would compile a copy program for each.
  fields = dict(outcome=np.asarray(outcome, np.float32),
                group_ids=np.asarray(batch.group_ids, np.int32),
                loss_mask=batch.loss_mask, turn_id=batch.turn_id,
                num_turns=np.asarray(batch.num_turns, np.int32), ig=ig, **(extra or {}))
  return _advantages(name, tuple(sorted(kwargs.items())), fields)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _advantages(name, kwargs, fields):
  return get_advantage_estimator(name)(**fields, **dict(kwargs))


def advantage_kwargs(config: Any) -> dict[str, Any]:
  """The configuration keywords of the estimator of `config.algorithm`, for
  `compute_advantages`: its registry entry's settings (agentjax/methods: IGPO's turn discount,
  normalization pool and weights; CW-GRPO's cw.*; PPO's ppo.*; rl.std_estimator and rl.std_eps
  for the estimators that divide by a group std)."""
  return get_method(config.algorithm).settings(config)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  name: str = "ppo"                     # registry: ppo | gspo
  kwargs: tuple[tuple[str, Any], ...] = ()  # e.g. (("clip_high", 0.28), ("kl_coef", 1e-3))
  entropy: bool = False                 # compute the entropy (needed for an entropy bonus)
  chunk: int = 256
  # [B, L] minibatch fields passed to the loss as keywords (a method's loss_inputs).
  inputs: tuple[str, ...] = ()
  # rl.off_policy_correction / rl.off_policy_cap (agentjax/rl/offpolicy.py): with a correction
  # the minibatch carries the sampler's log-probs ("behav_logp").
  correction: str = "none"
  correction_cap: float = 2.0

  def as_kwargs(self) -> dict[str, Any]:
    return dict(self.kwargs)


def policy_loss_config(config: Any, norm_length: int | None = None) -> PolicyLossConfig:
  """The policy loss of config.rl (its clip range, KL, entropy bonus and aggregation), the
  entropy computed. norm_length: Dr.GRPO's constant normalizer (default: the rollout budget
  rollout.max_total_tokens, not a batch's trimmed width)."""
  rl = config.rl
  kwargs = dict(clip_low=rl.clip_low, clip_high=rl.clip_high, kl_coef=rl.kl_coef,
                kl_estimator=rl.kl_estimator, entropy_coef=rl.entropy_coef,
                aggregation=rl.aggregation,
                norm_length=norm_length or config.rollout.max_total_tokens)
  return PolicyLossConfig(name=rl.loss, kwargs=tuple(sorted(kwargs.items())), entropy=True,
                          chunk=rl.chunk,
                          inputs=get_method(config.algorithm).loss_inputs_for(config),
                          # .get: configs recorded before these fields existed
                          correction=rl.off_policy_correction,
                          correction_cap=float(rl.off_policy_cap))


def role_objective(model: Qwen, loss: PolicyLossConfig):
  """loss(params, minibatch, totals=None) -> (value, metrics) of the policy loss on one
  minibatch; `params` are the model's (a LoRA model's with its adapter selected). totals: the
  losses.loss_totals of the minibatch `minibatch` is a micro-batch of (its share is returned).
  A minibatch with MinibatchPacker's maps runs its forward on packed rows."""
  loss_fn = get_policy_loss(loss.name)
  kwargs = loss.as_kwargs()
  use_ref = kwargs.get("kl_coef", 0.0) > 0

  def objective(params, mb, totals=None):
    if PACK_SEGMENT_IDS in mb:  # packed rows (MinibatchPacker): forward on them, loss on [b, S]
      index = PackIndex.from_arrays(mb)
      positions = index.pack(masks.positions_from_padding(mb["valid"]))
      logp, ent = packed_logprobs(model, params, index.pack(mb["tokens"]), positions,
                                  index.segment_ids, chunk=loss.chunk, with_entropy=loss.entropy)
      logp, ent = index.unpack(logp), (None if ent is None else index.unpack(ent))
    else:
      logp, ent = sequence_logprobs(model, params, mb["tokens"], mb["valid"], chunk=loss.chunk,
                                    with_entropy=loss.entropy)
    if loss.correction == "none":
      return loss_fn(logp, mb["old_logp"], mb["advantages"], mb["loss_mask"],
                     ref_logp=mb["ref_logp"] if use_ref else None, entropy=ent, totals=totals,
                     **{k: mb[k] for k in loss.inputs}, **kwargs)
    weights, stats = importance_weights(mb["old_logp"], mb["behav_logp"], mb["loss_mask"],
                                        loss.correction, loss.correction_cap)
    value, metrics = loss_fn(logp, mb["old_logp"], mb["advantages"], mb["loss_mask"],
                             ref_logp=mb["ref_logp"] if use_ref else None, entropy=ent,
                             totals=totals, token_weights=weights,
                             **{k: mb[k] for k in loss.inputs}, **kwargs)
    if totals is not None:  # a micro-batch's share of the minibatch's token means
      share = jnp.sum(jnp.asarray(mb["loss_mask"]).astype(bool)) / jnp.maximum(
          totals["tokens"], 1.0)
      stats = {k: v * share for k, v in stats.items()}
    return value, {**metrics, **stats}

  return objective


def _minibatch_totals(mb: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  return loss_totals(mb["loss_mask"])


def make_policy_update(model: Qwen, optimizer: optax.GradientTransformation,
                       loss: PolicyLossConfig = PolicyLossConfig(), policy: str | None = None,
                       micro_batch: int = 0, grad_shardings: Any = None):
  """Step 5: a jitted update on one minibatch (params and optimizer state donated).

  minibatch: dict of [b, S] arrays tokens, valid, loss_mask, old_logp, ref_logp, advantages.
  Returns (params, opt_state, metrics); a non-finite loss, gradient or update skips the step
  (metrics["skipped"] = 1) and returns params and opt_state unchanged (optim.make_guarded_step).

  A LoRA model (model.lora set): `update(adapters, opt_state, minibatch, backbone)`, params are
  the adapters {name: tree} and the frozen backbone is an argument; the loss runs adapter
  `policy` (default: the first of model.lora.names). Gradients and optimizer state then exist
  for the adapters only.

  micro_batch: rows per forward/backward over all devices (microbatch.global_micro; 0: the
  whole minibatch in one pass). The gradients of the micro-batches are summed in float32 (in
  grad_shardings, a tree of shardings like params, when given) and ONE guarded optimizer step is
  applied; loss, metrics and gradients are those of the one-pass update (the loss's
  normalizers are the whole minibatch's, rl/losses.loss_totals).
  """
  role_loss = role_objective(model, loss)
  spec = model.lora
  active = None if spec is None else (policy or spec.policy)

  def objective(params, mb, *backbone, totals=None):
    if spec is not None:
      params = attach(frozen_backbone(backbone, "make_policy_update"), params, spec, active)
    return role_loss(params, mb, totals)

  if not micro_batch:
    return make_guarded_step(objective, optimizer)
  partial = lambda params, mb, totals, *backbone: objective(  # noqa: E731
      params, mb, *backbone, totals=totals)
  return make_guarded_step(accumulate(partial, _minibatch_totals, micro_batch,
                                      grad_shardings=grad_shardings), optimizer, with_grad=True)


def make_roles_update(model: Qwen, optimizer: optax.GradientTransformation,
                      losses: Mapping[str, PolicyLossConfig], micro_batch: int = 0,
                      grad_shardings: Any = None):
  """One jitted update of several LoRA adapters, each on its own role's minibatch (DAC: the
  searcher's trajectories and the generator's answers):

      update(adapters, opt_state, {role: minibatch}, backbone) -> (adapters, opt_state, metrics)

  losses: {role: its policy loss} (the role's adapter has that name). The objective is the sum
  of the roles' losses, each with its adapter selected; the adapters share no parameter, so each
  gets exactly its own role's gradient (and, with optim.make_adapter_optimizer, its own AdamW).
  metrics: each role's as "<role>/<name>", plus the sum's loss, grad_norm and skipped (a
  non-finite role skips the whole update).

  micro_batch, grad_shardings: as make_policy_update's; each role's minibatch is cut into its
  own micro-batches of micro_batch rows (the roles' minibatches may differ in size), each
  role's gradient accumulated over its own, and one step applied to the sum."""
  spec = model.lora
  roles = tuple(losses)
  if spec is None or any(r not in spec.names for r in roles):
    raise ValueError(f"make_roles_update needs a LoRA model with adapters {list(roles)}; got "
                     f"{None if spec is None else list(spec.names)}")
  role_losses = {role: role_objective(model, loss) for role, loss in losses.items()}

  if micro_batch:
    def role_partial(role):
      def partial(params, mb, totals, *backbone):
        backbone = frozen_backbone(backbone, "make_roles_update")
        return role_losses[role](attach(backbone, params, spec, role), mb, totals)
      return accumulate(partial, _minibatch_totals, micro_batch, grad_shardings=grad_shardings)

    role_grads = {role: role_partial(role) for role in roles}

    def value_and_grad(params, mbs, *backbone):
      total, metrics, grads = 0.0, {}, None
      for role in roles:  # the adapters share no parameter: the sum's gradient is the sum
        (value, m), g = role_grads[role](params, mbs[role], *backbone)
        total = total + value
        metrics.update({f"{role}/{k}": v for k, v in m.items()})
        metrics[f"{role}/loss"] = value
        grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
      return (total, metrics), grads

    return make_guarded_step(value_and_grad, optimizer, with_grad=True)

  def objective(params, mbs, *backbone):
    backbone = frozen_backbone(backbone, "make_roles_update")
    total, metrics = 0.0, {}
    for role in roles:
      value, m = role_losses[role](attach(backbone, params, spec, role), mbs[role])
      total = total + value
      metrics.update({f"{role}/{k}": v for k, v in m.items()})
      metrics[f"{role}/loss"] = value
    return total, metrics

  return make_guarded_step(objective, optimizer)


# A minibatch's fields, named here once: what every policy update reads ([B, L] each), what the
# off-policy correction adds (the sampler's log-probs), and what the critic's update reads. The
# step cuts these (and a method's per-token inputs) and the fit check compiles them.
POLICY_MINIBATCH = ("tokens", "valid", "loss_mask", "old_logp", "ref_logp", "advantages")
OFF_POLICY_MINIBATCH = ("behav_logp",)
CRITIC_MINIBATCH = ("tokens", "valid", "old_values", "returns", "value_mask")


def policy_minibatch_keys(config: Any) -> tuple[str, ...]:
  """The minibatch fields every policy update reads: POLICY_MINIBATCH, and OFF_POLICY_MINIBATCH
  when rl.off_policy_correction weighs the loss by the sampler's log-probs."""
  return POLICY_MINIBATCH + (OFF_POLICY_MINIBATCH if config.rl.off_policy_correction != "none"
                             else ())


def minibatches(batch: TrajectoryBatch, scored: ScoredBatch, advantages: jax.Array,
                size: int, rng: np.random.Generator,
                extra: Mapping[str, jax.Array] | None = None,
                packer: MinibatchPacker | None = None,
                keys: Sequence[str] | None = None) -> list[dict[str, jax.Array]]:
  """Shuffled minibatches of `size` trajectories (the last partial one is dropped).

  extra: more [B, ...] arrays cut the same way (the critic's old_values, returns, value_mask).
  packer: with it, each minibatch's trajectories are reordered within it and it carries the
  maps of its packed rows (PACK_KEYS); the update then runs its forward on those rows.
  keys: the fields to cut (default: every policy field, the off-policy one and `extra`)."""
  arrays = dict(tokens=batch.tokens, valid=batch.valid, loss_mask=batch.loss_mask,
                old_logp=scored.old_logp, ref_logp=scored.ref_logp, advantages=advantages,
                behav_logp=batch.logprobs, **(extra or {}))
  if keys is not None:
    arrays = {k: arrays[k] for k in dict.fromkeys(keys)}
  order = rng.permutation(batch.tokens.shape[0])
  out = []
  for start in range(0, len(order) - size + 1, size):
    idx, packed = order[start:start + size], {}
    if packer is not None:
      idx, packed = packer(idx)
    out.append({**_take_rows(arrays, np.asarray(idx, np.int32)), **packed})
  return out


@jax.jit
def _take_rows(arrays: dict, idx: jax.Array) -> dict:
  # One program per batch shape for every field (eager indexing compiled a gather per dtype).
  return {k: v[idx] for k, v in arrays.items()}


def summarize(metrics: list[Mapping[str, jax.Array]]) -> dict[str, float]:
  """Mean of each metric over the minibatches whose update was applied (a skipped update's loss
  and gradient norm are not finite); "skipped" is the fraction of updates skipped."""
  if not metrics:
    return {}
  host = to_host(metrics)
  applied = [m for m in host if not m.get("skipped", 0)] or host
  out = {k: float(np.mean([m[k] for m in applied])) for k in host[0]}
  if "skipped" in host[0]:
    out["skipped"] = float(np.mean([m["skipped"] for m in host]))
  return out


__all__ = ["CRITIC_MINIBATCH", "OFF_POLICY_MINIBATCH", "POLICY_MINIBATCH", "PolicyLossConfig",
           "advantage_kwargs", "compute_advantages", "make_policy_update",
           "make_roles_update", "minibatches", "policy_loss_config", "policy_minibatch_keys",
           "summarize"]
