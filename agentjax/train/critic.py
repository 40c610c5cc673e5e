"""The critic of a PPO run (algorithm ppo | ppo_turn | ppo_round): its value model, optimizer and
the two jitted programs the RL step calls.

    critic = Critic.build(config, target, updates_per_step)          # no arrays
    state["critic"] = critic.init_state(config, policy_params, mesh) # {"params", "opt_state"}
    values = critic.values(state["critic"]["params"], tokens, valid)            # [B, L]
    params, opt_state, m = critic.update(params, opt_state, minibatch)          # one minibatch

The value model is agentjax/models/qwen/value.py's QwenValue (the Qwen trunk and a scalar head on
its final hidden state, verl's critic). What it trains (critic.init):
  full    {"model": trunk params, "score": head}: the policy's initial weights copied (the
          default) or a Hugging Face folder; its own AdamW (critic.lr, critic.weight_decay, ...).
  LoRA    with model.lora.adapters and critic.init "policy": {"adapter": a "value" LoRA adapter,
          "score": head} on the policy's frozen backbone (shared, not copied): the critic then
          costs an adapter and a head, not a second model and its Adam moments.

The critic's updates run on the policy's minibatches (same shuffles), after the policy's; its
loss is agentjax/rl/losses.py's clipped value loss over the slots the estimator gives targets for
(every sampled token, or each turn's first sampled token for ppo_turn). A non-finite loss or
gradient skips the update and keeps the critic (optim.make_guarded_step).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any

import jax
import optax

from agentjax.models import lora as lora_lib
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import QwenConfig, adapter_abstract, init_adapters
from agentjax.models.qwen.value import (QwenValue, init_value_head, load_value_hf,
                                        save_value_hf, sequence_values, value_abstract,
                                        value_params_from_policy, value_params_with_adapter,
                                        value_shardings)
from agentjax.methods import get_method
from agentjax.rl.losses import value_loss, value_totals
from agentjax.train.adapters import TrainTarget
from agentjax.rl.microbatch import accumulate, map_micro
from agentjax.train.optim import opt_state_shardings, make_guarded_step, make_optimizer, make_schedule

log = logging.getLogger(__name__)

VALUE_ADAPTER = "value"   # the critic's LoRA adapter name
CRITIC_EXPORT_DIR = "critic_export"  # {workdir}/critic_export: a *ForTokenClassification folder


def needs_critic(config: Any) -> bool:
  """Whether the run's method trains a critic (its registry entry; config validation allows
  those methods with trainer "rl" only)."""
  return get_method(config.algorithm).critic


@dataclasses.dataclass
class Critic:
  """A run's critic: its module, what is trained, its optimizer and loss settings."""
  cfg: QwenConfig
  module: QwenValue
  spec: LoraSpec | None        # the value adapter's spec (LoRA critic), else None
  backbone: Any                # LoRA critic: the policy's frozen backbone; else None
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule     # the optimizer's learning rate per update (for logging)
  value_clip: float | None
  value_coef: float
  aggregation: str
  warmup_steps: int            # RL steps in which only the critic trains
  # Rows per forward/backward over all devices (microbatch.global_micro; 0: a whole batch at
  # once) of values() and update(); grad_shardings: where update() accumulates the gradients.
  micro_batch: int = 0
  grad_shardings: Any = None

  @classmethod
  def build(cls, config: Any, target: TrainTarget, updates_per_step: int,
            micro_batch: int = 0, mesh: jax.sharding.Mesh | None = None) -> "Critic":
    """The critic of `config` beside the policy `target` (its cfg and, with LoRA, its backbone).
    updates_per_step: optimizer updates per RL step (the schedule counts updates).
    micro_batch: rows per pass over all devices (0: whole batches); with a mesh, its updates
    accumulate gradients in the trainable params' shardings."""
    c, p = config.critic, config.ppo
    spec = None
    if target.spec is not None and c.init == "policy":
      spec = LoraSpec(names=(VALUE_ADAPTER,), rank=target.spec.rank, alpha=target.spec.alpha,
                      targets=target.spec.targets, decode=target.spec.decode)
    k = updates_per_step
    lr, warmup, total = c.lr, c.lr_warmup_steps * k, config.train.steps * k
    optimizer = make_optimizer(lr, warmup, total, c.weight_decay, c.clip_norm or None,
                               c.final_lr_ratio, config.optimizer.b2)
    critic = cls(cfg=target.cfg, module=QwenValue(target.cfg, lora=spec), spec=spec,
                 backbone=target.backbone if spec is not None else None, optimizer=optimizer,
                 schedule=make_schedule(lr, warmup, total, c.final_lr_ratio),
                 value_clip=float(p.value_clip) or None, value_coef=float(p.value_coef),
                 aggregation=config.rl.aggregation, warmup_steps=int(c.warmup_steps),
                 micro_batch=micro_batch)
    if micro_batch and mesh is not None:
      critic.grad_shardings = critic.shardings(mesh)
    return critic

  # ------------------------------------------------------------------ state

  def init_params(self, config: Any, policy_params: Any, mesh: jax.sharding.Mesh) -> Any:
    """The critic's initial trainable params. policy_params: the policy's initial full params
    (ignored with a LoRA critic, which starts from a fresh adapter on the backbone)."""
    rng = jax.random.fold_in(jax.random.key(config.seed), 2)
    head_rng, adapter_rng = jax.random.split(rng)
    if self.spec is not None:
      adapter = init_adapters(self.cfg, self.spec, adapter_rng, mesh)[VALUE_ADAPTER]
      return {"adapter": adapter, "score": init_value_head(self.cfg, head_rng, mesh)}
    init = config.critic.init
    if init == "policy":
      return value_params_from_policy(self.cfg, policy_params, head_rng, mesh)
    cfg, params = load_value_hf(os.path.expanduser(init), mesh, rng=head_rng,
                                param_dtype=self.cfg.param_dtype, dtype=self.cfg.dtype,
                                remat_policy=self.cfg.remat_policy,
                                attention=self.cfg.attention,
                                attention_block=self.cfg.attention_block)
    if _shape(cfg) != _shape(self.cfg):
      from agentjax.train.config import ConfigError
      raise ConfigError(f"config.critic.init={init!r}: its model ({cfg.model_type}, hidden "
                        f"{cfg.hidden_size}, {cfg.num_layers} layers, vocab {cfg.vocab_size}) "
                        f"is not the policy's shape; the critic reads the policy's tokens")
    log.info("critic from %s", init)
    return params

  def shardings(self, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings of the trainable tree, by the rules table."""
    if self.spec is None:
      return value_shardings(self.cfg, mesh)
    from agentjax.models.qwen import adapter_shardings
    head = value_shardings(self.cfg, mesh)["score"]
    return {"adapter": adapter_shardings(self.cfg, self.spec, mesh), "score": head}

  def init_state(self, config: Any, policy_params: Any, mesh: jax.sharding.Mesh
                 ) -> dict[str, Any]:
    """{"params": trainable, "opt_state": AdamW state} placed like the params (moments FSDP-
    sharded alike, counters replicated)."""
    params = self.init_params(config, policy_params, mesh)
    opt_state = jax.jit(self.optimizer.init, out_shardings=opt_state_shardings(
        self.optimizer, params, self.shardings(mesh), mesh))(params)
    n = sum(x.size for x in jax.tree.leaves(params))
    log.info("critic: %s trainable parameters (%s)", f"{n:,}",
             "value adapter + head on the backbone" if self.spec is not None else "full model")
    return {"params": params, "opt_state": opt_state}

  def abstract_state(self, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """The critic's state as ShapeDtypeStructs with their shardings: a restore target that
    reads a PPO checkpoint (eval, serving) without building and initializing a critic first."""
    shardings = self.shardings(mesh)
    if self.spec is None:
      params = value_abstract(self.cfg)
    else:
      params = {"adapter": adapter_abstract(self.cfg, self.spec),
                "score": value_abstract(self.cfg)["score"]}
    place = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
    params = jax.tree.map(place, params, shardings)
    opt_state = jax.tree.map(place, jax.eval_shape(self.optimizer.init, params),
                             opt_state_shardings(self.optimizer, params, shardings, mesh))
    return {"params": params, "opt_state": opt_state}

  # ------------------------------------------------------------------ programs

  def model_params(self, trainable: Any, *backbone: Any) -> Any:
    """The params QwenValue runs with (LoRA: the backbone, an argument of the jitted programs
    rather than a constant baked into them, with the value adapter attached)."""
    if self.spec is None:
      return trainable
    return value_params_with_adapter(lora_lib.frozen_backbone(backbone, "critic"),
                                     trainable["adapter"], trainable["score"], self.spec)

  @property
  def frozen(self) -> tuple[Any, ...]:
    return () if self.spec is None else (self.backbone,)

  def values(self, trainable: Any, tokens: jax.Array, valid: jax.Array) -> jax.Array:
    """[B, L] values of the states in which each token is sampled (value.sequence_values), in
    passes of micro_batch rows."""
    return self._values(trainable, tokens, valid, *self.frozen)

  @functools.cached_property
  def _values(self):
    def run(trainable, tokens, valid, *backbone):
      params = self.model_params(trainable, *backbone)
      return map_micro(lambda t, v: sequence_values(self.module, params, t, v), self.micro_batch,
                       tokens, valid)
    return jax.jit(run)

  @functools.cached_property
  def _update(self):
    def objective(trainable, mb, *backbone, totals=None):
      v = sequence_values(self.module, self.model_params(trainable, *backbone), mb["tokens"],
                          mb["valid"])
      loss, metrics = value_loss(v, mb["old_values"], mb["returns"], mb["value_mask"],
                                 value_clip=self.value_clip, aggregation=self.aggregation,
                                 totals=totals)
      return self.value_coef * loss, metrics
    if not self.micro_batch:
      return make_guarded_step(objective, self.optimizer)
    # Micro-batches: gradients summed over slices of the minibatch, normalized by its totals.
    partial = lambda trainable, mb, totals, *backbone: objective(  # noqa: E731
        trainable, mb, *backbone, totals=totals)
    totals = lambda mb: value_totals(mb["returns"], mb["value_mask"])  # noqa: E731
    return make_guarded_step(accumulate(partial, totals, self.micro_batch,
                                        grad_shardings=self.grad_shardings),
                             self.optimizer, with_grad=True)

  def batch_metrics(self, old_values: jax.Array, returns: jax.Array, value_mask: jax.Array
                    ) -> dict[str, jax.Array]:
    """critic/explained_variance, critic/value_mean, critic/return_mean of the values the batch
    was scored with, over every slot with a target (verl's critic data metrics; the update's
    value_loss and clip fraction come from the minibatches)."""
    return self._batch_metrics(old_values, returns, value_mask)

  @functools.cached_property
  def _batch_metrics(self):
    def run(old, returns, mask):
      m = value_loss(old, old, returns, mask, value_clip=None, aggregation=self.aggregation)[1]
      return {k: m[k] for k in ("critic/explained_variance", "critic/value_mean",
                                "critic/return_mean")}
    return jax.jit(run)

  def update(self, trainable: Any, opt_state: Any, minibatch: dict[str, jax.Array]
             ) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One guarded AdamW step on the value loss of `minibatch` ([b, S] tokens, valid,
    old_values, returns, value_mask), its gradient summed over micro-batches of micro_batch
    rows when set. trainable and opt_state are donated."""
    return self._update(trainable, opt_state, minibatch, *self.frozen)

  # ------------------------------------------------------------------ export

  def export(self, path: str, trainable: Any, tokenizer: Any = None) -> str:
    """The critic as a Hugging Face *ForTokenClassification folder (num_labels 1; a LoRA
    critic's adapter merged into a copy of the backbone)."""
    params = trainable
    if self.spec is not None:
      merged = lora_lib.merge(self.backbone, trainable["adapter"], self.spec.scale)
      params = {"model": {k: v for k, v in merged.items() if k != "lm_head"},
                "score": trainable["score"]}
    return save_value_hf(path, self.cfg, params, tokenizer)


def _shape(cfg: QwenConfig) -> tuple:
  return (cfg.model_type, cfg.hidden_size, cfg.num_layers, cfg.vocab_size, cfg.num_heads,
          cfg.num_kv_heads, cfg.head_dim)


__all__ = ["CRITIC_EXPORT_DIR", "Critic", "VALUE_ADAPTER", "needs_critic"]
