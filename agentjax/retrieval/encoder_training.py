"""A small dense retriever trained on a world's question -> gold passage pairs (contrastive,
in-batch negatives, Optax), from scratch: a WordPiece tokenizer of the corpus and a BERT encoder.

    python launch/train_encoder.py --world=runs/research/synthworld --out=runs/research/encoder

The pairs: each question and the passage of the entity it names (SynthWorld's chain[0], the
first hop's gold document, matched by title). The loss: InfoNCE over a batch of B pairs,
scores q_i . p_j / temperature, each query's own passage the positive and the batch's other
B - 1 passages the negatives (DPR, e5's fine-tuning). The encoder is saved as a Hugging Face
folder that launch/index.py and the "dense" backend read.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentjax.judge.oracle import gold_chain, title_key
from agentjax.models import bert
from agentjax.retrieval.dense_index import padded_tokens


@dataclasses.dataclass(frozen=True)
class EncoderTraining:
  """The encoder's shape and its training (our reading: no paper trains a retriever here)."""
  hidden_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  vocab_size: int = 4096
  max_length: int = 64
  steps: int = 300
  batch_size: int = 64
  lr: float = 1e-3
  temperature: float = 0.05
  seed: int = 0


def first_hop_pairs(questions: Sequence[dict[str, Any]], corpus: Sequence[dict[str, Any]]
                    ) -> tuple[list[str], np.ndarray]:
  """(question texts, [n] index into `corpus` of each one's first-hop gold passage); questions
  without a chain, or whose entity has no passage, are left out."""
  by_title = {}
  for i, row in enumerate(corpus):
    by_title.setdefault(title_key(row["contents"].split("\n", 1)[0]), i)
  texts, gold = [], []
  for q in questions:
    chain, why = gold_chain(q)
    if why is None and chain[0] in by_title:
      texts.append(q["question"])
      gold.append(by_title[chain[0]])
  return texts, np.asarray(gold, np.int64)


def wordpiece_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
  """A lowercasing BERT WordPiece tokenizer trained on `texts` ([CLS] text [SEP])."""
  from tokenizers import BertWordPieceTokenizer
  from transformers import PreTrainedTokenizerFast
  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1,
                         show_progress=False)
  # The trained tokenizer object itself (its normalizer, WordPiece model and [CLS]/[SEP]
  # post-processor): transformers 5's BertTokenizerFast(vocab_file=...) keeps only the specials.
  return PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, unk_token="[UNK]",
                                 pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                 mask_token="[MASK]")


def _tokens(tokenizer: Any, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
  return padded_tokens(tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"])


def info_nce(q: jax.Array, p: jax.Array, temperature: float) -> jax.Array:
  """Mean over the batch of -log softmax_j(q_i . p_j / t)[i]: q, p [B, E] (normalized)."""
  logits = q @ p.T / temperature
  return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
def _train_step(cfg: bert.BertConfig, optimizer: Any, temperature: float, params: Any,
                opt_state: Any, q_tokens, q_valid, p_tokens, p_valid):
  def loss_fn(params):
    return info_nce(bert.encode(cfg, params, q_tokens, q_valid),
                    bert.encode(cfg, params, p_tokens, p_valid), temperature)
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def train_encoder(settings: EncoderTraining, questions: Sequence[str], gold: np.ndarray,
                  passages: Sequence[str], query_prefix: str = "query: ",
                  passage_prefix: str = "passage: ", log_every: int = 0
                  ) -> tuple[bert.BertConfig, Any, Any, list[float]]:
  """(config, params, tokenizer, per-step losses): a WordPiece tokenizer of the passages and
  questions, then settings.steps AdamW steps of InfoNCE on batches of question / gold passage
  pairs drawn without repeats within a batch (a passage twice in a batch would be its own
  negative)."""
  tokenizer = wordpiece_tokenizer([passage_prefix + p for p in passages]
                                  + [query_prefix + q for q in questions], settings.vocab_size)
  cfg = bert.BertConfig(vocab_size=len(tokenizer), hidden_size=settings.hidden_size,
                        num_layers=settings.num_layers, num_heads=settings.num_heads,
                        intermediate_size=4 * settings.hidden_size,
                        max_position_embeddings=max(64, settings.max_length), pooling="mean")
  params = bert.init_params(cfg, jax.random.key(settings.seed))
  optimizer = optax.adamw(settings.lr, weight_decay=0.01)
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(settings.seed)
  losses = []
  for step in range(settings.steps):
    order = rng.permutation(len(questions))
    batch, seen = [], set()
    for i in order:  # distinct gold passages in a batch
      if gold[i] not in seen:
        batch.append(i)
        seen.add(gold[i])
      if len(batch) == settings.batch_size:
        break
    qt, qv = _tokens(tokenizer, [query_prefix + questions[i] for i in batch],
                     settings.max_length)
    pt, pv = _tokens(tokenizer, [passage_prefix + passages[gold[i]] for i in batch],
                     settings.max_length)
    params, opt_state, loss = _train_step(cfg, optimizer, settings.temperature, params,
                                          opt_state, qt, qv, pt, pv)
    losses.append(float(loss))
    if log_every and (step + 1) % log_every == 0:
      print(f"encoder step {step + 1}/{settings.steps} loss {np.mean(losses[-log_every:]):.4f}",
            flush=True)
  return cfg, params, tokenizer, losses


def recall_at(backend: Any, questions: Sequence[str], gold_ids: Sequence[str],
              ks: Sequence[int] = (1, 3, 10)) -> dict[str, float]:
  """recall@k of a SearchBackend: the share of questions whose gold passage id is among its
  top k (one batched call)."""
  response = backend.search(list(questions), max(ks))
  hits = [[d.id for d in docs] for docs in response.documents]
  return {f"recall@{k}": float(np.mean([g in h[:k] for g, h in zip(gold_ids, hits)]))
          for k in ks}
