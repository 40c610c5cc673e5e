"""`python launch/bench.py async`: asynchronous RL (train.async_steps) against the synchronous
step, colocated on this machine's devices (bench_async)."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import tempfile
import threading
import time

from agentjax.benchmarks.common import FLAGS, device_name, mix_shape

# The most steps an async setting produces ahead of its update (the largest async_steps run).
AHEAD = 2
# The mismatch metrics every step logs (agentjax/rl/offpolicy.py), reported per setting.
MISMATCH_KEYS = ("mismatch/abs_logp_diff", "mismatch/kl", "mismatch/ratio_out_share")


class _Timeline:
  """Intervals (t0, t1) of what ran: the trainer's updates, the producer's productions, and the
  host waits injected below (retriever and judge latency)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.spans: dict[str, list[tuple[float, float]]] = {"consume": [], "produce": [], "wait": []}
    # The process's CPU seconds (every thread's: XLA's pool, the producer, the trainer) at the
    # end of each update: the CPU time of a window of whole steps.
    self.cpu_at: dict[float, float] = {}

  def add(self, kind, t0, t1):
    with self.lock:
      self.spans[kind].append((t0, t1))


def _union(spans):
  out = []
  for a, b in sorted(spans):
    if out and a <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], b))
    else:
      out.append((a, b))
  return out


def _minus(spans, holes):
  """The parts of `spans` outside `holes` (both lists of intervals)."""
  out = []
  holes = _union(holes)
  for a, b in spans:
    cur = a
    for h0, h1 in holes:
      if h1 <= cur or h0 >= b:
        continue
      if h0 > cur:
        out.append((cur, h0))
      cur = max(cur, h1)
    if cur < b:
      out.append((cur, b))
  return out


def _measure(window, spans):
  """Seconds of the union of spans inside window (t0, t1)."""
  w0, w1 = window
  return sum(max(0.0, min(b, w1) - max(a, w0)) for a, b in _union(spans))


def cpu_seconds() -> float:
  """CPU seconds (user + system) this process's threads have run so far."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def idle_share(timeline: _Timeline, window: tuple[float, float]) -> float:
  """The share of `window` in which the devices had nothing to run: neither an update
  (consume) nor a production outside its injected host waits (the rollout's decode, scoring of
  rewards on the host counted busy: an upper bound of the device's work)."""
  busy = list(timeline.spans["consume"]) + _minus(timeline.spans["produce"],
                                                   timeline.spans["wait"])
  return 1.0 - _measure(window, busy) / max(window[1] - window[0], 1e-9)


def bench_async() -> dict:
  """Demo-shaped CW-GRPO steps (configs/cw_grpo.py:demo's RL settings: 8 questions x 8, 4 turns,
  64 new tokens a turn, the oracle judge) of the scripted "mix" policy (tests/agent_fixtures.py:
  turns of 12-64 tokens, then a search or an answer, 1/2 each, at temperature 1), with a
  retriever latency (--search_latency_ms per call; 50 unless given) and a judge latency
  (--judge_latency_ms per batch, 200), for train.async_steps 0, 1 and 2 in turn: --steps steps
  each (default 6; the first two not timed) by RLStep and the trainer's RolloutPipeline, one
  rollout lane (so a retriever wait is a device wait), after a synchronous warm-up pass that
  compiles what the settings share. Steps per hour over the timed steps, and the idle share of
  the devices (idle_share: neither an update nor a rollout outside its injected waits). --mix_model=<preset> runs the same script at that preset's
  shape in --dtype (e.g. qwen2.5-1.5b in bfloat16 on a GPU: the step's compute is the real
  model's; the mismatch metrics are the bf16 sampler's against the bf16 scoring pass's; the
  update in micro-batches of 8 trajectories); --mix_layers=n at n layers (a CPU dry run).

  --async_partial: also async_steps 1 and 2 with rollout.partial="continue" (the parameters
  published after each update read by the rollouts in flight; staleness_mean per step).

  --async_split=n: every setting on 2n fake CPU devices, and a fourth: async_steps 1 with the
  split placement (n devices sample, n train; the weight copy timed). On a 2-core CPU the fake
  devices share the cores: this checks the placement's overheads, not a GPU's speed-up.

  Last line: {"ratio": steps/h of async_steps=1 over synchronous, "ratio_2": of 2,
  "ratio_split" (with --async_split),
  "idle_share_before": synchronous, "idle_share": async_steps=1, "idle_share_2",
  "cores_busy_before" / "cores_busy": CPU seconds per second of the synchronous / async_steps=1
  window (all threads), "ratio_bound": the cores over the synchronous cores_busy (the most any
  overlap can give when a step's CPU work stays the same), per setting: steps_per_hour,
  idle_share, cores_busy, staleness per step, wait_s_mean (the trainer's wait for a rollout)}.
  Every async setting keeps producing past its last timed step (no end), so each timed update
  has the next rollouts beside it, as in a long run.
  """
  from agentjax.benchmarks.fit import force_devices
  split = FLAGS.async_split
  if split:
    force_devices(2 * split)  # before jax is imported
  import jax
  import numpy as np

  import agentjax.train.step as step_lib
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.benchmarks.common import fixture_modules
  from agentjax.compiles import CompileCounter
  from agentjax.models.qwen import param_shardings
  from agentjax.parallel import make_mesh, split_meshes
  from agentjax.retrieval import make_backend
  from agentjax.sampling import SamplingParams
  from agentjax.train.optim import make_optimizer
  from agentjax.train.pipeline import RolloutPipeline
  from configs import cw_grpo
  af, retrieval_fixtures = fixture_modules("agent_fixtures", "retrieval_fixtures")

  steps = FLAGS.steps if FLAGS.steps != 20 else 6  # 20 is the flag's default (sft_step's)
  warm = 2
  search_s = (FLAGS.search_latency_ms if FLAGS.search_latency_ms != 20 else 50) / 1000
  judge_s = FLAGS.judge_latency_ms / 1000
  tmp = tempfile.mkdtemp(prefix="agentjax-bench-async-")
  timeline = _Timeline()

  class SlowJudge:
    def __init__(self, judge):
      self.inner = judge

    def judge(self, requests):
      t0 = time.perf_counter()
      time.sleep(judge_s)
      timeline.add("wait", t0, time.perf_counter())
      return self.inner.judge(requests)

    def __getattr__(self, name):
      return getattr(self.inner, name)

  class TimedSlowBackend(retrieval_fixtures.SlowBackend):
    def search(self, queries, topk):
      t0 = time.perf_counter()
      time.sleep(self.latency_s)
      timeline.add("wait", t0, time.perf_counter())
      self.calls += 1
      return self.backend.search(queries, topk)

  config = cw_grpo.get_config("demo")
  if FLAGS.mix_model != "scripted":
    # At a real model's shape the demo's one pass over 64 trajectories would hold [64, chunk, V]
    # log-prob chunks (10 GB in f32 at Qwen's 151,936-token vocabulary): micro-batches of 8
    # trajectories, as a verl run sets ppo_micro_batch_size_per_gpu.
    config.rl.micro_batch_size = 8
  r = config.rollout
  tok = af.scripted_tokenizer(os.path.join(tmp, "tok"))
  backend = TimedSlowBackend(make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(
      os.path.join(tmp, "corpus.jsonl")), index_dir=os.path.join(tmp, "index")), search_s)
  agent = af.ScriptedAgent(tok)
  # The same script at a real model's shape and dtype with --mix_model.
  cfg, params0 = af.mix_params(agent, mix_shape())
  rollout = RolloutConfig(
      group_size=r.group_size, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
      max_obs_tokens=r.max_obs_tokens, max_total_tokens=r.max_total_tokens,
      topk=config.retrieval.topk, sampling=SamplingParams(temperature=1.0), lanes=1)
  names = retrieval_fixtures.NAMES
  # Questions for AHEAD steps past the last too: an async setting (async_steps <= AHEAD) keeps
  # producing the next steps while its last timed steps update, as a longer run would.
  questions = [{"id": str(i), "question": f"Who founded {names[i % len(names)]}?",
                "golden_answers": ["Aldric"]}
               for i in range((steps + AHEAD) * config.rl.prompts_per_step)]
  n = config.rl.prompts_per_step
  at = lambda j: questions[j * n:(j + 1) * n]  # noqa: E731
  o = config.optimizer
  optimizer = make_optimizer(o.lr, o.warmup_steps, steps, o.weight_decay, o.clip_norm or None,
                             o.final_lr_ratio, o.b2)
  real_judge = step_lib.build_judge
  real_produce, real_consume = step_lib.RLStep.produce, step_lib.RLStep.consume

  def timed(kind, method):
    def run(self, *a, **k):
      t0 = time.perf_counter()
      try:
        return method(self, *a, **k)
      finally:
        t1 = time.perf_counter()
        timeline.add(kind, t0, t1)
        if kind == "consume":
          timeline.cpu_at[t1] = cpu_seconds()
    return run

  step_lib.build_judge = lambda c, mesh=None: (lambda j: None if j is None else SlowJudge(j))(
      real_judge(c, mesh=mesh))
  step_lib.RLStep.produce = timed("produce", real_produce)
  step_lib.RLStep.consume = timed("consume", real_consume)
  results = {}
  # (name, async_steps, split): colocated on every device, then with --async_split the split
  # placement (the last async_split devices sample, the others train).
  # A warm-up pass first (per placement), not reported: every setting then reuses its compiled
  # programs, else the first setting alone pays the compiles its later steps still make (new
  # slot counts, key windows and lengths) and the ratios over it come out too high.
  settings = [("warmup", 0, False, "off"), ("0", 0, False, "off"), ("1", 1, False, "off"),
              ("2", 2, False, "off")]
  if FLAGS.async_partial:
    settings += [("1_continue", 1, False, "continue"), ("2_continue", 2, False, "continue")]
  if split:
    settings += [("warmup_split", 1, True, "off"), ("1_split", 1, True, "off")]
  try:
    built = {}
    for name, k, is_split, partial in settings:
      if is_split not in built:
        mesh, sampler = (split_meshes(split) if is_split else
                         (make_mesh(-1, 1, 1), None))
        engine = RolloutEngine(cfg, tok, backend, rollout, mesh=sampler or mesh)
        built[is_split] = (mesh, step_lib.RLStep.build(config, mesh, engine, optimizer, None,
                                                       sampler_mesh=sampler))
      mesh, rl_step = built[is_split]
      for key in timeline.spans:
        timeline.spans[key].clear()
      timeline.cpu_at.clear()
      params = jax.device_put(jax.tree.map(np.copy, params0), param_shardings(cfg, mesh))
      state = {"params": params, "opt_state": optimizer.init(params), "rng": jax.random.key(0)}
      rl_step.stage.engine.config = dataclasses.replace(rl_step.stage.engine.config,
                                                        partial=partial)
      # No end: the timed steps all have the next steps' rollouts beside their updates (with
      # end=steps the last k steps would have none and update alone, which a long run's steps
      # do not: async_steps 2 then had one more such step in its window than async_steps 1).
      # close() then drops the productions past the window (search_calls counts them).
      assert k <= AHEAD, (k, AHEAD)
      pipeline = RolloutPipeline(rl_step, at, k, partial=partial) if k else None
      rows = []
      try:
        for t in range(steps):
          t0, compiles = time.perf_counter(), CompileCounter()  # this step's compiles
          out = pipeline.step(state, t) if pipeline else rl_step(state, at(t), t)
          state = out.state
          rows.append(out.metrics)
          # Progress as it goes (the first steps compile): a run cut short still says where
          # its time went.
          print(json.dumps({"setting": name, "step": t,
                            "seconds": round(time.perf_counter() - t0, 3),
                            "compiles": compiles.count, "compile_s": round(compiles.seconds, 1),
                            **{key: round(float(out.metrics.get(key, 0.0)), 3) for key in (
                                "rollout_s", "scoring_s", "update_s", "reward",
                                "sampled_tokens_per_s")}}),
                flush=True)
      finally:
        if pipeline:
          pipeline.close()
      ends = sorted(b for _, b in timeline.spans["consume"])
      window = (ends[warm - 1], ends[steps - 1])
      results[name] = {
          "steps_per_hour": (steps - warm) / (window[1] - window[0]) * 3600,
          "idle_share": idle_share(timeline, window),
          # CPU seconds per second of the window: how many of the cores the step kept busy
          # (XLA's pool threads count while they spin for work too).
          "cores_busy": (timeline.cpu_at[window[1]] - timeline.cpu_at[window[0]]) /
                        (window[1] - window[0]),
          "staleness": [m.get("async/staleness", 0.0) for m in rows],
          # the token-weighted mean (rollout.partial "continue": below the oldest token's)
          "staleness_mean": [round(m.get("async/staleness_mean", 0.0), 3) for m in rows],
          "partial_share": float(np.mean([m.get("async/partial_share", 0.0) for m in rows])),
          "wait_s_mean": float(np.mean([m.get("async/wait_s", 0.0) for m in rows[warm:]])),
          "judge_calls": float(np.mean([m.get("judge/calls", 0.0) for m in rows])),
          "search_calls": backend.calls, "reward": [round(m["reward"], 3) for m in rows],
          "weight_copy_s_mean": float(np.mean([m.get("async/weight_copy_s", 0.0)
                                               for m in rows[warm:]])),
          # The sampler's log-probs against the scoring pass's, every step (rl/offpolicy.py).
          **{key: float(np.mean([m[key] for m in rows])) for key in MISMATCH_KEYS}}
      backend.calls = 0
      print(json.dumps({"setting": name, **results[name]}), flush=True)
      if name.startswith("warmup"):
        del results[name]
  finally:
    step_lib.build_judge = real_judge
    step_lib.RLStep.produce, step_lib.RLStep.consume = real_produce, real_consume
  base = results["0"]["steps_per_hour"]
  out = {"bench": "async", "device": device_name(), "devices": jax.device_count(),
         "policy": "scripted mix", "model": FLAGS.mix_model, "dtype": str(cfg.dtype), "steps": steps, "timed_steps": steps - warm,
         "search_latency_ms": search_s * 1000, "judge_latency_ms": judge_s * 1000,
         "settings": results,
         "idle_share_before": results["0"]["idle_share"], "idle_share": results["1"]["idle_share"],
         "idle_share_2": results["2"]["idle_share"],
         "ratio_2": results["2"]["steps_per_hour"] / base}
  # What the cores allow when they are what a step waits for (a CPU run): a step does about
  # the same work (CPU seconds) in every setting, so with every core busy it can run at most
  # cores / cores_busy(synchronous) times as many steps. On an accelerator this says nothing.
  cores = len(os.sched_getaffinity(0))
  out.update(cores=cores, cores_busy_before=results["0"]["cores_busy"],
             cores_busy=results["1"]["cores_busy"],
             ratio_bound=cores / results["0"]["cores_busy"])
  out.update({key: results["0"][key] for key in MISMATCH_KEYS})
  if split:
    out["ratio_split"] = results["1_split"]["steps_per_hour"] / base
    out["idle_share_split"] = results["1_split"]["idle_share"]
  if FLAGS.async_partial:
    out["ratio_continue"] = results["1_continue"]["steps_per_hour"] / base
  out["ratio"] = results["1"]["steps_per_hour"] / base
  return out
