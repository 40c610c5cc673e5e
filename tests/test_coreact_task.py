"""Co-ReAct's rubric generator as an RL task: the rubric protocol, config checks, branch records,
batched rubric rewards, warm-start rubrics, and trainer "rubric" end to end on a tiny model."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentjax.agent.protocol import ANSWER, INVALID, RUBRIC, get_protocol  # noqa: E402
from agentjax.models.qwen.config import ConfigError  # noqa: E402
from agentjax.train.config import validate  # noqa: E402


# ============================================================================ protocol, config


def test_rubric_protocol_takes_the_whole_text_as_the_output():
  assert get_protocol("rubric") is RUBRIC and not RUBRIC.can_search
  text = "<think>hm</think>\n1. [0.5] The action searches\n2. [0.5] <search> x </search>"
  action = RUBRIC.parse(text)
  assert action.kind == ANSWER and action.content == text.strip()
  assert RUBRIC.parse(" \n ").kind == INVALID


def _rubric_config():
  from configs import coreact
  c = coreact.get_config("demo")
  c.model.lora.init = ""
  return c


@pytest.mark.parametrize("field,value,expect", [
    ("rollout.protocol", "search_r1", "config.rollout.protocol="),
    ("rollout.max_turns", 2, "config.rollout.max_turns="),
    ("coreact.rank_reward", "ndcg", "config.coreact.rank_reward="),
    ("algorithm", "igpo", "config.algorithm="),
    ("coreact.num_candidates", 1, "config.coreact.num_candidates="),
    ("coreact.min_items", 6, "config.coreact.min_items="),
    ("coreact.best_of_n_select", "judge", "config.coreact.best_of_n_select="),
    ("coreact.branches_train", "", "config.coreact.branches_train="),
])
def test_rubric_config_errors_name_the_field(field, value, expect):
  c = _rubric_config()
  validate(c)
  section, key = field.split(".") if "." in field else (None, field)
  if section:
    c[section][key] = value
  else:
    c[key] = value
  with pytest.raises(ConfigError, match=expect.replace(".", r"\.")):
    validate(c)


def test_the_rubric_protocol_is_the_rubric_trainers_only():
  from configs import base
  c = base.get_config("demo")
  c.rollout.protocol = "rubric"
  with pytest.raises(ConfigError, match=r"config\.rollout\.protocol='rubric'"):
    validate(c)
