"""The method registry (agentjax/methods): every estimator has one entry, the step and the
config validation read entries (not names), and an entry's unmet needs fail at validation."""

from __future__ import annotations

import os
import re

import pytest

from agentjax import methods
from agentjax.methods import Method, get_method, register_method
from agentjax.rl import advantages as adv_lib
from agentjax.train import config as config_lib
from agentjax.train.config import ConfigError
from agentjax.train.updates import advantage_kwargs
from configs import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_estimator_has_one_method_and_the_needs_are_the_papers():
  estimators = {name for name in adv_lib.ADVANTAGE_ESTIMATORS if not name.startswith("test_")}
  assert {m.estimator for m in methods.METHODS.values()} == estimators
  c = base.get_config()
  needs = {name: (m.group, m.outcome_only, m.signals_for(c), m.critic)
           for name, m in methods.METHODS.items() if not name.startswith("test_")}
  outcome = (True, True, (), False)
  ppo = (False, False, ("critic",), True)
  assert needs == {"grpo": outcome, "drgrpo": outcome, "gspo": outcome, "rloo": outcome,
                   "reinforce++": (False, True, (), False),
                   "reinforce++_baseline": outcome,
                   "igpo": (True, False, ("probes",), False),
                   "cw_grpo": (True, False, ("judge",), False),
                   "cw_grpo_ig": (True, False, ("probes", "judge"), False),
                   "a2tgpo": (True, False, ("probes",), False),
                   "ppo": ppo, "ppo_turn": ppo, "ppo_round": ppo,
                   "stepsearch": (False, False, ("critic", "step_rewards"), True)}
  with pytest.raises(KeyError, match="unknown method 'nope'; known"):
    get_method("nope")


def test_settings_are_the_config_sections():
  c = base.get_config()
  std = dict(std_estimator=c.rl.std_estimator, eps=c.rl.std_eps)
  want = {
      "grpo": std, "gspo": std, "drgrpo": {}, "rloo": {},
      "reinforce++": dict(std_estimator=c.rl.std_estimator),
      "reinforce++_baseline": dict(std_estimator=c.rl.std_estimator),
      "igpo": dict(gamma=c.rl.gamma, norm_mode=c.rl.igpo_norm, ig_weight=c.rl.igpo_ig_weight,
                   outcome_weight=c.rl.igpo_outcome_weight, **std),
      "cw_grpo": dict(gamma=c.cw.gamma, inf_threshold=c.cw.inf_threshold,
                      all_zero_fallback=c.cw.all_zero_fallback, **std),
      **{n: dict(gamma=c.ppo.gamma, lam=c.ppo.lam, ig_weight=c.ppo.ig_weight,
                 outcome_weight=c.ppo.outcome_weight, whiten=c.ppo.whiten)
         for n in ("ppo", "ppo_turn", "ppo_round")}}
  for name, kwargs in want.items():
    c.algorithm = name
    assert advantage_kwargs(c) == kwargs, name


def test_signals_follow_the_entry():
  c = base.get_config()
  assert get_method("igpo").run_signals(c) == ("probes",)
  assert get_method("grpo").run_signals(c) == ()
  c.rl.probe_all = True  # the probes' metrics for any method
  assert get_method("grpo").run_signals(c) == ("probes",)
  assert get_method("igpo").run_signals(c) == ("probes",)
  c.rl.probe_all = False
  assert get_method("ppo").run_signals(c) == ("critic",)
  assert "ig" not in get_method("ppo").inputs_for(c)
  c.ppo.ig_weight = 0.5
  assert get_method("ppo").run_signals(c) == ("critic", "probes")
  assert "ig" in get_method("ppo").inputs_for(c)


@pytest.fixture
def scratch_method():
  """Registers methods for one test and removes them after."""
  added = []

  def add(**kw):
    added.append(register_method(Method(**kw)).name)
    return added[-1]

  yield add
  for name in added:
    del methods.METHODS[name]


def test_unmet_needs_fail_at_validation_naming_the_field(scratch_method):
  c = base.get_config()
  c.algorithm = scratch_method(name="test_ig_without_probes", estimator="grpo",
                               inputs=frozenset({"ig", "outcome"}))
  with pytest.raises(ConfigError, match=r"config\.algorithm='test_ig_without_probes'.*the batch "
                     r"field 'ig', which none of its signals \[\] provides"):
    config_lib.validate(c)
  c.algorithm = scratch_method(name="test_judge_fields", estimator="grpo",
                               inputs=frozenset({"retrieval_scores", "outcome"}),
                               signals=("probes",))
  with pytest.raises(ConfigError, match=r"config\.algorithm=.*'retrieval_scores'"):
    config_lib.validate(c)
  c.algorithm = scratch_method(name="test_unknown_signal", estimator="grpo",
                               inputs=frozenset({"outcome"}), signals=("oracle_tea",))
  with pytest.raises(ConfigError, match=r"unknown signal\(s\) \['oracle_tea'\]"):
    config_lib.validate(c)
  c.algorithm = scratch_method(name="test_values_without_critic", estimator="grpo",
                               inputs=frozenset({"outcome", "values"}), signals=("critic",))
  with pytest.raises(ConfigError, match=r"trains a critic"):
    config_lib.validate(c)
  c.algorithm = scratch_method(name="test_group", estimator="grpo", inputs=frozenset({"outcome"}))
  c.rollout.group_size = 1
  with pytest.raises(ConfigError, match=r"config\.rollout\.group_size=1"):
    config_lib.validate(c)
  with pytest.raises(ValueError, match="unknown inputs"):
    register_method(Method(name="test_bad_input", estimator="grpo",
                           inputs=frozenset({"logits"})))
  with pytest.raises(KeyError, match="unknown advantage estimator"):
    register_method(Method(name="test_no_estimator", estimator="nope", inputs=frozenset()))
  with pytest.raises(ValueError, match="already registered"):
    register_method(Method(name="grpo", estimator="grpo", inputs=frozenset()))


def test_the_step_and_validation_never_ask_for_a_method_by_name():
  # A comparison with a name, or membership in a literal list of names (membership in the
  # registry, or in what it derives, is how validation asks).
  pattern = re.compile(r"algorithm\s*(==|!=)\s*['\"]|algorithm\s+(not\s+)?in\s+[(\[{'\"A-Z]")
  hits = []
  for folder in ("agentjax/train", "agentjax/dac", "agentjax/coreact"):
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
      if name.endswith(".py"):
        text = open(os.path.join(ROOT, folder, name)).read()
        hits += [f"{folder}/{name}: {m.group(0)}" for m in pattern.finditer(text)
                 if not text[m.end() - 1:].startswith("METHODS")]
  assert hits == []


@pytest.mark.parametrize("cw_gamma,fallback", [(100.0, "zero"), (100.0, "uniform"), (2.0, "zero")])
def test_ig_turn_rewards_times_cw_weights_against_numpy(cw_gamma, fallback):
  """cw_grpo_ig: IGPO's turn advantages (IG turn rewards + outcome, group-normalized, discounted)
  times CW-GRPO's round multipliers (K * w_k on the non-answer rounds of a trajectory whose GRPO
  advantage is positive, 1 elsewhere), per token; NumPy loops from tests/test_rl_advantages'
  references, on its judged batch (an all-correct group, K = 0 rows, all-zero contributions)."""
  import jax.numpy as jnp
  import numpy as np
  from tests.test_rl_advantages import make_cw_batch, ref_cw_grpo_ig
  d = make_cw_batch(3)
  rng = np.random.default_rng(5)
  b, num_t = d["retrieval_scores"].shape
  d["ig"] = rng.normal(size=(b, num_t)).astype(np.float32)
  d["ig"][0, :] = d["ig"][1, 0]  # ties
  gamma = 0.9
  fn = adv_lib.get_advantage_estimator("cw_grpo_ig")
  adv, stats = fn(**{k: jnp.asarray(v) for k, v in d.items()}, gamma=gamma, cw_gamma=cw_gamma,
                  cw_all_zero_fallback=fallback)
  want, fired = ref_cw_grpo_ig(d, gamma, cw_gamma, fallback)
  np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-5, atol=1e-5)
  assert float(stats["cw_fallback_count"]) == fired  # where cw.all_zero_fallback decided
  assert np.isfinite(float(stats["collapse_fraction"]))
  # The composition is a registered method: probes and the judge, IGPO's and CW's settings.
  c = base.get_config()
  c.algorithm = "cw_grpo_ig"
  m = get_method("cw_grpo_ig")
  assert m.run_signals(c) == ("probes", "judge") and not m.critic
  assert {"ig", "retrieval_scores"} <= m.inputs_for(c)
