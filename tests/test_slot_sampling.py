"""The slot engine's device programs (agentjax/sampling/slots.py) against independent references:
`generate` and `extend` on whole batches, teacher-forced log-probs of full forwards, and NumPy.

One tiny model, one batch shape ([4 slots, 32 cache slots], 16-token feeds, 10 new tokens per
turn), so each program compiles once for the whole file.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.logprobs import sequence_logprobs
from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.sampling import (STOP_BUDGET, STOP_EOS, STOP_MAX_NEW, STOP_STRING, DecodeState,
                               SamplingParams, StopTable, copy_rows, decode_slots,
                               empty_trajectories, extend, extend_rows, generate, init_progress,
                               init_state, sample_token_rows, store_rows, take_rows)
from agentjax.sampling.slots import SlotProgress
from tests.test_sampling import (FILTERS, fill, filter_logits_cases, log_softmax,
                                 reference_filter, spread_params)

N, S, MAX_NEW = 4, 32, 10
GREEDY = SamplingParams(greedy=True)
# Every token is 4 bytes "ddd,": a stop string of whole tokens can only match on token bounds.
BYTES = [f"{i:03d},".encode() for i in range(512)]


@pytest.fixture(scope="module")
def setup():
  cfg = QwenConfig.preset("tiny")
  return cfg, spread_params(cfg, 0)


def prompts(seed, lengths):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(0, 512, n)) for n in lengths]


def filled(cfg, params, rows, rng=0):
  return fill(init_state(cfg, N, S, jax.random.key(rng)), cfg, params, rows, -1)


def stop_tuple(stop_string, eos, budget):
  return (StopTable.build(BYTES, [stop_string]), jnp.asarray([eos], jnp.int32), jnp.int32(budget))


def host(state):
  """The state's arrays on the host (the key as its data), for comparisons."""
  return jax.device_get(state.replace(rng=jax.random.key_data(state.rng)))


def assert_rows_equal(got, want, rows, exact=True, what=""):
  """Every array of two states (cache included) equal on `rows`."""
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    name = jax.tree_util.keystr(path)
    if "rng" in name:
      continue
    a, b = np.asarray(a)[rows], np.asarray(b)[rows]
    if exact or a.dtype.kind != "f":
      np.testing.assert_array_equal(a, b, err_msg=f"{what}{name} rows {rows}")
    else:
      # atol: logits of a [V] row of scale ~3 differ by ~1e-5 in float32 when computed
      # by another program (the suite's unoptimized CPU code: 1.25e-5).
      np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-5, err_msg=f"{what}{name} rows {rows}")


def slots_call(cfg, params, state, progress, start, turn, traj, active, sampling, stop, exit_after):
  as_i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
  return decode_slots(Qwen(cfg), params, state, progress, jnp.asarray(start, bool), as_i32(turn),
                      as_i32(traj), jnp.asarray(active, bool), sampling, MAX_NEW, stop,
                      as_i32(exit_after))


# --------------------------------------------------------------------------- decode_slots


def test_decode_slots_greedy_equals_generate_in_one_call_and_split_over_calls(setup):
  """Greedy decode_slots reproduces generate (tokens, log-probs, every per-slot array, next
  logits, stop reasons): in one call, and split into a call per stopping row, where a stop string
  spans a call boundary (the window carries over) and max_new counts the turn across calls."""
  cfg, params = setup
  # Budget 24: row 1 (prompt 20) stops after 4 tokens, which ends the first split call.
  rows = prompts(0, (5, 20, 7, 3))
  model = Qwen(cfg)
  turn = jnp.asarray([0, 1, 2, 3], jnp.int32)
  _, free = generate(model, params, filled(cfg, params, rows), jnp.ones(N, bool), turn,
                     stop_tuple("~" * 8, -1, 24), GREEDY, MAX_NEW)
  free = np.asarray(free.new_tokens)
  # Row 0 stops on the string its tokens 3 and 4 spell; row 3 on its 7th token as an EOS.
  stop = stop_tuple(f"{free[0, 3]:03d},{free[0, 4]:03d},", free[3, 6], 24)
  want_state, want = generate(model, params, filled(cfg, params, rows), jnp.ones(N, bool), turn,
                              stop, GREEDY, MAX_NEW)
  want_state, want = host(want_state), jax.device_get(want)
  np.testing.assert_array_equal(want.stop_reason, [STOP_STRING, STOP_BUDGET, STOP_MAX_NEW,
                                                   STOP_EOS])
  np.testing.assert_array_equal(want.num_new, [5, 4, 10, 7])

  state, progress, call = slots_call(cfg, params, filled(cfg, params, rows),
                                     init_progress(N, stop[0]), [True] * N, turn, [7, 8, 9, 6],
                                     [True] * N, GREEDY, stop, N)
  assert_rows_equal(host(state), want_state, slice(None), exact=False)
  call = jax.device_get(call)
  assert (int(call.steps), int(call.sampled)) == (10, 26)
  np.testing.assert_array_equal(call.reason, want.stop_reason)
  np.testing.assert_array_equal(call.num_new, want.num_new)
  np.testing.assert_array_equal(call.turn_tokens, want.new_tokens)
  np.testing.assert_array_equal(progress.traj, [7, 8, 9, 6])
  np.testing.assert_array_equal(progress.turn, turn)

  # Split: one stopping row per call; after the first call no row starts, and every row is
  # passed as active (the stopped ones must be left alone).
  state, progress = filled(cfg, params, rows), init_progress(N, stop[0])
  steps, stopped_by_call = [], []
  start = [True] * N
  while True:
    before = host(state)
    state, progress, call = slots_call(cfg, params, state, progress, start, turn, [7, 8, 9, 6],
                                       [True] * N, GREEDY, stop, 1)
    start = [False] * N
    call = jax.device_get(call)
    steps.append(int(call.steps))
    earlier = sum(stopped_by_call, [])
    stopped_by_call.append([b for b in range(N) if call.reason[b] != 0 and b not in earlier])
    for b in range(N):
      n = 0 if b in earlier else int(call.num_new[b])   # earlier rows were not in the call
      np.testing.assert_array_equal(call.turn_tokens[b, :n], want.new_tokens[b, :n])
      assert not call.turn_tokens[b, n:].any()
    for b in earlier:   # stopped in an earlier call: untouched
      assert_rows_equal(host(state), before, [b], what="stopped row ")
    if (call.reason != 0).all():
      break
  assert steps == [4, 1, 2, 3], steps
  assert stopped_by_call == [[1], [0], [3], [2]], stopped_by_call
  assert_rows_equal(host(state), want_state, slice(None), exact=False)
  np.testing.assert_array_equal(progress.reason, want.stop_reason)
  np.testing.assert_array_equal(progress.num_new, want.num_new)

  # A row that starts a turn at its budget stops at once (and counts for exit_after): no step.
  state, progress, call = slots_call(cfg, params, state, progress, [False, True, False, False],
                                     turn + 1, [0, 8, 0, 0], [False, True, False, False], GREEDY,
                                     stop, 1)
  assert int(call.steps) == 0 and int(call.sampled) == 0
  np.testing.assert_array_equal(call.reason, [STOP_STRING, STOP_BUDGET, STOP_MAX_NEW, STOP_EOS])
  np.testing.assert_array_equal(call.num_new, [5, 0, 10, 7])
  np.testing.assert_array_equal(progress.turn, [0, 2, 2, 3])
  assert_rows_equal(host(state), want_state, slice(None), exact=False)


def test_sampled_decode_slots_logprobs_teacher_forced_and_keys_follow_the_trajectory(setup):
  """Temperature sampling: every stored log-prob equals the teacher-forced temperature-1 one
  (sequence_logprobs of the whole row) within 1e-4; and a trajectory samples the same tokens in
  another slot, beside other trajectories, starting in a later call and split over calls."""
  cfg, params = setup
  sampling = SamplingParams(temperature=1.3)
  lengths = {0: 5, 1: 16, 2: 20, 3: 9, 5: 18}   # budget 24: turns of 10, 8, 4, 10, 6 tokens
  by_traj = dict(zip(lengths, prompts(1, lengths.values())))
  stop = stop_tuple("~" * 8, -1, 24)
  teacher = jax.jit(functools.partial(sequence_logprobs, Qwen(cfg)))

  def check_logprobs(state):
    tokens, valid, sampled, logprobs = jax.device_get(
        (state.tokens, state.valid, state.sampled, state.logprobs))
    ref = np.asarray(teacher(params, state.tokens, state.valid)[0])
    assert sampled.any() and (sampled <= valid).all()
    np.testing.assert_allclose(logprobs[sampled], ref[sampled], atol=1e-4)
    assert not logprobs[~sampled].any()
    return tokens

  def traj_tokens(tokens, row, traj):
    return list(tokens[row, lengths[traj]:lengths[traj] + min(MAX_NEW, 24 - lengths[traj])])

  slots = [0, 1, 2, 5]
  state, _, call = slots_call(cfg, params,
                              filled(cfg, params, [by_traj[t] for t in slots], rng=3),
                              init_progress(N, stop[0]), [True] * N, [0] * N, slots, [True] * N,
                              sampling, stop, N)
  np.testing.assert_array_equal(call.num_new, [10, 8, 4, 6])
  tokens = check_logprobs(state)
  first = {t: traj_tokens(tokens, row, t) for row, t in enumerate(slots)}

  # Other slots, trajectory 3 instead of 1, trajectory 0 starting only in the second call, and a
  # call per stopping row.
  slots = [2, 5, 3, 0]
  state = filled(cfg, params, [by_traj[t] for t in slots], rng=3)
  progress = init_progress(N, stop[0])
  start, calls = np.asarray([True, True, True, False]), 0
  while True:
    state, progress, call = slots_call(cfg, params, state, progress, start, [0] * N, slots,
                                       start | (np.asarray(progress.reason) == 0) & (calls > 0),
                                       sampling, stop, 1)
    start, calls = np.asarray([False, False, False, calls == 0]), calls + 1
    if (np.asarray(call.reason) != 0).all() and calls > 1:
      break
  assert calls >= 4
  tokens = check_logprobs(state)
  for row, t in enumerate(slots):
    if t in first:
      assert traj_tokens(tokens, row, t) == first[t], (t, row)


# --------------------------------------------------------------------------- row programs


def test_extend_rows_equals_extend_on_the_full_batch(setup):
  """extend_rows on rows {3, 1} (and a padding row) equals extend of the whole batch with lengths
  0 elsewhere; per-token turn ids are recorded; the other rows are bit-identical."""
  cfg, params = setup
  rows = prompts(2, (5, 9, 3, 12))
  feed = np.asarray(prompts(3, (16, 16, 16)), np.int32)      # [K=3, T=16], row 1 padding
  lengths = np.asarray([6, 5, 9], np.int32)
  turn = 100 + 10 * np.arange(3)[:, None] + np.arange(16)[None]
  before = host(filled(cfg, params, rows))
  got = host(extend_rows(Qwen(cfg), params, filled(cfg, params, rows), jnp.asarray([3, N, 1]),
                         jnp.asarray(feed), jnp.asarray(lengths), jnp.asarray(turn, jnp.int32)))
  full = np.zeros((N, 16), np.int32)
  full[3], full[1] = feed[0], feed[2]
  want = host(extend(Qwen(cfg), params, filled(cfg, params, rows), jnp.asarray(full),
                     jnp.asarray([0, 9, 0, 6], jnp.int32), jnp.full((N,), 7, jnp.int32)))
  np.testing.assert_array_equal(got.length, [5, 18, 3, 18])
  assert_rows_equal(got, before, [0, 2], what="untouched ")
  assert_rows_equal(got.replace(turn_id=want.turn_id), want, [1, 3], exact=False)
  for k, b in ((0, 3), (2, 1)):
    n0 = len(rows[b])
    np.testing.assert_array_equal(got.turn_id[b, n0:n0 + lengths[k]], turn[k, :lengths[k]])
    np.testing.assert_array_equal(got.turn_id[b, :n0], -1)
    assert (got.turn_id[b, n0 + lengths[k]:] == -1).all()


def test_copy_rows_shared_prefill_equals_separate_prefill(setup):
  """Prompts prefilled once in a 2-row state of 16 slots and copied into rows 2 and 0 of a
  32-slot state equal prefilling them there: per-slot arrays and lengths exactly, next logits and
  the logits after a fed continuation within 1e-5; the other rows and the rng untouched."""
  cfg, params = setup
  a, b, c, d = prompts(4, (9, 13, 4, 7))
  src = fill(init_state(cfg, 2, 16, jax.random.key(5)), cfg, params, [a, b], -1)
  before = host(filled(cfg, params, [c, d, c, d], rng=1))
  got = copy_rows(filled(cfg, params, [c, d, c, d], rng=1), jnp.asarray([2, 0, N]), src,
                  jnp.asarray([0, 1, 1]))
  want = filled(cfg, params, [b, d, a, d], rng=1)
  assert_rows_equal(host(got).replace(cache=want.cache), host(want), [0, 2], exact=False)
  assert_rows_equal(host(got), before, [1, 3], what="untouched ")
  np.testing.assert_array_equal(jax.random.key_data(got.rng), before.rng)
  more = prompts(5, (5, 5, 5, 5))
  got = host(fill(got, cfg, params, more, 1))
  want = host(fill(want, cfg, params, more, 1))
  np.testing.assert_allclose(got.next_logits, want.next_logits, atol=3e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="source cache length 32 exceeds the destination's 16"):
    copy_rows(src, jnp.asarray([0]), filled(cfg, params, [a, b, c, d]), jnp.asarray([0]))


def random_state(cfg, seed, rows=N, slots=8):
  """A small state of random contents (no model call)."""
  rng = np.random.RandomState(seed)
  cache = init_state(cfg, rows, slots, jax.random.key(0)).cache
  cache = jax.tree.map(lambda x: jnp.asarray(rng.randn(*x.shape), x.dtype), cache)
  shape = (rows, slots)
  return DecodeState(
      cache=cache, tokens=jnp.asarray(rng.randint(0, 512, shape), jnp.int32),
      valid=jnp.asarray(rng.rand(*shape) < 0.5), sampled=jnp.asarray(rng.rand(*shape) < 0.5),
      logprobs=jnp.asarray(rng.randn(*shape), jnp.float32),
      turn_id=jnp.asarray(rng.randint(-1, 5, shape), jnp.int32),
      versions=jnp.asarray(rng.randint(-1, 3, shape), jnp.int32),
      length=jnp.asarray(rng.randint(0, slots, rows), jnp.int32),
      next_logits=jnp.asarray(rng.randn(rows, cfg.vocab_size), jnp.float32),
      rng=jax.random.key(9))


def test_store_rows_and_take_rows_copy_rows_exactly_and_drop_padding(setup):
  cfg, _ = setup
  state = random_state(cfg, 0)
  ref = host(state)
  out = jax.device_get(store_rows(empty_trajectories(5, 8), jnp.asarray([3, 5, 0]), state,
                                  jnp.asarray([1, 2, 3])))
  empty = jax.device_get(empty_trajectories(1, 8))
  for name in ("tokens", "valid", "sampled", "logprobs", "turn_id", "versions"):
    got, rows = getattr(out, name), getattr(ref, name)
    np.testing.assert_array_equal(got[3], rows[1], err_msg=name)
    np.testing.assert_array_equal(got[0], rows[3], err_msg=name)
    for t in (1, 2, 4):
      np.testing.assert_array_equal(got[t], getattr(empty, name)[0], err_msg=name)
  with pytest.raises(ValueError, match="cache length 8 differs from the trajectories' 6"):
    store_rows(empty_trajectories(5, 6), jnp.asarray([0]), state, jnp.asarray([0]))

  rng = np.random.RandomState(1)
  progress = SlotProgress(
      traj=jnp.asarray([4, 7, 2, 9], jnp.int32), turn=jnp.asarray([1, 2, 3, 4], jnp.int32),
      num_new=jnp.asarray([5, 6, 7, 8], jnp.int32),
      window=jnp.asarray(rng.randint(1, 255, (N, 12)), jnp.uint8),
      reason=jnp.asarray([0, 2, 0, 3], jnp.int32))
  taken, part = take_rows(state, progress, jnp.asarray([2, 0, N]))
  taken, part = host(taken), jax.device_get(part)
  np.testing.assert_array_equal(taken.rng, ref.rng)
  for got, want in zip(jax.tree.leaves(taken.replace(rng=None)),
                       jax.tree.leaves(ref.replace(rng=None))):
    np.testing.assert_array_equal(got, want[[2, 0, N - 1]])
  np.testing.assert_array_equal(part.traj, [2, 4, -1])
  np.testing.assert_array_equal(part.turn, [3, 1, 0])
  np.testing.assert_array_equal(part.num_new, [7, 5, 0])
  np.testing.assert_array_equal(part.reason, [0, 0, 0])
  np.testing.assert_array_equal(part.window[:2], np.asarray(progress.window)[[2, 0]])
  assert not part.window[2].any()


# --------------------------------------------------------------------------- sample_token_rows


def test_sample_token_rows_is_gumbel_max_of_the_filtered_logits_with_each_rows_key():
  """Row b's token is argmax(filtered logits / T + gumbel(keys[b], [V])) with NumPy's filters
  (ties at the top-k and nucleus boundaries included), in both layouts; greedy is the argmax
  whatever the keys; log-probs are temperature-1; a row's token follows its key and logits,
  wherever the row sits."""
  logits = filter_logits_cases()                                        # [12, 40]
  keys = jax.random.split(jax.random.key(21), len(logits))
  settings = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in FILTERS] + [GREEDY]
  perm = np.random.RandomState(0).permutation(len(logits))

  @jax.jit
  def draw(keys, x):
    return [(sample_token_rows(keys, x, s), sample_token_rows(keys, x.T, s, vocab_major=True),
             sample_token_rows(keys[perm], x[perm], s)[0]) for s in settings]

  noise = np.stack([np.asarray(jax.random.gumbel(k, (logits.shape[1],), jnp.float32))
                    for k in keys])
  ref_logp = log_softmax(logits)
  for s, ((tok, logp), (tok_vm, logp_vm), tok_perm) in zip(settings, jax.device_get(
      draw(keys, logits))):
    if s.greedy:
      want = np.argmax(logits, axis=-1)
    else:
      keep = reference_filter(logits, s.temperature, s.top_k, s.top_p)[0]
      want = np.argmax(np.where(keep, logits / np.float32(s.temperature) + noise, -np.inf), -1)
    np.testing.assert_array_equal(tok, want, err_msg=str(s))
    np.testing.assert_array_equal(tok_vm, want, err_msg=f"vocab-major {s}")
    np.testing.assert_array_equal(tok_perm, want[perm], err_msg=f"permuted {s}")
    np.testing.assert_allclose(logp, ref_logp[np.arange(len(want)), want], atol=1e-5)
    np.testing.assert_allclose(logp_vm, logp, atol=1e-6)
  # The draws depend on the keys (a sampler ignoring them would repeat the same tokens).
  plain = settings.index(SamplingParams(temperature=2.0))
  other = jax.random.split(jax.random.key(22), len(logits))
  tokens = lambda ks: np.asarray(draw(ks, logits)[plain][0][0])  # noqa: E731
  assert (tokens(other) != tokens(keys)).any()
  with pytest.raises(ValueError, match="one key per row"):
    sample_token_rows(keys[:3], logits, settings[0])
