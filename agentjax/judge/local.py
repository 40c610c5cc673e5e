"""The "local" judge backend: a Flax Qwen from a Hugging Face folder, greedy, batched.

    judge:
      backend: local
      hf_path: /models/Qwen2.5-7B-Instruct    # config.json, safetensors, tokenizer (chat template)
      max_prompt_tokens: 4096                 # a longer judge prompt fails its round (0/0)
      max_new_tokens: 512                     # the reply: analysis and the JSON object
      max_batch: 0                            # judge calls decoded together (0: all of them)

One call per round, as the "openai" backend: round k of a trajectory is judged on the question
and rounds 0..k (agentjax.judge.render.build_messages, in the model's chat template), and the
reply goes through render.parse_verdict. The decode is agentjax.judge.chat.LocalChat's (shared
with Co-ReAct's LLM appliers and rankers): every call of a judge() batch (a whole RL step's) is
decoded as ONE batch by agentjax.sampling.complete.Completer (one prefill, one decode loop, each
row stopping at its own EOS), on the run's mesh; judge.max_batch > 0 splits them into chunks of
at most that many (calls sorted by prompt length, so a chunk's rows pad to similar lengths), to
bound the KV cache: rows x bucket(max_prompt_tokens + max_new_tokens) slots.

Faults never raise out of judge(): a prompt longer than judge.max_prompt_tokens, a reply that
does not parse (a random or weak model's), a reply cut at max_new_tokens, and an error of the
decode itself each become Verdict.failed(reason) for their rounds.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from agentjax.judge.base import (JudgeRequest, Verdict, load_prompt, prompt_sha256,
                                 register_judge)
from agentjax.judge.chat import ChatReply, LocalChat
from agentjax.judge.render import build_messages, check_template, parse_verdict
from agentjax.sampling.complete import Completer

log = logging.getLogger(__name__)


class LocalJudge:
  """A Judge decoding with a local Completer (see the module docstring).

  Attributes:
    last_replies: the reply text of each call of the latest judge() ([i][k], None for a round
      whose prompt did not fit or whose decode failed), for logs and debugging.
    last_seconds: wall time of the latest judge().
  """

  def __init__(self, completer: Completer, template: str, *, model_name: str,
               max_prompt_tokens: int, max_new_tokens: int, max_batch: int = 0):
    check_template(template)
    self.backend = LocalChat(completer, max_prompt_tokens=max_prompt_tokens,
                             max_new_tokens=max_new_tokens, max_batch=max_batch,
                             model_name=model_name)
    self.template, self.model_name = template, model_name
    self.last_replies: list[list[str | None]] = []
    self.last_seconds = 0.0

  # The decode settings live in the backend (one place); these read and set them there.
  completer = property(lambda self: self.backend.completer)
  max_prompt_tokens = property(lambda self: self.backend.max_prompt_tokens)
  max_new_tokens = property(lambda self: self.backend.max_new_tokens)
  max_batch = property(lambda self: self.backend.max_batch,
                       lambda self, value: setattr(self.backend, "max_batch", int(value)))

  def identity(self) -> dict[str, str]:
    return {"backend": "local", "model": self.model_name,
            "prompt_sha256": prompt_sha256(self.template)}

  def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
    """One Verdict per round of each request; the calls decoded together. Never raises on a fault
    of the model or its replies."""
    start = time.perf_counter()
    calls = [(request, k) for request in requests for k in range(len(request.turns))]
    verdicts, replies = self.judge_calls(calls)
    out: list[list[Verdict]] = []
    self.last_replies = []
    for request in requests:
      n = len(request.turns)
      out.append(verdicts[:n])
      self.last_replies.append(replies[:n])
      verdicts, replies = verdicts[n:], replies[n:]
    self.last_seconds = time.perf_counter() - start
    failed = [v.error for row in out for v in row if not v.ok]
    if failed:
      log.warning("local judge: %d of %d calls failed (scored 0/0); first: %s", len(failed),
                  len(calls), failed[0])
    return out

  def judge_calls(self, calls: Sequence[tuple[JudgeRequest, int]]
                  ) -> tuple[list[Verdict], list[str | None]]:
    """(verdicts, replies) of judge calls (request, round k), decoded together (in max_batch
    chunks); a reply is None where the prompt did not fit or the decode failed."""
    replies = self.backend.chat([build_messages(self.template, request, k)
                                 for request, k in calls])
    return [_verdict(r) for r in replies], [r.text for r in replies]


def _verdict(reply: ChatReply) -> Verdict:
  if not reply.ok:
    return Verdict.failed(reply.error or "no reply")
  verdict = parse_verdict(reply.text)
  if not verdict.ok and reply.finish_reason == "length":
    # Say why first: the reason itself would be cut at 300 characters.
    return Verdict.failed(f"reply cut at max_new_tokens ({reply.completion_tokens} tokens); "
                          f"{verdict.error}")
  return verdict


@register_judge("local")
def make_local_judge(judge_config: Any, *, mesh: Any = None) -> LocalJudge:
  """The "local" backend: judge.hf_path loaded on `mesh` (every process, one SPMD decode)."""
  template = load_prompt(judge_config)
  check_template(template, judge_config.prompt_path or "the built-in judge prompt")
  chat = LocalChat.from_config(judge_config, mesh=mesh)
  return LocalJudge(chat.completer, template, model_name=chat.model_name,
                    max_prompt_tokens=chat.max_prompt_tokens, max_new_tokens=chat.max_new_tokens,
                    max_batch=chat.max_batch)
