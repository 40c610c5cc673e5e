"""CW-GRPO steps end to end: a scripted agent, the judge pass, the contribution-weighted update.

The scripted agent (tests/agent_fixtures.py) answers correctly or searches at every turn, so a
step holds correct trajectories of one round (K = 0) and of two (K = 1) and failed ones: the
judge is called for the correct ones of mixed groups only, and its verdicts reach the advantage.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.judge import JUDGES, Verdict, register_judge
from agentjax.parallel import make_mesh
from agentjax.sampling import SamplingParams
from agentjax.train.step import RLStep
from tests import agent_fixtures as af
from tests.retrieval_fixtures import free_port

GROUP, QUESTIONS = 8, 2


@pytest.fixture(scope="module")
def setup(scripted_world):
  tok, backend, agent = scripted_world
  engine = RolloutEngine(agent.cfg, tok, backend, RolloutConfig(
      group_size=GROUP, max_turns=2, max_new_tokens=8, max_obs_tokens=48, max_total_tokens=512,
      topk=2, sampling=SamplingParams(temperature=1.0)))
  return engine, agent.params(af.SEARCH, af.ANSWER)


def _config(**judge):
  c = importlib.import_module("configs.cw_grpo").get_config("demo")
  c.rollout.group_size, c.rollout.max_turns, c.rollout.max_total_tokens = GROUP, 2, 512
  c.rl.prompts_per_step, c.rl.minibatch_size, c.rl.kl_coef = QUESTIONS, GROUP * QUESTIONS, 0.0
  c.train.steps = 3
  c.judge.update(judge)
  return c


def _steps(setup, config, steps=3):
  engine, params = setup
  params = jax.tree.map(jnp.copy, params)  # the update donates its params
  optimizer = optax.sgd(0.3)
  rl_step = RLStep.build(config, make_mesh(-1, 1, 1), engine, optimizer, None)
  state = {"params": params, "opt_state": optimizer.init(params), "rng": jax.random.key(0)}
  questions = [{"question": "Who founded Zorvath?", "golden_answers": ["Aldric"]}] * QUESTIONS
  out = []
  for step in range(steps):
    result = rl_step(state, questions, step)
    state = result.state
    out.append(result.metrics)
  return out



@pytest.fixture(scope="module")
def fixed_judge():
  """A registered judge giving round k retrieval = thinking = value(k) (set per test)."""
  state = {"value": lambda k: 1, "requests": 0}

  class Fixed:
    def judge(self, requests):
      state["requests"] += len(requests)
      return [[Verdict(state["value"](k), state["value"](k)) for k in range(len(r.turns))]
              for r in requests]

    def identity(self):
      return {"backend": "test_fixed"}

  register_judge("test_fixed")(lambda cfg, mesh=None: Fixed())
  yield state
  del JUDGES["test_fixed"]


def test_a_judge_server_that_is_down_costs_rounds_not_the_run(setup):
  """Every call refused: the run trains to the end, each round 0/0, the failures counted; with
  the code's "zero" fallback only the answer rounds of correct trajectories keep their A."""
  config = _config(backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                   timeout_s=2.0, max_retries=1, retry_backoff_s=0.01)
  metrics = _steps(setup, config)
  assert len(metrics) == 3 and all(np.isfinite(m["loss"]) for m in metrics)
  calls = sum(m["judge/calls"] for m in metrics)
  assert calls > 0 and sum(m["judge/failures"] for m in metrics) == calls
  assert all(m["judge/contribution_share"] == 0 for m in metrics)
  # Every correct two-round trajectory of a live group hit the all-zero fallback.
  fired = sum(m["cw/fallback_count"] for m in metrics)
  assert fired > 0 and all(m["cw/fallback_rate"] == 1.0 for m in metrics
                           if m["cw/fallback_count"])


def test_verdicts_reach_the_advantage(setup, fixed_judge):
  """All-ones verdicts: the fallback never fires and the same step with all-zero verdicts
  differs only through the contribution weights (its loss differs)."""
  fixed_judge["value"] = lambda k: 1
  ones = _steps(setup, _config(backend="test_fixed"), steps=1)[0]
  assert ones["judge/calls"] > 0 and ones["judge/failures"] == 0
  assert ones["cw/fallback_count"] == 0 and ones["judge/contribution_share"] == 1.0
  fixed_judge["value"] = lambda k: 0
  zeros = _steps(setup, _config(backend="test_fixed"), steps=1)[0]
  assert zeros["judge/calls"] == ones["judge/calls"]  # same rollouts (same rng), same calls
  assert zeros["cw/fallback_count"] > 0 and zeros["loss"] != ones["loss"]


@pytest.mark.parametrize("credited", [0, 1])
def test_round_k_verdict_weights_turn_k_tokens(setup, fixed_judge, monkeypatch, credited):
  """Round k's verdict lands on turn k's tokens. Two-turn correct trajectories (a search, then
  the answer) with only round `credited` credited: crediting the search gives its tokens A
  (K w = 1); crediting only the answer round leaves the search with c = 0, so the code's
  "zero" fallback gives its tokens 0, while the answer's tokens keep A either way."""
  import agentjax.train.step as step_lib
  seen = {}
  real = step_lib.compute_advantages

  def spy(name, batch, outcome, ig, extra=None, **kw):
    adv, stats = real(name, batch, outcome, ig, extra=extra, **kw)
    seen.update(batch=batch, outcome=outcome, adv=adv, grpo=real("grpo", batch, outcome, ig)[0])
    return adv, stats

  monkeypatch.setattr(step_lib, "compute_advantages", spy)
  fixed_judge["value"] = lambda k: int(k == credited)
  _steps(setup, _config(backend="test_fixed"), steps=1)
  batch = seen["batch"]
  adv, grpo = np.asarray(seen["adv"]), np.asarray(seen["grpo"])
  turn_id, mask = np.asarray(batch.turn_id), np.asarray(batch.loss_mask)
  rows = [b for b in range(len(batch.num_turns))
          if batch.num_turns[b] == 2 and batch.answered[b] and grpo[b][mask[b]].max() > 0]
  assert rows  # the scripted agent gives such trajectories
  for b in rows:
    a = grpo[b][mask[b]][0]  # GRPO's A, the same on every sampled token of the row
    search, answer = mask[b] & (turn_id[b] == 0), mask[b] & (turn_id[b] == 1)
    np.testing.assert_allclose(adv[b][search], a if credited == 0 else 0.0, rtol=1e-6)
    np.testing.assert_allclose(adv[b][answer], a, rtol=1e-6)


def test_the_openai_judge_against_launch_serve(setup, chat_model_dir, tmp_path):
  """The `openai` backend pointed at agentjax's own server (launch/serve.py's app, a tiny random
  Qwen as the judge): every judged round is one request, the server decodes concurrent ones
  together, and a random judge's junk replies are counted failures, never an exception."""
  from agentjax.sampling.complete import Completer
  from agentjax.serve import ServerThread, create_app

  prompt = tmp_path / "judge.md"  # a user's own prompt file (short: the tiny judge's context)
  prompt.write_text("Score the last round as JSON.\n{{TRACE}}\n")
  app = create_app(Completer.from_hf(chat_model_dir, max_total_tokens=1024), model_name="judge",
                   max_batch=64, batch_window_s=2.0,  # a step's calls meet in one batch
                   max_tokens_limit=8)
  with ServerThread(app) as server:
    config = _config(backend="openai", base_url=f"{server.url}/v1", model="judge",
                     prompt_path=str(prompt), max_tokens=8, timeout_s=300.0, max_retries=0)
    m = _steps(setup, config, steps=1)[0]
    stats = app.state.batcher.stats()
  calls = m["judge/calls"]
  assert calls > 0 and stats["requests"] == calls and stats["batches"] < calls
  assert m["judge/failures"] == calls and np.isfinite(m["loss"])
