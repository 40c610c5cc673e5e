"""`python launch/bench.py rollout_mix`: the rollout engines on a realistic mix: turn-synchronous
against slots (bench_rollout_mix)."""

from __future__ import annotations

import collections
import json
import os
import time

from agentjax.benchmarks.common import FLAGS, device_name, fixture_modules, mix_shape


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
  from agentjax.retrieval import make_backend
  from agentjax.sampling import SamplingParams
  af, retrieval_fixtures = fixture_modules("agent_fixtures", "retrieval_fixtures")

  questions, group = FLAGS.questions or 6, FLAGS.group_size or 8
  root = tempfile.mkdtemp(prefix="agentjax-bench-")
  tok = af.scripted_tokenizer(os.path.join(root, "tok"))
  backend = retrieval_fixtures.SlowBackend(make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(
      os.path.join(root, "corpus.jsonl")), index_dir=os.path.join(root, "index")),
      FLAGS.search_latency_ms / 1000)
  agent = af.ScriptedAgent(tok)
  cfg, params = af.mix_params(agent, mix_shape())
  names = [f"Who founded {retrieval_fixtures.NAMES[i % len(retrieval_fixtures.NAMES)]}?"
           for i in range(questions)]
  base = dict(group_size=group, max_turns=6, max_new_tokens=64, max_obs_tokens=128,
              max_total_tokens=2048, topk=3, sampling=SamplingParams(temperature=1.0))
  factors = [int(f) for f in FLAGS.compact_factors.split(",")]
  engines = {"turns": RolloutConfig(engine="turns", **base)}
  for i, factor in enumerate(factors):  # "slots": the first; the others named by their factor
    engines["slots" if i == 0 else f"slots_compact{factor}"] = RolloutConfig(
        engine="slots", slots=FLAGS.slots, lanes=2, refill_fraction=0.125,
        compact_factor=factor, **base)
  report = {}
  for name, config in engines.items():
    engine = RolloutEngine(cfg, tok, backend, config)
    start, warmup = time.perf_counter(), CompileCounter()
    engine.run(params, names, jax.random.key(0))  # warm-up: compiles
    warmup_s, warmup_compiles = time.perf_counter() - start, warmup.count
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
        "compiles_warmup": warmup_compiles, "compiles_after_warmup": counter.count,
        "compact_factor": config.compact_factor if config.engine == "slots" else None}
    print(json.dumps({"engine": name, **report[name]}), flush=True)
  new, old = report["slots"], report["turns"]
  return {"bench": "rollout_mix", "ratio": round(new["tokens_per_s"] / old["tokens_per_s"], 3),
          "useful_row_share": new["useful_row_share"],
          "useful_row_share_before": old["useful_row_share"],
          "prefill_tokens": new["prefill_tokens"], "prefill_tokens_before": old["prefill_tokens"],
          "search_wait_s": new["search_wait_s"], "search_wait_s_before": old["search_wait_s"],
          "model": FLAGS.mix_model, "dtype": FLAGS.dtype, "questions": questions,
          "group_size": group, "slots": FLAGS.slots, "compact_factors": factors,
          "search_latency_ms": FLAGS.search_latency_ms, "engines": report,
          "device": device_name()}
