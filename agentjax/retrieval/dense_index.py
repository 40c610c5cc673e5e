"""A dense index on disk and the search backend over it (SearchBackend "dense").

    python launch/index.py --corpus=corpus.jsonl --encoder=e5-base-v2 --out=index/
    backend = make_backend("dense", index_dir="index/")          # in-process, on this mesh
    backend.search(["who wrote hamlet"], topk=3)

An index folder holds the passages' embeddings as safetensors shards ("embeddings" [n, E],
float32 or bfloat16; the documents' ids in the metadata), one per `shard_docs` corpus lines in
corpus order, and manifest.json: the
corpus (path and sha256), the encoder folder, the prefixes and length it encoded with, and the
finished shards. A shard is written to a temporary name and renamed, then recorded in the
manifest (itself replaced atomically): a build killed at any point resumes at the first
unrecorded shard. The backend reads the shards, places them on the mesh (retrieval/dense.py) and
encodes each call's queries in one batch.

Prefixes: e5 (the Search-R1 papers' retriever) embeds "query: " + question and "passage: " +
passage, the defaults here; bge takes an instruction before queries and nothing before passages;
Qwen3-Embedding "Instruct: {task}\nQuery:" before queries (models/qwen/embedding.query_text)
and nothing before passages (--query_prefix, --passage_prefix).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from agentjax.models import bert
from agentjax.models import safetensors_io  # noqa: F401 (numpy reads bfloat16 shards)
from agentjax.retrieval.base import (BACKENDS, CorpusError, Document, SearchResponse, SearchStats,
                                     check_search_args, read_corpus)
from agentjax.retrieval.dense import build_index, search
from agentjax.sampling import bucket

MANIFEST = "manifest.json"
_FORMAT = 1
E5_QUERY, E5_PASSAGE = "query: ", "passage: "


def padded_tokens(ids: Sequence[Sequence[int]], rows: int = 0, fill: int = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Token id lists -> (tokens, valid) [max(rows, n), bucket(longest)] right-padded with 0: a
  few widths, a few programs. Rows past the lists hold one `fill` token (no row all padding)."""
  n = max(rows, len(ids))
  width = bucket(max(len(x) for x in ids))
  tokens = np.zeros((n, width), np.int32)
  tokens[:, 0] = fill
  lengths = np.ones(n, np.int32)
  for r, x in enumerate(ids):
    tokens[r, :len(x)] = x
    lengths[r] = max(len(x), 1)
  return tokens, np.arange(width)[None] < lengths[:, None]


class TextEncoder:
  """Texts -> [N, E] float32 embeddings with an encoder folder (config.json, safetensors, its
  tokenizer): a BERT-family model (e5, bge: agentjax/models/bert, mean or [CLS] pooling) or
  Qwen3-Embedding (model_type qwen2/qwen3: the Qwen port, last-token pooling). Tokenized with
  the folder's tokenizer (its special tokens, cut to max_length), encoded in batches of
  `batch_size` texts of similar length (sorted by length: little padding), widths bucketed to
  powers of two and every batch padded to batch_size rows (a few programs)."""

  def __init__(self, folder: str, mesh: jax.sharding.Mesh | None = None, max_length: int = 512,
               batch_size: int = 64, dtype: str = "float32"):
    from transformers import AutoTokenizer
    self.folder = os.path.abspath(folder)
    with open(os.path.join(folder, "config.json")) as f:
      model_type = json.load(f).get("model_type", "bert")
    if model_type in ("qwen2", "qwen3"):
      from agentjax.models.qwen import embedding
      self.cfg, self.params = embedding.load_embedding_hf(folder, mesh=mesh, dtype=dtype,
                                                         param_dtype=dtype)
      self._encode, self.pooling = embedding.embed, "last"
    else:
      self.cfg, self.params = bert.load_hf(folder, mesh=mesh, dtype=dtype, param_dtype=dtype)
      self._encode, self.pooling = bert.encode, self.cfg.pooling
    self.tokenizer = AutoTokenizer.from_pretrained(folder)
    self.max_length = min(max_length, self.cfg.max_position_embeddings)
    self.batch_size = batch_size

  @property
  def dim(self) -> int:
    return self.cfg.hidden_size

  def __call__(self, texts: Sequence[str], progress: Callable[[int], Any] | None = None
               ) -> np.ndarray:
    ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
    out = np.zeros((len(ids), self.dim), np.float32)
    order = np.argsort([len(x) for x in ids], kind="stable")
    cls = ids[0][0] if ids and ids[0] else 0
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      tokens, valid = padded_tokens([ids[i] for i in rows], self.batch_size, cls)
      out[rows] = np.asarray(self._encode(self.cfg, self.params, tokens, valid))[:len(rows)]
      if progress is not None:
        progress(len(rows))
    return out


def _write_json(path: str, value: Any) -> None:
  """Replaces `path` atomically (a temporary file renamed over it)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(tmp, path)


def build_dense_index(corpus_path: str, encoder: TextEncoder, out_dir: str, *,
                      shard_docs: int = 65536, passage_prefix: str = E5_PASSAGE,
                      dtype: str = "float32", progress: Callable[[int], Any] | None = None
                      ) -> dict[str, Any]:
  """Encodes the corpus's passages into out_dir (module docstring), resuming a killed build:
  shards already recorded are kept when the manifest's corpus, encoder and settings are this
  call's (a CorpusError names the first that differs). Returns the manifest."""
  rows, sha = read_corpus(corpus_path)
  os.makedirs(out_dir, exist_ok=True)
  settings = {"format": _FORMAT, "corpus": os.path.abspath(corpus_path), "corpus_sha256": sha,
              "num_docs": len(rows), "encoder": encoder.folder, "dim": encoder.dim,
              "passage_prefix": passage_prefix, "max_length": encoder.max_length,
              "pooling": encoder.pooling, "dtype": dtype, "shard_docs": shard_docs}
  path = os.path.join(out_dir, MANIFEST)
  manifest = {**settings, "shards": []}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    differs = [k for k in settings if old.get(k) != settings[k]]
    if differs:
      raise CorpusError(f"{path}: an index of other settings is there ({differs[0]}: "
                        f"{old.get(differs[0])!r}, this build: {settings[differs[0]]!r}); "
                        "give another --out or remove it")
    manifest = old
  done = {s["file"] for s in manifest["shards"]}
  if progress is not None:
    progress(sum(s["rows"][1] - s["rows"][0] for s in manifest["shards"]))
  for number, start in enumerate(range(0, len(rows), shard_docs)):
    name = f"embeddings-{number:05d}.safetensors"
    if name in done:
      continue
    chunk = rows[start:start + shard_docs]
    emb = encoder([passage_prefix + r["contents"] for r in chunk], progress)
    emb = emb.astype(np.dtype(dtype)) if dtype != "float32" else emb
    tmp = os.path.join(out_dir, name + ".tmp")
    # The shard's document ids ride in its metadata (safetensors holds tensors and strings).
    save_file({"embeddings": emb}, tmp,
              metadata={"format": "pt", "ids": json.dumps([r["id"] for r in chunk])})
    os.replace(tmp, os.path.join(out_dir, name))
    manifest["shards"].append({"file": name, "rows": [start, start + len(chunk)]})
    _write_json(path, manifest)
  _write_json(path, manifest)
  return manifest


def load_embeddings(index_dir: str) -> tuple[dict[str, Any], np.ndarray]:
  """(manifest, embeddings [N, E]) of a finished index folder, the manifest's "ids" the
  documents' ids in row order (from the shards' metadata); errors name what is missing."""
  path = os.path.join(index_dir, MANIFEST)
  if not os.path.exists(path):
    raise CorpusError(f"{path}: no dense index here (build one with launch/index.py)")
  with open(path) as f:
    manifest = json.load(f)
  covered = sum(s["rows"][1] - s["rows"][0] for s in manifest["shards"])
  if covered != manifest["num_docs"]:
    raise CorpusError(f"{path}: the index is unfinished ({covered} of {manifest['num_docs']} "
                      "passages encoded); run launch/index.py again to finish it")
  parts, ids = [], []
  for shard in sorted(manifest["shards"], key=lambda s: s["rows"][0]):
    path = os.path.join(index_dir, shard["file"])
    emb = load_file(path)["embeddings"]
    with safe_open(path, framework="numpy") as f:
      ids += json.loads((f.metadata() or {}).get("ids", "[]"))
    if emb.shape != (shard["rows"][1] - shard["rows"][0], manifest["dim"]):
      raise CorpusError(f"{os.path.join(index_dir, shard['file'])}: embeddings of shape "
                        f"{list(emb.shape)}, the manifest says "
                        f"[{shard['rows'][1] - shard['rows'][0]}, {manifest['dim']}]")
    parts.append(emb)
  return {**manifest, "ids": ids}, np.concatenate(parts)


class DenseBackend:
  """SearchBackend over a dense index folder, searched on this process's devices (one, or a mesh
  whose devices each hold a block of the rows), the queries of a call encoded in one batch.

  Args:
    index_dir: a folder of build_dense_index.
    corpus_path, encoder: default: the manifest's (the corpus is checked against its sha256).
    mesh: the devices the index lives on (default: the first device).
    query_prefix: prepended to each query (e5: "query: ").
    chunk: rows a device scores at a time; recall_target: approximate search (dense.search).
  """

  def __init__(self, index_dir: str, corpus_path: str | None = None,
               encoder: str | TextEncoder | None = None, mesh: jax.sharding.Mesh | None = None,
               query_prefix: str = E5_QUERY, chunk: int = 16384,
               recall_target: float | None = None, batch_size: int = 64):
    manifest, emb = load_embeddings(index_dir)
    rows, sha = read_corpus(corpus_path or manifest["corpus"])
    if sha != manifest["corpus_sha256"]:
      raise CorpusError(f"{corpus_path or manifest['corpus']}: not the corpus the index at "
                        f"{index_dir} was built from (its sha256 differs)")
    self._ids = [r["id"] for r in rows]
    if manifest["ids"] != self._ids:
      raise CorpusError(f"{index_dir}: the shards' document ids are not the corpus's, in order")
    self._contents = [r["contents"] for r in rows]
    self.num_docs = len(rows)
    self.encoder = encoder if isinstance(encoder, TextEncoder) else TextEncoder(
        encoder or manifest["encoder"], mesh=mesh, max_length=manifest["max_length"],
        batch_size=batch_size)
    self.index = build_index(emb, chunk=chunk, mesh=mesh)
    self.query_prefix, self.recall_target = query_prefix, recall_target
    self.stats = SearchStats()

  def search(self, queries: Sequence[str], topk: int) -> SearchResponse:
    """Top-`topk` passages per query by inner product, best first (equal scores: the earlier
    corpus line), every query of the call in one encode and one search."""
    queries = check_search_args(queries, topk)
    start = time.perf_counter()
    if not queries:
      return SearchResponse([], [])
    k = min(topk, self.num_docs)
    emb = self.encoder([self.query_prefix + q for q in queries])
    scores, ids = (np.asarray(x) for x in search(self.index, emb, k, self.recall_target))
    documents = [[Document(self._ids[j], self._contents[j], float(s))
                  for j, s in zip(row_ids, row_scores)] for row_ids, row_scores in zip(ids, scores)]
    self.stats.record(queries=len(queries), seconds=time.perf_counter() - start)
    return SearchResponse(documents, [None] * len(queries))


BACKENDS.register("dense", DenseBackend)
