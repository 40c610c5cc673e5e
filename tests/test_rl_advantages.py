"""Tests of agentjax.rl.advantages against plain-loop NumPy references written here.

Every jnp kernel runs with and without jit (chex variants). Batches are random multi-turn layouts
(prompt, per-turn sampled tokens and observations, padding) with non-contiguous group ids.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from agentjax.rl import advantages as adv_lib
from agentjax.train import updates as rl_lib

SEEDS = (0, 1, 2)

# ---------------------------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------------------------


def make_layout(rng, num_turns, length):
  """turn_id [B, L] and loss_mask [B, L] for trajectories with the given turn counts.

  Layout of a row: prompt (turn -1, mask 0), then per turn k its sampled tokens (turn k, mask 1)
  and, except for the last turn, an observation (turn k, mask 0); then padding (turn -1, mask 0).
  """
  b = len(num_turns)
  turn_id = np.full((b, length), -1, np.int32)
  mask = np.zeros((b, length), np.float32)
  for i in range(b):
    pos = int(rng.integers(1, 4))
    for k in range(num_turns[i]):
      n_gen = int(rng.integers(1, 4))
      turn_id[i, pos:pos + n_gen] = k
      mask[i, pos:pos + n_gen] = 1.0
      pos += n_gen
      if k < num_turns[i] - 1:
        n_obs = int(rng.integers(0, 3))
        turn_id[i, pos:pos + n_obs] = k
        pos += n_obs
    assert pos <= length
  return turn_id, mask


def make_batch(seed, b=10, num_t=4, length=26):
  rng = np.random.default_rng(seed)
  # Non-contiguous, arbitrary group ids, group sizes 1..4.
  ids = np.array([7, 3, 7, 100, 3, 7, 42, 100, 3, 7][:b], np.int32)
  ids = ids[rng.permutation(b)]
  num_turns = rng.integers(1, num_t + 1, size=b).astype(np.int32)
  turn_id, mask = make_layout(rng, num_turns, length)
  # Outcome rewards with ties (F1-like values), IG values continuous.
  outcome = rng.choice(np.array([0.0, 0.5, 1.0, -2.0, 0.25], np.float32), size=b)
  ig = rng.normal(size=(b, num_t)).astype(np.float32)
  ig[np.arange(num_t)[None, :] >= num_turns[:, None] - 1] = 1e3  # ignored entries: garbage
  return dict(outcome=outcome, group_ids=ids, num_turns=num_turns, turn_id=turn_id,
              loss_mask=mask, ig=ig)


# ---------------------------------------------------------------------------------------------
# NumPy references (loops).
# ---------------------------------------------------------------------------------------------


def members(group_ids, i):
  return [j for j in range(len(group_ids)) if group_ids[j] == group_ids[i]]


def ref_zscore(x, pool, std_estimator="population", eps=1e-6):
  """(x - mean(pool)) / std(pool) with the std form of `std_estimator`; 0 for a pool of one."""
  pool = np.asarray(pool, np.float64)
  if len(pool) == 1:
    return 0.0
  if std_estimator == "sqrt_var_eps":
    denom = np.sqrt(np.var(pool) + eps)
  else:
    denom = np.std(pool, ddof=1 if std_estimator == "unbiased" else 0) + eps
  return (x - pool.mean()) / denom


def ref_grpo(outcome, group_ids, scale, eps=1e-6, std_estimator="population"):
  out = np.zeros(len(outcome))
  for i in range(len(outcome)):
    vals = np.array([outcome[j] for j in members(group_ids, i)], np.float64)
    out[i] = (ref_zscore(outcome[i], vals, std_estimator, eps) if scale
              else outcome[i] - vals.mean())
  return out


def ref_rloo(outcome, group_ids):
  out = np.zeros(len(outcome))
  for i in range(len(outcome)):
    others = [outcome[j] for j in members(group_ids, i) if j != i]
    out[i] = outcome[i] - np.mean(others) if others else 0.0
  return out


def ref_tokens_from_traj(per_traj, mask):
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for l in range(mask.shape[1]):
      if mask[i, l]:
        out[i, l] = per_traj[i]
  return out


def ref_tokens_from_turns(turn_adv, turn_id, mask):
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for l in range(mask.shape[1]):
      if mask[i, l] and 0 <= turn_id[i, l] < turn_adv.shape[1]:
        out[i, l] = turn_adv[i, turn_id[i, l]]
  return out


def ref_reinforce(outcome, group_ids, mask, subtract, eps=1e-8, ddof=0):
  base = ref_grpo(outcome, group_ids, scale=False) if subtract else np.array(outcome, np.float64)
  toks = [base[i] for i in range(mask.shape[0]) for l in range(mask.shape[1]) if mask[i, l]]
  mean, var = np.mean(toks), np.var(toks, ddof=ddof)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for l in range(mask.shape[1]):
      if mask[i, l]:
        out[i, l] = (base[i] - mean) / np.sqrt(var + eps)
  return out


def ref_ppo(d, mode, gamma=1.0, lam=1.0, ig_weight=0.0, outcome_weight=1.0, whiten=True):
  """NumPy loops for the critic estimators. mode: "token" (verl's gae with observation tokens
  skipped), "round" (verl's gae-round: the recursion reset at every non-sampled slot), "turn"
  (one step per turn, its value at the turn's first sampled token). Returns (adv, returns,
  value_mask), all [B, L]. ("round" also resets where a turn follows another with no
  observation slot between them, which verl's mask-only loop would merge: our rollouts always
  have one, this layout sometimes not.)"""
  m, tid, nt, v = d["loss_mask"].astype(bool), d["turn_id"], d["num_turns"], d["values"]
  b, length = m.shape
  rewards = np.zeros((b, length))
  turn_r = {}  # (row, step turn) -> its reward, a cut-off turn's added to the previous step's
  for i in range(b):
    prev = None  # the last turn so far with a sampled token
    for k in range(nt[i]):
      r = outcome_weight * d["outcome"][i] if k == nt[i] - 1 else ig_weight * d["ig"][i, k]
      slots = [l for l in range(length) if m[i, l] and tid[i, l] == k]
      if slots:
        prev = k
        turn_r[i, k] = r
      elif prev is not None:  # no action in this turn: the previous action gets its reward
        turn_r[i, prev] += r
    for k in range(nt[i]):
      slots = [l for l in range(length) if m[i, l] and tid[i, l] == k]
      if slots:
        rewards[i, slots[-1]] = turn_r[i, k]
  adv, ret, vmask = np.zeros((b, length)), np.zeros((b, length)), np.zeros((b, length), bool)
  for i in range(b):
    if mode in ("token", "round"):
      next_v = last = 0.0
      after = None  # the turn of the next sampled slot
      for l in reversed(range(length)):  # verl's loop over every slot, masks as weights
        if mode == "round" and m[i, l] and after is not None and after != tid[i, l]:
          next_v = last = 0.0
        after = tid[i, l] if m[i, l] else after
        delta = rewards[i, l] + gamma * next_v - v[i, l]
        a = delta + gamma * lam * last
        if mode == "token":
          next_v = v[i, l] if m[i, l] else next_v
          last = a if m[i, l] else last
        else:
          next_v, last = (v[i, l], a) if m[i, l] else (0.0, 0.0)
        if m[i, l]:
          adv[i, l], ret[i, l], vmask[i, l] = a, a + v[i, l], True
    else:
      steps = []  # (turn, first slot)
      for k in range(nt[i]):
        slots = [l for l in range(length) if m[i, l] and tid[i, l] == k]
        if slots:
          steps.append((k, slots[0]))
      next_v = last = 0.0
      turn_adv = {}
      for k, first in reversed(steps):
        delta = turn_r[i, k] + gamma * next_v - v[i, first]
        last = delta + gamma * lam * last
        next_v = v[i, first]
        turn_adv[k] = last
        ret[i, first], vmask[i, first] = last + v[i, first], True
      for l in range(length):
        if m[i, l] and tid[i, l] in turn_adv:
          adv[i, l] = turn_adv[tid[i, l]]
  if whiten:
    toks = adv[m]
    adv = np.where(m, (adv - toks.mean()) / np.sqrt(toks.var(ddof=1) + 1e-8), 0.0)
  return adv, ret, vmask


def ref_igpo_turns(ig, outcome, num_turns, group_ids, gamma, mode, eps=1e-6, w_ig=1.0, w_out=1.0,
                   std_estimator="population"):
  b, num_t = ig.shape
  r = np.zeros((b, num_t))
  for i in range(b):
    for k in range(num_turns[i]):
      r[i, k] = w_out * outcome[i] if k == num_turns[i] - 1 else w_ig * ig[i, k]
  z = np.zeros((b, num_t))
  for i in range(b):
    mem = members(group_ids, i)
    for k in range(num_turns[i]):
      if mode == "joint":
        pool = [r[j, kk] for j in mem for kk in range(num_turns[j])]
      elif k == num_turns[i] - 1:
        pool = [w_out * outcome[j] for j in mem]
      else:
        pool = [r[j, kk] for j in mem for kk in range(num_turns[j] - 1)]
      z[i, k] = ref_zscore(r[i, k], pool, std_estimator, eps)
  out = np.zeros((b, num_t))
  for i in range(b):
    acc = 0.0
    for k in reversed(range(num_turns[i])):
      acc = z[i, k] + gamma * acc
      out[i, k] = acc
  return out


def ref_cw_weights(a, c, big_k, gamma, fallback, inf_threshold=10.0):
  """The CW-GRPO code's weights of one trajectory (verl compute_cw_grpo_advantage, CW-GRPO
  branch), a plain loop: c holds the K + 1 judged rounds' contributions, the answer round's last.
  """
  if a < 0:  # a wrong answer: contributions ignored, uniform weights
    return [1.0 / big_k] * big_k
  if gamma >= inf_threshold:  # "treat large gamma as infinity": the sum counts the answer round
    total = 0.0
    for x in c:
      total += x
    w = [c[k] / max(total, 1e-6) for k in range(big_k)]
    if fallback == "uniform" and all(c[k] == 0 for k in range(big_k)):
      w = [1.0 / big_k] * big_k
    return w
  top = max(c[:big_k])
  e = [math.exp(gamma * (c[k] - top)) for k in range(big_k)]
  return [x / sum(e) for x in e]


def ref_cw_turns(a, ret, think, num_turns, gamma, fallback):
  """[B, T] round advantages: A * K * w_k on non-answer rounds, A on the answer round."""
  b, num_t = ret.shape
  out = np.zeros((b, num_t))
  for i in range(b):
    big_k = int(num_turns[i]) - 1
    out[i, big_k] = a[i]
    if big_k == 0:
      continue
    c = [float(ret[i, k]) * float(think[i, k]) for k in range(big_k + 1)]
    w = ref_cw_weights(float(a[i]), c, big_k, gamma, fallback)
    for k in range(big_k):
      out[i, k] = a[i] * big_k * w[k]
  return out


def ref_cw_grpo(d, gamma, fallback, std_estimator="population", eps=1e-6):
  """The cw_grpo estimator from scratch, as the code does it sample by sample: the GRPO advantage,
  then per trajectory its weights and token advantages. Also the fallback / judged counts.

  Returns:
    adv [B, L], fallback count, judged-positive count.
  """
  o, g, ret, think = d["outcome"], d["group_ids"], d["retrieval_scores"], d["thinking_scores"]
  a = ref_grpo(o, g, scale=True, eps=eps, std_estimator=std_estimator)
  adv = np.zeros(d["loss_mask"].shape)
  fired = judged = 0
  for i in range(len(o)):
    big_k = int(d["num_turns"][i]) - 1
    c = [float(ret[i, k]) * float(think[i, k]) for k in range(big_k + 1)]
    w = ref_cw_weights(a[i], c, big_k, gamma, fallback) if big_k > 0 else []
    if a[i] > 0 and big_k > 0:
      judged += 1
      fired += gamma >= 10.0 and not any(c[:big_k])
    for l in range(adv.shape[1]):
      k = int(d["turn_id"][i, l])
      if not d["loss_mask"][i, l] or k < 0:
        continue  # prompt, observations, padding
      adv[i, l] = a[i] if k == big_k else a[i] * big_k * w[k]
  return adv, fired, judged


def ref_cw_grpo_ig(d, gamma=1.0, cw_gamma=100.0, fallback="zero", std_estimator="population",
                   eps=1e-6, norm_mode="joint"):
  """cw_grpo_ig (agentjax/methods/cw_grpo.py) from scratch: IGPO's turn advantages times CW-GRPO's
  round multipliers (K * w_k on the non-answer rounds of a row with a positive GRPO advantage,
  1 elsewhere), per token. Returns (adv [B, L], fallback count)."""
  std = dict(std_estimator=std_estimator, eps=eps)
  a = ref_grpo(d["outcome"], d["group_ids"], scale=True, **std)
  turns = ref_igpo_turns(d["ig"], d["outcome"], d["num_turns"], d["group_ids"], gamma,
                         norm_mode, **std)
  want = np.zeros(d["loss_mask"].shape)
  fired = 0
  for i in range(len(a)):
    big_k = int(d["num_turns"][i]) - 1
    mult = [1.0] * (big_k + 1)
    if a[i] > 0 and big_k > 0:
      c = [float(d["retrieval_scores"][i, k] * d["thinking_scores"][i, k])
           for k in range(big_k + 1)]
      mult[:big_k] = [big_k * x for x in ref_cw_weights(a[i], c, big_k, cw_gamma, fallback)]
      fired += cw_gamma >= 10.0 and not any(c[:big_k])
    for l in range(want.shape[1]):
      k = int(d["turn_id"][i, l])
      if d["loss_mask"][i, l] and 0 <= k <= big_k:
        want[i, l] = turns[i, k] * mult[k]
  return want, fired


def make_cw_batch(seed, num_t=4, length=26):
  """A judged batch: EM outcomes in 4 non-contiguous groups (one all-correct: advantage 0),
  num_turns 1..num_t, binary verdicts (1 past each row's answer round too: must be ignored), and
  rows pinned to the edge cases: correct rows whose non-answer contributions are all 0 (answer
  round c = 1 and c = 0), a correct row whose answer round c = 1 joins the infinite branch's sum,
  K = 0 with A > 0 and A < 0, a wrong row with contributions."""
  rng = np.random.default_rng(seed)
  ids = np.array([7] * 4 + [3] * 4 + [100] * 3 + [42] * 3, np.int32)
  outcome = np.array([1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1], np.float32)
  b = len(ids)
  num_turns = rng.integers(1, num_t + 1, size=b).astype(np.int32)
  num_turns[[0, 1, 3, 4, 8]] = rng.integers(2, num_t + 1, size=5)
  num_turns[[9, 2]] = 1                      # K = 0: correct (A > 0) and wrong (A < 0)
  ret = (rng.uniform(size=(b, num_t)) < 0.6).astype(np.float32)
  think = (rng.uniform(size=(b, num_t)) < 0.7).astype(np.float32)
  past = np.arange(num_t)[None, :] >= num_turns[:, None]
  ret[past] = think[past] = 1.0
  for i, answer_c in ((0, 1.0), (1, 0.0)):   # all non-answer c = 0 (the fallback fires)
    k = num_turns[i] - 1
    ret[i, :k] = 0.0
    ret[i, k] = think[i, k] = answer_c
  k = num_turns[4] - 1                       # answer round c = 1 next to a contributing round
  ret[4, :k + 1] = think[4, :k + 1] = 0.0
  ret[4, [0, k]] = think[4, [0, k]] = 1.0
  ret[3, 0] = think[3, 0] = 1.0              # a wrong row with a contribution
  ret[8, 0] = think[8, 0] = 1.0              # a correct row with a contribution
  order = rng.permutation(b)
  num_turns = num_turns[order]
  turn_id, mask = make_layout(rng, num_turns, length)
  return dict(outcome=outcome[order], group_ids=ids[order], num_turns=num_turns,
              turn_id=turn_id, loss_mask=mask, retrieval_scores=ret[order],
              thinking_scores=think[order])


def ref_collapse(outcome, group_ids, tol=1e-6):
  groups = {}
  for r, g in zip(outcome, group_ids):
    groups.setdefault(int(g), []).append(r)
  return np.mean([max(v) - min(v) <= tol for v in groups.values()])


def ref_zero_adv(adv, group_ids, mask, tol=1e-6):
  groups = {}
  for i, g in enumerate(group_ids):
    live = np.abs(np.asarray(adv[i], np.float64))[np.asarray(mask[i]) > 0]
    groups.setdefault(int(g), []).append(live.max() if live.size else 0.0)
  return np.mean([max(v) <= tol for v in groups.values()])


def assert_close(x, y, **kw):
  np.testing.assert_allclose(np.asarray(x, np.float64), y, **{"rtol": 1e-4, "atol": 1e-5, **kw})


# ---------------------------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------------------------


class OutcomeEstimatorsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("grpo", "gspo", "drgrpo")
  def test_grpo_family_random(self, name):
    fn = self.variant(adv_lib.get_advantage_estimator(name))
    for seed in SEEDS:
      d = make_batch(seed)
      adv, stats = fn(outcome=d["outcome"], group_ids=d["group_ids"], loss_mask=d["loss_mask"],
                      ig=d["ig"], turn_id=d["turn_id"])  # unused batch fields are dropped
      want = ref_grpo(d["outcome"], d["group_ids"], scale=name != "drgrpo")
      assert_close(adv, ref_tokens_from_traj(want, d["loss_mask"]))
      assert_close(stats["collapse_fraction"], ref_collapse(d["outcome"], d["group_ids"]))
      # Outcome-only: the groups with all-zero advantages are the collapsed ones.
      assert_close(stats["zero_adv_fraction"], ref_collapse(d["outcome"], d["group_ids"]))
      assert_close(stats["reward_mean"], np.mean(d["outcome"]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo_random(self):
    fn = self.variant(adv_lib.rloo_advantages)
    for seed in SEEDS:
      d = make_batch(seed)
      adv, _ = fn(d["outcome"], d["group_ids"], d["loss_mask"])
      want = ref_rloo(d["outcome"], d["group_ids"])
      assert_close(adv, ref_tokens_from_traj(want, d["loss_mask"]))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(False, True)
  def test_reinforce_pp_random(self, subtract):
    fn = self.variant(functools.partial(adv_lib.reinforce_pp_advantages,
                                        subtract_group_mean=subtract))
    for seed in SEEDS:
      d = make_batch(seed)
      adv, stats = fn(d["outcome"], d["group_ids"], d["loss_mask"])
      assert_close(adv, ref_reinforce(d["outcome"], d["group_ids"], d["loss_mask"], subtract))
      # Whitened over sampled tokens.
      assert_close(stats["adv_mean"], 0.0, atol=1e-5)
      assert_close(stats["adv_std"], 1.0, atol=1e-4)
    baseline = adv_lib.get_advantage_estimator("reinforce++_baseline")
    d = make_batch(0)
    if subtract:
      assert_close(baseline(outcome=d["outcome"], group_ids=d["group_ids"],
                            loss_mask=d["loss_mask"])[0],
                   ref_reinforce(d["outcome"], d["group_ids"], d["loss_mask"], True))

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_equal_groups_and_singletons(self):
    # Groups 5 (all 1.0) and 9 (all 0.0) collapse, group 2 does not, group 8 is a singleton.
    outcome = np.array([1.0, 0.0, 1.0, 0.3, 0.0, 0.7, 1.0, 0.5], np.float32)
    group_ids = np.array([5, 9, 5, 2, 9, 2, 5, 8], np.int32)
    mask = np.ones((8, 3), np.float32)
    mask[:, 0] = 0.0
    collapsed = np.array([1, 1, 1, 0, 1, 0, 1, 1], bool)
    for name in ("grpo", "drgrpo", "rloo"):
      fn = self.variant(adv_lib.get_advantage_estimator(name))
      adv, stats = fn(outcome=outcome, group_ids=group_ids, loss_mask=mask)
      adv = np.asarray(adv)
      np.testing.assert_array_equal(adv[collapsed], 0.0)
      assert np.all(adv[~collapsed][:, 1:] != 0.0) and np.all(adv[:, 0] == 0.0)
      assert_close(stats["collapse_fraction"], 3 / 4)
    frac = self.variant(adv_lib.advantage_collapse_fraction)(outcome, group_ids)
    assert_close(frac, 0.75)
    # GRPO: the zero-advantage groups are exactly the collapsed ones. IGPO: a collapsed group
    # whose searches gained differently still has (IG) advantages.
    adv, stats = self.variant(adv_lib.get_advantage_estimator("grpo"))(
        outcome=outcome, group_ids=group_ids, loss_mask=mask)
    assert_close(stats["zero_adv_fraction"], 3 / 4)
    turn_id = np.array([[0, 0, 1]] * 8, np.int32)
    ig = np.array([[0.5, 0], [1.5, 0], [2.0, 0], [0.1, 0], [0.1, 0], [0.1, 0], [-1.0, 0],
                   [0.3, 0]], np.float32)
    igpo = self.variant(functools.partial(adv_lib.get_advantage_estimator("igpo"),
                                          norm_mode="separate"))
    adv, stats = igpo(outcome=outcome, group_ids=group_ids, loss_mask=mask, ig=ig,
                      num_turns=np.full(8, 2, np.int32), turn_id=turn_id)
    # Group 5 (IG 0.5, 2.0, -1.0) and group 9 (1.5, 0.1) differ in IG; the singleton 8 does not.
    assert_close(stats["zero_adv_fraction"], 1 / 4)
    assert_close(stats["zero_adv_fraction"], ref_zero_adv(adv, group_ids, mask))
    # Near-ties within the tolerance also count as collapsed.
    assert_close(self.variant(functools.partial(adv_lib.advantage_collapse_fraction, tol=1e-3))(
        outcome + np.array([0, 0, 1e-4, 0, 0, 0, 0, 0], np.float32), group_ids), 0.75)

  @chex.variants(with_jit=True, without_jit=True)
  def test_collapse_fraction_random(self):
    fn = self.variant(adv_lib.advantage_collapse_fraction)
    for seed in range(6):
      d = make_batch(seed)
      assert_close(fn(d["outcome"], d["group_ids"]), ref_collapse(d["outcome"], d["group_ids"]))


class TurnLevelTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(norm_mode=("joint", "separate"), gamma=(1.0, 0.9, 0.0))
  def test_igpo_random(self, norm_mode, gamma):
    fn = self.variant(functools.partial(adv_lib.get_advantage_estimator("igpo"), gamma=gamma,
                                        norm_mode=norm_mode))
    for seed in SEEDS:
      d = make_batch(seed)
      adv, stats = fn(**d)
      turns = ref_igpo_turns(d["ig"], d["outcome"], d["num_turns"], d["group_ids"], gamma,
                             norm_mode)
      assert_close(adv, ref_tokens_from_turns(turns, d["turn_id"], d["loss_mask"]))
      assert_close(stats["collapse_fraction"], ref_collapse(d["outcome"], d["group_ids"]))
      assert_close(stats["zero_adv_fraction"], ref_zero_adv(adv, d["group_ids"],
                                                           d["loss_mask"]))
      turn_adv = adv_lib.igpo_turn_advantages(d["ig"], d["outcome"], d["num_turns"],
                                              d["group_ids"], gamma=gamma, norm_mode=norm_mode)
      assert_close(turn_adv, turns)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(norm_mode=("joint", "separate"), weights=((0.0, 1.0), (1.0, 0.0),
                                                                   (0.5, 2.0)))
  def test_igpo_reward_weights(self, norm_mode, weights):
    # The ablations: ig_weight=0 (outcome-only), outcome_weight=0 (IG-only), and a mixed scale.
    w_ig, w_out = weights
    fn = self.variant(functools.partial(adv_lib.igpo_advantages, gamma=0.9, norm_mode=norm_mode,
                                        ig_weight=w_ig, outcome_weight=w_out))
    for seed in SEEDS:
      d = make_batch(seed)
      adv, _ = fn(**d)
      turns = ref_igpo_turns(d["ig"], d["outcome"], d["num_turns"], d["group_ids"], 0.9,
                             norm_mode, w_ig=w_ig, w_out=w_out)
      assert_close(adv, ref_tokens_from_turns(turns, d["turn_id"], d["loss_mask"]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_igpo_outcome_only_separate_is_grpo(self):
    # With separate normalization and ig_weight=0 every IG turn is a collapsed (all-zero) pool,
    # so with gamma=1 each token gets its trajectory's GRPO advantage.
    fn = self.variant(functools.partial(adv_lib.igpo_advantages, gamma=1.0, norm_mode="separate",
                                        ig_weight=0.0))
    for seed in SEEDS:
      d = make_batch(seed)
      adv, _ = fn(**d)
      want = ref_tokens_from_traj(ref_grpo(d["outcome"], d["group_ids"], True), d["loss_mask"])
      assert_close(adv, want)

  @chex.variants(with_jit=True, without_jit=True)
  def test_igpo_single_turn_is_grpo(self):
    # Every trajectory answers at once: only the outcome turn exists, in either norm mode, and
    # IGPO reduces to GRPO (the ig values are never read).
    d = make_batch(3)
    d["num_turns"] = np.ones(10, np.int32)
    rng = np.random.default_rng(3)
    d["turn_id"], d["loss_mask"] = make_layout(rng, d["num_turns"], 26)
    d["ig"] = np.full_like(d["ig"], np.nan)
    want = ref_tokens_from_traj(ref_grpo(d["outcome"], d["group_ids"], True), d["loss_mask"])
    for mode in ("joint", "separate"):
      fn = self.variant(functools.partial(adv_lib.igpo_advantages, norm_mode=mode, gamma=0.5))
      adv, stats = fn(**d)
      assert_close(adv, want)
      assert "ig_mean" not in stats  # the probes signal's metric, computed once there

  @chex.variants(with_jit=True, without_jit=True)
  def test_igpo_hand_case(self):
    # Group 4: a (2 turns: ig 1, outcome 0) and b (1 turn: outcome 1). Group 1: c, d with every
    # turn reward 1 (collapsed: all-zero advantages). Joint pool of group 4 = [1, 0, 1]: mean 2/3,
    # std sqrt(2)/3.
    ig = np.array([[1.0, 9.0], [9.0, 9.0], [1.0, 9.0], [1.0, 9.0]], np.float32)
    outcome = np.array([0.0, 1.0, 1.0, 1.0], np.float32)
    num_turns = np.array([2, 1, 2, 2], np.int32)
    group_ids = np.array([4, 4, 1, 1], np.int32)
    # Tokens: [prompt, t0, t0, obs0, t1, pad] for 2-turn rows; [prompt, t0, pad...] otherwise.
    turn_id = np.array([[-1, 0, 0, 0, 1, -1], [-1, 0, 0, -1, -1, -1],
                        [-1, 0, 0, 0, 1, -1], [-1, 0, 0, 0, 1, -1]], np.int32)
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0],
                     [0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 1, 0]], np.float32)
    mean, std = 2 / 3, np.sqrt(2) / 3
    z_ig, z_out_a, z_out_b = (1 - mean) / std, (0 - mean) / std, (1 - mean) / std
    gamma = 0.5
    a0, a1 = z_ig + gamma * z_out_a, z_out_a
    want = np.array([[0, a0, a0, 0, a1, 0], [0, z_out_b, z_out_b, 0, 0, 0],
                     [0] * 6, [0] * 6])
    fn = self.variant(functools.partial(adv_lib.igpo_advantages, gamma=gamma))
    adv, stats = fn(ig, outcome, num_turns, group_ids, turn_id, mask)
    assert_close(adv, want)
    assert_close(stats["collapse_fraction"], 0.5)
    # Separate: outcomes of group 4 are [0, 1] -> -1, +1; its single IG value has std 0 -> 0.
    fn = self.variant(functools.partial(adv_lib.igpo_advantages, gamma=gamma, eps=1e-6,
                                        norm_mode="separate"))
    adv, _ = fn(ig, outcome, num_turns, group_ids, turn_id, mask)
    a0 = 0.0 + gamma * -1.0
    want = np.array([[0, a0, a0, 0, -1, 0], [0, 1, 1, 0, 0, 0], [0] * 6, [0] * 6])
    assert_close(adv, want, atol=1e-5)

  def test_igpo_unknown_norm_mode(self):
    d = make_batch(0)
    with pytest.raises(ValueError, match="norm_mode"):
      adv_lib.igpo_advantages(**d, norm_mode="pooled")

  @chex.variants(with_jit=True, without_jit=True)
  def test_turn_to_token_padding(self):
    turn_adv = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    # Out-of-range ids (3, -1), masked sampled-looking slots, bool mask.
    turn_id = np.array([[-1, 0, 1, 1, 2, 3], [0, 0, 2, -1, 1, 1]], np.int32)
    mask = np.array([[1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 1, 1]], bool)
    got = self.variant(adv_lib.turn_to_token)(turn_adv, turn_id, mask)
    assert_close(got, [[0, 1, 2, 0, 3, 0], [4, 0, 6, 0, 5, 5]])
    d = make_batch(1)
    rng = np.random.default_rng(0)
    turn_adv = rng.normal(size=(10, 4)).astype(np.float32)
    assert_close(self.variant(adv_lib.turn_to_token)(turn_adv, d["turn_id"], d["loss_mask"]),
                 ref_tokens_from_turns(turn_adv, d["turn_id"], d["loss_mask"]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_discounted_turn_returns(self):
    rng = np.random.default_rng(0)
    r = rng.normal(size=(5, 4)).astype(np.float32)
    n = np.array([1, 4, 2, 3, 4])
    mask = np.arange(4)[None] < n[:, None]
    for gamma in (1.0, 0.7, 0.0):
      got = self.variant(functools.partial(adv_lib.discounted_turn_returns, gamma=gamma))(r, mask)
      want = np.zeros((5, 4))
      for i in range(5):
        acc = 0.0
        for k in reversed(range(n[i])):
          acc = r[i, k] + gamma * acc
          want[i, k] = acc
      assert_close(got, want)

  @parameterized.product(gamma=(0.5, 1.0, 3.0, 100.0, math.inf), fallback=("zero", "uniform"))
  def test_cw_grpo_matches_official_rule(self, gamma, fallback):
    # Through the registry, with verl's std (the paper presets), eager: the jitted kernel is
    # checked in test_cw_jit_and_traced_gamma.
    fn = functools.partial(adv_lib.get_advantage_estimator("cw_grpo"), gamma=gamma,
                           all_zero_fallback=fallback, std_estimator="unbiased")
    for seed in SEEDS[:2]:
      d = make_cw_batch(seed)
      adv, stats = fn(**d, ig=np.zeros((14, 4), np.float32))  # an unused batch field is dropped
      want, fired, judged = ref_cw_grpo(d, gamma, fallback, std_estimator="unbiased")
      assert_close(adv, want)
      self.assertEqual(judged, 4)  # the correct rows with K >= 1 outside the all-correct group
      self.assertEqual(fired, 2 if gamma >= 10 else 0)
      self.assertEqual(float(stats["cw_judged_positive"]), judged)
      self.assertEqual(float(stats["cw_fallback_count"]), fired)
      assert_close(stats["collapse_fraction"], 0.25)  # the all-correct group
      self.assertIn("adv_mean", stats)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cw_all_zero_contributions_issue_example(self):
    a, ret, think, n = jnp.array([2.0]), jnp.zeros((1, 3)), jnp.ones((1, 3)), jnp.array([3])
    cw = adv_lib.contribution_weighted_advantages
    # The official code: gamma >= 10 gives weights c / max(sum c, 1e-6) = 0, so only the answer
    # round is reinforced (an earlier kernel gave [2, 2, 2] by default).
    for kw, want in (({}, [0.0, 0.0, 2.0]),
                     ({"all_zero_fallback": "zero"}, [0.0, 0.0, 2.0]),
                     ({"all_zero_fallback": "uniform"}, [2.0, 2.0, 2.0]),
                     ({"gamma": math.inf}, [0.0, 0.0, 2.0]),
                     ({"gamma": 10.0}, [0.0, 0.0, 2.0]),
                     ({"gamma": 9.5}, [2.0, 2.0, 2.0]),   # softmax of equal logits: uniform
                     ({"gamma": 1.0, "all_zero_fallback": "zero"}, [2.0, 2.0, 2.0]),
                     ({"gamma": 20.0, "inf_threshold": 50.0}, [2.0, 2.0, 2.0])):
      got = self.variant(functools.partial(cw, **kw))(a, ret, think, n)
      np.testing.assert_array_equal(np.asarray(got), [want], err_msg=str(kw))
    # An answer round with c = 1 does not rescue the all-zero rounds (c / 1 = 0).
    ret = jnp.array([[0.0, 0.0, 1.0]])
    got = self.variant(cw)(a, ret, think, n)
    np.testing.assert_array_equal(np.asarray(got), [[0.0, 0.0, 2.0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_cw_hand_cases(self):
    # Rows: A = 2 with K = 2, c = [1, 0] and answer c = 1 / 0; c = [1, 1] with answer c = 1;
    # A = -1.5 with contributions; A = 0; K = 0 with A = 3 and A = -1 (scores of the single round
    # and past it ignored).
    a = np.array([2.0, 2.0, 2.0, -1.5, 0.0, 3.0, -1.0], np.float32)
    ret = np.array([[1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 0], [1, 0, 1, 1], [1, 0, 1, 1],
                    [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
    think = np.ones((7, 4), np.float32)
    n = np.array([3, 3, 3, 3, 3, 1, 1], np.int32)
    e = math.e
    soft = [4 * e / (e + 1), 4 / (e + 1)]  # gamma 1, c = [1, 0]: 2 * 2 * softmax
    want = {
        math.inf: [[2, 0, 2, 0], [4, 0, 2, 0], [4 / 3, 4 / 3, 2, 0]],
        1.0: [soft + [2, 0], soft + [2, 0], [2, 2, 2, 0]]}
    tail = [[-1.5, -1.5, -1.5, 0], [0, 0, 0, 0], [3, 0, 0, 0], [-1, 0, 0, 0]]
    for gamma in (math.inf, 1.0):
      for fallback in ("zero", "uniform"):
        fn = functools.partial(adv_lib.contribution_weighted_advantages, gamma=gamma,
                               all_zero_fallback=fallback)
        got = self.variant(fn)(a, ret, think, n)
        assert_close(got, np.array(want[gamma] + tail), rtol=1e-6, atol=1e-6)
        assert_close(got, ref_cw_turns(a, ret, think, n, gamma, fallback), rtol=1e-6, atol=1e-6)
        # Without an answer-round c the multipliers K * w_k average to 1: row 1 keeps A * K.
        assert_close(np.asarray(got)[1, :2].sum(), 2 * 2.0, rtol=1e-6)

  def test_cw_jit_and_traced_gamma(self):
    # gamma as a traced scalar picks its branch inside jit; the jitted registry estimator matches
    # the reference.
    d = make_cw_batch(2)
    est = adv_lib.get_advantage_estimator("cw_grpo")
    traced = jax.jit(lambda g, **f: est(**f, gamma=g, all_zero_fallback="zero")[0])
    static = jax.jit(functools.partial(est, gamma=3.0, all_zero_fallback="uniform"))
    adv, stats = static(**d)
    want, fired, judged = ref_cw_grpo(d, 3.0, "uniform")
    assert_close(adv, want)
    self.assertEqual((float(stats["cw_fallback_count"]), float(stats["cw_judged_positive"])),
                     (fired, judged))
    for gamma in (3.0, 100.0, math.inf):
      assert_close(traced(jnp.float32(gamma), **d), ref_cw_grpo(d, gamma, "zero")[0])

  def test_cw_unknown_fallback(self):
    d = make_cw_batch(0)
    with self.assertRaisesRegex(ValueError, r"cw.all_zero_fallback 'spread'.*'zero', 'uniform'"):
      adv_lib.get_advantage_estimator("cw_grpo")(**d, all_zero_fallback="spread")
    with self.assertRaisesRegex(ValueError, "cw.gamma is NaN"):
      adv_lib.contribution_weighted_advantages(
          np.ones(14), d["retrieval_scores"], d["thinking_scores"], d["num_turns"],
          gamma=math.nan)
    with self.assertRaises(TypeError):  # the old `mode` keyword is gone, not ignored
      adv_lib.get_advantage_estimator("cw_grpo")(**d, mode="softmax")


class StatisticsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_ig_statistics(self):
    for seed in SEEDS:
      d = make_batch(seed)
      got = self.variant(adv_lib.ig_statistics)(d["ig"], d["num_turns"])
      vals = [d["ig"][i, k] for i in range(10) for k in range(d["num_turns"][i] - 1)]
      assert_close(got["ig_mean"], np.mean(vals))
      assert_close(got["ig_std"], np.std(vals))
    got = self.variant(adv_lib.ig_statistics)(np.ones((3, 2), np.float32), np.ones(3, np.int32))
    assert_close(got["ig_mean"], 0.0)
    assert_close(got["ig_count"], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gt_entropy_reduction(self):
    fn = self.variant(adv_lib.gt_entropy_reduction)
    for seed in SEEDS:
      rng = np.random.default_rng(seed)
      num_turns = rng.integers(1, 5, size=9).astype(np.int32)
      v = -rng.uniform(0.1, 5.0, size=(9, 5)).astype(np.float32)
      vals = []
      for i in range(9):
        big_k = num_turns[i] - 1
        if big_k >= 1:
          h0, hk = -v[i, 0], -v[i, big_k]
          vals.append(h0 - hk)
      assert_close(fn(v, num_turns), np.mean(vals) if vals else 0.0)
      # Telescoping: equals the mean summed IG when IG_k = v[k+1] - v[k].
      ig = np.diff(v, axis=1)
      sums = [ig[i, :num_turns[i] - 1].sum() for i in range(9) if num_turns[i] >= 2]
      assert_close(fn(v, num_turns), np.mean(sums))
    assert_close(fn(np.zeros((2, 3), np.float32), np.ones(2, np.int32)), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gt_logprob_ends(self):
    """The two ends of the reduction: the mean v[b, 0] and v[b, K] over trajectories that
    searched (K = num_turns - 1 >= 1); entries past K and answer-only trajectories ignored."""
    fn = self.variant(adv_lib.gt_logprob_ends)
    for seed in SEEDS:
      rng = np.random.default_rng(seed)
      num_turns = rng.integers(1, 5, size=9).astype(np.int32)
      num_turns[0] = 1  # an answer-only trajectory: in neither mean
      v = -rng.uniform(0.1, 5.0, size=(9, 5)).astype(np.float32)
      rows = [i for i in range(9) if num_turns[i] >= 2]
      before, after = fn(v, num_turns)
      assert_close(before, np.mean([v[i, 0] for i in rows]) if rows else 0.0)
      assert_close(after, np.mean([v[i, num_turns[i] - 1] for i in rows]) if rows else 0.0)
      assert_close(after - before, adv_lib.gt_entropy_reduction(v, num_turns))
    before, after = fn(-np.ones((2, 3), np.float32), np.ones(2, np.int32))  # nobody searched
    assert_close(before, 0.0)
    assert_close(after, 0.0)


# ---------------------------------------------------------------------------------------------
# All-equal groups and the std estimator (eager calls on one batch shape: few compiles).
# ---------------------------------------------------------------------------------------------

# One value per collapsed group of sizes 2..16; most are not exact in float32, so a float32
# sum / n mean misses them by an ulp or two.
EQUAL_VALUES = (0.7, 2 / 3, 0.9, 0.1, 1e3 + 0.1, 0.3, 1 / 3, -0.7, 0.2, 5 / 7, 0.6, 1e-3, 0.45,
                0.55, 0.15)
# Estimators that whiten over the whole batch after (or without) a group baseline: an all-equal
# group is zero only when the whole batch is (verl / OpenRLHF semantics).
WHITENED = ("reinforce++", "reinforce++_baseline")
# The critic estimators and their reference's mode; a critic is their baseline (no group one).
CRITIC = {"ppo": "token", "ppo_turn": "turn", "ppo_round": "round"}


def make_collapsed_batch(seed, ig_shift=0.0, num_t=3, length=16):
  """Collapsed groups of sizes 2..16 mixed with groups that differ, rows shuffled.

  Collapsed group members share the outcome v and carry IG v + ig_shift on every non-answer
  turn (ig_shift=0: collapsed for IGPO's joint pool too). Also: a singleton, and groups of
  sizes 2, 3 and 5 with differing outcomes and random IG. Ignored IG entries are NaN.

  Returns:
    the batch dict (every field of adv_lib.BATCH_FIELDS) and collapsed [B] bool.
  """
  rng = np.random.default_rng(seed)
  outcome, ig_const, ids, collapsed = [], [], [], []
  for n, v in zip(range(2, 17), EQUAL_VALUES):
    outcome += [v] * n
    ig_const += [v + ig_shift] * n
    ids += [1000 + 13 * n] * n
    collapsed += [True] * n
  outcome.append(0.9)  # singleton
  ig_const.append(0.9 + ig_shift)
  ids.append(5)
  collapsed.append(True)
  for g, n in ((21, 2), (22, 3), (23, 5)):
    vals = rng.choice(np.array([0.0, 0.7, 2 / 3, 1.0, 0.25]), size=n)
    vals[:2] = (0.7, 2 / 3)  # never all equal
    outcome += list(vals)
    ig_const += [np.nan] * n
    ids += [g] * n
    collapsed += [False] * n
  b = len(outcome)
  order = rng.permutation(b)
  outcome = np.array(outcome, np.float32)[order]
  ids = np.array(ids, np.int32)[order]
  collapsed = np.array(collapsed)[order]
  ig_const = np.array(ig_const, np.float32)[order]
  num_turns = rng.integers(1, num_t + 1, size=b).astype(np.int32)
  turn_id, mask = make_layout(rng, num_turns, length)
  ig = np.where(collapsed[:, None], ig_const[:, None],
                rng.normal(size=(b, num_t))).astype(np.float32)
  ig[np.arange(num_t)[None, :] >= num_turns[:, None] - 1] = np.nan
  ret = rng.uniform(size=(b, num_t)).astype(np.float32)
  think = rng.uniform(size=(b, num_t)).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  steps = rng.normal(size=(b, num_t)).astype(np.float32)  # StepSearch's step rewards
  d = dict(outcome=outcome, group_ids=ids, num_turns=num_turns, turn_id=turn_id, loss_mask=mask,
           ig=ig, retrieval_scores=ret, thinking_scores=think, values=values, step_rewards=steps)
  d = {k: v for k, v in d.items() if k in adv_lib.BATCH_FIELDS}  # the registered ones
  assert set(d) == adv_lib.BATCH_FIELDS, "a registered batch field has no test values here"
  return d, collapsed


def ref_estimator(name, d, kw):
  """[B, L] NumPy reference of the registered estimator `name` called with keywords kw."""
  std = dict(std_estimator=kw.get("std_estimator", "population"),
             eps=kw.get("eps", 1e-8 if name in WHITENED else 1e-6))
  o, g, m = d["outcome"], d["group_ids"], d["loss_mask"]
  if name in ("grpo", "gspo", "drgrpo", "rloo"):
    per = (ref_rloo(o, g) if name == "rloo" else
           ref_grpo(o, g, scale=name != "drgrpo", **std))
    return ref_tokens_from_traj(per, m)
  if name in WHITENED:
    return ref_reinforce(o, g, m, name == "reinforce++_baseline", eps=std["eps"],
                         ddof=int(std["std_estimator"] == "unbiased"))
  if name == "igpo":
    turns = ref_igpo_turns(d["ig"], o, d["num_turns"], g, kw.get("gamma", 1.0),
                           kw.get("norm_mode", "joint"), w_ig=kw.get("ig_weight", 1.0),
                           w_out=kw.get("outcome_weight", 1.0), **std)
    return ref_tokens_from_turns(turns, d["turn_id"], m)
  if name == "cw_grpo":
    return ref_cw_grpo(d, kw.get("gamma", 100.0), kw.get("all_zero_fallback", "zero"),
                       **std)[0]
  if name in CRITIC:
    return ref_ppo(d, CRITIC[name], **kw)[0]
  if name == "cw_grpo_ig":
    return ref_cw_grpo_ig(d, kw.get("gamma", 1.0), kw.get("cw_gamma", 100.0),
                          kw.get("cw_all_zero_fallback", "zero"), **std)[0]
  if name == "stepsearch":  # PPO's token GAE with the step rewards as the turns' rewards
    return ref_ppo(dict(d, ig=d["step_rewards"]), "token", ig_weight=1.0, **kw)[0]
  if name == "a2tgpo":
    from tests.test_a2tgpo import ref_a2tgpo
    return ref_a2tgpo(d, **std)[0]
  raise AssertionError(f"no NumPy reference for the registered estimator {name!r}: add one")


def estimator_settings(name):
  """Keyword settings each estimator is checked under: every std estimator it accepts."""
  fn = adv_lib.ADVANTAGE_ESTIMATORS[name].__wrapped__
  takes_std = "std_estimator" in inspect.signature(fn).parameters
  out = []
  for std in adv_lib.STD_ESTIMATORS if takes_std else (None,):
    for mode in ("joint", "separate") if name == "igpo" else (None,):
      kw = {} if std is None else {"std_estimator": std}
      if mode:
        kw["norm_mode"] = mode
      out.append(kw)
  return out


class CollapsedGroupsTest(absltest.TestCase):

  def test_all_equal_groups_get_exactly_zero_in_every_estimator(self):
    d, collapsed = make_collapsed_batch(0)
    d_sep, _ = make_collapsed_batch(0, ig_shift=1 / 7)  # IG differs from the outcome
    for name in sorted(adv_lib.ADVANTAGE_ESTIMATORS):
      for kw in estimator_settings(name):
        batches = [d] + ([d_sep] if kw.get("norm_mode") == "separate" else [])
        for batch in batches:
          with self.subTest(name=name, **kw, ig_shift=batch is d_sep):
            adv, stats = adv_lib.get_advantage_estimator(name)(**batch, **kw)
            adv = np.asarray(adv)
            assert_close(adv, ref_estimator(name, batch, kw))
            if name in WHITENED or name in CRITIC or name == "stepsearch":
              continue  # see test_whitened_all_equal_batch; a critic is the critic's baseline
            np.testing.assert_array_equal(adv[collapsed], 0.0)
            self.assertTrue(np.all(np.abs(adv[~collapsed]).max(axis=1) > 1e-3))
            want = ref_collapse(batch["outcome"], batch["group_ids"])
            assert_close(stats["collapse_fraction"], want)
            assert_close(stats["zero_adv_fraction"], want)

  def test_whitened_all_equal_batch(self):
    # REINFORCE++ whitens over the batch: a batch of equal groups is exactly zero.
    d, collapsed = make_collapsed_batch(1)
    d["outcome"] = np.where(collapsed, d["outcome"], np.float32(0.9))  # every group equal
    for std in adv_lib.STD_ESTIMATORS:
      adv, stats = adv_lib.get_advantage_estimator("reinforce++_baseline")(**d, std_estimator=std)
      np.testing.assert_array_equal(np.asarray(adv), 0.0)
      assert_close(stats["zero_adv_fraction"], 1.0)
    for v in (0.7, 2 / 3, 0.1, 1e3 + 0.1):
      for name in WHITENED:
        adv, stats = adv_lib.get_advantage_estimator(name)(
            **{**d, "outcome": np.full(len(d["outcome"]), v, np.float32)})
        np.testing.assert_array_equal(np.asarray(adv), 0.0, err_msg=f"{name}, value {v}")
        assert_close(stats["collapse_fraction"], stats["zero_adv_fraction"])

  def test_spread_below_float_resolution_is_collapsed(self):
    # Members one ulp apart (rounding, not signal) get 0 instead of (1 ulp) / (~1e-7 + eps).
    # Shapes of make_batch (10 rows, 26 slots), as the other eager calls: no new compiles.
    mask = np.ones((10, 26), np.float32)
    v = np.float32(0.7)
    up = np.nextafter(v, np.float32(1))
    outcome = np.array([v, up, v, up, 0.0, 1.0, 1e3, np.nextafter(np.float32(1e3), 0), 0.5, 0.5],
                       np.float32)
    ids = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3, 3], np.int32)
    for std in adv_lib.STD_ESTIMATORS:
      adv, _ = adv_lib.grpo_advantages(outcome, ids, mask, std_estimator=std)
      np.testing.assert_array_equal(np.asarray(adv)[[0, 1, 2, 3, 6, 7, 8, 9]], 0.0)
      self.assertTrue(np.all(np.abs(np.asarray(adv)[4:6]) > 0.5))
    # The case as first reported (11 rows: +0.1065; with these 10 the old code gave +0.0563).
    adv, stats = adv_lib.get_advantage_estimator("grpo")(
        outcome=jnp.full(10, 0.7), group_ids=jnp.zeros(10, jnp.int32), loss_mask=mask)
    np.testing.assert_array_equal(np.asarray(adv), 0.0)
    self.assertEqual(float(stats["zero_adv_fraction"]), float(stats["collapse_fraction"]))


class StdEstimatorTest(absltest.TestCase):

  def test_group_of_two_and_singleton_by_hand(self):
    # Group [0, 1]: population std 0.5, unbiased std 1/sqrt(2) (x1.41), IGPO's sqrt(0.25 + eps).
    # Then a singleton (0) and a group of 7 equal values (0); make_batch's shapes.
    outcome = np.array([0.0, 1.0, 0.5] + [0.3] * 7, np.float32)
    ids = np.array([3, 3, 8] + [1] * 7, np.int32)
    mask = np.ones((10, 26), np.float32)
    for std, eps, half in (("population", 1e-6, 0.5 / (0.5 + 1e-6)),
                           ("unbiased", 1e-6, 0.5 / (np.sqrt(0.5) + 1e-6)),
                           ("sqrt_var_eps", 1e-8, 0.5 / np.sqrt(0.25 + 1e-8)),
                           ("sqrt_var_eps", 0.25, 0.5 / np.sqrt(0.5))):
      adv, _ = adv_lib.grpo_advantages(outcome, ids, mask, std_estimator=std, eps=eps)
      assert_close(np.asarray(adv)[:, 0], [-half, half] + [0.0] * 8, rtol=1e-6, atol=0)
    pop = adv_lib.grpo_outcome_advantages(outcome, ids, std_estimator="population")
    unb = adv_lib.grpo_outcome_advantages(outcome, ids, std_estimator="unbiased")
    assert_close(np.asarray(pop)[1] / np.asarray(unb)[1], np.sqrt(2), rtol=1e-5)

  def test_estimators_against_numpy(self):
    for seed in SEEDS[:2]:
      d = make_batch(seed)  # group sizes 1..4: a singleton and a pair among them
      d["retrieval_scores"] = np.random.default_rng(seed).uniform(size=(10, 4)).astype(np.float32)
      d["thinking_scores"] = np.ones((10, 4), np.float32)
      for name in ("grpo", "igpo", "cw_grpo", "reinforce++", "reinforce++_baseline"):
        for kw in estimator_settings(name):
          for eps in (1e-8, 0.1):
            with self.subTest(seed=seed, name=name, eps=eps, **kw):
              adv, _ = adv_lib.get_advantage_estimator(name)(**d, **kw, eps=eps)
              assert_close(adv, ref_estimator(name, d, {**kw, "eps": eps}))

  def test_unknown_std_estimator(self):
    d = make_batch(0)
    for name in ("grpo", "igpo", "cw_grpo", "reinforce++"):
      with self.assertRaisesRegex(ValueError, "unknown std_estimator 'bessel'.*population"):
        adv_lib.get_advantage_estimator(name)(**d, retrieval_scores=d["ig"],
                                              thinking_scores=d["ig"], std_estimator="bessel")


# ---------------------------------------------------------------------------------------------
# Config -> estimator keywords (agentjax.train.updates.advantage_kwargs).
# ---------------------------------------------------------------------------------------------


class AdvantageKwargsTest(absltest.TestCase):

  def test_every_preset_gives_keywords_its_estimator_accepts(self):
    d = make_batch(0)
    d["retrieval_scores"] = d["thinking_scores"] = np.ones((10, 4), np.float32)
    seen = {}
    for module in ("igpo", "grpo", "drgrpo", "rloo", "reinforcepp", "gspo"):
      for preset in ("demo", "qwen2.5-3b", "qwen2.5-7b", "qwen3-8b"):
        config = importlib.import_module(f"configs.{module}").get_config(preset)
        kw = rl_lib.advantage_kwargs(config)
        rl = config.rl
        std = {"std_estimator": rl.std_estimator, "eps": rl.std_eps}
        want = {"igpo": dict(gamma=rl.gamma, norm_mode=rl.igpo_norm,
                             ig_weight=rl.igpo_ig_weight,
                             outcome_weight=rl.igpo_outcome_weight, **std),
                "grpo": std, "gspo": std, "drgrpo": {}, "rloo": {},
                "reinforce++": {"std_estimator": rl.std_estimator}}[config.algorithm]
        self.assertEqual(kw, want)
        # The paper presets follow each paper's code: the official IGPO code's
        # sqrt(population var + 1e-8); verl's unbiased std + 1e-6 for the baselines it runs.
        paper = (("sqrt_var_eps", 1e-8) if module == "igpo" else ("unbiased", 1e-6))
        self.assertEqual((rl.std_estimator, rl.std_eps),
                         paper if preset != "demo" else ("population", 1e-6))
        seen[(config.algorithm, tuple(sorted(kw.items())))] = kw
    for (name, _), kw in seen.items():  # accepted, and it acts as the NumPy reference says
      adv, _ = adv_lib.get_advantage_estimator(name)(**d, **kw)
      assert_close(adv, ref_estimator(name, d, kw))
    config = importlib.import_module("configs.grpo").get_config("demo")
    config.algorithm = "cw_grpo"
    self.assertEqual(rl_lib.advantage_kwargs(config),
                     {"std_estimator": "population", "eps": 1e-6, "gamma": 100.0,
                      "inf_threshold": 10.0, "all_zero_fallback": "zero"})


def test_registry():
  names = set(adv_lib.ADVANTAGE_ESTIMATORS)
  assert {"grpo", "drgrpo", "gspo", "rloo", "reinforce++", "reinforce++_baseline", "igpo",
          "cw_grpo"} <= names
  with pytest.raises(KeyError, match=r"'nope'.*known: .*'grpo'"):
    adv_lib.get_advantage_estimator("nope")
  with pytest.raises(ValueError, match="already registered"):
    adv_lib.register_advantage("grpo")(lambda **k: None)
  d = make_batch(0)
  with pytest.raises(TypeError):  # a misspelled config keyword is not silently dropped
    adv_lib.get_advantage_estimator("grpo")(outcome=d["outcome"], group_ids=d["group_ids"],
                                            loss_mask=d["loss_mask"], scale_by_sd=False)

  @adv_lib.register_advantage("test_zero")
  def zero(outcome, loss_mask):
    return jnp.zeros(loss_mask.shape), {}

  try:
    adv, _ = adv_lib.get_advantage_estimator("test_zero")(**d)
    assert adv.shape == d["loss_mask"].shape
  finally:
    del adv_lib.ADVANTAGE_ESTIMATORS["test_zero"]


@pytest.mark.parametrize("name", sorted(CRITIC))
@pytest.mark.parametrize("kw", [dict(gamma=0.9, lam=0.95), dict(gamma=0.8, lam=0.0, whiten=False),
                                dict(ig_weight=0.5, outcome_weight=2.0, lam=0.7)])
def test_critic_estimators_match_numpy_loops(name, kw):
  """ppo / ppo_turn / ppo_round against NumPy loops (ref_ppo) on ragged trajectories: gamma,
  lam, IG turn rewards, whitening; the critic's targets and the slots they sit on too. The
  second batch has turns cut off before their first sampled token (also a last one, whose
  outcome goes to the previous action) and an all-padding row."""
  for seed in range(3):
    d = make_batch(seed) if seed < 2 else make_cut_off_batch(seed)
    rng = np.random.default_rng(seed + 10)
    d["values"] = rng.normal(size=d["loss_mask"].shape).astype(np.float32)
    adv, stats = adv_lib.get_advantage_estimator(name)(**d, **kw)
    ref_adv, ref_ret, ref_vmask = ref_ppo(d, CRITIC[name], **kw)
    assert_close(adv, ref_adv, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(stats["value_mask"]), ref_vmask)
    assert_close(np.where(ref_vmask, stats["returns"], 0.0), ref_ret, atol=2e-5)
    # Values off the steps never matter (observations, prompt, padding).
    d["values"] = np.where(d["loss_mask"] > 0, d["values"], 50.0).astype(np.float32)
    adv2, _ = adv_lib.get_advantage_estimator(name)(**d, **kw)
    assert_close(adv2, adv, atol=1e-6)


def make_cut_off_batch(seed, b=8, num_t=4, length=30):
  """Like make_batch, with some turns cut off before their first sampled token (the last turn
  of rows 1 and 4, a middle one of row 2), row 5 with no sampled token at all, row 6 all
  padding (turn_id -1, no turns sampled)."""
  d = make_batch(seed, b=b, num_t=num_t, length=length)
  rng = np.random.default_rng(seed)
  num_turns = np.array([3, 2, 4, 1, 3, 2, 1, 4], np.int32)
  turn_id = np.full((b, length), -1, np.int32)
  mask = np.zeros((b, length), np.float32)
  cut = {(1, 1), (4, 2), (2, 1), (5, 0), (5, 1)}
  for i in range(b):
    if i == 6:
      continue
    pos = 2
    for k in range(num_turns[i]):
      n_gen = 0 if (i, k) in cut else int(rng.integers(1, 4))
      turn_id[i, pos:pos + n_gen] = k
      mask[i, pos:pos + n_gen] = 1.0
      pos += n_gen
      if k < num_turns[i] - 1:
        turn_id[i, pos:pos + 2] = k
        pos += 2
  d.update(num_turns=num_turns, turn_id=turn_id, loss_mask=mask)
  d["ig"] = rng.normal(size=(b, num_t)).astype(np.float32)
  return d


def test_turn_first_slots_and_carry_back_match_numpy():
  from agentjax.rl import gae as gae_lib
  d = make_cut_off_batch(0)
  m, tid, nt = d["loss_mask"] > 0, d["turn_id"], d["num_turns"]
  first = np.asarray(gae_lib.turn_first_slots(jnp.asarray(tid), jnp.asarray(m), 4))
  rewards = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
  rewards[np.arange(4)[None] >= nt[:, None]] = 0.0
  steps = first >= 0
  carried = np.asarray(gae_lib.carry_back(jnp.asarray(rewards), jnp.asarray(steps)))
  for i in range(8):
    prev = None
    want = np.zeros(4)
    for k in range(4):
      slots = [l for l in range(m.shape[1]) if m[i, l] and tid[i, l] == k]
      assert first[i, k] == (slots[0] if slots else -1)
      if slots:
        prev = k
      if prev is not None:
        want[prev] += rewards[i, k]
    np.testing.assert_allclose(carried[i], want, atol=1e-6)
