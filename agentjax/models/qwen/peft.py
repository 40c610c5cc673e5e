"""LoRA adapters <-> PEFT adapter folders (what `peft.PeftModel.from_pretrained` loads).

    save_peft("runs/x/adapters/policy", cfg, spec, adapters["policy"], "Qwen/Qwen2.5-7B-Instruct")
    spec = peft_spec("some/peft_folder")                 # rank, alpha, targets of its config
    adapter = load_peft("some/peft_folder", cfg, spec, mesh=mesh)

A PEFT folder holds adapter_config.json and adapter_model.safetensors, with one pair of tensors
per adapted projection of the transformers model (`get_peft_model_state_dict`'s names):

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

(nn.Linear's [out, in] convention: PEFT computes y = x W^T + (alpha/r) x A^T B^T). An agentjax
adapter holds lora_a [*in, r] and lora_b [r, *out] with the kernel's in and out dims (q/k/v_proj
out [heads, D], o_proj in [H, D]); flattening those dims in the same order as the kernels'
Hugging Face layout (checkpoint._param_map) and transposing gives PEFT's tensors, both ways.
Tied and untied heads need nothing: PEFT's adapter never touches embeddings or the LM head.

Loading checks adapter_config.json against the LoraSpec and every tensor's name, shape and dtype
from the file header before any data is read: a folder for another rank, another backbone
(other shapes or layer count) or a PEFT feature this model does not compute (DoRA, rsLoRA,
biases, per-module ranks, ...) fails with an error naming the field or the tensor.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import SingleDeviceSharding
from safetensors import SafetensorError, safe_open

from agentjax.models.lora import ALL_TARGETS, LoraSpec
from agentjax.models.qwen.checkpoint import _get, _param_map, _set, staged_folder
from agentjax.models.qwen.config import QwenConfig
from agentjax.models.qwen.model import adapter_abstract, adapter_shardings
from agentjax.models.safetensors_io import (FLOAT_DTYPES, CheckpointError, Tensor,
                                            write_safetensors)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PeftModelForCausalLM wraps LoraModel (base_model), which wraps the transformers model (model),
# whose decoder is `model`: a projection's module path gains this prefix in PEFT's state dict.
_PREFIX = "base_model.model."
# PEFT's name of each adapter leaf.
_LEAF_NAMES = {"lora_a": "lora_A.weight", "lora_b": "lora_B.weight"}

# adapter_config.json fields that change what the adapter computes (or which modules it holds)
# beyond plain LoRA, each with the value that means "off" and what it would need. A field absent
# from a folder (an older PEFT) is off.
_UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "use_dora": (False, "DoRA's magnitude vectors"),
    "use_rslora": (False, "rsLoRA's alpha/sqrt(r) scale"),
    "bias": ("none", "trained biases"),
    "lora_bias": (False, "a bias on lora_B"),
    "fan_in_fan_out": (False, "Conv1D-style [in, out] weights"),
    "modules_to_save": (None, "fully trained copies of other modules"),
    "layers_to_transform": (None, "adapters on some layers only"),
    "rank_pattern": ({}, "per-module ranks"),
    "alpha_pattern": ({}, "per-module alphas"),
    "exclude_modules": (None, "modules excluded from the targets"),
    "layer_replication": (None, "replicated layers"),
    "target_parameters": (None, "LoRA on nn.Parameters"),
    "trainable_token_indices": (None, "trained embedding rows"),
    "alora_invocation_tokens": (None, "activated LoRA (aLoRA)"),
    "use_qalora": (False, "QALoRA's pooled inputs"),
    "use_bdlora": (None, "block-diagonal LoRA"),
    "kasa_config": (None, "KaSA's singular values"),
    "monteclora_config": (None, "MonteCLoRA's sampling"),
    "arrow_config": (None, "Arrow routing"),
}
_TASK_TYPES = ("CAUSAL_LM", None)


def _is_off(value: Any, off: Any) -> bool:
  # null, false, {}, [] and the default all mean off (PEFT writes some of each).
  return value == off or value is None or value is False or value == {} or value == []


# --------------------------------------------------------------------------- names and layouts


@functools.lru_cache(maxsize=None)
def _layout(cfg: QwenConfig, spec: LoraSpec) -> tuple[tuple[tuple[str, ...], str, tuple[int, ...]],
                                                       ...]:
  """(adapter leaf path, PEFT tensor name, our shape) per leaf, in the model's order: layer by
  layer, q k v o gate up down, A then B (checks report the first bad tensor in that order).

  A module's PEFT path is the Hugging Face name of the kernel the adapter sits beside."""
  kernels = _param_map(cfg)
  rows = []
  for keys, leaf in _flat(adapter_abstract(cfg, spec)):
    module = kernels[keys[:-1] + ("kernel",)][0].removesuffix(".weight")
    rows.append((keys, f"{_PREFIX}{module}.{_LEAF_NAMES[keys[-1]]}", tuple(leaf.shape)))
  rows.sort(key=lambda row: (int(row[0][0].removeprefix("layers_")),
                             ALL_TARGETS.index(row[0][-2]), row[0][-1]))
  return tuple(rows)


def peft_names(cfg: QwenConfig, spec: LoraSpec) -> dict[tuple[str, ...], str]:
  """Adapter leaf path (e.g. ("layers_0", "self_attn", "q_proj", "lora_a")) -> PEFT tensor name
  (e.g. "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")."""
  return {keys: name for keys, name, _ in _layout(cfg, spec)}


def _flat(tree: Any) -> list[tuple[tuple[str, ...], Any]]:
  return [(tuple(p.key for p in path), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _peft_shape(leaf: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """PEFT's shape of an adapter leaf: lora_a [*in, r] -> [r, in]; lora_b [r, *out] -> [out, r]."""
  if leaf == "lora_a":
    return (shape[-1], math.prod(shape[:-1]))
  return (math.prod(shape[1:]), shape[0])


def _to_peft(leaf: str, ours: np.ndarray) -> np.ndarray:
  if leaf == "lora_a":
    return ours.reshape(-1, ours.shape[-1]).T
  return ours.reshape(ours.shape[0], -1).T


def _from_peft(theirs: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """PEFT's [r, in] / [out, r] -> our [*in, r] / [r, *out] (the inverse of _to_peft)."""
  return theirs.T.reshape(shape)


# --------------------------------------------------------------------------- export


def peft_config(spec: LoraSpec, base_model_name_or_path: str = "") -> dict[str, Any]:
  """The adapter_config.json of an adapter of `spec` (plain LoRA: every option off)."""
  alpha = spec.alpha
  return {
      "peft_type": "LORA",
      "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base_model_name_or_path or None,
      "r": spec.rank,
      "lora_alpha": int(alpha) if float(alpha).is_integer() else float(alpha),
      # Sorted names of the targets: the same modules PEFT's set-valued field would write.
      "target_modules": sorted(spec.targets),
      "lora_dropout": 0.0,
      "bias": "none",
      "fan_in_fan_out": False,
      "use_rslora": False,
      "use_dora": False,
      "modules_to_save": None,
      "layers_to_transform": None,
      "layers_pattern": None,
      "rank_pattern": {},
      "alpha_pattern": {},
      "init_lora_weights": True,
      "inference_mode": True,
      "revision": None,
  }


def peft_tensors(cfg: QwenConfig, spec: LoraSpec, adapter: Any
                 ) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (PEFT tensor name, float32 host array) per adapter leaf, gathered across hosts
  (every process must consume it: the gathers are collective)."""
  for path, name, _ in _layout(cfg, spec):
    arr = _get(adapter, path)
    if isinstance(arr, jax.Array) and not arr.is_fully_addressable:
      arr = multihost_utils.process_allgather(arr, tiled=True)
    host = np.asarray(jax.device_get(arr), np.float32)
    yield name, np.ascontiguousarray(_to_peft(path[-1], host))


def save_peft(path: str, cfg: QwenConfig, spec: LoraSpec, adapter: Any,
              base_model_name_or_path: str = "") -> str:
  """Writes one adapter (a tree of `init_adapters`' shape) as a PEFT folder; returns its path.

  Float32 tensors in adapter_model.safetensors (safetensors' own writer) beside
  adapter_config.json, written with checkpoint.staged_folder: beside the target, then swapped in
  whole. On multi-host runs every process must call this (the adapter is gathered); process 0
  writes.
  """
  for leaf_path, _, shape in _layout(cfg, spec):
    got = tuple(_get(adapter, leaf_path).shape)
    if got != shape:
      raise ValueError(f"adapter leaf {'/'.join(leaf_path)} has shape {list(got)}, expected "
                       f"{list(shape)} for rank {spec.rank} on this model")
  tensors = dict(peft_tensors(cfg, spec, adapter))  # adapters are small: gathered at once
  if jax.process_index() != 0:
    return path
  path = os.path.abspath(path)
  with staged_folder(path) as staging:
    write_safetensors(os.path.join(staging, WEIGHTS_FILE), tensors)
    with open(os.path.join(staging, CONFIG_FILE), "w") as f:
      json.dump(peft_config(spec, base_model_name_or_path), f, indent=2)
  return path


# --------------------------------------------------------------------------- import


def read_peft_config(path: str) -> dict[str, Any]:
  """adapter_config.json of a PEFT folder, checked to describe plain LoRA on this model's
  projections (target_modules a list of projection names). Raises CheckpointError naming the
  file and the field."""
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise CheckpointError(f"{config_path}: missing; not a PEFT adapter folder")
  try:
    with open(config_path) as f:
      config = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{config_path}: not valid JSON ({e})") from None
  if not isinstance(config, dict):
    raise CheckpointError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
  if config.get("peft_type") != "LORA":
    raise CheckpointError(f"{config_path}: peft_type is {config.get('peft_type')!r}; only "
                          "'LORA' adapters are supported")
  if config.get("task_type") not in _TASK_TYPES:
    raise CheckpointError(f"{config_path}: task_type is {config.get('task_type')!r}; only "
                          "'CAUSAL_LM' adapters are supported")
  for field, (off, what) in _UNSUPPORTED.items():
    if field in config and not _is_off(config[field], off):
      raise CheckpointError(f"{config_path}: {field}={config[field]!r} is not supported (it "
                            f"needs {what}; agentjax adapters are plain LoRA)")
  r = config.get("r")
  if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
    raise CheckpointError(f"{config_path}: r must be a positive integer, got {r!r}")
  alpha = config.get("lora_alpha")
  if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
    raise CheckpointError(f"{config_path}: lora_alpha must be a positive number, got {alpha!r}")
  targets = config.get("target_modules")
  if isinstance(targets, str):
    raise CheckpointError(
        f"{config_path}: target_modules is the string {targets!r}, which PEFT reads as a regular "
        f"expression over module paths; only a list of projection names is supported (save the "
        f"adapter with target_modules=[...], a subset of {list(ALL_TARGETS)})")
  if not isinstance(targets, list) or not targets:
    raise CheckpointError(f"{config_path}: target_modules must be a non-empty list of "
                          f"projection names, got {targets!r}")
  unknown = [t for t in targets if t not in ALL_TARGETS]
  if unknown:
    raise CheckpointError(f"{config_path}: target_modules names {unknown}, not projections "
                          f"this model adapts (expected a subset of {list(ALL_TARGETS)})")
  return config


def peft_spec(path: str, name: str = "policy") -> LoraSpec:
  """The LoraSpec (one adapter called `name`) a PEFT folder's adapter_config.json describes."""
  config = read_peft_config(path)
  targets = tuple(t for t in ALL_TARGETS if t in config["target_modules"])
  return LoraSpec(names=(name,), rank=config["r"], alpha=float(config["lora_alpha"]),
                  targets=targets)


def validate_peft(path: str, cfg: QwenConfig, spec: LoraSpec) -> dict[str, Tensor]:
  """Checks a PEFT folder against `spec` and the model's shapes from the config and the file
  header (no tensor data is read); returns the weights' tensors by name, unread."""
  config_path = os.path.join(path, CONFIG_FILE)
  config = read_peft_config(path)
  if config["r"] != spec.rank:
    raise CheckpointError(f"{config_path}: r={config['r']}, expected rank {spec.rank}")
  if float(config["lora_alpha"]) != float(spec.alpha):
    raise CheckpointError(f"{config_path}: lora_alpha={config['lora_alpha']}, expected "
                          f"alpha {spec.alpha:g}")
  if set(config["target_modules"]) != set(spec.targets):
    raise CheckpointError(f"{config_path}: target_modules={sorted(config['target_modules'])}, "
                          f"expected {sorted(spec.targets)}")
  weights = os.path.join(path, WEIGHTS_FILE)
  if not os.path.isfile(weights):
    pickled = os.path.isfile(os.path.join(path, "adapter_model.bin"))
    raise CheckpointError(f"{weights}: missing" + (
        " (found adapter_model.bin: pickle weights are never read; re-save with "
        "safe_serialization=True)" if pickled else ""))
  tensors = _open_weights(weights)
  expected = {name: _peft_shape(leaf_path[-1], shape) for leaf_path, name, shape in
              _layout(cfg, spec)}
  missing = [n for n in expected if n not in tensors]
  if missing:
    raise CheckpointError(f"{weights}: tensor {missing[0]!r} is missing"
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                          + f"; expected for targets {sorted(spec.targets)} on "
                            f"{cfg.num_layers} layers")
  extra = sorted(set(tensors) - set(expected))
  if extra:
    raise CheckpointError(f"{weights}: unexpected tensor {extra[0]!r}"
                          + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                          + f"; not an adapter of targets {sorted(spec.targets)} on a "
                            f"{cfg.num_layers}-layer {cfg.model_type} model")
  for name, shape in expected.items():
    got, dtype = tensors[name].shape, tensors[name].dtype
    if got != shape:
      raise CheckpointError(
          f"{weights}: tensor {name!r} has shape {list(got)}, expected {list(shape)} "
          f"(rank {spec.rank}; hidden {cfg.hidden_size}, heads {cfg.num_heads}x"
          f"{cfg.head_dim}, kv heads {cfg.num_kv_heads}, mlp {cfg.intermediate_size})")
    if dtype not in FLOAT_DTYPES:
      raise CheckpointError(f"{weights}: tensor {name!r} has non-float dtype {dtype}")
  return tensors


def _open_weights(file_path: str) -> dict[str, Tensor]:
  """The tensors of one safetensors file by name (the library validates the header on opening;
  data is read only when a tensor is sliced)."""
  try:
    handle = safe_open(file_path, framework="numpy")
  except (SafetensorError, OSError) as e:
    raise CheckpointError(f"{file_path}: not a valid safetensors file ({e})") from None
  return {name: Tensor(file_path, name, handle.get_slice(name)) for name in handle.keys()}


def load_peft(path: str, cfg: QwenConfig, spec: LoraSpec,
              mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Reads a PEFT adapter folder into one adapter tree (float32 lora_a [*in, r], lora_b
  [r, *out] per target), placed by adapter_shardings on `mesh` (default: the first local
  device). Everything is validated first (validate_peft); then each tensor is read once."""
  tensors = validate_peft(path, cfg, spec)
  shardings = adapter_shardings(cfg, spec, mesh) if mesh is not None else None
  default = SingleDeviceSharding(jax.local_devices()[0])
  adapter: dict[str, Any] = {}
  for leaf_path, name, shape in _layout(cfg, spec):
    host = _from_peft(np.asarray(tensors[name], np.float32), shape)
    sharding = _get(shardings, leaf_path) if shardings is not None else default
    _set(adapter, leaf_path,
         jax.make_array_from_callback(shape, sharding, lambda index, host=host: host[index]))
  return adapter
