"""The "local" judge backend: a Flax Qwen from a Hugging Face folder, greedy, batched.

    judge:
      backend: local
      hf_path: /models/Qwen2.5-7B-Instruct    # config.json, safetensors, tokenizer (chat template)
      max_prompt_tokens: 4096                 # a longer judge prompt fails its round (0/0)
      max_new_tokens: 512                     # the reply: analysis and the JSON object
      max_batch: 0                            # judge calls decoded together (0: all of them)

One call per round, as the "openai" backend: round k of a trajectory is judged on the question
and rounds 0..k (agentjax.judge.render.build_messages, in the model's chat template), and the
reply goes through render.parse_verdict. Every call of a judge() batch (a whole RL step's) is
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
import os
import time
from typing import Any, Sequence

from agentjax.judge.base import (JudgeRequest, Verdict, load_prompt, prompt_sha256,
                                 register_judge)
from agentjax.judge.render import build_messages, check_template, parse_verdict
from agentjax.sampling.complete import Completer, Completion

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
    if max_prompt_tokens < 1 or max_new_tokens < 1:
      raise ValueError(f"judge.max_prompt_tokens ({max_prompt_tokens}) and judge.max_new_tokens "
                       f"({max_new_tokens}) must be >= 1")
    if max_batch < 0:
      raise ValueError(f"judge.max_batch must be >= 0 (0: one batch), got {max_batch}")
    if completer.max_total_tokens < max_prompt_tokens + 1:
      raise ValueError(f"the Completer's max_total_tokens ({completer.max_total_tokens}) leaves no "
                       f"room to reply to a prompt of judge.max_prompt_tokens={max_prompt_tokens}")
    self.completer, self.template, self.model_name = completer, template, model_name
    self.max_prompt_tokens, self.max_new_tokens = int(max_prompt_tokens), int(max_new_tokens)
    self.max_batch = int(max_batch)
    self.last_replies: list[list[str | None]] = []
    self.last_seconds = 0.0

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
    verdicts: list[Verdict | None] = [None] * len(calls)
    replies: list[str | None] = [None] * len(calls)
    jobs, prompts = [], []
    for j, (request, k) in enumerate(calls):
      ids = self.completer.chat_ids(build_messages(self.template, request, k))
      if len(ids) > self.max_prompt_tokens:
        verdicts[j] = Verdict.failed(f"judge prompt of {len(ids)} tokens exceeds "
                                     f"judge.max_prompt_tokens={self.max_prompt_tokens}")
      else:
        jobs.append(j)
        prompts.append(ids)
    order = list(range(len(jobs)))
    size = len(jobs)
    if self.max_batch and len(jobs) > self.max_batch:
      order.sort(key=lambda i: len(prompts[i]))
      size = self.max_batch
    for lo in range(0, len(order), max(size, 1)):
      chunk = order[lo:lo + size]
      for i, (verdict, reply) in zip(chunk, self._decode([prompts[i] for i in chunk])):
        verdicts[jobs[i]], replies[jobs[i]] = verdict, reply
    return verdicts, replies  # type: ignore[return-value]

  def _decode(self, prompts: list[list[int]]) -> list[tuple[Verdict, str | None]]:
    """(verdict, reply) of each prompt, all in one Completer call."""
    try:
      completions = self.completer.complete(prompts, max_new_tokens=self.max_new_tokens)
    except Exception as e:  # noqa: BLE001 - a decode fault (device OOM, ...) fails its rounds
      log.exception("local judge: the decode of %d calls failed", len(prompts))
      return [(Verdict.failed(f"local decode failed: {type(e).__name__}: {e}"), None)] * len(
          prompts)
    return [(_verdict(c), c.text) for c in completions]


def _verdict(completion: Completion) -> Verdict:
  verdict = parse_verdict(completion.text)
  if not verdict.ok and completion.finish_reason == "length":
    # Say why first: the reason itself would be cut at 300 characters.
    return Verdict.failed(f"reply cut at max_new_tokens ({len(completion.token_ids)} tokens); "
                          f"{verdict.error}")
  return verdict


@register_judge("local")
def make_local_judge(judge_config: Any, *, mesh: Any = None) -> LocalJudge:
  """The "local" backend: judge.hf_path loaded on `mesh` (every process, one SPMD decode)."""
  path = judge_config.hf_path
  if not path or not os.path.isdir(os.path.expanduser(path)):
    raise ValueError(f"judge.hf_path: the local judge needs a Hugging Face folder, got {path!r}")
  template = load_prompt(judge_config)
  check_template(template, judge_config.prompt_path or "the built-in judge prompt")
  max_prompt, max_new = int(judge_config.max_prompt_tokens), int(judge_config.max_new_tokens)
  completer = Completer.from_hf(os.path.expanduser(path), max_total_tokens=max_prompt + max_new,
                                mesh=mesh)
  return LocalJudge(completer, template,
                    model_name=os.path.basename(os.path.normpath(path)),
                    max_prompt_tokens=max_prompt, max_new_tokens=max_new,
                    max_batch=int(judge_config.max_batch))
