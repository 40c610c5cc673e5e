"""The environment of a subprocess a test starts (a launch script, a multi-device check).

It keeps the suite's XLA flags (tests/conftest.py sets fast CPU compiles) and replaces any fake
device count of this process with the subprocess's own:

    env = subprocess_env(devices=8, JAX_PLATFORMS="cpu")
"""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def xla_flags(devices: int | None = None) -> str:
  """This process's XLA_FLAGS without a device count, plus `devices` fake CPU devices if given."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(DEVICE_COUNT_FLAG)]
  if devices:
    flags.append(f"{DEVICE_COUNT_FLAG}={devices}")
  return " ".join(flags)


def subprocess_env(devices: int | None = None, **extra: str) -> dict[str, str]:
  """os.environ with `extra` set and XLA_FLAGS = xla_flags(devices) (removed when empty)."""
  env = dict(os.environ, **extra)
  flags = xla_flags(devices)
  if flags:
    env["XLA_FLAGS"] = flags
  else:
    env.pop("XLA_FLAGS", None)
  return env
