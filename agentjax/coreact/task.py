"""The rubric generator as a single-turn RL task (trainer = "rubric"; configs/coreact.py).

    records = branch_records(config.coreact.branches_train, "coreact.branches_train")
    rewards = RubricRewards.from_config(config)           # the applier, the reward settings
    outcome, metrics = rewards(batch, records_of_rows)    # [B] rewards, rubric/* metrics
    result = evaluate_rubrics(engine, params, dev, batch_size, rewards)   # held-out Spearman

A record is one branch point (launch/collect_branches.py): its "question" is the rubric
generator's whole prompt (rubric.rubric_prompt of the context: question, trajectory with <think>
stripped, phase hint), so the RL loop rolls it out with protocol "rubric" (one turn, the text is
the rubric) exactly as it rolls out a search question. The reward of a rubric (the official
code's compute_score, agentjax/coreact/rubric.py): the applier ranks the branch's K candidate
actions by the rubric, and that ranking is compared with the expert ranking (Borda over the
judges) by Spearman, plus the atomic and format terms, all zero under the repetition gate.

Every rubric of a step goes to the applier in one batched call (a server sees them in flight
together); a failed call scores that rubric's rank and atomic terms 0 (counted, never raised).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import (RewardSettings, fit_rubric_prompt, parse_rubric,
                                     rubric_prompt, rubric_reward)
from agentjax.jsonl import iter_json_objects
from agentjax.rl import ranking

log = logging.getLogger(__name__)

# The branch-point fields the task reads besides the context's.
BRANCH_FIELDS = ("candidates", "expert_ranking")


def branch_records(path: str, field: str, count_tokens: Callable[[str], int] | None = None,
                   room: int = 0) -> list[dict[str, Any]]:
  """The branch points of a JSONL file as RL records {"id", "question": the rubric prompt,
  "golden_answers": [], "branch": the row}.

  count_tokens, room: the prompt is fitted to `room` tokens as count_tokens counts them
  (rubric.fit_rubric_prompt, as the guided agent's generator fits it); None: not fitted.
  Raises ValueError naming `field` (the config entry), the file and the line of a malformed
  row: a missing field, a context that does not parse, K < 2 candidates, an expert ranking of
  another length, or a prompt that cannot fit."""
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise ValueError(f"config.{field}={path!r}: no such file (write it with "
                     f"launch/collect_branches.py)")
  out = []
  for line, row in iter_json_objects(path, ValueError, what="branch points"):
    where = f"config.{field}={path!r} line {line}"
    for key in BRANCH_FIELDS:
      if key not in row:
        raise ValueError(f"{where}: missing field {key!r}")
    try:
      ctx = BranchContext.from_json(row)
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from None
    k = len(row["candidates"])
    if k < 2 or len(row["expert_ranking"]) != k:
      raise ValueError(f"{where}: needs >= 2 candidates and an expert_ranking of the same length, "
                       f"got {k} and {len(row['expert_ranking'])}")
    prompt = rubric_prompt(ctx) if count_tokens is None else \
        fit_rubric_prompt(ctx, count_tokens, room)
    if prompt is None:
      raise ValueError(f"{where}: the rubric prompt does not fit {room} tokens even with its "
                       f"trajectory cut (rollout.max_total_tokens - rollout.max_new_tokens)")
    out.append({"id": str(row.get("id", f"line{line}")), "question": prompt,
                "golden_answers": [], "branch": row})
  if not out:
    raise ValueError(f"config.{field}={path!r}: no branch points")
  return out


def fitted_branch_records(config: Any, tokenizer: Any, field: str) -> list[dict[str, Any]]:
  """branch_records of config.<field> ("coreact.branches_train" / "coreact.branches_dev") with
  each prompt fitted to what the rubric rollout leaves for it (rollout.max_total_tokens -
  rollout.max_new_tokens - 1), counted as the rollout encodes it (protocol "rubric", the chat
  template per rollout.use_chat_template)."""
  from agentjax.agent.protocol import RUBRIC
  from agentjax.agent.rollout import prompt_ids
  r = config.rollout
  section, key = field.split(".")
  return branch_records(config[section][key], field,
                        lambda text: len(prompt_ids(tokenizer, RUBRIC, text, r.use_chat_template)),
                        r.max_total_tokens - r.max_new_tokens - 1)


@dataclasses.dataclass
class RubricRewards:
  """The rubric reward of each rollout row, applier calls batched per step.

  eos_texts: the policy's EOS tokens as text. A turn's text is decoded from every sampled id, the
  final EOS included; the rubric scored (and its repeat gate) is the response without it, as
  verl decodes responses without special tokens and as the guided agent's generator (a
  Completer) returns it.
  """
  applier: Any
  settings: RewardSettings
  eos_texts: tuple[str, ...] = ()

  @classmethod
  def from_config(cls, config: Any, mesh: Any = None, engine: Any = None) -> "RubricRewards":
    """The applier and settings of config.coreact; with the generator's rollout `engine`, its EOS
    texts."""
    from agentjax.coreact.appliers import build_applier
    eos = () if engine is None else tuple(engine.decode([int(i)])
                                          for i in np.asarray(engine.eos_ids))
    return cls(build_applier(config, mesh=mesh), RewardSettings.from_config(config.coreact), eos)

  def score(self, texts: Sequence[str], branches: Sequence[Mapping[str, Any]]
            ) -> tuple[list[Any], list[Any]]:
    """(RubricScore, the applier's Applied or None) of each (rubric text, branch row); one
    applier call for all of them."""
    rubrics = [parse_rubric(t) for t in texts]
    contexts = [BranchContext.from_json(b) for b in branches]
    candidates = [tuple(b["candidates"]) for b in branches]
    # Rubrics with < 2 items score 0 on the rank terms whatever the applier says: not sent.
    ask = [i for i, r in enumerate(rubrics) if r.n >= 2]
    applied: list[Any] = [None] * len(texts)
    if ask:
      got = self.applier.rank([rubrics[i] for i in ask], [contexts[i] for i in ask],
                              [candidates[i] for i in ask])
      for i, a in zip(ask, got):
        applied[i] = a
    return [rubric_reward(t, b["expert_ranking"], a, self.settings)
            for t, b, a in zip(texts, branches, applied)], applied

  def __call__(self, batch: Any, questions: Sequence[Mapping[str, Any]]
               ) -> tuple[np.ndarray, dict[str, float]]:
    """(rewards [B] float32, metrics) of a rollout of records (row b answers
    questions[batch.group_ids[b]])."""
    texts = [_output(batch, b, self.eos_texts) for b in range(len(batch.group_ids))]
    branches = [questions[g]["branch"] for g in batch.group_ids]
    scores, _ = self.score(texts, branches)
    return np.array([s.reward for s in scores], np.float32), summarize_scores(scores, "rubric/")

  # The task's eval in the RL loop: what it logs (eval/<score>), and the progress bar's keys.
  eval_scores = ("spearman", "reward", "pairwise", "top1", "format", "atomic")
  progress = ("reward", "rubric/spearman", "kl", "step_s")

  def evaluate(self, engine: Any, params: Any, records: Sequence[Mapping[str, Any]],
               batch_size: int) -> dict[str, Any]:
    """The rubric generator's held-out scores: greedy rubrics of the dev branch points
    (evaluate_rubrics)."""
    return evaluate_rubrics(engine, params, records, batch_size, self)

  def describe(self, result: Mapping[str, Any]) -> str:
    return (f"{result['n']} held-out branch points: Spearman {result['spearman']:.4f} "
            f"reward {result['reward']:.4f}")


def _output(batch: Any, b: int, eos_texts: Sequence[str] = ()) -> str:
  """Row b's generated text without a final EOS token: its answer, or the raw text of its one
  turn when none parsed."""
  if batch.answered[b]:
    text = str(batch.answers[b])
  else:
    turns = batch.turns[b]
    text = turns[0].text if turns else ""
  for eos in eos_texts:
    if eos and text.endswith(eos):
      return text[:-len(eos)].rstrip()
  return text


def summarize_scores(scores: Sequence[Any], prefix: str = "") -> dict[str, float]:
  """Means over RubricScores: reward, spearman (rho, NaN counted as 0: no agreement), the terms,
  repetitive / applier-failure rates, items per rubric."""
  if not scores:
    return {}
  rho = np.array([s.rho for s in scores], np.float64)
  return {f"{prefix}reward": float(np.mean([s.reward for s in scores])),
          f"{prefix}spearman": float(np.mean(np.nan_to_num(rho, nan=0.0))),
          f"{prefix}rank_term": float(np.mean([s.rank_term for s in scores])),
          f"{prefix}atomic": float(np.mean([s.atomic_term for s in scores])),
          f"{prefix}format": float(np.mean([s.format_term for s in scores])),
          f"{prefix}repetitive": float(np.mean([s.repetitive for s in scores])),
          f"{prefix}applier_failures": float(np.mean([
              (not s.applier_ok) and s.n_items >= 2 and not s.repetitive for s in scores])),
          f"{prefix}items": float(np.mean([s.n_items for s in scores]))}


def evaluate_rubrics(engine: Any, params: Any, records: Sequence[Mapping[str, Any]],
                     batch_size: int, rewards: RubricRewards, *, samples: int = 1,
                     seed: int = 0) -> dict[str, Any]:
  """The rubric generator's held-out scores: `samples` rubrics per branch point from `engine`
  (greedy for the trainer's eval; sampled engines draw sample s of batch b from
  fold_in(fold_in(key(seed), b), s)), scored by `rewards`; plus pairwise accuracy and top-1
  match of the induced rankings. Means are over every (branch point, sample).

  Returns {"n" (branch points), "samples", "reward", "spearman", "rank_term", "atomic",
  "format", "repetitive", "applier_failures", "items", "pairwise", "top1", "per_question":
  [{"id", "sample", "rubric", "reward", "spearman"}] (branch-major)}. The last batch is padded
  (repeating its last record) to one compiled shape."""
  import jax
  if samples < 1:
    raise ValueError(f"samples must be >= 1, got {samples}")
  texts: list[list[str]] = [[] for _ in records]
  root = jax.random.key(seed)
  for index, start in enumerate(range(0, len(records), batch_size)):
    chunk = list(records[start:start + batch_size])
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_size - real)
    for sample in range(samples):
      rng = jax.random.fold_in(jax.random.fold_in(root, index), sample)
      batch, _ = engine.run(params, [r["question"] for r in chunk], rng)
      for b in range(real):
        texts[start + b].append(_output(batch, b, rewards.eos_texts))
  flat = [t for row in texts for t in row]
  branches = [r["branch"] for r in records for _ in range(samples)]
  result, scores = rubric_agreement(flat, branches, rewards)
  result["n"], result["samples"] = len(records), samples
  result["per_question"] = [
      {"id": records[i // samples]["id"], "sample": i % samples, "rubric": t, "reward": s.reward,
       "spearman": None if np.isnan(s.rho) else float(s.rho)}
      for i, (t, s) in enumerate(zip(flat, scores))]
  return result


def rubric_agreement(texts: Sequence[str], branches: Sequence[Mapping[str, Any]],
                     rewards: RubricRewards) -> tuple[dict[str, Any], list[Any]]:
  """({"n", summarize_scores' means, "pairwise", "top1"}, the RubricScores) of one rubric text
  per branch row: evaluate_rubrics' scores of given texts (also for fixed reference rubrics)."""
  scores, applied = rewards.score(texts, branches)
  result = dict(n=len(branches), **summarize_scores(scores))
  pair, top = [], []
  for s, a, b in zip(scores, applied, branches):
    expert = np.asarray(b["expert_ranking"], np.float32)
    if a is None or s.repetitive:  # no induced ranking: no agreement
      pair.append(0.0)
      top.append(0.0)
      continue
    pred = np.asarray(a.ranking, np.float32)
    pair.append(float(np.nan_to_num(ranking.pairwise_accuracy(pred, expert, 0.5), nan=0.5)))
    top.append(float(ranking.top1_match(pred, expert)))
  result["pairwise"] = float(np.mean(pair))
  result["top1"] = float(np.mean(top))
  return result, scores


def evaluate_generator(config: Any, engine: Any, params: Any, tokenizer: Any, mesh: Any,
                       source: str, samples: int, temperature: float | None) -> dict[str, Any]:
  """Co-ReAct's rubric generator on config.coreact.branches_dev (evaluate_rubrics; prompts
  fitted as the trainer fits them): what launch/eval.py reports for a trainer "rubric" run.
  {"source", "split": the file, "samples", "temperature", "seed", "rubric": evaluate_rubrics'
  result}."""
  from agentjax.parallel import use_mesh
  records = fitted_branch_records(config, tokenizer, "coreact.branches_dev")
  if config.data.eval_size:
    records = records[:config.data.eval_size]
  rewards = RubricRewards.from_config(config, mesh=mesh, engine=engine)
  with use_mesh(mesh):
    result = evaluate_rubrics(engine, params, records, config.train.eval_batch, rewards,
                              samples=samples, seed=config.seed)
  log.info("rubric generator %s on %d held-out branch points x %d samples: Spearman %.4f "
           "reward %.4f", source, result["n"], samples, result["spearman"], result["reward"])
  return {"source": source, "split": config.coreact.branches_dev, "samples": samples,
          "temperature": temperature, "seed": int(config.seed), "rubric": result}
