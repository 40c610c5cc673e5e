"""agentjax.jsonl and its readers: bad lines named by file and line, or skipped on request."""

from __future__ import annotations

import pytest

from agentjax.data.demo_world import hops_by_id
from agentjax.data.tokenizer import synthworld_texts
from agentjax.jsonl import iter_json_objects


class _Bad(ValueError):
  pass


LINES = [b'{"id": "a", "hops": 1}\n',
         b"\n",                            # blank: skipped silently
         b'["not", "an", "object"]\n',     # 3
         b'{"id": "b"}\n',                 # 4: no "hops"
         b'{"id": "c", "hops": 2}\n',
         b'{"id": "\xff\xfe"}\n',          # 6: not UTF-8
         b'{"id": "d", "hops": 2, "tr']    # 7: half-written by a killed process


def _write(path, lines):
  path.write_bytes(b"".join(lines))
  return str(path)


def test_bad_line_raises_naming_file_and_line(tmp_path):
  path = _write(tmp_path / "x.jsonl", LINES)
  rows = iter_json_objects(path, _Bad, ("id", "hops"))
  assert next(rows) == (1, {"id": "a", "hops": 1})
  with pytest.raises(_Bad, match=rf"^{path}:3: expected a JSON object, got list$"):
    next(rows)
  with pytest.raises(_Bad, match=rf"^{tmp_path / 'nope.jsonl'}: cannot open metrics log"):
    list(iter_json_objects(str(tmp_path / "nope.jsonl"), _Bad, what="metrics log"))


def test_on_error_skips_bad_lines_and_reports_each(tmp_path):
  path = _write(tmp_path / "x.jsonl", LINES)
  bad, seen = [], []
  rows = list(iter_json_objects(path, _Bad, ("id", "hops"), on_line=seen.append,
                                on_error=lambda lineno, msg: bad.append((lineno, msg))))
  assert rows == [(1, {"id": "a", "hops": 1}), (5, {"id": "c", "hops": 2})]
  assert [lineno for lineno, _ in bad] == [3, 4, 6, 7]
  assert bad[1][1] == f"{path}:4: missing field 'hops'"
  assert bad[2][1].startswith(f"{path}:6: not valid JSON (")
  assert bad[3][1].startswith(f"{path}:7: not valid JSON (")
  assert seen == LINES  # every raw line, blank and bad ones too


def test_synthworld_texts_name_the_bad_file_and_line(tmp_path):
  _write(tmp_path / "corpus.jsonl", [b'{"id": "0", "contents": "Paris is in France."}\n'])
  _write(tmp_path / "train.jsonl", [b'{"question": "Where is Paris?"}\n', b'{"q": "typo"}\n'])
  with pytest.raises(ValueError, match=rf"{tmp_path / 'train.jsonl'}:2: missing field 'question'"):
    list(synthworld_texts(str(tmp_path)))
  _write(tmp_path / "train.jsonl", [b'{"question": "Where is Paris?"}\n'])
  _write(tmp_path / "demos.jsonl", [b'{"segments": [{"text": "<search> Paris'])
  with pytest.raises(ValueError, match=rf"{tmp_path / 'demos.jsonl'}:1: not valid JSON"):
    list(synthworld_texts(str(tmp_path)))
  (tmp_path / "demos.jsonl").unlink()  # a world without demonstrations is fine
  texts = list(synthworld_texts(str(tmp_path)))
  assert texts[0] == "Paris is in France." and "Where is Paris?" in texts[1]


def test_hops_by_id_names_the_bad_line(tmp_path):
  path = _write(tmp_path / "dev.jsonl", LINES[:2])
  assert hops_by_id(path) == {"a": 1}  # a trailing blank line is no row
  path = _write(tmp_path / "dev.jsonl", LINES[:2] + [LINES[3]])
  with pytest.raises(ValueError, match=rf"^{path}:3: missing field 'hops'"):
    hops_by_id(path)
