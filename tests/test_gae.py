"""GAE per token and per turn against independent NumPy loops, on ragged multi-turn trajectories
with prompts, observation spans, empty turns and padding."""

from __future__ import annotations

import numpy as np
import pytest

from agentjax.rl.gae import rewards_at_turn_ends, token_gae, turn_gae


def _batch(seed, b=6, length=48, num_t=4):
  """Random trajectories: a prompt, then per turn some sampled tokens (possibly none) and an
  observation span (none after the last turn), then padding."""
  rng = np.random.default_rng(seed)
  loss_mask = np.zeros((b, length), bool)
  turn_id = np.full((b, length), -1, np.int32)
  num_turns = rng.integers(1, num_t + 1, b)
  for row in range(b):
    pos = int(rng.integers(1, 6))
    for t in range(num_turns[row]):
      k = int(rng.integers(0, 5)) if row % 3 else int(rng.integers(1, 5))  # some empty turns
      turn_id[row, pos:pos + k] = t
      loss_mask[row, pos:pos + k] = True
      pos += k
      if t < num_turns[row] - 1:
        obs = int(rng.integers(1, 5))
        turn_id[row, pos:pos + obs] = t
        pos += obs
  values = rng.normal(size=(b, length)).astype(np.float32)
  turn_rewards = rng.normal(size=(b, num_t)).astype(np.float32)
  return loss_mask, turn_id, num_turns, values, turn_rewards


def _np_rewards(turn_rewards, turn_id, loss_mask):
  out = np.zeros(loss_mask.shape, np.float32)
  for b in range(loss_mask.shape[0]):
    for t in range(turn_rewards.shape[1]):
      slots = [j for j in range(loss_mask.shape[1]) if loss_mask[b, j] and turn_id[b, j] == t]
      if slots:
        out[b, slots[-1]] = turn_rewards[b, t]
  return out


def _np_gae(rewards, values, steps, gamma, lam):
  """GAE along each row over the positions in `steps` only: a plain loop over the step list."""
  adv = np.zeros(rewards.shape, np.float64)
  for b in range(rewards.shape[0]):
    idx = [j for j in range(rewards.shape[1]) if steps[b, j]]
    next_v, next_a = 0.0, 0.0
    for j in reversed(idx):
      delta = rewards[b, j] + gamma * next_v - values[b, j]
      adv[b, j] = delta + gamma * lam * next_a
      next_v, next_a = values[b, j], adv[b, j]
  returns = np.where(steps, adv + values, 0.0)
  return adv, returns


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0), (0.5, 0.7)])
def test_token_gae_skips_observations_and_matches_a_numpy_loop(gamma, lam):
  for seed in range(3):
    loss_mask, turn_id, _, values, turn_rewards = _batch(seed)
    rewards = np.asarray(rewards_at_turn_ends(turn_rewards, turn_id, loss_mask))
    np.testing.assert_allclose(rewards, _np_rewards(turn_rewards, turn_id, loss_mask), atol=0)
    adv, ret = token_gae(rewards, values, loss_mask, gamma, lam)
    ref_adv, ref_ret = _np_gae(rewards, values, loss_mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-5, atol=1e-5)
    assert not np.asarray(adv)[~loss_mask].any() and not np.asarray(ret)[~loss_mask].any()


def test_observation_values_never_enter_the_recursion():
  """Changing the values on observation, prompt and padding slots changes nothing: they are not
  steps (counting them as steps would discount across them and read their values)."""
  loss_mask, turn_id, _, values, turn_rewards = _batch(7)
  rewards = rewards_at_turn_ends(turn_rewards, turn_id, loss_mask)
  other = np.where(loss_mask, values, 100.0).astype(np.float32)
  a1, _ = token_gae(rewards, values, loss_mask, 0.9, 0.9)
  a2, _ = token_gae(rewards, other, loss_mask, 0.9, 0.9)
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))


def test_gae_with_lambda_one_and_gamma_one_is_return_minus_value():
  """lam = gamma = 1: A_t = (sum of rewards from t on) - v(t), the Monte Carlo advantage."""
  loss_mask, turn_id, _, values, turn_rewards = _batch(3)
  rewards = np.asarray(rewards_at_turn_ends(turn_rewards, turn_id, loss_mask))
  adv, ret = token_gae(rewards, values, loss_mask, 1.0, 1.0)
  to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
  np.testing.assert_allclose(np.asarray(adv), np.where(loss_mask, to_go - values, 0), atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret), np.where(loss_mask, to_go, 0), atol=1e-5)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.8, 0.0)])
def test_turn_gae_matches_a_numpy_loop_over_turns(gamma, lam):
  rng = np.random.default_rng(0)
  num_turns = np.array([1, 4, 2, 3, 4])
  turn_mask = np.arange(4)[None] < num_turns[:, None]
  rewards = rng.normal(size=(5, 4)).astype(np.float32)
  values = rng.normal(size=(5, 4)).astype(np.float32)
  adv, ret = turn_gae(rewards, values, turn_mask, gamma, lam)
  ref_adv, ref_ret = _np_gae(rewards, values, turn_mask, gamma, lam)
  np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-5, atol=1e-6)
  # one turn: A = r - v
  np.testing.assert_allclose(np.asarray(adv)[0, 0], rewards[0, 0] - values[0, 0], atol=1e-6)
  assert not np.asarray(adv)[~turn_mask].any()
