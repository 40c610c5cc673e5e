"""`python launch/bench.py packing`: the packing efficiency of padded against packed batches
(bench_packing)."""

from __future__ import annotations

import json
import os

from agentjax.benchmarks.common import FLAGS, demo_world, fixture_modules


def _packing_figures(batches: list, pack_tokens: int, max_turns: int, multiple: int = 128) -> dict:
  """Padded vs packed computed tokens over `batches` of (lengths [B], num_turns [B], probe_valid
  [B, K, A] from info_gain.build_probes).

  Padded: each batch as train/scoring.trim leaves it (every row as wide as the longest trajectory,
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
  """packing_efficiency (real tokens / computed tokens) of padded vs packed batches
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

  from configs import base as base_config
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.models.tokenizer import load_tokenizer
  from agentjax.retrieval import make_backend
  from agentjax.rl.info_gain import build_probes
  from agentjax.sampling import SamplingParams
  from agentjax.train.sft import tokenize_demos
  af, retrieval_fixtures = fixture_modules("agent_fixtures", "retrieval_fixtures")

  demo_cfg = base_config.get_config("demo")
  rng = np.random.default_rng(0)
  report = {"bench": "packing"}
  with tempfile.TemporaryDirectory() as tmp:
    world = demo_world(tmp, demo_cfg.retrieval.topk)
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
