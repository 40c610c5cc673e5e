"""Warm starts for Co-ReAct's two models on SynthWorld (ours; configs/coreact.py:rubric_sft,
agentjax/studies/backbone.py).

    rows = rubric_demos(branch_rows, seed=0, per_branch=2)   # SFT rows, protocol "rubric"
    rows = rubric_following_demos(searcher_demos, backend, topk, entities)   # the agent's side

A from-scratch demo model has never written a rubric, so GRPO could never sample one that parses.
Each demonstration answers a branch point's rubric prompt (rubric.rubric_prompt, the prompt the RL
task and the guided agent build) with a rubric drawn at random from the executor's criterion
vocabulary (executor.CRITERION_PHRASES): 3 to 5 distinct criteria in all, positive weights in steps
of 0.05 summing to 1, and with probability `negative_rate` one of them with a negative weight
instead (every demonstration has the full format score). The rubrics are well formed and uninformed
by the context: the warm-started generator writes parseable rubrics whose rankings agree with the
experts' only by chance, which is what GRPO then has to make discriminative.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from agentjax.agent.protocol import RUBRIC
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import rubric_prompt


def random_rubric(rng: np.random.Generator, phrases: tuple[str, ...], min_items: int = 3,
                  max_items: int = 5, negative_rate: float = 0.3) -> str:
  """A rubric text: `N. [w] Criterion` lines (module docstring)."""
  negative = rng.random() < negative_rate and min_items + 1 <= min(max_items, len(phrases))
  # The positive items, leaving room for the negative one within max_items.
  n = int(rng.integers(min_items - int(negative) if negative else min_items,
                       max_items - int(negative) + 1))
  picked = rng.choice(len(phrases), size=min(n + int(negative), len(phrases)), replace=False)
  # n positive weights in 0.05 steps summing to 1 (each >= 0.05).
  cuts = np.sort(rng.choice(np.arange(1, 20), size=n - 1, replace=False))
  parts = np.diff(np.concatenate([[0], cuts, [20]])) * 0.05
  weights = [float(w) for w in parts]
  if negative:
    weights.append(-float(rng.choice([0.1, 0.2, 0.3])))
  lines = []
  for i, (p, w) in enumerate(zip(picked, weights)):
    text = phrases[int(p)]
    lines.append(f"{i + 1}. [{w:.2f}] {text[0].upper()}{text[1:]}")
  return "\n".join(lines)


def rubric_demos(branches: Iterable[Mapping[str, Any]], seed: int = 0, per_branch: int = 2,
                 negative_rate: float = 0.3) -> list[dict[str, Any]]:
  """SFT rows (agentjax/train/sft.py format, protocol "rubric": the "question" is the whole
  prompt) with `per_branch` random rubrics for each branch point's context."""
  from agentjax.coreact.executor import CRITERION_PHRASES
  rng = np.random.default_rng(seed)
  out = []
  for row in branches:
    prompt = rubric_prompt(BranchContext.from_json(row))
    for j in range(per_branch):
      out.append({"id": f"rubric_{row.get('id', len(out))}_{j}", "question": prompt,
                  "golden_answers": [], "protocol": RUBRIC.name,
                  "segments": [{"role": "assistant", "text": random_rubric(
                      rng, CRITERION_PHRASES, negative_rate=negative_rate)}]})
  return out


# The criteria a following demonstration's rubric may hold, by what they decide: the action's kind
# first (the decision a rubric most often changes: search on, or answer), then the query's.
_KIND_CRITERIA = ("the action searches", "the action answers", "the action answers after a search")
_QUERY_CRITERIA = ("the query repeats no earlier query", "the query names the question entity",
                   "the query names an entity from the latest documents",
                   "the answer names an entity from the documents")
_AVOID_CRITERIA = ("the query repeats an earlier query", "the action searches", "the action answers")


def following_rubric(ctx: BranchContext, action_text: str, entities: frozenset[str],
                     rng: np.random.Generator, negative_rate: float = 0.5) -> str:
  """A rubric the action `action_text` meets in full (its verify score is 1): the kind criterion
  it meets, one or two query/answer criteria it meets, weights in 0.05 steps summing to 1, and
  with probability `negative_rate` a criterion it does not meet at a negative weight."""
  from agentjax.coreact.executor import CRITERIA
  action = ctx.parse(action_text)
  met = {phrase: bool(CRITERIA[phrase](ctx, action, entities)) for phrase in CRITERIA}
  kind = [p for p in _KIND_CRITERIA if met[p]]
  if not kind:
    raise ValueError(f"the action {action_text!r:.80} neither searches nor answers")
  more = [p for p in _QUERY_CRITERIA if met[p]]
  picked = [kind[int(rng.integers(len(kind)))]]
  if more:
    picked += [more[i] for i in rng.choice(len(more), size=min(len(more),
                                                               int(rng.integers(1, 3))),
                                           replace=False)]
  cuts = np.sort(rng.choice(np.arange(1, 20), size=len(picked) - 1, replace=False))
  weights = [float(w) * 0.05 for w in np.diff(np.concatenate([[0], cuts, [20]]))]
  items = list(zip(picked, weights))
  avoid = [p for p in _AVOID_CRITERIA if not met[p]]
  if avoid and rng.random() < negative_rate:
    items.append((avoid[int(rng.integers(len(avoid)))], -float(rng.choice([0.1, 0.2, 0.3]))))
  return "\n".join(f"{i + 1}. [{w:.2f}] {p[0].upper()}{p[1:]}" for i, (p, w) in enumerate(items))


def demo_turns(demos: Sequence[Mapping[str, Any]], backend: Any, topk: int) -> list[list[Any]]:
  """Each demonstration's turns as TurnRecords (agentjax.agent.trajectories): the action parsed
  from each assistant segment (hook segments skipped), the observation that followed, and the
  documents its search retrieves again (top `topk` from `backend`, one batched call), as the
  rollout saw them; what a BranchContext holds, for criteria that read documents."""
  from agentjax.agent.protocol import SEARCH, get_protocol
  from agentjax.agent.trajectories import TurnRecord
  plain = [[s for s in d["segments"] if s["role"] != "hook"] for d in demos]
  parsed = [[get_protocol(d.get("protocol", "search_r1")).parse(s["text"]) for s in segs[0::2]]
            for d, segs in zip(demos, plain)]
  queries = [a.content for actions in parsed for a in actions if a.kind == SEARCH]
  response = backend.search(queries, topk) if queries else None
  docs = iter(() if response is None else
              [tuple(ds) if e is None else () for ds, e in zip(response.documents,
                                                               response.errors)])
  out = []
  for segs, actions in zip(plain, parsed):
    out.append([TurnRecord(text=segs[2 * t]["text"], action=a,
                           documents=next(docs) if a.kind == SEARCH else (),
                           observation=segs[2 * t + 1]["text"] if 2 * t + 1 < len(segs) else "")
                for t, a in enumerate(actions)])
  return out


def rubric_following_demos(searcher_demos: Iterable[Mapping[str, Any]], backend: Any, topk: int,
                           entities: frozenset[str], max_calls: int, seed: int = 0,
                           negative_rate: float = 0.5) -> list[dict[str, Any]]:
  """The guided agent's side of the warm start: each multi-turn searcher demonstration again, with
  the shadow suffix of a rubric (rubric_suffix) as a "hook" segment before every turn after the
  first, a rubric its own action there meets in full (following_rubric). The hooks are fed and
  not learned (agentjax/train/sft.py), as the guided engine feeds them.

  The demonstrations come from a hasty and a careful teacher (SynthWorld.demonstrations): after
  the same kind of context one answers and the other searches on, so the rubric ("The action
  answers" or "The action searches", and which entity the query names) is what tells them apart:
  a model that learns these rows learns to follow a rubric, which is what the guided agent needs.
  The criteria read the documents the rollout saw (demo_turns)."""
  from agentjax.coreact.rubric import parse_rubric, rubric_suffix
  rng = np.random.default_rng(seed)
  demos = [d for d in searcher_demos if len(d["segments"]) >= 3]
  out = []
  for d, turns in zip(demos, demo_turns(demos, backend, topk)):
    segments = []
    for t, turn in enumerate(turns):
      if t > 0:
        ctx = BranchContext(question=d, turns=tuple(turns[:t]), max_calls=max_calls,
                            protocol=d.get("protocol", "search_r1"))
        rubric = parse_rubric(following_rubric(ctx, turn.text, entities, rng, negative_rate))
        segments.append({"role": "hook", "text": rubric_suffix(rubric)})
      segments += d["segments"][2 * t:2 * t + 2]
    out.append({**{k: v for k, v in d.items() if k != "segments"},
                "id": f"following_{d['id']}", "segments": segments})
  return out


def write_rubric_demos(config: Any, per_branch: int = 2) -> str:
  """rubric_demos of config.coreact.branches_train written to config.sft.demos (atomically)."""
  from agentjax.jsonl import iter_json_objects, write_jsonl_atomic
  src = os.path.expanduser(config.coreact.branches_train)
  rows = [row for _, row in iter_json_objects(src, ValueError, what="branch points")]
  demos = rubric_demos(rows, seed=config.seed, per_branch=per_branch)
  return write_jsonl_atomic(config.sft.demos, demos)
