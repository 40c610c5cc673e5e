"""Checks a run config (configs/base.py and friends) before anything is loaded or compiled.

    validate(config)   # raises ConfigError("config.rollout.group_size=1: ...") on the first problem

Every message starts with the dotted field it is about. Checks that need the data or the model
(a prompt longer than the budget, a tokenizer larger than the vocabulary) happen where those are
loaded, also before compiling.
"""

from __future__ import annotations

import os
from typing import Any

from agentjax.agent.feed import PARTIAL_MODES
from agentjax.rl.info_gain import PROBE_TOKENS
from agentjax.agent.protocol import PROTOCOLS
from agentjax.agent.rollout import ENGINES
# One ConfigError for model and run configs (re-exported here), and the model's own lists of
# what QwenConfig accepts, so validation passes exactly what will load.
from agentjax.models.qwen.config import (ATTENTION_IMPLEMENTATIONS, DTYPES, PRESETS,
                                         REMAT_POLICIES, ConfigError)
from agentjax.judge.base import BUILTIN_JUDGES, JUDGES
from agentjax.models.lora import ALL_TARGETS, DECODE_MODES, LoraSpec
from agentjax.judge.controls import NOISE_MODES
from agentjax.methods import METHODS, get_method, outcome_methods  # noqa: F401
from agentjax.rl.advantages import CW_FALLBACKS, STD_ESTIMATORS
from agentjax.rl.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from agentjax.rl.offpolicy import CORRECTIONS
from agentjax.train.fields import fail as _fail, get as _get, names as _names  # noqa: F401
from agentjax.train.fields import non_negative as _non_negative, positive as _positive
from agentjax.train.fields import non_negative_int as _non_negative_int
# A misspelled field's closest names (launch/common.py's override errors use them too).
from agentjax.train.fields import field_paths, unknown_field  # noqa: F401
from agentjax.train.kinds import TRAINER_KINDS, trainer_kind
from agentjax.train.pipeline import STALE_MODES

JUDGE_BACKENDS = ("none",) + tuple(BUILTIN_JUDGES)
# rl.pack_tokens is a multiple of this: the multiple train/scoring.trim rounds padded widths to, so a
# packed row lines up with attention blocks and log-prob chunks as a padded one does.
PACK_MULTIPLE = 128


def benchmark_list(value: str, field: str) -> list[str]:
  """'nq,hotpotqa' -> ['nq', 'hotpotqa'], each checked against the known benchmarks; a named
  list ('cw_grpo_400', agentjax.data.searchqa.BENCHMARK_LISTS) gives its members."""
  from agentjax.data.searchqa import expand_benchmarks  # tfds import only when data is configured
  try:
    return [name for name, _, _ in expand_benchmarks(value)]
  except ValueError as e:
    _fail(field, value, str(e))


def validate(config: Any) -> None:
  """Raises ConfigError naming the first field that cannot work."""
  kind = trainer_kind(config)  # its entry (kinds.py); ConfigError when unknown
  _validate_model(config)
  for dim in ("data", "fsdp", "tensor"):
    v = _get(config, f"mesh.{dim}")
    if not isinstance(v, int) or (v < 1 and v != -1):
      _fail(f"mesh.{dim}", v, "must be a positive int or -1 (the remaining devices)")
  _positive(config, "optimizer.lr", "train.steps", "train.keep_checkpoints")
  _non_negative_int(config, "train.async_steps", "mesh.sampler_devices")
  _positive(config, "mesh.sampler_tensor")
  if _get(config, "mesh.sampler_devices") and not _get(config, "train.async_steps"):
    _fail("mesh.sampler_devices", _get(config, "mesh.sampler_devices"),
          "a split placement needs train.async_steps >= 1 (else the sampler's devices wait "
          "for every update and the trainer's for every rollout)")
  if _get(config, "mesh.sampler_devices") and (_get(config, "model.lora.adapters")
                                               or trainer_kind(config).roles):
    _fail("mesh.sampler_devices", _get(config, "mesh.sampler_devices"),
          "the split placement copies full parameters to the sampler: not yet with LoRA "
          "adapters or several roles (use the colocated placement, 0)")
  partial = config.rollout.partial
  if partial not in PARTIAL_MODES:
    _fail("rollout.partial", partial, f"must be one of {list(PARTIAL_MODES)}")
  if partial != "off" and not _get(config, "train.async_steps"):
    _fail("rollout.partial", partial, "reads parameters published during a rollout: needs "
          "train.async_steps >= 1 (a synchronous step publishes none)")
  if partial != "off" and trainer_kind(config).roles:
    _fail("rollout.partial", partial, "takes one agent with one policy; this trainer has "
          "several roles (use 'off')")
  stale = _get(config, "train.stale")
  if stale not in STALE_MODES:
    _fail("train.stale", stale, f"must be one of {list(STALE_MODES)}")
  max_staleness = config.train.max_staleness
  if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < -1:
    _fail("train.max_staleness", max_staleness, "must be an int >= 0 (or -1: async_steps)")
  if stale == "drop":
    k = _get(config, "train.async_steps")
    if not 0 <= max_staleness < k:
      _fail("train.max_staleness", max_staleness, f"train.stale='drop' leaves out "
            f"trajectories older than max_staleness versions: needs 0 <= max_staleness < "
            f"train.async_steps={k} (else nothing is ever dropped)")
    if partial != "continue":
      _fail("rollout.partial", partial, "train.stale='drop' needs rollout.partial='continue' "
            "(else every rollout is train.async_steps versions old and all would be dropped)")
  _non_negative(config, "optimizer.warmup_steps", "optimizer.weight_decay", "train.log_every",
                "train.eval_every", "train.checkpoint_every", "optimizer.clip_norm",
                "optimizer.final_lr_ratio")
  if not 0.0 < _get(config, "optimizer.b2") < 1.0:
    _fail("optimizer.b2", _get(config, "optimizer.b2"), "must be in (0, 1)")
  if not isinstance(_get(config, "train.keep_checkpoints"), int):
    _fail("train.keep_checkpoints", _get(config, "train.keep_checkpoints"), "must be an int")
  for f in ("train.max_skipped_updates", "retrieval.max_failed_steps"):
    if not isinstance(_get(config, f), int) or _get(config, f) < 0:
      _fail(f, _get(config, f), "must be an int >= 0 (0: never stop the run for it)")
  if not isinstance(_get(config, "train.final_eval"), bool):
    _fail("train.final_eval", _get(config, "train.final_eval"), "must be True or False")
  stall = _get(config, "train.stall_timeout_s")
  if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall >= 0:
    _fail("train.stall_timeout_s", stall, "must be a number of seconds >= 0 (0: no watchdog)")
  if not 0.0 <= _get(config, "retrieval.max_failure_rate") < 1.0:
    _fail("retrieval.max_failure_rate", _get(config, "retrieval.max_failure_rate"),
          "must be in [0, 1): the share of a step's queries that may fail")
  if kind.supervised:  # demonstrations: none of the RL fields below are read
    kind.validate(config)
    return
  _validate_rl(config)
  if kind.validate is not None:
    kind.validate(config)
  _validate_coreact(config)


def _validate_model(config: Any) -> None:
  hf, preset = _get(config, "model.hf_path"), _get(config, "model.preset")
  if not hf and preset not in PRESETS:
    _fail("model.preset", preset, f"unknown model preset (and model.hf_path is empty); known: "
          f"{sorted(PRESETS)}")
  if not hf and not _get(config, "model.tokenizer_path"):
    _fail("model.tokenizer_path", "", "a model trained from a preset needs a tokenizer folder")
  for f in ("model.param_dtype", "model.dtype"):
    if _get(config, f) not in DTYPES:
      _fail(f, _get(config, f), f"must be one of {list(DTYPES)}")
  if _get(config, "model.remat_policy") not in REMAT_POLICIES:
    _fail("model.remat_policy", _get(config, "model.remat_policy"),
          f"must be one of {list(REMAT_POLICIES)}")
  if config.model.attention not in ATTENTION_IMPLEMENTATIONS:
    _fail("model.attention", config.model.attention,
          f"must be one of {list(ATTENTION_IMPLEMENTATIONS)}")
  block = config.model.attention_block
  if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
    _fail("model.attention_block", block, "must be a positive integer")
  spec = lora_spec(config)
  if spec is not None:
    lora_rates(config)
    lora_inits(config)


def lora_spec(config: Any) -> LoraSpec | None:
  """config.model.lora as a LoraSpec (None: full fine-tuning); errors name the field."""
  adapters = _names(_get(config, "model.lora.adapters"), "model.lora.adapters")
  if not adapters:
    return None
  rank, alpha = _get(config, "model.lora.rank"), _get(config, "model.lora.alpha")
  if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
    _fail("model.lora.rank", rank, "must be a positive int")
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
    _fail("model.lora.alpha", alpha, "must be >= 0 (0: equal to model.lora.rank)")
  targets = _names(_get(config, "model.lora.targets"), "model.lora.targets")
  if len(set(adapters)) != len(adapters) or not all(n.isidentifier() for n in adapters):
    _fail("model.lora.adapters", _get(config, "model.lora.adapters"),
          "adapter names must be distinct identifiers (letters, digits, _)")
  unknown = sorted(set(targets) - set(ALL_TARGETS))
  if unknown or not targets:
    _fail("model.lora.targets", _get(config, "model.lora.targets"),
          f"{unknown or 'no targets'}: expected a comma list of {list(ALL_TARGETS)}")
  decode = _get(config, "model.lora.decode")
  if decode not in DECODE_MODES:
    _fail("model.lora.decode", decode, f"must be one of {list(DECODE_MODES)}")
  spec = LoraSpec(names=adapters, rank=rank, alpha=float(alpha or rank), targets=targets,
                  decode=decode)
  if spec.decode == "merge" and _get(config, "model.param_dtype") != "float32":
    _fail("model.lora.decode", "merge", f"with model.param_dtype="
          f"{_get(config, 'model.param_dtype')!r} the merged kernels would round the adapter's "
          "delta away (the sampler would not sample the policy it trains); use 'auto' or "
          "'unmerged'")
  return spec


def _assignments(config: Any, field: str, names: tuple[str, ...]) -> dict[str, str]:
  """'a=x,b=y' -> {a: x, b: y}, each name one of `names`."""
  value = _get(config, field)
  out = {}
  for item in _names(value, field):
    name, eq, rhs = item.partition("=")
    name, rhs = name.strip(), rhs.strip()
    if not eq or not rhs:
      _fail(field, value, f"{item!r} is not name=value")
    if name not in names:
      _fail(field, value, f"{name!r} is not an adapter of model.lora.adapters={list(names)}")
    out[name] = rhs
  return out


def lora_rates(config: Any) -> dict[str, float]:
  """The adapters given a learning rate of their own in model.lora.lr: name -> peak lr (the
  others train at optimizer.lr, or sft.lr in SFT)."""
  spec = lora_spec(config)
  if spec is None:
    return {}
  out = {}
  for name, text in _assignments(config, "model.lora.lr", spec.names).items():
    try:
      out[name] = float(text)
    except ValueError:
      _fail("model.lora.lr", _get(config, "model.lora.lr"), f"{text!r} is not a number")
    if not out[name] > 0:
      _fail("model.lora.lr", _get(config, "model.lora.lr"), f"{name}'s rate must be positive")
  return out


def lora_inits(config: Any) -> dict[str, str]:
  """Adapters started from PEFT folders: name -> folder (model.lora.init)."""
  spec = lora_spec(config)
  if spec is None:
    return {}
  out = _assignments(config, "model.lora.init", spec.names)
  for name, path in out.items():
    if not os.path.isdir(os.path.expanduser(path)):
      hint = ("; DAC's demo starts its generator from its warm start: run `python "
              "launch/dac_demos.py` and `python launch/train.py --config=configs/dac.py:"
              "generator_sft --workdir=runs/demo/dac/generator_sft` first (configs/dac.py)"
              if _get(config, "trainer") == "dac" else "")
      _fail("model.lora.init", _get(config, "model.lora.init"),
            f"{name}: {path} is not a folder{hint}")
  return {k: os.path.expanduser(v) for k, v in out.items()}


def _validate_rl(config: Any) -> None:
  """The RL fields: the method and its losses, then the rollout, the batch sizes, retrieval."""
  algorithm = _get(config, "algorithm")
  if algorithm not in METHODS:
    _fail("algorithm", algorithm, f"unknown algorithm; known: {sorted(METHODS)}")
  method = get_method(algorithm)
  _validate_judge(config, method)
  loss = _get(config, "rl.loss")
  if loss not in POLICY_LOSSES:
    _fail("rl.loss", loss, f"unknown policy loss; known: {sorted(POLICY_LOSSES)}")
  if _get(config, "rl.aggregation") not in AGGREGATIONS:
    _fail("rl.aggregation", _get(config, "rl.aggregation"), f"must be one of {list(AGGREGATIONS)}")
  if _get(config, "rl.kl_estimator") not in KL_ESTIMATORS:
    _fail("rl.kl_estimator", _get(config, "rl.kl_estimator"),
          f"must be one of {list(KL_ESTIMATORS)}")
  if _get(config, "rl.reward_metric") not in ("f1", "em"):
    _fail("rl.reward_metric", _get(config, "rl.reward_metric"), "must be 'f1' or 'em'")
  if _get(config, "rl.igpo_norm") not in ("joint", "separate"):
    _fail("rl.igpo_norm", _get(config, "rl.igpo_norm"), "must be 'joint' or 'separate'")
  _non_negative(config, "rl.igpo_ig_weight", "rl.igpo_outcome_weight")
  _positive(config, "rl.probe_width_multiple")
  if config.rl.ig_probe_tokens not in PROBE_TOKENS:
    _fail("rl.ig_probe_tokens", config.rl.ig_probe_tokens, f"must be one of {PROBE_TOKENS}")
  if _get(config, "rl.ig_mode") not in ("log_prob", "prob"):
    _fail("rl.ig_mode", _get(config, "rl.ig_mode"), "must be 'log_prob' or 'prob'")
  if _get(config, "rl.std_estimator") not in STD_ESTIMATORS:
    _fail("rl.std_estimator", _get(config, "rl.std_estimator"),
          f"must be one of {list(STD_ESTIMATORS)}")
  _non_negative(config, "rl.std_eps")
  _positive(config, "rl.prompts_per_step", "rl.minibatch_size", "rl.ppo_epochs", "retrieval.topk",
            "train.eval_batch", "rl.chunk")
  _non_negative(config, "rl.kl_coef", "rl.entropy_coef", "rl.clip_low", "rl.clip_high",
                "data.eval_size")
  if not 0.0 <= _get(config, "rl.gamma") <= 1.0:
    _fail("rl.gamma", _get(config, "rl.gamma"), "must be in [0, 1]")
  if method.critic:
    _validate_critic(config)
  if _get(config, "rl.off_policy_correction") not in CORRECTIONS:
    _fail("rl.off_policy_correction", _get(config, "rl.off_policy_correction"),
          f"must be one of {list(CORRECTIONS)}")
  _positive(config, "rl.off_policy_cap")
  _validate_rollout(config)
  method.check(config, _fail)  # group size, inputs the step can provide, the method's own checks
  _validate_batches(config)
  _validate_retrieval(config)
  benchmark_list(_get(config, "data.train"), "data.train")
  benchmark_list(_get(config, "data.eval"), "data.eval")


def _validate_rollout(config: Any) -> None:
  if _get(config, "rollout.protocol") not in PROTOCOLS:
    _fail("rollout.protocol", _get(config, "rollout.protocol"),
          f"unknown protocol; known: {sorted(PROTOCOLS)}")
  _positive(config, "rollout.group_size", "rollout.max_turns", "rollout.max_new_tokens",
            "rollout.max_obs_tokens", "rollout.max_total_tokens", "rollout.temperature")
  _non_negative(config, "rollout.top_k")
  if not 0.0 < _get(config, "rollout.top_p") <= 1.0:
    _fail("rollout.top_p", _get(config, "rollout.top_p"), "must be in (0, 1]")
  penalty = _get(config, "rollout.repetition_penalty")
  if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
    _fail("rollout.repetition_penalty", penalty, "must be a number > 0 (1.0: off)")
  _non_negative_int(config, "rollout.max_think_tokens")
  if _get(config, "rollout.engine") not in ENGINES:
    _fail("rollout.engine", _get(config, "rollout.engine"), f"must be one of {list(ENGINES)}")
  _non_negative(config, "rollout.slots")
  _positive(config, "rollout.lanes")
  if _get(config, "rollout.slots") % _get(config, "rollout.lanes"):
    _fail("rollout.slots", _get(config, "rollout.slots"),
          f"must be a multiple of rollout.lanes={_get(config, 'rollout.lanes')}")
  if not 0.0 < _get(config, "rollout.refill_fraction") <= 1.0:
    _fail("rollout.refill_fraction", _get(config, "rollout.refill_fraction"),
          "must be in (0, 1]")
  kv_min = config.rollout.kv_window_min
  if isinstance(kv_min, bool) or not isinstance(kv_min, int) or kv_min < 0:
    _fail("rollout.kv_window_min", kv_min, "must be an int >= 0 (0: decode reads the whole cache)")
  factor = config.rollout.compact_factor
  if isinstance(factor, bool) or not isinstance(factor, int) or factor < 0 or factor == 1:
    _fail("rollout.compact_factor", factor, "must be 0 (lanes never compact) or an int >= 2")
  factor = config.rollout.row_bucket_factor
  if isinstance(factor, bool) or not isinstance(factor, int) or factor < 0 or factor == 1:
    _fail("rollout.row_bucket_factor", factor, "must be 0 (a lane's size) or an int >= 2")
  if not isinstance(config.rollout.warm_up, bool):
    _fail("rollout.warm_up", config.rollout.warm_up, "must be true or false")
  prefill_rows = config.rollout.prefill_rows
  if isinstance(prefill_rows, bool) or not isinstance(prefill_rows, int) or prefill_rows < 0:
    _fail("rollout.prefill_rows", prefill_rows, "must be an int >= 0 (0: every prompt in one "
          "prefill call)")
  new, obs, total = (_get(config, f"rollout.{k}") for k in
                     ("max_new_tokens", "max_obs_tokens", "max_total_tokens"))
  if new + obs >= total:
    _fail("rollout.max_total_tokens", total, f"leaves no room for a prompt: one turn alone "
          f"takes max_new_tokens + max_obs_tokens = {new + obs} tokens")


def _validate_batches(config: Any) -> None:
  """Minibatches divide the step's batch; micro-batches the minibatch; packed rows' size."""
  batch = _get(config, "rl.prompts_per_step") * _get(config, "rollout.group_size")
  mb = _get(config, "rl.minibatch_size")
  if mb > batch or batch % mb:
    _fail("rl.minibatch_size", mb, f"must divide the batch of prompts_per_step * group_size = "
          f"{batch} trajectories")
  micro = config.rl.micro_batch_size
  if isinstance(micro, bool) or not isinstance(micro, int) or micro < 0:
    _fail("rl.micro_batch_size", micro, "must be an int >= 0 (0: the whole minibatch at once)")
  shards = [_get(config, f"mesh.{dim}") for dim in ("data", "fsdp")]
  if micro and -1 not in shards:  # with a -1 axis the device count is known at build time only
    rows = micro * shards[0] * shards[1]
    if mb % rows:
      _fail("rl.micro_batch_size", micro, f"x the mesh's data x fsdp = {shards[0]} x "
            f"{shards[1]} devices = {rows} trajectories per pass must divide "
            f"rl.minibatch_size={mb}")
  elif micro and mb % micro:
    _fail("rl.micro_batch_size", micro, f"must divide rl.minibatch_size={mb} (with the mesh's "
          f"data x fsdp devices: trajectories per device per pass)")
  octave = config.rl.pack_rows_per_octave
  if isinstance(octave, bool) or not isinstance(octave, int) or octave < 1 or \
      octave & (octave - 1):
    _fail("rl.pack_rows_per_octave", octave, "must be a power of two >= 1 (row sizes per octave)")
  pack = config.rl.pack_tokens
  if isinstance(pack, bool) or not isinstance(pack, int) or pack < 0 or pack % PACK_MULTIPLE:
    _fail("rl.pack_tokens", pack, f"must be 0 (padded rows) or a positive multiple of "
          f"{PACK_MULTIPLE} (tokens per packed row)")
  if pack and _get(config, "trainer") == "dac":
    _fail("rl.pack_tokens", pack, "DAC's roles score and update padded rows; set it to 0")


def _validate_retrieval(config: Any) -> None:
  backend = _get(config, "retrieval.backend")
  if backend == "bm25":
    path = _get(config, "retrieval.corpus_path")
    if not path:
      _fail("retrieval.corpus_path", path, "the bm25 backend needs a corpus JSONL")
  elif backend == "http":
    _positive(config, "retrieval.timeout_s")
    url = str(_get(config, "retrieval.url"))
    if not url.startswith(("http://", "https://")):
      _fail("retrieval.url", url, "the http backend needs an http(s):// URL")
  elif backend == "dense":
    if not _get(config, "retrieval.index_dir"):
      _fail("retrieval.index_dir", _get(config, "retrieval.index_dir"),
            "the dense backend needs an index folder (launch/index.py)")
    target = _get(config, "retrieval.recall_target")
    if not 0.0 <= target < 1.0:
      _fail("retrieval.recall_target", target, "must be in [0, 1) (0: exact search)")
    devices = _get(config, "retrieval.devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 0:
      _fail("retrieval.devices", devices, "must be an int >= 0 (0: every device of the mesh)")
  else:  # the user's own: its plugins import, it is registered, its kwargs parse
    from agentjax.retrieval.plugins import PluginError, resolve_backend
    try:
      resolve_backend(config.retrieval)
    except PluginError as e:
      _fail(e.field, e.value, e.why)

def _validate_critic(config: Any) -> None:
  """The PPO estimators' settings (ppo.*, critic.*)."""
  kind = trainer_kind(config)
  if not kind.critic:
    critics = sorted(name for name, m in METHODS.items() if m.critic)
    allowed = [name for name, k in TRAINER_KINDS.items() if k.critic]
    _fail("algorithm", _get(config, "algorithm"), f"the critic methods {critics} "
          f"train with trainer {' or '.join(map(repr, allowed))}, not {kind.name!r}")
  for f in ("ppo.gamma", "ppo.lam"):
    if not 0.0 <= _get(config, f) <= 1.0:
      _fail(f, _get(config, f), "must be in [0, 1]")
  _non_negative(config, "ppo.ig_weight", "ppo.outcome_weight", "ppo.value_clip",
                "critic.lr_warmup_steps", "critic.weight_decay", "critic.clip_norm",
                "critic.final_lr_ratio")
  if not (_get(config, "ppo.ig_weight") or _get(config, "ppo.outcome_weight")):
    _fail("ppo.outcome_weight", _get(config, "ppo.outcome_weight"),
          "with ppo.ig_weight=0 the critic estimators have no reward at all")
  _positive(config, "critic.lr", "ppo.value_coef")
  for f in ("critic.warmup_steps", "critic.lr_warmup_steps"):
    if isinstance(_get(config, f), bool) or not isinstance(_get(config, f), int):
      _fail(f, _get(config, f), "must be an int (RL steps)")
  warmup = _get(config, "critic.warmup_steps")
  if not 0 <= warmup < _get(config, "train.steps"):
    _fail("critic.warmup_steps", warmup, f"must be >= 0 and below train.steps="
          f"{_get(config, 'train.steps')} (the policy trains only after it)")
  init = _get(config, "critic.init")
  if init != "policy" and not os.path.isdir(os.path.expanduser(str(init))):
    _fail("critic.init", init, "must be 'policy' or a Hugging Face folder")


def trained_roles(config: Any) -> tuple[str, ...] | None:
  """The adapters a run's updates train when not just the policy: the kind's roles (DAC's)."""
  return trainer_kind(config).roles


def _validate_coreact(config: Any) -> None:
  """config.coreact (read by trainer "rubric", collection and guided eval)."""
  from agentjax.coreact import RANK_REWARDS, SELECTS, VALUE_METRICS
  kind, protocol = trainer_kind(config), _get(config, "rollout.protocol")
  owners = [k.name for k in TRAINER_KINDS.values() if k.protocol == protocol]
  if owners and kind.name not in owners:  # a kind's own protocol (the rubric generator's)
    _fail("rollout.protocol", protocol, f"is the protocol of trainer {owners[0]!r}")
  if _get(config, "coreact.rank_reward") not in RANK_REWARDS:
    _fail("coreact.rank_reward", _get(config, "coreact.rank_reward"),
          f"must be one of {list(RANK_REWARDS)}")
  for f in ("coreact.spearman_weight", "coreact.atomic_weight", "coreact.format_weight",
            "coreact.repeat_threshold", "coreact.weight_tol", "coreact.nan_score",
            "coreact.verify_threshold", "coreact.oracle_noise", "coreact.max_retries"):
    _non_negative(config, f)
  for f in ("coreact.repeat_ngram", "coreact.min_items", "coreact.max_items",
            "coreact.num_candidates", "coreact.num_judges", "coreact.candidates_per_temperature",
            "coreact.generator_max_new_tokens", "coreact.generator_max_total_tokens",
            "coreact.best_of_n", "coreact.collect_questions"):
    v = _get(config, f)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      _fail(f, v, "must be an int >= 1")
  _non_negative_int(config, "coreact.generator_max_think_tokens")
  for f in ("coreact.value_rollouts", "coreact.value_batch"):
    v = _get(config, f)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      _fail(f, v, "must be an int >= 1")
  _positive(config, "coreact.value_temperature")
  if _get(config, "coreact.value_metric") not in VALUE_METRICS:
    _fail("coreact.value_metric", _get(config, "coreact.value_metric"),
          f"must be one of {list(VALUE_METRICS)}")
  if _get(config, "coreact.min_items") > _get(config, "coreact.max_items"):
    _fail("coreact.min_items", _get(config, "coreact.min_items"),
          "must be <= coreact.max_items")
  if _get(config, "coreact.num_candidates") < 2:
    _fail("coreact.num_candidates", _get(config, "coreact.num_candidates"),
          "a ranking needs >= 2 candidates")
  if not 0.0 < _get(config, "coreact.oracle_gamma") < 1.0:
    _fail("coreact.oracle_gamma", _get(config, "coreact.oracle_gamma"), "must be in (0, 1): "
          "value-to-go discounts each step left")
  if _get(config, "coreact.verify_threshold") > 1.0:
    _fail("coreact.verify_threshold", _get(config, "coreact.verify_threshold"),
          "must be in [0, 1] (verify scores are)")
  llm = [f for f in ("coreact.applier", "coreact.judge_backend") if _get(config, f) in
         ("openai", "local")]
  if llm and _get(config, "coreact.num_candidates") > 26:
    _fail("coreact.num_candidates", _get(config, "coreact.num_candidates"),
          f"an LLM ({llm[0]}) sees the candidates lettered A..Z: at most 26")
  if _get(config, "coreact.best_of_n_select") not in SELECTS:
    _fail("coreact.best_of_n_select", _get(config, "coreact.best_of_n_select"),
          f"must be one of {list(SELECTS)}")
  for f in ("coreact.verify", "coreact.persist"):
    if not isinstance(_get(config, f), bool):
      _fail(f, _get(config, f), "must be True or False")


def _validate_judge(config: Any, method: Any) -> None:
  backend = _get(config, "judge.backend")
  if backend not in JUDGE_BACKENDS and backend not in JUDGES:  # built in, or registered
    _fail("judge.backend", backend, f"must be one of {list(JUDGE_BACKENDS)} or a backend "
          f"registered with agentjax.judge.register_judge")
  judged = "judge" in method.signals_for(config)
  if judged and backend == "none":
    _fail("judge.backend", backend, f"algorithm {method.name!r} needs per-round judge verdicts: "
          f"set judge.backend to one of {list(JUDGE_BACKENDS[1:])}")
  if not judged and backend != "none":  # calls whose verdicts nothing reads
    judged = sorted(name for name, m in METHODS.items() if "judge" in m.signals_for(config))
    _fail("judge.backend", backend, f"algorithm {method.name!r} does not read judge verdicts "
          f"(only {judged} do): set judge.backend=none")
  if _get(config, "judge.noise") not in NOISE_MODES:
    _fail("judge.noise", _get(config, "judge.noise"), f"must be one of {list(NOISE_MODES)}")
  p = _get(config, "judge.noise_p")
  if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
    _fail("judge.noise_p", p, "must be a probability in [0, 1]")
  if _get(config, "cw.all_zero_fallback") not in CW_FALLBACKS:
    _fail("cw.all_zero_fallback", _get(config, "cw.all_zero_fallback"),
          f"must be one of {list(CW_FALLBACKS)}")
  _non_negative(config, "cw.gamma")
  _positive(config, "cw.inf_threshold")
  if backend == "openai":
    _positive(config, "judge.max_concurrency", "judge.timeout_s")
    _non_negative(config, "judge.max_retries", "judge.retry_backoff_s", "judge.temperature",
                  "judge.max_tokens")
    url = str(_get(config, "judge.base_url"))
    if not url.startswith(("http://", "https://")):
      _fail("judge.base_url", url, "the openai judge needs an http(s):// URL of an "
            "OpenAI-compatible endpoint (e.g. http://127.0.0.1:8001/v1)")
  if backend == "local":
    _positive(config, "judge.max_new_tokens", "judge.max_prompt_tokens")
    if not _get(config, "judge.hf_path"):
      _fail("judge.hf_path", "", "the local judge needs a Hugging Face folder")
  if _get(config, "judge.prompt_path") and backend in ("openai", "local") and not os.path.isfile(
      os.path.expanduser(_get(config, "judge.prompt_path"))):
    _fail("judge.prompt_path", _get(config, "judge.prompt_path"), "no such file")


def check_paths(config: Any) -> None:
  """The files a run reads exist (checked after validate, before loading anything)."""
  if config.model.hf_path and not os.path.isdir(os.path.expanduser(config.model.hf_path)):
    _fail("model.hf_path", config.model.hf_path, "is not a folder (a Hugging Face checkpoint "
          "folder with config.json and *.safetensors)")
  tok = config.model.tokenizer_path
  if tok and not os.path.isdir(os.path.expanduser(tok)):
    _fail("model.tokenizer_path", tok, "is not a folder")
  if trainer_kind(config).supervised:
    for field in ("sft.demos", "sft.corpus_path"):
      path = _get(config, field)
      if path and not os.path.isfile(os.path.expanduser(path)):
        _fail(field, path, "no such file")
    return
  if config.retrieval.backend == "bm25" and not os.path.isfile(
      os.path.expanduser(config.retrieval.corpus_path)):
    _fail("retrieval.corpus_path", config.retrieval.corpus_path, "no such file")
  if config.retrieval.backend == "dense" and not os.path.isfile(
      os.path.join(os.path.expanduser(config.retrieval.index_dir), "manifest.json")):
    _fail("retrieval.index_dir", config.retrieval.index_dir, "no dense index there (no "
          "manifest.json: build one with launch/index.py)")
