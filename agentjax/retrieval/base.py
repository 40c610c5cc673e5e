"""The search interface of rollouts: a batch of queries and a top-k in, documents out.

Every backend (local BM25, a remote retrieval server, later dense retrievers) implements
`SearchBackend.search(queries, topk) -> SearchResponse`. A retriever fault (server down, slow,
answering garbage) never raises: the failed query gets no documents and a short error string,
which the rollout engine turns into an error observation and counts (`SearchStats`). Only
programmer errors (topk < 1, a bare string for `queries`) raise.

Corpora use the FlashRAG / Search-R1 JSONL format: one `{"id": ..., "contents": "\"Title\"\\nbody"}`
per line, the title on the first line of `contents` (often quoted; kept as-is).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from agentjax.jsonl import iter_json_objects
from agentjax.registry import Registry


class CorpusError(ValueError):
  """A corpus file that cannot be read; the message names the file and the line."""


@dataclasses.dataclass(frozen=True)
class Document:
  """One retrieved passage. `contents` is "Title\\nbody" (FlashRAG); `score` is the backend's."""
  id: str
  contents: str
  score: float

  @property
  def title(self) -> str:
    """The first line of `contents` (quotes, if any, kept)."""
    return self.contents.split("\n", 1)[0]

  @property
  def text(self) -> str:
    """`contents` after its first newline ("" for a one-line document)."""
    parts = self.contents.split("\n", 1)
    return parts[1] if len(parts) == 2 else ""


@dataclasses.dataclass
class SearchResponse:
  """The answer to a batch of B queries, aligned with them.

  documents: B lists of up to topk Documents, best first (fewer when fewer documents match).
  errors: B entries, None for a query that succeeded (even with no documents), else a short
    human-readable reason; a failed query always has `documents[i] == []`.
  """
  documents: list[list[Document]]
  errors: list[str | None]

  @classmethod
  def failed(cls, num_queries: int, reason: str) -> SearchResponse:
    """Every query failed for the same reason (the retriever as a whole is at fault)."""
    return cls([[] for _ in range(num_queries)], [reason] * num_queries)

  @classmethod
  def from_exception(cls, num_queries: int, error: BaseException) -> SearchResponse:
    """Every query failed because the backend raised `error` (its repr, cut, is the reason)."""
    return cls.failed(num_queries, f"search backend error: {error!r}"[:300])

  def to_json(self) -> dict[str, Any]:
    """{"documents": [[[id, contents, score], ...], ...], "errors": [...]}: plain JSON types."""
    return {"documents": [[[str(d.id), str(d.contents), float(d.score)] for d in docs]
                          for docs in self.documents],
            "errors": [None if e is None else str(e) for e in self.errors]}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> SearchResponse:
    """The inverse of to_json."""
    return cls([[Document(*d) for d in docs] for docs in data["documents"]], data["errors"])

  @property
  def num_failed(self) -> int:
    return sum(e is not None for e in self.errors)


def guarded_search(backend: Any, queries: Sequence[str], topk: int) -> SearchResponse:
  """backend.search(queries, topk), never raising: a backend that raises (a bug, a fault its
  own handling missed) or answers a number of results other than len(queries) fails every query
  of the call (SearchResponse.from_exception), so that a rollout or a branch collection goes on
  with error observations. The one guard of RolloutEngine.search and BranchCollector."""
  try:
    response = backend.search(list(queries), topk)
    if len(response.documents) != len(queries) or len(response.errors) != len(queries):
      raise ValueError(f"{len(response.documents)} results for {len(queries)} queries")
    return response
  except Exception as e:  # noqa: BLE001 - retriever faults must not crash training
    return SearchResponse.from_exception(len(queries), e)


@dataclasses.dataclass
class SearchStats:
  """Cumulative counters of one backend, for the trainer's logs ("retriever failures").

  calls: search() calls; queries: queries asked; failed_queries: queries answered with an error;
  retries: extra attempts beyond the first (remote backends); overloaded: attempts the server
  turned away as overloaded (HTTP 503; each also counts as a retry when one followed);
  seconds: wall time inside search().
  Thread-safe: the rollout engine and the retrieval server call search() from several threads.
  """
  calls: int = 0
  queries: int = 0
  failed_queries: int = 0
  retries: int = 0
  overloaded: int = 0
  seconds: float = 0.0
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False,
                                            compare=False)

  def record(self, *, queries: int, failed_queries: int = 0, retries: int = 0,
             overloaded: int = 0, seconds: float = 0.0) -> None:
    """Adds one search() call."""
    with self._lock:
      self.calls += 1
      self.queries += queries
      self.failed_queries += failed_queries
      self.retries += retries
      self.overloaded += overloaded
      self.seconds += seconds

  def as_dict(self) -> dict[str, float]:
    """A snapshot, e.g. for a metrics logger."""
    with self._lock:
      return {"calls": self.calls, "queries": self.queries, "failed_queries": self.failed_queries,
              "retries": self.retries, "overloaded": self.overloaded, "seconds": self.seconds}


@runtime_checkable
class SearchBackend(Protocol):
  """What the rollout engine calls. Implementations keep a `stats: SearchStats`."""

  stats: SearchStats

  def search(self, queries: Sequence[str], topk: int) -> SearchResponse:
    """Top-`topk` documents for each of the B `queries`; never raises for a retriever fault."""
    ...


def check_search_args(queries: Sequence[str], topk: int) -> list[str]:
  """Validates search() arguments (programmer errors raise) and returns the queries as a list."""
  if isinstance(queries, (str, bytes)):
    raise TypeError("`queries` must be a sequence of strings, not a single string")
  if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
    raise ValueError(f"`topk` must be an integer >= 1, got {topk!r}")
  queries = list(queries)
  for i, q in enumerate(queries):
    if not isinstance(q, str):
      raise TypeError(f"`queries[{i}]` must be a string, got {type(q).__name__}")
  return queries


def read_corpus(path: str) -> tuple[list[dict[str, Any]], str]:
  """Reads a FlashRAG JSONL corpus; returns (rows, sha256 hex of the file's bytes).

  Each row is the line's JSON object with "id" coerced to str. The hash is computed in the same
  pass (we read every byte anyway) so that index caches can be keyed by content. Blank lines are
  skipped. Raises CorpusError naming the file and the 1-based line number of a malformed line.
  """
  digest = hashlib.sha256()
  rows = []
  for lineno, row in iter_json_objects(path, CorpusError, ("id", "contents"), "corpus",
                                       on_line=digest.update):
    if not isinstance(row["contents"], str):
      raise CorpusError(f"{path}:{lineno}: field 'contents' must be a string, "
                        f"got {type(row['contents']).__name__}")
    if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
      raise CorpusError(f"{path}:{lineno}: field 'id' must be a string or an integer")
    row["id"] = str(row["id"])
    rows.append(row)
  if not rows:
    raise CorpusError(f"{path}: the corpus has no documents")
  return rows, digest.hexdigest()


def load_corpus(path: str) -> list[dict[str, Any]]:
  """Reads a FlashRAG JSONL corpus: a list of {"id": str, "contents": str, ...} rows.

  Raises CorpusError (a ValueError) naming the file and line number of a malformed line.
  """
  return read_corpus(path)[0]


# kind -> factory(**kwargs) -> SearchBackend. The built-in ones register themselves when their
# module is first imported (so that e.g. the http client does not pay for importing bm25s).
BACKENDS = Registry("search backend kind", {"bm25": "agentjax.retrieval.bm25",
                                            "http": "agentjax.retrieval.http",
                                            "dense": "agentjax.retrieval.dense_index"})


def register_backend(kind: str, factory: Callable[..., SearchBackend]) -> None:
  """Makes `make_backend(kind, **kwargs)` call `factory(**kwargs)`. A run selects it with
  config.retrieval.backend=kind once a module named in config.retrieval.plugins has called this
  (agentjax/retrieval/plugins.py). A taken kind raises ValueError."""
  BACKENDS.register(kind, factory)


def make_backend(kind: str, **kwargs: Any) -> SearchBackend:
  """Builds a backend by name, e.g. make_backend("http", url="http://127.0.0.1:8000/retrieve")."""
  try:
    factory = BACKENDS[kind]
  except KeyError as e:
    raise ValueError(f"{e.args[0]}; register one with register_backend({kind!r}, factory) "
                     f"(from a run's config: a module in config.retrieval.plugins)") from None
  return factory(**kwargs)
