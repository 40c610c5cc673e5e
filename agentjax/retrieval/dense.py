"""Dense retrieval on the training devices: maximum inner product search over an embedding
matrix sharded like everything else.

    scores, ids = search(index, queries, k)                    # exact, [Q, k] each
    scores, ids = search(index, queries, k, recall_target=0.95) # approximate (lax.approx_max_k)

`index` is a DenseIndex: embeddings [N, E] (rows padded to a multiple of the devices x chunk,
the padding never returned) placed with rows over every device of the mesh (logical axis
"docs"). Each device scores its rows a chunk at a time (a [Q, chunk] matmul and a top-k,
merged into a running [Q, k] in a lax.scan: memory Q x (chunk + k), never Q x N), then the
devices' [Q, k] candidates are gathered and merged. Exact search returns the same ids and scores
as faiss' IndexFlatIP; equal scores come lower id first (lax.top_k keeps the lower index among
equals; the running candidates precede the chunk's, and devices hold contiguous blocks in order),
where faiss lists them higher id first (its tie order is not documented).

Shapes: N documents, E embedding width, Q queries, k results.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

Array = jax.Array
_F32 = jnp.float32
# A padded row's score: below any real inner product, so it is never among the top k (k <= N).
_PAD_SCORE = -jnp.inf


@dataclasses.dataclass(frozen=True)
class DenseIndex:
  """embeddings: [N_padded, E] on `mesh`, rows over every device (None: one device);
  size: N, the real rows (the rest are padding); chunk: rows a device scores at a time."""
  embeddings: Array
  size: int
  chunk: int
  mesh: jax.sharding.Mesh | None = None

  @property
  def shards(self) -> int:
    return 1 if self.mesh is None else self.mesh.size


def build_index(embeddings: np.ndarray | Array, *, chunk: int = 16384,
                mesh: jax.sharding.Mesh | None = None, dtype: Any = None) -> DenseIndex:
  """A DenseIndex of embeddings [N, E] (float32 or bfloat16: `dtype`, default theirs): padded
  with zero rows to a multiple of devices x chunk (chunk shrinks to the rows a device holds when
  fewer) and placed with rows over every device of `mesh`."""
  n, e = embeddings.shape
  if n == 0:
    raise ValueError("build_index: no embeddings")
  shards = 1 if mesh is None else mesh.size
  per_shard = -(-n // shards)
  chunk = max(1, min(chunk, per_shard))
  per_shard = -(-per_shard // chunk) * chunk
  host = np.asarray(embeddings, dtype=dtype or np.asarray(embeddings[:1]).dtype)
  padded = np.zeros((per_shard * shards, e), host.dtype)
  padded[:n] = host
  if mesh is None:
    placed = jax.device_put(padded)
  else:
    placed = jax.device_put(padded, NamedSharding(mesh, P(mesh.axis_names, None)))
  return DenseIndex(placed, n, chunk, mesh)


def _merge(scores: Array, ids: Array, k: int, approx: float | None) -> tuple[Array, Array]:
  """The k best of [Q, M] candidates (scores, ids), ties to the earlier candidate."""
  if approx is None:
    best, where = jax.lax.top_k(scores, k)
  else:
    best, where = jax.lax.approx_max_k(scores, k, recall_target=approx)
  return best, jnp.take_along_axis(ids, where, axis=1)


def _search_rows(rows: Array, queries: Array, first: Array, size: int, k: int, chunk: int,
                 approx: float | None) -> tuple[Array, Array]:
  """The best k of one block of rows [R, E] (global ids first + r; rows past `size` padding):
  a scan over chunks, each [Q, chunk] scored, cut to its k best and merged with the running k."""
  q = queries.shape[0]
  take = min(k, chunk)

  # XLA:CPU computes a bfloat16 matmul in float32, and the upcast of the rows, loop-invariant,
  # is hoisted out of the loop: a float32 copy of the whole block (twice a bfloat16 index's
  # bytes; bench dense_fit measured 0.85 GB of temporaries for a 0.40 GB block). Converting each
  # chunk ourselves, from rows carried through the loop behind a barrier (not loop-invariant),
  # keeps the temporaries to a chunk's scores (0.08 GB). Other backends multiply bf16 natively.
  compute = _F32 if jax.default_backend() == "cpu" else queries.dtype
  queries = queries.astype(compute)

  def step(carry, i):
    best, best_ids, rows = carry
    rows = jax.lax.optimization_barrier(rows)  # see `compute` above
    block = jax.lax.dynamic_slice_in_dim(rows, i * chunk, chunk).astype(compute)
    ids = first + i * chunk + jnp.arange(chunk, dtype=jnp.int32)
    scores = jnp.einsum("qe,ce->qc", queries, block, preferred_element_type=_F32)
    scores = jnp.where(ids[None] < size, scores, _PAD_SCORE)
    top, top_ids = _merge(scores, jnp.broadcast_to(ids, (q, chunk)), take, approx)
    best, best_ids = _merge(jnp.concatenate([best, top], 1),
                            jnp.concatenate([best_ids, top_ids], 1), k, None)
    return (best, best_ids, rows), None

  init = (jnp.full((q, k), _PAD_SCORE, _F32), jnp.full((q, k), -1, jnp.int32), rows)
  (best, best_ids, _), _ = jax.lax.scan(step, init, jnp.arange(rows.shape[0] // chunk))
  return best, best_ids


@functools.partial(jax.jit, static_argnames=("size", "k", "chunk", "approx", "mesh"))
def _search(embeddings: Array, queries: Array, *, size: int, k: int, chunk: int,
            approx: float | None, mesh: jax.sharding.Mesh | None) -> tuple[Array, Array]:
  # Host queries come in as they are (no eager copy program per shape) and are cast here.
  queries = queries.astype(embeddings.dtype)
  if mesh is None:
    return _search_rows(embeddings, queries, jnp.int32(0), size, k, chunk, approx)
  axes = mesh.axis_names

  def local(rows, queries):
    shard = jax.lax.axis_index(axes)
    best, ids = _search_rows(rows, queries, (shard * rows.shape[0]).astype(jnp.int32), size, k,
                             chunk, approx)
    # Every device's k candidates, in device (= id) order, then the best k of them all.
    best = jax.lax.all_gather(best, axes, axis=1, tiled=True)
    ids = jax.lax.all_gather(ids, axes, axis=1, tiled=True)
    return _merge(best, ids, k, None)

  return jax.shard_map(local, mesh=mesh, in_specs=(P(axes, None), P()), out_specs=(P(), P()),
                       check_vma=False)(embeddings, queries)


def search(index: DenseIndex, queries: np.ndarray | Array, k: int,
           recall_target: float | None = None) -> tuple[Array, Array]:
  """The k largest inner products of each query [Q, E] with the index's rows: (scores [Q, k]
  float32, ids [Q, k] int32), best first, equal scores lower id first (exact). recall_target:
  approximate per chunk with lax.approx_max_k at that recall (on TPU a fast partial reduction;
  elsewhere it may be exact); the merges stay exact."""
  if not 1 <= k <= index.size:
    raise ValueError(f"dense search: k={k} must be in [1, {index.size}] (the index's documents)")
  shape = np.shape(queries)
  if len(shape) != 2 or shape[1] != index.embeddings.shape[1]:
    raise ValueError(f"dense search: queries of shape {tuple(shape)}, expected "
                     f"[Q, {index.embeddings.shape[1]}]")
  return _search(index.embeddings, queries, size=index.size, k=k, chunk=index.chunk,
                 approx=recall_target, mesh=index.mesh)


def compiled_search(num_docs: int, dim: int, queries: int, k: int, *, dtype: Any = jnp.bfloat16,
                    chunk: int = 16384, mesh: jax.sharding.Mesh | None = None,
                    recall_target: float | None = None) -> Any:
  """The search program of an index of num_docs x dim compiled, never run, from abstract arrays
  (placed as build_index places them): its memory_analysis() says what a device holds for a
  wiki-scale index before any embedding is computed."""
  shards = 1 if mesh is None else mesh.size
  per_shard = -(-num_docs // shards)
  chunk = max(1, min(chunk, per_shard))
  per_shard = -(-per_shard // chunk) * chunk
  rows = jax.ShapeDtypeStruct((per_shard * shards, dim), dtype, sharding=None if mesh is None
                              else NamedSharding(mesh, P(mesh.axis_names, None)))
  asked = jax.ShapeDtypeStruct((queries, dim), dtype)
  return _search.lower(rows, asked, size=num_docs, k=k, chunk=chunk, approx=recall_target,
                       mesh=mesh).compile()
