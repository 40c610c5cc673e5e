"""Dense search (agentjax/retrieval/dense.py) against NumPy and faiss-cpu's IndexFlatIP: random
and clustered embeddings, ties, padding, bf16, the approximate mode's recall, 8 fake devices."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agentjax.retrieval.dense import build_index, search
from tests.test_sharding import run_with_fake_devices


def _reference(docs, queries, k):
  """NumPy: inner products in float64, best first, equal scores lower id first."""
  scores = queries.astype(np.float64) @ docs.astype(np.float64).T
  order = np.lexsort((np.broadcast_to(np.arange(len(docs)), scores.shape), -scores), axis=1)
  ids = order[:, :k]
  return np.take_along_axis(scores, ids, 1), ids


def _faiss(docs, queries, k):
  import faiss
  index = faiss.IndexFlatIP(docs.shape[1])
  index.add(np.ascontiguousarray(docs, np.float32))
  return index.search(np.ascontiguousarray(queries, np.float32), k)


def _clustered(rng, n, e, clusters=8, spread=0.05):
  centers = rng.normal(size=(clusters, e))
  return (centers[rng.integers(0, clusters, n)] + spread * rng.normal(size=(n, e))
          ).astype(np.float32)


@pytest.mark.parametrize("kind", ["random", "clustered"])
@pytest.mark.parametrize("chunk", [64, 5000])
def test_exact_search_equals_faiss_and_numpy(kind, chunk):
  """Chunks smaller than k's candidates and one chunk for all, N not a multiple of the chunk."""
  rng = np.random.default_rng(1)
  docs = rng.normal(size=(1337, 24)).astype(np.float32) if kind == "random" else \
      _clustered(rng, 1337, 24)
  queries = rng.normal(size=(9, 24)).astype(np.float32)
  scores, ids = search(build_index(docs, chunk=chunk), queries, 10)
  want_scores, want_ids = _reference(docs, queries, 10)
  np.testing.assert_array_equal(np.asarray(ids), want_ids)
  np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-5, atol=1e-5)
  faiss_scores, faiss_ids = _faiss(docs, queries, 10)
  np.testing.assert_array_equal(np.asarray(ids), faiss_ids)
  np.testing.assert_allclose(np.asarray(scores), faiss_scores, rtol=1e-5, atol=1e-5)


def test_ties_come_lower_id_first_across_chunks():
  """Identical documents in different chunks (and all-equal scores): lower id first, the
  documented rule; a k covering every document returns each once."""
  rng = np.random.default_rng(2)
  docs = rng.normal(size=(100, 8)).astype(np.float32)
  docs[[7, 40, 41, 99]] = docs[70]
  queries = np.stack([docs[70], np.zeros(8, np.float32)])  # the second: every score 0
  scores, ids = search(build_index(docs, chunk=16), queries, 5)
  assert list(np.asarray(ids)[0]) == [7, 40, 41, 70, 99]
  assert list(np.asarray(ids)[1]) == [0, 1, 2, 3, 4]
  np.testing.assert_array_equal(np.asarray(scores)[1], 0.0)
  everything = np.asarray(search(build_index(docs, chunk=16), queries, 100)[1])
  assert sorted(everything[0]) == list(range(100)) and list(everything[1]) == list(range(100))
  want = _reference(docs, queries, 100)[1]
  np.testing.assert_array_equal(everything, want)
  # faiss' IndexFlatIP returns the same documents and scores, equal scores in the other order
  # (higher id first: [99, 70, 41, 40, 7] here; its order among ties is not documented)
  faiss_scores, faiss_ids = _faiss(docs, queries, 5)
  assert [sorted(row) for row in faiss_ids] == [sorted(row) for row in np.asarray(ids)]
  np.testing.assert_allclose(faiss_scores, np.asarray(scores), rtol=1e-6)


def test_bf16_index_and_approximate_recall():
  """bfloat16 embeddings keep the true top-10 within rounding; approx_max_k at recall 0.95
  recalls at least that share of the exact top-10 (on CPU it is exact)."""
  rng = np.random.default_rng(3)
  docs = _clustered(rng, 4000, 32, clusters=50, spread=0.5)
  queries = rng.normal(size=(16, 32)).astype(np.float32)
  _, want = _reference(docs, queries, 10)
  _, half = search(build_index(docs, chunk=512, dtype=np.dtype("bfloat16")), queries, 10)
  overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(np.asarray(half), want)])
  assert overlap >= 0.9, overlap
  _, approx = search(build_index(docs, chunk=512), queries, 10, recall_target=0.95)
  recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(np.asarray(approx), want)])
  assert recall >= 0.95, recall


def test_bad_arguments_name_what_is_wrong():
  index = build_index(np.ones((5, 4), np.float32))
  with pytest.raises(ValueError, match=r"k=6 must be in \[1, 5\]"):
    search(index, np.ones((1, 4), np.float32), 6)
  with pytest.raises(ValueError, match=r"queries of shape \(1, 3\), expected \[Q, 4\]"):
    search(index, np.ones((1, 3), np.float32), 2)
  with pytest.raises(ValueError, match="no embeddings"):
    build_index(np.ones((0, 4), np.float32))


def test_eight_devices_return_what_one_does():
  assert "DENSE_SEARCH_OK" in run_with_fake_devices("tests.dense_search_check")


# ---------------------------------------------------------------- the index on disk, the backend

CORPUS = [f"Title {i}\nthe {w} of {v} is near the {u}" for i, (w, v, u) in enumerate(
    (w, v, u) for w in ("river", "tower", "garden", "bridge", "castle")
    for v in ("north", "south", "east") for u in ("market", "harbor"))]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
  """A tiny random BERT with a WordPiece tokenizer of the corpus's words, as an HF folder, and
  the corpus as FlashRAG JSONL: (encoder folder, corpus path, transformers model)."""
  import json
  import torch
  from transformers import BertConfig, BertModel
  from agentjax.retrieval.encoder_training import wordpiece_tokenizer
  root = tmp_path_factory.mktemp("dense")
  folder = root / "encoder"
  tokenizer = wordpiece_tokenizer(CORPUS + ["query: passage: who what"], 300)
  assert "[UNK]" not in tokenizer.tokenize("query: the castle of east")  # real word pieces
  tokenizer.save_pretrained(str(folder))
  torch.manual_seed(1)
  model = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=48,
                               max_position_embeddings=64), add_pooling_layer=False).eval()
  model.save_pretrained(str(folder), safe_serialization=True)
  corpus = root / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": c}) + "\n"
                            for i, c in enumerate(CORPUS)))
  return str(folder), str(corpus), model, tokenizer


def _hf_embed(model, tokenizer, texts):
  """e5's recipe in torch: mean over real tokens, L2-normalized."""
  import torch
  batch = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
  with torch.no_grad():
    hidden = model(**batch).last_hidden_state
  mask = batch["attention_mask"][..., None].float()
  emb = (hidden * mask).sum(1) / mask.sum(1)
  return torch.nn.functional.normalize(emb, dim=-1).numpy()


def test_index_equals_transformers_and_resumes_after_a_kill(encoder_dir, tmp_path, monkeypatch):
  """launch/index.py's build: the shards hold transformers' e5 embeddings of "passage: " +
  passage (length-sorted batches, padded rows: no effect); a build killed after its first
  shard resumes there (the finished shard is not encoded again) and ends with the same index;
  another corpus in the same folder is refused, naming the setting."""
  from agentjax.retrieval import dense_index as di
  folder, corpus, model, tokenizer = encoder_dir
  encoder = di.TextEncoder(folder, batch_size=4)
  want = _hf_embed(model, tokenizer, ["passage: " + c for c in CORPUS])
  whole = di.build_dense_index(corpus, encoder, str(tmp_path / "whole"), shard_docs=8)
  assert [s["rows"] for s in whole["shards"]] == [[0, 8], [8, 16], [16, 24], [24, 30]]
  manifest, emb = di.load_embeddings(str(tmp_path / "whole"))
  assert manifest["ids"] == [f"d{i}" for i in range(len(CORPUS))]
  np.testing.assert_allclose(emb, want, rtol=1e-5, atol=1e-6)

  calls = []
  original = di.TextEncoder.__call__

  def dies_on_the_second_shard(self, texts, progress=None):
    calls.append(len(texts))
    if len(calls) == 2:
      raise KeyboardInterrupt("killed")
    return original(self, texts, progress)

  monkeypatch.setattr(di.TextEncoder, "__call__", dies_on_the_second_shard)
  with pytest.raises(KeyboardInterrupt):
    di.build_dense_index(corpus, encoder, str(tmp_path / "resumed"), shard_docs=8)
  with pytest.raises(di.CorpusError, match="unfinished"):
    di.load_embeddings(str(tmp_path / "resumed"))
  calls.clear()
  monkeypatch.setattr(di.TextEncoder, "__call__", original)
  counted = []
  monkeypatch.setattr(di.TextEncoder, "__call__",
                      lambda self, texts, progress=None: counted.append(len(texts)) or
                      original(self, texts, progress))
  di.build_dense_index(corpus, encoder, str(tmp_path / "resumed"), shard_docs=8)
  assert counted == [8, 8, 6]  # shard 0 was kept
  np.testing.assert_array_equal(di.load_embeddings(str(tmp_path / "resumed"))[1], emb)
  with pytest.raises(di.CorpusError, match="shard_docs"):
    di.build_dense_index(corpus, encoder, str(tmp_path / "resumed"), shard_docs=16)


def test_backend_searches_in_process_and_over_the_search_r1_api(encoder_dir, tmp_path):
  """make_backend("dense"): one encode and one search per call, the passages of the exact inner
  products with transformers' query embeddings ("query: " + question); served by
  launch/retriever.py's server it answers /retrieve with the same documents."""
  import json
  import urllib.request
  from agentjax.retrieval import make_backend, make_server, start_in_thread
  from agentjax.retrieval.dense_index import TextEncoder, build_dense_index
  folder, corpus, model, tokenizer = encoder_dir
  build_dense_index(corpus, TextEncoder(folder), str(tmp_path / "index"), shard_docs=16)
  backend = make_backend("dense", index_dir=str(tmp_path / "index"))
  questions = ["what is near the harbor", "the tower of north", ""]
  got = backend.search(questions, 3)
  passages = _hf_embed(model, tokenizer, ["passage: " + c for c in CORPUS])
  queries = _hf_embed(model, tokenizer, ["query: " + q for q in questions])
  _, want = _reference(passages, queries, 3)
  assert got.errors == [None] * 3
  assert [[d.id for d in docs] for docs in got.documents] == [[f"d{j}" for j in row]
                                                               for row in want]
  assert got.documents[0][0].contents == CORPUS[want[0][0]]
  assert backend.stats.queries == 3
  server = make_server(backend, port=0)
  start_in_thread(server)
  try:
    request = urllib.request.Request(server.url, data=json.dumps(
        {"queries": questions[:2], "topk": 3, "return_scores": True}).encode())
    with urllib.request.urlopen(request, timeout=30) as r:
      body = json.loads(r.read())
  finally:
    server.shutdown()
    server.server_close()
  served = [[hit["document"]["id"] for hit in row] for row in body["result"]]
  assert served == [[f"d{j}" for j in row] for row in want[:2]]


def test_launchers_index_a_corpus_and_serve_it(encoder_dir, tmp_path):
  """launch/index.py builds the index (and says so); launch/retriever.py --index serves it at
  /retrieve on 127.0.0.1, the corpus read from the manifest."""
  import selectors
  import subprocess
  import sys
  from agentjax.retrieval.http import HttpSearchBackend
  from tests.subprocess_env import subprocess_env
  folder, corpus, _, _ = encoder_dir
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = subprocess_env(JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "launch/index.py", f"--corpus={corpus}",
                        f"--encoder={folder}", f"--out={tmp_path / 'index'}", "--shard_docs=12"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "indexed 30 passages (32-d, float32) in 3 shards" in out.stdout
  proc = subprocess.Popen([sys.executable, "launch/retriever.py", f"--index={tmp_path / 'index'}",
                           "--port=0"], cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
  try:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    assert selector.select(timeout=120), "the launcher printed nothing within 120 s"
    line = proc.stdout.readline()
    assert line.startswith("serving 30 documents at http://127.0.0.1:"), line
    got = HttpSearchBackend(line.split()[-1]).search(["the castle of east"], 2)
    assert got.errors == [None] and len(got.documents[0]) == 2
  finally:
    proc.terminate()
    proc.wait(timeout=10)


def test_the_trainer_config_selects_the_dense_backend(encoder_dir, tmp_path):
  """retrieval.backend "dense": the index folder and recall are checked, naming the field, and
  make_search_backend builds the in-process backend on the given mesh."""
  from agentjax.parallel import make_mesh
  from agentjax.retrieval.dense_index import DenseBackend, TextEncoder, build_dense_index
  from agentjax.train import config as config_lib
  from agentjax.train.builders import make_search_backend
  from configs import base
  folder, corpus, _, _ = encoder_dir
  config = base.get_config("demo")
  config.retrieval.backend = "dense"
  config.retrieval.index_dir = ""
  with pytest.raises(config_lib.ConfigError, match="config.retrieval.index_dir=''"):
    config_lib.validate(config)
  config.retrieval.index_dir = str(tmp_path / "index")
  config.retrieval.recall_target = 1.5
  with pytest.raises(config_lib.ConfigError, match="config.retrieval.recall_target=1.5"):
    config_lib.validate(config)
  config.retrieval.recall_target = 0.0
  build_dense_index(corpus, TextEncoder(folder), config.retrieval.index_dir)
  config.retrieval.corpus_path = ""
  backend = make_search_backend(config, make_mesh())
  assert isinstance(backend, DenseBackend) and backend.num_docs == 30
  config.retrieval.devices = -1
  with pytest.raises(config_lib.ConfigError, match="config.retrieval.devices=-1"):
    config_lib.validate(config)
  config.retrieval.devices = 1  # the first device of the mesh (8 fake ones: dense_search_check)
  assert make_search_backend(config, make_mesh()).index.mesh.size == 1
  assert backend.search(["the river of south"], 1).documents[0]


def test_an_encoder_trained_on_the_world_retrieves_in_a_short_rl_run(world_dir, tokenizer,
                                                                      tmp_path):
  """encoder_training: InfoNCE over a world's first-hop pairs lowers the loss and beats chance
  recall on held-out questions; saved, indexed and searched in-process, it serves a 2-step RL
  run (retrieval.backend "dense") whose rollouts search with it."""
  import json
  from agentjax.models import bert
  from agentjax.retrieval import make_backend
  from agentjax.retrieval.base import load_corpus
  from agentjax.retrieval.dense_index import DenseBackend, TextEncoder, build_dense_index
  from agentjax.retrieval.encoder_training import (EncoderTraining, first_hop_pairs, recall_at,
                                                   info_nce, train_encoder)
  from agentjax.train.trainer import train
  from tests.trainer_fixtures import run_metrics, tiny_config
  # the loss against a NumPy reference
  rng = np.random.default_rng(0)
  q, p = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
  logits = q @ p.T / 0.1
  want = -np.mean(np.diag(logits - np.log(np.exp(logits).sum(1, keepdims=True))))
  np.testing.assert_allclose(float(info_nce(q, p, 0.1)), want, rtol=1e-5)

  corpus = load_corpus(os.path.join(world_dir, "corpus.jsonl"))
  rows = [json.loads(line) for line in open(os.path.join(world_dir, "train.jsonl"))]
  questions, gold = first_hop_pairs(rows, corpus)
  assert len(questions) == len(rows) and all(
      corpus[g]["contents"].split("\n")[0].strip('"') == r["chain"][0]
      for g, r in zip(gold, rows))
  settings = EncoderTraining(hidden_size=32, num_layers=1, num_heads=2, vocab_size=600,
                             steps=40, batch_size=16, lr=3e-3)
  cfg, params, tok, losses = train_encoder(settings, questions[:120], gold[:120],
                                           [r["contents"] for r in corpus])
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses
  folder = bert.save_hf(str(tmp_path / "encoder"), cfg, params, tok)
  index = str(tmp_path / "index")
  build_dense_index(os.path.join(world_dir, "corpus.jsonl"), TextEncoder(folder), index)
  backend = make_backend("dense", index_dir=index)
  held = recall_at(backend, questions[120:], [corpus[g]["id"] for g in gold[120:]], ks=(10,))
  assert held["recall@10"] > 3 * 10 / len(corpus), held  # chance: 10 / N

  config = tiny_config(world_dir, tokenizer.name_or_path, str(tmp_path), algorithm="grpo",
                       steps=2)
  config.retrieval.backend = "dense"
  config.retrieval.index_dir = index
  # One decoder layer (the tiny preset has 2): compiling the policy's layers is most of the run's
  # time, and what is checked (its rollouts search the dense index) does not depend on depth.
  config.model.shape.num_layers = 1
  config.train.eval_every = 0
  # No eval at the end, and no warm-up (it compiles the eval's rollout too): nothing here reads
  # an eval, and the warm-up's own check is tests/test_trainer.py's.
  config.train.final_eval = False
  config.rollout.warm_up = False
  config.train.export_hf = False
  calls = []
  original = DenseBackend.search
  DenseBackend.search = lambda self, queries, topk: calls.append(len(queries)) or original(
      self, queries, topk)
  try:
    train(config, str(tmp_path / "run"))
  finally:
    DenseBackend.search = original
  rows = run_metrics(str(tmp_path / "run"), "reward")
  assert len(rows) == 2 and all(r["search_failure_rate"] == 0.0 for r in rows)
  # (a random tiny policy seldom writes a well-formed search: the scripted one below does)
  assert sum(calls) == sum(r["search_queries"] for r in rows)


def test_rollouts_search_the_dense_index(scripted_world, encoder_dir, tmp_path):
  """The rollout engine with the "dense" backend: the scripted agent's searches go to it in one
  batched call per lane and turn, and its observations hold the index's passages."""
  import jax
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.retrieval import make_backend
  from agentjax.retrieval.dense_index import TextEncoder, build_dense_index
  from agentjax.sampling import SamplingParams
  from tests import agent_fixtures as af
  from tests.test_rollout import QUESTIONS
  tok, _, agent = scripted_world
  folder, corpus, _, _ = encoder_dir
  build_dense_index(corpus, TextEncoder(folder), str(tmp_path / "index"))
  backend = make_backend("dense", index_dir=str(tmp_path / "index"))
  engine = RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96, max_total_tokens=1024,
      topk=2, sampling=SamplingParams(greedy=True)))
  batch, metrics = engine.run(agent.params(af.SEARCH, af.ANSWER), QUESTIONS, jax.random.key(0))
  assert metrics["search_queries"] > 0 and backend.stats.queries == metrics["search_queries"]
  ids = {f"d{i}" for i in range(len(CORPUS))}
  documents = [d for row in batch.turns for t in row for d in t.documents]
  assert documents and all(d.id in ids for d in documents)  # the dense index's passages
  assert all(d.title in t.observation for row in batch.turns for t in row
             for d in t.documents[:1] if t.observation)
