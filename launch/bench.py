"""Benchmarks: agentjax against a reference implementation in the same run, reported as a ratio.

    python launch/bench.py forward            # jitted forward vs transformers (PyTorch), CPU
    python launch/bench.py forward --preset=qwen2.5-1.5b --dtype=bfloat16 --no_reference  # GPU
    python launch/bench.py decode --batch=16 --length=256   # sampler vs transformers generate
    python launch/bench.py decode --preset=qwen2.5-1.5b --dtype=bfloat16 --batch=64 --no_reference  # GPU
    python launch/bench.py decode --lora_rank=32   # sampler: bare vs LoRA (merged / unmerged)
    python launch/bench.py decode_window     # decode step: 4096- vs 512-token budget, windowed
    python launch/bench.py rollout_mix        # rollout engines: turn-synchronous vs slots
    python launch/bench.py rollout_mix --mix_model=qwen2.5-1.5b --dtype=bfloat16 --group_size=16
    python launch/bench.py attention          # attention memory/time: blockwise vs xla
    python launch/bench.py rewards            # outcome rewards vs plain Python; format rule
    python launch/bench.py synthworld         # world generation: full vs quarter size
    python launch/bench.py sft_step           # make demo's SFT step: micro-batches vs whole batch
    python launch/bench.py judge              # local judge: a step's calls batched vs one at a time
    python launch/bench.py train_step --lora_rank=32   # PPO update: LoRA vs full fine-tuning
    python launch/bench.py coreact            # Co-ReAct guided rollouts vs plain ReAct
    python launch/bench.py ppo_step           # PPO: scoring + update with the critic vs without
    python launch/bench.py async              # train.async_steps 1, 2 vs the synchronous step
    python launch/bench.py server_overload    # retriever and model server: 64 clients vs one
    python launch/bench.py compiles --config=configs/igpo.py:demo --steps=10
                                              # programs an RL run compiles, by step and name
    python launch/bench.py fit --config=configs/igpo.py:qwen2.5-7b --devices=8 --device_memory_gb=80
                                              # compile-only memory per device (launch/fit.py)

The last printed line is one JSON object. Figures are recorded in docs/BENCHMARKS.md.
Timings are medians over several runs after a warm-up (compilation excluded and reported apart).
Each bench is a module of agentjax/benchmarks (agentjax/benchmarks/registry.py: BENCHES, name ->
function), with its flags and helpers in agentjax/benchmarks/common.py.
"""

from __future__ import annotations

import difflib
import json

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.benchmarks import common as bench_common
from agentjax.benchmarks import fit
from agentjax.benchmarks.registry import BENCHES  # no jax yet: `fit` sets the fake devices first

bench_common.define_flags()
flags.adopt_module_key_flags(bench_common)  # --helpshort lists them
flags.adopt_module_key_flags(fit)


def main(argv):
  names = ", ".join(BENCHES)
  if len(argv) != 2:
    raise common.UserError(f"launch/bench.py {' '.join(argv[1:])}".rstrip() + ": takes one "
                           f"benchmark name, e.g. `launch/bench.py forward`; the benchmarks: "
                           f"{names}")
  if argv[1] not in BENCHES:
    close = difflib.get_close_matches(argv[1], list(BENCHES), n=3)
    raise common.UserError(f"launch/bench.py {argv[1]}: no such benchmark; " + (
        f"did you mean {' or '.join(close)}?" if close else f"the benchmarks: {names}"))
  result = BENCHES[argv[1]]()
  print(json.dumps(result))


if __name__ == "__main__":
  common.run(main)
