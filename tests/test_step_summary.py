"""The rollout stage's summary every RL run logs (train/step.py AgentRollout), on a hand-made
batch: the sufficiency rate and the share of sufficient trajectories left unrewarded (the credit
DAC's searcher reward gives back), against a direct count."""

from __future__ import annotations

import types

import numpy as np
import pytest

from agentjax.agent.protocol import Action
from agentjax.agent.trajectories import TurnRecord
from agentjax.retrieval import Document
from agentjax.train.step import AgentRollout
from configs.base import get_config


def _turn(*texts):
  docs = tuple(Document(id=t, contents=t, score=1.0) for t in texts)
  return TurnRecord(text="", action=Action("search", "q"), documents=docs)


def test_sufficient_unrewarded_counts_found_but_unrewarded_trajectories():
  golds = ["Paris"]
  # Row: (its turns' documents, its answer or None)
  rows = [((["Paris is a city"],), "Paris"),           # sufficient, rewarded
          ((["nothing here"], ["Paris again"]), "Rome"),  # sufficient, wrong answer: unrewarded
          ((["Paris"],), None),                         # sufficient, no answer: unrewarded
          ((["nothing"],), "Paris"),                    # insufficient, a lucky guess
          ((), None)]                                   # no search at all
  batch = types.SimpleNamespace(
      turns=[[_turn(*d) for d in docs] for docs, _ in rows],
      answers=[a or "" for _, a in rows], answered=np.array([a is not None for _, a in rows]),
      format_valid=np.ones(len(rows), bool), truncated=np.zeros(len(rows), bool),
      num_turns=np.array([len(d) for d, _ in rows]), group_ids=np.zeros(len(rows), np.int32),
      num_search_failures=np.zeros(len(rows), np.int32))
  engine = types.SimpleNamespace(run=lambda params, questions, rng: (batch, {}))
  out = AgentRollout(engine)(get_config("demo"), None, [{"question": "q", "golden_answers":
                                                         golds}], None, 0, lambda b: b)
  sufficient = np.array([True, True, True, False, False])
  rewarded = np.array([True, False, False, True, False])
  assert out.summary["sufficiency_rate"] == pytest.approx(sufficient.mean())
  assert out.summary["sufficient_unrewarded"] == pytest.approx(
      np.mean(~rewarded[sufficient]))  # 2 of the 3 sufficient ones
