"""Search backends of the user's own, selected from a run's config.

    --config.retrieval.plugins=my_search.py --config.retrieval.backend=my_search \
        --config.retrieval.backend_kwargs='{"path": "data/notes.jsonl"}'

retrieval.plugins is a comma-separated list of Python modules, each a module name on the path
(my_pkg.search) or a .py file; importing one calls `register_backend(name, factory)`
(agentjax/retrieval/base.py). A run whose retrieval.backend is not a built-in one (bm25, http,
dense) imports them, looks the backend up, and calls factory(**backend_kwargs) (a JSON object;
"" for none). Each plugin is imported once per process however often a config names it, so that
its register_backend call runs once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any, Callable

from agentjax.retrieval.base import BACKENDS, SearchBackend

# The backends make_search_backend builds from their own config fields (not backend_kwargs).
BUILTIN_BACKENDS = ("bm25", "http", "dense")
HOW_TO_REGISTER = ("register one with agentjax.retrieval.register_backend(name, factory) in a "
                   "module named in config.retrieval.plugins (docs/guides/data.md, \"Your own "
                   "retriever\")")


class PluginError(ValueError):
  """A retrieval.* field that cannot work: `field` (dotted, under config), its value and why."""

  def __init__(self, field: str, value: Any, why: str):
    super().__init__(f"config.{field}={value!r}: {why}")
    self.field, self.value, self.why = field, value, why


def _import_file(path: str) -> ModuleType:
  """A .py file as a module, once: its sys.modules name is derived from its absolute path."""
  path = os.path.abspath(os.path.expanduser(path))
  stem = os.path.splitext(os.path.basename(path))[0]
  name = f"agentjax_plugin_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:10]}"
  if name in sys.modules:
    return sys.modules[name]
  if not os.path.isfile(path):
    raise ImportError(f"no such file {path}")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # before running it: an import of itself finds it
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]  # a failed import can be retried once fixed
    raise
  return module


def load_plugins(value: str) -> list[ModuleType]:
  """Imports each comma-separated entry of `value` (a module name, or a path ending in .py).

  Raises PluginError naming retrieval.plugins and the entry whose import failed (its error in
  one line)."""
  if not isinstance(value, str):
    raise PluginError("retrieval.plugins", value, "must be a comma-separated string of modules")
  modules = []
  for entry in (e.strip() for e in value.split(",")):
    if not entry:
      continue
    try:
      modules.append(_import_file(entry) if entry.endswith(".py")
                     else importlib.import_module(entry))
    except Exception as e:  # noqa: BLE001 - a plugin's own error, reported with its entry
      raise PluginError("retrieval.plugins", value, f"importing {entry!r} failed: "
                        f"{type(e).__name__}: {e}".replace("\n", " ")) from None
  return modules


def backend_kwargs(value: Any) -> dict[str, Any]:
  """retrieval.backend_kwargs as a dict: a JSON object string ("" for none)."""
  if isinstance(value, str) and not value.strip():
    return {}
  try:
    kwargs = json.loads(value) if isinstance(value, str) else None
  except json.JSONDecodeError as e:
    raise PluginError("retrieval.backend_kwargs", value, f"not valid JSON ({e})") from None
  if not isinstance(kwargs, dict):
    raise PluginError("retrieval.backend_kwargs", value, "must be a JSON object of keyword "
                      "arguments for the backend's factory, e.g. '{\"path\": \"notes.jsonl\"}'")
  return kwargs


def resolve_backend(retrieval: Any) -> tuple[Callable[..., SearchBackend], dict[str, Any]]:
  """(factory, kwargs) of a config's retrieval section whose backend is not built in: its plugins
  imported, its name looked up, its backend_kwargs parsed. Raises PluginError naming the field:
  an unknown name lists the registered ones and says how to register one."""
  load_plugins(retrieval.plugins)
  name = retrieval.backend
  if not isinstance(name, str) or name not in BACKENDS.known():
    raise PluginError("retrieval.backend", name, f"no such search backend; registered: "
                      f"{BACKENDS.known()}; {HOW_TO_REGISTER}")
  return BACKENDS[name], backend_kwargs(retrieval.backend_kwargs)


__all__ = ["BUILTIN_BACKENDS", "HOW_TO_REGISTER", "PluginError", "backend_kwargs",
           "load_plugins", "resolve_backend"]
