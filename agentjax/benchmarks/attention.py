"""`python launch/bench.py attention`: attention memory and time: blockwise against xla
(bench_attention)."""

from __future__ import annotations

import json
import statistics
import time

from agentjax.benchmarks.common import FLAGS, device_name


def bench_attention() -> dict:
  """Attention memory and time: blockwise (flash-style, agentjax/models/attention.py) vs xla
  (the materialized [B, N, Q*G, K] scores), forward + backward.

  The bare attention function at 8 query heads over 4 kv heads (GQA 2), head_dim 64, batch 1,
  float32, a causal mask, block 512 (QwenConfig.attention_block's default): temp memory from
  `jax.jit(jax.grad(f)).lower(...).compile().memory_analysis()` at L = --length (default 2048)
  and 2L, and a 2-layer 8-head model (hidden 256, remat full, batch 1) on the
  loss sequence_logprobs(...).sum(), at the same lengths. Time (median of 5+ rounds) at L = 512,
  where blockwise runs one block (and, as time_ratio_512_block128, 4 x 4 blocks of 128), and at
  L = 2048 (4 x 4 blocks of 512; blocks above the causal diagonal are skipped). max_rel_diff: outputs and gradients of the timed runs (L = 512 and
  2048, block 512), over the largest magnitude. Goals: mem_ratio_2x (blockwise temp at 2L over
  L) <= 2.2, time_ratio_512 <= 1.3.
  """
  import dataclasses

  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models import attention, masks
  from agentjax.models.logprobs import sequence_logprobs
  from agentjax.models.qwen import Qwen, QwenConfig, init_params

  n, g, d, block = 4, 2, 64, 512
  length = FLAGS.length or 2048
  rng = np.random.RandomState(0)

  def inputs(l):
    q, k, v, w = (jnp.asarray(rng.randn(*shape), jnp.float32)
                  for shape in [(1, n, l * g, d), (1, n, d, l), (1, n, l, d), (1, n, l * g, d)])
    return q, k, v, w, masks.causal_padding_mask(jnp.ones((1, l), bool))

  def grad_fn(impl, block=block):
    def loss(q, k, v, w, mask):
      out = attention.attend(q, k, v, mask, dtype=jnp.float32, implementation=impl, block=block)
      return jnp.sum(out * w), out
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))

  def temp_mb(fn, *args):
    return fn.lower(*args).compile().memory_analysis().temp_size_in_bytes / 1e6

  impls = ("xla", "blockwise")
  mem = {impl: {l: round(temp_mb(grad_fn(impl), *inputs(l)), 1) for l in (length, 2 * length)}
         for impl in impls}
  print(json.dumps({"memory_mb_attention": mem}), flush=True)

  cfg = QwenConfig.preset("tiny", hidden_size=256, intermediate_size=768, num_heads=8,
                          num_kv_heads=8, head_dim=32, num_layers=2, remat_policy="full",
                          attention_block=block)
  params = init_params(cfg, jax.random.key(0))
  model_mem = {}
  for impl in impls:
    model = Qwen(dataclasses.replace(cfg, attention=impl))
    loss = lambda p, t, v: sequence_logprobs(model, p, t, v)[0].sum()  # noqa: E731
    model_mem[impl] = {l: round(temp_mb(jax.jit(jax.grad(loss)), params,
                                        jnp.zeros((1, l), jnp.int32), jnp.ones((1, l), bool)), 1)
                       for l in (length, 2 * length)}
  print(json.dumps({"memory_mb_2_layer_model": model_mem}), flush=True)

  times, diffs = {}, []
  for l in (512, 2048):
    args = inputs(l)
    results = {impl: jax.block_until_ready(grad_fn(impl)(*args)) for impl in impls}  # compiles
    (ref_grads, ref_out), (grads, out) = results["xla"], results["blockwise"]
    diffs += [float(jnp.abs(a - b).max() / jnp.abs(b).max())
              for a, b in zip((out, *grads), (ref_out, *ref_grads))]
    # At 512 also blockwise with blocks of 128 (4 x 4 blocks, the causal skip at work).
    fns = {impl: grad_fn(impl) for impl in impls}
    if l == 512:
      fns["blockwise_128"] = grad_fn("blockwise", 128)
      jax.block_until_ready(fns["blockwise_128"](*args))
    # Rounds rotate the order of the programs (this machine's speed drifts).
    names, rounds = list(fns), []
    for i in range(max(FLAGS.repeats, 5)):
      rounds.append({})
      for name in names[i % len(names):] + names[:i % len(names)]:
        start = time.perf_counter()
        jax.block_until_ready(fns[name](*args))
        rounds[-1][name] = time.perf_counter() - start
    for name in names:
      times[(name, l)] = statistics.median(r[name] for r in rounds)
    print(json.dumps({"length": l, **{f"{name}_s": round(times[(name, l)], 4)
                                      for name in names}}), flush=True)

  ratio = lambda table, key: round(table[key][2 * length] / table[key][length], 3)  # noqa: E731
  return {"bench": "attention", "length": length, "block": block,
          "memory_mb": mem, "model_memory_mb": model_mem,
          "model_mem_ratio_2x": ratio(model_mem, "blockwise"),
          "model_mem_ratio_2x_xla": ratio(model_mem, "xla"),
          "time_ratio_2048": round(times[("blockwise", 2048)] / times[("xla", 2048)], 3),
          "time_ratio_512_block128": round(times[("blockwise_128", 512)] / times[("xla", 512)],
                                           3),
          "device": device_name(),
          "mem_ratio_2x": ratio(mem, "blockwise"), "mem_ratio_2x_xla": ratio(mem, "xla"),
          "time_ratio_512": round(times[("blockwise", 512)] / times[("xla", 512)], 3),
          "max_rel_diff": max(diffs)}
