"""Shared fixtures: tiny random Hugging Face checkpoints and tokenizers, built locally.

There is no model hub here: transformers itself writes random checkpoints, and the `tokenizers`
library trains a small byte-level BPE.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from tests import hf_fixtures  # noqa: E402


_CACHE_ENV = "AGENTJAX_TEST_JAX_CACHE"


def pytest_configure(config):
  # `make test` deselects these (-m "not slow"); `make test-all` runs them too.
  config.addinivalue_line("markers", "slow: end-to-end checks of minutes (make test-all only)")
  _compile_fast()
  _share_compiled_programs(config)


# LLVM's optimization level for the programs XLA:CPU compiles in the suite (and, through the
# environment, in the subprocesses it starts: tests/subprocess_env.py keeps the flag).
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def _compile_fast():
  """Compile the suite's programs without LLVM's optimizations (unless XLA_FLAGS chose a level).

  The suite's programs are tiny and mostly run once or a few times, so compiling them is most of
  its time; optimizing their machine code does not pay for itself (tests/test_ppo.py: 118 s ->
  98 s; one CW-GRPO test: 44 s -> 34 s; the default suite with two workers: 801 s -> 632 s on one
  2-core machine, 2026-11-26). What the suite checks is unchanged: the code computes the same
  operations, only its float32 rounding can differ where sums run in another order (three
  tolerances were widened for it, each by a comment). Runs outside the suite keep XLA's default.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_FLAG}".strip()


def _share_compiled_programs(config):
  """Every compiled program goes to a persistent compilation cache that this pytest run's
  processes share (its xdist workers inherit the folder through the environment).

  Most of the suite's time is XLA compiling tiny programs, and most programs are compiled more
  than once: each worker compiles the model's programs for itself, and each train() builds its
  update step as a fresh closure, which jit cannot recognize (a second identical train() in one
  process recompiled its 8.6 s update step). The persistent cache keys a program by its HLO, so
  an identical program is read back instead (a tiny IGPO train(): 52 s, 37 s of it compiling, on
  a cold cache; 17 s on a warm one; the whole suite with two workers: 974 s -> 751 s on one 2-core
  machine, 2026-11-26). Programs still compile once, so what the suite checks is
  unchanged; CompileCounter counts cache reads as compilations, so the tests that count
  compilations still see a retrace.
  AGENTJAX_TEST_JAX_CACHE: a folder to keep between runs (kept), or "off".
  """
  folder = os.environ.get(_CACHE_ENV)
  if folder == "off":
    return
  if not folder:
    import tempfile
    folder = tempfile.mkdtemp(prefix="agentjax-test-jax-cache-")
    os.environ[_CACHE_ENV] = folder
    config._agentjax_cache_to_remove = folder  # made by this process: removed at its end
  # The same settings through the environment: the launch scripts and multi-device checks the
  # tests start as subprocesses share the folder too.
  settings = {"jax_compilation_cache_dir": folder,
              "jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": -1}
  import jax
  for name, value in settings.items():
    os.environ[name.upper()] = str(value)
    jax.config.update(name, value)
  # No size bound: with one, every write lists the whole folder to evict (quadratic in the
  # suite's ~5,000 programs: it made the suite slower than no cache). Without it there is no file
  # lock either; an entry read while another worker writes it fails to decompress, and jax then
  # warns and compiles the program itself.


def pytest_unconfigure(config):
  folder = getattr(config, "_agentjax_cache_to_remove", None)
  if folder:
    import shutil
    shutil.rmtree(folder, ignore_errors=True)


# The modules that take longest (each over ~40 s on 2 cores, most of it compiling), run first:
# pytest-xdist hands whole files to its workers in collection order, so with these at the end
# (alphabetical order puts test_trainer*.py there) one worker finished minutes before the other.
HEAVY_FIRST = ("test_trainer", "test_ppo", "test_dac", "test_launch", "test_rl_step",
               "test_slot_rollout", "test_cw_grpo", "test_sft", "test_trainer_lora",
               "test_microbatch")


def pytest_collection_modifyitems(session, config, items):
  rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
  module = lambda item: item.module.__name__.rsplit(".", 1)[-1]  # noqa: E731
  items.sort(key=lambda item: rank.get(module(item), len(rank)))  # stable: files keep their order


def _maps_in_use() -> int | None:
  """Memory mappings of this process (Linux), or None where /proc cannot tell."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def _map_budget() -> int:
  """Mappings the suite may hold before it drops jax's caches: half of vm.max_map_count."""
  if os.environ.get("AGENTJAX_TEST_MAP_BUDGET"):
    return int(os.environ["AGENTJAX_TEST_MAP_BUDGET"])
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read()) // 2
  except (OSError, ValueError):
    return 65530 // 2


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
  """After a module's last test, drop jax's caches once the process holds half of the memory
  mappings Linux allows.

  XLA:CPU maps each executable's code into the process with its own memory mappings, and jit's
  caches keep every executable alive: one process running the whole suite passed Linux's
  vm.max_map_count (65530) late in tests/test_trainer.py, and LLVM's next mapping failed with a
  segfault (CI, 2026-11-26; reproduced by lowering vm.max_map_count to 4000 and running
  tests/test_trainer.py alone). Dropping the caches frees them (one module peaks at ~6,000
  mappings); doing it only when needed keeps the programs later modules share. Where /proc
  cannot count, after every module.
  """
  if nextitem is not None and nextitem.module is item.module:
    return
  used = _maps_in_use()
  if used is None or used > _map_budget():
    import gc

    import jax
    jax.clear_caches()
    gc.collect()
    if used is not None:
      print(f"\n[conftest] {used} memory mappings after {item.module.__name__}: jax's caches "
            f"dropped ({_maps_in_use()} now)")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
  """A byte-level BPE tokenizer folder with a Qwen-style chat template."""
  return hf_fixtures.make_tokenizer_dir(str(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
  """Factory: hf_checkpoint(name) -> (folder, transformers model in eval mode), cached per name."""
  cache = {}

  def build(name: str, **save_kwargs):
    key = (name, tuple(sorted(save_kwargs.items())))
    if key not in cache:
      folder = str(tmp_path_factory.mktemp(name))
      cache[key] = (folder, hf_fixtures.make_checkpoint(name, folder, **save_kwargs))
    return cache[key]

  return build


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
  """A small SynthWorld written to disk (corpus, splits, demonstrations)."""
  from agentjax.data import SynthWorld

  world = SynthWorld.generate(seed=3, n_entities=200, n_train=150, n_dev=30, n_test=30)
  out = str(tmp_path_factory.mktemp("synthworld"))
  world.write(out, topk=3, index_dir=str(tmp_path_factory.mktemp("bm25")))
  return out


@pytest.fixture(scope="session")
def tokenizer(world_dir, tmp_path_factory):
  """A 1024-token byte-level BPE trained on that world, tags as single tokens."""
  from agentjax.data.tokenizer import synthworld_texts, train_tokenizer
  from agentjax.models.tokenizer import load_tokenizer

  folder = str(tmp_path_factory.mktemp("tokenizer"))
  assert train_tokenizer(synthworld_texts(world_dir), folder, vocab_size=1024) == folder
  return load_tokenizer(folder)


@pytest.fixture(scope="session")
def chat_model_dir(hf_checkpoint, tiny_tokenizer_dir, tmp_path_factory):
  """A Hugging Face folder "tiny-chat": the tiny random qwen2-chat checkpoint with the chat-template
  tokenizer beside it (what Completer.from_hf, the local judge and launch/serve.py load)."""
  import shutil
  src, _ = hf_checkpoint("qwen2-chat")
  folder = tmp_path_factory.mktemp("chat_model") / "tiny-chat"
  folder.mkdir()
  for d in (src, tiny_tokenizer_dir):
    for name in os.listdir(d):
      shutil.copy(os.path.join(d, name), folder)
  return str(folder)


@pytest.fixture(scope="session")
def scripted_world(tmp_path_factory):
  """(tokenizer, BM25 backend, ScriptedAgent): the scripted search agent of tests/agent_fixtures.py
  over the invented corpus of tests/retrieval_fixtures.py, built once for every test module."""
  from agentjax.retrieval import make_backend
  from tests import agent_fixtures as af
  from tests import retrieval_fixtures

  root = tmp_path_factory.mktemp("scripted_world")
  tok = af.scripted_tokenizer(str(root / "tok"))
  backend = make_backend("bm25", corpus_path=retrieval_fixtures.write_corpus(root / "c.jsonl"),
                         index_dir=str(root / "index"))
  return tok, backend, af.ScriptedAgent(tok)


@pytest.fixture(scope="session")
def world(scripted_world):
  """scripted_world under the name the rollout and step tests use (a module may define its own
  `world`, which then wins)."""
  return scripted_world
