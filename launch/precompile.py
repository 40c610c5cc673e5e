r"""Compile ahead, run nothing: every program of a run, lowered and compiled from abstract arrays
(no data, no weights), each printed with its compile seconds and memory per device; exit status
1 when one does not fit. On a pod this finds an out-of-memory program or a compile-time
regression in minutes, not after the first rollout.

    python launch/precompile.py --config=configs/igpo.py:demo           # this machine's devices
    python launch/precompile.py --config=configs/igpo.py:qwen2.5-7b --devices=8 \
        --device_memory_gb=80 --num_layers=2      # a paper preset on 8 fake CPU devices, 2 layers

It is the fit check (launch/fit.py, agentjax/benchmarks/fit.py: the same programs, built by the
code the trainer runs) with --ladders: the slot engine's every lane size x key window and row
bucket (agent.slots.SlotLadder, the list rollout.warm_up runs) and eval's rollout, not only the
widest of each; scoring and the update at the widest batch. Any config override and fit flag
applies (--programs=rollout/decode to list a subset). Defaults here: --devices=0 (this
machine's), --device_memory_gb=0 (the device's own limit; none on a CPU).
"""

from __future__ import annotations

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.benchmarks import fit  # no jax yet: fake devices are set before it is imported

flags.adopt_module_key_flags(fit)

if __name__ == "__main__":
  flags.FLAGS.set_default("ladders", True)
  flags.FLAGS.set_default("devices", 0)
  flags.FLAGS.set_default("device_memory_gb", 0.0)
  common.run(fit.main)
