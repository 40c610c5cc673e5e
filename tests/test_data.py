"""Data layer: SynthWorld (determinism, names, schema invariants, disjoint splits, answers that
follow the chain, corpus, BM25-backed demonstrations) and the tfds search-QA builder (FlashRAG
JSONL -> array_record -> as_data_source, with no TensorFlow; malformed lines named precisely)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from agentjax.agent.protocol import ANSWER, SEARCH, SEARCH_R1, TOOL_CALL, format_documents
from agentjax.data import (BENCHMARKS, QUESTION_TEMPLATES, RELATIONS, QAFormatError, SearchQA,
                           SynthWorld, load_qa_path, load_split, natural_key, prepare,
                           read_qa_file, read_qa_jsonl, source_files)
from agentjax.retrieval import BM25Backend, load_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(n_entities=200, n_train=150, n_dev=30, n_test=30)
TOPK = 3
# Real places and given names (checked independently of the generator's own blocklist).
REAL_NAMES = {
    "paris", "london", "berlin", "rome", "madrid", "lisbon", "oslo", "lima", "tokyo", "delhi",
    "cairo", "nairobi", "kigali", "bamako", "dakar", "panama", "toronto", "sydney", "moscow",
    "kenya", "mali", "peru", "chad", "cuba", "fiji", "iran", "iraq", "laos", "togo", "tonga",
    "samoa", "ghana", "nepal", "spain", "china", "japan", "india", "egypt", "italy", "anna",
    "maria", "sara", "laura", "linda", "nina", "nora", "rosa", "david", "peter", "john", "ivan",
    "boris", "omar", "karl", "hans", "otto", "juan", "pedro", "mario", "marco", "luna", "maya"}
# What each relation's sentence says in the passage of its subject.
STATES = {"born_in": "{s} was born in {o}.", "works_for": "{s} works for {o}.",
          "located_in": "{s} is a city located in {o}.", "capital": "The capital of {s} is {o}.",
          "founded_by": "{s} was founded by {o}.",
          "headquartered_in": "{s} is an organization headquartered in {o}."}


def _quiet_tfds():
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()


@pytest.fixture(scope="module")
def world():
  return SynthWorld.generate(seed=7)  # the default size: 2000 entities, 5000 questions


@pytest.fixture(scope="module")
def written(world, tmp_path_factory):
  out = tmp_path_factory.mktemp("synthworld")
  index_dir = str(tmp_path_factory.mktemp("bm25"))
  paths = world.write(str(out), topk=TOPK, index_dir=index_dir)
  backend = BM25Backend(paths["corpus"], index_dir=index_dir)
  assert not backend.built  # write() built and cached the index; this one loads it
  return paths, backend


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _subject(q):
  return q["chain"][0]


# ------------------------------------------------------------------ SynthWorld


def test_generation_is_deterministic_per_seed_and_differs_across_seeds():
  a, b, c = (SynthWorld.generate(seed=s, **SMALL) for s in (3, 3, 4))
  assert a.entities == b.entities and a.relations == b.relations
  assert a.questions == b.questions and a.corpus() == b.corpus()
  assert [e.name for e in a.entities] != [e.name for e in c.entities]
  assert a.questions["train"] != c.questions["train"]


def test_generation_at_full_size():
  """The demo's size (its speed is measured by `python launch/bench.py synthworld`)."""
  w = SynthWorld.generate(seed=1, n_entities=2000, n_train=4000, n_dev=500, n_test=500)
  assert len(w.entities) == 2000 and sum(map(len, w.questions.values())) == 5000
  assert len(w.corpus()) == 2000


def test_names_are_unique_invented_and_pronounceable(world):
  names = [e.name for e in world.entities]
  assert len(set(names)) == len(names)
  words = [w.lower() for e in world.entities
           for w in (e.name.split()[:1] if e.type == "organization" else e.name.split())]
  assert len(set(words)) == len(words)  # no name word shared, besides organization suffixes
  for e in world.entities:
    assert all(re.fullmatch(r"[A-Z][a-z]{3,}", w) for w in e.name.split()), e.name
    assert len(e.name.split()) == {"person": 2, "organization": 2}.get(e.type, 1)
  assert not set(words) & REAL_NAMES
  for w in words:  # pronounceable: no run of more than 3 consonants
    assert not re.search(r"[^aeiouy]{4}", w), w


def test_relations_satisfy_the_schema(world):
  types = [e.type for e in world.entities]
  by_type = {t: {i for i, x in enumerate(types) if x == t} for t in set(types)}
  assert set(world.relations) == set(RELATIONS)
  for rel, (subj_type, obj_type) in RELATIONS.items():
    table = world.relations[rel]
    assert set(table) == by_type[subj_type], rel          # defined for every subject, only them
    assert all(types[o] == obj_type for o in table.values()), rel
  located, capital = world.relations["located_in"], world.relations["capital"]
  for country, city in capital.items():
    assert located[city] == country                       # a capital lies in its own country
  assert set(located.values()) == by_type["country"]      # every country has a city
  assert len(set(capital.values())) == len(capital)       # no city is capital of two countries


def test_splits_have_sizes_disjoint_subjects_and_hops(world):
  sizes = {s: len(q) for s, q in world.questions.items()}
  assert sizes == {"train": 4000, "dev": 500, "test": 500}
  subjects = {s: {_subject(q) for q in qs} for s, qs in world.questions.items()}
  assert not subjects["train"] & subjects["dev"]
  assert not subjects["train"] & subjects["test"]
  assert not subjects["dev"] & subjects["test"]
  for split, qs in world.questions.items():
    assert len({q["id"] for q in qs}) == len(qs)
    assert {q["hops"] for q in qs} == {1, 2, 3}, split
    for q in qs:
      assert q["hops"] == len(q["relations"]) == len(q["chain"]) - 1
      assert tuple(q["relations"]) in QUESTION_TEMPLATES
      assert len(set(q["chain"])) == len(q["chain"])       # no loops, one answer
      assert _subject(q) in q["question"] and q["golden_answers"] == [q["chain"][-1]]


def test_gold_answers_follow_the_chain_in_the_world(world):
  # Independent walk over the relation tables, from names to indices and back.
  index = {e.name: i for i, e in enumerate(world.entities)}
  for qs in world.questions.values():
    for q in qs:
      node = index[_subject(q)]
      for step, rel in enumerate(q["relations"]):
        assert world.entities[node].type == RELATIONS[rel][0]
        node = world.relations[rel][node]
        assert world.entities[node].name == q["chain"][step + 1]
      assert q["golden_answers"] == [world.entities[node].name]


def test_corpus_passages_state_their_relations(world):
  corpus = world.corpus()
  assert len(corpus) == len(world.entities)
  assert len({row["id"] for row in corpus}) == len(corpus)
  for i, (row, e) in enumerate(zip(corpus, world.entities)):
    title, body = row["contents"].split("\n", 1)
    assert row["id"] == e.id and title == f'"{e.name}"'
    for rel, (subj_type, _) in RELATIONS.items():
      if subj_type == e.type:
        obj = world.entities[world.relations[rel][i]].name
        assert STATES[rel].format(s=e.name, o=obj) in body, (rel, body)


def test_write_lays_out_flashrag_files(world, written):
  paths, _ = written
  out = os.path.dirname(paths["corpus"])
  assert sorted(os.listdir(out)) == sorted(["corpus.jsonl", "train.jsonl", "dev.jsonl",
                                            "test.jsonl", "demos.jsonl", "entities.jsonl",
                                            "world.json"])
  assert load_corpus(paths["corpus"]) == world.corpus()
  for split in ("train", "dev", "test"):
    assert _read_jsonl(paths[split]) == world.questions[split]
    list(read_qa_jsonl(paths[split], ("hops", "chain", "relations")))  # valid FlashRAG QA
  assert len(_read_jsonl(paths["demos"])) == 4000
  entities = _read_jsonl(paths["entities"])
  assert [(e["id"], e["name"], e["type"]) for e in entities] == \
      [(e.id, e.name, e.type) for e in world.entities]
  with open(paths["world"]) as f:
    assert json.load(f)["seed"] == 7


def test_written_files_are_deterministic(tmp_path):
  w = SynthWorld.generate(seed=5, **SMALL)
  a = w.write(str(tmp_path / "a"), index_dir=str(tmp_path / "idx"))
  b = SynthWorld.generate(seed=5, **SMALL).write(str(tmp_path / "b"),
                                                   index_dir=str(tmp_path / "idx"))
  for key in a:
    with open(a[key], "rb") as fa, open(b[key], "rb") as fb:
      assert fa.read() == fb.read(), key


def test_bm25_finds_the_subject_passage_for_every_demo_query(world, written):
  _, backend = written
  index = {e.name: e.id for e in world.entities}
  queries, expected = [], []
  for q in world.questions["train"]:
    for h, rel in enumerate(q["relations"]):
      queries.append(SynthWorld.hop_query(rel, q["chain"][h]))
      expected.append(index[q["chain"][h]])
  docs = backend.search(queries, TOPK).documents
  assert all(d and d[0].id == want for d, want in zip(docs, expected))


def test_demonstrations_parse_turn_by_turn_and_match_real_search(world, written):
  paths, backend = written
  demos = _read_jsonl(paths["demos"])
  questions = {q["id"]: q for q in world.questions["train"]}
  searches = []  # (query, observation text) of every search turn
  for demo in demos:
    q = questions[demo["id"]]
    segs = demo["segments"]
    assert demo["protocol"] == "search_r1" and demo["golden_answers"] == q["golden_answers"]
    assert [s["role"] for s in segs] == ["assistant", "observation"] * q["hops"] + ["assistant"]
    for turn, seg in enumerate(segs[0::2]):
      assert seg["text"].startswith("<think>")
      assert seg["text"].endswith(SEARCH_R1.stop_strings)  # what the rollout stops generation at
      action = SEARCH_R1.parse(seg["text"])
      if turn < q["hops"]:
        assert action.kind == SEARCH
        searches.append((action.content, segs[2 * turn + 1]["text"]))
      else:
        assert action.kind == ANSWER and action.content == q["golden_answers"][0]
    # The last search's documents hold the gold answer.
    assert q["golden_answers"][0] in segs[-2]["text"]
  docs = backend.search([query for query, _ in searches], TOPK).documents
  for (query, text), d in zip(searches, docs):
    assert text == SEARCH_R1.observation_prefix + format_documents(d) + \
        SEARCH_R1.observation_suffix, query


def test_demonstrations_can_search_the_question_first(world, written):
  _, backend = written
  demos = world.demonstrations(backend, 1, first_query="question")
  for demo, q in zip(demos, world.questions["train"]):
    first = SEARCH_R1.parse(demo["segments"][0]["text"])
    assert first.kind == SEARCH
    # The question itself, unless BM25 missed the subject's passage (then the bare name).
    assert first.content in (q["question"], q["chain"][0])
    obs = demo["segments"][1]["text"]
    assert f'(Title: "{q["chain"][0]}")' in obs  # the hop's fact is in the observation
    last = SEARCH_R1.parse(demo["segments"][-1]["text"])
    assert last.kind == ANSWER and last.content == q["golden_answers"][0]
  assert sum(SEARCH_R1.parse(d["segments"][0]["text"]).content == q["question"]
             for d, q in zip(demos, world.questions["train"])) > 0.9 * len(demos)
  with pytest.raises(ValueError, match="first_query"):
    world.demonstrations(backend, 1, first_query="title")


def test_hasty_teacher_stops_multi_hop_demonstrations_early(world, written):
  _, backend = written
  questions = world.questions["train"]
  full = world.demonstrations(backend, TOPK)
  demos = world.demonstrations(backend, TOPK, stop_early_rate=0.5)
  assert demos == world.demonstrations(backend, TOPK, stop_early_rate=0.5)  # reproducible
  stopped = {1: 0, 2: 0, 3: 0}
  stops_of_3_hop = set()
  for demo, whole, q in zip(demos, full, questions):
    segs, k = demo["segments"], demo["searches"]
    actions = [SEARCH_R1.parse(s["text"]) for s in segs[0::2]]
    assert [a.kind for a in actions] == [SEARCH] * k + [ANSWER]
    assert actions[-1].content == demo["answer"]
    assert whole["searches"] == q["hops"] and whole["answer"] == q["golden_answers"][0]
    if k == q["hops"]:  # complete: the same demonstration as without the option
      assert segs == whole["segments"]
      continue
    stopped[q["hops"]] += 1
    if q["hops"] == 3:
      stops_of_3_hop.add(k)
    # The searches it made are the complete demonstration's; then it answers the entity the
    # last one reached (a bridge, present in that observation), stating the fact it read.
    assert 1 <= k < q["hops"] and segs[:-1] == whole["segments"][:2 * k]
    assert demo["answer"] == q["chain"][k] != q["golden_answers"][0]
    assert q["chain"][k] in segs[-2]["text"]
    assert segs[-1]["text"].split(". ")[0] == whole["segments"][2 * k]["text"].split(". ")[0]
  assert stopped[1] == 0  # nothing to stop early on
  assert stops_of_3_hop == {1, 2}  # after either bridge
  for hops in (2, 3):
    n = sum(q["hops"] == hops for q in questions)
    assert abs(stopped[hops] / n - 0.5) < 0.08, (hops, stopped[hops], n)
  with pytest.raises(ValueError, match="stop_early_rate"):
    world.demonstrations(backend, TOPK, stop_early_rate=1.5)


def test_demonstrations_in_the_tool_call_protocol(tmp_path):
  w = SynthWorld.generate(seed=2, **SMALL)
  paths = w.write(str(tmp_path / "w"), index_dir=str(tmp_path / "idx"), protocol=TOOL_CALL)
  backend = BM25Backend(paths["corpus"], index_dir=str(tmp_path / "idx"))
  for demo, q in zip(w.demonstrations(backend, TOPK, protocol=TOOL_CALL), w.questions["train"]):
    actions = [TOOL_CALL.parse(s["text"]) for s in demo["segments"][0::2]]
    assert [a.kind for a in actions] == [SEARCH] * q["hops"] + [ANSWER]
    assert actions[-1].content == q["golden_answers"][0]
    assert demo["segments"][1]["text"].startswith(TOOL_CALL.observation_prefix)


def test_generate_rejects_sizes_the_world_cannot_satisfy():
  with pytest.raises(ValueError, match=r"split '(train|dev|test)' needs \d+ \d-hop questions"):
    SynthWorld.generate(seed=0, n_entities=60, n_train=1000, n_dev=1000, n_test=1000)
  with pytest.raises(ValueError, match="n_entities"):
    SynthWorld.generate(seed=0, n_entities=10)


# ------------------------------------------------------------------ tfds builder


def _write_lines(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for row in rows:
      f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


def _nq_style_manual_dir(root):
  """A made-up FlashRAG "nq" folder: train (12 rows, ids train_0..11) and dev, extra keys."""
  train = [{"id": f"train_{i}", "question": f"who wrote book {i}?",
            "golden_answers": [f"Author {i}", f"A. {i}"], "metadata": {"x": i}}
           for i in range(12)]
  dev = [{"id": "dev_0", "question": "where is the Zorvath tower?", "golden_answers": ["Quell"]},
         {"id": 1, "question": "an integer id?", "golden_answers": ["ünïcode ✓"]}]
  _write_lines(os.path.join(root, "nq", "train.jsonl"), train)
  _write_lines(os.path.join(root, "nq", "dev.jsonl"), dev)
  return train, dev


def test_tfds_builds_flashrag_dir_into_array_record_without_tensorflow(tmp_path):
  manual, data = tmp_path / "manual", tmp_path / "tfds"
  train, dev = _nq_style_manual_dir(str(manual))
  # A fresh interpreter, so that no other test's imports can hide a TensorFlow import.
  script = f"""
import importlib.util, json, logging, sys
logging.basicConfig(level=logging.INFO)  # as launch/train.py logs: every INFO line shows
from agentjax.data import load_split, SearchQA
out = {{s: load_split("nq", s, {str(data)!r}, {str(manual)!r}) for s in ("train", "dev")}}
print("LOADED", file=sys.stderr, flush=True)
builder = SearchQA(config="nq", data_dir={str(data)!r})
raw = builder.as_data_source(split="train")[0]
out["raw_types"] = sorted(type(v).__name__ for v in raw.values())
out["splits"] = sorted(builder.info.splits)
out["tf_loaded"] = "tensorflow" in sys.modules
out["tf_installed"] = importlib.util.find_spec("tensorflow") is not None
print("RESULT" + json.dumps(out))
"""
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.split("RESULT", 1)[1])
  # Nothing downloads, and tfds' own progress lines say nothing a user can act on: neither its
  # "Downloading and preparing dataset" print nor its absl lines reach the output; ours does.
  loading = proc.stderr.split("LOADED")[0]  # what load_split's build and reads logged
  assert "Downloading and preparing" not in proc.stdout + loading
  assert "downloaded and prepared" not in proc.stdout + loading
  assert not [line for line in loading.splitlines() if ":absl:" in line], loading
  assert "building search_qa/nq into" in loading
  # Building and reading never import TensorFlow (this holds whether or not it is installed; in
  # this project's environment it is not installed at all, so nothing could have used it).
  assert not out["tf_loaded"], f"tensorflow imported (installed: {out['tf_installed']})"
  assert out["splits"] == ["dev", "train"]  # the splits whose files exist
  assert "bytes" in out["raw_types"]  # tfds gives bytes; load_split decodes them
  keep = ("id", "question", "golden_answers")
  assert out["train"] == [{k: r[k] for k in keep} for r in train]  # natural id order = file order
  assert out["dev"] == [{**dev[1], "id": "1"}, dev[0]]  # "1" < "dev_0" in natural order
  assert [f.name for f in (data / "search_qa" / "nq" / "1.0.0").iterdir()
          if "array_record" in f.name]


def test_synthworld_goes_through_the_tfds_builder(world, written, tmp_path):
  _quiet_tfds()
  paths, _ = written
  folder = os.path.dirname(paths["corpus"])  # the world's folder itself serves as manual_dir
  for split in ("train", "dev", "test"):
    got = load_split("synthworld", split, str(tmp_path), folder)
    assert got == [{k: q[k] for k in sorted(q)} for q in world.questions[split]], split


def test_load_split_rebuilds_when_the_source_files_change(tmp_path):
  _quiet_tfds()
  manual, data = str(tmp_path / "manual"), str(tmp_path / "tfds")
  row = {"id": "test_0", "question": "q?", "golden_answers": ["a"]}
  _write_lines(os.path.join(manual, "bamboogle", "test.jsonl"), [row])
  assert [r["question"] for r in load_split("bamboogle", "test", data, manual)] == ["q?"]
  _write_lines(os.path.join(manual, "bamboogle", "test.jsonl"),
               [row, {**row, "id": "test_1", "question": "new?"}])
  assert [r["question"] for r in load_split("bamboogle", "test", data, manual)] == ["q?", "new?"]
  assert len(load_split("bamboogle", "test", data)) == 2  # built: no manual_dir needed
  with pytest.raises(ValueError, match="no split 'train'"):
    load_split("bamboogle", "train", data)


BAD_LINES = [
    ('{"id": "x", "question": "q?", "golden_answers": ["a"]', "not valid JSON"),
    ('["id", "question"]', "expected a JSON object"),
    ('{"question": "q?", "golden_answers": ["a"]}', "missing field 'id'"),
    ('{"id": "x", "golden_answers": ["a"]}', "missing field 'question'"),
    ('{"id": "x", "question": "q?"}', "missing field 'golden_answers'"),
    ('{"id": "", "question": "q?", "golden_answers": ["a"]}', "field 'id' is empty"),
    ('{"id": "x", "question": "  ", "golden_answers": ["a"]}', "field 'question' is empty"),
    ('{"id": "x", "question": 3, "golden_answers": ["a"]}', "field 'question' must be a string"),
    ('{"id": "x", "question": "q?", "golden_answers": []}', "field 'golden_answers' is empty"),
    ('{"id": "x", "question": "q?", "golden_answers": "a"}',
     "field 'golden_answers' must be a list"),
    ('{"id": "x", "question": "q?", "golden_answers": ["a", ""]}',
     "field 'golden_answers[1]' is empty"),
    ('{"id": "train_0", "question": "q?", "golden_answers": ["a"]}',
     "field 'id' repeats 'train_0' from line 1"),
]


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_malformed_lines_name_file_line_and_field(tmp_path, line, message):
  path = str(tmp_path / "train.jsonl")
  good = {"id": "train_0", "question": "fine?", "golden_answers": ["yes"]}
  _write_lines(path, [good, "", line])  # the bad line is line 3 (a blank line 2 is skipped)
  with pytest.raises(QAFormatError) as err:
    list(read_qa_jsonl(path))
  assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value)


def test_builder_reports_malformed_lines_and_missing_files(tmp_path):
  _quiet_tfds()
  manual, data = str(tmp_path / "manual"), str(tmp_path / "tfds")
  _write_lines(os.path.join(manual, "popqa", "test.jsonl"),
               [{"id": "test_0", "question": "q?", "golden_answers": ["a"]},
                {"id": "test_1", "question": "q?"}])
  with pytest.raises(QAFormatError, match=r"popqa/test\.jsonl:2: missing field 'golden_answers'"):
    prepare("popqa", data, manual)
  assert not SearchQA(config="popqa", data_dir=data).is_prepared()
  with pytest.raises(FileNotFoundError, match="musique"):
    load_split("musique", "dev", data, manual)
  with pytest.raises(QAFormatError, match="missing field 'hops'"):  # synthworld needs its fields
    _write_lines(os.path.join(manual, "synthworld", "dev.jsonl"),
                 [{"id": "dev_0", "question": "q?", "golden_answers": ["a"]}])
    prepare("synthworld", data, manual)


def test_builder_has_one_config_per_benchmark_and_manual_instructions():
  assert BENCHMARKS == ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique",
                        "bamboogle", "synthworld")
  assert [c.name for c in SearchQA.BUILDER_CONFIGS] == list(BENCHMARKS)
  # The layout in the message, the download steps in the guide it points to.
  assert "{manual_dir}/{config}/{split}.jsonl" in SearchQA.MANUAL_DOWNLOAD_INSTRUCTIONS
  assert "docs/guides/data.md" in SearchQA.MANUAL_DOWNLOAD_INSTRUCTIONS
  guide = _guide()
  assert "hf download RUC-NLPIR/FlashRAG_datasets" in guide
  assert "hf download PeterJinGo/nq_hotpotqa_train" in guide
  assert "hf download PeterJinGo/wiki-18-corpus" in guide
  with pytest.raises(FileNotFoundError, match=r"docs/guides/data\.md"):
    source_files(ROOT, "musique")  # no musique files here: the message points to the guide


def test_natural_key_orders_digit_runs_as_numbers():
  ids = ["train_10", "train_2", "dev_1", "train_1", "5a8b", "5a10b"]
  assert sorted(ids, key=natural_key) == ["5a8b", "5a10b", "dev_1", "train_1", "train_2",
                                          "train_10"]


# ------------------------------------------------------------------ SynthWorld v2


def test_the_demo_world_is_the_one_it_always_was():
  """The v2 options draw from their own random streams: the demo world (seed 0, 1- and 2-hop) is
  byte for byte the world of the studies in docs/results (its sha256 taken before v2 existed)."""
  import hashlib
  w = SynthWorld.generate(seed=0, hop_weights=(1.0, 1.0, 0.0))
  blob = json.dumps([w.corpus(), w.questions], sort_keys=True).encode()
  assert hashlib.sha256(blob).hexdigest() == \
      "efd56ec91d56e54bdceef141d3e1cd20f3298b4372551822786b8a73e88dfd80"


def test_v2_has_four_hops_distractors_and_confusable_names(tmp_path):
  from agentjax.data.demo_world import WORLD_V2
  from agentjax.data.synthworld import _TEXT, RELATIONS
  w = SynthWorld.generate(**dict(WORLD_V2, n_entities=400, n_train=300, n_dev=60, n_test=60))
  for split, n in (("train", 300), ("dev", 60), ("test", 60)):
    hops = [q["hops"] for q in w.questions[split]]
    assert len(hops) == n and sorted(set(hops)) == [1, 2, 3, 4]
    # (0.2, 0.3, 0.3, 0.2), largest remainder
    assert [hops.count(h) for h in (1, 2, 3, 4)] == [round(n * f) for f in (0.2, 0.3, 0.3, 0.2)]
  for q in w.questions["dev"]:  # 4-hop answers follow the chain through the world
    chain = [w._by_name[name] for name in q["chain"]]
    assert len(set(chain)) == len(chain) == q["hops"] + 1
    for rel, (s, o) in zip(q["relations"], zip(chain, chain[1:])):
      assert w.relations[rel][s] == o
  # 1.5 distractor passages per entity, each naming two entities and no true fact
  assert len(w.distractors) == round(1.5 * 400)
  facts = set()
  for rel, pairs in w.relations.items():
    for s, o in pairs.items():
      facts.add(_TEXT[rel].fact.format(s=w.entities[s].name, o=w.entities[o].name).lower())
  for row in w.distractors:
    body = row["contents"].split("\n", 1)[1].lower()
    assert not any(f in body for f in facts), row
    assert sum(e.name in row["contents"] for e in w.entities) >= 2
  # confusable names: some persons share a family name; full names stay unique
  persons = [e.name for e in w.entities if e.type == "person"]
  family = [n.split(" ")[-1] for n in persons]
  assert len(set(persons)) == len(persons) and len(set(family)) < 0.85 * len(family)
  assert len({e.name for e in w.entities}) == len(w.entities)
  assert set(RELATIONS) >= {r for q in w.questions["train"] for r in q["relations"]}
  # Demonstrations of every hop count are written against real BM25 search (top 2).
  paths = w.write(str(tmp_path / "v2"), topk=2, index_dir=str(tmp_path / "idx"))
  demos = _read_jsonl(paths["demos"])
  assert sorted({d["searches"] for d in demos}) == [1, 2, 3, 4]
  with open(paths["world"]) as f:
    assert json.load(f)["distractor_passages"] == len(w.distractors)
  corpus = _read_jsonl(paths["corpus"])
  assert len(corpus) == 400 + len(w.distractors)
  # What the distractors do to search, against a count written here.
  backend = BM25Backend(paths["corpus"], index_dir=str(tmp_path / "idx"))
  stats = w.hop_retrieval(backend, topk=2, split="dev")
  hops = [(q, h) for q in w.questions["dev"] for h in range(q["hops"])]
  docs = backend.search([SynthWorld.hop_query(q["relations"][h], q["chain"][h])
                         for q, h in hops], 2).documents
  ids = [w.entity(q["chain"][h]).id for q, h in hops]
  assert stats["queries"] == len(hops)
  assert stats["first"] == sum(d[0].id == i for d, i in zip(docs, ids)) / len(hops)
  assert stats["missing"] == sum(all(x.id != i for x in d) for d, i in zip(docs, ids)) / len(hops)
  assert stats["distractor_in_topk"] == sum(
      any(x.id.startswith("distractor-") for x in d) for d in docs) / len(hops)
  assert stats["distractor_in_topk"] > 0.5


def test_v2_options_are_checked():
  with pytest.raises(ValueError, match="hop_weights must be 3 or 4"):
    SynthWorld.generate(seed=0, hop_weights=(1.0, 1.0), **SMALL)
  with pytest.raises(ValueError, match="distractors must be >= 0"):
    SynthWorld.generate(seed=0, distractors=-1.0, **SMALL)
  with pytest.raises(ValueError, match="confusable_rate in"):
    SynthWorld.generate(seed=0, confusable_rate=1.5, **SMALL)


# ------------------------------------------------------------------ your own question files


def _guide() -> str:
  with open(os.path.join(ROOT, "docs", "guides", "data.md")) as f:
    return f.read()


def guide_block(marker: str) -> str:
  """The fenced block after `<!-- data-guide: {marker} -->` in docs/guides/data.md."""
  match = re.search(rf"<!-- data-guide: {marker} -->\s*```\w*\n(.*?)```", _guide(), re.S)
  assert match, f"docs/guides/data.md lost its {marker!r} block"
  return match.group(1)


def guide_commands() -> list[str]:
  """Every command of the guide's ```bash blocks, continuation lines joined, a trailing & cut."""
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", _guide(), re.S):
    text = re.sub(r"\\\n\s*", "", textwrap.dedent(block))
    commands += [line.strip().rstrip("&").strip() for line in text.splitlines() if line.strip()]
  return commands


def test_the_guides_question_example_loads_with_its_field_names(tmp_path):
  path = tmp_path / "mydata.jsonl"
  path.write_text(guide_block("questions"))
  assert load_qa_path(str(path), "train") == [
      {"id": "mydata_0", "question": "Who wrote the novel Middlemarch?",
       "golden_answers": ["George Eliot", "Mary Ann Evans"]},
      {"id": "q2", "question": "In which city is the Rijksmuseum?", "golden_answers": ["Amsterdam"]},
      {"id": "mydata_2", "question": "What is the capital of Australia?",
       "golden_answers": ["Canberra"]}]
  assert load_qa_path(str(path), "test") == load_qa_path(str(path), "train")  # a file: any split


def test_question_files_in_every_format_and_alias(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  rows = [{"id": 3, "question": "q0?", "golden_answers": ["a0"], "extra": {"x": 1}},
          {"question": "q1?", "answers": ["a1", "b1"]},
          {"id": "x", "question": "q2?", "answer": "a2"},
          {"question": "q3?", "answer": ["a3"]},
          {"question": "q4?", "reward_model": {"ground_truth": {"target": ["a4"]}}},
          {"question": "q5?", "golden_answers": ["first"], "answers": ["second"]}]
  want = [{"id": "3", "question": "q0?", "golden_answers": ["a0"]},
          {"id": "f_1", "question": "q1?", "golden_answers": ["a1", "b1"]},
          {"id": "x", "question": "q2?", "golden_answers": ["a2"]},
          {"id": "f_3", "question": "q3?", "golden_answers": ["a3"]},
          {"id": "f_4", "question": "q4?", "golden_answers": ["a4"]},
          {"id": "f_5", "question": "q5?", "golden_answers": ["first"]}]  # the first name wins
  (tmp_path / "jsonl").mkdir()
  _write_lines(str(tmp_path / "jsonl" / "f.jsonl"), rows)
  (tmp_path / "json").mkdir()
  (tmp_path / "json" / "f.json").write_text("\ufeff" + json.dumps(rows, indent=2))
  (tmp_path / "lines").mkdir()
  _write_lines(str(tmp_path / "lines" / "f.json"), rows)  # .json holding JSON lines
  (tmp_path / "parquet").mkdir()  # columns as Search-R1's processed files have them
  table = pa.Table.from_pylist([
      {"id": None if "id" not in r else str(r["id"]), "question": r["question"],
       "golden_answers": w["golden_answers"],
       "reward_model": {"ground_truth": {"target": w["golden_answers"]}}}
      for r, w in zip(rows, want)])
  pq.write_table(table, str(tmp_path / "parquet" / "f.parquet"))
  for form in ("jsonl", "json", "lines", "parquet"):
    assert read_qa_file(str(tmp_path / form / os.listdir(tmp_path / form)[0])) == want, form


BAD_RECORDS = [
    ('{"golden_answers": ["a"]}', "missing field 'question'"),
    ('{"question": "q?"}', "missing field 'golden_answers'"),
    ('{"question": "q?", "answers": []}', "field 'answers' is empty"),
    ('{"question": "q?", "answer": 3}', "field 'answer' must be a list of strings"),
    ('{"question": "", "answers": ["a"]}', "field 'question' is empty"),
    ('{"question": "q?", "answers": ["a", 2]}', "field 'answers[1]' must be a string"),
    ('{"id": true, "question": "q?", "answers": ["a"]}', "field 'id' must be a string"),
    ('{"id": "k", "question": "q?", "answers": ["a"]}', "field 'id' repeats 'k' from line 1"),
    ('{"question": "q?", "answers": ["a"]', "not valid JSON"),
    ('["q?", "a"]', "expected a JSON object"),
]


@pytest.mark.parametrize("record,message", BAD_RECORDS)
def test_a_bad_record_names_file_line_and_field(tmp_path, record, message):
  good = '{"id": "k", "question": "fine?", "answers": ["yes"]}'
  path = str(tmp_path / "mine.jsonl")
  _write_lines(path, [good, "", record])  # the bad record is on line 3
  with pytest.raises(QAFormatError) as err:
    read_qa_file(path)
  assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value), str(err.value)
  if record.startswith("{") and record.endswith("}"):  # the same record in a JSON list
    path = str(tmp_path / "mine.json")
    with open(path, "w") as f:
      f.write(f"[\n  {good},\n\n  {record}\n]\n")
    with pytest.raises(QAFormatError) as err:
      read_qa_file(path)
    message = message.replace("from line 1", "from line 2")  # the list's first item: line 2
    assert str(err.value).startswith(f"{path}:4: ") and message in str(err.value), str(err.value)


def test_parquet_rows_and_folders_of_split_files(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  folder = tmp_path / "mine"
  folder.mkdir()
  pq.write_table(pa.Table.from_pylist([{"question": "q?", "golden_answers": ["a"]},
                                       {"question": "r?", "golden_answers": []}]),
                 str(folder / "train.parquet"))
  with pytest.raises(QAFormatError, match=r"train\.parquet: row 2: field 'golden_answers' is"):
    load_qa_path(str(folder), "train")
  _write_lines(str(folder / "dev.jsonl"), [{"question": "d?", "answers": ["x"]}])
  assert load_qa_path(f"{folder}/", "dev") == [
      {"id": "dev_0", "question": "d?", "golden_answers": ["x"]}]
  with pytest.raises(QAFormatError, match=r"no test\.jsonl/\.json/\.parquet in this folder \(it "
                                          r"has the splits \['dev', 'train'\]\)"):
    load_qa_path(str(folder), "test")
  _write_lines(str(folder / "dev.json"), [{"question": "d?", "answers": ["x"]}])
  with pytest.raises(QAFormatError, match=r"2 files for split 'dev'.*keep one"):
    load_qa_path(str(folder), "dev")
  with pytest.raises(QAFormatError, match="no such file or folder"):
    load_qa_path(str(tmp_path / "nothing.jsonl"), "train")
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(QAFormatError, match="no questions"):
    load_qa_path(str(tmp_path / "empty.jsonl"), "train")


def test_data_entries_take_paths_beside_benchmark_names(tmp_path, monkeypatch):
  from agentjax.data.searchqa import BENCHMARK_LISTS, expand_benchmarks
  from agentjax.train import config as config_lib
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine").mkdir()  # a bare folder name in the working directory is a path too
  value = "mydata.jsonl, data/x, ~/q.parquet, mine, ./nq, cw_grpo_400"
  names = [n for n, _, _ in expand_benchmarks(value)]
  assert names[:5] == ["mydata.jsonl", "data/x", "~/q.parquet", "mine", "./nq"]
  assert names[5:] == [n for n, _, _ in BENCHMARK_LISTS["cw_grpo_400"]]  # nq among them
  with pytest.raises(ValueError, match=r"unknown benchmark 'mydata'; .*or a path to your own "
                                       r"questions .*docs/guides/data\.md"):
    expand_benchmarks("mydata")
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.train='nq,mydata': unknown"):
    config_lib.benchmark_list("nq,mydata", "data.train")


def test_load_questions_reads_a_file_and_names_the_field_of_a_bad_one(tmp_path):
  import ml_collections
  from agentjax.train import config as config_lib
  from agentjax.train.builders import load_questions
  config = ml_collections.ConfigDict({"data": {"data_dir": str(tmp_path / "tfds"),
                                               "manual_dir": str(tmp_path / "manual")}})
  path = str(tmp_path / "mydata.jsonl")
  path_bad = str(tmp_path / "bad.jsonl")
  _write_lines(path, [{"question": "q?", "answers": ["a"]}])
  _write_lines(path_bad, [{"question": "q?", "answers": ["a"]}, {"question": "r?"}])
  assert load_questions(config, [path], "train") == [
      {"id": "mydata_0", "question": "q?", "golden_answers": ["a"], "benchmark": path}]
  assert load_questions(config, [path], "dev", "data.eval_split") == \
      load_questions(config, [path], "train")
  with pytest.raises(config_lib.ConfigError) as err:
    load_questions(config, [path_bad], "train")
  assert str(err.value) == (f"config.data.train={path_bad!r}: {path_bad}:2: missing field "
                            f"'golden_answers' (the gold answers: a list of strings; also read "
                            f"from ['answers', 'answer', 'reward_model.ground_truth.target'])")
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.eval="):
    load_questions(config, [path_bad], "dev", "data.eval_split")
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.manual_dir=.*no "
                                                   r"train/dev/test\.jsonl for 'popqa'"):
    load_questions(config, ["popqa"], "test")


# ------------------------------------------------------------------ the guide's commands
# (tests/test_guides.py parses and validates every launch command of the guides; these run the
# data guide's own)


def test_the_guides_bm25_command_builds_the_index_of_its_corpus(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mycorpus.jsonl").write_text(guide_block("corpus"))
  [command] = [c for c in guide_commands() if c.startswith("python -c ")]
  exec(compile(command[len("python -c "):].strip("\"'"), "data.md", "exec"), {})
  assert [r["id"] for r in load_corpus(str(tmp_path / "mycorpus.jsonl"))] == ["0", "1"]
  backend = BM25Backend("mycorpus.jsonl", index_dir="indexes/bm25")
  assert not backend.built  # the command built the cache this one loads
  assert backend.search(["who wrote Middlemarch"], 1).documents[0][0].id == "0"


@pytest.mark.slow
def test_the_guides_plugin_training_command_runs(tmp_path, tiny_tokenizer_dir):
  """The guide's last train command, as written (in a folder holding its three files), with the
  tiny model from scratch and short rollouts: two GRPO steps on the guide's own questions, with
  its word-overlap backend over its corpus."""
  from tests.subprocess_env import subprocess_env
  (tmp_path / "mydata.jsonl").write_text(guide_block("questions"))
  (tmp_path / "mycorpus.jsonl").write_text(guide_block("corpus"))
  (tmp_path / "my_search.py").write_text(guide_block("backend"))
  [command] = [c for c in guide_commands() if "retrieval.plugins" in c]
  words = shlex.split(command)
  words[1] = os.path.join(ROOT, words[1])
  words = [w.replace("--config=configs/", f"--config={ROOT}/configs/") for w in words]
  tiny = ["--config.model.hf_path=", "--config.model.preset=tiny",
          f"--config.model.tokenizer_path={tiny_tokenizer_dir}", "--config.rollout.group_size=2",
          "--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=24",
          "--config.rl.prompts_per_step=2", "--config.rl.minibatch_size=4",
          "--config.train.eval_batch=4", "--config.train.checkpoint_every=2"]
  proc = subprocess.run([sys.executable, *words[1:], *tiny], cwd=tmp_path, capture_output=True,
                        text=True, timeout=1200, env=subprocess_env(PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr[-4000:]
  workdir = tmp_path / "runs" / "mine-plugin"
  with open(workdir / "metrics.jsonl") as f:
    steps = [json.loads(line) for line in f if '"reward"' in line]
  assert [s["step"] for s in steps] == [1, 2]
  with open(workdir / "eval" / "2.json") as f:
    final = json.load(f)
  assert final["benchmark"] == "mydata.jsonl" and final["n"] == 3
