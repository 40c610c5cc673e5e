r"""EM and F1 per benchmark with greedy decoding, from a run's checkpoint or a Hugging Face folder.

  python launch/eval.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo
  python launch/eval.py --config=configs/igpo.py:qwen2.5-7b --hf_path=models/Qwen2.5-7B-Instruct \
      --config.data.eval_size=0 --output=results/qwen7b_test.json

Benchmarks: config.data.eval (comma-separated), split config.data.eval_split, the first
config.data.eval_size questions of each (0: all), with the config's retriever and rollout limits.
Prints a table, writes JSON (per-question answers included) to --output (default
{workdir}/eval_{split}_{step}.json, or {hf_path}_eval_{split}.json beside the folder), and prints
one JSON line last. Multi-host: the same flags as launch/train.py; process 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import common  # noqa: E402  (launch/common.py: multi-host flags)

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file and preset.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir: evaluate its checkpoint.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_HF_PATH = flags.DEFINE_string("hf_path", None, "A Hugging Face folder to evaluate instead.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON output path.")
flags.mark_flag_as_required("config")


def main(_):
  logging.getLogger().setLevel(logging.INFO)
  if (_WORKDIR.value is None) == (_HF_PATH.value is None):
    raise app.UsageError("give exactly one of --workdir or --hf_path")
  common.init_distributed()
  import jax
  from agentjax.train.trainer import eval_benchmarks, format_table
  result = eval_benchmarks(_CONFIG.value, workdir=_WORKDIR.value, hf_path=_HF_PATH.value,
                           step=_STEP.value)
  if jax.process_index() != 0:
    return
  split = result["split"]
  if _OUTPUT.value:
    output = _OUTPUT.value
  elif _WORKDIR.value:  # one file per evaluated step
    output = os.path.join(_WORKDIR.value, f"eval_{split}_{os.path.basename(result['source'])}.json")
  else:  # beside the folder, named after it
    folder = os.path.abspath(_HF_PATH.value).rstrip("/")
    output = f"{folder}_eval_{split}.json"
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output, "w") as f:
    json.dump(result, f, indent=1)
  print(format_table(result))
  print(f"per-question results: {output}")
  print(json.dumps({"eval": result["source"], "split": split,
                    **{name: {"em": round(b["em"], 4), "f1": round(b["f1"], 4), "n": b["n"]}
                       for name, b in result["benchmarks"].items()},
                    "average": {k: round(v, 4) for k, v in result["average"].items()}}))


if __name__ == "__main__":
  app.run(main)
