"""`python launch/bench.py gpu`: on an accelerator: decode against the HBM roofline, train-step MFU,
attention cudnn against blockwise (bench_gpu)."""

from __future__ import annotations

import json
import statistics
import time

from agentjax.benchmarks.common import (FLAGS, copy_bandwidth, device_name, matmul_peak_flops,
                                        ppo_minibatch, tree_bytes)


def bench_gpu() -> dict:
  """On an accelerator: the --preset shape (qwen2.5-1.5b when not given) run for
  real, random weights, bfloat16 compute. Three figures, each against a ceiling measured in the
  same run (a bf16 matmul of 8192^3 for FLOP/s, a donated x + 1 over 1 GB for bytes/s):

  decode: `generate` of --new_tokens (128) greedy tokens after a 256-token prompt, bf16 params
    (the decode layout), a 1024-slot cache read through sampling.kv_window_size's window, at
    batch 16 and 128. tokens/s over the HBM roofline: each step must read every weight once
    and the K/V of the window for every row, bytes / measured bandwidth = the fastest step.
  train: one full fine-tuning policy update (train/updates.make_policy_update, configs/base's loss and
    AdamW, float32 master params, bf16 compute, remat full, model.attention auto) on [4, 4096]
    tokens. MFU = model FLOPs (6 x matmul params x tokens, plus causal attention 6 x layers x
    L^2/2 x 2 x heads x head_dim per row) / step time / measured peak; HFU also counts the
    forward recomputed under remat (8 x instead of 6 x).
  attention: forward + backward of the bare attention at the preset's heads (GQA), batch 1,
    L = 8192 causal, bf16: cudnn (jax.nn.dot_product_attention) vs blockwise vs xla, median
    times and the max relative difference to xla.
  """
  import dataclasses

  import jax
  import jax.numpy as jnp
  import numpy as np

  from configs import base as base_config
  from agentjax.models import attention, masks
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.sampling import (SamplingParams, StopTable, decode_layout, extend, generate,
                                 init_state, kv_window_arg, kv_window_size)
  from agentjax.train.optim import make_optimizer
  from agentjax.train.updates import make_policy_update, policy_loss_config

  preset = FLAGS.preset if FLAGS["preset"].present else "qwen2.5-1.5b"
  bf16 = "bfloat16"
  repeats = max(FLAGS.repeats, 3)
  result = {"bench": "gpu", "preset": preset, "device": device_name(),
            "jax": jax.__version__, "backend": jax.default_backend()}
  peak = matmul_peak_flops(jnp.bfloat16, n=8192 if jax.default_backend() != "cpu" else 1024)
  bandwidth = copy_bandwidth(1 << 30 if jax.default_backend() != "cpu" else 1 << 26)
  result.update(peak_bf16_tflops=round(peak / 1e12, 1), hbm_gb_s=round(bandwidth / 1e9, 1))
  print(json.dumps(result), flush=True)

  # ---------------------------------------------------------------------------- decode
  cfg = QwenConfig.preset(preset, dtype=bf16, param_dtype=bf16, eos_token_id=None)
  params = init_params(cfg, jax.random.key(0))
  model = Qwen(cfg)
  decoder = jax.block_until_ready(decode_layout(model, params))
  weight_bytes = tree_bytes(decoder[1])
  del params
  prompt_len, new = FLAGS.length or 256, FLAGS.new_tokens if FLAGS["new_tokens"].present else 128
  budget = 1024
  window = kv_window_size(prompt_len + new, budget)
  slots = window or budget
  decode_rows = []
  for b in [int(x) for x in (FLAGS.batch and [FLAGS.batch] or [16, 128])]:
    ids = np.random.RandomState(b).randint(0, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
    state = init_state(cfg, b, budget, jax.random.key(0))
    state = jax.block_until_ready(extend(*decoder, state, jnp.asarray(ids),
                                         jnp.full((b,), prompt_len, jnp.int32),
                                         jnp.full((b,), -1, jnp.int32)))
    stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
            jnp.int32(budget))

    def run(state=state, b=b, stop=stop):
      fresh = jax.tree.map(jnp.copy, state)
      jax.block_until_ready(fresh)
      t0 = time.perf_counter()
      _, gen = generate(*decoder, fresh, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                        stop, SamplingParams(greedy=True), new, **kv_window_arg(window))
      jax.block_until_ready(gen.new_tokens)
      return time.perf_counter() - t0

    run()  # compiles
    step_s = statistics.median(run() for _ in range(repeats)) / new
    kv_bytes = (cfg.num_layers * 2 * b * cfg.num_kv_heads * slots * cfg.head_dim
                * jnp.dtype(bf16).itemsize)
    roofline_s = (weight_bytes + kv_bytes) / bandwidth
    decode_rows.append({"batch": b, "step_ms": round(1e3 * step_s, 3),
                        "tokens_per_s": round(b / step_s, 1),
                        "roofline_tokens_per_s": round(b / roofline_s, 1),
                        "roofline_fraction": round(roofline_s / step_s, 3),
                        "bytes_per_step_gb": round((weight_bytes + kv_bytes) / 1e9, 3),
                        "kv_window": slots})
    print(json.dumps({"decode": decode_rows[-1]}), flush=True)
    del state
  result["decode"] = dict(prompt_len=prompt_len, new_tokens=new, cache_budget=budget,
                          weight_gb=round(weight_bytes / 1e9, 3), rows=decode_rows)
  del decoder

  # ---------------------------------------------------------------------------- train step
  config = base_config.get_config("qwen2.5-3b")
  o = config.optimizer
  tcfg = QwenConfig.preset(preset, dtype=bf16, param_dtype="float32", remat_policy="full")
  opt = make_optimizer(o.lr, o.warmup_steps, 1000, o.weight_decay, o.clip_norm or None,
                       o.final_lr_ratio, o.b2)
  update = make_policy_update(Qwen(tcfg), opt, policy_loss_config(config))
  tb, tl = 4, 4096
  if jax.default_backend() == "cpu":
    tb, tl = 2, 256
  p = init_params(tcfg, jax.random.key(0))
  opt_state = opt.init(p)
  minibatch = ppo_minibatch(tcfg.vocab_size, tb, tl)
  t0 = time.perf_counter()
  p, opt_state, metrics = update(p, opt_state, minibatch)  # compiles
  jax.block_until_ready(p)
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    p, opt_state, metrics = update(p, opt_state, minibatch)
    jax.block_until_ready(p)
    times.append(time.perf_counter() - t0)
  step = statistics.median(times)
  embed = tcfg.vocab_size * tcfg.hidden_size
  matmul_params = tcfg.num_params() - embed + (embed if tcfg.tie_word_embeddings else 0)
  tokens = tb * tl
  attn = 6 * tcfg.num_layers * tb * (tl * tl / 2) * 2 * tcfg.num_heads * tcfg.head_dim
  model_flops = 6 * matmul_params * tokens + attn
  hw_flops = 8 * matmul_params * tokens + attn * 4 / 3
  result["train"] = dict(batch=tb, length=tl, step_s=round(step, 4), compile_s=round(compile_s, 1),
                         tokens_per_s=round(tokens / step, 1),
                         model_tflops=round(model_flops / step / 1e12, 1),
                         mfu=round(model_flops / step / peak, 3),
                         hfu=round(hw_flops / step / peak, 3),
                         mfu_vs_989=round(model_flops / step / 989e12, 3),
                         skipped=int(metrics["skipped"]), attention=tcfg.attention)
  print(json.dumps({"train": result["train"]}), flush=True)
  del p, opt_state, update

  # ---------------------------------------------------------------------------- attention
  n, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
  length = 8192 if jax.default_backend() != "cpu" else 512
  rng = np.random.RandomState(0)
  q, k, v, w = (jnp.asarray(rng.randn(*shape), jnp.bfloat16)
                for shape in [(1, n, length * g, d), (1, n, d, length), (1, n, length, d),
                              (1, n, length * g, d)])
  mask = masks.causal_padding_mask(jnp.ones((1, length), bool))

  def grad_fn(impl):
    def loss(q, k, v):
      out = attention.attend(q, k, v, mask, dtype=jnp.bfloat16, implementation=impl,
                             block=cfg.attention_block)
      return jnp.sum(out.astype(jnp.float32) * w), out
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))

  impls = ["xla", "blockwise"] + (["cudnn"] if jax.default_backend() == "gpu" else [])
  fns = {impl: grad_fn(impl) for impl in impls}
  outs = {impl: jax.block_until_ready(fns[impl](q, k, v)) for impl in impls}
  att_times = {}
  for impl in impls:
    ts = []
    for _ in range(max(repeats, 5)):
      t0 = time.perf_counter()
      jax.block_until_ready(fns[impl](q, k, v))
      ts.append(time.perf_counter() - t0)
    att_times[impl] = statistics.median(ts)

  def rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

  ref_grads, ref_out = outs["xla"]
  result["attention"] = dict(
      length=length, heads=cfg.num_heads, kv_heads=n, head_dim=d,
      ms={impl: round(1e3 * t, 3) for impl, t in att_times.items()},
      blockwise_over_xla=round(att_times["blockwise"] / att_times["xla"], 3),
      max_rel_diff={impl: max(rel(a, b) for a, b in zip((outs[impl][1], *outs[impl][0]),
                                                       (ref_out, *ref_grads)))
                    for impl in impls if impl != "xla"})
  if "cudnn" in att_times:
    result["attention"]["cudnn_over_blockwise"] = round(att_times["cudnn"]
                                                        / att_times["blockwise"], 3)
  return result
