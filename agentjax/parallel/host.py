"""Moving values to the host on one or many processes, doing a step on process 0 first, and
handing process 0's host-side value (e.g. a retriever's answer) to every process.

On a multi-host run (TPU pod, several GPU hosts) a batch-sharded array spans devices of other
processes, so `jax.device_get` refuses it. Every process runs the same host logic (parsing, search,
rewards) on the whole batch, so each needs the whole value: `to_host` all-gathers such arrays
(a collective: every process must call it, in the same order) and fetches the rest directly.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils


def _one(x: Any) -> Any:
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.device_get(x)


class DeviceTurn:
  """Who may dispatch device programs, when two threads share a multi-device mesh.

  Two threads dispatching SPMD programs onto the same devices can enqueue them in different
  orders on different devices; a program's collectives then wait on a device busy with the other
  program, forever (seen on 8 fake CPU devices: an all-reduce rendezvous timeout). Asynchronous
  RL's colocated pipeline on a multi-device mesh (train/pipeline.py) therefore lets one thread at
  a time hold the devices: the update holds them for all of RLStep.consume, the rollout producer
  for its production except its host waits (`host_wait`: the retriever, the judge), so what
  overlaps is the host waits of one with the device work of the other. One device needs none of
  this (no collectives): the pipeline then does not take turns.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._holder = threading.local()

  @contextlib.contextmanager
  def hold(self) -> Iterator[None]:
    """The calling thread holds the devices inside the block."""
    with self._lock:
      self._holder.held = True
      try:
        yield
      finally:
        self._holder.held = False

  @contextlib.contextmanager
  def host_wait(self) -> Iterator[None]:
    """Host-only work (nothing dispatched inside): the devices are let go for its duration when
    the calling thread holds them, and taken back after; otherwise nothing happens."""
    if not getattr(self._holder, "held", False):
      yield
      return
    self._holder.held = False
    self._lock.release()
    try:
      yield
    finally:
      self._lock.acquire()
      self._holder.held = True


DEVICE_TURN = DeviceTurn()


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any (e.g. a SIGTERM one host received)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


def broadcast_from_primary(value: Any) -> Any:
  """Process 0's `value` (anything JSON can hold) on every process; others pass anything (e.g.
  None). A collective: every process calls it, in the same order. A no-op on one process.

  If process 0's value cannot be encoded, every process raises ValueError (none is left waiting).
  """
  if jax.process_count() == 1:
    return value
  primary = jax.process_index() == 0
  payload = b""
  if primary:
    try:
      payload = json.dumps(value, allow_nan=True).encode()
    except (TypeError, ValueError) as e:
      payload = json.dumps({_ENCODE_ERROR: repr(e)[:300]}).encode()
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(payload))))
  # Padded to a power of two (JSON ignores trailing spaces): broadcast_one_to_all compiles one
  # program per shape, so a few sizes serve every call.
  padded = 1 << max(8, (size - 1).bit_length())
  data = np.full(padded, ord(" "), np.uint8)
  data[:len(payload)] = np.frombuffer(payload, np.uint8)
  out = json.loads(np.asarray(multihost_utils.broadcast_one_to_all(data)).tobytes().decode())
  if isinstance(out, dict) and _ENCODE_ERROR in out:
    raise ValueError(f"broadcast_from_primary: process 0's value is not JSON: "
                     f"{out[_ENCODE_ERROR]}")
  return out


_ENCODE_ERROR = "__broadcast_from_primary_encode_error__"


def to_host(tree: Any) -> Any:
  """jax.device_get that also works for arrays sharded across processes."""
  return jax.tree.map(_one, tree)


@contextlib.contextmanager
def primary_first(name: str) -> Iterator[None]:
  """Process 0 runs the block first (e.g. building a dataset or an index on shared storage),
  the others after it finished; a no-op on one process."""
  if jax.process_count() == 1:
    yield
    return
  if jax.process_index() == 0:
    try:
      yield
    finally:  # release the others even when this fails (they then fail on their own)
      multihost_utils.sync_global_devices(f"{name}:done")
  else:
    multihost_utils.sync_global_devices(f"{name}:done")
    yield
