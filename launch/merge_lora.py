r"""Merges a PEFT LoRA adapter into its base model: a full Hugging Face folder
(agentjax/models/qwen/merge.py).

    python launch/merge_lora.py --base=models/Qwen2.5-7B-Instruct \
        --adapter=runs/igpo/adapters/policy --out=runs/igpo/merged

For servers that take a plain checkpoint (vLLM or SGLang without their LoRA support). --adapter
is any PEFT LoRA folder (one of a run's {workdir}/adapters/<name>/, or one trained with peft);
--dtype: the output's weight dtype, "auto" (default) keeps the base's.
"""

from __future__ import annotations

import argparse
import logging

import common  # launch/common.py: one-line errors, quiet logs
from agentjax.models.qwen.merge import MERGE_DTYPES, merge_lora


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--base", required=True, help="Hugging Face folder of the base model.")
  parser.add_argument("--adapter", required=True, help="PEFT LoRA adapter folder.")
  parser.add_argument("--out", required=True, help="Folder to write the merged model to.")
  parser.add_argument("--dtype", default="auto", choices=["auto", *MERGE_DTYPES],
                      help="Weight dtype of the output (auto: the base's).")
  parser.add_argument("--verbose", action="store_true",
                      help="Print an error's traceback, and every library's INFO log lines.")
  args = parser.parse_args(argv)  # a bad argument: usage and one line, status 2
  logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
  common.quiet_logs(args.verbose)
  with common.user_errors(["merge_lora.py"] + (["--verbose"] if args.verbose else [])):
    out = merge_lora(args.base, args.adapter, args.out, args.dtype)
  print(out)
  return out


if __name__ == "__main__":
  main()
