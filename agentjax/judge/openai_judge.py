"""The "openai" judge backend: any OpenAI-compatible chat-completions endpoint.

vLLM, SGLang, a hosted API, or agentjax's own launch/serve.py, through the official `openai`
client. One call per round: round k of a trajectory is judged on the question and rounds 0..k
(agentjax.judge.render), so a trajectory of K rounds costs K calls, the answer round included
(the trainer decides which trajectories to send).

Concurrency, retries and faults are agentjax.judge.chat.OpenAIChat's (one definition, shared
with Co-ReAct's LLM appliers and rankers): every call of a judge() batch in flight together (up
to judge.max_concurrency), timeouts, connection errors and HTTP 408/409/429/5xx retried with
backoff, other statuses and unusable replies not retried. A reply that arrives but holds no
parseable verdict fails too (at temperature 0 the judge would say the same again). Every failure
becomes Verdict.failed(reason) for its round and is counted; judge() never raises on a fault of
the server or the model.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

from agentjax.judge.base import (JudgeRequest, Verdict, load_prompt, prompt_sha256,
                                 register_judge)
from agentjax.judge.chat import OpenAIChat
from agentjax.judge.render import build_messages, check_template, parse_verdict

log = logging.getLogger(__name__)


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


class OpenAIJudge:
  """A Judge over an OpenAI-compatible chat-completions endpoint (see the module docstring).

  Attributes:
    stats: JudgeStats over every judge() call so far.
    last_stats: JudgeStats of the latest judge() call.
  """

  def __init__(self, judge_config: Any):
    self.backend = OpenAIChat(judge_config)  # checks the connection settings first
    self.template = load_prompt(judge_config)
    check_template(self.template, judge_config.prompt_path or "the built-in judge prompt")
    self.model = self.backend.model
    self.stats = JudgeStats()
    self.last_stats = JudgeStats()

  @property
  def client(self) -> Any:
    """The backend's openai client."""
    return self.backend.client

  def identity(self) -> dict[str, str]:
    return {"backend": "openai", "model": self.model,
            "prompt_sha256": prompt_sha256(self.template)}

  def close(self) -> None:
    self.backend.close()

  def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
    """One Verdict per round of each request; all calls in flight together (up to
    max_concurrency). Never raises on a fault of the endpoint or of its replies."""
    start = time.perf_counter()
    jobs = [(i, k) for i, request in enumerate(requests) for k in range(len(request.turns))]
    messages = [build_messages(self.template, requests[i], k) for i, k in jobs]
    out: list[list[Verdict | None]] = [[None] * len(r.turns) for r in requests]
    stats = JudgeStats(calls=len(jobs))
    first_error = None
    for (i, k), reply in zip(jobs, self.backend.chat(messages)):
      # An answered call whose reply holds no verdict fails without retry: at temperature 0 the
      # judge would say the same again.
      verdict = parse_verdict(reply.text) if reply.ok else Verdict.failed(reply.error)
      out[i][k] = verdict
      stats.retries += reply.retries
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


@register_judge("openai")
def make_openai_judge(judge_config: Any, *, mesh: Any = None) -> OpenAIJudge:
  """The "openai" backend (the mesh is not used: the model runs behind the endpoint)."""
  del mesh
  return OpenAIJudge(judge_config)
