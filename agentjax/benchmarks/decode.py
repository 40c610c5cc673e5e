"""`python launch/bench.py decode`: greedy generation against transformers generate; with
--lora_rank, the bare backbone against one LoRA adapter (merged and unmerged decode)
(bench_decode)."""

from __future__ import annotations

import statistics
import time

from agentjax.benchmarks.common import FLAGS, copy_bandwidth, device_name, reference_model


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
    ref_model, params = reference_model(cfg)
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
