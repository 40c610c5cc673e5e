r"""Trains a small dense retriever on a SynthWorld's question -> gold passage pairs, indexes the
corpus with it, and compares its recall@k on the dev questions with BM25's (one JSON line).

    python launch/train_encoder.py --world=runs/research/synthworld --out=runs/research/dense
    # then train with it: --config.retrieval.backend=dense \
    #     --config.retrieval.index_dir=runs/research/dense/index

Writes {out}/encoder (a Hugging Face BERT folder) and {out}/index (launch/index.py's layout).
The pairs, the loss and the encoder's shape: agentjax/retrieval/encoder_training.py.
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

FLAGS = flags.FLAGS
flags.DEFINE_string("world", None, "A SynthWorld folder (corpus.jsonl, train.jsonl, dev.jsonl).")
flags.DEFINE_string("out", None, "Output folder (encoder/ and index/).")
flags.DEFINE_integer("steps", 300, "Training steps.")
flags.DEFINE_integer("batch_size", 64, "Question / passage pairs a step (in-batch negatives).")
flags.DEFINE_integer("hidden_size", 128, "Encoder width.")
flags.DEFINE_integer("num_layers", 2, "Encoder layers.")
flags.DEFINE_float("lr", 1e-3, "AdamW learning rate.")
flags.DEFINE_integer("seed", 0, "Initialization and batch order.")
flags.DEFINE_integer("eval_questions", 1000, "Dev questions of the recall comparison.")
flags.mark_flags_as_required(["world", "out"])


def main(argv):
  del argv
  from agentjax.jsonl import iter_json_objects
  from agentjax.models import bert
  from agentjax.retrieval import make_backend
  from agentjax.retrieval.base import load_corpus
  from agentjax.retrieval.dense_index import TextEncoder, build_dense_index
  from agentjax.retrieval.encoder_training import (EncoderTraining, first_hop_pairs, recall_at,
                                                   train_encoder)
  def read_jsonl(path):
    return [row for _, row in iter_json_objects(path, ValueError, ("question",), "questions")]

  corpus_path = os.path.join(FLAGS.world, "corpus.jsonl")
  corpus = load_corpus(corpus_path)
  passages = [r["contents"] for r in corpus]
  train_q, train_gold = first_hop_pairs(read_jsonl(os.path.join(FLAGS.world, "train.jsonl")),
                                        corpus)
  dev_q, dev_gold = first_hop_pairs(read_jsonl(os.path.join(FLAGS.world, "dev.jsonl")), corpus)
  dev_q, dev_gold = dev_q[:FLAGS.eval_questions], dev_gold[:FLAGS.eval_questions]
  settings = EncoderTraining(hidden_size=FLAGS.hidden_size, num_layers=FLAGS.num_layers,
                             steps=FLAGS.steps, batch_size=FLAGS.batch_size, lr=FLAGS.lr,
                             seed=FLAGS.seed)
  t0 = time.perf_counter()
  cfg, params, tokenizer, losses = train_encoder(settings, train_q, train_gold, passages,
                                                 log_every=50)
  train_s = time.perf_counter() - t0
  encoder_dir = bert.save_hf(os.path.join(FLAGS.out, "encoder"), cfg, params, tokenizer)
  index_dir = os.path.join(FLAGS.out, "index")
  build_dense_index(corpus_path, TextEncoder(encoder_dir), index_dir)
  gold_ids = [corpus[i]["id"] for i in dev_gold]
  dense = recall_at(make_backend("dense", index_dir=index_dir), dev_q, gold_ids)
  bm25 = recall_at(make_backend("bm25", corpus_path=corpus_path,
                                index_dir=os.path.join(FLAGS.out, "bm25")), dev_q, gold_ids)
  print(json.dumps({"train_pairs": len(train_q), "dev_questions": len(dev_q),
                    "steps": FLAGS.steps, "train_s": round(train_s, 1),
                    "loss_first_10": round(sum(losses[:10]) / 10, 4),
                    "loss_last_10": round(sum(losses[-10:]) / 10, 4),
                    "dense": dense, "bm25": bm25, "encoder": encoder_dir,
                    "index": index_dir}), flush=True)


if __name__ == "__main__":
  common.run(main)
