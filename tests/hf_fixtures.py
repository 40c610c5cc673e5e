"""Builders for tiny random transformers checkpoints and tokenizers (used by tests and benches)."""

from __future__ import annotations

import numpy as np

# Configs that exercise every branch of the port: tied/untied heads, several GQA ratios, Qwen3's
# head_dim != hidden/heads, non-default rope_theta.
HF_CONFIGS = {
    "qwen2-tied-gqa2": dict(model_type="qwen2", vocab_size=211, hidden_size=64, intermediate_size=112,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            tie_word_embeddings=True, rope_theta=10000.0),
    "qwen2-untied-mha": dict(model_type="qwen2", vocab_size=211, hidden_size=48, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                             tie_word_embeddings=False, rope_theta=1_000_000.0),
    "qwen2-gqa8": dict(model_type="qwen2", vocab_size=211, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=1,
                       tie_word_embeddings=True, rope_theta=500.0),
    "qwen3-headdim": dict(model_type="qwen3", vocab_size=211, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=24, tie_word_embeddings=False, rope_theta=1_000_000.0),
    # Every sharded dimension divisible by 2, for the 2x2x2 mesh test.
    "qwen3-shardable": dict(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, tie_word_embeddings=False, rope_theta=1_000_000.0),
    "qwen3-tied-gqa4": dict(model_type="qwen3", vocab_size=211, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                            head_dim=16, tie_word_embeddings=True, rope_theta=2500.0),
    # Covers every id of make_tokenizer_dir's 400-token tokenizer (chat completion tests).
    "qwen2-chat": dict(model_type="qwen2", vocab_size=400, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=True, rope_theta=10000.0),
}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def hf_config(name: str):
  from transformers import Qwen2Config, Qwen3Config

  kw = dict(HF_CONFIGS[name])
  model_type = kw.pop("model_type")
  theta = kw.pop("rope_theta")
  cls = Qwen3Config if model_type == "qwen3" else Qwen2Config
  return cls(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)


def make_checkpoint(name: str, folder: str, seed: int = 0, **save_kwargs):
  """Random transformers model saved to `folder`; returns the model (float32, eval mode).

  Every parameter, norms and biases included, is perturbed so that no path is an identity.
  """
  import torch
  from transformers import AutoModelForCausalLM

  torch.manual_seed(seed)
  model = AutoModelForCausalLM.from_config(hf_config(name)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.1)
  model.save_pretrained(folder, **save_kwargs)
  return model


def hf_logits(model, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
  import torch

  with torch.no_grad():
    kwargs = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
    return model(torch.tensor(ids), **kwargs).logits.float().numpy()


def make_tokenizer_dir(folder: str, chat_template: str | None = CHAT_TEMPLATE,
                       vocab_size: int = 400) -> str:
  """Trains a byte-level BPE on a few sentences and saves it as a transformers tokenizer folder."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  text = [
      "<think>I need to search for the capital.</think>",
      "<search>capital of Veltrana</search>",
      "<information>Doc 1(Title: Veltrana) Veltrana is a country. Its capital is Orsk.</information>",
      "<answer>Orsk</answer>",
      "The quick brown fox jumps over the lazy dog. Who was born in which city?",
  ] * 20
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(text, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>")
  if chat_template is not None:
    fast.chat_template = chat_template
  fast.save_pretrained(folder)
  return folder
