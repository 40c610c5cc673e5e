"""Search backends: BM25 (vs a NumPy reference, on-disk cache), the HTTP client against the
in-process server, and retriever faults (down, slow, garbage) answered as errors, never raised."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from agentjax.retrieval import (BM25Backend, CorpusError, Document, HttpSearchBackend,
                                SearchBackend, SearchResponse, load_corpus, make_backend,
                                make_server, start_in_thread)
from tests import retrieval_fixtures as fx

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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


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
      "calls": 1, "queries": len(queries), "failed_queries": 0, "retries": 0, "seconds": 0}
  assert client.health() == {"status": "ok", "num_docs": 30}
  assert _client(f"http://127.0.0.1:{_free_port()}/retrieve").health() is None

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


def test_retriever_down_returns_errors_with_bounded_retries():
  client = _client(f"http://127.0.0.1:{_free_port()}/retrieve", max_retries=3)
  start = time.monotonic()
  response = client.search(["a", "b", "c"], topk=3)
  assert time.monotonic() - start < 5
  assert response.documents == [[], [], []] and response.num_failed == 3
  assert all("after 4 attempts" in e and "connection" in e for e in response.errors)
  stats = client.stats.as_dict()
  assert stats | {"seconds": 0} == {
      "calls": 1, "queries": 3, "failed_queries": 3, "retries": 3, "seconds": 0}


def test_retriever_too_slow_times_out(serve):
  server = serve(fx.ScriptedServer([(200, fx.search_r1_body([[]]), 5.0)]))
  client = _client(server.url, timeout_s=0.2, max_retries=1)
  start = time.monotonic()
  response = client.search(["slow query"], topk=2)
  assert time.monotonic() - start < 2.0
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


# --- launcher -------------------------------------------------------------------------------


def test_launcher_serves_bm25_over_http(corpus_path, tmp_path):
  proc = subprocess.Popen(
      [sys.executable, "launch/retriever.py", f"--corpus={corpus_path}", "--port=0",
       f"--index_dir={tmp_path}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      text=True)
  try:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    assert selector.select(timeout=60), "the launcher printed nothing within 60s"
    line = proc.stdout.readline()
    assert line.startswith("serving 30 documents at http://127.0.0.1:"), line
    client = _client(line.split()[-1])
    assert client.health() == {"status": "ok", "num_docs": 30}
    assert client.search(["Xandrith"], topk=1).documents[0][0].id == "doc-26"
  finally:
    proc.terminate()
    proc.wait(timeout=10)
