r"""Train: RL (IGPO, GRPO, Dr.GRPO, RLOO, REINFORCE++, GSPO) or the SFT warm start, by config.

  python launch/train.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo
  python launch/train.py --config=configs/sft.py:demo --workdir=runs/demo/sft
  python launch/train.py --config=configs/igpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/igpo7b \
      --config.rollout.group_size=8 --config.optimizer.lr=2e-6

Re-running the same command resumes from the latest checkpoint in --workdir; so does --workdir
alone, with the config the run recorded ({workdir}/config.json) and any --config.* overrides on
top, e.g. more steps:

  python launch/train.py --workdir=runs/demo/igpo --config.train.steps=40

Each command is appended to {workdir}/overrides.jsonl (launch/common.py). On a TPU pod or
several GPU hosts every worker runs the same command (see README: multi-host); set
--coordinator=host:port --num_processes=N --process_id=i where jax cannot detect the cluster.
"""

from __future__ import annotations

import json
import logging
import sys

from absl import flags

import common  # launch/common.py: the entry point, the run config, multi-host flags

_CONFIG = common.define_config("Config file and preset, e.g. configs/igpo.py:demo (default: the "
                               "config --workdir's run recorded, to continue it).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, logs, exports.")
flags.mark_flags_as_required(["workdir"])


def main(_):
  common.init_distributed()
  import jax
  from agentjax.train import config as config_lib
  from agentjax.train.trainer import RetrieverUnavailableError, TrainingDivergedError, train
  config_lib.validate(_CONFIG.value)  # before the command is recorded in the workdir
  _CONFIG.record()
  try:
    summary = train(_CONFIG.value, _WORKDIR.value)
  except (TrainingDivergedError, RetrieverUnavailableError) as e:
    # The step is checkpointed: say what happened and exit non-zero (schedulers see a failure).
    logging.error("%s: %s", type(e).__name__, e)
    sys.exit(3)
  if jax.process_index() == 0:
    out = {k: v for k, v in summary.items() if k not in ("params", "cfg", "critic_params")}
    print(json.dumps({"train": _CONFIG.value.trainer, **out}, default=str))


if __name__ == "__main__":
  common.run(main)
