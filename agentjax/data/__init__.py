"""Data: search-QA benchmarks through tensorflow-datasets (array_record, no TensorFlow) and
SynthWorld, a generated knowledge world with multi-hop questions and demonstrations.

    world = SynthWorld.generate(seed=0, n_entities=2000, n_train=4000, n_dev=500, n_test=500)
    world.write("data/manual/synthworld")                  # corpus, splits, demos (see synthworld)
    train = load_split("synthworld", "train", data_dir="data/tfds", manual_dir="data/manual")
    nq = load_split("nq", "test", data_dir="data/tfds", manual_dir="data/manual")

    mine = load_qa_path("data/mine.jsonl", "train")         # your own questions (qa_files)

The tfds names (SearchQA, load_split, ...) are imported lazily, so that SynthWorld alone does
not pay for importing tensorflow_datasets; `import agentjax.data.searchqa` registers the
"search_qa" builder with tfds (e.g. for tfds.builder("search_qa/nq", data_dir=...)).
"""

from __future__ import annotations

import importlib
from typing import Any

from agentjax.data.qa_files import QAFormatError, load_qa_path, read_qa_file
from agentjax.data.synthworld import (ENTITY_TYPES, QUESTION_TEMPLATES, RELATIONS, Entity,
                                      SynthWorld)

_SEARCHQA = ("BENCHMARKS", "SPLITS", "SearchQA", "SearchQAConfig",
             "fingerprint", "load_split", "natural_key", "prepare", "read_qa_jsonl",
             "source_files")

__all__ = ["ENTITY_TYPES", "Entity", "QAFormatError", "QUESTION_TEMPLATES", "RELATIONS",
           "SynthWorld", "load_qa_path", "read_qa_file", *_SEARCHQA]


def __getattr__(name: str) -> Any:
  if name in _SEARCHQA:
    return getattr(importlib.import_module("agentjax.data.searchqa"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
