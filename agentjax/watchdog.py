"""A progress watchdog: a run that makes no progress for `timeout_s` writes every thread's stack
to its workdir and exits with STALL_EXIT_CODE, so that a scheduler restarts it from its last
checkpoint instead of leaving it hung until a person looks (the anchor: torch.distributed's NCCL
watchdog, which aborts a collective that has not finished within its timeout).

    with Watchdog(config.train.stall_timeout_s, workdir):
      ...  # the loop; its parts call progress("what") as they finish something

Progress is `progress(what)`, called as work moves: at each turn of a rollout (every engine,
training's and eval's: the previous turn is done), after each train or SFT step and its
checkpoint save (which waits for the previous write), after the final checkpoint's write; and
at every XLA compilation's start and end (jax's monitoring events). A compilation in flight, or
a `busy` block (the export), counts as progress for up to Watchdog.BUSY_TIMEOUTS timeouts from
its start. Any thread may call it. What stalls a run without another call: a retriever or
judge that never answers, a rollout producer thread that blocks (the update then waits on it), a collective one process
never joins (the other processes wait in it; on a pod every process then times out and exits),
a checkpoint write that does not finish, a deadlock.

The stack dump goes to `{folder}/stall-p{process}-{unix time}.txt`: every thread by name with its
Python stack (the stuck frame is the innermost), then faulthandler's listing. The process then
exits at once (os._exit: a thread stuck in a collective or a socket cannot be joined, and an
exit that waited for it would hang too). A restart resumes from the last checkpoint; what the
stalled step had done since is done again, the same way (the trainer's resume repeats the
uninterrupted run).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable, Iterator

from agentjax.compiles import COMPILE_EVENT as _COMPILE_EVENT

log = logging.getLogger(__name__)

# os.EX_TEMPFAIL ("temporary failure; the user is invited to retry"): distinct from a crash (1),
# a bad config (2) and a signal's 128+n, so a scheduler can restart on it alone (Slurm's
# --requeue on this code, Kubernetes' podFailurePolicy onExitCodes).
STALL_EXIT_CODE = 75

_active: "Watchdog | None" = None
_listening = False


def progress(what: str) -> None:
  """Tells the running watchdog (if any) that `what` just finished; cheap, any thread."""
  watchdog = _active
  if watchdog is not None:
    watchdog.beat(what)


@contextlib.contextmanager
def busy(what: str) -> Iterator[None]:
  """Watchdog.busy of the running watchdog (nothing when none runs)."""
  watchdog = _active
  if watchdog is None:
    yield
    return
  with watchdog.busy(what):
    yield


def _compile_started(name: str, *_, fun_name: str = "?", **__) -> None:
  watchdog = _active
  if name == _COMPILE_EVENT and watchdog is not None:
    watchdog.compiling(+1, f"compiling {fun_name}")


def _compile_ended(name: str, *_, fun_name: str = "?", **__) -> None:
  watchdog = _active
  if name == _COMPILE_EVENT and watchdog is not None:
    watchdog.compiling(-1, f"compiled {fun_name}")


class Watchdog:
  """Watches `progress` calls from a thread of its own (module docstring).

  timeout_s: seconds without progress before it acts; <= 0: off (entering it does nothing).
  folder: where the stack dump goes (a run's workdir).
  on_stall: called with the dump's path instead of exiting (tests; default: log and exit with
    STALL_EXIT_CODE).
  poll_s: how often it looks (default: a tenth of the timeout, at most 10 s).
  """

  def __init__(self, timeout_s: float, folder: str, *,
               on_stall: Callable[[str], None] | None = None, poll_s: float | None = None):
    self.timeout_s = float(timeout_s)
    self.folder = folder
    self.on_stall = on_stall
    self.poll_s = poll_s if poll_s is not None else min(10.0, max(0.05, self.timeout_s / 10))
    self._last = (time.monotonic(), "started")
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._lock = threading.Lock()
    self._compiles = 0  # XLA compilations (and `busy` blocks) in flight
    self._busy_since = 0.0  # when the first of those began
    self._process = 0
    self.stalled: str | None = None  # the dump's path once it acted

  def beat(self, what: str) -> None:
    self._last = (time.monotonic(), what)  # one tuple: read whole by the watching thread

  # Long legitimate work without progress calls (a compilation, an export) counts as progress
  # up to this many timeouts; past it the watchdog acts (a compiler or a write that never
  # returns, e.g. on a hung file system, is a hang too).
  BUSY_TIMEOUTS = 4

  def compiling(self, change: int, what: str) -> None:
    """A compilation (or other long work: `busy`) started (+1) or ended (-1). While one is in
    flight the watchdog waits up to BUSY_TIMEOUTS timeouts from its start: a large model's
    first programs can compile for many minutes on a loaded host."""
    with self._lock:
      if change > 0 and not self._compiles:
        self._busy_since = time.monotonic()
      self._compiles = max(0, self._compiles + change)
    self.beat(what)

  @contextlib.contextmanager
  def busy(self, what: str) -> Iterator[None]:
    """Long work with no progress calls inside (the Hugging Face export of a large model):
    progress however long, up to BUSY_TIMEOUTS timeouts."""
    self.compiling(+1, what)
    try:
      yield
    finally:
      self.compiling(-1, f"{what}: done")

  def __enter__(self) -> "Watchdog":
    global _active, _listening
    if self.timeout_s <= 0:
      return self
    if _active is not None:  # a run inside a run (a sweep's stage): the outer one watches
      return self
    if not _listening:  # registered once for the process: a no-op while no watchdog runs
      import jax
      jax.monitoring.register_scalar_listener(_compile_started)
      jax.monitoring.register_event_duration_secs_listener(_compile_ended)
      _listening = True
    import jax
    self._process = jax.process_index()  # here: the watchdog thread must not wait on jax
    self.beat("started")
    self._stop.clear()
    self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
    self._thread.start()
    _active = self
    return self

  def __exit__(self, *_) -> None:
    global _active
    if self._thread is None:
      return
    _active = None
    self._stop.set()
    self._thread.join()
    self._thread = None

  def _watch(self) -> None:
    while not self._stop.wait(self.poll_s):
      since, what = self._last
      now = time.monotonic()
      idle = now - since
      busy = self._compiles and now - self._busy_since < self.BUSY_TIMEOUTS * self.timeout_s
      if idle > self.timeout_s and not busy:
        if self.on_stall is None:
          # The dump writes to the workdir, which may be the hung file system itself: the
          # process ends after 60 s whatever the write does, and the stacks go to stderr first.
          backstop = threading.Timer(60.0, os._exit, (STALL_EXIT_CODE,))
          backstop.daemon = True
          backstop.start()
          faulthandler.dump_traceback(sys.stderr, all_threads=True)
        try:
          self.stalled = self.dump(what, idle)
        except Exception as e:  # noqa: BLE001 - no file (disk full, hung mount): exit anyway
          self.stalled = f"(not written: {type(e).__name__}: {e}; the stacks are on stderr)"
        if self.on_stall is not None:
          self.on_stall(self.stalled)
          return
        _exit_stalled(self.stalled, self.timeout_s)

  def dump(self, last: str, idle: float) -> str:
    """Writes every thread's stack to a new file in `folder`; returns its path."""
    os.makedirs(self.folder, exist_ok=True)
    path = os.path.join(self.folder, f"stall-p{self._process}-{int(time.time())}.txt")
    names = {t.ident: t.name for t in threading.enumerate()}
    with open(path, "w") as f:
      f.write(f"no progress for {idle:.0f} s (timeout {self.timeout_s:g} s); the last was: "
              f"{last}\n\n")
      for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
          continue  # this watchdog thread
        f.write(f"--- thread {names.get(ident, '?')} ({ident}), innermost last\n")
        f.write("".join(traceback.format_stack(frame)))
        f.write("\n")
      f.write("--- faulthandler (every thread, innermost first)\n")
      f.flush()
      faulthandler.dump_traceback(f, all_threads=True)
    return path


def _exit_stalled(path: str, timeout_s: float) -> None:
  message = (f"no progress for {timeout_s:g} s (train.stall_timeout_s): every thread's stack is "
             f"in {path}; exiting with code {STALL_EXIT_CODE} so the run restarts from its last "
             "checkpoint")
  log.error(message)
  print(f"agentjax watchdog: {message}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(STALL_EXIT_CODE)


__all__ = ["STALL_EXIT_CODE", "Watchdog", "busy", "progress"]
