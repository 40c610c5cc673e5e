"""A small byte-level BPE trained from scratch, for the tiny models of `make demo`.

    texts = synthworld_texts("data/manual/synthworld")        # corpus, prompts, demo turns
    folder = train_tokenizer(texts, "runs/demo/tokenizer", vocab_size=1024)
    tokenizer = agentjax.models.tokenizer.load_tokenizer(folder)

The folder is an ordinary transformers tokenizer (PreTrainedTokenizerFast) laid out like Qwen's:

  special tokens   <|endoftext|> (pad, id 0), <|im_start|> (1), <|im_end|> (2, eos)
  added tokens     the protocol tags <think> </think> <search> </search> <answer> </answer>
                   <information> </information>: single tokens, but NOT special, so decode keeps
                   them (skip_special_tokens drops only the three above)
  chat template    "<|im_start|>{role}\\n{content}<|im_end|>\\n" per message, then
                   "<|im_start|>assistant\\n" as the generation prompt

Tags as single tokens keep a tiny model's action syntax one prediction long, and make the
rollout's stop strings (</search>, </answer>) end exactly at a token boundary.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Iterator

from agentjax.agent.protocol import SEARCH_R1, Protocol
from agentjax.jsonl import iter_json_objects

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PROTOCOL_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
                 "<information>", "</information>")
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_BYTE_ALPHABET = 256
# The training text is split at special and added tokens, as encoding splits it: they become
# whole tokens anyway, and left in they would spend merges on pieces such as "</" and "think".
_RESERVED = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + PROTOCOL_TAGS))


def train_tokenizer(texts: Iterable[str], out_dir: str, vocab_size: int = 1024) -> str:
  """Trains a byte-level BPE on `texts` and saves a transformers tokenizer folder.

  Args:
    texts: training text (any iterable; consumed once).
    out_dir: folder to write (created if needed); it then loads with
      agentjax.models.tokenizer.load_tokenizer.
    vocab_size: total vocabulary, special and added tokens included (len(tokenizer) is at most
      this; less when the text has too few distinct pairs to merge). Must leave room for the 256
      byte tokens plus the 11 special/added ones.
  Returns:
    out_dir.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  reserved = len(SPECIAL_TOKENS) + len(PROTOCOL_TAGS)
  if vocab_size < _BYTE_ALPHABET + reserved:
    raise ValueError(f"vocab_size must be >= {_BYTE_ALPHABET + reserved} (256 bytes + "
                     f"{reserved} special/added tokens), got {vocab_size}")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  # The trainer's budget includes the special tokens (ids 0..2); the tags are added after
  # training (ids at the top), so they are taken off its budget here.
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(PROTOCOL_TAGS),
                                special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  pieces = (piece for text in texts for piece in _RESERVED.split(text) if piece)
  tok.train_from_iterator(pieces, trainer)
  # Added before training, the tags would take ids the trainer then reassigns; after it, they
  # are appended. normalized=False: matched on the raw text, as Qwen's added tokens are.
  tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in PROTOCOL_TAGS])
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
      # Decode must give back the exact text: no " ." -> "." clean-up.
      clean_up_tokenization_spaces=False, model_max_length=1 << 20)
  fast.chat_template = CHAT_TEMPLATE
  os.makedirs(out_dir, exist_ok=True)
  fast.save_pretrained(out_dir)
  return out_dir


def synthworld_texts(data_dir: str, protocol: Protocol = SEARCH_R1) -> Iterator[str]:
  """Tokenizer training text of a written SynthWorld folder (see SynthWorld.write).

  Yields every corpus passage, the prompt (`protocol.prompt`) of every question of every split,
  and every demonstration segment: the text the model reads and writes, weighted as often as
  it will see it (the instruction once per question, so the prompt compresses well).
  """

  def rows(name: str, field: str) -> Iterator[dict]:
    path = os.path.join(data_dir, name)
    if os.path.exists(path):  # a world written without demonstrations, or without a split
      for _, row in iter_json_objects(path, ValueError, (field,), "SynthWorld file"):
        yield row

  for row in rows("corpus.jsonl", "contents"):
    yield row["contents"]
  for split in ("train", "dev", "test"):
    for row in rows(f"{split}.jsonl", "question"):
      yield protocol.prompt(row["question"])
  for row in rows("demos.jsonl", "segments"):
    for seg in row["segments"]:
      yield seg["text"]
