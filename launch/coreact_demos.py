r"""The rubric generator's warm-start demonstrations (agentjax/coreact/warmstart.py).

  python launch/coreact_demos.py                  # configs/coreact.py:rubric_sft's sft.demos
  python launch/coreact_demos.py --per_branch=4 --config.seed=1

Reads the training branch points (config.coreact.branches_train, from
launch/collect_branches.py) and writes, for each, `per_branch` random well-formed rubrics from the
executor's criterion vocabulary to config.sft.demos. Prints one JSON line last: {"demos", "n"}.
"""

from __future__ import annotations

import json
import os

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_CONFIG = common.define_config(
    "A coreact rubric_sft config.", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "coreact.py")
    + ":rubric_sft")
_PER_BRANCH = flags.DEFINE_integer("per_branch", 2, "Random rubrics per branch point.")


def main(_):
  from agentjax.coreact.warmstart import write_rubric_demos
  from agentjax.jsonl import iter_json_objects
  path = write_rubric_demos(_CONFIG.value, per_branch=_PER_BRANCH.value)
  n = sum(1 for _ in iter_json_objects(path, ValueError, what="rubric demos"))
  print(json.dumps({"demos": path, "n": n}))


if __name__ == "__main__":
  common.run(main)
