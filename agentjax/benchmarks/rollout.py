"""`python launch/bench.py rollout`: a 4-turn search rollout against one single-turn generation of
as many tokens (bench_rollout)."""

from __future__ import annotations

import os

from agentjax.benchmarks.common import FLAGS, device_name, fixture_modules, median_seconds


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
  af, retrieval_fixtures = fixture_modules("agent_fixtures", "retrieval_fixtures")

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
