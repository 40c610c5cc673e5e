"""CompileCounter counts every program jit has to produce: compiled, or read back from a
persistent compilation cache (the suite runs with one: tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.compiles import CompileCounter, cache_folder, use_persistent_cache


def _fresh_program():
  # A new closure each call: jit's in-memory cache cannot recognize it (a retrace).
  def f(x):
    return jnp.sin(x) * 3.0 + 1.0
  return jax.jit(f)


def test_counts_a_retrace_whether_compiled_or_read_from_the_persistent_cache(tmp_path):
  previous = {name: getattr(jax.config, name) for name in (
      "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
      "jax_persistent_cache_min_entry_size_bytes")}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  try:
    x = jnp.arange(7.0)
    counts, hits = [], []
    hit_events = []
    jax.monitoring.register_event_listener(
        lambda name, **_: hit_events.append(name) if name.endswith("cache_hits") else None)
    for _ in range(2):
      counter, before = CompileCounter(), len(hit_events)
      np.testing.assert_allclose(_fresh_program()(x), np.sin(np.arange(7.0)) * 3 + 1, rtol=1e-6)
      counts.append(counter.count)
      hits.append(len(hit_events) - before)
    program = _fresh_program()
    program(x)
    counter = CompileCounter()
    program(x)  # jit's own cache: nothing produced
    assert counter.count == 0
  finally:
    for name, value in previous.items():
      jax.config.update(name, value)
  # The first is compiled (and written); the second is the same HLO, read back: counted as well.
  assert counts == [1, 1], counts
  assert hits == [0, 1], hits


def test_use_persistent_cache_sets_a_folder_only_where_none_is_set(tmp_path):
  """train.jax_cache_dir: "" leaves jax as it is; a folder is used when none is set; a folder
  already set (JAX_COMPILATION_CACHE_DIR, the suite's shared cache) is kept."""
  previous = jax.config.jax_compilation_cache_dir
  min_seconds = jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    assert use_persistent_cache("") is None
    assert jax.config.jax_compilation_cache_dir is None
    folder = str(tmp_path / "cache")
    assert use_persistent_cache(folder) == folder
    assert jax.config.jax_compilation_cache_dir == folder and (tmp_path / "cache").is_dir()
    # every program is kept, not only those that took >= 1 s (jax's default)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert use_persistent_cache(str(tmp_path / "other")) == folder  # the first one stays
    assert not (tmp_path / "other").exists()
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)


def test_the_default_cache_is_a_folder_of_the_workdir():
  """configs/base.py's train.jax_cache_dir puts a run's programs under its workdir; "" is off; a
  folder without "{workdir}" (a sweep's shared one) is used as it is."""
  from configs import base
  setting = base.get_config("demo").train.jax_cache_dir
  assert cache_folder(setting, "/runs/a/") == "/runs/a/jax_cache"
  assert cache_folder("", "/runs/a") == ""
  assert cache_folder("/shared/jax_cache", "/runs/a") == "/shared/jax_cache"


def test_seconds_sum_the_compile_durations_jax_reports():
  """CompileCounter.seconds is the sum of jax's backend-compile durations since construction
  (the async bench prints it per step: where a GPU run's first steps go)."""
  durations = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, secs, **_: durations.append(secs)
      if name == "/jax/core/compile/backend_compile_duration" else None)
  x5, x6 = np.arange(5.0, dtype=np.float32), np.arange(6.0, dtype=np.float32)
  counter, before = CompileCounter(), len(durations)
  _fresh_program()(x5).block_until_ready()
  _fresh_program()(x6).block_until_ready()
  assert counter.count == 2
  ours = durations[before:]
  assert len(ours) == 2 and counter.seconds > 0
  np.testing.assert_allclose(counter.seconds, sum(ours), rtol=1e-9)


def test_compile_log_names_each_program_and_takes_them_step_by_step():
  """CompileLog: one entry per program produced, named as jit names it, with its seconds; take()
  splits them at its calls; a second call on a seen shape adds nothing; the same counts as
  CompileCounter; jax's logger is left as it was."""
  import logging
  from agentjax.compiles import CompileLog

  def scale_rows(x):
    return x * 2.0

  program = jax.jit(scale_rows)
  three, five = jnp.ones(3), jnp.ones(5)  # made before: their own programs are not logged
  logger = logging.getLogger("jax._src.dispatch")
  level, propagate = logger.level, logger.propagate
  with CompileLog() as log:
    counter = CompileCounter()
    program(three)
    first = log.take()
    program(three)  # jit's own cache: nothing
    program(five)  # a new shape: a new program
    second = log.take()
    assert counter.count == len(log.programs)
  assert [name for name, _ in first] == ["jit(scale_rows)"]
  assert [name for name, _ in second] == ["jit(scale_rows)"]
  assert all(seconds >= 0.0 for _, seconds in log.programs)
  assert log.take() == []
  # each program's source: the innermost agentjax frame (none here: a test's own call)
  assert len(log.sources) == len(log.programs) and set(log.sources) == {"?"}
  assert (logger.level, logger.propagate) == (level, propagate)
  # eager ops inside agentjax's code are named with their line there
  from agentjax.rl.advantages import masked_mean_std
  # an odd length no other test uses: its eager programs are new in any process
  x, mask = np.arange(37.0, dtype=np.float32), np.arange(37) % 2 == 0
  with CompileLog() as log:
    masked_mean_std(x, mask)
  assert log.programs and all(where.startswith("agentjax/rl/advantages.py:")
                              for where in log.sources), log.sources


def test_every_bench_module_imports_and_compiles_is_registered():
  """launch/bench.py imports every bench (agentjax/benchmarks/registry.py): a module that does
  not import breaks them all."""
  from agentjax.benchmarks.registry import BENCHES
  assert "compiles" in BENCHES and all(callable(f) for f in BENCHES.values())


def test_host_values_reach_the_device_without_a_program():
  """parallel.host.to_device: a transfer, not a program (jnp.asarray compiles a copy per shape
  and dtype), with the value and dtype asked for; jitted programs take NumPy as it is."""
  from agentjax.parallel.host import to_device
  rows = np.arange(41, dtype=np.int64)  # an odd length: nothing else made it before
  counter = CompileCounter()
  got = to_device(rows, np.int32)
  flags = to_device([True, False, True])
  assert counter.count == 0
  assert got.dtype == jnp.int32 and np.array_equal(np.asarray(got), rows)
  assert flags.dtype == jnp.bool_ and np.asarray(flags).tolist() == [True, False, True]


def test_an_empty_decode_state_is_one_program_per_shape():
  """sampling.init_state: one program per (config, rows, cache length), made once (each zeros /
  full made eagerly was a program of its own); the empty values; the key copied, not shared."""
  from agentjax.models.qwen.config import QwenConfig
  from agentjax.sampling import init_state
  cfg = QwenConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=8)
  rng = jax.random.key(3)
  counter = CompileCounter()
  state = init_state(cfg, 3, 48, rng)
  assert counter.count == 1
  again = init_state(cfg, 3, 48, rng)
  assert counter.count == 1
  h = jax.device_get(state)
  assert h.tokens.shape == (3, 48) and not h.tokens.any() and not h.valid.any()
  assert (h.turn_id == -1).all() and (h.versions == -1).all() and not h.length.any()
  assert h.next_logits.shape == (3, 64) and not h.next_logits.any()
  assert len(h.cache.keys) == 2 and h.cache.keys[0].shape == (3, 1, 8, 48)
  assert h.cache.values[0].shape == (3, 1, 48, 8) and not h.cache.values[1].any()
  assert state.rng is not rng and again.rng is not state.rng
  np.testing.assert_array_equal(jax.random.key_data(state.rng), jax.random.key_data(rng))
