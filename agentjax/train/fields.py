"""Reading and rejecting config fields: the helpers every validator uses (config.py, kinds.py).

    get(config, "rollout.group_size")        # the value, or ConfigError naming the missing field
                                             # and the closest fields the config has
    fail("rollout.group_size", 1, "why")   # ConfigError("config.rollout.group_size=1: why")

Every message starts with the dotted field it is about. One ConfigError for model and run configs.
"""

from __future__ import annotations

import difflib
from typing import Any, NoReturn

from agentjax.models.qwen.config import ConfigError


def fail(field: str, value: Any, why: str) -> NoReturn:
  raise ConfigError(f"config.{field}={value!r}: {why}")


def get(config: Any, field: str) -> Any:
  node = config
  for part in field.split("."):
    if part not in node:
      # the section's closest fields: a config file's misspelling of the field ("group_sise")
      raise ConfigError(f"config.{field} is missing (a config starts from configs/base.py's "
                        f"get_config): {unknown_field(config, field)}")
    node = node[part]
  return node


def positive(config: Any, *fields: str) -> None:
  for f in fields:
    v = get(config, f)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
      fail(f, v, "must be a positive number")


def non_negative(config: Any, *fields: str) -> None:
  for f in fields:
    v = get(config, f)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
      fail(f, v, "must be >= 0")


def non_negative_int(config: Any, *fields: str) -> None:
  for f in fields:
    v = get(config, f)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      fail(f, v, "must be an int >= 0")


def names(value: Any, field: str) -> tuple[str, ...]:
  """'a, b' -> ("a", "b") (a comma-separated string field)."""
  if not isinstance(value, str):
    fail(field, value, "must be a comma-separated string")
  return tuple(n.strip() for n in value.split(",") if n.strip())


__all__ = ["ConfigError", "fail", "get", "names", "non_negative", "non_negative_int", "positive"]


def field_paths(config: Any, prefix: str = "") -> list[str]:
  """Every dotted field of a config, sections included: ["data", "data.train", ...]."""
  paths = []
  for key in config.keys():
    path = f"{prefix}{key}"
    paths.append(path)
    if hasattr(config[key], "keys"):
      paths += field_paths(config[key], f"{path}.")
  return paths


def unknown_field(config: Any, field: str, name: str = "config") -> str:
  """Why the dotted `field` is not one of `config`'s, with the closest fields it has (a
  misspelled --config.* override): "config.train has no field 'step'; did you mean
  config.train.steps?", or the section's fields when nothing is close."""
  node, parents = config, []
  for part in field.split("."):
    where = ".".join([name, *parents])
    if not hasattr(node, "keys"):
      return f"{where} is the {type(node).__name__} {node!r}, not a section with fields"
    if part not in node:
      break
    node, parents = node[part], parents + [part]
  else:
    return f"{name}.{field} exists"
  # A typo anywhere in the path ("trian.steps"), else a field of the section the path reached.
  close = difflib.get_close_matches(field, field_paths(config), n=3, cutoff=0.8) or [
      ".".join([*parents, k]) for k in difflib.get_close_matches(part, list(node.keys()), n=3)]
  why = f"{where} has no field {part!r}"
  if close:
    return f"{why}; did you mean {' or '.join(f'{name}.{c}' for c in close)}?"
  return f"{why}; its fields: {', '.join(sorted(node.keys()))}"
