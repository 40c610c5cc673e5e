"""Branch-point collection: at each step of the policy's trajectories, candidate next actions
ranked by J judges (Co-ReAct's training data; launch/collect_branches.py).

    collector = BranchCollector(completer, backend, ranker, CollectSettings.from_config(config))
    rows, stats = collector.collect(question_records)
    write_rows(path, rows)                                   # JSONL, atomically

For a batch of questions, step by step up to rollout.max_turns:

  1. sample candidate next actions from the policy (a Completer over the policy's parameters) at
     each of coreact.candidate_temperatures, coreact.candidates_per_temperature each (top_p =
     rollout.top_p; the Completer has no top-k). The context is the exact ids the rollout would
     have fed (agentjax/agent/rollout.py): prompt_ids, then each chosen action's ids and its
     observation's ids (observation_ids of protocol.observation(docs), error_observation or the
     invalid message, cut to the token budget). A candidate's text is decoded from its exact
     ids (stop string and EOS included), as the rollout decodes a turn.
     Extra generators (coreact.extra_generators; build_generators) sample as many again each,
     at the same temperatures: they continue the policy's context ids decoded to text (chat
     markup included, as the policy would continue it), a Hugging Face folder (HFGenerator)
     encoding it with its own tokenizer, "openai:<model>" (OpenAIGenerator) sending it to
     config.judge's endpoint's /v1/completions. Their texts end at the stop string as the
     policy's do (restore_stop), without an EOS. A generator's request that fails (server down,
     a prompt too long for it) contributes no candidates; a branch point where one did is
     counted in CollectStats.generator_failures and logged; collection goes on.
  2. deduplicate and keep up to coreact.num_candidates by greedy BM25 diversity
     (agentjax.rl.ranking.diverse_select).
  3. search every kept candidate's query (one batched call for the whole batch).
  4. rank the candidates by the J judges (agentjax/coreact/rankers.py), Borda (sum of ranks),
     expert ranking = average ranks of the Borda scores. Montecarlo judges rank by the returns
     of policy continuations after each candidate, which the collector runs here
     (_continuation_returns: batched Completer calls, one search call per step).
  5. write the row, unless the branch has < 2 distinct candidates or the judges failed on it;
     continue with the Borda rank-1 candidate (ties: the first in selection order; an unranked
     branch continues with its first candidate), its documents becoming the observation. The
     trajectory's ids grow by the candidate's ids: the policy's sampled ids, or for an extra
     generator's candidate its text encoded with the policy's tokenizer (the policy never
     sampled those ids), cut at the token budget like a policy turn.

A trajectory ends at an answer, at the token budget (rollout.max_total_tokens), or after
max_turns steps. Row:

  {"id": "{question id}/{step}", "question", "turns", "max_calls", "protocol" (BranchContext),
   "candidates": [K texts], "sources": [K generator names: "policy", an extra generator's
   entry of coreact.extra_generators], "judge_rankings": [J][K], "judges": [J identities],
   "borda": [K], "expert_ranking": [K], "values": [K] (oracle judges: the noiseless
   value-to-go; montecarlo judges: the mean return of every continuation), "value_returns":
   [K][J x value_rollouts] (montecarlo judges: each continuation's return, judge j's the j-th
   slice of value_rollouts)}
"""

from __future__ import annotations

import dataclasses
import logging
import os
import zlib
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from agentjax.agent.protocol import ANSWER, INVALID, SEARCH, Action, get_protocol, parse_action
from agentjax.agent.rollout import observation_ids, prompt_ids
from agentjax.agent.trajectories import TurnRecord
from agentjax.coreact.context import BranchContext
from agentjax.jsonl import write_jsonl_atomic
from agentjax.coreact.rankers import MonteCarloRanker, OracleRanker, branch_id
from agentjax.judge.chat import short
from agentjax.retrieval import SearchResponse
from agentjax.retrieval.base import guarded_search
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
  value_batch: int = 64  # rows per Completer call of a montecarlo ranker's continuations

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
    if self.value_batch < 1:
      raise ValueError(f"config.coreact.value_batch must be >= 1, got {self.value_batch}")
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
               num_candidates=int(c.num_candidates), seed=int(config.seed),
               value_batch=int(c.value_batch))


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
  extra_sampled: int = 0      # of `sampled`, from extra generators
  generator_failures: int = 0  # (extra generator, branch point) pairs with a failed request
  value_samples: int = 0      # montecarlo: continuation actions sampled
  value_searches: int = 0     # montecarlo: continuation queries searched

  def to_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)


POLICY = "policy"  # the source name of the policy's own candidates


@dataclasses.dataclass
class _Candidate:
  text: str
  ids: list[int]    # what the trajectory is fed when this candidate continues it (policy ids)
  budget_cut: bool  # stopped by the context budget (rollout: "cut off by the token budget")
  source: str = POLICY


@dataclasses.dataclass
class _Trajectory:
  question: Mapping[str, Any]
  ids: list[int]
  turns: list[TurnRecord]
  done: bool = False


# ---------------------------------------------------------------------------------------------
# Extra candidate generators (coreact.extra_generators)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Generated:
  """One context's samples from an extra generator: the texts that came back, and why some (or
  all) did not (None when every request succeeded)."""
  texts: tuple[str, ...] = ()
  error: str | None = None


class CandidateGenerator(Protocol):
  """An extra source of candidate actions: continues context texts (the policy's context ids
  decoded), n samples each; one Generated per context, in order; never raises on a fault of its
  model or server."""
  name: str

  def sample(self, contexts: Sequence[str], *, n: int, temperature: float, top_p: float,
             max_new_tokens: int, stop: Sequence[str], seed: int) -> list[Generated]: ...


def restore_stop(text: str, finish_reason: str | None, stop_reason: str | None,
                 stops: Sequence[str]) -> str:
  """A text completion as the policy's own candidate reads: with the stop string that ended it.

  OpenAI-style servers return the text cut before the stop string. The stop is the server's
  `stop_reason` when it names one of `stops`; otherwise (OpenAI, agentjax's server) the stop
  string "</x>" whose opening tag "<x>" the text opened last and left open, since generation
  stopped at the first stop string (a completion that ended at EOS inside an open tag reads as
  if it had closed it). finish_reason other than "stop" (max_tokens): the text as it is.
  """
  if finish_reason != "stop" or not stops:
    return text
  if stop_reason in stops:
    return text + stop_reason
  best = (-1, "")
  for stop in stops:
    if stop.startswith("</"):
      at = text.rfind("<" + stop[2:])
      if at > best[0] and stop not in text[at:]:
        best = (at, stop)
  return text + best[1]


class HFGenerator:
  """A Hugging Face folder's model as an extra generator: a Completer that encodes the context
  text with its own tokenizer (a context that its tokenizer makes too long for its
  max_total_tokens fails alone). A candidate is its sampled ids decoded (the stop string
  included, as the policy's), without a final EOS."""

  def __init__(self, completer: Any, name: str):
    self.completer, self.name = completer, name
    self._eos = frozenset(int(i) for i in completer.eos_ids)

  @classmethod
  def from_hf(cls, path: str, *, max_total_tokens: int, name: str | None = None
              ) -> "HFGenerator":
    from agentjax.sampling.complete import Completer

    completer = Completer.from_hf(os.path.expanduser(path), max_total_tokens=max_total_tokens)
    return cls(completer, path if name is None else name)

  def sample(self, contexts: Sequence[str], *, n: int, temperature: float, top_p: float,
             max_new_tokens: int, stop: Sequence[str], seed: int) -> list[Generated]:
    out = [Generated() for _ in contexts]
    rows, prompts = [], []
    for b, text in enumerate(contexts):
      ids = self.completer.encode(text)
      if len(ids) >= self.completer.max_total_tokens:
        out[b] = Generated(error=f"prompt of {len(ids)} tokens does not fit its "
                                 f"max_total_tokens={self.completer.max_total_tokens}")
      else:
        rows.append(b)
        prompts += [ids] * n
    if not rows:
      return out
    try:
      completions = self.completer.complete(prompts, max_new_tokens=max_new_tokens,
                                            temperature=temperature, top_p=top_p, stop=stop,
                                            seed=seed)
    except Exception as e:  # noqa: BLE001 - a decode fault fails this call's contexts only
      why = f"decode failed: {type(e).__name__}: {short(str(e))}"
      return [Generated(error=why) if b in rows else g for b, g in enumerate(out)]
    for j, b in enumerate(rows):
      texts = []
      for c in completions[j * n:(j + 1) * n]:
        ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] in self._eos else c.token_ids
        texts.append(decode_bytes(self.completer.byte_table, ids))
      out[b] = Generated(tuple(texts))
    return out


class OpenAIGenerator:
  """An OpenAI-compatible /v1/completions endpoint as an extra generator (agentjax.judge.chat
  OpenAIText: config.judge's connection, retries and concurrency): one request per sample, the
  context text as the prompt (the server tokenizes it), sample j's seed = seed + j."""

  def __init__(self, endpoint: Any, name: str):
    self.endpoint, self.name = endpoint, name

  def sample(self, contexts: Sequence[str], *, n: int, temperature: float, top_p: float,
             max_new_tokens: int, stop: Sequence[str], seed: int) -> list[Generated]:
    from agentjax.judge.chat import TextRequest

    requests = [TextRequest(text, max_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, stop=tuple(stop), seed=(seed + j) % 2 ** 31)
                for text in contexts for j in range(n)]
    replies = self.endpoint.complete(requests)
    out = []
    for b in range(len(contexts)):
      got = replies[b * n:(b + 1) * n]
      out.append(Generated(
          tuple(restore_stop(r.text, r.finish_reason, r.stop_reason, stop) for r in got if r.ok),
          next((r.error for r in got if not r.ok), None)))
    return out


OPENAI_PREFIX = "openai:"


def build_generators(config: Any) -> list[Any]:
  """The extra generators of config.coreact.extra_generators (comma-separated: Hugging Face
  folders, loaded with rollout.max_total_tokens, or "openai:<model>" for config.judge's
  endpoint), each named by its entry. Every entry is checked before any model is loaded."""
  names = [x.strip() for x in str(config.coreact.extra_generators or "").split(",") if x.strip()]
  for name in names:
    if name.startswith(OPENAI_PREFIX):
      if not name[len(OPENAI_PREFIX):].strip():
        raise ValueError(f"config.coreact.extra_generators: {name!r} names no model "
                         f"(\"openai:<model>\")")
    elif not os.path.isdir(os.path.expanduser(name)):
      raise ValueError(f"config.coreact.extra_generators: {name!r} is neither "
                       f"\"openai:<model>\" nor a Hugging Face folder")
  _check_names(names)
  gens: list[Any] = []
  for name in names:
    if name.startswith(OPENAI_PREFIX):
      from agentjax.judge.chat import OpenAIText

      gens.append(OpenAIGenerator(OpenAIText(config.judge,
                                             model=name[len(OPENAI_PREFIX):].strip()), name))
    else:
      gens.append(HFGenerator.from_hf(name, max_total_tokens=int(config.rollout.max_total_tokens)))
  return gens


def _check_names(names: Sequence[str]) -> None:
  seen = set()
  for name in names:
    if name == POLICY or name in seen:
      raise ValueError(f"config.coreact.extra_generators: {name!r} is "
                       f"{'the policy' if name == POLICY else 'given twice'}; each extra "
                       f"generator is named once (its entry) and \"{POLICY}\" names the policy")
    seen.add(name)


class BranchCollector:
  """The collection loop (module docstring) over a policy Completer, a search backend, a
  ranker and extra candidate generators (CandidateGenerator: build_generators)."""

  def __init__(self, completer: Any, backend: Any, ranker: Any, settings: CollectSettings,
               generators: Sequence[Any] = ()):
    if completer.max_total_tokens != settings.max_total_tokens:
      raise ValueError(f"the policy Completer's max_total_tokens ({completer.max_total_tokens}) "
                       f"must be config.rollout.max_total_tokens ({settings.max_total_tokens})")
    _check_names([g.name for g in generators])
    self.completer, self.backend, self.ranker, self.settings = completer, backend, ranker, settings
    self.generators = list(generators)
    self.tokenizer = completer.tokenizer
    self.protocol = get_protocol(settings.protocol)

  # ------------------------------------------------------------------ pieces

  def _decode(self, ids: Sequence[int]) -> str:
    return decode_bytes(self.completer.byte_table, ids)

  def _sample(self, trajectories: Sequence[_Trajectory], step: int,
              stats: CollectStats) -> list[list[_Candidate]]:
    """Each trajectory's candidates: per temperature, per_temperature samples (one Completer
    call per temperature, every trajectory's rows in it), the policy's first, then each extra
    generator's."""
    s = self.settings
    out: list[list[_Candidate]] = [[] for _ in trajectories]
    prompts = [t.ids for t in trajectories for _ in range(s.per_temperature)]
    for i, temperature in enumerate(s.temperatures):
      seed = zlib.crc32(f"{s.seed}/{step}/{i}".encode()) % (2 ** 31)
      completions = self.completer.complete(
          prompts, max_new_tokens=s.max_new_tokens, temperature=temperature, top_p=s.top_p,
          stop=self.protocol.stop_strings, seed=seed)
      for row, c in enumerate(completions):
        out[row // s.per_temperature].append(self._candidate(c))
    if self.generators:
      contexts = [self._decode(t.ids) for t in trajectories]
    for g, gen in enumerate(self.generators):
      errors: list[str | None] = [None] * len(trajectories)
      for i, temperature in enumerate(s.temperatures):
        seed = zlib.crc32(f"{s.seed}/{step}/{i}/{g}".encode()) % (2 ** 31)
        got = gen.sample(contexts, n=s.per_temperature, temperature=temperature, top_p=s.top_p,
                         max_new_tokens=s.max_new_tokens, stop=self.protocol.stop_strings,
                         seed=seed)
        for b, (t, generated) in enumerate(zip(trajectories, got)):
          errors[b] = errors[b] or generated.error
          for text in generated.texts:
            out[b].append(self._foreign(t, text, gen.name))
            stats.extra_sampled += 1
      failed = [e for e in errors if e is not None]
      if failed:
        stats.generator_failures += len(failed)
        log.warning("extra generator %s failed on %d of %d branch points at step %d (no "
                    "candidates from those requests), e.g.: %s", gen.name, len(failed),
                    len(trajectories), step, failed[0])
    return out

  def _candidate(self, c: Any) -> _Candidate:
    """A policy completion as a candidate (cut: it ended at the context budget)."""
    cut = c.finish_reason == "length" and c.prompt_tokens + len(c.token_ids) >= \
        self.settings.max_total_tokens
    return _Candidate(self._decode(c.token_ids), list(c.token_ids), cut)

  def _foreign(self, t: _Trajectory, text: str, source: str) -> _Candidate:
    """An extra generator's candidate: its text in the policy's tokenization (what the
    trajectory is fed if it continues), cut where the context budget ends."""
    ids = list(self.tokenizer.encode(text, add_special_tokens=False))
    room = self.settings.max_total_tokens - len(t.ids)
    return _Candidate(text, ids[:room], len(ids) > room, source)

  def _search(self, queries: Sequence[str]) -> SearchResponse:
    """One batched call; a backend that raises or answers the wrong number of results fails
    every query (as the rollout's search does)."""
    if not queries:
      return SearchResponse([], [])
    return guarded_search(self.backend, queries, self.settings.topk)

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
    montecarlo = isinstance(self.ranker, MonteCarloRanker)

    for step in range(s.max_turns):
      live = [b for b, t in enumerate(trajectories) if not t.done]
      if not live:
        break
      sampled = self._sample([trajectories[b] for b in live], step, stats)
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
      returns: list = []
      if montecarlo and ranked:
        returns = self._continuation_returns(
            [trajectories[live[i]] for i in ranked], [kept[i] for i in ranked],
            [actions[i] for i in ranked], [docs[i] for i in ranked],
            [errors[i] for i in ranked], step, stats)
        rankings, values = map(list, zip(*(self.ranker.rank_returns(r) for r in returns)))
      else:
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
               "sources": [c.source for c in kept[i]],
               "judge_rankings": [[float(r) for r in judge] for judge in judge_rankings],
               "judges": identities, "borda": [float(x) for x in scores],
               "expert_ranking": [float(x) for x in expert]}
        if oracle or montecarlo:
          row["values"] = [float(v) for v in values[n]]
        if montecarlo:
          row["value_returns"] = [[float(x) for x in r] for r in returns[n]]
        rows_by_question[live[i]].append(row)
        stats.rows += 1

      for i, b in enumerate(live):
        self._advance(trajectories[b], kept[i][choice[i]], actions[i][choice[i]],
                      docs[i][choice[i]], errors[i][choice[i]], stats)
    return [row for rows in rows_by_question for row in rows], stats

  def _continuation_returns(self, trajectories: Sequence[_Trajectory],
                            kept: Sequence[Sequence[_Candidate]],
                            actions: Sequence[Sequence[Action]], docs: Sequence[Sequence[Any]],
                            errors: Sequence[Sequence[str | None]], step: int,
                            stats: CollectStats) -> list[list[list[float]]]:
    """[branch][candidate][n] returns of n = ranker.continuations policy continuations after
    each kept candidate (the montecarlo ranker): the trajectory advanced with the candidate as
    collection would (_advance), then one sampled policy action per continuation and step
    (every live continuation of the step in Completer calls of value_batch rows, their searches
    in one call) until it answers, its context budget ends or rollout.max_turns steps are
    taken. A return is the ranker's score of the answer, 0 without one. A candidate that ends
    the trajectory (an answer, the budget) is scored once for all n."""
    s, ranker = self.settings, self.ranker
    n = ranker.continuations
    scratch = CollectStats()  # the continuations' own counts stay out of the collection's
    out = [[[0.0] * n for _ in cands] for cands in kept]
    runs: list[tuple[int, int, int, _Trajectory]] = []
    for i, (t, cands) in enumerate(zip(trajectories, kept)):
      for k, cand in enumerate(cands):
        first = _Trajectory(t.question, list(t.ids), list(t.turns))
        self._advance(first, cand, actions[i][k], docs[i][k], errors[i][k], scratch)
        if first.done:
          out[i][k] = [self._return(first)] * n
        else:
          runs += [(i, k, r, _Trajectory(first.question, list(first.ids), list(first.turns)))
                   for r in range(n)]
    for later in range(step + 1, s.max_turns):
      live = [run for run in runs if not run[3].done]
      if not live:
        break
      cands = []
      for start in range(0, len(live), s.value_batch):
        chunk = live[start:start + s.value_batch]
        seed = zlib.crc32(f"{s.seed}/{step}/value/{later}/{start}".encode()) % (2 ** 31)
        cands += [self._candidate(c) for c in self.completer.complete(
            [run[3].ids for run in chunk], max_new_tokens=s.max_new_tokens,
            temperature=ranker.temperature, top_p=s.top_p, stop=self.protocol.stop_strings,
            seed=seed)]
      acts = [parse_action(self.protocol, c.text) for c in cands]
      jobs = [j for j, a in enumerate(acts) if a.kind == SEARCH]
      response = self._search([acts[j].content for j in jobs])
      found: dict[int, tuple[tuple, str | None]] = {
          j: (tuple(d), e) for j, d, e in zip(jobs, response.documents, response.errors)}
      for j, (run, cand, act) in enumerate(zip(live, cands, acts)):
        got, error = found.get(j, ((), None))
        self._advance(run[3], cand, act, got, error, scratch)
      stats.value_samples += len(live)
      stats.value_searches += len(jobs)
    for i, k, r, t in runs:
      out[i][k][r] = self._return(t)
    return out

  def _return(self, t: _Trajectory) -> float:
    """A continuation's return: the ranker's score of its answer, 0 without one."""
    last = t.turns[-1].action if t.turns else None
    if last is None or last.kind != ANSWER:
      return 0.0
    golds = t.question.get("golden_answers") or []
    return self.ranker.score(last.content, [golds] if isinstance(golds, str) else list(golds))

  def _advance(self, t: _Trajectory, cand: _Candidate, action: Action, docs: Sequence[Any],
               error: str | None, stats: CollectStats) -> None:
    """Feeds the chosen candidate and its observation to trajectory t (as the rollout does)."""
    s = self.settings
    t.ids = t.ids + cand.ids
    if cand.budget_cut:  # the turn is what the context holds (an extra candidate's cut text)
      t.turns.append(TurnRecord(text=self._decode(cand.ids),
                                action=Action(INVALID, "cut off by the token budget")))
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
  """Writes rows as JSONL at path atomically (agentjax.jsonl.write_jsonl_atomic: ASCII JSON, so a
  lone surrogate in a model's text cannot fail the write); returns path."""
  return write_jsonl_atomic(path, rows)
