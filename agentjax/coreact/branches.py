"""Branch-point collection: at each step of the policy's trajectories, candidate next actions
ranked by J judges (Co-ReAct's training data; launch/collect_branches.py).

    collector = BranchCollector(completer, backend, ranker, CollectSettings.from_config(config))
    rows, stats = collector.collect(question_records)
    write_rows(path, rows)                                   # JSONL, atomically

For a batch of questions, step by step up to rollout.max_turns:

  1. sample candidate next actions from the policy (a Completer over the policy's parameters) at
     each of coreact.candidate_temperatures, coreact.candidates_per_temperature each (top_p =
     rollout.top_p; the Completer has no top-k). The context is the exact ids the rollout would
     have fed (agentjax/agent/rollout.py): prompt_ids, then each chosen action's sampled ids and
     its observation's ids (observation_ids of protocol.observation(docs), error_observation or
     the invalid message, cut to the token budget). A candidate's text is decoded from its exact
     ids (stop string and EOS included), as the rollout decodes a turn.
  2. deduplicate and keep up to coreact.num_candidates by greedy BM25 diversity
     (agentjax.rl.ranking.diverse_select).
  3. search every kept candidate's query (one batched call for the whole batch).
  4. rank the candidates by the J judges (agentjax/coreact/rankers.py), Borda (sum of ranks),
     expert ranking = average ranks of the Borda scores.
  5. write the row, unless the branch has < 2 distinct candidates or the judges failed on it;
     continue with the Borda rank-1 candidate (ties: the first in selection order; an unranked
     branch continues with its first candidate), its documents becoming the observation.

A trajectory ends at an answer, at the token budget (rollout.max_total_tokens), or after
max_turns steps. Row:

  {"id": "{question id}/{step}", "question", "turns", "max_calls", "protocol" (BranchContext),
   "candidates": [K texts], "judge_rankings": [J][K], "judges": [J identities], "borda": [K],
   "expert_ranking": [K], "values": [K] (oracle judges only: the noiseless value-to-go)}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from agentjax.agent.protocol import ANSWER, INVALID, SEARCH, Action, get_protocol
from agentjax.agent.rollout import TurnRecord, observation_ids, prompt_ids
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rankers import OracleRanker, branch_id
from agentjax.retrieval import SearchResponse
from agentjax.rl import ranking
from agentjax.sampling import decode_bytes

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CollectSettings:
  """What collection reads from the config (rollout.*, coreact.*, retrieval.topk, seed)."""
  protocol: str = "search_r1"
  max_turns: int = 4
  max_new_tokens: int = 256
  max_obs_tokens: int = 512
  max_total_tokens: int = 4096
  use_chat_template: bool = True
  top_p: float = 1.0
  topk: int = 3
  temperatures: tuple[float, ...] = (0.7, 1.0, 1.3)
  per_temperature: int = 4
  num_candidates: int = 4
  seed: int = 0

  def __post_init__(self):
    get_protocol(self.protocol)
    for name in ("max_turns", "max_new_tokens", "max_obs_tokens", "max_total_tokens", "topk"):
      if getattr(self, name) < 1:
        raise ValueError(f"config.rollout.{name} must be >= 1, got {getattr(self, name)}")
    if not self.temperatures or any(not t > 0 for t in self.temperatures):
      raise ValueError(f"config.coreact.candidate_temperatures must be temperatures > 0, got "
                       f"{self.temperatures}")
    if self.per_temperature < 1:
      raise ValueError(f"config.coreact.candidates_per_temperature must be >= 1, got "
                       f"{self.per_temperature}")
    if self.num_candidates < 2:
      raise ValueError(f"config.coreact.num_candidates must be >= 2, got {self.num_candidates}")

  @classmethod
  def from_config(cls, config: Any) -> "CollectSettings":
    r, c = config.rollout, config.coreact
    return cls(protocol=r.protocol, max_turns=int(r.max_turns),
               max_new_tokens=int(r.max_new_tokens), max_obs_tokens=int(r.max_obs_tokens),
               max_total_tokens=int(r.max_total_tokens),
               use_chat_template=bool(r.use_chat_template), top_p=float(r.top_p),
               topk=int(config.retrieval.topk),
               temperatures=tuple(float(t) for t in c.candidate_temperatures),
               per_temperature=int(c.candidates_per_temperature),
               num_candidates=int(c.num_candidates), seed=int(config.seed))


@dataclasses.dataclass
class CollectStats:
  """Counts of one collect() call (the launch script prints them)."""
  questions: int = 0
  steps: int = 0              # branch points visited (a question's step with an action taken)
  rows: int = 0               # branch points written
  few_candidates: int = 0     # not written: < 2 distinct candidates
  unranked: int = 0           # not written: the judges gave no ranking
  sampled: int = 0            # candidate actions sampled
  searches: int = 0           # candidate queries searched
  search_failures: int = 0
  answered: int = 0           # trajectories that ended with an answer

  def to_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class _Candidate:
  text: str
  ids: list[int]
  budget_cut: bool  # stopped by the context budget (rollout: "cut off by the token budget")


@dataclasses.dataclass
class _Trajectory:
  question: Mapping[str, Any]
  ids: list[int]
  turns: list[TurnRecord]
  done: bool = False


class BranchCollector:
  """The collection loop (module docstring) over a policy Completer, a search backend and a
  ranker."""

  def __init__(self, completer: Any, backend: Any, ranker: Any, settings: CollectSettings):
    if completer.max_total_tokens != settings.max_total_tokens:
      raise ValueError(f"the policy Completer's max_total_tokens ({completer.max_total_tokens}) "
                       f"must be config.rollout.max_total_tokens ({settings.max_total_tokens})")
    self.completer, self.backend, self.ranker, self.settings = completer, backend, ranker, settings
    self.tokenizer = completer.tokenizer
    self.protocol = get_protocol(settings.protocol)

  # ------------------------------------------------------------------ pieces

  def _decode(self, ids: Sequence[int]) -> str:
    return decode_bytes(self.completer.byte_table, ids)

  def _sample(self, trajectories: Sequence[_Trajectory], step: int) -> list[list[_Candidate]]:
    """Each trajectory's candidates: per temperature, per_temperature samples (one Completer
    call per temperature, every trajectory's rows in it)."""
    s = self.settings
    out: list[list[_Candidate]] = [[] for _ in trajectories]
    prompts = [t.ids for t in trajectories for _ in range(s.per_temperature)]
    for i, temperature in enumerate(s.temperatures):
      seed = zlib.crc32(f"{s.seed}/{step}/{i}".encode()) % (2 ** 31)
      completions = self.completer.complete(
          prompts, max_new_tokens=s.max_new_tokens, temperature=temperature, top_p=s.top_p,
          stop=self.protocol.stop_strings, seed=seed)
      for row, c in enumerate(completions):
        b = row // s.per_temperature
        cut = c.finish_reason == "length" and c.prompt_tokens + len(c.token_ids) >= \
            s.max_total_tokens
        out[b].append(_Candidate(self._decode(c.token_ids), list(c.token_ids), cut))
    return out

  def _search(self, queries: Sequence[str]) -> SearchResponse:
    """One batched call; a backend that raises or answers the wrong number of results fails
    every query (as the rollout's search does)."""
    if not queries:
      return SearchResponse([], [])
    try:
      response = self.backend.search(list(queries), self.settings.topk)
      if len(response.documents) != len(queries) or len(response.errors) != len(queries):
        raise ValueError(f"{len(response.documents)} results for {len(queries)} queries")
      return response
    except Exception as e:  # noqa: BLE001 - a retriever fault fails the queries, not the run
      return SearchResponse.from_exception(len(queries), e)

  def _observation(self, action: Action, docs: Sequence[Any], error: str | None) -> list[int]:
    s = self.settings
    if action.kind == SEARCH:
      parts = self.protocol.observation(docs) if error is None else \
          self.protocol.error_observation(error)
      return observation_ids(self.tokenizer, *parts, s.max_obs_tokens)
    if action.kind == INVALID:
      return list(self.tokenizer.encode(self.protocol.invalid_observation(),
                                         add_special_tokens=False))
    return []

  # ------------------------------------------------------------------ the loop

  def collect(self, questions: Sequence[Mapping[str, Any]]
              ) -> tuple[list[dict[str, Any]], CollectStats]:
    """Rows of every branch point of the questions' trajectories (in question then step order),
    and the counts."""
    s = self.settings
    stats = CollectStats(questions=len(questions))
    trajectories = []
    for q in questions:
      ids = prompt_ids(self.tokenizer, self.protocol, str(q["question"]), s.use_chat_template)
      if len(ids) >= s.max_total_tokens:
        raise ValueError(f"question {q.get('id')!r}: prompt of {len(ids)} tokens does not fit "
                         f"rollout.max_total_tokens={s.max_total_tokens}")
      trajectories.append(_Trajectory(dict(q), ids, []))
    rows_by_question: list[list[dict[str, Any]]] = [[] for _ in questions]
    identities = self.ranker.identities()
    oracle = isinstance(self.ranker, OracleRanker)

    for step in range(s.max_turns):
      live = [b for b, t in enumerate(trajectories) if not t.done]
      if not live:
        break
      sampled = self._sample([trajectories[b] for b in live], step)
      stats.sampled += sum(len(c) for c in sampled)
      stats.steps += len(live)
      contexts, kept, actions = [], [], []
      for b, cands in zip(live, sampled):
        t = trajectories[b]
        ctx = BranchContext(question=t.question, turns=tuple(t.turns), max_calls=s.max_turns,
                            protocol=s.protocol)
        keep = ranking.diverse_select([c.text for c in cands], s.num_candidates) or [0]
        contexts.append(ctx)
        kept.append([cands[i] for i in keep])
        actions.append([ctx.parse(cands[i].text) for i in keep])

      # Every kept candidate's query, one call.
      jobs = [(i, k) for i, acts in enumerate(actions) for k, a in enumerate(acts)
              if a.kind == SEARCH]
      response = self._search([actions[i][k].content for i, k in jobs])
      stats.searches += len(jobs)
      stats.search_failures += sum(e is not None for e in response.errors)
      docs = [[() for _ in acts] for acts in actions]
      errors: list[list[str | None]] = [[None for _ in acts] for acts in actions]
      for (i, k), d, e in zip(jobs, response.documents, response.errors):
        docs[i][k], errors[i][k] = tuple(d), e

      ranked = [i for i in range(len(live)) if len(kept[i]) >= 2]
      stats.few_candidates += len(live) - len(ranked)
      rankings = self.ranker.rank([contexts[i] for i in ranked],
                                  [[c.text for c in kept[i]] for i in ranked],
                                  [docs[i] for i in ranked]) if ranked else []
      values = self.ranker.values([contexts[i] for i in ranked],
                                  [[c.text for c in kept[i]] for i in ranked],
                                  [docs[i] for i in ranked]) if oracle and ranked else []
      choice = [0] * len(live)
      for n, i in enumerate(ranked):
        judge_rankings = rankings[n]
        if judge_rankings is None:
          stats.unranked += 1
          continue
        scores = np.asarray(ranking.borda(np.asarray(judge_rankings, np.float32)))
        expert = np.asarray(ranking.borda_to_ranking(scores))
        choice[i] = int(np.argmin(scores))  # the first of the best on ties
        ctx = contexts[i]
        row = {"id": branch_id(ctx), **ctx.to_json(),
               "candidates": [c.text for c in kept[i]],
               "judge_rankings": [[float(r) for r in judge] for judge in judge_rankings],
               "judges": identities, "borda": [float(x) for x in scores],
               "expert_ranking": [float(x) for x in expert]}
        if oracle:
          row["values"] = [float(v) for v in values[n]]
        rows_by_question[live[i]].append(row)
        stats.rows += 1

      for i, b in enumerate(live):
        self._advance(trajectories[b], kept[i][choice[i]], actions[i][choice[i]],
                      docs[i][choice[i]], errors[i][choice[i]], stats)
    return [row for rows in rows_by_question for row in rows], stats

  def _advance(self, t: _Trajectory, cand: _Candidate, action: Action, docs: Sequence[Any],
               error: str | None, stats: CollectStats) -> None:
    """Feeds the chosen candidate and its observation to trajectory t (as the rollout does)."""
    s = self.settings
    t.ids = t.ids + cand.ids
    if cand.budget_cut:
      t.turns.append(TurnRecord(text=cand.text, action=Action(INVALID,
                                                               "cut off by the token budget")))
      t.done = True
      return
    obs = self._observation(action, docs, error)
    room = s.max_total_tokens - len(t.ids)
    if obs and len(obs) >= room:  # no room to generate after it: keep what fits and stop
      obs = obs[:max(0, room)]
      t.done = True
    t.ids = t.ids + obs
    t.turns.append(TurnRecord(text=cand.text, action=action,
                              documents=tuple(docs) if action.kind == SEARCH and error is None
                              else (), observation=self._decode(obs), search_error=error))
    if action.kind == ANSWER:
      t.done = True
      stats.answered += 1


def write_rows(path: str, rows: Sequence[Mapping[str, Any]]) -> str:
  """Writes rows as JSONL at path atomically (a temporary file renamed over it); returns path."""
  path = os.path.expanduser(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  os.replace(tmp, path)
  return path
