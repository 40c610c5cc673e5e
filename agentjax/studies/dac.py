r"""DAC's study (`python launch/compare.py --study=dac`: runs/dac ->
docs/results/dac).

The monolithic policy by GRPO with full fine-tuning and with one LoRA adapter, against DAC
(configs/dac.py:demo, two LoRA roles) and its ablations (DAC_METHODS), on the base size from the
CW-GRPO study's SFT start. Besides the RL runs, the sweep trains the generator's warm start
(run_generator_sft, {root}/{size}/generator_sft) and evaluates the DAC agent before RL
({root}/{size}/dac_start); each DAC run adds the augmentation check (augmented_dev_rows,
augmentation_summary). Its report (--out): results.md (the method table, training figures, the
paired comparison with full fine-tuning, the alpha ablation, the augmentation check),
results.json, f1_vs_step.png, sufficiency_vs_step.png, abstain_vs_step.png.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

from agentjax.studies.lora import LORA_METHODS
from agentjax.studies.reporting import (WINDOW, cell, mean_std, moving, paired_by_seed,
                                        paired_by_step, paired_pooled, pm, step_mean,
                                        step_seconds, vs_reference)
from agentjax.studies.runs import (GENERATOR_SFT, SPLITS, point_at_world, read_json, result_path,
                                   split_result, write_json)


# DAC's study: the monolithic policy by GRPO with full fine-tuning and with
# one LoRA adapter (the LoRA study's rank, alpha and rate: separates "decomposition" from "LoRA"),
# against DAC (configs/dac.py:demo, two LoRA roles) and its ablations: the searcher rewarded by S
# alone (no abstention term), no hard-positive augmentation, alpha 0.1 / 0.5 (dac is 0.3).
# The study ran with the generator grouped per evidence set, then the default (configs/base.py
# dac.generator_group): its dac_* arms name it, so they still run what was measured.
_EVIDENCE = {"dac.generator_group": "evidence"}
DAC_METHODS = {
    "grpo_full": ("grpo", {}),
    "grpo_lora": ("grpo", LORA_METHODS["lora_r32"][1]),
    "dac": ("dac", dict(_EVIDENCE)),
    "dac_sufficient_only": ("dac", {**_EVIDENCE, "dac.searcher_reward": "sufficient_only"}),
    "dac_no_aug": ("dac", {**_EVIDENCE, "dac.augment_rate": 0.0}),
    "dac_alpha0.1": ("dac", {**_EVIDENCE, "dac.alpha": 0.1}),
    "dac_alpha0.5": ("dac", {**_EVIDENCE, "dac.alpha": 0.5}),
    # alpha where it can act: the generator's advantages grouped by question (with groups per
    # evidence set, GRPO's z-score cancels alpha exactly; docs/results/dac/README.md).
    "dacq_alpha0.1": ("dac", {"dac.alpha": 0.1, "dac.generator_group": "question"}),
    "dacq_alpha0.3": ("dac", {"dac.generator_group": "question"}),
    "dacq_alpha0.5": ("dac", {"dac.alpha": 0.5, "dac.generator_group": "question"}),
}


def generator_init(root: str, size: str) -> str:
  """The PEFT folder of the generator's warm start of `size` (DAC runs' model.lora.init)."""
  return os.path.join(root, size, GENERATOR_SFT, "adapters", "generator")


def generator_config(root: str, size: str, steps: int = 0):
  """configs/dac.py:generator_sft on the world under `root`, from the size's SFT export: LoRA SFT
  of the "generator" adapter on generator demonstrations written under {root}/{size}/
  generator_sft/ (agentjax/dac/warmstart.py). steps: 0 keeps the preset's sft.steps."""
  from configs import dac
  config = dac.get_config(GENERATOR_SFT)
  corpus = config.sft.corpus_path  # the preset's ("": demonstrations only); use_demo_world sets it
  point_at_world(config, root, size)
  config.sft.corpus_path = corpus
  config.sft.demos = os.path.join(root, size, GENERATOR_SFT, "generator_demos.jsonl")
  config.model.hf_path = os.path.join(root, size, "sft", "hf_export")
  config.model.tokenizer_path = ""
  if steps:
    config.sft.steps = steps
  return config


def run_generator_sft(root: str, size: str, steps: int = 0) -> None:
  """DAC's generator warm start of `size` (configs/dac.py:generator_sft, generator_config): its
  demonstrations written from the world's searcher demonstrations, then LoRA SFT of the
  "generator" adapter; every DAC method and seed starts its generator adapter from the PEFT
  export. Writes {root}/{size}/generator_sft/result.json (the demos' counts, the last SFT step's
  loss and token accuracy, minutes)."""
  from agentjax.dac.warmstart import write_generator_demos
  from agentjax.jsonl import iter_json_objects
  from agentjax.train.trainer import train
  config = generator_config(root, size, steps)
  workdir = os.path.join(root, size, GENERATOR_SFT)
  t0 = time.time()
  if not os.path.exists(config.sft.demos):
    write_generator_demos(config)
  demos = [row for _, row in iter_json_objects(config.sft.demos, ValueError, what="demos")]
  train(config, workdir)
  if not os.path.isdir(generator_init(root, size)):
    raise RuntimeError(f"{workdir}: the warm start left no PEFT folder {generator_init(root, size)}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    last = [m for m in map(json.loads, f) if "loss" in m][-1]
  write_json(result_path(root, f"{size}/{GENERATOR_SFT}/0"), {
      "demos": len(demos), "sufficient": sum(bool(r["sufficient"]) for r in demos),
      "steps": config.sft.steps, "batch_size": config.sft.batch_size, "lr": config.sft.lr,
      "last_loss": last["loss"], "last_accuracy": last["accuracy"],
      "minutes": (time.time() - t0) / 60})


def check_generator_start(config, root: str, size: str) -> None:
  """A DAC run's generator must start from a warm start that learned the run's abstention
  answer and labels: configs/dac.py may change between the warm start and a run."""
  recorded = read_json(os.path.join(root, size, GENERATOR_SFT, "config.json"))
  if recorded is None:
    raise FileNotFoundError(f"{root}/{size}/{GENERATOR_SFT}: no generator warm start")
  for key in ("abstain_text", "sufficiency_match"):
    if recorded["dac"][key] != config.dac[key]:
      raise ValueError(
          f"dac.{key}: the run has {config.dac[key]!r} but the generator warm start in "
          f"{root}/{size}/{GENERATOR_SFT} was trained with {recorded['dac'][key]!r}; delete that "
          "folder to train it again")


def dac_split(config, root: str, split: str) -> dict:
  """Greedy eval of the DAC agent before RL on `split`: the searcher adapter at its init (B = 0:
  the backbone) and the generator adapter from the warm start (the params RL starts from)."""
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  from agentjax.train.evaluation import eval_questions, evaluate
  from agentjax.train.trainer import TrainTarget, load_model, make_agents, make_search_backend
  c = config.copy_and_resolve_references()
  c.data.eval_split = split
  mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  cfg, params, tokenizer = load_model(c, mesh)
  target = TrainTarget.build(c, cfg, params, mesh)
  _, agent = make_agents(c, cfg, tokenizer, make_search_backend(c), mesh, target.spec,
                         eval_only=True)
  name = config_lib.benchmark_list(c.data.eval, "data.eval")[0]
  _, records = eval_questions(c)[name]
  with use_mesh(mesh):
    rows = evaluate(agent, target.rollout_params(target.trainable), records,
                    c.train.eval_batch)["per_question"]
  return split_result(root, split, rows)


def augmented_dev_rows(config, workdir: str) -> list[dict]:
  """The augmentation check's rollouts (ours: a test of DAC's claim, arXiv:2606.10684, abstract,
  that hard-positive augmentation makes the generator robust): the run's final searcher and
  generator, greedy, one answer per evidence set, on the dev questions the trainer's final eval
  used, with dac.augment_rate = 1: every sufficient evidence set gets augment_k hard
  distractors (answer-free retriever hits for the searcher's own queries) shuffled in, as in
  training. Batches as the trainer's eval (train.eval_batch, the last padded), so the searcher's
  greedy trajectories are the eval's; the augmentation rng of batch b is
  default_rng([config.seed, b]). Returns per question {"id", "answer", "sufficient",
  "augmented", "distractors", "abstained", "correct"}."""
  import jax
  import numpy as np
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  from agentjax.train.evaluation import eval_questions
  from agentjax.train.trainer import make_agents, make_search_backend, restore_trainable
  c = config.copy_and_resolve_references()
  c.dac.augment_rate = 1.0
  mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  cfg, target, trainable, tokenizer, _ = restore_trainable(c, workdir, mesh,
                                                           purpose="check augmentation")
  _, agent = make_agents(c, cfg, tokenizer, make_search_backend(c), mesh, target.spec,
                         eval_only=True)
  name = config_lib.benchmark_list(c.data.eval, "data.eval")[0]
  _, records = eval_questions(c)[name]
  params, size, rows = target.rollout_params(trainable), c.train.eval_batch, []
  with use_mesh(mesh):
    for b, start in enumerate(range(0, len(records), size)):
      chunk = list(records[start:start + size])
      real = len(chunk)
      chunk += [chunk[-1]] * (size - real)  # the eval's padding: one compiled shape
      out, _ = agent.run(params, [r["question"] for r in chunk], jax.random.key(0),
                         golds=[r["golden_answers"] for r in chunk],
                         aug_rng=np.random.default_rng([int(c.seed), b]))
      for i, rec in enumerate(chunk[:real]):
        rows.append({"id": rec["id"], "answer": out.answers[i] if out.answered[i] else None,
                     "sufficient": bool(out.sufficient[i]), "augmented": bool(out.augmented[i]),
                     "distractors": int(out.distractors[i]), "abstained": bool(out.abstained[i]),
                     "correct": bool(out.correct[i])})
  return rows


def augmentation_summary(augmented_rows: list[dict], clean_rows: list[dict]) -> dict:
  """The augmentation check from the augmented pass's rows (augmented_dev_rows) and the clean
  eval's rows of the same questions (the trainer's final dev eval: "id", "answer", "em",
  "abstained", "sufficient"): on the questions whose evidence was sufficient in both passes and
  got distractors in the augmented one, the generator's accuracy (EM > 0; an abstention is
  wrong) and abstention rate with distractors vs clean (paired: same questions, same searcher
  trajectories). consistency: the share of the other questions (nothing added) whose answer is
  the clean eval's, a check that both passes saw the same searcher trajectories (1.0 expected)."""
  clean = {r["id"]: r for r in clean_rows}
  both = [r for r in augmented_rows if r["augmented"] and r["sufficient"]
          and clean[r["id"]]["sufficient"]]
  rest = [r for r in augmented_rows if not r["augmented"]]
  share = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
  acc_aug = share([r["correct"] for r in both])
  acc_clean = share([clean[r["id"]]["em"] > 0 for r in both])
  return {
      "n_augmented_sufficient": len(both),
      "n_sufficient": sum(r["sufficient"] for r in augmented_rows),
      "distractors_per_set": share([r["distractors"] for r in both]),
      "accuracy_augmented": acc_aug, "accuracy_clean": acc_clean,
      "accuracy_drop": None if acc_aug is None else acc_clean - acc_aug,
      "abstain_rate_augmented": share([r["abstained"] for r in both]),
      "abstain_rate_clean": share([clean[r["id"]]["abstained"] for r in both]),
      "consistency": share([r["answer"] == clean[r["id"]]["answer"] for r in rest])}


# The monolithic baseline every method is paired with; the alpha ablation's methods by alpha.
DAC_REFERENCE = "grpo_full"
DAC_ALPHAS = (("dac_alpha0.1", 0.1), ("dac", 0.3), ("dac_alpha0.5", 0.5))
# Per split of result.json: (column, key); precision and recall only exist for an agent that
# abstains (DAC), and "—" is shown for the others.
DAC_SPLIT_KEYS = ("f1", "em", "coverage", "accuracy_answered", "abstain_rate",
                  "abstain_precision", "abstain_recall", "abstain_sufficient")
# Training metrics (metrics.jsonl) averaged over a run's last WINDOW steps.
DAC_TRAIN_KEYS = (("train_f1", "f1"), ("sufficiency_rate", "sufficiency_rate"),
                  ("train_abstain_rate", "dac/abstain_rate"),
                  ("train_abstain_precision", "dac/abstain_precision"),
                  ("train_abstain_recall", "dac/abstain_recall"),
                  ("searcher_reward", "dac/searcher_reward"),
                  ("generator_reward", "dac/generator_reward"))
AUG_KEYS = ("accuracy_clean", "accuracy_augmented", "accuracy_drop", "abstain_rate_clean",
            "abstain_rate_augmented", "n_augmented_sufficient", "consistency")


# The alpha sweep around the DAC agent's threshold before RL: alpha* / 3, alpha*,
# 3 alpha* (DAC_RESEARCH_METHODS' dac_astar arms).
ALPHA_FACTORS = (1 / 3, 1.0, 3.0)


def threshold_prediction(start_split: dict, penalty: float = 0.0) -> dict | None:
  """The abstention predicted from the DAC agent before RL (its eval on a split: the
  generator's warm start on the searcher's evidence): P(S = 0), c_G (accuracy when it answers on
  S = 1), c0 (on S = 0) and alpha* (dac.rewards.abstention_threshold): above alpha* a generator
  that cannot tell S apart earns more by abstaining everywhere, below it by answering. None for
  an eval without those figures (recorded before they existed)."""
  from agentjax.dac.rewards import abstention_threshold
  keys = ("insufficient_share", "accuracy_sufficient", "accuracy_insufficient")
  if any(start_split.get(k) is None for k in keys):
    return None
  p0, c1, c0 = (float(start_split[k]) for k in keys)
  return {"p_insufficient": p0, "c_G": c1, "c0": c0,
          "alpha_star": abstention_threshold(p0, c1, c0, penalty),
          "alpha_star_paper": abstention_threshold(p0, c1)}


@dataclasses.dataclass(frozen=True)
class AlphaStar:
  """A study override's value that is only known once the DAC agent before RL is evaluated:
  alpha* (threshold_prediction on its dev eval, {root}/{size}/dac_start/0) times `factor`.
  sweep.rl_config resolves it (resolve_alpha_star) when a run starts."""
  factor: float


def resolve_alpha_star(value: AlphaStar, start: dict | None, where: str) -> float:
  """value.factor x alpha* of the DAC agent's eval before RL (`start`: its result.json, read
  from `where`); a clear error when that eval is missing or predicts no threshold."""
  if start is None:
    raise FileNotFoundError(f"{where}: no eval of the DAC agent before RL, so alpha* is unknown; "
                            "run the study's dac_start stage first")
  threshold = threshold_prediction(start["dev"])
  if threshold is None:
    raise ValueError(f"{where}: the eval before RL has no P(S = 0), c_G and c0 (recorded before "
                     "they existed): delete it to evaluate again")
  star = threshold["alpha_star"]
  if not 0 < star < float("inf"):
    raise ValueError(f"{where}: alpha* = {star} is not a positive number to sweep around")
  return round(star * value.factor, 6)


# DAC on SynthWorld v2 from the research backbone (configs/dac.py:research):
# the backbone learned the generator's reading (its corpus' evidence rows), so both roles start
# from it, with no generator warm start. GRPO is the research study's own arm (its records,
# sweep.Study.borrow); the alpha arms sit at alpha* / 3, alpha* and 3 alpha*, alpha* measured on
# the DAC agent before RL (the searcher's own evidence) and recorded with each run.
# dac_paper: DAC at the paper's settings as far as the paper gives them (DAC, arXiv:2606.10684,
# appendix: EM-based verification; training details):
# sufficiency as "any retrieved document contains the gold answer as an exact string match"
# (substring after normalization), and the Qwen3-8B row's role rates, the generator's 5 times
# the searcher's (2e-6 / 1e-5), here on our LoRA rate (searcher 3e-4, generator 1.5e-3); its
# AdamW (0.9, 0.999), weight decay 0.01 (the research preset's: 0.99, none). What it does not
# give is ours: alpha (alpha*, where its own trade-off balances), the reward tables, the rollout
# settings, 30 steps not 500.
DAC_RESEARCH_REFERENCE = "grpo"
DAC_PAPER = {"dac.alpha": AlphaStar(1.0), "dac.sufficiency_match": "substring",
             "model.lora.lr": "searcher=3e-4,generator=1.5e-3", "optimizer.b2": 0.999,
             "optimizer.weight_decay": 0.01}
DAC_RESEARCH_METHODS = {
    "grpo": ("grpo", {}),
    "grpo_lora": ("grpo", dict(LORA_METHODS["lora_r32"][1])),
    **{f"dac_astar{f:.2g}": ("dac", {"dac.alpha": AlphaStar(f)}) for f in ALPHA_FACTORS},
    "dac_paper": ("dac", DAC_PAPER),
}
# The DAC paper's claim (abstract; the seed gives no numbers): role-decomposed LoRA training
# beats full fine-tuning of one monolithic agent.
DAC_CLAIM = ("DAC (two LoRA roles) beats full fine-tuning of one monolithic agent (the abstract; "
             "no numbers in the seed)")


def _ms(xs: list) -> tuple[float, float] | None:
  """Mean ± sample std of the values that exist (None when none does)."""
  xs = [x for x in xs if x is not None]
  return mean_std(xs) if xs else None


def insufficient_share(split: dict) -> float | None:
  """P(S = 0) of a split's evidence sets from its abstention figures: P(abstained and S = 0) /
  P(abstained | S = 0) = rate * precision / recall (None without abstentions): the precision a
  generator abstaining at random would have."""
  rate, recall = split.get("abstain_rate"), split.get("abstain_recall")
  if not rate or not recall or split.get("abstain_precision") is None:
    return None
  return rate * split["abstain_precision"] / recall


def _last_mean(curve: list[dict], key: str, w: int = WINDOW) -> float | None:
  """Mean of `key` over the last w steps that log it (None: never logged)."""
  xs = [m[key] for m in curve if key in m][-w:]
  return sum(xs) / len(xs) if xs else None


def _dac_train_accuracy(curve: list[dict]) -> dict[str, float | None]:
  """The generator's training accuracy on sufficient evidence sets without / with distractors,
  over every step, each step weighted by its share of such sets (dac/accuracy_* is a per-step
  share, logged 0 when the step has no such set): clean sets ~ dac/sufficiency_rate -
  dac/augmented_rate (augmented sets are sufficient), augmented ~ dac/augmented_rate."""
  clean = lambda m: max(m["dac/sufficiency_rate"] - m["dac/augmented_rate"], 0.0)  # noqa: E731
  if not all("dac/augmented_rate" in m for m in curve):
    return {"accuracy_clean": None, "accuracy_augmented": None}
  return {"accuracy_clean": step_mean(curve, "dac/accuracy_clean", clean),
          "accuracy_augmented": step_mean(curve, "dac/accuracy_augmented",
                                           lambda m: m["dac/augmented_rate"])}


def summarize_dac(study: dict, dac_start: dict | None = None,
                  reference: str = DAC_REFERENCE, alphas=DAC_ALPHAS,
                  generator_start: str = "the warm start") -> dict:
  """Per size and method of DAC's study: mean ± sample std over seeds of dev and test F1 / EM
  (an abstention is wrong), coverage, accuracy when answered, abstention rate, precision and
  recall against S = 0; training figures over the last WINDOW steps (F1, the sufficiency rate of
  the searcher's retrieved documents, abstention); the sufficiency rate's rise (last WINDOW steps
  minus first WINDOW); the generator's training accuracy on clean / augmented sufficient sets;
  the augmentation check of each DAC run (augmentation_summary); each method against `reference`
  seed by seed (paired per-question test F1 difference ± its standard error, training F1
  paired by step); and the alpha ablation (`alphas`: (method, alpha) pairs). dac_start: the DAC
  agent's eval before RL ({"dev", "test"}), reported as is; generator_start: what its generator
  started from, for the report's text."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    ref = {r["seed"]: r for r in runs.get(reference, [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "acc") if k in start[split]}
                   for split in SPLITS}, "methods": {}, "alpha": []}
    if dac_start:
      t["dac_start"] = {split: {**{k: dac_start[split].get(k) for k in DAC_SPLIT_KEYS},
                                "insufficient": insufficient_share(dac_start[split])}
                        for split in SPLITS}
      t["threshold"] = threshold_prediction(dac_start["dev"])
    for method, rs in runs.items():
      row = {"seeds": len(rs), "overrides": rs[0].get("overrides")}
      for split in SPLITS:
        for k in DAC_SPLIT_KEYS:
          row[f"{split}_{k}"] = _ms([r[split].get(k) for r in rs])
        row[f"{split}_insufficient"] = _ms([insufficient_share(r[split]) for r in rs])
        # (the start's questions that the run was evaluated on: all of them but in smoke tests)
        row[f"{split}_gain"] = _ms([paired_gain(
            {q: f for q, f in start[split]["f1_by_id"].items() if q in r[split]["f1_by_id"]},
            r[split]["f1_by_id"])[0] for r in rs])
      for column, key in DAC_TRAIN_KEYS:
        row[column] = _ms([_last_mean(r["curve"], key) for r in rs])
      rise = [_last_mean(r["curve"], "sufficiency_rate")
              - sum(m["sufficiency_rate"] for m in r["curve"][:WINDOW]) / WINDOW
              for r in rs if all("sufficiency_rate" in m for m in r["curve"])]
      row["sufficiency_rise"] = _ms(rise)
      accs = [_dac_train_accuracy(r["curve"]) for r in rs]
      for k in ("accuracy_clean", "accuracy_augmented"):
        row[f"train_{k}"] = _ms([a[k] for a in accs])
      checks = [r["augmentation_check"] for r in rs if r.get("augmentation_check")]
      if checks:
        row["augmentation_check"] = {k: _ms([c[k] for c in checks]) for k in AUG_KEYS}
        row["augmentation_check"]["per_seed"] = checks
      row["step_s"] = mean_std([step_seconds(r["curve"])[1] for r in rs])
      row["minutes"] = mean_std([r.get("minutes", 0.0) for r in rs])
      paired = [r for r in rs if r["seed"] in ref]
      if method != reference and paired:
        # The primary metric: test F1 (an abstention is 0) against the reference, paired by
        # question and pooled over seeds, and the seed-level test beside it.
        by_q = lambda runs, split="test": {r["seed"]: r[split]["f1_by_id"]  # noqa: E731
                                           for r in runs}
        row["vs_pooled"] = paired_pooled(by_q(ref.values()), by_q(paired))
        row["vs_by_seed"] = paired_by_seed(by_q(ref.values()), by_q(paired))
        row["dev_vs_pooled"] = paired_pooled(by_q(ref.values(), "dev"), by_q(paired, "dev"))
        vs = vs_reference(reference, ref, paired)
        row["vs_reference"] = dict(
            vs, seeds_ahead=sum(d > 0 for d in vs["test_f1_points"]),
            sufficiency_paired_by_step=_ms(
                [paired_by_step(r, ref[r["seed"]], "sufficiency_rate") for r in paired
                 if all("sufficiency_rate" in m for m in r["curve"] + ref[r["seed"]]["curve"])]))
      t["methods"][method] = row
    for method, alpha in alphas:
      if method in t["methods"]:
        r = t["methods"][method]
        star = (t.get("threshold") or {}).get("alpha_star")
        t["alpha"].append({"alpha": alpha, "method": method, "seeds": r["seeds"],
                           "predicted": predicted_side(alpha, star),
                           **abstention_change(runs[method], dac_start),
                           **{k: r[k] for k in ("dev_abstain_rate", "dev_abstain_precision",
                                                "dev_insufficient", "dev_abstain_sufficient",
                                                "dev_abstain_recall", "dev_coverage",
                                                "dev_accuracy_answered", "test_abstain_rate",
                                                "test_abstain_precision", "test_abstain_recall",
                                                "test_f1", "train_abstain_rate")}})
    t["reference"], t["generator_start"] = reference, generator_start
    table[size] = t
  return table


def predicted_side(alpha: float, star: float | None) -> str | None:
  """The threshold's prediction for a generator trained at `alpha`: "abstain" above alpha*,
  "answer" below, "indifferent" at alpha* (to the 6 digits an AlphaStar arm is rounded to);
  None without a threshold."""
  if star is None:
    return None
  if math.isclose(alpha, star, rel_tol=1e-5):
    return "indifferent"
  return "abstain" if alpha > star else "answer"


def abstention_change(runs: list[dict], dac_start: dict | None) -> dict:
  """The prediction tested: each run's dev abstentions after RL against the DAC agent's before
  RL (`dac_start`, one greedy eval: the same start for every seed), paired by question and
  pooled over seeds (reporting.paired_pooled of the 0/1 abstained flags): "abstain_change" on
  every question, and on the questions whose evidence was sufficient both before and after
  ("abstain_sufficient_change": answers lost to abstention), with "observed" the side the
  change falls on ("abstain" up, "answer" down, "neither" when p >= 0.05). Empty when the start
  or the runs lack per-question abstentions (recorded before they existed)."""
  before = (dac_start or {}).get("dev", {})
  if "abstained_by_id" not in before or not all("abstained_by_id" in r["dev"] for r in runs):
    return {}
  start = {r["seed"]: before["abstained_by_id"] for r in runs}
  after = {r["seed"]: r["dev"]["abstained_by_id"] for r in runs}
  sufficient = lambda r: {q for q, s in r["dev"]["sufficient_by_id"].items()  # noqa: E731
                          if s and before["sufficient_by_id"].get(q)}
  keep = {r["seed"]: sufficient(r) for r in runs}
  on_sufficient = [{s: {q: v for q, v in qs.items() if q in keep[s]} for s, qs in d.items()}
                   for d in (start, after)]
  change = paired_pooled(start, after)
  observed = "neither" if not change["p"] < 0.05 else \
      ("abstain" if change["mean"] > 0 else "answer")
  return {"abstain_change": change, "abstain_sufficient_change": paired_pooled(*on_sufficient),
          "observed": observed}


def _pct(ms, digits: int = 1) -> str:
  """A share as percent, mean ± std ("—" when absent)."""
  if ms is None:
    return "—"
  return pm((100 * ms[0], 100 * ms[1]), digits)


def _num(x: float | None, digits: int = 3) -> str:
  return "—" if x is None else f"{x:.{digits}f}"


def markdown_dac(table: dict, steps: int, hardware: str) -> str:
  """results.md of DAC's study: the method table (dev and test), training figures, the paired
  comparison with full fine-tuning, the alpha ablation and the augmentation check."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (monolithic, greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, EM "
              f"{st['dev']['em']:.3f}; test F1 {st['test']['f1']:.3f}, EM "
              f"{st['test']['em']:.3f}."]
    if "dac_start" in t:
      d = t["dac_start"]
      lines.append(
          "DAC before RL (searcher = the SFT model, its adapter at B = 0; generator = "
          f"{t.get('generator_start', 'the warm start')}): dev F1 {d['dev']['f1']:.3f} "
          f"(coverage {d['dev']['coverage']:.3f}, abstention "
          f"{d['dev']['abstain_rate']:.3f}, precision {d['dev']['abstain_precision']:.3f} "
          f"against P(S = 0) = {_num(d['dev']['insufficient'])}"
          f", recall {d['dev']['abstain_recall']:.3f}); test F1 {d['test']['f1']:.3f} (coverage "
          f"{d['test']['coverage']:.3f}, abstention {d['test']['abstain_rate']:.3f}).")
    lines += ["", f"{steps} RL steps; mean ± sample std over seeds; whole dev and test splits "
              "(the SFT start's questions), greedy. An abstention counts as wrong in F1 and EM. "
              "Coverage: share of questions answered (not abstained, not invalid); accuracy when answered: "
              "EM > 0 among those. Abstention precision P(S = 0 | abstained) and recall "
              "P(abstained | S = 0), S the sufficiency of the evidence the generator was shown.",
              "", "| method | seeds | dev F1 | dev EM | test F1 | test EM | test F1 gain vs SFT "
              "(paired) | coverage (test) | accuracy when answered (test) | abstention rate "
              "(test) | abstention precision (test) | abstention recall (test) |",
              "| --- " * 12 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {r['seeds']} | {pm(r['dev_f1'])} | {pm(r['dev_em'])} | "
          f"{pm(r['test_f1'])} | {pm(r['test_em'])} | {cell(r['test_gain'], sign='+')} | "
          f"{cell(r['test_coverage'])} | {cell(r['test_accuracy_answered'])} | "
          f"{cell(r['test_abstain_rate'])} | {cell(r['test_abstain_precision'])} | "
          f"{cell(r['test_abstain_recall'])} |")
    lines += ["", "Dev split, abstention (DAC methods):", "",
              "| method | dev coverage | dev accuracy when answered | dev abstention rate | dev "
              "abstention precision | P(S = 0) (a random abstainer's precision) | dev abstention "
              "recall |", "| --- " * 7 + "|"]
    for method, r in t["methods"].items():
      if r["dev_abstain_precision"] is not None:
        lines.append(f"| {method} | {cell(r['dev_coverage'])} | "
                     f"{cell(r['dev_accuracy_answered'])} | {cell(r['dev_abstain_rate'])} | "
                     f"{cell(r['dev_abstain_precision'])} | {cell(r['dev_insufficient'])} | "
                     f"{cell(r['dev_abstain_recall'])} |")
    lines += ["", f"Training (metrics.jsonl; \"last {WINDOW}\": the mean over the last {WINDOW} "
              "steps). Training F1: of the trajectories' answers (monolithic) or of the "
              "generator's answers (DAC, m per evidence set), abstentions 0. Sufficiency rate: "
              "the share of searcher trajectories whose retrieved documents hold a gold answer "
              f"(every retrieved document; rise: last {WINDOW} steps minus first {WINDOW}). "
              "Generator accuracy on sufficient sets, clean / with distractors: over all steps, "
              "each step weighted by its number of such sets.", "",
              f"| method | training F1 (last {WINDOW}) | sufficiency rate (last {WINDOW}) | "
              "sufficiency rise | abstention rate (last 5) | abstention precision (last 5) | "
              "abstention recall (last 5) | generator accuracy, clean sufficient sets | "
              "generator accuracy, augmented sets | step s (steps 2+) | minutes a run |",
              "| --- " * 11 + "|"]
    for method, r in t["methods"].items():
      lines.append(
          f"| {method} | {cell(r['train_f1'])} | {cell(r['sufficiency_rate'])} | "
          f"{cell(r['sufficiency_rise'], sign='+')} | {cell(r['train_abstain_rate'])} | "
          f"{cell(r['train_abstain_precision'])} | {cell(r['train_abstain_recall'])} | "
          f"{cell(r['train_accuracy_clean'])} | {cell(r['train_accuracy_augmented'])} | "
          f"{pm(r['step_s'], 1)} | {pm(r['minutes'], 1)} |")
    pooled = {m: r for m, r in t["methods"].items() if "vs_pooled" in r}
    if pooled:
      ref = t.get("reference", DAC_REFERENCE)
      lines += ["", f"**Primary metric: test F1 (an abstention counts 0) − {ref}, paired by "
                "question and pooled over seeds** (every (seed, question) a pair; by seed: each "
                "seed's mean difference, Student's t over the seeds). The paper's claim: "
                f"{DAC_CLAIM}.", "",
                f"| method | seeds | pairs | test F1 − {ref} (points) | stderr | p | by seed: "
                f"stderr, t, p | dev F1 − {ref} (points) |", "| --- " * 8 + "|"]
      for m, r in pooled.items():
        v, b, d = r["vs_pooled"], r["vs_by_seed"], r["dev_vs_pooled"]
        lines.append(f"| {m} | {r['seeds']} | {v['pairs']} | {100 * v['mean']:+.2f} | "
                     f"{100 * v['stderr']:.2f} | {_num(v['p'])} | {100 * b['stderr']:.2f}, "
                     f"{b['t']:.2f}, {_num(b['p'])} | {100 * d['mean']:+.2f} ± "
                     f"{100 * d['stderr']:.2f} |")
    vs = {m: r["vs_reference"] for m, r in t["methods"].items() if "vs_reference" in r}
    if vs:
      ref = t.get("reference", DAC_REFERENCE)
      lines += ["", f"Against {ref} (monolithic, full fine-tuning), seed by seed (same "
                "seed: same training questions at every step; test: the same questions, "
                "paired per question, ± its standard error):", "",
                "| method | seeds | Δ test F1 per seed, points | seeds ahead | training F1 − "
                f"{ref} (paired by step) | sufficiency rate − {ref} (paired "
                "by step) |", "| --- " * 6 + "|"]
      for m, v in vs.items():
        cells = ", ".join(f"{d:+.1f} ± {e:.1f}" for d, e in
                          zip(v["test_f1_points"], v["test_f1_stderr_points"]))
        lines.append(f"| {m} | {', '.join(v['seeds'])} | {cells} | {v['seeds_ahead']}/"
                     f"{len(v['seeds'])} | {pm(v['train_f1_paired_by_step'], sign='+')} | "
                     f"{cell(v['sufficiency_paired_by_step'], sign='+')} |")
    if t.get("threshold"):
      th = t["threshold"]
      lines += ["", f"The threshold predicted before RL (the DAC agent at the start, dev): P(S = 0) "
                f"{th['p_insufficient']:.3f}, c_G {th['c_G']:.3f} (accuracy when answering on "
                f"S = 1), c0 {th['c0']:.3f} (on S = 0): α* = {th['alpha_star']:.3f} (the "
                f"paper's c_G·P(S=1)/P(S=0): {th['alpha_star_paper']:.3f}). Above α* a generator "
                "that cannot tell S apart earns more by abstaining everywhere."]
      if t.get("dac_start", {}).get("dev", {}).get("abstain_sufficient") is not None:
        d = t["dac_start"]["dev"]
        lines.append(f"Before RL it abstains on {d['abstain_sufficient']:.3f} of the sufficient "
                     f"sets and {d['abstain_recall']:.3f} of the insufficient ones (dev).")
    changes = [a for a in t["alpha"] if "abstain_change" in a]
    if changes:
      lines += ["", "The prediction tested: dev abstentions after RL minus before RL (the DAC "
                "agent at the start), paired by question and pooled over seeds; on every "
                "question and on the questions whose evidence was sufficient before and after "
                "(answers lost to abstention). Observed: the side of a change with p < 0.05.", "",
                "| α | method | predicted | observed | abstention change (points) | p | on "
                "sufficient sets (points) | p | dev abstention on sufficient sets after |",
                "| --- " * 9 + "|"]
      for a in changes:
        c, cs = a["abstain_change"], a["abstain_sufficient_change"]
        lines.append(f"| {a['alpha']:g} | {a['method']} | {a.get('predicted') or '—'} | "
                     f"{a['observed']} | {100 * c['mean']:+.1f} ± {100 * c['stderr']:.1f} | "
                     f"{_num(c['p'])} | {100 * cs['mean']:+.1f} ± {100 * cs['stderr']:.1f} | "
                     f"{_num(cs['p'])} | {cell(a.get('dev_abstain_sufficient'))} |")
    if t["alpha"]:
      lines += ["", "The α ablation (generator reward α for abstaining on insufficient evidence; "
                "the paper's trade-off predicts more abstention as α rises; predicted: the side "
                "of α* each α is on):", "",
                "| α | predicted | method | seeds | dev abstention rate | dev precision | dev "
                "P(S = 0) | dev "
                "recall | dev "
                "coverage | dev accuracy when answered | test abstention rate | test precision | "
                "test recall | test F1 | training abstention rate (last 5) |",
                "| --- " * 15 + "|"]
      for a in t["alpha"]:
        lines.append(
            f"| {a['alpha']:g} | {a.get('predicted') or '—'} | {a['method']} | {a['seeds']} | "
            f"{cell(a['dev_abstain_rate'])} | "
            f"{cell(a['dev_abstain_precision'])} | {cell(a['dev_insufficient'])} | "
            f"{cell(a['dev_abstain_recall'])} | "
            f"{cell(a['dev_coverage'])} | {cell(a['dev_accuracy_answered'])} | "
            f"{cell(a['test_abstain_rate'])} | {cell(a['test_abstain_precision'])} | "
            f"{cell(a['test_abstain_recall'])} | {cell(a['test_f1'])} | "
            f"{cell(a['train_abstain_rate'])} |")
    checks = {m: r["augmentation_check"] for m, r in t["methods"].items()
              if "augmentation_check" in r}
    if checks:
      lines += ["", "The augmentation check (each DAC run's final searcher and generator, greedy, "
                "dev questions): on the questions whose evidence is sufficient and got hard "
                "distractors (augment_k answer-free retriever hits for the searcher's own "
                "queries, shuffled in), the generator's accuracy (EM > 0) and abstention rate "
                "with the distractors vs on the same evidence clean (the final dev eval: same "
                "searcher trajectories). Consistency: the share of the other questions whose "
                "answer equals the clean eval's (1 = the two passes saw the same trajectories).",
                "", "| method | questions checked | accuracy clean | accuracy with distractors | "
                "drop (clean − augmented) | abstention clean | abstention with distractors | "
                "consistency |", "| --- " * 8 + "|"]
      for m, c in checks.items():
        lines.append(
            f"| {m} | {cell(c['n_augmented_sufficient'], 0)} | {cell(c['accuracy_clean'])} | "
            f"{cell(c['accuracy_augmented'])} | {cell(c['accuracy_drop'], sign='+')} | "
            f"{cell(c['abstain_rate_clean'])} | {cell(c['abstain_rate_augmented'])} | "
            f"{cell(c['consistency'])} |")
    lines.append("")
  return "\n".join(lines)


# (metric key, file name, label, methods plotted: None = every method that logs the key)
def dac_panels(alphas=DAC_ALPHAS, sufficiency=("grpo_full", "grpo_lora", "dac",
                                                "dac_sufficient_only", "dac_no_aug")) -> tuple:
  """plot_dac's panels: F1 of every method, the sufficiency rate of `sufficiency`'s methods
  (None: every method), the abstention rate of the alpha arms."""
  return (("f1", "f1_vs_step", "training F1", None),
          ("sufficiency_rate", "sufficiency_vs_step", "sufficiency rate of retrieved docs",
           sufficiency),
          ("dac/abstain_rate", "abstain_vs_step", "training abstention rate",
           tuple(m for m, _ in alphas)))


def plot_dac(study: dict, out: str, panels: tuple | None = None) -> list[str]:
  """`panels` (default dac_panels(): the demo DAC study's) vs step ({WINDOW}-step moving
  averages over full windows): the mean over seeds as a line, the min-max over seeds as a band; a method whose runs do not log the key is left out."""
  from agentjax.plots import pyplot, save_figure
  plt = pyplot()
  paths = []
  for key, name, label, methods in panels or dac_panels():
    fig, axes = plt.subplots(1, len(study), figsize=(7 * len(study), 4.5), squeeze=False)
    for ax, (size, s) in zip(axes[0], study.items()):
      for method, rs in s["runs"].items():
        if methods is not None and method not in methods:
          continue
        values = [[m[key] for m in r["curve"]] for r in rs
                  if all(key in m for m in r["curve"])]
        if not values or min(len(v) for v in values) < WINDOW:
          continue
        n = min(len(v) for v in values)
        curves = [moving(v[:n])[WINDOW - 1:] for v in values]
        steps = [m["step"] for m in rs[0]["curve"][WINDOW - 1:n]]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(steps))]
        style = "--" if method.startswith("grpo") else "-"
        line, = ax.plot(steps, mean, style, label=f"{method} ({len(values)} seeds)")
        ax.fill_between(steps, [min(c[i] for c in curves) for i in range(len(steps))],
                        [max(c[i] for c in curves) for i in range(len(steps))], alpha=0.15,
                        color=line.get_color())
      ax.set_title(f"{size} model: mean over seeds, band min-max over seeds")
      ax.set_xlabel("RL step")
      ax.set_ylabel(f"{label}\n({WINDOW}-step moving average)")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8)
    path = os.path.join(out, f"{name}.png")
    save_figure(fig, path)
    paths.append(path)
  return paths
