"""agentjax/studies/rubric_bandit.py: the categorical policy over fixed rubrics (list-wise vs
pairwise vs top-1 without language generation): its tables against the generator's own reward
and eval, its policy-gradient step against a finite-difference gradient, and its convergence."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agentjax.studies import rubric_bandit as rb
from tests.test_coreact_task import _synthworld_branches


def _with_steps(rows):
  """Half of the rows one step later (a search turn before them): two phases."""
  out = []
  for i, row in enumerate(rows):
    row = dict(row)
    if i % 2:
      subject = row["question"]["chain"][0]
      row["turns"] = [{"text": f"<search> {subject} </search>",
                       "action": {"kind": "search", "content": subject},
                       "documents": [{"id": "0", "contents": f'"{subject}"\n{subject} is.'}],
                       "observation": "", "search_error": None, "hook_text": ""}]
    out.append(row)
  return out


def test_tables_are_the_generators_reward_and_eval(world_dir):
  """Each rubric's row of the tables: its rewards under each rank reward are RubricRewards'
  (the generator's GRPO reward), and its mean Spearman, pairwise accuracy and top-1 match are
  what the generator's eval (rubric_agreement) reports for that rubric on the rows."""
  from agentjax.coreact import RANK_REWARDS
  from agentjax.coreact.appliers import ExecutorApplier
  from agentjax.coreact.executor import CRITERION_PHRASES
  from agentjax.coreact.rubric import RewardSettings
  from agentjax.coreact.task import RubricRewards, rubric_agreement
  from agentjax.studies.coreact import fixed_rubrics
  rows = _with_steps(_synthworld_branches(world_dir, "train", 6))
  applier = ExecutorApplier.from_path(os.path.join(world_dir, "entities.jsonl"))
  rubrics = fixed_rubrics(CRITERION_PHRASES)[:12]
  tables = rb.reward_tables(rubrics, rows, RewardSettings(), applier)
  assert tables["phase"].tolist() == [0, 1] * 3
  for arm in RANK_REWARDS:
    rewards = RubricRewards(applier, RewardSettings(rank_reward=arm))
    for r, text in enumerate(rubrics):
      want = [s.reward for s in rewards.score([text] * len(rows), rows)[0]]
      np.testing.assert_allclose(tables[f"reward_{arm}"][r], want)
  rewards = RubricRewards(applier, RewardSettings())
  for r, text in enumerate(rubrics):
    got, _ = rubric_agreement([text] * len(rows), rows, rewards)
    for k in rb.EVAL_KEYS:
      assert tables[k][r].mean() == pytest.approx(got[k]), (text, k)
  assert len({tuple(t) for t in tables["spearman"]}) > 1  # the rubrics rank differently


def test_one_step_is_the_policy_gradient_of_the_sampled_surrogate():
  """From theta = 0 one step moves theta by lr times the gradient of the surrogate
  mean(A * log pi(sampled rubric)), computed here by finite differences with the same draws and
  GRPO advantages (z-scored per row's group; an all-equal group contributes nothing)."""
  rng = np.random.default_rng(0)
  num_rubrics, num_rows = 5, 7
  table = {"reward_listwise": rng.random((num_rubrics, num_rows)),
           "phase": np.array([0, 1, 2, 0, 1, 5, 0])}
  table["reward_listwise"][:, 3] = 0.5  # an all-equal row
  s = rb.BanditSettings(steps=1, rows=4, group=6, lr=0.7, phases=3, seed=11)
  theta, curve = rb.train_bandit(table, "listwise", s)
  draw = np.random.default_rng(s.seed)  # the same draws: uniform probabilities at theta = 0
  rows = draw.integers(0, num_rows, s.rows)
  picks = np.stack([draw.choice(num_rubrics, s.group, p=np.full(num_rubrics, 1 / num_rubrics))
                    for _ in rows])
  r = table["reward_listwise"][picks, rows[:, None]]
  adv = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
  phase = np.minimum(table["phase"], s.phases - 1)

  def surrogate(t):
    logits = t[phase[rows]]
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float((adv * np.take_along_axis(logp, picks, 1)).sum() / (s.rows * s.group))

  grad, eps = np.zeros((s.phases, num_rubrics)), 1e-6
  for idx in np.ndindex(grad.shape):
    up, down = np.zeros_like(grad), np.zeros_like(grad)
    up[idx], down[idx] = eps, -eps
    grad[idx] = (surrogate(up) - surrogate(down)) / (2 * eps)
  np.testing.assert_allclose(theta, s.lr * grad, atol=1e-7)
  assert curve[0]["reward"] == pytest.approx(r.mean())


def test_training_finds_each_phases_best_rubric_and_the_study_pairs_seeds():
  """A table where rubric 2 is best in phase 0 and rubric 4 in phase 1: the list-wise arm's
  greedy rubric per phase is that one, the dev scores are the table's at those rubrics, and the
  ceilings are the brute-force best."""
  num_rubrics, n = 6, 40
  rng = np.random.default_rng(3)
  phase = np.arange(n) % 2
  base = rng.random((num_rubrics, n)) * 0.2
  base[2, phase == 0] += 0.6
  base[4, phase == 1] += 0.6
  table = {f"reward_{a}": base for a in ("listwise", "pairwise", "top1")}
  table.update(spearman=base, pairwise=base / 2, top1=(base > 0.5).astype(float), phase=phase)
  s = rb.BanditSettings(steps=150, rows=8, group=8, lr=1.0, phases=2, seed=0)
  theta, _ = rb.train_bandit(table, "listwise", s)
  assert np.argmax(theta, 1).tolist() == [2, 4]
  got = rb.evaluate_bandit(theta, table)
  best = np.where(phase == 0, 2, 4)
  assert got["spearman"] == pytest.approx(base[best, np.arange(n)].mean())
  assert got["top1"] == pytest.approx((base[best, np.arange(n)] > 0.5).mean())
  ceil = rb.ceilings(table, 2)
  assert ceil["best_fixed"] == pytest.approx(base.mean(1).max())
  assert ceil["best_per_phase"] == pytest.approx(base[best, np.arange(n)].mean())
  study = rb.bandit_study(table, table, [0, 1, 2], rb.BanditSettings(steps=60, phases=2))
  assert set(study["arms"]) == {"listwise", "pairwise", "top1"}
  assert len(study["paired"]["top1"]) == 3
  for arm, res in study["arms"].items():
    spear = [p["spearman"] for p in res["per_seed"]]
    assert res["mean"]["spearman"][0] == pytest.approx(np.mean(spear))
  with pytest.raises(ValueError, match="rank reward"):
    rb.train_bandit(table, "ndcg", s)
  with pytest.raises(ValueError, match="group"):
    rb.BanditSettings(group=0)
