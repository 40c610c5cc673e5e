"""The token ids that end a generation: the config's EOS ids, the tokenizer's, and <|im_end|>."""

from __future__ import annotations

from typing import Any

# Ends an assistant turn in the ChatML template of Qwen (and others): a chat model emits it, not
# its tokenizer's eos_token, when it has finished its reply.
IM_END = "<|im_end|>"


def eos_token_ids(cfg: Any, tokenizer: Any, chat: bool = True) -> list[int]:
  """Sorted ids that stop generation.

  Args:
    cfg: a QwenConfig (its eos_token_ids, from the checkpoint's config.json).
    tokenizer: a transformers tokenizer (its eos_token_id, when it has one).
    chat: also stop at <|im_end|> when the vocabulary has it (the text is a chat turn).
  """
  eos = set(cfg.eos_token_ids)
  if tokenizer.eos_token_id is not None:
    eos.add(int(tokenizer.eos_token_id))
  if chat and IM_END in tokenizer.get_vocab():
    eos.add(int(tokenizer.convert_tokens_to_ids(IM_END)))
  return sorted(eos)
