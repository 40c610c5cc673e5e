"""Reading and rejecting config fields: the helpers every validator uses (config.py, kinds.py).

    get(config, "rollout.group_size")        # the value, or ConfigError naming the missing field
                                             # and the closest fields the config has
    fail("rollout.group_size", 1, "why")   # ConfigError("config.rollout.group_size=1: why")

Every message starts with the dotted field it is about. One ConfigError for model and run configs.
"""

from __future__ import annotations

from typing import Any, NoReturn

from agentjax.models.qwen.config import ConfigError


def fail(field: str, value: Any, why: str) -> NoReturn:
  raise ConfigError(f"config.{field}={value!r}: {why}")


def get(config: Any, field: str) -> Any:
  node = config
  for part in field.split("."):
    if part not in node:
      # the section's closest fields: a config file's misspelling of the field ("group_sise")
      from agentjax.train.config import unknown_field
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
