"""`python launch/bench.py train_step`: a PPO update with LoRA adapters against full fine-tuning
(bench_train_step)."""

from __future__ import annotations

import json
import statistics
import time

from agentjax.benchmarks.common import FLAGS, device_name, ppo_minibatch, tree_bytes


def _train_step_memory(compiled, found) -> dict:
  """Memory fields of bench_train_step's compiled steps (see its docstring), in GB."""
  out = {}
  memory = {}
  for name, (exe, (_, args, _)) in compiled.items():
    m = exe.memory_analysis()
    fields = {f: int(getattr(m, f"{f}_size_in_bytes")) for f in
              ("argument", "output", "alias", "temp")}
    fields["peak"] = fields["argument"] + fields["output"] - fields["alias"] + fields["temp"]
    fields["sum"] = fields["argument"] + fields["output"] + fields["temp"]
    memory[name] = fields
    state = tree_bytes(args[:2])
    out[f"{name}_memory_gb"] = {k: round(v / 1e9, 3) for k, v in fields.items()}
    out[f"{name}_train_state_gb"] = round(state / 1e9, 3)
  backbone_gb = tree_bytes(found["full"][1][0]) / 1e9
  out.update(
      peak_ratio=round(memory["lora"]["peak"] / memory["full"]["peak"], 3),
      sum_ratio=round(memory["lora"]["sum"] / memory["full"]["sum"], 3),
      train_state_ratio=round(out["lora_train_state_gb"] / out["full_train_state_gb"], 4),
      backbone_gb=round(backbone_gb, 3),
      # Held for the run (KL on, rl.kl_coef > 0): full FT keeps params, Adam's two moments and a
      # frozen reference copy; LoRA the backbone (also the reference) and the adapters' state.
      resident_full_gb=round(out["full_train_state_gb"] + backbone_gb, 3),
      resident_lora_gb=round(out["lora_train_state_gb"] + backbone_gb, 3))
  return out


def bench_train_step() -> dict:
  """One PPO-clip minibatch update (train/updates.make_policy_update) with LoRA adapters on a frozen
  backbone against full fine-tuning, same model shape, minibatch and loss.

  Loss and optimizer as train/step.py builds them from configs/base.py's qwen2.5-3b preset (the
  IGPO paper's: PPO clip 0.2/0.2, low_var_kl 0.001, token-mean, entropy computed, AdamW with
  global-norm clip 1.0, weight decay 0.01, b2 0.999). Full: make_optimizer over every param.
  LoRA: one adapter "policy" of rank --lora_rank (alpha --lora_alpha, default the rank) on all 7
  projections, make_adapter_optimizer; gradients and optimizer state for the adapters only.

  Memory: `jax.jit(step).lower(...).compile().memory_analysis()` of each step at --preset (from
  abstract shapes, nothing executed): argument, output, alias (outputs written into donated
  arguments: params and optimizer state) and temp bytes. `peak_bytes` = argument + output -
  alias + temp (a donated buffer counted once); `sum_bytes` = argument + output + temp. Train
  state = params + optimizer state (LoRA: adapters + their state; the frozen backbone apart).

  Time: median step time over --repeats rounds (full, then LoRA, each round; one variant's state
  resident at a time), 2 timed steps per phase after one warm-up step per variant, compiles
  excluded. At --time_preset if given (memory stays at --preset); the steps run only if a step's
  peak (with a 15% margin) fits the machine's available memory. --time_layers=4,8 times the
  preset's shape at those depths instead and extrapolates each variant's step time linearly to
  the preset's depth (`extrapolated_*`: an estimate; the measured rows are in `timing`), for a
  machine where full fine-tuning at the full depth does not fit. --nomemory skips the analysis
  at --preset (its compile takes minutes on 2 cores).
  """
  import concurrent.futures

  import jax
  import numpy as np
  import psutil

  from configs import base as base_config
  from agentjax.models.lora import LoraSpec
  from agentjax.models.qwen import (Qwen, QwenConfig, abstract_params, adapter_abstract,
                                    init_adapters, init_params)
  from agentjax.train.optim import make_adapter_optimizer, make_optimizer
  from agentjax.train.updates import make_policy_update, policy_loss_config

  config = base_config.get_config("qwen2.5-3b")
  o = config.optimizer
  loss = policy_loss_config(config)
  total = 1000
  opt_args = (o.warmup_steps, total, o.weight_decay, o.clip_norm or None, o.final_lr_ratio, o.b2)
  rank = FLAGS.lora_rank or 32
  alpha = FLAGS.lora_alpha or float(rank)
  spec = LoraSpec(names=("policy",), rank=rank, alpha=alpha)
  b, length = FLAGS.batch or 4, FLAGS.length or 256
  full_opt = make_optimizer(o.lr, *opt_args)
  lora_opt = make_adapter_optimizer({"policy": o.lr}, *opt_args)

  def variants(cfg):
    """name -> (update fn, abstract args, a function making the concrete args)."""
    params = abstract_params(cfg)
    adapters = {"policy": adapter_abstract(cfg, spec)}
    mb = jax.eval_shape(lambda: ppo_minibatch(cfg.vocab_size, b, length))

    def full_args():
      p = init_params(cfg, jax.random.key(0))
      return (p, full_opt.init(p))

    def lora_args():
      a = init_adapters(cfg, spec, jax.random.key(1))
      return (a, lora_opt.init(a), init_params(cfg, jax.random.key(0)))

    return {
        "full": (make_policy_update(Qwen(cfg), full_opt, loss),
                 (params, jax.eval_shape(full_opt.init, params), mb), full_args),
        "lora": (make_policy_update(Qwen(cfg, lora=spec), lora_opt, loss),
                 (adapters, jax.eval_shape(lora_opt.init, adapters), mb, params), lora_args)}

  def compile_all(cfg):
    # The two compiles in parallel threads (XLA compiles outside the GIL; minutes each here).
    found = variants(cfg)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      futures = {k: pool.submit(lambda u=u, a=a: u.lower(*a).compile())
                 for k, (u, a, _) in found.items()}
      return {k: (f.result(), found[k]) for k, f in futures.items()}, found

  cfg = QwenConfig.preset(FLAGS.preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  result = {"bench": "train_step", "preset": FLAGS.preset, "dtype": FLAGS.dtype, "batch": b,
            "length": length, "lora_rank": rank, "lora_alpha": alpha,
            "targets": list(spec.targets), "loss": dict(loss.as_kwargs(), name=loss.name)}
  if not FLAGS.memory:
    compiled = None
  else:
    start = time.perf_counter()
    compiled, found = compile_all(cfg)
    result["compile_s"] = round(time.perf_counter() - start, 1)
    result.update(_train_step_memory(compiled, found))
  def peak(exe):
    m = exe.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)

  def time_steps(compiled, tcfg) -> dict:
    need = max(peak(exe) for exe, _ in compiled.values())
    available = psutil.virtual_memory().available
    row = {"layers": tcfg.num_layers, "params": tcfg.num_params(),
           "peak_gb": {k: round(peak(exe) / 1e9, 3) for k, (exe, _) in compiled.items()},
           "temp_gb": {k: round(exe.memory_analysis().temp_size_in_bytes / 1e9, 3)
                       for k, (exe, _) in compiled.items()},
           "available_gb": round(available / 1e9, 1)}
    if need * 1.15 > available:
      return dict(row, timed=False, not_timed=f"a step needs ~{need / 1e9:.1f} GB, "
                  f"{available / 1e9:.1f} GB available: use --time_layers or --time_preset")
    minibatch = ppo_minibatch(tcfg.vocab_size, b, length)
    times = {k: [] for k in compiled}
    skipped = {k: 0 for k in compiled}
    for r in range(FLAGS.repeats):  # full, then LoRA, each round: one state resident at a time
      for name, (exe, (_, _, make_args)) in compiled.items():
        train, opt_state, *frozen = make_args()
        for i in range(3 if r == 0 else 2):  # round 0: one warm-up step first
          begin = time.perf_counter()
          train, opt_state, metrics = exe(train, opt_state, minibatch, *frozen)
          skip = int(metrics["skipped"])
          if not (r == 0 and i == 0):
            times[name].append(time.perf_counter() - begin)
            skipped[name] += skip
        del train, opt_state, frozen, metrics
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(row, timed=True, full_step_s=round(med["full"], 3),
                lora_step_s=round(med["lora"], 3), step_ratio=round(med["lora"] / med["full"], 3),
                steps_timed=len(times["full"]),
                step_ranges={k: [round(min(v), 2), round(max(v), 2)] for k, v in times.items()},
                skipped_steps=skipped)

  time_preset = FLAGS.time_preset or FLAGS.preset
  rows = []
  for layers in [int(x) for x in FLAGS.time_layers] or [None]:
    tcfg = QwenConfig.preset(time_preset, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype,
                             **({} if layers is None else {"num_layers": layers}))
    if compiled is None or tcfg != cfg:
      compiled = None  # free the analysed executables before compiling the timed ones
      start = time.perf_counter()
      compiled, _ = compile_all(tcfg)
      cfg, timed_compile_s = tcfg, time.perf_counter() - start
    else:
      timed_compile_s = 0.0
    rows.append(dict(time_steps(compiled, tcfg), compile_s=round(timed_compile_s, 1)))
    print(json.dumps(rows[-1]), flush=True)
  result.update(timed_preset=time_preset, timing=rows)
  timed = [r for r in rows if r["timed"]]
  depth = QwenConfig.preset(time_preset).num_layers
  whole = [r for r in timed if r["layers"] == depth]
  if whole:
    r = whole[0]
    result.update(full_step_s=r["full_step_s"], lora_step_s=r["lora_step_s"],
                  step_ratio=r["step_ratio"],
                  tokens_per_s={k: round(b * length / r[f"{k}_step_s"], 1)
                                for k in ("full", "lora")})
  elif len({r["layers"] for r in timed}) >= 2:
    # Step time linear in the depth (every layer the same work; the embedding, LM head, loss and
    # the optimizer's share of them the fixed part): a least-squares line per variant, read at
    # the preset's depth. An estimate, not a measurement.
    xs = [r["layers"] for r in timed]
    fit = {k: np.polyfit(xs, [r[f"{k}_step_s"] for r in timed], 1) for k in ("full", "lora")}
    est = {k: float(np.polyval(f, depth)) for k, f in fit.items()}
    result.update(extrapolated_to_layers=depth,
                  extrapolated_full_step_s=round(est["full"], 2),
                  extrapolated_lora_step_s=round(est["lora"], 2),
                  extrapolated_step_ratio=round(est["lora"] / est["full"], 3),
                  per_layer_s={k: round(float(f[0]), 3) for k, f in fit.items()},
                  fixed_s={k: round(float(f[1]), 3) for k, f in fit.items()})
  result["device"] = device_name()
  return result
