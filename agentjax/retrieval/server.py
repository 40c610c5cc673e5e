"""Serving any SearchBackend over the Search-R1 retrieval HTTP API (standard library only).

  POST /retrieve  {"queries": [str, ...], "topk": k (optional), "return_scores": bool (optional)}
    200 -> {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]} (return_scores)
           {"result": [[{"id", "contents"}, ...], ...]}                           (otherwise)
    400 -> {"error": "..."} naming the bad field; 500 -> {"error": "..."} if the backend failed.
  GET /health     200 -> {"status": "ok", "num_docs": N}

`return_scores` defaults to false as in Search-R1's server; HttpSearchBackend always asks for
scores. launch/retriever.py runs this over a BM25Backend; tests start it in-process on port 0.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentjax.retrieval.base import SearchBackend

_log = logging.getLogger(__name__)


class RequestError(ValueError):
  """A client mistake, answered with HTTP 400 and this message."""


class RetrievalServer(ThreadingHTTPServer):
  """A ThreadingHTTPServer holding the backend and the request limits (see make_server)."""

  daemon_threads = True
  # Do not wait for in-flight searches on close: a stopping retriever owes nobody an answer.
  block_on_close = False

  def __init__(self, address: tuple[str, int], backend: SearchBackend, default_topk: int,
               max_topk: int, max_queries: int, max_body_bytes: int):
    self.backend = backend
    self.default_topk = default_topk
    self.max_topk = max_topk
    self.max_queries = max_queries
    self.max_body_bytes = max_body_bytes
    super().__init__(address, _Handler)

  @property
  def url(self) -> str:
    """The /retrieve endpoint at the bound address (useful with port 0)."""
    host, port = self.server_address[:2]
    return f"http://{host}:{port}/retrieve"


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

  def _reply(self, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
    if self.path.split("?")[0] != "/health":
      return self._reply(404, {"error": f"no such endpoint {self.path!r} (GET /health)"})
    self._reply(200, {"status": "ok", "num_docs": getattr(self.server.backend, "num_docs", None)})

  def do_POST(self) -> None:  # noqa: N802
    if self.path.split("?")[0] != "/retrieve":
      return self._reply(404, {"error": f"no such endpoint {self.path!r} (POST /retrieve)"})
    try:
      length = int(self.headers.get("Content-Length", ""))
    except ValueError:
      return self._reply(411, {"error": "a Content-Length header is required"})
    if length > self.server.max_body_bytes:
      return self._reply(413, {"error": f"request body of {length} bytes exceeds the limit of "
                                        f"{self.server.max_body_bytes}"})
    try:
      queries, topk, return_scores = parse_request(
          self.rfile.read(length), self.server.default_topk, self.server.max_topk,
          self.server.max_queries)
    except RequestError as e:
      return self._reply(400, {"error": str(e)})
    try:
      response = self.server.backend.search(queries, topk)
    except Exception as e:  # noqa: BLE001 -- the client gets a 500 (and retries), we keep serving
      _log.exception("search failed")
      return self._reply(500, {"error": f"search failed: {type(e).__name__}: {e}"})
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
                max_body_bytes: int = 16 << 20) -> RetrievalServer:
  """A bound (not yet serving) retrieval server; port 0 picks a free port (see `server.url`).

  Serve with `server.serve_forever()` or `start_in_thread(server)`; stop with
  `server.shutdown(); server.server_close()`.
  """
  return RetrievalServer((host, port), backend, default_topk, max_topk, max_queries,
                         max_body_bytes)


def start_in_thread(server: RetrievalServer, poll_interval: float = 0.05) -> threading.Thread:
  """Runs serve_forever in a daemon thread; a short poll_interval makes shutdown() prompt."""
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval},
                            name="retrieval-server", daemon=True)
  thread.start()
  return thread
