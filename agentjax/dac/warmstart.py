"""Generator demonstrations for DAC's warm start (configs/dac.py:generator_sft; our stand-in).

An instruction-tuned Qwen follows the generator's instruction ("answer from the documents, or
reply <answer> insufficient evidence </answer>") from its first step; the demo's small model,
trained from scratch on search trajectories, has never seen it and would never sample an
abstention, so RL could not learn when to abstain. These demonstrations teach the format, built
from the searcher demonstrations (SynthWorld's demos.jsonl):

  for each demonstration: its queries are run against the retriever (top `topk`, as the searcher
  saw them) -> the evidence set (deduplicated, in order) -> with probability `insufficient_share`
  (0.33: with the demos' hasty teachers about half the examples end up insufficient)
  the documents holding a gold answer are removed (a random corpus document stands in when none
  is left) -> the label S (rewards.sufficient) decides the target: <answer> gold </answer> when
  S = 1, the abstention when S = 0.

So the targets are exactly the labels DAC's rewards use; a hasty-teacher demonstration that
stopped before the answer's document is an abstention example too.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from agentjax.agent.protocol import ANSWER_ONLY, SEARCH, get_protocol
from agentjax.dac import rewards as R
from agentjax.dac.roles import generator_prompt
from agentjax.retrieval import Document, SearchBackend


def generator_demos(searcher_demos: Iterable[Mapping[str, Any]], backend: SearchBackend,
                    topk: int, abstain_text: str, corpus: list[Document], seed: int = 0,
                    insufficient_share: float = 0.33, match: str = "word",
                    max_docs: int | None = None) -> list[dict[str, Any]]:
  """Demonstrations for the generator (module docstring), in the SFT format of
  agentjax/train/sft.py with protocol "answer_only" (the "question" is the whole prompt).
  max_docs: the evidence cut to its first max_docs documents, as the rollout cuts it
  (dac.max_evidence_docs)."""
  rng = np.random.default_rng(seed)
  out = []
  for demo in searcher_demos:
    protocol = get_protocol(demo.get("protocol", "search_r1"))
    queries = [a.content for a in (protocol.parse(s["text"]) for s in demo["segments"]
                                   if s["role"] == "assistant") if a.kind == SEARCH]
    golds = demo["golden_answers"]
    docs: tuple[Document, ...] = ()
    if queries:
      response = backend.search(queries, topk)
      docs = R.evidence_set([d for d, e in zip(response.documents, response.errors)
                             if e is None])[:max_docs]
    if rng.random() < insufficient_share:
      docs = tuple(d for d in docs if not R.contains_answer(d.contents, golds, match))
      if not docs:
        pick = corpus[int(rng.integers(len(corpus)))]
        docs = () if R.contains_answer(pick.contents, golds, match) else (pick,)
    ok = R.sufficient(docs, golds, match)
    answer = golds[0] if ok else abstain_text
    out.append({"id": f"generator_{demo['id']}", "question": generator_prompt(
        demo["question"], docs, abstain_text), "golden_answers": list(golds),
        "protocol": ANSWER_ONLY.name, "sufficient": bool(ok),
        "segments": [{"role": "assistant", "text": f"<answer> {answer} </answer>"}]})
  return out


def write_generator_demos(config: Any, seed: int | None = None,
                          insufficient_share: float = 0.33) -> str:
  """Writes the generator demonstrations of a `configs/dac.py:generator_sft`-like config to its
  sft.demos (atomically), from its world's searcher demonstrations ({data.manual_dir}/
  demos.jsonl), its retriever (BM25 over retrieval.corpus_path, top retrieval.topk) and its
  dac.abstain_text / dac.sufficiency_match. Returns the path."""
  import json
  import os

  from agentjax.jsonl import iter_json_objects
  from agentjax.retrieval import load_corpus, make_backend
  r = config.retrieval
  backend = make_backend("bm25", corpus_path=os.path.expanduser(r.corpus_path),
                         index_dir=os.path.expanduser(r.index_dir) if r.index_dir else None)
  corpus = [Document(row["id"], row["contents"], 0.0)
            for row in load_corpus(os.path.expanduser(r.corpus_path))]
  source = os.path.join(os.path.expanduser(config.data.manual_dir), "demos.jsonl")
  demos = [row for _, row in iter_json_objects(source, ValueError, what="demonstrations")]
  rows = generator_demos(demos, backend, r.topk, config.dac.abstain_text, corpus,
                         seed=config.seed if seed is None else seed,
                         insufficient_share=insufficient_share, match=config.dac.sufficiency_match,
                         max_docs=config.dac.max_evidence_docs)
  path = os.path.expanduser(config.sft.demos)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path + ".tmp", "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  os.replace(path + ".tmp", path)
  return path


__all__ = ["generator_demos", "write_generator_demos"]
