"""Decode that reads only the live context: `extend`, `generate`, `decode_slots` and `extend_rows`
with a key window (sampler.kv_window_size) equal the programs that read the whole cache, and the
rollout engines pick windows that cover their rows.

Tiny model, [4 rows, 64 cache slots], windows of 16 and 32 slots: each program compiles once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.sampling import (SamplingParams, StopTable, decode_slots, extend, extend_rows,
                               generate, init_progress, init_state, kv_window_arg, kv_window_size)
from agentjax.sampling.sampler import shared_prefix
from tests.test_sampling import spread_params

B, S, MAX_NEW = 4, 64, 8
GREEDY, SAMPLED = SamplingParams(greedy=True), SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def setup():
  cfg = QwenConfig.preset("tiny")
  return cfg, spread_params(cfg, 0)


def block(rows, width):
  """[len(rows), width] int32 ids (right-padded) and [len(rows)] lengths."""
  out = np.zeros((len(rows), width), np.int32)
  for b, r in enumerate(rows):
    out[b, :len(r)] = r
  return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


def ids(seed, lengths):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(0, 512, n)) for n in lengths]


def no_stop(cfg):
  return (StopTable.build([b""] * cfg.vocab_size, []), jnp.zeros((0,), jnp.int32), jnp.int32(S))


def host(state):
  return jax.device_get(state.replace(rng=jax.random.key_data(state.rng)))


def assert_states_close(got, want, atol=1e-6):
  """Every array of two states equal: ints and bools exactly, floats within atol. The cache is
  compared on the valid slots only: slots past a row's length hold the keys of padding tokens
  (never attended, overwritten before use), which depend on what their queries saw."""
  got, want = host(got), host(want)
  valid = np.asarray(want.valid)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    name = jax.tree_util.keystr(path)
    a, b = np.asarray(a), np.asarray(b)
    if ".keys" in name:      # [B, N, D, S]
      a, b = a * valid[:, None, None], b * valid[:, None, None]
    elif ".values" in name:  # [B, N, S, D]
      a, b = a * valid[:, None, :, None], b * valid[:, None, :, None]
    if a.dtype.kind == "f":
      np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=name)


def test_window_ladder_is_a_few_powers_of_two_below_the_cache():
  sizes = {kv_window_size(n, 8192) for n in range(1, 8193)}
  assert sizes == {256, 512, 1024, 2048, 4096, None}
  assert kv_window_size(256 + 32, 4096) == 512  # the bench's live context
  assert kv_window_size(256 + 32, 512) is None  # reaching the cache: the plain program
  assert kv_window_size(17, 64, minimum=16) == 32
  assert kv_window_size(10, 64, minimum=0) is None  # windows off
  assert kv_window_arg(None) == {} and kv_window_arg(32) == {"kv_window": 32}


def run(cfg, params, sampling, wide, fed, gen, prefix=None):
  """Prompts (5, 13, 40, 3) fed with the full cache; then 4 more tokens fed to rows 0, 1, 3
  (ends 9, 17, 7; row 2 untouched at 40) with key window `fed`; then rows 0, 1, 3 generate
  MAX_NEW tokens (ends <= 25) with window `gen`; row 2 stays inactive past both windows."""
  model = Qwen(cfg)
  state = init_state(cfg, B, S, jax.random.key(3))
  tokens, lengths = block(ids(0, (5, 13, 40, 3)), wide)
  args = {} if prefix is None else {"prefix": prefix}
  state = extend(model, params, state, tokens, lengths, jnp.full(B, -1, jnp.int32), **args)
  tokens, lengths = block(ids(1, (4, 4, 0, 4)), 16)
  state = extend(model, params, state, tokens, lengths, jnp.zeros(B, jnp.int32), **args,
                 **kv_window_arg(fed))
  active = jnp.asarray([True, True, False, True])
  return generate(model, params, state, active, jnp.ones(B, jnp.int32), no_stop(cfg), sampling,
                  MAX_NEW, **args, **kv_window_arg(gen))


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_extend_and_generate_with_a_window_equal_the_full_cache(setup, sampling):
  cfg, params = setup
  want_state, want = run(cfg, params, sampling, 64, None, None)
  got_state, got = run(cfg, params, sampling, 64, kv_window_size(17, S, 16),
                       kv_window_size(17 + MAX_NEW, S, 16))
  np.testing.assert_array_equal(got.new_tokens, want.new_tokens)
  np.testing.assert_array_equal(got.num_new, [MAX_NEW, MAX_NEW, 0, MAX_NEW])
  assert_states_close(got_state, want_state)  # tokens, log-probs, cache, next logits


def test_a_window_below_a_row_changes_it(setup):
  """The window is applied (not a no-op): one of 16 slots cuts row 1's turn (it ends at 25),
  which changes its tokens or log-probs; row 3, which ends at 15, stays exact."""
  cfg, params = setup
  want_state, _ = run(cfg, params, GREEDY, 64, None, None)
  got_state, _ = run(cfg, params, GREEDY, 64, None, 16)
  want, got = host(want_state), host(got_state)
  assert np.abs(got.logprobs[1] - want.logprobs[1]).max() > 1e-3 or \
      (got.tokens[1] != want.tokens[1]).any()
  # (1e-5: its scores reduce over 16 keys instead of 64, in another order)
  np.testing.assert_allclose(got.logprobs[3], want.logprobs[3], atol=1e-5)
  np.testing.assert_array_equal(got.tokens[3], want.tokens[3])


def test_the_shared_prefix_path_with_a_window_equals_the_full_cache(setup):
  cfg, params = setup
  model = Qwen(cfg)
  one = init_state(cfg, 1, 32, jax.random.key(0))
  tokens, lengths = block(ids(2, (20,)), 32)
  prefix = shared_prefix(extend(model, params, one, tokens, lengths, jnp.full(1, -1, jnp.int32)))
  want_state, want = run(cfg, params, SAMPLED, 64, None, None, prefix)
  got_state, got = run(cfg, params, SAMPLED, 64, 32, 32, prefix)
  np.testing.assert_array_equal(got.new_tokens, want.new_tokens)
  assert_states_close(got_state, want_state)


def test_slot_programs_with_a_window_equal_the_full_cache(setup):
  """decode_slots (rows 0, 1, 3 decode; row 2 waits past the window) and extend_rows (rows 0
  and 3 fed) with windows equal the full-cache programs."""
  cfg, params = setup
  model = Qwen(cfg)
  stop = no_stop(cfg)

  def slots(window_decode, window_feed):
    state = init_state(cfg, B, S, jax.random.key(5))
    tokens, lengths = block(ids(0, (5, 13, 40, 3)), 64)
    state = extend(model, params, state, tokens, lengths, jnp.full(B, -1, jnp.int32))
    active = jnp.asarray([True, True, False, True])
    state, progress, call = decode_slots(
        model, params, state, init_progress(B, stop[0]), active, jnp.ones(B, jnp.int32),
        jnp.arange(B, dtype=jnp.int32), active, SAMPLED, MAX_NEW, stop, jnp.int32(B),
        **kv_window_arg(window_decode))
    tokens, lengths = block(ids(1, (6, 6)), 16)
    state = extend_rows(model, params, state, jnp.asarray([0, 3, B, B], jnp.int32),
                        jnp.pad(tokens, ((0, 2), (0, 0))), jnp.pad(lengths, (0, 2)),
                        jnp.full((B, 16), 2, jnp.int32), **kv_window_arg(window_feed))
    return state, call

  want_state, want = slots(None, None)
  got_state, got = slots(kv_window_size(13 + MAX_NEW, S, 16),
                         kv_window_size(5 + MAX_NEW + 6, S, 16))
  np.testing.assert_array_equal(got.turn_tokens, want.turn_tokens)
  np.testing.assert_array_equal(got.num_new, [MAX_NEW, MAX_NEW, 0, MAX_NEW])
  assert_states_close(got_state, want_state)


@pytest.mark.parametrize("engine", ["slots", "turns"])
def test_rollouts_with_windows_equal_rollouts_without(scripted_world, engine, monkeypatch):
  """The engines' host bookkeeping picks windows that cover every row: trajectories equal those
  of kv_window_min=0 (the whole cache), token by token."""
  from agentjax.agent import RolloutConfig, RolloutEngine
  from agentjax.agent import rollout as rollout_module
  from agentjax.agent import slots as slots_module
  from tests import agent_fixtures as af
  from tests.test_slot_rollout import assert_same_trajectories

  picked = []  # the windows the engine's calls ran with

  def spy(kv_window):
    picked.append(kv_window)
    return kv_window_arg(kv_window)
  monkeypatch.setattr(rollout_module, "kv_window_arg", spy)
  monkeypatch.setattr(slots_module, "kv_window_arg", spy)

  tok, backend, agent = scripted_world
  params = agent.params(af.SEARCH, af.ANSWER)
  questions = ["Who founded Zorvath?", "Where is Quellmoor?"]

  def rollout(**window):
    # The shapes of tests/test_slot_rollout.py: its windowed programs are shared in one run.
    config = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
                           max_total_tokens=1024, topk=2, sampling=SAMPLED, engine=engine,
                           **window)
    return RolloutEngine(agent.cfg, tok, backend, config).run(params, questions,
                                                              jax.random.key(0))[0]

  # Contexts of 381 to 595 tokens in a 1024-slot cache: windows of 512 slots, then the whole.
  windowed = rollout()
  assert set(picked) == {512, None}, set(picked)
  assert_same_trajectories(windowed, rollout(kv_window_min=0), logprob_atol=1e-6)


def test_decode_layout_casts_master_weights_to_the_compute_dtype_without_changing_logits(setup):
  """float32 master weights with bfloat16 compute: decode_layout hands the token loop bfloat16
  weights (half the bytes a step reads), and the model's logits are bit-identical, since every
  use casts the weights to the compute dtype anyway; integer leaves stay as they are."""
  from agentjax.models import masks
  from agentjax.sampling.sampler import compute_dtype_params, decode_layout

  cfg, params = setup
  cfg = cfg.replace(dtype="bfloat16")
  model, decoded = decode_layout(Qwen(cfg), params)
  leaves = jax.tree.leaves(decoded)
  assert leaves and all(x.dtype == jnp.bfloat16 for x in leaves)
  mixed = {"w": jnp.ones((2,), jnp.float32), "index": jnp.int32(3)}
  cast = compute_dtype_params(mixed, "bfloat16")
  assert cast["w"].dtype == jnp.bfloat16 and cast["index"].dtype == jnp.int32
  tokens = jnp.asarray(ids(3, [9, 9]))
  valid = jnp.ones(tokens.shape, bool)
  args = (tokens, masks.positions_from_padding(valid), masks.causal_padding_mask(valid))
  run = jax.jit(lambda p: Qwen(cfg).apply({"params": p}, *args)[0])
  np.testing.assert_array_equal(np.asarray(run(params)),
                                np.asarray(run(compute_dtype_params(params, "bfloat16"))))
