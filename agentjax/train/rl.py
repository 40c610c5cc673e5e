"""One RL step for search agents: rollouts -> rewards -> one scoring pass -> advantages -> update.

    batch, metrics = engine.run(params, questions, rng)                    # 1. rollouts
    outcome = outcome_rewards(batch.answers, golds, ...)                   # 2. rewards (host)
    scored = score_batch(model, params, ref_params, batch, probes)         # 3. old/ref log-probs + IG
    adv, stats = compute_advantages("igpo", batch, outcome, scored.ig)     # 4. advantages
    params, opt_state, m = update(params, opt_state, minibatch)           # 5. PPO-clip minibatches

Each piece is a pure function over arrays; the trainer (a later part of this folder) strings them
together, logs, checkpoints and evaluates. The update skips a step whose loss or gradient is not
finite and leaves params and optimizer state untouched. With `micro_batch` (rl.micro_batch_size x
the batch's devices) scoring and updates run that many rows per forward/backward, with the same
results: the update sums the micro-batches' gradients and applies one step (microbatch.py).

Padding-free (rl.pack_tokens > 0; train/packing.py): scoring runs on packed rows
(`plan_scoring` on the host, then `score_batch(..., packing=plans)`), and each minibatch carries
the maps of its packed rows (`minibatches(..., packer=MinibatchPacker(...))`): the update's
forward runs on them and unpacks the log-probs to [b, S] before the unchanged loss, so loss,
metrics and gradients are the padded update's (the unpack's gradient is a scatter-add).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentjax.agent.rollout import TrajectoryBatch
from agentjax.models import masks
from agentjax.models.logprobs import packed_logprobs, sequence_logprobs
from agentjax.rl.offpolicy import importance_weights
from agentjax.models.lora import attach, frozen_backbone
from agentjax.models.qwen import Qwen
from agentjax.parallel.host import to_host
from agentjax.methods import get_method
from agentjax.rl.advantages import get_advantage_estimator
from agentjax.rl.info_gain import Probes, probe_keep, score_packed, score_packed_rows
from agentjax.rl.losses import get_policy_loss, loss_totals
from agentjax.rl.microbatch import accumulate, map_micro, num_micro
from agentjax.train.optim import make_guarded_step
from agentjax.train.packing import (PackIndex, PackPlan, micro_batch_order, plan_micro_packing,
                                    plan_packing)


@flax.struct.dataclass
class ScoredBatch:
  old_logp: jax.Array   # [B, S] current policy's log-probs of the trajectory tokens
  ref_logp: jax.Array   # [B, S] reference policy's (zeros when no reference is used)
  values: jax.Array     # [B, T] ground-truth value at each boundary (IGPO)
  ig: jax.Array         # [B, T] information gain of each non-answer turn


@dataclasses.dataclass(frozen=True)
class ScorePlans:
  """Where the scoring passes put each token when packed (host; `plan_scoring`).

  plain: the trajectories' real tokens (the reference's pass, and the policy's without probes);
  probes: each trajectory followed by the probes of its live boundaries (IGPO's policy pass).
  Either is None when no pass needs it."""

  plain: PackPlan | None
  probes: PackPlan | None

  def stats(self) -> dict[str, float]:
    """score_packing_efficiency: real / computed slots over the packed passes."""
    plans = [p for p in (self.plain, self.probes) if p is not None]
    real = sum(p.real_tokens for p in plans)
    return {"score_packing_efficiency": real / max(sum(p.source.size for p in plans), 1)}


# Room a probe pass's rows get on top of pack_tokens: T * K * A probe slots rounded up to this, so
# that a trajectory of pack_tokens and all its probes share one row (few distinct widths).
PROBE_ROOM_MULTIPLE = 128


def plan_scoring(valid: np.ndarray, num_turns: np.ndarray, num_boundaries: int,
                 probes: Probes | None, pack_tokens: int, *, reference: bool = True,
                 row_multiple: int = 1) -> ScorePlans:
  """The packed rows of score_batch's passes (host, first-fit-decreasing: packing.plan_packing).

  Args:
    valid: [B, S] bool (host) real tokens, each row's a prefix when probes are given.
    num_turns: [B]; num_boundaries: T = turn_ends.shape[1] - 1.
    probes: IGPO's (None: the policy's pass is plain).
    pack_tokens: tokens per packed row (rl.pack_tokens); the probe pass's rows are wider by
      T * K * A rounded up to PROBE_ROOM_MULTIPLE. A longer item widens its batch's rows to the
      next power-of-two multiple (packing.width_ladder).
    reference: whether a reference pass runs (a plain plan is needed even with probes).
    row_multiple: the number of rows is a multiple of it (the global micro-batch, else the
      devices the rows are sharded over).
  """
  valid = np.asarray(valid, bool)
  plain = plan_packing(valid, pack_tokens, row_multiple=row_multiple) \
      if probes is None or reference else None
  probe_plan = None
  if probes is not None:
    _, k, a = probes.tokens.shape
    room = -(-(num_boundaries * k * a) // PROBE_ROOM_MULTIPLE) * PROBE_ROOM_MULTIPLE
    keep = probe_keep(valid, np.asarray(num_turns), num_boundaries, probes.valid)
    probe_plan = plan_packing(keep, pack_tokens + room, row_multiple=row_multiple)
  return ScorePlans(plain=plain, probes=probe_plan)


def score_batch(model: Qwen, params: Any, ref_params: Any | None, batch: TrajectoryBatch,
                probes: Probes | None, mode: str = "log_prob", chunk: int = 256,
                ref_model: Qwen | None = None, micro_batch: int = 0,
                packing: ScorePlans | None = None) -> ScoredBatch:
  """Step 3: the policy's log-probs and IGPO's probes in ONE packed pass; the reference's log-probs
  in a plain pass (no probes needed). Without probes (GRPO family) the policy pass is plain too.

  ref_model: the reference's module when it is not `model` (a LoRA run: the policy is
  Qwen(cfg, lora=...), the reference the bare backbone Qwen(cfg) with the same arrays).
  micro_batch: rows per forward over all devices (microbatch.global_micro; 0: the whole batch
  at once); each pass is one program looping over the slices, the same numbers either way.
  packing: plan_scoring(...) of this batch and probes: every pass runs on packed rows
  (micro_batch then counts packed rows), the same numbers as the padded passes."""
  if packing is not None:
    return _score_packed_batch(model, params, ref_params, batch, probes, mode, chunk,
                               ref_model, micro_batch, packing)
  tokens, valid = batch.tokens, batch.valid
  num_turns = jnp.asarray(batch.num_turns)
  t = batch.turn_ends.shape[1] - 1
  if probes is not None:
    packed = _packed_scores(model, params, tokens, valid, jnp.asarray(batch.turn_ends), num_turns,
                            jnp.asarray(probes.tokens), jnp.asarray(probes.score),
                            jnp.asarray(probes.valid), jnp.asarray(probes.alias_valid),
                            mode=mode, chunk=chunk, micro_batch=micro_batch)
    old, values, ig = packed.token_logprobs, packed.values, packed.info_gain
  else:
    old = _plain_logprobs(model, params, tokens, valid, chunk, micro_batch)
    values = ig = jnp.zeros((tokens.shape[0], t), jnp.float32)
  ref = _plain_logprobs(ref_model or model, ref_params, tokens, valid, chunk, micro_batch) \
      if ref_params is not None else jnp.zeros_like(old)
  return ScoredBatch(old_logp=old, ref_logp=ref, values=values, ig=ig)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _plain_logprobs(model, params, tokens, valid, chunk, micro_batch=0):
  return map_micro(lambda t, v: sequence_logprobs(model, params, t, v, chunk=chunk)[0],
                   micro_batch, tokens, valid)


def _score_packed_batch(model, params, ref_params, batch, probes, mode, chunk, ref_model,
                        micro_batch, plans: ScorePlans) -> ScoredBatch:
  """score_batch on the packed rows of `plans`."""
  tokens, valid = batch.tokens, batch.valid
  num_turns = jnp.asarray(batch.num_turns)
  t = batch.turn_ends.shape[1] - 1
  plain = None if plans.plain is None else plans.plain.index()  # one transfer for both passes
  if probes is not None:
    if plans.probes is None:
      raise ValueError("score_batch: probes given but plan_scoring(...) planned none")
    scores = score_packed_rows(model, params, plans.probes.index(), tokens, valid,
                               jnp.asarray(batch.turn_ends), num_turns, jnp.asarray(probes.tokens),
                               jnp.asarray(probes.score), jnp.asarray(probes.valid),
                               jnp.asarray(probes.alias_valid), mode=mode, chunk=chunk,
                               micro_batch=micro_batch)
    old, values, ig = scores.token_logprobs, scores.values, scores.info_gain
  else:
    old = _packed_plain_logprobs(model, params, tokens, valid, plain, chunk=chunk,
                                 micro_batch=micro_batch)
    values = ig = jnp.zeros((tokens.shape[0], t), jnp.float32)
  if ref_params is None:
    ref = jnp.zeros_like(old)
  else:
    if plain is None:
      raise ValueError("score_batch: a reference pass but plan_scoring(..., reference=False)")
    ref = _packed_plain_logprobs(ref_model or model, ref_params, tokens, valid, plain,
                                 chunk=chunk, micro_batch=micro_batch)
  return ScoredBatch(old_logp=old, ref_logp=ref, values=values, ig=ig)


@functools.partial(jax.jit, static_argnames=("model", "chunk", "micro_batch"))
def _packed_plain_logprobs(model, params, tokens, valid, index: PackIndex, *, chunk,
                           micro_batch):
  """sequence_logprobs of [B, S] tokens computed on index's packed rows ([R, W], micro_batch
  rows per forward) -> [B, S]."""
  positions = index.pack(masks.positions_from_padding(valid))
  logp = map_micro(lambda tok, pos, seg: packed_logprobs(model, params, tok, pos, seg,
                                                         chunk=chunk)[0],
                   micro_batch, index.pack(tokens), positions, index.segment_ids)
  return index.unpack(logp)


@functools.partial(jax.jit, static_argnames=("model", "mode", "chunk", "micro_batch"))
def _packed_scores(model, params, *rows, mode, chunk, micro_batch):
  """score_packed over [B, ...] rows (tokens, valid, turn_ends, num_turns, probe arrays) in
  slices of micro_batch rows; every output is per row."""
  return map_micro(lambda *r: score_packed(model, params, *r, mode=mode, chunk=chunk),
                   micro_batch, *rows)


def trim(batch: TrajectoryBatch, multiple: int = 128) -> TrajectoryBatch:
  """The batch cut to its longest trajectory, rounded up to `multiple` slots.

  Rollouts fill a KV cache sized for the worst case (a power of two); scoring and updates only
  need the slots some row uses, and rounding keeps the number of compiled shapes small
  (cache_len / multiple at most)."""
  cache_len = batch.tokens.shape[1]
  used = int(np.max(batch.turn_ends)) if batch.turn_ends.size else cache_len
  width = min(cache_len, max(multiple, -(-used // multiple) * multiple))
  if width == cache_len:
    return batch
  cut = lambda x: x[:, :width]  # noqa: E731
  return batch.replace(tokens=cut(batch.tokens), positions=cut(batch.positions),
                       valid=cut(batch.valid), loss_mask=cut(batch.loss_mask),
                       logprobs=cut(batch.logprobs), turn_id=cut(batch.turn_id),
                       versions=cut(batch.versions))


def compute_advantages(name: str, batch: TrajectoryBatch, outcome: np.ndarray, ig: jax.Array,
                       extra: Mapping[str, jax.Array] | None = None,
                       **kwargs: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Step 4: per-token advantages [B, S] with the estimator named in config (registry).

  extra: more per-batch fields from earlier stages (CW-GRPO's retrieval_scores and
  thinking_scores [B, T] from the judge pass); an estimator that does not take one ignores it.
  One jitted program per (estimator, settings, shapes), not one eager op per primitive."""
  fields = dict(outcome=jnp.asarray(outcome, jnp.float32), group_ids=jnp.asarray(batch.group_ids),
                loss_mask=batch.loss_mask, turn_id=batch.turn_id,
                num_turns=jnp.asarray(batch.num_turns), ig=ig, **(extra or {}))
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


def _role_objective(model: Qwen, loss: PolicyLossConfig):
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
  role_loss = _role_objective(model, loss)
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
  role_losses = {role: _role_objective(model, loss) for role, loss in losses.items()}

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


# The key of a packed minibatch's segment ids (PackIndex.arrays): its presence selects the packed
# forward in the update.
PACK_SEGMENT_IDS = "pack_segment_ids"
# What MinibatchPacker adds to a minibatch: PackIndex.arrays()'s keys, one per map.
PACK_KEYS = tuple(f"pack_{f.name}" for f in dataclasses.fields(PackIndex)
                  if f.metadata.get("pytree_node", True))


@dataclasses.dataclass
class MinibatchPacker:
  """Plans each minibatch's packed rows on the host (train/packing.py), for `minibatches`.

  valid: [B, S] bool, the batch's real tokens (host: one transfer per step).
  pack_tokens: tokens per packed row (rl.pack_tokens).
  micro_batch: the update's rows per pass (0: one pass): the minibatch is reordered so that its
    strided micro-batches carry balanced token counts (packing.micro_batch_order) and each
    micro-batch is packed on its own (plan_micro_packing), as microbatch.split will cut it.
  row_multiple: each micro-batch's packed row count is a multiple of it (the devices the rows
    are sharded over).
  plans: every plan made, in order (packing_efficiency)."""

  valid: np.ndarray
  pack_tokens: int
  micro_batch: int = 0
  row_multiple: int = 1
  plans: list[PackPlan] = dataclasses.field(default_factory=list)

  def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, dict[str, jax.Array]]:
    """idx [b] (the minibatch's trajectories) -> (idx reordered, the packed rows' maps
    ({PACK_KEYS}: [n * R_m, W] and [b, ...] arrays, split by microbatch.split like the rest))."""
    keep = self.valid[idx]
    n = num_micro(len(idx), self.micro_batch)
    if n > 1:  # the order does not change the loss: every aggregation sums over trajectories
      idx = idx[micro_batch_order(keep.sum(axis=1), n)]
      keep = self.valid[idx]
    plan = plan_micro_packing(keep, self.pack_tokens, n, row_multiple=self.row_multiple)
    self.plans.append(plan)
    return idx, plan.index().arrays()

  def stats(self) -> dict[str, float]:
    """packing_efficiency: real / computed slots over the packed rows of every plan."""
    real = sum(p.real_tokens for p in self.plans)
    return {"packing_efficiency": real / max(sum(p.source.size for p in self.plans), 1)}


def minibatches(batch: TrajectoryBatch, scored: ScoredBatch, advantages: jax.Array,
                size: int, rng: np.random.Generator,
                extra: Mapping[str, jax.Array] | None = None,
                packer: MinibatchPacker | None = None) -> list[dict[str, jax.Array]]:
  """Shuffled minibatches of `size` trajectories (the last partial one is dropped).

  extra: more [B, ...] arrays cut the same way (the critic's old_values, returns, value_mask).
  packer: with it, each minibatch's trajectories are reordered within it and it carries the
  maps of its packed rows (PACK_KEYS); the update then runs its forward on those rows."""
  arrays = dict(tokens=batch.tokens, valid=batch.valid, loss_mask=batch.loss_mask,
                old_logp=scored.old_logp, ref_logp=scored.ref_logp, advantages=advantages,
                behav_logp=batch.logprobs, **(extra or {}))
  order = rng.permutation(batch.tokens.shape[0])
  out = []
  for start in range(0, len(order) - size + 1, size):
    idx, packed = order[start:start + size], {}
    if packer is not None:
      idx, packed = packer(idx)
    idx = jnp.asarray(idx)
    out.append({**{k: v[idx] for k, v in arrays.items()}, **packed})
  return out


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
