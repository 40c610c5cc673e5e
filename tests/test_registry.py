"""agentjax/registry.py: the one registry class every pluggable part uses."""

from __future__ import annotations

import pytest

from agentjax.registry import Registry


def test_a_registry_refuses_a_taken_name_and_names_the_known_ones(monkeypatch):
  r = Registry("widget", builtin={"lazy": "fake_widget_module"})
  assert r.decorator("a")(len) is len and r["a"] is len
  with pytest.raises(ValueError, match="widget 'a' is already registered"):
    r.register("a", max)
  with pytest.raises(KeyError, match=r"unknown widget 'b'; known: \['a', 'lazy'\]"):
    r["b"]
  # A built-in entry: its module registers it when the lookup first imports it.
  imported = []

  def load():
    imported.append(1)
    r.register("lazy", min)
  monkeypatch.setattr("importlib.import_module", lambda name: load())
  assert "lazy" not in r and r["lazy"] is min and imported == [1]
  assert r["lazy"] is min and imported == [1]  # registered now: no second import
  assert sorted(r) == ["a", "lazy"] and r.known() == ["a", "lazy"]


def test_every_registry_is_one():
  """The estimators, losses, methods, trainer kinds, judges and search backends."""
  from agentjax.judge.base import JUDGES
  from agentjax.methods import METHODS
  from agentjax.retrieval.base import BACKENDS
  from agentjax.rl.advantages import ADVANTAGE_ESTIMATORS
  from agentjax.rl.losses import POLICY_LOSSES
  from agentjax.train.kinds import TRAINER_KINDS
  for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, METHODS, TRAINER_KINDS, JUDGES,
                   BACKENDS):
    assert isinstance(registry, Registry)
  assert {"bm25", "http"} <= set(BACKENDS.known()) and "oracle" in JUDGES.known()
