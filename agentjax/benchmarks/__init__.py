"""Benchmarks: agentjax against a reference implementation in the same run, reported as a ratio
(the command line: launch/bench.py NAME; the figures: docs/BENCHMARKS.md).

  registry   BENCHES: bench name -> function (each returns the dict printed as the last line)
  common     the benches' flags, timing and device helpers, shared fixtures
  fit        the fit check: every device program compiled on fake devices, memory per device
  <name>     one module per bench (forward, decode, rollout, ..., gpu)

Nothing in this package imports jax at import time (the fit check sets XLA_FLAGS first).
"""
