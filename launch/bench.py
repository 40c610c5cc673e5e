"""Benchmarks: agentjax against a reference implementation in the same run, reported as a ratio.

    python launch/bench.py forward            # jitted forward vs transformers (PyTorch), CPU
    python launch/bench.py forward --preset=qwen2.5-1.5b --dtype=bfloat16 --no_reference  # GPU
    python launch/bench.py decode --batch=16 --length=256   # sampler vs transformers generate
    python launch/bench.py decode --preset=qwen2.5-1.5b --dtype=bfloat16 --batch=64 --no_reference  # GPU
    python launch/bench.py decode --lora_rank=32   # sampler: bare vs LoRA (merged / unmerged)
    python launch/bench.py decode_window     # decode step: 4096- vs 512-token budget, windowed
    python launch/bench.py rollout_mix        # rollout engines: turn-synchronous vs slots
    python launch/bench.py rollout_mix --mix_model=qwen2.5-1.5b --dtype=bfloat16 --group_size=16
    python launch/bench.py attention          # attention memory/time: blockwise vs xla
    python launch/bench.py rewards            # outcome rewards vs plain Python; format rule
    python launch/bench.py synthworld         # world generation: full vs quarter size
    python launch/bench.py sft_step           # make demo's SFT step: micro-batches vs whole batch
    python launch/bench.py judge              # local judge: a step's calls batched vs one at a time
    python launch/bench.py train_step --lora_rank=32   # PPO update: LoRA vs full fine-tuning
    python launch/bench.py coreact            # Co-ReAct guided rollouts vs plain ReAct
    python launch/bench.py ppo_step           # PPO: scoring + update with the critic vs without
    python launch/bench.py fit --config=configs/igpo.py:qwen2.5-7b --devices=8 --device_memory_gb=80
                                              # compile-only memory per device (launch/fit.py)

The last printed line is one JSON object. Figures are recorded in docs/BENCHMARKS.md.
Timings are medians over several runs after a warm-up (compilation excluded and reported apart).
"""

from __future__ import annotations

import collections
import json
import os
import re
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
flags.DEFINE_integer("batch", None, "Batch size (forward: 4, decode: 16).")
flags.DEFINE_integer("length", None, "Tokens per sequence (forward: 512) or prompt (decode: 256).")
flags.DEFINE_integer("steps", 20, "sft_step: steps compared (and timed, round robin).")
flags.DEFINE_string("dtype", "float32", "Compute and parameter dtype: float32 or bfloat16.")
flags.DEFINE_integer("repeats", 3, "Timed runs (the median is reported).")
flags.DEFINE_integer("new_tokens", 128, "decode: tokens generated per sequence.")
flags.DEFINE_integer("think_tokens", 60, "rollout: tokens of thinking before each action.")
flags.DEFINE_integer("lora_rank", 0, "decode: > 0 compares the bare model with one LoRA adapter "
                     "of this rank (merged and unmerged decode); train_step: the adapters' rank.")
flags.DEFINE_float("lora_alpha", 0.0, "LoRA alpha (0: equal to the rank, config.model.lora's "
                   "default).")
flags.DEFINE_string("time_preset", "", "train_step: preset whose steps are timed (default: "
                    "--preset); memory is always analysed at --preset.")
flags.DEFINE_list("time_layers", [], "train_step: time the steps at these depths of "
                  "--time_preset (e.g. 4,8) instead of its own, and extrapolate to it (when full "
                  "fine-tuning at the preset's depth does not fit in memory).")
flags.DEFINE_bool("memory", True, "train_step: analyse memory at --preset (--nomemory: time only).")
flags.DEFINE_integer("questions", None, "rollout_mix: questions per rollout (default 6; the "
                     "batch is questions x group_size trajectories).")
flags.DEFINE_integer("group_size", None, "rollout_mix: rollouts per question (default 8).")
flags.DEFINE_integer("search_latency_ms", 20, "rollout_mix: the retriever's added latency per "
                     "search call (batched: one call per batch of queries).")
flags.DEFINE_integer("slots", 0, "rollout_mix: the slot engine's rollout.slots (0: one per "
                     "trajectory).")
flags.DEFINE_string("mix_model", "scripted", "rollout_mix: 'scripted' (the tiny scripted Qwen) "
                    "or a preset name (e.g. qwen2.5-1.5b): the same script at that shape's "
                    "compute, in --dtype.")
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

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  b, length = FLAGS.batch or 4, FLAGS.length or 512
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, length))
  tokens_per_run = b * length

  if FLAGS.no_reference:
    params, ref_model = init_params(cfg, jax.random.key(0)), None
  else:
    ref_model, params = _reference_model(cfg)

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


def _reference_model(cfg):
  """A random transformers model of cfg's shape, and the same weights as agentjax params."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM

  from agentjax.models.qwen.checkpoint import params_from_tensors

  torch.manual_seed(0)
  model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.to_hf_dict())).eval()
  tensors = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  return model, params_from_tensors(cfg, tensors)


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
  """Measured device memory bandwidth, bytes/s: x + 1 over a float32 array (read and write)."""
  import jax
  import jax.numpy as jnp

  # The input is donated, so each call writes into the buffer it reads: steady-state bandwidth,
  # not the page faults of a fresh 1 GB output. Ten chained calls per timing, one sync: on a GPU
  # one call is under a millisecond.
  f = jax.jit(lambda x: x + 1, donate_argnums=0)
  box = [f(jnp.zeros((nbytes // 4,), jnp.float32)).block_until_ready()]

  def ten():
    for _ in range(10):
      box[0] = f(box[0])
    box[0].block_until_ready()

  return 10 * 2 * nbytes / median_seconds(ten, repeats)


def bench_decode() -> dict:
  """Greedy generation (prefill + new tokens) vs transformers generate, same random weights.

  Each round times, for each side (the order alternates between rounds): ours: the decode layout,
  the prefill (`extend`), then `generate` of the new tokens from that prefilled state; theirs:
  `generate` of 1 token (its prefill and setup) and of all the new tokens. Both sides of every
  ratio run within minutes of each other (this shared machine's speed drifts by 10-15% over
  minutes). `ratio` is the decode throughput ratio (new tokens per second of decoding: ours
  `generate` over its N steps, theirs (generate(N) - generate(1)) over N - 1 steps), from the
  median times, with the range of the per-round ratios; `ratio_layout_in_step` also charges our
  layout copy to our decode. The prefill (compute-bound, the same FLOPs on both sides) is
  reported apart, and so is the end-to-end ratio of one generation from checkpoint-layout
  weights (our layout copy included).

  With --lora_rank > 0: bench_decode_lora (the bare model against one LoRA adapter; no
  transformers reference).
  """
  if FLAGS.lora_rank > 0:
    return bench_decode_lora()
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.compiles import CompileCounter
  from agentjax.models.qwen import Qwen, QwenConfig
  from agentjax.sampling import (SamplingParams, StopTable, bucket, decode_layout, extend,
                                 generate, init_state)

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype,
                          eos_token_id=None)
  b, prompt_len, new = FLAGS.batch or 16, FLAGS.length or 256, FLAGS.new_tokens
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
  if FLAGS.no_reference:
    from agentjax.models.qwen import init_params
    params, ref_model = init_params(cfg, jax.random.key(0)), None
  else:
    ref_model, params = _reference_model(cfg)
  model = Qwen(cfg)
  cache_len = bucket(prompt_len + new)
  no_stops = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
              jnp.int32(cache_len))
  greedy = SamplingParams(greedy=True)

  # The decode layout (on CPU a transposed copy of the kernels) is made once per weights version,
  # as a serving engine lays weights out at load and a rollout once for all its turns; its time
  # is reported apart. generate() called with checkpoint-layout params makes it itself.
  def layout():
    return jax.block_until_ready(decode_layout(model, params))

  def prefill():
    state = init_state(cfg, b, cache_len, jax.random.key(0))
    state = extend(model, params, state, jnp.asarray(ids), jnp.full((b,), prompt_len, jnp.int32),
                   jnp.full((b,), -1, jnp.int32))
    return jax.block_until_ready(state)

  def decode(state):
    state, gen = generate(*decoder, state, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                          no_stops, greedy, new)
    return np.asarray(gen.new_tokens), gen

  def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out

  counter = CompileCounter()
  start = time.perf_counter()
  decoder = layout()
  ours_tokens, gen = decode(prefill())
  warm_s = time.perf_counter() - start
  compiles_warmup = counter.count
  assert (np.asarray(gen.num_new) == new).all()

  def ours_round():
    layout_s, _ = timed(layout)
    prefill_s, state = timed(prefill)
    decode_s, _ = timed(decode, state)
    return {"ours_layout_s": layout_s, "ours_prefill_s": prefill_s,
            "ours_step_s": decode_s / new, "ours_e2e_s": layout_s + prefill_s + decode_s}

  sides = [ours_round]
  if ref_model is not None:
    import torch

    ids_t = torch.tensor(ids, dtype=torch.long)

    @torch.inference_mode()
    def ref_generate(n):
      return ref_model.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=n,
                                min_new_tokens=n, do_sample=False, pad_token_id=0,
                                eos_token_id=None)[:, prompt_len:].numpy()

    ref_tokens = ref_generate(new)  # warm-up
    ref_generate(1)

    def ref_round():
      prefill_s, _ = timed(ref_generate, 1)
      total_s, _ = timed(ref_generate, new)
      return {"ref_prefill_s": prefill_s, "ref_step_s": (total_s - prefill_s) / (new - 1),
              "ref_e2e_s": total_s}

    sides.append(ref_round)

  counter = CompileCounter()
  rounds = []
  for i in range(FLAGS.repeats):
    times = {}
    for side_round in sides[::-1] if i % 2 else sides:
      times.update(side_round())
    rounds.append(times)
  med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
  tokens = b * new
  result = {"bench": "decode", "preset": FLAGS.preset, "batch": b, "prompt": prompt_len,
            "new_tokens": new, "dtype": FLAGS.dtype, "rounds": FLAGS.repeats,
            "ours_tok_s": round(b / med["ours_step_s"], 1),
            "compiles": counter.count, "compiles_warmup": compiles_warmup,
            "warmup_s": round(warm_s, 1), "ours_step_ms": round(med["ours_step_s"] * 1000, 1),
            "ours_prefill_s": round(med["ours_prefill_s"], 3),
            "ours_layout_s": round(med["ours_layout_s"], 3),
            "ours_e2e_s": round(med["ours_e2e_s"], 3)}
  if ref_model is not None:
    def ratio(ref_key, ours_key, ours_extra=lambda r: 0.0):
      per_round = sorted(r[ref_key] / (r[ours_key] + ours_extra(r)) for r in rounds)
      value = med[ref_key] / (med[ours_key] + statistics.median(ours_extra(r) for r in rounds))
      return round(value, 3), [round(per_round[0], 3), round(per_round[-1], 3)]

    decode_ratio, decode_range = ratio("ref_step_s", "ours_step_s")
    e2e_ratio, e2e_range = ratio("ref_e2e_s", "ours_e2e_s")
    result.update(
        ref_tok_s=round(b / med["ref_step_s"], 1), ratio=decode_ratio, ratio_range=decode_range,
        ratio_layout_in_step=ratio("ref_step_s", "ours_step_s",
                                   lambda r: r["ours_layout_s"] / new)[0],
        ref_step_ms=round(med["ref_step_s"] * 1000, 1),
        ours_e2e_tok_s=round(tokens / med["ours_e2e_s"], 1),
        ref_e2e_tok_s=round(tokens / med["ref_e2e_s"], 1), ref_e2e_s=round(med["ref_e2e_s"], 3),
        end_to_end_ratio=e2e_ratio, end_to_end_range=e2e_range,
        ref_prefill_s=round(med["ref_prefill_s"], 3),
        prefill_ratio=ratio("ref_prefill_s", "ours_prefill_s")[0],
        greedy_token_agreement=float((ref_tokens == ours_tokens).mean()))
  else:
    # Memory roofline of this implementation: each step reads every weight once (an untied input
    # embedding only in the B rows it gathers, counted whole here) and all cache_len slots of the
    # KV cache (masked slots included: the loop reads them; live ones average prompt + new / 2).
    itemsize = jnp.dtype(FLAGS.dtype).itemsize
    step_bytes = (cfg.num_params() * itemsize
                  + 2 * cfg.num_layers * b * cfg.num_kv_heads * cache_len * cfg.head_dim * itemsize)
    bandwidth = copy_bandwidth()
    result.update(step_bytes_gb=round(step_bytes / 1e9, 3),
                  copy_bandwidth_gb_s=round(bandwidth / 1e9, 1),
                  hbm_roofline_fraction=round(step_bytes / bandwidth / med["ours_step_s"], 3))
  result["device"] = device_name()
  return result


def _random_lora_b(adapters, rng, std: float = 0.05):
  """Adapters with B drawn normal(0, std) instead of zero, so that the adapter changes the
  model's outputs (a fresh adapter, B = 0, would leave the bare backbone's tokens)."""
  import jax

  leaves, treedef = jax.tree_util.tree_flatten_with_path(adapters)
  keys = jax.random.split(rng, len(leaves))
  out = [std * jax.random.normal(k, x.shape, x.dtype) if path[-1].key == "lora_b" else x
         for k, (path, x) in zip(keys, leaves)]
  return jax.tree_util.tree_unflatten(treedef, out)


def bench_decode_lora() -> dict:
  """Greedy generation of the bare backbone against the same backbone with one LoRA adapter
  (rank --lora_rank on all 7 projections, random non-zero B), in the two decode modes of
  LoraSpec.decode: "merge" (decode_layout folds the adapter into a copy of the kernels, then the
  bare program runs) and "unmerged" (the low-rank products inside the token loop). Same shape as
  bench_decode (qwen2.5-0.5b random weights, batch 16, prompt 256, 128 new tokens, float32);
  no transformers reference (bench_decode compares the bare sampler with it).

  Each round (the order of the three rotates between rounds) times, per variant, the decode
  layout (`decode_layout`: on CPU the out-major copy of the kernels; for "merge" the merge
  first, which a rollout pays once for all its turns and is charged here to one 128-token
  `generate` call, the pessimistic case) and `generate` of the new tokens from a prefilled
  state; the merge alone (`merge_selected`) is timed apart. The prefill (`extend`, which always
  runs the adapter unmerged) is timed for the bare and the LoRA model. Ratios are bare / LoRA
  time (>= 1: LoRA as fast): `ratio_*` per generate call, layout included; `ratio_*_loop` the
  token loop alone. Sanity: the merged and unmerged greedy tokens must agree (the first token of
  every row exactly; `greedy_merge_vs_unmerged` over all tokens), and differ from the bare
  model's (`greedy_lora_vs_bare`: the adapter matters).
  """
  import dataclasses

  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.compiles import CompileCounter
  from agentjax.models.lora import LoraSpec, attach, merge_selected
  from agentjax.models.qwen import Qwen, QwenConfig, init_adapters, init_params
  from agentjax.sampling import (SamplingParams, StopTable, bucket, decode_layout, extend,
                                 generate, init_state)

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype,
                          eos_token_id=None)
  b, prompt_len, new = FLAGS.batch or 16, FLAGS.length or 256, FLAGS.new_tokens
  rank = FLAGS.lora_rank
  alpha = FLAGS.lora_alpha or float(rank)
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
  backbone = init_params(cfg, jax.random.key(0))
  spec = LoraSpec(names=("policy",), rank=rank, alpha=alpha, decode="merge")
  adapters = _random_lora_b(init_adapters(cfg, spec, jax.random.key(1)), jax.random.key(2))
  full = attach(backbone, adapters, spec, "policy")
  models = {"bare": Qwen(cfg), "merge": Qwen(cfg, lora=spec),
            "unmerged": Qwen(cfg, lora=dataclasses.replace(spec, decode="unmerged"))}
  weights = {"bare": backbone, "merge": full, "unmerged": full}
  cache_len = bucket(prompt_len + new)
  no_stops = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
              jnp.int32(cache_len))
  greedy = SamplingParams(greedy=True)

  def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out

  def prefill(model, params):
    # `extend` runs the checkpoint layout: the LoRA model with its adapter unmerged (the decode
    # mode does not enter it), so one LoRA prefill serves both decode modes.
    state = init_state(cfg, b, cache_len, jax.random.key(0))
    state = extend(model, params, state, jnp.asarray(ids), jnp.full((b,), prompt_len, jnp.int32),
                   jnp.full((b,), -1, jnp.int32))
    return jax.block_until_ready(state)

  def layout(name):
    return jax.block_until_ready(decode_layout(models[name], weights[name]))

  def decode(decoder, state):
    state, gen = generate(*decoder, state, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32),
                          no_stops, greedy, new)
    return jax.block_until_ready((state, gen))

  def merge_only():
    return jax.block_until_ready(merge_selected(full, spec.scale))

  def copy(state):
    return jax.block_until_ready(jax.tree.map(jnp.copy, state))

  # Warm-up: every program compiled once; the greedy tokens of each variant kept for the checks.
  counter, start = CompileCounter(), time.perf_counter()
  states = {"bare": prefill(models["bare"], backbone), "lora": prefill(models["merge"], full)}
  merge_only()
  outputs = {}
  for name in models:
    state = copy(states["bare" if name == "bare" else "lora"])
    decoder = layout(name)
    final, gen = decode(decoder, state)
    del decoder
    outputs[name] = (np.asarray(gen.new_tokens), np.asarray(final.next_logits))
  warm_s, compiles_warmup = time.perf_counter() - start, counter.count
  tokens = {k: v[0] for k, v in outputs.items()}
  first_agree = bool((tokens["merge"][:, 0] == tokens["unmerged"][:, 0]).all())
  if not first_agree:
    raise AssertionError("merged and unmerged LoRA decode disagree on the first greedy token: "
                         f"{tokens['merge'][:, 0]} vs {tokens['unmerged'][:, 0]}")

  counter = CompileCounter()
  names, rounds = list(models), []
  for i in range(FLAGS.repeats):
    times = {}
    times["bare_prefill_s"], states["bare"] = timed(prefill, models["bare"], backbone)
    times["lora_prefill_s"], states["lora"] = timed(prefill, models["merge"], full)
    times["merge_only_s"], _ = timed(merge_only)
    for name in names[i % 3:] + names[:i % 3]:  # the order rotates between rounds
      state = states["bare"] if name == "bare" else copy(states["lora"])
      times[f"{name}_layout_s"], decoder = timed(layout, name)
      times[f"{name}_decode_s"], _ = timed(decode, decoder, state)
      del decoder, state
    rounds.append(times)
  med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}

  def call_s(r, name):  # one generate call from checkpoint-layout weights, layout included
    return r[f"{name}_layout_s"] + r[f"{name}_decode_s"]

  def ratio(name, per_call):
    t = (lambda r, n: call_s(r, n)) if per_call else (lambda r, n: r[f"{n}_decode_s"])
    per_round = sorted(t(r, "bare") / t(r, name) for r in rounds)
    value = statistics.median(t(r, "bare") for r in rounds) / statistics.median(
        t(r, name) for r in rounds)
    return round(value, 3), [round(per_round[0], 3), round(per_round[-1], 3)]

  result = {"bench": "decode_lora", "preset": FLAGS.preset, "batch": b, "prompt": prompt_len,
            "new_tokens": new, "dtype": FLAGS.dtype, "lora_rank": rank, "lora_alpha": alpha,
            "targets": list(spec.targets), "rounds": FLAGS.repeats}
  for name in names:
    r, rng_ = ratio(name, True)
    rl, rl_range = ratio(name, False)
    if name != "bare":
      result.update({f"ratio_{name}": r, f"ratio_{name}_range": rng_,
                     f"ratio_{name}_loop": rl, f"ratio_{name}_loop_range": rl_range})
    result.update({
        f"{name}_tok_s": round(b * new / statistics.median(call_s(r, name) for r in rounds), 1),
        f"{name}_loop_tok_s": round(b * new / med[f"{name}_decode_s"], 1),
        f"{name}_step_ms": round(1000 * med[f"{name}_decode_s"] / new, 1),
        f"{name}_layout_s": round(med[f"{name}_layout_s"], 3)})
  result.update(
      merge_s=round(med["merge_only_s"], 3),
      bare_prefill_s=round(med["bare_prefill_s"], 3),
      lora_prefill_s=round(med["lora_prefill_s"], 3),
      prefill_ratio=round(med["bare_prefill_s"] / med["lora_prefill_s"], 3),
      greedy_merge_vs_unmerged=float((tokens["merge"] == tokens["unmerged"]).mean()),
      greedy_lora_vs_bare=float((tokens["merge"] == tokens["bare"]).mean()),
      final_logits_max_abs_diff_merge_vs_unmerged=float(
          np.abs(outputs["merge"][1] - outputs["unmerged"][1]).max()),
      compiles=counter.count, compiles_warmup=compiles_warmup, warmup_s=round(warm_s, 1),
      device=device_name())
  return result


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


def bench_rollout() -> dict:
  """A 4-turn search rollout against local BM25 vs one single-turn generation of the same number
  of sampled tokens: what multi-turn costs on top of generating (search, cache extension, host
  round trips). The policy is a scripted Qwen model (agentjax/models/qwen/scripted.py) of tiny
  size, since a random tiny model never emits a well-formed search: each turn it thinks for
  `think_tokens` tokens, then searches; the last turn answers."""
  import tempfile

  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.compiles import CompileCounter
  from agentjax.models.qwen.scripted import chain, transition_params
  from agentjax.retrieval import make_backend
  from agentjax.sampling import SamplingParams, StopTable, bucket, extend, generate, init_state
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests import agent_fixtures as af
  from tests import retrieval_fixtures

  turns, think_tokens, questions = 4, FLAGS.think_tokens, 4
  root = tempfile.mkdtemp(prefix="agentjax-bench-")
  tok = af.scripted_tokenizer(os.path.join(root, "tok"))
  backend = make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(
      os.path.join(root, "corpus.jsonl")), index_dir=os.path.join(root, "index"))
  agent = af.ScriptedAgent(tok)
  cfg = agent.cfg
  # Thinking: distinct plain-text tokens (no tag characters), then search; turn 4 answers.
  reserved = set(agent.ids(af.THINK + af.SEARCH + af.ANSWER)) | agent.turn_starts()
  words = [i for i in range(len(tok)) if i not in reserved and tok.eos_token_id != i
           and not set(tok.decode([i])) & set("<>/")][:think_tokens]
  think, search, answer = agent.ids(["<think>"]), agent.ids(af.SEARCH), agent.ids(af.ANSWER)
  close = agent.ids(["</think>"])
  succ = chain(think + words + close + search)
  succ.update(chain(answer))
  for last in agent.turn_starts():
    succ[last] = think[:1]
  params_search = transition_params(cfg, succ, fallback=tok.eos_token_id)
  succ_answer = dict(succ)
  succ_answer[close[0]] = answer[:1]
  params_answer = transition_params(cfg, succ_answer, fallback=tok.eos_token_id)
  policies = {"search": params_search, "answer": params_answer}
  config = RolloutConfig(group_size=4, max_turns=turns, max_new_tokens=128, max_obs_tokens=128,
                         max_total_tokens=2048, topk=3, sampling=SamplingParams(greedy=True))
  engine = RolloutEngine(cfg, tok, backend, config)
  names = [f"Who founded {n}?" for n in retrieval_fixtures.NAMES[:questions]]
  pick = lambda t: "answer" if t == turns - 1 else "search"  # noqa: E731

  def multi():
    return engine.run(policies, names, jax.random.key(0), policy_for_turn=pick)

  batch, metrics = multi()  # warm-up: compiles
  counter = CompileCounter()
  multi_s = median_seconds(multi, FLAGS.repeats)  # wall time of the whole rollout
  batch, metrics = multi()
  compiles = counter.count
  assert batch.answered.all() and (batch.num_turns == turns).all(), metrics
  sampled = int(np.asarray(batch.loss_mask).sum(1)[0])
  rows = len(names) * config.group_size

  # Single turn: the same prompts, the same number of sampled tokens, no stops, one generate call.
  model = engine.model
  prompt = engine.prompt_ids(names[0])
  no_stop = (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32),
             jnp.int32(engine.cache_len))

  def single():
    state = init_state(cfg, rows, engine.cache_len, jax.random.key(0))
    block = np.zeros((rows, bucket(len(prompt))), np.int32)
    block[:, :len(prompt)] = prompt
    state = extend(model, params_search, state, jnp.asarray(block),
                   jnp.full((rows,), len(prompt), jnp.int32), jnp.full((rows,), -1, jnp.int32))
    _, gen = generate(model, params_search, state, jnp.ones((rows,), bool),
                      jnp.zeros((rows,), jnp.int32), no_stop, config.sampling, sampled)
    return np.asarray(gen.num_new)

  single()
  single_s = median_seconds(single, FLAGS.repeats)
  return {"bench": "rollout", "multi_over_single": round(multi_s / single_s, 3),
          "multi_s": round(multi_s, 3), "single_s": round(single_s, 3),
          "generate_s": round(metrics["generate_s"], 3), "search_s": round(metrics["search_s"], 3),
          "extend_s": round(metrics["extend_s"], 3), "turns": turns, "rows": rows,
          "sampled_tokens_per_row": sampled, "compiles_after_warmup": compiles,
          "device": device_name()}


# The rollout metrics rollout_mix reports (per rollout, averaged over the timed ones).
WORK = ("sampled_tokens", "decode_steps", "decode_row_steps", "decode_useful_row_steps",
        "prefill_tokens", "extend_tokens", "search_s", "search_wait_s", "search_queries",
        "search_calls", "turns_mean", "answered", "format_errors")


def bench_rollout_mix() -> dict:
  """The rollout engines on a realistic mix: the turn-synchronous engine (rollout.engine "turns")
  vs the slot engine ("slots": shared prompt prefill, in-flight slot refill, search overlapped
  with decoding), the same questions in the same run: after a warm-up rollout (key 0), both
  engines roll out with keys 1..--repeats; tokens/s and the useful row share are totals over
  those rollouts, the other counts per-rollout means.

  The policy (tests/agent_fixtures.py mix_successors) samples at temperature 1 turns of 12 to
  max_new_tokens tokens (7 fixed thinking words, a geometric number of optional ones, mean 32,
  then a search or an answer, 1/2 each; a turn cut off at max_new_tokens is an invalid action and
  the trajectory goes on), so trajectories take 1 to max_turns = 6 turns. The retriever is the
  local BM25 backend behind --search_latency_ms per call. --mix_model=<preset> runs the same
  script at a real model's shape (compute) instead of the tiny scripted one.
  """
  import tempfile

  import jax
  import numpy as np

  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.compiles import CompileCounter
  from agentjax.models.qwen import QwenConfig
  from agentjax.retrieval import make_backend
  from agentjax.sampling import SamplingParams
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests import agent_fixtures as af
  from tests import retrieval_fixtures

  questions, group = FLAGS.questions or 6, FLAGS.group_size or 8
  root = tempfile.mkdtemp(prefix="agentjax-bench-")
  tok = af.scripted_tokenizer(os.path.join(root, "tok"))
  backend = retrieval_fixtures.SlowBackend(make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(
      os.path.join(root, "corpus.jsonl")), index_dir=os.path.join(root, "index")),
      FLAGS.search_latency_ms / 1000)
  agent = af.ScriptedAgent(tok)
  shape = None
  if FLAGS.mix_model != "scripted":
    shape = QwenConfig.preset(FLAGS.mix_model, tie_word_embeddings=False, dtype=FLAGS.dtype,
                              param_dtype=FLAGS.dtype)
  cfg, params = af.mix_params(agent, shape)
  names = [f"Who founded {retrieval_fixtures.NAMES[i % len(retrieval_fixtures.NAMES)]}?"
           for i in range(questions)]
  base = dict(group_size=group, max_turns=6, max_new_tokens=64, max_obs_tokens=128,
              max_total_tokens=2048, topk=3, sampling=SamplingParams(temperature=1.0))
  engines = {"turns": RolloutConfig(engine="turns", **base),
             "slots": RolloutConfig(engine="slots", slots=FLAGS.slots, lanes=2,
                                    refill_fraction=0.125, **base)}
  report = {}
  for name, config in engines.items():
    engine = RolloutEngine(cfg, tok, backend, config)
    start = time.perf_counter()
    engine.run(params, names, jax.random.key(0))  # warm-up: compiles
    warmup_s = time.perf_counter() - start
    # Timed rollouts with keys 1..repeats, the same for both engines: each key samples another
    # mix (and the slot engine another schedule: lane sizes, feed row counts), so the compiles
    # counted here are those a training run keeps paying after its first step.
    counter = CompileCounter()
    totals = collections.Counter()
    for key in range(1, FLAGS.repeats + 1):
      start = time.perf_counter()
      batch, m = engine.run(params, names, jax.random.key(key))
      totals["seconds"] += time.perf_counter() - start
      sampled = float(np.asarray(batch.loss_mask).sum())
      assert sampled == m["sampled_tokens"], (sampled, m["sampled_tokens"])
      totals.update({k: m[k] for k in WORK})
    runs = FLAGS.repeats
    report[name] = {
        "tokens_per_s": round(totals["sampled_tokens"] / totals["seconds"], 1),
        "seconds": round(totals["seconds"] / runs, 3), "warmup_s": round(warmup_s, 2),
        "sampled_tokens": round(totals["sampled_tokens"] / runs, 1),
        "useful_row_share": round(totals["decode_useful_row_steps"]
                                  / totals["decode_row_steps"], 3),
        **{k: round(totals[k] / runs, 3) for k in WORK if k != "sampled_tokens"},
        "compiles_after_warmup": counter.count}
    print(json.dumps({"engine": name, **report[name]}), flush=True)
  new, old = report["slots"], report["turns"]
  return {"bench": "rollout_mix", "ratio": round(new["tokens_per_s"] / old["tokens_per_s"], 3),
          "useful_row_share": new["useful_row_share"],
          "useful_row_share_before": old["useful_row_share"],
          "prefill_tokens": new["prefill_tokens"], "prefill_tokens_before": old["prefill_tokens"],
          "search_wait_s": new["search_wait_s"], "search_wait_s_before": old["search_wait_s"],
          "model": FLAGS.mix_model, "dtype": FLAGS.dtype, "questions": questions,
          "group_size": group, "slots": FLAGS.slots,
          "search_latency_ms": FLAGS.search_latency_ms, "engines": report,
          "device": device_name()}


def _packing_figures(batches: list, pack_tokens: int, max_turns: int, multiple: int = 128) -> dict:
  """Padded vs packed computed tokens over `batches` of (lengths [B], num_turns [B], probe_valid
  [B, K, A] from info_gain.build_probes).

  Padded: each batch as train/rl.trim leaves it (every row as wide as the longest trajectory,
  rounded up to `multiple`); packed: train/packing.plan_packing into rows of pack_tokens. The
  same for IGPO's scoring layout (each row followed by max_turns probes of A slots each): padded
  B x (S + T*K*A), packed (probes of turns past num_turns dropped) rows of pack_tokens + T*K*A."""
  import numpy as np

  from agentjax.rl.info_gain import probe_keep
  from agentjax.train import packing

  real = padded = packed = igpo_real = igpo_padded = igpo_packed = rows = traj = 0
  for lengths, turns, probe_valid in batches:
    lengths = np.asarray(lengths)
    width = max(multiple, -(-int(lengths.max()) // multiple) * multiple)
    valid = np.arange(width)[None] < lengths[:, None]
    plan = packing.plan_packing(valid, pack_tokens)
    real, padded, packed = real + plan.real_tokens, padded + valid.size, packed + plan.source.size
    rows, traj = rows + plan.shape[0], traj + len(lengths)
    keep = probe_keep(valid, np.asarray(turns), max_turns, probe_valid)
    plan = packing.plan_packing(keep, pack_tokens + keep.shape[1] - width)
    igpo_real += plan.real_tokens
    igpo_padded, igpo_packed = igpo_padded + keep.size, igpo_packed + plan.source.size
  all_lengths = np.concatenate([np.asarray(b[0]) for b in batches])
  return {"padded_efficiency": round(real / padded, 3),
          "packing_efficiency": round(real / packed, 3),
          "ratio": round(padded / packed, 3),
          "igpo_padded_efficiency": round(igpo_real / igpo_padded, 3),
          "igpo_packing_efficiency": round(igpo_real / igpo_packed, 3),
          "igpo_ratio": round(igpo_padded / igpo_packed, 3),
          "pack_tokens": pack_tokens, "batches": len(batches),
          "trajectories_per_batch": traj // len(batches),
          "rows_per_batch": round(rows / len(batches), 2),
          "length_p10_p50_p90_max": [int(x) for x in np.percentile(all_lengths, [10, 50, 90, 100])],
          "mean_turns": round(float(np.mean(np.concatenate([b[1] for b in batches]))), 2),
          "probe_width": int(batches[0][2].shape[-1])}


def _packing_report(name: str, batches: list, budget: int, max_turns: int) -> dict:
  """_packing_figures at pack_tokens = the rollout budget, and the packed figures at twice it
  (more trajectories share a row: less left over at each row's end)."""
  out = _packing_figures(batches, budget, max_turns)
  wide = _packing_figures(batches, 2 * budget, max_turns)
  out.update({f"{k}_2x": wide[k] for k in ("packing_efficiency", "ratio",
                                           "igpo_packing_efficiency", "igpo_ratio")})
  print(json.dumps({"distribution": name, **out}), flush=True)
  return out


def bench_packing() -> dict:
  """packing_efficiency (real tokens / computed tokens) of padded vs packed batches (issue 30 §3)
  on two length distributions; compute-free apart from the rollouts that produce the lengths.

  demo: the demo's SFT demonstrations (SynthWorld, its BPE tokenizer, retrieval.topk 1, laid out
  as rollouts: sft.tokenize_demo), batches of prompts_per_step x group_size = 64 drawn at random,
  packed into rows of rollout.max_total_tokens = 512 (the demo budget). The trained demo policy
  imitates these; an untrained one's rollouts differ.
  rollout_mix: --repeats rollouts of bench rollout_mix's scripted mix (turns engine, --questions x
  --group_size trajectories, turns of 12..64 tokens, 1..6 turns, observations up to 128 tokens),
  packed into rows of its budget 2048. Each also at twice the budget (the *_2x figures). IGPO's
  scoring layout (rl/info_gain.py probe_keep, one alias) too: igpo_*. Last line one JSON object
  with {demo,rollout_mix}_{padded_efficiency,packing_efficiency,ratio} on top.
  """
  import tempfile

  import jax
  import numpy as np

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import base as base_config
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.models.tokenizer import load_tokenizer
  from agentjax.retrieval import make_backend
  from agentjax.rl.info_gain import build_probes
  from agentjax.sampling import SamplingParams
  from agentjax.train.sft import tokenize_demos
  from tests import agent_fixtures as af
  from tests import retrieval_fixtures

  demo_cfg = base_config.get_config("demo")
  rng = np.random.default_rng(0)
  report = {"bench": "packing"}
  with tempfile.TemporaryDirectory() as tmp:
    world = _demo_world(tmp, demo_cfg.retrieval.topk)
    tok = load_tokenizer(os.path.join(world, "tokenizer"))
    with open(os.path.join(world, "demos.jsonl")) as f:
      demos = [json.loads(line) for line in f]
    lengths = np.array([len(ids) for ids, _ in tokenize_demos(tok, demos)])
    turns = np.array([sum(s["role"] == "assistant" for s in d["segments"]) for d in demos])
    budget = demo_cfg.rollout.max_total_tokens
    lengths = np.minimum(lengths, budget)
    encode = lambda text, t=tok: t.encode(text, add_special_tokens=False)  # noqa: E731
    probe_valid = build_probes(encode, [d["golden_answers"] for d in demos]).valid
    size = demo_cfg.rl.prompts_per_step * demo_cfg.rollout.group_size
    batches = [(lengths[i], turns[i], probe_valid[i]) for i in
               (rng.choice(len(lengths), size, replace=False) for _ in range(50))]
    report["demo"] = _packing_report("demo", batches, budget, demo_cfg.rollout.max_turns)

    questions, group = FLAGS.questions or 6, FLAGS.group_size or 8
    stok = af.scripted_tokenizer(os.path.join(tmp, "tok"))
    backend = make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(
        os.path.join(tmp, "corpus.jsonl")), index_dir=os.path.join(tmp, "index"))
    cfg, params = af.mix_params(af.ScriptedAgent(stok))
    names = [f"Who founded {retrieval_fixtures.NAMES[i % len(retrieval_fixtures.NAMES)]}?"
             for i in range(questions)]
    config = RolloutConfig(engine="turns", group_size=group, max_turns=6, max_new_tokens=64,
                           max_obs_tokens=128, max_total_tokens=2048, topk=3,
                           sampling=SamplingParams(temperature=1.0))
    engine = RolloutEngine(cfg, stok, backend, config)
    encode = lambda text: stok.encode(text, add_special_tokens=False)  # noqa: E731
    golds = [retrieval_fixtures.FOUNDERS[i % len(retrieval_fixtures.FOUNDERS)]
             for i in range(questions)]
    probe_valid = build_probes(encode, golds).valid  # [questions, 1, A]
    batches = []
    for key in range(FLAGS.repeats):
      batch, _ = engine.run(params, names, jax.random.key(key))
      batches.append((np.asarray(batch.valid).sum(1), np.asarray(batch.num_turns),
                      probe_valid[np.asarray(batch.group_ids)]))
    report["rollout_mix"] = _packing_report("rollout_mix", batches, config.max_total_tokens,
                                            config.max_turns)
  for name in ("demo", "rollout_mix"):
    report.update({f"{name}_{k}": report[name][k]
                   for k in ("padded_efficiency", "packing_efficiency", "ratio")})
  return report


def bench_info_gain() -> dict:
  """IGPO's ground-truth probes: ONE packed pass vs the official one-pass-per-turn, and vs the
  plain forward that training runs anyway (trajectory log-probs only).

  Shapes: the tiny preset, and the qwen2.5-0.5b widths (hidden 896, 14/2 heads, vocab 151936)
  with 2 layers instead of 24 so that the whole bench fits in a few minutes on 2 CPU cores; the
  LM head (the same in both) is then a larger share of the cost than at full depth.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models.logprobs import sequence_logprobs
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.rl.info_gain import build_probes, score_naive, score_packed

  shapes = {"tiny": QwenConfig.preset("tiny"),
            "qwen2.5-0.5b-width-2-layers": QwenConfig.preset("qwen2.5-0.5b", num_layers=2)}
  grid = {"tiny": [(1024, 2), (1024, 5), (1024, 10), (2048, 2), (2048, 5), (2048, 10)],
          "qwen2.5-0.5b-width-2-layers": [(1024, 2), (1024, 5), (1024, 10), (2048, 10)]}
  rng = np.random.RandomState(0)
  # Word-level stand-in tokenizer: the probe then has ~20 tokens, as with Qwen's BPE (only the
  # ids' count matters here, not their values).
  encode = lambda text: [5 + sum(map(ord, w)) % 97 for w in re.findall(r"\w+|[^\w\s]", text)]  # noqa: E731
  rows, headline = [], None
  for name, cfg in shapes.items():
    params = init_params(cfg, jax.random.key(0))
    model = Qwen(cfg)

    plain = jax.jit(sequence_logprobs, static_argnums=0)

    for length, turns in grid[name]:
      b = FLAGS.batch or 1
      tokens = rng.randint(0, cfg.vocab_size, (b, length)).astype(np.int32)
      valid = np.ones((b, length), bool)
      prompt = length // 8  # the prompt, then `turns` turns of equal length up to the end
      turn_ends = np.tile(np.linspace(prompt, length, turns + 1).astype(np.int32), (b, 1))
      num_turns = np.full((b,), turns, np.int32)
      probes = build_probes(encode, [["Orsk"]] * b)
      args = [jnp.asarray(x) for x in (tokens, valid, turn_ends, num_turns, probes.tokens,
                                       probes.score, probes.valid, probes.alias_valid)]
      packed = lambda: jax.block_until_ready(score_packed(model, params, *args))  # noqa: E731
      forward = lambda: jax.block_until_ready(plain(model, params, args[0], args[1])[0])  # noqa: E731
      naive = lambda: score_naive(model, params, tokens, turn_ends, num_turns, probes)  # noqa: E731
      out, ref = packed(), naive()  # warm-up (compiles) and correctness
      forward()
      repeats = FLAGS.repeats if name == "tiny" else 1
      t_packed, t_forward = median_seconds(packed, repeats), median_seconds(forward, repeats)
      t_naive = median_seconds(naive, repeats)
      row = {"shape": name, "length": length, "turns": turns, "batch": b,
             "probe_tokens": int(probes.tokens.shape[-1]),
             "packed_s": round(t_packed, 3), "naive_s": round(t_naive, 3),
             "forward_s": round(t_forward, 3),
             "packed_over_forward": round(t_packed / t_forward, 3),
             "naive_over_packed": round(t_naive / t_packed, 2),
             "max_abs_diff": float(np.abs(np.asarray(out.values) - ref).max())}
      print(json.dumps(row), flush=True)
      rows.append(row)
      if name != "tiny" and turns == 10 and length == 1024:
        headline = row
  return {"bench": "info_gain", "packed_over_forward": headline["packed_over_forward"],
          "naive_over_packed": headline["naive_over_packed"],
          "max_abs_diff": max(r["max_abs_diff"] for r in rows), "headline": headline,
          "device": device_name()}


def bench_attention() -> dict:
  """Attention memory and time: blockwise (flash-style, agentjax/models/attention.py) vs xla
  (the materialized [B, N, Q*G, K] scores), forward + backward.

  The bare attention function at 8 query heads over 4 kv heads (GQA 2), head_dim 64, batch 1,
  float32, a causal mask, block 512 (QwenConfig.attention_block's default): temp memory from
  `jax.jit(jax.grad(f)).lower(...).compile().memory_analysis()` at L = --length (default 2048)
  and 2L, and the issue's probe, a 2-layer 8-head model (hidden 256, remat full, batch 1) on the
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


def bench_rewards() -> dict:
  """Host-side scoring of one step: outcome_rewards (F1, 5000 rows of 2 aliases) against a
  plain-Python character-loop F1 (the SQuAD script's), and the protocol's format rule over 2000
  five-turn trajectories (microseconds per trajectory). These were timing asserts in the tests."""
  import string
  from collections import Counter

  import numpy as np

  from agentjax.agent.protocol import SEARCH_R1
  from agentjax.rl.rewards import outcome_rewards

  rng = np.random.default_rng(0)
  words = ["the", "a", "Cat", "dog", "Paris", "U.S.", "it's", "New-York", "1,000", "naïve"]
  answer = lambda: " ".join(rng.choice(words, rng.integers(1, 6)))  # noqa: E731
  preds = [answer() for _ in range(5000)]
  golds = [[answer(), answer()] for _ in preds]

  def ref_f1(pred, gold):
    norm = lambda s: re.sub(r"\b(a|an|the)\b", " ", "".join(  # noqa: E731
        ch for ch in s.lower() if ch not in string.punctuation)).split()
    p, g = norm(pred), norm(gold)
    same = sum((Counter(p) & Counter(g)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))

  ours = lambda: outcome_rewards(preds, golds)  # noqa: E731
  reference = lambda: [max(ref_f1(p, g) for g in gs) for p, gs in zip(preds, golds)]  # noqa: E731
  max_abs_diff = float(np.abs(ours() - np.asarray(reference(), np.float32)).max())
  t_ours, t_ref = median_seconds(ours, FLAGS.repeats), median_seconds(reference, FLAGS.repeats)
  turn = "<think>" + "reasoning " * 50 + "</think>\n<search> capital of Orsk </search>"
  trajectories = [[turn] * 4 + ["<think>so</think>\n<answer> Paris </answer>"]] * 2000
  check = lambda: [SEARCH_R1.format_error(t) for t in trajectories]  # noqa: E731
  if any(check()):
    raise AssertionError("bench trajectories must be well-formed")
  t_format = median_seconds(check, FLAGS.repeats)
  return {"bench": "rewards", "reference_over_ours": round(t_ref / t_ours, 2),
          "rewards_s": round(t_ours, 4), "reference_s": round(t_ref, 4),
          "max_abs_diff": max_abs_diff, "rows": len(preds),
          "format_us_per_trajectory": round(1e6 * t_format / len(trajectories), 2),
          "device": "host (Python)"}


def bench_synthworld() -> dict:
  """SynthWorld.generate + corpus() at the demo's size (2000 entities, 5000 questions) against a
  quarter-size world in the same run: `scaling` = t(full) / (4 t(quarter)) is 1 when generation
  is linear in the size, 4 when quadratic. This was a `< 5 s` assert in tests/test_data.py."""
  from agentjax.data import SynthWorld

  times = {1: [], 4: []}  # by the divisor of the demo's size
  for _ in range(max(FLAGS.repeats, 11)):  # runs of 20-100 ms: more of them, sizes interleaved
    for n, runs in times.items():
      start = time.perf_counter()
      SynthWorld.generate(seed=1, n_entities=2000 // n, n_train=4000 // n, n_dev=500 // n,
                          n_test=500 // n).corpus()
      runs.append(time.perf_counter() - start)
  t_full, t_quarter = statistics.median(times[1]), statistics.median(times[4])
  return {"bench": "synthworld", "scaling": round(t_full / (4 * t_quarter), 3),
          "full_s": round(t_full, 4), "quarter_s": round(t_quarter, 4), "device": "host (Python)"}


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

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
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


def _tree_bytes(tree) -> int:
  import jax

  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _ppo_minibatch(vocab: int, b: int, length: int) -> dict:
  """A PPO minibatch of random tokens [b, length]: every slot valid, the last 3/4 of each row
  the policy's (loss_mask), old and reference log-probs near a uniform policy's, one advantage
  per row (the values change no shape or cost; they keep the loss and its gradient finite)."""
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.RandomState(0)
  mask = np.broadcast_to(np.arange(length) >= length // 4, (b, length))
  logp = lambda: (-np.log(vocab) + 0.1 * rng.randn(b, length)) * mask  # noqa: E731
  return {"tokens": jnp.asarray(rng.randint(0, vocab, (b, length)), jnp.int32),
          "valid": jnp.ones((b, length), bool), "loss_mask": jnp.asarray(mask),
          "old_logp": jnp.asarray(logp(), jnp.float32),
          "ref_logp": jnp.asarray(logp(), jnp.float32),
          "advantages": jnp.asarray(rng.randn(b, 1) * mask, jnp.float32)}


def _train_step_memory(compiled, found) -> dict:
  """Memory fields of bench_train_step's compiled steps (see its docstring), in GB."""
  out = {}
  memory = {}
  for name, (exe, (_, args, _)) in compiled.items():
    m = exe.memory_analysis()
    fields = {f: int(getattr(m, f"{f}_size_in_bytes")) for f in
              ("argument", "output", "alias", "temp")}
    fields["peak"] = fields["argument"] + fields["output"] - fields["alias"] + fields["temp"]
    fields["sum"] = fields["argument"] + fields["output"] + fields["temp"]
    memory[name] = fields
    state = _tree_bytes(args[:2])
    out[f"{name}_memory_gb"] = {k: round(v / 1e9, 3) for k, v in fields.items()}
    out[f"{name}_train_state_gb"] = round(state / 1e9, 3)
  backbone_gb = _tree_bytes(found["full"][1][0]) / 1e9
  out.update(
      peak_ratio=round(memory["lora"]["peak"] / memory["full"]["peak"], 3),
      sum_ratio=round(memory["lora"]["sum"] / memory["full"]["sum"], 3),
      train_state_ratio=round(out["lora_train_state_gb"] / out["full_train_state_gb"], 4),
      backbone_gb=round(backbone_gb, 3),
      # Held for the run (KL on, rl.kl_coef > 0): full FT keeps params, Adam's two moments and a
      # frozen reference copy; LoRA the backbone (also the reference) and the adapters' state.
      resident_full_gb=round(out["full_train_state_gb"] + backbone_gb, 3),
      resident_lora_gb=round(out["lora_train_state_gb"] + backbone_gb, 3))
  return out


def bench_train_step() -> dict:
  """One PPO-clip minibatch update (train/rl.make_policy_update) with LoRA adapters on a frozen
  backbone against full fine-tuning, same model shape, minibatch and loss.

  Loss and optimizer as train/step.py builds them from configs/base.py's qwen2.5-3b preset (the
  IGPO paper's: PPO clip 0.2/0.2, low_var_kl 0.001, token-mean, entropy computed, AdamW with
  global-norm clip 1.0, weight decay 0.01, b2 0.999). Full: make_optimizer over every param.
  LoRA: one adapter "policy" of rank --lora_rank (alpha --lora_alpha, default the rank) on all 7
  projections, make_adapter_optimizer; gradients and optimizer state for the adapters only.

  Memory: `jax.jit(step).lower(...).compile().memory_analysis()` of each step at --preset (from
  abstract shapes, nothing executed): argument, output, alias (outputs written into donated
  arguments: params and optimizer state) and temp bytes. `peak_bytes` = argument + output -
  alias + temp (a donated buffer counted once); `sum_bytes` = argument + output + temp. Train
  state = params + optimizer state (LoRA: adapters + their state; the frozen backbone apart).

  Time: median step time over --repeats rounds (full, then LoRA, each round; one variant's state
  resident at a time), 2 timed steps per phase after one warm-up step per variant, compiles
  excluded. At --time_preset if given (memory stays at --preset); the steps run only if a step's
  peak (with a 15% margin) fits the machine's available memory. --time_layers=4,8 times the
  preset's shape at those depths instead and extrapolates each variant's step time linearly to
  the preset's depth (`extrapolated_*`: an estimate; the measured rows are in `timing`), for a
  machine where full fine-tuning at the full depth does not fit. --nomemory skips the analysis
  at --preset (its compile takes minutes on 2 cores).
  """
  import concurrent.futures

  import jax
  import numpy as np
  import psutil

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import base as base_config
  from agentjax.models.lora import LoraSpec
  from agentjax.models.qwen import (Qwen, QwenConfig, abstract_params, adapter_abstract,
                                    init_adapters, init_params)
  from agentjax.train.optim import make_adapter_optimizer, make_optimizer
  from agentjax.train.rl import make_policy_update, policy_loss_config

  config = base_config.get_config("qwen2.5-3b")
  o = config.optimizer
  loss = policy_loss_config(config)
  total = 1000
  opt_args = (o.warmup_steps, total, o.weight_decay, o.clip_norm or None, o.final_lr_ratio, o.b2)
  rank = FLAGS.lora_rank or 32
  alpha = FLAGS.lora_alpha or float(rank)
  spec = LoraSpec(names=("policy",), rank=rank, alpha=alpha)
  b, length = FLAGS.batch or 4, FLAGS.length or 256
  full_opt = make_optimizer(o.lr, *opt_args)
  lora_opt = make_adapter_optimizer({"policy": o.lr}, *opt_args)

  def variants(cfg):
    """name -> (update fn, abstract args, a function making the concrete args)."""
    params = abstract_params(cfg)
    adapters = {"policy": adapter_abstract(cfg, spec)}
    mb = jax.eval_shape(lambda: _ppo_minibatch(cfg.vocab_size, b, length))

    def full_args():
      p = init_params(cfg, jax.random.key(0))
      return (p, full_opt.init(p))

    def lora_args():
      a = init_adapters(cfg, spec, jax.random.key(1))
      return (a, lora_opt.init(a), init_params(cfg, jax.random.key(0)))

    return {
        "full": (make_policy_update(Qwen(cfg), full_opt, loss),
                 (params, jax.eval_shape(full_opt.init, params), mb), full_args),
        "lora": (make_policy_update(Qwen(cfg, lora=spec), lora_opt, loss),
                 (adapters, jax.eval_shape(lora_opt.init, adapters), mb, params), lora_args)}

  def compile_all(cfg):
    # The two compiles in parallel threads (XLA compiles outside the GIL; minutes each here).
    found = variants(cfg)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      futures = {k: pool.submit(lambda u=u, a=a: u.lower(*a).compile())
                 for k, (u, a, _) in found.items()}
      return {k: (f.result(), found[k]) for k, f in futures.items()}, found

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  result = {"bench": "train_step", "preset": FLAGS.preset, "dtype": FLAGS.dtype, "batch": b,
            "length": length, "lora_rank": rank, "lora_alpha": alpha,
            "targets": list(spec.targets), "loss": dict(loss.as_kwargs(), name=loss.name)}
  if not FLAGS.memory:
    compiled = None
  else:
    start = time.perf_counter()
    compiled, found = compile_all(cfg)
    result["compile_s"] = round(time.perf_counter() - start, 1)
    result.update(_train_step_memory(compiled, found))
  def peak(exe):
    m = exe.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)

  def time_steps(compiled, tcfg) -> dict:
    need = max(peak(exe) for exe, _ in compiled.values())
    available = psutil.virtual_memory().available
    row = {"layers": tcfg.num_layers, "params": tcfg.num_params(),
           "peak_gb": {k: round(peak(exe) / 1e9, 3) for k, (exe, _) in compiled.items()},
           "temp_gb": {k: round(exe.memory_analysis().temp_size_in_bytes / 1e9, 3)
                       for k, (exe, _) in compiled.items()},
           "available_gb": round(available / 1e9, 1)}
    if need * 1.15 > available:
      return dict(row, timed=False, not_timed=f"a step needs ~{need / 1e9:.1f} GB, "
                  f"{available / 1e9:.1f} GB available: use --time_layers or --time_preset")
    minibatch = _ppo_minibatch(tcfg.vocab_size, b, length)
    times = {k: [] for k in compiled}
    skipped = {k: 0 for k in compiled}
    for r in range(FLAGS.repeats):  # full, then LoRA, each round: one state resident at a time
      for name, (exe, (_, _, make_args)) in compiled.items():
        train, opt_state, *frozen = make_args()
        for i in range(3 if r == 0 else 2):  # round 0: one warm-up step first
          begin = time.perf_counter()
          train, opt_state, metrics = exe(train, opt_state, minibatch, *frozen)
          skip = int(metrics["skipped"])
          if not (r == 0 and i == 0):
            times[name].append(time.perf_counter() - begin)
            skipped[name] += skip
        del train, opt_state, frozen, metrics
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(row, timed=True, full_step_s=round(med["full"], 3),
                lora_step_s=round(med["lora"], 3), step_ratio=round(med["lora"] / med["full"], 3),
                steps_timed=len(times["full"]),
                step_ranges={k: [round(min(v), 2), round(max(v), 2)] for k, v in times.items()},
                skipped_steps=skipped)

  time_preset = FLAGS.time_preset or FLAGS.preset
  rows = []
  for layers in [int(x) for x in FLAGS.time_layers] or [None]:
    tcfg = QwenConfig.preset(time_preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype,
                             **({} if layers is None else {"num_layers": layers}))
    if compiled is None or tcfg != cfg:
      compiled = None  # free the analysed executables before compiling the timed ones
      start = time.perf_counter()
      compiled, _ = compile_all(tcfg)
      cfg, timed_compile_s = tcfg, time.perf_counter() - start
    else:
      timed_compile_s = 0.0
    rows.append(dict(time_steps(compiled, tcfg), compile_s=round(timed_compile_s, 1)))
    print(json.dumps(rows[-1]), flush=True)
  result.update(timed_preset=time_preset, timing=rows)
  timed = [r for r in rows if r["timed"]]
  depth = QwenConfig.preset(time_preset).num_layers
  whole = [r for r in timed if r["layers"] == depth]
  if whole:
    r = whole[0]
    result.update(full_step_s=r["full_step_s"], lora_step_s=r["lora_step_s"],
                  step_ratio=r["step_ratio"],
                  tokens_per_s={k: round(b * length / r[f"{k}_step_s"], 1)
                                for k in ("full", "lora")})
  elif len({r["layers"] for r in timed}) >= 2:
    # Step time linear in the depth (every layer the same work; the embedding, LM head, loss and
    # the optimizer's share of them the fixed part): a least-squares line per variant, read at
    # the preset's depth. An estimate, not a measurement.
    xs = [r["layers"] for r in timed]
    fit = {k: np.polyfit(xs, [r[f"{k}_step_s"] for r in timed], 1) for k in ("full", "lora")}
    est = {k: float(np.polyval(f, depth)) for k, f in fit.items()}
    result.update(extrapolated_to_layers=depth,
                  extrapolated_full_step_s=round(est["full"], 2),
                  extrapolated_lora_step_s=round(est["lora"], 2),
                  extrapolated_step_ratio=round(est["lora"] / est["full"], 3),
                  per_layer_s={k: round(float(f[0]), 3) for k, f in fit.items()},
                  fixed_s={k: round(float(f[1]), 3) for k, f in fit.items()})
  result["device"] = device_name()
  return result


def _demo_world(tmp: str, topk: int) -> str:
  """The SynthWorld folder of `make demo` if it was built, else a fresh one under tmp."""
  from agentjax.data.demo_world import build_demo_world
  from configs import base as base_config

  world = os.path.join(base_config.DEMO_ROOT, "synthworld")
  if not os.path.isfile(os.path.join(world, "tokenizer", "tokenizer.json")):
    world = os.path.join(tmp, "synthworld")
    build_demo_world(world, topk=topk)
  return world


def _demo_judge_requests(world: str, n: int) -> list:
  """Judge requests of n SynthWorld demonstrations (the rounds of correct trajectories, as a
  CW-GRPO step sends them): each assistant segment a round, the observation after it its
  information."""
  from agentjax.agent.protocol import get_protocol
  from agentjax.agent.rollout import TurnRecord
  from agentjax.judge import JudgeRequest

  requests = []
  with open(os.path.join(world, "demos.jsonl")) as f:
    for line in f:
      demo = json.loads(line)
      protocol = get_protocol(demo.get("protocol", "search_r1"))
      segments, turns = demo["segments"], []
      for j, seg in enumerate(segments):
        if seg["role"] == "assistant":
          after = segments[j + 1] if j + 1 < len(segments) else None
          obs = after["text"] if after and after["role"] == "observation" else ""
          turns.append(TurnRecord(seg["text"], protocol.parse(seg["text"]), observation=obs))
      requests.append(JudgeRequest({"question": demo["question"],
                                    "golden_answers": demo["golden_answers"]}, tuple(turns)))
      if len(requests) == n:
        break
  return requests


def bench_judge() -> dict:
  """The local judge (agentjax/judge/local.py) at the demo model's shape (configs/base.py demo:
  the tiny preset, hidden 128, random weights written as a Hugging Face folder with the demo
  tokenizer), on the built-in prompt: every round of --batch correct SynthWorld trajectories
  (default 16, about a CW-GRPO demo step's judged trajectories) judged in one batched judge()
  call vs the same calls made one at a time (judge() per round). Replies are --new_tokens long
  (a random model never emits EOS: every call decodes the full reply in both modes). `ratio` =
  judged rounds per second batched / one at a time. `judge_share_of_demo_step` puts the batched
  time beside the median step_s of a recorded demo run (runs/demo/igpo/metrics.jsonl, the same
  rollout and update; not measured in this run), when that file exists."""
  import tempfile

  import jax

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import base as base_config
  from agentjax.compiles import CompileCounter
  from agentjax.judge import build_judge
  from agentjax.judge.render import build_messages
  from agentjax.models.qwen import QwenConfig, init_params
  from agentjax.models.qwen.checkpoint import save_hf
  from agentjax.models.tokenizer import load_tokenizer

  config = base_config.get_config("demo")
  m = config.model
  trajectories = FLAGS.batch or 16
  with tempfile.TemporaryDirectory() as tmp:
    world = _demo_world(tmp, config.retrieval.topk)
    tokenizer = load_tokenizer(os.path.join(world, "tokenizer"))
    requests = _demo_judge_requests(world, trajectories)
    cfg = QwenConfig.preset(m.preset, vocab_size=-(-len(tokenizer) // 64) * 64,
                            **{k: v for k, v in m.shape.items() if v})
    folder = os.path.join(tmp, "demo-judge")
    save_hf(folder, cfg, init_params(cfg, jax.random.key(0)), tokenizer=tokenizer)
    jc = config.judge
    jc.backend, jc.hf_path, jc.max_new_tokens = "local", folder, FLAGS.new_tokens
    judge = build_judge(jc)

  rounds = sum(len(r.turns) for r in requests)
  calls = [(r, k) for r in requests for k in range(len(r.turns))]

  def batched():
    return judge.judge(requests)

  def single():
    return [judge.judge_calls([call])[0][0] for call in calls]

  warmup = {}
  for name, fn in (("batched", batched), ("single", single)):
    counter, start = CompileCounter(), time.perf_counter()
    fn()
    warmup[name] = (round(time.perf_counter() - start, 1), counter.count)
  prompt_tokens = [len(judge.completer.chat_ids(build_messages(judge.template, r, k)))
                   for r, k in calls]
  t_batched = median_seconds(batched, FLAGS.repeats)
  t_single = median_seconds(single, FLAGS.repeats)
  result = {"bench": "judge", "ratio": round(t_single / t_batched, 2),
            "rounds": rounds, "trajectories": len(requests),
            "rounds_per_s_batched": round(rounds / t_batched, 2),
            "rounds_per_s_single": round(rounds / t_single, 2),
            "batched_s": round(t_batched, 2), "single_s": round(t_single, 2),
            "prompt_tokens_mean": round(statistics.mean(prompt_tokens)),
            "prompt_tokens_max": max(prompt_tokens), "reply_tokens": FLAGS.new_tokens,
            "failed_verdicts": sum(not v.ok for row in batched() for v in row),
            "warmup_s_and_compiles": warmup, "model": {
                "hidden": cfg.hidden_size, "layers": cfg.num_layers, "vocab": cfg.vocab_size},
            "device": device_name()}
  metrics_path = os.path.join(base_config.DEMO_ROOT, "igpo", "metrics.jsonl")
  if os.path.isfile(metrics_path):
    with open(metrics_path) as f:
      steps = [r["step_s"] for r in map(json.loads, f) if "step_s" in r]
    if steps:
      step_s = statistics.median(steps)
      result["demo_step_s_recorded"] = round(step_s, 2)
      result["judge_share_of_demo_step"] = round(t_batched / (step_s + t_batched), 3)
  return result


def _scripted_preset_params(cfg, successors: dict, alpha: float = 30.0, seed: int = 0):
  """Params of cfg (any shape with an untied head) whose greedy next token follows `successors`
  from every token it lists (models/qwen/scripted.py's rule, for hidden < vocab): those tokens get
  orthonormal embeddings (so at most hidden of them), attention and MLP outputs are zeroed so the
  residual stays the embedding, and the head maps each to its successors (logit alpha, else 0).
  The FLOPs are those of a random model of the same shape: only the values are scripted."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models.qwen import init_params

  h, tokens = cfg.hidden_size, sorted(successors)
  if len(tokens) > h or cfg.tie_word_embeddings:
    raise ValueError(f"a scripted {h}-wide model needs an untied head and at most {h} scripted "
                     f"tokens, got {len(tokens)} (lower --think_tokens)")
  params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(seed)))
  q = np.linalg.qr(np.random.default_rng(seed).standard_normal((h, len(tokens))))[0]
  embed = params["embed_tokens"].astype(np.float32)
  embed[tokens] = q.T
  follows = np.zeros((len(tokens), cfg.vocab_size), np.float32)
  for i, x in enumerate(tokens):
    follows[i, successors[x]] = 1.0
  # The final RMSNorm scales a unit vector by sqrt(hidden): divided out so the logits are alpha.
  head = q @ follows * (alpha / np.sqrt(h))
  params["embed_tokens"], params["lm_head"] = embed, head.astype(params["lm_head"].dtype)
  for i in range(cfg.num_layers):
    layer = params[f"layers_{i}"]
    for module, name in (("self_attn", "o_proj"), ("mlp", "down_proj")):
      layer[module][name]["kernel"] = np.zeros_like(layer[module][name]["kernel"])
  return jax.tree.map(jnp.asarray, params)


def bench_coreact() -> dict:
  """Co-ReAct's guided rollout overhead (agentjax/coreact/guided.py GuidedEngine) against plain
  ReAct (agentjax/agent/rollout.py RolloutEngine) on the same 4-turn search rollout: 4 SynthWorld
  dev questions x group 4 against local BM25 over the demo corpus, the demo tokenizer, greedy.

    react        RolloutEngine
    shadow       GuidedEngine "coreact", verify off: from turn 1 each row's rubric suffix is fed,
                 the action generated, the row rewound to before the suffix (sampler.rewind) and
                 the action's ids fed again
    persist      the same with persist=True: the suffix stays, no rewind and no re-feed
    best_of_n    GuidedEngine "best_of_n", N=4, select "self" (every turn)

  The rubric source is a fixed callable (the same parsed 4-item rubric for every row), so no
  generator model runs: the figures are the engine's own cost. The model has the demo's shape
  (configs/base.py demo: the tiny preset, hidden 128, 2 layers, vocab 1024; --preset for another
  shape, the vocab staying the tokenizer's) with an untied head whose values script the turns
  (_scripted_preset_params): each turn thinks --think_tokens tokens then searches an entity's name,
  the last turn answers, and a rubric suffix leads to the same thinking, so every mode takes the
  same actions and the ratios compare equal work. Rounds interleave the modes (the order rotates);
  medians over --repeats rounds after one warm-up run of each mode (compiles reported apart)."""
  import shutil
  import tempfile

  import jax
  import numpy as np

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import base as base_config
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.agent.rollout import encode_text
  from agentjax.compiles import CompileCounter
  from agentjax.coreact.guided import GuidedEngine, GuidedSettings
  from agentjax.coreact.rubric import parse_rubric, rubric_suffix
  from agentjax.models.qwen import QwenConfig
  from agentjax.models.tokenizer import load_tokenizer
  from agentjax.retrieval import make_backend
  from agentjax.sampling import SamplingParams

  config = base_config.get_config("demo")
  m = config.model
  turns, questions_n, n_best = 4, 4, 4
  tmp = tempfile.mkdtemp(prefix="agentjax-bench-coreact-")
  world = _demo_world(tmp, config.retrieval.topk)
  tok = load_tokenizer(os.path.join(world, "tokenizer"))
  backend = make_backend("bm25", corpus_path=os.path.join(world, "corpus.jsonl"),
                         index_dir=os.path.join(tmp, "bm25_index"))
  with open(os.path.join(world, "dev.jsonl")) as f:
    records = [json.loads(next(f)) for _ in range(questions_n)]
  questions = [r["question"] for r in records]
  vocab = -(-len(tok) // 64) * 64
  over = dict(vocab_size=vocab, tie_word_embeddings=False, dtype=FLAGS.dtype,
              param_dtype=FLAGS.dtype)
  if FLAGS["preset"].present:
    cfg = QwenConfig.preset(FLAGS.preset, **over)
  else:
    cfg = QwenConfig.preset(m.preset, **over, **{k: v for k, v in m.shape.items() if v})
  rollout = RolloutConfig(group_size=4, max_turns=turns, max_new_tokens=128, max_obs_tokens=128,
                          max_total_tokens=2048, topk=3, sampling=SamplingParams(greedy=True))
  rubric = parse_rubric("1. [0.4] The action searches\n"
                        "2. [0.3] The query names the question entity\n"
                        "3. [0.3] The query repeats no earlier query\n"
                        "4. [-0.2] The action answers")
  assert rubric.n == 4, rubric

  # The script: <think> words </think> then <search> name </search>, or <answer> name </answer>.
  enc = lambda text: encode_text(tok, text)  # noqa: E731
  one = lambda tag: enc(tag)[0]  # noqa: E731 - the protocol tags are single tokens here
  engine = RolloutEngine(cfg, tok, backend, rollout)
  p = engine.protocol
  starts = {engine.prompt_ids(q)[-1] for q in questions} | {
      enc(t)[-1] for t in (p.observation_suffix, p.invalid_message, rubric_suffix(rubric))}
  names = []
  with open(os.path.join(world, "entities.jsonl")) as f:
    for line in f:
      ids = enc(json.loads(line)["name"])
      if len(set(ids)) == len(ids) and not set(ids) & starts and not any(
          set(ids) & set(n) for n in names):
        names.append(ids)
      if len(names) == 2:
        break
  query, answer = names
  tags = {one(t) for t in ("<think>", "</think>", "<search>", "</search>", "<answer>",
                           "</answer>", "<information>", "</information>")}
  reserved = tags | starts | set(query) | set(answer) | set(engine.eos_ids.tolist())
  words = [i for i in range(len(tok)) if i not in reserved and tok.decode([i]).strip()
           and not set(tok.decode([i])) & set("<>/")][:FLAGS.think_tokens]
  think = [one("<think>")] + words + [one("</think>")]
  succ = {a: [b] for a, b in zip(think[:-1], think[1:])}
  for s in starts:
    succ[s] = [think[0]]
  for action in ([one("<search>")] + query + [one("</search>")],
                 [one("<answer>")] + answer + [one("</answer>")]):
    succ.update({a: [b] for a, b in zip(action[:-1], action[1:])})
  search_succ, answer_succ = dict(succ), dict(succ)
  search_succ[think[-1]] = [one("<search>")]
  answer_succ[think[-1]] = [one("<answer>")]
  policies = {"search": _scripted_preset_params(cfg, search_succ),
              "answer": _scripted_preset_params(cfg, answer_succ)}
  pick = lambda t: "answer" if t == turns - 1 else "search"  # noqa: E731

  source = lambda contexts: [rubric] * len(contexts)  # noqa: E731
  engines = {
      "react": engine,
      "shadow": GuidedEngine(cfg, tok, backend, rollout, GuidedSettings(
          mode="coreact", verify=False), rubric_source=source),
      "persist": GuidedEngine(cfg, tok, backend, rollout, GuidedSettings(
          mode="coreact", verify=False, persist=True), rubric_source=source),
      "best_of_n": GuidedEngine(cfg, tok, backend, rollout, GuidedSettings(
          mode="best_of_n", best_of_n=n_best, best_of_n_select="self")),
  }
  modes = list(engines)

  def run(name):
    return engines[name].run(policies, questions, jax.random.key(0), policy_for_turn=pick)

  compile_s = [0.0]  # tracing, lowering and XLA compilation, summed from jax's own events

  def on_event(event, seconds, **_):
    if event.startswith("/jax/core/compile/") and event.endswith("_duration"):
      compile_s[0] += seconds

  jax.monitoring.register_event_duration_secs_listener(on_event)
  warmup, outputs = {}, {}
  for name in modes:
    counter, start, compile_s[0] = CompileCounter(), time.perf_counter(), 0.0
    outputs[name] = run(name)
    warmup[name] = {"s": round(time.perf_counter() - start, 2), "compiles": counter.count,
                    "compile_s": round(compile_s[0], 2)}
  counter = CompileCounter()
  # Wall time (the convention) and this process's CPU time (all its threads): on a CPU shared
  # with other jobs the second is the steadier measure of the work each mode does.
  rounds, cpu_rounds = [], []
  for i in range(FLAGS.repeats):
    times, cpu = {}, {}
    for name in modes[i % len(modes):] + modes[:i % len(modes)]:  # the order rotates
      start, start_cpu = time.perf_counter(), time.process_time()
      run(name)
      times[name] = time.perf_counter() - start
      cpu[name] = time.process_time() - start_cpu
    rounds.append(times)
    cpu_rounds.append(cpu)
  compiles = counter.count
  med = {name: statistics.median(r[name] for r in rounds) for name in modes}
  med_cpu = {name: statistics.median(r[name] for r in cpu_rounds) for name in modes}

  rows = len(questions) * rollout.group_size
  tokens = {name: np.asarray(jax.device_get(b.tokens)) for name, (b, _) in outputs.items()}
  for name, (b, metrics) in outputs.items():
    actions = [[r.action.kind for r in row] for row in b.turns]
    if not (b.answered.all() and (b.num_turns == turns).all()) or any(
        a != ["search"] * (turns - 1) + ["answer"] for a in actions):
      raise RuntimeError(f"{name}: the scripted rollout did not search {turns - 1} times and "
                         f"answer: {actions[0]}, {metrics}")
  suffix = len(enc(rubric_suffix(rubric)))
  trace = {name: engines[name].trace for name in modes[1:]}
  fed = {  # extra tokens fed per row over the rollout, beyond ReAct's
      "shadow": sum(suffix + len(e["ids"]) for e in trace["shadow"]) / rows,
      "persist": sum(suffix for _ in trace["persist"]) / rows,
      "best_of_n": sum(len(e["ids"][e["chosen"]]) for e in trace["best_of_n"]) / rows}
  sampled = {name: outputs[name][1].get("guided_proposal_tokens") or
             outputs[name][1]["sampled_tokens"] for name in modes}

  result = {"bench": "coreact", "turns": turns, "rows": rows,
            "guided_turns_per_row": (turns - 1), "rubric_items": rubric.n,
            "suffix_tokens": suffix, "best_of_n": n_best, "rounds": FLAGS.repeats}
  for name in modes:
    result[f"{name}_s"] = round(med[name], 3)
    result[f"{name}_cpu_s"] = round(med_cpu[name], 3)
    if name != "react":
      per_round = sorted(r[name] / r["react"] for r in rounds)
      result[f"{name}_over_react"] = round(med[name] / med["react"], 3)
      result[f"{name}_over_react_range"] = [round(per_round[0], 3), round(per_round[-1], 3)]
      result[f"{name}_over_react_cpu"] = round(med_cpu[name] / med_cpu["react"], 3)
      result[f"{name}_extra_fed_tokens_per_row"] = round(fed[name], 1)
    result[f"{name}_sampled_tokens_per_row"] = round(sampled[name] / rows, 1)
  result.update(
      react_context_tokens_per_row=round(float(np.asarray(
          jax.device_get(outputs["react"][0].valid)).sum(1).mean()), 1),
      shadow_tokens_equal_react=bool((tokens["shadow"] == tokens["react"]).all()),
      best_of_n_tokens_equal_react=bool((tokens["best_of_n"] == tokens["react"]).all()),
      warmup=warmup, compiles_after_warmup=compiles,
      model={"preset": FLAGS.preset if FLAGS["preset"].present else "demo",
             "hidden": cfg.hidden_size, "layers": cfg.num_layers, "vocab": cfg.vocab_size,
             "dtype": FLAGS.dtype},
      device=device_name())
  shutil.rmtree(tmp, ignore_errors=True)
  return result


def bench_ppo_step() -> dict:
  """What PPO's critic adds to an RL step, against the same step without it (GRPO's), same model
  shape and minibatch: the scoring pass (the policy's teacher-forced log-probs, + the critic's
  values) and one minibatch update (the policy's PPO-clip update, + the critic's value-loss
  update), each timed as a median over --repeats rounds after a warm-up (compiles excluded), and
  the train state held between steps (params + AdamW state; the critic: a full value model, or
  with LoRA a rank --lora_rank value adapter + head), counted from the arrays' shapes.

  Settings as train/step.py builds them from configs/ppo.py:qwen2.5-3b (loss: PPO clip 0.2,
  low_var_kl 0.001, token-mean, entropy computed; AdamW, clip 1.0; the critic verl's: lr 1e-5,
  value clip 0.5). `ratio` = (policy + critic) / policy time of scoring + one update.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import ppo as ppo_config
  from agentjax.models.logprobs import sequence_logprobs
  from agentjax.models.lora import LoraSpec
  from agentjax.models.qwen import Qwen, QwenConfig, adapter_abstract, init_params
  from agentjax.models.qwen.value import value_abstract, value_params_from_policy
  from agentjax.train.adapters import TrainTarget
  from agentjax.train.critic import Critic
  from agentjax.train.optim import make_optimizer
  from agentjax.train.rl import make_policy_update, policy_loss_config

  config = ppo_config.get_config("qwen2.5-3b")
  rl, o = config.rl, config.optimizer
  loss = policy_loss_config(config)
  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  b, length = FLAGS.batch or 4, FLAGS.length or 256
  total = 1000
  policy_opt = make_optimizer(o.lr, o.warmup_steps, total, o.weight_decay, o.clip_norm or None,
                              o.final_lr_ratio, o.b2)
  update = make_policy_update(Qwen(cfg), policy_opt, loss)
  critic = Critic.build(config, TrainTarget(cfg, None, None, None), updates_per_step=1)
  mb = _ppo_minibatch(cfg.vocab_size, b, length)
  rng = np.random.RandomState(1)
  cmb = {"tokens": mb["tokens"], "valid": mb["valid"], "value_mask": mb["loss_mask"],
         "old_values": jnp.asarray(0.1 * rng.randn(b, length), jnp.float32),
         "returns": jnp.asarray(rng.rand(b, 1) * mb["loss_mask"], jnp.float32)}
  score = jax.jit(lambda p, t, v: sequence_logprobs(Qwen(cfg), p, t, v, chunk=rl.chunk)[0])

  params = init_params(cfg, jax.random.key(0))
  state = {"policy": (params, policy_opt.init(params))}
  cparams = value_params_from_policy(cfg, params, jax.random.key(1))
  state["critic"] = (cparams, critic.optimizer.init(cparams))

  def run_score(name):
    p = state[name][0]
    out = score(p, mb["tokens"], mb["valid"]) if name == "policy" else \
        critic.values(p, mb["tokens"], mb["valid"])
    return jax.block_until_ready(out)

  def run_update(name):
    p, s = state[name]
    if name == "policy":
      p, s, m = update(p, s, mb)
    else:
      p, s, m = critic.update(p, s, cmb)
    jax.block_until_ready(p)
    state[name] = (p, s)
    return int(m["skipped"])

  start = time.perf_counter()
  for name in ("policy", "critic"):  # warm-up: compiles
    run_score(name)
    run_update(name)
  compile_s = time.perf_counter() - start
  times = {f"{phase}_{name}": [] for phase in ("score", "update") for name in ("policy", "critic")}
  skipped = 0
  for _ in range(FLAGS.repeats):
    for name in ("policy", "critic"):
      t0 = time.perf_counter()
      run_score(name)
      times[f"score_{name}"].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      skipped += run_update(name)
      times[f"update_{name}"].append(time.perf_counter() - t0)
  med = {k: statistics.median(v) for k, v in times.items()}

  nbytes = _tree_bytes
  spec = LoraSpec(names=("value",), rank=FLAGS.lora_rank or 32,
                  alpha=FLAGS.lora_alpha or float(FLAGS.lora_rank or 32))
  lora_params = {"adapter": adapter_abstract(cfg, spec), "score": value_abstract(cfg)["score"]}
  lora_state = nbytes(lora_params) + nbytes(jax.eval_shape(critic.optimizer.init, lora_params))
  policy_state = nbytes(state["policy"])
  critic_state = nbytes(state["critic"])
  base = med["score_policy"] + med["update_policy"]
  return {
      "bench": "ppo_step", "preset": FLAGS.preset, "dtype": FLAGS.dtype, "batch": b,
      "length": length, "repeats": FLAGS.repeats, "compile_s": round(compile_s, 1),
      **{f"{k}_s": round(v, 4) for k, v in med.items()},
      "score_ratio": round((med["score_policy"] + med["score_critic"]) / med["score_policy"], 3),
      "update_ratio": round((med["update_policy"] + med["update_critic"])
                            / med["update_policy"], 3),
      "policy_state_gb": round(policy_state / 1e9, 3),
      "critic_state_gb": round(critic_state / 1e9, 3),
      "lora_critic_state_gb": round(lora_state / 1e9, 4), "lora_rank": spec.rank,
      "state_ratio": round((policy_state + critic_state) / policy_state, 3),
      "lora_state_ratio": round((policy_state + lora_state) / policy_state, 4),
      "skipped_updates": skipped, "device": device_name(),
      "ratio": round((base + med["score_critic"] + med["update_critic"]) / base, 3)}


import fit  # noqa: E402  (launch/fit.py: defines the fit flags --config, --devices, ...)


def bench_gpu() -> dict:
  """Issue 30 §6, on an accelerator: the --preset shape (qwen2.5-1.5b when not given) run for
  real, random weights, bfloat16 compute. Three figures, each against a ceiling measured in the
  same run (a bf16 matmul of 8192^3 for FLOP/s, a donated x + 1 over 1 GB for bytes/s):

  decode: `generate` of --new_tokens (128) greedy tokens after a 256-token prompt, bf16 params
    (the decode layout), a 1024-slot cache read through sampling.kv_window_size's window, at
    batch 16 and 128. tokens/s over the HBM roofline: each step must read every weight once
    and the K/V of the window for every row, bytes / measured bandwidth = the fastest step.
  train: one full fine-tuning policy update (train/rl.make_policy_update, configs/base's loss and
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

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  from configs import base as base_config
  from agentjax.models import attention, masks
  from agentjax.models.qwen import Qwen, QwenConfig, init_params
  from agentjax.sampling import (SamplingParams, StopTable, decode_layout, extend, generate,
                                 init_state, kv_window_arg, kv_window_size)
  from agentjax.train.optim import make_optimizer
  from agentjax.train.rl import make_policy_update, policy_loss_config

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
  weight_bytes = _tree_bytes(decoder[1])
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
  minibatch = _ppo_minibatch(tcfg.vocab_size, tb, tl)
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


def bench_fit() -> dict:
  """The fit check (launch/fit.py): the preset's programs compiled, never run, on --devices fake
  CPU devices; memory per device against --device_memory_gb. Must run before jax is imported."""
  fit.quiet_logs()
  return fit.run_from_flags()


BENCHES = {"gpu": bench_gpu, "forward": bench_forward, "decode": bench_decode, "rollout": bench_rollout,
           "decode_window": bench_decode_window,
           "rollout_mix": bench_rollout_mix,
           "packing": bench_packing,
           "info_gain": bench_info_gain, "attention": bench_attention, "rewards": bench_rewards, "synthworld": bench_synthworld,
           "sft_step": bench_sft_step, "judge": bench_judge, "train_step": bench_train_step,
           "coreact": bench_coreact, "ppo_step": bench_ppo_step,
           "fit": bench_fit}


def main(argv):
  if len(argv) != 2 or argv[1] not in BENCHES:
    sys.exit(f"usage: python launch/bench.py {{{'|'.join(BENCHES)}}} [--flags]")
  result = BENCHES[argv[1]]()
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
