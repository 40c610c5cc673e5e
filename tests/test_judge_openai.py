"""The "openai" judge backend against a scripted OpenAI-compatible stub server on loopback, and the
trace rendering and verdict parsing every LLM judge shares (agentjax/judge/render.py).

The stub (FastAPI + uvicorn in a thread) reads which reply to script from a "case:<name>" tag in
the question and the judged round from the number of "Agent:" blocks in the trace, so every
verdict can be checked against the round it belongs to, whatever order the calls arrive in.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import socket
import threading

import fastapi
import pytest
import uvicorn

from agentjax.agent.protocol import ANSWER, INVALID, SEARCH, Action
from agentjax.agent.rollout import TurnRecord
from agentjax.judge import (DEFAULT_PROMPT_PATH, JudgeRequest, Verdict, build_judge,
                            judge_identity, prompt_sha256)
from agentjax.judge.openai_judge import OpenAIJudge
from agentjax.judge.render import TRACE_MARKER, build_messages, parse_verdict, render_trace
from agentjax.retrieval import Document
from configs.base import get_config

TEMPLATE = "Grade the last round.\n\n" + TRACE_MARKER + "\n\nReply in JSON.\n"


def _expected(k: int) -> tuple[int, int]:
  """(retrieval, thinking) the stub's well-formed replies give round k."""
  return k % 2, 1 - (k % 3 == 2)


class Stub:
  """A chat-completions endpoint whose replies are scripted by the case tag in the question."""

  def __init__(self):
    self.app = fastapi.FastAPI()
    self.app.post("/v1/chat/completions")(self.chat)
    self.reset()

  def reset(self, gate: int = 0, hang_s: float = 1.0):
    self.attempts = collections.Counter()   # (case, question, round) -> requests seen
    self.inflight = 0
    self.max_inflight = 0
    self.gate_target = gate                  # hold "gate" requests until this many are in flight
    self.gate = None
    self.hang_s = hang_s
    self.bodies = []                         # every request body, in arrival order

  @staticmethod
  def completion(content):
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]}

  async def chat(self, request: fastapi.Request):
    body = await request.json()
    self.bodies.append(body)
    text = "\n".join(m["content"] for m in body["messages"])
    case = re.search(r"case:(\w+)", text).group(1)
    question = re.search(r"Question: (.*)", text).group(1)
    k = text.count("Agent:\n") - 1
    self.attempts[case, question, k] += 1
    self.inflight += 1
    self.max_inflight = max(self.max_inflight, self.inflight)
    try:
      return await self.reply(case, k, self.attempts[case, question, k])
    finally:
      self.inflight -= 1

  async def reply(self, case, k, attempt):
    ret, think = _expected(k)
    good = {"analysis": f"round {k}", "thinking_reward": think, "retrieval_reward": ret}
    fenced = f"Checking the claims.\n```json\n{json.dumps(good)}\n```"
    if case == "gate":
      if self.gate is None:
        self.gate = asyncio.Event()
      if self.inflight >= self.gate_target:
        self.gate.set()
      try:
        await asyncio.wait_for(self.gate.wait(), 3.0)
      except asyncio.TimeoutError:
        pass  # fewer in flight than expected: the assertion on max_inflight says so
      await asyncio.sleep(0.01)
      return self.completion(fenced)
    if case == "good":
      return self.completion(fenced)
    if case == "bare":
      return self.completion(json.dumps(good))
    if case == "wrongtype":
      return self.completion(json.dumps({**good, "thinking_reward": "1"}))
    if case == "missing":
      return self.completion(json.dumps({"analysis": "x", "retrieval_reward": 1}))
    if case == "prose":
      return self.completion("Both rewards should be one, I believe.")
    if case == "flaky" and attempt == 1 or case == "down":
      return fastapi.responses.JSONResponse({"error": {"message": "overloaded"}}, 500)
    if case == "flaky":
      return self.completion(fenced)
    if case == "bad400":
      return fastapi.responses.JSONResponse({"error": {"message": "prompt too long"}}, 400)
    if case == "hang":
      await asyncio.sleep(self.hang_s)
      return self.completion(fenced)
    if case == "nochoices":
      return {**self.completion(""), "choices": []}
    if case == "nullcontent":
      return self.completion(None)
    if case == "html":
      return fastapi.responses.HTMLResponse("<html>gateway error</html>")
    raise AssertionError(case)


@pytest.fixture(scope="module")
def stub():
  server_stub = Stub()
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  config = uvicorn.Config(server_stub.app, log_level="error", timeout_graceful_shutdown=1)
  server = uvicorn.Server(config)
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  for _ in range(500):
    if server.started:
      break
    threading.Event().wait(0.01)
  assert server.started
  server_stub.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
  yield server_stub
  server.should_exit = True
  thread.join(5)
  sock.close()


def _config(tmp_path, url, **overrides):
  prompt = tmp_path / "prompt.md"
  prompt.write_text(TEMPLATE)
  c = get_config().judge
  c.backend = "openai"
  c.base_url = url
  c.model = "stub-judge"
  c.prompt_path = str(prompt)
  c.api_key_env = "AGENTJAX_TEST_JUDGE_KEY"
  c.timeout_s = 2.0
  c.max_retries = 3
  c.retry_backoff_s = 0.01
  c.max_concurrency = 8
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _doc(i: int, title: str) -> Document:
  return Document(id=str(i), contents=f"{title}\npassage {i} about {title}", score=1.0)


def _request(question: str, rounds: int) -> JudgeRequest:
  """A trajectory of rounds-1 searches then an answer."""
  turns = [TurnRecord(text=f"<think>step {k}</think>\n<search>query {k}</search>",
                      action=Action(SEARCH, f"query {k}"), documents=(_doc(k, f"T{k}"),),
                      observation=f"\n\n<information>Doc 1(Title: T{k}) passage {k}\n"
                                  "</information>\n\n")
           for k in range(rounds - 1)]
  turns.append(TurnRecord(text="<think>done</think>\n<answer>A</answer>",
                          action=Action(ANSWER, "A")))
  return JudgeRequest({"question": question, "golden_answers": ["A"]}, turns)


def _judge(stub, tmp_path, cases, rounds=3, **overrides):
  judge = build_judge(_config(tmp_path, stub.url, **overrides))
  assert isinstance(judge, OpenAIJudge)
  requests = [_request(f"case:{case} q{i}", rounds) for i, case in enumerate(cases)]
  verdicts = judge.judge(requests)
  judge.close()
  assert [len(v) for v in verdicts] == [rounds] * len(cases)
  return judge, verdicts


def test_verdicts_per_round_fenced_and_bare(stub, tmp_path):
  stub.reset()
  judge, verdicts = _judge(stub, tmp_path, ["good", "bare", "good"], rounds=4)
  for row in verdicts:
    for k, v in enumerate(row):
      assert v.ok and (v.retrieval, v.thinking) == _expected(k) and v.analysis == f"round {k}"
  assert (judge.last_stats.calls, judge.last_stats.failures, judge.last_stats.retries) == \
      (12, 0, 0)
  # One call per round: round k of each question was asked once.
  assert sorted(stub.attempts.values()) == [1] * 12
  assert {k for (_, _, k) in stub.attempts} == {0, 1, 2, 3}


@pytest.mark.parametrize("case,error", [("wrongtype", "thinking_reward must be 0 or 1"),
                                        ("missing", "missing key 'thinking_reward'"),
                                        ("prose", "no JSON object"),
                                        ("nochoices", "no choices"),
                                        ("nullcontent", "empty reply"),
                                        ("html", "not a chat completion")])
def test_bad_replies_fail_without_retry(stub, tmp_path, case, error):
  stub.reset()
  judge, verdicts = _judge(stub, tmp_path, [case, "good"], rounds=2)
  assert all(not v.ok and (v.retrieval, v.thinking) == (0, 0) and error in v.error
             for v in verdicts[0]), verdicts[0]
  assert all(v.ok for v in verdicts[1])
  assert (judge.last_stats.failures, judge.last_stats.retries) == (2, 0)
  assert all(n == 1 for n in stub.attempts.values())  # an answered call is not asked again


def test_http_500_is_retried_then_succeeds(stub, tmp_path):
  stub.reset()
  judge, verdicts = _judge(stub, tmp_path, ["flaky", "flaky"], rounds=3)
  assert all(v.ok and (v.retrieval, v.thinking) == _expected(k)
             for row in verdicts for k, v in enumerate(row))
  assert (judge.last_stats.calls, judge.last_stats.failures, judge.last_stats.retries) == (6, 0, 6)
  assert sorted(stub.attempts.values()) == [2] * 6


def test_http_500_always_fails_after_retries_and_is_counted(stub, tmp_path):
  stub.reset()
  judge, verdicts = _judge(stub, tmp_path, ["down", "good"], rounds=2, max_retries=2)
  assert all(not v.ok and (v.retrieval, v.thinking) == (0, 0) and "HTTP 500" in v.error
             and "3 attempts" in v.error for v in verdicts[0])
  assert all(v.ok for v in verdicts[1])
  assert (judge.last_stats.failures, judge.last_stats.retries) == (2, 4)
  assert sorted(n for (case, _, _), n in stub.attempts.items() if case == "down") == [3, 3]
  # Cumulative stats add up over calls.
  judge.judge([_request("case:down again", 1)])
  assert (judge.stats.calls, judge.stats.failures, judge.stats.retries) == (5, 3, 6)
  assert judge.stats.metrics()["judge/failures"] == 3.0


def test_http_400_is_not_retried(stub, tmp_path):
  stub.reset()
  judge, verdicts = _judge(stub, tmp_path, ["bad400"], rounds=2)
  assert all(not v.ok and "HTTP 400" in v.error and "prompt too long" in v.error
             for v in verdicts[0])
  assert judge.last_stats.retries == 0 and sorted(stub.attempts.values()) == [1, 1]


def test_hang_times_out(stub, tmp_path):
  stub.reset(hang_s=1.5)
  judge, verdicts = _judge(stub, tmp_path, ["hang"], rounds=2, timeout_s=0.25, max_retries=1)
  assert all(not v.ok and "timed out" in v.error for v in verdicts[0]), verdicts
  assert (judge.last_stats.failures, judge.last_stats.retries) == (2, 2)


def test_connection_refused(tmp_path):
  # A bound socket that does not listen: connecting to it is refused, and no one else can take
  # the port meanwhile.
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    judge = build_judge(_config(tmp_path, url, max_retries=2))
    verdicts = judge.judge([_request("case:good q", 3), _request("case:good r", 1)])
  assert [len(v) for v in verdicts] == [3, 1]
  assert all(not v.ok and (v.retrieval, v.thinking) == (0, 0) and "connection failed" in v.error
             for row in verdicts for v in row), verdicts
  assert (judge.last_stats.calls, judge.last_stats.failures, judge.last_stats.retries) == \
      (4, 4, 8)


@pytest.mark.parametrize("concurrency,trajectories", [(4, 5), (16, 3)])
def test_all_calls_in_flight_up_to_max_concurrency(stub, tmp_path, concurrency, trajectories):
  calls = 2 * trajectories
  stub.reset(gate=min(concurrency, calls))
  _, verdicts = _judge(stub, tmp_path, ["gate"] * trajectories, rounds=2,
                       max_concurrency=concurrency, timeout_s=10.0)
  assert all(v.ok for row in verdicts for v in row)
  assert stub.max_inflight == min(concurrency, calls)
  assert sum(stub.attempts.values()) == calls


def test_empty_batch_and_api_key(stub, tmp_path, monkeypatch):
  stub.reset()
  judge = build_judge(_config(tmp_path, stub.url))
  assert judge.judge([]) == [] and judge.judge([JudgeRequest({"question": "q"}, [])]) == [[]]
  assert judge.last_stats.calls == 0
  assert judge.client.api_key == "EMPTY"
  monkeypatch.setenv("AGENTJAX_TEST_JUDGE_KEY", "sk-test")
  assert build_judge(_config(tmp_path, stub.url)).client.api_key == "sk-test"


def test_identity_is_the_prompt_hash(tmp_path):
  c = _config(tmp_path, "http://127.0.0.1:1/v1")
  judge = build_judge(c)
  assert judge.identity() == {"backend": "openai", "model": "stub-judge",
                              "prompt_sha256": prompt_sha256(TEMPLATE)}
  assert judge_identity(c)["prompt_sha256"] == judge.identity()["prompt_sha256"]
  c.prompt_path = ""  # the built-in prompt
  with open(DEFAULT_PROMPT_PATH, encoding="utf-8") as f:
    builtin = f.read()
  assert build_judge(c).identity()["prompt_sha256"] == prompt_sha256(builtin) != \
      prompt_sha256(TEMPLATE)


@pytest.mark.parametrize("field,value,match", [
    ("max_concurrency", 0, "judge.max_concurrency"), ("timeout_s", 0.0, "judge.timeout_s"),
    ("max_retries", -1, "judge.max_retries"), ("base_url", "", "judge.base_url"),
    ("model", "", "judge.model")])
def test_bad_config_raises_naming_the_field(tmp_path, field, value, match):
  with pytest.raises(ValueError, match=match):
    build_judge(_config(tmp_path, "http://127.0.0.1:1/v1", **{field: value}))


def test_prompt_without_marker_raises(tmp_path):
  c = _config(tmp_path, "http://127.0.0.1:1/v1")
  (tmp_path / "prompt.md").write_text("no marker {trace}")
  with pytest.raises(ValueError, match=r"\{\{TRACE\}\}"):
    build_judge(c)


# ---- rendering


def test_render_trace_holds_rounds_up_to_k_only():
  request = _request("Who wrote X?", 4)
  for k in range(4):
    trace = render_trace(request, k)
    assert trace.startswith("Question: Who wrote X?\n\nAgent:\n<think>step 0</think>")
    assert trace.count("Agent:\n") == k + 1
    for j in range(3):
      assert (f"query {j}" in trace) == (j <= k)
      assert (f"passage {j}" in trace) == (j <= k)
    assert ("<answer>A</answer>" in trace) == (k == 3)
    # Observation wrappers are dropped; an answer round has no Information block.
    assert "<information>" not in trace and not trace.endswith("Information:")
  assert render_trace(request, 3).endswith("Agent:\n<think>done</think>\n<answer>A</answer>")
  expected = ("Question: Who wrote X?\n\nAgent:\n<think>step 0</think>\n<search>query 0</search>"
              "\n\nInformation:\nDoc 1(Title: T0) passage 0")
  assert render_trace(request, 0) == expected
  with pytest.raises(ValueError, match="round 4 out of range"):
    render_trace(request, 4)


def test_render_tool_call_protocol_and_fallbacks():
  call = '<think>t</think>\n<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
  fed = ("<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: A) a\n</tool_response>"
         "<|im_end|>\n<|im_start|>assistant\n")
  turns = [TurnRecord(call, Action(SEARCH, "q"), (_doc(0, "A"),), fed),
           # no observation recorded: the documents are shown
           TurnRecord("<search>r</search>", Action(SEARCH, "r"), (_doc(1, "B"),)),
           # a failed search with no observation text: its error is shown
           TurnRecord("<search>s</search>", Action(SEARCH, "s"), (), "", "index offline"),
           TurnRecord("garbled", Action(INVALID, "no action"), (), "\nMy previous action is "
                      "invalid.\n"),
           TurnRecord("", Action(INVALID, "cut"))]
  trace = render_trace(JudgeRequest({"question": "Q"}, turns), 4)
  blocks = trace.split("\n\n")
  assert blocks == ["Question: Q", f"Agent:\n{call}", "Information:\nDoc 1(Title: A) a",
                    "Agent:\n<search>r</search>", "Information:\nDoc 1(Title: B) passage 1 about B",
                    "Agent:\n<search>s</search>", "Information:\nSearch failed: index offline",
                    "Agent:\ngarbled", "Information:\nMy previous action is invalid.",
                    "Agent:\n(no output)"]


def test_max_tokens_zero_is_not_sent(stub, tmp_path):
  """judge.max_tokens=0 (the default, as the official code): no max_tokens in the request, so a
  reasoning judge is not cut off; a positive value is sent as is."""
  for max_tokens, sent in ((0, None), (7, 7)):
    stub.reset()
    _judge(stub, tmp_path, ["good"], rounds=1, max_tokens=max_tokens)
    assert stub.bodies and all(b.get("max_tokens") == sent for b in stub.bodies)
    assert all(b["temperature"] == 0.0 for b in stub.bodies)


def test_build_messages_fills_the_marker_only():
  # Literal braces in the template (a JSON example) survive; the trace's own braces too.
  template = 'Rate.\n{"analysis": "...", "thinking_reward": 0}\n' + TRACE_MARKER + "\nEnd {x}"
  request = _request("What is {{TRACE}} {0}?", 2)
  messages = build_messages(template, request, 1)
  assert messages == [{"role": "user", "content": template.replace(
      TRACE_MARKER, render_trace(request, 1))}]
  assert messages[0]["content"].startswith('Rate.\n{"analysis": "...", "thinking_reward": 0}\n'
                                           "Question: What is {{TRACE}} {0}?")
  assert messages[0]["content"].endswith("<answer>A</answer>\nEnd {x}")
  with open(DEFAULT_PROMPT_PATH, encoding="utf-8") as f:
    builtin = f.read()
  plain = _request("Who wrote X? {{USER}}", 2)
  # The built-in prompt follows the official layout: the instructions as the system message,
  # "Here is the trace:" and the trace as the user message.
  system, user = build_messages(builtin, plain, 0)
  assert (system["role"], user["role"]) == ("system", "user")
  assert user["content"] == "Here is the trace:\n\n" + render_trace(plain, 0) + "\n"
  assert TRACE_MARKER not in system["content"] and "{{USER}}" not in system["content"]
  assert '"thinking_reward"' in system["content"] and '"retrieval_reward"' in system["content"]


# ---- parsing

GOOD = '{"analysis": "ok", "thinking_reward": 1, "retrieval_reward": 0}'


@pytest.mark.parametrize("reply,expected", [
    (f"```json\n{GOOD}\n```", (0, 1, "ok")),
    (GOOD, (0, 1, "ok")),
    (f"  Steps...\n{GOOD}\nThat is all.", (0, 1, "ok")),          # object inside prose
    ("```JSON\n" + GOOD + "```", (0, 1, "ok")),
    # The last fence wins (an earlier draft or example is ignored).
    ('```json\n{"analysis": "d", "thinking_reward": 0, "retrieval_reward": 1}\n```\nFinal:\n'
     f"```json\n{GOOD}\n```", (0, 1, "ok")),
    ('```json\n{"analysis": "b", "thinking_reward": true, "retrieval_reward": false}\n```',
     (0, 1, "b")),
    ('{"analysis": "e", "thinking_reward": 0, "retrieval_reward": 1, "extra": [1]}', (1, 0, "e")),
    ('prefix {} then ' + GOOD, None),                              # the first object is {}
    ('{"analysis": "x", "thinking_reward": 2, "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": 0.5, "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": 1.0, "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": "yes", "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": "1", "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": null, "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": -1, "retrieval_reward": 0}', None),
    ('{"analysis": 3, "thinking_reward": 1, "retrieval_reward": 0}', None),
    ('{"thinking_reward": 1, "retrieval_reward": 0}', None),
    ('{"analysis": "x", "thinking_reward": 1}', None),
    ("[" + GOOD + "]", None),                                      # not an object
    ('"just a string"', None), ("1", None), ("null", None), ("", None),
    ("```json\nnot json at all\n```\n" + GOOD, None),               # the last fence is junk
    ("```json\n" + GOOD[:30], None),                                # cut off by max_tokens
])
def test_parse_verdict(reply, expected):
  v = parse_verdict(reply)
  if expected is None:
    assert not v.ok and (v.retrieval, v.thinking, v.analysis) == (0, 0, "") and v.error, v
  else:
    assert v == Verdict(expected[0], expected[1], expected[2])


def test_parse_verdict_reasons():
  assert "missing key 'retrieval_reward'" in parse_verdict(
      '{"analysis": "x", "thinking_reward": 1}').error
  assert "list, not an object" in parse_verdict("[1, 2]").error
  assert "last ```json fence" in parse_verdict("```json\n[]\n```").error
  assert "not text" in parse_verdict(None).error
  assert "longer than" in parse_verdict("{" * 300_000).error


def test_parse_verdict_never_raises_on_junk():
  rng = random.Random(0)
  pieces = ["{", "}", "[", "]", '"', ":", ",", "```", "```json\n", "\n", " ", "0", "1", "2",
            "true", "null", "1e999", "9" * 5000, '"analysis"', '"thinking_reward"',
            '"retrieval_reward"', "\\", "\\u12", "\ud800", "é", "\x00", "NaN", "{" * 2000]
  for _ in range(400):
    reply = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
    v = parse_verdict(reply)
    assert isinstance(v, Verdict) and v.retrieval in (0, 1) and v.thinking in (0, 1)
    assert v.ok == (v.error is None)
  for _ in range(200):
    reply = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 200)))
    assert isinstance(parse_verdict(reply), Verdict)
  # Junk around a good object, fenced: still found.
  assert parse_verdict("}{]\x00```json\n" + GOOD + "\n```\x00{{").ok
