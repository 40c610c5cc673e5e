"""tensorflow-datasets builder for search-QA benchmarks in FlashRAG JSONL, stored as array_record.

One builder, `SearchQA` (tfds name "search_qa"), with one config per benchmark (`BENCHMARKS`):
nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, and synthworld (our generated
world, agentjax.data.synthworld). Nothing is downloaded: the builder reads a local manual dir,

    {manual_dir}/{config}/{split}.jsonl     split in ("train", "dev", "test"), whichever exist

(or `{manual_dir}/{split}.jsonl` when `{manual_dir}/{config}` does not exist, so that a single
benchmark folder such as SynthWorld's output can be passed directly). Each line is
`{"id": str, "question": str, "golden_answers": [str, ...]}`; other keys are ignored, except that
the synthworld config also keeps "hops" (int), "chain" and "relations" (lists of str). A malformed
line raises QAFormatError naming the file, the 1-based line number and the field.

Storage is array_record, read back with `builder.as_data_source()` (random access, no
TensorFlow). Only tfds' tf.data paths need TensorFlow (`tfds.load`, `as_dataset`, `as_numpy`);
this module never calls them, and building (`download_and_prepare`) runs without it.

    records = load_split("nq", "train", data_dir="~/tensorflow_datasets", manual_dir="data/manual")

`load_split` builds on first use, decodes bytes to str, and returns records sorted by natural id
order (digit runs compared as numbers: train_2 < train_10), which restores file order for
FlashRAG-style ids ("train_0", "test_17") and SynthWorld ids; tfds itself stores records in an
order shuffled by key. Ids must therefore be unique within a split (checked while building).

A user's own question files are not benchmarks: they are read directly, without tfds
(agentjax.data.qa_files), and `expand_benchmarks` takes either in a config's data entries.
tfds' own chatter (its "Downloading and preparing dataset" print, though nothing downloads, and
its absl INFO lines) is kept out of a run's log (`quiet_tfds`).

tfds keys a built dataset by (config, version) under data_dir only. `load_split` with a
manual_dir also records the sha256 of the source files in the dataset's metadata and rebuilds
when they changed (e.g. a SynthWorld regenerated with another seed into the same folder).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import re
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from agentjax.data.qa_files import (QA_SUFFIXES, QAFormatError, check_id, check_text,
                                    check_text_list, is_data_path)
from agentjax.jsonl import iter_json_objects

_log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
# Fields the synthworld config keeps beyond the common three.
SYNTHWORLD_FIELDS = ("hops", "chain", "relations")
_METADATA_KEY = "source_sha256"


@dataclasses.dataclass(frozen=True)
class _Benchmark:
  name: str
  description: str
  homepage: str


_FLASHRAG = "https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets"
_BENCHMARKS = (
    _Benchmark("nq", "Natural Questions (open-domain subset), single-hop.", _FLASHRAG),
    _Benchmark("triviaqa", "TriviaQA (open-domain), single-hop.", _FLASHRAG),
    _Benchmark("popqa", "PopQA: long-tail entity questions, single-hop.", _FLASHRAG),
    _Benchmark("hotpotqa", "HotpotQA, multi-hop (2 hops).", _FLASHRAG),
    _Benchmark("2wikimultihopqa", "2WikiMultiHopQA, multi-hop.", _FLASHRAG),
    _Benchmark("musique", "MuSiQue, multi-hop (2-4 hops).", _FLASHRAG),
    _Benchmark("bamboogle", "Bamboogle: 125 two-hop questions (test only).", _FLASHRAG),
    _Benchmark("synthworld", "SynthWorld: generated world, 1-3 hop questions over invented "
               "entities (agentjax.data.synthworld).", ""),
)
BENCHMARKS = tuple(b.name for b in _BENCHMARKS)

# Named benchmark lists that config.data.eval can take: (benchmark, questions, split) per member.
# A member's questions are the first N of its split (in `natural_key` id order).
BENCHMARK_LISTS = {
    # CW-GRPO's evaluation mix (its code's data/agentgym/searchqa_test.json): MuSiQue 100 and 50
    # of each other benchmark, 400 questions. The code takes AgentGym SearchQA's test indices into
    # FlashRAG's splits; those indices are not available offline, so this is our reading: the
    # first N questions of each benchmark's FlashRAG test split, or of its dev split where FlashRAG
    # has no test split (hotpotqa, 2wikimultihopqa, musique).
    "cw_grpo_400": (("musique", 100, "dev"), ("nq", 50, "test"), ("triviaqa", 50, "test"),
                    ("popqa", 50, "test"), ("hotpotqa", 50, "dev"),
                    ("2wikimultihopqa", 50, "dev"), ("bamboogle", 50, "test")),
    # The seven benchmarks of Search-R1's evaluation (and IGPO's), each on the split Search-R1
    # reports: the test split, or the dev split where FlashRAG has no test split (hotpotqa,
    # 2wikimultihopqa, musique). Size 0: data.eval_size questions of each (0: all).
    "flashrag": (("nq", 0, "test"), ("triviaqa", 0, "test"), ("popqa", 0, "test"),
                 ("hotpotqa", 0, "dev"), ("2wikimultihopqa", 0, "dev"), ("musique", 0, "dev"),
                 ("bamboogle", 0, "test")),
}


def is_benchmark(name: str) -> bool:
  """Whether a data entry is a benchmark (a tfds search_qa config) rather than a path."""
  return name in BENCHMARKS


def expand_benchmarks(value: str) -> list[tuple[str, int, str | None]]:
  """A comma-separated data value ('nq,cw_grpo_400', 'data/mine.jsonl') as (name, size, split)
  per entry.

  A plain benchmark name, or a path to a question file or folder (agentjax.data.qa_files), gives
  (name, 0, None): its size and split are the config's (data.eval_size, data.eval_split). A named
  list (BENCHMARK_LISTS) gives its members, each with its own size and split. Whether a path
  exists is checked when it is read. Raises ValueError naming an unknown name, an empty value or
  an entry named twice.
  """
  out = []
  for name in (n.strip() for n in str(value).split(",")):
    if not name:
      continue
    if name in BENCHMARK_LISTS:
      out += list(BENCHMARK_LISTS[name])
    elif name in BENCHMARKS or is_data_path(name):
      out.append((name, 0, None))
    else:
      raise ValueError(f"unknown benchmark {name!r}; known: {list(BENCHMARKS)}, a list: "
                       f"{list(BENCHMARK_LISTS)}, or a path to your own questions (a "
                       f"{'/'.join(QA_SUFFIXES)} file or a folder of split files, e.g. "
                       f"data/mine.jsonl: docs/guides/data.md)")
  if not out:
    raise ValueError("names no benchmark")
  names = [n for n, _, _ in out]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise ValueError(f"names {twice} more than once")
  return out


def read_qa_jsonl(path: str, extra_fields: tuple[str, ...] = ()) -> Iterator[tuple[int, dict]]:
  """Validated records of a FlashRAG QA JSONL file, as (1-based line number, record).

  A record is {"id": str, "question": str, "golden_answers": list[str]} plus `extra_fields`
  (any of SYNTHWORLD_FIELDS: "hops" int >= 1, "chain" and "relations" non-empty lists of str);
  other keys are dropped. Integer ids are turned into str (as read_corpus does). Blank lines are
  skipped.

  Raises:
    QAFormatError: unreadable file, invalid JSON, a missing/empty/mistyped field, or an id seen
      on an earlier line; the message starts with "{path}:{line}:" and names the field.
  """
  seen: dict[str, int] = {}
  required = ("id", "question", "golden_answers", *extra_fields)
  for lineno, row in iter_json_objects(path, QAFormatError, required):
    where = f"{path}:{lineno}"
    qid = check_id(row["id"], where)
    if qid in seen:
      raise QAFormatError(f"{path}:{lineno}: field 'id' repeats {qid!r} from line {seen[qid]}")
    seen[qid] = lineno
    record = {"id": qid, "question": check_text(row["question"], where, "question"),
              "golden_answers": check_text_list(row["golden_answers"], where, "golden_answers")}
    for field in extra_fields:
      if field == "hops":
        hops = row["hops"]
        if not isinstance(hops, int) or isinstance(hops, bool) or hops < 1:
          raise QAFormatError(f"{path}:{lineno}: field 'hops' must be an integer >= 1, "
                              f"got {hops!r}")
        record["hops"] = hops
      elif field in ("chain", "relations"):
        record[field] = check_text_list(row[field], where, field)
      else:
        raise ValueError(f"unknown extra field {field!r}; known: {SYNTHWORLD_FIELDS}")
    yield lineno, record


def source_files(manual_dir: str, name: str) -> dict[str, str]:
  """{split: path} of the split files of benchmark `name` under manual_dir (see module doc).

  Raises FileNotFoundError naming where it looked, when there is no split file.
  """
  manual_dir = os.fspath(manual_dir)
  folder = os.path.join(manual_dir, name)
  if not os.path.isdir(folder):
    folder = manual_dir  # a single benchmark's folder passed directly
  files = {s: os.path.join(folder, f"{s}.jsonl") for s in SPLITS}
  files = {s: p for s, p in files.items() if os.path.isfile(p)}
  if not files:
    raise FileNotFoundError(
        f"no {'/'.join(SPLITS)}.jsonl for {name!r} in {os.path.join(manual_dir, name)} or "
        f"{manual_dir}: put the benchmark's FlashRAG files there (where to get them: "
        f"docs/guides/data.md, \"Benchmarks\"), or name your own file instead of {name!r}")
  return files


def file_sha256(path: str) -> str:
  """sha256 hex digest of a file's bytes, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def fingerprint(manual_dir: str, name: str) -> dict[str, str]:
  """{split: sha256 of its file}: what a build of `name` from manual_dir would read."""
  return {s: file_sha256(p) for s, p in source_files(manual_dir, name).items()}


class SearchQAConfig(tfds.core.BuilderConfig):
  """One benchmark. `extra_fields`: fields kept beyond id/question/golden_answers."""

  def __init__(self, *, extra_fields: tuple[str, ...] = (), homepage: str = "", **kwargs):
    super().__init__(**kwargs)
    self.extra_fields = extra_fields
    self.homepage = homepage


class SearchQA(tfds.core.GeneratorBasedBuilder):
  """Search-QA benchmarks (FlashRAG JSONL) from a manual dir, stored as array_record.

  array_record is the default file format here (tfds' default, tfrecord, is only readable
  through tf.data); pass file_format explicitly to override.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "FlashRAG JSONL; id, question, golden_answers (+ SynthWorld fields)."}
  BUILDER_CONFIGS = [
      SearchQAConfig(name=b.name, description=b.description, homepage=b.homepage,
                     extra_fields=SYNTHWORLD_FIELDS if b.name == "synthworld" else ())
      for b in _BENCHMARKS
  ]
  # tfds shows this where a manual dir is missing; the steps themselves are in the guide.
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put each benchmark's FlashRAG JSONL files at {manual_dir}/{config}/{split}.jsonl (split: "
      "train, dev or test, those present; one {\"id\", \"question\", \"golden_answers\"} "
      "object per line). Where to get them (the FlashRAG collection, Search-R1's NQ/HotpotQA) "
      "and how to lay them out: docs/guides/data.md, \"Benchmarks\". For synthworld: "
      "SynthWorld.generate(...).write(\"{manual_dir}/synthworld\") (agentjax.data.synthworld).")

  def _log_download_bytes(self) -> None:
    # tfds prints "Downloading and preparing dataset Unknown size ..." here: nothing downloads.
    _log.info("building search_qa/%s into %s", self.builder_config.name, self.data_dir)

  def _log_download_done(self) -> None:
    _log.debug("search_qa/%s built in %s", self.builder_config.name, self.data_dir)

  def __init__(self, *, file_format: str | None = "array_record", **kwargs: Any):
    super().__init__(file_format=file_format, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    features = {"id": text, "question": text, "golden_answers": tfds.features.Sequence(text)}
    extra = self.builder_config.extra_fields
    if "hops" in extra:
      features["hops"] = tfds.features.Scalar(dtype=np.int32)
    for field in ("chain", "relations"):
      if field in extra:
        features[field] = tfds.features.Sequence(text)
    return tfds.core.DatasetInfo(
        builder=self, description=self.builder_config.description,
        features=tfds.features.FeaturesDict(features),
        homepage=self.builder_config.homepage or None,
        # Saved with the dataset: load_split compares it with the files to detect stale builds.
        metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
    files = source_files(os.fspath(dl_manager.manual_dir), self.builder_config.name)
    self.info.metadata[_METADATA_KEY] = {s: file_sha256(p) for s, p in files.items()}
    return {split: self._generate_examples(path) for split, path in files.items()}

  def _generate_examples(self, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for _, record in read_qa_jsonl(path, self.builder_config.extra_fields):
      yield record["id"], record


_TFDS_DIR = os.path.dirname(tfds.__file__)


class _DropTfdsChatter(logging.Filter):
  """Drops tensorflow-datasets' own log records below ERROR: its progress lines of a local build
  and read ("Generating dataset", "Load dataset info from", a folder without dataset_info.json
  before the first build), which say nothing a run's user can act on."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR or not record.pathname.startswith(_TFDS_DIR)


def quiet_tfds(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Runs `fn` with tfds' chatter dropped from the absl logger (which tfds logs through) and its
  progress bars off (a global tfds setting, left off: agentjax never shows them)."""

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    tfds.disable_progress_bar()
    logger, chatter = logging.getLogger("absl"), _DropTfdsChatter()
    logger.addFilter(chatter)
    try:
      return fn(*args, **kwargs)
    finally:
      logger.removeFilter(chatter)

  return wrapper


@quiet_tfds
def prepare(name: str, data_dir: str, manual_dir: str, force: bool = False) -> SearchQA:
  """Builds benchmark `name` from manual_dir into data_dir unless an up-to-date build exists.

  Up to date: built by this version from files with the same sha256 as manual_dir's now. Returns
  the builder, ready for `as_data_source()`.
  """
  data_dir = os.path.expanduser(os.fspath(data_dir))
  source_files(manual_dir, name)  # no files: our message (tfds' own is an AssertionError)
  builder = SearchQA(config=name, data_dir=data_dir)
  if builder.is_prepared() and not force:
    if builder.info.metadata.get(_METADATA_KEY) == fingerprint(manual_dir, name):
      return builder
    _log.info("search_qa/%s in %s was built from other files; rebuilding", name, data_dir)
    force = True
  mode = (tfds.download.GenerateMode.FORCE_REDOWNLOAD if force
          else tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS)
  # try_download_gcs=False: never look for a prebuilt copy online; everything is local.
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=os.fspath(manual_dir), download_mode=mode, try_download_gcs=False))
  return SearchQA(config=name, data_dir=data_dir)  # a fresh builder reads the new dataset_info


def _decode(value: Any) -> Any:
  """tfds numpy values -> Python: bytes -> str, containers elementwise, numpy scalars -> int."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, dict):
    return {k: _decode(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    return _decode(value.tolist())
  if isinstance(value, (list, tuple)):
    return [_decode(v) for v in value]
  if isinstance(value, np.generic):
    return value.item()
  return value


def natural_key(qid: str) -> tuple:
  """Sort key comparing digit runs as numbers: "train_2" < "train_10"; ties by the raw id."""
  parts = re.split(r"(\d+)", qid)
  return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), qid


@quiet_tfds
def load_split(name: str, split: str, data_dir: str, manual_dir: str | None = None
               ) -> list[dict[str, Any]]:
  """The records of one split as Python dicts, sorted by `natural_key` of their ids.

  Args:
    name: a benchmark (config) name, one of BENCHMARKS.
    split: "train", "dev" or "test" (whichever the build has).
    data_dir: where tfds keeps built datasets.
    manual_dir: where the JSONL files are; when given, builds or rebuilds as needed (see
      `prepare`), else the dataset must already be built in data_dir.

  Returns:
    [{"id": str, "question": str, "golden_answers": list[str]}, ...] (synthworld adds "hops": int,
    "chain", "relations": list[str]).

  Never imports TensorFlow (array_record random access through `as_data_source`).
  """
  if name not in BENCHMARKS:
    raise ValueError(f"unknown benchmark {name!r}; known: {list(BENCHMARKS)}")
  if manual_dir is not None:
    builder = prepare(name, data_dir, manual_dir)
  else:
    builder = SearchQA(config=name, data_dir=os.path.expanduser(os.fspath(data_dir)))
    if not builder.is_prepared():
      raise FileNotFoundError(f"search_qa/{name} is not built in {data_dir}; pass manual_dir "
                              f"to build it")
  if split not in builder.info.splits:
    raise ValueError(f"search_qa/{name} has no split {split!r}; it has "
                     f"{sorted(builder.info.splits)}")
  source = builder.as_data_source(split=split)
  records = []
  chunk = 4096  # batched reads: one array_record call per chunk instead of per record
  for start in range(0, len(source), chunk):
    keys = list(range(start, min(start + chunk, len(source))))
    records += [_decode(r) for r in source.__getitems__(keys)]
  records.sort(key=lambda r: natural_key(r["id"]))
  return records
