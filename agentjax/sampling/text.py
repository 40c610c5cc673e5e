"""Exact token <-> byte mapping, so stop strings are matched and text decoded without re-tokenizing.

A byte-level BPE (Qwen, GPT-2) writes each token as a string over a 256-character alphabet that
stands for raw bytes; added/special tokens are stored as their literal text. `token_byte_table`
turns any vocabulary into one bytes object per token id, and `decode_bytes` joins them: the text
of a trajectory is always derived from the exact token ids that were sampled or fed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Sequence


@functools.lru_cache(maxsize=None)
def _byte_decoder() -> dict[str, int]:
  """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte value."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  chars = list(printable)
  extra = 0
  for b in range(256):
    if b not in printable:
      printable.append(b)
      chars.append(256 + extra)
      extra += 1
  return {chr(c): b for b, c in zip(printable, chars)}


def _is_byte_level(tokenizer: Any) -> bool:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    return False
  decoder = json.loads(backend.to_str()).get("decoder") or {}
  kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
  return "ByteLevel" in kinds


def token_byte_table(tokenizer: Any, vocab_size: int) -> list[bytes]:
  """bytes of every token id in [0, vocab_size); ids the tokenizer lacks (padded vocab) -> b"".

  Byte-level BPE tokens are mapped back to their exact bytes. For other tokenizers
  (SentencePiece) each id is decoded on its own, which is exact for whole-character pieces.
  """
  added = {tok.content for tok in tokenizer.added_tokens_decoder.values()} \
      if hasattr(tokenizer, "added_tokens_decoder") else set()
  table = [b""] * vocab_size
  n = min(vocab_size, len(tokenizer))
  pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
  if _is_byte_level(tokenizer):
    dec = _byte_decoder()
    for i, piece in enumerate(pieces):
      if piece is None:
        continue
      if piece in added or any(ch not in dec for ch in piece):
        table[i] = piece.encode("utf-8")
      else:
        table[i] = bytes(dec[ch] for ch in piece)
  else:
    for i in range(n):
      table[i] = tokenizer.decode([i]).encode("utf-8")
  return table


def decode_bytes(table: Sequence[bytes], ids: Sequence[int]) -> str:
  """Text of a token sequence; invalid UTF-8 becomes U+FFFD (never an exception)."""
  return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def think_tag_ids(tokenizer: Any, field: str = "max_think_tokens") -> tuple[int, int]:
  """The ids of `<think>` and `</think>` (each must be one token: an added token in agentjax's
  tokenizers, a special one in Qwen3's); a ValueError naming `field` otherwise."""
  ids = []
  for tag in ("<think>", "</think>"):
    got = list(tokenizer.encode(tag, add_special_tokens=False))
    if len(got) != 1:
      raise ValueError(f"{field}: the thinking budget needs {tag!r} as one token of the "
                       f"tokenizer, it encodes to {got}")
    ids.append(int(got[0]))
  return ids[0], ids[1]


def with_think_tags(sampling: Any, tokenizer: Any, field: str = "max_think_tokens") -> Any:
  """`sampling` (a SamplingParams) with think_tags read from the tokenizer when its thinking
  budget is on and they are not set; unchanged otherwise."""
  if sampling.max_think_tokens <= 0 or sampling.think_tags is not None:
    return sampling
  return dataclasses.replace(sampling, think_tags=think_tag_ids(tokenizer, field))
