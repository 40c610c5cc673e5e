r"""The fit check: compile (never run) a preset's device programs on N fake CPU devices and say
whether each fits in one device's memory.

    python launch/fit.py --config=configs/igpo.py:qwen2.5-7b --devices=8 --device_memory_gb=80
    python launch/bench.py fit --config=configs/igpo.py:qwen2.5-7b --devices=8 --device_memory_gb=80
    python launch/fit.py --config=configs/igpo.py:demo --model_preset=tiny --devices=2  # seconds
    python launch/fit.py --config=configs/ppo.py:qwen2.5-7b --config.rl.micro_batch_size=1 \
        --programs=update,critic_update       # any config field, a subset of the programs
    python launch/fit.py --config=configs/igpo.py:qwen2.5-7b --num_layers=2   # a depth proxy:
        # compile at 2 and 4 layers and extrapolate each total linearly to the model's depth
        # (matched the full 7B compile within 0.2 GB per program; ~1 min instead of ~12)

The paper presets on their papers' hardware (each compiles for minutes on a CPU):

    --config=configs/igpo.py:qwen2.5-7b   --devices=8 --device_memory_gb=80   (also qwen2.5-3b)
    --config=configs/cw_grpo.py:qwen3-8b  --devices=4 --device_memory_gb=80
    --config=configs/dac.py:qwen2.5-7b    --devices=8 --device_memory_gb=80   (also qwen3-8b)
    --config=configs/coreact.py:qwen3-14b --devices=8 --device_memory_gb=80
    --config=configs/ppo.py:qwen2.5-7b    --devices=8 --device_memory_gb=80

The check itself (what is compiled, how memory is counted, the JSON it prints):
agentjax/benchmarks/fit.py. Exit status 1 when a program does not fit (its name is printed).
"""

from __future__ import annotations

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.benchmarks import fit  # no jax yet: fit.main sets the fake devices first

flags.adopt_module_key_flags(fit)  # --helpshort lists them

if __name__ == "__main__":
  common.run(fit.main)
