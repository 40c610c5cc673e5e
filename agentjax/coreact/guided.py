"""Rubric-guided search agents at inference (Co-ReAct, arXiv:2605.23590: the abstract's step-level
rubric injection, Fig. 4's rubric-verify-retry; the official agent/dr_agent/rubric_generator.py
`format_rubric_suffix` and `verify`): shadow suffix, verify and retry, Best-of-N.

    generator = RubricGenerator.from_config(config)            # a Completer over an HF folder
    engine = GuidedEngine(cfg, tokenizer, backend, rollout, GuidedSettings.from_config(
        config.coreact, "coreact"), rubric_source=generator, applier=build_applier(config))
    batch, metrics = engine.run(params, questions, rng)        # as RolloutEngine.run

A GuidedEngine is a RolloutEngine whose guide (RolloutEngine.guide, the public per-turn hook of
agentjax/agent/guide.py) is a RubricGuide: it shapes each turn's generation by a rubric, in
either rollout engine (rollout.engine "slots", the default, or "turns"); parsing, searching and
observations are the ReAct engine's. Before each step after the first (no rubric at turn 0), the
rubric source writes a rubric for the rows about to take it from their BranchContext (the
question and the row's turns so far): with the turn engine, every active row in one call; with
the slot engine, the rows of a lane that reach the step together.

mode "coreact":
  shadow suffix  rubric_suffix(rubric) is fed after the row's context, the action is generated,
                 then the row is rewound to before the suffix (sampler.rewind) and the action's
                 exact sampled ids are fed again: the next step's context is the trajectory
                 without any rubric token. persist=True keeps the suffix in the context
                 (ablation; TurnRecord.hook_text then holds it, else TurnRecord.shadow_text).
  verify         the applier scores the action against the rubric (weighted, in [0, 1]); below
                 verify_threshold the row is rewound to before the suffix, the suffix and the
                 retry feedback (retry_suffix: the criteria the action failed) are fed, and the
                 action is generated again. Up to max_retries times; the last retry is accepted
                 without being verified (max_retries=1: one retry, accepted). An applier failure
                 (None) accepts the action.
mode "best_of_n": N actions are sampled per step from the same context (TurnPlan.samples:
                 generate, rewind, generate again ...), none of them sees a rubric; the one with
                 the highest rubric score (best_of_n_select "rubric": applier.score; rows without
                 a rubric, e.g. at turn 0, take a single sample as ReAct does) or the highest
                 mean sampled log-prob ("self", every turn) is fed back as the step's action.

Guided rollouts are for inference: an action fed again after a rewind is context (fed, not
sampled): its loss_mask is False and its logprobs 0, and the tokens it was sampled from (the
suffix) are gone, so a guided TrajectoryBatch is not an RL batch.

The engine's `trace` holds the last run's decisions (turn, row, rubric, proposals, scores,
retries) and `totals` the counts summed over every run since construction (eval.py reports them).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from agentjax.agent.guide import ACCEPT, TurnAttempt, TurnGuide, TurnPlan, TurnRows, TurnVerdict
from agentjax.agent.rollout import RolloutConfig, RolloutEngine
from agentjax.coreact import AGENTS, SELECTS  # noqa: F401 (AGENTS: re-exported)
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import (Rubric, RubricItem, fit_rubric_prompt, parse_rubric,
                                     retry_suffix, rubric_suffix, strip_think)
from agentjax.sampling import STOP_BUDGET
from agentjax.sampling.text import think_tag_ids

log = logging.getLogger(__name__)

MODES = ("coreact", "best_of_n")
# contexts -> one Rubric (or None: no rubric for that row) per context.
RubricSource = Callable[[Sequence[BranchContext]], Sequence[Rubric | None]]
# (rubric, context, action text) -> the rubric items the action failed (the retry feedback).
Feedback = Callable[[Rubric, BranchContext, str], Sequence[RubricItem]]
# The question record's fields a rubric generator and an applier may see: never the gold answers
# (nor SynthWorld's gold chain), which an agent at inference does not have.
QUESTION_FIELDS = ("id", "question", "benchmark")


# ---------------------------------------------------------------------------------------------
# Settings.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GuidedSettings:
  """config.coreact's inference settings (configs/base.py) and the mode."""
  mode: str = "coreact"
  verify: bool = True
  verify_threshold: float = 0.6
  max_retries: int = 1
  persist: bool = False
  best_of_n: int = 4
  best_of_n_select: str = "rubric"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"guided mode {self.mode!r} is unknown; choose one of {MODES}")
    if self.best_of_n_select not in SELECTS:
      raise ValueError(f"config.coreact.best_of_n_select={self.best_of_n_select!r}: choose one "
                       f"of {SELECTS}")
    if self.best_of_n < 1:
      raise ValueError(f"config.coreact.best_of_n={self.best_of_n}: must be >= 1")
    if self.max_retries < 0:
      raise ValueError(f"config.coreact.max_retries={self.max_retries}: must be >= 0")
    if not 0.0 <= self.verify_threshold <= 1.0:
      raise ValueError(f"config.coreact.verify_threshold={self.verify_threshold}: must be in "
                       f"[0, 1] (verify scores are)")

  @classmethod
  def from_config(cls, coreact: Any, mode: str) -> "GuidedSettings":
    return cls(mode=mode, verify=bool(coreact.verify),
               verify_threshold=float(coreact.verify_threshold),
               max_retries=int(coreact.max_retries), persist=bool(coreact.persist),
               best_of_n=int(coreact.best_of_n), best_of_n_select=str(coreact.best_of_n_select))

  def describe(self) -> dict[str, Any]:
    """The settings that matter for the mode (what eval.py records)."""
    if self.mode == "coreact":
      keys = ("verify", "verify_threshold", "max_retries", "persist")
    else:
      keys = ("best_of_n", "best_of_n_select")
    return {k: getattr(self, k) for k in keys}


# ---------------------------------------------------------------------------------------------
# The rubric generator.
# ---------------------------------------------------------------------------------------------


class RubricGenerator:
  """Rubrics from a Completer (a Hugging Face folder: the trained generator), one batched
  completion per call.

  The prompt is rubric.rubric_prompt(ctx) as the user turn of the tokenizer's chat template (as
  the rubric trainer's protocol "rubric" builds it), or its plain ids when the tokenizer has no
  chat template; a prompt that does not fit the completer's budget with max_new_tokens is
  rebuilt with fewer characters of trajectory (rubric_prompt keeps the question, the hint and the
  latest step). The reply, `<think>` stripped, is parsed with parse_rubric. A failed call gives
  None for every context (counted in `stats`, never raised).
  """

  def __init__(self, completer: Any, *, max_new_tokens: int = 128, temperature: float = 0.0,
               seed: int = 0, source: str = "", repetition_penalty: float = 1.0,
               max_think_tokens: int = 0):
    if max_new_tokens < 1:
      raise ValueError(f"config.coreact.generator_max_new_tokens={max_new_tokens}: must be >= 1")
    self.completer, self.max_new_tokens = completer, int(max_new_tokens)
    self.temperature, self.seed, self.source = float(temperature), int(seed), source
    self.repetition_penalty = float(repetition_penalty)
    self.max_think_tokens = int(max_think_tokens)
    if self.max_think_tokens > 0:  # refused here, not by every call (each would fail unguided)
      think_tag_ids(completer.tokenizer, "config.coreact.generator_max_think_tokens")
    self.chat = bool(getattr(completer.tokenizer, "chat_template", None))
    self.stats = {"calls": 0, "rubrics": 0, "empty": 0, "failed": 0, "too_long": 0}
    self._calls = 0

  @classmethod
  def from_config(cls, config: Any, path: str | None = None,
                  mesh: jax.sharding.Mesh | None = None) -> "RubricGenerator":
    """The generator of `path` (default config.coreact.generator_path)."""
    import os

    from agentjax.sampling.complete import Completer
    c = config.coreact
    path = os.path.expanduser(path or c.generator_path)
    if not path:
      raise ValueError("a rubric generator needs config.coreact.generator_path (or "
                       "--rubric_generator): a Hugging Face folder")
    if not os.path.isdir(path):
      raise ValueError(f"config.coreact.generator_path={path!r}: no such folder")
    completer = Completer.from_hf(path, max_total_tokens=int(c.generator_max_total_tokens),
                                  mesh=mesh)
    return cls(completer, max_new_tokens=int(c.generator_max_new_tokens),
               temperature=float(c.generator_temperature), seed=int(config.seed), source=path,
               repetition_penalty=float(c.generator_repetition_penalty),
               max_think_tokens=int(c.generator_max_think_tokens))

  def _ids(self, text: str) -> list[int]:
    return (self.completer.chat_ids([{"role": "user", "content": text}]) if self.chat
            else self.completer.encode(text))

  def prompt_ids(self, ctx: BranchContext) -> list[int] | None:
    """The generator's prompt ids for a context (rubric.fit_rubric_prompt); None when even a
    minimal prompt does not fit."""
    text = fit_rubric_prompt(ctx, lambda t: len(self._ids(t)),
                             self.completer.max_total_tokens - self.max_new_tokens)
    return None if text is None else self._ids(text)

  def __call__(self, contexts: Sequence[BranchContext]) -> list[Rubric | None]:
    prompts = [self.prompt_ids(ctx) for ctx in contexts]
    self.stats["too_long"] += sum(p is None for p in prompts)
    asked = [i for i, p in enumerate(prompts) if p is not None]
    out: list[Rubric | None] = [None] * len(contexts)
    if not asked:
      return out
    self.stats["calls"] += 1
    self._calls += 1
    try:
      completions = self.completer.complete(
          [prompts[i] for i in asked], max_new_tokens=self.max_new_tokens,
          temperature=self.temperature, seed=self.seed + self._calls,
          repetition_penalty=self.repetition_penalty, max_think_tokens=self.max_think_tokens)
    except Exception as e:  # noqa: BLE001 - a failed generator call leaves the step unguided
      log.warning("rubric generator failed (%s: %s): %d rows unguided", type(e).__name__, e,
                  len(asked))
      self.stats["failed"] += len(asked)
      return out
    for i, completion in zip(asked, completions):
      rubric = parse_rubric(strip_think(completion.text))
      self.stats["rubrics" if rubric.n else "empty"] += 1
      out[i] = rubric
    return out

  def identity(self) -> dict[str, Any]:
    return {"path": self.source, "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens, "repetition_penalty": self.repetition_penalty,
            "max_think_tokens": self.max_think_tokens}


# ---------------------------------------------------------------------------------------------
# The guide and the engine.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Guide:
  """One row's rubric for its current turn (mode "coreact")."""
  rubric: Rubric
  ctx: BranchContext
  suffix: list[int]        # rubric_suffix ids
  shown: list[int]         # what is fed before the (last) generation: suffix [+ feedback]
  trace: dict[str, Any]    # the turn's trace entry, filled as the turn goes


class RubricGuide(TurnGuide):
  """Co-ReAct's rubric guidance as a TurnGuide (agentjax/agent/guide.py), which either rollout
  engine honours (module docstring): in mode "coreact" a plan feeds the rubric suffix (kept with
  persist) and review verifies the action and answers a low one with a retry (the suffix and the
  feedback); in mode "best_of_n" a plan asks for N samples and review picks one.

  `reset(questions)` before each rollout (GuidedEngine.run does it); `trace` holds the run's
  decisions, `stats` its counts.
  """

  def __init__(self, settings: GuidedSettings, config: RolloutConfig,
               encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str], *,
               rubric_source: RubricSource | None = None, applier: Any = None,
               feedback: Feedback | None = None):
    s = self.settings = settings
    needs_rubric = s.mode == "coreact" or s.best_of_n_select == "rubric"
    if needs_rubric and rubric_source is None:
      raise ValueError(f"guided mode {s.mode!r} (select {s.best_of_n_select!r}) needs a rubric "
                       f"source (config.coreact.generator_path)")
    needs_applier = (s.mode == "coreact" and s.verify) or \
        (s.mode == "best_of_n" and s.best_of_n_select == "rubric")
    if needs_applier and applier is None:
      raise ValueError(f"guided mode {s.mode!r} needs a rubric applier to "
                       f"{'verify' if s.mode == 'coreact' else 'select by rubric score'} "
                       f"(config.coreact.applier)")
    self.config, self.encode, self.decode = config, encode, decode
    self.rubric_source, self.applier, self.feedback = rubric_source, applier, feedback
    self.trace: list[dict[str, Any]] = []
    self.questions: list[dict[str, Any]] = []
    self.stats: dict[str, float] = {}
    self._guides: dict[int, _Guide] = {}   # row -> its coreact turn in progress
    self._rubrics_of: dict[int, tuple[Rubric, BranchContext]] = {}  # row -> best_of_n's rubric

  def reset(self, questions: Sequence[Mapping[str, Any]]) -> None:
    """A new rollout of these questions (the contexts' question records)."""
    self.questions = list(questions)
    self.trace = []
    self._guides, self._rubrics_of = {}, {}
    self.stats = dict.fromkeys(
        ("rubrics", "rubric_missing", "rubric_dropped", "verify_checks", "verify_retries",
         "retry_no_room", "verify_score_sum", "applier_failures", "proposals",
         "proposal_tokens"), 0.0)

  def _context(self, rows: TurnRows, b: int) -> BranchContext:
    return BranchContext(question=self.questions[rows.group_ids[b]], turns=rows.history(b),
                         max_calls=self.config.max_turns, protocol=self.config.protocol)

  def _rubrics(self, rows: TurnRows) -> dict[int, tuple[Rubric, Any]]:
    """row -> (rubric, context) for the rows the source gave a usable rubric (none at turn 0)."""
    which = [int(b) for b in rows.rows]
    if rows.turn == 0 or not which:
      return {}
    contexts = [self._context(rows, b) for b in which]
    try:
      got = list(self.rubric_source(contexts))
      if len(got) != len(contexts):
        raise ValueError(f"{len(got)} rubrics for {len(contexts)} contexts")
    except Exception as e:  # noqa: BLE001 - no rubric: the step is taken unguided
      log.warning("rubric source failed (%s: %s): turn %d unguided", type(e).__name__, e,
                  rows.turn)
      got = [None] * len(contexts)
    out = {}
    for b, ctx, rubric in zip(which, contexts, got):
      if rubric is None or rubric.n == 0:
        self.stats["rubric_missing"] += 1
        continue
      self.stats["rubrics"] += 1
      out[b] = (rubric, ctx)
    return out

  def _score(self, rubrics, contexts, texts) -> list[float | None]:
    try:
      scores = list(self.applier.score(list(rubrics), list(contexts), list(texts)))
      if len(scores) != len(texts):
        raise ValueError(f"{len(scores)} scores for {len(texts)} actions")
    except Exception as e:  # noqa: BLE001 - appliers should not raise; if one does, accept
      log.warning("rubric applier failed (%s: %s)", type(e).__name__, e)
      scores = [None] * len(texts)
    self.stats["applier_failures"] += sum(s is None for s in scores)
    return [None if s is None else float(s) for s in scores]

  def _failed(self, guide: _Guide, text: str) -> Sequence[RubricItem]:
    if self.feedback is None:
      return ()
    try:
      return list(self.feedback(guide.rubric, guide.ctx, text))
    except Exception as e:  # noqa: BLE001 - feedback is a nicety: the generic text then
      log.warning("retry feedback failed (%s: %s)", type(e).__name__, e)
      return ()

  # ------------------------------------------------------------------ TurnGuide

  def begin(self, rows: TurnRows) -> list[TurnPlan | None]:
    if self.settings.mode == "coreact":
      return self._coreact_plans(rows)
    return self._best_of_n_plans(rows)

  def review(self, rows: TurnRows, attempts: Sequence[TurnAttempt]) -> list[TurnVerdict]:
    if self.settings.mode == "coreact":
      return self._coreact_review(rows, attempts)
    return self._best_of_n_review(rows, attempts)

  # ------------------------------------------------------------------ Co-ReAct

  def _coreact_plans(self, rows: TurnRows) -> list[TurnPlan | None]:
    s, max_new = self.settings, self.config.max_new_tokens
    plans: dict[int, TurnPlan] = {}
    for b, (rubric, ctx) in self._rubrics(rows).items():
      ids = self.encode(rubric_suffix(rubric))
      # The suffix must leave room for a whole action: otherwise the step goes unguided.
      if int(rows.length[b]) + len(ids) + max_new > rows.budget:
        self.stats["rubric_dropped"] += 1
        continue
      self._guides[b] = _Guide(rubric, ctx, ids, list(ids), {
          "turn": rows.turn, "row": b, "rubric": rubric.raw, "actions": [], "scores": []})
      plans[b] = TurnPlan(prefix=ids, keep=s.persist)
    return [plans.get(int(b)) for b in rows.rows]

  def _coreact_review(self, rows: TurnRows, attempts: Sequence[TurnAttempt]
                      ) -> list[TurnVerdict]:
    s, max_new = self.settings, self.config.max_new_tokens
    texts = [self.decode(a.ids[0]) for a in attempts]
    # The first action is verified, a retry only while retries are left (the last retry is
    # accepted as it is); an action cut off by the budget is accepted.
    check = [i for i, a in enumerate(attempts)
             if s.verify and a.reasons[0] != STOP_BUDGET and (a.number == 0 or
                                                              a.number < s.max_retries)]
    scores: dict[int, float | None] = {}
    if check:
      got = self._score([self._guides[attempts[i].row].rubric for i in check],
                        [self._guides[attempts[i].row].ctx for i in check],
                        [texts[i] for i in check])
      self.stats["verify_checks"] += sum(x is not None for x in got)
      self.stats["verify_score_sum"] += sum(x for x in got if x is not None)
      scores = dict(zip(check, got))
    out = []
    for i, (a, text) in enumerate(zip(attempts, texts)):
      g = self._guides[a.row]
      g.trace["actions"].append(text)
      score = scores.get(i)
      if i in scores:
        g.trace["scores"].append(score)
      if score is not None and score < s.verify_threshold and a.number < s.max_retries:
        shown = g.suffix + self.encode(retry_suffix(g.rubric, self._failed(g, text)))
        if int(rows.length[a.row]) + len(shown) + max_new > rows.budget:
          self.stats["retry_no_room"] += 1  # no room for the feedback and a new action
        else:
          g.shown = shown
          self.stats["verify_retries"] += 1
          out.append(TurnVerdict(retry=shown))
          continue
      g.trace.update(ids=list(a.ids[0]), shown=self.decode(g.shown),
                     retries=len(g.trace["actions"]) - 1)
      self.trace.append(g.trace)
      del self._guides[a.row]
      out.append(ACCEPT)
    return out

  # ------------------------------------------------------------------ Best-of-N

  def _best_of_n_plans(self, rows: TurnRows) -> list[TurnPlan | None]:
    s = self.settings
    if s.best_of_n_select == "rubric":
      guides = self._rubrics(rows)  # rows without a rubric (turn 0) take a single sample
      many = set(guides)
    else:
      guides, many = {}, {int(b) for b in rows.rows}
    if s.best_of_n == 1:
      return [None] * len(rows.rows)
    self._rubrics_of.update(guides)
    plan = TurnPlan(samples=s.best_of_n, logprobs=True)
    return [plan if int(b) in many else None for b in rows.rows]

  def _best_of_n_review(self, rows: TurnRows, attempts: Sequence[TurnAttempt]
                        ) -> list[TurnVerdict]:
    s = self.settings
    n = s.best_of_n
    self.stats["proposals"] += n * len(attempts)
    self.stats["proposal_tokens"] += sum(len(ids) for a in attempts for ids in a.ids)
    texts = [[self.decode(ids) for ids in a.ids] for a in attempts]
    self_scores = [[float(np.mean(lp)) if len(lp) else -np.inf for lp in a.logprobs]
                   for a in attempts]
    if s.best_of_n_select == "rubric":
      guides = [self._rubrics_of.pop(a.row) for a in attempts]
      got = self._score([g[0] for g in guides for _ in range(n)],
                        [g[1] for g in guides for _ in range(n)], [t for ts in texts for t in ts])
      scores = [got[i * n:(i + 1) * n] for i in range(len(attempts))]
    else:
      guides = [None] * len(attempts)
      scores = self_scores
    out = []
    for a, guide, text, row, own in zip(attempts, guides, texts, scores, self_scores):
      pick_by = own if all(x is None for x in row) else row  # every applier call failed
      pick = int(np.argmax([-np.inf if x is None else x for x in pick_by]))
      self.trace.append({"turn": rows.turn, "row": a.row, "select": s.best_of_n_select,
                         "rubric": guide[0].raw if guide is not None else None,
                         "actions": text, "scores": row, "self_scores": own,
                         "logprobs": list(a.logprobs), "ids": [list(ids) for ids in a.ids],
                         "chosen": pick})
      out.append(TurnVerdict(choose=pick))
    return out


class GuidedEngine(RolloutEngine):
  """A RolloutEngine whose steps are guided by rubrics (module docstring): its guide is a
  RubricGuide, honoured by either rollout engine (rollout.engine). For inference only."""

  def __init__(self, cfg: Any, tokenizer: Any, backend: Any, config: RolloutConfig,
               settings: GuidedSettings, *, rubric_source: RubricSource | None = None,
               applier: Any = None, feedback: Feedback | None = None,
               mesh: jax.sharding.Mesh | None = None, lora: Any = None):
    """
    Args:
      settings: the mode and config.coreact's settings.
      rubric_source: contexts -> Rubric | None per context (RubricGenerator); needed by
        "coreact" and by "best_of_n" with select "rubric".
      applier: agentjax.coreact.appliers.RubricApplier (`score`): needed to verify and by
        "best_of_n" with select "rubric".
      feedback: the failed items of an action for the retry text (executor.failed_items for the
        executor applier); None: retry_suffix's generic feedback.
    """
    super().__init__(cfg, tokenizer, backend, config, mesh=mesh, lora=lora)
    self.guide = RubricGuide(settings, config, self.encode, self.decode,
                             rubric_source=rubric_source, applier=applier, feedback=feedback)
    self.totals: dict[str, float] = {}

  settings = property(lambda self: self.guide.settings)
  rubric_source = property(lambda self: self.guide.rubric_source)
  applier = property(lambda self: self.guide.applier)
  feedback = property(lambda self: self.guide.feedback)
  trace = property(lambda self: self.guide.trace,
                   doc="The last run's decisions (turn, row, rubric, proposals, scores, retries).")

  def run(self, params: Any, questions: Sequence[str], rng: jax.Array,
          policy_for_turn: Callable[[int], str] | None = None,
          records: Sequence[Mapping[str, Any]] | None = None):
    """RolloutEngine.run, guided. records: the question records (one per question; their
    QUESTION_FIELDS form the contexts' question); default {"question": text}. Metrics gain
    "guided_*" counts (rubrics generated, verify checks / retries / mean score, ...)."""
    if records is not None and len(records) != len(questions):
      raise ValueError(f"{len(records)} records for {len(questions)} questions")
    self.guide.reset([
        {k: r[k] for k in QUESTION_FIELDS if k in r} if r is not None else {"question": q}
        for q, r in zip(questions, records if records is not None else [None] * len(questions))])
    batch, metrics = super().run(params, questions, rng, policy_for_turn=policy_for_turn)
    st = self.guide.stats
    for k, v in st.items():
      self.totals[k] = self.totals.get(k, 0.0) + v
    metrics.update({f"guided_{k}": float(v) for k, v in st.items() if k != "verify_score_sum"})
    metrics["guided_verify_score_mean"] = \
        st["verify_score_sum"] / st["verify_checks"] if st["verify_checks"] else float("nan")
    return batch, metrics

  def summary(self) -> dict[str, float]:
    """The totals over every run, with the mean verify score."""
    out = dict(self.totals)
    checks = out.pop("verify_score_sum", 0.0)
    out["verify_score_mean"] = checks / out["verify_checks"] if out.get("verify_checks") else None
    return out


# ---------------------------------------------------------------------------------------------
# Building one from a config.
# ---------------------------------------------------------------------------------------------

def make_guided_engine(config: Any, cfg: Any, tokenizer: Any, backend: Any,
                       rollout: RolloutConfig, agent: str, *, generator_path: str | None = None,
                       mesh: jax.sharding.Mesh | None = None, lora: Any = None,
                       rubric_source: RubricSource | None = None) -> GuidedEngine:
  """A GuidedEngine for `agent` ("coreact" | "best_of_n") from config.coreact: the rubric
  generator (generator_path or config.coreact.generator_path, unless a rubric_source is given;
  not loaded for best_of_n with select "self"), the applier (config.coreact.applier) and, for
  the executor applier, its failed criteria as the retry feedback."""
  from agentjax.coreact.appliers import ExecutorApplier, build_applier
  if agent not in MODES:
    raise ValueError(f"agent {agent!r}: a guided agent is one of {MODES}")
  settings = GuidedSettings.from_config(config.coreact, agent)
  wants_rubrics = agent == "coreact" or settings.best_of_n_select == "rubric"
  if wants_rubrics and rubric_source is None:
    rubric_source = RubricGenerator.from_config(config, generator_path, mesh=mesh)
  needs_applier = (agent == "coreact" and settings.verify) or wants_rubrics
  applier = build_applier(config, mesh=mesh) if needs_applier else None
  feedback = None
  if isinstance(applier, ExecutorApplier):
    from agentjax.coreact.executor import failed_items
    entities = applier.entities
    feedback = lambda rubric, ctx, text: failed_items(rubric, ctx, text, entities)  # noqa: E731
  return GuidedEngine(cfg, tokenizer, backend, rollout, settings,
                      rubric_source=rubric_source if wants_rubrics else None, applier=applier,
                      feedback=feedback, mesh=mesh, lora=lora)


__all__ = ["AGENTS", "GuidedEngine", "GuidedSettings", "MODES", "RubricGenerator", "RubricGuide",
           "make_guided_engine"]
