"""DAC's two-role rollout: a searcher gathers evidence, a generator answers from it or abstains.

    agent = DacAgent(cfg, tokenizer, backend, searcher_rollout, DacSettings.from_config(config),
                     lora=spec)
    out, metrics = agent.run({"searcher": p_s, "generator": p_g}, questions, rng, golds=golds,
                             aug_rng=r)

  questions ─► searcher rollout (the search protocol, group_size per question; it hands over with
               its <answer> action, whose text is not used, or when it runs out of turns)
            ─► evidence set per trajectory: its documents, deduplicated, in retrieval order
            ─► (training) hard-positive augmentation: one batched retriever call for the queries
               of the sets that get it (agentjax/dac/rewards.py)
            ─► generator rollout in a fresh context: the question and the evidence set only (the
               searcher's turns too with `sees_reasoning`), m answers per set, one turn, no search
            ─► labels: S per set (on the documents the generator was shown), C and abstention per
               answer

Both stages run the same backbone; the params of each role select its adapter (models/lora.attach:
the adapter index is data, so switching roles compiles nothing). The hand-over is our reading
(the paper is silent on how the searcher stops and what the generator reads;
config.dac.generator_sees_reasoning).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from agentjax.agent.protocol import ANSWER_ONLY, format_documents
from agentjax.agent.rollout import RolloutConfig, RolloutEngine
from agentjax.agent.trajectories import TrajectoryBatch
from agentjax.dac import rewards as R
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import QwenConfig
from agentjax.retrieval import Document, SearchBackend

ROLES = ("searcher", "generator")  # the LoRA adapter of each role, by name

# The generator's instruction (our words; the paper's prompts are not public). {abstain} is
# dac.abstain_text; {notes} is empty unless dac.generator_sees_reasoning.
GENERATOR_TEMPLATE = (
    "Answer the question using only the documents below. If they do not contain the answer, "
    "reply <answer> {abstain} </answer>. Otherwise give the answer inside <answer> and </answer>, "
    "without detailed illustrations.\n{notes}Documents:\n{documents}Question: {question}\n")


def generator_prompt(question: str, docs: Sequence[Document], abstain_text: str,
                     notes: str | None = None) -> str:
  """The generator's prompt text (GENERATOR_TEMPLATE); `notes`: the searcher's turns as text."""
  return GENERATOR_TEMPLATE.format(
      abstain=abstain_text, question=question,
      documents=format_documents(docs) if docs else "(none)\n",
      notes=f"Notes from the search:\n{notes.strip()}\n" if notes else "")


@dataclasses.dataclass(frozen=True)
class DacSettings:
  """config.dac as the rollout and the step read it (configs/base.py documents each field)."""
  generator_samples: int = 4
  generator_group: str = "evidence"
  sees_reasoning: bool = False
  max_evidence_docs: int = 8
  generator_max_new_tokens: int = 64
  generator_max_total_tokens: int = 1024
  abstain_text: str = "insufficient evidence"
  sufficiency_match: str = "word"
  alpha: float = 0.3
  insufficient_answer_penalty: float = 0.0
  searcher_reward: str = "sufficient_answered"
  augment_rate: float = 0.5
  augment_k: int = 2
  augment_depth: int = 10

  @classmethod
  def from_config(cls, config: Any) -> "DacSettings":
    d = config.dac
    return cls(generator_samples=d.generator_samples, generator_group=d.generator_group,
               sees_reasoning=d.generator_sees_reasoning, max_evidence_docs=d.max_evidence_docs,
               generator_max_new_tokens=d.generator_max_new_tokens,
               generator_max_total_tokens=d.generator_max_total_tokens,
               abstain_text=d.abstain_text, sufficiency_match=d.sufficiency_match,
               alpha=float(d.alpha), insufficient_answer_penalty=float(
                   d.insufficient_answer_penalty), searcher_reward=d.searcher_reward,
               augment_rate=float(d.augment_rate), augment_k=d.augment_k,
               augment_depth=d.augment_depth)


@dataclasses.dataclass
class DacBatch:
  """One two-role rollout. E = evidence sets (searcher rows, Q * group_size), m answers each;
  generator row g answers evidence set g // m.

  searcher: TrajectoryBatch [E]; generator: TrajectoryBatch [E * m] (its group_ids: the set).
  evidence: [E] the documents each set showed the generator (after augmentation and the budget).
  sufficient: [E] bool S of what was shown; distractors: [E] int added (`augmented`: > 0). abstained, correct: [E * m] bool. retrieved_sufficient: [E] bool
  S of everything the searcher retrieved (before the caps). metrics: the rollouts' counts and
  times.
  """
  searcher: TrajectoryBatch
  generator: TrajectoryBatch
  evidence: list[tuple[Document, ...]]
  sufficient: np.ndarray
  distractors: np.ndarray
  abstained: np.ndarray
  correct: np.ndarray
  retrieved_sufficient: np.ndarray
  metrics: dict[str, Any]

  @property
  def augmented(self) -> np.ndarray:
    """[E] bool: the set got distractors."""
    return self.distractors > 0

  @property
  def samples(self) -> int:
    return self.generator.tokens.shape[0] // self.searcher.tokens.shape[0]

  # What evaluation reads of a rollout (train/evaluation.evaluate), per evidence set, from its
  # first generator answer: an abstention is no answer (scored 0) and is counted apart.
  @property
  def answers(self) -> np.ndarray:
    return self.generator.answers[::self.samples]

  @property
  def answered(self) -> np.ndarray:
    first = slice(None, None, self.samples)
    return self.generator.answered[first] & ~self.abstained[first]

  @property
  def abstentions(self) -> np.ndarray:
    return self.abstained[::self.samples]

  # self.sufficient ([E]) is per evidence set already.

  @property
  def num_turns(self) -> np.ndarray:
    return self.searcher.num_turns

  @property
  def format_valid(self) -> np.ndarray:
    return self.generator.format_valid[::self.samples]


class DacAgent:
  """The searcher and the generator over one backbone (module docstring)."""

  labels_from_golds = True  # evaluation passes golds to `run`: S and C per evidence set

  def __init__(self, cfg: QwenConfig, tokenizer: Any, backend: SearchBackend,
               searcher: RolloutConfig, settings: DacSettings, mesh: jax.sharding.Mesh | None = None,
               lora: LoraSpec | None = None, samples: int | None = None):
    """searcher: the searcher's rollout settings (its sampling is the generator's too).
    samples: the generator's answers per evidence set (default settings.generator_samples; eval
    passes 1). lora None: both roles run the params they are given as they are."""
    self.settings, self.backend = settings, backend
    self.searcher = RolloutEngine(cfg, tokenizer, backend, searcher, mesh=mesh, lora=lora)
    generator = RolloutConfig(
        protocol=ANSWER_ONLY.name, group_size=samples or settings.generator_samples, max_turns=1,
        max_new_tokens=settings.generator_max_new_tokens,
        max_obs_tokens=searcher.max_obs_tokens,
        max_total_tokens=settings.generator_max_total_tokens, topk=searcher.topk,
        sampling=searcher.sampling, use_chat_template=searcher.use_chat_template,
        engine=searcher.engine, slots=searcher.slots, lanes=searcher.lanes,
        refill_fraction=searcher.refill_fraction, kv_window_min=searcher.kv_window_min,
        prefill_rows=searcher.prefill_rows, compact_factor=searcher.compact_factor,
        row_bucket_factor=searcher.row_bucket_factor)
    self.generator = RolloutEngine(cfg, tokenizer, backend, generator, mesh=mesh, lora=lora)

  def _fits(self, question: str, docs: Sequence[Document], note: str | None) -> bool:
    """Whether the generator's prompt and an answer of generator_max_new_tokens fit its budget."""
    s = self.settings
    text = generator_prompt(question, docs, s.abstain_text, note)
    return len(self.generator.prompt_ids(text)) <= \
        s.generator_max_total_tokens - s.generator_max_new_tokens

  def fit(self, question: str, docs: Sequence[Document], note: str | None
          ) -> tuple[tuple[Document, ...], str | None]:
    """(documents, notes) that fit the generator's budget: documents dropped from the end (the
    last retrieved first), then the notes cut to their last characters (the searcher's latest
    turns); ValueError naming the fields when the bare question and instruction do not fit."""
    s = self.settings
    docs = list(docs)
    while docs and not self._fits(question, docs, note):
      docs.pop()
    while note and not self._fits(question, docs, note):
      note = note[len(note) // 2 + 1:]  # halves: a handful of tokenizations at most
    if not self._fits(question, docs, note):
      raise ValueError(
          f"dac.generator_max_total_tokens={s.generator_max_total_tokens}: the generator's prompt "
          f"for {question[:60]!r} does not fit even without documents (with "
          f"dac.generator_max_new_tokens={s.generator_max_new_tokens})")
    return tuple(docs), note or None

  def distractors(self, batch: TrajectoryBatch, rows: Sequence[int],
                  evidence: Sequence[Sequence[Document]], golds: Sequence[Any]
                  ) -> tuple[dict[int, list[Document]], int]:
    """({row: answer-free hits (rewards.distractor_candidates)}, queries that failed) for the
    searcher's queries of `rows`, in one batched retriever call of depth augment_depth (the
    searcher engine's guarded search: a failed call or query gives no hits, and the set stays as
    it is: a retriever fault never stops training)."""
    s = self.settings
    queries = {b: [t.action.content for t in batch.turns[b] if t.documents] for b in rows}
    flat = [q for b in rows for q in queries[b]]
    if not flat:
      return {}, 0
    response = self.searcher.search(flat, s.augment_depth)
    out, i = {}, 0
    for b in rows:
      hits = [d if e is None else [] for d, e in zip(response.documents[i:i + len(queries[b])],
                                                     response.errors[i:i + len(queries[b])])]
      i += len(queries[b])
      out[b] = R.distractor_candidates(hits, evidence[b], golds[b], s.sufficiency_match)
    return out, sum(e is not None for e in response.errors)

  def run(self, params: Mapping[str, Any], questions: Sequence[str], rng: jax.Array,
          golds: Sequence[Any] | None = None, aug_rng: np.random.Generator | None = None
          ) -> tuple[DacBatch, dict[str, Any]]:
    """Both stages for Q questions (module docstring).

    The evidence a generator is shown: the searcher's first max_evidence_docs documents, fitted
    to the generator's budget (`fit`); an augmented set then gets up to augment_k distractors
    (as many as still fit) and is shuffled. Distractors hold no gold answer, so S is the same
    with or without them.

    Args:
      params: {"searcher": params, "generator": params} (each with its adapter selected).
      golds: Q gold answer lists: needed for the labels (without them, S and C are all False:
        eval scores answers itself).
      aug_rng: a numpy Generator: augment (training); None: no augmentation (eval).
    Returns:
      (DacBatch, metrics): as RolloutEngine.run, the two rollouts' metrics prefixed "searcher_"
      and "generator_", and "augment_failures" (the augmentation's retriever queries that
      failed) (also DacBatch.metrics).
    """
    s = self.settings
    rng_s, rng_g = jax.random.split(rng)
    sb, s_metrics = self.searcher.run(params["searcher"], questions, rng_s)
    rows = len(sb.group_ids)
    row_q = [questions[g] for g in sb.group_ids]
    row_golds = [golds[g] for g in sb.group_ids] if golds is not None else [None] * rows
    retrieved = [R.evidence_set([t.documents for t in turns]) for turns in sb.turns]
    # The searcher's text (its reasoning and queries, not the documents again) when asked.
    notes = [("".join(t.text for t in turns) if s.sees_reasoning else None) for turns in sb.turns]
    evidence, notes = map(list, zip(*(self.fit(q, docs[:s.max_evidence_docs], note)
                                      for q, docs, note in zip(row_q, retrieved, notes)))) \
        if rows else ([], [])
    suff = np.array([golds is not None and R.sufficient(d, row_golds[b], s.sufficiency_match)
                     for b, d in enumerate(evidence)], bool)
    added = np.zeros(rows, np.int32)
    failed = 0
    if aug_rng is not None and golds is not None and s.augment_rate > 0 and s.augment_k > 0:
      draw = aug_rng.random(rows) < s.augment_rate  # one draw per set: the same stream always
      chosen = [b for b in range(rows) if draw[b] and suff[b]]
      pool, failed = self.distractors(sb, chosen, evidence, row_golds)
      for b in chosen:
        extra = pool.get(b, [])[:s.augment_k]
        while extra and not self._fits(row_q[b], evidence[b] + tuple(extra), notes[b]):
          extra.pop()
        if extra:
          evidence[b] = R.augment(evidence[b], extra, s.augment_k, aug_rng)
          added[b] = len(extra)
    texts = [generator_prompt(q, d, s.abstain_text, n) for q, d, n in zip(row_q, evidence, notes)]
    gb, g_metrics = self.generator.run(params["generator"], texts, rng_g)
    m = gb.tokens.shape[0] // rows
    answers = [a if ok else None for a, ok in zip(gb.answers, gb.answered)]
    abstained = np.array([R.is_abstention(a, s.abstain_text) for a in answers], bool)
    correct = np.array([golds is not None and R.correct(a, row_golds[g // m], s.abstain_text)
                        for g, a in enumerate(answers)], bool)
    retrieved_suff = np.array([golds is not None and R.sufficient(
        d, row_golds[b], s.sufficiency_match) for b, d in enumerate(retrieved)], bool)
    metrics = {**{f"searcher_{k}": v for k, v in s_metrics.items()},
               **{f"generator_{k}": v for k, v in g_metrics.items()},
               "augment_failures": float(failed)}
    return DacBatch(searcher=sb, generator=gb, evidence=evidence, sufficient=suff,
                    distractors=added, abstained=abstained,
                    correct=correct, retrieved_sufficient=retrieved_suff,
                    metrics=metrics), metrics


__all__ = ["DacAgent", "DacBatch", "DacSettings", "GENERATOR_TEMPLATE", "ROLES",
           "generator_prompt"]
