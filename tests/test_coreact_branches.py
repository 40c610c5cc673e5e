"""Co-ReAct's ranking judges (oracle value-to-go, LLM), LLM rubric appliers, and branch-point
collection end to end (a scripted Qwen policy, real BM25, the oracle judges)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import scipy.stats

from agentjax.agent.protocol import ANSWER, SEARCH, SEARCH_R1, Action
from agentjax.agent.rollout import observation_ids, prompt_ids
from agentjax.agent.trajectories import TurnRecord
from agentjax.coreact.appliers import (ANSWER_PLACEHOLDER, LLMApplier, build_applier,
                                       first_action)
from agentjax.coreact.branches import (BranchCollector, CollectSettings, Generated,
                                       HFGenerator, OpenAIGenerator, _Trajectory,
                                       build_generators, restore_stop, write_rows)
from agentjax.coreact.context import BranchContext
from agentjax.coreact.rankers import LLMRanker, OracleRanker, build_ranker
from agentjax.coreact.rubric import Applied, parse_rubric
from agentjax.judge.chat import OpenAIChat, OpenAIText, TextRequest
from agentjax.retrieval import Document
from configs.base import get_config
from tests import agent_fixtures as af
from tests.test_judge_openai import Stub, stub  # noqa: F401  (the scripted server fixture)

G = 0.8  # oracle gamma

# A 2-hop SynthWorld-style question: Alpha Corp -> (founded by) Bob Smith -> (born in) Paris.
Q2 = {"id": "q7", "question": "Where was the founder of Alpha Corp born?",
      "golden_answers": ["Paris"], "chain": ["Alpha Corp", "Bob Smith", "Paris"], "hops": 2}


def _doc(title: str, i: int = 0) -> Document:
  return Document(id=f"d{i}", contents=f'"{title}"\n{title} is a thing number {i}.', score=1.0)


def _search_turn(query: str, *titles: str) -> TurnRecord:
  return TurnRecord(text=f"<think>go</think><search>{query}</search>", action=Action(SEARCH, query),
                    documents=tuple(_doc(t, i) for i, t in enumerate(titles)),
                    observation="\n\n<information>...</information>\n\n")


def _ctx(*turns: TurnRecord, question=Q2) -> BranchContext:
  return BranchContext(question=question, turns=tuple(turns), max_calls=4)


def _ranks_desc(values) -> list[float]:
  """The reference ranking: scipy's average ranks of the negated values (1 = highest)."""
  return scipy.stats.rankdata(-np.asarray(values, np.float64), method="average").tolist()


# ---------------------------------------------------------------------------------------------
# The oracle's value-to-go, against hand-computed values.
# ---------------------------------------------------------------------------------------------

# (context, [(candidate text, its search results' titles)], hand-computed values with H = 2)
CASES = [
    # R = 0: the query retrieving hop 0's gold document g^(1+1+1); a useless search and an
    # invalid action g^(1+2+1); a correct (lucky) answer g; a wrong answer 0.
    (_ctx(), [("<search>Alpha Corp founder</search>", ["Alpha Corp"]),
              ("<search>weather today</search>", ["Zed"]),
              ("<answer>Paris</answer>", []),
              ("<answer>London</answer>", []),
              ("I am not sure", [])],
     [G ** 3, G ** 4, G, 0.0, G ** 4]),
    # R = 1 (hop 0 seen): the next gold document g^(1+0+1) beats repeating the first search,
    # which retrieves hop 0's document again (not new: g^(1+1+1)).
    (_ctx(_search_turn("Alpha Corp founder", "Alpha Corp")),
     [("<search>Alpha Corp founder</search>", ["Alpha Corp"]),
      ("<search>Bob Smith birthplace</search>", ["Bob Smith", "Alpha Corp"])],
     [G ** 3, G ** 2]),
    # R = 2 (every hop seen): the correct answer g beats another search g^2 and a wrong answer 0.
    (_ctx(_search_turn("Alpha Corp founder", "Alpha Corp"),
          _search_turn("Bob Smith birthplace", "Bob Smith")),
     [("<search>Paris</search>", ["Paris"]), ("<answer>the Paris</answer>", []),
      ("<answer>Bob Smith</answer>", [])],
     [G ** 2, G, 0.0]),
]


def _rank(ranker, cases):
  contexts = [c for c, _, _ in cases]
  candidates = [[t for t, _ in cands] for _, cands, _ in cases]
  documents = [[tuple(_doc(x, i) for i, x in enumerate(titles)) for _, titles in cands]
               for _, cands, _ in cases]
  return ranker, contexts, candidates, documents


def test_oracle_value_to_go_against_hand_computed_values():
  ranker, contexts, candidates, documents = _rank(OracleRanker(3, G, 0.0, seed=0), CASES)
  values = ranker.values(contexts, candidates, documents)
  for got, (_, _, want) in zip(values, CASES):
    np.testing.assert_allclose(got, want, rtol=1e-12)
  rankings = ranker.rank(contexts, candidates, documents)
  for got, (_, _, want) in zip(rankings, CASES):
    assert np.shape(got) == (3, len(want))
    for judge in got:  # noise 0: three identical rankings, ties kept
      np.testing.assert_allclose(judge, _ranks_desc(want))
  # The intended orderings: the next gold document beats a repeated search; a correct answer
  # after the last hop beats everything; an early wrong answer is last.
  assert rankings[1][0] == [2.0, 1.0]
  assert rankings[0][0] == [2.0, 3.5, 1.0, 5.0, 3.5]
  assert rankings[2][0] == [2.0, 1.0, 3.0]
  # No gold chain: no ranking.
  plain = {"id": "x", "question": "Q?", "golden_answers": ["a"]}
  assert ranker.rank([_ctx(question=plain)], [["<answer>a</answer>", "z"]], [[(), ()]]) == [None]


def test_oracle_noise_is_seeded_and_reproducible():
  def run(seed, noise):
    ranker, contexts, candidates, documents = _rank(OracleRanker(4, G, noise, seed=seed), CASES)
    return ranker.rank(contexts, candidates, documents)

  a, b, c = run(0, 0.3), run(0, 0.3), run(1, 0.3)
  assert a == b and a != c
  for branch in a:
    judges = np.asarray(branch)
    k = judges.shape[1]
    # Continuous noise breaks every tie: each judge's ranks are a permutation of 1..K.
    assert all(sorted(j) == list(range(1, k + 1)) for j in judges.tolist())
  assert any(len({tuple(j) for j in branch}) > 1 for branch in a)  # the judges disagree
  # Small noise only breaks ties: strictly ordered candidates keep their order.
  small = run(0, 1e-6)
  for got, (_, _, want) in zip(small, CASES):
    ref = np.asarray(_ranks_desc(want))
    for judge in np.asarray(got):
      for i in range(len(want)):
        for j in range(len(want)):
          if ref[i] < ref[j]:
            assert judge[i] < judge[j]


def test_build_ranker_and_applier_config_errors(tmp_path):
  config = get_config("demo")
  assert isinstance(build_ranker(config), OracleRanker)
  config.coreact.judge_backend = "montecarlo"
  mc = build_ranker(config)
  assert (mc.num_judges, mc.rollouts, mc.continuations, mc.metric) == (3, 4, 12, "em")
  with pytest.raises(ValueError, match="continuations"):
    mc.rank([], [], [])
  config.coreact.judge_backend = "crystal_ball"
  with pytest.raises(ValueError, match="coreact.judge_backend"):
    build_ranker(config)
  config.coreact.judge_backend = "openai"
  config.coreact.judge_models = "a,b"
  with pytest.raises(ValueError, match="coreact.judge_models"):
    build_ranker(config)  # 2 models for 3 judges
  config.coreact.judge_models = "a,b,a"
  ranker = build_ranker(config)
  assert [i["model"] for i in ranker.identities()] == ["a", "b", "a"]
  assert ranker.backends[0] is ranker.backends[2]  # one client per distinct model
  config.coreact.applier = "nope"
  with pytest.raises(ValueError, match="coreact.applier"):
    build_applier(config)
  config.coreact.applier = "executor"
  config.coreact.entities_path = str(tmp_path / "missing.jsonl")
  with pytest.raises(ValueError, match="coreact.entities_path"):
    build_applier(config)


# ---------------------------------------------------------------------------------------------
# LLM rankers and appliers against the scripted OpenAI-compatible server.
# ---------------------------------------------------------------------------------------------

REPLIES = {
    "rgood": 'Thinking.\n```json\n{"ranking": [2, 1, 1]}\n```',
    "rshort": '{"ranking": [1, 2]}',
    "rtext": '{"ranking": ["1", "2", "3"]}',
    "agood": '{"ranking": [1, 3, 2], "atomic_count": 2}',
    "aneg": '{"ranking": [1, 3, 2], "atomic_count": -1}',
    "sgood": '{"score": 0.7}',
    "sbig": '{"score": 1.5}',
    "prose": "The second one, I think.",
}


@pytest.fixture
def scripted(stub, monkeypatch):  # noqa: F811
  stub.reset()

  async def reply(case, k, attempt):
    if case in REPLIES:
      return Stub.completion(REPLIES[case])
    return await Stub.reply(stub, case, k, attempt)  # "down" and the judge tests' other cases

  monkeypatch.setattr(stub, "reply", reply)
  return stub


def _judge_config(url, **overrides):
  c = get_config("demo").judge
  c.base_url, c.model, c.api_key_env = url, "stub", ""
  c.timeout_s, c.max_retries, c.retry_backoff_s = 2.0, 1, 0.01
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _case_ctx(case: str) -> BranchContext:
  return _ctx(_search_turn("Alpha Corp founder", "Alpha Corp"),
              question={**Q2, "question": f"case:{case} where?"})


CANDS = ["<think>a</think><search>Bob Smith</search> trailing", "<answer>Paris</answer>",
         "<search>x</search>"]


def test_llm_ranker_replies_and_faults(scripted):
  chat = OpenAIChat(_judge_config(scripted.url))
  ranker = LLMRanker([chat, chat, chat])
  cases = ["rgood", "rshort", "rtext", "prose", "down"]
  got = ranker.rank([_case_ctx(c) for c in cases], [CANDS] * len(cases))
  # [2, 1, 1]: ties re-ranked to average ranks; three judges sharing one backend asked once.
  assert got[0] == [[3.0, 1.5, 1.5]] * 3
  assert got[1:] == [None] * 4
  per_case = {}
  for (case, _, _), n in scripted.attempts.items():
    per_case[case] = per_case.get(case, 0) + n
  assert per_case == {"rgood": 1, "rshort": 1, "rtext": 1, "prose": 1, "down": 2}  # 1 retry
  prompt = scripted.bodies[0]["messages"][0]["content"]
  # The candidates are lettered, think stripped, cut after the first action; answers shown.
  assert "A. <search>Bob Smith</search>\nB. <answer>Paris</answer>\nC. <search>x</search>" \
      in prompt and "trailing" not in prompt
  assert "Step 1: <search>Alpha Corp founder</search>" in prompt
  chat.close()


def test_llm_applier_rank_and_score_never_raise(scripted):
  applier = LLMApplier(OpenAIChat(_judge_config(scripted.url)))
  rubric = parse_rubric("1. [0.6] The action searches\n2. [0.4] The query names the question "
                        "entity\n3. [-0.2] The action answers")
  cases = ["agood", "aneg", "prose", "down"]
  got = applier.rank([rubric] * 4, [_case_ctx(c) for c in cases], [CANDS] * 4)
  assert got == [Applied((1.0, 3.0, 2.0), 2), None, None, None]
  scores = applier.score([rubric] * 3, [_case_ctx(c) for c in ("sgood", "sbig", "prose")],
                         [CANDS[1]] * 3)
  assert scores == [0.7, None, None]
  assert (applier.stats.calls, applier.stats.failures) == (7, 5)
  prompts = [b["messages"][0]["content"] for b in scripted.bodies]
  # The applier never sees an answer's content; the rubric's lines are in the prompt.
  assert all("<answer>Paris</answer>" not in p for p in prompts)
  assert any(f"B. <answer>{ANSWER_PLACEHOLDER}</answer>" in p for p in prompts)
  assert all("1. [0.6] The action searches" in p for p in prompts)


def test_llm_appliers_and_rankers_with_the_server_down():
  with socket.socket() as sock:  # bound, not listening: connections are refused
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    chat = OpenAIChat(_judge_config(url, max_retries=1))
    rubric = parse_rubric("1. [1] The action searches\n2. [0] The action answers")
    ctx = _case_ctx("x")
    assert LLMApplier(chat).rank([rubric], [ctx], [CANDS]) == [None]
    assert LLMApplier(chat).score([rubric, rubric], [ctx, ctx], CANDS[:2]) == [None, None]
    assert LLMRanker([chat]).rank([ctx], [CANDS]) == [None]


def test_first_action_cuts_and_hides():
  ctx = _ctx()
  assert first_action(ctx, "<think>x</think> <answer> Paris </answer><search>q</search>",
                      hide_answer=True) == f"<answer>{ANSWER_PLACEHOLDER}</answer>"
  assert first_action(ctx, "<think>unclosed <search>q</search>") == "(empty)"
  assert first_action(ctx, "  ") == "(empty)"


# ---------------------------------------------------------------------------------------------
# Collection end to end: a scripted policy that searches or answers, BM25, oracle judges.
# ---------------------------------------------------------------------------------------------

QUESTIONS = [
    # "Zorvath founder" retrieves Zorvath's passage (gold); answering Aldric is right.
    {"id": "z", "question": "Who founded Zorvath?", "golden_answers": ["Aldric"],
     "chain": ["Zorvath", "Aldric"], "hops": 1},
    # Neither action helps: the search retrieves Zorvath (not gold), the answer is wrong; the
    # useless search (g^3) beats the wrong answer (0) at every step.
    {"id": "q", "question": "Who founded Quellmoor?", "golden_answers": ["Belisande"],
     "chain": ["Quellmoor", "Belisande"], "hops": 1},
]


def test_collection_end_to_end(scripted_world, tmp_path, monkeypatch):
  from agentjax.sampling.complete import Completer
  tok, backend, agent = scripted_world
  params = agent.params(af.SEARCH, af.ANSWER)  # each turn: think, then search or answer
  completer = Completer(agent.cfg, params, tok, max_total_tokens=512)
  settings = CollectSettings(max_turns=2, max_new_tokens=16, max_obs_tokens=64,
                             max_total_tokens=512, topk=1, temperatures=(1.0,),
                             per_temperature=8, num_candidates=4, seed=0)
  ranker = OracleRanker(3, G, 0.0)
  calls = []
  real = completer.complete
  monkeypatch.setattr(completer, "complete",
                      lambda p, **kw: calls.append((p, kw, real(p, **kw))) or calls[-1][2])
  rows, stats = BranchCollector(completer, backend, ranker, settings).collect(QUESTIONS)

  by_id = {r["id"]: r for r in rows}
  assert sorted(by_id) == ["q/0", "q/1", "z/0"]
  assert stats.rows == 3 and stats.questions == 2 and stats.answered == 1
  assert len(calls) == 2 and all(kw["stop"] == SEARCH_R1.stop_strings for _, kw, _ in calls)
  search = "<think>Let me look.</think><search>Zorvath founder</search>"
  answer = "<think>Let me look.</think><answer>Aldric</answer>"
  for row in rows:
    ctx = BranchContext.from_json(row)
    k = len(row["candidates"])
    assert 2 <= k <= 4 and len(set(row["candidates"])) == k
    assert sorted(row["candidates"]) == sorted([answer, search])
    assert np.shape(row["judge_rankings"]) == (3, k) and len(row["judges"]) == 3
    np.testing.assert_allclose(row["borda"], np.sum(row["judge_rankings"], axis=0))
    np.testing.assert_allclose(row["expert_ranking"],
                               scipy.stats.rankdata(row["borda"], method="average"))
    is_answer = [ctx.parse(c).kind == ANSWER for c in row["candidates"]]
    want = [G if a and row["id"].startswith("z") else 0.0 if a else
            G ** 2 if row["id"].startswith("z") else G ** 3 for a in is_answer]
    np.testing.assert_allclose(row["values"], want, rtol=1e-12)
  # The Borda rank-1 continues: z answered at step 0; q searched at step 0 and step 1.
  best = lambda row: row["candidates"][int(np.argmin(row["borda"]))]  # noqa: E731
  assert "<answer>" in best(by_id["z/0"]) and "<search>" in best(by_id["q/0"])
  q1 = BranchContext.from_json(by_id["q/1"])
  assert [t.text for t in q1.turns] == [best(by_id["q/0"])]
  assert q1.turns[0].documents[0].title == '"Zorvath"'
  # The step-1 context is token for token what the rollout feeds: prompt ids, the chosen
  # action's sampled ids, the observation's ids.
  prompts0, _, completions0 = calls[0]
  prompts1 = calls[1][0]
  z_prompt = prompt_ids(tok, SEARCH_R1, QUESTIONS[0]["question"])
  q_prompt = prompt_ids(tok, SEARCH_R1, QUESTIONS[1]["question"])
  assert [list(p) for p in prompts0] == [z_prompt] * 8 + [q_prompt] * 8
  chosen = next(c for c in completions0[8:] if "<search>" in
                tok.decode(c.token_ids)).token_ids
  obs = observation_ids(tok, *SEARCH_R1.observation(q1.turns[0].documents), 64)
  assert [list(p) for p in prompts1] == [q_prompt + list(chosen) + obs] * 8
  assert q1.turns[0].observation == tok.decode(obs)

  path = write_rows(str(tmp_path / "out" / "rows.jsonl"), rows)
  assert [json.loads(line) for line in open(path)] == rows
  assert not (tmp_path / "out" / "rows.jsonl.tmp").exists()


def test_local_applier_and_ranker_wiring(chat_model_dir):
  """The "local" backends load judge.hf_path; a prompt over judge.max_prompt_tokens fails its
  call (None), without a decode."""
  config = get_config("demo")
  config.judge.hf_path, config.judge.max_prompt_tokens, config.judge.max_new_tokens = \
      chat_model_dir, 32, 8
  config.coreact.applier = config.coreact.judge_backend = "local"
  applier, ranker = build_applier(config), build_ranker(config)
  assert applier.identity()["model"] == "tiny-chat"
  assert len(ranker.identities()) == 3 and len({id(b) for b in ranker.backends}) == 1
  rubric = parse_rubric("1. [1] The action searches\n2. [0] The action answers")
  ctx = _case_ctx("x")
  assert applier.rank([rubric], [ctx], [CANDS]) == [None]
  assert applier.score([rubric], [ctx], [CANDS[0]]) == [None]
  assert ranker.rank([ctx], [CANDS]) == [None]


# ---------------------------------------------------------------------------------------------
# Extra candidate generators (coreact.extra_generators).
# ---------------------------------------------------------------------------------------------


def _down_url(sock: socket.socket) -> str:
  """A bound socket that does not listen: connections to it are refused."""
  sock.bind(("127.0.0.1", 0))
  return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def _recording(completer, monkeypatch):
  """Records every (prompts, completions) of completer.complete."""
  calls, real = [], completer.complete
  monkeypatch.setattr(completer, "complete",
                      lambda p, **kw: calls.append(([list(x) for x in p], real(p, **kw)))
                      or calls[-1][1])
  return calls


class ScriptedGenerator:
  """An extra generator that answers every context with fixed texts (and records the contexts)."""
  name = "scripted"

  def __init__(self, texts):
    self.texts, self.contexts = texts, []

  def sample(self, contexts, *, n, **_):
    self.contexts.append(list(contexts))
    return [Generated(tuple(self.texts[:n])) for _ in contexts]


def test_extra_generators_hf_and_openai_contribute_candidates(scripted_world, chat_model_dir,
                                                             monkeypatch):
  """A second checkpoint folder (its own tokenizer) and the same model served by agentjax's
  server on loopback continue the policy's context text; rows name each candidate's source; a
  generator whose server is down contributes nothing, is counted, and collection goes on."""
  from agentjax.sampling.complete import Completer
  from agentjax.serve import ServerThread, create_app
  tok, backend, agent = scripted_world
  policy = Completer(agent.cfg, agent.params(af.SEARCH, af.ANSWER), tok, max_total_tokens=512)
  hf = HFGenerator.from_hf(chat_model_dir, max_total_tokens=512)
  served = Completer.from_hf(chat_model_dir, max_total_tokens=512)
  hf_calls, served_calls = _recording(hf.completer, monkeypatch), _recording(served, monkeypatch)
  settings = CollectSettings(max_turns=1, max_new_tokens=8, max_obs_tokens=64,
                             max_total_tokens=512, topk=1, temperatures=(1.0,),
                             per_temperature=1, num_candidates=16, seed=0)
  with ServerThread(create_app(served, model_name="tiny", max_batch=4)) as server, \
      socket.socket() as sock:
    up = OpenAIText(_judge_config(server.url + "/v1", max_concurrency=1, timeout_s=120.0),
                    model="tiny")  # the first request compiles the decode
    down = OpenAIText(_judge_config(_down_url(sock), max_retries=1), model="tiny")
    generators = [hf, OpenAIGenerator(up, "openai:tiny"), OpenAIGenerator(down, "openai:down")]
    collector = BranchCollector(policy, backend, OracleRanker(3, G, 0.0), settings, generators)
    rows, stats = collector.collect(QUESTIONS[:1])

  assert stats.steps == 1 and stats.rows == 1
  assert stats.extra_sampled == 2 and stats.sampled == 3  # one each from the policy, hf and up
  assert stats.generator_failures == 1                    # "openai:down" at the branch point
  # Each generator continued the policy's context decoded to text, encoded by its tokenizer.
  other = hf.completer.tokenizer
  text = tok.decode(prompt_ids(tok, SEARCH_R1, QUESTIONS[0]["question"]),
                    skip_special_tokens=False, clean_up_tokenization_spaces=False)
  assert "<|im_start|>user" in text   # the chat markup as the policy continues it
  want = other.encode(text, add_special_tokens=False)
  assert [p for p, _ in hf_calls] == [[want]] and [p for p, _ in served_calls] == [[want]]
  # Candidates: the generators' samples, named by source (a served one ends as its text did).
  eos = other.convert_tokens_to_ids("<|im_end|>")
  from_hf = {other.decode([i for i in c.token_ids if i != eos], skip_special_tokens=False,
                          clean_up_tokenization_spaces=False) for c in hf_calls[0][1]}
  from_up = {restore_stop(c.text, c.finish_reason, None, SEARCH_R1.stop_strings)
             for _, completions in served_calls for c in completions}
  (row,) = rows
  assert sorted(row["sources"]) == sorted(["policy", chat_model_dir, "openai:tiny"])
  by_source = dict(zip(row["sources"], row["candidates"]))
  assert "<think>Let me look.</think>" in by_source["policy"]
  assert by_source[chat_model_dir] in from_hf and by_source["openai:tiny"] in from_up


def test_extra_generator_candidate_continues_in_the_policy_tokenization(scripted_world,
                                                                       monkeypatch):
  """When an extra generator's candidate is the Borda rank-1, the trajectory goes on with its
  text encoded by the policy's tokenizer (ids the policy never sampled)."""
  from agentjax.sampling.complete import Completer
  tok, backend, agent = scripted_world
  policy = Completer(agent.cfg, agent.params(af.SEARCH, af.ANSWER), tok, max_total_tokens=512)
  calls = _recording(policy, monkeypatch)
  # For "q" this search retrieves Quellmoor's passage (its gold hop: g^2), beating the policy's
  # useless search (g^3) and wrong answer (0); for "z" the policy's answer (g) wins.
  foreign = "<think>The founder.</think><search>Quellmoor founder</search>"
  scripted = ScriptedGenerator([foreign])
  settings = CollectSettings(max_turns=2, max_new_tokens=16, max_obs_tokens=64,
                             max_total_tokens=512, topk=1, temperatures=(1.0,),
                             per_temperature=8, num_candidates=4, seed=0)
  collector = BranchCollector(policy, backend, OracleRanker(3, G, 0.0), settings, [scripted])
  rows, stats = collector.collect(QUESTIONS)

  by_id = {r["id"]: r for r in rows}
  assert sorted(by_id) == ["q/0", "q/1", "z/0"]
  q0 = by_id["q/0"]
  best = int(np.argmin(q0["borda"]))
  assert q0["candidates"][best] == foreign and q0["sources"][best] == "scripted"
  assert q0["sources"].count("scripted") == 1 and stats.extra_sampled == 3
  z0 = by_id["z/0"]
  assert z0["sources"][int(np.argmin(z0["borda"]))] == "policy"
  q1 = BranchContext.from_json(by_id["q/1"])
  assert [t.text for t in q1.turns] == [foreign]
  assert q1.turns[0].documents[0].title == '"Quellmoor"'
  # Step 1's context: the prompt, the foreign text's ids in the policy's tokenization, then the
  # observation; the extra generator was given that context decoded.
  q_prompt = prompt_ids(tok, SEARCH_R1, QUESTIONS[1]["question"])
  encoded = tok.encode(foreign, add_special_tokens=False)
  obs = observation_ids(tok, *SEARCH_R1.observation(q1.turns[0].documents), 64)
  assert calls[1][0] == [q_prompt + encoded + obs] * 8
  assert all(tuple(encoded) != c.token_ids for c in calls[0][1])  # not a policy sample
  assert scripted.contexts[1] == [tok.decode(q_prompt + encoded + obs, skip_special_tokens=False,
                                             clean_up_tokenization_spaces=False)]
  # A foreign text longer than the room left is cut at the budget (a turn cut off).
  short = _Trajectory(QUESTIONS[0], [1] * 510, [])
  cand = collector._foreign(short, foreign, "scripted")
  assert cand.ids == encoded[:2] and cand.budget_cut


def test_restore_stop_and_text_endpoint_faults():
  stops = SEARCH_R1.stop_strings
  assert restore_stop("<think>a</think><search>q", "stop", None, stops) == \
      "<think>a</think><search>q</search>"
  assert restore_stop("<search>x</search> <answer>y", "stop", None, stops) == \
      "<search>x</search> <answer>y</answer>"
  assert restore_stop("<answer>y", "stop", "</search>", stops) == "<answer>y</search>"
  assert restore_stop("<search>q", "length", None, stops) == "<search>q"
  assert restore_stop("no tags", "stop", None, stops) == "no tags"  # ended at EOS
  with socket.socket() as sock:
    text = OpenAIText(_judge_config(_down_url(sock), max_retries=2), model="m")
    got = text.complete([TextRequest("p", max_tokens=4, temperature=1.0)] * 2)
  assert [r.ok for r in got] == [False, False] and all(r.retries == 2 for r in got)
  assert all("connection failed" in r.error and "(3 attempts)" in r.error for r in got)


def test_build_generators_config_errors(tmp_path):
  config = get_config("demo")
  assert build_generators(config) == []
  for spec, match in [("openai:", "names no model"), (str(tmp_path / "missing"), "neither"),
                      ("openai:a, openai:a", "given twice"), ("policy", "neither")]:
    config.coreact.extra_generators = spec
    with pytest.raises(ValueError, match="coreact.extra_generators"):
      build_generators(config)
  (tmp_path / "policy").mkdir()
  config.coreact.extra_generators = f"openai:a,{tmp_path / 'policy'}"
  config.judge.base_url = ""
  with pytest.raises(ValueError, match="judge.base_url"):  # the endpoint is config.judge's
    build_generators(config)
  config.judge.base_url = "http://127.0.0.1:9/v1"
  config.coreact.extra_generators = "openai:a , openai:b"
  assert [g.name for g in build_generators(config)] == ["openai:a", "openai:b"]


def test_hf_generator_faults_fail_their_contexts_only():
  """A context its tokenizer makes too long fails alone (no decode of it); a decode that raises
  fails that call's contexts; an EOS is dropped from a sample's text."""

  class Fake:
    max_total_tokens, eos_ids, byte_table = 6, (9,), [bytes([97 + i]) for i in range(10)]

    def __init__(self):
      self.prompts, self.fail = [], False

    def encode(self, text):
      return [0] * len(text)

    def complete(self, prompts, **kw):
      self.prompts.append(prompts)
      if self.fail:
        raise RuntimeError("device out of memory")
      from agentjax.sampling.complete import Completion
      return [Completion("", (1, 2, 9), "stop", len(p)) for p in prompts]

  fake = Fake()
  gen = HFGenerator(fake, "fake")
  kw = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=3, stop=(), seed=0)
  got = gen.sample(["abc", "abcdef", "xy"], **kw)
  assert fake.prompts == [[[0] * 3, [0] * 3, [0] * 2, [0] * 2]]
  assert got[0] == got[2] == Generated(("bc", "bc"))
  assert got[1].texts == () and "6 tokens does not fit" in got[1].error
  fake.fail = True
  got = gen.sample(["abc", "abcdef"], **kw)
  assert "RuntimeError: device out of memory" in got[0].error and "does not fit" in got[1].error


def test_collection_survives_a_faulty_backend(scripted_world):
  """A backend that raises, or answers fewer results than queries, fails the step's queries
  (retrieval.base.guarded_search): the searches are counted as failed and collection goes on."""
  from agentjax.retrieval import SearchResponse
  from agentjax.sampling.complete import Completer
  tok, backend, agent = scripted_world

  class Faulty:
    def __init__(self, mode):
      self.mode = mode

    def search(self, queries, topk):
      if self.mode == "raise":
        raise RuntimeError("index file vanished")
      return SearchResponse([[]], [None])  # one result, whatever the number of queries

  policy = Completer(agent.cfg, agent.params(af.SEARCH, af.ANSWER), tok, max_total_tokens=512)
  settings = CollectSettings(max_turns=1, max_new_tokens=16, max_obs_tokens=64,
                             max_total_tokens=512, topk=1, temperatures=(1.0,),
                             per_temperature=8, num_candidates=4, seed=0)
  for mode in ("raise", "short"):
    rows, stats = BranchCollector(policy, Faulty(mode), OracleRanker(3, G, 0.0),
                                  settings).collect(QUESTIONS)
    assert stats.searches == 2 and stats.search_failures == 2 and len(rows) == 2


def test_montecarlo_values_from_policy_continuations(scripted_world, monkeypatch):
  """The montecarlo judges on the scripted policy, which after thinking searches or answers
  "Aldric" with probability 1/2 each (right for z, wrong for q): an answer candidate's returns
  are its own score (1 for z, 0 for q) with no continuation; a search candidate's returns are
  0/1 successes of continuations that start from exactly the context collection would feed
  (prompt, the candidate's ids, its observation), with a success rate near 1 - 2^-(steps left);
  "values" is the mean return and each judge ranks by its own slice (scipy's average ranks)."""
  from agentjax.coreact.rankers import MonteCarloRanker
  from agentjax.sampling.complete import Completer
  tok, backend, agent = scripted_world
  completer = Completer(agent.cfg, agent.params(af.SEARCH, af.ANSWER), tok, max_total_tokens=512)
  settings = CollectSettings(max_turns=3, max_new_tokens=16, max_obs_tokens=64,
                             max_total_tokens=512, topk=1, temperatures=(1.0,),
                             per_temperature=8, num_candidates=4, seed=0, value_batch=16)
  judges, rollouts = 2, 12
  ranker = MonteCarloRanker(judges, rollouts, temperature=1.0, metric="em")
  calls = []
  real = completer.complete
  monkeypatch.setattr(completer, "complete",
                      lambda p, **kw: calls.append((p, kw)) or real(p, **kw))
  rows, stats = BranchCollector(completer, backend, ranker, settings).collect(QUESTIONS)
  assert stats.value_samples > 0 and stats.value_searches > 0
  assert all(len(p) <= 16 for p, _ in calls)  # value_batch rows per call at most
  z0 = next(r for r in rows if r["id"] == "z/0")
  search_mean = None
  for row in rows:
    ctx = BranchContext.from_json(row)
    returns = np.asarray(row["value_returns"])
    assert returns.shape == (len(row["candidates"]), judges * rollouts)
    assert set(np.unique(returns)) <= {0.0, 1.0}
    np.testing.assert_allclose(row["values"], returns.mean(1))
    slices = returns.reshape(len(returns), judges, rollouts).mean(-1).T
    np.testing.assert_allclose(row["judge_rankings"], [_ranks_desc(s) for s in slices])
    np.testing.assert_allclose(row["borda"], np.sum(row["judge_rankings"], axis=0))
    for cand, r in zip(row["candidates"], returns):
      if ctx.parse(cand).kind == ANSWER:  # scored once, no continuation
        assert set(r) == {1.0 if row["id"].startswith("z") else 0.0}
    if row["id"].startswith("q"):  # nothing the policy does can succeed: every value 0, tied
      assert not returns.any() and len(set(row["expert_ranking"])) == 1
  for cand, r in zip(z0["candidates"], z0["value_returns"]):
    if "<search>" in cand:
      search_mean = float(np.mean(r))
  # Two steps left after a search at step 0: success 1 - 1/4 = 0.75 (24 samples: sd 0.09).
  assert search_mean is not None and 0.4 < search_mean < 1.0
  # A continuation's first context is the trajectory advanced with its candidate.
  search = next(c for c in z0["candidates"] if "<search>" in c)
  ids = tok.encode(search, add_special_tokens=False)
  z_prompt = prompt_ids(tok, SEARCH_R1, QUESTIONS[0]["question"])
  doc = backend.search(["Zorvath founder"], 1).documents[0]
  obs = observation_ids(tok, *SEARCH_R1.observation(doc), 64)
  continued = [list(p) for prompts, kw in calls if kw["temperature"] == 1.0 for p in prompts]
  assert z_prompt + ids + obs in continued
  with pytest.raises(ValueError, match="value_rollouts"):
    MonteCarloRanker(2, 0)
  with pytest.raises(ValueError, match="value_metric"):
    MonteCarloRanker(2, 2, metric="bleu")
