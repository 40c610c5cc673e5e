"""Dense search on 8 fake CPU devices returns what one device does (run by tests/test_dense.py):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.dense_search_check
"""

import jax
import numpy as np

from agentjax.parallel import make_mesh
from agentjax.retrieval.dense import build_index, search


def main():
  assert jax.device_count() == 8, jax.devices()
  rng = np.random.default_rng(0)
  docs = rng.normal(size=(1001, 16)).astype(np.float32)  # not a multiple of 8 x chunk
  docs[500:510] = docs[3]  # equal scores across devices' blocks: lower id first
  queries = rng.normal(size=(5, 16)).astype(np.float32)
  queries[0] = docs[3]
  one = search(build_index(docs, chunk=32), queries, 20)
  # the whole mesh, a 3-axis one, and a named subset (retrieval.devices: the first 4)
  for mesh in (make_mesh(8), make_mesh(2, 2, 2), make_mesh(devices=jax.devices()[:4])):
    index = build_index(docs, chunk=32, mesh=mesh)
    assert index.embeddings.sharding.shard_shape(index.embeddings.shape)[0] * mesh.size == \
        index.embeddings.shape[0]
    assert len(index.embeddings.sharding.device_set) == mesh.size
    got = search(index, queries, 20)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(one[1]))
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(one[0]), rtol=1e-6)
  assert list(np.asarray(one[1])[0, :11]) == [3] + list(range(500, 510))
  print("DENSE_SEARCH_OK")


if __name__ == "__main__":
  main()
