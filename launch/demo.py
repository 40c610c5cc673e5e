r"""The main job on the embedded default (`make demo`): SynthWorld -> SFT -> IGPO -> dev eval.

    python launch/demo.py                       # what `make demo` runs
    python launch/demo.py --root=/tmp/demo --rl_config=configs/grpo.py:demo

1. Generates a SynthWorld (invented entities, so the answers must be searched for) and writes its
   corpus, splits and demonstrations under {root}/synthworld; trains a byte-level BPE on it. The
   demonstrations come from a hasty teacher: --stop_early_rate of the 2-hop ones answer the
   bridge entity after one search, a shortcut the SFT policy inherits and RL has to unlearn.
2. SFT warm start of the tiny model from scratch on the demonstrations (configs/sft.py:demo).
3. RL from the SFT export with the local BM25 retriever (configs/igpo.py:demo), evaluating the
   dev split greedily before (= after SFT) and after RL.
4. Prints dev F1 after SFT and after RL with the paired standard error of the gain, F1 and early
   answers per hop count, writes the learning curves as PNG files ({root}/sft/plots/,
   {root}/igpo/plots/: agentjax/plots.py), prints where they, the TensorBoard logs, checkpoints
   and exports are, and (last line) one JSON object.

Each stage shows its progress on stderr: a bar on a terminal, a line every ~30 s otherwise
(AGENTJAX_PROGRESS=off turns them off; agentjax/bars.py).

The world and tokenizer are reused when {root}/synthworld already holds the same settings; the SFT
and RL workdirs start fresh unless --resume (then the runs continue from their checkpoints).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

from absl import flags  # noqa: E402

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

from agentjax.data.demo_world import (WORLDS, build_demo_world, hop_table,  # noqa: E402
                                      paired_gain, use_demo_world)

_ROOT = flags.DEFINE_string("root", "runs/demo", "Folder for the world, tokenizer and workdirs.")
_SFT = common.define_config("SFT config.", name="sft_config", default="configs/sft.py:demo")
_RL = common.define_config("RL config.", name="rl_config", default="configs/igpo.py:demo")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the SFT/RL workdirs instead of starting "
                            "them fresh.")
_VOCAB = flags.DEFINE_integer("vocab_size", 1024, "BPE vocabulary of the demo tokenizer.")
_WORLD = flags.DEFINE_enum("world", "demo", sorted(WORLDS), "SynthWorld preset "
                           "(agentjax/data/demo_world.py WORLDS): the demo's 1- and 2-hop world, "
                           "or v2 (1-4 hops, distractors, confusable names; give the RL config "
                           "enough turns, e.g. --rl_config.rollout.max_turns=6).")
_STOP_EARLY = flags.DEFINE_float(
    "stop_early_rate", 0.5, "Share of 2-hop demonstrations whose teacher answers the bridge "
    "entity after one search (SynthWorld.demonstrations): the SFT policy inherits the shortcut "
    "and RL has to learn that the second search pays.")


def _say(msg: str) -> None:
  print(msg, flush=True)


def build_world(folder: str, topk: int) -> None:
  """SynthWorld files + tokenizer in `folder`, unless they are there with the same settings."""
  # A few seconds: a line before it starts, the result after (no bar).
  _say(f"[1/4] SynthWorld ({_WORLD.value}), its BM25 index and BPE tokenizer in {folder}")
  _say("      " + build_demo_world(folder, topk=topk, vocab_size=_VOCAB.value,
                                   stop_early_rate=_STOP_EARLY.value, world=_WORLD.value))


def learning_curves(workdirs: list[str]) -> list[str]:
  """The runs' PNG learning curves ({workdir}/plots/, agentjax/plots.py), or a line saying why
  there are none."""
  from agentjax.plots import plot_run
  paths = []
  for workdir in workdirs:
    try:
      paths += plot_run(workdir)
    except (ImportError, FileNotFoundError, ValueError) as e:  # the demo's result stands
      _say(f"Plots: none for {workdir}: {e}")
  return paths



def main(_):
  logging.getLogger().setLevel(logging.WARNING)
  start = time.time()
  root = _ROOT.value
  sft_config, rl_config = _SFT.value, _RL.value
  world_dir = os.path.join(root, "synthworld")
  sft_dir = os.path.join(root, "sft")
  rl_dir = os.path.join(root, rl_config.algorithm.replace("+", "p"))
  for config in (sft_config, rl_config):  # everything under --root
    use_demo_world(config, root)
  rl_config.model.hf_path = os.path.join(sft_dir, "hf_export")
  rl_config.model.tokenizer_path = ""
  rl_config.train.eval_at_start = True  # the dev F1 after SFT, on the same questions

  from agentjax.train import config as config_lib
  from agentjax.train.trainer import train
  config_lib.validate(sft_config)
  config_lib.validate(rl_config)
  if not _RESUME.value:
    for d in (sft_dir, rl_dir):
      shutil.rmtree(d, ignore_errors=True)

  build_world(world_dir, rl_config.retrieval.topk)
  t0 = time.time()
  _say(f"[2/4] SFT warm start: {sft_config.model.preset} model from scratch, "
       f"{sft_config.sft.steps} steps x {sft_config.sft.batch_size} demonstrations")
  sft = train(sft_config, sft_dir)
  _say(f"      done in {time.time() - t0:.0f} s" + (
      f": loss {sft['final_loss']:.3f}, token accuracy {sft['final_accuracy']:.3f}"
      if "final_loss" in sft else " (reused)"))

  t0 = time.time()
  _say(f"[3/4] {rl_config.algorithm.upper()}: {rl_config.train.steps} steps x "
       f"{rl_config.rl.prompts_per_step} questions x {rl_config.rollout.group_size} rollouts, "
       f"local BM25; dev eval before and after")
  rl = train(rl_config, rl_dir)
  _say(f"      done in {time.time() - t0:.0f} s")

  with open(os.path.join(rl_dir, "eval", "0.json")) as f:
    before = json.load(f)
  with open(os.path.join(rl_dir, "eval", f"{rl_config.train.steps}.json")) as f:
    after = json.load(f)
  gain, stderr = paired_gain({r["id"]: r["f1"] for r in before["per_question"]},
                             {r["id"]: r["f1"] for r in after["per_question"]})
  minutes = (time.time() - start) / 60
  _say(f"[4/4] dev F1 ({before['n']} questions, greedy): after SFT {before['f1']:.4f}, "
       f"after {rl_config.algorithm.upper()} {after['f1']:.4f}; gain {gain:+.4f} "
       f"(paired stderr {stderr:.4f}, {gain / stderr if stderr else float('inf'):.1f} stderr)")
  _say(f"      EM {before['em']:.4f} -> {after['em']:.4f}; format ok {before['format_ok']:.3f} -> "
       f"{after['format_ok']:.3f}")
  for row in hop_table(os.path.join(world_dir, "dev.jsonl"), before["per_question"],
                     after["per_question"]):
    _say("      " + row)
  plots = learning_curves([rl_dir, sft_dir])
  folders: dict[str, list[str]] = {}
  for path in plots:
    folders.setdefault(os.path.dirname(path), []).append(os.path.basename(path))
  for i, (folder, names) in enumerate(folders.items()):
    _say(("Plots: " if i == 0 else "       ") + f"{folder}/ {' '.join(names)}")
  if plots:
    _say(f"       (python launch/plot.py --workdir={rl_dir} redraws them, also during a run)")
  _say(f"TensorBoard: logs in {rl_dir}/tensorboard and {sft_dir}/tensorboard "
       f"(pip install tensorboard; tensorboard --logdir {root})")
  _say(f"Checkpoints: {rl_dir}/checkpoints   Hugging Face exports: {sft['hf_export']}, "
       f"{rl['hf_export']}")
  _say(json.dumps({"demo": rl_config.algorithm, "sft_dev_f1": round(before["f1"], 4),
                   "rl_dev_f1": round(after["f1"], 4), "dev_n": before["n"],
                   "gain_stderr": round(stderr, 4), "minutes": round(minutes, 2)}))


if __name__ == "__main__":
  common.run(main)
