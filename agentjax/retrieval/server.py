"""Serving any SearchBackend over the Search-R1 retrieval HTTP API (standard library only).

  POST /retrieve  {"queries": [str, ...], "topk": k (optional), "return_scores": bool (optional)}
    200 -> {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]} (return_scores)
           {"result": [[{"id", "contents"}, ...], ...]}                           (otherwise)
    400 -> {"error": "..."} naming the bad field; 500 -> {"error": "..."} if the backend failed;
    503 -> {"error": "..."} with a Retry-After header (seconds): max_pending requests are already
           searching or waiting to, try again later (see "Overload" below).
  GET /health     200 -> {"status": "ok", "num_docs": N, "pending": requests admitted now,
                          "max_pending", "rejected": 503 answers so far}; never refused for
                          overload.

A bad length is refused before any body byte is read; after any of these answers the connection
is closed (the body, unread or incomplete, cannot be told from a next request):
  400  Content-Length not a plain non-negative decimal ("-1", "+5", "1_0", "0x10", ""), two that
       disagree, or a body that ends before its announced length;
  411  no Content-Length (chunked request bodies are not supported);
  413  Content-Length above max_body_bytes;
  408  the body did not arrive within read_timeout_s.
Every socket operation of a connection times out after read_timeout_s, so a client that connects
and stalls (before or inside its request, or by not reading its answer) loses its connection and
its thread within that time; other clients are served meanwhile (one thread per connection). A
client that trickles bytes faster than that is not cut off: this server is meant for a trusted
local network (it binds 127.0.0.1 unless told otherwise), not to face the internet.

Overload: at most search_threads searches run at once (the backend's pool); the other admitted
requests wait for one of them. A request whose body was read and parsed is admitted only while
fewer than max_pending requests are searching or waiting; beyond that it is answered 503 at once
(with Retry-After: retry_after_s), so a burst of clients costs a parse each rather than an
unbounded queue of parsed requests, searches and answers in memory. Refused bodies (4xx above)
are never admitted, and an admitted request leaves the count when its search ends (whatever its
outcome), before its answer is written: a client slow to read its answer holds no place.
HttpSearchBackend retries a 503 after its Retry-After (capped by its max_backoff_s).

`return_scores` defaults to false as in Search-R1's server; HttpSearchBackend always asks for
scores. launch/retriever.py runs this over a BM25Backend; tests start it in-process on port 0.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentjax.retrieval.base import SearchBackend

_log = logging.getLogger(__name__)


# A Content-Length value: ASCII digits only (int() would also take "+5", " 1_0 " and "-1").
_DECIMAL = re.compile(r"[0-9]+")
# A length with more digits is refused as too large without int() (which refuses 4300+ digits).
_MAX_LENGTH_DIGITS = 18


class RequestError(ValueError):
  """A client mistake, answered with HTTP `status` (400 unless said otherwise) and this message."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


class RetrievalServer(ThreadingHTTPServer):
  """A ThreadingHTTPServer holding the backend, the request limits and the admission count (see
  make_server). `pending`: requests admitted now (searching or waiting to); `rejected`: 503
  answers so far."""

  daemon_threads = True
  # Do not wait for in-flight searches on close: a stopping retriever owes nobody an answer.
  block_on_close = False
  # The listen backlog (socketserver's default is 5): a burst of rollout workers connecting at
  # once would overflow 5, and the kernel drops the extra SYNs, which clients resend only after
  # a second or more. Overload is answered with 503s instead, which needs the connections in.
  request_queue_size = 128

  def __init__(self, address: tuple[str, int], backend: SearchBackend, default_topk: int,
               max_topk: int, max_queries: int, max_body_bytes: int, read_timeout_s: float,
               max_pending: int = 64, retry_after_s: int = 1, search_threads: int = 4):
    self.backend = backend
    self.default_topk = default_topk
    self.max_topk = max_topk
    self.max_queries = max_queries
    self.max_body_bytes = max_body_bytes
    self.read_timeout_s = read_timeout_s
    self.max_pending = max_pending
    self.retry_after_s = retry_after_s
    self.search_threads = search_threads
    self.search_slots = threading.BoundedSemaphore(search_threads)
    self.pending = 0
    self.rejected = 0
    self._admission = threading.Lock()
    super().__init__(address, _Handler)

  def admit(self) -> bool:
    """Admits a request if fewer than max_pending are (then the caller must release_slot());
    False (and one more rejected) if not."""
    with self._admission:
      if self.pending >= self.max_pending:
        self.rejected += 1
        return False
      self.pending += 1
      return True

  def release_slot(self) -> None:
    """Gives back the place of an admit() that returned True."""
    with self._admission:
      self.pending -= 1

  @property
  def url(self) -> str:
    """The /retrieve endpoint at the bound address (useful with port 0)."""
    host, port = self.server_address[:2]
    return f"http://{host}:{port}/retrieve"


def body_length(headers: Any, max_body_bytes: int) -> int:
  """The request body's length from its headers; RequestError (400/411/413) if unusable.

  Args:
    headers: the request's headers (an email.message.Message, as http.server parses them).
    max_body_bytes: the largest body accepted.
  """
  if headers.get("Transfer-Encoding") is not None:
    raise RequestError("chunked (Transfer-Encoding) request bodies are not supported; "
                       "send a Content-Length header", status=411)
  values = [v.strip() for v in headers.get_all("Content-Length") or []]
  if not values:
    raise RequestError("a Content-Length header is required", status=411)
  for value in values:
    if not _DECIMAL.fullmatch(value):
      raise RequestError(f"header Content-Length must be a non-negative decimal integer, "
                         f"got {value[:40]!r}")
  digits = {v.lstrip("0") or "0" for v in values}
  if len(digits) > 1:
    raise RequestError(f"conflicting Content-Length headers {sorted(v[:40] for v in values)}")
  (value,) = digits
  if len(value) > _MAX_LENGTH_DIGITS or int(value) > max_body_bytes:
    shown = value if len(value) <= 40 else f"a {len(value)}-digit number of"
    raise RequestError(f"request body of {shown} bytes (Content-Length) exceeds the limit of "
                       f"{max_body_bytes} (max_body_bytes)", status=413)
  return int(value)


def parse_request(body: bytes, default_topk: int, max_topk: int,
                  max_queries: int) -> tuple[list[str], int, bool]:
  """(queries, topk, return_scores) from a /retrieve body; RequestError naming the bad field."""
  try:
    payload = json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RequestError(f"request body is not valid JSON ({e})") from None
  if not isinstance(payload, dict):
    raise RequestError("request body must be a JSON object with a 'queries' field")
  if "queries" not in payload:
    raise RequestError("missing field 'queries' (a list of strings)")
  queries = payload["queries"]
  if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
    raise RequestError("field 'queries' must be a list of strings")
  if len(queries) > max_queries:
    raise RequestError(f"field 'queries' has {len(queries)} queries; the limit is {max_queries}")
  topk = payload.get("topk")
  if topk is None:
    topk = default_topk
  if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= max_topk:
    raise RequestError(f"field 'topk' must be an integer in [1, {max_topk}], got {topk!r}")
  return_scores = payload.get("return_scores", False)
  if not isinstance(return_scores, bool):
    raise RequestError(f"field 'return_scores' must be a boolean, got {return_scores!r}")
  return queries, topk, return_scores


class _Handler(BaseHTTPRequestHandler):
  server: RetrievalServer

  def setup(self) -> None:
    # StreamRequestHandler.setup applies `timeout` to the connection's socket: every read and
    # write, including waiting for the request line and headers, gives up after it.
    self.timeout = self.server.read_timeout_s
    super().setup()

  def _reply(self, status: int, payload: Any, close: bool = False,
             headers: dict[str, str] | None = None) -> None:
    """Sends `payload` as JSON (with `headers`); `close` ends the connection after it (unread
    bytes left)."""
    if close:
      self.close_connection = True
    body = json.dumps(payload).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      for name, value in (headers or {}).items():
        self.send_header(name, value)
      if close:
        self.send_header("Connection", "close")
      self.end_headers()
      self.wfile.write(body)
    except OSError as e:  # the client went away (or stopped reading): nobody to answer
      self.close_connection = True
      _log.debug("%s - could not send the %d answer: %r", self.address_string(), status, e)

  def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
    if self.path.split("?")[0] != "/health":
      return self._reply(404, {"error": f"no such endpoint {self.path!r} (GET /health)"})
    server = self.server
    self._reply(200, {"status": "ok", "num_docs": getattr(server.backend, "num_docs", None),
                      "pending": server.pending, "max_pending": server.max_pending,
                      "rejected": server.rejected})

  def do_POST(self) -> None:  # noqa: N802
    if self.path.split("?")[0] != "/retrieve":
      return self._reply(404, {"error": f"no such endpoint {self.path!r} (POST /retrieve)"})
    # Everything about the body is checked before reading it; a refused request leaves its body
    # unread, so the connection cannot carry another request and is closed.
    try:
      length = body_length(self.headers, self.server.max_body_bytes)
    except RequestError as e:
      _log.info("%s - refused: %s", self.address_string(), e)
      return self._reply(e.status, {"error": str(e)}, close=True)
    try:
      body = self.rfile.read(length)
    except TimeoutError:
      return self._reply(408, {"error": f"request body not received within read_timeout_s="
                                        f"{self.server.read_timeout_s:g}s"}, close=True)
    except OSError as e:  # the client reset the connection: nobody to answer
      self.close_connection = True
      _log.debug("%s - connection lost while reading the body: %r", self.address_string(), e)
      return None
    if len(body) != length:  # the client closed its side early
      return self._reply(400, {"error": f"request body ended after {len(body)} of {length} "
                                        f"bytes (Content-Length)"}, close=True)
    try:
      queries, topk, return_scores = parse_request(
          body, self.server.default_topk, self.server.max_topk, self.server.max_queries)
    except RequestError as e:
      return self._reply(e.status, {"error": str(e)})
    # Admitted only now: a refused body above never held a slot. The body was read whole, so
    # the connection stays usable after a 503.
    server = self.server
    if not server.admit():
      return self._reply(503, {"error": f"the retriever is overloaded: {server.max_pending} "
                                        f"requests are searching or waiting to (max_pending); "
                                        f"retry after {server.retry_after_s} s"},
                         headers={"Retry-After": str(server.retry_after_s)})
    try:
      with server.search_slots:  # waits (admitted) while search_threads searches run
        response = server.backend.search(queries, topk)
    except Exception as e:  # noqa: BLE001 -- the client gets a 500 (and retries), we keep serving
      _log.exception("search failed")
      response = e
    finally:  # before any answer is written: a slow reader holds no slot (see the docstring)
      server.release_slot()
    if isinstance(response, Exception):
      return self._reply(500, {"error": f"search failed: {type(response).__name__}: {response}"})
    failed = [e for e in response.errors if e is not None]
    if failed:  # the protocol has no per-query errors: fail the batch, the client will retry
      return self._reply(500, {"error": f"{len(failed)} queries failed: {failed[0]}"})
    result = []
    for docs in response.documents:
      items = [{"id": d.id, "contents": d.contents} for d in docs]
      if return_scores:
        items = [{"document": item, "score": d.score} for item, d in zip(items, docs)]
      result.append(items)
    self._reply(200, {"result": result})

  def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- base class signature
    _log.debug("%s - " + format, self.address_string(), *args)


def make_server(backend: SearchBackend, host: str = "127.0.0.1", port: int = 8000,
                default_topk: int = 3, max_topk: int = 100, max_queries: int = 4096,
                max_body_bytes: int = 16 << 20, read_timeout_s: float = 30.0,
                max_pending: int = 64, retry_after_s: int = 1,
                search_threads: int = 4) -> RetrievalServer:
  """A bound (not yet serving) retrieval server; port 0 picks a free port (see `server.url`).

  Args:
    backend: what answers the searches.
    host, port: where to bind; the default host keeps the server off the network.
    default_topk: documents per query when a request gives no topk; max_topk: the largest topk.
    max_queries: the most queries in one request.
    max_body_bytes: the largest request body (413 above it, refused before reading).
    read_timeout_s: how long any socket read or write of a connection may block; a client that
      stalls that long loses its connection (408 if it stalled inside its body). Searches
      themselves are not limited by it.
    max_pending: the most requests searching or waiting for a search thread; one more is
      answered 503 with Retry-After at once. 64 is several times what trainers send at once
      (each rollout worker waits for its batch's answer before it asks again; a multi-host run
      asks from one process), so it refuses only a real pile-up, and bounds the memory of
      requests in flight to 64 requests' worth (64 bodies of at most max_body_bytes, and their
      answers).
    retry_after_s: the Retry-After of a 503, whole seconds (HTTP's unit): how long a refused
      client should wait. 1 s: about a large batch's search time.
    search_threads: the most searches run at once. BM25 scoring holds Python's lock for much of
      a search, and a dense index's searches share its devices, so more concurrent searches
      mostly add memory (each its scores) and make every one slower; 4 still overlaps one
      search's Python work with another's NumPy or device work.

  Serve with `server.serve_forever()` or `start_in_thread(server)`; stop with
  `server.shutdown(); server.server_close()`. Raises ValueError naming a limit that is not > 0.
  """
  limits = {"default_topk": default_topk, "max_topk": max_topk, "max_queries": max_queries,
            "max_body_bytes": max_body_bytes, "read_timeout_s": read_timeout_s,
            "max_pending": max_pending, "search_threads": search_threads}
  for name, value in limits.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      raise ValueError(f"`{name}` must be a number > 0, got {value!r}")
  for name, value in (("max_pending", max_pending), ("search_threads", search_threads)):
    if isinstance(value, float):
      raise ValueError(f"`{name}` must be an integer > 0, got {value!r}")
  if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 0:
    raise ValueError(f"`retry_after_s` must be an integer >= 0 (seconds), got {retry_after_s!r}")
  if default_topk > max_topk:
    raise ValueError(f"`default_topk` ({default_topk}) must be <= `max_topk` ({max_topk})")
  return RetrievalServer((host, port), backend, default_topk, max_topk, max_queries,
                         max_body_bytes, float(read_timeout_s), max_pending, retry_after_s,
                         search_threads)


def start_in_thread(server: RetrievalServer, poll_interval: float = 0.05) -> threading.Thread:
  """Runs serve_forever in a daemon thread; a short poll_interval makes shutdown() prompt."""
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval},
                            name="retrieval-server", daemon=True)
  thread.start()
  return thread
