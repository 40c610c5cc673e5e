"""The judge pass of an RL step: which rounds are judged, one batched call, faults as 0/0."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from agentjax.agent import Action, TurnRecord
from agentjax.judge import Verdict
from agentjax.judge.stage import JudgePass, rows_to_judge


def _config(**overrides):
  c = ml_collections.ConfigDict(dict(
      backend="test", model="m", prompt_path="", hf_path="", answer_round=True,
      skip_collapsed_groups=True, noise="none", noise_p=0.0))
  c.update(overrides)
  return c


class RecordingJudge:
  """Verdicts from a function of (request index, round); records every judge() call."""

  def __init__(self, verdict=lambda i, k: Verdict(1, k % 2), raises=None, short=False,
               drop=False):
    self.verdict, self.raises, self.short, self.drop = verdict, raises, short, drop
    self.calls = []

  def judge(self, requests):
    self.calls.append(list(requests))
    if self.raises:
      raise self.raises
    out = [[self.verdict(i, k) for k in range(len(r.turns))] for i, r in enumerate(requests)]
    if self.drop:  # one trajectory's verdicts missing
      return out[:-1]
    return [v[:-1] for v in out] if self.short else out

  def identity(self):
    return {"backend": "test"}


def _turns(n, answered=True):
  turns = [TurnRecord(text=f"<search> q{k} </search>", action=Action("search", f"q{k}"))
           for k in range(n - 1)]
  last = Action("answer", "x") if answered else Action("search", "again")
  return tuple(turns + [TurnRecord(text="<answer> x </answer>", action=last)])


def _run(judge, config, outcome, group_ids, num_turns, num_t=4, answered=None):
  answered = answered if answered is not None else [True] * len(outcome)
  turns = [_turns(n, a) for n, a in zip(num_turns, answered)]
  questions = [{"question": f"q{g}", "golden_answers": ["x"]} for g in group_ids]
  stage = JudgePass(judge, config)
  return stage(turns, np.asarray(num_turns), np.asarray(group_ids), np.asarray(outcome),
               questions, num_t, np.random.default_rng(0))


def test_rows_to_judge_follows_the_paper_rule_and_skips_collapsed_groups():
  rng = np.random.default_rng(0)
  for _ in range(50):
    group_ids = rng.integers(0, 4, size=12)
    outcome = rng.choice([0.0, 0.5, 1.0], size=12)
    judged, paper = rows_to_judge(outcome, group_ids, skip_collapsed_groups=True)
    for b in range(12):  # an independent loop
      members = outcome[group_ids == group_ids[b]]
      assert paper[b] == (outcome[b] > 0)
      assert judged[b] == (outcome[b] > 0 and len(set(members.tolist())) > 1)
    judged, paper = rows_to_judge(outcome, group_ids, skip_collapsed_groups=False)
    np.testing.assert_array_equal(judged, outcome > 0)


def test_one_call_per_step_one_verdict_per_round():
  judge = RecordingJudge()
  # group 0: outcomes differ (rows 0, 1 judged if > 0); group 1: all correct (collapsed, skipped)
  out = _run(judge, _config(), outcome=[1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 1, 1],
             num_turns=[3, 2, 2, 4])
  assert len(judge.calls) == 1 and len(judge.calls[0]) == 1  # only row 0
  assert len(judge.calls[0][0].turns) == 3
  np.testing.assert_array_equal(out.judged[0], [True, True, True, False])
  assert not out.judged[1:].any()
  np.testing.assert_array_equal(out.retrieval[0], [1, 1, 1, 0])
  np.testing.assert_array_equal(out.thinking[0], [0, 1, 0, 0])
  m = out.metrics
  assert m["judge/calls"] == 3 and m["judge/calls_paper_rule"] == 3 + 2 + 4
  assert m["judge/calls_saved"] == 6 and m["judge/failures"] == 0


def test_answer_round_can_be_left_out():
  judge = RecordingJudge()
  out = _run(judge, _config(answer_round=False), outcome=[1.0, 0.0], group_ids=[0, 0],
             num_turns=[3, 1])
  assert len(judge.calls[0][0].turns) == 2  # the answer round is not sent
  np.testing.assert_array_equal(out.judged[0], [True, True, False, False])


def test_a_judge_that_raises_or_miscounts_gives_zero_and_counts_failures():
  for judge in (RecordingJudge(raises=ConnectionError("down")), RecordingJudge(short=True),
                RecordingJudge(drop=True)):
    out = _run(judge, _config(), outcome=[1.0, 0.0, 0.5, 0.0], group_ids=[0, 0, 1, 1],
               num_turns=[3, 2, 2, 1])
    assert out.metrics["judge/failures"] == out.metrics["judge/calls"] == 5
    assert not out.retrieval.any() and not out.thinking.any()


def test_noise_touches_only_judged_rounds():
  judge = RecordingJudge(verdict=lambda i, k: Verdict(1, 1))
  out = _run(judge, _config(noise="flip", noise_p=1.0), outcome=[1.0, 0.0], group_ids=[0, 0],
             num_turns=[3, 2])
  assert not out.retrieval.any() and not out.thinking.any()  # every judged bit flipped 1 -> 0
  judge = RecordingJudge(verdict=lambda i, k: Verdict(0, 0))
  out = _run(judge, _config(noise="flip", noise_p=1.0), outcome=[1.0, 0.0], group_ids=[0, 0],
             num_turns=[3, 2])
  np.testing.assert_array_equal(out.retrieval, out.judged.astype(np.int32))


def test_no_call_when_nothing_is_judged():
  judge = RecordingJudge()
  out = _run(judge, _config(), outcome=[0.0, 0.0], group_ids=[0, 0], num_turns=[2, 2])
  assert judge.calls == [] and out.metrics["judge/calls"] == 0


@pytest.mark.parametrize("backend", ["nope"])
def test_unknown_backend_names_the_field(backend):
  from agentjax.judge import build_judge
  with pytest.raises(ValueError, match="judge.backend: unknown backend 'nope'.*oracle"):
    build_judge(_config(backend=backend))


def test_random_control_draws_search_and_answer_rounds_apart():
  """An oracle-like judge credits every search round and never an answer round: the random
  control keeps that split (pooled, answer rounds would take credit from the search rounds)."""
  judge = RecordingJudge(verdict=lambda i, k: Verdict(1, 1) if k < 2 else Verdict(0, 0))
  out = _run(judge, _config(noise="random"), outcome=[1.0, 0.0, 1.0, 0.0] * 8,
             group_ids=np.repeat(np.arange(8), 4), num_turns=[3, 1, 3, 2] * 8)
  search = out.judged & (np.arange(4)[None, :] < 2)
  assert search.any() and out.retrieval[search].all() and out.thinking[search].all()
  assert not out.retrieval[out.judged & ~search].any()


def test_controls_leave_failed_calls_at_zero():
  judge = RecordingJudge(verdict=lambda i, k: Verdict.failed("down"))
  out = _run(judge, _config(noise="flip", noise_p=1.0), outcome=[1.0, 0.0], group_ids=[0, 0],
             num_turns=[3, 2])
  assert out.metrics["judge/failures"] == 3 and not out.retrieval.any()
