"""Generalized advantage estimation (GAE) over multi-turn search trajectories: per token or per turn.

    rewards = rewards_at_turn_ends(turn_rewards, turn_id, loss_mask)       # [B, L]
    adv, ret = token_gae(rewards, values, loss_mask, gamma=1.0, lam=0.95)   # [B, L] each
    adv_t, ret_t = turn_gae(turn_rewards, turn_values, turn_mask, gamma, lam)   # [B, T] each

Shapes and conventions are agentjax/rl/advantages.py's: B trajectories, L token slots, T turns.

Token level (verl / OpenRLHF PPO, with observations skipped). The steps of a trajectory are its
sampled tokens (loss_mask), in slot order; prompt, observation and padding slots are not actions
and are skipped, not counted as steps: the step after a turn's last sampled token is the first
sampled token of the next turn, observation in between. With v(t) the value at step t and t' the
next step (none after the last: v = 0, the episode ends),

    delta_t = r_t + gamma v(t') - v(t)         A_t = delta_t + gamma lam A_t'     R_t = A_t + v(t)

Rewards sit on sampled tokens: a turn's reward (the outcome on the answer turn, IGPO's
information gain on earlier turns, or both) on the turn's last sampled token
(`rewards_at_turn_ends`), 0 on the others.

A turn cut off before its first sampled token is no action: `carry_back` moves its reward to the
previous action (the advantages' estimators do this first).

Turn level (AReaL's gae_timestep_unit="turn"): the same recursion over turns 0..num_turns-1, one
reward and one value per turn (the value at the turn's boundary), v = 0 after the last turn;
every token of a turn then takes its turn's advantage (advantages.turn_to_token).

Round level (the CW-GRPO code's "gae-round", compute_gae_round_advantage_return): token level
with each turn an episode of its own (token_gae with turn_id): a turn's last sampled token
bootstraps from 0, so no credit flows back from later turns. (Its README calls its MT-PPO baseline
"round-level GAE"; its mt-ppo script runs the token-level "gae" on per-round rewards, and
"gae-round" appears in its R3-RAG script.)

All run as one reverse `lax.scan`, jittable; outputs are 0 off loss_mask / turn_mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _reverse_gae(rewards: Array, values: Array, step: Array, gamma, lam,
                 episode: Array | None = None) -> tuple[Array, Array]:
  """The GAE recursion over the last axis of [B, N] arrays, backwards, through the positions
  where `step` is true only (the others are skipped: they carry nothing and get 0).

  episode: [B, N] int ids (None: one episode per row); a step whose next step lies in another
  episode bootstraps from 0, as at the end of the row."""
  gamma = jnp.asarray(gamma, jnp.float32)
  lam = jnp.asarray(lam, jnp.float32)
  if episode is None:
    episode = jnp.zeros(step.shape, jnp.int32)

  def body(carry, xs):
    next_value, next_adv, next_episode = carry       # of the next step (0 after the last)
    r, v, is_step, ep = xs
    same = ep == next_episode
    next_value = jnp.where(same, next_value, 0.0)
    next_adv = jnp.where(same, next_adv, 0.0)
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * next_adv
    carry = (jnp.where(is_step, v, next_value), jnp.where(is_step, adv, next_adv),
             jnp.where(is_step, ep, next_episode))
    return carry, jnp.where(is_step, adv, 0.0)

  b = rewards.shape[0]
  zeros = jnp.zeros((b,), jnp.float32)
  xs = (rewards.astype(jnp.float32).T, values.astype(jnp.float32).T, step.T,
        episode.astype(jnp.int32).T)
  _, adv = jax.lax.scan(body, (zeros, zeros, episode[:, -1].astype(jnp.int32)), xs,
                        reverse=True)
  adv = adv.T
  returns = jnp.where(step, adv + values.astype(jnp.float32), 0.0)
  return adv, returns


def _turn_slots(turn_id: Array, loss_mask: Array, num_t: int) -> tuple[Array, Array]:
  """([B, L, T] one-hot of each sampled token's turn, [1, L, 1] slot numbers)."""
  mask = loss_mask.astype(bool)
  slots = jnp.arange(mask.shape[1])[None, :, None]
  onehot = (turn_id[..., None] == jnp.arange(num_t)) & mask[..., None]
  return onehot, slots


def turn_first_slots(turn_id: Array, loss_mask: Array, num_t: int) -> Array:
  """[B, T] int32: the slot of turn k's first sampled token (-1 for a turn with none)."""
  onehot, slots = _turn_slots(turn_id, loss_mask, num_t)
  length = loss_mask.shape[1]
  first = jnp.min(jnp.where(onehot, slots, length), axis=1)
  return jnp.where(first < length, first, -1).astype(jnp.int32)


def carry_back(turn_rewards: Array, steps: Array) -> Array:
  """[B, T] turn rewards with each turn's reward moved to the last step turn at or before it.

  A turn with no sampled token (a trajectory cut off by the token budget right after an
  observation) is not an action; its reward (the outcome, or a format penalty, of a truncated
  trajectory) belongs to the last action taken, the previous turn's. (verl drops it: its reward
  sits on an observation token that its GAE skips.) A reward with no step at or before it is
  dropped.

  Args:
    turn_rewards: [B, T] float, 0 on the turns a trajectory does not have.
    steps: [B, T] bool, the turns with a sampled token (turn_first_slots >= 0).
  """
  num_t = turn_rewards.shape[1]
  k = jnp.arange(num_t)
  last_step = jax.lax.cummax(jnp.where(steps, k[None, :], -1), axis=1)        # [B, T]
  moved = last_step[:, None, :] == k[None, :, None]          # [B, T (to), T (from)]
  return jnp.sum(jnp.where(moved, turn_rewards[:, None, :].astype(jnp.float32), 0.0), axis=-1)


@jax.jit
def rewards_at_turn_ends(turn_rewards: Array, turn_id: Array, loss_mask: Array) -> Array:
  """[B, L] rewards: turn k's reward turn_rewards[b, k] on that turn's last sampled token. A turn
  with no sampled token (one cut off before its first) has no action to credit here: its reward
  is dropped (`carry_back` first moves it to the previous action).

  Args:
    turn_rewards: [B, T] float, one reward per turn (entries past a row's turns are ignored).
    turn_id: [B, L] int32, the turn of each slot (-1 on prompt and padding).
    loss_mask: [B, L] bool, sampled tokens.
  """
  onehot, slots = _turn_slots(turn_id, loss_mask, turn_rewards.shape[1])        # [B, L, T]
  # A sampled token is its turn's last when no later sampled token has the same turn.
  last_slot = jnp.max(jnp.where(onehot, slots, -1), axis=1)                    # [B, T]
  is_last = onehot & (slots == last_slot[:, None, :])                           # [B, L, T]
  return jnp.sum(jnp.where(is_last, turn_rewards[:, None, :].astype(jnp.float32), 0.0), axis=-1)


@jax.jit
def token_gae(rewards: Array, values: Array, loss_mask: Array, gamma=1.0, lam=1.0,
              turn_id: Array | None = None) -> tuple[Array, Array]:
  """(advantages [B, L], returns [B, L]) of token-level GAE over the sampled tokens (module
  docstring); 0 off loss_mask.

  Args:
    rewards: [B, L] float, 0 except where a reward is given (see rewards_at_turn_ends).
    values: [B, L] float, the critic's value at each slot (read on sampled tokens only).
    loss_mask: [B, L] bool, the steps.
    gamma, lam: discount and GAE lambda (scalars, may be traced).
    turn_id: [B, L] int32 (None: the trajectory is one episode). Given, each turn is an episode
      of its own: its last sampled token bootstraps from 0, not from the next turn's first (the
      CW-GRPO code's "gae-round", compute_gae_round_advantage_return, which resets the recursion
      at observation tokens; a turn's credit then comes from its own reward alone).
  """
  return _reverse_gae(rewards, values, loss_mask.astype(bool), gamma, lam, turn_id)


@jax.jit
def turn_gae(turn_rewards: Array, turn_values: Array, turn_mask: Array, gamma=1.0, lam=1.0
             ) -> tuple[Array, Array]:
  """(advantages [B, T], returns [B, T]) of turn-level GAE (module docstring); 0 off turn_mask.

  Args:
    turn_rewards: [B, T] float, one reward per turn.
    turn_values: [B, T] float, the critic's value at each turn's boundary.
    turn_mask: [B, T] bool, arange(T) < num_turns (advantages.turn_mask_from).
  """
  return _reverse_gae(turn_rewards, turn_values, turn_mask.astype(bool), gamma, lam)


__all__ = ["carry_back", "rewards_at_turn_ends", "token_gae", "turn_first_slots", "turn_gae"]
