"""The newest parameters of a run, for rollouts in flight (rollout.partial; asynchronous RL).

    feed = ParamsFeed(params, version=0)       # the trainer's thread
    feed.publish(new_params, version=1)        # after each update
    engine.run(params, questions, rng, feed=feed, version=0)   # the producer's thread

A rollout reads the feed before it feeds its prompts (starting with the newest parameters
there are), then at each turn (rollout.engine "turns") or as each lane of the slot engine settles
(before its feeds and its next decode call). When it finds a newer version:
  "continue": the rest of the rollout samples (and feeds observations) with the new parameters;
    each sampled token records the version in use when it was sampled (TrajectoryBatch.versions;
    the first token after a switch is drawn from logits the older parameters computed at the
    end of the context). The KV cache of the context already fed stays as the older parameters
    computed it (PipelineRL's in-flight weight update: re-encoding the context would cost a
    prefill per update).
  "restart": the whole rollout starts again from its prompts with the new parameters (and the
    same key), so every token of a trajectory is by one version; wasted decode, counted.
  "off": the feed is not read; a rollout ends with the parameters it started with.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

PARTIAL_MODES = ("off", "continue", "restart")


class ParamsFeed:
  """The latest (params, version) a run published; thread-safe. `map(fn)` is a view whose
  current() gives fn(params), computed once per version (e.g. LoRA's rollout parameters)."""

  def __init__(self, params: Any, version: int):
    self._lock = threading.Lock()
    self._value = (params, int(version))

  def publish(self, params: Any, version: int) -> None:
    with self._lock:
      if int(version) < self._value[1]:
        raise ValueError(f"ParamsFeed: version {version} is older than the published "
                         f"{self._value[1]}")
      self._value = (params, int(version))

  def current(self) -> tuple[Any, int]:
    with self._lock:
      return self._value

  def map(self, fn: Callable[[Any], Any]) -> "_MappedFeed":
    return _MappedFeed(self, fn)


class _MappedFeed:
  def __init__(self, feed: ParamsFeed, fn: Callable[[Any], Any]):
    self.feed, self.fn, self._cache = feed, fn, (None, -1)

  def current(self) -> tuple[Any, int]:
    params, version = self.feed.current()
    if self._cache[1] != version:
      self._cache = (self.fn(params), version)
    return self._cache


class NewVersion(Exception):
  """Raised inside a rollout of rollout.partial="restart" that found newer parameters; the
  engine catches it and starts the rollout again with them."""

  def __init__(self, params: Any, version: int):
    super().__init__(f"parameters of version {version} were published")
    self.params, self.version = params, version


def newer(feed: Any, version: int) -> tuple[Any, int] | None:
  """The feed's (params, version) when it is newer than `version`; None otherwise (or no
  feed)."""
  if feed is None:
    return None
  params, latest = feed.current()
  return (params, latest) if latest > version else None


__all__ = ["NewVersion", "PARTIAL_MODES", "ParamsFeed", "newer"]
