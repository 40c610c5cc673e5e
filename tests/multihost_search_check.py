"""PrimarySearch across processes: every process gets process 0's retriever answer.

  python -m tests.multihost_search_check --num_processes=2 --process_id=0 --port=P   (and 1)

Each process has its own backend, which answers differently per process (process 1's fails every
query, process 0's raises on its second call). Printed: one JSON line of what this process got.
"""

from __future__ import annotations

import argparse
import json
import os



class PerProcessBackend:
  """Answers query q with a document naming this process; process 1's retriever is down."""

  def __init__(self, process: int):
    from agentjax.retrieval import SearchStats
    self.process, self.calls, self.stats = process, 0, SearchStats()

  def search(self, queries, topk):
    from agentjax.retrieval import Document, SearchResponse
    self.calls += 1
    if self.process == 1:
      return SearchResponse.failed(len(queries), "timeout on host 1")
    if self.calls == 2:
      raise ConnectionError("retriever reset")
    return SearchResponse([[Document(f"d{i}", f"Title {q}\nbody ü from {self.process}", 1.5)]
                           for i, q in enumerate(queries)], [None] * len(queries))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--num_processes", type=int, default=2)
  p.add_argument("--process_id", type=int, default=0)
  p.add_argument("--port", type=int, default=0)
  args = p.parse_args()
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes, args.process_id)
  from agentjax.parallel.host import broadcast_from_primary
  from agentjax.retrieval.shared import PrimarySearch
  backend = PrimarySearch(PerProcessBackend(jax.process_index()))
  got = []
  for queries in (["who is ä", "where"], ["x"], ["again"]):
    got.append(backend.search(queries, 1).to_json())
  got.append(broadcast_from_primary({"process": jax.process_index()} if jax.process_index() == 0
                                    else None))
  print(json.dumps({"process": jax.process_index(), "got": got,
                    "backend_calls": backend.backend.calls}), flush=True)


if __name__ == "__main__":
  main()
