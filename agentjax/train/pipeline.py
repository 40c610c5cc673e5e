"""Asynchronous RL, colocated: the next steps' rollouts are produced while this step updates
(train.async_steps = k >= 1; 0 is the synchronous step, RLStep.__call__).

    pipeline = RolloutPipeline(rl_step, questions_at, k)
    out = pipeline.step(state, step, position)     # per training step, instead of rl_step(...)
    pipeline.close()

One worker thread runs RLStep.produce (the rollout on the device, the retriever, the rewards and
the judge on the host) for the steps ahead, in step order, while the trainer's thread runs
RLStep.consume (scoring, advantages, the PPO-clip updates) of the current one. JAX dispatches
from both threads; what overlaps is the host work of one with the device work of the other (and,
with devices to spare, both device programs).

Which parameters sample which step (deterministic, so a run is reproducible): at step t the state
has had t updates (version t), and the pipeline submits every step in [t, t + k] not yet
submitted, with a copy of those parameters (the update donates its own). So step j's rollout is
by version max(j - k, s), s the step the run (re)started from: a trajectory is at most k versions
old when it enters an update, the staleness bound of "wait" (train.stale); after a resume the
first k steps' rollouts are by the restored parameters (the in-flight ones of the interrupted run
are not saved: they restart). Each step logs async/staleness (t minus its rollout's version) and
async/wait_s (the seconds the trainer waited for the rollout: the idle time the overlap did not
hide).

Placement (mesh.sampler_devices): colocated (0), the rollouts and the updates on the same
devices; split, the rollouts on the last sampler_devices devices and the updates on the others,
each submission copying the parameters to the sampler (RLStep.to_sampler: async/weight_copy_s)
and each step's rollouts moved to the trainer's devices before scoring.

On a colocated mesh of several devices the two threads take turns on the devices
(parallel.host.DEVICE_TURN: two threads dispatching SPMD programs onto the same devices can
deadlock in their collectives): the update holds them for all of its step, the producer for its
production but for its host waits (retriever, judge), so the host waits are what is hidden. One
device (no collectives) and the split placement overlap freely. The trainer's thread holds the
devices for its whole loop (evals, checkpoints, collectives) but while it waits for a rollout.

Several processes (multi-host): the turns come in process 0's order on every process
(DeviceTurn.ordered: process 0 writes each turn's thread to jax.distributed's key-value store,
the others follow it), so each process's programs reach the devices in the same order and
every process sees the same trajectories; a collective inside a host wait (PrimarySearch's and
the judge's broadcasts) takes a turn of its own. Partial rollouts and the split placement stay
one-process only (refused), and close() finishes every submitted rollout rather than cancel
the ones not yet started (whether one started differs between processes).

Partial rollouts (rollout.partial, agentjax/agent/feed.py): with "continue" or "restart" the
pipeline publishes the parameters after every update (one copy per update, which the next
submission reuses), and a rollout in flight reads them at its next turn (turn engine) or decode
call (slot engine): it samples the rest with them, or starts again. Every sampled token records
its version (TrajectoryBatch.versions); a step then logs async/staleness (t minus the oldest
token's version: still at most k), async/staleness_mean (over sampled tokens) and
async/partial_share (trajectories sampled by more than one version). The off-policy
corrections (rl.off_policy_correction) weigh each token by the sampler's own log-prob, so a
trajectory of several versions is corrected token by token.

train.stale = "drop" (with train.max_staleness = m < k and rollout.partial "continue"): the
rollouts are still submitted k steps ahead, but at step t a trajectory whose oldest sampled token
is by a version older than t - m takes no part in the update (its loss mask is zeroed: no
policy, KL or entropy term; it still counts in its group's outcome statistics: our reading, the
alternative being to drop its whole group), counted as async/dropped_share. With "continue" a
rollout moves to the newest parameters as soon as it reads them, and the slot engine starts
trajectories as slots free up, so a step's trajectories start at different versions and only the
oldest are dropped. A step whose every trajectory is stale is produced again with this step's
parameters (async/reproduced; after the worker's production in flight: one production at a
time), so an update never runs on nothing. So "drop" pays when rollouts are the bottleneck;
when updates are, every rollout is stale by the time it is used and each step is produced
again (use "wait"). A dropped row still counts in a loss normalized by rows (Dr.GRPO's B), and
a minibatch of dropped rows only still takes an optimizer step (momentum, weight decay). "wait" (default): nothing is
dropped; the submission bound keeps every trajectory within k versions.

The rng chain is the synchronous one: step t's rollout key is split(rng_t)[1] and rng_{t+1} =
split(rng_t)[0], computed ahead from the state's key.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from agentjax.agent.feed import ParamsFeed
from agentjax.parallel.host import DEVICE_TURN, distributed_kv, to_host

log = logging.getLogger(__name__)
_PIPELINES = 0  # pipelines made by this process (a multi-process run's turn-key prefix)

STALE_MODES = ("wait", "drop")


class RolloutPipeline:
  """Rollouts of the next k steps produced beside the current step's update (module docstring).

  rl_step: an RLStep (produce / consume). questions_at(step) -> that step's question records.
  end: the run's last step + 1 (no rollout is produced for a step at or past it); None: no end.
  partial: rollout.partial ("off", "continue", "restart"; module docstring).
  stale, max_staleness: train.stale ("wait" or "drop") and, for "drop", the oldest version a
    trajectory may start from, as steps before the update (module docstring).
  """

  def __init__(self, rl_step: Any, questions_at: Callable[[int], Sequence[Mapping[str, Any]]],
               async_steps: int, end: int | None = None, partial: str = "off",
               stale: str = "wait", max_staleness: int | None = None):
    if async_steps < 1:
      raise ValueError(f"train.async_steps={async_steps}: a pipeline needs >= 1 (0 is the "
                       "synchronous step)")
    processes = jax.process_count()
    if processes > 1 and getattr(rl_step, "sampler_mesh", None) is not None:
      raise ValueError("mesh.sampler_devices (the split placement) runs on one process only so "
                       f"far (this run has {processes}); use 0 (colocated)")
    if processes > 1 and partial != "off":
      # A rollout in flight reads the published parameters when they happen to be there: the
      # moment differs between processes, and so would their trajectories.
      raise ValueError(f"rollout.partial={partial!r} runs on one process only so far (this run "
                       f"has {processes}); use 'off'")
    self.rl_step, self.questions_at, self.k = rl_step, questions_at, int(async_steps)
    self.end = end
    # A colocated multi-device mesh: the two threads take turns on the devices (DEVICE_TURN);
    # one device, or the split placement's disjoint meshes, need not. Several processes take
    # turns in process 0's order (DeviceTurn.ordered).
    mesh = getattr(rl_step, "mesh", None)
    self.turns = processes > 1 or (getattr(rl_step, "sampler_mesh", None) is None
                                   and mesh is not None and mesh.devices.size > 1)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts")
    self._futures: dict[int, concurrent.futures.Future] = {}
    # rollout.partial: the feed of the parameters published after each update (None: "off").
    self.partial = partial
    if self.partial != "off" and not getattr(rl_step.stage, "partial", False):
      raise ValueError(f"rollout.partial={self.partial!r}: this run's rollout stage "
                       f"({type(rl_step.stage).__name__}, roles {rl_step.stage.roles}) does "
                       "not read published parameters (one agent with one policy does); use "
                       "'off'")
    self.feed: ParamsFeed | None = None
    if stale not in STALE_MODES:
      raise ValueError(f"train.stale must be one of {STALE_MODES}, got {stale!r}")
    if stale == "drop" and partial != "continue":
      raise ValueError("train.stale='drop' needs rollout.partial='continue' (else every rollout "
                       "is async_steps versions old and all would be dropped)")
    # One production at a time: a step produced again (drop) waits for the worker's.
    self._producing = threading.Lock()
    self.stale = stale
    self.max_staleness = self.k if max_staleness is None or max_staleness < 0 else \
        int(max_staleness)
    self._ordered = contextlib.ExitStack()
    if processes > 1:  # last: a check above that raises leaves no ordered DEVICE_TURN behind
      global _PIPELINES
      _PIPELINES += 1  # the same count on every process: each pipeline's turns have own keys
      self._ordered.enter_context(DEVICE_TURN.ordered(
          distributed_kv(), f"agentjax/device_turn/{_PIPELINES}", jax.process_index() == 0))

  @staticmethod
  def _keys(rng: jax.Array, count: int) -> list[tuple[jax.Array, jax.Array]]:
    """(rng_{t+i+1}, rollout key of step t+i) for i < count, from rng_t: the synchronous chain."""
    out = []
    for _ in range(count):
      rng, rollout = jax.random.split(rng)
      out.append((rng, rollout))
    return out

  def step(self, state: Mapping[str, Any], step: int) -> Any:
    """Step `step` (the state has had `step` updates): submits the steps up to step + k, waits
    for this step's rollouts, and runs its update. Returns RLStep.consume's StepOutput with the
    async/* metrics. Taking turns, it holds the devices but while it waits for the rollouts
    (already held by the caller, the trainer's loop: the same)."""
    with DEVICE_TURN.hold() if self.turns else contextlib.nullcontext():
      return self._step(state, step)

  def _step(self, state: Mapping[str, Any], step: int) -> Any:
    t_step = time.perf_counter()
    keys = self._keys(state["rng"], self.k + 1)
    last = step + self.k + 1 if self.end is None else min(step + self.k + 1, self.end)
    todo = [j for j in range(step, last) if j not in self._futures]
    copy_s = 0.0
    if self.partial != "off" and (self.feed is None or self.feed.current()[1] != step):
      snapshot, copy_s = self.rl_step.to_sampler(state["params"])  # a (re)start: first feed
      self.feed = ParamsFeed(snapshot, step)
    if todo:  # a copy (the update donates state["params"]), on the sampler's devices if split
      if self.feed is not None:  # the copy published after the last update
        snapshot = self.feed.current()[0]
      else:
        snapshot, copy_s = self.rl_step.to_sampler(state["params"])
      for j in todo:
        self._futures[j] = self._pool.submit(
            self._produce, snapshot, self.questions_at(j), keys[j - step][1], j, step)
    t0 = time.perf_counter()
    with DEVICE_TURN.host_wait():  # a caller holding the devices lets the producer have them
      produced = self._futures.pop(step).result()
    waited = time.perf_counter() - t0
    dropped, reproduced = 0.0, 0.0
    if self.stale == "drop":
      produced, dropped, reproduced = self._drop_stale(produced, state, step, keys[0][1])
    out = self.rl_step.consume(state, produced, step, keys[0][0], t_step)
    if self.feed is not None and (self.end is None or step + 1 < self.end):
      # The rollouts in flight read these at their next turn or decode call.
      published, publish_s = self.rl_step.to_sampler(out.state["params"])
      self.feed.publish(published, step + 1)
      copy_s += publish_s
    # The versions of the tokens the update learns from (the dropped trajectories' excluded).
    stats = None if produced.token_versions is None else version_stats(*produced.token_versions)
    oldest, mean, mixed = stats or (produced.version, float(produced.version), 0.0)
    out.metrics.update({"async/staleness": float(step - oldest),
                        "async/staleness_mean": float(step - mean),
                        "async/partial_share": mixed, "async/dropped_share": dropped,
                        "async/reproduced": reproduced,
                        "async/partial_restarts": float(
                            produced.out.engine.get("partial_restarts", 0.0)),
                        "async/wait_s": waited, "async/produce_s": produced.produce_s,
                        "async/weight_copy_s": copy_s})
    return out

  def _produce(self, params, questions, key, j, version):
    # A step produced again (drop) runs on the trainer's thread, which may hold the devices:
    # it lets them go while the worker finishes the production in flight (that needs them).
    with DEVICE_TURN.host_wait():
      self._producing.acquire()
    try:
      with DEVICE_TURN.hold() if self.turns else contextlib.nullcontext():
        produced = self.rl_step.produce(params, questions, key, j, version, **(
            {} if self.feed is None else {"feed": self.feed}))
    finally:
      self._producing.release()
    produced.token_versions = None
    if self.feed is not None:  # tokens of several versions: read them (host, this thread)
      batch = produced.out.batches[self.rl_step.stage.roles[0]]
      produced.token_versions = to_host((batch.versions, batch.loss_mask))
    return produced

  def _drop_stale(self, produced: Any, state: Mapping[str, Any], step: int,
                  key: jax.Array) -> tuple[Any, float, float]:
    """train.stale = "drop": (the production with its stale trajectories masked out, the share
    dropped, 1.0 if it was produced again because every trajectory was stale)."""
    if produced.token_versions is None:  # one version for every row: the one it started from
      n = produced.out.batches[self.rl_step.stage.roles[0]].loss_mask.shape[0]
      oldest = np.full(n, produced.version)
    else:
      oldest = row_oldest(*produced.token_versions)
    keep = oldest >= step - self.max_staleness
    if keep.all():
      return produced, 0.0, 0.0
    if not keep.any():  # nothing to learn from: this step's rollouts by this step's parameters
      log.info("async: every trajectory of step %d is older than %d versions; producing it again",
               step, self.max_staleness)
      params, version = self.feed.current()  # this step's parameters, published after its
      assert version == step, (version, step)  # update (drop runs with a feed)
      return self._produce(params, self.questions_at(step), key, step, step), 0.0, 1.0
    role = self.rl_step.stage.roles[0]
    batch = produced.out.batches[role]
    masked = batch.replace(loss_mask=batch.loss_mask & jax.device_put(
        keep[:, None], batch.loss_mask.sharding))
    versions, mask = produced.token_versions
    produced = dataclasses.replace(produced, out=dataclasses.replace(
        produced.out, batches={**produced.out.batches, role: masked}))
    produced.token_versions = (versions, mask & keep[:, None])
    return produced, float(1.0 - keep.mean()), 0.0

  def close(self) -> None:
    """Drops the rollouts not yet started and waits for the one in flight (its parameters are
    its own copy; nothing it makes is used). On several processes every submitted rollout is
    finished instead: whether one has started differs between processes, and a rollout one
    process started takes turns the others must take too."""
    try:
      if jax.process_count() == 1:
        for future in self._futures.values():
          future.cancel()
      with DEVICE_TURN.host_wait():
        for future in self._futures.values():
          if not future.cancelled():
            future.exception()  # waits; its error (if any) is not this close's
      self._futures.clear()
      self._pool.shutdown(wait=True)
    finally:
      self._ordered.close()


def row_oldest(versions: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[B] the oldest version among each row's sampled tokens (mask [B, S]); a row with none
  gets int32 max (it is never stale)."""
  return np.where(np.asarray(mask, bool), np.asarray(versions),
                  np.iinfo(np.int32).max).min(axis=1)


def version_stats(versions: np.ndarray, mask: np.ndarray) -> tuple[int, float, float] | None:
  """(oldest version, mean version over the sampled tokens, share of trajectories sampled by
  more than one version) of a batch's versions [B, S] where mask [B, S] (its sampled tokens);
  None when nothing was sampled."""
  versions, mask = np.asarray(versions), np.asarray(mask, bool)
  if not mask.any():
    return None
  low = row_oldest(versions, mask)
  high = np.where(mask, versions, -1).max(axis=1)
  rows = mask.any(axis=1)
  return (int(low[rows].min()), float(versions[mask].mean()),
          float(np.mean(low[rows] != high[rows])))


__all__ = ["RolloutPipeline", "STALE_MODES", "row_oldest", "version_stats"]
