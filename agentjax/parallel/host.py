"""Moving values to the host on one or many processes, and doing a step on process 0 first.

On a multi-host run (TPU pod, several GPU hosts) a batch-sharded array spans devices of other
processes, so `jax.device_get` refuses it. Every process runs the same host logic (parsing, search,
rewards) on the whole batch, so each needs the whole value: `to_host` all-gathers such arrays
(a collective: every process must call it, in the same order) and fetches the rest directly.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils


def _one(x: Any) -> Any:
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.device_get(x)


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any (e.g. a SIGTERM one host received)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


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
