"""Tests of agentjax.rl.advantages against plain-loop NumPy references written here.

Every jnp kernel runs with and without jit (chex variants). Batches are random multi-turn layouts
(prompt, per-turn sampled tokens and observations, padding) with non-contiguous group ids.
"""

from __future__ import annotations

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from agentjax.rl import advantages as adv_lib

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


def ref_grpo(outcome, group_ids, scale, eps=1e-6):
  out = np.zeros(len(outcome))
  for i in range(len(outcome)):
    vals = np.array([outcome[j] for j in members(group_ids, i)], np.float64)
    out[i] = outcome[i] - vals.mean()
    if scale:
      out[i] /= vals.std() + eps
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


def ref_reinforce(outcome, group_ids, mask, subtract, eps=1e-8):
  base = ref_grpo(outcome, group_ids, scale=False) if subtract else np.array(outcome, np.float64)
  toks = [base[i] for i in range(mask.shape[0]) for l in range(mask.shape[1]) if mask[i, l]]
  mean, var = np.mean(toks), np.var(toks)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for l in range(mask.shape[1]):
      if mask[i, l]:
        out[i, l] = (base[i] - mean) / np.sqrt(var + eps)
  return out


def ref_igpo_turns(ig, outcome, num_turns, group_ids, gamma, mode, eps=1e-6, w_ig=1.0, w_out=1.0):
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
      z[i, k] = (r[i, k] - np.mean(pool)) / (np.std(pool) + eps)
  out = np.zeros((b, num_t))
  for i in range(b):
    acc = 0.0
    for k in reversed(range(num_turns[i])):
      acc = z[i, k] + gamma * acc
      out[i, k] = acc
  return out


def ref_cw(a, ret, think, num_turns, mode, gamma):
  b, num_t = ret.shape
  out = np.zeros((b, num_t))
  for i in range(b):
    big_k = num_turns[i] - 1
    c = [ret[i, k] * think[i, k] for k in range(big_k)]
    if mode == "normalize":
      s = sum(c)
      w = [x / s for x in c] if s > 0 else [1.0 / max(big_k, 1)] * big_k
    else:
      m = max(c) if c else 0.0
      e = [np.exp(gamma * x - gamma * m) for x in c]
      w = [x / sum(e) for x in e]
    for k in range(big_k):
      out[i, k] = a[i] * big_k * w[k] if a[i] > 0 else a[i]
    out[i, big_k] = a[i]
  return out


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
      valid_ig = [d["ig"][i, k] for i in range(10) for k in range(d["num_turns"][i] - 1)]
      assert_close(stats["ig_mean"], np.mean(valid_ig))
      assert_close(stats["ig_std"], np.std(valid_ig))
      assert_close(stats["ig_count"], len(valid_ig))
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
      assert_close(stats["ig_count"], 0.0)
      assert_close(stats["ig_mean"], 0.0)

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

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(mode=("normalize", "softmax"), gamma=(1.0, 2.5))
  def test_contribution_weighted_random(self, mode, gamma):
    fn = self.variant(functools.partial(adv_lib.contribution_weighted_advantages, mode=mode,
                                        gamma=gamma))
    for seed in SEEDS:
      rng = np.random.default_rng(seed)
      b, num_t = 12, 5
      a = rng.normal(size=b).astype(np.float32)
      a[:2] = 0.0
      ret = rng.uniform(size=(b, num_t)).astype(np.float32)
      ret[rng.uniform(size=(b, num_t)) < 0.3] = 0.0
      ret[2] = 0.0  # no contribution anywhere: uniform fallback
      think = rng.uniform(size=(b, num_t)).astype(np.float32)
      num_turns = rng.integers(1, num_t + 1, size=b).astype(np.int32)
      num_turns[2] = 4
      a[2] = 1.5
      got = fn(a, ret, think, num_turns)
      assert_close(got, ref_cw(a, ret, think, num_turns, mode, gamma))

  @chex.variants(with_jit=True, without_jit=True)
  def test_contribution_weighted_hand_case(self):
    a = np.array([2.0, -1.0, 2.0, 3.0], np.float32)
    ret = np.array([[1.0, 0.5, 0.0, 7.0], [1.0, 0.5, 0.0, 7.0], [0.0, 0.0, 0.0, 7.0],
                    [5.0, 5.0, 5.0, 5.0]], np.float32)
    think = np.array([[1.0, 1.0, 0.0, 7.0], [1.0, 1.0, 0.0, 7.0], [1.0, 1.0, 1.0, 7.0],
                      [1.0, 1.0, 1.0, 1.0]], np.float32)
    num_turns = np.array([3, 3, 3, 1], np.int32)
    got = self.variant(adv_lib.contribution_weighted_advantages)(a, ret, think, num_turns)
    # Row 0: c = [1, .5], w = [2/3, 1/3], K = 2: rounds 2*2*w, answer 2.
    assert_close(got, [[8 / 3, 4 / 3, 2.0, 0.0], [-1.0, -1.0, -1.0, 0.0],
                       [2.0, 2.0, 2.0, 0.0], [3.0, 0.0, 0.0, 0.0]])
    # Positive-advantage rounds keep the total A * K of uniform weighting.
    assert_close(np.asarray(got)[0, :2].sum(), 2 * 2.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cw_grpo_estimator(self):
    d = make_batch(4)
    rng = np.random.default_rng(4)
    ret = rng.uniform(size=(10, 4)).astype(np.float32)
    think = rng.uniform(size=(10, 4)).astype(np.float32)
    fn = self.variant(functools.partial(adv_lib.get_advantage_estimator("cw_grpo"),
                                        mode="softmax", gamma=3.0))
    adv, _ = fn(**d, retrieval_scores=ret, thinking_scores=think)
    a = ref_grpo(d["outcome"], d["group_ids"], True)
    turns = ref_cw(a, ret, think, d["num_turns"], "softmax", 3.0)
    assert_close(adv, ref_tokens_from_turns(turns, d["turn_id"], d["loss_mask"]))


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
