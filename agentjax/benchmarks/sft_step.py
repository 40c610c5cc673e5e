"""`python launch/bench.py sft_step`: `make demo`'s SFT step: micro-batches against the whole batch
(bench_sft_step)."""

from __future__ import annotations

import json
import os
import statistics
import time

from agentjax.benchmarks.common import FLAGS, device_name


def bench_sft_step() -> dict:
  """One SFT step of `make demo` (configs/sft.py:demo: the tiny model from scratch, [16, 384]
  batches of SynthWorld demonstrations and packed corpus text in run_sft's order): the preset's
  micro-batches (sft.micro_batches sorted by length, padded to sft.length_buckets) against the
  whole batch padded to max_len, in the same run, rounds interleaved. Both start from the same
  weights and see the same batches; max_rel_loss_diff compares their losses over the first
  --steps steps (the math is the same: only the rounding may differ). `ratio` = micro / whole
  per-step time (compiles excluded: `compiles` counts the micro-batch shapes met, `warmup_s`
  is each variant's first pass over those steps, compiles included)."""
  import tempfile

  import jax
  import numpy as np

  from configs import sft as sft_config
  from agentjax.data.demo_world import build_demo_world
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.models.tokenizer import load_tokenizer
  from agentjax.retrieval import load_corpus
  from agentjax.train import sft
  from agentjax.train.optim import make_optimizer

  config = sft_config.get_config("demo")
  s, m = config.sft, config.model
  steps = FLAGS.steps
  with tempfile.TemporaryDirectory() as tmp:
    world = os.path.join(tmp, "synthworld")
    build_demo_world(world, topk=config.retrieval.topk)
    tokenizer = load_tokenizer(os.path.join(world, "tokenizer"))
    with open(os.path.join(world, "demos.jsonl")) as f:
      demos = [json.loads(line) for line in f]
    examples = sft.tokenize_demos(tokenizer, demos) + sft.pack_text(
        tokenizer, (r["contents"] for r in load_corpus(os.path.join(world, "corpus.jsonl"))),
        s.max_len)
  cfg = QwenConfig.preset(m.preset, vocab_size=-(-len(tokenizer) // 64) * 64,
                          **{k: v for k, v in m.shape.items() if v}, param_dtype=m.param_dtype,
                          dtype=m.dtype, remat_policy=m.remat_policy,
                          attention=m.get("attention", "auto"))
  order = sft._round_robin_batches(len(examples), s.batch_size, np.random.default_rng(0))
  chosen = [[examples[j] for j in next(order)] for _ in range(steps)]
  pad = tokenizer.pad_token_id or 0
  variants = {"whole": (1, ()), "micro": (s.micro_batches, tuple(s.length_buckets))}
  batches = {k: [sft.pack_micro_batches(b, s.max_len, pad, n, buckets) for b in chosen]
             for k, (n, buckets) in variants.items()}
  optimizer = make_optimizer(s.lr, max(1, s.steps // 20), s.steps, config.optimizer.weight_decay,
                             config.optimizer.clip_norm or None, config.optimizer.final_lr_ratio,
                             config.optimizer.b2)
  state, losses, warmup, times = {}, {}, {}, {k: [] for k in variants}
  for k in variants:
    step = sft.make_sft_step(Qwen(cfg), optimizer)
    params = init_params(cfg, jax.random.key(config.seed))
    opt_state, losses[k] = optimizer.init(params), []
    start = time.perf_counter()
    for batch in batches[k]:
      params, opt_state, metrics = step(params, opt_state, batch)
      losses[k].append(float(metrics["loss"]))
    warmup[k] = time.perf_counter() - start
    state[k] = [step, params, opt_state]
  whole, micro = np.asarray(losses["whole"]), np.asarray(losses["micro"])
  per_round = 4
  for r in range(max(FLAGS.repeats, 5)):
    for k in variants:
      step, params, opt_state = state[k]
      for i in range(per_round):
        batch = batches[k][(r * per_round + i) % steps]
        start = time.perf_counter()
        params, opt_state, metrics = step(params, opt_state, batch)
        float(metrics["loss"])
        times[k].append(time.perf_counter() - start)
      state[k][1:] = params, opt_state
  t_whole, t_micro = statistics.median(times["whole"]), statistics.median(times["micro"])
  return {"bench": "sft_step", "ratio": round(t_micro / t_whole, 3),
          "whole_ms": round(1e3 * t_whole, 1), "micro_ms": round(1e3 * t_micro, 1),
          "micro_batches": s.micro_batches, "length_buckets": list(s.length_buckets),
          "max_len": s.max_len, "batch": s.batch_size,
          "compiles": len({tuple(b["tokens"].shape for b in mb) for mb in batches["micro"]}),
          "warmup_s": {k: round(v, 1) for k, v in warmup.items()},
          "max_rel_loss_diff": float(np.max(np.abs(micro - whole) / np.abs(whole))),
          "steps_compared": steps, "device": device_name()}
