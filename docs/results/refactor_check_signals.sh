#!/bin/bash
# The 2-step runs of docs/results/refactor_check_signals.md: run.sh TAG REPO NAME -> /tmp/rc/TAG/NAME.
# W: a folder holding the research world (synthworld/, tfds/, bm25_index/: e.g. a study's root).
TAG=$1; R=$2; NAME=$3; shift 3
W=${W:-/tmp/dac_smoke}
CFG=$NAME; PRESET=research
case $NAME in
  ppo_ig) CFG=ppo; EXTRA="--config.ppo.ig_weight=1.0";;
  cw_grpo_ig) CFG=cw_grpo; EXTRA="--config.algorithm=cw_grpo_ig";;
  *) EXTRA="";;
esac
cd $R && PYTHONPATH=$R nice -n 19 python launch/train.py --config=configs/$CFG.py:$PRESET \
  --workdir=/tmp/rc/$TAG/$NAME --config.seed=0 --config.train.steps=2 --config.train.eval_every=0 \
  --config.train.eval_at_start=False --config.data.eval_size=8 --config.train.export_hf=False \
  --config.model.hf_path=$R/backbones/research_v2/final --config.model.tokenizer_path= \
  --config.data.manual_dir=$W/synthworld --config.data.data_dir=$W/tfds \
  --config.retrieval.corpus_path=$W/synthworld/corpus.jsonl --config.retrieval.index_dir=$W/bm25_index \
  --config.train.jax_cache_dir=/tmp/rc/jax_cache_$TAG $EXTRA "$@" > /tmp/rc/$TAG.$NAME.log 2>&1
echo "$TAG $NAME rc=$?"
