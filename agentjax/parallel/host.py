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
import logging
import threading
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils


def _one(x: Any) -> Any:
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    with DEVICE_TURN.collective():  # defined below; a turn of its own in an asynchronous run
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

  Several processes (a multi-host run): each process's turns must also come in the same order
  as every other process's, since a program's collectives span them. `ordered(kv, prefix)`
  makes process 0 the leader: it grants turns as its threads ask and writes the n-th holder's
  thread name to the key-value store (jax.distributed's client: `{prefix}/{n}`); every other
  process grants its n-th turn to the thread of that name, which waits for it. Each thread runs
  the same host logic on every process (same trajectories, same host waits), so each process's
  threads dispatch the same programs in the same turns, in the leader's order. A collective
  called during a host wait (PrimarySearch's and the judge's broadcasts) takes a turn of its own
  (`collective`). Turns are matched by thread name, so only threads named alike on every process
  (the main thread, the pipeline's "rollouts_0") may take them, and a cross-process collective
  that does not go through `collective` (orbax's, `primary_first`'s) must run where the caller
  holds the devices (the trainer's loop does).
  """

  def __init__(self):
    self._cond = threading.Condition()
    self._busy = False
    self._holder = threading.local()
    self._order: _TurnOrder | None = None

  @contextlib.contextmanager
  def ordered(self, kv: Any, prefix: str, leader: bool, *, process: int | None = None,
              processes: int | None = None) -> Iterator[None]:
    """Inside the block, turns follow the leader's order (class docstring). kv: an object with
    key_value_set(key, value, allow_overwrite), blocking_key_value_get(key, timeout_in_ms),
    key_value_try_get(key) and key_value_delete(key) (jax.distributed's client:
    `distributed_kv()`); prefix: a key prefix no other block of this run uses, the same on every
    process; leader: True on process 0. process, processes: this process's index and their
    count (default: jax's)."""
    if self._order is not None:
      raise RuntimeError("DeviceTurn.ordered: already ordered (one pipeline at a time)")
    process = jax.process_index() if process is None else process
    processes = jax.process_count() if processes is None else processes
    self._order = _TurnOrder(kv, prefix, leader, process,
                             followers=range(1, processes) if leader else ())
    try:
      yield
    finally:
      self._order = None

  def _acquire(self) -> None:
    name = threading.current_thread().name
    order = self._order
    if order is None or order.leader:
      with self._cond:
        while self._busy:
          self._cond.wait()
        self._busy = True
        n = order.next() if order is not None else 0
      if order is not None:
        try:
          order.publish(n, name)
        except BaseException:
          self._release()  # a failed publish must not leave the devices taken for ever
          raise
      return
    while True:  # a follower: the n-th turn goes to the thread the leader gave it to
      with self._cond:
        while self._busy:
          self._cond.wait()
        n = order.count
        holder = order.next_holder
      if holder is None:
        # Blocking, outside the lock: the holder may be releasing. None: turn n was taken
        # meanwhile (by a thread whose fetch came first).
        holder = order.fetch(n)
        with self._cond:
          if holder is not None and order.count == n:  # else taken and gone: nothing to keep
            order.next_holder = holder
          self._cond.notify_all()
      with self._cond:
        if order.count != n or holder is None:
          continue
        if holder == name and not self._busy:
          self._busy = True
          order.count += 1
          order.next_holder = None
          return
        while order.count == n and (holder != name or self._busy):
          self._cond.wait()

  def _release(self) -> None:
    with self._cond:
      self._busy = False
      self._cond.notify_all()

  @staticmethod
  def _settle() -> None:
    """Waits for the programs this turn dispatched, before the turn goes to the other thread.
    XLA:CPU runs dispatched programs on a thread pool as their inputs become ready, not in
    dispatch order: the other thread's first program could start before this turn's last one
    ends, and their collectives (gloo across processes, a rendezvous across fake devices) would
    meet in another order on each process or device (seen: a two-process run hung, each
    process waiting in a different program). A GPU or TPU runs each device's programs in
    dispatch order, so only the CPU waits."""
    if jax.default_backend() != "cpu":
      return
    for array in jax.live_arrays():
      try:
        array.block_until_ready()
      except RuntimeError:  # deleted meanwhile (donated, collected): nothing left to wait for
        pass

  @contextlib.contextmanager
  def hold(self) -> Iterator[None]:
    """The calling thread holds the devices inside the block (already held: nothing more)."""
    if getattr(self._holder, "held", False):
      yield
      return
    self._acquire()
    self._holder.held = True
    try:
      yield
    finally:
      # Held no more if a host wait inside failed to take the devices back: then the turn is
      # another thread's, not this one's to release.
      if self._holder.held:
        self._holder.held = False
        self._settle()
        self._release()

  @contextlib.contextmanager
  def host_wait(self) -> Iterator[None]:
    """Host-only work (nothing dispatched inside, but for `collective` blocks): the devices are
    let go for its duration when the calling thread holds them, and taken back after; otherwise
    nothing happens."""
    if not getattr(self._holder, "held", False):
      yield
      return
    self._holder.held = False
    self._settle()
    self._release()
    try:
      yield
    finally:
      self._acquire()
      self._holder.held = True

  def collective(self) -> contextlib.AbstractContextManager:
    """Around a cross-process collective (a broadcast, an all-gather): it takes a turn for its
    duration when the calling thread does not hold the devices (inside a host wait, or a thread
    that never took them), since its program must come in the same turn on every process;
    nothing happens when the thread holds them. That is `hold` (reentrant), named for the
    call sites."""
    return self.hold()


class _TurnOrder:
  """The order of a multi-process DeviceTurn (its `ordered` docstring): the leader's count of
  turns granted, or a follower's, and (a follower) the thread turn `count` goes to once read.

  Turn n's key is deleted once no follower will read it again, so a long run keeps a bounded
  number of keys in the coordination service (its memory, and the leader's process, would
  otherwise grow with every turn: tens a step). A follower's fetches are serialized and skip a
  turn already taken (count past it), so once it fetches turn n it never asks for one below n:
  every ACK_EVERY turns it records n - 1 (`{prefix}/read/{process}`, overwritten). Every
  PRUNE_EVERY turns the leader deletes the turns every follower has recorded. Keys alive: at most
  PRUNE_EVERY + ACK_EVERY + the leader's lead over the slowest follower, plus one per follower.
  """

  TIMEOUT_MS = 30 * 60 * 1000  # a turn waits as long as a step may (an update, a slow judge)
  ACK_EVERY = 8
  PRUNE_EVERY = 16

  def __init__(self, kv: Any, prefix: str, leader: bool, process: int,
               followers: Sequence[int] = ()):
    self.kv, self.prefix, self.leader, self.process = kv, prefix, leader, process
    self.followers = tuple(followers)  # the leader's: the process indices that read its turns
    self.count = 0
    self.next_holder: str | None = None
    self.pruned = 0  # the leader's: turns below this are deleted
    self._fetching = threading.Lock()  # a follower's: one fetch at a time

  def next(self) -> int:
    n, self.count = self.count, self.count + 1
    return n

  def publish(self, n: int, name: str) -> None:
    self.kv.key_value_set(f"{self.prefix}/{n}", name)
    if n % self.PRUNE_EVERY == self.PRUNE_EVERY - 1:
      self.prune()

  def prune(self) -> None:
    """Deletes the turns every follower has read (the leader's; a no-op until all have said)."""
    read = []
    for process in self.followers:
      try:
        read.append(int(self.kv.key_value_try_get(f"{self.prefix}/read/{process}")))
      except Exception:  # noqa: BLE001 - not yet written: that follower has said nothing
        return
    upto = min(read, default=self.count - 1)
    try:
      for n in range(self.pruned, upto + 1):
        self.kv.key_value_delete(f"{self.prefix}/{n}")
        self.pruned = n + 1
    except Exception as e:  # noqa: BLE001 - housekeeping: the turn is granted already, and an
      # error here would leave the followers waiting in its collective
      logging.getLogger(__name__).warning("DeviceTurn: could not delete turn keys of %r (%s); "
                                          "trying again later", self.prefix, e)

  def fetch(self, n: int) -> str | None:
    """The name of turn n's holder (a follower's; blocks until the leader publishes it), or None
    when turn n is already taken (the caller's count is stale: the turn went to a thread whose
    fetch came first; its key may be deleted by now)."""
    with self._fetching:
      if self.count != n:
        return None
      try:
        name = self.kv.blocking_key_value_get(f"{self.prefix}/{n}", self.TIMEOUT_MS)
      except Exception as e:  # noqa: BLE001 - name the turn: a bare coordination error says little
        raise RuntimeError(f"DeviceTurn: turn {n} of {self.prefix!r} was not published by "
                           f"process 0 within {self.TIMEOUT_MS // 60000} min ({e})") from e
      if n % self.ACK_EVERY == 0 and n:  # no fetch of this process asks below n from now on
        self.kv.key_value_set(f"{self.prefix}/read/{self.process}", str(n - 1),
                              allow_overwrite=True)
      return name


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (bound, then released): for a
  loopback coordinator (jax.distributed) or a local server."""
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def distributed_kv() -> Any:
  """jax.distributed's key-value client (set after jax.distributed.initialize; every process of
  a multi-host run has one)."""
  from jax._src import distributed
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("no jax.distributed client: call jax.distributed.initialize first")
  return client


DEVICE_TURN = DeviceTurn()


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any (e.g. a SIGTERM one host received)."""
  if jax.process_count() == 1:
    return bool(flag)
  with DEVICE_TURN.collective():
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
  with DEVICE_TURN.collective():  # inside a host wait of an asynchronous run: a turn of its own
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


def to_device(x: Any, dtype: Any = None) -> jax.Array:
  """A host value (NumPy array, list, scalar) as a device array, by a transfer alone.

  `jnp.asarray(host_array)` compiles and runs a small copy program per shape and dtype (jax's
  "jit(stage)"), so a rollout handing the device row lists of new lengths compiled one at each;
  `jax.device_put` transfers without one. Jitted functions take NumPy arguments as they are."""
  return jax.device_put(np.asarray(x, dtype))


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
