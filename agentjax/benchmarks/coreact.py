"""`python launch/bench.py coreact`: Co-ReAct's guided rollouts against plain ReAct (bench_coreact)."""

from __future__ import annotations

import json
import os
import statistics
import time

from agentjax.benchmarks.common import FLAGS, demo_world, device_name


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
  world = demo_world(tmp, config.retrieval.topk)
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
