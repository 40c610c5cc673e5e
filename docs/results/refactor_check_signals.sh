#!/bin/bash
# The 2-step runs of docs/results/refactor_check_signals.md, one run per call:
#
#   docs/results/refactor_check_signals.sh [--world=DIR] [--out=DIR] TAG REPO NAME [overrides]
#
# TAG: old | new (which tree); REPO: that tree's checkout; NAME: grpo igpo ppo ppo_ig cw_grpo
# cw_grpo_ig a2tgpo (configs/<NAME>.py:research; ppo_ig and cw_grpo_ig are overrides of ppo and
# cw_grpo). The overrides after NAME (--config.x=y ...) go to launch/train.py.
# --world: the research world (synthworld/, tfds/, bm25_index/: e.g. a study's root); default $W
#   if set, else runs/research.
# --out: where the runs go: OUT/TAG/NAME (its metrics.jsonl is what refactor_check_signals.py
#   compares), its log OUT/TAG.NAME.log, the JAX cache OUT/jax_cache_TAG; default
#   runs/refactor_check.
# Relative folders are taken from the directory the script is called in (the run itself starts in
# REPO).
W=${W:-runs/research}
OUT=runs/refactor_check
while [[ $1 == --world=* || $1 == --out=* ]]; do
  case $1 in
    --world=*) W=${1#--world=};;
    --out=*) OUT=${1#--out=};;
  esac
  shift
done
if [[ $# -lt 3 ]]; then
  echo "usage: $0 [--world=DIR] [--out=DIR] TAG REPO NAME [--config.x=y ...]" >&2
  exit 2
fi
TAG=$1; R=$2; NAME=$3; shift 3
[[ -d $W ]] || {
  echo "--world=$W: no such folder (give the research world: synthworld/, tfds/, bm25_index/)" >&2
  exit 2; }
[[ -d $R ]] || { echo "REPO=$R: no such folder (give a checkout of the tree to run)" >&2; exit 2; }
mkdir -p "$OUT" || exit 1
W=$(cd "$W" && pwd); R=$(cd "$R" && pwd); OUT=$(cd "$OUT" && pwd)
CFG=$NAME; PRESET=research
case $NAME in
  ppo_ig) CFG=ppo; EXTRA="--config.ppo.ig_weight=1.0";;
  cw_grpo_ig) CFG=cw_grpo; EXTRA="--config.algorithm=cw_grpo_ig";;
  *) EXTRA="";;
esac
cd "$R" && PYTHONPATH=$R nice -n 19 python launch/train.py --config=configs/$CFG.py:$PRESET \
  --workdir="$OUT/$TAG/$NAME" --config.seed=0 --config.train.steps=2 --config.train.eval_every=0 \
  --config.train.eval_at_start=False --config.data.eval_size=8 --config.train.export_hf=False \
  --config.model.hf_path=$R/backbones/research_v2/final --config.model.tokenizer_path= \
  --config.data.manual_dir=$W/synthworld --config.data.data_dir=$W/tfds \
  --config.retrieval.corpus_path=$W/synthworld/corpus.jsonl --config.retrieval.index_dir=$W/bm25_index \
  --config.train.jax_cache_dir="$OUT/jax_cache_$TAG" $EXTRA "$@" > "$OUT/$TAG.$NAME.log" 2>&1
echo "$TAG $NAME rc=$?"
