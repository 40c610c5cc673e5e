"""Client for a Search-R1-compatible retrieval server (standard library only).

Protocol (Search-R1's retrieval_server.py, and agentjax.retrieval.server):
  POST {url}  {"queries": [q, ...], "topk": k, "return_scores": true}
  ->          {"result": [[{"document": {"id": ..., "contents": ...}, "score": s}, ...], ...]}
one result list per query. Servers asked without scores (or that ignore return_scores) may
answer bare documents, [{"id": ..., "contents": ...}, ...]; those get score 0.0.

Faults are the retriever's, not the rollout's: connection errors, timeouts, HTTP 5xx and
unparsable answers are retried with exponential backoff (bounded), then every query of the batch
gets an error string naming the server's URL; search() never raises for them. HTTP 4xx means
our request is wrong, and an answer above max_response_bytes would come back the same, so those
are not retried (but still reported per query, not raised: the rollout goes on). HTTP 503 is
the server saying it is overloaded (agentjax.retrieval.server answers it beyond its max_pending):
retried like the other 5xx, but after the answer's Retry-After (seconds) when it gives one,
capped by max_backoff_s, and counted (stats.overloaded). The answer is
read up to max_response_bytes and no further: a Content-Length announcing more is refused before
any body byte is read, a body without one is cut off there.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Sequence

from agentjax.retrieval.base import (BACKENDS, Document, SearchResponse, SearchStats,
                                     check_search_args)


class _RetryableError(Exception):
  """A fault worth another attempt; the message is the short reason reported per query."""


class _OverloadedError(_RetryableError):
  """HTTP 503; `retry_after_s`: the answer's Retry-After in seconds (None: absent or a date)."""

  def __init__(self, reason: str, retry_after_s: float | None):
    super().__init__(reason)
    self.retry_after_s = retry_after_s


class _FatalError(Exception):
  """A fault that another attempt would not fix (HTTP 4xx)."""


def _retry_after(value: str | None) -> float | None:
  """A Retry-After header's delay in seconds; None unless it is delta-seconds (the HTTP-date
  form is left to the usual backoff: clocks of client and server need not agree)."""
  value = (value or "").strip()
  return float(value) if value.isdigit() and len(value) <= 9 else None


def _parse_hit(hit: Any) -> Document:
  """One result item: {"document": {...}, "score": s}, {"document": {...}}, or a bare document."""
  if not isinstance(hit, dict):
    raise ValueError(f"result item is a {type(hit).__name__}, not an object")
  if "document" in hit:
    doc, score = hit["document"], hit.get("score", 0.0)
  else:
    doc, score = hit, 0.0
  if not isinstance(doc, dict):
    raise ValueError(f"'document' is a {type(doc).__name__}, not an object")
  contents = doc.get("contents")
  if contents is None and "text" in doc:  # corpora stored as title/text columns
    title = doc.get("title")
    contents = f"\"{title}\"\n{doc['text']}" if title is not None else doc["text"]
  if not isinstance(contents, str):
    raise ValueError("document has no string 'contents'")
  if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
    raise ValueError(f"score {score!r} is not a finite number")
  return Document(str(doc.get("id", "")), contents, float(score))


def parse_response(payload: Any, num_queries: int) -> list[list[Document]]:
  """Documents per query from a decoded response; ValueError (a short reason) if malformed."""
  if not isinstance(payload, dict) or "result" not in payload:
    raise ValueError("response has no 'result' field")
  result = payload["result"]
  if not isinstance(result, list):
    raise ValueError(f"'result' is a {type(result).__name__}, not a list")
  if len(result) != num_queries:
    raise ValueError(f"'result' has {len(result)} lists for {num_queries} queries")
  documents = []
  for hits in result:
    if not isinstance(hits, list):
      raise ValueError(f"a result entry is a {type(hits).__name__}, not a list")
    documents.append([_parse_hit(h) for h in hits])
  return documents


class HttpSearchBackend:
  """SearchBackend that asks a remote retrieval server; see the module docstring.

  Args:
    url: the endpoint, e.g. "http://127.0.0.1:8000/retrieve".
    timeout_s: socket timeout of one attempt (connect, and each read).
    max_response_bytes: the largest answer read (64 MiB by default: a batch of 4096 queries
      with top-10 passages of ~1 KB is about 40 MiB of JSON).
    max_retries: attempts after the first; a failing batch costs at most 1 + max_retries requests.
      An overloaded server's 503 uses them up like any other retryable fault.
    backoff_s, max_backoff_s: the wait before retry r (1-based) is
      min(max_backoff_s, backoff_s * 2 ** (r - 1)), scaled by a random factor in [0.5, 1] so that
      many rollout workers do not hammer a restarting server in lockstep. After a 503 with a
      Retry-After of s seconds it is min(max_backoff_s, s * a random factor in [1, 1.5]): never
      sooner than the server asked, spread so that the workers it turned away together do not
      come back together.

  Worst-case time of one search() call is about (1 + max_retries) * timeout_s (per blocking
  socket operation) plus the backoffs.
  """

  def __init__(self, url: str, timeout_s: float = 10.0, max_retries: int = 3,
               backoff_s: float = 0.5, max_backoff_s: float = 8.0,
               max_response_bytes: int = 64 << 20):
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
      raise ValueError(f"`url` must be an http(s) URL, got {url!r}")
    if timeout_s <= 0:
      raise ValueError(f"`timeout_s` must be > 0, got {timeout_s}")
    if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or (
        max_response_bytes <= 0):
      raise ValueError(f"`max_response_bytes` must be an integer > 0, got {max_response_bytes!r}")
    if max_retries < 0 or backoff_s < 0 or max_backoff_s < 0:
      raise ValueError("`max_retries`, `backoff_s` and `max_backoff_s` must be >= 0")
    self.url = url
    self.timeout_s = float(timeout_s)
    self.max_retries = int(max_retries)
    self.backoff_s = float(backoff_s)
    self.max_backoff_s = float(max_backoff_s)
    self.max_response_bytes = max_response_bytes
    self.stats = SearchStats()
    # No proxies: retrievers run on the local network, and an http_proxy set for the hub would
    # otherwise capture requests to them.
    self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

  def _read_capped(self, response: http.client.HTTPResponse) -> bytes:
    """The response body, or _FatalError if it is (or announces to be) above the cap."""
    # http.client parsed Content-Length (None if absent, chunked, or not a number).
    announced = getattr(response, "length", None)
    if announced is not None and announced > self.max_response_bytes:
      raise _FatalError(f"response of {announced} bytes (Content-Length) exceeds "
                        f"max_response_bytes={self.max_response_bytes}")
    raw = response.read(self.max_response_bytes + 1)
    if len(raw) > self.max_response_bytes:
      raise _FatalError(f"response exceeds max_response_bytes={self.max_response_bytes}")
    return raw

  def _post(self, body: bytes, num_queries: int) -> list[list[Document]]:
    """One attempt; raises _RetryableError or _FatalError with a short reason."""
    request = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
      with self._opener.open(request, timeout=self.timeout_s) as response:
        raw = self._read_capped(response)
    except urllib.error.HTTPError as e:
      detail = ""
      try:  # only the start of an error page: its reason is cut to 200 characters anyway
        detail = json.loads(e.read(4096)).get("error", "")
      except Exception:  # noqa: BLE001 -- the status alone is reason enough
        pass
      reason = f"HTTP {e.code}" + (f": {str(detail)[:200]}" if detail else "")
      if e.code == 503:
        raise _OverloadedError(reason, _retry_after(e.headers.get("Retry-After"))) from None
      raise (_FatalError if 400 <= e.code < 500 else _RetryableError)(reason) from None
    except urllib.error.URLError as e:
      reason = e.reason
      if isinstance(reason, (socket.timeout, TimeoutError)):
        raise _RetryableError(f"timed out after {self.timeout_s:g}s") from None
      if isinstance(reason, OSError) and reason.strerror:
        reason = reason.strerror
      raise _RetryableError(f"connection failed ({reason})") from None
    except (socket.timeout, TimeoutError):
      raise _RetryableError(f"timed out after {self.timeout_s:g}s") from None
    except (http.client.HTTPException, OSError) as e:
      raise _RetryableError(f"connection failed ({type(e).__name__}: {e})") from None
    try:
      payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
      raise _RetryableError(f"unparsable response (not JSON: {raw[:60]!r})") from None
    try:
      return parse_response(payload, num_queries)
    except ValueError as e:
      raise _RetryableError(f"malformed response ({e})") from None

  def search(self, queries: Sequence[str], topk: int) -> SearchResponse:
    """Top-`topk` documents per query from the server; every query errs if the batch fails."""
    queries = check_search_args(queries, topk)
    if not queries:
      return SearchResponse([], [])
    start = time.perf_counter()
    body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
    attempts = overloaded = 0
    reason = ""
    retry_after_s = None  # the last 503's Retry-After
    for attempt in range(self.max_retries + 1):
      if attempt:
        if retry_after_s is not None:
          time.sleep(min(self.max_backoff_s, retry_after_s * random.uniform(1.0, 1.5)))
        else:
          delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
          time.sleep(delay * random.uniform(0.5, 1.0))
      attempts += 1
      retry_after_s = None
      try:
        documents = self._post(body, len(queries))
      except _OverloadedError as e:
        reason, retry_after_s = str(e), e.retry_after_s
        overloaded += 1
        continue
      except _RetryableError as e:
        reason = str(e)
        continue
      except _FatalError as e:
        reason = str(e)
        break
      # Servers may ignore topk; the contract is "at most topk".
      documents = [d[:topk] for d in documents]
      self.stats.record(queries=len(queries), retries=attempts - 1, overloaded=overloaded,
                        seconds=time.perf_counter() - start)
      return SearchResponse(documents, [None] * len(queries))
    tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
    self.stats.record(queries=len(queries), failed_queries=len(queries), retries=attempts - 1,
                      overloaded=overloaded, seconds=time.perf_counter() - start)
    return SearchResponse.failed(len(queries),
                                 f"retriever {self.url} failed after {tries}: {reason}")

  def health(self) -> dict[str, Any] | None:
    """GET <server>/health once (no retries): its JSON object, or None if unreachable/garbage."""
    parts = urllib.parse.urlsplit(self.url)
    path = parts.path[:-len("/retrieve")] if parts.path.endswith("/retrieve") else ""
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/health", "", ""))
    try:
      with self._opener.open(url, timeout=self.timeout_s) as response:
        payload = json.loads(self._read_capped(response))
    except Exception:  # noqa: BLE001 -- any failure means "not healthy"
      return None
    return payload if isinstance(payload, dict) else None


BACKENDS.register("http", HttpSearchBackend)
