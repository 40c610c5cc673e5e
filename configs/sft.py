r"""SFT warm start: cross-entropy on demonstration trajectories (observation tokens masked out, as in
RL), then a Hugging Face export that the RL configs start from.

  python launch/train.py --config=configs/sft.py:demo --workdir=runs/demo/sft
  python launch/train.py --config=configs/sft.py:qwen2.5-7b --workdir=runs/sft7b \
      --config.sft.demos=data/demos.jsonl

Presets: see configs/base.py. For `demo` the model is the tiny preset trained from scratch with the
SynthWorld tokenizer; for `research` the research backbone from scratch on its mixed corpus
(launch/backbone.py runs it), its lr decayed to 0.1x (the RL presets keep theirs constant); for
the others it is the preset's Hugging Face folder.
"""

from configs import base


def get_config(arg: str = "demo"):
  config = base.get_config(arg)
  config.trainer = "sft"
  if arg in ("demo", "research"):
    config.model.hf_path = ""  # from scratch: shape from model.preset, vocab from the tokenizer
  if arg == "research":
    config.optimizer.final_lr_ratio = 0.1
    # Every checkpoint kept (20 of ~13 MB): the sparse-reward regime of the research study starts
    # from an early one (launch/backbone.py --stages=early).
    config.train.keep_checkpoints = 100
  return config
