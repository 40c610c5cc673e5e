"""Optimizer and the guarded update step shared by SFT and RL.

`make_optimizer`: AdamW on a warmup + cosine schedule after global-norm clipping.
`make_guarded_step`: one jitted update (params and optimizer state donated) that skips a step whose
loss, gradients or updated parameters are not finite, leaving params and optimizer state as they
were, and reports it in metrics["skipped"].
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec


def make_schedule(lr: float, warmup_steps: int, total_steps: int,
                  final_lr_ratio: float = 0.1) -> optax.Schedule:
  """Linear warmup from 0 to lr over warmup_steps, then cosine decay to lr * final_lr_ratio at
  total_steps (held there after)."""
  warmup_steps = max(0, int(warmup_steps))
  total_steps = max(int(total_steps), warmup_steps + 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=lr, warmup_steps=warmup_steps, decay_steps=total_steps,
      end_value=lr * final_lr_ratio)


def _decay_mask(params: Any) -> Any:
  # Decay matrices only: norm scales and biases are not penalized (standard for transformers).
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(lr: float, warmup_steps: int, total_steps: int, weight_decay: float = 0.0,
                   clip_norm: float | None = 1.0, final_lr_ratio: float = 0.1,
                   b2: float = 0.95) -> optax.GradientTransformation:
  """AdamW on the warmup + cosine schedule of `make_schedule`, after global-norm clipping.

  Weight decay applies to matrices only (not norm scales or biases). clip_norm None: no clipping.
  """
  schedule = make_schedule(lr, warmup_steps, total_steps, final_lr_ratio)
  adamw = optax.adamw(schedule, b1=0.9, b2=b2, weight_decay=weight_decay, mask=_decay_mask)
  if clip_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(clip_norm), adamw)


def make_adapter_optimizer(lrs: Mapping[str, float], warmup_steps: int, total_steps: int,
                           weight_decay: float = 0.0, clip_norm: float | None = 1.0,
                           final_lr_ratio: float = 0.1, b2: float = 0.95,
                           frozen: tuple[str, ...] = (), clip_each: bool = False
                           ) -> optax.GradientTransformation:
  """AdamW per LoRA adapter, each on its own learning rate (`lrs`: adapter name -> peak lr), for
  params {name: adapter tree}; the same warmup + cosine shape and betas for all.

  Gradients are clipped by their global norm over every adapter first (one clip, as for a
  full model), then each adapter's AdamW applies its own schedule (optax.multi_transform).
  clip_each: each adapter's gradient is clipped by its own norm instead (adapters trained by
  different roles' losses, e.g. DAC's searcher and generator: one role's large gradient then
  does not shrink the other's step).
  Adapters in `frozen` (held by the model but not trained by this run) get no update at all:
  not even AdamW's weight decay, which would otherwise shrink them at every step."""
  def adamw(lr):
    opt = optax.adamw(make_schedule(lr, warmup_steps, total_steps, final_lr_ratio), b1=0.9,
                      b2=b2, weight_decay=weight_decay, mask=_decay_mask)
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt) \
        if clip_each and clip_norm is not None else opt

  transforms = {name: optax.set_to_zero() if name in frozen else adamw(lr)
                for name, lr in lrs.items()}
  # A prefix of the params' tree labels each adapter's whole subtree with its name.
  per_adapter = optax.multi_transform(transforms, {name: name for name in lrs})
  if clip_norm is None or clip_each:
    return per_adapter
  return optax.chain(optax.clip_by_global_norm(clip_norm), per_adapter)


def all_finite(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def make_guarded_step(loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
                      optimizer: optax.GradientTransformation, *, with_grad: bool = False):
  """A jitted `step(params, opt_state, batch, *frozen) -> (params, opt_state, metrics)`.

  loss_fn(params, batch, *frozen) -> (loss, metrics); `frozen` (e.g. a LoRA run's backbone) is
  read, not differentiated, not donated. params and opt_state are donated (do not reuse the
  arguments). metrics gain loss, grad_norm (before clipping) and skipped (1 when the step was
  dropped because the loss, the gradients or the new parameters were not all finite; the new
  parameters are checked too: a finite gradient times a huge step can overflow).
  with_grad: loss_fn already returns ((loss, metrics), grads), e.g. gradients accumulated over
  micro-batches (agentjax/rl/microbatch.accumulate).
  """
  value_and_grad = loss_fn if with_grad else jax.value_and_grad(loss_fn, has_aux=True)

  def step(params, opt_state, batch, *frozen):
    (loss, metrics), grads = value_and_grad(params, batch, *frozen)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    ok = jnp.isfinite(loss) & all_finite(grads) & all_finite(new_params)

    def keep_if_ok(new, old):
      return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)

    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                   skipped=jnp.logical_not(ok).astype(jnp.int32))
    return keep_if_ok(new_params, params), keep_if_ok(new_opt_state, opt_state), metrics

  return jax.jit(step, donate_argnums=(0, 1))


def opt_state_shardings(optimizer: optax.GradientTransformation, params: Any,
                        shardings: Any, mesh: jax.sharding.Mesh) -> Any:
  """Optimizer-state shardings: moments like their parameters (`shardings`, a tree like params:
  FSDP by the rules table), counters replicated."""
  replicated = NamedSharding(mesh, PartitionSpec())
  abstract = jax.eval_shape(optimizer.init, params)
  # multi_transform (one AdamW per LoRA adapter) masks the other adapters' subtrees out of each
  # inner state with a MaskedNode: it stays a MaskedNode, not a subtree of shardings.
  masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  return optax.tree_map_params(optimizer, lambda p, s: p if masked(p) else s, abstract, shardings,
                               transform_non_params=lambda _: replicated, is_leaf=masked)
