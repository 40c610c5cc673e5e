"""What the benchmarks share: their flags (define_flags: launch/bench.py's; every bench reads the
ones it needs), timing (median_seconds), the device and its ceilings measured in the same run
(device_name, matmul_peak_flops, copy_bandwidth), the transformers reference model, the PPO
minibatch and byte counts of the update benches, the demo's world, and the repository's test
fixtures that the rollout benches script their policies with (fixture_modules).

Timings are medians over several runs after a warm-up (compilation excluded and reported apart).
Nothing here imports jax at import time: `launch/bench.py fit` must set XLA_FLAGS first.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import statistics
import sys
import time
from typing import Callable

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import flags  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
_defined = False


def define_flags() -> None:
  """Defines the benches' flags (launch/bench.py calls this before parsing; once). Not at import:
  agentjax.studies.sweep defines another --steps, and both packages must import together."""
  global _defined
  if _defined:
    return
  _defined = True
  flags.DEFINE_string("preset", "qwen2.5-0.5b", "Model shape (random weights).")
  flags.DEFINE_integer("batch", None, "Batch size (forward: 4, decode: 16).")
  flags.DEFINE_integer("length", None, "Tokens per sequence (forward: 512) or prompt (decode: "
                       "256).")
  flags.DEFINE_integer("steps", 20, "sft_step: steps compared (and timed, round robin).")
  flags.DEFINE_string("dtype", "float32", "Compute and parameter dtype: float32 or bfloat16.")
  flags.DEFINE_integer("repeats", 3, "Timed runs (the median is reported).")
  flags.DEFINE_integer("new_tokens", 128, "decode: tokens generated per sequence.")
  flags.DEFINE_integer("think_tokens", 60, "rollout: tokens of thinking before each action.")
  flags.DEFINE_integer("lora_rank", 0, "decode: > 0 compares the bare model with one LoRA adapter "
                       "of this rank (merged and unmerged decode); train_step: the adapters' rank.")
  flags.DEFINE_float("lora_alpha", 0.0, "LoRA alpha (0: equal to the rank, config.model.lora's "
                     "default).")
  flags.DEFINE_string("time_preset", "", "train_step: preset whose steps are timed (default: "
                      "--preset); memory is always analysed at --preset.")
  flags.DEFINE_list("time_layers", [], "train_step: time the steps at these depths of "
                    "--time_preset (e.g. 4,8) instead of its own, and extrapolate to it (when full "
                    "fine-tuning at the preset's depth does not fit in memory).")
  flags.DEFINE_bool("memory", True, "train_step: analyse memory at --preset (--nomemory: time "
                    "only).")
  flags.DEFINE_integer("questions", None, "rollout_mix: questions per rollout (default 6; the "
                       "batch is questions x group_size trajectories).")
  flags.DEFINE_integer("group_size", None, "rollout_mix: rollouts per question (default 8).")
  flags.DEFINE_integer("search_latency_ms", 20, "rollout_mix: the retriever's added latency per "
                       "search call (batched: one call per batch of queries).")
  flags.DEFINE_integer("judge_latency_ms", 200, "async: the judge's added latency per batch "
                       "call.")
  flags.DEFINE_bool("async_partial", False, "async: also async_steps 1 and 2 with "
                    "rollout.partial='continue' (rollouts move to the parameters published "
                    "mid-flight).")
  flags.DEFINE_integer("async_split", 0, "async: > 0 also runs the split placement, this many "
                       "fake CPU devices sampling and as many training (2x fake devices in all; "
                       "every setting then runs on them).")
  flags.DEFINE_integer("slots", 0, "rollout_mix: the slot engine's rollout.slots (0: one per "
                       "trajectory).")
  flags.DEFINE_string("compact_factors", "2", "rollout_mix: the slot engine's "
                      "rollout.compact_factor, one engine per value (comma-separated; the "
                      "first is the one `ratio` compares)")
  flags.DEFINE_string("mix_model", "scripted", "rollout_mix: 'scripted' (the tiny scripted Qwen) "
                      "or a preset name (e.g. qwen2.5-1.5b): the same script at that shape's "
                      "compute, in --dtype.")
  flags.DEFINE_integer("mix_layers", 0, "rollout_mix, async: --mix_model's depth (0: the "
                       "preset's); e.g. 1 for a CPU dry run of a GPU shape (its programs and "
                       "compile count are the real depth's, its time is not).")
  flags.DEFINE_float("overload_s", 20.0, "server_overload: seconds of load per server, for one "
                     "client and for --overload_clients clients each.")
  flags.DEFINE_integer("overload_clients", 64, "server_overload: concurrent clients of the "
                       "overload.")
  flags.DEFINE_integer("overload_max_pending", 8, "server_overload: both servers' --max_pending "
                       "(below the clients, so that the bound is exercised).")
  flags.DEFINE_float("overload_bad_share", 0.1, "server_overload: share of malformed or "
                     "oversized requests (half each).")
  flags.DEFINE_integer("overload_docs", 300, "server_overload: synthetic documents of the "
                       "retriever's BM25 index.")
  flags.DEFINE_list("overload_servers", ["retriever", "serve"], "server_overload: the servers "
                    "loaded (retriever: launch/retriever.py, serve: launch/serve.py).")
  flags.DEFINE_bool("no_reference", False, "Skip the transformers reference (e.g. on a GPU host "
                    "without torch); reports throughput and MFU only.")


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def mix_shape():
  """The QwenConfig the scripted mix policy runs at (--mix_model, --mix_layers, --dtype), or
  None for the tiny scripted model itself (tests/agent_fixtures.mix_params)."""
  if FLAGS.mix_model == "scripted":
    return None
  from agentjax.models.qwen import QwenConfig
  depth = {"num_layers": FLAGS.mix_layers} if FLAGS.mix_layers else {}
  return QwenConfig.preset(FLAGS.mix_model, tie_word_embeddings=False, dtype=FLAGS.dtype,
                           param_dtype=FLAGS.dtype, **depth)


def device_name() -> str:
  import jax

  dev = jax.devices()[0]
  if dev.platform == "cpu":
    return f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
  return f"{dev.platform}: {dev.device_kind} x{jax.device_count()}"


def matmul_peak_flops(dtype, n: int = 4096, repeats: int = 5) -> float:
  """Measured peak of one large square matmul on the default device, FLOP/s."""
  import jax
  import jax.numpy as jnp

  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a: a @ a)
  f(a).block_until_ready()
  secs = median_seconds(lambda: f(a).block_until_ready(), repeats)
  return 2 * n ** 3 / secs


def reference_model(cfg):
  """A random transformers model of cfg's shape, and the same weights as agentjax params."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM

  from agentjax.models.qwen.checkpoint import params_from_tensors

  torch.manual_seed(0)
  model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.to_hf_dict())).eval()
  tensors = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  return model, params_from_tensors(cfg, tensors)


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
  """Measured device memory bandwidth, bytes/s: x + 1 over a float32 array (read and write)."""
  import jax
  import jax.numpy as jnp

  # The input is donated, so each call writes into the buffer it reads: steady-state bandwidth,
  # not the page faults of a fresh 1 GB output. Ten chained calls per timing, one sync: on a GPU
  # one call is under a millisecond.
  f = jax.jit(lambda x: x + 1, donate_argnums=0)
  box = [f(jnp.zeros((nbytes // 4,), jnp.float32)).block_until_ready()]

  def ten():
    for _ in range(10):
      box[0] = f(box[0])
    box[0].block_until_ready()

  return 10 * 2 * nbytes / median_seconds(ten, repeats)


def tree_bytes(tree) -> int:
  import jax

  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def ppo_minibatch(vocab: int, b: int, length: int) -> dict:
  """A PPO minibatch of random tokens [b, length]: every slot valid, the last 3/4 of each row
  the policy's (loss_mask), old and reference log-probs near a uniform policy's, one advantage
  per row (the values change no shape or cost; they keep the loss and its gradient finite)."""
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.RandomState(0)
  mask = np.broadcast_to(np.arange(length) >= length // 4, (b, length))
  logp = lambda: (-np.log(vocab) + 0.1 * rng.randn(b, length)) * mask  # noqa: E731
  return {"tokens": jnp.asarray(rng.randint(0, vocab, (b, length)), jnp.int32),
          "valid": jnp.ones((b, length), bool), "loss_mask": jnp.asarray(mask),
          "old_logp": jnp.asarray(logp(), jnp.float32),
          "ref_logp": jnp.asarray(logp(), jnp.float32),
          "advantages": jnp.asarray(rng.randn(b, 1) * mask, jnp.float32)}


def demo_world(tmp: str, topk: int) -> str:
  """The SynthWorld folder of `make demo` if it was built, else a fresh one under tmp."""
  from agentjax.data.demo_world import build_demo_world
  from configs import base as base_config

  world = os.path.join(base_config.DEMO_ROOT, "synthworld")
  if not os.path.isfile(os.path.join(world, "tokenizer", "tokenizer.json")):
    world = os.path.join(tmp, "synthworld")
    build_demo_world(world, topk=topk)
  return world


def fixture_modules(*names: str) -> list:
  """The repository's tests/<name>.py modules (the scripted tokenizer and agent, the corpus, the
  slow retriever backend the rollout benches run): its `tests` package, which is not installed,
  imported from its folder in this checkout as `tests` (unless already imported, as under
  pytest), then tests.<name> for each name."""
  if "tests" not in sys.modules:
    folder = os.path.join(REPO, "tests")
    spec = importlib.util.spec_from_file_location("tests", os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["tests"] = module
    spec.loader.exec_module(module)
  return [importlib.import_module(f"tests.{name}") for name in names]
