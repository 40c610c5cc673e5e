r"""What a SynthWorld preset is like before any model sees it: sizes, hop counts, confusable
names, and how the teacher's hop queries fare against BM25 with its distractors (top 1, 2, 3).

    python launch/world_stats.py --world=v2      # last line: one JSON object

The world is written to a temporary folder (corpus, splits, demonstrations, the BM25 index).
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.data.demo_world import WORLDS

_WORLD = flags.DEFINE_enum("world", "v2", sorted(WORLDS), "SynthWorld preset (demo_world.WORLDS).")


def main(_):
  from agentjax.data.synthworld import SynthWorld
  from agentjax.retrieval.bm25 import BM25Backend
  t0 = time.time()
  world = SynthWorld.generate(**WORLDS[_WORLD.value])
  folder = tempfile.mkdtemp(prefix="world_stats-")
  paths = world.write(folder, topk=3, index_dir=os.path.join(folder, "idx"),
                      first_query="question", stop_early_rate=0.5)
  backend = BM25Backend(paths["corpus"], index_dir=os.path.join(folder, "idx"))
  family = [e.name.split(" ")[-1] for e in world.entities if e.type == "person"]
  counts = collections.Counter(family)
  with open(paths["demos"]) as f:
    demos = [json.loads(line) for line in f]
  out = {"world": _WORLD.value, "entities": len(world.entities),
         "distractor_passages": len(world.distractors),
         "questions": {s: len(q) for s, q in world.questions.items()},
         "train_hops": dict(sorted(collections.Counter(q["hops"] for q in
                                                       world.questions["train"]).items())),
         "persons_sharing_a_family_name": round(sum(counts[f] > 1 for f in family) /
                                                max(len(family), 1), 4),
         "demo_searches_mean": round(sum(d["searches"] for d in demos) / len(demos), 3)}
  for k in (1, 2, 3):
    out[f"hop_retrieval_top{k}"] = {m: round(v, 4) for m, v in
                                    world.hop_retrieval(backend, k, "train").items()}
  out["seconds"] = round(time.time() - t0, 1)
  print(json.dumps(out))


if __name__ == "__main__":
  common.run(main)
