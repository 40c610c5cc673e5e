"""The demo tokenizer (agentjax.data.tokenizer): a byte-level BPE trained on a SynthWorld folder.

Exact round trips (through transformers and through the rollout's byte table), protocol tags as
single non-special tokens, the Qwen-style chat template, and the vocabulary budget.
"""

from __future__ import annotations

import json
import os

import pytest

from agentjax.agent.protocol import SEARCH_R1
from agentjax.data.tokenizer import (CHAT_TEMPLATE, PROTOCOL_TAGS, SPECIAL_TOKENS,
                                     synthworld_texts, train_tokenizer)
from agentjax.models.tokenizer import load_tokenizer
from agentjax.sampling import decode_bytes, token_byte_table

VOCAB = 1024


def _texts(world_dir):
  texts = list(synthworld_texts(world_dir))
  with open(os.path.join(world_dir, "demos.jsonl")) as f:
    demos = [json.loads(line) for line in f]
  return texts, demos


def test_synthworld_texts_cover_corpus_prompts_and_demo_segments(world_dir):
  texts, demos = _texts(world_dir)
  with open(os.path.join(world_dir, "corpus.jsonl")) as f:
    corpus = [json.loads(line)["contents"] for line in f]
  assert texts[:len(corpus)] == corpus
  assert SEARCH_R1.prompt(demos[0]["question"]) in texts
  assert all(seg["text"] in texts for seg in demos[0]["segments"])


def test_round_trip_of_synthworld_text(world_dir, tokenizer):
  texts, _ = _texts(world_dir)
  table = token_byte_table(tokenizer, len(tokenizer))
  for text in texts[::7]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert decode_bytes(table, ids) == text  # the rollout engine's decoding path
  # Text the tokenizer never saw still round-trips (byte fallback via the byte alphabet).
  odd = "Zürich — 東京 emoji 🙂 tabs\tand  double  spaces\n"
  assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd


def test_tags_are_single_non_special_tokens(tokenizer):
  ids = [tokenizer.convert_tokens_to_ids(tag) for tag in PROTOCOL_TAGS]
  assert len(set(ids)) == len(PROTOCOL_TAGS) and tokenizer.unk_token_id not in ids
  for tag, i in zip(PROTOCOL_TAGS, ids):
    assert tokenizer.encode(tag, add_special_tokens=False) == [i]
    assert tag not in tokenizer.all_special_tokens
  text = "<think>I need it.</think>\n<search> where is Orsk </search>"
  enc = tokenizer.encode(text, add_special_tokens=False)
  assert enc[0] == ids[0] and enc[-1] == ids[3]
  assert ids[1] in enc and ids[2] in enc
  # Tags survive skip_special_tokens (they are text); the chat markers do not.
  assert tokenizer.decode(enc + [tokenizer.eos_token_id], skip_special_tokens=True) == text


def test_special_tokens_and_chat_template(tokenizer):
  assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
  assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
  assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
  assert tokenizer.chat_template == CHAT_TEMPLATE
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
  rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
                      "<|im_start|>assistant\n")
  ids = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
  assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # markers are single tokens
  assert tokenizer.decode(ids) == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
  no_prompt = tokenizer.apply_chat_template(messages[1:], tokenize=False)
  assert no_prompt == "<|im_start|>user\nHi?<|im_end|>\n"


def test_vocab_size_is_respected(world_dir, tokenizer, tmp_path):
  assert len(tokenizer) == VOCAB  # enough text to fill the budget
  assert max(tokenizer.get_vocab().values()) == VOCAB - 1
  small = load_tokenizer(train_tokenizer(synthworld_texts(world_dir), str(tmp_path / "s"), 300))
  assert len(small) == 300 and max(small.get_vocab().values()) == 299
  assert small.encode("<answer>", add_special_tokens=False) == \
      [small.convert_tokens_to_ids("<answer>")]
  with pytest.raises(ValueError, match="vocab_size must be >= 267"):
    train_tokenizer(["abc"], str(tmp_path / "t"), vocab_size=266)
  # Little text: fewer merges than the budget allows, never more.
  tiny = load_tokenizer(train_tokenizer(["hello world"] * 3, str(tmp_path / "u"), 4096))
  assert len(tiny) < 4096


def test_compression_is_useful(world_dir, tokenizer):
  _, demos = _texts(world_dir)
  text = "".join(seg["text"] for seg in demos[0]["segments"])
  assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text) / 2.5
