"""What a run trains: the whole model, or LoRA adapters on a frozen backbone (config.model.lora).

    target = TrainTarget.build(config, cfg, params, mesh)   # params: the loaded backbone
    state["params"] = target.trainable                      # full params, or {name: adapter}
    policy = target.policy_params(state["params"])          # what rollouts and scoring run
    update(state["params"], opt_state, minibatch, *target.frozen)

With LoRA the optimizer state, the gradients and the checkpoints hold the adapters only; the
backbone is read, never copied (`attach` shares its arrays), and it is also the KL reference
(the policy without its adapter), so a LoRA run holds one copy of the weights where full
fine-tuning holds two (policy + frozen reference) plus Adam's two moments.

Checkpoints of a LoRA run record the backbone (its path and `models.lora.fingerprint`);
`check_backbone` refuses to resume adapters onto another backbone, naming both.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

from agentjax.models import lora as lora_lib
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import Qwen, QwenConfig, adapter_shardings, init_adapters
from agentjax.models.qwen.checkpoint import save_hf
from agentjax.train import config as config_lib
from agentjax.train.checkpoint import CheckpointMismatchError
from agentjax.train.optim import make_adapter_optimizer, make_optimizer

log = logging.getLogger(__name__)

ADAPTERS_DIR = "adapters"  # {workdir}/adapters/<name>/: one PEFT folder per adapter


@dataclasses.dataclass
class TrainTarget:
  """The trained part of a run and how it becomes the model's params.

  spec None: full fine-tuning; trainable is the params, frozen is ().
  spec set: trainable is {name: adapter tree}, backbone the frozen params, frozen (backbone,).
  """
  cfg: QwenConfig
  spec: LoraSpec | None
  backbone: Any
  trainable: Any
  backbone_record: dict[str, str] | None = None
  own_lrs: dict[str, float] | None = None  # model.lora.lr: adapters with a rate of their own
  roles: tuple[str, ...] | None = None  # adapters trained by updates (None: the policy alone)

  @classmethod
  def build(cls, config: Any, cfg: QwenConfig, params: Any, mesh: jax.sharding.Mesh
            ) -> "TrainTarget":
    spec = config_lib.lora_spec(config)
    if spec is None:
      return cls(cfg, None, None, params)
    adapters = init_adapters(cfg, spec, jax.random.fold_in(jax.random.key(config.seed), 1),
                             mesh)
    for name, path in config_lib.lora_inits(config).items():
      from agentjax.models.qwen.peft import load_peft
      adapters[name] = load_peft(path, cfg, spec, mesh=mesh)
      log.info("adapter %r starts from the PEFT folder %s", name, path)
    record = {"path": config.model.hf_path or f"preset:{config.model.preset}",
              "fingerprint": lora_lib.fingerprint(params)}
    n_adapter = sum(x.size for x in jax.tree.leaves(adapters))
    n_backbone = sum(x.size for x in jax.tree.leaves(params))
    log.info("LoRA %s rank %d alpha %g on %s: %s trainable parameters (%.2f%% of the backbone)",
             ",".join(spec.names), spec.rank, spec.alpha, ",".join(spec.targets),
             f"{n_adapter:,}", 100.0 * n_adapter / max(n_backbone, 1))
    own = config_lib.lora_rates(config)
    return cls(cfg, spec, params, adapters, record, own, config_lib.trained_roles(config))

  @classmethod
  def of(cls, config: Any) -> "TrainTarget":
    """The spec alone (no arrays): what a Checkpointer records when no model is loaded."""
    return cls(None, config_lib.lora_spec(config), None, None,
               roles=config_lib.trained_roles(config))

  # ------------------------------------------------------------------ params

  @property
  def model(self) -> Qwen:
    """The module the policy runs as (rollouts, scoring, updates)."""
    return Qwen(self.cfg, lora=self.spec)

  @property
  def frozen(self) -> tuple[Any, ...]:
    """The update's frozen arguments (make_policy_update / make_sft_step)."""
    return () if self.spec is None else (self.backbone,)

  @property
  def policy_name(self) -> str | None:
    return None if self.spec is None else self.spec.policy

  def policy_params(self, trainable: Any, name: str | None = None) -> Any:
    """The params `self.model` runs with: the full params, or the backbone with the adapters
    attached and adapter `name` (default: the policy) selected."""
    if self.spec is None:
      return trainable
    return lora_lib.attach(self.backbone, trainable, self.spec, name or self.policy_name)

  def rollout_params(self, trainable: Any) -> Any:
    """What the run's agent rolls out with: the policy's params, or with several trained roles
    (DAC) {role: params with its adapter selected}."""
    if self.roles:
      return {role: self.policy_params(trainable, role) for role in self.roles}
    return self.policy_params(trainable)

  def reference(self, kl_coef: float) -> tuple[Any, Qwen | None]:
    """(reference params, its module) for the KL term; (None, None) without one. Full
    fine-tuning: a frozen copy of the initial params (updates donate the policy's). LoRA: the
    backbone itself, run without adapters: no second copy of the weights."""
    if kl_coef <= 0:
      return None, None
    if self.spec is None:
      return jax.tree.map(jnp.copy, self.trainable), None
    return self.backbone, Qwen(self.cfg)

  def merged(self, trainable: Any, name: str | None = None) -> Any:
    """Plain params (Qwen(cfg)) with adapter `name` (default: the policy) merged in."""
    if self.spec is None:
      return trainable
    return lora_lib.merge(self.backbone, trainable[name or self.policy_name], self.spec.scale)

  def shardings(self, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings of the trainable tree (None: the params' own, by the rules table)."""
    if self.spec is None:
      return None
    one = adapter_shardings(self.cfg, self.spec, mesh)
    return {name: one for name in self.spec.names}

  # ------------------------------------------------------------------ optimizer

  def optimizer(self, config: Any, lr: float, warmup: int, total: int,
                final_ratio: float, b2: float) -> optax.GradientTransformation:
    """AdamW after global-norm clipping (config.optimizer); with LoRA one AdamW per adapter, at
    its model.lora.lr rate if it has one, else at `lr`, all on the same warmup + cosine shape."""
    o = config.optimizer
    return self.optimizer_with(lr, warmup, total, o.weight_decay, o.clip_norm or None,
                               final_ratio, b2)

  def optimizer_with(self, lr: float, warmup: int, total: int, weight_decay: float,
                     clip_norm: float | None, final_ratio: float, b2: float
                     ) -> optax.GradientTransformation:
    """As `optimizer`, from explicit settings (SFT's). Adapters without a rate of their own in
    model.lora.lr train at `lr`."""
    if self.spec is None:
      return make_optimizer(lr, warmup, total, weight_decay, clip_norm, final_ratio, b2)
    lrs = self.learning_rates(lr)
    ignored = sorted(set(self.own_lrs or {}) - set(self.trained))
    if ignored:
      log.warning("model.lora.lr gives a rate to %s, which this run does not train (it trains "
                  "%s): ignored", ignored, list(self.trained))
    # RL and SFT train the policy adapter, DAC its two roles' (`roles`); the others ride along
    # untouched. Adapters of different roles clip their own gradients.
    frozen = tuple(n for n in self.spec.names if n not in self.trained)
    return make_adapter_optimizer(lrs, warmup, total, weight_decay, clip_norm, final_ratio, b2,
                                  frozen=frozen, clip_each=len(self.trained) > 1)

  def learning_rates(self, lr: float) -> dict[str, float]:
    """{adapter: peak rate}: its model.lora.lr entry, else `lr`."""
    return dict({name: lr for name in self.spec.names}, **(self.own_lrs or {}))

  @property
  def trained(self) -> tuple[str, ...]:
    """The adapters this run's updates train: its roles' (DAC), else the policy's."""
    if self.spec is None:
      return ()
    return tuple(self.roles) if self.roles else (self.policy_name,)

  # ------------------------------------------------------------------ checkpoints and exports

  def recorded(self) -> dict[str, Any]:
    """What a run's config.json records of its target: the adapters' spec, normalized (targets
    in order, alpha resolved: equal specs compare equal however they were written), or None;
    and with LoRA the backbone's path and fingerprint."""
    if self.spec is None:
      return {"lora": None}
    out: dict[str, Any] = {"lora": {"adapters": list(self.spec.names), "rank": self.spec.rank,
                                    "alpha": self.spec.alpha,
                                    "targets": sorted(self.spec.targets)}}
    if self.backbone_record is not None:
      out["lora_backbone"] = self.backbone_record
    return out

  def check_backbone(self, stored: Mapping[str, Any]) -> None:
    """Refuses adapters checkpointed on another backbone (`stored`: the config.json of the run
    that wrote them), naming both. The Checkpointer calls it once the compat keys matched."""
    old = stored.get("lora_backbone")
    if self.backbone_record is None or not old:
      return
    if old.get("fingerprint") != self.backbone_record["fingerprint"]:
      raise CheckpointMismatchError(
          f"the adapters in this workdir were trained on the backbone {old.get('path')!r} "
          f"(fingerprint {old.get('fingerprint')}), but this run loads "
          f"{self.backbone_record['path']!r} (fingerprint {self.backbone_record['fingerprint']}):"
          f" resuming would put them on other weights (the same path means the weights there "
          f"changed). Use a fresh workdir, or restore the backbone they were trained on.")

  def export(self, workdir: str, trainable: Any, tokenizer: Any, hf_export: str | None
             ) -> dict[str, str]:
    """A finished run's exports: each adapter as a PEFT folder {workdir}/adapters/<name>/ and,
    when hf_export is a path, the Hugging Face model there (the policy adapter merged).
    Returns {what: path}. Each folder is written beside its target and swapped in whole."""
    out = {}
    if self.spec is not None:
      from agentjax.models.qwen.peft import save_peft
      # PEFT loaders fetch base_model_name_or_path: only a real folder, not "preset:<name>".
      base = "" if self.backbone_record["path"].startswith("preset:") \
          else self.backbone_record["path"]
      for name in self.spec.names:
        out[f"adapter:{name}"] = save_peft(os.path.join(workdir, ADAPTERS_DIR, name), self.cfg,
                                           self.spec, trainable[name],
                                           base_model_name_or_path=base)
    if hf_export:
      out["hf_export"] = save_hf(hf_export, self.cfg, self.merged(trainable), tokenizer)
    return out
