"""Counting XLA compilations, so tests and benchmarks can check that a run compiles a handful of
programs rather than one per step or turn."""

from __future__ import annotations

import jax

# Recorded around the backend's compile, which includes reading a program back from a persistent
# compilation cache (jax_compilation_cache_dir): a retrace is counted either way.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_count = 0
_registered = False


def _listener(name: str, *_, **__) -> None:
  global _count
  if name == _COMPILE_EVENT:
    _count += 1


class CompileCounter:
  """Counts backend compilations from construction on: `CompileCounter().count`."""

  def __init__(self):
    global _registered
    if not _registered:
      jax.monitoring.register_event_duration_secs_listener(_listener)
      _registered = True
    self.start = _count

  @property
  def count(self) -> int:
    return _count - self.start
