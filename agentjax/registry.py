"""One registry class for every pluggable part: advantage estimators, policy losses, methods,
trainer kinds, judges, search backends and the step's signals.

    ESTIMATORS = Registry("advantage estimator")
    @ESTIMATORS.decorator("grpo")
    def grpo(...): ...
    ESTIMATORS["grpo"]        # KeyError naming the known entries when unknown
    "grpo" in ESTIMATORS; sorted(ESTIMATORS); ESTIMATORS.items()

A registry is a dict (name -> entry) that refuses a second entry under a taken name and whose
lookup error lists what is known. `builtin` names entries whose module registers them when it is
first imported (e.g. a judge backend that needs the openai client): a lookup imports it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


class Registry(dict):
  """name -> entry (module docstring). `what` names an entry in errors ("policy loss")."""

  def __init__(self, what: str, builtin: Mapping[str, str] | None = None):
    super().__init__()
    self.what = what
    self.builtin = dict(builtin or {})

  def register(self, name: str, entry: Any) -> Any:
    """Adds `entry` under `name` (a ValueError when taken); returns the entry."""
    if name in self:
      raise ValueError(f"{self.what} {name!r} is already registered")
    self[name] = entry
    return entry

  def decorator(self, name: str) -> Callable[[Any], Any]:
    """@registry.decorator(name): registers the decorated object, returned unchanged."""
    return lambda entry: self.register(name, entry)

  def known(self) -> list[str]:
    """Every name a lookup can find: the registered ones and the built-in ones not yet loaded."""
    return sorted(set(self) | set(self.builtin))

  def __missing__(self, name: str) -> Any:
    if name in self.builtin:
      importlib.import_module(self.builtin[name])  # registers it
      if dict.__contains__(self, name):
        return dict.__getitem__(self, name)
    raise KeyError(f"unknown {self.what} {name!r}; known: {self.known()}")

  def __repr__(self) -> str:
    return f"Registry({self.what!r}: {sorted(self)})"


__all__ = ["Registry"]
