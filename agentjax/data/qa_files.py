"""A user's own question files, named wherever a benchmark name is (config.data.train, data.eval).

    --config.data.train=data/mine.jsonl --config.data.eval=data/mine_dev.jsonl
    --config.data.train=data/mine/        # a folder: data/mine/{train,dev,test}.jsonl

An entry is a path when it has a path separator, starts with "~", ends with one of QA_SUFFIXES,
or is an existing folder that is not a benchmark name. A file is one split: whatever split a
run asks of it (train, or data.eval_split), it gives all its questions. A folder holds one file
per split, `{folder}/{split}{suffix}` (the layout of a FlashRAG benchmark folder).

Formats (docs/guides/data.md):
  .jsonl    one JSON object per line (blank lines skipped)
  .json     a JSON list of those objects (or, when it starts with "{", JSON lines)
  .parquet  one row per question (e.g. Search-R1's processed NQ/HotpotQA files)

A record: "question" (a non-empty string), the gold answers under the first of ANSWER_FIELDS that
it has (a non-empty list of non-empty strings, or one string), and optionally "id" (a string or
an integer; default: "{file stem}_{index}", index 0-based, as FlashRAG numbers "train_0").
"gold_documents" (a list of strings, StepSearch's) is kept when present; other keys are ignored.
Records come back as {"id", "question", "golden_answers"} (and "gold_documents"), in file order.
A bad record raises QAFormatError: "{path}:{line}: ..." (parquet: "{path}: row {n}: ...")
naming the field.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from agentjax.jsonl import iter_json_objects

QA_SUFFIXES = (".jsonl", ".json", ".parquet")
# Where the gold answers may be, first match wins: FlashRAG's and Search-R1's "golden_answers",
# the common "answers" and "answer", and the reward target of Search-R1's verl rows.
ANSWER_FIELDS = ("golden_answers", "answers", "answer", "reward_model.ground_truth.target")
# Kept when a record has them (a list of strings each): what a method reads beyond the answers,
# StepSearch's gold documents (the texts its step rewards match retrieved documents against).
OPTIONAL_FIELDS = ("gold_documents",)


class QAFormatError(ValueError):
  """A QA file that cannot be read; the message names the file, the line (or row) and the field."""


def check_text(value: Any, where: str, field: str) -> str:
  """`value` when it is a non-blank string; else QAFormatError "{where}: field ...". """
  if not isinstance(value, str):
    raise QAFormatError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
  if not value.strip():
    raise QAFormatError(f"{where}: field {field!r} is empty")
  return value


def check_text_list(value: Any, where: str, field: str) -> list[str]:
  """`value` when it is a non-empty list of non-blank strings; else QAFormatError."""
  if not isinstance(value, list):
    raise QAFormatError(f"{where}: field {field!r} must be a list of strings, "
                        f"got {type(value).__name__}")
  if not value:
    raise QAFormatError(f"{where}: field {field!r} is empty")
  return [check_text(v, where, f"{field}[{i}]") for i, v in enumerate(value)]


def check_id(value: Any, where: str) -> str:
  """An id as a string: a non-blank string, or an integer (FlashRAG files have both)."""
  if isinstance(value, int) and not isinstance(value, bool):
    value = str(value)
  return check_text(value, where, "id")


def is_data_path(name: str) -> bool:
  """Whether a data entry names a file or folder rather than a benchmark (module docstring).
  The caller checks benchmark names first: a folder named like a benchmark needs a "/"."""
  name = str(name)
  return (os.sep in name or "/" in name or name.startswith("~") or name.endswith(QA_SUFFIXES)
          or os.path.isdir(name))


def split_file(entry: str, split: str) -> str:
  """The file that data entry `entry` (a file or a folder) gives for `split`.

  Raises QAFormatError when there is no such file or folder, when a folder has no file for
  `split` (naming the splits it has) or more than one (e.g. train.jsonl and train.parquet).
  """
  path = os.path.expanduser(entry)
  if os.path.isfile(path):
    if not path.endswith(QA_SUFFIXES):
      raise QAFormatError(f"{entry}: not a question file: the name must end with one of "
                          f"{list(QA_SUFFIXES)}")
    return path
  if not os.path.isdir(path):
    raise QAFormatError(f"{entry}: no such file or folder")
  found = [os.path.join(path, split + s) for s in QA_SUFFIXES
           if os.path.isfile(os.path.join(path, split + s))]
  if len(found) > 1:
    raise QAFormatError(f"{entry}: {len(found)} files for split {split!r} "
                        f"({[os.path.basename(f) for f in found]}): keep one")
  if not found:
    has = sorted({n.rsplit(".", 1)[0] for n in os.listdir(path) if n.endswith(QA_SUFFIXES)})
    raise QAFormatError(f"{entry}: no {split}{'/'.join(QA_SUFFIXES)} in this folder (it has "
                        f"the splits {has}); a folder holds one file per split, "
                        f"{{split}}.jsonl")
  return found[0]


def _answers(row: dict[str, Any], where: str) -> list[str]:
  for field in ANSWER_FIELDS:
    node: Any = row
    for part in field.split("."):
      if not isinstance(node, dict) or part not in node:
        break
      node = node[part]
    else:
      if isinstance(node, str):
        node = [node]
      return check_text_list(node, where, field)
  raise QAFormatError(f"{where}: missing field 'golden_answers' (the gold answers: a list of "
                      f"strings; also read from {list(ANSWER_FIELDS[1:])})")


def _json_list(path: str) -> Iterator[tuple[str, str, Any]]:
  """(where, short, item) for each item of a JSON list: "{path}:{line}", "line {line}", the
  line where the item starts."""
  try:
    with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is dropped
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise QAFormatError(f"{path}: cannot read ({e})") from None
  decoder = json.JSONDecoder()
  counted, line = 0, 1  # newlines before text[counted]: counted once over the whole file

  def skip(i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
      i += 1
    return i

  def line_at(i: int) -> int:
    nonlocal counted, line
    line += text.count("\n", counted, i)
    counted = i
    return line

  i = skip(0)
  if text[i:i + 1] != "[":
    raise QAFormatError(f"{path}:{line_at(i)}: expected a JSON list of question objects")
  i = skip(i + 1)
  if text[i:i + 1] == "]":
    return
  while True:
    try:
      item, end = decoder.raw_decode(text, i)
    except json.JSONDecodeError as e:
      raise QAFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    n = line_at(i)
    yield f"{path}:{n}", f"line {n}", item
    i = skip(end)
    if text[i:i + 1] == "]":
      return
    if text[i:i + 1] != ",":
      raise QAFormatError(f"{path}:{line_at(i)}: not valid JSON (expected ',' or ']' after an "
                          f"item)")
    i = skip(i + 1)


def _parquet_rows(path: str) -> Iterator[tuple[str, str, Any]]:
  try:
    import pyarrow.parquet as pq  # installed with tensorflow-datasets
  except ImportError:
    raise QAFormatError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)") from None
  try:
    rows = pq.read_table(path).to_pylist()
  except Exception as e:  # noqa: BLE001 - any arrow error: the file is not a readable parquet
    raise QAFormatError(f"{path}: cannot read as parquet ({e})") from None
  for n, row in enumerate(rows, start=1):
    yield f"{path}: row {n}", f"row {n}", row


def _items(path: str) -> Iterator[tuple[str, str, Any]]:
  """(where, short, raw item) of each record of a .jsonl, .json or .parquet file: where is
  "{path}:{line}" ("{path}: row {n}" for parquet), short "line {line}" ("row {n}")."""
  if path.endswith(".parquet"):
    yield from _parquet_rows(path)
    return
  if path.endswith(".json"):
    with open(path, "rb") as f:
      head = f.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    if head.startswith(b"["):
      yield from _json_list(path)
      return
  for lineno, row in iter_json_objects(path, QAFormatError, what="question file"):
    yield f"{path}:{lineno}", f"line {lineno}", row


def read_qa_file(path: str) -> list[dict[str, Any]]:
  """The records of one question file (module docstring), as {"id", "question",
  "golden_answers"} in file order. Raises QAFormatError naming the file, the line (or row) and
  the field of the first bad record, or a file with no record."""
  stem = os.path.basename(path).rsplit(".", 1)[0]
  records, seen = [], {}
  for where, short, row in _items(path):
    if not isinstance(row, dict):
      raise QAFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "question" not in row:
      raise QAFormatError(f"{where}: missing field 'question'")
    qid = check_id(row["id"], where) if row.get("id") is not None else f"{stem}_{len(records)}"
    if qid in seen:
      raise QAFormatError(f"{where}: field 'id' repeats {qid!r} from {seen[qid]}")
    seen[qid] = short
    record = {"id": qid, "question": check_text(row["question"], where, "question"),
              "golden_answers": _answers(row, where)}
    for field in OPTIONAL_FIELDS:
      if row.get(field) is not None:
        record[field] = check_text_list(row[field], where, field)
    records.append(record)
  if not records:
    raise QAFormatError(f"{path}: no questions in the file")
  return records


def load_qa_path(entry: str, split: str) -> list[dict[str, Any]]:
  """The records `split` of data entry `entry` (a question file, or a folder of split files)."""
  return read_qa_file(split_file(entry, split))


__all__ = ["ANSWER_FIELDS", "OPTIONAL_FIELDS", "QAFormatError", "QA_SUFFIXES", "check_id", "check_text",
           "check_text_list", "is_data_path", "load_qa_path", "read_qa_file", "split_file"]
