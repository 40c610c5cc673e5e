"""What a process holds, recorded with every step's metrics (`sys/*`), so that slow growth over a
long run shows in metrics.jsonl and TensorBoard rather than as an out-of-memory a week in
(launch/soak.py fits its slope over a run's second half).

  sys/rss_mb          resident host memory of this process (MiB)
  sys/live_arrays     jax arrays alive on this process's devices (jax.live_arrays())
  sys/live_mb         their bytes on this process's devices (MiB)
  sys/threads         Python threads alive
  sys/open_fds        open file descriptors (Linux; absent elsewhere)
  sys/kv_keys         keys this run keeps in jax.distributed's key-value store (several
                      processes only: the device turns' keys, agentjax/parallel/host.py)
"""

from __future__ import annotations

import math
import os
import resource
import sys
import threading
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from agentjax.parallel.host import distributed_kv

# The prefix of every key agentjax writes to the coordination service.
KV_PREFIX = "agentjax/"


def rss_mb() -> float:
  """This process's resident memory now (MiB): /proc/self/statm where there is one, else the
  peak (getrusage), which only grows."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
  except (OSError, ValueError, IndexError):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def open_fds() -> int | None:
  try:
    return len(os.listdir("/proc/self/fd"))
  except OSError:
    return None


def kv_keys() -> int | None:
  """The run's keys in the coordination service (None on one process: there is none)."""
  if jax.process_count() == 1:
    return None
  try:
    return len(distributed_kv().key_value_dir_get(KV_PREFIX))
  except Exception:  # noqa: BLE001 - a measurement: a coordination hiccup must not stop the run
    return None


def resources() -> dict[str, float]:
  """The `sys/*` metrics (module docstring) of this process now."""
  arrays = [a for a in jax.live_arrays() if not a.is_deleted()]
  local = 0
  for a in arrays:  # from the sharding alone: reading a shard would make an array of its own
    shard = math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
    local += shard * len(a.sharding.addressable_devices)
  out = {"sys/rss_mb": rss_mb(), "sys/live_arrays": float(len(arrays)),
         "sys/live_mb": local / 2**20, "sys/threads": float(threading.active_count())}
  fds, keys = open_fds(), kv_keys()
  if fds is not None:
    out["sys/open_fds"] = float(fds)
  if keys is not None:
    out["sys/kv_keys"] = float(keys)
  return out


# (metric, floor of its bound): the growth_report docstring.
WATCHED = (("sys/rss_mb", 16.0), ("sys/live_arrays", 0.5), ("sys/live_mb", 0.5),
           ("sys/threads", 0.5), ("sys/open_fds", 0.5), ("sys/kv_keys", 0.5), ("compiles", 0.5))


def growth(steps: Sequence[float], values: Sequence[float], floor: float) -> dict[str, Any]:
  """Over the second half of a run's steps: the fitted slope of `values`, the growth it makes
  over that half, the residuals' standard deviation (noise), and whether the growth is within
  max(3 x noise, floor)."""
  x, y = np.asarray(steps, float), np.asarray(values, float)
  half = x >= x[len(x) // 2]
  slope, intercept = np.polyfit(x[half], y[half], 1)
  noise = float(np.std(y[half] - (slope * x[half] + intercept)))
  grown = float(slope * (x[half][-1] - x[half][0]))
  bound = max(3 * noise, floor)
  return {"first": float(y[0]), "middle": float(y[half][0]), "last": float(y[-1]),
          "slope_per_step": float(slope), "growth_second_half": grown, "noise": noise,
          "bound": bound, "bounded": bool(grown <= bound)}


def growth_report(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
  """{metric: growth(...)} for every WATCHED metric the step rows (metrics.jsonl, with "step")
  carry. A metric is bounded when its growth over the run's second half is within max(3 x its
  noise, its floor): 16 MiB of resident memory (the allocator's arenas move in such steps),
  0.5 MiB of live arrays, half a unit of a count (a count that grows by one is caught)."""
  out = {}
  for name, floor in WATCHED:
    have = [r for r in rows if name in r]
    if len(have) >= 4:
      out[name] = growth([r["step"] for r in have], [r[name] for r in have], floor)
  return out


__all__ = ["KV_PREFIX", "WATCHED", "growth", "growth_report", "kv_keys", "open_fds", "resources",
           "rss_mb"]
