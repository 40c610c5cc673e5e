"""Reading JSON-lines files with errors that name the file, the line and the field."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Sequence


def iter_json_objects(path: str, error: type[Exception], required: Sequence[str] = (),
                      what: str = "file", on_line: Callable[[bytes], None] | None = None
                      ) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields (1-based line number, object) for each non-blank line of a JSONL file.

  Raises `error` with "{path}: cannot open {what}" or "{path}:{line}: ..." for invalid JSON, a
  value that is not an object, or a missing required field. `on_line` sees every raw line, blank
  ones included (e.g. to hash the file in the same pass).
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
      try:
        row = json.loads(raw)
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}:{lineno}: not valid JSON ({e})") from None
      if not isinstance(row, dict):
        raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
      for field in required:
        if field not in row:
          raise error(f"{path}:{lineno}: missing field {field!r}")
      yield lineno, row
