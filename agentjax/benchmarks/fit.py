r"""The fit check (its command lines: launch/fit.py and `launch/bench.py fit`): compile (never
run) a preset's device programs on N fake CPU devices and say whether each fits in one
device's memory. force_devices must run before jax is imported (it sets XLA_FLAGS): nothing
here imports jax at import time.

Parameters, optimizer state and every batch are abstract (jax.ShapeDtypeStruct with the
NamedSharding the rules table gives them on the preset's mesh): nothing is allocated. Each program
is built by the code the trainer runs, lowered with those abstract arguments and compiled:

  rollout/prefill, /decode, /feed  the rollout (trainer.rollout_config; sampling.extend, the slot
                                   engine's decode_slots and row feed, or generate for "turns")
  generator_rollout/...            DAC's generator rollout (one answer turn per evidence set)
  score/policy, /reference         rl.score_batch's passes (IGPO's packed probes or plain
                                   log-probs; the KL reference's), score_<role>/... for DAC
  update                           RLStep.build's policy update (DAC: its roles update)
  critic_values, critic_update     PPO's critic (the Critic RLStep.build makes)
  judge/prefill, /decode           a local judge's Completer (judge.backend "local")

With rl.micro_batch_size the scoring passes and the updates are the micro-batched programs the
step builds. `compiled.memory_analysis()` gives, per device, the bytes of a program's arguments,
outputs, temporaries and of the outputs aliased to (donated) arguments. For each program:

  peak  = argument + output + temp - alias      (the program's own buffers, per device)
  live  = bytes per device of what stays allocated outside the program while it runs (the rest of
          the train state: optimizer moments, the KL reference, the critic; during a rollout the
          other lanes' decode states, the prompts' state and the finished trajectories)
  total = peak + live                           (compared with --device_memory_gb)
  gather = bytes the program's all-gathers produce (FSDP: mostly weights; a hint, not a sum of
          live buffers)

The shapes are the worst case the code can reach at the preset's settings: the full KV-cache
budget cache_size(rollout.max_total_tokens) (decode and feed without a kv_window: the widest program
of the window ladder), every slot of a lane fed at once, batches trimmed to the token budget
(rl.trim's widest), rollout prompts of --prompt_tokens. Decode programs are
compiled in the layout GPUs and TPUs run (checkpoint-size kernels, LoRA adapters unmerged), not
the CPU's decode layout copy (sampling.decode_layout). model.attention "auto" compiles as
blockwise here (a GPU runs cudnn, a TPU splash: both also linear in the sequence). Buffer sizes
from the CPU compiler approximate those of a GPU or TPU compile (fusion and scheduling differ);
treat a few percent of headroom as noise.

The update's outputs are also checked: new parameters and optimizer state must come out sharded
as they went in (a replicated gradient or parameter would cost its full size on every device and
defeat donation); a mismatch is reported under "problems".

The last printed line is one JSON object: {"fits", "peak_gb" (the largest total),
"device_memory_gb", "programs": {name: {argument_gb, output_gb, temp_gb, alias_gb, peak_gb,
live_gb, total_gb, gathered_gb, compile_s, shape}}, "too_big", "problems", "state_gb", ...}.
Exit status 1 when a program does not fit (its name is printed).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
import time
from typing import Any, Callable

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file and preset, e.g. "
                                          "configs/igpo.py:qwen2.5-7b.", lock_config=False)
_DEVICES = flags.DEFINE_integer("devices", 8, "fit: fake CPU devices (the mesh is the preset's "
                                "config.mesh over them; 0: the devices this machine has).")
_MEMORY = flags.DEFINE_float("device_memory_gb", 80.0, "fit: memory of one device, GB (1e9 B; "
                             "0: the device's own limit where jax reports one, else none).")
_MODEL = flags.DEFINE_string("model_preset", "", "fit: a QwenConfig preset (e.g. tiny, "
                             "qwen2.5-0.5b) in place of the config's model (shape only).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 0, "fit: rollout prompt length (0: 1024 for a "
                               "multi-turn agent, the budget less one turn for one turn).")
_PROBE = flags.DEFINE_integer("probe_tokens", 32, "fit: IGPO probe width A (template + answer).")
_JUDGE = flags.DEFINE_string("judge_preset", "", "fit: the local judge's shape (a QwenConfig "
                             "preset) when judge.backend=local and judge.hf_path has no "
                             "config.json.")
_LAYERS = flags.DEFINE_integer("num_layers", 0, "fit: a reduced-depth proxy (the model's widths "
                              "with this many layers; 0: the model's own) to attribute memory to "
                              "what grows with depth and what does not, in seconds.")
_BACKEND = flags.DEFINE_enum("backend", "cpu", ["cpu", "gpu"], "fit: compile with the CPU "
                             "compiler on --devices fake CPU devices (anywhere), or with the GPU "
                             "compiler on --devices mock GPUs (jax_mock_gpu_topology: one real "
                             "GPU stands for each; compile only, on a machine with one GPU).")
_EXTRAPOLATE = flags.DEFINE_list("extrapolate", [], "fit: two depths (e.g. 2,4): compile the "
                                 "preset at each (--num_layers) and extrapolate each program's "
                                 "total linearly to the model's depth; `fits` then says whether "
                                 "the extrapolated totals fit (a full compile takes 10-25 min "
                                 "on a CPU; these, seconds to a minute).")
_LADDERS = flags.DEFINE_bool("ladders", False, "fit: every shape of the slot engine's programs "
                             "(lane sizes x key windows, row buckets; agent.slots.SlotLadder) "
                             "and eval's rollout, not only the widest of each (launch/"
                             "precompile.py sets it).")
_PROGRAMS = flags.DEFINE_list("programs", [], "fit: only these programs (names or prefixes; "
                              "default: all).")

GB = 1e9

# Shapes of checkpoints the config presets name (model.hf_path) that QwenConfig.PRESETS lacks
# (Hugging Face config.json of the release).
EXTRA_SHAPES = {
    "qwen3-14b": dict(model_type="qwen3", vocab_size=151936, hidden_size=5120,
                      intermediate_size=17408, num_layers=40, num_heads=40, num_kv_heads=8,
                      head_dim=128, rope_theta=1_000_000.0, tie_word_embeddings=False,
                      qkv_bias=False, qk_norm=True, max_position_embeddings=40960),
}


# ============================================================================ abstract values


def place(abstract: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying shardings (a tree of them, like `abstract`)."""
  import jax
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract, shardings)


def sharded_like(mesh, tree: Any, axes: Any) -> Any:
  """`tree`'s ShapeDtypeStructs sharded by the rules table from logical `axes` (a tree of
  PartitionSpecs of logical names, or one for every leaf)."""
  import jax
  from jax.sharding import PartitionSpec
  from agentjax.parallel import logical_to_sharding
  if isinstance(axes, PartitionSpec):
    axes = jax.tree.map(lambda _: axes, tree)
  return place(tree, logical_to_sharding(axes, tree, mesh))


def sds(shape, dtype) -> Any:
  import jax
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (unsharded: whole)."""
  import jax
  import numpy as np
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.shape if getattr(x, "sharding", None) is None else x.sharding.shard_shape(x.shape)
    key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    itemsize = 8 if key else np.dtype(x.dtype).itemsize  # a threefry key: two uint32
    total += math.prod(shape) * itemsize
  return total


def model_config(config: Any, model_preset: str = ""):
  """The QwenConfig of config.model (shape from --model_preset, the hf_path folder's config.json,
  a preset named like the folder, or model.preset with model.shape), numerics from config.model."""
  from agentjax.models.qwen import QwenConfig
  m = config.model
  numerics = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy,
                  attention=m.get("attention", "auto"),
                  attention_block=m.get("attention_block", 512))
  cfg = hf_config(m.hf_path, model_preset, **numerics)
  if cfg is not None:
    return cfg
  shape = {k: v for k, v in m.shape.items() if v}
  return QwenConfig(**{**_shape_preset(m.preset), **shape, **numerics})


def hf_config(path: str, preset: str = "", **numerics):
  """The QwenConfig of a Hugging Face folder: `preset`'s shape when given, else its
  config.json, else the preset named like the folder (Qwen2.5-7B-Instruct: qwen2.5-7b); None
  when none applies."""
  from agentjax.models.qwen import PRESETS, QwenConfig
  if preset:
    return QwenConfig(**{**_shape_preset(preset), **numerics})
  path = os.path.expanduser(path) if path else ""
  if path and os.path.isfile(os.path.join(path, "config.json")):
    return QwenConfig.from_hf_folder(path, **numerics)
  if path:
    name = os.path.basename(path.rstrip("/")).lower().removesuffix("-instruct")
    if name in PRESETS or name in EXTRA_SHAPES:
      return QwenConfig(**{**_shape_preset(name), **numerics})
  return None


def _shape_preset(name: str) -> dict:
  from agentjax.models.qwen import PRESETS, ConfigError
  if name in PRESETS:
    return dict(PRESETS[name])
  if name in EXTRA_SHAPES:
    return dict(EXTRA_SHAPES[name])
  raise ConfigError(f"unknown model shape {name!r}; known: "
                    f"{sorted(PRESETS) + sorted(EXTRA_SHAPES)}")


# ============================================================================ programs


@dataclasses.dataclass
class Program:
  """One device program to compile: fn(*args, **kwargs) lowered with abstract args (static
  arguments concrete). live: bytes per device allocated outside it while it runs.
  check: optional compiled -> [problem strings] (the update's output shardings)."""
  name: str
  fn: Callable
  args: tuple
  live: int
  kwargs: dict = dataclasses.field(default_factory=dict)
  check: Callable | None = None
  note: str = ""


@dataclasses.dataclass
class Setup:
  """What every program builder reads: the run config, model, mesh and the train state's
  abstract arrays with their per-device sizes."""
  config: Any
  cfg: Any
  mesh: Any
  spec: Any                  # LoraSpec or None
  params: Any                # the policy's params as its model runs them (LoRA: attached)
  trainable: Any             # what the optimizer updates (full params or {name: adapter})
  opt_state: Any
  backbone: Any              # LoRA: the frozen backbone (= params' backbone leaves); else None
  ref: Any                   # the KL reference's params (full FT with KL: a copy), else None
  sizes: dict                # component -> bytes per device: params, opt_state, reference, critic
  target: Any = None         # train/adapters.TrainTarget (what the optimizer trains)
  optimizer: Any = None      # the policy's optax transformation (target.optimizer)
  judge_params: Any = None   # a local judge's params (judge.backend "local"), abstract
  critic: Any = None         # train/critic.Critic (PPO)
  critic_state: Any = None   # {"params", "opt_state"} abstract

  def state_bytes(self, *without: str) -> int:
    """Bytes per device of the train state, less the named components (passed as arguments)."""
    return sum(v for k, v in self.sizes.items() if k not in without)


def make_setup(config: Any, mesh: Any, cfg: Any, judge_cfg: Any = None) -> Setup:
  """The train state as init_train_state builds it, abstract: params (policy and, with KL, its
  reference copy), optimizer state sharded like the params, the critic's state (PPO), a local
  judge's params (judge_cfg)."""
  import jax
  from agentjax.models.qwen import abstract_params, param_shardings
  from agentjax.train import config as config_lib
  from agentjax.train.adapters import TrainTarget
  from agentjax.train.critic import Critic, needs_critic
  from agentjax.train.step import schedule_args, updates_per_step
  from agentjax.train.trainer import opt_state_shardings

  spec = config_lib.lora_spec(config)
  backbone = place(abstract_params(cfg), param_shardings(cfg, mesh))
  if spec is None:
    trainable, params, shardings = backbone, backbone, param_shardings(cfg, mesh)
    target = TrainTarget(cfg, None, None, trainable)
  else:
    target = TrainTarget(cfg, spec, backbone, None, own_lrs=config_lib.lora_rates(config),
                         roles=config_lib.trained_roles(config))
    shardings = target.shardings(mesh)
    from agentjax.models.qwen import adapter_abstract
    trainable = place({n: adapter_abstract(cfg, spec) for n in spec.names}, shardings)
    target.trainable = trainable
    params = place(abstract_params(cfg, spec), param_shardings(cfg, mesh, spec))
  lr, warmup, total, final_ratio = schedule_args(config)
  optimizer = target.optimizer(config, lr, warmup, total, final_ratio, config.optimizer.b2)
  opt_state = place(jax.eval_shape(optimizer.init, trainable),
                    opt_state_shardings(optimizer, trainable, shardings, mesh))
  ref = backbone if (spec is None and config.rl.kl_coef > 0) else None
  sizes = {"params": device_bytes(params), "opt_state": device_bytes(opt_state),
           "reference": device_bytes(ref) if ref is not None else 0}
  setup = Setup(config=config, cfg=cfg, mesh=mesh, spec=spec, params=params, trainable=trainable,
                opt_state=opt_state, backbone=backbone if spec is not None else None, ref=ref,
                sizes=sizes, target=target, optimizer=optimizer)
  if judge_cfg is not None:  # loaded once, held for the whole run
    setup.judge_params = place(abstract_params(judge_cfg), param_shardings(judge_cfg, mesh))
    sizes["judge"] = device_bytes(setup.judge_params)
  if needs_critic(config):
    setup.critic = Critic.build(config, target, updates_per_step(config))
    setup.critic_state = setup.critic.abstract_state(mesh)
    sizes["critic"] = device_bytes(setup.critic_state)
  return setup


def _decode_model(s: Setup, cfg: Any = None, lora: Any = "policy"):
  """(model, abstract params) of the decode loop as a GPU/TPU runs it: checkpoint-size kernels,
  LoRA unmerged. On CPU sampling.decode_layout would copy the kernels out-major inside the
  program; an out-major model is taken as it is, so it is compiled in that layout (same sizes).
  cfg, lora: another model's (the judge's) instead of the policy's."""
  import jax
  import flax.linen as nn
  from agentjax.models.qwen import Qwen
  from agentjax.models.qwen import model as qwen_model
  from agentjax.parallel import logical_to_sharding
  model = Qwen(cfg or s.cfg, out_major=True, lora=s.spec if lora == "policy" else lora)
  boxed = jax.eval_shape(lambda r: model.init(r, *qwen_model._dummy_inputs())["params"],
                         jax.random.key(0))
  abstract = nn.meta.unbox(boxed)
  return model, place(abstract, logical_to_sharding(nn.get_partition_spec(boxed), abstract,
                                                    s.mesh))


def _state(s: Setup, rows: int, cache_len: int, cfg: Any = None) -> Any:
  """An abstract DecodeState of `rows` x `cache_len` (the policy's model, or `cfg`'s), placed
  like init_state(mesh=...)."""
  import jax
  from agentjax.sampling import init_state, state_logical_axes
  state = jax.eval_shape(lambda: init_state(cfg or s.cfg, rows, cache_len, jax.random.key(0)))
  return sharded_like(s.mesh, state, state_logical_axes(state))


def _stop(s: Setup, rollout: Any, vocab: int = 0) -> tuple:
  """(StopTable, eos ids, budget) as abstract arrays: the vocabulary's token bytes at their
  widest (stops.MAX_TOKEN_BYTES), the rollout protocol's stop strings (rollout None: a
  Completer's padded table, 4 x 16)."""
  import jax.numpy as jnp
  from agentjax.agent.protocol import get_protocol
  from agentjax.sampling.stops import MAX_TOKEN_BYTES, StopTable
  if rollout is None:
    m, ls = 4, 16
  else:
    stops = [x.encode() for x in get_protocol(rollout.protocol).stop_strings]
    m, ls = len(stops), max([len(x) for x in stops], default=1)
  v = vocab or s.cfg.vocab_size
  table = StopTable(token_bytes=sds((v, MAX_TOKEN_BYTES), jnp.uint8),
                    token_len=sds((v,), jnp.int32), stops=sds((m, ls), jnp.uint8),
                    stop_len=sds((m,), jnp.int32))
  return table, sds((2,), jnp.int32), sds((), jnp.int32)


def rollout_programs(s: Setup, rollout, questions: int, prefix: str = "rollout",
                     prompt_tokens: int = 0, live: int = 0, ladder: bool = False
                     ) -> list[Program]:
  """The rollout's programs for `questions` x rollout.group_size trajectories.

  slots engine: the prompts' prefill (`extend` on a [rollout.prefill_rows, bucket(prompt)]
  state: one chunk of the Q prompts), one lane's
  decode call (`decode_slots` over ceil(slots / lanes) rows, the whole KV budget), the
  observation feed of a lane's rows (`_extend_tokens` on every row of the lane at once, the
  widest feed); turns engine: the prefill, `generate` and the feed on the whole batch.
  live: bytes per device allocated beside the rollout (e.g. an earlier role's batch).
  ladder: the slot engine's every program instead (slot_ladder_programs)."""
  import jax.numpy as jnp
  from agentjax.agent.slots import MIN_ROWS
  from agentjax.models.qwen import Qwen
  from agentjax.sampling import (SamplingParams, bucket, cache_size, decode_slots, extend,
                                 generate)
  from agentjax.sampling import slots as slot_programs
  from agentjax.sampling.slots import SlotProgress

  model = Qwen(s.cfg, lora=s.spec)
  dmodel, dparams = _decode_model(s)
  count = questions * rollout.group_size
  cache_len = cache_size(rollout.max_total_tokens)
  budget = min(rollout.max_total_tokens, cache_len)
  if not prompt_tokens:
    one_turn = budget - rollout.max_new_tokens - 1
    prompt_tokens = one_turn if rollout.max_turns == 1 else min(1024, one_turn)
  width = bucket(prompt_tokens)
  state_live = s.state_bytes("params") + live  # the train state beside the policy's params
  obs = bucket(rollout.max_obs_tokens)
  sampling = rollout.sampling if isinstance(rollout.sampling, SamplingParams) else SamplingParams()
  stop = _stop(s, rollout)
  i32, b = jnp.int32, jnp.bool_
  out = []
  if rollout.engine == "turns":
    state = _state(s, count, cache_len)
    note = f"{count} trajectories x {cache_len} cache slots"
    out.append(Program(f"{prefix}/prefill", extend,
                       (model, s.params, state, sds((count, width), i32), sds((count,), i32),
                        sds((count,), i32)), live=state_live, note=f"{note}, {width} tokens"))
    out.append(Program(f"{prefix}/decode", generate,
                       (dmodel, dparams, state, sds((count,), b), sds((count,), i32), stop,
                        sampling, rollout.max_new_tokens), live=state_live, note=note))
    if rollout.max_turns > 1:
      out.append(Program(f"{prefix}/feed", extend,
                         (model, s.params, state, sds((count, obs), i32), sds((count,), i32),
                          sds((count,), i32)), live=state_live, note=f"{note}, {obs} tokens"))
    return out

  from agentjax.agent.slots import SlotLadder
  ladder_sizes = SlotLadder.of(rollout, count, cache_len, width, 1)  # the engine's own sizes
  per_lane, chunk = ladder_sizes.sizes[0], ladder_sizes.chunk  # a lane; the prefill's chunk
  lanes = math.ceil(min(rollout.slots or count, count) / per_lane)
  prompts = _state(s, chunk, width)
  lane = _state(s, per_lane, cache_len)
  # The finished trajectories' buffer (tokens, valid, sampled, logprobs, turn_id, versions per
  # slot).
  traj = count * cache_len * (4 + 1 + 1 + 4 + 4 + 4)
  traj //= _batch_shards(s.mesh, count)
  rollout_live = state_live + lanes * device_bytes(lane) + device_bytes(prompts) + traj
  note = f"{count} trajectories, {lanes} lanes x {per_lane} slots x {cache_len} cache slots"
  out.append(Program(f"{prefix}/prefill", extend,
                     (model, s.params, prompts, sds((chunk, width), i32),
                      sds((chunk,), i32), sds((chunk,), i32)), live=state_live,
                     note=f"{chunk} of {questions} prompts x {width} tokens"))
  if ladder:
    return out + slot_ladder_programs(s, rollout, count, width, prompts, stop, sampling,
                                      rollout_live, prefix)
  progress = sharded_like(s.mesh, SlotProgress(
      traj=sds((per_lane,), i32), turn=sds((per_lane,), i32), num_new=sds((per_lane,), i32),
      window=sds((per_lane, stop[0].window_size), jnp.uint8), reason=sds((per_lane,), i32)),
      SlotProgress(traj=_p("batch"), turn=_p("batch"), num_new=_p("batch"),
                   window=_p("batch", None), reason=_p("batch")))
  out.append(Program(
      f"{prefix}/decode", decode_slots,
      (dmodel, dparams, lane, progress, sds((per_lane,), b), sds((per_lane,), i32),
       sds((per_lane,), i32), sds((per_lane,), b), sampling, rollout.max_new_tokens, stop,
       sds((), i32)),
      live=rollout_live - device_bytes(lane), note=note))
  if rollout.max_turns > 1:
    rows = bucket(per_lane, MIN_ROWS)
    sub = _state(s, rows, cache_len)
    out.append(Program(
        f"{prefix}/feed", slot_programs._extend_tokens,
        (model, s.params, sub, sds((rows, obs), i32), sds((rows,), i32), sds((rows, obs), i32)),
        live=rollout_live, note=f"{rows} rows x {obs} tokens (every row of a lane)"))
  return out


def slot_ladder_programs(s: Setup, rollout, count: int, width: int, prompts: Any, stop: tuple,
                         sampling: Any, live: int, prefix: str) -> list[Program]:
  """Every program of the slot engine's ladder (agent.slots.SlotLadder, the list a run's
  rollout.warm_up runs) as abstract calls: decode per lane size x key window, the feed's
  extend per row bucket x window, its gathers and scatters, the stores, moves and refills.
  Windows from the smallest rung up (the data's shortest prompt is not known here), so the list
  holds the warm-up's. Names carry the shape: decode[size,window], feed[rows,window], ..."""
  import jax
  import jax.numpy as jnp
  from agentjax.agent.slots import SlotLadder
  from agentjax.models.qwen import Qwen
  from agentjax.sampling import cache_size, kv_window_arg
  from agentjax.sampling import slots as sp
  i32, b = jnp.int32, jnp.bool_
  model = Qwen(s.cfg, lora=s.spec)
  dmodel, dparams = _decode_model(s)
  cache_len = cache_size(rollout.max_total_tokens)
  lad = SlotLadder.of(rollout, count, cache_len, width, 1)
  # Each program takes a lane (or a smaller one) as an argument: not counted again as live.
  live -= device_bytes(_state(s, lad.sizes[0], cache_len))
  wname = lambda w: "all" if w is None else str(w)  # noqa: E731
  batch = lambda n: sharded_like(s.mesh, sds((n,), i32), _p("batch"))  # noqa: E731
  progress = lambda n: sharded_like(s.mesh, sp.SlotProgress(  # noqa: E731
      traj=sds((n,), i32), turn=sds((n,), i32), num_new=sds((n,), i32),
      window=sds((n, stop[0].window_size), jnp.uint8), reason=sds((n,), i32)),
      sp.SlotProgress(traj=_p("batch"), turn=_p("batch"), num_new=_p("batch"),
                      window=_p("batch", None), reason=_p("batch")))
  out_buffer = jax.eval_shape(lambda: sp.empty_trajectories(count, cache_len))
  out_buffer = sharded_like(s.mesh, out_buffer, jax.tree.map(lambda _: _p("batch", "length"),
                                                             out_buffer))
  obs = lad.feed_tokens
  programs = []
  for i, size in enumerate(lad.sizes):
    lane = _state(s, size, cache_len)
    if i:
      before = lad.sizes[i - 1]
      programs.append(Program(f"{prefix}/move[{before}->{size}]", sp.take_rows,
                              (_state(s, before, cache_len), progress(before), batch(size)),
                              live=live))
    for w in lad.decode_windows:
      programs.append(Program(
          f"{prefix}/decode[{size},{wname(w)}]", sp.decode_slots,
          (dmodel, dparams, lane, progress(size), sds((size,), b), sds((size,), i32),
           sds((size,), i32), sds((size,), b), sampling, rollout.max_new_tokens, stop,
           sds((), i32)), kwargs=kv_window_arg(w), live=live))
    for rows in lad.row_buckets(size):
      sub = _state(s, rows, cache_len)
      if lad.fused:  # the gather, feed and scatter of a row bucket are one program
        programs += [Program(
            f"{prefix}/feed[{size},{rows},{wname(w)}]", sp._extend_rows_fused,
            (model, s.params, lane, batch(rows), sds((rows, obs), i32), sds((rows,), i32),
             sds((rows, obs), i32)), kwargs=kv_window_arg(w), live=live,
            note=f"{rows} of {size} rows x {obs} tokens") for w in lad.feed_windows]
      else:
        programs.append(Program(f"{prefix}/gather[{size},{rows}]", sp._gather_rows,
                                (lane, batch(rows)), live=live))
        programs.append(Program(f"{prefix}/scatter[{size},{rows}]", sp._scatter_rows,
                                (lane, batch(rows), sub), live=live))
      programs.append(Program(f"{prefix}/store[{size},{rows}]", sp.store_rows,
                              (out_buffer, batch(rows), lane, batch(rows)), live=live))
      if i == 0:
        programs.append(Program(f"{prefix}/refill[{rows}]", sp.copy_rows,
                                (lane, batch(rows), prompts, batch(rows)), live=live))
  shared = set() if lad.fused else {r for size in lad.sizes for r in lad.row_buckets(size)}
  for rows in sorted(shared):  # the feed of rows, shared by every lane size
    sub = _state(s, rows, cache_len)
    for w in lad.feed_windows:
      programs.append(Program(
          f"{prefix}/feed[{rows},{wname(w)}]", sp._extend_tokens,
          (model, s.params, sub, sds((rows, obs), i32), sds((rows,), i32), sds((rows, obs), i32)),
          kwargs=kv_window_arg(w), live=live, note=f"{rows} rows x {obs} tokens"))
  return programs


def _p(*names):
  from jax.sharding import PartitionSpec
  return PartitionSpec(*names)


def _batch_shards(mesh: Any, rows: int) -> int:
  """Devices a [rows, ...] batch is split over (the rules table's batch axes that divide it)."""
  from agentjax.parallel import logical_to_spec
  spec = logical_to_spec(("batch",), (rows,), mesh)
  axes = () if spec[0] is None else (spec[0],) if isinstance(spec[0], str) else spec[0]
  return math.prod(mesh.shape[a] for a in axes)


def trimmed_width(cache_len: int, max_total: int, multiple: int = 128) -> int:
  """The widest batch rl.trim gives: the token budget rounded up to `multiple`, <= the cache."""
  return min(cache_len, max(multiple, -(-max_total // multiple) * multiple))


def _rows(s: Setup, rows: int, width: int, **arrays) -> dict:
  """{name: [rows, width] abstract array of dtype} sharded like a trajectory batch."""
  return {k: sharded_like(s.mesh, sds((rows, width), dtype), _p("batch", "length"))
          for k, dtype in arrays.items()}


def score_programs(s: Setup, rows: int, width: int, turns: int, probes: bool, prefix: str = "score",
                   batch_live: int = 0, probe_tokens: int = 32, micro_batch: int = 0
                   ) -> list[Program]:
  """rl.score_batch's passes on a [rows, width] batch: the policy's (the packed pass with IGPO's
  probes, or the plain log-probs), the reference's (plain, with the reference's params), each in
  slices of micro_batch rows when the code takes them (RLStep's micro_batch)."""
  import jax.numpy as jnp
  from agentjax.models.qwen import Qwen
  from agentjax.train import scoring as scoring_lib
  rl = s.config.rl
  model, params = Qwen(s.cfg, lora=s.spec), s.params
  batch = _rows(s, rows, width, tokens=jnp.int32, valid=jnp.bool_)
  plain = scoring_lib.plain_logprobs
  micro = (micro_batch,) if _takes(plain, "micro_batch") else ()
  note = f"{rows} x {width} tokens" + (f", {micro_batch} rows a pass" if micro_batch else "")
  out = []
  if probes:
    a = probe_tokens
    i32, b = jnp.int32, jnp.bool_
    packed = scoring_lib.packed_scores
    kwargs = dict(mode=rl.ig_mode, chunk=rl.chunk)
    if _takes(packed, "micro_batch"):
      kwargs["micro_batch"] = micro_batch
    out.append(Program(
        f"{prefix}/policy", packed,
        (model, params, batch["tokens"], batch["valid"], sds((rows, turns + 1), i32),
         sds((rows,), i32), sds((rows, 1, a), i32), sds((rows, 1, a), b), sds((rows, 1, a), b),
         sds((rows, 1), b)), kwargs=kwargs, live=s.state_bytes("params") + batch_live,
        note=f"{note} + {turns} probes x {a}"))
  else:
    out.append(Program(f"{prefix}/policy", plain,
                       (model, params, batch["tokens"], batch["valid"], rl.chunk, *micro),
                       live=s.state_bytes("params") + batch_live, note=note))
  if rl.kl_coef > 0:
    if s.spec is None:
      ref_model, ref, without = model, s.ref, "reference"
    else:  # LoRA: the backbone without adapters (the policy's params hold it: live already)
      ref_model, ref, without = Qwen(s.cfg), s.backbone, "params"
    old = rows * width * 4 // _batch_shards(s.mesh, rows)  # the policy's log-probs, kept
    out.append(Program(f"{prefix}/reference", plain,
                       (ref_model, ref, batch["tokens"], batch["valid"], rl.chunk, *micro),
                       live=s.state_bytes(without) + batch_live + old, note=note))
  return out


def _takes(fn: Callable, name: str) -> bool:
  """Whether fn (a jitted function) has a parameter `name`."""
  import inspect
  try:
    return name in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def _check_outputs(names: tuple[str, ...], args: tuple) -> Callable:
  """compiled -> problems: outputs i (for i, name in enumerate(names)) not sharded like args[i]."""
  import jax

  def check(compiled) -> list[str]:
    problems = []
    outs = compiled.output_shardings
    for i, name in enumerate(names):
      bad, nbytes = [], 0
      for (path, x), got in zip(jax.tree_util.tree_flatten_with_path(args[i])[0],
                                jax.tree.leaves(outs[i])):
        want = x.sharding
        if want is not None and not got.is_equivalent_to(want, len(x.shape)):
          bad.append((jax.tree_util.keystr(path), want.spec, getattr(got, "spec", got)))
          nbytes += math.prod(x.shape) * x.dtype.itemsize
      if bad:
        problems.append(f"{len(bad)} {name} output(s) ({nbytes / GB:.2f} GB) not sharded like "
                        f"the input, e.g. {bad[0][0]}: {bad[0][2]} instead of {bad[0][1]}")
    return problems

  return check


def update_programs(s: Setup, width: int, rl_step: Any) -> list[Program]:
  """One policy update (RLStep.build's) on a minibatch of rl.minibatch_size x width, and with a
  critic its values (scoring) and its update on the same minibatch."""
  import jax.numpy as jnp
  from agentjax.methods import get_method
  from agentjax.train.updates import CRITIC_MINIBATCH, policy_minibatch_keys
  rl = s.config.rl
  f32 = jnp.float32
  dtypes = dict(tokens=jnp.int32, valid=jnp.bool_, loss_mask=jnp.bool_, old_logp=f32,
                ref_logp=f32, advantages=f32, behav_logp=f32, old_values=f32, returns=f32,
                value_mask=jnp.bool_)
  mbs = rl.minibatch_size
  micro = getattr(rl_step, "micro_batch", 0)
  per_pass = f", {micro} rows a pass" if micro else ""
  frozen = () if s.spec is None else (s.backbone,)
  # A method's per-token loss inputs (A²TGPO's clip scale) ride in the minibatch too.
  inputs = get_method(s.config.algorithm).loss_inputs_for(s.config)
  mb = _rows(s, mbs, width, **{k: dtypes[k] for k in policy_minibatch_keys(s.config)},
             **dict.fromkeys(inputs, f32))
  args = (s.trainable, s.opt_state, mb, *frozen)
  out = [Program("update", rl_step.update, args,
                 live=s.state_bytes("params", "opt_state") if s.spec is None
                 else s.state_bytes("opt_state"),
                 check=_check_outputs(("params", "opt_state"), args),
                 note=f"minibatch {mbs} x {width} tokens{per_pass}")]
  if s.critic is not None:
    c, cs = getattr(rl_step, "critic", None) or s.critic, s.critic_state  # the step's (micro)
    cfrozen = () if c.spec is None else (s.backbone,)
    b = s.config.rl.prompts_per_step * s.config.rollout.group_size
    batch = _rows(s, b, width, tokens=jnp.int32, valid=jnp.bool_)
    out.append(Program("critic_values", c._values, (cs["params"], batch["tokens"], batch["valid"],
                                                     *cfrozen),
                       live=s.state_bytes("critic") + device_bytes(cs["opt_state"]),
                       note=f"{b} x {width} tokens{per_pass}"))
    cmb = _rows(s, mbs, width, **{k: dtypes[k] for k in CRITIC_MINIBATCH})
    cargs = (cs["params"], cs["opt_state"], cmb, *cfrozen)
    out.append(Program("critic_update", c._update, cargs, live=s.state_bytes("critic"),
                       check=_check_outputs(("critic params", "critic opt_state"), cargs),
                       note=f"minibatch {mbs} x {width} tokens{per_pass}"))
  return out


def judge_programs(s: Setup, judge_cfg: Any, rows: int) -> list[Program]:
  """The local judge's programs (judge.backend "local": sampling.complete.Completer): the
  prompts fed in `extend` calls of Completer's width and `generate` of judge.max_new_tokens,
  greedy, on `rows` calls at once, each in its own cache of judge.max_prompt_tokens +
  max_new_tokens slots (the worst case: no prefix shared between calls)."""
  import jax.numpy as jnp
  from agentjax.models.qwen import Qwen
  from agentjax.sampling import SamplingParams, bucket, extend, generate
  from agentjax.sampling.complete import Completer
  j = s.config.judge
  prompt, new = int(j.max_prompt_tokens), int(j.max_new_tokens)
  cache_len = bucket(prompt + new)
  import inspect
  prefill = inspect.signature(Completer.__init__).parameters["prefill_tokens"].default
  width = min(bucket(prompt), 1 << max(3, (prefill // rows).bit_length() - 1))
  params = s.judge_params
  state = _state(s, rows, cache_len, judge_cfg)
  live = s.state_bytes("judge")
  i32 = jnp.int32
  dmodel, dparams = _decode_model(s, judge_cfg, None)
  stop = _stop(s, None, judge_cfg.vocab_size)
  stop = (stop[0], stop[1], sds((rows,), i32))  # a budget per row
  note = f"{rows} calls x {cache_len} cache slots"
  return [Program("judge/prefill", extend,
                  (Qwen(judge_cfg), params, state, sds((rows, width), i32), sds((rows,), i32),
                   sds((rows,), i32)), live=live, note=f"{note}, {width} tokens a call"),
          Program("judge/decode", generate,
                  (dmodel, dparams, state, sds((rows,), jnp.bool_), sds((rows,), i32), stop,
                   SamplingParams(greedy=True), min(bucket(new), cache_len)),
                  live=live, note=note)]


def build_programs(config: Any, mesh: Any, cfg: Any, prompt_tokens: int = 0,
                   probe_tokens: int = 32, judge_preset: str = "", ladders: bool = False
                   ) -> tuple[list[Program], Setup]:
  """Every program of one RL step of `config` (rl, rubric or dac trainer), and the Setup.
  ladders: the slot engine's every shape (slot_ladder_programs), the eval rollout's too
  (train.eval_batch questions, greedy), instead of its widest programs."""
  import copy
  import types
  from agentjax.models.qwen import Qwen
  from agentjax.sampling import cache_size
  from agentjax.train.trainer import rollout_config

  judge_cfg = None
  if config.judge.backend == "local":
    # Completer.from_hf's numerics: float32 parameters and compute (its default).
    judge_cfg = hf_config(config.judge.hf_path, judge_preset)
    if judge_cfg is None:
      from agentjax.models.qwen import ConfigError
      raise ConfigError(f"config.judge.hf_path={config.judge.hf_path!r}: no config.json there "
                        "and no preset of that name; give the judge's shape with --judge_preset")
  s = make_setup(config, mesh, cfg, judge_cfg)
  rl, r = config.rl, config.rollout
  rollout = rollout_config(config)
  questions = rl.prompts_per_step
  batch_rows = questions * rollout.group_size
  cache_len = cache_size(rollout.max_total_tokens)
  width = trimmed_width(cache_len, rollout.max_total_tokens)
  programs = rollout_programs(s, rollout, questions, prompt_tokens=prompt_tokens,
                              ladder=ladders)
  if ladders and config.trainer != "dac" and config.train.eval_batch:
    programs += rollout_programs(s, rollout_config(config, greedy=True), config.train.eval_batch,
                                 prefix="eval_rollout", prompt_tokens=prompt_tokens, ladder=True)
  # The judge is not part of the update (a local judge is its own program, below).
  quiet = copy.deepcopy(config)
  with quiet.unlocked():
    quiet.judge.backend = "none"
  engine = types.SimpleNamespace(model=Qwen(cfg, lora=s.spec), cfg=cfg)
  if config.trainer == "dac":
    programs += dac_programs(s, quiet, rollout, batch_rows, width, prompt_tokens)
    return programs, s
  from agentjax.train.step import RLStep
  rl_step = RLStep.build(quiet, mesh, engine, s.optimizer, s.ref, target=s.target)
  programs += score_programs(s, batch_rows, width, r.max_turns, "probes" in rl_step.signal_names,
                             probe_tokens=probe_tokens,
                             micro_batch=getattr(rl_step, "micro_batch", 0))
  programs += update_programs(s, width, rl_step)
  if judge_cfg is not None:  # every round of every trajectory at once, unless judge.max_batch
    calls = int(config.judge.max_batch) or batch_rows * r.max_turns
    programs += judge_programs(s, judge_cfg, -(-calls // 16) * 16 if calls > 16 else calls)
  return programs, s


def dac_programs(s: Setup, config: Any, rollout: Any, batch_rows: int, width: int,
                 prompt_tokens: int) -> list[Program]:
  """DAC's generator rollout (one answer turn, dac.generator_samples per evidence set), each
  role's scoring and the roles' update (RLStep.build's make_roles_update for DacRollout)."""
  import jax.numpy as jnp
  from agentjax.dac.roles import DacSettings
  from agentjax.dac.stage import DacRollout
  from agentjax.sampling import cache_size
  from agentjax.train.step import RLStep
  from agentjax.train.updates import policy_minibatch_keys
  settings = DacSettings.from_config(config)
  m = settings.generator_samples
  generator = dataclasses.replace(
      rollout, protocol="answer_only", group_size=m, max_turns=1,
      max_new_tokens=settings.generator_max_new_tokens,
      max_total_tokens=settings.generator_max_total_tokens)
  g_cache = cache_size(generator.max_total_tokens)
  g_width = trimmed_width(g_cache, generator.max_total_tokens, 256)
  s_batch = batch_rows * width * 14 // _batch_shards(s.mesh, batch_rows)  # the searcher's batch
  out = rollout_programs(s, generator, batch_rows, prefix="generator_rollout",
                         prompt_tokens=prompt_tokens, live=s_batch)
  g_rows = batch_rows * m
  step = RLStep.build(config, s.mesh, DacRollout(None), s.optimizer, None, s.target)
  micro = getattr(step, "micro_batch", 0)
  out += score_programs(s, batch_rows, width, rollout.max_turns, False, prefix="score_searcher",
                        micro_batch=micro)
  out += score_programs(s, g_rows, g_width, 1, False, prefix="score_generator",
                        batch_live=s_batch, micro_batch=micro)
  f32 = jnp.float32
  dtypes = dict(tokens=jnp.int32, valid=jnp.bool_, loss_mask=jnp.bool_, old_logp=f32,
                ref_logp=f32, advantages=f32, behav_logp=f32)
  mbs = config.rl.minibatch_size
  keys = policy_minibatch_keys(config)
  mb = {"searcher": _rows(s, mbs, width, **{k: dtypes[k] for k in keys}),
        "generator": _rows(s, mbs * m, g_width, **{k: dtypes[k] for k in keys})}
  args = (s.trainable, s.opt_state, mb, s.backbone)
  out.append(Program("update", step.update, args, live=s.state_bytes("opt_state"),
                     check=_check_outputs(("adapters", "opt_state"), args),
                     note=f"searcher {mbs} x {width}, generator {mbs * m} x {g_width} tokens"
                     + (f", {micro} rows a pass" if micro else "")))
  return out


# ============================================================================ the check


def analyse(program: Program) -> dict[str, Any]:
  """Lower and compile one program; its memory per device (GB) and the compile time."""
  import jax
  start = time.perf_counter()
  fn = program.fn if hasattr(program.fn, "lower") else jax.jit(program.fn)
  compiled = fn.lower(*program.args, **program.kwargs).compile()
  compile_s = time.perf_counter() - start
  mem = compiled.memory_analysis()
  arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
  temp, alias = mem.temp_size_in_bytes, mem.alias_size_in_bytes
  peak = arg + out + temp - alias
  row = {"argument_gb": arg / GB, "output_gb": out / GB, "temp_gb": temp / GB,
         "alias_gb": alias / GB, "peak_gb": peak / GB, "live_gb": program.live / GB,
         "total_gb": (peak + program.live) / GB, "compile_s": compile_s,
         "gathered_gb": gathered_bytes(compiled.as_text()) / GB}
  if program.check is not None:
    problems = program.check(compiled)
    if problems:
      row["problems"] = problems
  if program.note:
    row["shape"] = program.note
  del compiled
  gc.collect()
  return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
              "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def gathered_bytes(hlo: str) -> int:
  """Bytes per device that a program's all-gathers produce (its optimized HLO): with FSDP
  mostly the weights gathered for the matmuls. A hint at where temp goes: when it approaches the
  whole model's size the gathered layers are live at once (e.g. hoisted out of a loop)."""
  import re
  total = 0
  # One array, or a tuple of them (XLA combines collectives): "= f32[8,64]{1,0} all-gather(".
  for shapes in re.findall(r"= (\(.*?\)|\S+) all-gather(?:-start)?\(", hlo):
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
      total += math.prod(int(d) for d in dims.split(",") if d) * _HLO_BYTES.get(dtype, 4)
  return total


def fit_check(config: Any, device_memory_gb: float, model_preset: str = "",
              programs: list[str] | None = None, prompt_tokens: int = 0,
              probe_tokens: int = 32, judge_preset: str = "", num_layers: int = 0,
              log: Callable[[str], None] = print, ladders: bool = False) -> dict[str, Any]:
  """Compiles the programs of `config` on the devices jax has (fake CPU devices) and reports
  their memory per device against `device_memory_gb` (module docstring). ladders: every shape
  of the slot engine's programs, eval's included (build_programs; `launch/precompile.py`)."""
  import jax
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  config_lib.validate(config)  # a bad field is named before anything compiles
  cfg = model_config(config, model_preset)
  if num_layers:
    cfg = cfg.replace(num_layers=num_layers)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  start = time.perf_counter()
  # Built outside the mesh context, as the trainer loads its state; lowered inside it, as the
  # trainer calls its programs.
  todo, setup = build_programs(config, mesh, cfg, prompt_tokens, probe_tokens, judge_preset,
                               ladders)
  if programs:
    todo = [p for p in todo if any(p.name == w or p.name.startswith(w.rstrip("/") + "/")
                                   or p.name.startswith(w + "[") for w in programs)]
  with use_mesh(mesh):
    log(f"fit: {config.preset} model {model_preset or cfg.model_type} hidden "
        f"{cfg.hidden_size} x "
        f"{cfg.num_layers} layers ({cfg.num_params() / 1e9:.2f}B, {cfg.param_dtype} params, "
        f"{cfg.dtype} compute, remat {cfg.remat_policy}, attention {cfg.attention}) on "
        f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, {device_memory_gb:g} GB each")
    log(f"{len(todo)} programs")
    header = (f"{'program':28s} {'arg':>8s} {'out':>8s} {'temp':>8s} {'alias':>8s} {'peak':>8s} "
              f"{'live':>8s} {'total':>8s} {'gather':>8s} {'compile':>8s}  (GB per device; s)")
    log(header)
    report = {}
    for program in todo:
      row = analyse(program)
      report[program.name] = row
      log(f"{program.name:28s} {row['argument_gb']:8.2f} {row['output_gb']:8.2f} "
          f"{row['temp_gb']:8.2f} {row['alias_gb']:8.2f} {row['peak_gb']:8.2f} "
          f"{row['live_gb']:8.2f} {row['total_gb']:8.2f} {row['gathered_gb']:8.2f} "
          f"{row['compile_s']:8.1f}  "
          f"{row.get('shape', '')}")
      for problem in row.get("problems", []):
        log(f"  PROBLEM {program.name}: {problem}")
  worst = max((row["total_gb"] for row in report.values()), default=0.0)
  too_big = [name for name, row in report.items() if row["total_gb"] > device_memory_gb]
  problems = {name: row["problems"] for name, row in report.items() if row.get("problems")}
  if too_big:
    log(f"DOES NOT FIT in {device_memory_gb:g} GB: " + ", ".join(
        f"{name} ({report[name]['total_gb']:.2f} GB)" for name in too_big))
  import resource
  return {"bench": "fit", "config": config.preset, "fits": not too_big,
          "peak_gb": worst, "too_big": too_big,
          "device_memory_gb": device_memory_gb if math.isfinite(device_memory_gb) else None,
          "problems": problems, "devices": jax.device_count(), "mesh": dict(mesh.shape),
          "compiler": f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind}), jax "
                      f"{jax.__version__}",
          "model": {"type": cfg.model_type, "hidden": cfg.hidden_size, "layers": cfg.num_layers,
                    "params_b": round(cfg.num_params() / 1e9, 3), "param_dtype": cfg.param_dtype,
                    "dtype": cfg.dtype, "remat": cfg.remat_policy, "attention": cfg.attention},
          "state_gb": {k: round(v / GB, 3) for k, v in setup.sizes.items()},
          "compile_s": round(time.perf_counter() - start, 1), "num_programs": len(report),
          "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
          "programs": report}


def force_devices(n: int, backend: str = "cpu") -> None:
  """Asks for n fake CPU devices (backend "cpu"), or n mock GPUs (backend "gpu": XLA's mock
  topology of n one-GPU hosts, collectives mocked, each host's device the one real GPU, so that
  programs compile, never run, with the GPU compiler); before jax is imported (it reads XLA_FLAGS
  and its platform once)."""
  if "jax" in sys.modules:
    import jax
    if jax.device_count() != n:
      raise RuntimeError(f"jax was imported before the fit check set {n} fake devices "
                         f"(it has {jax.device_count()}); run launch/fit.py itself")
    return
  if backend == "gpu":
    os.environ["JAX_PLATFORMS"] = "cuda"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # nothing runs
    # Autotuning runs candidate kernels, collectives included, on the mock devices: it hangs
    # (seen on an H200 with jax 0.11.2). Buffer sizes do not depend on the kernels it would pick.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_gpu_autotune_level=0").strip()
    import jax
    jax.config.update("jax_mock_gpu_topology", f"1x{n}x1")
    if jax.device_count() != n:
      raise RuntimeError(f"--backend=gpu: asked for {n} mock GPUs, jax has "
                         f"{jax.device_count()} devices")
    return
  flag = f"--xla_force_host_platform_device_count={n}"
  old = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count"))
  os.environ["XLA_FLAGS"] = f"{old} {flag}".strip()
  os.environ["JAX_PLATFORMS"] = "cpu"


def quiet_logs() -> None:
  """No INFO lines from agentjax (the rules table logs every dimension it cannot shard)."""
  import logging
  from absl import logging as absl_logging
  absl_logging.set_verbosity("warning")  # optax's constant-schedule notes
  logging.getLogger("agentjax").setLevel(logging.WARNING)


def extrapolate(config: Any, device_memory_gb: float, depths: tuple[int, int],
                log: Callable[[str], None] = print, **kwargs) -> dict[str, Any]:
  """fit_check at two reduced depths, each program's total extrapolated linearly to the
  model's own depth (what grows per layer: weights, their gradients and optimizer state, saved
  activations, KV caches; the rest does not). Measured against full compiles: within 0.2 GB per
  program on igpo and ppo qwen2.5-7b, 1.3 GB on igpo qwen2.5-3b (docs/BENCHMARKS.md, fit)."""
  lo, hi = sorted(depths)
  if lo < 1 or lo == hi:
    raise ValueError(f"--extrapolate needs two different depths >= 1, got {depths}")
  depth = model_config(config, kwargs.get("model_preset", "")).num_layers
  runs = {n: fit_check(config, device_memory_gb, num_layers=n, log=log, **kwargs)
          for n in (lo, hi)}
  programs = {}
  for name, row in runs[lo]["programs"].items():
    a, b = row["total_gb"], runs[hi]["programs"][name]["total_gb"]
    per_layer = (b - a) / (hi - lo)
    programs[name] = {"total_gb": round(a + (depth - lo) * per_layer, 2),
                      "per_layer_gb": round(per_layer, 3), f"total_gb_{lo}": a,
                      f"total_gb_{hi}": b}
  log(f"{'program':28s} {'L' + str(lo):>8s} {'L' + str(hi):>8s} {'per layer':>9s} "
      f"{'L' + str(depth):>8s}  (total GB per device, extrapolated)")
  for name, row in programs.items():
    log(f"{name:28s} {row[f'total_gb_{lo}']:8.2f} {row[f'total_gb_{hi}']:8.2f} "
        f"{row['per_layer_gb']:9.3f} {row['total_gb']:8.2f}")
  too_big = [name for name, row in programs.items() if row["total_gb"] > device_memory_gb]
  if too_big:
    log(f"DOES NOT FIT in {device_memory_gb:g} GB (extrapolated): " + ", ".join(
        f"{name} ({programs[name]['total_gb']:.2f} GB)" for name in too_big))
  top = runs[hi]
  return {**{k: v for k, v in top.items() if k not in ("programs", "model", "state_gb")},
          "fits": not too_big, "too_big": too_big,
          "peak_gb": max((row["total_gb"] for row in programs.values()), default=0.0),
          "how": f"extrapolated from {lo} and {hi} layers to {depth}",
          "model": {**top["model"], "layers": depth},
          "problems": {**runs[lo]["problems"], **top["problems"]}, "programs": programs}


def device_memory_gb() -> float:
  """One device's memory limit as jax reports it (GPU, TPU), GB; inf where it reports none
  (CPU)."""
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("bytes_limit", 0) / GB or float("inf")


def run_from_flags() -> dict[str, Any]:
  """The check as the flags ask (launch/bench.py fit calls this)."""
  if _CONFIG.value is None:
    raise app.UsageError("fit: --config=configs/<method>.py:<preset> is required")
  if _DEVICES.value:
    force_devices(_DEVICES.value, _BACKEND.value)
  kwargs = dict(model_preset=_MODEL.value, programs=_PROGRAMS.value,
                prompt_tokens=_PROMPT.value, probe_tokens=_PROBE.value,
                judge_preset=_JUDGE.value, ladders=_LADDERS.value)
  log = lambda line: print(line, flush=True)  # noqa: E731
  memory = _MEMORY.value or device_memory_gb()
  if _EXTRAPOLATE.value:
    if _LAYERS.value:
      raise app.UsageError("fit: --extrapolate and --num_layers exclude each other")
    depths = tuple(int(x) for x in _EXTRAPOLATE.value)
    if len(depths) != 2:
      raise app.UsageError(f"fit: --extrapolate takes two depths, got {_EXTRAPOLATE.value}")
    return extrapolate(_CONFIG.value, memory, depths, log=log, **kwargs)
  return fit_check(_CONFIG.value, memory, num_layers=_LAYERS.value, log=log, **kwargs)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  quiet_logs()
  result = run_from_flags()
  print(json.dumps(result))
  sys.exit(0 if result["fits"] else 1)


def bench_fit() -> dict:
  """The fit check (launch/fit.py): the preset's programs compiled, never run, on --devices fake
  CPU devices; memory per device against --device_memory_gb. Must run before jax is imported."""
  quiet_logs()
  return run_from_flags()
