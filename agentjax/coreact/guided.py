"""Rubric-guided search agents at inference (Co-ReAct, methods spec §4): shadow suffix, verify and
retry, Best-of-N.

    generator = RubricGenerator.from_config(config)            # a Completer over an HF folder
    engine = GuidedEngine(cfg, tokenizer, backend, rollout, GuidedSettings.from_config(
        config.coreact, "coreact"), rubric_source=generator, applier=build_applier(config))
    batch, metrics = engine.run(params, questions, rng)        # as RolloutEngine.run

A GuidedEngine is a RolloutEngine whose per-turn generation (`_generate_turn`) is shaped by a
rubric; parsing, searching and observations are the ReAct engine's. Before each step after the
first (no rubric at turn 0), the rubric source writes a rubric for every active row from its
BranchContext (the question and the row's turns so far).

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
mode "best_of_n": N actions are sampled per step from the same context (generate, rewind,
                 generate again ...), none of them sees a rubric; the one with the highest rubric
                 score (best_of_n_select "rubric": applier.score; rows without a rubric, e.g. at
                 turn 0, take a single sample as ReAct does) or the highest mean sampled log-prob
                 ("self", every turn) is fed back as the step's action.

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
import jax.numpy as jnp
import numpy as np

from agentjax.agent.rollout import (GeneratedTurn, RolloutConfig, RolloutEngine, TurnRows)
from agentjax.coreact import AGENTS, SELECTS  # noqa: F401 (AGENTS: re-exported)
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rubric import (Rubric, RubricItem, fit_rubric_prompt, parse_rubric,
                                     retry_suffix, rubric_suffix, strip_think)
from agentjax.parallel.host import to_host
from agentjax.sampling import STOP_BUDGET
from agentjax.sampling.sampler import rewind

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
               seed: int = 0, source: str = ""):
    if max_new_tokens < 1:
      raise ValueError(f"config.coreact.generator_max_new_tokens={max_new_tokens}: must be >= 1")
    self.completer, self.max_new_tokens = completer, int(max_new_tokens)
    self.temperature, self.seed, self.source = float(temperature), int(seed), source
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
               temperature=float(c.generator_temperature), seed=int(config.seed), source=path)

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
          temperature=self.temperature, seed=self.seed + self._calls)
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
            "max_new_tokens": self.max_new_tokens}


# ---------------------------------------------------------------------------------------------
# The engine.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Guide:
  """One row's rubric for the step."""
  rubric: Rubric
  ctx: BranchContext
  suffix: list[int]        # rubric_suffix ids
  shown: list[int]         # what is fed before the (last) generation: suffix [+ feedback]


class GuidedEngine(RolloutEngine):
  """A RolloutEngine whose steps are guided by rubrics (module docstring). For inference only."""

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
    self.rubric_source, self.applier, self.feedback = rubric_source, applier, feedback
    self.trace: list[dict[str, Any]] = []
    self.totals: dict[str, float] = {}
    self._questions: list[dict[str, Any]] = []
    self._stats: dict[str, float] = {}

  # ------------------------------------------------------------------ the run

  def run(self, params: Any, questions: Sequence[str], rng: jax.Array,
          policy_for_turn: Callable[[int], str] | None = None,
          records: Sequence[Mapping[str, Any]] | None = None):
    """RolloutEngine.run, guided. records: the question records (one per question; their
    QUESTION_FIELDS form the contexts' question); default {"question": text}. Metrics gain
    "guided_*" counts (rubrics generated, verify checks / retries / mean score, ...)."""
    if records is not None and len(records) != len(questions):
      raise ValueError(f"{len(records)} records for {len(questions)} questions")
    self._questions = [
        {k: r[k] for k in QUESTION_FIELDS if k in r} if r is not None else {"question": q}
        for q, r in zip(questions, records if records is not None else [None] * len(questions))]
    self.trace = []
    self._stats = dict.fromkeys(
        ("rubrics", "rubric_missing", "rubric_dropped", "verify_checks", "verify_retries",
         "retry_no_room", "verify_score_sum", "applier_failures", "proposals",
         "proposal_tokens"), 0.0)
    batch, metrics = super().run(params, questions, rng, policy_for_turn=policy_for_turn)
    st = self._stats
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

  def _context(self, rows: TurnRows, b: int) -> BranchContext:
    return BranchContext(question=self._questions[rows.group_ids[b]], turns=rows.history(b),
                         max_calls=self.config.max_turns, protocol=self.config.protocol)

  def _rubrics(self, rows: TurnRows, which: Sequence[int]) -> dict[int, tuple[Rubric, Any]]:
    """row -> (rubric, context) for the rows the source gave a usable rubric (none at turn 0)."""
    if rows.turn == 0 or not len(which):
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
        self._stats["rubric_missing"] += 1
        continue
      self._stats["rubrics"] += 1
      out[int(b)] = (rubric, ctx)
    return out

  def _score(self, rubrics, contexts, texts) -> list[float | None]:
    try:
      scores = list(self.applier.score(list(rubrics), list(contexts), list(texts)))
      if len(scores) != len(texts):
        raise ValueError(f"{len(scores)} scores for {len(texts)} actions")
    except Exception as e:  # noqa: BLE001 - appliers should not raise; if one does, accept
      log.warning("rubric applier failed (%s: %s)", type(e).__name__, e)
      scores = [None] * len(texts)
    self._stats["applier_failures"] += sum(s is None for s in scores)
    return [None if s is None else float(s) for s in scores]

  def _generate(self, policy, decoder, state, active, turn_arr, stop, rows) -> GeneratedTurn:
    """One plain generate call for the `active` rows (RolloutEngine's step)."""
    return RolloutEngine._generate_turn(self, policy, decoder, state, active, turn_arr, stop,
                                        rows)

  def _rewind(self, state, rows_to: dict[int, int], logits: jax.Array | None = None):
    """Rows in rows_to back to their given length (the others unchanged)."""
    lengths = np.full(state.length.shape[0], np.iinfo(np.int32).max, np.int32)
    for b, n in rows_to.items():
      lengths[b] = n
    return rewind(state, jnp.asarray(lengths), logits)

  def _generate_turn(self, policy, decoder, state, active, turn_arr, stop, rows):
    if self.settings.mode == "coreact":
      return self._coreact_turn(policy, decoder, state, active, turn_arr, stop, rows)
    return self._best_of_n_turn(policy, decoder, state, active, turn_arr, stop, rows)

  # ------------------------------------------------------------------ Co-ReAct

  def _coreact_turn(self, policy, decoder, state, active, turn_arr, stop, rows):
    s, length, n_rows = self.settings, rows.length, len(active)
    guides: dict[int, _Guide] = {}
    for b, (rubric, ctx) in self._rubrics(rows, rows.rows).items():
      ids = self.encode(rubric_suffix(rubric))
      # The suffix must leave room for a whole action: otherwise the step goes unguided.
      if int(length[b]) + len(ids) + self.config.max_new_tokens > rows.budget:
        self._stats["rubric_dropped"] += 1
        continue
      guides[b] = _Guide(rubric, ctx, ids, list(ids))
    if not guides:
      return self._generate(policy, decoder, state, active, turn_arr, stop, rows)

    state = self._feed(policy, state, [guides[b].shown if b in guides else []
                                       for b in range(n_rows)], turn_arr)
    gen = self._generate(policy, decoder, state, active, turn_arr, stop, rows)
    state, sampled = gen.state, int(gen.num_new.sum())
    new_tokens, num_new, reason = (np.array(x) for x in (gen.new_tokens, gen.num_new,
                                                          gen.reason))
    trace = {b: {"turn": rows.turn, "row": int(b), "rubric": g.rubric.raw,
                 "actions": [self.decode(new_tokens[b, :num_new[b]])], "scores": []}
             for b, g in guides.items()}

    pending = [b for b in guides if reason[b] != STOP_BUDGET] if s.verify else []
    attempt = 0
    while pending:
      texts = [self.decode(new_tokens[b, :num_new[b]]) for b in pending]
      scores = self._score([guides[b].rubric for b in pending], [guides[b].ctx for b in pending],
                           texts)
      self._stats["verify_checks"] += sum(x is not None for x in scores)
      self._stats["verify_score_sum"] += sum(x for x in scores if x is not None)
      low = []
      for b, text, score in zip(pending, texts, scores):
        trace[b]["scores"].append(score)
        if score is not None and score < s.verify_threshold and attempt < s.max_retries:
          g = guides[b]
          failed = self._failed(g, text)
          shown = g.suffix + self.encode(retry_suffix(g.rubric, failed))
          if int(length[b]) + len(shown) + self.config.max_new_tokens > rows.budget:
            self._stats["retry_no_room"] += 1
            continue  # no room for the feedback and a new action: the action stands
          g.shown = shown
          low.append(b)
      if not low:
        break
      self._stats["verify_retries"] += len(low)
      again = np.zeros(n_rows, bool)
      again[low] = True
      state = self._rewind(state, {b: int(length[b]) for b in low})
      state = self._feed(policy, state, [guides[b].shown if again[b] else []
                                         for b in range(n_rows)], turn_arr)
      retry = self._generate(policy, decoder, state, again, turn_arr, stop, rows)
      state = retry.state
      sampled += int(retry.num_new.sum())
      for b in low:
        new_tokens[b], num_new[b], reason[b] = retry.new_tokens[b], retry.num_new[b], \
            retry.reason[b]
        trace[b]["actions"].append(self.decode(new_tokens[b, :num_new[b]]))
      attempt += 1
      # A retry is verified again only while retries are left: the last one is accepted as it is.
      pending = [b for b in low if reason[b] != STOP_BUDGET] if attempt < s.max_retries else []

    added = num_new.astype(np.int64).copy()
    hooks, shadows = {}, {}
    if s.persist:
      for b, g in guides.items():
        added[b] += len(g.shown)
        hooks[b] = self.decode(g.shown)
    else:
      # The shadow suffix leaves: back to before it, the action's exact ids fed again.
      state = self._rewind(state, {b: int(length[b]) for b in guides})
      state = self._feed(policy, state, [list(new_tokens[b, :num_new[b]]) if b in guides else []
                                         for b in range(n_rows)], turn_arr)
      shadows = {b: self.decode(g.shown) for b, g in guides.items()}
    for b, entry in trace.items():
      entry.update(ids=new_tokens[b, :num_new[b]].tolist(), shown=self.decode(guides[b].shown),
                   retries=len(entry["actions"]) - 1)
    self.trace += trace.values()
    return GeneratedTurn(state=state, new_tokens=new_tokens, num_new=num_new, reason=reason,
                         context_added=added, hook_texts=hooks, shadow_texts=shadows,
                         sampled_tokens=sampled)

  def _failed(self, guide: _Guide, text: str) -> Sequence[RubricItem]:
    if self.feedback is None:
      return ()
    try:
      return list(self.feedback(guide.rubric, guide.ctx, text))
    except Exception as e:  # noqa: BLE001 - feedback is a nicety: the generic text then
      log.warning("retry feedback failed (%s: %s)", type(e).__name__, e)
      return ()

  # ------------------------------------------------------------------ Best-of-N

  def _best_of_n_turn(self, policy, decoder, state, active, turn_arr, stop, rows):
    s, length, n_rows = self.settings, rows.length, len(active)
    if s.best_of_n_select == "rubric":
      guides = self._rubrics(rows, rows.rows)
      many = sorted(guides)
    else:
      guides, many = {}, [int(b) for b in rows.rows]
    if s.best_of_n == 1 or not many:
      return self._generate(policy, decoder, state, active, turn_arr, stop, rows)

    saved = jnp.copy(state.next_logits)  # generate donates the state: a copy of the logits
    again = np.zeros(n_rows, bool)
    again[many] = True
    proposals = []  # per sample: (new_tokens, num_new, reason, logprobs per row)
    sampled = 0
    for i in range(s.best_of_n):
      gen = self._generate(policy, decoder, state, active if i == 0 else again, turn_arr, stop,
                           rows)
      state = gen.state
      sampled += int(gen.num_new.sum())
      logprobs = np.asarray(to_host(state.logprobs))
      lp = [logprobs[b, length[b]:length[b] + gen.num_new[b]] if again[b] else None
            for b in range(n_rows)]
      proposals.append((gen.new_tokens, gen.num_new, gen.reason, lp))
      state = self._rewind(state, {b: int(length[b]) for b in many}, saved)
    self._stats["proposals"] += s.best_of_n * len(many)
    self._stats["proposal_tokens"] += sampled

    texts = {b: [self.decode(p[0][b, :p[1][b]]) for p in proposals] for b in many}
    self_scores = {b: [float(np.mean(p[3][b])) if p[1][b] else -np.inf for p in proposals]
                   for b in many}
    if s.best_of_n_select == "rubric":
      flat = [(b, k) for b in many for k in range(s.best_of_n)]
      got = self._score([guides[b][0] for b, _ in flat], [guides[b][1] for b, _ in flat],
                        [texts[b][k] for b, k in flat])
      scores = {b: [got[i * s.best_of_n + k] for k in range(s.best_of_n)]
                for i, b in enumerate(many)}
    else:
      scores = self_scores

    new_tokens, num_new, reason = (np.array(x) for x in proposals[0][:3])
    for b in many:
      row = scores[b]
      if all(x is None for x in row):  # every applier call failed: the policy's own choice
        row = self_scores[b]
      pick = int(np.argmax([-np.inf if x is None else x for x in row]))
      p = proposals[pick]
      new_tokens[b], num_new[b], reason[b] = p[0][b], p[1][b], p[2][b]
      self.trace.append({"turn": rows.turn, "row": b, "select": s.best_of_n_select,
                         "rubric": guides[b][0].raw if b in guides else None,
                         "actions": texts[b], "scores": scores[b],
                         "self_scores": self_scores[b], "logprobs": [p[3][b] for p in proposals],
                         "ids": [p[0][b, :p[1][b]].tolist() for p in proposals], "chosen": pick})
    # Rows that drew several actions are back before them: the chosen one is fed.
    state = self._feed(policy, state, [list(new_tokens[b, :num_new[b]]) if again[b] else []
                                       for b in range(n_rows)], turn_arr)
    return GeneratedTurn(state=state, new_tokens=new_tokens, num_new=num_new, reason=reason,
                         sampled_tokens=sampled)


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


__all__ = ["AGENTS", "GuidedEngine", "GuidedSettings", "MODES", "RubricGenerator",
           "make_guided_engine"]
