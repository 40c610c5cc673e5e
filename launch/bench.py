"""Benchmarks: agentjax against a reference implementation in the same run, reported as a ratio.

    python launch/bench.py forward            # jitted forward vs transformers (PyTorch), CPU
    python launch/bench.py forward --preset=qwen2.5-1.5b --dtype=bfloat16 --no_reference  # GPU

The last printed line is one JSON object. Figures are recorded in docs/BENCHMARKS.md.
Timings are medians over several runs after a warm-up (compilation excluded and reported apart).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen2.5-0.5b", "Model shape (random weights).")
flags.DEFINE_integer("batch", 4, "Batch size.")
flags.DEFINE_integer("length", 512, "Tokens per sequence.")
flags.DEFINE_string("dtype", "float32", "Compute and parameter dtype: float32 or bfloat16.")
flags.DEFINE_integer("repeats", 3, "Timed runs (the median is reported).")
flags.DEFINE_bool("no_reference", False, "Skip the transformers reference (e.g. on a GPU host "
                  "without torch); reports throughput and MFU only.")


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def device_name() -> str:
  import jax

  dev = jax.devices()[0]
  if dev.platform == "cpu":
    return f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
  return f"{dev.platform}: {dev.device_kind} x{jax.device_count()}"


def matmul_peak_flops(dtype, n: int = 4096, repeats: int = 5) -> float:
  """Measured peak of one large square matmul on the default device, FLOP/s."""
  import jax
  import jax.numpy as jnp

  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a: a @ a)
  f(a).block_until_ready()
  secs = median_seconds(lambda: f(a).block_until_ready(), repeats)
  return 2 * n ** 3 / secs


def bench_forward() -> dict:
  """Teacher-forced forward (logits for every position) of a random model vs transformers."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models import masks
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.models.qwen.checkpoint import params_from_tensors

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  b, length = FLAGS.batch, FLAGS.length
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, length))
  tokens_per_run = b * length

  ref_model = None
  if FLAGS.no_reference:
    params = init_params(cfg, jax.random.key(0))
  else:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    ref_model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.to_hf_dict())).eval()
    tensors = {k: v.detach().float().numpy() for k, v in ref_model.state_dict().items()}
    params = params_from_tensors(cfg, tensors)
    del tensors

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


BENCHES = {"forward": bench_forward}


def main(argv):
  if len(argv) != 2 or argv[1] not in BENCHES:
    sys.exit(f"usage: python launch/bench.py {{{'|'.join(BENCHES)}}} [--flags]")
  result = BENCHES[argv[1]]()
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
