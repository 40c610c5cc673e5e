"""Judges in ranking mode: J rankings of a branch point's K candidate actions (Co-ReAct collection).

    ranker = build_ranker(config, mesh=mesh)                  # config.coreact.judge_backend
    rankings = ranker.rank(contexts, candidates, documents)   # [branch][judge][K] | None
    ranker.identities()                                        # one identity per judge

A ranking holds K ranks, 1 = best, ties averaged (agentjax.rl.ranking.average_ranks). Borda over
the J judges (ranking.borda) and its average ranks (ranking.borda_to_ranking) are the expert
ranking the rubric reward compares with (launch/collect_branches.py, agentjax/coreact/branches.py).

Backends (registry RANKERS):

  oracle  SynthWorld's value-to-go from the question's gold chain (ours). With H hops, R of them
          resolved before the step (a gold document seen: agentjax/judge/oracle.py's resolution
          rule, by title), and gamma = coreact.oracle_gamma, a candidate's value is gamma^(steps
          to a correct answer if it is followed by the best play):
            a correct answer (EM against golden_answers)       gamma^1 (also a lucky guess, R < H)
            a wrong answer                                     0
            a search retrieving a gold document of a hop not
              resolved before the step                         gamma^(1 + (H - R - 1) + 1)
            any other search (a repeat, a useless query, a
              failed search) or an invalid action              gamma^(1 + (H - R) + 1)
          so a query that retrieves the next needed document beats one that repeats a search,
          and a correct answer after the last hop beats an early wrong one. Judge j adds
          N(0, coreact.oracle_noise) noise to the values (rng seeded by (config.seed, the branch
          id "{question id}/{step}", j)) and ranks them descending; with noise 0 the J judges
          agree and equal values stay tied. A candidate's documents are what its search returned
          (the collector runs every candidate's query). A question without a usable gold chain
          gives None (the branch is not written).
  montecarlo  graded values (ours; issue: the oracle's value-to-go ties in most rows): a
          candidate's value is the success rate of continuations of the policy after it
          (config.coreact.value_rollouts per judge, sampled at coreact.value_temperature, each
          run to an answer or to rollout.max_turns; the collector runs them, batched:
          BranchCollector._continuation_returns), scored by coreact.value_metric ("em": success
          1/0; "f1") against golden_answers. An answer candidate needs no continuation: its own
          score. Judge j ranks by the mean of its own value_rollouts continuations (independent
          samples, so judges disagree where the estimate is uncertain); "values" is the mean of
          all J x value_rollouts.
  openai  an LLM per judge at config.judge's endpoint: coreact.judge_models (comma-separated, one
          model per judge) or judge.model for every judge (agentjax/judge/chat.py, its retries).
  local   config.judge.hf_path, greedy (all judges are the one model).

The LLM prompt (English, ours): the question, the trajectory so far (`<think>` stripped), the
candidates lettered A, B, ... cut to their first action (answers shown: the judge ranks whether
an answer is right), and a reply {"ranking": [rank of A, ...]} (1 = best, ties allowed). A
branch is None when any judge's reply is unusable (the Borda needs all J); never raises on a
fault of a model or its server. Judges with the same model are asked once when
config.judge.temperature is 0 (greedy: the same reply); sampled judges (the code's 0.7) are each
asked.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from agentjax.agent.protocol import ANSWER, SEARCH
from agentjax.coreact.appliers import candidates_block, context_block, letters, parse_ranking
from agentjax.coreact import VALUE_METRICS, build_named
from agentjax.coreact.context import BranchContext
from agentjax.judge.base import prompt_sha256
from agentjax.judge.oracle import gold_chain, hop_index, resolve
from agentjax.judge.render import reply_object
from agentjax.rl import ranking
from agentjax.rl.rewards import exact_match, f1_score

log = logging.getLogger(__name__)

Rankings = list[list[float]]  # [judge][K]


@runtime_checkable
class Ranker(Protocol):
  def rank(self, contexts: Sequence[BranchContext], candidates: Sequence[Sequence[str]],
           documents: Sequence[Sequence[Sequence[Any]]] | None = None
           ) -> list[Rankings | None]: ...

  def identities(self) -> list[dict[str, str]]: ...


def branch_id(ctx: BranchContext) -> str:
  """"{question id}/{step}": a branch point's id (the collected row's "id")."""
  return f"{ctx.question.get('id', '')}/{ctx.step}"


# ---------------------------------------------------------------------------------------------
# oracle
# ---------------------------------------------------------------------------------------------


def oracle_values(ctx: BranchContext, candidates: Sequence[str],
                  documents: Sequence[Sequence[Any]], gamma: float) -> list[float] | None:
  """Each candidate's value-to-go (module docstring), or None without a usable gold chain.

  Args:
    ctx: the branch point (its question needs "chain", "hops", "golden_answers").
    candidates: K action texts (parsed with ctx.parse).
    documents: K sequences of retrieval.Document: what candidate k's search returned (empty for
      an answer, an invalid action or a failed search).
  """
  gold, error = gold_chain(ctx.question)
  golds = ctx.question.get("golden_answers") or []
  if error is not None or isinstance(golds, str) or not golds:
    return None
  if len(documents) != len(candidates):
    raise ValueError(f"oracle: {len(documents)} document lists for {len(candidates)} candidates")
  hop_of = hop_index(gold)
  resolved = [False] * len(gold)
  for turn in ctx.turns:
    resolve(hop_of, resolved, turn.documents)
  hops, done = len(gold), sum(resolved)
  values = []
  for text, docs in zip(candidates, documents):
    action = ctx.parse(text)
    if action.kind == ANSWER:
      values.append(gamma if exact_match(action.content, list(golds)) else 0.0)
    elif action.kind == SEARCH and resolve(hop_of, list(resolved), docs):
      values.append(gamma ** (1 + (hops - done - 1) + 1))
    else:
      values.append(gamma ** (1 + (hops - done) + 1))
  return values


class OracleRanker:
  """num_judges noisy copies of the value-to-go ranking (module docstring)."""

  def __init__(self, num_judges: int, gamma: float, noise: float, seed: int = 0):
    if num_judges < 1:
      raise ValueError(f"config.coreact.num_judges must be >= 1, got {num_judges}")
    if not 0 < gamma < 1:
      raise ValueError(f"config.coreact.oracle_gamma must be in (0, 1), got {gamma}")
    if not noise >= 0:
      raise ValueError(f"config.coreact.oracle_noise must be >= 0, got {noise}")
    self.num_judges, self.gamma, self.noise, self.seed = int(num_judges), gamma, noise, int(seed)

  def identities(self) -> list[dict[str, str]]:
    return [{"backend": "oracle", "model": f"synthworld-value-to-go/gamma={self.gamma:g}/"
             f"noise={self.noise:g}/judge={j}", "prompt_sha256": "-"}
            for j in range(self.num_judges)]

  def values(self, contexts, candidates, documents) -> list[list[float] | None]:
    return [oracle_values(c, k, d, self.gamma)
            for c, k, d in zip(contexts, candidates, documents)]

  def judge_values(self, ctx: BranchContext, values: Sequence[float]) -> np.ndarray:
    """[J, K] float64: each judge's noisy values (noise 0: the values J times)."""
    values = np.asarray(values, np.float64)
    out = np.tile(values, (self.num_judges, 1))
    if self.noise > 0:
      key = zlib.crc32(branch_id(ctx).encode("utf-8"))
      for j in range(self.num_judges):
        out[j] += np.random.default_rng([self.seed, key, j]).normal(0.0, self.noise, len(values))
    return out

  def rank(self, contexts, candidates, documents=None):
    if documents is None:
      raise ValueError("the oracle ranker needs each candidate's search results (documents)")
    out: list[Rankings | None] = []
    for ctx, values in zip(contexts, self.values(contexts, candidates, documents)):
      if values is None:
        out.append(None)
        continue
      ranks = np.asarray(ranking.average_ranks(self.judge_values(ctx, values), descending=True))
      out.append(ranks.astype(float).tolist())
    return out


# ---------------------------------------------------------------------------------------------
# Monte-Carlo continuations
# ---------------------------------------------------------------------------------------------

class MonteCarloRanker:
  """num_judges rankings from policy continuations (module docstring, "montecarlo"). The
  collector asks for `continuations` returns per candidate and passes them to rank_returns."""

  def __init__(self, num_judges: int, rollouts: int, temperature: float = 1.0,
               metric: str = "em"):
    if num_judges < 1:
      raise ValueError(f"config.coreact.num_judges must be >= 1, got {num_judges}")
    if rollouts < 1:
      raise ValueError(f"config.coreact.value_rollouts must be >= 1, got {rollouts}")
    if not temperature > 0:
      raise ValueError(f"config.coreact.value_temperature must be > 0, got {temperature}")
    if metric not in VALUE_METRICS:
      raise ValueError(f"config.coreact.value_metric={metric!r}: must be one of "
                       f"{list(VALUE_METRICS)}")
    self.num_judges, self.rollouts = int(num_judges), int(rollouts)
    self.temperature, self.metric = float(temperature), metric
    self.continuations = self.num_judges * self.rollouts

  def identities(self) -> list[dict[str, str]]:
    return [{"backend": "montecarlo", "model": f"policy-continuations/k={self.rollouts}/"
             f"temperature={self.temperature:g}/metric={self.metric}/judge={j}",
             "prompt_sha256": "-"} for j in range(self.num_judges)]

  def score(self, answer: str, golds: Sequence[str]) -> float:
    """A continuation's return: its answer against the golds (value_metric)."""
    return float(exact_match(answer, list(golds)) if self.metric == "em"
                 else f1_score(answer, list(golds)))

  def rank_returns(self, returns: Sequence[Sequence[float]]) -> tuple[Rankings, list[float]]:
    """returns [K][continuations] of one branch point -> ([J][K] rankings: judge j's average
    ranks of the mean of its slice j * rollouts:(j + 1) * rollouts, 1 = best; [K] values: the
    mean of every return)."""
    r = np.asarray(returns, np.float64)
    if r.ndim != 2 or r.shape[1] != self.continuations:
      raise ValueError(f"montecarlo: returns of shape {r.shape}, expected [K, "
                       f"{self.continuations}]")
    means = r.reshape(r.shape[0], self.num_judges, self.rollouts).mean(-1).T  # [J, K]
    ranks = np.asarray(ranking.average_ranks(means, descending=True))
    return ranks.astype(float).tolist(), r.mean(-1).tolist()

  def rank(self, contexts, candidates, documents=None):
    raise ValueError("the montecarlo ranker ranks from policy continuations: collect with "
                     "BranchCollector (launch/collect_branches.py), which runs them")


# ---------------------------------------------------------------------------------------------
# LLM judges
# ---------------------------------------------------------------------------------------------

RANK_INSTRUCTION = (
    "You judge candidate next actions of a search agent answering a question with a search "
    "engine. Rank the candidates by how well each moves the agent towards a correct, "
    "well-supported answer with few searches: a search for missing information beats a repeated "
    "or useless search; a correct answer once the evidence is found beats everything else; a "
    "wrong or unsupported answer is worst. Rank 1 = best; equal candidates may share a rank.")


def rank_messages(ctx: BranchContext, candidates: Sequence[str]) -> list[dict[str, str]]:
  example = ", ".join(f"<rank of {x}>" for x in letters(len(candidates)))
  text = (f"{RANK_INSTRUCTION}\n\n{context_block(ctx)}\n\nCandidate next actions:\n"
          f"{candidates_block(ctx, candidates)}\n\nReply with JSON only: "
          f"{{\"ranking\": [{example}]}}")
  return [{"role": "user", "content": text}]


def parse_rankings(reply: str | None, k: int) -> tuple[list[float] | None, str | None]:
  """(K average ranks, None) from a judge's reply, or (None, why)."""
  obj, why, _ = reply_object(reply)
  if obj is None:
    return None, why
  ranks, why = parse_ranking(obj, k)
  return (None, why) if ranks is None else (list(ranks), None)


class LLMRanker:
  """J judges over chat backends (agentjax.judge.chat), one per judge; judges sharing a backend
  object are asked once."""

  def __init__(self, backends: Sequence[Any]):
    if not backends:
      raise ValueError("config.coreact.num_judges must be >= 1")
    self.backends = list(backends)
    self.calls = self.failures = 0

  def identities(self) -> list[dict[str, str]]:
    return [{**b.identity(), "prompt_sha256": prompt_sha256(RANK_INSTRUCTION)}
            for b in self.backends]

  def rank(self, contexts, candidates, documents=None):
    del documents  # the judges rank the actions, not their results
    messages = [rank_messages(c, list(k)) for c, k in zip(contexts, candidates)]
    by_backend: dict[int, list[list[float] | None]] = {}
    first = None
    for backend in self.backends:
      if id(backend) in by_backend:
        continue
      got = []
      for i, reply in enumerate(backend.chat(messages) if messages else []):
        ranks, why = parse_rankings(reply.text, len(candidates[i])) if reply.ok else \
            (None, reply.error)
        first = first or why
        got.append(ranks)
      by_backend[id(backend)] = got
      self.calls += len(got)
      self.failures += sum(r is None for r in got)
    out: list[Rankings | None] = []
    for i in range(len(messages)):
      rows = [by_backend[id(b)][i] for b in self.backends]
      out.append(None if any(r is None for r in rows) else rows)
    if first is not None:
      log.warning("ranking judges: %d of %d branches unusable; first: %s",
                  sum(r is None for r in out), len(out), first)
    return out


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def _oracle(config: Any, mesh: Any = None) -> OracleRanker:
  del mesh
  c = config.coreact
  return OracleRanker(c.num_judges, float(c.oracle_gamma), float(c.oracle_noise), config.seed)


def _montecarlo(config: Any, mesh: Any = None) -> MonteCarloRanker:
  del mesh
  c = config.coreact
  return MonteCarloRanker(c.num_judges, int(c.value_rollouts), float(c.value_temperature),
                          str(c.value_metric))


def _openai(config: Any, mesh: Any = None) -> LLMRanker:
  from agentjax.judge.chat import OpenAIChat
  del mesh
  c = config.coreact
  models = [m.strip() for m in str(c.judge_models).split(",") if m.strip()]
  if models and len(models) != c.num_judges:
    raise ValueError(f"config.coreact.judge_models names {len(models)} models for "
                     f"coreact.num_judges={c.num_judges} judges (one model per judge)")
  models = models or [config.judge.model] * c.num_judges
  if float(config.judge.temperature) > 0:  # sampled judges: each its own draw, even one model
    return LLMRanker([OpenAIChat(config.judge, model=m) for m in models])
  made: dict[str, Any] = {}
  for m in models:
    if m not in made:
      made[m] = OpenAIChat(config.judge, model=m)
  return LLMRanker([made[m] for m in models])


def _local(config: Any, mesh: Any = None) -> LLMRanker:
  from agentjax.judge.chat import LocalChat
  if str(config.coreact.judge_models).strip():
    raise ValueError("config.coreact.judge_models selects openai models; the local judges are "
                     "config.judge.hf_path")
  backend = LocalChat.from_config(config.judge, mesh=mesh)
  return LLMRanker([backend] * int(config.coreact.num_judges))


RANKERS: dict[str, Callable[..., Ranker]] = {"oracle": _oracle, "montecarlo": _montecarlo,
                                             "openai": _openai, "local": _local}


def build_ranker(config: Any, mesh: Any = None) -> Ranker:
  """The judges named by config.coreact.judge_backend."""
  return build_named(RANKERS, "coreact.judge_backend", config, mesh)


__all__ = ["RANKERS", "LLMRanker", "MonteCarloRanker", "OracleRanker", "Ranker", "branch_id",
           "build_ranker",
           "oracle_values", "parse_rankings", "rank_messages"]
