r"""Encodes a FlashRAG JSONL corpus into a dense index with a BERT-family encoder (e5, bge), for
the "dense" search backend (in-process) and launch/retriever.py --index (the Search-R1 API).

    python launch/index.py --corpus=data/wiki-18.jsonl --encoder=models/e5-base-v2 \
        --out=indexes/wiki18-e5
    # bge: an instruction before queries (at search time) and no prefix before passages
    python launch/index.py --corpus=corpus.jsonl --encoder=models/bge-base-en-v1.5 \
        --out=indexes/bge --passage_prefix=""

The encoder is a local Hugging Face folder (config.json, safetensors, its tokenizer; a
sentence-transformers folder's 1_Pooling/config.json picks mean or [CLS] pooling). Passages
are encoded in batches of similar length with a progress bar and written as safetensors shards
of --shard_docs passages with a manifest (agentjax/retrieval/dense_index.py); a killed build
resumes where it stopped when run again with the same arguments.
"""

from __future__ import annotations

import sys

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.retrieval.dense_index import E5_PASSAGE, TextEncoder, build_dense_index

FLAGS = flags.FLAGS
flags.DEFINE_string("corpus", None, "FlashRAG JSONL corpus ({\"id\", \"contents\"} per line).")
flags.DEFINE_string("encoder", None, "Hugging Face folder of a BERT-family encoder.")
flags.DEFINE_string("out", None, "Index folder (created; an unfinished one is resumed).")
flags.DEFINE_string("passage_prefix", E5_PASSAGE, "Text before each passage (e5: \"passage: \").")
flags.DEFINE_integer("max_length", 512, "Tokens per passage (cut beyond).")
flags.DEFINE_integer("batch_size", 64, "Passages per encoder call.")
flags.DEFINE_integer("shard_docs", 65536, "Passages per shard file (the unit of resumption).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Stored embeddings' dtype.")
flags.mark_flags_as_required(["corpus", "encoder", "out"])


def main(argv):
  del argv
  from tqdm import tqdm
  encoder = TextEncoder(FLAGS.encoder, max_length=FLAGS.max_length, batch_size=FLAGS.batch_size)
  with tqdm(desc="passages", unit="doc", file=sys.stderr) as bar:
    manifest = build_dense_index(FLAGS.corpus, encoder, FLAGS.out, shard_docs=FLAGS.shard_docs,
                                 passage_prefix=FLAGS.passage_prefix, dtype=FLAGS.dtype,
                                 progress=bar.update)
  print(f"indexed {manifest['num_docs']} passages ({manifest['dim']}-d, {FLAGS.dtype}) in "
        f"{len(manifest['shards'])} shards at {FLAGS.out}", flush=True)


if __name__ == "__main__":
  common.run(main)
