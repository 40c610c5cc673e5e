"""Gathers concurrent requests into shared decode batches for one completer.

    batcher = Batcher(completer, max_batch=8, window_s=0.01)
    future = batcher.submit([[ids of prompt 0], ...], SamplingKey(max_new_tokens=64, ...))
    completions = future.result()   # one Completion per prompt, in order

One background thread owns the completer (the model, its jitted programs and the device): HTTP
handlers only enqueue jobs and wait on their futures. The thread takes the first queued job, then
whatever else arrives within `window_s` (up to `max_batch` rows), groups the jobs by their
sampling settings (a `complete()` call has one max_new_tokens, temperature, top_p, stop list and
seed) and runs each group as one `complete()` call of at most `max_batch` rows.

A failing call never stops the thread: when a call of several jobs fails, each job is retried in
a call of its own, so only the job that causes the failure gets the exception (on its future).

The jobs waiting or decoding are bounded by `max_pending`: submit() beyond it raises Overloaded at
once (the server answers 503 with Retry-After) rather than queueing without bound.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import random
import threading
import time
from typing import Any, Sequence

log = logging.getLogger(__name__)

_STOP = object()  # queue sentinel: the worker exits


@dataclasses.dataclass(frozen=True)
class SamplingKey:
  """Settings shared by every row of one complete() call (requests group by equal keys).

  seed None: the batch draws a fresh seed (OpenAI's default: an unseeded request is not
  reproducible). Greedy requests (temperature 0) should pass top_p=1 and seed=0, so that they
  group whatever top_p and seed they asked for (neither changes greedy decoding).
  """
  max_new_tokens: int
  temperature: float = 0.0
  top_p: float = 1.0
  stop: tuple[str, ...] = ()
  seed: int | None = 0
  repetition_penalty: float = 1.0   # Completer.complete's; 1.0 off
  max_think_tokens: int = 0         # Completer.complete's; 0 off


class Overloaded(RuntimeError):
  """submit() refused a job: max_pending jobs are already waiting or decoding."""


@dataclasses.dataclass
class _Job:
  prompts: list[list[int]]
  key: SamplingKey
  future: concurrent.futures.Future


class Batcher:
  """A worker thread running queued jobs through `completer.complete` in shared batches.

  Attributes are read-only for callers; stats() gives the counters (also exposed by /health).
  """

  def __init__(self, completer: Any, *, max_batch: int = 8, window_s: float = 0.01,
               max_pending: int = 256):
    """`max_pending`: the most jobs (requests) waiting or decoding; submit() beyond it raises
    Overloaded. A job leaves the count when its future is done: answered, failed or cancelled."""
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    if window_s < 0:
      raise ValueError(f"window_s must be >= 0, got {window_s}")
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
      raise ValueError(f"max_pending must be an integer >= 1, got {max_pending!r}")
    self.completer = completer
    self.max_batch = max_batch
    self.max_pending = max_pending
    self._pending = 0  # jobs submitted whose future is not done (under _lock)
    # How long the worker waits for more jobs after the first one. A plain attribute: tests set
    # it high so that concurrent requests deterministically meet in one batch (a full batch is
    # dispatched at once, without waiting for the window to end).
    self.window_s = window_s
    self._queue: queue.Queue = queue.Queue()
    self._lock = threading.Lock()
    self._stats = collections.Counter()
    self._stats["max_rows"] = 0
    self._closed = False
    self._thread = threading.Thread(target=self._loop, name="agentjax-batcher", daemon=True)
    self._thread.start()

  # ------------------------------------------------------------------------------ callers

  def submit(self, prompts: Sequence[Sequence[int]], key: SamplingKey
             ) -> concurrent.futures.Future:
    """Queues `prompts` (token ids) for decoding; the future gets one Completion per prompt.

    Cancelling the future before the worker starts the job (e.g. the client went away) drops it.
    Raises Overloaded when max_pending jobs are waiting or decoding (nothing is queued then).
    """
    if not prompts:
      raise ValueError("submit needs at least one prompt")
    future: concurrent.futures.Future = concurrent.futures.Future()
    # Runs once, when the job is answered, failed or cancelled, in the thread that does that (none
    # holds _lock then); a refused job's future is never done, so it never runs for one.
    future.add_done_callback(self._finished)
    with self._lock:  # the put too: no job can land behind close()'s stop marker
      if self._closed:
        raise RuntimeError("the batcher is closed")
      if self._pending >= self.max_pending:
        self._stats["rejected"] += 1
        raise Overloaded(f"{self._pending} requests are waiting or decoding (max_pending)")
      self._pending += 1
      self._stats["requests"] += 1
      self._queue.put(_Job([list(p) for p in prompts], key, future))
    return future

  def _finished(self, _: concurrent.futures.Future) -> None:
    with self._lock:
      self._pending -= 1

  def stats(self) -> dict[str, int]:
    """Counters: requests (jobs submitted), batches (complete() calls), rows (prompts decoded),
    max_rows (largest call), failed_calls, failed_requests, rejected (submits refused as
    Overloaded), pending (jobs waiting or decoding now, what max_pending bounds)."""
    with self._lock:
      out = {k: int(v) for k, v in self._stats.items()}
      out["pending"] = self._pending
    for k in ("requests", "batches", "rows", "failed_calls", "failed_requests", "rejected"):
      out.setdefault(k, 0)
    return out

  @property
  def alive(self) -> bool:
    return self._thread.is_alive()

  def close(self, timeout_s: float | None = 30.0) -> None:
    """Stops the worker after the jobs already queued; later submits raise RuntimeError."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
    self._queue.put(_STOP)
    self._thread.join(timeout_s)

  # ------------------------------------------------------------------------------ worker

  def _loop(self) -> None:
    stop = False
    while not stop:
      first = self._queue.get()
      if first is _STOP:
        break
      jobs, rows = [first], len(first.prompts)
      deadline = time.monotonic() + self.window_s
      while rows < self.max_batch:
        try:
          job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
          break
        if job is _STOP:
          stop = True  # finish what was gathered, then exit
          break
        jobs.append(job)
        rows += len(job.prompts)
      try:
        self._run(jobs)
      except BaseException as e:  # noqa: BLE001  the thread must outlive any job
        log.exception("batcher: unexpected error; failing the batch's requests")
        for job in jobs:
          if not job.future.done():
            job.future.set_exception(e)
    # Closed: fail whatever is still queued rather than leave its caller waiting.
    while True:
      try:
        job = self._queue.get_nowait()
      except queue.Empty:
        break
      if job is not _STOP and not job.future.done():
        job.future.set_exception(RuntimeError("the batcher is closed"))

  def _run(self, jobs: list[_Job]) -> None:
    # Jobs whose client went away (future cancelled) are dropped; the others can no longer be
    # cancelled once marked running.
    jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
    groups: dict[SamplingKey, list[_Job]] = {}
    for job in jobs:
      groups.setdefault(job.key, []).append(job)
    for key, group in groups.items():
      # Pack whole jobs into calls of <= max_batch rows (a job larger than that runs alone, split
      # into several calls by _call).
      call: list[_Job] = []
      rows = 0
      for job in group:
        if call and rows + len(job.prompts) > self.max_batch:
          self._call(call, key)
          call, rows = [], 0
        call.append(job)
        rows += len(job.prompts)
      if call:
        self._call(call, key)

  def _call(self, jobs: list[_Job], key: SamplingKey) -> None:
    prompts = [p for job in jobs for p in job.prompts]
    seed = random.getrandbits(31) if key.seed is None else key.seed
    try:
      outs = []
      with self._mesh_context():
        for start in range(0, len(prompts), self.max_batch):
          chunk = prompts[start:start + self.max_batch]
          try:
            outs.extend(self.completer.complete(
                chunk, max_new_tokens=key.max_new_tokens, temperature=key.temperature,
                top_p=key.top_p, stop=key.stop, seed=seed,
                repetition_penalty=key.repetition_penalty,
                max_think_tokens=key.max_think_tokens))
          finally:
            with self._lock:
              self._stats["batches"] += 1
              self._stats["rows"] += len(chunk)
              self._stats["max_rows"] = max(self._stats["max_rows"], len(chunk))
      if len(outs) != len(prompts):
        raise RuntimeError(f"the completer returned {len(outs)} completions for "
                           f"{len(prompts)} prompts")
    except Exception as e:  # noqa: BLE001  answered to the request(s), the worker goes on
      with self._lock:
        self._stats["failed_calls"] += 1
      if len(jobs) > 1:  # find the culprit: each job alone, the others still get answers
        log.warning("batcher: a call of %d requests failed (%s: %s); retrying them one by one",
                    len(jobs), type(e).__name__, e)
        for job in jobs:
          self._call([job], key)
        return
      log.warning("batcher: a request failed: %s: %s", type(e).__name__, e)
      with self._lock:
        self._stats["failed_requests"] += 1
      jobs[0].future.set_exception(e)
      return
    start = 0
    for job in jobs:
      job.future.set_result(outs[start:start + len(job.prompts)])
      start += len(job.prompts)

  def _mesh_context(self) -> contextlib.AbstractContextManager:
    # A completer on a mesh decodes under it, as the trainer's rollouts do (without the mesh
    # context flax's logical sharding constraints do nothing).
    mesh = getattr(self.completer, "mesh", None)
    if mesh is None:
      return contextlib.nullcontext()
    from agentjax.parallel import use_mesh
    return use_mesh(mesh)
