"""agentjax/train/upgrade.py: the one upgrade of a recorded config."""

from __future__ import annotations

import json
import os
import re

from agentjax.train.upgrade import ADDED, upgrade_recorded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_old_config_gains_what_its_run_ran_with_and_keeps_what_it_has():
  old = {"rl": {"loss": "ppo", "pack_tokens": 1024}, "model": {"preset": "demo"}}
  got = upgrade_recorded(old)
  assert got["rl"]["ig_probe_tokens"] == "split"  # the probes before the field: not today's
  assert got["rl"]["pack_tokens"] == 1024 and got["rl"]["loss"] == "ppo"  # recorded: kept
  assert got["coreact"]["generator_repetition_penalty"] == 1.0 and got["lora"] is None
  assert "ig_probe_tokens" not in old["rl"]  # a copy
  for key, value, _ in ADDED:
    node = got
    for name in key.split("."):
      node = node[name]
    assert node == value or key == "rl.pack_tokens"


def test_every_added_field_is_a_field_of_the_base_config():
  """What the upgrade fills is a field today's configs have (or a recorded extra), so code can
  read it directly."""
  from configs import base
  from agentjax.train.builders import RECORDED_EXTRAS
  config = base.get_config("demo")
  for key, _, _ in ADDED:
    if key in RECORDED_EXTRAS:
      continue
    node = config
    for name in key.split("."):
      assert name in node, key
      node = node[name]


def test_no_fallback_for_recorded_configs_outside_the_upgrade():
  """The code reads config fields directly: no `config.<section>.get(key, default)`."""
  pattern = re.compile(r"\b(config|c|rl|cfg)(\.[a-z_]+)*\.get\(\"[a-z_]+\", ")
  found = []
  for folder in ("agentjax", "launch"):
    for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
      for name in names:
        if name.endswith(".py") and not dirpath.endswith(os.path.join("models", "qwen")):
          with open(os.path.join(dirpath, name)) as f:
            found += [f"{name}:{i + 1}" for i, line in enumerate(f) if pattern.search(line)]
  assert not found, found
