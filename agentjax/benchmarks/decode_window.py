"""`python launch/bench.py decode_window`: a decode step with a 4096-token cache budget against a
512-token one, windowed (bench_decode_window)."""

from __future__ import annotations

import statistics
import time

from agentjax.benchmarks.common import FLAGS, device_name


def bench_decode_window() -> dict:
  """Decode step time with a 4096-token cache budget over the same with a 512-token budget, for
  the same ~300 live tokens (a --length prompt, default 256, and 32 new tokens; batch 16; the
  --preset shape, random weights): `ratio` for the windowed engine (`generate` with the key
  window sampling.kv_window_size picks for the rows' live context), `ratio_before` for the engine
  that reads the whole cache (window None), in the same run. The goal is ratio <= 1.15.

  One prefill (into the 512-slot cache, copied into the 4096-slot one with copy_rows), then each
  round times `generate` of the new tokens from a copy of the prefilled state for the three
  programs, in an order that rotates between rounds (this machine's speed drifts over minutes).
  Steps are medians over --repeats rounds; greedy tokens must agree between the programs.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.compiles import CompileCounter
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.sampling import (SamplingParams, StopTable, copy_rows, decode_layout, extend,
                                 generate, init_state, kv_window_arg, kv_window_size)

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype,
                          eos_token_id=None)
  b, prompt_len = FLAGS.batch or 16, FLAGS.length or 256
  new = FLAGS.new_tokens if FLAGS["new_tokens"].present else 32
  small, large = 512, 4096
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
  params = init_params(cfg, jax.random.key(0))
  model = Qwen(cfg)
  greedy = SamplingParams(greedy=True)
  rows = jnp.arange(b, dtype=jnp.int32)

  start = time.perf_counter()
  prefilled = {small: init_state(cfg, b, small, jax.random.key(0))}
  prefilled[small] = jax.block_until_ready(extend(
      model, params, prefilled[small], jnp.asarray(ids), jnp.full((b,), prompt_len, jnp.int32),
      jnp.full((b,), -1, jnp.int32)))
  prefill_s = time.perf_counter() - start
  prefilled[large] = jax.block_until_ready(copy_rows(
      init_state(cfg, b, large, jax.random.key(0)), rows, prefilled[small], rows))
  decoder = jax.block_until_ready(decode_layout(model, params))
  del params
  end = prompt_len + new
  # (budget, window): today's engine reads every slot of the budget; the windowed one reads
  # kv_window_size(live context) slots (None at 512: that cache is already the window).
  programs = {"small": (small, kv_window_size(end, small)),
              "large": (large, kv_window_size(end, large)),
              "large_before": (large, None)}

  def decode(name):
    budget, window = programs[name]
    state = jax.block_until_ready(jax.tree.map(jnp.copy, prefilled[budget]))
    stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
            jnp.int32(budget))
    t0 = time.perf_counter()
    state, gen = generate(*decoder, state, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                          stop, greedy, new, **kv_window_arg(window))
    tokens = np.asarray(gen.new_tokens)
    return (time.perf_counter() - t0) / new, tokens

  counter = CompileCounter()
  start = time.perf_counter()
  tokens = {name: decode(name)[1] for name in programs}  # warm-up: compiles each program once
  warm_s, compiles_warmup = time.perf_counter() - start, counter.count
  agree = {name: float((tokens[name] == tokens["small"]).mean()) for name in programs}

  counter = CompileCounter()
  names, rounds = list(programs), []
  for i in range(FLAGS.repeats):
    rounds.append({name: decode(name)[0] for name in names[i % 3:] + names[:i % 3]})
  med = {name: statistics.median(r[name] for r in rounds) for name in names}
  return dict(
      preset=FLAGS.preset, dtype=FLAGS.dtype, batch=b, prompt_len=prompt_len, new_tokens=new,
      budgets=[small, large], window=programs["large"][1],
      ratio=round(med["large"] / med["small"], 3),
      ratio_before=round(med["large_before"] / med["small"], 3),
      ratio_range=[round(min(r["large"] / r["small"] for r in rounds), 3),
                   round(max(r["large"] / r["small"] for r in rounds), 3)],
      ratio_before_range=[round(min(r["large_before"] / r["small"] for r in rounds), 3),
                          round(max(r["large_before"] / r["small"] for r in rounds), 3)],
      step_ms={name: round(1000 * med[name], 2) for name in names},
      greedy_agree=agree, prefill_s=round(prefill_s, 1), compiles=counter.count,
      compiles_warmup=compiles_warmup, warmup_s=round(warm_s, 1), device=device_name())
