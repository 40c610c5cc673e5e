"""Reading and writing Hugging Face safetensors folders, memory-mapped, without torch or pickle.

We parse the safetensors format directly (an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then raw little-endian bytes) so that:
  * tensors are numpy views of a memory map: a loader reads only the slice one device shard needs;
  * bfloat16 works (numpy-based readers reject it) through ml_dtypes.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Iterable, Mapping

import ml_dtypes
import numpy as np

_CODE_TO_DTYPE = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_TO_CODE = {v: k for k, v in _CODE_TO_DTYPE.items()}
FLOAT_DTYPES = frozenset(_CODE_TO_DTYPE[c] for c in ("F64", "F32", "F16", "BF16"))
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
  """A checkpoint folder or file that cannot be read as the model; the message names the tensor."""


class SafetensorsFile:
  """One .safetensors file: header parsed eagerly, data memory-mapped lazily."""

  def __init__(self, path: str):
    self.path = path
    try:
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
          raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > size - 8:
          raise CheckpointError(f"{path}: header length {header_len} exceeds the file size {size}")
        header = json.loads(f.read(header_len))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
      raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    self.metadata = header.pop("__metadata__", None) or {}
    self._data_start = 8 + header_len
    self._entries = {}
    for name, entry in header.items():
      code = entry.get("dtype") if isinstance(entry, dict) else None
      if code not in _CODE_TO_DTYPE:
        raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {code!r}")
      dtype = _CODE_TO_DTYPE[code]
      try:
        shape = tuple(int(s) for s in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
      except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: tensor {name!r} has a corrupt header entry ({e!r})") from None
      if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) or \
          self._data_start + end > size:
        raise CheckpointError(f"{path}: tensor {name!r} has data offsets {[begin, end]} that do "
                              f"not match its shape {list(shape)} and dtype {code} or the file size")
      self._entries[name] = (dtype, shape, begin)
    self._mmap = None

  def names(self) -> list[str]:
    return list(self._entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._entries[name][1]

  def dtype(self, name: str) -> np.dtype:
    return self._entries[name][0]

  def tensor(self, name: str) -> np.ndarray:
    """A read-only numpy view of the tensor (no copy until sliced and cast)."""
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    dtype, shape, begin = self._entries[name]
    count = int(np.prod(shape, dtype=np.int64))
    start = self._data_start + begin
    flat = self._mmap[start:start + count * dtype.itemsize].view(dtype)
    return flat.reshape(shape)


class SafetensorsFolder(Mapping[str, np.ndarray]):
  """All tensors of a Hugging Face checkpoint folder, by name.

  Accepts model.safetensors, a sharded set described by model.safetensors.index.json, or (failing
  both) every *.safetensors file in the folder. Pickle formats (*.bin, *.pt) are never read.
  """

  def __init__(self, path: str):
    self.path = path
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.exists(index_path):
      with open(index_path) as f:
        try:
          weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
          raise CheckpointError(f"{index_path}: corrupt index ({e!r})") from None
      files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
      files = [SINGLE_FILE]
    else:
      files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
      pickled = [p for p in os.listdir(path) if p.endswith((".bin", ".pt", ".pth"))] \
          if os.path.isdir(path) else []
      hint = f" (found pickle weights {pickled}: convert them to safetensors first)" if pickled else ""
      raise CheckpointError(f"{path}: no safetensors weights in the folder{hint}")
    self._files = {}
    self._where: dict[str, SafetensorsFile] = {}
    for name in files:
      file_path = os.path.join(path, name)
      if not os.path.exists(file_path):
        raise CheckpointError(f"{path}: {INDEX_FILE} lists {name!r}, which is missing")
      st = SafetensorsFile(file_path)
      self._files[name] = st
      for tensor_name in st.names():
        if tensor_name in self._where:
          raise CheckpointError(f"{path}: tensor {tensor_name!r} appears in two files")
        self._where[tensor_name] = st

  def __getitem__(self, name: str) -> np.ndarray:
    return self._where[name].tensor(name)

  def __iter__(self):
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._where[name].shape(name)

  def file_of(self, name: str) -> str:
    return self._where[name].path


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes one safetensors file (tensors written in name order, header padded to 8 bytes)."""
  header, offset, arrays = {}, 0, []
  for name in sorted(tensors):
    arr = np.ascontiguousarray(tensors[name])
    if arr.dtype not in _DTYPE_TO_CODE:
      raise CheckpointError(f"tensor {name!r}: dtype {arr.dtype} cannot be written to safetensors")
    header[name] = {"dtype": _DTYPE_TO_CODE[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays.append(arr)
  # transformers refuses files whose metadata lacks a known format.
  header["__metadata__"] = dict(metadata or {"format": "pt"})
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays:
      f.write(arr.tobytes())


def write_safetensors_folder(path: str, tensors: Iterable[tuple[str, np.ndarray]],
                             max_shard_bytes: int = 4 << 30) -> None:
  """Writes tensors as model.safetensors or, above max_shard_bytes, as
  model-0000k-of-0000n.safetensors shards with an index file.

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
