"""`python launch/bench.py info_gain`: IGPO's ground-truth probes: one packed pass against one pass
per turn (bench_info_gain)."""

from __future__ import annotations

import json
import re

from agentjax.benchmarks.common import FLAGS, device_name, median_seconds


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
