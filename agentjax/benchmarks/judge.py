"""`python launch/bench.py judge`: the local judge: a step's calls batched against one at a time
(bench_judge)."""

from __future__ import annotations

import json
import os
import statistics
import time

from agentjax.benchmarks.common import FLAGS, demo_world, device_name, median_seconds


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
    world = demo_world(tmp, config.retrieval.topk)
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
