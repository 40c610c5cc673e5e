"""The SynthWorld oracle judge, the study controls (noise) and the judge metrics."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from agentjax.agent.protocol import ANSWER, INVALID, SEARCH, SEARCH_R1, Action
from agentjax.agent.rollout import TurnRecord
from agentjax.judge import JudgeRequest, Verdict, build_judge, judge_identity
from agentjax.judge.controls import apply_noise
from agentjax.judge.metrics import agreement, gini, judge_metrics
from agentjax.judge.oracle import oracle_verdicts
from agentjax.retrieval import Document

# A 3-hop question: Zaru Kel --works_for--> Brimo Labs --headquartered_in--> Tessa --located_in-->
# Vornland. Gold documents: those of Zaru Kel, Brimo Labs and Tessa (not Vornland, the answer).
QUESTION = {"question": "In which country is the organization that Zaru Kel works for "
                        "headquartered?", "golden_answers": ["Vornland"], "hops": 3,
            "chain": ["Zaru Kel", "Brimo Labs", "Tessa", "Vornland"],
            "relations": ["works_for", "headquartered_in", "located_in"]}


def doc(name: str, body: str = "some text.") -> Document:
  return Document(id=name.lower().replace(" ", "-"), contents=f'"{name}"\n{body}', score=1.0)


def search(query: str, *names: str, error: str | None = None) -> TurnRecord:
  return TurnRecord(text=f"<search> {query} </search>", action=Action(SEARCH, query),
                    documents=tuple(doc(n) for n in names), search_error=error)


def answer(text: str) -> TurnRecord:
  return TurnRecord(text=f"<answer> {text} </answer>", action=Action(ANSWER, text))


def bits(verdicts: list[Verdict]) -> list[tuple[int, int]]:
  assert all(v.ok for v in verdicts)
  return [(v.retrieval, v.thinking) for v in verdicts]


# ------------------------------------------------------------------------------------ oracle


def test_oracle_full_chain():
  turns = [search("which organization does Zaru Kel work for", "Zaru Kel", "Brimo Labs"),
           search("where is brimo labs headquartered", "Brimo Labs", "Tessa"),
           search("  which country is TESSA located in ", "Tessa", "Vornland"),
           answer("Vornland")]
  # Round 0 also retrieved hop 1's document, so round 1's query (hop 1) targets nothing missing
  # while its documents add Tessa's (new); round 2 repeats Tessa's and adds only the answer's.
  assert bits(oracle_verdicts(QUESTION, turns)) == [(1, 1), (1, 0), (0, 0), (0, 1)]


def test_oracle_repeat_and_non_gold_documents():
  turns = [search("Zaru Kel employer", "Zaru Kel"),
           search("Zaru Kel employer again", "Zaru Kel", "Zaru Kel"),  # repeat: nothing new
           search("Brimo Labs", "Vornland", "Kelmo Orr"),  # answer's doc and a stranger: no gold
           search("Brimo Labs headquarters", "Brimo Labs", "Brimo Labs"),
           answer("Tessa")]
  assert bits(oracle_verdicts(QUESTION, turns)) == [(1, 1), (0, 0), (0, 1), (1, 1), (0, 0)]


def test_oracle_thinking_targets_unresolved_hops_only():
  turns = [search("Zaru Kel", "Zaru Kel"),
           search("Zaru Kel", "Kelmo Orr"),         # hop 0 already resolved
           search("what is Vornland", "Kelmo Orr"),  # the answer entity is no hop
           search("Zaru Kel and Brimo Labs", "Zaru Kel"),  # names an unresolved hop too
           search("Brimo Labsx Tessan", "Tessa"),  # no whole-word mention; Tessa's doc is new
           search("", "Brimo Labs"),
           answer("Vornland")]
  assert bits(oracle_verdicts(QUESTION, turns)) == [
      (1, 1), (0, 0), (0, 0), (0, 1), (1, 0), (1, 0), (0, 1)]


def test_oracle_early_answer_and_invalid_round():
  invalid = TurnRecord(text="<search> </search>", action=Action(INVALID, "empty query"))
  turns = [search("Zaru Kel", "Zaru Kel"), invalid,
           search("Brimo Labs", "Brimo Labs"), answer("Tessa")]
  got = oracle_verdicts(QUESTION, turns)
  assert bits(got) == [(1, 1), (0, 0), (1, 1), (0, 0)]  # the answer before hop 2: unsupported
  assert got[1].ok and got[1].error is None  # invalid is a real 0/0 verdict, not a failure
  # A failed search retrieved nothing; its query still targets a missing hop.
  failed = search("Tessa", error="HTTP 503")
  assert bits(oracle_verdicts(QUESTION, [failed])) == [(0, 1)]


def test_oracle_title_matching_is_normalized():
  q = dict(QUESTION, chain=["the zaru kel", "Brimo Labs", "Tessa", "Vornland"])
  for title in ('"Zaru  KEL"', "  ZARU kel "):  # quoted or not, spacing and case aside
    turns = [TurnRecord("", Action(SEARCH, "ZARU\tkel?"), (Document("x", f"{title}\nbody", 0.0),))]
    assert bits(oracle_verdicts(q, turns)) == [(1, 1)], title


@pytest.mark.parametrize("question", [
    {"question": "q", "golden_answers": ["a"]},                  # not SynthWorld
    {"question": "q", "chain": ["A", "B"]},                       # no hops
    dict(QUESTION, chain="Zaru Kel"),                             # chain not a list
    dict(QUESTION, hops=5),                                       # more hops than names
    dict(QUESTION, hops="two"),
])
def test_oracle_needs_a_gold_chain(question):
  turns = [search("Zaru Kel", "Zaru Kel"), answer("x")]
  got = oracle_verdicts(question, turns)
  assert len(got) == 2
  for v in got:
    assert (v.retrieval, v.thinking, v.ok) == (0, 0, False)
    assert "oracle needs a SynthWorld question (chain)" in v.error


def test_oracle_backend_through_the_registry():
  cfg = ml_collections.ConfigDict({"backend": "oracle", "noise": "none", "noise_p": 0.0})
  judge = build_judge(cfg)
  expected = {"backend": "oracle", "model": "synthworld-gold-chain", "prompt_sha256": "-"}
  assert judge.identity() == expected
  assert {k: judge_identity(cfg)[k] for k in expected} == expected
  requests = [JudgeRequest(QUESTION, [search("Zaru Kel", "Zaru Kel"), answer("x")]),
              JudgeRequest({"question": "q"}, [answer("x")]), JudgeRequest(QUESTION, [])]
  got = judge.judge(requests)
  assert [len(v) for v in got] == [2, 1, 0]
  assert bits(got[0]) == [(1, 1), (0, 0)] and not got[1][0].ok


def test_oracle_on_synthworld_demonstrations(tmp_path):
  """Replays generated demonstrations with real BM25 results (search h queries hop h). Expected
  bits by entity ids: search h is (1, 1) unless an earlier search already brought chain[h]'s
  passage (BM25 sometimes returns the next hop's passage early: then (0, 0), or (1, 0) when it
  still brings another new hop); the answer is supported iff every hop's passage was seen."""
  from agentjax.data.synthworld import SynthWorld
  from agentjax.retrieval.bm25 import BM25Backend

  world = SynthWorld.generate(seed=0, n_entities=60, n_train=20, n_dev=5, n_test=5)
  paths = world.write(str(tmp_path / "world"), topk=3, index_dir=str(tmp_path / "bm25"))
  backend = BM25Backend(paths["corpus"], index_dir=str(tmp_path / "bm25"))
  demos = world.demonstrations(backend, topk=3, stop_early_rate=0.5)
  questions = {q["id"]: q for q in world.questions["train"]}
  counts = {"complete": 0, "early": 0, "redundant": 0}
  for demo in demos:
    q = questions[demo["id"]]
    gold = [world.entity(name).id for name in q["chain"][:q["hops"]]]
    turns, want, seen = [], [], set()
    for seg in demo["segments"]:
      if seg["role"] != "assistant":
        continue
      action = SEARCH_R1.parse(seg["text"])
      if action.kind == SEARCH:
        docs = backend.search([action.content], 3).documents[0]
        ids = {d.id for d in docs}
        want.append((int(bool((ids - seen) & set(gold))), int(gold[len(want)] not in seen)))
        seen |= ids
      else:
        docs = []
        want.append((0, int(set(gold) <= seen)))
      turns.append(TurnRecord(seg["text"], action, tuple(docs)))
    assert bits(oracle_verdicts(q, turns)) == want, demo["id"]
    complete = demo["searches"] == demo["hops"]
    counts["complete" if complete else "early"] += 1
    counts["redundant"] += want[:-1] != [(1, 1)] * demo["searches"]
    if not complete:
      assert want[-1] == (0, 0)  # the hasty teacher answers a bridge entity, unsupported
  assert counts["complete"] > counts["redundant"] and counts["early"] > 0, counts


# ------------------------------------------------------------------------------------ metrics


def ref_gini(x) -> float:
  """Mean absolute difference over all ordered pairs / (2 * mean), by double loop."""
  x = [float(v) for v in x]
  n = len(x)
  if n <= 1 or sum(x) == 0:
    return 0.0
  return sum(abs(a - b) for a in x for b in x) / (2 * n * n * (sum(x) / n))


@pytest.mark.parametrize("x", [[0, 0, 1, 0], [1, 1, 1], [0, 0, 0], [5.0], [], [1, 0],
                               [3, 1, 2, 2, 0, 7], [2, 2, 0.5, 0.5]])
def test_gini_matches_pairwise_definition(x):
  assert gini(np.array(x, float)) == pytest.approx(ref_gini(x), abs=1e-12)


def test_gini_values_and_errors():
  assert gini(np.array([0, 0, 0, 1])) == pytest.approx(0.75)  # (K - m) / K
  assert gini(np.array([1, 1, 0, 0])) == pytest.approx(0.5)
  assert gini(np.full(5, 3.0)) == 0.0
  with pytest.raises(ValueError, match="nonnegative"):
    gini(np.array([1.0, -1.0]))
  with pytest.raises(ValueError, match="1-D"):
    gini(np.ones((2, 2)))


def ref_judge_metrics(ret, think, judged, num_turns, answer_round_judged):
  """Row-by-row loops over Python lists."""
  rounds, r_sum, t_sum, c_ones, c_n, ginis = 0, 0, 0, 0, 0, []
  for b in range(len(num_turns)):
    cs = []
    for t in range(num_turns[b]):
      if not judged[b][t]:
        continue
      rounds += 1
      r_sum += ret[b][t]
      t_sum += think[b][t]
      if answer_round_judged and t == num_turns[b] - 1:
        continue
      cs.append(ret[b][t] * think[b][t])
    c_ones += sum(cs)
    c_n += len(cs)
    if len(cs) >= 2:
      ginis.append(ref_gini(cs))
  return {"rounds": rounds, "retrieval_mean": r_sum / rounds if rounds else 0.0,
          "thinking_mean": t_sum / rounds if rounds else 0.0,
          "contribution_share": c_ones / c_n if c_n else 0.0,
          "gini": sum(ginis) / len(ginis) if ginis else 0.0}


def test_judge_metrics_against_loops():
  # Rows: K=3 with one contributing round; all rounds contributing (gini 0); K=1 (no gini);
  # K=0 (answer only); not judged; all-zero c (gini 0, counted). Padding holds garbage 1s.
  num_turns = np.array([4, 3, 2, 1, 3, 4])
  ret = np.array([[1, 0, 1, 0, 1], [1, 1, 0, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1],
                  [1, 1, 1, 1, 1], [0, 1, 0, 0, 1]])
  think = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 1, 1], [1, 1, 1, 1, 1],
                    [1, 1, 1, 1, 1], [1, 0, 1, 1, 1]])
  t = np.arange(5)[None, :]
  judged = (t < num_turns[:, None]) & np.array([1, 1, 1, 1, 0, 1], bool)[:, None]
  for answer_round_judged in (True, False):
    mask = judged
    if not answer_round_judged:  # the trainer then does not send answer rounds
      mask = judged & (t < num_turns[:, None] - 1)
    got = judge_metrics(ret, think, mask, num_turns, answer_round_judged)
    want = ref_judge_metrics(ret.tolist(), think.tolist(), mask.tolist(), num_turns.tolist(),
                             answer_round_judged)
    assert got.keys() == want.keys()
    for k in want:
      assert got[k] == pytest.approx(want[k], abs=1e-12), (answer_round_judged, k)
  # By hand (answer round judged): gini over rows 0 (K=3, c=[1,0,0]: 2/3), 1 (K=2, c=[1,1]: 0)
  # and 5 (K=3, c=[0,0,0]: 0); rows 2 and 3 have K < 2, row 4 is not judged.
  got = judge_metrics(ret, think, judged, num_turns, True)
  assert got["gini"] == pytest.approx((2 / 3) / 3)
  assert got["rounds"] == 14
  assert got["contribution_share"] == pytest.approx(4 / 9)  # c=1: 1+2+1+0+0 of 3+2+1+0+3


def test_judge_metrics_empty_and_padding_errors():
  z = np.zeros((2, 3), int)
  got = judge_metrics(z, z, np.zeros((2, 3), bool), np.array([3, 1]), True)
  assert got == {"rounds": 0.0, "retrieval_mean": 0.0, "thinking_mean": 0.0,
                 "contribution_share": 0.0, "gini": 0.0}
  judged = np.array([[True, True, False], [True, True, False]])  # row 1 has 1 turn
  with pytest.raises(ValueError, match=r"rows \[1\].*beyond num_turns"):
    judge_metrics(z, z, judged, np.array([3, 1]), True)


def test_agreement():
  a_r = np.array([[1, 0, 1], [0, 0, 1]])
  a_t = np.array([[1, 1, 1], [0, 1, 0]])
  b_r = np.array([[1, 1, 1], [0, 1, 0]])
  b_t = np.array([[1, 1, 0], [0, 1, 1]])
  judged = np.array([[True, True, True], [True, False, False]])
  assert agreement(a_r, a_t, b_r, b_t, judged) == pytest.approx(
      {"agreement_retrieval": 3 / 4, "agreement_thinking": 3 / 4})
  assert agreement(a_r, a_t, b_r, b_t, np.zeros((2, 3), bool))["agreement_retrieval"] == 0.0


# ------------------------------------------------------------------------------------ controls


def test_noise_none_and_flip_extremes():
  rng = np.random.default_rng(0)
  ret = rng.integers(0, 2, (4, 6))
  think = rng.integers(0, 2, (4, 6))
  judged = rng.random((4, 6)) < 0.5
  for mode, p in (("none", 0.7), ("flip", 0.0)):
    r, t = apply_noise(ret, think, judged, mode, p, np.random.default_rng(1))
    np.testing.assert_array_equal(r, ret)
    np.testing.assert_array_equal(t, think)
  r, t = apply_noise(ret, think, judged, "flip", 1.0, np.random.default_rng(1))
  np.testing.assert_array_equal(r, np.where(judged, 1 - ret, ret))
  np.testing.assert_array_equal(t, np.where(judged, 1 - think, think))
  assert r.dtype == ret.dtype


def test_noise_flip_rate_within_binomial_bound():
  shape = (200, 100)
  rng = np.random.default_rng(3)
  ret = rng.integers(0, 2, shape)
  think = rng.integers(0, 2, shape)
  judged = rng.random(shape) < 0.6
  r, t = apply_noise(ret, think, judged, "flip", 0.2, np.random.default_rng(4))
  n = judged.sum()
  for new, old in ((r, ret), (t, think)):
    flipped = (new != old)
    assert not flipped[~judged].any()  # unjudged entries untouched
    # 6 standard deviations of Binomial(n, 0.2).
    assert abs(flipped[judged].sum() - 0.2 * n) < 6 * np.sqrt(n * 0.2 * 0.8)
  # Retrieval and thinking are flipped independently.
  both = ((r != ret) & (t != think))[judged].sum()
  assert abs(both - 0.04 * n) < 6 * np.sqrt(n * 0.04 * 0.96)


def test_noise_random_keeps_the_marginal_rates():
  shape = (200, 100)
  rng = np.random.default_rng(5)
  judged = rng.random(shape) < 0.5
  # Correlated bits as the oracle's: thinking = 1 whenever retrieval = 1, plus a few more.
  ret = (rng.random(shape) < 0.3).astype(np.int32)
  think = np.maximum(ret, rng.random(shape) < 0.2).astype(np.int32)
  ret[~judged], think[~judged] = 7, 9  # sentinels: must survive
  r, t = apply_noise(ret, think, judged, "random", 0.0, np.random.default_rng(6))
  np.testing.assert_array_equal(r[~judged], 7)
  np.testing.assert_array_equal(t[~judged], 9)
  n = judged.sum()
  for new, old in ((r, ret), (t, think)):
    rate = old[judged].mean()
    assert set(np.unique(new[judged])) <= {0, 1}
    assert abs(new[judged].sum() - rate * n) < 6 * np.sqrt(n * rate * (1 - rate))
  c_rate = (ret * think)[judged].mean()
  assert abs((r * t)[judged].sum() - c_rate * n) < 6 * np.sqrt(n * c_rate * (1 - c_rate))
  # Independent of the round: a redrawn bit differs from the old one with prob 2 r (1 - r).
  rate = ret[judged].mean()
  assert abs((r[judged] != ret[judged]).mean() - 2 * rate * (1 - rate)) < 0.03


def test_noise_validation():
  z = np.zeros((2, 2), int)
  m = np.ones((2, 2), bool)
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="judge.noise"):
    apply_noise(z, z, m, "shuffle", 0.1, rng)
  with pytest.raises(ValueError, match="judge.noise_p"):
    apply_noise(z, z, m, "flip", 1.5, rng)
  with pytest.raises(ValueError, match="same shape"):
    apply_noise(z, z, np.ones((2, 3), bool), "flip", 0.1, rng)
  r, t = apply_noise(z, z, np.zeros((2, 2), bool), "random", 0.0, rng)  # nothing judged
  np.testing.assert_array_equal(r, z)
