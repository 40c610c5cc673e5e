"""Tokenizers come from the checkpoint folder through transformers.AutoTokenizer."""

from __future__ import annotations

import os
from typing import Any


class TokenizerError(ValueError):
  """A tokenizer folder agentjax cannot use; the message names the missing piece."""


def load_tokenizer(path: str, require_chat_template: bool = True) -> Any:
  """Loads the tokenizer (and its chat template) saved beside a Hugging Face checkpoint.

  Agent prompts are rendered with the chat template, so a folder without one is an error unless
  `require_chat_template=False`.
  """
  from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

  if not os.path.isdir(path):
    raise TokenizerError(f"{path}: tokenizer folder does not exist")
  try:
    tokenizer = AutoTokenizer.from_pretrained(path)
  except (OSError, ValueError) as e:
    raise TokenizerError(f"{path}: cannot load a tokenizer ({e})") from None
  if require_chat_template and not getattr(tokenizer, "chat_template", None):
    raise TokenizerError(
        f"{path}: the tokenizer has no chat_template (expected in tokenizer_config.json or "
        "chat_template.jinja); agent prompts need one")
  return tokenizer
