"""One retriever answer for every process of a multi-host run.

Each process runs the same host logic on the whole batch (agentjax.parallel.host), so each asks
the same queries. A remote retriever can still answer processes differently (a timeout seen by
one host only, an index being rebuilt), and then their trajectories, rewards and updates would
diverge. PrimarySearch asks on process 0 only and broadcasts its response.
"""

from __future__ import annotations

from typing import Sequence

import jax

from agentjax.parallel.host import broadcast_from_primary
from agentjax.retrieval.base import (SearchBackend, SearchResponse, SearchStats,
                                     check_search_args)


class PrimarySearch:
  """A SearchBackend that searches `backend` on process 0 and gives every process its response.

  Every process must call search() with the same queries in the same order (a collective).
  `stats` counts on process 0 (where the searches happen); elsewhere it counts calls and queries.
  """

  def __init__(self, backend: SearchBackend):
    self.backend = backend
    self.stats = backend.stats if jax.process_index() == 0 else SearchStats()

  def search(self, queries: Sequence[str], topk: int) -> SearchResponse:
    queries = check_search_args(queries, topk)
    payload = None
    if jax.process_index() == 0:
      try:  # everything that may raise, so that process 0 always reaches the broadcast
        payload = self.backend.search(queries, topk).to_json()
      except Exception as e:  # noqa: BLE001 - the others wait on the broadcast: never skip it
        payload = SearchResponse.from_exception(len(queries), e).to_json()
    else:
      self.stats.record(queries=len(queries))
    return SearchResponse.from_json(broadcast_from_primary(payload))
