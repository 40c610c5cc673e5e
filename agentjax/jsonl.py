"""Reading JSON-lines files with errors that name the file, the line and the field; writing them
atomically."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Sequence


def iter_json_objects(path: str, error: type[Exception], required: Sequence[str] = (),
                      what: str = "file", on_line: Callable[[bytes], None] | None = None,
                      on_error: Callable[[int, str], None] | None = None
                      ) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields (1-based line number, object) for each non-blank line of a JSONL file.

  A bad line (invalid JSON or UTF-8, a value that is not an object, a missing required field)
  raises `error` with "{path}:{line}: ...", or, when `on_error` is given, is skipped after
  calling on_error(line number, that same message): e.g. a log whose last line a killed
  process left half-written. A file that cannot be opened always raises `error` with
  "{path}: cannot open {what}". `on_line` sees every raw line, blank and bad ones included (e.g.
  to hash the file in the same pass).

      bad = []
      rows = [row for _, row in iter_json_objects(
          path, ValueError, on_error=lambda lineno, msg: (log.warning(msg), bad.append(lineno)))]
  """
  try:
    f = open(path, "rb")
  except OSError as e:
    raise error(f"{path}: cannot open {what} ({e.strerror or e})") from None
  with f:
    for lineno, raw in enumerate(f, start=1):
      if on_line is not None:
        on_line(raw)
      if not raw.strip():
        continue
      row, problem = _parse(raw, required)
      if problem is None:
        yield lineno, row
        continue
      message = f"{path}:{lineno}: {problem}"
      if on_error is None:
        raise error(message)
      on_error(lineno, message)


def _parse(raw: bytes, required: Sequence[str]) -> tuple[dict[str, Any], str | None]:
  """The object on one line and None, or ({}, what is wrong with the line)."""
  try:
    row = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    return {}, f"not valid JSON ({e})"
  if not isinstance(row, dict):
    return {}, f"expected a JSON object, got {type(row).__name__}"
  for field in required:
    if field not in row:
      return {}, f"missing field {field!r}"
  return row, None


def write_jsonl_atomic(path: str, rows: Any) -> str:
  """Writes rows (dicts) as JSONL at `path` through a temporary file renamed over it: a killed
  writer never leaves a half-written file, and an existing file is replaced only by a complete
  one. ASCII JSON (non-ASCII escaped), so any Python string, a lone surrogate from a model's reply
  included, is written. Returns path."""
  path = os.path.expanduser(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="ascii") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=True) + "\n")
  os.replace(tmp, path)
  return path
