"""Test helpers for retrieval: an invented corpus, a NumPy BM25 reference, scripted servers.

The corpus is 30 invented entities whose names and founders are words found in one document
only, so targeted queries have one right answer; kinds and places repeat across documents so
that document frequencies (and lengths) vary.
"""

from __future__ import annotations

import json
import math
import re
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

NAMES = ["Zorvath", "Quellmoor", "Brindlecap", "Ostravane", "Myrkholt", "Tessaline", "Varnquist",
         "Helmgrave", "Sarnoth", "Pellucid", "Dravenmere", "Kolvastra", "Ebbentide", "Frostmantle",
         "Gorrimund", "Ilvanshee", "Jastrowe", "Lumbrecht", "Nessivar", "Orrinwald", "Plumtrove",
         "Rivenholm", "Skarnwick", "Thistlegard", "Umbervale", "Wyncastle", "Xandrith",
         "Yorvenna", "Zephyrine", "Abernook"]
FOUNDERS = ["Aldric", "Belisande", "Corvin", "Delphine", "Evander", "Fenwick", "Gisella", "Hadrian",
            "Isolde", "Jorund", "Katrin", "Leopold", "Marisol", "Niall", "Ottoline", "Percival",
            "Quintessa", "Roderick", "Seraphina", "Tobias", "Ulrika", "Valentin", "Wilhelmina",
            "Xavier", "Yseult", "Zacharias", "Anselm", "Brunhild", "Casimir", "Dagny"]
KINDS = ["fortress", "library", "observatory", "orchard", "foundry", "monastery"]
PLACES = ["glacier", "canyon", "lagoon", "meadow", "volcano", "marsh", "delta", "plateau",
          "archipelago", "steppe"]
ADJECTIVES = ["crimson", "ancient", "floating", "hidden", "copper"]


def corpus_rows() -> list[dict]:
  """30 FlashRAG rows {"id": "doc-i", "contents": "\\"Name\\"\\nbody"}; lengths vary with i."""
  rows = []
  for i, name in enumerate(NAMES):
    kind, place, adj = KINDS[i % 6], PLACES[i % 10], ADJECTIVES[i % 5]
    body = (f"{name} is a {adj} {kind} founded by {FOUNDERS[i]} beside the {place}. "
            + f"The {kind} keeps {adj} records. " * (i % 4))
    rows.append({"id": f"doc-{i}", "contents": f"\"{name}\"\n{body.strip()}"})
  return rows


def write_corpus(path, rows: list[dict] | None = None) -> str:
  """Writes rows (default corpus_rows()) as JSONL at path; returns the path as a string."""
  rows = corpus_rows() if rows is None else rows
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(path)


def reference_bm25(contents: list[str], query: str, k1: float = 1.5,
                   b: float = 0.75) -> np.ndarray:
  """[N] float64 BM25 scores, written from the formula (bm25s' "lucene" variant, no stopwords).

  Tokens: lowercased runs of 2+ word characters. idf = ln(1 + (N - df + 0.5) / (df + 0.5));
  per query token (repeats counted) idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)); bm25s
  omits Lucene's (k1 + 1) numerator factor, a constant that does not change the ranking.
  """
  tokenize = lambda s: re.findall(r"\b\w\w+\b", s.lower())  # noqa: E731
  docs = [tokenize(c) for c in contents]
  n = len(docs)
  dl = np.array([len(d) for d in docs], np.float64)
  avgdl = dl.mean()
  scores = np.zeros(n)
  for term in tokenize(query):
    tf = np.array([d.count(term) for d in docs], np.float64)
    df = int((tf > 0).sum())
    if df == 0:
      continue
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scores += idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))
  return scores


def search_r1_body(documents_per_query: list[list[dict]], scores: bool = True) -> bytes:
  """A well-formed Search-R1 /retrieve answer for the given documents (score = 1/rank)."""
  result = []
  for docs in documents_per_query:
    if scores:
      result.append([{"document": d, "score": 1.0 / (r + 1)} for r, d in enumerate(docs)])
    else:
      result.append(list(docs))
  return json.dumps({"result": result}).encode()


class ScriptedServer(ThreadingHTTPServer):
  """Answers each POST with the next (status, body, delay_s) of `script`, the last one repeating;
  a step may add a fourth item, a dict of headers to send (e.g. {"Retry-After": "0"}).

  `requests` counts POSTs; `release` (set at teardown) cuts every pending delay short, so slow
  handlers never outlive the test.
  """

  daemon_threads = True
  block_on_close = False

  def __init__(self, script: list[tuple[int, bytes, float]]):
    self.script = list(script)
    self.requests = 0
    self.bodies: list[dict] = []
    self.release = threading.Event()
    self._lock = threading.Lock()
    super().__init__(("127.0.0.1", 0), _ScriptedHandler)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}/retrieve"

  def next_step(self, body: bytes) -> tuple[int, bytes, float, dict]:
    with self._lock:
      step = self.script[min(self.requests, len(self.script) - 1)]
      self.requests += 1
      try:
        self.bodies.append(json.loads(body))
      except ValueError:
        self.bodies.append({})
      return (*step[:3], step[3] if len(step) > 3 else {})


class _ScriptedHandler(BaseHTTPRequestHandler):
  server: ScriptedServer

  def do_POST(self) -> None:  # noqa: N802
    body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
    status, payload, delay_s, headers = self.server.next_step(body)
    if delay_s:
      self.server.release.wait(delay_s)
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      for name, value in headers.items():
        self.send_header(name, value)
      self.end_headers()
      self.wfile.write(payload)
    except OSError:  # the client gave up (timed out) first
      pass

  def log_message(self, *args) -> None:
    pass


def chunked(body: bytes, chunk_size: int = 512) -> bytes:
  """`body` in HTTP/1.1 chunked transfer coding (chunks of chunk_size, then the last chunk)."""
  chunks = [body[i:i + chunk_size] for i in range(0, len(body), chunk_size)]
  return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


class RawResponseServer(socketserver.ThreadingTCPServer):
  """Answers every request with the same raw bytes (status line, headers, body, as given).

  For answers http.server does not produce: a Content-Length that lies, a chunked body.
  With hold_open the connection stays open after the bytes are sent until `release` is set
  (teardown) or 10 s pass; `requests` counts the requests read.
  """

  daemon_threads = True
  block_on_close = False

  def __init__(self, response: bytes, hold_open: bool = False):
    self.response = response
    self.hold_open = hold_open
    self.requests = 0
    self.release = threading.Event()
    self._lock = threading.Lock()
    super().__init__(("127.0.0.1", 0), _RawHandler)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}/retrieve"


class _RawHandler(socketserver.StreamRequestHandler):
  server: RawResponseServer
  timeout = 10  # a client that stalls never keeps this thread past the test

  def handle(self) -> None:
    length = 0
    try:
      for _ in range(100):  # request line and headers, up to the blank line
        line = self.rfile.readline(65537)
        if line in (b"\r\n", b"\n", b""):
          break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
          length = int(value)
      self.rfile.read(length)
      with self.server._lock:
        self.server.requests += 1
      self.wfile.write(self.server.response)
      if self.server.hold_open:
        self.server.release.wait(10)
    except OSError:  # the client gave up first
      pass


class SlowBackend:
  """A SearchBackend that answers as `backend` after sleeping `latency_s` per call (a remote
  retriever's round trip; the engines batch queries, so one sleep per batch). `calls` counts them."""

  def __init__(self, backend, latency_s: float):
    self.backend, self.latency_s, self.calls = backend, latency_s, 0
    self.stats = backend.stats

  def search(self, queries, topk):
    self.calls += 1
    time.sleep(self.latency_s)
    return self.backend.search(queries, topk)


from agentjax.parallel.host import free_port  # noqa: E402,F401  (the tests' import of it)
