"""The multi-turn rollout engine, on a scripted Qwen agent against real BM25 retrieval."""

from __future__ import annotations


import jax
import numpy as np
import pytest

from agentjax.compiles import CompileCounter
from agentjax.agent import (INVALID, SEARCH, SEARCH_R1, TOOL_CALL, Action, RolloutConfig,
                            RolloutEngine, transcripts_of)
from agentjax.retrieval import HttpSearchBackend
from agentjax.sampling import SamplingParams
from tests import agent_fixtures as af
from tests.retrieval_fixtures import free_port

QUESTIONS = ["Who founded Zorvath?", "Where is Quellmoor?"]


def assert_consistent(batch):
  """Invariants every TrajectoryBatch keeps, whatever happened in the rollout."""
  valid, loss_mask, turn_id = (np.asarray(x) for x in jax.device_get(
      (batch.valid, batch.loss_mask, batch.turn_id)))
  rows = np.arange(len(batch.num_turns))
  np.testing.assert_array_equal(batch.turn_ends[rows, batch.num_turns], valid.sum(1))
  assert (np.diff(batch.turn_ends, axis=1) >= 0).all()
  assert not (loss_mask & ~valid).any()
  for b in rows:
    n = valid[b].sum()
    assert valid[b, :n].all()  # real tokens are a prefix
    np.testing.assert_array_equal(turn_id[b, :n] >= 0, np.arange(n) >= batch.turn_ends[b, 0])


def assert_turn_records(batch, eng):
  """batch.turns: one TurnRecord per turn, whose texts are the transcript after the prompt."""
  for b, text in enumerate(transcripts_of(batch, eng.byte_table)):
    records = batch.turns[b]
    assert len(records) == batch.num_turns[b]
    prompt = eng.decode(np.asarray(batch.tokens[b, :batch.turn_ends[b, 0]]))
    assert prompt + "".join(r.hook_text + r.text + r.observation for r in records) == text
    for r in records:
      assert (r.action.kind == SEARCH) or not r.documents
      assert r.search_error is None or not r.documents


def engine(world, **overrides):
  """An engine on the shared shapes: every test runs 2 questions x 2 (4 rows), greedy, in a
  1024-slot cache unless it is about other settings, so the jitted extend/generate programs
  compile once for the module, not once per test."""
  tok, backend, agent = world
  kw = dict(group_size=2, max_turns=3, max_new_tokens=16, max_obs_tokens=96,
            max_total_tokens=1024, topk=2, sampling=SamplingParams(greedy=True))
  backend = overrides.pop("backend", backend)
  hook = overrides.pop("before_turn", None)
  return RolloutEngine(agent.cfg, tok, backend, RolloutConfig(**{**kw, **overrides}), before_turn=hook)


def test_scripted_trajectory_token_by_token(world):
  """Greedy: think + search every turn until max_turns. Every token is where the protocol says,
  and the loss mask is exactly the sampled tokens: observations and prompt are excluded."""
  tok, backend, agent = world
  eng = engine(world)
  batch, metrics = eng.run(agent.params(af.SEARCH), QUESTIONS, jax.random.key(0))
  docs = backend.search(["Zorvath founder"], 2).documents[0]
  observation = eng.observation_ids(*SEARCH_R1.observation(docs))
  turn = agent.ids(af.THINK + af.SEARCH)
  tokens, loss_mask, turn_id, valid = jax.device_get(
      (batch.tokens, batch.loss_mask, batch.turn_id, batch.valid))
  for b in range(4):
    prompt = eng.prompt_ids(QUESTIONS[b // 2])
    want = list(prompt)
    want_mask = [False] * len(prompt)
    want_turn = [-1] * len(prompt)
    ends = [len(want)]
    for t in range(3):
      want += turn + observation
      want_mask += [True] * len(turn) + [False] * len(observation)
      want_turn += [t] * (len(turn) + len(observation))
      ends.append(len(want))
    n = len(want)
    assert list(tokens[b, :n]) == want
    assert list(loss_mask[b, :n]) == want_mask and not loss_mask[b, n:].any()
    assert list(turn_id[b, :n]) == want_turn
    assert valid[b, :n].all() and not valid[b, n:].any()
    assert list(batch.turn_ends[b]) == ends
  assert list(batch.num_turns) == [3] * 4 and batch.truncated.all() and not batch.answered.any()
  assert_consistent(batch)
  assert list(batch.group_ids) == [0, 0, 1, 1]
  assert metrics["search_failures"] == 0 and metrics["format_errors"] == 0
  assert metrics["search_queries"] == 12.0 and metrics["search_last_error"] is None
  assert not batch.format_valid.any()  # never answered: malformed by the protocol's rule
  assert_turn_records(batch, eng)
  first = batch.turns[0][0]
  assert first.action == Action(SEARCH, "Zorvath founder") and first.documents == tuple(docs)
  assert first.observation == eng.decode(observation) and first.search_error is None
  text = transcripts_of(batch, eng.byte_table)[0]
  assert text.count("<information>Doc 1(Title: \"Zorvath\")") == 3


@pytest.mark.parametrize("kind,seed", [("slots", 5), ("turns", 0)])
def test_sampled_branching_gives_ragged_turns_and_answers(world, kind, seed):
  tok, backend, agent = world
  eng = engine(world, max_turns=4, sampling=SamplingParams(temperature=1.0), engine=kind)
  batch, metrics = eng.run(agent.params(af.SEARCH, af.ANSWER), QUESTIONS, jax.random.key(seed))
  # Both outcomes and several lengths occur (the slot engine's key 5 gives turns 2, 3, 2, 4, the
  # turn engine's key 0 turns 4, 2, 3, 4, each with one row that never answers); the rules below
  # are checked on every row.
  assert len(set(batch.num_turns)) > 2 and batch.answered.any() and not batch.answered.all()
  for b in range(4):
    if batch.answered[b]:
      assert batch.answers[b] == "Aldric" and batch.format_valid[b] and not batch.truncated[b]
      last = batch.turn_ends[b, batch.num_turns[b]]
      answer = agent.ids(af.ANSWER)
      assert list(np.asarray(batch.tokens[b, last - len(answer):last])) == answer
    else:
      assert batch.num_turns[b] == 4 and batch.truncated[b] and not batch.format_valid[b]
  loss_mask, turn_id = jax.device_get((batch.loss_mask, batch.turn_id))
  # 3 sampled tokens of think and 3 of the action in every turn
  np.testing.assert_array_equal(loss_mask.sum(1), 6 * batch.num_turns)
  assert metrics["answered"] == batch.answered.mean()
  assert_consistent(batch)
  assert_turn_records(batch, eng)
  for b in range(4):
    assert (batch.turns[b][-1].action.kind == "answer") == batch.answered[b]


def test_invalid_actions_and_eos(world):
  tok, backend, agent = world
  eng = engine(world)
  batch, metrics = eng.run(agent.params(af.EMPTY_SEARCH), QUESTIONS, jax.random.key(0))
  text = transcripts_of(batch, eng.byte_table)[0]
  assert text.count("My previous action is invalid") == 3
  assert list(batch.num_format_errors) == [3] * 4 and not batch.format_valid.any()
  assert metrics["format_errors"] == 12 and metrics["search_queries"] == 0
  # What the model writes in a query is cleaned before the retriever sees it; a query of only
  # control / bidi characters is an invalid action (the engine parses with the protocol).
  assert eng.parse("<search>\u202e\x00\x1b\n</search>").kind == INVALID
  assert eng.parse("<search>\u2066Orsk\x07\u2069</search>") == Action(SEARCH, "Orsk")
  # A model that ends its turn (EOS) without an action stops there.
  assert_consistent(batch)
  # A turn that ends (EOS) without an action is invalid too: the agent is told and goes on.
  params = agent.params([tok.eos_token])  # THINK then EOS
  batch, _ = eng.run(params, QUESTIONS, jax.random.key(0))
  assert list(batch.num_turns) == [3] * 4 and list(batch.num_format_errors) == [3] * 4
  assert batch.truncated.all() and not batch.answered.any()
  assert_consistent(batch)



def test_retriever_down_gives_error_observation(world):
  down = HttpSearchBackend(f"http://127.0.0.1:{free_port()}/retrieve", timeout_s=0.5,
                           max_retries=1, backoff_s=0.01)
  tok, _, agent = world
  eng = engine(world, backend=down, max_turns=2)
  batch, metrics = eng.run(agent.params(af.SEARCH), QUESTIONS, jax.random.key(0))
  text = transcripts_of(batch, eng.byte_table)[0]
  assert text.count("<information>Search failed: ") == 2
  assert list(batch.num_search_failures) == [2] * 4 and metrics["search_failures"] == 8
  assert down.stats.failed_queries == 8
  # What the trainer's retriever-down rule reads: queries sent, and the last error.
  assert metrics["search_queries"] == 8.0
  error = metrics["search_last_error"]
  assert isinstance(error, str) and error.startswith(f"retriever {down.url}")
  # The agent is shown that error (as much of it as rollout.max_obs_tokens lets through).
  assert eng.decode(eng.observation_ids(*SEARCH_R1.error_observation(error))) in text
  assert_consistent(batch)
  assert_turn_records(batch, eng)
  assert all(r.search_error == error and not r.documents for r in batch.turns[0])


class BrokenBackend:
  """A backend with a bug: raises, or answers fewer results than queries."""

  def __init__(self, short):
    self.short = short

  def search(self, queries, topk):
    if self.short:
      from agentjax.retrieval import SearchResponse
      return SearchResponse([[]], [None])
    raise RuntimeError("index file vanished")


@pytest.mark.parametrize("short", [False, True])
def test_backend_bug_does_not_crash_the_rollout(world, short):
  tok, _, agent = world
  eng = engine(world, backend=BrokenBackend(short), max_turns=2)
  batch, metrics = eng.run(agent.params(af.SEARCH), QUESTIONS, jax.random.key(0))
  assert metrics["search_failures"] == 8 and metrics["search_queries"] == 8.0
  assert "search backend error" in transcripts_of(batch, eng.byte_table)[3]
  assert metrics["search_last_error"].startswith("search backend error: ")
  if not short:
    assert "index file vanished" in metrics["search_last_error"]
  assert_consistent(batch)


def test_caller_rng_survives_the_rollout(world):
  tok, _, agent = world
  rng = jax.random.key(7)
  engine(world, max_turns=1).run(agent.params(af.SEARCH), QUESTIONS, rng)
  jax.random.split(rng)  # the engine donated its own copy, not the caller's key


def test_tool_call_protocol(world):
  tok, backend, agent = world
  eng = engine(world, protocol="tool_call", max_turns=2)
  batch, _ = eng.run(agent.params(af.TOOL_SEARCH), QUESTIONS, jax.random.key(0))
  text = transcripts_of(batch, eng.byte_table)[0]
  assert text.count("<tool_response>\nDoc 1(Title: \"Zorvath\")") == 2
  assert text.count("<|im_start|>user\n<tool_response>") == 2
  batch, metrics = eng.run(agent.params(af.TOOL_BROKEN), QUESTIONS, jax.random.key(0))
  assert metrics["format_errors"] == 8 and TOOL_CALL.invalid_message.strip() in \
      transcripts_of(batch, eng.byte_table)[0]


@pytest.mark.parametrize("kind", ["slots", "turns"])
def test_before_turn_hook_and_two_policies(world, kind):
  tok, backend, agent = world
  seen = []

  def hook(turn, rows, transcripts):
    seen.append((turn, list(rows)))
    return [f"Rubric {turn}: cite a document." for _ in rows]

  eng = engine(world, before_turn=hook, engine=kind)
  rubric = ["Rubric 0: cite a document.", "Rubric 1: cite a document."]
  searcher = agent.params(af.SEARCH, extra_starts=rubric)
  answerer = agent.params(af.ANSWER, extra_starts=rubric)
  batch, _ = eng.run({"searcher": searcher, "answerer": answerer}, QUESTIONS, jax.random.key(0),
                     policy_for_turn=lambda t: "searcher" if t == 0 else "answerer")
  assert list(batch.num_turns) == [2] * 4 and batch.answered.all()
  if kind == "turns":  # one call per turn for the whole batch
    assert seen == [(0, [0, 1, 2, 3]), (1, [0, 1, 2, 3])]
  else:  # one call per lane and turn: every row once per turn, in turn order per row
    assert sorted((t, b) for t, rows in seen for b in rows) == [
        (t, b) for t in (0, 1) for b in range(4)]
    assert all(t == 0 for t, _ in seen[:2])
  tokens, loss_mask = jax.device_get((batch.tokens, batch.loss_mask))
  text = transcripts_of(batch, eng.byte_table)[0]
  assert (text.index("Rubric 0") < text.index("<search>Zorvath founder") < text.index("Rubric 1")
          < text.index("<answer>Aldric"))
  # injected text is context, never trained on
  rubric = eng.encode("Rubric 1: cite a document.")
  row = list(tokens[0])
  start = next(i for i in range(len(row)) if row[i:i + len(rubric)] == rubric)
  assert not loss_mask[0, start:start + len(rubric)].any()
  assert_turn_records(batch, eng)
  assert [r.hook_text for r in batch.turns[0]] == ["Rubric 0: cite a document.",
                                                   "Rubric 1: cite a document."]


def test_decode_layout_made_once_per_policy_per_rollout(world, monkeypatch):
  """The decode-layout copy of the weights is made once per policy and rollout, not per turn."""
  from agentjax.agent import rollout
  tok, backend, agent = world
  made = []

  def counting(model, params):
    made.append(model)
    return real(model, params)

  real = rollout.decode_layout
  monkeypatch.setattr(rollout, "decode_layout", counting)
  batch, _ = engine(world).run(agent.params(af.SEARCH), QUESTIONS, jax.random.key(0))
  assert list(batch.num_turns) == [3] * 4 and len(made) == 1
  made.clear()
  policies = {"searcher": agent.params(af.SEARCH), "answerer": agent.params(af.ANSWER)}
  engine(world, max_turns=3).run(policies, QUESTIONS, jax.random.key(0),
                                 policy_for_turn=lambda t: "searcher" if t < 2 else "answerer")
  assert len(made) == 2


def test_budget_truncation_and_prompt_too_long(world):
  tok, backend, agent = world
  prompt_len = len(engine(world).prompt_ids(QUESTIONS[0]))
  eng = engine(world, max_total_tokens=prompt_len + 40, max_turns=4)
  batch, _ = eng.run(agent.params(af.SEARCH), QUESTIONS[:1], jax.random.key(0))
  assert batch.truncated.all() and not batch.answered.any()
  assert int(np.asarray(batch.valid).sum(1).max()) <= prompt_len + 40
  assert_consistent(batch)
  # The budget runs out in the middle of the first action: cut off, not a format error.
  eng = engine(world, max_total_tokens=prompt_len + 4)
  batch, _ = eng.run(agent.params(af.SEARCH), QUESTIONS[:1], jax.random.key(0))
  assert batch.truncated.all() and list(batch.num_format_errors) == [0, 0]
  np.testing.assert_array_equal(np.asarray(batch.valid).sum(1), prompt_len + 4)
  assert_consistent(batch)
  assert_turn_records(batch, eng)
  assert batch.turns[0][0].action.kind == INVALID  # cut off: recorded, not parsed
  eng = engine(world, max_total_tokens=prompt_len)
  with pytest.raises(ValueError, match="max_total_tokens"):
    eng.run(agent.params(af.SEARCH), QUESTIONS[:1], jax.random.key(0))


def test_compilations_are_bounded(world):
  """A second rollout with other questions (same buckets) compiles nothing new."""
  tok, backend, agent = world
  eng = engine(world, sampling=SamplingParams(temperature=1.0))
  params = agent.params(af.SEARCH, af.ANSWER)
  counter = CompileCounter()
  eng.run(params, QUESTIONS, jax.random.key(0))
  first = counter.count
  counter = CompileCounter()
  eng.run(params, ["Who founded Brindlecap, the library?", "Quellmoor?"], jax.random.key(1))
  assert counter.count == 0
  assert first <= 12, first


def _agentjax_sources():
  import pathlib

  import agentjax
  root = pathlib.Path(agentjax.__file__).parent
  for path in sorted(root.rglob("*.py")):
    module = ".".join(("agentjax",) + path.relative_to(root).with_suffix("").parts)
    yield module.removesuffix(".__init__"), path


def test_no_class_overrides_a_private_method_of_the_rollout_engine():
  """Turns are shaped through the public hooks (before_turn, guide: agentjax/agent/guide.py),
  which both engines honour: no class in agentjax (found by its source, any depth of
  subclassing) redefines a private method of RolloutEngine."""
  import ast
  private = {n for n in vars(RolloutEngine) if n.startswith("_") and not n.startswith("__")}
  assert "_feed" in private
  classes = {}  # name -> (bases, methods, module)
  for module, path in _agentjax_sources():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ClassDef):
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)
                 for b in node.bases}
        methods = {f.name for f in node.body
                   if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes.setdefault(node.name, []).append((bases, methods, module))
  engines, grew = {"RolloutEngine"}, True
  while grew:  # subclasses of subclasses
    grew = False
    for name, defs in classes.items():
      if name not in engines and any(bases & engines for bases, _, _ in defs):
        engines.add(name)
        grew = True
  assert "GuidedEngine" in engines
  overrides = {(module, name, m) for name in engines - {"RolloutEngine"}
               for bases, methods, module in classes[name] if bases & engines
               for m in methods & private}
  assert not overrides, overrides
