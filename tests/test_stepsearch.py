"""StepSearch (agentjax/methods/stepsearch.py): its TF-IDF similarity, its step rewards, its
signal on a step's rollouts and its estimator, each against an independent reference written here
(plain Python loops, NumPy), on edge cases: an empty document, a turn that retrieved nothing,
repeats within a turn and across turns, no gold document, ties."""

from __future__ import annotations

import json
import math
import re
import types
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.methods import get_method
from agentjax.methods import stepsearch as ss
from agentjax.retrieval.base import Document
from agentjax.signals import SIGNALS, MissingData, SignalEnv, StepContext
from tests.test_rl_advantages import make_batch


def _tokens(text):
  """Lowercase, punctuation out, articles out, words of 2+ characters (written apart from the
  module: the normalization of answers, then scikit-learn's default token pattern)."""
  text = re.sub(r"[^\w\s]", "", text.lower())
  words = [w for w in text.split() if w not in ("a", "an", "the")]
  return [w for w in words if len(w) >= 2]


def ref_similarity(doc, golds):
  """TF-IDF cosine, as scikit-learn's TfidfVectorizer defaults compute it, with dicts."""
  texts = [_tokens(doc)] + [_tokens(g) for g in golds]
  n = len(texts)
  df = Counter(w for t in texts for w in set(t))
  idf = {w: math.log((1 + n) / (1 + c)) + 1 for w, c in df.items()}
  vecs = []
  for t in texts:
    v = {w: c * idf[w] for w, c in Counter(t).items()}
    norm = math.sqrt(sum(x * x for x in v.values()))
    vecs.append({w: x / norm for w, x in v.items()} if norm else {})
  return [max(0.0, sum(vecs[0].get(w, 0.0) * x for w, x in g.items())) for g in vecs[1:]]


def ref_step_rewards(turn_docs, golds, scale):
  best, seen, out = [0.0] * len(golds), set(), []
  for docs in turn_docs:
    if not docs:
      out.append((0.0, 0.0, 0.0))
      continue
    gain = 0.0
    if golds:
      c = [max(ref_similarity(d.contents, golds)[i] for d in docs) for i in range(len(golds))]
      gain = sum(max(c[i] - best[i], 0.0) for i in range(len(golds))) / len(golds)
      best = [max(b, x) for b, x in zip(best, c)]
    rep = 0
    for d in docs:
      rep += d.id in seen
      seen.add(d.id)
    out.append((scale * (gain - rep / len(docs)), gain, rep / len(docs)))
  return out


GOLDS = ["Kefurn was born in Ostrava in 1901.", "Ostrava is a city in the Moravian region."]


def doc(i, text):
  return Document(str(i), text, 0.0)


def test_similarity_against_a_reference_and_its_edge_cases():
  texts = ["Kefurn was born in Ostrava, a city.", "", "a an the", GOLDS[0], "unrelated words here"]
  for text in texts:
    np.testing.assert_allclose(ss.tfidf_similarities(text, GOLDS), ref_similarity(text, GOLDS),
                               atol=1e-12)
  assert ss.tfidf_similarities(GOLDS[0], GOLDS)[0] == pytest.approx(1.0)
  assert (ss.tfidf_similarities("", GOLDS) == 0).all()
  assert ss.tfidf_similarities("anything", []).shape == (0,)


def test_step_rewards_against_a_reference():
  turns = [[doc(1, "Kefurn lived in Ostrava"), doc(2, "Ostrava weather")],
           [],                                                       # retrieved nothing
           [doc(1, "Kefurn lived in Ostrava"), doc(1, "Kefurn lived in Ostrava")],  # repeats
           [doc(3, GOLDS[1]), doc(4, "Moravian region facts")],      # a new gold: gain
           [doc(3, GOLDS[1])]]                                       # no gain, all repeated
  for golds, scale in ((GOLDS, 1.6), (GOLDS, 0.6), ([], 1.6), (GOLDS[:1], 1.0)):
    s, g, p = ss.step_rewards(turns, golds, scale)
    want = np.array(ref_step_rewards(turns, golds, scale))
    np.testing.assert_allclose(np.stack([s, g, p], 1), want, atol=1e-12)
  s, g, p = ss.step_rewards(turns, GOLDS, 1.6)
  assert p.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0] and g[4] == 0.0 and g[3] > 0 and s[1] == 0.0
  assert ss.step_rewards([], GOLDS, 1.6)[0].shape == (0,)


def _ctx(tmp_path, questions, turns, num_turns):
  corpus = tmp_path / "corpus.jsonl"
  rows = [{"id": "g1", "contents": "Kefurn\n" + GOLDS[0]},
          {"id": "g2", "contents": '"Ostrava"\n' + GOLDS[1]},
          {"id": "x", "contents": "Other\nnothing"}]
  corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
  import ml_collections
  config = ml_collections.ConfigDict({"retrieval": {"corpus_path": str(corpus)},
                                      "stepsearch": {"step_scale": 1.6}})
  batch = types.SimpleNamespace(
      turns=turns, num_turns=np.asarray(num_turns),
      turn_ends=np.zeros((len(turns), 4), np.int32))  # T = 3
  rollouts = types.SimpleNamespace(row_questions=questions)
  return config, StepContext(config=config, step=0, rollouts=rollouts, role="policy",
                             batch=batch)


def test_the_signal_scores_each_search_turn_with_the_gold_chain_from_the_corpus(tmp_path):
  from agentjax.agent.trajectories import TurnRecord
  from agentjax.agent.protocol import Action
  turn = lambda docs: TurnRecord("t", Action("search", "q"), tuple(docs))  # noqa: E731
  chain = {"id": "q0", "chain": ["Kefurn", "Ostrava"], "hops": 2}
  turns = [[turn([doc(1, "Kefurn\n" + GOLDS[0])]), turn([doc(2, "x\nOstrava city")]),
            turn([])],                                   # the answer turn: no step reward
           [turn([doc(1, "Kefurn\n" + GOLDS[0])])]]      # answered at once: no search turn
  config, ctx = _ctx(tmp_path, [chain, dict(chain, id="q1")], turns, [3, 1])
  runner = ss.StepRewardsRunner(SignalEnv(config=config, mesh=None))
  out = runner.produce(ctx)
  got = np.asarray(out.fields["step_rewards"])
  golds = ["Kefurn\n" + GOLDS[0], '"Ostrava"\n' + GOLDS[1]]
  want = [r[0] for r in ref_step_rewards([t.documents for t in turns[0][:2]], golds, 1.6)]
  np.testing.assert_allclose(got[0, :2], want, atol=1e-6)
  assert got.shape == (2, 3) and got[0, 2] == 0 and (got[1] == 0).all()
  assert set(out.metrics) == {"stepsearch/gain", "stepsearch/redundancy",
                              "stepsearch/step_reward"}
  # A record's own gold documents win; a record with neither names the field.
  own = {"id": "q2", "gold_documents": ["Ostrava weather"]}
  assert ss.gold_documents(own, dict) == ["Ostrava weather"]
  with pytest.raises(MissingData, match=r"question 'q3'.*'gold_documents'"):
    ss.gold_documents({"id": "q3", "question": "?"}, dict)
  with pytest.raises(MissingData, match=r"'gold_documents' must be a list of str"):
    ss.gold_documents({"id": "q4", "gold_documents": "one text"}, dict)


def test_training_records_without_gold_documents_are_refused_before_the_first_step(tmp_path):
  """A user's question file: its gold_documents are kept by the reader, and a run of StepSearch
  on records without them stops at load with one ConfigError naming the data entry, the record
  and the field (it was a MissingData traceback from inside the first step)."""
  from agentjax.data.qa_files import read_qa_file
  from agentjax.models.qwen.config import ConfigError
  from agentjax.signals import check_records
  path = tmp_path / "mine.jsonl"
  path.write_text(json.dumps({"question": "a?", "answer": "x", "gold_documents": ["x is a"]})
                  + "\n" + json.dumps({"question": "b?", "answer": "y"}) + "\n")
  records = read_qa_file(str(path))
  assert records[0]["gold_documents"] == ["x is a"] and "gold_documents" not in records[1]
  signals = get_method("stepsearch").signals  # its registry entry: ("critic", "step_rewards")
  check_records(signals, records[:1], "data.train", "mine.jsonl")  # has them: passes
  with pytest.raises(ConfigError, match=r"^config.data.train='mine.jsonl': question 'mine_1': "
                                        r"StepSearch needs its gold documents: a 'gold_documents'"):
    check_records(signals, records, "data.train", "mine.jsonl")
  check_records(("critic",), records, "data.train", "mine.jsonl")  # PPO reads no gold documents
  path.write_text(json.dumps({"question": "a?", "answer": "x", "gold_documents": "x is a"}) + "\n")
  with pytest.raises(ValueError, match=r"mine.jsonl:1: field 'gold_documents' must be a list"):
    read_qa_file(str(path))


def ref_stepppo(outcome, step_r, num_turns, turn_id, mask, values):
  """gamma = lam = 1 GAE over the sampled tokens: each search turn's step reward on its last
  sampled token, the outcome on the answer turn's; A_t = (rewards at sampled slots >= t) - V_t;
  then whitened over every sampled token (unbiased variance, eps 1e-8)."""
  b, length = mask.shape
  adv = np.zeros((b, length))
  for i in range(b):
    rewards = np.zeros(length)
    for k in range(num_turns[i]):
      slots = [j for j in range(length) if mask[i, j] and turn_id[i, j] == k]
      if not slots:  # a turn cut off before its first sampled token: to the previous action
        continue
      r = outcome[i] if k == num_turns[i] - 1 else step_r[i, k]
      # carried back: rewards of later slotless turns join this one (none in this layout)
      rewards[slots[-1]] += r
    for j in range(length):
      if mask[i, j]:
        adv[i, j] = sum(rewards[jj] for jj in range(j, length) if mask[i, jj]) - values[i, j]
  m = mask.astype(bool)
  pool = adv[m]
  white = (adv - pool.mean()) / np.sqrt(pool.var(ddof=1) + 1e-8)
  return np.where(m, white, 0.0)


def test_the_estimator_is_ppo_with_the_step_rewards_as_turn_rewards():
  d = make_batch(3)
  rng = np.random.default_rng(0)
  b, length = d["loss_mask"].shape
  step_r = rng.normal(size=(b, 4)).astype(np.float32)
  values = rng.normal(size=(b, length)).astype(np.float32)
  # every turn with a sampled token, so that nothing is carried back
  has = [all(((d["turn_id"][i] == k) & d["loss_mask"][i].astype(bool)).any()
             for k in range(d["num_turns"][i])) for i in range(b)]
  keep = np.asarray(has)
  d = {k: v[keep] for k, v in d.items()}
  step_r, values = step_r[keep], values[keep]
  from agentjax.rl.advantages import get_advantage_estimator
  adv, stats = get_advantage_estimator("stepsearch")(
      **{k: jnp.asarray(v) for k, v in d.items()}, step_rewards=jnp.asarray(step_r),
      values=jnp.asarray(values))
  want = ref_stepppo(d["outcome"], step_r, d["num_turns"], d["turn_id"], d["loss_mask"], values)
  np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-4, atol=1e-4)
  assert {"returns", "value_mask"} <= set(stats)


def test_the_method_reads_the_critic_and_the_step_rewards():
  from configs import stepsearch
  config = stepsearch.get_config("demo")
  method = get_method("stepsearch")
  assert method.run_signals(config) == ("critic", "step_rewards") and method.critic
  assert SIGNALS["step_rewards"].provides == frozenset({"step_rewards"})
  assert config.stepsearch.step_scale == 1.6 and config.algorithm == "stepsearch"
