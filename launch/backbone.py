r"""The research backbone: SynthWorld v2, the mixed SFT corpus, the tokenizer, the
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
4. early: the SFT checkpoint at --early_step exported as {root}/backbone/sft/early_export (the
   sparse-reward regime's start: a weaker policy, many all-zero groups).
5. ship: both exports copied into the repository ({repo}/backbones/research_v2/final and
   early) with manifest.json: the world's and corpus' settings, the SFT config, the gate, the
   sha256 of every shipped file and of the world's files (the studies check them).
6. properties (not in the default stages): v2's properties on the backbone's sampled rollouts
   before any RL (agentjax/studies/world_properties.py: search rounds per correct trajectory,
   the oracle judge's contribution share and Gini, IG vs "retrieved a new gold document" for
   both IG readings, the ground truth's entropy reduction) -> {root}/backbone/properties.json.

    python launch/backbone.py --stages=properties

The backbone every research study starts from is the shipped one (backbones/research_v2);
rebuilding it (about an hour on a 2-core CPU) and shipping it again:

    python launch/backbone.py --stages=build,sft,early,gate,ship
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import time

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_ROOT = flags.DEFINE_string("root", "runs/research", "Folder of the world, corpus and backbone.")
_SFT = common.define_config("SFT config.", name="sft_config", default="configs/sft.py:research")
STAGES = ("build", "sft", "early", "gate", "ship", "properties")
_STAGES = flags.DEFINE_list("stages", ["build", "sft", "early", "gate"],
                            f"Stages to run, in order: {', '.join(STAGES)}.")
_SCHEDULES = flags.DEFINE_list(
    "sft_schedules", ["2000", "4000"], "The SFT's learning-rate schedules, in steps, run one "
    "after the other in one workdir: each resumes where the one before stopped, with the lr of "
    "its own length (warm-up 5%, decay to 0.1x). The backbone: 2000 steps, then on to 4000 (at "
    "2000 its 1-hop dev F1 was 0.36, far from the gate; that model is the early start). Each "
    "schedule's export but the last is kept as hf_export_<steps>.")
_EARLY = flags.DEFINE_integer("early_step", 2000, "The SFT checkpoint exported as the "
                              "sparse-reward start (stage early).")
_DEST = flags.DEFINE_string("dest", "", "Where stage ship writes (default: "
                            "backbones/research_v2 in this repository).")
_VOCAB = flags.DEFINE_integer("vocab_size", 2048, "BPE vocabulary.")
_N = flags.DEFINE_integer("gate_n", 500, "Dev questions of the gate.")
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
  unknown = [s for s in _STAGES.value if s not in STAGES]
  if unknown:  # before any stage runs
    close = difflib.get_close_matches(unknown[0], STAGES, n=1)
    raise common.UserError(f"--stages={','.join(_STAGES.value)}: no stage {unknown[0]!r}; " + (
        f"did you mean {close[0]}?" if close else f"the stages: {', '.join(STAGES)}"))
  if not common.VERBOSE.value:  # the stages' own lines, not agentjax's INFO logs
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
      import shutil
      *earlier, last = [int(n) for n in _SCHEDULES.value]
      for n in earlier:
        kept = os.path.join(sft_dir, f"hf_export_{n}")
        if os.path.exists(os.path.join(kept, "config.json")):
          continue  # that schedule is done; its export was moved aside
        if os.path.exists(export):
          raise SystemExit(f"{export} exists but {kept} does not: an SFT run of other schedules "
                           "(move it aside to train these)")
        config.sft.steps = n
        out = train(config, sft_dir)
        if out.get("hf_export") is None or out.get("step") != n:
          raise SystemExit(f"[sft] the {n}-step schedule stopped at step {out.get('step')} "
                           "(preempted?): run the same command to resume it")
        shutil.move(export, kept)  # the next schedule resumes from the checkpoints
        print(f"[sft] schedule of {n} steps done: {kept}", flush=True)
      config.sft.steps = last
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
    elif stage == "early":
      out = backbone.export_step(config, sft_dir, _EARLY.value,
                                 os.path.join(sft_dir, "early_export"))
      print(f"[early] SFT step {_EARLY.value} exported: {out} ({time.time() - t0:.0f} s)",
            flush=True)
    elif stage == "ship":
      repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
      dest = _DEST.value or os.path.join(repo, backbone.SHIPPED)
      with open(os.path.join(root, "backbone", "gate.json")) as f:
        gate = json.load(f)
      with open(os.path.join(root, "synthworld", "demo_settings.json")) as f:
        world = json.load(f)
      with open(config.sft.demos + ".settings.json") as f:
        corpus = json.load(f)
      record = {"world_settings": world, "corpus_settings": corpus, "gate": gate,
                "starts": {"final": {"sft_step": config.sft.steps},
                           "early": {"sft_step": _EARLY.value}},
                "rebuild": "python launch/backbone.py --stages=build,sft,early,gate,ship "
                           f"--early_step={_EARLY.value}"}
      manifest = backbone.ship({"final": export, "early": os.path.join(sft_dir, "early_export")},
                               dest, world_dir=os.path.join(root, "synthworld"),
                               sft_dir=sft_dir, record=record)
      print(f"[ship] {dest}: {len(manifest['files'])} files "
            f"({sum(os.path.getsize(os.path.join(dest, n)) for n in manifest['files']) / 2**20:.1f}"
            f" MiB) ({time.time() - t0:.0f} s)", flush=True)
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


if __name__ == "__main__":
  common.run(main)
