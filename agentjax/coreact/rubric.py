"""Co-ReAct rubrics as text: the parser, the list-wise reward, and the generator's prompt.

    rubric = parse_rubric(text)          # never raises: junk -> Rubric with no items
    score = rubric_reward(text, expert_ranking, applied, RewardSettings.from_config(c.coreact))
    prompt = rubric_prompt(ctx)          # the rubric generator's instruction at a branch point
    suffix = rubric_suffix(rubric)       # the shadow suffix the guided agent generates after

A rubric is lines `N. [w] criterion` (the official regex `\\d+\\.\\s*\\[([-\\d.]+)\\]\\s*(.+)`,
found anywhere in the text after `<think>` blocks are stripped): weights are floats, positive ones
should sum to about 1, negative ones mark what the next action should avoid; 3 to 5 items are
expected. An item whose weight float() rejects ("1.2.3", "-") or that is not finite (a digit run
too long for a float) is skipped; nothing in a model's text makes the parser raise.

The reward (the official rubric_rl/reward_fn.py `compute_score`; the paper, Co-ReAct
arXiv:2605.23590, gives no formula; every constant a config.coreact field, see RewardSettings):

    0                                              if the raw response's 4-gram repeat rate > 0.40
    0.75 s_rank + 0.15 s_atom + 0.10 s_fmt         otherwise, with
    s_rank = (rho + 1) / 2, rho = Spearman(rubric ranking, expert ranking), NaN rho -> 0.5
    s_atom = clamp(m, 0, N) / N                    m: the applier's count of atomic criteria
    s_fmt  = 0.5 [3 <= N <= 5] + 0.5 [|sum of positive weights - 1| < 0.15]   (0 if N = 0)
    s_rank = s_atom = 0                            if N < 2 or the applier failed

rank_reward swaps s_rank for the study's alternatives: "pairwise" (ranking.pairwise_accuracy over
the expert's strictly ordered pairs, no such pair -> nan_score) or "top1" (ranking.top1_match).
The prompts are English (the official ranking and verify prompts, rubric_rl/rubric_judge.py and
agent/dr_agent/rubric_generator.py, are Chinese).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np

from agentjax.coreact import RANK_REWARDS
from agentjax.coreact.context import BranchContext
from agentjax.agent.protocol import ANSWER, INVALID, SEARCH
from agentjax.rl import ranking

# ---------------------------------------------------------------------------------------------
# Parsing.
# ---------------------------------------------------------------------------------------------

ITEM_RE = re.compile(r"\d+\.\s*\[([-\d.]+)\]\s*(.+)")
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_THINK_OPEN = re.compile(r"<think>.*", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RubricItem:
  weight: float
  text: str


@dataclasses.dataclass(frozen=True)
class Rubric:
  """The parsed items of a rubric, in order, and the text they came from."""
  items: tuple[RubricItem, ...]
  raw: str = ""

  @property
  def n(self) -> int:
    return len(self.items)

  @property
  def positive_sum(self) -> float:
    return float(sum(item.weight for item in self.items if item.weight > 0))


def strip_think(text: str) -> str:
  """`text` without `<think>...</think>` blocks, without anything from an unclosed `<think>`
  on, and without stray `</think>` tags (the official strip_think_tags)."""
  text = _THINK_BLOCK.sub("", text)
  text = _THINK_OPEN.sub("", text)
  return text.replace("</think>", "")


def parse_rubric(text: Any) -> Rubric:
  """The rubric items in `text` (after strip_think). Never raises: a non-string, or text with no
  well-formed item, gives a Rubric with no items."""
  if not isinstance(text, str):
    return Rubric((), "")
  items = []
  for match in ITEM_RE.finditer(strip_think(text)):
    try:
      weight = float(match.group(1))
    except ValueError:  # "-", "1.2.3", "--1": not a number
      continue
    if not math.isfinite(weight):  # a digit run too long for a float parses as inf
      continue
    items.append(RubricItem(weight, match.group(2).strip()))
  return Rubric(tuple(items), text)


def repeat_rate(text: str, n: int = 4) -> float:
  """1 - |distinct word n-grams| / |n-grams| over lowercase `\\w+` words; 0 with fewer than
  n + 1 words."""
  words = re.findall(r"\w+", text.lower())
  if len(words) < n + 1:
    return 0.0
  grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
  return 1.0 - len(set(grams)) / len(grams)


def is_repetitive(text: str, n: int = 4, threshold: float = 0.40) -> bool:
  """Whether the n-gram repeat rate of `text` exceeds `threshold` (the reward's hard gate)."""
  return repeat_rate(text, n) > threshold


def format_score(rubric: Rubric, min_items: int = 3, max_items: int = 5,
                 weight_tol: float = 0.15) -> float:
  """0.5 [min_items <= N <= max_items] + 0.5 [|sum of positive weights - 1| < weight_tol];
  0 for a rubric with no items."""
  if rubric.n == 0:
    return 0.0
  count_ok = min_items <= rubric.n <= max_items
  sum_ok = abs(rubric.positive_sum - 1.0) < weight_tol
  return 0.5 * count_ok + 0.5 * sum_ok


# ---------------------------------------------------------------------------------------------
# Reward.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RewardSettings:
  """The reward's constants (config.coreact fields of the same names)."""
  spearman_weight: float = 0.75
  atomic_weight: float = 0.15
  format_weight: float = 0.10
  repeat_threshold: float = 0.40
  repeat_ngram: int = 4
  min_items: int = 3
  max_items: int = 5
  weight_tol: float = 0.15
  nan_score: float = 0.5
  rank_reward: str = "listwise"

  def __post_init__(self):
    if self.rank_reward not in RANK_REWARDS:
      raise ValueError(f"coreact.rank_reward: unknown {self.rank_reward!r}; known: {RANK_REWARDS}")
    if self.repeat_ngram < 1:
      raise ValueError(f"coreact.repeat_ngram must be >= 1, got {self.repeat_ngram}")
    if self.min_items > self.max_items:
      raise ValueError(f"coreact.min_items ({self.min_items}) > max_items ({self.max_items})")

  @classmethod
  def from_config(cls, coreact: Any) -> "RewardSettings":
    """From config.coreact (a ConfigDict or anything with the fields as attributes)."""
    kwargs = {}
    for field in dataclasses.fields(cls):
      if not hasattr(coreact, field.name):
        raise ValueError(f"config.coreact lacks the reward field {field.name!r}")
      value = getattr(coreact, field.name)
      cast = {"str": str, "int": int}.get(field.type, float)
      try:
        kwargs[field.name] = cast(value)
      except (TypeError, ValueError):
        raise ValueError(f"config.coreact.{field.name}: expected {field.type}, got {value!r}") \
            from None
    return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class Applied:
  """A rubric applier's output for one rubric over K candidates.

  ranking: K ranks, 1 = best, ties averaged (the rubric-induced ranking).
  atomic_count: m, how many of the rubric's criteria are atomic (checkable from the action).
  scores: the per-candidate rubric scores behind the ranking when the applier has them (the
    executor does; an LLM applier leaves it empty).
  """
  ranking: tuple[float, ...]
  atomic_count: int
  scores: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class RubricScore:
  """One rubric's reward and its parts (all host floats, for the trainer's metrics).

  reward: the scalar reward.
  rank_term: s_rank in [0, 1] as rank_reward defines it (0 when N < 2, the applier failed or
    the response is repetitive).
  rho: the raw Spearman of the rubric ranking against the expert's (NaN when undefined or not
    computed: applier failure or a repetitive response), logged whatever rank_reward is.
  atomic_term: s_atom; format_term: s_fmt (both 0 for a repetitive response).
  repetitive: the repeat gate fired (reward 0).
  n_items: N, the parsed items.
  applier_ok: the applier returned a usable ranking of the K candidates.
  """
  reward: float
  rank_term: float
  rho: float
  atomic_term: float
  format_term: float
  repetitive: bool
  n_items: int
  applier_ok: bool


def _measures(pred, expert):
  return (ranking.spearman(pred, expert), ranking.pairwise_accuracy(pred, expert),
          ranking.top1_match(pred, expert))


# One compile per K; called on host numpy rows (the reward is host-side).
_measures_jit = jax.jit(_measures)


def _usable_ranking(applied: Applied | None, k: int) -> np.ndarray | None:
  """The applier's ranking as [K] float32, or None when it cannot be used (wrong length,
  non-numeric or non-finite entries, a non-numeric atomic_count)."""
  if applied is None:
    return None
  try:
    pred = np.asarray(applied.ranking, np.float64)
    int(applied.atomic_count)
  except (TypeError, ValueError, OverflowError):
    return None
  if pred.shape != (k,) or not np.all(np.isfinite(pred)):
    return None
  return pred.astype(np.float32)


def rubric_reward(raw_text: str, expert_ranking: Sequence[float], applied: Applied | None,
                  settings: RewardSettings) -> RubricScore:
  """The reward of one rubric generator response (see the module docstring).

  Args:
    raw_text: the generator's raw response (the repeat gate reads it raw; the parser strips
      `<think>` first).
    expert_ranking: [K] the expert consensus ranks (1 = best, ties averaged; K >= 1).
    applied: the applier's ranking of the same K candidates by this rubric and its atomic count;
      None when the applier failed (so does a ranking of the wrong length or with non-finite
      entries).
    settings: the constants.
  Returns:
    RubricScore.
  Raises:
    ValueError: expert_ranking is not a non-empty 1-D finite sequence (a data error, not the
      model's).
  """
  expert = np.asarray(expert_ranking, np.float64)
  if expert.ndim != 1 or expert.size == 0 or not np.all(np.isfinite(expert)):
    raise ValueError(f"rubric_reward: expert_ranking must be [K] finite ranks, got "
                     f"{expert_ranking!r}")
  rubric = parse_rubric(raw_text if isinstance(raw_text, str) else "")
  n = rubric.n
  pred = _usable_ranking(applied, expert.size)
  ok = pred is not None
  if is_repetitive(raw_text if isinstance(raw_text, str) else "", settings.repeat_ngram,
                   settings.repeat_threshold):
    return RubricScore(0.0, 0.0, math.nan, 0.0, 0.0, True, n, ok)
  fmt = format_score(rubric, settings.min_items, settings.max_items, settings.weight_tol)
  rho, rank_term, atomic = math.nan, 0.0, 0.0
  if ok:
    rho_j, pair_j, top1_j = _measures_jit(pred, expert.astype(np.float32))
    rho = float(rho_j)
    if n >= 2:
      if settings.rank_reward == "listwise":
        rank_term = (rho + 1.0) / 2.0 if math.isfinite(rho) else settings.nan_score
      elif settings.rank_reward == "pairwise":
        pair = float(pair_j)
        rank_term = pair if math.isfinite(pair) else settings.nan_score
      else:
        rank_term = float(top1_j)
      atomic = min(max(int(applied.atomic_count), 0), n) / n
  reward = (settings.spearman_weight * rank_term + settings.atomic_weight * atomic +
            settings.format_weight * fmt)
  return RubricScore(float(reward), float(rank_term), rho, float(atomic), float(fmt), False, n, ok)


# ---------------------------------------------------------------------------------------------
# Prompts and suffixes.
# ---------------------------------------------------------------------------------------------

EARLY, MIDDLE, LATE = "early", "middle", "late"

PHASE_HINTS = {
    EARLY: ("Early phase: broaden the search and gather the evidence the question needs; do not "
            "suggest answering yet."),
    MIDDLE: ("Middle phase: focus on the search strategy and on covering what is still missing; "
             "answering may be suggested if the evidence is complete."),
    LATE: ("Late phase: answer if the information suffices; otherwise fill the critical gap "
           "with one precise search."),
}


def phase_of(tool_calls: int, max_calls: int) -> str:
  """The phase of a branch point by searches used: "late" when tool_calls >= max_calls - 1 (one
  call or none left; checked first, so a tiny budget is late rather than early), "early" when
  tool_calls < max_calls / 3, else "middle"."""
  if tool_calls >= max_calls - 1:
    return LATE
  if tool_calls < max_calls / 3:
    return EARLY
  return MIDDLE


def _cut(text: str, limit: int) -> str:
  text = " ".join(text.split())
  return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def _turn_block(index: int, turn: Any, doc_chars: int) -> str:
  action = " ".join(strip_think(turn.text).split())
  if not action:
    action = f"[{turn.action.kind}] {turn.action.content}".strip()
  lines = [f"Step {index + 1}: {_cut(action, 2 * doc_chars)}"]
  if turn.action.kind == SEARCH:
    if turn.search_error:
      lines.append(f"Search failed: {_cut(str(turn.search_error), doc_chars)}")
    elif not turn.documents:
      lines.append("Results: none")
    else:
      lines.append("Results:")
      for doc in turn.documents:
        title = doc.title.strip().strip('"')
        lines.append(f"- {_cut(title, 80)}: {_cut(doc.text, doc_chars)}")
  elif turn.action.kind == INVALID:
    lines.append(f"Invalid action: {_cut(turn.action.content, doc_chars)}")
  elif turn.action.kind == ANSWER:
    lines.append("(answered)")
  return "\n".join(lines)


def render_trajectory(ctx: BranchContext, doc_chars: int = 300) -> str:
  """The trajectory so far as text: each turn's action (`<think>` stripped) and what it got back
  (documents' titles and text, each cut to `doc_chars` characters; a failed search's error;
  an invalid action's reason). "" when there are no turns."""
  return "\n".join(_turn_block(i, t, doc_chars) for i, t in enumerate(ctx.turns))


_INSTRUCTION = (
    "Write a rubric for the next action of a search agent: 3 to 5 criteria, one per line as "
    "`N. [w] criterion`, positive weights summing to 1, negative weights for what the next "
    "action should avoid.")


def rubric_prompt(ctx: BranchContext, max_chars: int = 4000, doc_chars: int = 300) -> str:
  """The rubric generator's instruction at a branch point.

  The instruction, the question, the trajectory so far (render_trajectory), the phase hint by
  searches used (phase_of, PHASE_HINTS), and "Rubric:" to continue from. When the prompt would
  exceed `max_chars` characters, whole earlier steps are dropped first (oldest first, noted as
  omitted), then the latest step is cut from its front: the question, the hint and the end of the
  latest step are always kept.
  """
  question = str(ctx.question.get("question", ""))
  phase = phase_of(ctx.tool_calls, ctx.max_calls)
  head = f"{_INSTRUCTION}\nQuestion: {question}\nTrajectory so far:\n"
  tail = (f"\nPhase: {phase} ({ctx.tool_calls} of {ctx.max_calls} searches used). "
          f"{PHASE_HINTS[phase]}\nRubric:\n")
  blocks = [_turn_block(i, t, doc_chars) for i, t in enumerate(ctx.turns)]
  budget = max_chars - len(head) - len(tail)
  if not blocks:
    return head + "(no steps yet)" + tail
  kept: list[str] = []
  used = 0
  for block in reversed(blocks):
    extra = len(block) + (1 if kept else 0)
    if kept and used + extra > budget:
      break
    kept.insert(0, block)
    used += extra
  omitted = len(blocks) - len(kept)
  note = f"({omitted} earlier steps omitted)\n" if omitted else ""
  body = note + "\n".join(kept)
  if len(body) > budget:  # the latest step alone is too long: keep its end
    body = "..." + body[len(body) - max(budget - 3, 0):]
  return head + body + tail


def fit_rubric_prompt(ctx: BranchContext, count_tokens: Callable[[str], int], room: int,
                      max_chars: int = 4000) -> str | None:
  """rubric_prompt(ctx) cut to `room` tokens as `count_tokens` counts them (the generator's
  prompt ids, chat template included): fewer characters of trajectory until it fits (the
  question, the hint and the end of the latest step stay); None when even 200 characters do not
  fit. The rubric trainer (task.branch_records) and the guided agent's generator both call it,
  so a context gets the same prompt in training and at inference."""
  while True:
    text = rubric_prompt(ctx, max_chars=max_chars)
    n = count_tokens(text)
    if n <= room:
      return text
    if max_chars <= 200:
      return None
    max_chars = max(200, int(max_chars * room / n * 0.9))


def _format_weight(weight: float) -> str:
  return f"{weight:g}"


def format_items(rubric: Rubric) -> str:
  """The rubric's items as `N. [w] criterion` lines (renumbered from 1), one per line."""
  return "".join(f"{i + 1}. [{_format_weight(item.weight)}] {item.text}\n"
                 for i, item in enumerate(rubric.items))


def rubric_suffix(rubric: Rubric) -> str:
  """The shadow suffix fed before the agent generates its next action; "" for a rubric with no
  items (nothing to inject)."""
  if rubric.n == 0:
    return ""
  return f"\n[Rubric for the next step]\n{format_items(rubric)}"


def retry_suffix(rubric: Rubric, failed: Sequence[RubricItem]) -> str:
  """The feedback fed (after rubric_suffix(rubric)) when the proposed action scored below the
  verify threshold: the criteria it failed, numbered as in the rubric (positive ones it missed,
  negative ones it met)."""
  numbers = {id(item): i + 1 for i, item in enumerate(rubric.items)}
  lines = []
  for item in failed:
    number = numbers.get(id(item))
    if number is None:  # an equal item from another parse of the same text
      number = next((i + 1 for i, it in enumerate(rubric.items) if it == item), None)
    why = "met, but should be avoided" if item.weight < 0 else "not met"
    label = f"{number}. " if number is not None else ""
    lines.append(f"- {label}[{_format_weight(item.weight)}] {item.text} ({why})\n")
  if not lines:
    return "[Feedback] The proposed action scored low against the rubric. Write it again.\n"
  return ("[Feedback] The proposed action failed these criteria:\n" + "".join(lines) +
          "Write the next action again so that it meets the rubric.\n")
