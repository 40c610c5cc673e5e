"""Search backends: BM25 (vs a NumPy reference, on-disk cache), the HTTP client against the
in-process server, and retriever faults (down, slow, garbage) answered as errors, never raised."""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from agentjax.retrieval import (BM25Backend, CorpusError, Document, HttpSearchBackend,
                                SearchBackend, SearchResponse, SearchStats, load_corpus,
                                make_backend, make_server, start_in_thread)
from agentjax.retrieval import http as http_client
from tests import retrieval_fixtures as fx
from tests.retrieval_fixtures import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Targeted queries -> the one right document (founders and names occur in one document only).
TARGETED = {"who founded the library by Belisande": "doc-1",
            "Hadrian founded what": "doc-7",
            "Xandrith": "doc-26",
            "the floating monastery founded by Fenwick": "doc-5",
            "Dagny abernook": "doc-29"}


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
  return fx.write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25(corpus_path, tmp_path_factory):
  return BM25Backend(corpus_path, index_dir=str(tmp_path_factory.mktemp("index")))


@pytest.fixture
def serve():
  """serve(server) starts it on a thread; every server is shut down and closed after the test."""
  servers = []

  def start(server):
    servers.append(server)
    start_in_thread(server)
    return server

  yield start
  for server in servers:
    release = getattr(server, "release", None)
    if release is not None:
      release.set()
    server.shutdown()
    server.server_close()


def _client(url, **kwargs):
  kwargs = {"timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.02,
            **kwargs}
  return HttpSearchBackend(url, **kwargs)



def _post(url, body: bytes):
  request = urllib.request.Request(url, data=body, method="POST")
  try:
    with urllib.request.urlopen(request, timeout=5) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


# --- corpus and interface -------------------------------------------------------------------


def test_document_title_and_text():
  doc = Document("d", "\"Zorvath\"\nA fortress.\nSecond line.", 1.0)
  assert doc.title == "\"Zorvath\"" and doc.text == "A fortress.\nSecond line."
  assert Document("d", "only a title", 0.0).text == ""


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"contents": "\\"T\\"\\nx"}', "missing field 'id'"),
    ('{"id": "x"}', "missing field 'contents'"),
    ('["id", "contents"]', "expected a JSON object"),
])
def test_malformed_corpus_line_names_file_and_line(tmp_path, line, message):
  path = tmp_path / "bad.jsonl"
  good = [json.dumps(r) for r in fx.corpus_rows()[:2]]
  path.write_text("\n".join([good[0], good[1], line, good[0]]) + "\n")
  with pytest.raises(CorpusError, match=message) as info:
    load_corpus(str(path))
  assert f"{path}:3:" in str(info.value)
  with pytest.raises(CorpusError, match="bad.jsonl:3"):
    BM25Backend(str(path), index_dir=str(tmp_path / "index"))


def test_load_corpus_reads_flashrag_rows(corpus_path):
  rows = load_corpus(corpus_path)
  assert len(rows) == 30 and rows[0]["id"] == "doc-0"
  assert rows[0]["contents"].startswith("\"Zorvath\"\nZorvath is")


def test_make_backend_and_argument_errors(corpus_path, bm25):
  with pytest.raises(ValueError, match="kind 'faiss'"):
    make_backend("faiss")
  client = make_backend("http", url="http://127.0.0.1:9/retrieve")
  assert isinstance(client, HttpSearchBackend) and isinstance(client, SearchBackend)
  assert isinstance(bm25, SearchBackend)
  for backend in (bm25, client):
    with pytest.raises(ValueError, match="topk"):
      backend.search(["Xandrith"], topk=0)
    with pytest.raises(TypeError, match="queries"):
      backend.search("Xandrith", topk=1)
  assert client.stats.calls == 0  # programmer errors are not retriever failures


# --- BM25 -----------------------------------------------------------------------------------


def test_bm25_targeted_queries_in_one_batched_call(bm25, monkeypatch):
  calls = []
  retrieve = bm25._retriever.retrieve
  monkeypatch.setattr(bm25._retriever, "retrieve",
                      lambda tokens, **kw: calls.append(len(tokens)) or retrieve(tokens, **kw))
  calls_before = bm25.stats.calls
  response = bm25.search(list(TARGETED), topk=3)
  assert calls == [len(TARGETED)]
  assert response.errors == [None] * len(TARGETED)
  for docs, want in zip(response.documents, TARGETED.values()):
    assert 1 <= len(docs) <= 3 and docs[0].id == want
    scores = [d.score for d in docs]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
  assert bm25.stats.calls == calls_before + 1


def test_bm25_topk_bounds_and_queries_that_match_nothing(bm25):
  # "founded" occurs in every document: topk above the corpus size returns all 30.
  response = bm25.search(["founded", "founded", "", "the of and", "qwzx", "???"], topk=100)
  assert [len(d) for d in response.documents] == [30, 30, 0, 0, 0, 0]
  assert response.errors == [None] * 6 and response.num_failed == 0
  assert len({d.id for d in response.documents[0]}) == 30
  assert [len(d) for d in bm25.search(["founded"] * 2, topk=7).documents] == [7, 7]
  assert bm25.search([], topk=3) == SearchResponse([], [])


@pytest.mark.parametrize("k1, b", [(1.5, 0.75), (0.9, 0.4)])
def test_bm25_scores_match_numpy_reference(corpus_path, tmp_path, k1, b):
  backend = BM25Backend(corpus_path, index_dir=str(tmp_path), k1=k1, b=b, stopwords=None)
  contents = [r["contents"] for r in fx.corpus_rows()]
  queries = ["crimson fortress records", "the hidden orchard keeps records beside the lagoon",
             "Tobias Tobias founded"]
  # topk = N returns every matching document, so the whole ranking is compared (the top of a
  # smaller topk may cut a tie differently: bm25s selects with argpartition).
  full, top5 = backend.search(queries, topk=30), backend.search(queries, topk=5)
  for query, docs, docs5 in zip(queries, full.documents, top5.documents):
    ref = fx.reference_bm25(contents, query, k1=k1, b=b)
    assert {d.id for d in docs} == {f"doc-{i}" for i in np.flatnonzero(ref > 0)}
    np.testing.assert_allclose([d.score for d in docs], [ref[int(d.id[4:])] for d in docs],
                               rtol=1e-5)
    np.testing.assert_allclose([d.score for d in docs], np.sort(ref[ref > 0])[::-1], rtol=1e-5)
    np.testing.assert_allclose([d.score for d in docs5], np.sort(ref)[::-1][:5], rtol=1e-5)


def test_bm25_index_cached_on_disk_and_rebuilt_when_corpus_changes(tmp_path):
  corpus = fx.write_corpus(tmp_path / "corpus.jsonl")
  index_dir = str(tmp_path / "index")
  first = BM25Backend(corpus, index_dir=index_dir)
  assert first.built and os.path.isdir(first.index_path)
  files = sorted(os.listdir(first.index_path))
  assert "agentjax_bm25.json" in files and not any(f.endswith((".pkl", ".pickle")) for f in files)
  mtimes = {f: os.stat(os.path.join(first.index_path, f)).st_mtime_ns for f in files}

  second = BM25Backend(corpus, index_dir=index_dir)
  assert not second.built and second.index_path == first.index_path
  assert {f: os.stat(os.path.join(first.index_path, f)).st_mtime_ns for f in files} == mtimes
  queries = list(TARGETED)
  assert second.search(queries, 5) == first.search(queries, 5)
  assert os.listdir(index_dir) == [os.path.basename(first.index_path)]  # no staging left over

  # Other BM25 parameters, or another corpus content, get their own (rebuilt) index.
  assert BM25Backend(corpus, index_dir=index_dir, k1=1.2).built
  rows = fx.corpus_rows() + [{"id": "new", "contents": "\"Grommulax\"\nGrommulax the comet."}]
  fx.write_corpus(tmp_path / "corpus.jsonl", rows)
  changed = BM25Backend(corpus, index_dir=index_dir)
  assert changed.built and changed.index_path != first.index_path and changed.num_docs == 31
  assert changed.search(["Grommulax"], 1).documents[0][0].id == "new"

  # A cache folder without its completion marker (a crash mid-save) is rebuilt, not loaded.
  os.remove(os.path.join(changed.index_path, "agentjax_bm25.json"))
  assert BM25Backend(corpus, index_dir=index_dir).built


# --- HTTP client and server -----------------------------------------------------------------


def test_http_client_matches_local_backend_through_server(bm25, serve):
  server = serve(make_server(bm25, host="127.0.0.1", port=0))
  assert server.server_address[0] == "127.0.0.1" and server.server_address[1] != 0
  client = _client(server.url)
  queries = list(TARGETED) + ["", "founded"]
  remote, local = client.search(queries, topk=4), bm25.search(queries, topk=4)
  assert remote == local and remote.errors == [None] * len(queries)
  assert client.stats.as_dict() | {"seconds": 0} == {
      "calls": 1, "queries": len(queries), "failed_queries": 0, "retries": 0, "overloaded": 0,
      "seconds": 0}
  assert client.health() == {"status": "ok", "num_docs": 30, "pending": 0, "max_pending": 64,
                             "rejected": 0}
  assert _client(f"http://127.0.0.1:{free_port()}/retrieve").health() is None

  # Search-R1 clients that do not ask for scores get bare documents.
  status, body = _post(server.url, json.dumps({"queries": ["Xandrith"], "topk": 1}).encode())
  assert status == 200 and body["result"][0][0]["id"] == "doc-26"
  assert set(body["result"][0][0]) == {"id", "contents"}


@pytest.mark.parametrize("body, field", [
    (b"{not json", "JSON"),
    (b'{"topk": 3}', "'queries'"),
    (b'{"queries": "one string"}', "'queries'"),
    (b'{"queries": ["a", 3]}', "'queries'"),
    (b'{"queries": ["a"], "topk": 0}', "'topk'"),
    (b'{"queries": ["a"], "topk": "3"}', "'topk'"),
    (b'{"queries": ["a"], "return_scores": "yes"}', "'return_scores'"),
])
def test_server_rejects_bad_requests_with_400(bm25, serve, body, field):
  server = serve(make_server(bm25, port=0))
  status, payload = _post(server.url, body)
  assert status == 400 and field in payload["error"]


def test_server_client_error_is_not_retried(bm25, serve):
  server = serve(make_server(bm25, port=0, max_topk=5))
  client = _client(server.url)
  response = client.search(["Xandrith", "Dagny"], topk=6)
  assert response.documents == [[], []] and all("HTTP 400" in e and "topk" in e
                                                 for e in response.errors)
  assert client.stats.retries == 0 and client.stats.failed_queries == 2


def test_retriever_down_returns_errors_naming_url_with_bounded_retries(monkeypatch):
  # A closed port: every attempt is refused at once; the backoffs are recorded, not slept.
  sleeps = []
  monkeypatch.setattr(http_client, "time", types.SimpleNamespace(perf_counter=time.perf_counter,
                                                                 sleep=sleeps.append))
  url = f"http://127.0.0.1:{free_port()}/retrieve"
  client = _client(url, max_retries=3, backoff_s=0.25, max_backoff_s=0.6)
  response = client.search(["a", "b", "c"], topk=3)
  assert response.documents == [[], [], []] and response.num_failed == 3
  assert all(url in e and "after 4 attempts" in e and "Connection refused" in e
             for e in response.errors), response.errors[0]
  # Retry r waits min(max_backoff_s, backoff_s * 2^(r-1)) times a jitter factor in [0.5, 1].
  nominal = np.minimum(0.6, 0.25 * 2.0 ** np.arange(3))
  assert len(sleeps) == 3
  assert np.all(np.asarray(sleeps) >= 0.5 * nominal) and np.all(np.asarray(sleeps) <= nominal)
  stats = client.stats.as_dict()
  assert stats | {"seconds": 0} == {
      "calls": 1, "queries": 3, "failed_queries": 3, "retries": 3, "overloaded": 0, "seconds": 0}


def test_retriever_too_slow_times_out(serve):
  server = serve(fx.ScriptedServer([(200, fx.search_r1_body([[]]), 5.0)]))
  client = _client(server.url, timeout_s=0.2, max_retries=1)
  response = client.search(["slow query"], topk=2)
  # Both attempts gave up on their own (the scripted answer comes only after 5 s, at teardown).
  assert response.documents == [[]] and "timed out" in response.errors[0]
  assert server.requests == 2 and client.stats.failed_queries == 1


DOC = {"id": "7", "contents": "\"Seven\"\nThe seventh."}


@pytest.mark.parametrize("status, body, reason", [
    (200, b"<html>Bad Gateway</html>", "not JSON"),
    (200, b'{"results": []}', "no 'result'"),
    (200, fx.search_r1_body([[DOC]]), "1 lists for 2 queries"),
    (200, json.dumps({"result": [[{"document": DOC, "score": "high"}], []]}).encode(), "score"),
    (200, json.dumps({"result": [[{"document": {"id": 1}}], []]}).encode(), "contents"),
    (200, json.dumps({"result": [{"a": 1}, []]}).encode(), "not a list"),
    (503, b"overloaded", "HTTP 503"),
])
def test_garbage_responses_are_retried_then_reported(serve, status, body, reason):
  server = serve(fx.ScriptedServer([(status, body, 0.0)]))
  client = _client(server.url, max_retries=2)
  response = client.search(["q1", "q2"], topk=2)
  assert response.documents == [[], []] and response.num_failed == 2
  assert reason in response.errors[0] and "after 3 attempts" in response.errors[0]
  assert server.requests == 3 and client.stats.retries == 2


def test_http_500_then_success_recovers(serve):
  good = fx.search_r1_body([[DOC, {"id": "8", "contents": "\"Eight\"\nx"}], []])
  server = serve(fx.ScriptedServer([(500, b'{"error": "boom"}', 0.0), (200, good, 0.0)]))
  client = _client(server.url)
  response = client.search(["q1", "q2"], topk=1)
  assert response.errors == [None, None]
  assert response.documents == [[Document("7", DOC["contents"], 1.0)], []]  # topk enforced
  assert server.requests == 2 and client.stats.retries == 1 and client.stats.failed_queries == 0
  assert server.bodies[0] == {"queries": ["q1", "q2"], "topk": 1, "return_scores": True}


def test_results_without_scores_get_zero(serve):
  server = serve(fx.ScriptedServer([
      (200, fx.search_r1_body([[DOC]], scores=False), 0.0)]))
  response = _client(server.url).search(["q"], topk=3)
  assert response.documents == [[Document("7", DOC["contents"], 0.0)]]
  assert response.documents[0][0].title == "\"Seven\""


# --- the server under bad input (raw sockets) -----------------------------------------------


def _recv_all(sock: socket.socket) -> bytes:
  """Everything the peer sends until it closes (a reset after its answer also ends it).

  Bounded by the socket's timeout: a server that never closes raises socket.timeout.
  """
  data = b""
  while True:
    try:
      chunk = sock.recv(65536)
    except ConnectionResetError:  # closed with our unread bytes in its buffer: the answer is in
      return data
    if not chunk:
      return data
    data += chunk


def _raw_exchange(server, request: bytes) -> tuple[int, dict, bytes]:
  """Sends `request` as it is, ends our side, returns (status, JSON body, raw reply)."""
  with socket.create_connection(server.server_address[:2], timeout=10) as sock:
    sock.sendall(request)
    sock.shutdown(socket.SHUT_WR)
    raw = _recv_all(sock)
  head, _, body = raw.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/"), raw[:200]
  return int(head.split()[1]), json.loads(body), raw


def _head(*headers: str) -> bytes:
  return ("\r\n".join(["POST /retrieve HTTP/1.1", "Host: 127.0.0.1", *headers]) +
          "\r\n\r\n").encode()


class _CountingBackend:
  """A SearchBackend that counts search() calls and finds nothing."""

  def __init__(self):
    self.stats = SearchStats()
    self.calls = 0

  def search(self, queries, topk):
    self.calls += 1
    return SearchResponse([[] for _ in queries], [None] * len(queries))


# A valid request body of 2 KiB, twice the 1 KiB limit used below.
BIG_BODY = json.dumps({"queries": ["x" * 2000]}).encode()


@pytest.mark.parametrize("headers, body, status, message", [
    # A negative length used to read the body to EOF, past max_body_bytes.
    pytest.param(["Content-Length: -1"], BIG_BODY, 400, "Content-Length", id="negative"),
    pytest.param(["Content-Length: -2048"], BIG_BODY, 400, "Content-Length", id="negative-big"),
    # Not a plain decimal: int() would accept "+20" and "1_0".
    pytest.param(["Content-Length: abc"], BIG_BODY, 400, "'abc'", id="non-numeric"),
    pytest.param(["Content-Length: 1_0"], BIG_BODY, 400, "'1_0'", id="underscore"),
    pytest.param(["Content-Length: +20"], BIG_BODY, 400, "'+20'", id="plus-sign"),
    pytest.param(["Content-Length: 0x10"], BIG_BODY, 400, "'0x10'", id="hex"),
    pytest.param(["Content-Length: "], BIG_BODY, 400, "Content-Length", id="empty"),
    # Two lengths that disagree: the server must not pick one (request smuggling).
    pytest.param(["Content-Length: 16", "Content-Length: 2048"], BIG_BODY, 400,
                 "conflicting", id="conflicting"),
    # A body that ends before its announced length.
    pytest.param(["Content-Length: 500"], b'{"queries": []}', 400, "15 of 500", id="short-body"),
    # Missing, or chunked (which this server does not read).
    pytest.param([], BIG_BODY, 411, "Content-Length", id="missing"),
    pytest.param(["Transfer-Encoding: chunked"], fx.chunked(BIG_BODY), 411, "chunked",
                 id="chunked"),
    # Above the limit: refused before the body is read.
    pytest.param([f"Content-Length: {len(BIG_BODY)}"], BIG_BODY, 413, "1024", id="oversized"),
    pytest.param(["Content-Length: 99999999999999999999999999"], BIG_BODY, 413, "1024",
                 id="oversized-26-digits"),
    pytest.param(["Content-Length: " + "9" * 5000], BIG_BODY, 413, "5000-digit",
                 id="oversized-5000-digits"),  # int() refuses 4300+ digits
])
def test_server_rejects_bad_content_length(serve, headers, body, status, message):
  backend = _CountingBackend()
  server = serve(make_server(backend, port=0, max_body_bytes=1024, read_timeout_s=5.0))
  got_status, payload, raw = _raw_exchange(server, _head(*headers) + body)
  assert (got_status, backend.calls) == (status, 0), raw[:300]
  assert message in payload["error"], payload
  assert len(re.findall(rb"HTTP/1\.[01] \d{3} ", raw)) == 1  # one answer, then closed
  # The server keeps serving well-formed requests.
  ok = json.dumps({"queries": ["a"]}).encode()
  assert _raw_exchange(server, _head(f"Content-Length: {len(ok)}") + ok)[:2] == (
      200, {"result": [[]]})


def test_server_closes_stalled_connections_and_keeps_serving(bm25, serve):
  server = serve(make_server(bm25, port=0, read_timeout_s=0.5))
  stalls = {"nothing sent": b"",
            "headers unfinished": b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n",
            "body unfinished": _head("Content-Length: 100") + b'{"queries": '}
  sockets = {}
  try:
    for name, sent in stalls.items():
      sockets[name] = socket.create_connection(server.server_address[:2], timeout=10)
      sockets[name].sendall(sent)
    # Others are served while those connections stall.
    assert _client(server.url).search(["Xandrith"], topk=1).documents[0][0].id == "doc-26"
    replies = {name: _recv_all(sock) for name, sock in sockets.items()}  # returns on close
  finally:
    for sock in sockets.values():
      sock.close()
  assert replies["nothing sent"] == b"" and replies["headers unfinished"] == b""
  status_line, _, body = replies["body unfinished"].partition(b"\r\n")
  assert b" 408 " in status_line and b"0.5" in body, replies["body unfinished"]
  assert _client(server.url).search(["Xandrith"], topk=1).errors == [None]


def test_server_limits_must_be_positive(bm25):
  for field in ("read_timeout_s", "max_body_bytes", "max_queries", "max_topk", "default_topk"):
    with pytest.raises(ValueError, match=field):
      make_server(bm25, port=0, **{field: 0})


# --- client response cap --------------------------------------------------------------------


def test_client_refuses_response_over_max_response_bytes(serve):
  body = fx.search_r1_body([[DOC] * 20])
  assert len(body) > 1000
  server = serve(fx.ScriptedServer([(200, body, 0.0)]))
  response = _client(server.url, max_response_bytes=1000).search(["q"], topk=3)
  assert response.documents == [[]]
  assert "max_response_bytes=1000" in response.errors[0] and server.url in response.errors[0]
  assert server.requests == 1  # the same request would get the same answer: not retried
  # Under the cap the same answer is read.
  assert _client(server.url, max_response_bytes=len(body)).search(["q"], 1).errors == [None]


def test_client_refuses_announced_length_over_cap_without_reading(serve):
  # The server announces 1 TB, sends a few bytes and keeps the connection open: a client that
  # believed it would wait (and buffer) for the rest.
  server = serve(fx.RawResponseServer(
      b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
      b"Content-Length: 1000000000000\r\n\r\n{\"result\": [", hold_open=True))
  client = _client(server.url, timeout_s=5.0, max_response_bytes=1 << 20)
  response = client.search(["q"], topk=3)
  assert response.documents == [[]] and "1000000000000" in response.errors[0]
  assert "max_response_bytes=1048576" in response.errors[0] and server.requests == 1


def test_client_caps_chunked_response_without_length(serve):
  body = fx.search_r1_body([[DOC] * 50])
  server = serve(fx.RawResponseServer(
      b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
      b"Connection: close\r\n\r\n" + fx.chunked(body)))
  response = _client(server.url, max_response_bytes=1000).search(["q"], topk=3)
  assert response.documents == [[]] and "max_response_bytes=1000" in response.errors[0]
  full = _client(server.url, max_response_bytes=len(body)).search(["q"], topk=3)
  assert full.errors == [None] and full.documents == [[Document("7", DOC["contents"], 1.0),
                                                       Document("7", DOC["contents"], 0.5),
                                                       Document("7", DOC["contents"], 1 / 3)]]


def test_client_max_response_bytes_must_be_positive():
  with pytest.raises(ValueError, match="max_response_bytes"):
    HttpSearchBackend("http://127.0.0.1:9/retrieve", max_response_bytes=0)


# --- overload: the server's admission bound, the client's 503 retries ------------------------


class _GatedBackend:
  """A SearchBackend whose searches wait for `gate` (set at the end of the test, or after 30 s);
  `entered` counts the searches begun."""

  def __init__(self):
    self.stats = SearchStats()
    self.gate = threading.Event()
    self.entered = 0

  def search(self, queries, topk):
    self.entered += 1
    self.gate.wait(30)
    return SearchResponse([[] for _ in queries], [None] * len(queries))


def _post_with_headers(url, body: bytes):
  """(status, headers, JSON body) of one POST."""
  request = urllib.request.Request(url, data=body, method="POST")
  try:
    with urllib.request.urlopen(request, timeout=30) as r:
      return r.status, r.headers, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, e.headers, json.loads(e.read())


def _wait_for(condition) -> None:
  """Waits until condition() holds (for up to 30 s: a wait, not a timing); asserts it."""
  for _ in range(3000):
    if condition():
      return
    time.sleep(0.01)
  assert condition()


def _fill(server, n: int) -> tuple[list, list]:
  """n requests admitted and held (by a gated backend): their threads and status codes."""
  results, threads = [], []
  for _ in range(n):
    t = threading.Thread(target=lambda: results.append(
        _post_with_headers(server.url, b'{"queries": ["held"]}')[0]), daemon=True)
    t.start()
    threads.append(t)
  _wait_for(lambda: server.pending == n)
  return threads, results


def test_server_answers_503_with_retry_after_beyond_max_pending(serve):
  backend = _GatedBackend()
  server = serve(make_server(backend, port=0, max_pending=2, retry_after_s=7, search_threads=1))
  try:
    threads, results = _fill(server, 2)  # one searching, one waiting for the search thread
    _wait_for(lambda: backend.entered == 1)
    for _ in range(3):  # answered at once, while the two admitted searches are still held
      status, headers, body = _post_with_headers(server.url, b'{"queries": ["more"]}')
      assert (status, headers["Retry-After"]) == (503, "7") and "max_pending" in body["error"]
    health = _client(server.url).health()
    assert health | {"num_docs": None} == {"status": "ok", "num_docs": None, "pending": 2,
                                           "max_pending": 2, "rejected": 3}
  finally:
    backend.gate.set()
  for t in threads:
    t.join(30)
  assert results == [200, 200] and server.pending == 0 and server.rejected == 3
  assert _post_with_headers(server.url, b'{"queries": ["after"]}')[0] == 200
  assert _client(server.url).health()["pending"] == 0


def test_server_refused_bodies_at_the_bound_get_their_4xx_and_hold_no_slot(serve):
  backend = _GatedBackend()
  server = serve(make_server(backend, port=0, max_pending=2, max_body_bytes=1024,
                             read_timeout_s=5.0))
  try:
    threads, results = _fill(server, 2)
    refused = [  # (raw request, status, part of the error)
        (_head(f"Content-Length: {len(BIG_BODY)}") + BIG_BODY, 413, "max_body_bytes"),
        (_head("Content-Length: 9") + b"{not json", 400, "JSON"),
        (_head("Content-Length: 11") + b'{"topk": 3}', 400, "'queries'"),
        (_head("Content-Length: -1") + b"{}", 400, "Content-Length"),
        (_head("Content-Length: 500") + b'{"queries": []}', 400, "15 of 500"),
        (_head() + b"{}", 411, "Content-Length"),
    ]
    for request, status, message in refused:
      got, payload, raw = _raw_exchange(server, request)
      assert got == status and message in payload["error"], raw[:300]
      assert (server.pending, server.rejected) == (2, 0)
    # A valid request at the bound is the one turned away.
    ok = json.dumps({"queries": ["a"]}).encode()
    assert _raw_exchange(server, _head(f"Content-Length: {len(ok)}") + ok)[0] == 503
  finally:
    backend.gate.set()
  for t in threads:
    t.join(30)
  assert results == [200, 200] and (server.pending, server.rejected) == (0, 1)
  # Both places are free again: two held searches are admitted at once.
  backend.gate.clear()
  try:
    threads, results = _fill(server, 2)
    _wait_for(lambda: backend.entered == 4)  # both search at once (search_threads 4)
  finally:
    backend.gate.set()
  for t in threads:
    t.join(30)
  assert results == [200, 200] and server.pending == 0


def test_server_overload_options_are_checked(bm25):
  for field in ("max_pending", "search_threads"):
    for value in (0, -1, 1.5, True):
      with pytest.raises(ValueError, match=field):
        make_server(bm25, port=0, **{field: value})
  for value in (-1, 0.5, None):
    with pytest.raises(ValueError, match="retry_after_s"):
      make_server(bm25, port=0, retry_after_s=value)


def test_client_retries_503_and_counts_it(serve):
  good = fx.search_r1_body([[DOC], []])
  busy = (503, b'{"error": "overloaded"}', 0.0, {"Retry-After": "0"})
  server = serve(fx.ScriptedServer([busy, busy, (200, good, 0.0)]))
  client = _client(server.url, max_retries=3, backoff_s=5.0, max_backoff_s=5.0)
  response = client.search(["q1", "q2"], topk=1)  # Retry-After 0: no backoff of 5 s slept
  assert response.errors == [None, None] and response.documents[0][0].id == "7"
  assert server.requests == 3
  assert (client.stats.overloaded, client.stats.retries, client.stats.failed_queries) == (2, 2, 0)


def test_client_waits_out_retry_after_capped_by_max_backoff(serve, monkeypatch):
  sleeps = []
  monkeypatch.setattr(http_client, "time", types.SimpleNamespace(perf_counter=time.perf_counter,
                                                                 sleep=sleeps.append))
  good = fx.search_r1_body([[DOC]])
  server = serve(fx.ScriptedServer([
      (503, b"{}", 0.0, {"Retry-After": "3"}),    # waited out: 3 s, spread up to 4.5 s
      (503, b"{}", 0.0, {"Retry-After": "100"}),  # capped at max_backoff_s
      (503, b"{}", 0.0, {}),                       # none given: the usual backoff
      (200, good, 0.0)]))
  client = _client(server.url, max_retries=3, backoff_s=0.25, max_backoff_s=8.0)
  assert client.search(["q"], topk=1).errors == [None]
  assert len(sleeps) == 3
  assert 3.0 <= sleeps[0] <= 4.5 and sleeps[1] == 8.0 and 0.5 <= sleeps[2] <= 1.0
  assert (client.stats.overloaded, client.stats.retries) == (3, 3)


def test_client_persistent_503_is_reported_per_query_like_other_faults(serve):
  server = serve(fx.ScriptedServer([(503, b'{"error": "busy"}', 0.0, {"Retry-After": "0"})]))
  client = _client(server.url, max_retries=2)
  response = client.search(["q1", "q2"], topk=2)  # returns; does not raise
  assert response.documents == [[], []] and response.num_failed == 2
  assert all("after 3 attempts" in e and "HTTP 503: busy" in e and server.url in e
             for e in response.errors), response.errors[0]
  assert server.requests == 3
  assert client.stats.as_dict() | {"seconds": 0} == {
      "calls": 1, "queries": 2, "failed_queries": 2, "retries": 2, "overloaded": 3, "seconds": 0}


# --- launcher -------------------------------------------------------------------------------


def test_launcher_serves_bm25_over_http(corpus_path, tmp_path):
  proc = subprocess.Popen(
      [sys.executable, "launch/retriever.py", f"--corpus={corpus_path}", "--port=0",
       f"--index_dir={tmp_path}", "--read_timeout_s=0.5", "--max_pending=3"], cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL, text=True)
  try:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    assert selector.select(timeout=60), "the launcher printed nothing within 60s"
    line = proc.stdout.readline()
    assert line.startswith("serving 30 documents at http://127.0.0.1:"), line
    client = _client(line.split()[-1])
    assert client.health() == {"status": "ok", "num_docs": 30, "pending": 0, "max_pending": 3,
                               "rejected": 0}
    assert client.search(["Xandrith"], topk=1).documents[0][0].id == "doc-26"
    # --read_timeout_s reaches the server: a connection that sends nothing gets closed.
    host, port = urllib.parse.urlsplit(client.url).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
      assert _recv_all(sock) == b""
  finally:
    proc.terminate()
    proc.wait(timeout=10)


# --- your own backend: register_backend, reached from a run's config -------------------------


@pytest.fixture
def restore_backends():
  """The backend registry as it was before the test (a test's registrations are undone)."""
  from agentjax.retrieval.base import BACKENDS
  before = dict(BACKENDS)
  yield
  BACKENDS.clear()
  BACKENDS.update(before)


def _demo_config(**retrieval):
  import importlib
  config = importlib.import_module("configs.grpo").get_config("demo")
  for key, value in retrieval.items():
    config.retrieval[key] = value
  return config


def _guide_files(tmp_path):
  """The guide's corpus and custom backend, written as the guide says (mycorpus.jsonl,
  my_search.py); returns their paths."""
  from tests.test_data import guide_block
  corpus, plugin = tmp_path / "mycorpus.jsonl", tmp_path / "my_search.py"
  corpus.write_text(guide_block("corpus"))
  plugin.write_text(guide_block("backend"))
  return str(corpus), str(plugin)


def test_the_guides_backend_snippet_registers_a_working_backend(tmp_path, restore_backends):
  corpus, plugin = _guide_files(tmp_path)
  with open(plugin) as f:
    code = f.read()
  assert len(code.strip().splitlines()) <= 25  # a short example
  exec(compile(code, "docs/guides/data.md", "exec"), {})
  backend = make_backend("word_overlap", path=corpus)
  assert isinstance(backend, SearchBackend)
  response = backend.search(["who wrote Middlemarch", "the Rijksmuseum city"], topk=1)
  assert [d[0].id for d in response.documents] == ["0", "1"]
  assert response.errors == [None, None] and backend.stats.queries == 2


def test_a_plugin_backend_is_built_from_the_config(tmp_path, restore_backends):
  from agentjax.train import config as config_lib
  from agentjax.train.builders import make_search_backend
  corpus, plugin = _guide_files(tmp_path)
  config = _demo_config(plugins=plugin, backend="word_overlap",
                        backend_kwargs=json.dumps({"path": corpus}))
  config_lib.validate(config)  # imports the plugin: it registers word_overlap
  config_lib.validate(config)  # ... once per process, however often a config names it
  backend = make_search_backend(config)
  assert backend.search(["Middlemarch"], topk=2).documents[0][0].id == "0"
  # A module name on the path works as well as a file: it registers another name.
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "other_search.py").write_text(
      "from agentjax.retrieval import register_backend\n"
      "from agentjax.retrieval.bm25 import BM25Backend\n"
      "register_backend('bm25_again', BM25Backend)\n")
  sys.path.insert(0, str(tmp_path / "pkg"))
  try:
    config = _demo_config(plugins=f"other_search, {plugin}", backend="bm25_again",
                          backend_kwargs=json.dumps({"corpus_path": corpus,
                                                     "index_dir": str(tmp_path / "idx")}))
    config_lib.validate(config)
    assert make_search_backend(config).search(["Rijksmuseum"], 1).documents[0][0].id == "1"
  finally:
    sys.path.remove(str(tmp_path / "pkg"))
    sys.modules.pop("other_search", None)


def test_an_unknown_backend_is_one_line_naming_the_registered_ones_and_how_to_add_one(
    tmp_path, restore_backends):
  from agentjax.train import config as config_lib
  from agentjax.train.builders import make_search_backend
  config = _demo_config(backend="faiss")
  for check in (config_lib.validate, make_search_backend):
    with pytest.raises(config_lib.ConfigError) as err:
      check(config)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("config.retrieval.backend='faiss': no such search backend; "
                              "registered: ['bm25', 'dense', 'http']; register one with "
                              "agentjax.retrieval.register_backend(name, factory) in a module "
                              "named in config.retrieval.plugins"), message
  _, plugin = _guide_files(tmp_path)
  with pytest.raises(config_lib.ConfigError, match=r"registered: \['bm25', 'dense', 'http', "
                                                   r"'word_overlap'\]"):
    config_lib.validate(_demo_config(backend="faiss", plugins=plugin))
  with pytest.raises(ValueError, match=r"kind 'faiss'.*register_backend\('faiss', factory\)"):
    make_backend("faiss")


@pytest.mark.parametrize("fields,message", [
    (dict(plugins="no_such_module_xyz"),
     "config.retrieval.plugins='no_such_module_xyz': importing 'no_such_module_xyz' failed: "
     "ModuleNotFoundError"),
    (dict(plugins="missing.py"), "importing 'missing.py' failed: ImportError: no such file"),
    (dict(plugins="PLUGIN", backend_kwargs="{'path': 1}"),
     "config.retrieval.backend_kwargs=\"{'path': 1}\": not valid JSON"),
    (dict(plugins="PLUGIN", backend_kwargs="[1]"),
     "config.retrieval.backend_kwargs='[1]': must be a JSON object"),
])
def test_plugin_fields_are_checked(tmp_path, restore_backends, fields, message):
  from agentjax.train import config as config_lib
  _, plugin = _guide_files(tmp_path)
  fields = {k: v.replace("PLUGIN", plugin) for k, v in fields.items()}
  with pytest.raises(config_lib.ConfigError) as err:
    config_lib.validate(_demo_config(backend="word_overlap", **fields))
  assert str(err.value).startswith(message) or message in str(err.value), str(err.value)
  assert "\n" not in str(err.value)
