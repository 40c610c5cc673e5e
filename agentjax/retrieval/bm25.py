"""Local BM25 search over a FlashRAG JSONL corpus (bm25s), with the index cached on disk.

The index is built once per (corpus bytes, BM25 parameters, bm25s version) and saved as plain
.npy/.json files (bm25s save/load with allow_pickle=False: no pickle anywhere); a later
construction loads it instead of rebuilding. A changed corpus has another content hash, hence
another cache folder, hence a rebuild.

Scoring is bm25s' "lucene" variant by default:
  idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)),  tfc = tf / (tf + k1 * (1 - b + b * dl / avgdl)),
  score(q, d) = sum over query tokens t (repeats counted) of idf(t) * tfc(t, d),
where bm25s drops Lucene's constant (k1 + 1) factor (same ranking). Tokens are bm25s' default:
lowercased `\\b\\w\\w+\\b` words (one-character words are dropped), English stopwords removed
unless `stopwords=None`, no stemming.

Queries that match nothing (empty, only stopwords, or only words absent from the corpus) succeed
with no documents, and documents that match no query word (score 0) are never returned: a query
may get fewer than topk documents, as with Lucene/pyserini, which Search-R1 uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Sequence

import bm25s

from agentjax.retrieval.base import (BACKENDS, Document, SearchResponse, SearchStats,
                                     check_search_args, read_corpus)

_log = logging.getLogger(__name__)

# Written last into a finished cache folder: its presence (and matching key) marks the folder as
# complete, so a crash mid-save is rebuilt rather than loaded.
MARKER_FILE = "agentjax_bm25.json"
# Bumped when what we store (or how we tokenize) changes, to invalidate old caches.
_CACHE_FORMAT = 1


def default_index_dir() -> str:
  """$XDG_CACHE_HOME/agentjax/bm25 (~/.cache/agentjax/bm25): corpora may live on read-only disks."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
  return os.path.join(root, "agentjax", "bm25")


class BM25Backend:
  """BM25 over a FlashRAG JSONL corpus held in memory; implements SearchBackend.

  Args:
    corpus_path: JSONL file, one {"id", "contents"} object per line.
    index_dir: parent folder of the index caches (default `default_index_dir()`); each corpus and
      parameter set gets its own subfolder `<corpus name>-<key>`.
    k1, b, method: BM25 parameters (method: a bm25s variant: lucene, robertson, atire, bm25l,
      bm25+).
    stopwords: bm25s stopwords for corpus and queries: "en" (default), None, or a list of words.
    mmap: memory-map the cached score arrays instead of reading them (for large corpora).

  Attributes:
    num_docs: N, the corpus size.
    index_path: the cache subfolder in use.
    built: True when this construction built the index, False when it loaded the cache.
    stats: SearchStats.
  """

  def __init__(self, corpus_path: str, index_dir: str | None = None, k1: float = 1.5,
               b: float = 0.75, method: str = "lucene", stopwords: str | list[str] | None = "en",
               mmap: bool = False):
    self.corpus_path = corpus_path
    rows, corpus_sha = read_corpus(corpus_path)
    self._ids = [r["id"] for r in rows]
    self._contents = [r["contents"] for r in rows]
    self.num_docs = len(rows)
    self._stopwords = stopwords
    self.params = {"k1": float(k1), "b": float(b), "method": method, "stopwords": stopwords}
    key_source = {"corpus_sha256": corpus_sha, "num_docs": self.num_docs, **self.params,
                  "bm25s": bm25s.__version__, "format": _CACHE_FORMAT}
    self._key = hashlib.sha256(json.dumps(key_source, sort_keys=True).encode()).hexdigest()
    stem = os.path.splitext(os.path.basename(corpus_path))[0] or "corpus"
    self.index_path = os.path.join(index_dir or default_index_dir(), f"{stem}-{self._key[:16]}")
    self.built = False
    self._retriever = self._load_cached(mmap)
    if self._retriever is None:
      self._retriever = self._build_and_cache()
      self.built = True
    self._vocab = self._retriever.vocab_dict
    self.stats = SearchStats()

  def _load_cached(self, mmap: bool) -> bm25s.BM25 | None:
    marker = os.path.join(self.index_path, MARKER_FILE)
    try:
      with open(marker) as f:
        meta = json.load(f)
    except (OSError, json.JSONDecodeError):
      return None
    if meta.get("key") != self._key or meta.get("num_docs") != self.num_docs:
      return None
    try:
      retriever = bm25s.BM25.load(self.index_path, mmap=mmap, allow_pickle=False,
                                  load_corpus=False, show_progress=False)
    except Exception as e:  # noqa: BLE001 -- a corrupt cache is rebuilt, whatever the failure
      _log.warning("BM25 cache %s is unreadable (%r); rebuilding", self.index_path, e)
      return None
    if retriever.scores["num_docs"] != self.num_docs:
      return None
    _log.info("BM25 index loaded from %s (%d documents)", self.index_path, self.num_docs)
    return retriever

  def _build_and_cache(self) -> bm25s.BM25:
    start = time.perf_counter()
    tokens = bm25s.tokenize(self._contents, stopwords=self._stopwords, show_progress=False)
    # backend="numpy": numba is optional and not a dependency.
    retriever = bm25s.BM25(k1=self.params["k1"], b=self.params["b"], method=self.params["method"],
                           backend="numpy")
    retriever.index(tokens, show_progress=False)
    _log.info("BM25 index of %d documents built in %.1fs", self.num_docs,
              time.perf_counter() - start)
    # Save into a staging folder beside the target, then rename it into place: readers never see
    # a half-written index, and concurrent builders of the same key just keep the first one.
    parent = os.path.dirname(self.index_path)
    try:
      os.makedirs(parent, exist_ok=True)
      staging = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    except OSError as e:
      _log.warning("BM25 index not cached (cannot write under %s: %s)", parent, e)
      return retriever
    try:
      retriever.save(staging, allow_pickle=False, show_progress=False)
      with open(os.path.join(staging, MARKER_FILE), "w") as f:
        json.dump({"key": self._key, "num_docs": self.num_docs, "corpus": self.corpus_path,
                   "params": self.params, "bm25s": bm25s.__version__}, f, indent=2)
      if os.path.exists(self.index_path):  # incomplete or stale: we decided to rebuild it
        shutil.rmtree(self.index_path, ignore_errors=True)
      os.rename(staging, self.index_path)
    except OSError as e:
      _log.warning("BM25 index not cached at %s: %s", self.index_path, e)
    finally:
      shutil.rmtree(staging, ignore_errors=True)  # a no-op after a successful rename
    return retriever

  def search(self, queries: Sequence[str], topk: int) -> SearchResponse:
    """Top-`topk` documents per query, best first, all queries scored in one bm25s call.

    A query gets fewer than topk documents when fewer match (or topk > num_docs), and [] with no
    error when nothing matches. Never returns errors for valid arguments.
    """
    queries = check_search_args(queries, topk)
    start = time.perf_counter()
    documents: list[list[Document]] = [[] for _ in queries]
    # Words absent from the corpus vocabulary cannot score; dropping them ourselves lets us skip
    # queries left empty (bm25s would score them all-zero and log about it).
    tokens = [[t for t in q if t in self._vocab] for q in
              bm25s.tokenize(queries, stopwords=self._stopwords, return_ids=False,
                             show_progress=False)] if queries else []
    live = [i for i, t in enumerate(tokens) if t]
    if live:
      # backend_selection="numpy": bm25s' "auto" picks jax.lax.top_k, which recompiles for
      # every new (num_docs, k) and would put the scores on the trainer's accelerator.
      indices, scores = self._retriever.retrieve(
          [tokens[i] for i in live], k=min(topk, self.num_docs), sorted=True, n_threads=0,
          show_progress=False, backend_selection="numpy")
      for row, i in enumerate(live):
        # Ties go to the earlier corpus line (bm25s leaves their order to argpartition).
        hits = sorted((-s, j) for j, s in zip(indices[row].tolist(), scores[row].tolist())
                      if s > 0.0)
        documents[i] = [Document(self._ids[j], self._contents[j], -neg) for neg, j in hits]
    self.stats.record(queries=len(queries), seconds=time.perf_counter() - start)
    return SearchResponse(documents, [None] * len(queries))


BACKENDS.register("bm25", BM25Backend)
