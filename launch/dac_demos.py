r"""DAC's generator demonstrations (agentjax/dac/warmstart.py), for its warm start.

  python launch/dac_demos.py                      # configs/dac.py:generator_sft's sft.demos
  python launch/dac_demos.py --config=configs/dac.py:generator_sft --config.seed=1

Reads the world's searcher demonstrations, retriever and corpus named by the config (the `make
demo` world by default) and writes one generator demonstration per searcher demonstration to
config.sft.demos: the question and the evidence its queries retrieve, answered when the
evidence holds a gold answer, abstained on when not (a third of them with the answer's documents
removed). Prints one JSON line last: {"demos": path, "n", "sufficient"}.
"""

from __future__ import annotations

import json
import os

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_CONFIG = common.define_config(
    "A DAC generator_sft config.", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "dac.py")
    + ":generator_sft")


def main(_):
  from agentjax.dac.warmstart import write_generator_demos
  from agentjax.jsonl import iter_json_objects
  path = write_generator_demos(_CONFIG.value)
  rows = [row for _, row in iter_json_objects(path, ValueError, what="generator demos")]
  print(json.dumps({"demos": path, "n": len(rows),
                    "sufficient": sum(r["sufficient"] for r in rows)}))


if __name__ == "__main__":
  common.run(main)
