r"""StepSearch (Zheng, An, Wang et al., EMNLP 2025, arXiv 2505.15107; docs/methods/stepsearch.md):
PPO with a critic over token rewards, where each search step earns what it retrieved about the
question's gold documents, less a penalty for documents retrieved before. One module: its signal
("step_rewards"), its estimator and its method entry; configs/stepsearch.py holds the presets.

The signal, per row b and search turn t (the non-answer turns; a turn that retrieved nothing, an
invalid action or a failed search, earns nothing), with g_1..g_n the question's gold documents
and D_t the documents turn t retrieved (the official code, qa_step.py):

  S(d, g)  = max(0, cos(tfidf(d), tfidf(g))), the vectorizer fit on [d, g_1..g_n] for each d
             (scikit-learn's TfidfVectorizer defaults: words of 2+ characters, smooth idf,
             l2-normalized rows), both texts normalized as answers are
  c_i^t    = max_{d in D_t} S(d, g_i);   m_i^t = max(m_i^{t-1}, c_i^t),  m_i^0 = 0
  G^t      = (1/n) sum_i max(c_i^t - m_i^{t-1}, 0)                    information gain
  P^t      = (1/|D_t|) sum_{d in D_t} 1[d retrieved earlier in the trajectory]   redundancy
  s^t      = stepsearch.step_scale * (G^t - P^t)

The estimator "stepsearch": PPO's token-level GAE (agentjax/rl/advantages.ppo_advantages) with
s^t as turn t's reward on its last sampled token and the outcome reward on the answer's, gamma =
lam = 1 in the paper's preset, advantages whitened over the batch; the critic regresses every
sampled token's return.

Our reading where the paper and its code leave a choice (each a config field; the alternatives
one override away):
- stepsearch.step_scale: the code's effective 1.6 (its intended 0.6 is added in place to the step
  reward already written: s + 0.6 s); 0.6 is one override away.
- redundancy by document id: the code compares document strings that still carry the next
  document's "Doc j" label, so a repeat counts only at the same rank; the id is the intent.
- the search-key reward (0.618 x the F1 of the queries against MuSiQue's sub-question keywords)
  is not implemented: our data sets carry no such keywords (stepsearch.key_weight is absent on
  purpose; the outcome reward is rl.reward_metric's, F1 in the presets, and an answer-less
  trajectory gets rl.format_penalty, the code's -1).
- the gold documents: a question record's "gold_documents" (texts); SynthWorld's records name
  them by their hop chain ("chain", "hops": the corpus documents titled so, read from
  retrieval.corpus_path). A record with neither stops the step with an error naming the field.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from agentjax.answers import normalize_answer
from agentjax.methods import Method, register_method, section_settings
from agentjax.rl.advantages import ppo_advantages, register_advantage
from agentjax.signals import MissingData, Signal, SignalOutput, SignalRunner, register_signal

DEFAULTS = {"step_scale": 1.6, "gamma": 1.0, "lam": 1.0, "whiten": True}
_WORD = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token_pattern


# ---------------------------------------------------------------------------------------------
# The similarity and the step reward (host, NumPy).
# ---------------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
  return _WORD.findall(normalize_answer(text, "standard"))


def tfidf_similarities(doc: str, golds: Sequence[str]) -> np.ndarray:
  """[n] S(doc, g_i): TF-IDF cosine clipped at 0, the vocabulary and idf fit on [doc] + golds
  (idf = ln((1 + N) / (1 + df)) + 1, N = n + 1), raw term counts, l2-normalized rows; 0 for a
  text without a word."""
  texts = [_words(doc)] + [_words(g) for g in golds]
  vocab = {w: i for i, w in enumerate(sorted({w for t in texts for w in t}))}
  if not vocab:
    return np.zeros(len(golds))
  counts = np.zeros((len(texts), len(vocab)))
  for row, words in enumerate(texts):
    for w, c in collections.Counter(words).items():
      counts[row, vocab[w]] = c
  df = (counts > 0).sum(axis=0)
  tfidf = counts * (np.log((1 + len(texts)) / (1 + df)) + 1.0)
  norms = np.linalg.norm(tfidf, axis=1, keepdims=True)
  tfidf = np.divide(tfidf, norms, out=np.zeros_like(tfidf), where=norms > 0)
  return np.maximum(tfidf[1:] @ tfidf[0], 0.0)


def step_rewards(turn_documents: Sequence[Sequence[Any]], golds: Sequence[str],
                 scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(s [K], G [K], P [K]) of one trajectory's K search turns: turn_documents[t] the documents
  (.id, .contents) turn t retrieved ([] for a turn that retrieved nothing: 0, 0, 0). With no
  gold document (n = 0) there is no gain, as in the code; the penalty stays."""
  k = len(turn_documents)
  gain, penalty = np.zeros(k), np.zeros(k)
  best = np.zeros(len(golds))
  seen: set[str] = set()
  for t, docs in enumerate(turn_documents):
    if not docs:
      continue
    if len(golds):
      c = np.max([tfidf_similarities(d.contents, golds) for d in docs], axis=0)
      gain[t] = float(np.mean(np.maximum(c - best, 0.0)))
      best = np.maximum(best, c)
    repeats = 0
    for d in docs:  # a repeat within the turn counts too, as in the code
      repeats += d.id in seen
      seen.add(d.id)
    penalty[t] = repeats / len(docs)
  return scale * (gain - penalty), gain, penalty


# ---------------------------------------------------------------------------------------------
# The signal: gold documents from the data, step rewards after the rollouts.
# ---------------------------------------------------------------------------------------------


def check_gold(question: Mapping[str, Any]) -> list[str] | None:
  """None when the record gives its gold documents ("gold_documents": a list of str), else its
  SynthWorld hop chain (the titles to look up); MissingData naming the field when it has
  neither (the signal's check_record: every training record is checked before step 1)."""
  if "gold_documents" in question:
    docs = question["gold_documents"]
    if isinstance(docs, (str, bytes)) or not all(isinstance(d, str) for d in docs):
      raise MissingData(f"question {question.get('id')!r}: 'gold_documents' must be a list of "
                        f"str, got {docs!r}")
    return None
  from agentjax.judge.oracle import gold_chain
  chain, why = gold_chain(question)
  if why is not None:
    raise MissingData(f"question {question.get('id')!r}: StepSearch needs its gold documents: a "
                      f"'gold_documents' field (their texts) or a SynthWorld hop chain ({why})")
  return chain


def gold_documents(question: Mapping[str, Any], corpus: Callable[[], Mapping[str, str]]
                   ) -> list[str]:
  """The question's gold documents' texts: its "gold_documents", or SynthWorld's hop chain
  resolved in the corpus (`corpus()`: {normalized title: contents}); MissingData naming the
  field otherwise."""
  chain = check_gold(question)
  if chain is None:
    return list(question["gold_documents"])
  titles = corpus()
  missing = [name for name in chain if name not in titles]
  if missing:
    raise MissingData(f"question {question.get('id')!r}: chain documents {missing} are not "
                      "titles of the corpus (retrieval.corpus_path)")
  return [titles[name] for name in chain]


class StepRewardsRunner(SignalRunner):
  def __init__(self, env):
    self.scale = float(section_settings(env.config, "stepsearch", DEFAULTS)["step_scale"])
    self.corpus_path = env.config.retrieval.corpus_path
    self._titles: dict[str, str] | None = None

  def titles(self) -> Mapping[str, str]:
    """{normalized title: contents} of the corpus, read once (SynthWorld's chains)."""
    if self._titles is None:
      from agentjax.judge.oracle import title_key
      from agentjax.retrieval.base import Document, read_corpus
      rows, _ = read_corpus(self.corpus_path)
      self._titles = {}
      for row in rows:
        doc = Document(row["id"], row["contents"], 0.0)
        self._titles.setdefault(title_key(doc.title), doc.contents)
    return self._titles

  def produce(self, ctx):
    batch = ctx.batch
    num_t = batch.turn_ends.shape[1] - 1
    rewards = np.zeros((len(batch.turns), num_t), np.float32)
    gains, penalties = [], []
    for b, (turns, question) in enumerate(zip(batch.turns, ctx.questions)):
      searches = list(turns[:max(int(batch.num_turns[b]) - 1, 0)])  # the non-answer turns
      s, g, p = step_rewards([t.documents for t in searches],
                             gold_documents(question, self.titles), self.scale)
      rewards[b, :len(s)] = s[:num_t]
      gains += g.tolist()
      penalties += p.tolist()
    mean = lambda x: float(np.mean(x)) if x else 0.0  # noqa: E731
    return SignalOutput(fields={"step_rewards": jnp.asarray(rewards)},
                        metrics={"stepsearch/gain": mean(gains),
                                 "stepsearch/redundancy": mean(penalties),
                                 "stepsearch/step_reward": self.scale * (mean(gains)
                                                                         - mean(penalties))})


STEP_REWARDS = register_signal(Signal("step_rewards", frozenset({"step_rewards"}),
                                      StepRewardsRunner, check_record=check_gold))


# ---------------------------------------------------------------------------------------------
# The estimator and the method.
# ---------------------------------------------------------------------------------------------


@register_advantage("stepsearch")
def stepsearch_advantages(outcome, step_rewards, num_turns, group_ids, turn_id, loss_mask,
                          values, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
                          collapse_tol: float = 1e-6):
  """StePPO: PPO's token-level GAE with the step rewards as the search turns' rewards (on their
  last sampled token) and the outcome on the answer's (rl.advantages.ppo_advantages)."""
  return ppo_advantages(outcome, step_rewards, num_turns, group_ids, turn_id, loss_mask, values,
                        gamma=gamma, lam=lam, ig_weight=1.0, outcome_weight=1.0, whiten=whiten,
                        collapse_tol=collapse_tol)


def _settings(config: Any) -> dict[str, Any]:
  s = section_settings(config, "stepsearch", DEFAULTS)
  return dict(gamma=float(s["gamma"]), lam=float(s["lam"]), whiten=bool(s["whiten"]))


def _validate(config: Any, fail: Callable[..., None]) -> None:
  s = section_settings(config, "stepsearch", DEFAULTS, fail)
  if not (isinstance(s["step_scale"], (int, float)) and math.isfinite(s["step_scale"])):
    fail("stepsearch.step_scale", s["step_scale"], "must be a finite number")
  for key in ("gamma", "lam"):
    if not 0.0 <= s[key] <= 1.0:
      fail(f"stepsearch.{key}", s[key], "must be in [0, 1]")


register_method(Method(
    name="stepsearch", estimator="stepsearch",
    inputs=frozenset({"outcome", "step_rewards", "num_turns", "group_ids", "turn_id",
                      "loss_mask", "values"}),
    settings=_settings, signals=("critic", "step_rewards"), group=False, critic=True,
    value_targets=("returns", "value_mask"), validate=_validate))
