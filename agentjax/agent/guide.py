"""Turn guides: a public per-turn hook that shapes how each turn's action is generated, honoured
by both rollout engines (rollout.engine "turns", agentjax/agent/rollout.py, and "slots",
agentjax/agent/slots.py).

A TurnGuide is a host-side object given to RolloutEngine(guide=...). For each trajectory (row)
and turn, the engine asks it for a plan before the turn's generation and for a verdict after:

  plan = guide.begin(rows)[i]      before row rows.rows[i] generates turn rows.turn (after
                                   before_turn's text is fed); None: one plain generation (ReAct)
  the engine feeds plan.prefix and samples plan.samples actions from that context (between two
  samples the row is rewound to it, with the logits it had there)
  verdict = guide.review(rows, attempts)[i]
    verdict.retry (ids): the row is rewound to the turn's start (before any prefix), the retry ids
      are fed, plan.samples actions are generated again and review is asked again
    otherwise the turn's action is the attempt's sample verdict.choose.

The chosen action stays in the context as sampled when the row's context already ends with it: a
single sample, after a kept prefix (plan.keep) or none. Otherwise the row is rewound to the turn's
start and the kept prefix and the chosen action's exact ids are fed again: those tokens are
context (loss_mask False, log-prob 0), so a batch with such turns is for inference, not an RL
batch. The turn's TurnRecord holds the last prefix fed (plan.prefix, or the last retry's ids) as
hook_text when kept, else as shadow_text.

Calls: the turn engine calls `begin` once per turn with every active row, and `review` once per
generation round with every guided row whose round ended. The slot engine calls them per lane as
its rows reach those points (the rows of one turn per call; each row once per turn and round), so
a guide must not assume that one call holds every active row, nor that calls come in turn order
across rows. Both run on the host between device calls; a guide never touches the decode state.
For a greedy policy both engines give the same trajectories; under sampling, every generation of
a turn after its first draws other keys (the slot engine folds the row's generation count into
its key; the turn engine's `generate` advances its key at every call).

agentjax/coreact/guided.py's RubricGuide is one: Co-ReAct's rubric as a shadow (or kept) prefix,
verify and retry (review scores the action and answers a retry with the rubric and feedback), and
Best-of-N (plan.samples = N, review picks one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from agentjax.agent.trajectories import TrajectoryBook, TurnRecord


@dataclasses.dataclass
class TurnRows:
  """What a TurnGuide sees of the rollout at a turn (host side).

  turn: the 0-based turn the rows are generating.
  rows: the rows (trajectory indices) the call is about, in the order of its results.
  group_ids: [B] the question index of every row.
  length: [B] each row's context length when the turn began (its hook text counted, no prefix of
    the guide's; a copy).
  budget: the slots a row may fill (the token budget).
  records: per row, the TurnRecord fields of its turns so far (dicts, read-only).
  transcripts: per row, the text of its context so far (read-only).
  """
  turn: int
  rows: np.ndarray
  group_ids: np.ndarray
  length: np.ndarray
  budget: int
  records: Sequence[Sequence[dict[str, Any]]]
  transcripts: Sequence[str]

  def history(self, b: int) -> tuple[TurnRecord, ...]:
    """Row b's finished turns as TurnRecords."""
    return tuple(TurnRecord(**r) for r in self.records[b])


@dataclasses.dataclass(frozen=True)
class TurnPlan:
  """How one row's turn is generated (TurnGuide.begin).

  prefix: ids fed right before the generation (e.g. a rubric suffix); cut to the token budget.
  keep: the prefix stays in the context before the action (TurnRecord.hook_text); False: it is
    removed once the turn's action is chosen (TurnRecord.shadow_text) and the action fed again.
  samples: actions sampled per round from the same context (Best-of-N); review chooses one.
  logprobs: give review each sample's sampling-time log-probs (TurnAttempt.logprobs).
  """
  prefix: Sequence[int] = ()
  keep: bool = False
  samples: int = 1
  logprobs: bool = False

  def __post_init__(self):
    if self.samples < 1:
      raise ValueError(f"TurnPlan.samples={self.samples}: must be >= 1")


@dataclasses.dataclass(frozen=True)
class TurnAttempt:
  """One generation round of a guided row's turn, as TurnGuide.review sees it.

  row: the row (trajectory index).
  number: 0 for the round after plan.prefix, k after the k-th retry.
  prefix: the ids fed before the round's samples (plan.prefix, or the retry's ids).
  ids: per sample, its exact sampled ids.
  reasons: per sample, its stop reason (sampling.STOP_*; STOP_BUDGET: cut off by the budget).
  logprobs: per sample, its sampling-time log-probs ([len(ids)] float32), when plan.logprobs;
    else None.
  """
  row: int
  number: int
  prefix: tuple[int, ...]
  ids: tuple[tuple[int, ...], ...]
  reasons: tuple[int, ...]
  logprobs: tuple[np.ndarray, ...] | None = None


@dataclasses.dataclass(frozen=True)
class TurnVerdict:
  """What follows a generation round (TurnGuide.review).

  retry: None: the turn's action is sample `choose` of the round. Otherwise ids (at least one)
    fed after the row is rewound to the turn's start, before the turn is generated again (cut to
    the token budget).
  """
  choose: int = 0
  retry: Sequence[int] | None = None


ACCEPT = TurnVerdict()


class TurnGuide:
  """The per-turn hook (module docstring). The base guide plans nothing: every turn is one plain
  generation, as without a guide."""

  def begin(self, rows: TurnRows) -> Sequence[TurnPlan | None]:
    """One plan (or None: a plain generation) per row of rows.rows, about to generate rows.turn."""
    return [None] * len(rows.rows)

  def review(self, rows: TurnRows, attempts: Sequence[TurnAttempt]) -> Sequence[TurnVerdict]:
    """One verdict per attempt (attempts[i] is row rows.rows[i]'s round of turn rows.turn)."""
    return [ACCEPT] * len(attempts)


# ---------------------------------------------------------------------------------------------
# The engines' side: what to do with each row, shared by both engines.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class GuideStep:
  """What an engine does with a row after one of its generations (GuideBook.generated), in order:
  rewind the row (to `rewind`, restoring the logits saved for it when `restore`), feed `feed`,
  save the row's logits if `snapshot`, then generate the turn again if `generate`; else the turn
  is over and `action` is TrajectoryBook.action's (ids, reason, context_added, kept, shadow)."""
  row: int
  rewind: int | None = None
  restore: bool = False
  feed: list[int] = dataclasses.field(default_factory=list)
  snapshot: bool = False
  generate: bool = False
  action: tuple[Sequence[int], int, int | None, str, str] | None = None


@dataclasses.dataclass
class _RowTurn:
  """A guided row's turn in progress."""
  plan: TurnPlan
  start: int                  # the row's context length at the turn's start (book.length)
  prefix: list[int]           # the ids fed after `start` for this round
  number: int = 0             # the round: 0, then one per retry
  ids: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
  reasons: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[np.ndarray] = dataclasses.field(default_factory=list)


class GuideBook:
  """The host-side bookkeeping of a rollout's guided turns, shared by both engines (next to their
  TrajectoryBook): plans, rounds, verdicts, and the device steps they imply (GuideStep).

  extra: [B] ids in each row's context beyond book.length (its turn's prefix while the turn goes
    on): an engine's windows cover book.length + extra.
  draws: [B] generations of each row's current turn so far (the slot engine keys its samples by
    it: the first generation keys as an unguided turn).
  """

  def __init__(self, guide: TurnGuide | None, book: TrajectoryBook):
    rows = len(book.group_ids)
    self.guide, self.book = guide, book
    self.turns: dict[int, _RowTurn] = {}
    self.extra = np.zeros(rows, np.int64)
    self.draws = np.zeros(rows, np.int64)

  def _view(self, turn: int, rows: Sequence[int]) -> TurnRows:
    book = self.book
    return TurnRows(turn=turn, rows=np.asarray(rows, np.int64), group_ids=book.group_ids,
                    length=book.length.copy(), budget=book.budget, records=book.records,
                    transcripts=book.transcripts)

  def _cut(self, b: int, ids: Sequence[int]) -> list[int]:
    return [int(x) for x in ids][:max(0, self.book.budget - 1 - int(self.book.length[b]))]

  def begin(self, turn: int, rows: Sequence[int]) -> list[tuple[list[int], bool]]:
    """The guide's plans for `rows` about to generate `turn` (their hook text fed): per row, the
    ids to feed before its generation ([] for none) and whether to save its logits after them
    (several samples)."""
    rows = [int(b) for b in rows]
    if self.guide is None or not rows:
      return [([], False)] * len(rows)
    plans = list(self.guide.begin(self._view(turn, rows)))
    if len(plans) != len(rows):
      raise ValueError(f"TurnGuide.begin returned {len(plans)} plans for the {len(rows)} rows "
                       f"it was given (turn {turn}): one TurnPlan or None per row")
    out = []
    for b, plan in zip(rows, plans):
      self.draws[b] = 0
      if plan is None:
        out.append(([], False))
        continue
      prefix = self._cut(b, plan.prefix)
      self.turns[b] = _RowTurn(plan, int(self.book.length[b]), prefix)
      self.extra[b] = len(prefix)
      out.append((prefix, plan.samples > 1))
    return out

  def wants_logprobs(self, b: int) -> bool:
    g = self.turns.get(b)
    return g is not None and g.plan.logprobs

  def context(self, b: int) -> int:
    """Where row b's generation began: book.length + the prefix fed."""
    return int(self.book.length[b] + self.extra[b])

  def generated(self, turn: int, rows: Sequence[int], ids: Sequence[Sequence[int]],
                reasons: Sequence[int],
                logprobs: Sequence[np.ndarray | None] | None = None) -> list[GuideStep]:
    """Rows of `turn` finished a generation (ids, stop reason, log-probs when wanted): one step
    per row, in order. Rows whose round is complete are reviewed in one call."""
    steps: list[GuideStep | None] = []
    review = []  # (index in steps, row)
    for i, (b, sample, reason) in enumerate(zip(rows, ids, reasons)):
      b = int(b)
      g = self.turns.get(b)
      if g is None:  # a plain turn
        steps.append(GuideStep(b, action=(sample, int(reason), None, "", "")))
        continue
      g.ids.append(tuple(int(x) for x in sample))
      g.reasons.append(int(reason))
      if g.plan.logprobs:
        g.logprobs.append(np.asarray(logprobs[i], np.float32))
      if len(g.ids) < g.plan.samples:  # the next sample, from the same context
        self.draws[b] += 1
        steps.append(GuideStep(b, rewind=g.start + len(g.prefix), restore=True, generate=True))
      else:
        steps.append(None)
        review.append((i, b))
    if not review:
      return steps
    which = [b for _, b in review]
    attempts = [TurnAttempt(row=b, number=self.turns[b].number, prefix=tuple(self.turns[b].prefix),
                            ids=tuple(self.turns[b].ids), reasons=tuple(self.turns[b].reasons),
                            logprobs=tuple(self.turns[b].logprobs)
                            if self.turns[b].plan.logprobs else None) for b in which]
    verdicts = list(self.guide.review(self._view(turn, which), attempts))
    if len(verdicts) != len(attempts):
      raise ValueError(f"TurnGuide.review returned {len(verdicts)} verdicts for "
                       f"{len(attempts)} attempts (turn {turn})")
    for (i, b), verdict in zip(review, verdicts):
      steps[i] = self._verdict(b, verdict)
    return steps

  def _verdict(self, b: int, verdict: TurnVerdict) -> GuideStep:
    g = self.turns[b]
    if verdict.retry is not None:
      retry = self._cut(b, verdict.retry)
      if not retry:
        raise ValueError(f"TurnVerdict.retry for row {b} feeds no ids (or none fit the budget): "
                         f"to sample again from the same context use TurnPlan.samples")
      g.prefix, g.number = retry, g.number + 1
      g.ids, g.reasons, g.logprobs = [], [], []
      self.extra[b] = len(retry)
      self.draws[b] += 1
      return GuideStep(b, rewind=g.start, feed=list(retry), snapshot=g.plan.samples > 1,
                       generate=True)
    if not 0 <= verdict.choose < len(g.ids):
      raise ValueError(f"TurnVerdict.choose={verdict.choose} for row {b}: {len(g.ids)} samples")
    ids, reason = list(g.ids[verdict.choose]), g.reasons[verdict.choose]
    keep, prefix = g.plan.keep, g.prefix
    text = self.book.engine.decode(prefix) if prefix else ""
    action = (ids, reason, (len(prefix) if keep else 0) + len(ids), text if keep else "",
              "" if keep else text)
    del self.turns[b]
    self.extra[b] = 0
    if g.plan.samples == 1 and (keep or not prefix):  # the context ends with the action already
      return GuideStep(b, action=action)
    return GuideStep(b, rewind=g.start, feed=(prefix if keep else []) + ids, action=action)


__all__ = ["ACCEPT", "GuideBook", "GuideStep", "TurnAttempt", "TurnGuide", "TurnPlan", "TurnRows",
           "TurnVerdict"]
