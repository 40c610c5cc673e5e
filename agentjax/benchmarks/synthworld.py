"""`python launch/bench.py synthworld`: SynthWorld generation at the demo's size against a quarter
of it (bench_synthworld)."""

from __future__ import annotations

import statistics
import time

from agentjax.benchmarks.common import FLAGS


def bench_synthworld() -> dict:
  """SynthWorld.generate + corpus() at the demo's size (2000 entities, 5000 questions) against a
  quarter-size world in the same run: `scaling` = t(full) / (4 t(quarter)) is 1 when generation
  is linear in the size, 4 when quadratic. This was a `< 5 s` assert in tests/test_data.py."""
  from agentjax.data import SynthWorld

  times = {1: [], 4: []}  # by the divisor of the demo's size
  for _ in range(max(FLAGS.repeats, 11)):  # runs of 20-100 ms: more of them, sizes interleaved
    for n, runs in times.items():
      start = time.perf_counter()
      SynthWorld.generate(seed=1, n_entities=2000 // n, n_train=4000 // n, n_dev=500 // n,
                          n_test=500 // n).corpus()
      runs.append(time.perf_counter() - start)
  t_full, t_quarter = statistics.median(times[1]), statistics.median(times[4])
  return {"bench": "synthworld", "scaling": round(t_full / (4 * t_quarter), 3),
          "full_s": round(t_full, 4), "quarter_s": round(t_quarter, 4), "device": "host (Python)"}
