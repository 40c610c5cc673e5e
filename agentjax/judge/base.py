"""The judge interface: per-round verdicts on search-agent trajectories (CW-GRPO, Co-ReAct).

    judge = build_judge(config.judge, mesh=mesh)          # a backend from the registry
    verdicts = judge.judge([JudgeRequest(question, turns), ...])
    verdicts[i][k]  # Verdict of round k of trajectory i (one per turn, the answer round included)

A round is one turn of the rollout (agentjax.agent.TurnRecord): the agent's generated text (its
<think> and its action) and the observation that came back. For round k the judge sees the
question and rounds 0..k, and scores only round k (its latest action and what it retrieved):

  retrieval = 1 iff what round k retrieved is relevant to the question AND new (not obtained in
              an earlier round);
  thinking  = 1 iff round k's reasoning is grounded in what was retrieved before AND its action is
              useful (a search aims at missing information; an answer is supported).

Backends (`config.judge.backend`, registry `JUDGES`): "openai" (any OpenAI-compatible endpoint),
"local" (a Flax Qwen from a Hugging Face folder on the run's mesh), "oracle" (SynthWorld's gold
evidence chain). A backend never raises on a fault of the judge model or its server: a failed or
unparseable call gives that round Verdict(0, 0, ok=False, error=...), which the trainer counts
(`judge/failures`). Only programmer errors (a bad config) raise, when the judge is built.

Layering: judge sits beside agent and retrieval (it reads their records), below rl and train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from agentjax.agent.trajectories import TurnRecord
from agentjax.registry import Registry


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
  """One trajectory to judge round by round.

  question: the question record ("question", "golden_answers"; SynthWorld's also "chain",
    "relations", "hops", which the oracle reads).
  turns: the trajectory's rounds, in order (TurnRecord: generated text, parsed action,
    documents, observation).
  """
  question: Mapping[str, Any]
  turns: Sequence[TurnRecord]


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The judge's scores of one round. A failed call is Verdict(0, 0, ok=False, error=...)."""
  retrieval: int
  thinking: int
  analysis: str = ""
  ok: bool = True
  error: str | None = None

  @classmethod
  def failed(cls, error: str) -> "Verdict":
    return cls(0, 0, "", ok=False, error=error[:300])


@runtime_checkable
class Judge(Protocol):
  """What the trainer calls. `judge` returns len(requests) lists, list i holding one Verdict per
  turn of requests[i]; every call of the batch goes out together (a server sees them in flight
  at once, a local model decodes them in one batch)."""

  def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]: ...

  def identity(self) -> dict[str, str]:
    """{"backend", "model", "prompt_sha256"}: recorded with every run and results file."""
    ...


def prompt_sha256(text: str) -> str:
  """The hash recorded as a judge's prompt identity (first 16 hex digits of SHA-256)."""
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# Built-in backends, imported when first built (the openai client is only needed by "openai").
BUILTIN_JUDGES = {"openai": "agentjax.judge.openai_judge", "local": "agentjax.judge.local",
                  "oracle": "agentjax.judge.oracle"}
# name -> factory(judge_config, mesh=None) -> Judge
JUDGES = Registry("judge backend", BUILTIN_JUDGES)


def register_judge(name: str):
  """Decorator: register a judge factory `factory(judge_config, *, mesh=None) -> Judge`."""
  return JUDGES.decorator(name)


def build_judge(judge_config: Any, *, mesh: Any = None) -> Judge | None:
  """The backend named by judge_config.backend ("none": no judge, returns None)."""
  name = judge_config.backend
  if name == "none":
    return None
  try:
    factory = JUDGES[name]  # a built-in one imported (and registered) here
  except KeyError:
    raise ValueError(f"judge.backend: unknown backend {name!r}; known: "
                     f"{sorted(JUDGES.known() + ['none'])}") from None
  return factory(judge_config, mesh=mesh)


DEFAULT_PROMPT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts",
                                   "cw_grpo.md")


def load_prompt(judge_config: Any) -> str:
  """The judge prompt template: judge.prompt_path, or the built-in prompts/cw_grpo.md."""
  path = judge_config.prompt_path or DEFAULT_PROMPT_PATH
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise ValueError(f"judge.prompt_path: cannot read {path!r}: {e}") from None


def judge_identity(judge_config: Any) -> dict[str, Any]:
  """What identifies a run's judge, without building it (no model is loaded): backend, model,
  prompt hash and the study noise. Recorded in the run's config.json and every results file."""
  backend = judge_config.backend
  if backend == "none":
    return {"backend": "none"}
  if backend == "oracle":
    model, prompt = "synthworld-gold-chain", "-"
  else:
    model = judge_config.model if backend == "openai" else \
        os.path.basename(os.path.normpath(judge_config.hf_path or "")) or "?"
    prompt = prompt_sha256(load_prompt(judge_config))
  return {"backend": backend, "model": model, "prompt_sha256": prompt,
          "noise": judge_config.noise, "noise_p": float(judge_config.noise_p)}
