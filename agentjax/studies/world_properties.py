"""What a world offers credit assignment, measured on a policy's sampled rollouts before any RL
(`python launch/backbone.py --stages=properties`).

    props = measure(config, hf_path, questions=200)      # -> {root}/backbone/properties.json

On rollouts of the SFT backbone (config's rollout settings: sampled, group_size per question) of
the first `questions` dev questions:

  rounds_per_correct     search rounds per correct (EM > 0) trajectory (goal >= 2: credit can
                         only be assigned among rounds if correct trajectories have several)
  contribution_share     the oracle judge's share of judged non-answer rounds that contribute
                         (CW-GRPO's c = retrieval x thinking; goal < 0.7: some searches are
                         wasted), and its Gini of contributions within a trajectory, overall and
                         on 3- and 4-hop questions
  ig_vs_new_gold         for ig_mode "prob" and "log_prob": the correlation (Pearson, i.e.
                         point-biserial) of each non-answer turn's information gain with "this
                         turn retrieved the gold document of a hop not resolved before"
                         (new_gold_per_turn, the oracle's resolution rule): which IG reading
                         tracks useful retrieval on this world (the paper defines prob, the
                         official script uses log_prob)
  gt_entropy_reduction   the ground truth's mean log-prob gain from the prompt to after the last
                         search (log_prob mode): IGPO's "entropy reduction"
  cw_fallback            how often CW-GRPO's all-zero fallback fires on correct trajectories
                         and why (fallback_reasons: nothing retrieved, or retrieved without the
                         thinking bit), and the share of correct trajectories with no round
  collapse               the share of a question's groups whose outcome rewards are all equal
                         (GRPO's zero-advantage groups: advantage collapse), under F1 and EM
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping, Sequence

import numpy as np

from agentjax.agent.protocol import SEARCH
from agentjax.judge.oracle import ig_pairs, new_gold_per_turn  # noqa: F401 (re-exported)


def correlation(x: Sequence[float], y: Sequence[float]) -> float:
  """Pearson's r of two equal-length sequences (nan when either is constant or < 2 points)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if len(x) < 2 or x.std() == 0 or y.std() == 0:
    return float("nan")
  return float(np.corrcoef(x, y)[0, 1])


def rounds_per_correct(turns: Sequence[Sequence[Any]], correct: np.ndarray) -> float:
  """Mean number of search rounds of the correct trajectories (nan when none is correct)."""
  counts = [sum(t.action.kind == SEARCH for t in row) for row, ok in zip(turns, correct) if ok]
  return float(np.mean(counts)) if counts else float("nan")


def fallback_reasons(retrieval: np.ndarray, thinking: np.ndarray, judged: np.ndarray,
                     num_turns: np.ndarray, correct: np.ndarray) -> dict[str, float]:
  """Why CW-GRPO's all-zero fallback fires (advantages._cw_round_advantages: a trajectory with
  a positive advantage, K = num_turns - 1 >= 1 non-answer rounds, none with c = retrieval x
  thinking = 1): among the judged correct trajectories with K >= 1, the share where it fires,
  and of those, the share with no non-answer round retrieving (retrieval 0 everywhere) and the
  share that retrieved but whose rounds that retrieved were all judged not to think towards it
  (thinking 0); also the share of judged correct trajectories with K = 0 (no round to weigh).

  Arrays [B, T] (bits read where judged) and [B]."""
  num_k = np.asarray(num_turns) - 1
  t = np.arange(retrieval.shape[1])[None, :]
  rounds = (t < num_k[:, None]) & np.asarray(judged, bool)
  ret = (np.asarray(retrieval) != 0) & rounds
  c = ret & (np.asarray(thinking) != 0)
  judged_rows = np.asarray(judged, bool).any(1) & np.asarray(correct, bool)
  with_rounds = judged_rows & (num_k >= 1)
  fires = with_rounds & ~c.any(1)
  n_fire = int(fires.sum())
  return {"judged_correct": int(judged_rows.sum()),
          "no_round_share": float(np.mean(num_k[judged_rows] < 1)) if judged_rows.any()
          else float("nan"),
          "fallback_share": float(fires.sum() / with_rounds.sum()) if with_rounds.any()
          else float("nan"),
          "of_which_nothing_retrieved": float(np.mean(~ret[fires].any(1))) if n_fire
          else float("nan"),
          "of_which_thinking_zero": float(np.mean(ret[fires].any(1))) if n_fire
          else float("nan")}


# JudgePass's metrics that are counts (or seconds) of a step: summed over the chunks. Its other
# metrics (judge_metrics') are computed again on the concatenated bits.
JUDGE_COUNTS = ("calls", "calls_paper_rule", "calls_saved", "trajectories", "failures", "seconds")


def equal_groups(rewards: np.ndarray, group_ids: np.ndarray, tol: float = 1e-6) -> tuple[int, int]:
  """(groups whose rewards all lie within tol of each other, groups) of one batch: the groups
  GRPO gives a zero advantage (a singleton group counts as equal)."""
  rewards, group_ids = np.asarray(rewards, np.float64), np.asarray(group_ids)
  groups = np.unique(group_ids)
  equal = sum(int(np.ptp(rewards[group_ids == g]) <= tol) for g in groups)
  return equal, len(groups)


def pad_concat(parts: Sequence[np.ndarray]) -> np.ndarray:
  """[sum B_i, max T_i]: [B_i, T_i] arrays padded on the right with zeros (False) and stacked.
  The chunks' turn axes may differ (today they do not: trim cuts the token axis only); every
  reader of the result reads a row only below its num_turns, so the padding is never read."""
  width = max(p.shape[1] for p in parts)
  return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts])


def measure(config: Any, hf_path: str, questions: int = 200, seed: int = 0,
            chunk_questions: int = 25) -> dict[str, Any]:
  """The properties of the module docstring on `questions` dev questions x config's group size,
  sampled by the export at hf_path with config's rollout settings; the oracle judge as config's
  CW-GRPO settings run it.

  The questions are rolled out, judged and scored `chunk_questions` at a time (whole groups per
  chunk): one batch of 200 questions x the group size holds a KV cache of tens of GB (it was
  killed for memory on a 24 GB machine). Every property is computed on the concatenated rows, so
  the result does not depend on the chunking except through the sampling keys (one per chunk).
  """
  import jax

  from agentjax.agent import RolloutEngine
  from agentjax.judge import build_judge
  from agentjax.judge.metrics import judge_metrics
  from agentjax.judge.stage import JudgePass
  from agentjax.parallel import make_mesh, use_mesh
  from agentjax.rl import build_probes, outcome_rewards
  from agentjax.rl.advantages import gt_entropy_reduction
  from agentjax.rl.info_gain import ANSWER_TEMPLATES
  from agentjax.train.builders import (load_model, load_questions, make_search_backend,
                                       rollout_config)
  from agentjax.train.scoring import score_batch, trim
  if chunk_questions < 1:
    raise ValueError(f"chunk_questions must be >= 1, got {chunk_questions}")
  c = copy.deepcopy(config)
  c.model.hf_path = hf_path
  c.judge.backend = "oracle"
  mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  cfg, params, tokenizer = load_model(c, mesh)
  records = load_questions(c, c.data.eval.split(","), "dev", "data.eval")[:questions]
  engine = RolloutEngine(cfg, tokenizer, make_search_backend(c), rollout_config(c), mesh=mesh)
  judge = JudgePass(build_judge(c.judge, mesh=mesh), c.judge)
  modes = ("prob", "log_prob")
  rows, turns, num_turns, em, bits = [], [], [], [], []
  counts = dict.fromkeys(JUDGE_COUNTS, 0.0)  # summed over chunks
  pairs = {mode: ([], []) for mode in modes}
  values = []  # [B_chunk, T_chunk + 1] ground-truth log-prob values per chunk (log_prob mode)
  collapse = {"f1": [0, 0], "em": [0, 0]}  # [equal groups, groups], summed over chunks
  for i, lo in enumerate(range(0, len(records), chunk_questions)):
    part = records[lo:lo + chunk_questions]
    with use_mesh(mesh):
      batch, _ = engine.run(params, [r["question"] for r in part],
                            jax.random.fold_in(jax.random.key(seed), i))
      batch = trim(batch)
    part_rows = [part[g] for g in batch.group_ids]
    golds = [r["golden_answers"] for r in part_rows]
    answers = [a if ok else None for a, ok in zip(batch.answers, batch.answered)]
    part_em = outcome_rewards(answers, golds, metric="em")
    for metric, reward in (("f1", outcome_rewards(answers, golds, metric="f1")), ("em", part_em)):
      equal, groups = equal_groups(reward, np.asarray(batch.group_ids))
      collapse[metric][0] += equal
      collapse[metric][1] += groups
    part_turns = np.asarray(batch.num_turns)
    scores = judge(batch.turns, part_turns, batch.group_ids, part_em, part_rows,
                   num_t=batch.turn_ends.shape[1] - 1, rng=np.random.default_rng([seed, 1, i]))
    for k in counts:
      counts[k] += float(scores.metrics.get(f"judge/{k}", 0.0))
    bits.append((np.asarray(scores.retrieval), np.asarray(scores.thinking),
                 np.asarray(scores.judged, bool)))
    probes = build_probes(engine.encode, golds, template=ANSWER_TEMPLATES[c.rollout.protocol],
                          tokens=c.rl.ig_probe_tokens)
    for mode in modes:
      with use_mesh(mesh):
        scored = score_batch(engine.model, params, None, batch, probes, mode=mode,
                             chunk=c.rl.chunk)
      gains, hits = ig_pairs(np.asarray(scored.ig), part_turns, part_rows, batch.turns)
      pairs[mode][0].extend(gains)
      pairs[mode][1].extend(hits)
      if mode == "log_prob":
        values.append(np.asarray(scored.values, np.float32))
    rows += part_rows
    turns += list(batch.turns)
    num_turns.append(part_turns)
    em.append(part_em)
  num_turns, em = np.concatenate(num_turns), np.concatenate(em)
  retrieval, thinking, judged = (pad_concat([b[k] for b in bits]) for k in range(3))
  correct = em > 0
  answer_round = bool(c.judge.answer_round)
  hops = np.array([int(r.get("hops", 0)) for r in rows])
  deep = hops >= 3
  deep_metrics = judge_metrics(retrieval[deep], thinking[deep], judged[deep], num_turns[deep],
                               answer_round) if deep.any() else {}
  ig_vs_gold = {}
  for mode, (gains, hits) in pairs.items():
    ig_vs_gold[mode] = {"r": correlation(gains, hits), "turns": len(gains),
                        "new_gold_share": float(np.mean(hits)) if hits else float("nan"),
                        "ig_mean_new_gold": float(np.mean([g for g, h in zip(gains, hits) if h]))
                        if any(hits) else float("nan"),
                        "ig_mean_other": float(np.mean([g for g, h in zip(gains, hits) if not h]))
                        if not all(hits) else float("nan")}
  judge_all = {f"judge/{k}": float(v) for k, v in
               judge_metrics(retrieval, thinking, judged, num_turns, answer_round).items()}
  judge_all.update({f"judge/{k}": v for k, v in counts.items()})
  return {"hf_path": hf_path, "questions": len(records), "trajectories": len(rows),
          "group_size": int(c.rollout.group_size), "chunk_questions": int(chunk_questions),
          "em": float(em.mean()),
          "rounds_per_correct": rounds_per_correct(turns, correct),
          "rounds_mean": float(np.mean([sum(t.action.kind == SEARCH for t in r)
                                        for r in turns])),
          "judge": judge_all,
          "judge_3_4_hop": {k: float(v) for k, v in deep_metrics.items()},
          "cw_fallback": fallback_reasons(retrieval, thinking, judged, num_turns, correct),
          "ig_vs_new_gold": ig_vs_gold,
          "collapse": {metric: n / max(total, 1) for metric, (n, total) in collapse.items()},
          "gt_entropy_reduction": float(gt_entropy_reduction(pad_concat(values), num_turns)),
          "goals": {"rounds_per_correct": ">= 2", "contribution_share": "< 0.7"}}


__all__ = ["correlation", "equal_groups", "fallback_reasons", "ig_pairs", "measure",
           "new_gold_per_turn",
           "pad_concat", "rounds_per_correct"]
