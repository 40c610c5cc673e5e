"""A tiny trainer config that runs in seconds (shared by test_trainer and the multi-host check)."""

from __future__ import annotations

import importlib
import os


def tiny_config(world_dir: str, tokenizer_dir: str, tmp: str, algorithm: str = "igpo",
                steps: int = 3):
  """The tiny preset from scratch on a test SynthWorld, short rollouts, small batches."""
  c = importlib.import_module(f"configs.{algorithm}").get_config("demo")
  c.model.hf_path = ""
  c.model.preset = "tiny"
  c.model.tokenizer_path = tokenizer_dir
  c.data.manual_dir = world_dir
  c.data.data_dir = os.path.join(tmp, "tfds")
  c.data.eval_size = 4
  c.retrieval.corpus_path = os.path.join(world_dir, "corpus.jsonl")
  c.retrieval.index_dir = os.path.join(tmp, "bm25")
  c.rollout.group_size = 2
  c.rollout.max_turns = 2
  c.rollout.max_new_tokens = 24
  c.rollout.max_obs_tokens = 96
  c.rollout.max_total_tokens = 512
  c.rl.prompts_per_step = 2
  c.rl.minibatch_size = 2
  # A random model rarely answers (zero advantages); the KL and entropy terms keep every update
  # moving the parameters, so resuming must restore them exactly to repeat the run.
  c.rl.kl_coef = 0.05
  c.rl.entropy_coef = 0.01
  c.optimizer.lr = 1e-3
  c.optimizer.warmup_steps = 1
  c.train.steps = steps
  c.train.eval_every = 2
  c.train.eval_batch = 4
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.sft.demos = os.path.join(world_dir, "demos.jsonl")
  c.sft.corpus_path = os.path.join(world_dir, "corpus.jsonl")
  c.sft.steps = 3
  c.sft.batch_size = 2
  c.sft.max_len = 512
  c.sft.micro_batches = 1  # the demo's 4 does not divide 2, and one shape compiles once
  return c


def run_metrics(workdir, key: str | None = None) -> list[dict]:
  """A run's metrics.jsonl rows (those that have `key`, when given: "reward" for the steps)."""
  import json
  import os
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if key is None or key in r]


class StallingBackend:
  """The run's real retriever, except that from step `stall_at` (0-based) on a search never
  returns (`retriever_never_answers`: the frame a stall dump must name). calls: searches asked."""

  def __init__(self, inner, stall_at: int | None):
    self.inner, self.stall_at, self.step, self.calls = inner, stall_at, 0, 0

  def search(self, queries, topk):
    self.calls += 1
    if self.stall_at is not None and self.step >= self.stall_at:
      retriever_never_answers()
    return self.inner.search(queries, topk)


def retriever_never_answers():
  import threading
  threading.Event().wait()


def search_every_turn(setattr_, stall_at: int | None = None) -> list:
  """Every action of the tiny model is a search (a random model rarely writes one), through a
  StallingBackend that stalls from step `stall_at` (None: never). setattr_: pytest's
  monkeypatch.setattr, or the builtin setattr in a subprocess. Returns the backends made."""
  from agentjax.agent.protocol import Action
  from agentjax.agent.rollout import RolloutEngine
  from agentjax.train import step as step_lib
  from agentjax.train import trainer
  setattr_(RolloutEngine, "parse", lambda self, text: Action("search", "zorvath"))
  made = []
  real_backend = trainer.make_search_backend
  setattr_(trainer, "make_search_backend", lambda config, mesh=None: made.append(
      StallingBackend(real_backend(config, mesh), stall_at)) or made[-1])
  real_produce = step_lib.RLStep.produce

  def produce(self, params, questions, rollout_rng, step, version, feed=None):
    made[-1].step = step  # the producing thread's step: synchronous or asynchronous
    return real_produce(self, params, questions, rollout_rng, step, version, feed=feed)

  setattr_(step_lib.RLStep, "produce", produce)
  return made
