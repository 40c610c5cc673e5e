"""A PEFT LoRA adapter merged into its base model: a full Hugging Face folder (what
launch/merge_lora.py writes).

    merge_lora("models/Qwen2.5-7B-Instruct", "runs/igpo/adapters/policy", "runs/igpo/merged")

For servers that take a plain checkpoint (vLLM or SGLang without their LoRA support): the output
is the base's config with every adapted kernel replaced by W + (alpha / r) . A . B, the tokenizer
files and generation_config.json of the base copied beside it. The adapter is any PEFT LoRA
folder whose adapter_config.json agentjax can compute (peft.py); rank, alpha and targets come
from it, and the tensors are checked against the base's shapes before anything is merged.

dtype "auto" keeps the base's. The base is loaded in bfloat16 when the output is bfloat16 (half
the memory; the merge runs in float32 per kernel and rounds once, so the result equals merging in
float32 and casting), else in float32. The folder is written beside `out` and swapped in whole
(checkpoint.staged_folder).
"""

from __future__ import annotations

import logging
import os

import numpy as np

# Files of a Hugging Face folder that describe its tokenizer and generation defaults: copied to
# the merged folder as they are (no load/save round trip that could rewrite them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
# Output dtype name -> (the dtype the base is loaded in, numpy dtype save_hf casts to or None).
MERGE_DTYPES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
           "float16": ("float32", np.float16)}
_FROM_SAFETENSORS = {"F32": "float32", "F64": "float32", "BF16": "bfloat16", "F16": "float16"}

log = logging.getLogger(__name__)


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
  if name not in MERGE_DTYPES:
    raise ValueError(f"dtype must be auto or one of {sorted(MERGE_DTYPES)}, got {dtype!r}")
  load_dtype, save_dtype = MERGE_DTYPES[name]
  spec = peft_spec(adapter)
  cfg, params = load_hf(base, param_dtype=load_dtype)
  tree = load_peft(adapter, cfg, spec)
  log.info("merging %s (rank %d, alpha %g, targets %s) into %s as %s", adapter, spec.rank,
           spec.alpha, ",".join(spec.targets), base, name)
  merged = lora_lib.merge(params, tree, spec.scale)
  copies = [os.path.join(base, f) for f in TOKENIZER_FILES if os.path.isfile(os.path.join(base, f))]
  return save_hf(out, cfg, merged, dtype=save_dtype, copy_files=copies)


__all__ = ["MERGE_DTYPES", "TOKENIZER_FILES", "base_dtype", "merge_lora"]
