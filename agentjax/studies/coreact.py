"""The Co-ReAct study on SynthWorld (ours: the claims of Co-ReAct, arXiv:2605.23590, abstract and
Fig. 3-4, tested at CPU scale), as a library (its command line: launch/coreact_study.py): the runs
of its stages (jobs: collect, sft, grpo, guided; each a subprocess of the repository's own
launchers), their scheduler (each run claimed as the sweep claims its runs,
agentjax/studies/sweep.py), and the report: branch-point statistics, the rubric generator's held-out
scores before and after GRPO, the guided-inference variants, their tables and plots."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import re
import sys
from typing import Any, Mapping, Sequence

from agentjax.studies import sweep
from agentjax.studies.reporting import (WINDOW, mean_std, no_nan, paired_by_seed,
                                        paired_pooled, say)
from agentjax.studies.runs import read_json, write_json


STAGES = ("collect", "sft", "grpo", "guided", "report")
REWARDS = ("listwise", "pairwise", "top1")
# variant: (eval.py --agent, which rubric generator: None | "untrained" | "trained" | a reward,
# overrides). "trained" is the list-wise GRPO generator of the agent's own seed; a reward names
# the GRPO generator of that reward and seed (the research study's per-reward variants).
VARIANTS = {
    "react": ("react", None, {}),
    "coreact_untrained": ("coreact", "untrained", {"coreact.verify": False}),
    "coreact_untrained_verify": ("coreact", "untrained", {"coreact.verify": True}),
    "coreact_trained": ("coreact", "trained", {"coreact.verify": False}),
    "coreact_trained_verify": ("coreact", "trained", {"coreact.verify": True}),
    "bon_self": ("best_of_n", None, {"coreact.best_of_n_select": "self"}),
    "bon_rubric": ("best_of_n", "trained", {"coreact.best_of_n_select": "rubric"}),
    **{f"coreact_{r}_verify": ("coreact", r, {"coreact.verify": True}) for r in REWARDS},
}
DEMO_VARIANTS = ("react", "coreact_untrained", "coreact_untrained_verify", "coreact_trained",
                 "coreact_trained_verify", "bon_self", "bon_rubric")  # docs/results/coreact
TRAINED_REWARD = "listwise"  # the generator the guided variants use
# The research study's variants: ReAct; rubrics by the warm start and by each
# reward's trained generator (shadow suffix, verify and one retry), the list-wise one also
# without verify; Best-of-N by self-score and by the list-wise rubric's score.
RESEARCH_VARIANTS = ("react", "coreact_untrained_verify", "coreact_trained",
                     *(f"coreact_{r}_verify" for r in REWARDS), "bon_self", "bon_rubric")
EVAL_KEYS = ("spearman", "pairwise", "top1", "reward")  # the held-out rubric scores reported
# Also reported per run: the share of held-out (greedy) rubrics the repetition gate zeroes.
SUMMARY_KEYS = EVAL_KEYS + ("repetitive",)
# Training-side (sampled rubrics, metrics.jsonl): the step's mean reward and Spearman.
TRAIN_KEYS = (("train_reward", "reward"), ("train_spearman", "rubric/spearman"))
GUIDED_KEYS = ("f1", "em", "redundant_query_rate", "steps_to_answer", "answered",
               "retries_per_step", "retry_share", "verify_score")
AGENT_TEMPERATURE = 0.7  # configs/coreact.py:agent (the code's search agent)


@dataclasses.dataclass(frozen=True)
class Job:
  """One subprocess run: done when every path of `done` exists; starts once `needs` exist."""
  spec: str
  stage: str
  cmd: tuple[str, ...]
  done: tuple[str, ...]
  needs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Settings:
  root: str
  world: str
  seeds: tuple[int, ...]
  steps: int
  train_questions: int
  dev_questions: int
  collect_seed: int
  eval_size: int
  rewards: tuple[str, ...] = REWARDS
  variants: tuple[str, ...] = DEMO_VARIANTS
  best_of_n: int = 4
  grpo_temperature: float | None = None  # None: the preset's (configs/coreact.py:demo, 1.0)
  # "demo": the `make demo` world and agent (configs/coreact.py's demo presets); "research":
  # SynthWorld v2 and the research backbone under `world` (its research_* presets).
  family: str = "demo"
  judge_backend: str = ""  # the collection's branch values (coreact.judge_backend; "": preset's)
  # Each finished job's record under {records}/runs (records.write_files_record; "": none): a
  # job with a record is done (unless a job still to run needs an output the record does not
  # keep, a model export), its files are restored under root when missing, and the report reads
  # them alone.
  records: str = ""
  commit_records: bool = False  # git-commit each record as it is written


# The research study's settings (docs/results/coreact_research/README.md), used by
# launch/coreact_study.py --family=research for every flag not given: the world and runs under
# runs/research (shared with the research sweep), its records in the results folder.
RESEARCH_DEFAULTS = {"root": "runs/research/coreact", "world": "runs/research",
                     "out": "docs/results/coreact_research", "judge_backend": "montecarlo",
                     "train_questions": 150, "dev_questions": 50, "steps": 40,
                     "eval_size": 200, "variants": RESEARCH_VARIANTS}


def paths(root: str) -> dict[str, str]:
  """Where every stage writes under `root`."""
  return {"train": os.path.join(root, "branches_train.jsonl"),
          "dev": os.path.join(root, "branches_dev.jsonl"),
          "demos": os.path.join(root, "rubric_demos.jsonl"),
          "sft": os.path.join(root, "rubric_sft"),
          "untrained": os.path.join(root, "rubric_sft", "hf_export"),
          "guided": os.path.join(root, "guided")}


def run_name(reward: str, temperature: float | None) -> str:
  """A GRPO run's folder name: the reward, with its rollout temperature when not the preset's."""
  return reward if temperature is None else f"{reward}_t{temperature:g}"


def grpo_names(s: "Settings") -> list[str]:
  """The GRPO runs of the study, then (with another temperature) the preset-temperature runs,
  reported where they exist."""
  names = [run_name(r, s.grpo_temperature) for r in s.rewards]
  return names + (list(s.rewards) if s.grpo_temperature is not None else [])


def grpo_dir(root: str, name: str, seed: int) -> str:
  return os.path.join(root, name, f"seed{seed}")


def guided_path(root: str, variant: str, seed: int) -> str:
  return os.path.join(root, "guided", variant, f"seed{seed}.json")


def _overrides(d: Mapping[str, Any]) -> list[str]:
  return [f"--config.{k}={v}" for k, v in d.items()]


FAMILIES = ("demo", "research")


def _check_family(s: Settings) -> None:
  if s.family not in FAMILIES:
    raise ValueError(f"Settings.family must be one of {FAMILIES}, got {s.family!r}")


def preset(s: Settings, role: str) -> str:
  """configs/coreact.py's preset of a role (collect, rubric_sft, demo: the GRPO one, agent) in
  the study's family."""
  _check_family(s)
  if s.family == "demo":
    return role
  return "research" if role == "demo" else f"research_{role}"


def _world(s: Settings) -> dict[str, str]:
  """The config fields that put a config on --world: configs/base.py's DEMO_ROOT layout (a
  `make demo` folder) or its RESEARCH_ROOT layout (launch/backbone.py's: the tokenizer and the
  export under backbone/)."""
  _check_family(s)
  w = s.world
  agent = {"demo": {"model.tokenizer_path": f"{w}/synthworld/tokenizer",
                    "model.hf_path": f"{w}/sft/hf_export"},
           # the backbone shipped in the repository (its tokenizer beside its weights)
           "research": {"model.tokenizer_path": "",
                        "model.hf_path": shipped_backbone()}}[s.family]
  return {"data.manual_dir": f"{w}/synthworld", "data.data_dir": f"{w}/tfds",
          "retrieval.corpus_path": f"{w}/synthworld/corpus.jsonl",
          "retrieval.index_dir": f"{w}/bm25_index", **agent,
          "coreact.entities_path": f"{w}/synthworld/entities.jsonl"}


def shipped_backbone() -> str:
  """The research family's agent: the finished backbone shipped in the repository
  (backbones/research_v2/final, checked against its manifest before the study's jobs)."""
  from agentjax.studies.backbone import SHIPPED
  return os.path.join(sweep.REPO, SHIPPED, "final")


def _generator_folder(s: Settings, generator: str, seed: int) -> str:
  """The rubric generator a guided variant reads: the warm start ("untrained") or the GRPO
  generator of a reward ("trained": the list-wise one) and the agent's seed."""
  if generator == "untrained":
    return paths(s.root)["untrained"]
  reward = TRAINED_REWARD if generator == "trained" else generator
  return os.path.join(grpo_dir(s.root, run_name(reward, s.grpo_temperature), seed), "hf_export")


def jobs(s: Settings) -> list[Job]:
  """Every run of the study in priority order (the scheduler starts the first ready one)."""
  p = paths(s.root)
  py = sys.executable
  launch = lambda name: f"launch/{name}"  # noqa: E731  (run from the repo root)
  branches = {"coreact.branches_train": p["train"], "coreact.branches_dev": p["dev"]}
  world = _world(s)
  out: list[Job] = []
  config = lambda role: f"--config=configs/coreact.py:{preset(s, role)}"  # noqa: E731
  values = {"coreact.judge_backend": s.judge_backend} if s.judge_backend else {}
  for split, n in (("train", s.train_questions), ("dev", s.dev_questions)):
    out.append(Job(f"collect/{split}", "collect", (
        py, launch("collect_branches.py"), config("collect"),
        f"--split={split}", f"--out={p[split]}", f"--questions={n}",
        f"--seed={s.collect_seed}", *_overrides({**world, **values})), (p[split],)))
  out.append(Job("sft/demos", "sft", (
      py, launch("coreact_demos.py"), config("rubric_sft"),
      *_overrides({**world, **branches, "sft.demos": p["demos"]})), (p["demos"],), (p["train"],)))
  out.append(Job("sft/rubric", "sft", (
      py, launch("train.py"), config("rubric_sft"), f"--workdir={p['sft']}",
      *_overrides({**world, **branches, "sft.demos": p["demos"]})),
      (os.path.join(p["untrained"], "config.json"),), (p["demos"], p["dev"])))
  grpo = []
  temperature = {} if s.grpo_temperature is None else \
      {"rollout.temperature": s.grpo_temperature}
  for reward in s.rewards:
    name = run_name(reward, s.grpo_temperature)
    for seed in s.seeds:
      wd = grpo_dir(s.root, name, seed)
      grpo.append(Job(f"grpo/{name}/{seed}", "grpo", (
          py, launch("train.py"), config("demo"), f"--workdir={wd}",
          # The generator is its own model, fully fine-tuned from its warm start's export
          # (configs/coreact.py:rubric_sft says why not a LoRA adapter).
          *_overrides({**world, **branches, "seed": seed, "coreact.rank_reward": reward,
                       "train.steps": s.steps, "model.hf_path": p["untrained"],
                       **temperature})),
          (os.path.join(wd, "hf_export", "config.json"),
           os.path.join(wd, "eval", f"{s.steps}.json")),
          (p["train"], p["dev"], os.path.join(p["untrained"], "config.json"))))
  guided = []
  for seed in s.seeds:
    for variant in s.variants:
      agent, generator, extra = VARIANTS[variant]
      cmd = [py, launch("eval.py"), config("agent"),
             f"--hf_path={world['model.hf_path']}", f"--agent={agent}",
             f"--temperature={AGENT_TEMPERATURE:g}",
             f"--output={guided_path(s.root, variant, seed)}"]
      needs: tuple[str, ...] = ()
      if generator is not None:
        folder = _generator_folder(s, generator, seed)
        cmd.append(f"--rubric_generator={folder}")
        needs = (os.path.join(folder, "config.json"),)
      cmd += _overrides({**world, "seed": seed, "data.eval_split": "test",
                         "data.eval_size": s.eval_size, "coreact.best_of_n": s.best_of_n,
                         **extra})
      guided.append(Job(f"guided/{variant}/{seed}", "guided", tuple(cmd),
                        (guided_path(s.root, variant, seed),), needs))
  if s.family == "research":
    # Seed by seed: each seed's generators, then its guided runs, so that a seed's guided runs
    # end soon after the generators they read (a generator's export is not in its record: a
    # lost machine reruns only a seed in flight).
    order = []
    for seed in s.seeds:
      order += [j for j in grpo if j.spec.endswith(f"/{seed}")]
      order += [j for j in guided if j.spec.endswith(f"/{seed}")]
    return out + order
  # The list-wise generators first (the trained guided variants wait on them), the guided runs
  # that need no trained generator beside them, then the other rewards.
  first = [j for j in grpo
           if j.spec.startswith(f"grpo/{run_name(TRAINED_REWARD, s.grpo_temperature)}/")]
  return out + first + guided + [j for j in grpo if j not in first]


def command_line(job: Job) -> str:
  """The job's command as one would type it (python for this interpreter)."""
  return " ".join(["python"] + list(job.cmd[1:]) if job.cmd[0] == sys.executable else job.cmd)


def _done(job: Job) -> bool:
  return all(os.path.exists(x) for x in job.done)


def _log(root: str, spec: str) -> str:
  folder = os.path.join(root, "logs")
  os.makedirs(folder, exist_ok=True)
  return os.path.join(folder, spec.replace("/", "_") + ".log")


def prepare_world(s: Settings) -> None:
  """The research family's world under s.world (SynthWorld v2, its tokenizer, BM25 index and
  question dataset; built in seconds, reused when it has the same settings) checked against the
  shipped backbone's manifest. The demo family reads a `make demo` folder as it is."""
  if s.family != "research":
    return
  import configs.coreact as coreact_configs
  from agentjax.data.demo_world import build_demo_world
  from agentjax.studies.backbone import check_shipped
  from agentjax.train.builders import load_questions
  config = coreact_configs.get_config(preset(s, "agent"))
  say(build_demo_world(os.path.join(s.world, "synthworld"), topk=config.retrieval.topk,
                       world="v2"))
  for key, value in _world(s).items():
    section, field = key.split(".")
    config[section][field] = value
  load_questions(config, config.data.train.split(","), "train")
  check_shipped(os.path.dirname(shipped_backbone()), os.path.join(s.world, "synthworld"))


def record_files(s: Settings, job: Job) -> list[str]:
  """The files (relative to s.root) a finished job's record keeps: what the report and the
  later jobs read, never a model export (GRPO's generator is kept by the guided runs' results;
  the rubric warm start is rerun, deterministically, when a job still needs it)."""
  p, root = paths(s.root), s.root
  rel = lambda path: os.path.relpath(path, root)  # noqa: E731
  stage, *rest = job.spec.split("/")
  if stage == "collect":
    return [rel(p[rest[0]])]
  if job.spec == "sft/demos":
    return [rel(p["demos"])]
  if job.spec == "sft/rubric":
    return [rel(os.path.join(p["sft"], f)) for f in ("config.json", "metrics.jsonl")]
  if stage == "grpo":
    name, seed = rest
    wd = grpo_dir(root, name, int(seed))
    evals = sorted(f for f in os.listdir(os.path.join(wd, "eval"))
                   if re.fullmatch(r"\d+\.json", f) and int(f[:-5]) <= s.steps)
    return [rel(os.path.join(wd, f)) for f in ("config.json", "metrics.jsonl")] + \
        [rel(os.path.join(wd, "eval", f)) for f in evals]
  if stage == "guided":
    return [rel(guided_path(root, rest[0], int(rest[1])))]
  raise ValueError(f"no record layout for job {job.spec!r}")


def keep_record(s: Settings, job: Job) -> None:
  """With s.records: the record of a finished job (its outputs exist) written when it has none,
  with the code version of this checkout (and a model export's sha256 beside), and committed
  with s.commit_records. A failure is said, not raised (the next run of the study retries)."""
  from agentjax.studies import records
  if not s.records or not _done(job):
    return
  from agentjax.data.searchqa import file_sha256
  path = records.files_record_path(s.records, job.spec)
  export = next((os.path.join(os.path.dirname(x), "model.safetensors") for x in job.done
                 if x.endswith(os.path.join("hf_export", "config.json"))), None)
  sha = file_sha256(export) if export and os.path.exists(export) else None
  try:
    kept = records.read_record(path)
    if kept is not None and sha and kept.get("export_sha256") not in (None, sha):
      # a job run again (its export was lost) that did not reproduce its recorded export: the
      # runs that read the recorded one started from another model
      say(f"  {job.spec}: WARNING its export ({sha[:12]}) is not the one its record names "
          f"({kept['export_sha256'][:12]}): this machine did not reproduce it")
    if kept is None:
      extra = {"export_sha256": sha} if sha else {}
      records.write_files_record(s.records, job.spec, s.root, record_files(s, job),
                                 records.code_version(sweep.REPO), extra)
      say(f"  {job.spec}: record {path}")
    if s.commit_records and records.commit_record(path, f"coreact study: record of {job.spec}"):
      say(f"  {job.spec}: record committed")
  except (OSError, ValueError, RuntimeError) as e:
    say(f"  {job.spec}: its record could not be kept ({type(e).__name__}: {e})")


def recorded_done(s: Settings, todo: Sequence[Job]) -> set[str]:
  """The jobs that need not run: those whose outputs exist, and those with a record unless a job
  that must still run needs one of their outputs that the record does not keep (a generator's
  export: then the job runs again)."""
  from agentjax.studies import records
  kept = {j.spec for j in todo
          if s.records and os.path.exists(records.files_record_path(s.records, j.spec))}
  done = {j.spec for j in todo if _done(j) or j.spec in kept}
  while True:
    missing = {x for j in todo if j.spec not in done for x in j.needs if not os.path.exists(x)}
    undo = {j.spec for j in todo
            if j.spec in done and not _done(j) and any(x in missing for x in j.done)}
    if not undo:
      return done
    done -= undo


def restore_records(s: Settings, root: str | None = None) -> int:
  """Every record's files laid out under `root` (default s.root) where missing; returns how
  many files were written."""
  from agentjax.studies import records
  folder = os.path.join(s.records, records.RECORDS)
  n = 0
  for dirpath, _, names in os.walk(folder):
    for name in sorted(names):
      if name.endswith(".json.gz"):
        n += len(records.restore_files(os.path.join(dirpath, name), root or s.root))
  return n


def schedule(todo: Sequence[Job], root: str, workers: int,
             s: Settings | None = None) -> dict[str, str]:
  """Runs the jobs not done, at most `workers` at once, each as soon as its inputs exist (in list
  order among the ready ones). A failed run is not retried here; its dependents stay waiting.
  With s.records: the records' files are restored first, a job with a record counts as done
  (recorded_done) and each job's record is kept as it ends (keep_record).
  Returns {spec: "ok" | "failed (exit N)" | "taken" (claimed elsewhere) | "waiting on ..."}."""
  if s is not None and s.records:
    say(f"restored {restore_records(s)} file(s) from the records under {s.records}")
    for j in todo:  # finished while no scheduler could record it
      keep_record(s, j)
    done = recorded_done(s, todo)
  else:
    done = {j.spec for j in todo if _done(j)}
  pending = [j for j in todo if j.spec not in done]
  status: dict[str, str] = {j.spec: "done" for j in todo if j.spec in done}
  running: dict[concurrent.futures.Future, Job] = {}
  sweep.free_cores(workers)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    while True:
      for j in [j for j in pending if all(os.path.exists(x) for x in j.needs)]:
        if len(running) >= workers:
          break
        pending.remove(j)
        log = _log(root, j.spec)
        with open(log, "a") as f:  # the command beside its output, for the README's record
          f.write("$ " + command_line(j) + "\n")
        say(f"start {j.spec}")
        running[pool.submit(sweep.run_claimed, j.spec, j.done, j.cmd, log, root)] = j
      if not running:
        break
      finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in finished:
        j = running.pop(future)
        _, rc, secs = future.result()
        status[j.spec] = "taken" if rc is None else "ok" if rc == 0 else f"failed (exit {rc})"
        say(f"  {j.spec}: {status[j.spec]} in {secs / 60:.1f} min"
                     + ("" if not rc else f"; log {_log(root, j.spec)}"))
        if s is not None and rc == 0:
          keep_record(s, j)
  for j in pending:
    missing = [x for x in j.needs if not os.path.exists(x)]
    status[j.spec] = "waiting on " + ", ".join(missing)
    say(f"  {j.spec}: {status[j.spec]}")
  return status


# ============================================================================ report

def _nan_mean(xs: Sequence[float]) -> float:
  xs = [x for x in xs if x is not None and not math.isnan(x)]
  return sum(xs) / len(xs) if xs else float("nan")


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
  """Tie-aware Spearman of two rankings (agentjax.rl.ranking.spearman: the study's one
  definition); nan when one is constant."""
  import numpy as np
  from agentjax.rl import ranking
  return float(ranking.spearman(np.asarray(a, np.float32), np.asarray(b, np.float32)))


def branch_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """A branch-point file's summary: rows, questions, candidates per row and distinct ones
  (normalized: case and whitespace), judge agreement = mean over rows of the mean Spearman over
  judge pairs (pairs with a constant ranking left out; their share reported), the share of rows
  whose expert (Borda) ranking has a tie and the share of judge rankings with a tie, the share
  of candidates that answer and, with the oracle's "values", the share of rows whose values tie
  and the mean Spearman of the expert ranking against the values' order."""
  if not rows:
    return {"rows": 0}
  questions = {str(r.get("id", "")).rsplit("/", 1)[0] for r in rows}
  k = [len(r["candidates"]) for r in rows]
  from agentjax.rl.ranking import normalize_text  # the collector's dedup comparison
  distinct = [len({normalize_text(c) for c in r["candidates"]}) for r in rows]
  agreement, undefined, pairs = [], 0, 0
  judge_ties, judge_n = 0, 0
  for r in rows:
    js = r.get("judge_rankings") or []
    row = []
    for i in range(len(js)):
      judge_ties += len(set(js[i])) < len(js[i])
      judge_n += 1
      for j in range(i + 1, len(js)):
        pairs += 1
        rho = _spearman(js[i], js[j])
        if math.isnan(rho):
          undefined += 1
        else:
          row.append(rho)
    if row:
      agreement.append(sum(row) / len(row))
  expert_ties = [len(set(r["expert_ranking"])) < len(r["expert_ranking"]) for r in rows]
  answers = [("<answer>" in c) for r in rows for c in r["candidates"]]
  # The oracle's noiseless values (when recorded): how often they tie (the judges' noise then
  # decides the order) and how well the consensus recovers their order (rank 1 = highest value).
  valued = [r for r in rows if r.get("values")]
  value_stats = {}
  if valued:
    value_stats = {
        "value_tie_share": sum(len(set(r["values"])) < len(r["values"]) for r in valued)
        / len(valued),
        "expert_vs_values": _nan_mean([_spearman(r["expert_ranking"], [-v for v in r["values"]])
                                       for r in valued])}
  return {"rows": len(rows), "questions": len(questions),
          "judges": max(len(r.get("judge_rankings") or []) for r in rows),
          "candidates_mean": sum(k) / len(k), "distinct_mean": sum(distinct) / len(distinct),
          "judge_spearman": _nan_mean(agreement),
          "judge_pairs_undefined": undefined / pairs if pairs else float("nan"),
          "expert_tie_share": sum(expert_ties) / len(rows),
          "judge_tie_share": judge_ties / judge_n if judge_n else float("nan"),
          "answer_share": sum(answers) / len(answers), **value_stats}


def _ms(xs: Sequence[float]) -> tuple[float, float] | None:
  xs = [x for x in xs if x is not None and not math.isnan(x)]
  return mean_std(xs) if xs else None


def grpo_summary(runs: Mapping[str, Mapping[int, Mapping[int, Mapping[str, Any]]]],
                 train: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]] | None = None
                 ) -> dict[str, Any]:
  """{reward: {seed: {step: eval json}}} -> {reward: {"seeds", "steps", key: {"before",
  "after", "delta" (mean, std over seeds; delta paired by seed), "per_seed": {seed: [before,
  after]}, "curve": {step: (mean, std)}}}} for SUMMARY_KEYS (a key an eval lacks: None); before
  = step 0, after = the last step every seed reached. With `train` ({reward: {seed: metrics.jsonl
  rows}}), TRAIN_KEYS likewise: before = the mean of the first WINDOW steps, after = of the last
  WINDOW steps (the sampled rubrics of training, not the greedy held-out ones)."""
  out = {}
  for reward, by_seed in runs.items():
    if not by_seed:
      continue
    last = min(max(evals) for evals in by_seed.values())
    steps = sorted(set.intersection(*(set(e) for e in by_seed.values())))
    entry: dict[str, Any] = {"seeds": sorted(by_seed), "steps": steps, "last_step": last}
    for key in SUMMARY_KEYS:
      per_seed = {seed: [e[0].get(key) if 0 in e else None, e[last].get(key)]
                  for seed, e in by_seed.items()}
      entry[key] = _before_after(per_seed)
      entry[key]["curve"] = {t: _ms([e[t].get(key) for e in by_seed.values()]) for t in steps}
    for key, field in TRAIN_KEYS:
      rows = {seed: [m[field] for m in ms if field in m]
              for seed, ms in ((train or {}).get(reward) or {}).items()}
      per_seed = {seed: [sum(v[:WINDOW]) / len(v[:WINDOW]),
                         sum(v[-WINDOW:]) / len(v[-WINDOW:])]
                  for seed, v in rows.items() if v}
      if per_seed:
        entry[key] = _before_after(per_seed)
    out[reward] = entry
  return out


def _before_after(per_seed: Mapping[int, Sequence[float | None]]) -> dict[str, Any]:
  before = [v[0] for v in per_seed.values()]
  after = [v[1] for v in per_seed.values()]
  delta = [b - a for a, b in zip(before, after) if a is not None and b is not None]
  return {"before": _ms(before), "after": _ms(after), "delta": _ms(delta),
          "per_seed": dict(per_seed)}


def redundant_query_rate(queries: Sequence[Sequence[str]]) -> float:
  """Share of search queries (pooled over trajectories) that repeat an earlier query of the same
  trajectory (normalized as rollout.search_stats normalizes them: protocol.normalize_text);
  nan with no query."""
  from agentjax.agent.protocol import normalize_text
  total = repeats = 0
  for qs in queries:
    seen: set[str] = set()
    for q in qs:
      q = normalize_text(q)
      total += 1
      repeats += q in seen
      seen.add(q)
  return repeats / total if total else float("nan")


def _queries(row: Mapping[str, Any]) -> list[str] | None:
  """A per-question row's search queries (eval rows carry "queries"; else parsed from "turns"
  texts when those are listed), or None when the row has neither."""
  if "queries" in row:
    return list(row["queries"])
  texts = row.get("texts") or row.get("turn_texts")
  if texts is None:
    return None
  from agentjax.agent.protocol import SEARCH, SEARCH_R1, parse_action  # the rollout's parser
  return [a.content for a in (parse_action(SEARCH_R1, t) for t in texts) if a.kind == SEARCH]


def guided_scores(result: Mapping[str, Any]) -> dict[str, float]:
  """One guided eval (launch/eval.py JSON) -> GUIDED_KEYS: F1, EM, the redundant-query rate,
  steps to answer (mean turns of the answered rollouts), the answered share, verify retries per
  step (over every turn), the share of verified steps retried and the mean verify score (the
  guided agent's counts; nan where the eval does not record them)."""
  rows = [r for b in result.get("per_question", {}).values() for r in b] \
      if isinstance(result.get("per_question"), Mapping) else list(result.get("per_question", []))
  if not rows:
    overall = result.get("overall", {})
    return {"f1": overall.get("f1", float("nan")), "em": overall.get("em", float("nan")),
            **{k: float("nan") for k in GUIDED_KEYS[2:]}}
  if all("searches" in r for r in rows):  # launch/eval.py's counts (rollout.search_stats)
    searches = sum(r["searches"] for r in rows)
    redundant = sum(r["redundant_searches"] for r in rows) / searches if searches \
        else float("nan")
  else:
    queries = [_queries(r) for r in rows]
    redundant = redundant_query_rate(queries) if all(q is not None for q in queries) \
        else float("nan")
  answered = [r for r in rows if r.get("answer") is not None]
  # The guided agent's counts (launch/eval.py: result["agent"]["stats"], summed over its rollouts;
  # the eval batch holds exactly the questions when eval_size is a multiple of it).
  stats = (result.get("agent") or {}).get("stats") or {}
  turns = sum(r["turns"] for r in rows)
  retries = stats.get("verify_retries")
  checks = stats.get("verify_checks")
  return {"f1": sum(r["f1"] for r in rows) / len(rows),
          "em": sum(r["em"] for r in rows) / len(rows),
          "redundant_query_rate": redundant,
          "steps_to_answer": sum(r["turns"] for r in answered) / len(answered)
          if answered else float("nan"),
          "answered": len(answered) / len(rows),
          "retries_per_step": retries / turns if checks and turns else float("nan"),
          "retry_share": retries / checks if retries is not None and checks else float("nan"),
          "verify_score": float("nan") if stats.get("verify_score_mean") is None
          else float(stats["verify_score_mean"])}


def guided_summary(results: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any]:
  """{variant: {seed: eval json}} -> {variant: {"seeds", key: (mean, std) over seeds,
  "per_seed": {seed: scores}, "f1_vs_react": (mean, std) of the F1 difference to react's run of
  the same agent seed (seeds both have)}}."""
  out = {}
  for variant, by_seed in results.items():
    if not by_seed:
      continue
    per_seed = {seed: guided_scores(r) for seed, r in sorted(by_seed.items())}
    out[variant] = {"seeds": sorted(per_seed), "per_seed": per_seed,
                    **{k: _ms([s[k] for s in per_seed.values()]) for k in GUIDED_KEYS}}
  react = out.get("react", {}).get("per_seed", {})
  for g in out.values():
    g["f1_vs_react"] = _ms([x["f1"] - react[seed]["f1"] for seed, x in g["per_seed"].items()
                            if seed in react])
  return out


def guided_paired(results: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[dict]:
  """Test F1 paired per question (the same test questions and agent seed), pooled over seeds
  (reporting.paired_pooled), with the seed-level test (paired_by_seed) beside it: every variant
  against ReAct, then the comparisons of PAIRED. [{"reference", "variant", "pooled",
  "by_seed"}]."""
  f1s = {v: {seed: f1_by_id(r) for seed, r in by_seed.items()}
         for v, by_seed in results.items() if by_seed}
  return [{"reference": a, "variant": b, "pooled": paired_pooled(f1s[a], f1s[b]),
           "by_seed": paired_by_seed(f1s[a], f1s[b])}
          for a, b in [("react", v) for v in f1s if v != "react"] + list(PAIRED)
          if a in f1s and b in f1s]


# The comparisons beside "every variant vs ReAct" (reference, variant): rubric vs self-score
# Best-of-N, the other rewards' generators vs the list-wise one, verify vs the suffix alone.
PAIRED = (("bon_self", "bon_rubric"), ("coreact_listwise_verify", "coreact_pairwise_verify"),
          ("coreact_listwise_verify", "coreact_top1_verify"),
          ("coreact_trained", "coreact_listwise_verify"))


def f1_by_id(result: Mapping[str, Any]) -> dict[str, float]:
  """{question id: F1} of a guided eval (launch/eval.py JSON; one sample a question)."""
  rows = [r for b in result.get("per_question", {}).values() for r in b] \
      if isinstance(result.get("per_question"), Mapping) else list(result.get("per_question", []))
  return {str(r["id"]): float(r["f1"]) for r in rows}


def fixed_rubrics(phrases: Sequence[str], size: int = 3) -> list[str]:
  """Context-free reference rubrics: every `size`-subset of the executor's vocabulary, in its
  order, with equal positive weights summing to 1 (two decimals, the last one takes the rest)."""
  out = []
  for combo in itertools.combinations(phrases, size):
    w = [round(1 / size, 2)] * (size - 1)
    w.append(round(1 - sum(w), 2))
    out.append("\n".join(f"{i + 1}. [{x:.2f}] {p[0].upper()}{p[1:]}"
                         for i, (x, p) in enumerate(zip(w, combo))))
  return out


def references(s: Settings, rows: Mapping[str, Sequence[Mapping[str, Any]]]
               ) -> dict[str, Any]:
  """What the held-out scores can be read against, with the list-wise reward's settings and the
  executor applier: every context-free 3-criterion rubric (fixed_rubrics) scored on every row, the
  best one on train (its train and dev scores) and their mean on dev; and the ceiling of a
  predictor that knows the oracle's noiseless values (rank by value; a row whose values all tie
  gets no agreement, 0, as the eval counts a nan Spearman)."""
  import numpy as np
  import configs.coreact as coreact_configs
  from agentjax.coreact.appliers import ExecutorApplier
  from agentjax.coreact.executor import CRITERION_PHRASES
  from agentjax.coreact.rubric import RewardSettings
  from agentjax.coreact.task import RubricRewards, rubric_agreement
  from agentjax.rl import ranking
  config = coreact_configs.get_config(preset(s, "demo"))  # the study's GRPO preset
  rewards = RubricRewards(ExecutorApplier.from_path(_world(s)["coreact.entities_path"]),
                          RewardSettings.from_config(config.coreact))
  keys = ("spearman", "pairwise", "top1", "reward")
  scored = {}
  for text in fixed_rubrics(CRITERION_PHRASES):
    scored[text] = {split: {k: v for k, v in rubric_agreement(
        [text] * len(r), list(r), rewards)[0].items() if k in keys}
        for split, r in rows.items() if r}
  out: dict[str, Any] = {"fixed_rubrics": len(scored)}
  if "train" in rows and rows["train"]:
    best = max(scored, key=lambda t: scored[t]["train"]["spearman"])
    out["best_fixed"] = {"rubric": best, **scored[best]}
  if "dev" in rows and rows["dev"]:
    out["mean_fixed_dev"] = {k: float(np.mean([v["dev"][k] for v in scored.values()]))
                             for k in keys}
    ceiling = []
    for r in rows["dev"]:
      rho = float(ranking.spearman(np.asarray(r["expert_ranking"], np.float32),
                                   -np.asarray(r["values"], np.float32))) \
          if r.get("values") else float("nan")
      ceiling.append(0.0 if math.isnan(rho) else rho)
    out["value_ceiling_dev"] = float(np.mean(ceiling))
  return out


def categorical(s: Settings, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
  """List-wise vs pairwise vs top-1 on a categorical policy over the fixed rubrics
  (studies.rubric_bandit: every reward arm with every seed of the study, same settings), on the
  train and dev branch points, with the reward's settings and the executor applier."""
  import configs.coreact as coreact_configs
  from agentjax.coreact.appliers import ExecutorApplier
  from agentjax.coreact.executor import CRITERION_PHRASES
  from agentjax.coreact.rubric import RewardSettings
  from agentjax.studies import rubric_bandit
  settings = RewardSettings.from_config(coreact_configs.get_config("demo").coreact)
  applier = ExecutorApplier.from_path(_world(s)["coreact.entities_path"])
  rubrics = fixed_rubrics(CRITERION_PHRASES)
  tables = {split: rubric_bandit.reward_tables(rubrics, rows[split], settings, applier)
            for split in ("train", "dev")}
  return {**rubric_bandit.bandit_study(tables["train"], tables["dev"], s.seeds,
                                       rubric_bandit.BanditSettings()),
          "rubrics": len(rubrics)}


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def gather(s: Settings) -> dict[str, Any]:
  """Every finished output under s.root."""
  p = paths(s.root)
  grpo: dict[str, dict[int, dict[int, dict]]] = {}
  train: dict[str, dict[int, list[dict]]] = {}
  for reward in grpo_names(s):
    for seed in s.seeds:
      folder = os.path.join(grpo_dir(s.root, reward, seed), "eval")
      if not os.path.exists(os.path.join(folder, f"{s.steps}.json")):
        continue
      evals = {int(n[:-5]): read_json(os.path.join(folder, n))
               for n in os.listdir(folder) if re.fullmatch(r"\d+\.json", n)}
      grpo.setdefault(reward, {})[seed] = {t: e for t, e in evals.items() if t <= s.steps}
      train.setdefault(reward, {})[seed] = [
          m for m in _read_jsonl(os.path.join(grpo_dir(s.root, reward, seed), "metrics.jsonl"))
          if "reward" in m and m.get("step", 0) <= s.steps]
  guided: dict[str, dict[int, dict]] = {}
  for variant in s.variants:
    for seed in s.seeds:
      r = read_json(guided_path(s.root, variant, seed))
      if r is not None:
        guided.setdefault(variant, {})[seed] = r
  sft_metrics = _read_jsonl(os.path.join(p["sft"], "metrics.jsonl"))
  rows = {split: _read_jsonl(p[split]) for split in ("train", "dev")}
  # The references take a minute (84 rubrics x every row): kept beside the branch points they
  # were computed from, recomputed when those change.
  cache = os.path.join(s.root, "references.json")
  stamp = [os.path.getmtime(p[x]) if os.path.exists(p[x]) else None for x in ("train", "dev")]
  refs = read_json(cache)
  if refs is None or refs.get("stamp") != stamp:
    refs = dict(references(s, rows), stamp=stamp) if rows["dev"] else {"stamp": stamp}
    write_json(cache, refs)
  # The categorical policy's comparison of the rank rewards (rubric_bandit: seconds once the
  # tables are built), cached like the references.
  cache = os.path.join(s.root, "categorical.json")
  bandit = read_json(cache)
  if (bandit is None or bandit.get("stamp") != stamp or bandit.get("seeds") != list(s.seeds)) \
      and rows["train"] and rows["dev"]:
    bandit = dict(categorical(s, rows), stamp=stamp)
    write_json(cache, bandit)
  return {"branches": {split: branch_stats(r) for split, r in rows.items()},
          "references": {k: v for k, v in refs.items() if k != "stamp"},
          "categorical": {k: v for k, v in (bandit or {}).items() if k != "stamp"},
          "demos": len(_read_jsonl(p["demos"])),
          "sft_last": sft_metrics[-1] if sft_metrics else None,
          "grpo": grpo_summary(grpo, train), "guided": guided_summary(guided),
          "guided_paired": guided_paired(guided)}


def _pm(ms, digits: int = 3, sign: str = "") -> str:
  if ms is None:
    return "—"
  m, sd = ms
  if math.isnan(m):
    return "—"
  return f"{m:{sign}.{digits}f}" + ("" if math.isnan(sd) else f" ± {sd:.{digits}f}")


def _f(x, digits: int = 3) -> str:
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def tables(study: Mapping[str, Any]) -> str:
  """The report's tables (markdown)."""
  lines = ["### Branch points (S1)", "",
           "| split | rows | questions | candidates / row | distinct / row | judges | "
           "judge agreement (mean pairwise Spearman) | undefined judge pairs | rows with an "
           "expert tie | judge rankings with a tie | answers among candidates | rows whose "
           "oracle values tie | expert vs noiseless values (Spearman) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for split, b in study["branches"].items():
    if not b.get("rows"):
      lines.append(f"| {split} | 0 |" + " |" * 11)
      continue
    lines.append(f"| {split} | {b['rows']} | {b['questions']} | {_f(b['candidates_mean'], 2)} | "
                 f"{_f(b['distinct_mean'], 2)} | {b['judges']} | {_f(b['judge_spearman'])} | "
                 f"{_f(b['judge_pairs_undefined'])} | {_f(b['expert_tie_share'])} | "
                 f"{_f(b['judge_tie_share'])} | {_f(b['answer_share'])} | "
                 f"{_f(b.get('value_tie_share'))} | {_f(b.get('expert_vs_values'))} |")
  cat = study.get("categorical") or {}
  if cat.get("arms"):
    st, ceil = cat["settings"], cat["ceilings_dev"]
    lines += ["", "### List-wise vs pairwise vs top-1 on a categorical policy (S2b)", "",
              f"A softmax per phase (step 0, 1, 2, >= 3) over the {cat['rubrics']} fixed "
              f"rubrics, trained on the train branch points with each rank reward ({st['steps']} "
              f"steps of {st['rows']} rows x {st['group']} rubrics, GRPO advantages, lr "
              f"{st['lr']:g}; agentjax/studies/rubric_bandit.py); the greedy rubric per phase "
              f"scored on dev. Seeds {', '.join(map(str, cat['seeds']))}; mean ± sample std. "
              f"Ceilings on dev: best single rubric {_f(ceil['best_fixed'])}, best per phase "
              f"{_f(ceil['best_per_phase'])} (list-wise Spearman).", "",
              "| trained on | dev Spearman | dev pairwise | dev top-1 | Spearman − list-wise "
              "(per seed) |", "|---|---|---|---|---|"]
    for arm, res in cat["arms"].items():
      m = res["mean"]
      paired = ", ".join(f"{d:+.3f}" for d in cat["paired"].get(arm, [])) or "—"
      lines.append(f"| {arm} | {_pm(m['spearman'])} | {_pm(m['pairwise'])} | "
                   f"{_pm(m['top1'])} | {paired} |")
  lines += ["", "### Rubric generator on the held-out branch points (S3)", "",
            "Mean ± sample std over seeds; before = step 0 (the warm start), after = the last "
            "step; Δ paired by seed. Held-out rubrics are greedy; `repetitive` is the share the "
            "4-gram gate zeroes. `train_reward` / `train_spearman`: the sampled rubrics of "
            f"training (temperature 1), mean of the first vs the last {WINDOW} steps.",
            "",
            "| reward | seeds | metric | before | after | Δ | per seed (before → after) |",
            "|---|---|---|---|---|---|---|"]
  for reward, g in study["grpo"].items():
    for key in SUMMARY_KEYS + tuple(k for k, _ in TRAIN_KEYS):
      if key not in g:
        continue
      e = g[key]
      per = ", ".join(f"{s}: {_f(v[0])} → {_f(v[1])}" for s, v in sorted(e["per_seed"].items()))
      lines.append(f"| {reward} | {len(g['seeds'])} | {key} | {_pm(e['before'])} | "
                   f"{_pm(e['after'])} | {_pm(e['delta'], sign='+')} | {per} |")
  refs = study.get("references") or {}
  if refs.get("best_fixed"):
    b, m = refs["best_fixed"], refs["mean_fixed_dev"]
    lines += ["", "References on the same held-out rows (executor applier, no model):", "",
              "| reference | Spearman | pairwise | top1 | reward |", "|---|---|---|---|---|",
              f"| best context-free rubric on train ({refs['fixed_rubrics']} tried), on dev | "
              + " | ".join(_f(b["dev"][k]) for k in EVAL_KEYS) + " |",
              f"| mean of the {refs['fixed_rubrics']} context-free rubrics, on dev | "
              + " | ".join(_f(m[k]) for k in EVAL_KEYS) + " |",
              f"| ranking by the oracle's noiseless values (ceiling), on dev | "
              f"{_f(refs['value_ceiling_dev'])} | | | |", "",
              "The best context-free rubric: " + " / ".join(b["rubric"].splitlines()) + "."]
  lines += ["", "### Guided inference on SynthWorld test (S4)", "",
            "Mean ± sample std over agent seeds.", "",
            "| variant | seeds | F1 | F1 − react (paired by seed) | EM | redundant-query rate | "
            "steps to answer | answered | verify retries / step | verified steps retried | "
            "mean verify score |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for variant, g in study["guided"].items():
    lines.append(f"| {variant} | {len(g['seeds'])} | {_pm(g['f1'])} | "
                 f"{_pm(g['f1_vs_react'], sign='+')} | {_pm(g['em'])} | "
                 f"{_pm(g['redundant_query_rate'])} | {_pm(g['steps_to_answer'], 2)} | "
                 f"{_pm(g['answered'])} | {_pm(g['retries_per_step'])} | "
                 f"{_pm(g['retry_share'])} | {_pm(g['verify_score'])} |")
  if study.get("guided_paired"):
    lines += ["", "Test F1 paired per question (same questions, same agent seed), pooled over "
              "seeds: the mean difference in points, its standard error over the (seed, "
              "question) pairs and two-sided p; by seed: Student's t over the seeds' mean "
              "differences.", "",
              "| variant | against | pairs | F1 difference (points) | stderr | p | by seed: "
              "seeds, t, p |", "|---|---|---|---|---|---|---|"]
    for c in study["guided_paired"]:
      v, b = c["pooled"], c["by_seed"]
      lines.append(f"| {c['variant']} | {c['reference']} | {v['pairs']} | "
                   f"{_f(100 * v['mean'], 2)} | {_f(100 * v['stderr'], 2)} | {_f(v['p'])} | "
                   f"{b['seeds']}, {_f(b['t'], 2)}, {_f(b['p'])} |")
  return "\n".join(lines) + "\n"


def plot(study: Mapping[str, Any], out: str) -> list[str]:
  """spearman_vs_step.png (held-out Spearman per reward: mean over seeds, band min-max) and
  guided_f1.png (F1 and steps to answer per variant: mean, error bar = sample std over seeds,
  dots = seeds)."""
  from agentjax.plots import pyplot, save_figure
  plt = pyplot()
  written = []
  if study["grpo"]:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), squeeze=False)
    for ax, key in zip(axes[0], ("spearman", "pairwise", "top1")):
      for reward, g in study["grpo"].items():
        steps = g["steps"]
        curves = list(study["_curves"][reward][key].values())
        mean = [g[key]["curve"][t][0] for t in steps]
        line, = ax.plot(steps, mean, marker="o", label=f"{reward} reward ({len(curves)} seeds)")
        ax.fill_between(steps, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)],
                        alpha=0.15, color=line.get_color())
      ax.set_xlabel("GRPO step")
      ax.set_ylabel(f"held-out {key}")
      ax.set_title(f"held-out {key}: mean over seeds, band min-max")
      ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    path = os.path.join(out, "spearman_vs_step.png")
    save_figure(fig, path)
    written.append(path)
  if study["guided"]:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), squeeze=False)
    names = list(study["guided"])
    # (The redundant-query rate is 0 for every variant on the demo: its panel would be empty.)
    for ax, key in zip(axes[0], ("f1", "steps_to_answer")):
      means = [study["guided"][v][key][0] if study["guided"][v][key] else float("nan")
               for v in names]
      stds = [study["guided"][v][key][1] if study["guided"][v][key] else 0.0 for v in names]
      ax.bar(range(len(names)), means, yerr=[0.0 if math.isnan(x) else x for x in stds],
             capsize=4, alpha=0.7)
      for i, v in enumerate(names):
        ys = [s[key] for s in study["guided"][v]["per_seed"].values()]
        ax.plot([i] * len(ys), ys, "k.", alpha=0.6)
      ax.set_xticks(range(len(names)))
      ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
      ax.set_ylabel(f"test {key}")
      ax.set_title(f"{key}: mean, error bar = std over seeds, dots = seeds")
      ax.grid(alpha=0.3, axis="y")
    path = os.path.join(out, "guided_f1.png")
    save_figure(fig, path)
    written.append(path)
  return written


def seed_curves(s: Settings) -> dict[str, dict[str, dict[int, list[float]]]]:
  """{reward: {key: {seed: values at the common eval steps}}}, for the plot's bands."""
  out: dict = {}
  for reward in grpo_names(s):
    evals = {}
    for seed in s.seeds:
      folder = os.path.join(grpo_dir(s.root, reward, seed), "eval")
      if os.path.exists(os.path.join(folder, f"{s.steps}.json")):
        evals[seed] = {int(n[:-5]): read_json(os.path.join(folder, n))
                       for n in os.listdir(folder) if re.fullmatch(r"\d+\.json", n)}
    if not evals:
      continue
    steps = sorted(set.intersection(*(set(e) for e in evals.values())))
    out[reward] = {k: {seed: [e[t][k] for t in steps] for seed, e in evals.items()}
                   for k in EVAL_KEYS}
  return out


def report(s: Settings, out: str) -> dict[str, Any]:
  """results.json, the tables (results.md) and the plots under `out` (README.md is written by
  hand around results.md's tables). With s.records: from the records alone (their files laid
  out in a temporary folder), whatever s.root holds."""
  if not s.records:
    return _report(s, out, {j.spec: command_line(j) for j in jobs(s)}, dataclasses.asdict(s))
  import tempfile
  with tempfile.TemporaryDirectory(prefix="coreact_report_") as tmp:  # removed after
    say(f"the report reads {restore_records(s, tmp)} file(s) from the records under {s.records}")
    return _report(dataclasses.replace(s, root=tmp), out,
                   {j.spec: command_line(j) for j in jobs(s)}, dataclasses.asdict(s))


def _report(s: Settings, out: str, commands: Mapping[str, str],
            settings: Mapping[str, Any]) -> dict[str, Any]:
  """report's work on the outputs under s.root; commands and settings: the study's own (not
  the temporary folder's)."""
  study = gather(s)
  os.makedirs(out, exist_ok=True)
  study["_curves"] = seed_curves(s)
  written = plot(study, out)
  study.pop("_curves")
  text = tables(study)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(text)
  saved = {"study": "coreact", "settings": settings, "hardware": sweep.hardware(),
           "seed_band": "mean ± sample std over seeds (plots: min-max band)",
           "commands": commands, **study}
  write_json(os.path.join(out, "results.json"), no_nan(_keys_to_str(saved)))
  say(text)
  say("written: " + ", ".join([os.path.join(out, "results.json"),
                                        os.path.join(out, "results.md")] + written))
  return study


def _keys_to_str(obj):
  if isinstance(obj, dict):
    return {str(k): _keys_to_str(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_keys_to_str(v) for v in obj]
  return obj
