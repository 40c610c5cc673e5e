"""The judge pass of an RL step (CW-GRPO): which rounds go to the judge, its verdicts as arrays.

    judge_pass = JudgePass(build_judge(config.judge, mesh=mesh), config.judge)
    scores = judge_pass(batch.turns, batch.num_turns, batch.group_ids, outcome, row_questions,
                        num_t, rng)                         # between rewards and advantages
    adv, stats = compute_advantages("cw_grpo", batch, outcome, ig, extra=dict(
        retrieval_scores=scores.retrieval, thinking_scores=scores.thinking), ...)

Which trajectories are judged: those whose outcome reward is > 0 (the CW-GRPO code's rule: a
wrong answer's rounds are not analysed), except, with judge.skip_collapsed_groups, those in a
group whose outcomes are all equal: every member's advantage is 0 there, so their verdicts cannot
change a gradient (the metrics say how many calls this saves). Each judged trajectory sends one
call per round, its answer round included with judge.answer_round (the code's; that score only
enters the infinite-gamma branch's sum). Every call of the step goes to the judge in ONE
`judge.judge` call: a server sees them in flight together, a local judge decodes them as one batch.

Rounds that are not judged get 0/0, like a failed call; the advantage kernel reads only judged
trajectories' scores (A > 0 needs outcome > 0, hence judged, unless the group was skipped, where
A = 0). Host side only: the verdicts come from text.

The judge/ metrics of the bits (retrieval_mean, contribution_share, gini) describe what the
advantage reads, i.e. after the study controls (judge.noise); the oracle agreement compares the
judge's own verdicts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from agentjax.judge.base import Judge, JudgeRequest, Verdict, judge_identity
from agentjax.judge.controls import apply_noise
from agentjax.judge.metrics import agreement, judge_metrics
from agentjax.parallel.host import broadcast_from_primary


@dataclasses.dataclass
class JudgeScores:
  """The judge's verdicts of a batch, by round.

  retrieval, thinking: [B, T] int32 0/1 (0 where not judged or the call failed).
  judged: [B, T] bool, rounds that were sent to the judge.
  metrics: floats under keys "judge/..." for the step's log.
  """
  retrieval: np.ndarray
  thinking: np.ndarray
  judged: np.ndarray
  metrics: dict[str, float]


def rows_to_judge(outcome: np.ndarray, group_ids: np.ndarray,
                  skip_collapsed_groups: bool) -> tuple[np.ndarray, np.ndarray]:
  """([B] bool rows judged, [B] bool rows the paper's rule alone would judge (outcome > 0)).

  A group is collapsed when all its outcomes are equal (exactly: the advantage kernel gives such
  a group exactly 0, see agentjax.rl.advantages)."""
  outcome = np.asarray(outcome, np.float64)
  paper = outcome > 0
  if not skip_collapsed_groups:
    return paper, paper
  live = np.zeros_like(paper)
  for g in np.unique(group_ids):
    members = group_ids == g
    live[members] = np.ptp(outcome[members]) > 0
  return paper & live, paper


class JudgePass:
  """Builds the step's judge requests, calls the judge once, returns [B, T] arrays + metrics.

  oracle: when the judge is not SynthWorld's oracle and the questions carry a gold chain, the
  oracle's verdicts of the same rounds are computed too (cheap, text only) and the agreement is
  logged (judge/agreement_retrieval, judge/agreement_thinking).
  """

  def __init__(self, judge: Judge, judge_config: Any):
    self.judge = judge
    self.config = judge_config
    self.identity = judge_identity(judge_config)

  def __call__(self, turns: Sequence[Sequence[Any]], num_turns: np.ndarray,
               group_ids: np.ndarray, outcome: np.ndarray,
               questions: Sequence[Mapping[str, Any]], num_t: int,
               rng: np.random.Generator) -> JudgeScores:
    """turns[b]: row b's TurnRecords; questions[b]: row b's question record; num_t: T.

    Multi-host: a local judge runs on every process (its decode is one SPMD program over the
    run's mesh); any other judge runs on process 0 only (one set of HTTP calls, not one per
    host) and its scores are broadcast, so every process takes the same update."""
    args = (turns, num_turns, group_ids, outcome, questions, num_t, rng)
    if jax.process_count() == 1 or self.identity["backend"] == "local":
      return self._score(*args)
    payload = None
    if jax.process_index() == 0:
      try:
        out = self._score(*args)
        payload = dict(retrieval=out.retrieval.tolist(), thinking=out.thinking.tolist(),
                       judged=out.judged.tolist(), metrics=out.metrics)
      except Exception as e:  # noqa: BLE001 - re-raised below on every process, none left waiting
        payload = {"error": f"{type(e).__name__}: {e}"[:500]}
    got = broadcast_from_primary(payload)
    if "error" in got:
      raise RuntimeError(f"the judge pass failed on process 0: {got['error']}")
    return JudgeScores(retrieval=np.asarray(got["retrieval"], np.int32),
                       thinking=np.asarray(got["thinking"], np.int32),
                       judged=np.asarray(got["judged"], bool), metrics=got["metrics"])

  def _score(self, turns, num_turns, group_ids, outcome, questions, num_t, rng) -> JudgeScores:
    cfg = self.config
    rows = len(turns)
    judged_rows, paper_rows = rows_to_judge(outcome, np.asarray(group_ids),
                                            cfg.skip_collapsed_groups)
    num_turns = np.asarray(num_turns)
    answered = np.array([len(t) > 0 and t[-1].action.kind == "answer" for t in turns], bool)
    # Rounds sent per row: every turn, or all but the answer turn of a row that answered.
    sent = num_turns.copy()
    if not cfg.answer_round:
      sent = num_turns - answered.astype(num_turns.dtype)
    requests, owners = [], []
    for b in np.flatnonzero(judged_rows):
      if sent[b] > 0:
        requests.append(JudgeRequest(question=questions[b], turns=tuple(turns[b][:sent[b]])))
        owners.append(b)

    t0 = time.perf_counter()
    raised = False
    try:
      verdicts = self.judge.judge(requests) if requests else []
    except Exception as e:  # noqa: BLE001 - a judge fault must not end training: 0/0, counted
      verdicts = [[Verdict.failed(f"judge raised {e!r}")] * len(r.turns) for r in requests]
      raised = True
    if len(verdicts) != len(requests):  # a backend bug must not drop or shift trajectories
      verdicts = [[Verdict.failed(f"judge returned {len(verdicts)} verdict lists for "
                                  f"{len(requests)} trajectories")] * len(r.turns)
                  for r in requests]
    seconds = time.perf_counter() - t0

    retrieval = np.zeros((rows, num_t), np.int32)
    thinking = np.zeros((rows, num_t), np.int32)
    judged = np.zeros((rows, num_t), bool)
    ok = np.zeros((rows, num_t), bool)
    for b, request, row_verdicts in zip(owners, requests, verdicts):
      if len(row_verdicts) != len(request.turns):  # a backend bug must not shift rounds
        row_verdicts = [Verdict.failed(f"judge returned {len(row_verdicts)} verdicts for "
                                       f"{len(request.turns)} rounds")] * len(request.turns)
      for k, v in enumerate(row_verdicts):
        judged[b, k] = True
        ok[b, k] = v.ok
        retrieval[b, k] = int(v.retrieval == 1) if v.ok else 0
        thinking[b, k] = int(v.thinking == 1) if v.ok else 0
    failures = int((judged & ~ok).sum())
    clean_retrieval, clean_thinking = retrieval, thinking
    # The study controls act on real verdicts only (a failed call stays 0/0), search rounds and
    # answer rounds apart (see agentjax.judge.controls).
    answer_round = (np.arange(num_t)[None, :] == (num_turns - 1)[:, None]) & answered[:, None]
    retrieval, thinking = apply_noise(retrieval, thinking, judged & ok, cfg.noise, cfg.noise_p,
                                      rng, strata=answer_round.astype(np.int64))

    paper_calls = int(np.sum(np.where(paper_rows, sent, 0)))
    metrics = {"calls": float(judged.sum()), "calls_paper_rule": float(paper_calls),
               "calls_saved": float(paper_calls - judged.sum()),
               "trajectories": float(len(requests)), "failures": float(failures),
               "seconds": seconds}
    last = getattr(self.judge, "last_stats", None)  # a backend that retries (openai) says how often
    if last is not None and hasattr(last, "retries"):
      metrics["retries"] = float(last.retries) if requests and not raised else 0.0
    metrics.update(judge_metrics(retrieval, thinking, judged, num_turns,
                                 answer_round_judged=bool(cfg.answer_round)))
    if self.identity["backend"] != "oracle" and requests and all(
        "chain" in questions[b] for b in owners):
      from agentjax.judge.oracle import oracle_verdicts
      o_ret = np.zeros_like(retrieval)
      o_think = np.zeros_like(thinking)
      for b, request in zip(owners, requests):
        for k, v in enumerate(oracle_verdicts(request.question, request.turns)):
          o_ret[b, k], o_think[b, k] = v.retrieval, v.thinking
      # Over the rounds the judge answered: a failed call says nothing about agreement.
      metrics.update(agreement(clean_retrieval, clean_thinking, o_ret, o_think, judged & ok))
    return JudgeScores(retrieval=retrieval, thinking=thinking, judged=judged,
                       metrics={f"judge/{k}": float(v) for k, v in metrics.items()})
