"""The "openai" judge backend: any OpenAI-compatible chat-completions endpoint.

vLLM, SGLang, a hosted API, or agentjax's own launch/serve.py, through the official `openai`
client. One call per round: round k of a trajectory is judged on the question and rounds 0..k
(agentjax.judge.render), so a trajectory of K rounds costs K calls, the answer round included
(the trainer decides which trajectories to send).

Concurrency: every call of a judge() batch is submitted at once to a thread pool of
judge.max_concurrency workers over one synchronous client. Threads rather than AsyncOpenAI with a
semaphore because judge() is called from the synchronous training loop: a thread pool needs no
event loop (asyncio.run would fail under a caller's running loop, e.g. a notebook, and an async
client's connections are tied to the loop that opened them), the sync httpx client is
thread-safe with one shared connection pool, and the workers spend their time waiting on sockets
with the GIL released. The pool size is exactly the number of requests in flight.

Faults: the client's own retries are off (max_retries=0) so that the retry count and backoff are
ours (judge.max_retries attempts after the first, sleeping retry_backoff_s * 2**i before retry
i+1) and counted. Retried: timeouts, refused or dropped connections, and HTTP 408, 409, 429 and
5xx (the statuses the openai client itself retries). Not retried: other HTTP statuses (400 for a
trace longer than the judge's context, 401, 404: asking again gets the same answer), and replies
that arrive but are unusable (no choices, empty content, no parseable verdict), since at
temperature 0 the judge would say the same again. Every failure becomes Verdict.failed(reason)
for its round and is counted; judge() never raises on a fault of the server or the model.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any, Sequence

import httpx
import openai

from agentjax.judge.base import (JudgeRequest, Verdict, load_prompt, prompt_sha256,
                                 register_judge)
from agentjax.judge.render import build_messages, check_template, parse_verdict

log = logging.getLogger(__name__)

RETRIED_STATUSES = frozenset({408, 409, 429})  # and every status >= 500


def _retried(status: int) -> bool:
  return status in RETRIED_STATUSES or status >= 500


@dataclasses.dataclass
class JudgeStats:
  """Counters of judge calls, for the trainer's judge/* metrics.

  calls: judge calls made (one per judged round), failed ones included.
  failures: calls whose round got Verdict.failed (after any retries).
  retries: attempts made after a call's first one.
  seconds: wall time spent in judge().
  """
  calls: int = 0
  failures: int = 0
  retries: int = 0
  seconds: float = 0.0

  def add(self, other: "JudgeStats") -> None:
    self.calls += other.calls
    self.failures += other.failures
    self.retries += other.retries
    self.seconds += other.seconds

  def metrics(self, prefix: str = "judge/") -> dict[str, float]:
    return {f"{prefix}{k}": float(v) for k, v in dataclasses.asdict(self).items()}


def _check_config(cfg: Any) -> None:
  """Raises ValueError naming the first judge.* field the backend cannot run with."""
  if not isinstance(cfg.base_url, str) or not cfg.base_url.strip():
    raise ValueError(f"judge.base_url: an OpenAI-compatible endpoint is required, got "
                     f"{cfg.base_url!r}")
  if not isinstance(cfg.model, str) or not cfg.model.strip():
    raise ValueError(f"judge.model: the served model's name is required, got {cfg.model!r}")
  checks = [("max_concurrency", cfg.max_concurrency >= 1, ">= 1"),
            ("timeout_s", cfg.timeout_s > 0, "> 0"),
            ("max_retries", cfg.max_retries >= 0, ">= 0"),
            ("retry_backoff_s", cfg.retry_backoff_s >= 0, ">= 0"),
            ("max_tokens", cfg.max_tokens >= 0, ">= 0 (0: not sent)"),
            ("temperature", cfg.temperature >= 0, ">= 0")]
  for name, ok, want in checks:
    if not ok:
      raise ValueError(f"judge.{name} must be {want}, got {getattr(cfg, name)!r}")


class OpenAIJudge:
  """A Judge over an OpenAI-compatible chat-completions endpoint (see the module docstring).

  Attributes:
    stats: JudgeStats over every judge() call so far.
    last_stats: JudgeStats of the latest judge() call.
  """

  def __init__(self, judge_config: Any):
    _check_config(judge_config)
    self.template = load_prompt(judge_config)
    check_template(self.template, judge_config.prompt_path or "the built-in judge prompt")
    self.model = judge_config.model
    self.temperature = float(judge_config.temperature)
    self.max_tokens = int(judge_config.max_tokens)
    self.max_concurrency = int(judge_config.max_concurrency)
    self.timeout_s = float(judge_config.timeout_s)
    self.max_retries = int(judge_config.max_retries)
    self.retry_backoff_s = float(judge_config.retry_backoff_s)
    api_key = os.environ.get(judge_config.api_key_env, "") if judge_config.api_key_env else ""
    timeout = httpx.Timeout(self.timeout_s)  # connect, read, write and pool wait, each
    # Enough pooled connections that every worker keeps one alive between calls.
    limits = httpx.Limits(max_connections=max(1000, self.max_concurrency),
                          max_keepalive_connections=self.max_concurrency)
    self.client = openai.OpenAI(
        base_url=judge_config.base_url, api_key=api_key or "EMPTY", max_retries=0,
        timeout=timeout, http_client=openai.DefaultHttpxClient(timeout=timeout, limits=limits))
    self.stats = JudgeStats()
    self.last_stats = JudgeStats()

  def identity(self) -> dict[str, str]:
    return {"backend": "openai", "model": self.model,
            "prompt_sha256": prompt_sha256(self.template)}

  def close(self) -> None:
    self.client.close()

  def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
    """One Verdict per round of each request; all calls in flight together (up to
    max_concurrency). Never raises on a fault of the endpoint or of its replies."""
    start = time.perf_counter()
    jobs = [(i, k) for i, request in enumerate(requests) for k in range(len(request.turns))]
    messages = [build_messages(self.template, requests[i], k) for i, k in jobs]
    out: list[list[Verdict | None]] = [[None] * len(r.turns) for r in requests]
    stats = JudgeStats(calls=len(jobs))
    first_error = None
    if jobs:
      with concurrent.futures.ThreadPoolExecutor(
          max_workers=min(self.max_concurrency, len(jobs)), thread_name_prefix="judge") as pool:
        for (i, k), (verdict, retries) in zip(jobs, pool.map(self._call, messages)):
          out[i][k] = verdict
          stats.retries += retries
          if not verdict.ok:
            stats.failures += 1
            first_error = first_error or verdict.error
    stats.seconds = time.perf_counter() - start
    self.last_stats = stats
    self.stats.add(stats)
    if stats.failures:
      log.warning("judge: %d of %d calls failed (scored 0/0); first: %s", stats.failures,
                  stats.calls, first_error)
    return out  # type: ignore[return-value]

  def _call(self, messages: list[dict[str, str]]) -> tuple[Verdict, int]:
    """(the verdict of one judge call, retries it took). Never raises."""
    error = "no attempt"
    attempts = 0
    while attempts <= self.max_retries:
      if attempts:
        time.sleep(self.retry_backoff_s * 2 ** (attempts - 1))
      attempts += 1
      try:
        # max_tokens 0 is not sent (the official code sends none): the server's own limit
        # applies, and a reasoning judge (gpt-oss) is not cut off in its reasoning.
        limit = {"max_tokens": self.max_tokens} if self.max_tokens else {}
        response = self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=self.temperature, **limit)
      except openai.APIStatusError as e:
        error = f"HTTP {e.status_code}: {_short(e.message)}"
        if not _retried(e.status_code):
          break
        continue
      except openai.APITimeoutError:
        error = f"timed out after {self.timeout_s:g} s"
        continue
      except openai.APIConnectionError as e:
        error = f"connection failed: {_short(str(e.__cause__ or e))}"
        continue
      except Exception as e:  # pylint: disable=broad-except
        # A 200 whose body is not JSON, or that the client cannot read: the server answered
        # something that is not a chat completion.
        return Verdict.failed(f"unreadable response: {type(e).__name__}: {_short(str(e))}"), \
            attempts - 1
      content, why = _reply_text(response)
      if why is not None:
        return Verdict.failed(why), attempts - 1
      return parse_verdict(content), attempts - 1
    return Verdict.failed(f"{error} ({attempts} attempt{'s' * (attempts > 1)})"), attempts - 1


def _short(text: str, limit: int = 160) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + "..."


def _reply_text(response: Any) -> tuple[str, str | None]:
  """(the first choice's message content, None) or ("", why there is none). The client builds
  responses without validating them, so every field may be missing or of the wrong type."""
  if isinstance(response, str):  # the client returns a non-JSON body as text
    return "", f"response is not a chat completion: {_short(response, 80)!r}"
  choices = getattr(response, "choices", None)
  if not isinstance(choices, list) or not choices:
    return "", "response has no choices"
  message = getattr(choices[0], "message", None)
  content = getattr(message, "content", None)
  if not isinstance(content, str) or not content.strip():
    finish = getattr(choices[0], "finish_reason", None)
    return "", f"empty reply (finish_reason={finish!r})"
  return content, None


@register_judge("openai")
def make_openai_judge(judge_config: Any, *, mesh: Any = None) -> OpenAIJudge:
  """The "openai" backend (the mesh is not used: the model runs behind the endpoint)."""
  del mesh
  return OpenAIJudge(judge_config)
