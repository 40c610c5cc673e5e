"""The SynthWorld of `make demo` and of the IGPO-vs-GRPO study (launch/demo.py, launch/compare.py):
the world's files, its BM25 index and its BPE tokenizer, built once per folder and settings."""

from __future__ import annotations

import json
import math
import os
import time

from agentjax.jsonl import iter_json_objects

# 2000 invented entities, 1- and 2-hop questions only (the tiny models cannot do 3 hops).
DEMO_WORLD = dict(seed=0, n_entities=2000, n_train=4000, n_dev=500, n_test=500,
                  hop_weights=(1.0, 1.0, 0.0))
# SynthWorld v2, the research world: 1- to 4-hop questions (0.2, 0.3, 0.3, 0.2), 1.5
# distractor passages per entity that name two entities and a relation's words without a fact,
# and 30% of persons sharing a family name with another: searches can be wasted inside one
# trajectory, and more than one round is needed to answer most questions. 1000 dev and 1000
# test questions (the run protocol's eval size).
WORLD_V2 = dict(seed=0, n_entities=3000, n_train=6000, n_dev=1000, n_test=1000,
                hop_weights=(0.2, 0.3, 0.3, 0.2), distractors=1.5, confusable_rate=0.3)
WORLDS = {"demo": DEMO_WORLD, "v2": WORLD_V2}


def build_demo_world(folder: str, *, topk: int, vocab_size: int = 1024,
                     stop_early_rate: float = 0.5, world: str = "demo") -> str:
  """SynthWorld files + tokenizer in `folder` (BM25 index next to it in ../bm25_index), unless
  they are there with the same settings (a demo_settings.json stamp). Returns what it did.

  stop_early_rate: share of multi-hop demonstrations whose (hasty) teacher answers a bridge
  entity early (SynthWorld.demonstrations). world: a WORLDS preset ("demo", "v2")."""
  if world not in WORLDS:
    raise ValueError(f"unknown world {world!r}; known: {sorted(WORLDS)}")
  preset = WORLDS[world]
  from agentjax.data.synthworld import SynthWorld
  from agentjax.data.tokenizer import synthworld_texts, train_tokenizer
  stamp = os.path.join(folder, "demo_settings.json")
  settings = dict(preset, vocab_size=vocab_size, topk=topk, first_query="question",
                  hop_weights=list(preset["hop_weights"]), stop_early_rate=stop_early_rate)
  if os.path.exists(stamp):
    with open(stamp) as f:
      if json.load(f) == settings:
        return f"SynthWorld and tokenizer: reusing {folder}"
  t0 = time.time()
  synth = SynthWorld.generate(**preset)
  synth.write(folder, topk=topk, index_dir=os.path.join(os.path.dirname(folder), "bm25_index"),
              first_query="question", stop_early_rate=stop_early_rate)
  train_tokenizer(synthworld_texts(folder), os.path.join(folder, "tokenizer"), vocab_size)
  with open(stamp, "w") as f:
    json.dump(settings, f)
  sizes = {s: len(q) for s, q in synth.questions.items()}
  return (f"SynthWorld: {len(synth.entities)} entities, {len(synth.distractors)} distractor "
          f"passages, questions {sizes}, BPE tokenizer "
          f"({vocab_size}) in {folder} ({time.time() - t0:.0f} s)")


def use_demo_world(config, root: str) -> None:
  """Points a demo config's data, retrieval, tokenizer and SFT paths at the world under `root`
  ({root}/synthworld, {root}/tfds, {root}/bm25_index)."""
  world = os.path.join(root, "synthworld")
  config.data.manual_dir = world
  config.data.data_dir = os.path.join(root, "tfds")
  config.retrieval.corpus_path = os.path.join(world, "corpus.jsonl")
  config.retrieval.index_dir = os.path.join(root, "bm25_index")
  config.model.tokenizer_path = os.path.join(world, "tokenizer")
  config.sft.demos = os.path.join(world, "demos.jsonl")
  config.sft.corpus_path = os.path.join(world, "corpus.jsonl")


def hops_by_id(split_path: str) -> dict[str, int]:
  """{question id: hop count} of a SynthWorld split file ({root}/synthworld/{split}.jsonl)."""
  rows = iter_json_objects(split_path, ValueError, ("id", "hops"), "SynthWorld split")
  return {row["id"]: row["hops"] for _, row in rows}


def f1_by_hops(rows: list[dict], hops: dict[str, int]) -> dict[int, float]:
  """{hop count: mean F1} of per-question eval rows ({"id", "f1", ...}), `hops` from hops_by_id."""
  out = {}
  for h in sorted({hops[r["id"]] for r in rows}):
    scores = [r["f1"] for r in rows if hops[r["id"]] == h]
    out[h] = sum(scores) / len(scores)
  return out


def paired_gain(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
  """Mean per-question score gain after - before and its standard error (paired: the same
  questions; every id of `before` must be in `after`)."""
  d = [after[q] - s for q, s in before.items()]
  n = len(d)
  mean = sum(d) / n
  var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
  return mean, math.sqrt(var / n)


def hop_table(dev_path: str, before: list[dict], after: list[dict]) -> list[str]:
  """Rows per hop count of two evals' per-question results ({"id", "f1", "turns"}) on a
  SynthWorld dev split: questions, F1 and answers given before the last hop was searched
  (turns <= hops: the shortcut the hasty teacher showed), before -> after."""
  hops = hops_by_id(dev_path)
  f1 = [f1_by_hops(result, hops) for result in (before, after)]
  rows = []
  for h in sorted(set(hops.values())):
    cells = []
    for result, f1_at in zip((before, after), f1):
      qs = [q for q in result if hops[q["id"]] == h]
      cells.append(f"F1 {f1_at.get(h, 0.0):.3f}, answered early "
                   f"{sum(q['turns'] <= h for q in qs)}")
    rows.append(f"{h}-hop ({len(qs)} questions): {cells[0]} -> {cells[1]}")
  return rows
