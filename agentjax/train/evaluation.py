r"""Evaluation: rollouts of benchmark questions scored by EM / F1 / accuracy (launch/eval.py).

    result = eval_benchmarks(config, hf_path="models/Qwen3-8B")                      # greedy
    result = eval_benchmarks(config, workdir="runs/cw8b", samples=4, temperature=1.0)  # CW-GRPO's

Per benchmark: EM and F1 (means over every sample of every question) and accuracy, the share of
samples whose answer EM is > 0 (CW-GRPO's eval/compute_scores.py counts `score > 0` as 1). Over
the benchmarks, two averages (our reading: the papers report one of the two, so we report both):
  "overall"  sample-weighted: the mean over every sample of the mix, as CW-GRPO's code computes it
             (in its 400-question mix MuSiQue's 100 questions weigh twice the others' 50);
  "average"  macro: the unweighted mean of the per-benchmark means.

Greedy decoding with one sample per question is the default. With `temperature`, each question
gets `samples` rollouts sampled at that temperature (the config's rollout.top_k / top_p filters
apply too). The rollout of sample s of batch b draws from
jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), b), s), so a result is reproducible
from (seed, batch size) and does not depend on how many samples are asked for. Every batch is
padded to the batch size, so one compiled program serves every batch and sample.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from agentjax.agent.trajectories import search_stats
from agentjax.bars import progress_bar
from agentjax.rl.rewards import exact_match, f1_score
from agentjax.train.kinds import trainer_kind
from agentjax.train.builders import (load_model, load_questions, make_agents,
                                     make_search_backend, restore_policy, restore_trainable,
                                     sampling_params)

log = logging.getLogger(__name__)

SCORES = ("accuracy", "em", "f1")  # what the overall and macro averages report
# An agent that may abstain (DAC's generator): the share of samples answered (not abstained, not
# invalid), EM accuracy over those, the abstention rate and its precision and recall against the
# evidence's insufficiency (S = 0), P(S = 0), the accuracy when it answers on S = 1 (c_G) and
# on S = 0 evidence (what dac.rewards.abstention_threshold reads), and the abstention rate on
# sufficient evidence P(abstained | S = 1) (answers lost to abstention). Abstentions score 0 in
# EM and F1.
ABSTENTION_SCORES = ("coverage", "accuracy_answered", "abstain_rate", "abstain_precision",
                     "abstain_recall", "insufficient_share", "accuracy_sufficient",
                     "accuracy_insufficient", "abstain_sufficient")


def eval_key(seed: int, batch: int, sample: int) -> jax.Array:
  """The rollout key of `evaluate`'s batch `batch`, sample `sample` (a warm-up makes it alike)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), batch), sample)


def evaluate(engine: Any, params: Any, records: Sequence[Mapping[str, Any]], batch_size: int,
             *, samples: int = 1, seed: int = 0, desc: str = "eval") -> dict[str, Any]:
  """`samples` rollouts of every record by `engine` (its sampling settings); EM/F1 against the
  record's gold answers.

  Args:
    engine: a RolloutEngine with group_size 1 (anything whose `run(params, questions, rng)`
      returns a TrajectoryBatch-like object with answers, answered, num_turns, format_valid).
    records: {"id", "question", "golden_answers", optional "benchmark"} per question.
    batch_size: questions per engine call; the last batch is padded (repeating its last question)
      so every call has the same shape.
    samples: rollouts per question, each from its own rng (module docstring).
    seed: the root of those rngs (unused by a greedy engine).
    desc: the label of the progress bar (questions done; agentjax/bars.py).
  Returns:
    {"n": questions, "samples", "accuracy", "em", "f1", "format_ok", "turns" (means over the
    n * samples rollouts; with TurnRecords also "redundant_query_rate", "steps_to_answer":
    row_means), "per_question": [{"id", "benchmark", "sample", "answer", "golds", "f1", "em",
    "turns", "format_ok"[, "searches", "redundant_searches"]}] question-major (sample fastest)}.
  """
  if samples < 1:
    raise ValueError(f"samples must be >= 1, got {samples}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  rows = []
  bar = progress_bar(len(records), desc, unit="question", leave=False)
  for index, start in enumerate(range(0, len(records), batch_size)):
    chunk = list(records[start:start + batch_size])
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_size - real)
    questions = [r["question"] for r in chunk]
    batch_rows: list[list[dict[str, Any]]] = [[] for _ in range(real)]
    for s in range(samples):
      rng = eval_key(seed, index, s)
      # An agent with labels of its own (DAC: the sufficiency of each evidence set) gets golds.
      labels = {"golds": [r["golden_answers"] for r in chunk]} \
          if getattr(engine, "labels_from_golds", False) else {}
      batch, _ = engine.run(params, questions, rng, **labels)
      for i, rec in enumerate(chunk[:real]):
        answer = batch.answers[i] if batch.answered[i] else None
        golds = list(rec["golden_answers"])
        batch_rows[i].append({
            "id": rec["id"], "benchmark": rec.get("benchmark", ""), "sample": s,
            "answer": answer, "golds": golds, "f1": f1_score(answer, golds),
            "em": exact_match(answer, golds), "turns": int(batch.num_turns[i]),
            "format_ok": bool(batch.format_valid[i])})
        if getattr(batch, "turns", None) is not None:  # redundant queries (search_stats)
          searches, redundant = search_stats(batch.turns[i])
          batch_rows[i][-1].update(searches=searches, redundant_searches=redundant)
        if hasattr(batch, "abstentions"):  # an agent that may abstain (DAC)
          batch_rows[i][-1]["abstained"] = bool(batch.abstentions[i])
          batch_rows[i][-1]["sufficient"] = bool(batch.sufficient[i])
    rows += [row for question in batch_rows for row in question]
    bar.set_postfix_str(f"F1 {np.mean([r['f1'] for r in rows]):.3f}", refresh=False)
    bar.update(real)
  bar.close()
  return {"n": len(records), "samples": samples, **row_means(rows), "per_question": rows}


def row_means(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
  """{"accuracy": share of rows with em > 0, "em", "f1", "format_ok", "turns": means} (0.0 for
  no rows)."""
  if not rows:
    return {k: 0.0 for k in ("accuracy", "em", "f1", "format_ok", "turns")}
  col = lambda k: np.asarray([r[k] for r in rows], np.float64)  # noqa: E731
  out = {"accuracy": float(np.mean(col("em") > 0)), "em": float(col("em").mean()),
         "f1": float(col("f1").mean()), "format_ok": float(col("format_ok").mean()),
         "turns": float(col("turns").mean())}
  if all("searches" in r for r in rows):
    # The share of searches whose normalized query repeats an earlier one of its trajectory
    # (pooled over rows), and the turns of the trajectories that answered (None: none did).
    searches = col("searches").sum()
    out["redundant_query_rate"] = float(col("redundant_searches").sum() / searches) \
        if searches else 0.0
    answered = np.asarray([r["answer"] is not None for r in rows])
    out["steps_to_answer"] = float(col("turns")[answered].mean()) if answered.any() else None
  if all("abstained" in r for r in rows):  # ABSTENTION_SCORES
    answered = np.asarray([r["answer"] is not None for r in rows])
    out["coverage"] = float(answered.mean())
    out["accuracy_answered"] = float(np.mean(col("em")[answered] > 0)) if answered.any() else 0.0
    out["abstain_rate"] = float(col("abstained").mean())
    abstained, insufficient = col("abstained") > 0, col("sufficient") == 0
    # Against the label S of the evidence the answer was given on: P(S = 0 | abstained) and
    # P(abstained | S = 0) (0 when nothing abstained / no set was insufficient).
    out["abstain_precision"] = float(insufficient[abstained].mean()) if abstained.any() else 0.0
    out["abstain_recall"] = float(abstained[insufficient].mean()) if insufficient.any() else 0.0
    out["abstain_sufficient"] = float(abstained[~insufficient].mean()) \
        if (~insufficient).any() else 0.0
    out["insufficient_share"] = float(insufficient.mean())
    # EM accuracy of the answers given on S = 1 / S = 0 evidence (0 when it gave none there).
    for key, where in (("accuracy_sufficient", ~insufficient), ("accuracy_insufficient",
                                                                  insufficient)):
      took = answered & where
      out[key] = float(np.mean(col("em")[took] > 0)) if took.any() else 0.0
  return out


def mix_scores(per_question: Mapping[str, Sequence[Mapping[str, Any]]]
               ) -> tuple[dict[str, float], dict[str, float]]:
  """(overall, average) of SCORES over benchmarks' rows {name: [row, ...]} (one row a sample):
  overall is the mean over every row of every benchmark (sample-weighted, CW-GRPO's code),
  average the unweighted mean of the per-benchmark means (macro)."""
  every = [r for rows in per_question.values() for r in rows]
  overall = {k: v for k, v in row_means(every).items() if k in SCORES}
  means = [row_means(rows) for rows in per_question.values()]
  average = {k: float(np.mean([m[k] for m in means])) if means else 0.0 for k in SCORES}
  return overall, average


def eval_questions(config: Any) -> dict[str, tuple[str, list[dict[str, Any]]]]:
  """{name: (split, records)} of every benchmark config.data.eval names, in its order.

  A plain benchmark name takes the first config.data.eval_size questions (0: all) of
  config.data.eval_split. A named list (agentjax.data.searchqa.BENCHMARK_LISTS, e.g. cw_grpo_400)
  fixes each member's split and size; a non-zero data.eval_size below a member's size caps it
  (for smoke runs). A split shorter than a member's size is taken whole, with a warning. Every
  benchmark is loaded before any is evaluated, so a missing split fails in seconds.
  """
  from agentjax.data.searchqa import expand_benchmarks
  from agentjax.train import config as config_lib
  try:
    members = expand_benchmarks(config.data.eval)
  except ValueError as e:
    raise config_lib.ConfigError(f"config.data.eval={config.data.eval!r}: {e}") from None
  cap = config.data.eval_size
  out = {}
  for name, size, split in members:
    field = "data.eval_split" if split is None else f"data.eval ({config.data.eval})"
    split = split or config.data.eval_split
    records = load_questions(config, [name], split, field)
    want = min(size, cap) if size and cap else size or cap
    if want and len(records) < want:
      log.warning("%s/%s has %d questions, fewer than the %d asked for: taking them all", name,
                  split, len(records), want)
    out[name] = (split, records[:want] if want else records)
  return out


def eval_benchmarks(config: Any, *, workdir: str | None = None, hf_path: str | None = None,
                    step: int | None = None, samples: int = 1,
                    temperature: float | None = None,
                    make_engine: Any = None) -> dict[str, Any]:
  """EM/F1/accuracy of rollouts on every benchmark of config.data.eval (`eval_questions`).

  The policy comes from a Hugging Face folder (`hf_path`) or from a run's checkpoint (`workdir`,
  the latest step unless `step`). temperature None decodes greedily (samples must be 1); a
  temperature > 0 samples `samples` rollouts per question, seeded by config.seed (module
  docstring). make_engine(config, engine, mesh) -> the engine to evaluate instead of the
  config's eval engine (e.g. a rubric-guided one built on its settings).

  Returns {"source", "split" (config.data.eval_split), "samples", "temperature", "seed",
  "judge" (agentjax.judge.judge_identity of config.judge), "benchmarks": {name: {"split", "n",
  "samples", "accuracy", "em", "f1", "format_ok", "turns"}}, "overall": {"accuracy", "em",
  "f1"} (sample-weighted), "average": {"accuracy", "em", "f1"} (macro),
  "per_question": {name: [row per sample]}}.
  """
  from agentjax.judge import judge_identity
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.train import config as config_lib
  if (workdir is None) == (hf_path is None):
    raise ValueError("eval needs exactly one of workdir (a run's checkpoints) or hf_path")
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ValueError(f"samples={samples!r}: must be an int >= 1")
  if temperature is None and samples > 1:
    raise ValueError(f"samples={samples} with greedy decoding gives {samples} identical "
                     f"rollouts: give a temperature > 0 to sample them")
  if temperature is not None and not temperature > 0:
    raise ValueError(f"temperature={temperature!r}: must be > 0 (None decodes greedily)")
  config = config.copy_and_resolve_references()
  if hf_path is not None:
    config.model.hf_path, config.model.tokenizer_path = hf_path, ""
  config_lib.validate(config)
  config_lib.check_paths(config)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  roles = trainer_kind(config).roles  # DAC: the searcher then the generator, both adapters
  lora = None
  if workdir is not None and roles:
    cfg, target, trainable, tokenizer, source = restore_trainable(config, workdir, mesh,
                                                                  step=step, purpose="evaluate")
    params, lora = target.rollout_params(trainable), target.spec
  elif workdir is not None:
    cfg, params, tokenizer, source = restore_policy(config, workdir, mesh, step=step,
                                                    purpose="evaluate")
  else:
    (cfg, params, tokenizer), source = load_model(config, mesh), hf_path
    if roles:  # every role played by the plain model
      params = {role: params for role in roles}
  sampling = None  # greedy; a temperature samples with the config's top_k / top_p filters
  if temperature is not None:
    sampling = sampling_params(config, temperature=float(temperature))
  _, engine = make_agents(config, cfg, tokenizer, make_search_backend(config, mesh), mesh, lora,
                          eval_sampling=sampling, eval_only=True)
  if make_engine is not None:  # another agent on the same policy (launch/eval.py --agent)
    engine = make_engine(config, engine, mesh)
  if trainer_kind(config).evaluate is not None:  # e.g. a rubric generator: its branch points
    return trainer_kind(config).evaluate(config, engine, params, tokenizer, mesh, source, samples,
                                         temperature)
  questions = eval_questions(config)
  out = {"source": source, "split": config.data.eval_split, "samples": samples,
         "temperature": temperature, "seed": int(config.seed),
         "judge": judge_identity(config.judge), "benchmarks": {}, "per_question": {}}
  for name, (split, records) in questions.items():
    with use_mesh(mesh):
      result = evaluate(engine, params, records, config.train.eval_batch, samples=samples,
                        seed=config.seed, desc=f"eval {name}")
    out["per_question"][name] = result.pop("per_question")
    out["benchmarks"][name] = dict(split=split, **result)
    log.info("%s/%s: %d questions x %d samples, accuracy %.4f EM %.4f F1 %.4f", name, split,
             result["n"], samples, result["accuracy"], result["em"], result["f1"])
  out["overall"], out["average"] = mix_scores(out["per_question"])
  return out


def format_table(result: Mapping[str, Any]) -> str:
  """The benchmarks of eval_benchmarks' result as a fixed-width text table, then the
  sample-weighted overall and the macro average."""
  abstains = bool(result["benchmarks"]) and all("coverage" in b
                                                for b in result["benchmarks"].values())
  lines = [f"{'benchmark':<18}{'n':>6}{'acc':>9}{'EM':>9}{'F1':>9}" +
           (f"{'coverage':>10}{'acc|ans':>9}" if abstains else "")]
  for name, b in result["benchmarks"].items():
    lines.append(f"{name:<18}{b['n']:>6}{b['accuracy']:>9.4f}{b['em']:>9.4f}{b['f1']:>9.4f}" +
                 (f"{b['coverage']:>10.4f}{b['accuracy_answered']:>9.4f}" if abstains else ""))
  n = sum(b["n"] for b in result["benchmarks"].values())
  for label, key, count in (("overall (samples)", "overall", n), ("average (macro)", "average",
                                                                   "")):
    s = result[key]
    lines.append(f"{label:<18}{count:>6}{s['accuracy']:>9.4f}{s['em']:>9.4f}{s['f1']:>9.4f}")
  return "\n".join(lines)
