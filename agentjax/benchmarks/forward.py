"""`python launch/bench.py forward`: a random model's teacher-forced forward, jitted, against
transformers (bench_forward)."""

from __future__ import annotations

import time

from agentjax.benchmarks.common import (FLAGS, device_name, matmul_peak_flops, median_seconds,
                                        reference_model)


def bench_forward() -> dict:
  """Teacher-forced forward (logits for every position) of a random model vs transformers."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models import masks
  from agentjax.models.qwen import Qwen, QwenConfig, init_params

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  b, length = FLAGS.batch or 4, FLAGS.length or 512
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, length))
  tokens_per_run = b * length

  if FLAGS.no_reference:
    params, ref_model = init_params(cfg, jax.random.key(0)), None
  else:
    ref_model, params = reference_model(cfg)

  @jax.jit
  def forward(params, ids):
    valid = jnp.ones(ids.shape, bool)
    return Qwen(cfg).apply({"params": params}, ids, masks.positions_from_padding(valid),
                           masks.causal_padding_mask(valid))[0]

  ids_dev = jnp.asarray(ids)
  start = time.perf_counter()
  ours = forward(params, ids_dev).block_until_ready()
  compile_s = time.perf_counter() - start
  ours_s = median_seconds(lambda: forward(params, ids_dev).block_until_ready(), FLAGS.repeats)
  result = {"bench": "forward", "preset": FLAGS.preset, "batch": b, "length": length,
            "dtype": FLAGS.dtype, "ours_tok_s": round(tokens_per_run / ours_s, 1),
            "ours_s": round(ours_s, 3), "compile_s": round(compile_s, 1)}

  if ref_model is not None:
    import torch

    ours = np.asarray(ours)
    with torch.inference_mode():
      ids_t = torch.tensor(ids)
      ref = ref_model(ids_t).logits.numpy()
      ref_s = median_seconds(lambda: ref_model(ids_t), FLAGS.repeats)
    result.update(ref_tok_s=round(tokens_per_run / ref_s, 1), ref_s=round(ref_s, 3),
                  ratio=round(ref_s / ours_s, 3), max_abs_diff=float(np.abs(ours - ref).max()),
                  ref_max_abs=float(np.abs(ref).max()), torch_threads=torch.get_num_threads())
  else:
    # Matmul FLOPs: every parameter once per token, except an untied input embedding (a gather).
    matmul_params = cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    flops = 2 * matmul_params * tokens_per_run
    attn = 4 * cfg.num_layers * b * length * length * cfg.num_heads * cfg.head_dim
    peak = matmul_peak_flops(jnp.dtype(FLAGS.dtype))
    result.update(model_tflops_s=round((flops + attn) / ours_s / 1e12, 2),
                  peak_matmul_tflops_s=round(peak / 1e12, 1),
                  mfu=round((flops + attn) / ours_s / peak, 3))
  result["device"] = device_name()
  return result
