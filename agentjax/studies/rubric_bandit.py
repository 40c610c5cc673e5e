"""List-wise vs pairwise vs top-1 without language generation: a categorical policy over fixed
rubrics, trained on each rank reward (`python launch/coreact_study.py
--stage=categorical`).

    tables = reward_tables(rubrics, rows, settings, applier)       # once per branch file
    theta, curve = train_bandit(tables["train"], "listwise", BanditSettings(seed=0))
    scores = evaluate_bandit(theta, tables["dev"])                 # the greedy rubric per phase

The rubric generator's GRPO compares the three rank rewards through a language model, whose own
difficulties (format, repetition, a small vocabulary of criteria to learn to write) blur which
reward teaches ranking better. Here the policy is a table: for each phase (the branch point's
step, the last phase holding every later step) a softmax over R fixed rubrics (the study's
context-free references: every 3-criterion subset of the executor's vocabulary, equal weights),
so only the reward differs between arms.

A training step draws `rows` train branch points (uniformly, with replacement), `group` rubrics
per row from the row's phase's softmax, scores each with the rubric generator's own reward
(RubricRewards with coreact.rank_reward = the arm's: 0.75 s_rank + 0.15 s_atom + 0.10 s_fmt, the
last two equal for every fixed rubric), z-scores the rewards within each row's group (GRPO,
std + 1e-6; an all-equal group gives 0) and takes one step theta += lr * sum over samples of
A * d log pi / d theta / (rows * group). Evaluation: the arg-max rubric of each phase on the dev
rows, scored by what the generator's eval reports (list-wise Spearman, a nan counted 0; pairwise
accuracy; top-1 match), beside the best single fixed rubric and the best per phase on dev (the
ceilings of this policy class). Everything is NumPy over precomputed [R, N] tables: seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from agentjax.coreact import RANK_REWARDS

EVAL_KEYS = ("spearman", "pairwise", "top1")


@dataclasses.dataclass(frozen=True)
class BanditSettings:
  """The policy-gradient settings (the same for every reward arm)."""
  steps: int = 200
  rows: int = 8          # branch points per step
  group: int = 8         # rubrics sampled per branch point (the generator's rollout.group_size)
  lr: float = 0.5
  phases: int = 4        # steps 0, 1, 2 and >= 3
  seed: int = 0

  def __post_init__(self):
    for name in ("steps", "rows", "group", "phases"):
      if getattr(self, name) < 1:
        raise ValueError(f"BanditSettings.{name} must be >= 1, got {getattr(self, name)}")
    if not self.lr > 0:
      raise ValueError(f"BanditSettings.lr must be > 0, got {self.lr}")


def phase_of(row: Mapping[str, Any], phases: int) -> int:
  """A branch row's phase: its step (turns taken), the last phase for every later step."""
  return min(len(row.get("turns") or ()), phases - 1)


def reward_tables(rubrics: Sequence[str], rows: Sequence[Mapping[str, Any]], settings: Any,
                  applier: Any) -> dict[str, np.ndarray]:
  """Every rubric scored on every row: {"reward_<arm>": [R, N] the generator's reward with
  rank_reward = arm, for each of RANK_REWARDS; "spearman" / "pairwise" / "top1": [R, N] the
  eval's agreement (coreact.task.rubric_agreement's per-row values); "phase": [N] int, the
  row's step}.

  settings: a coreact.rubric.RewardSettings (its rank_reward is replaced per arm); applier: the
  rubric applier (executor), one call per rubric over all rows, shared by the arms."""
  from agentjax.coreact.rubric import rubric_reward
  from agentjax.coreact.task import RubricRewards
  from agentjax.rl import ranking
  out = {f"reward_{arm}": np.zeros((len(rubrics), len(rows))) for arm in RANK_REWARDS}
  for k in EVAL_KEYS:
    out[k] = np.zeros((len(rubrics), len(rows)))
  per_arm = {arm: dataclasses.replace(settings, rank_reward=arm) for arm in RANK_REWARDS}
  rewards = RubricRewards(applier, per_arm["listwise"])
  for r, text in enumerate(rubrics):
    scores, applied = rewards.score([text] * len(rows), rows)  # one applier call per rubric
    for arm, arm_settings in per_arm.items():
      out[f"reward_{arm}"][r] = [
          rubric_reward(text, row["expert_ranking"], a, arm_settings).reward
          for a, row in zip(applied, rows)]
    for n, (s, a, row) in enumerate(zip(scores, applied, rows)):
      if a is None or s.repetitive:
        continue  # no induced ranking: no agreement (0), as rubric_agreement counts it
      pred = np.asarray(a.ranking, np.float32)
      expert = np.asarray(row["expert_ranking"], np.float32)
      out["spearman"][r, n] = 0.0 if np.isnan(s.rho) else s.rho
      out["pairwise"][r, n] = float(np.nan_to_num(
          ranking.pairwise_accuracy(pred, expert, 0.5), nan=0.5))
      out["top1"][r, n] = float(ranking.top1_match(pred, expert))
  out["phase"] = np.asarray([phase_of(row, 1 << 30) for row in rows], np.int64)
  return out


def _softmax(x: np.ndarray) -> np.ndarray:
  z = np.exp(x - x.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def train_bandit(table: Mapping[str, np.ndarray], arm: str, s: BanditSettings
                 ) -> tuple[np.ndarray, list[dict[str, float]]]:
  """The policy trained on the train table's rows with reward arm `arm` (module docstring).

  Returns:
    (theta [phases, R], curve: per step {"reward": mean sampled reward, "entropy": mean policy
    entropy over phases}).
  """
  if arm not in RANK_REWARDS:
    raise ValueError(f"unknown rank reward {arm!r}; known: {list(RANK_REWARDS)}")
  reward = np.asarray(table[f"reward_{arm}"], np.float64)                     # [R, N]
  phase = np.minimum(np.asarray(table["phase"]), s.phases - 1)                # [N]
  num_rubrics, num_rows = reward.shape
  rng = np.random.default_rng(s.seed)
  theta = np.zeros((s.phases, num_rubrics))
  curve = []
  for _ in range(s.steps):
    rows = rng.integers(0, num_rows, s.rows)
    probs = _softmax(theta[phase[rows]])                                      # [rows, R]
    picks = np.stack([rng.choice(num_rubrics, s.group, p=p) for p in probs])  # [rows, G]
    r = reward[picks, rows[:, None]]                                          # [rows, G]
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
    # d log softmax_k / d theta = onehot(k) - p, summed over each row's samples, then per phase.
    row_grad = -adv.sum(1, keepdims=True) * probs                             # [rows, R]
    np.add.at(row_grad, (np.arange(s.rows)[:, None], picks), adv)
    grad = np.zeros_like(theta)
    np.add.at(grad, phase[rows], row_grad)
    theta += s.lr * grad / (s.rows * s.group)
    p = _softmax(theta)
    curve.append({"reward": float(r.mean()),
                  "entropy": float(-(p * np.log(p + 1e-12)).sum(-1).mean())})
  return theta, curve


def evaluate_bandit(theta: np.ndarray, table: Mapping[str, np.ndarray]) -> dict[str, float]:
  """The greedy policy (arg-max rubric of each row's phase) on the table's rows: the mean of
  EVAL_KEYS over rows."""
  phase = np.minimum(np.asarray(table["phase"]), theta.shape[0] - 1)
  picks = np.argmax(theta, axis=1)[phase]
  cols = np.arange(len(phase))
  return {k: float(np.asarray(table[k])[picks, cols].mean()) for k in EVAL_KEYS}


def ceilings(table: Mapping[str, np.ndarray], phases: int) -> dict[str, float]:
  """What the policy class can reach on these rows, by list-wise Spearman: the best single
  rubric, and the best rubric of each phase (chosen on these rows: an upper bound)."""
  spearman = np.asarray(table["spearman"])
  phase = np.minimum(np.asarray(table["phase"]), phases - 1)
  per_phase = sum(spearman[:, phase == p].sum(1).max() for p in np.unique(phase))
  return {"best_fixed": float(spearman.mean(1).max()),
          "best_per_phase": float(per_phase / spearman.shape[1])}


def bandit_study(train: Mapping[str, np.ndarray], dev: Mapping[str, np.ndarray],
                 seeds: Sequence[int], s: BanditSettings) -> dict[str, Any]:
  """Every arm of RANK_REWARDS trained with each seed (same settings, same draws of rows per
  seed), evaluated on dev: {"settings", "ceilings_dev", "arms": {arm: {"per_seed": [dev scores],
  "mean": {key: (mean, sample std)}, "train_reward_last": ...}}, "paired": {arm: Spearman minus
  listwise's, per seed}}."""
  out: dict[str, Any] = {"settings": dataclasses.asdict(s), "seeds": list(seeds),
                         "ceilings_dev": ceilings(dev, s.phases), "arms": {}}
  for arm in RANK_REWARDS:
    per_seed = []
    for seed in seeds:
      theta, curve = train_bandit(train, arm, dataclasses.replace(s, seed=int(seed)))
      per_seed.append({**evaluate_bandit(theta, dev),
                       "train_reward_last": float(np.mean([c["reward"] for c in curve[-10:]])),
                       "entropy_last": curve[-1]["entropy"]})
    out["arms"][arm] = {"per_seed": per_seed, "mean": {
        k: (float(np.mean([p[k] for p in per_seed])),
            float(np.std([p[k] for p in per_seed], ddof=1)) if len(per_seed) > 1 else 0.0)
        for k in EVAL_KEYS}}
  base = [p["spearman"] for p in out["arms"]["listwise"]["per_seed"]]
  out["paired"] = {arm: [p["spearman"] - b for p, b in zip(out["arms"][arm]["per_seed"], base)]
                   for arm in RANK_REWARDS if arm != "listwise"}
  return out


__all__ = ["BanditSettings", "EVAL_KEYS", "bandit_study", "ceilings", "evaluate_bandit",
           "phase_of", "reward_tables", "train_bandit"]
