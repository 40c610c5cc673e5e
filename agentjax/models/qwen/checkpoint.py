"""Hugging Face checkpoint interop for Qwen: safetensors folder <-> sharded agentjax params.

    cfg, params = load_hf("path/to/Qwen2.5-7B-Instruct", mesh=mesh)  # placed shard by shard
    save_hf("path/to/export", cfg, params)                         # transformers loads this

Loading validates every tensor name, shape and dtype against the config from the file headers
before reading any data, so a bad checkpoint fails with an error naming the tensor and nothing
half-loaded is returned. Each device's shard is read on its own from the memory-mapped file
(the safetensors library's get_slice, called by jax.make_array_from_callback): no process ever
materializes a whole float32 copy of the model on one device.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import SingleDeviceSharding

from agentjax.models.qwen.config import QwenConfig
from agentjax.models.qwen.model import abstract_params, param_shardings
from agentjax.models.safetensors_io import (FLOAT_DTYPES, CheckpointError, SafetensorsFolder,
                                            write_safetensors_folder)

log = logging.getLogger(__name__)

# Tensors that may appear in a folder without being parameters of the model.
_IGNORABLE_SUFFIXES = (".rotary_emb.inv_freq",)

# Layout kinds between our parameter (left) and the Hugging Face tensor (right):
#   copy   same layout
#   T      [in, out] <- [out, in]                        (nn.Linear weight)
#   heads  [E, heads, D] <- [heads*D, E]                 (q/k/v_proj.weight)
#   hbias  [heads, D] <- [heads*D]                       (q/k/v_proj.bias)
#   o      [H, D, E] <- [E, H*D]                         (o_proj.weight)


def _param_map(cfg: QwenConfig) -> dict[tuple[str, ...], tuple[str, str]]:
  """Our param path -> (Hugging Face tensor name, layout kind)."""
  out: dict[tuple[str, ...], tuple[str, str]] = {
      ("embed_tokens",): ("model.embed_tokens.weight", "copy"),
      ("norm", "scale"): ("model.norm.weight", "copy"),
  }
  if not cfg.tie_word_embeddings:
    out[("lm_head",)] = ("lm_head.weight", "T")
  for i in range(cfg.num_layers):
    ours, hf = f"layers_{i}", f"model.layers.{i}"
    out[(ours, "input_layernorm", "scale")] = (f"{hf}.input_layernorm.weight", "copy")
    out[(ours, "post_attention_layernorm", "scale")] = (f"{hf}.post_attention_layernorm.weight", "copy")
    for proj in ("q_proj", "k_proj", "v_proj"):
      out[(ours, "self_attn", proj, "kernel")] = (f"{hf}.self_attn.{proj}.weight", "heads")
      if cfg.qkv_bias:
        out[(ours, "self_attn", proj, "bias")] = (f"{hf}.self_attn.{proj}.bias", "hbias")
    out[(ours, "self_attn", "o_proj", "kernel")] = (f"{hf}.self_attn.o_proj.weight", "o")
    if cfg.qk_norm:
      out[(ours, "self_attn", "q_norm", "scale")] = (f"{hf}.self_attn.q_norm.weight", "copy")
      out[(ours, "self_attn", "k_norm", "scale")] = (f"{hf}.self_attn.k_norm.weight", "copy")
    for proj in ("gate_proj", "up_proj", "down_proj"):
      out[(ours, "mlp", proj, "kernel")] = (f"{hf}.mlp.{proj}.weight", "T")
  return out


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if kind == "copy":
    return shape
  if kind == "T":
    return shape[::-1]
  if kind == "heads":
    return (shape[1] * shape[2], shape[0])
  if kind == "hbias":
    return (shape[0] * shape[1],)
  if kind == "o":
    return (shape[2], shape[0] * shape[1])
  raise AssertionError(kind)


def _read_slice(hf: np.ndarray, kind: str, shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
  """Reads our-layout block `index` of the parameter from the HF tensor, touching only its rows."""
  idx = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
  if kind == "copy":
    return np.asarray(hf[idx])
  if kind == "T":
    return np.asarray(hf[idx[1], idx[0]]).T
  d = shape[-1] if kind in ("heads", "hbias") else shape[1]
  if kind == "heads":   # ours [E, h, D]
    se, sh, sd = idx
    block = np.asarray(hf[sh.start * d:sh.stop * d, se]).T          # [e, h*D]
    return block.reshape(block.shape[0], -1, d)[:, :, sd]
  if kind == "hbias":   # ours [h, D]
    sh, sd = idx
    return np.asarray(hf[sh.start * d:sh.stop * d]).reshape(-1, d)[:, sd]
  if kind == "o":       # ours [h, D, E]
    sh, sd, se = idx
    block = np.asarray(hf[se, sh.start * d:sh.stop * d]).T          # [h*D, e]
    return block.reshape(-1, d, block.shape[1])[:, sd, :]
  raise AssertionError(kind)


def _to_hf(kind: str, ours: np.ndarray) -> np.ndarray:
  if kind == "copy":
    return ours
  if kind == "T":
    return ours.T
  if kind == "heads":
    return ours.reshape(ours.shape[0], -1).T
  if kind == "hbias":
    return ours.reshape(-1)
  if kind == "o":
    return ours.reshape(-1, ours.shape[-1]).T
  raise AssertionError(kind)


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


# A param map: our param path -> (Hugging Face tensor name, layout kind), as `_param_map(cfg)`
# gives for the causal LM; a model built on the trunk (agentjax/models/qwen/value.py) extends it.
ParamMap = Mapping[tuple[str, ...], tuple[str, str]]


def expected_tensors(mapping: ParamMap, abstract: Any) -> dict[str, tuple[int, ...]]:
  """{Hugging Face tensor name: shape} of the parameters of `mapping` (shapes from `abstract`,
  a tree of ShapeDtypeStructs like the params)."""
  return {hf_name: _hf_shape(kind, _get(abstract, path).shape)
          for path, (hf_name, kind) in mapping.items()}


def check_tensors(folder: SafetensorsFolder, expected: Mapping[str, tuple[int, ...]],
                  allowed_extra: set[str], what: str) -> None:
  """The folder holds exactly the `expected` float tensors with their shapes (plus any of
  `allowed_extra` and ignorable buffers); errors name the tensor and its file. what: the model
  the tensors are checked against, for the unexpected-tensor error."""
  present = set(folder)
  missing = sorted(set(expected) - present)
  if missing:
    raise CheckpointError(f"{folder.path}: checkpoint is missing tensor {missing[0]!r}"
                          + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
  extra = sorted(n for n in present - set(expected) - allowed_extra
                 if not n.endswith(_IGNORABLE_SUFFIXES))
  if extra:
    raise CheckpointError(f"{folder.path}: checkpoint has unexpected tensor {extra[0]!r}"
                          + (f" and {len(extra) - 1} more" if len(extra) > 1 else "")
                          + f" (not part of a {what} with this config.json)")
  for name, shape in expected.items():
    if folder.shape(name) != shape:
      raise CheckpointError(f"{folder.file_of(name)}: tensor {name!r} has shape "
                            f"{list(folder.shape(name))}, expected {list(shape)} from config.json")
    if folder.dtype(name) not in FLOAT_DTYPES:
      raise CheckpointError(f"{folder.file_of(name)}: tensor {name!r} has non-float dtype "
                            f"{folder.dtype(name)}")


def validate_tensors(cfg: QwenConfig, folder: SafetensorsFolder) -> None:
  """Checks that the folder holds exactly the model's tensors with the right shapes."""
  # A tied checkpoint may still carry lm_head.weight (a copy of the embedding): harmless.
  check_tensors(folder, expected_tensors(_param_map(cfg), abstract_params(cfg)),
                {"lm_head.weight"} if cfg.tie_word_embeddings else set(),
                f"{cfg.model_type} model")


def params_from_tensors(cfg: QwenConfig, tensors: Mapping[str, Any],
                        shardings: Any | None = None) -> Any:
  """Builds (sharded) params from a mapping of Hugging Face tensor names to arrays.

  `tensors` may be a SafetensorsFolder (each tensor read block by block as it is sliced) or any
  dict of numpy arrays, e.g. a transformers state_dict converted to numpy. Each device's block is
  read and cast separately.
  """
  return arrays_from_tensors(_param_map(cfg), abstract_params(cfg), tensors, shardings)


def arrays_from_tensors(mapping: ParamMap, abstract: Any, tensors: Mapping[str, Any],
                        shardings: Any | None = None) -> Any:
  """`params_from_tensors` for any param map: the params tree of `mapping`'s paths, shapes and
  dtypes from `abstract`, placed by `shardings` (a tree like it; default: the first device)."""
  params: dict[str, Any] = {}
  default = SingleDeviceSharding(jax.local_devices()[0])
  for path, (hf_name, kind) in mapping.items():
    leaf = _get(abstract, path)
    sharding = _get(shardings, path) if shardings is not None else default
    hf = tensors[hf_name]
    shape, dtype = tuple(leaf.shape), leaf.dtype

    def callback(index, hf=hf, kind=kind, shape=shape, dtype=dtype):
      return _read_slice(hf, kind, shape, index).astype(dtype)

    _set(params, path, jax.make_array_from_callback(shape, sharding, callback))
  return params


def load_hf(path: str, mesh: jax.sharding.Mesh | None = None, **config_overrides: Any
            ) -> tuple[QwenConfig, Any]:
  """Loads a Hugging Face Qwen2/2.5/3 folder (config.json + safetensors) into sharded params.

  Args:
    path: checkpoint folder.
    mesh: place parameters by the rules table on this mesh; default: the first local device.
    config_overrides: QwenConfig fields to change, e.g. param_dtype="bfloat16", remat_policy="full".
  Returns:
    (config, params).
  """
  cfg = QwenConfig.from_hf_folder(path, **config_overrides)
  folder = SafetensorsFolder(path)
  validate_tensors(cfg, folder)
  shardings = param_shardings(cfg, mesh) if mesh is not None else None
  return cfg, params_from_tensors(cfg, folder, shardings)


def hf_tensors(cfg: QwenConfig, params: Any, dtype: Any = None) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (Hugging Face name, host array) one parameter at a time (gathered across hosts)."""
  return tensors_of(_param_map(cfg), params, dtype)


def tensors_of(mapping: ParamMap, params: Any, dtype: Any = None
               ) -> Iterator[tuple[str, np.ndarray]]:
  """`hf_tensors` for any param map."""
  for path, (hf_name, kind) in mapping.items():
    arr = _get(params, path)
    if isinstance(arr, jax.Array) and not arr.is_fully_addressable:
      arr = multihost_utils.process_allgather(arr, tiled=True)
    host = np.asarray(jax.device_get(arr))
    if dtype is not None:
      host = host.astype(dtype)
    yield hf_name, np.ascontiguousarray(_to_hf(kind, host))


# Names beside an export `<parent>/<name>` (hidden, so that they never look like an export):
#   .<name>.tmp-<random>   a write in progress, or a dead one: never a complete export
#   .<name>.bak-<ns>-<pid>   the previous export while the new one is moved into place
_TMP, _BAK = ".tmp-", ".bak-"


def _siblings(path: str, kind: str) -> list[str]:
  parent, name = os.path.split(path)
  return sorted(glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(name)}{kind}*")))


def recover_export(path: str) -> str:
  """Puts an export interrupted by a crash back in order; returns `path`.

  If `path` is missing but a backup of a previous export is left beside it (the process died
  between moving the old export aside and moving the new one in), the newest backup is renamed
  back to `path`. Leftover partial writes (and older backups, once `path` is complete) are
  removed. A complete export at `path` is never touched. save_hf calls this first; a trainer calls
  it at start-up. Only process 0 acts (it is the one that writes exports), and only one writer
  may export to `path` at a time.
  """
  path = os.path.abspath(path)
  if jax.process_index() != 0:
    return path
  backups = _siblings(path, _BAK)
  legacy = path + ".old"  # the backup name of earlier versions of save_hf
  if not os.path.exists(path) and not backups and os.path.isdir(legacy):
    backups = [legacy]
  if not os.path.exists(path) and backups:
    os.replace(backups.pop(), path)  # names sort by time: the last one is the newest
    log.warning("recovered the export %s from its backup (a previous export was interrupted)", path)
  for stale in backups + _siblings(path, _TMP):  # dead writes; backups older than `path`
    shutil.rmtree(stale, ignore_errors=True)
    log.info("removed %s, left by an interrupted export", stale)
  return path


@contextlib.contextmanager
def staged_folder(path: str) -> Iterator[str]:
  """Writes a folder crash-safely: yields an empty staging folder beside `path` to fill, then
  swaps it in whole when the `with` block ends without an error.

  The staging folder is `.<name>.tmp-*` beside the target; at the end the previous folder (if
  any) is renamed to a unique backup, the new one renamed into place, then the backup removed. At
  every moment one complete folder exists under `path` or under the backup, and recover_export
  (run here first, and by a trainer at start-up) restores it after a crash. On an error in the
  block the staging folder is removed and the previous folder is left as it was. Process 0 only:
  the caller gathers across hosts and lets the other processes skip the write.
  """
  path = recover_export(path)
  parent, name = os.path.split(path)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{name}{_TMP}", dir=parent)
  backup = None
  try:
    yield staging
    if os.path.exists(path):
      backup = os.path.join(parent, f".{name}{_BAK}{time.time_ns():020d}-{os.getpid()}")
      os.replace(path, backup)
    os.replace(staging, path)
  except BaseException:
    if backup is not None and not os.path.exists(path):
      os.replace(backup, path)  # interrupted between the two renames: put the old folder back
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if backup is not None:
    # Renamed before deletion so that a crash mid-delete never leaves a partial folder under a
    # backup name (recover_export would take it for a complete export).
    doomed = tempfile.mkdtemp(prefix=f".{name}{_TMP}", dir=parent)
    os.replace(backup, os.path.join(doomed, name))
    shutil.rmtree(doomed)


def save_hf(path: str, cfg: QwenConfig, params: Any, tokenizer: Any = None,
            dtype: Any = None, max_shard_bytes: int = 4 << 30,
            copy_files: Sequence[str] = ()) -> str:
  """Exports params as a folder `transformers.AutoModelForCausalLM.from_pretrained` loads.

  copy_files: files copied as they are into the folder (e.g. a base checkpoint's tokenizer and
  generation_config.json, for an export derived from it).

  The folder is written with `staged_folder`: beside the target, then swapped in whole, so that a
  crash never leaves a partial export under `path`. On multi-host runs every process must call
  this (parameters are gathered); only process 0 writes. Returns the absolute path.
  """
  hf_config = cfg.to_hf_dict()
  if dtype is not None:
    hf_config["dtype"] = np.dtype(dtype).name
  return write_hf_folder(path, hf_tensors(cfg, params, dtype), hf_config, tokenizer,
                         max_shard_bytes, copy_files)


def write_hf_folder(path: str, tensors: Iterator[tuple[str, np.ndarray]],
                    hf_config: Mapping[str, Any], tokenizer: Any = None,
                    max_shard_bytes: int = 4 << 30, copy_files: Sequence[str] = (),
                    extra_json: Mapping[str, Any] | None = None) -> str:
  """A Hugging Face folder at `path`: the (name, host array) `tensors` as safetensors shards,
  `hf_config` as config.json, the tokenizer and `copy_files` beside them, and extra_json's
  {relative path: object} as JSON files (e.g. sentence-transformers' 1_Pooling/config.json);
  written with `staged_folder` (see save_hf). Every process consumes `tensors` (their gathers);
  process 0 writes. Returns the absolute path."""
  if jax.process_index() != 0:
    for _ in tensors:  # take part in the gathers
      pass
    return path
  path = os.path.abspath(path)
  with staged_folder(path) as staging:
    write_safetensors_folder(staging, tensors, max_shard_bytes)
    with open(os.path.join(staging, "config.json"), "w") as f:
      json.dump(dict(hf_config), f, indent=2)
    if tokenizer is not None:
      tokenizer.save_pretrained(staging)
    for src in copy_files:
      shutil.copy(src, os.path.join(staging, os.path.basename(src)))
    for name, value in (extra_json or {}).items():
      os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
      with open(os.path.join(staging, name), "w") as f:
        json.dump(value, f, indent=2)
  return path
