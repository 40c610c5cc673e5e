"""launch/serve.py's server (agentjax/serve): the OpenAI API over a Completer, with batching.

A tiny random Qwen2 with a chat-template tokenizer is served in-process (uvicorn in a thread, on a
free loopback port) and called with the official `openai` client. The batcher's grouping and its
fault isolation are also tested alone with a fake completer (no model, no compiles).
"""

import concurrent.futures
import dataclasses
import os
import threading
import time
import types

import httpx
import openai
import pytest

from agentjax.sampling.complete import PromptError
from agentjax.serve import Batcher, Overloaded, SamplingKey, ServerThread, create_app

MODEL = "tiny-chat"
CONTEXT = 64        # the completer's max_total_tokens
MAX_NEW = 8         # every generating request asks for this (one decode-loop bucket)
LIMIT = 16          # --max_tokens_limit
MAX_BYTES = 4096    # --max_request_bytes
MAX_BATCH = 4


# ============================================================================ batcher alone


@dataclasses.dataclass(frozen=True)
class _Completion:
  text: str
  token_ids: tuple
  finish_reason: str
  prompt_tokens: int


class FakeCompleter:
  """Completes a prompt with its reversed ids; a prompt holding id 666 makes the call fail."""

  max_total_tokens = 1000
  cfg = types.SimpleNamespace(vocab_size=1000)
  mesh = None

  def __init__(self):
    self.calls = []  # (prompts, settings) of every complete() call

  def complete(self, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, stop=(), seed=0,
               repetition_penalty=1.0, max_think_tokens=0):
    settings = (max_new_tokens, temperature, top_p, tuple(stop), seed)
    if (repetition_penalty, max_think_tokens) != (1.0, 0):
      settings += (repetition_penalty, max_think_tokens)
    self.calls.append(([list(p) for p in prompts], settings))
    if any(666 in p for p in prompts):
      raise RuntimeError("injected fault: id 666")
    if any(777 in p for p in prompts):  # an internal error that happens to be a ValueError
      raise ValueError("injected fault: a shape mismatch")
    if any(888 in p for p in prompts):  # the completer refuses this request
      raise PromptError("prompt 0: injected refusal")
    return [_Completion(str(p[::-1]), tuple(p[::-1][:max_new_tokens]), "length", len(p))
            for p in prompts]

  def encode(self, text):
    return [ord(c) for c in text]

  def chat_ids(self, messages):
    return [ord(c) for m in messages for c in m["content"]]


def _submit_all(batcher, jobs):
  """Submits every (prompts, key) while the worker waits on its window; returns the futures."""
  return [batcher.submit(prompts, key) for prompts, key in jobs]


def test_batcher_groups_by_settings_and_splits_at_max_batch():
  fake = FakeCompleter()
  # A long window: everything submitted below is gathered, and the full batch goes at once.
  batcher = Batcher(fake, max_batch=3, window_s=60.0)
  greedy, sampled = SamplingKey(max_new_tokens=4), SamplingKey(max_new_tokens=4, temperature=0.7,
                                                               top_p=0.9, seed=5)
  futures = _submit_all(batcher, [([[1, 2]], greedy), ([[3]], sampled), ([[4, 5], [6]], greedy)])
  # 4 rows >= max_batch 3: the window ends at once; two groups -> greedy [1,2],[4,5],[6] and
  # sampled [3] (order of first appearance).
  results = [f.result(timeout=30) for f in futures]
  assert [[c.token_ids for c in r] for r in results] == [[(2, 1)], [(3,)], [(5, 4), (6,)]]
  assert fake.calls == [([[1, 2], [4, 5], [6]], (4, 0.0, 1.0, (), 0)),
                        ([[3]], (4, 0.7, 0.9, (), 5))]
  # A job larger than max_batch runs alone, in chunks of max_batch rows.
  fake.calls.clear()
  out = batcher.submit([[i] for i in range(7)], greedy).result(timeout=30)
  assert [c.token_ids for c in out] == [(i,) for i in range(7)]
  assert [len(p) for p, _ in fake.calls] == [3, 3, 1]
  stats = batcher.stats()
  assert (stats["requests"], stats["batches"], stats["rows"], stats["max_rows"]) == (4, 5, 11, 3)
  batcher.close()
  with pytest.raises(RuntimeError, match="closed"):
    batcher.submit([[1]], greedy)


def test_batcher_a_failing_request_fails_alone_and_the_worker_goes_on():
  fake = FakeCompleter()
  batcher = Batcher(fake, max_batch=8, window_s=0.0)  # queued jobs are still gathered
  key = SamplingKey(max_new_tokens=4)
  gate = threading.Event()
  real = fake.complete

  def held(prompts, **kw):  # the first call waits, so the next three jobs queue up together
    gate.wait(30)
    return real(prompts, **kw)

  fake.complete = held
  first = batcher.submit([[9]] * 8, key)  # a full batch: dispatched at once, then held
  futures = _submit_all(batcher, [([[1]], key), ([[2, 666]], key), ([[3]], key)])
  gate.set()
  assert first.result(timeout=30)[0].token_ids == (9,)
  assert futures[0].result(timeout=30)[0].token_ids == (1,)
  assert futures[2].result(timeout=30)[0].token_ids == (3,)
  with pytest.raises(RuntimeError, match="injected fault"):
    futures[1].result(timeout=30)
  # The shared call failed, then each job ran alone: only the culprit failed.
  assert [p for p, _ in fake.calls[1:]] == [[[1], [2, 666], [3]], [[1]], [[2, 666]], [[3]]]
  stats = batcher.stats()
  assert (stats["failed_calls"], stats["failed_requests"]) == (2, 1)
  assert batcher.submit([[7]], key).result(timeout=30)[0].token_ids == (7,)
  # A cancelled request (its client went away) is dropped before it is decoded.
  gate.clear()
  blocker = batcher.submit([[8]] * 8, key)
  dropped = batcher.submit([[5]], key)
  assert dropped.cancel()
  gate.set()
  blocker.result(timeout=30)
  assert batcher.submit([[6]], key).result(timeout=30)[0].token_ids == (6,)
  assert all([5] not in p for p, _ in fake.calls)
  batcher.close()


def test_app_answers_a_model_failure_with_500_and_goes_on():
  from fastapi.testclient import TestClient

  client = TestClient(create_app(FakeCompleter(), model_name="fake", batch_window_s=0.0))
  internal = client.post("/v1/completions", json={"model": "fake", "prompt": [1, 777]})
  assert internal.status_code == 500 and "shape mismatch" in internal.json()["error"]["message"]
  refused = client.post("/v1/completions", json={"model": "fake", "prompt": [1, 888]})
  assert refused.status_code == 400 and "injected refusal" in refused.json()["error"]["message"]
  bad = client.post("/v1/completions", json={"model": "fake", "prompt": [1, 666]})
  assert bad.status_code == 500
  assert bad.json()["error"]["type"] == "server_error"
  assert "injected fault" in bad.json()["error"]["message"]
  ok = client.post("/v1/completions", json={"model": "fake", "prompt": [1, 2], "max_tokens": 1})
  assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "[2, 1]"
  assert client.get("/health").json()["status"] == "ok"


def test_app_passes_vllms_repetition_penalty_and_thinking_budget():
  """The official Co-ReAct client sends repetition_penalty and max_think_tokens (vLLM's extra
  sampling fields): they reach the completer, requests differing in them are not batched
  together, and bad values are refused naming the field."""
  from fastapi.testclient import TestClient

  fake = FakeCompleter()
  client = TestClient(create_app(fake, model_name="fake", batch_window_s=0.0))
  body = {"model": "fake", "messages": [{"role": "user", "content": "ab"}], "max_tokens": 2,
          "temperature": 0}
  assert client.post("/v1/chat/completions", json=body).status_code == 200
  ok = client.post("/v1/chat/completions",
                   json={**body, "repetition_penalty": 1.1, "max_think_tokens": 1500})
  assert ok.status_code == 200
  assert [c[1] for c in fake.calls] == [(2, 0.0, 1.0, (), 0), (2, 0.0, 1.0, (), 0, 1.1, 1500)]
  for field, value in (("repetition_penalty", 0), ("max_think_tokens", -1),
                       ("max_think_tokens", "many")):
    bad = client.post("/v1/chat/completions", json={**body, field: value})
    assert bad.status_code == 400 and f"{field}:" in bad.json()["error"]["message"], bad.json()


# ============================================================================ overload


def test_batcher_refuses_jobs_beyond_max_pending_until_one_is_done():
  fake = FakeCompleter()
  gate = threading.Event()
  real = fake.complete
  fake.complete = lambda prompts, **kw: (gate.wait(30), real(prompts, **kw))[1]
  batcher = Batcher(fake, max_batch=1, window_s=0.0, max_pending=2)
  key = SamplingKey(max_new_tokens=4)
  try:
    held = [batcher.submit([[1]], key), batcher.submit([[2]], key)]  # one decoding, one queued
    with pytest.raises(Overloaded, match="max_pending"):
      batcher.submit([[3]], key)
    assert (batcher.stats()["pending"], batcher.stats()["rejected"]) == (2, 1)
    assert held[1].cancel()  # its client went away: its place is free at once
    extra = batcher.submit([[4]], key)
  finally:
    gate.set()
  assert [f.result(timeout=30)[0].token_ids for f in (held[0], extra)] == [(1,), (4,)]
  stats = batcher.stats()
  assert (stats["pending"], stats["requests"], stats["rejected"]) == (0, 3, 1)
  with pytest.raises(ValueError, match="max_pending"):
    Batcher(fake, max_pending=0)
  batcher.close()


@pytest.fixture
def gated_server():
  """(httpx client, app, gate): a FakeCompleter whose complete() waits for `gate`, served with
  max_pending 2, max_batch 1 (one request decoding, one queued) on a free loopback port."""
  fake = FakeCompleter()
  gate = threading.Event()
  real = fake.complete
  fake.complete = lambda prompts, **kw: (gate.wait(30), real(prompts, **kw))[1]
  app = create_app(fake, model_name="fake", max_batch=1, batch_window_s=0.0, max_pending=2,
                   retry_after_s=7, max_request_bytes=MAX_BYTES)
  try:
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as http:
      yield http, app, gate
  finally:
    gate.set()


def _hold_two(http, app):
  """Two completions admitted and held by the gate: their threads and status codes."""
  statuses, threads = [], []
  for i in range(2):
    t = threading.Thread(target=lambda i=i: statuses.append(http.post(
        "/v1/completions", json={"model": "fake", "prompt": [1, i + 2], "max_tokens": 2}
    ).status_code), daemon=True)
    t.start()
    threads.append(t)
  for _ in range(3000):  # until both are submitted (a wait, not a timing)
    if app.state.batcher.stats()["pending"] == 2:
      break
    time.sleep(0.01)
  assert app.state.batcher.stats()["pending"] == 2
  return threads, statuses


def test_app_answers_503_with_retry_after_beyond_max_pending(gated_server):
  http, app, gate = gated_server
  threads, statuses = _hold_two(http, app)
  for body in ({"model": "fake", "prompt": [5], "max_tokens": 2},
               {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = http.post(path, json=body)  # answered at once, while the two are held
    assert (r.status_code, r.headers["Retry-After"]) == (503, "7"), r.text
    error = r.json()["error"]
    assert error["code"] == "overloaded" and "max_pending" in error["message"]
  health = http.get("/health")
  assert health.status_code == 200
  assert (health.json()["pending"], health.json()["rejected"]) == (2, 2)
  gate.set()
  for t in threads:
    t.join(30)
  assert statuses == [200, 200]
  assert app.state.batcher.stats()["pending"] == 0
  ok = http.post("/v1/completions", json={"model": "fake", "prompt": [1, 2], "max_tokens": 1})
  assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "[2, 1]"
  assert http.get("/health").json()["status"] == "ok"


def test_app_refused_bodies_at_the_bound_get_their_4xx_and_hold_no_place(gated_server):
  http, app, gate = gated_server
  threads, statuses = _hold_two(http, app)
  json_headers = {"Content-Type": "application/json"}
  refused = [  # (path, keyword arguments of http.post, status, part of the message)
      ("/v1/completions", {"content": b"x" * (MAX_BYTES + 1), "headers": json_headers}, 413,
       "max_request_bytes"),
      ("/v1/completions", {"content": b'{"model": "fake", "prompt": [', "headers": json_headers},
       400, "not valid JSON"),
      ("/v1/completions", {"json": {"model": "fake"}}, 400, "prompt"),
      ("/v1/completions", {"json": {"model": "fake", "prompt": [1], "temperature": 9}}, 400,
       "temperature"),
      ("/v1/completions", {"json": {"model": "other", "prompt": [1]}}, 404, "does not exist"),
      ("/v1/chat/completions", {"json": {"model": "fake", "messages": []}}, 400, "messages"),
  ]
  for path, kwargs, status, message in refused:
    r = http.post(path, **kwargs)
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
    stats = app.state.batcher.stats()
    assert (stats["pending"], stats["rejected"]) == (2, 0)
  # A valid request at the bound is the one turned away.
  assert http.post("/v1/completions", json={"model": "fake", "prompt": [3]}).status_code == 503
  gate.set()
  for t in threads:
    t.join(30)
  assert statuses == [200, 200]
  stats = app.state.batcher.stats()
  assert (stats["pending"], stats["rejected"], stats["requests"]) == (0, 1, 2)


# ============================================================================ the real server


@pytest.fixture(scope="module")
def served(chat_model_dir):
  """(openai client, base URL, app, Completer): a tiny Qwen2 served on a free loopback port."""
  from agentjax.sampling.complete import Completer

  completer = Completer.from_hf(chat_model_dir, max_total_tokens=CONTEXT)
  app = create_app(completer, model_name=MODEL, max_batch=MAX_BATCH, batch_window_s=0.005,
                   max_tokens_limit=LIMIT, max_request_bytes=MAX_BYTES)
  with ServerThread(app) as server:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                           timeout=300)
    yield client, server.url, app, completer
  assert app.state.batcher.stats()["pending"] == 0 and not app.state.batcher.alive


def _chat(content):
  return [{"role": "user", "content": content}]


def test_chat_completions_and_models_match_the_completer(served):
  client, _, app, completer = served
  assert [m.id for m in client.models.list().data] == [MODEL]
  messages = _chat("capital of Veltrana?")
  resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_NEW,
                                        temperature=0)
  ids = completer.chat_ids(messages)
  want = completer.complete([ids], max_new_tokens=MAX_NEW)[0]  # the server is idle here
  assert resp.object == "chat.completion" and resp.model == MODEL and resp.id
  assert len(resp.choices) == 1 and resp.choices[0].index == 0
  assert resp.choices[0].message.role == "assistant"
  assert resp.choices[0].message.content == want.text
  assert resp.choices[0].finish_reason == want.finish_reason
  assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
      len(ids), len(want.token_ids), len(ids) + len(want.token_ids))
  # vLLM's repetition_penalty (extra_body, as the official Co-ReAct client sends it): the
  # completer's penalized greedy text (tests/test_complete.py checks that against transformers).
  penalized = completer.complete([ids], max_new_tokens=MAX_NEW, repetition_penalty=1.5)[0]
  resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_NEW,
                                        temperature=0, extra_body={"repetition_penalty": 1.5})
  assert resp.choices[0].message.content == penalized.text

  # Text completions: a string prompt, and the same prompt as token ids (list prompts give one
  # choice per prompt).
  text = "The quick brown"
  want = completer.complete([completer.encode(text)], max_new_tokens=MAX_NEW)[0]
  resp = client.completions.create(model=MODEL, prompt=text, max_tokens=MAX_NEW, temperature=0)
  assert resp.object == "text_completion"
  assert [(c.index, c.text, c.finish_reason) for c in resp.choices] == [
      (0, want.text, want.finish_reason)]
  assert resp.usage.prompt_tokens == len(completer.encode(text))
  resp = client.completions.create(model=MODEL, prompt=[completer.encode(text)] * 2,
                                   max_tokens=MAX_NEW, temperature=0)
  assert [(c.index, c.text) for c in resp.choices] == [(0, want.text), (1, want.text)]

  # A stop string (given as a plain str) cuts the text before it, finish_reason "stop".
  stop = want.text[3:5]
  assert stop and want.text.find(stop) >= 0
  resp = client.completions.create(model=MODEL, prompt=text, max_tokens=MAX_NEW, temperature=0,
                                   stop=stop)
  assert resp.choices[0].text == want.text[:want.text.find(stop)]
  assert resp.choices[0].finish_reason == "stop"


def test_concurrent_requests_are_decoded_in_one_batch(served):
  client, _, app, completer = served
  batcher = app.state.batcher
  contents = ["capital of Veltrana?", "who was born in Orsk?", "the lazy dog", "search Orsk"]
  before = batcher.stats()
  # The window is long, so the four requests deterministically meet; the batch is full (4 =
  # max_batch) when the last arrives, and is decoded at once.
  batcher.window_s = 120.0
  try:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      replies = list(pool.map(lambda c: client.chat.completions.create(
          model=MODEL, messages=_chat(c), max_tokens=MAX_NEW, temperature=0), contents))
  finally:
    batcher.window_s = 0.005
  after = batcher.stats()
  assert (after["batches"] - before["batches"], after["rows"] - before["rows"]) == (1, 4)
  assert after["max_rows"] == 4
  # Greedy rows do not depend on their batch: each equals its prompt decoded alone.
  for content, reply in zip(contents, replies):
    want = completer.complete([completer.chat_ids(_chat(content))], max_new_tokens=MAX_NEW)[0]
    assert reply.choices[0].message.content == want.text, content


def test_bad_requests_get_clear_errors_and_the_server_goes_on(served):
  client, url, app, completer = served

  def error(status, fn):
    with pytest.raises(openai.APIStatusError) as e:
      fn()
    assert e.value.status_code == status, e.value
    return e.value.body["message"]

  def chat(**kw):
    return lambda: client.chat.completions.create(**{
        "model": MODEL, "messages": _chat("hi"), "max_tokens": MAX_NEW, "temperature": 0, **kw})

  # A prompt that does not fit the context names the limit.
  long = " ".join(["Veltrana capital Orsk"] * 30)
  assert len(completer.encode(long)) >= CONTEXT
  msg = error(400, lambda: client.completions.create(model=MODEL, prompt=long, max_tokens=2))
  assert f"maximum context length is {CONTEXT}" in msg and "prompt" in msg
  fits_alone = completer.encode(long)[:CONTEXT - 4]
  msg = error(400, lambda: client.completions.create(model=MODEL, prompt=fits_alone,
                                                      max_tokens=MAX_NEW))
  assert f"{CONTEXT - 4} tokens and max_tokens asks for {MAX_NEW}" in msg
  # max_tokens over the server's limit; wrong types and ranges name their field.
  assert "max_tokens_limit" in error(400, chat(max_tokens=LIMIT + 1))
  assert "max_tokens:" in error(400, chat(max_tokens="many"))
  assert "temperature:" in error(400, chat(temperature=3))
  assert "messages[0].content:" in error(400, chat(messages=[{"role": "user", "content": 5}]))
  assert "messages:" in error(400, chat(messages=[]))
  assert "streaming is not supported" in error(400, chat(stream=True))
  assert "tools is not supported" in error(400, chat(tools=[{"type": "function", "function": {
      "name": "f", "parameters": {"type": "object", "properties": {}}}}]))
  assert "echo is not supported" in error(400, lambda: client.completions.create(
      model=MODEL, prompt="hi", max_tokens=2, echo=True))
  assert f"above this server's limit {MAX_BATCH}" in error(400, chat(n=MAX_BATCH + 1))
  assert "does not exist" in error(404, chat(model="gpt-4"))
  # An oversized body: refused by its Content-Length, and counted while read when it comes
  # chunked (no Content-Length).
  assert "max_request_bytes" in error(413, chat(messages=_chat("x" * MAX_BYTES)))
  with httpx.Client(base_url=url, timeout=60) as http:
    def chunks():
      for _ in range(8):
        yield b" " * (MAX_BYTES // 4)

    r = http.post("/v1/chat/completions", content=chunks(),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "max_request_bytes" in r.json()["error"]["message"]
    # Malformed JSON and a body that is not an object.
    r = http.post("/v1/chat/completions", content=b'{"model": "tiny-chat", "messages": [',
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert http.get("/health").json()["status"] == "ok"
  # Still serving.
  reply = chat()()
  assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens > 0


def test_a_runs_checkpoint_is_served_with_its_trained_params(tiny_tokenizer_dir, tmp_path):
  """completer_from_run (launch/serve.py --workdir) restores the checkpoint's params, not the
  config's initial ones."""
  import jax
  import numpy as np

  from agentjax.parallel import make_mesh
  from agentjax.serve.app import completer_from_run, recorded_config
  from agentjax.train.trainer import init_train_state, load_model, make_checkpointer
  from tests.trainer_fixtures import tiny_config

  config = tiny_config(str(tmp_path / "world"), tiny_tokenizer_dir, str(tmp_path))
  workdir = str(tmp_path / "run")
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, _ = load_model(config, mesh)
  _, state = init_train_state(config, cfg, params, mesh)
  # "Trained": every parameter moved, so serving the initial params would be caught.
  state["params"] = jax.tree.map(lambda p: p + 0.25, state["params"])
  with make_checkpointer(config, workdir) as ckpt:
    assert ckpt.save(3, state, {"position": 0}, force=True)
  # With the run's --config, and with the config the run recorded (serve.py --workdir alone).
  for run_config in (config, recorded_config(workdir)):
    completer, source = completer_from_run(run_config, workdir, max_total_tokens=32)
    assert source.endswith("3")
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(completer.params),
                                 jax.tree.leaves(state["params"])):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(path))
  with pytest.raises(ValueError, match=r"empty/config.json: no such file"):
    recorded_config(str(tmp_path / "empty"))
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write("[1]")
  with pytest.raises(ValueError, match=r"run/config.json: holds list, not a run's config"):
    recorded_config(workdir)
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    completer_from_run(config, str(tmp_path / "empty"), max_total_tokens=32)
