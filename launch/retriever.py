r"""A retrieval server speaking the Search-R1 HTTP API, for search-agent rollouts: BM25, or a
dense index of launch/index.py (e5, bge) searched on this machine's devices.

    python launch/retriever.py --corpus=data/wiki-18.jsonl --port=8000
    python launch/retriever.py --index=indexes/wiki18-e5 --port=8000   # dense
    curl -s 127.0.0.1:8000/health
    curl -s 127.0.0.1:8000/retrieve \
        -d '{"queries": ["who wrote hamlet"], "topk": 3, "return_scores": true}'

Trainers then use make_backend("http", url="http://127.0.0.1:8000/retrieve"). The corpus is
FlashRAG JSONL ({"id", "contents"} per line); the BM25 index is built on first start and cached
(--index_dir, default ~/.cache/agentjax/bm25), so later starts only load it. Binds 127.0.0.1
unless --host says otherwise. API, status codes and the limits on bad or stalled clients
(--max_body_bytes, --read_timeout_s) and on overload (--max_pending: 503 with Retry-After
beyond it): agentjax/retrieval/server.py.
"""

from __future__ import annotations

import logging
import os
import sys

# bm25s imports jax and runs one op at import time: keep that off the accelerators, which belong
# to the trainer (JAX would otherwise preallocate most of a GPU's memory for this process). A
# dense index is searched on this machine's devices: set JAX_PLATFORMS to choose them.
if not any(arg.startswith("--index") for arg in sys.argv[1:]):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

import common  # noqa: E402  (launch/common.py: the entry point, one-line errors, quiet logs)
from agentjax.retrieval.bm25 import BM25Backend  # noqa: E402
from agentjax.retrieval.server import make_server  # noqa: E402

FLAGS = flags.FLAGS
log = logging.getLogger("agentjax.retriever")  # kept by the launch scripts' quiet logs
flags.DEFINE_string("corpus", None, "FlashRAG JSONL corpus ({\"id\", \"contents\"} per line); "
                    "with --index, default: the index's own.")
flags.DEFINE_string("index", None, "A dense index folder (launch/index.py): serve it instead of "
                    "BM25.")
flags.DEFINE_string("query_prefix", "query: ", "Dense: text before each query (e5: \"query: \").")
flags.DEFINE_float("recall_target", 0.0, "Dense: approximate search at this recall "
                   "(lax.approx_max_k); 0: exact.")
flags.DEFINE_string("index_dir", None, "Folder of BM25 index caches (default "
                    "~/.cache/agentjax/bm25).")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0 exposes it to the network).")
flags.DEFINE_integer("port", 8000, "Port to bind (0: any free port, printed at start).")
flags.DEFINE_integer("topk", 3, "Documents per query when a request gives no topk.")
flags.DEFINE_integer("max_topk", 100, "Largest topk a request may ask for.")
flags.DEFINE_integer("max_queries", 4096, "Most queries in one request.")
flags.DEFINE_integer("max_body_bytes", 16 << 20, "Largest request body (413 above it).")
flags.DEFINE_float("read_timeout_s", 30.0, "Seconds any read or write of a connection may block; "
                   "a client that stalls longer loses its connection (searches are not limited).")
flags.DEFINE_integer("max_pending", 64, "Most requests searching or waiting for a search thread; "
                     "one more is answered 503 with Retry-After at once (bounded memory under a "
                     "pile-up). 64: several times what trainers send at once (each rollout worker "
                     "waits for its answer before it asks again).")
flags.DEFINE_integer("retry_after_s", 1, "Retry-After of a 503, in whole seconds.")
flags.DEFINE_integer("search_threads", 4, "Most searches run at once (the others admitted wait "
                     "for one).")
flags.DEFINE_float("k1", 1.5, "BM25 k1.")
flags.DEFINE_float("b", 0.75, "BM25 b.")
flags.DEFINE_bool("stopwords", True, "Remove English stopwords (corpus and queries).")
flags.DEFINE_bool("mmap", False, "Memory-map the cached index instead of reading it into RAM.")


def main(argv):
  del argv
  if FLAGS.index:
    from agentjax.retrieval.dense_index import DenseBackend
    backend = DenseBackend(FLAGS.index, corpus_path=FLAGS.corpus,
                           query_prefix=FLAGS.query_prefix,
                           recall_target=FLAGS.recall_target or None)
    log.info("dense index %s (%d documents)", FLAGS.index, backend.num_docs)
  elif not FLAGS.corpus:
    raise app.UsageError("give --corpus (BM25) or --index (a dense index of launch/index.py)")
  else:
    backend = BM25Backend(FLAGS.corpus, index_dir=FLAGS.index_dir, k1=FLAGS.k1, b=FLAGS.b,
                          stopwords="en" if FLAGS.stopwords else None, mmap=FLAGS.mmap)
    log.info("BM25 index %s at %s (%d documents)", "built" if backend.built else "loaded",
             backend.index_path, backend.num_docs)
  server = make_server(backend, host=FLAGS.host, port=FLAGS.port, default_topk=FLAGS.topk,
                       max_topk=FLAGS.max_topk, max_queries=FLAGS.max_queries,
                       max_body_bytes=FLAGS.max_body_bytes, read_timeout_s=FLAGS.read_timeout_s,
                       max_pending=FLAGS.max_pending, retry_after_s=FLAGS.retry_after_s,
                       search_threads=FLAGS.search_threads)
  print(f"serving {backend.num_docs} documents at {server.url}", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  common.run(main)
