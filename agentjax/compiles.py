"""Counting XLA compilations, so tests and benchmarks can check that a run compiles a handful of
programs rather than one per step or turn."""

from __future__ import annotations

import logging

import jax

# Recorded around the backend's compile, which includes reading a program back from a persistent
# compilation cache (jax_compilation_cache_dir): a retrace is counted either way. jax records it
# twice: a scalar (the start time) as the compile begins, a duration as it ends (watchdog.py
# listens to both).
COMPILE_EVENT = _COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_count = 0
_seconds = 0.0
_registered = False


def _listener(name: str, duration_secs: float = 0.0, *_, **__) -> None:
  global _count, _seconds
  if name == _COMPILE_EVENT:
    _count += 1
    _seconds += duration_secs


class CompileCounter:
  """Counts backend compilations from construction on: `CompileCounter().count`, and the
  seconds they took (`.seconds`: where a run's first steps go on a GPU)."""

  def __init__(self):
    global _registered
    if not _registered:
      jax.monitoring.register_event_duration_secs_listener(_listener)
      _registered = True
    self.start = _count
    self.start_seconds = _seconds

  @property
  def count(self) -> int:
    return _count - self.start

  @property
  def seconds(self) -> float:
    return _seconds - self.start_seconds


def cache_folder(setting: str, workdir: str) -> str:
  """train.jax_cache_dir for a run in `workdir`: "{workdir}" replaced by it ("" stays off)."""
  return setting.replace("{workdir}", workdir.rstrip("/")) if setting else ""


def use_persistent_cache(folder: str) -> str | None:
  """Keeps compiled programs in `folder` (jax's persistent compilation cache), so that a resumed
  run, or the next run of a sweep with the same shapes, reads its programs back instead of
  compiling them again (MaxText's `jax_cache_dir`). The rollout and the update compile once per
  distinct shape (slot counts, packed rows): on the research study's CPU that was ~40% of a
  step's time in a run's first steps, and every run and every resume paid it again.

  A folder already set (the environment's JAX_COMPILATION_CACHE_DIR, the test suite's shared
  cache) is kept: jax reads the setting once, at its first compilation. "" does nothing.
  Returns the folder in use, or None."""
  current = jax.config.jax_compilation_cache_dir
  if current or not folder:
    return current or None
  import os
  os.makedirs(folder, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", folder)
  # Every program, however quick to compile: a resume then compiles nothing it compiled before
  # (jax's default keeps only programs that took >= 1 s).
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return folder


class CompileLog:
  """The programs compiled while it is open, by name (jax's "Finished XLA compilation of
  jit(<name>) in <s> sec" debug record, which every backend compile writes, a persistent-cache
  read included): `programs` lists (name, seconds) in order; `take()` returns those since the
  last take. Use as a context manager; the records are not printed.

      with CompileLog() as log:
        step(...)
        first = log.take()   # [("jit(update)", 3.2), ...]
  """

  _LOGGER = "jax._src.dispatch"
  _PREFIX = "Finished XLA compilation of "

  def __init__(self):
    self.programs: list[tuple[str, float]] = []
    # Where each program was asked for: the innermost agentjax frame ("path.py:line"), or "?".
    self.sources: list[str] = []
    self._taken = 0
    log = self

    class _Handler(logging.Handler):
      def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(CompileLog._PREFIX):
          name, _, rest = message[len(CompileLog._PREFIX):].rpartition(" in ")
          log.programs.append((name, float(rest.split()[0])))
          log.sources.append(_caller())

    self._handler = _Handler(level=logging.DEBUG)

  def __enter__(self) -> "CompileLog":
    logger = logging.getLogger(self._LOGGER)
    self._saved = (logger.level, logger.propagate)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # debug records stay out of the run's log
    logger.addHandler(self._handler)
    return self

  def __exit__(self, *_) -> None:
    logger = logging.getLogger(self._LOGGER)
    logger.removeHandler(self._handler)
    logger.setLevel(self._saved[0])
    logger.propagate = self._saved[1]

  def take(self) -> list[tuple[str, float]]:
    """The programs compiled since the last take (or since the log opened)."""
    new = self.programs[self._taken:]
    self._taken = len(self.programs)
    return new


def _caller() -> str:
  """The innermost frame of agentjax's own code on the stack (not this module's), as
  "agentjax/<path>:<line>": which call of ours made jax compile."""
  import os
  import traceback
  root = os.path.dirname(os.path.abspath(__file__))
  for frame in reversed(traceback.extract_stack()):
    path = os.path.abspath(frame.filename)
    if path.startswith(root + os.sep) and path != os.path.abspath(__file__):
      return f"agentjax/{os.path.relpath(path, root)}:{frame.lineno}"
  return "?"
