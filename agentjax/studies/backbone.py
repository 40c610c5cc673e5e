"""The research backbone's SFT corpus: one mixed JSONL, so that one from-scratch model
can be the starting point of every study (configs/base.py preset "research"; launch/backbone.py).

    rows = backbone_demos(searcher_demos, backend, topk=3, corpus=docs, entities=names,
                          abstain_text="insufficient evidence", max_calls=6)
    write_jsonl_atomic(path, rows)

Three kinds of rows, in the SFT format of agentjax/train/sft.py (sft.protocols="answer_only"
lets one run read both protocols):

  search     the world's teacher demonstrations (SynthWorld.demonstrations: the careful
             teacher and, at stop_early_rate, the hasty one), as the demo trains on; the
             search agent of every RL method.
  evidence   DAC's generator rows (agentjax/dac/warmstart.generator_demos): the evidence set
             a demonstration's queries retrieve, with the gold documents removed from a share
             of them, answered when it holds the answer and abstained on (abstain_text) when
             it does not; protocol answer_only. What DAC's generator needs, and reading
             comprehension over distractors for every method.
  following  the demonstrations again with a rubric's shadow suffix before every turn after
             the first, a rubric the teacher's action meets (agentjax/coreact/warmstart.
             rubric_following_demos); the suffix is fed, not learned. What Co-ReAct's guided
             agent needs: an action that follows the rubric.

evidence_share and following_share: rows of each kind per search row (drawn from the search rows
at random, seeded). The corpus passages are mixed in as plain text by the SFT run itself
(sft.corpus_path), as in the demo.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from agentjax.coreact.context import BranchContext
from agentjax.data.searchqa import file_sha256

KINDS = ("search", "evidence", "following")


def _pick(rows: Sequence[Mapping[str, Any]], share: float, rng: np.random.Generator
          ) -> list[Mapping[str, Any]]:
  """round(share * len(rows)) rows drawn without replacement (share <= 1), in file order."""
  if not 0.0 <= share <= 1.0:
    raise ValueError(f"a share of rows must be in [0, 1], got {share}")
  n = int(round(share * len(rows)))
  keep = np.sort(rng.choice(len(rows), size=n, replace=False)) if n else []
  return [rows[int(i)] for i in keep]


def backbone_demos(searcher_demos: Sequence[Mapping[str, Any]], backend: Any, *, topk: int,
                   corpus: list, entities: frozenset[str], abstain_text: str, max_calls: int,
                   seed: int = 0, evidence_share: float = 0.5, following_share: float = 0.5,
                   insufficient_share: float = 0.33, max_docs: int | None = None,
                   match: str = "word") -> list[dict[str, Any]]:
  """The mixed corpus (module docstring): every search row, then the evidence rows, then the
  following rows; each row's "kind" says which. The SFT run shuffles them."""
  from agentjax.coreact.warmstart import rubric_following_demos
  from agentjax.dac.warmstart import generator_demos
  rng = np.random.default_rng(seed)
  search = [dict(d, kind="search") for d in searcher_demos]
  evidence = generator_demos(_pick(searcher_demos, evidence_share, rng), backend, topk,
                             abstain_text, corpus, seed=seed,
                             insufficient_share=insufficient_share, match=match,
                             max_docs=max_docs)
  multi_turn = [d for d in searcher_demos if len(d["segments"]) >= 3]
  following = rubric_following_demos(_pick(multi_turn, following_share, rng), backend, topk,
                                     entities, max_calls, seed=seed)
  return (search + [dict(r, kind="evidence") for r in evidence] +
          [dict(r, kind="following") for r in following])


def backbone_texts(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
  """Tokenizer training text of the rows the world's own texts do not hold: the evidence rows'
  prompts and answers (the generator's instruction, the abstention) and the rubric suffixes."""
  for row in rows:
    if row.get("kind") == "evidence":
      yield row["question"]
      yield from (s["text"] for s in row["segments"])
    elif row.get("kind") == "following":
      yield from (s["text"] for s in row["segments"] if s["role"] == "hook")


def kind_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
  counts = {k: 0 for k in KINDS}
  for row in rows:
    counts[row.get("kind", "search")] += 1
  return counts


# ------------------------------------------------------------------------------------ building


def _world_parts(config: Any) -> tuple[Any, list, frozenset[str]]:
  """(BM25 backend, corpus Documents, entity names) of a config's world."""
  from agentjax.coreact.executor import load_entities
  from agentjax.retrieval import Document, load_corpus, make_backend
  r = config.retrieval
  backend = make_backend("bm25", corpus_path=os.path.expanduser(r.corpus_path),
                         index_dir=os.path.expanduser(r.index_dir) if r.index_dir else None)
  corpus = [Document(row["id"], row["contents"], 0.0)
            for row in load_corpus(os.path.expanduser(r.corpus_path))]
  entities = load_entities(os.path.join(os.path.expanduser(config.data.manual_dir),
                                        "entities.jsonl"))
  return backend, corpus, entities


def build(config: Any, *, world: str = "v2", vocab_size: int = 2048,
          stop_early_rate: float = 0.5, evidence_share: float = 0.5,
          following_share: float = 0.5) -> dict[str, Any]:
  """The world, the mixed corpus and the tokenizer of a `research`-like SFT config, where its
  paths say (data.manual_dir: the world; sft.demos: the corpus; model.tokenizer_path: a BPE
  trained on the world's texts and the corpus' own (backbone_texts)). Reused when a stamp next
  to the corpus records the same settings. Returns {"world", "corpus", "tokenizer", "counts",
  "reused"}."""
  from agentjax.data.demo_world import build_demo_world
  from agentjax.data.tokenizer import synthworld_texts, train_tokenizer
  from agentjax.jsonl import iter_json_objects, write_jsonl_atomic
  world_dir = os.path.expanduser(config.data.manual_dir)
  corpus_path = os.path.expanduser(config.sft.demos)
  tokenizer_dir = os.path.expanduser(config.model.tokenizer_path)
  settings = dict(world=world, vocab_size=vocab_size, stop_early_rate=stop_early_rate,
                  evidence_share=evidence_share, following_share=following_share,
                  topk=config.retrieval.topk, max_calls=config.rollout.max_turns,
                  abstain_text=config.dac.abstain_text, seed=config.seed,
                  max_docs=config.dac.max_evidence_docs)
  stamp = corpus_path + ".settings.json"
  build_demo_world(world_dir, topk=config.retrieval.topk, vocab_size=vocab_size,
                   stop_early_rate=stop_early_rate, world=world)
  if os.path.exists(stamp) and os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
    with open(stamp) as f:
      if json.load(f) == settings:
        rows = [r for _, r in iter_json_objects(corpus_path, ValueError, what="corpus")]
        return {"world": world_dir, "corpus": corpus_path, "tokenizer": tokenizer_dir,
                "counts": kind_counts(rows), "reused": True}
  backend, corpus, entities = _world_parts(config)
  demos = [r for _, r in iter_json_objects(os.path.join(world_dir, "demos.jsonl"), ValueError,
                                           what="demonstrations")]
  rows = backbone_demos(demos, backend, topk=config.retrieval.topk, corpus=corpus,
                        entities=entities, abstain_text=config.dac.abstain_text,
                        max_calls=config.rollout.max_turns, seed=config.seed,
                        evidence_share=evidence_share, following_share=following_share,
                        max_docs=config.dac.max_evidence_docs,
                        match=config.dac.sufficiency_match)
  os.makedirs(os.path.dirname(corpus_path) or ".", exist_ok=True)
  write_jsonl_atomic(corpus_path, rows)
  train_tokenizer(itertools.chain(synthworld_texts(world_dir), backbone_texts(rows)),
                  tokenizer_dir, vocab_size)
  with open(stamp, "w") as f:
    json.dump(settings, f)
  return {"world": world_dir, "corpus": corpus_path, "tokenizer": tokenizer_dir,
          "counts": kind_counts(rows), "reused": False}


# ---------------------------------------------------------------------------------------- gate


def dev_rows(config: Any, world: str = "v2", stop_early_rate: float = 0.5, n: int = 1000
             ) -> tuple[list[dict], list[dict]]:
  """(evidence rows, following rows) built as the corpus' are, from the dev split's teacher
  demonstrations (the world regenerated from its preset: its files hold no dev demos), the
  first n dev questions."""
  from agentjax.data.demo_world import WORLDS
  from agentjax.data.synthworld import SynthWorld
  backend, corpus, entities = _world_parts(config)
  synth = SynthWorld.generate(**WORLDS[world])
  synth.questions["dev"] = synth.questions["dev"][:n]
  demos = synth.demonstrations(backend, config.retrieval.topk, split="dev",
                               first_query="question", stop_early_rate=stop_early_rate)
  rows = backbone_demos(demos, backend, topk=config.retrieval.topk, corpus=corpus,
                        entities=entities, abstain_text=config.dac.abstain_text,
                        max_calls=config.rollout.max_turns, seed=config.seed + 1,
                        evidence_share=1.0, following_share=1.0,
                        max_docs=config.dac.max_evidence_docs,
                        match=config.dac.sufficiency_match)
  return ([r for r in rows if r["kind"] == "evidence"],
          [r for r in rows if r["kind"] == "following"])


def _complete(completer: Any, prompts: list[list[int]], max_new_tokens: int, stops: list[str],
              batch: int = 64) -> list[str]:
  """Greedy completions, decoded with their stop string (an action's closing tag) kept."""
  out = []
  for i in range(0, len(prompts), batch):
    for c in completer.complete(prompts[i:i + batch], max_new_tokens=max_new_tokens, stop=stops):
      out.append(completer.tokenizer.decode(list(c.token_ids), skip_special_tokens=False))
  return out


def evidence_accuracy(completer: Any, rows: Sequence[Mapping[str, Any]], abstain_text: str,
                      use_chat_template: bool = True) -> dict[str, float]:
  """The generator's reading on evidence rows (greedy): accuracy (EM against the gold answers)
  on sufficient sets, the abstention rate on insufficient ones, and the abstention rate on
  sufficient ones (abstaining where the answer is there)."""
  from agentjax.agent.protocol import ANSWER, ANSWER_ONLY
  from agentjax.agent.rollout import prompt_ids
  from agentjax.dac.rewards import correct, is_abstention
  prompts = [prompt_ids(completer.tokenizer, ANSWER_ONLY, r["question"], use_chat_template)
             for r in rows]
  texts = _complete(completer, prompts, 32, ["</answer>"])
  answers = [a.content if a.kind == ANSWER else None
             for a in (ANSWER_ONLY.parse(t) for t in texts)]
  ok = np.array([r["sufficient"] for r in rows], bool)
  right = np.array([correct(a, r["golden_answers"], abstain_text)
                    for a, r in zip(answers, rows)], bool)
  abst = np.array([is_abstention(a, abstain_text) for a in answers], bool)
  mean = lambda x: float(x.mean()) if x.size else float("nan")  # noqa: E731
  return {"sufficient_n": int(ok.sum()), "insufficient_n": int((~ok).sum()),
          "accuracy_sufficient": mean(right[ok]), "abstain_insufficient": mean(abst[~ok]),
          "abstain_sufficient": mean(abst[ok])}


def rubric_following(completer: Any, rows: Sequence[Mapping[str, Any]], backend: Any, topk: int,
                     entities: frozenset[str], max_calls: int, use_chat_template: bool = True
                     ) -> dict[str, float]:
  """The rubric-following rate (greedy): at every hook of the following rows, the share of the
  model's own next actions, generated after the context and the rubric's shadow suffix, that
  meet the rubric in full (verify score 1); beside it the share that meet it without the suffix
  (the same context, unguided): following is the difference."""
  from agentjax.agent.protocol import SEARCH_R1
  from agentjax.coreact.executor import verify_score
  from agentjax.coreact.rubric import parse_rubric
  from agentjax.coreact.warmstart import demo_turns
  from agentjax.train.sft import demo_prefix_ids
  guided, plain, rubrics, contexts = [], [], [], []
  for row, turns in zip(rows, demo_turns(rows, backend, topk)):
    bare = dict(row, segments=[s for s in row["segments"] if s["role"] != "hook"])
    t = 0
    for k, seg in enumerate(row["segments"]):
      if seg["role"] == "assistant":
        t += 1
      if seg["role"] != "hook":
        continue
      guided.append(demo_prefix_ids(completer.tokenizer, row, k + 1, SEARCH_R1,
                                    use_chat_template))
      plain.append(demo_prefix_ids(completer.tokenizer, bare, 2 * t, SEARCH_R1,
                                   use_chat_template))
      rubrics.append(parse_rubric(seg["text"]))
      contexts.append(BranchContext(question=row, turns=tuple(turns[:t]), max_calls=max_calls))
  stops = ["</search>", "</answer>"]
  met = {}
  for name, prompts in (("guided", guided), ("unguided", plain)):
    texts = _complete(completer, prompts, 64, stops)
    met[name] = np.array([verify_score(r, c, text, entities) >= 1.0 - 1e-9
                          for r, c, text in zip(rubrics, contexts, texts)], bool)
  return {"hooks": len(rubrics), "following_rate": float(met["guided"].mean()),
          "unguided_rate": float(met["unguided"].mean())}


def gate(config: Any, hf_path: str, *, world: str = "v2", stop_early_rate: float = 0.5,
         n: int = 1000) -> dict[str, Any]:
  """The backbone's gate before any RL, greedy, on dev: the search agent's F1 per
  hop count (the first n dev questions, the eval of every study), the generator's reading of
  evidence sets, and the rubric-following rate. Goals: 1-hop F1 >= 0.8 (GATE)."""
  import copy

  from agentjax.data.demo_world import f1_by_hops, hops_by_id
  from agentjax.sampling.complete import Completer
  from agentjax.train.evaluation import eval_benchmarks
  c = copy.deepcopy(config)
  c.data.eval_split = "dev"
  c.data.eval_size = n
  searched = eval_benchmarks(c, hf_path=hf_path)
  bench = c.data.eval.split(",")[0]
  per_q = searched["per_question"][bench]
  hops = hops_by_id(os.path.join(os.path.expanduser(c.data.manual_dir), "dev.jsonl"))
  by_hops = f1_by_hops(per_q, hops)
  evidence, following = dev_rows(c, world, stop_early_rate, n)
  completer = Completer.from_hf(hf_path, max_total_tokens=config.rollout.max_total_tokens)
  backend, _, entities = _world_parts(c)
  out = {"dev_n": len(per_q), "f1": float(np.mean([q["f1"] for q in per_q])),
         "f1_by_hops": {str(h): round(v, 4) for h, v in by_hops.items()},
         "evidence": evidence_accuracy(completer, evidence, c.dac.abstain_text,
                                       c.rollout.use_chat_template),
         "following": rubric_following(completer, following, backend, c.retrieval.topk,
                                       entities, c.rollout.max_turns,
                                       c.rollout.use_chat_template)}
  out["passed"] = bool(by_hops.get(1, 0.0) >= GATE["f1_1hop"])
  return out


# ------------------------------------------------------------------ the shipped backbone -------

# Where the backbone lives in the repository (relative to its root): one Hugging Face folder per
# start (final: the finished SFT; early: an early SFT checkpoint, the sparse-reward regime's
# start) and manifest.json (the world's and corpus' settings, the SFT config, the gate, the
# sha256 of every shipped file and of the world's files the backbone was trained on).
SHIPPED = "backbones/research_v2"
STARTS = ("final", "early")
# The world's files a study reads (retrieval corpus, questions, entities): rebuilt from the
# world's preset (launch/backbone.py --stages=build, 20 s) and checked against the manifest.
WORLD_FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "entities.jsonl")


def export_step(config: Any, sft_dir: str, step: int, out: str) -> str:
  """The SFT run's checkpoint at `step` ({sft_dir}/checkpoints/<step>) exported as a Hugging Face
  folder at `out` (an earlier model than the run's final export: the sparse-reward start).
  config: the SFT config the run trained with (its model shape and optimizer give the stored
  state's structure). Returns the absolute path."""
  import jax

  from agentjax.models.qwen.checkpoint import save_hf
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train.builders import TrainTarget, load_model, make_checkpointer
  from agentjax.train.checkpoint import abstract_state
  from agentjax.train.optim import make_optimizer
  s, o = config.sft, config.optimizer
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, tokenizer = load_model(config, mesh)  # from scratch: the shapes only
  target = TrainTarget.build(config, cfg, params, mesh)
  optimizer = make_optimizer(s.lr, max(1, s.steps // 20), s.steps, o.weight_decay,
                             o.clip_norm or None, o.final_lr_ratio, o.b2)
  ckpt = make_checkpointer(config, sft_dir, target)
  with use_mesh(mesh):
    state = {"params": params, "opt_state": jax.eval_shape(optimizer.init, params)}
    restored = ckpt.restore_or_none(abstract_state(state), step=step)
  ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no checkpoint in {sft_dir}/checkpoints")
  return save_hf(out, cfg, restored[0]["params"], tokenizer)


def world_hashes(world_dir: str) -> dict[str, str]:
  """{file: sha256} of the world's files a study reads (WORLD_FILES)."""
  return {name: file_sha256(os.path.join(world_dir, name)) for name in WORLD_FILES}


def ship(exports: Mapping[str, str], dest: str, *, world_dir: str, sft_dir: str,
         record: Mapping[str, Any]) -> dict[str, Any]:
  """Copies each export ({start: HF folder}) into {dest}/{start}/ and writes {dest}/manifest.json:
  `record` (settings, gate, starts' measurements: whatever the caller knows), the SFT run's
  recorded config, the world's file hashes and every shipped file's sha256. Each start's folder
  is written beside its target and swapped in whole. Returns the manifest."""
  import shutil
  manifest = dict(record)
  with open(os.path.join(sft_dir, "config.json")) as f:
    manifest["sft_config"] = json.load(f)
  manifest["world_sha256"] = world_hashes(world_dir)
  manifest["files"] = {}
  os.makedirs(dest, exist_ok=True)
  for start, src in exports.items():
    tmp, final = os.path.join(dest, f".{start}.tmp"), os.path.join(dest, start)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if os.path.isdir(final):
      shutil.rmtree(final)
    os.replace(tmp, final)
    for name in sorted(os.listdir(final)):
      manifest["files"][f"{start}/{name}"] = file_sha256(os.path.join(final, name))
  tmp = os.path.join(dest, "manifest.json.tmp")
  with open(tmp, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(tmp, os.path.join(dest, "manifest.json"))
  return manifest


def check_shipped(dest: str, world_dir: str | None = None) -> dict[str, Any]:
  """The manifest of the backbone at `dest`, after checking every shipped file's sha256 and, given
  world_dir, that the world there is the one the backbone was trained on (its files' hashes).
  Raises ValueError naming the first file that differs or is missing."""
  path = os.path.join(dest, "manifest.json")
  if not os.path.exists(path):
    raise ValueError(f"{path}: no manifest; the backbone is rebuilt and shipped by "
                     "python launch/backbone.py --stages=build,sft,early,gate,ship")
  with open(path) as f:
    manifest = json.load(f)
  checks = [(os.path.join(dest, name), digest) for name, digest in manifest["files"].items()]
  if world_dir is not None:
    checks += [(os.path.join(world_dir, name), digest)
               for name, digest in manifest["world_sha256"].items()]
  for file, digest in checks:
    if not os.path.exists(file):
      raise ValueError(f"{file}: missing (manifest {path})")
    got = file_sha256(file)
    if got != digest:
      raise ValueError(f"{file}: sha256 {got[:12]}... differs from {digest[:12]}... in {path}"
                       + ("" if file.startswith(dest) else ": this world is not the one the "
                          "backbone was trained on (rebuild it: launch/backbone.py "
                          "--stages=build)"))
  return manifest


GATE = {"f1_1hop": 0.8}


__all__ = ["GATE", "KINDS", "SHIPPED", "STARTS", "WORLD_FILES", "backbone_demos",
           "backbone_texts", "build", "check_shipped", "dev_rows", "evidence_accuracy",
           "export_step", "file_sha256", "gate", "kind_counts", "rubric_following", "ship",
           "world_hashes"]
