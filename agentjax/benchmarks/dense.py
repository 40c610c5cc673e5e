"""`python launch/bench.py dense`: dense search and encoding against the field's references on
the same CPU and data (bench_dense).

    python launch/bench.py dense --dense_docs=200000 --dense_dim=768 --batch=64
    python launch/bench.py dense --dense_docs=1000000 --dense_dim=768   # 3 GB of float32

Search: exact maximum inner product (agentjax/retrieval/dense.py: chunked matmul + top-k) against
faiss-cpu's IndexFlatIP, queries/s over one batch of --batch queries, k = --dense_k, the ids
compared; the approximate mode (lax.approx_max_k at --dense_recall) against faiss' HNSW (M 32,
efSearch 128), each with its recall@k of the exact ids. Embeddings: random unit vectors around
1000 centers (clustered, as text embeddings are). Encoding: passages/s of the Flax BERT
(agentjax/models/bert) against transformers' BertModel in torch, a random e5-base shaped model
(--dense_encoder_layers layers of hidden 768), --dense_passages passages of --length tokens.
"""

from __future__ import annotations

import time

import numpy as np
from absl import flags

from agentjax.benchmarks.common import FLAGS, device_name, median_seconds

flags.DEFINE_integer("dense_docs", 200_000, "dense: indexed vectors.")
flags.DEFINE_integer("dense_dim", 768, "dense: embedding width.")
flags.DEFINE_integer("dense_k", 10, "dense: results per query.")
flags.DEFINE_float("dense_recall", 0.95, "dense: approx_max_k's recall target.")
flags.DEFINE_integer("dense_encoder_layers", 2, "dense: encoder layers timed (e5-base has 12).")
flags.DEFINE_integer("dense_passages", 256, "dense: passages encoded per timing.")
flags.DEFINE_integer("dense_fit_docs", 21_000_000, "dense_fit: indexed vectors (Search-R1's "
                     "2018 Wikipedia: 21M passages).")
flags.DEFINE_integer("dense_fit_devices", 8, "dense_fit: fake CPU devices the index is split "
                     "over.")


def _corpus(n: int, e: int, rng) -> np.ndarray:
  centers = rng.normal(size=(1000, e)).astype(np.float32)
  x = centers[rng.integers(0, 1000, n)] + 0.5 * rng.normal(size=(n, e)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _recall(got: np.ndarray, want: np.ndarray) -> float:
  return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(got, want)]))


def _search_bench(repeats: int) -> dict:
  import faiss
  import jax
  from agentjax.retrieval.dense import build_index, search
  rng = np.random.default_rng(0)
  n, e, k, q = FLAGS.dense_docs, FLAGS.dense_dim, FLAGS.dense_k, FLAGS.batch or 64
  docs = _corpus(n, e, rng)
  queries = _corpus(q, e, rng)
  index = build_index(docs)
  ours = lambda approx=None: jax.block_until_ready(search(index, queries, k, approx))  # noqa: E731
  _, ids = ours()
  flat = faiss.IndexFlatIP(e)
  flat.add(docs)
  _, faiss_ids = flat.search(queries, k)
  exact_s = median_seconds(ours, repeats)
  faiss_s = median_seconds(lambda: flat.search(queries, k), repeats)
  _, approx_ids = ours(FLAGS.dense_recall)
  approx_s = median_seconds(lambda: ours(FLAGS.dense_recall), repeats)
  t0 = time.perf_counter()
  hnsw = faiss.IndexHNSWFlat(e, 32, faiss.METRIC_INNER_PRODUCT)
  hnsw.add(docs)
  hnsw_build = time.perf_counter() - t0
  hnsw.hnsw.efSearch = 128
  _, hnsw_ids = hnsw.search(queries, k)
  hnsw_s = median_seconds(lambda: hnsw.search(queries, k), repeats)
  exact = np.asarray(ids)
  return {"docs": n, "dim": e, "queries": q, "k": k,
          "exact_qps": round(q / exact_s, 1), "faiss_flat_qps": round(q / faiss_s, 1),
          "exact_over_faiss_flat": round(faiss_s / exact_s, 3),
          "exact_ids_equal_faiss": float(np.mean(exact == faiss_ids)),
          "approx_qps": round(q / approx_s, 1), "approx_recall": _recall(np.asarray(approx_ids),
                                                                         exact),
          "faiss_hnsw_qps": round(q / hnsw_s, 1), "faiss_hnsw_recall": _recall(hnsw_ids, exact),
          "faiss_hnsw_build_s": round(hnsw_build, 1)}


def _encode_bench(repeats: int) -> dict:
  import jax
  import torch
  from transformers import BertConfig as HFConfig, BertModel
  from agentjax.models import bert
  length, passages = FLAGS.length or 128, FLAGS.dense_passages
  hf_cfg = HFConfig(hidden_size=768, num_hidden_layers=FLAGS.dense_encoder_layers,
                    num_attention_heads=12, intermediate_size=3072)
  torch.manual_seed(0)
  model = BertModel(hf_cfg, add_pooling_layer=False).eval()
  cfg = bert.BertConfig(num_layers=FLAGS.dense_encoder_layers)
  from agentjax.models.bert.checkpoint import params_from_tensors
  params = params_from_tensors(cfg, {n: t.numpy() for n, t in model.state_dict().items()})
  rng = np.random.default_rng(1)
  tokens = rng.integers(1000, 30000, (passages, length)).astype(np.int32)
  valid = np.ones_like(tokens, bool)
  batch = FLAGS.batch or 64

  def ours():
    for s in range(0, passages, batch):
      jax.block_until_ready(bert.encode(cfg, params, tokens[s:s + batch], valid[s:s + batch]))

  def reference():
    with torch.no_grad():
      for s in range(0, passages, batch):
        hidden = model(input_ids=torch.tensor(tokens[s:s + batch], dtype=torch.long)
                       ).last_hidden_state
        torch.nn.functional.normalize(hidden.mean(1), dim=-1)

  ours()
  reference()
  ours_s, ref_s = median_seconds(ours, repeats), median_seconds(reference, repeats)
  return {"encoder_layers": FLAGS.dense_encoder_layers, "passage_tokens": length,
          "encode_passages_per_s": round(passages / ours_s, 1),
          "transformers_passages_per_s": round(passages / ref_s, 1),
          "encode_over_transformers": round(ref_s / ours_s, 3),
          "torch_threads": torch.get_num_threads()}


def bench_dense_fit() -> dict:
  """`python launch/bench.py dense_fit`: the search program of a wiki-scale bfloat16 index
  (--dense_fit_docs x --dense_dim) on --dense_fit_devices fake CPU devices, compiled and never
  run; memory per device (memory_analysis: arguments, outputs, temporaries) against the index's
  own share. Must run before jax is imported (launch/bench.py does)."""
  from agentjax.benchmarks.fit import force_devices
  force_devices(FLAGS.dense_fit_devices)
  import jax.numpy as jnp
  from agentjax.parallel import make_mesh
  from agentjax.retrieval.dense import compiled_search
  n, e, q, k = FLAGS.dense_fit_docs, FLAGS.dense_dim, FLAGS.batch or 512, FLAGS.dense_k
  t0 = time.perf_counter()
  compiled = compiled_search(n, e, q, k, dtype=jnp.bfloat16, mesh=make_mesh(
      FLAGS.dense_fit_devices))
  memory = compiled.memory_analysis()
  gb = 1 << 30
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  return {"bench": "dense_fit", "docs": n, "dim": e, "dtype": "bfloat16", "queries": q, "k": k,
          "devices": FLAGS.dense_fit_devices, "compile_s": round(time.perf_counter() - t0, 1),
          "index_gb_per_device": round(n * e * 2 / FLAGS.dense_fit_devices / gb, 3),
          "argument_gb": round(memory.argument_size_in_bytes / gb, 3),
          "temp_gb": round(memory.temp_size_in_bytes / gb, 3),
          "total_gb_per_device": round(total / gb, 3),
          "reference": "the index's own bytes per device (N x E x 2 / devices)"}


def bench_dense() -> dict:
  repeats = FLAGS.repeats
  return {"bench": "dense", "device": device_name(), **_search_bench(repeats),
          **_encode_bench(repeats),
          "reference": "faiss-cpu IndexFlatIP / IndexHNSWFlat and transformers BertModel, same "
                       "CPU, same data"}
