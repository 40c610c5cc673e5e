r"""Merges a PEFT LoRA adapter into its base model: a full Hugging Face folder.

    python launch/merge_lora.py --base=models/Qwen2.5-7B-Instruct \
        --adapter=runs/igpo/adapters/policy --out=runs/igpo/merged

For servers that take a plain checkpoint (vLLM or SGLang without their LoRA support): the
output is the base's config with every adapted kernel replaced by W + (alpha / r) . A . B, the
tokenizer files and generation_config.json of the base copied beside it. --adapter is any PEFT
LoRA folder (one of a run's {workdir}/adapters/<name>/, or one trained with peft) whose
adapter_config.json agentjax can compute (see agentjax/models/qwen/peft.py); rank, alpha and
targets come from it, and the tensors are checked against the base's shapes before anything is
merged.

--dtype: the output's weight dtype; "auto" (default) keeps the base's. The base is loaded in
bfloat16 when the output is bfloat16 (half the memory; the merge runs in float32 per kernel and
rounds once, so the result equals merging in float32 and casting), else in float32.

The folder is written beside --out and swapped in whole (checkpoint.staged_folder).
"""

from __future__ import annotations

import argparse
import logging
import os

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

# Files of a Hugging Face folder that describe its tokenizer and generation defaults: copied to
# the merged folder as they are (no load/save round trip that could rewrite them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
# Output dtype name -> (the dtype the base is loaded in, numpy dtype save_hf casts to or None).
_DTYPES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
           "float16": ("float32", np.float16)}
_FROM_SAFETENSORS = {"F32": "float32", "F64": "float32", "BF16": "bfloat16", "F16": "float16"}

log = logging.getLogger("merge_lora")


def base_dtype(base: str) -> str:
  """The dtype name of the base checkpoint's weights (its embedding's, from the file header)."""
  from agentjax.models.safetensors_io import SafetensorsFolder

  folder = SafetensorsFolder(base)
  return _FROM_SAFETENSORS.get(folder.dtype("model.embed_tokens.weight"), "float32")


def merge_lora(base: str, adapter: str, out: str, dtype: str = "auto") -> str:
  """Writes base + adapter merged as a Hugging Face folder at `out`; returns its path.

  Args:
    base: a Hugging Face Qwen2/2.5/3 folder (what load_hf reads).
    adapter: a PEFT LoRA folder for that base.
    out: the folder to write (replaced whole if it exists).
    dtype: "auto" (the base's), "float32", "bfloat16" or "float16".
  """
  from agentjax.models import lora as lora_lib
  from agentjax.models.qwen.checkpoint import load_hf, save_hf
  from agentjax.models.qwen.peft import load_peft, peft_spec

  name = base_dtype(base) if dtype == "auto" else dtype
  if name not in _DTYPES:
    raise ValueError(f"--dtype must be auto or one of {sorted(_DTYPES)}, got {dtype!r}")
  load_dtype, save_dtype = _DTYPES[name]
  spec = peft_spec(adapter)
  cfg, params = load_hf(base, param_dtype=load_dtype)
  tree = load_peft(adapter, cfg, spec)
  log.info("merging %s (rank %d, alpha %g, targets %s) into %s as %s", adapter, spec.rank,
           spec.alpha, ",".join(spec.targets), base, name)
  merged = lora_lib.merge(params, tree, spec.scale)
  copies = [os.path.join(base, f) for f in TOKENIZER_FILES if os.path.isfile(os.path.join(base, f))]
  return save_hf(out, cfg, merged, dtype=save_dtype, copy_files=copies)


def main(argv: list[str] | None = None) -> str:
  # argparse, not absl flags: tests import this module beside other launch scripts, and absl's one
  # global flag registry would clash on shared names (--out).
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--base", required=True, help="Hugging Face folder of the base model.")
  parser.add_argument("--adapter", required=True, help="PEFT LoRA adapter folder.")
  parser.add_argument("--out", required=True, help="Folder to write the merged model to.")
  parser.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES],
                      help="Weight dtype of the output (auto: the base's).")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
  out = merge_lora(args.base, args.adapter, args.out, args.dtype)
  print(out)
  return out


if __name__ == "__main__":
  main()
