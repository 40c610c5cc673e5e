"""Hugging Face safetensors folders, read and written through the `safetensors` library.

The library parses and validates each file's header when it is opened (offsets inside the file,
no overlap or gap between tensors, sizes that match shape and dtype) and reads a tensor only when
it is sliced: `safe_open(path, framework="numpy").get_slice(name)[rows, cols]` copies just that
block out of the memory-mapped file, so a loader reads only the part one device shard needs.

bfloat16: the library's numpy framework looks dtypes up by name, and numpy knows "bfloat16" only
once ml_dtypes is imported (without it, reading a BF16 tensor raises "data type 'bfloat16' not
understood"); this module imports ml_dtypes for that reason. Writing goes through
`safetensors.numpy.save_file`, which maps ml_dtypes.bfloat16 to BF16 itself.

What this module adds to the library: folders (model.safetensors, or shards listed by
model.safetensors.index.json), shards written one at a time as tensors are gathered, and errors
that name the file and the tensor.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterable, Iterator, Mapping

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for the library's numpy framework)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

# Safetensors dtype codes of the floating types a model may be loaded from.
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# transformers refuses files whose metadata lacks a known format.
_METADATA = {"format": "pt"}


class CheckpointError(ValueError):
  """A checkpoint folder or file that cannot be read as the model; the message names the tensor."""


class Tensor:
  """One tensor of an open safetensors file: shape and dtype from the header, data on slicing.

  `tensor[index]` (basic slices only) returns a numpy array holding just that block;
  `np.asarray(tensor)` reads the whole tensor.
  """

  def __init__(self, path: str, name: str, view: Any):
    self.path, self.name, self._view = path, name, view
    self.shape: tuple[int, ...] = tuple(view.get_shape())
    self.dtype: str = view.get_dtype()  # the safetensors code, e.g. "BF16"

  def __getitem__(self, index: Any) -> np.ndarray:
    try:
      return self._view[index]
    except (SafetensorError, TypeError, ValueError) as e:
      raise CheckpointError(f"{self.path}: cannot read tensor {self.name!r} ({e})") from None

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    whole = self[...]
    return whole if dtype is None else whole.astype(dtype)


def _open(path: str) -> Any:
  """Opens a file with the library, which validates the whole header before any tensor is read."""
  try:
    return safe_open(path, framework="numpy")
  except (SafetensorError, OSError) as e:
    raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None


class SafetensorsFolder(Mapping[str, Tensor]):
  """All tensors of a Hugging Face checkpoint folder, by name (headers only until sliced).

  Accepts model.safetensors, a sharded set described by model.safetensors.index.json, or (failing
  both) every *.safetensors file in the folder. Pickle formats (*.bin, *.pt) are never read.
  """

  def __init__(self, path: str):
    self.path = path
    files = self._list_files(path)
    self._where: dict[str, Tensor] = {}
    for name in files:
      file_path = os.path.join(path, name)
      if not os.path.exists(file_path):
        raise CheckpointError(f"{path}: {INDEX_FILE} lists {name!r}, which is missing")
      handle = _open(file_path)
      for tensor_name in handle.keys():
        if tensor_name in self._where:
          raise CheckpointError(f"{path}: tensor {tensor_name!r} appears in two files "
                                f"({self._where[tensor_name].path} and {file_path})")
        self._where[tensor_name] = Tensor(file_path, tensor_name, handle.get_slice(tensor_name))

  @staticmethod
  def _list_files(path: str) -> list[str]:
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.exists(index_path):
      try:
        with open(index_path) as f:
          weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
      except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index_path}: corrupt index ({e!r})") from None
      for name in files:
        # The index names files of this folder only: no paths that lead out of it.
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
          raise CheckpointError(f"{index_path}: weight_map names {name!r}, not a file name")
      return files
    if os.path.exists(os.path.join(path, SINGLE_FILE)):
      return [SINGLE_FILE]
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
      pickled = [p for p in os.listdir(path) if p.endswith((".bin", ".pt", ".pth"))] \
          if os.path.isdir(path) else []
      hint = (f" (found pickle weights {pickled}: convert them to safetensors first)"
              if pickled else "")
      raise CheckpointError(f"{path}: no safetensors weights in the folder{hint}")
    return files

  def __getitem__(self, name: str) -> Tensor:
    return self._where[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._where[name].shape

  def dtype(self, name: str) -> str:
    """The tensor's safetensors dtype code ("F32", "BF16", ...)."""
    return self._where[name].dtype

  def file_of(self, name: str) -> str:
    return self._where[name].path


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
  """Writes one safetensors file with `safetensors.numpy.save_file` (metadata format "pt")."""
  # save_file reads each array's buffer as it lies in memory: make every one contiguous first.
  arrays = {name: np.asarray(arr, order="C") for name, arr in tensors.items()}  # keeps 0-d as 0-d
  try:
    save_file(arrays, path, metadata=dict(_METADATA))
  except (SafetensorError, TypeError, ValueError) as e:
    kinds = sorted({str(a.dtype) for a in arrays.values()})
    raise CheckpointError(f"{path}: cannot write tensors of dtypes {kinds} ({e})") from None


def write_safetensors_folder(path: str, tensors: Iterable[tuple[str, np.ndarray]],
                             max_shard_bytes: int = 4 << 30) -> None:
  """Writes tensors as model.safetensors or, above max_shard_bytes, as
  model-0000k-of-0000n.safetensors shards with an index file (the layout transformers writes).

  `tensors` is an iterable so that a caller can gather one tensor at a time; each shard is written
  as soon as it is full, so at most one shard is held in host memory.
  """
  written: list[tuple[str, list[str]]] = []
  shard: dict[str, np.ndarray] = {}
  size = total = 0

  def flush():
    part = os.path.join(path, f"shard-{len(written):05d}.part")
    write_safetensors(part, shard)
    written.append((part, list(shard)))

  for name, arr in tensors:
    if shard and size + arr.nbytes > max_shard_bytes:
      flush()
      shard, size = {}, 0
    shard[name] = arr
    size += arr.nbytes
    total += arr.nbytes
  flush()
  if len(written) == 1:
    os.replace(written[0][0], os.path.join(path, SINGLE_FILE))
    return
  weight_map = {}
  for k, (part, names) in enumerate(written):
    file_name = f"model-{k + 1:05d}-of-{len(written):05d}.safetensors"
    os.replace(part, os.path.join(path, file_name))
    weight_map.update({name: file_name for name in names})
  with open(os.path.join(path, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
