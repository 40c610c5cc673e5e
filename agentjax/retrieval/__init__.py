"""Search backends for search-agent rollouts: a batch of queries and a top-k in, documents out.

    backend = make_backend("bm25", corpus_path="wiki.jsonl")            # local, in-process
    backend = make_backend("http", url="http://127.0.0.1:8000/retrieve")  # launch/retriever.py
    response = backend.search(["who wrote hamlet"], topk=3)
    response.documents[0][0].title, response.errors[0]  # errors[i] is None or a short reason

BM25Backend is imported lazily (it pulls in bm25s) so that the HTTP client stays light.
"""

from __future__ import annotations

from typing import Any

from agentjax.retrieval.base import (CorpusError, Document, SearchBackend, SearchResponse,
                                     SearchStats, load_corpus, make_backend, read_corpus,
                                     register_backend)
from agentjax.retrieval.http import HttpSearchBackend
from agentjax.retrieval.server import RetrievalServer, make_server, start_in_thread

__all__ = [
    "BM25Backend", "CorpusError", "Document", "HttpSearchBackend", "RetrievalServer",
    "SearchBackend", "SearchResponse", "SearchStats", "load_corpus", "make_backend",
    "make_server", "read_corpus", "register_backend", "start_in_thread",
]


def __getattr__(name: str) -> Any:
  if name == "BM25Backend":
    from agentjax.retrieval.bm25 import BM25Backend
    return BM25Backend
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
