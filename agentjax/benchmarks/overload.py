"""`python launch/bench.py server_overload`: the retrieval server (launch/retriever.py) and the
model server (launch/serve.py) under 64 concurrent clients, against the same load from one client
(bench_server_overload)."""

from __future__ import annotations

import collections
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from agentjax.benchmarks.common import FLAGS, REPO, fixture_modules
from agentjax.parallel.host import free_port

# Bodies above this are refused (413) by both servers here: small, so that the oversized requests
# the clients mix in are cheap to send, and the same for both.
_MAX_BODY = 64 << 10
# A request still unanswered after this long counts as lost (a hang).
_ANSWER_TIMEOUT_S = 120.0
_HEAD = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
# Queries of one valid /retrieve request: a batch of a rollout's searches.
_QUERIES = 64


def _exchange(port: int, request: bytes) -> int | None:
  """Sends one raw request on a new connection (Connection: close) and returns the answer's
  status, or None if no answer came (refused or reset connection, a hang past
  _ANSWER_TIMEOUT_S): what the bench counts as lost."""
  data = b""
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=_ANSWER_TIMEOUT_S) as sock:
      try:
        sock.sendall(request)
      except OSError:  # an oversized body may be refused (and the socket closed) mid-send; the
        pass           # answer sent before that is still there to read
      while True:
        try:
          chunk = sock.recv(65536)
        except ConnectionResetError:  # closed with unread bytes of ours: the answer came first
          break
        if not chunk:
          break
        data += chunk
  except OSError:
    pass
  match = _HEAD.match(data)
  return int(match.group(1)) if match else None


def _request(path: str, body: bytes, length: int | None = None) -> bytes:
  """A POST with a Content-Length of `length` (default: the body's)."""
  length = len(body) if length is None else length
  return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode() + body


def _load(port: int, clients: int, seconds: float, make: dict, bad_share: float,
          seed: int) -> dict:
  """`clients` threads, each sending requests back to back for `seconds` (a turned-away client
  comes straight back: the worst case, not waiting out Retry-After): a share `bad_share` of them
  malformed or oversized (half each), the rest valid. `make[kind](rng)` builds one request.
  Returns the counts by kind and status, the lost requests and the 200s' latencies."""
  results: list[tuple[str, int | None, float]] = []
  lock = threading.Lock()
  deadline = time.monotonic() + seconds

  def client(k: int) -> None:
    rng = random.Random(seed * 1000 + k)
    mine = []
    while time.monotonic() < deadline:
      u = rng.random()
      kind = "valid" if u >= bad_share else ("malformed" if u < bad_share / 2 else "oversized")
      request = make[kind](rng)
      start = time.perf_counter()
      status = _exchange(port, request)
      mine.append((kind, status, time.perf_counter() - start))
    with lock:
      results.extend(mine)

  start = time.perf_counter()
  threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(seconds + 2 * _ANSWER_TIMEOUT_S)
  elapsed = time.perf_counter() - start
  by_kind = collections.defaultdict(collections.Counter)
  for kind, status, _ in results:
    by_kind[kind][str(status) if status is not None else "lost"] += 1
  statuses = collections.Counter(str(s) for _, s, _ in results if s is not None)
  ok = sorted(t for kind, s, t in results if s == 200)
  answered = sum(statuses.values())
  # A refused body is answered with its 4xx, never a 503 or a 200 (it holds no admission slot).
  bad_wrong = sum(1 for kind, s, _ in results if kind != "valid" and not (
      s is not None and 400 <= s < 500 and s != 429))

  def pct(q: float) -> float | None:
    return round(1000 * ok[min(len(ok) - 1, int(q * len(ok)))], 1) if ok else None

  return {"clients": clients, "seconds": round(elapsed, 1), "sent": len(results),
          "answered": dict(sorted(statuses.items())), "lost": len(results) - answered,
          "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
          "bad_not_their_4xx": bad_wrong,
          "p50_ms_200": pct(0.5), "p99_ms_200": pct(0.99),
          "answers_per_s": round(answered / elapsed, 1),
          "ok_per_s": round(len(ok) / elapsed, 1),
          "share_503": round(statuses.get("503", 0) / answered, 3) if answered else None}


def _rss_mb(pid: int) -> dict:
  """The process's resident memory now and at its peak (VmRSS, VmHWM), MiB; {} off Linux."""
  try:
    with open(f"/proc/{pid}/status") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
  except OSError:
    return {}
  return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
          "peak_rss_mb": round(int(fields["VmHWM"].split()[0]) / 1024, 1)}


def _health(port: int) -> tuple[int | None, dict]:
  try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, {}
  except OSError:
    return None, {}


def _wait_healthy(proc: subprocess.Popen, port: int, what: str, timeout_s: float = 600) -> None:
  deadline = time.monotonic() + timeout_s
  while _health(port)[0] != 200:
    if proc.poll() is not None or time.monotonic() > deadline:
      raise RuntimeError(f"{what} did not start (exit code {proc.poll()})")
    time.sleep(0.2)


def _measure(name: str, proc: subprocess.Popen, port: int, make: dict, warmup) -> dict:
  """Warm-up, then one client and --overload_clients clients for --overload_s each, the RSS
  around the overload, and a health check after it."""
  start = time.perf_counter()
  warmup()
  warmup_s = round(time.perf_counter() - start, 1)
  one = _load(port, 1, FLAGS.overload_s, make, FLAGS.overload_bad_share, seed=1)
  before = _rss_mb(proc.pid)
  many = _load(port, FLAGS.overload_clients, FLAGS.overload_s, make, FLAGS.overload_bad_share,
               seed=2)
  after = _rss_mb(proc.pid)
  status, health = _health(port)
  return {"server": name, "warmup_s": warmup_s, "one_client": one, "overload": many,
          "rss_before_mb": before.get("rss_mb"), "rss_after_mb": after.get("rss_mb"),
          "peak_rss_mb": after.get("peak_rss_mb"),
          "alive_after": status == 200 and proc.poll() is None,
          "pending_after": health.get("pending"),
          "rejected_total": health.get("rejected"),  # warm-up included
          "ok_per_s_ratio": round(many["ok_per_s"] / one["ok_per_s"], 2)
                            if one["ok_per_s"] else None}


def _retriever(tmp: str) -> dict:
  """BM25 over --overload_docs synthetic documents; each valid request asks _QUERIES queries,
  top 3."""
  rng = random.Random(0)
  syllables = ["ka", "lo", "mi", "ren", "tas", "vo", "zel", "qui", "dor", "fen", "ul", "bri"]
  words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
                  for _ in range(3000)})
  corpus = os.path.join(tmp, "corpus.jsonl")
  with open(corpus, "w") as f:
    for i in range(FLAGS.overload_docs):
      text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 80)))
      f.write(json.dumps({"id": str(i), "contents": f"\"Doc {i}\"\n{text}"}) + "\n")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "launch", "retriever.py"), f"--corpus={corpus}",
       "--port=0", f"--index_dir={os.path.join(tmp, 'index')}", f"--max_body_bytes={_MAX_BODY}",
       f"--max_pending={FLAGS.overload_max_pending}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    line = proc.stdout.readline()
    if not line.startswith("serving "):
      raise RuntimeError(f"the retriever did not start: {line!r}")
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    _wait_healthy(proc, port, "the retriever")
    make = {
        "valid": lambda r: _request("/retrieve", json.dumps({"queries": [
            " ".join(r.choice(words) for _ in range(r.randint(2, 5))) for _ in range(_QUERIES)],
            "topk": 3}).encode()),
        "malformed": lambda r: _request("/retrieve", r.choice(
            [b'{"queries": ["a", ', b'{"queries": "not a list"}', b'{"topk": 3}'])),
        "oversized": lambda r: _request("/retrieve", b" " * (_MAX_BODY + 1024)),
    }
    result = _measure("retriever", proc, port, make, warmup=lambda: _load(
        port, 4, 2.0, make, 0.0, seed=0))
    result["setup"] = {"documents": FLAGS.overload_docs, "queries_per_request": _QUERIES, "topk": 3,
                       "max_pending": FLAGS.overload_max_pending}
    return result
  finally:
    proc.terminate()
    proc.wait(30)


def _model_server(tmp: str) -> dict:
  """A tiny random Qwen2 (the tiny preset: hidden 64, 2 layers; the 400-token chat tokenizer of
  the tests); each valid request is a chat completion of 8 greedy tokens."""
  import jax

  from agentjax.models.qwen import QwenConfig, init_params
  from agentjax.models.qwen.checkpoint import save_hf
  from agentjax.models.tokenizer import load_tokenizer

  (hf_fixtures,) = fixture_modules("hf_fixtures")
  tok_dir = hf_fixtures.make_tokenizer_dir(os.path.join(tmp, "tokenizer"))
  cfg = QwenConfig.preset("tiny", vocab_size=400)
  folder = os.path.join(tmp, "tiny-chat")
  save_hf(folder, cfg, init_params(cfg, jax.random.key(0)), tokenizer=load_tokenizer(tok_dir))
  port = free_port()
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "launch", "serve.py"), f"--hf_path={folder}",
       f"--port={port}", "--max_total_tokens=128", "--max_tokens_limit=16",
       f"--max_request_bytes={_MAX_BODY}", f"--max_pending={FLAGS.overload_max_pending}"],
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    _wait_healthy(proc, port, "the model server")
    contents = ["capital of Veltrana?", "who was born in Orsk?", "the lazy dog",
                "search Orsk", "The quick brown fox", "Veltrana is a country."]
    make = {
        "valid": lambda r: _request("/v1/chat/completions", json.dumps({
            "model": "tiny-chat", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": r.choice(contents)}]}).encode()),
        "malformed": lambda r: _request("/v1/chat/completions", r.choice(
            [b'{"model": "tiny-chat", "messages": [', b'{"model": "tiny-chat", "messages": 5}',
             b'{"model": "tiny-chat"}'])),
        "oversized": lambda r: _request("/v1/chat/completions", b" " * (_MAX_BODY + 1024)),
    }

    def warmup():
      # Compiles the programs of every batch the load can make: the prompts are 17 to 23 tokens
      # (one length bucket), so a program per row bucket (1, 2, 4, 8, 16), made here by one
      # request of n rows each (a compile during the load would stall it for seconds).
      for n in (1, 2, 4, 8, 16):
        status = _exchange(port, _request("/v1/chat/completions", json.dumps({
            "model": "tiny-chat", "max_tokens": 8, "temperature": 0, "n": n,
            "messages": [{"role": "user", "content": contents[0]}]}).encode()))
        if status != 200:
          raise RuntimeError(f"the model server's warm-up request (n={n}) got {status}")
      _load(port, FLAGS.overload_clients, 5.0, make, 0.0, seed=0)

    result = _measure("model server", proc, port, make, warmup)
    result["setup"] = {"model": "tiny preset, hidden 64, 2 layers, vocab 400", "max_tokens": 8,
                       "max_batch": 16, "max_pending": FLAGS.overload_max_pending}
    return result
  finally:
    proc.terminate()
    proc.wait(30)


def bench_server_overload() -> dict:
  """Each server started as its launcher starts it (a subprocess on 127.0.0.1, bodies limited to
  64 KiB, --max_pending=--overload_max_pending), warmed up, then loaded by one client and by
  --overload_clients clients for --overload_s seconds each. Clients send requests back to back,
  each on a new connection, and do not wait out a 503's Retry-After (the worst case); a share
  --overload_bad_share of the requests is malformed (bad JSON, wrong fields) or oversized (a
  body past the limit), half each. Reported per server and load: requests sent, answers by
  status, lost (no answer: a refused or reset connection, or none within 120 s; must be 0),
  refused bodies answered other than with their 4xx (must be 0), p50/p99 latency of the 200s,
  answers/s and 200s/s, the 503 share of answers; the server's RSS before and after the overload
  (and its peak), whether /health answers 200 after it, and `ok_per_s_ratio` = 200s/s under
  overload / with one client."""
  servers = {"retriever": _retriever, "serve": _model_server}
  unknown = set(FLAGS.overload_servers) - set(servers)
  if unknown:
    raise ValueError(f"--overload_servers: unknown {sorted(unknown)}; known: {sorted(servers)}")
  out = {"bench": "server_overload", "clients": FLAGS.overload_clients,
         "seconds": FLAGS.overload_s, "bad_share": FLAGS.overload_bad_share,
         "max_pending": FLAGS.overload_max_pending, "cpus": os.cpu_count()}
  with tempfile.TemporaryDirectory() as tmp:
    for name in FLAGS.overload_servers:
      os.makedirs(os.path.join(tmp, name))
      out[name] = servers[name](os.path.join(tmp, name))
  results = [out[name] for name in FLAGS.overload_servers]
  out["lost"] = sum(r["one_client"]["lost"] + r["overload"]["lost"] for r in results)
  out["bad_not_their_4xx"] = sum(r["one_client"]["bad_not_their_4xx"] +
                                 r["overload"]["bad_not_their_4xx"] for r in results)
  out["alive_after"] = all(r["alive_after"] for r in results)
  return out
