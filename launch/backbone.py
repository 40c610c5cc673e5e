r"""The research backbone (issue 32 §2): SynthWorld v2, the mixed SFT corpus, the tokenizer, the
from-scratch SFT, and the gate before any RL. Every study of the research preset starts from its
export ({root}/backbone/sft/hf_export); it is built once, never per study.

    python launch/backbone.py                            # every stage, under runs/research
    python launch/backbone.py --stages=gate              # the gate again, of the finished export
    python launch/backbone.py --sft_config.sft.steps=6000

1. build: SynthWorld v2 ({root}/synthworld), the corpus ({root}/backbone/demos.jsonl: search
   transcripts, evidence sets answered or abstained on, rubric-guided transcripts;
   agentjax/studies/backbone.py) and a BPE on both ({root}/backbone/tokenizer); reused when
   their settings match.
2. sft: configs/sft.py:research into {root}/backbone/sft (checkpoints; the same command resumes;
   a finished run is not trained again).
3. gate: greedy on dev: the search agent's F1 per hop count (goal 1-hop >= 0.8), the reading of
   evidence sets (accuracy when sufficient, abstention when not) and the rubric-following rate;
   written to {root}/backbone/gate.json, the last line printed is the same JSON.
4. properties (not in the default stages): v2's properties on the backbone's sampled rollouts
   before any RL (agentjax/studies/world_properties.py: search rounds per correct trajectory,
   the oracle judge's contribution share and Gini, IG vs "retrieved a new gold document" for
   both IG readings, the ground truth's entropy reduction) -> {root}/backbone/properties.json.

    python launch/backbone.py --stages=properties
"""

from __future__ import annotations

import json
import logging
import os
import time

from absl import app, flags
from ml_collections import config_flags

_ROOT = flags.DEFINE_string("root", "runs/research", "Folder of the world, corpus and backbone.")
_SFT = config_flags.DEFINE_config_file("sft_config", "configs/sft.py:research", "SFT config.")
_STAGES = flags.DEFINE_list("stages", ["build", "sft", "gate"], "Stages to run, in order.")
_VOCAB = flags.DEFINE_integer("vocab_size", 2048, "BPE vocabulary.")
_N = flags.DEFINE_integer("gate_n", 1000, "Dev questions of the gate.")
_PROPS_N = flags.DEFINE_integer("properties_n", 200, "Dev questions whose sampled rollouts "
                                "(x the group size) measure the world's properties.")
_PROPS_CHUNK = flags.DEFINE_integer("properties_chunk", 25, "Questions rolled out at a time "
                                    "for the properties (the rollout's memory grows with it).")


def _paths(config, root: str) -> None:
  """Points the config's world, corpus, tokenizer and index paths under `root`."""
  from configs.base import RESEARCH_ROOT
  for section, field in (("data", "manual_dir"), ("data", "data_dir"),
                         ("retrieval", "corpus_path"), ("retrieval", "index_dir"),
                         ("model", "tokenizer_path"), ("sft", "demos"), ("sft", "corpus_path")):
    value = config[section][field]
    if value.startswith(RESEARCH_ROOT):
      config[section][field] = root + value[len(RESEARCH_ROOT):]


def main(_):
  logging.getLogger().setLevel(logging.WARNING)
  from agentjax.studies import backbone
  from agentjax.train import config as config_lib
  from agentjax.train.trainer import train
  root = _ROOT.value
  config = _SFT.value
  _paths(config, root)
  config_lib.validate(config)
  sft_dir = os.path.join(root, "backbone", "sft")
  export = os.path.join(sft_dir, "hf_export")
  for stage in _STAGES.value:
    t0 = time.time()
    if stage == "build":
      built = backbone.build(config, vocab_size=_VOCAB.value)
      print(f"[build] {'reused' if built['reused'] else 'built'}: world {built['world']}, "
            f"corpus {built['corpus']} {built['counts']}, tokenizer {built['tokenizer']} "
            f"({time.time() - t0:.0f} s)", flush=True)
    elif stage == "sft":
      out = train(config, sft_dir)
      print(f"[sft] {out.get('step', config.sft.steps)} steps, export {out['hf_export']} "
            f"({time.time() - t0:.0f} s)" + (f": loss {out['final_loss']:.3f}, token accuracy "
                                              f"{out['final_accuracy']:.3f}"
                                              if "final_loss" in out else ""), flush=True)
    elif stage == "gate":
      result = backbone.gate(config, export, n=_N.value)
      result["seconds"] = round(time.time() - t0, 1)
      with open(os.path.join(root, "backbone", "gate.json"), "w") as f:
        json.dump(result, f, indent=2)
      print(json.dumps(result), flush=True)
    elif stage == "properties":
      from agentjax.studies import world_properties
      from configs import cw_grpo
      rl = cw_grpo.get_config("research")  # the oracle judge as CW-GRPO's runs use it
      _paths(rl, root)
      result = world_properties.measure(rl, export, questions=_PROPS_N.value,
                                        chunk_questions=_PROPS_CHUNK.value)
      result["seconds"] = round(time.time() - t0, 1)
      with open(os.path.join(root, "backbone", "properties.json"), "w") as f:
        json.dump(result, f, indent=2)
      print(json.dumps(result), flush=True)
    else:
      raise app.UsageError(f"unknown stage {stage!r}: build, sft, gate or properties")


if __name__ == "__main__":
  app.run(main)
