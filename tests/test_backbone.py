"""The research backbone's mixed SFT corpus and its gate (agentjax/studies/backbone.py,
agentjax/coreact/warmstart.py rubric_following_demos), on the suite's small SynthWorld.

The rubrics are checked by the executor's own predicates (the applier every Co-ReAct stage uses),
the gate's plumbing with a scripted completer whose answers are known."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from agentjax.agent.protocol import ANSWER_ONLY, SEARCH_R1
from agentjax.coreact.context import BranchContext
from agentjax.coreact.executor import CRITERIA, load_entities, verify_score
from agentjax.coreact.rubric import parse_rubric
from agentjax.coreact.warmstart import demo_turns, following_rubric, rubric_following_demos
from agentjax.studies import backbone
from agentjax.train import sft


@pytest.fixture(scope="module")
def parts(world_dir, tmp_path_factory):
  from agentjax.retrieval import Document, load_corpus, make_backend
  corpus_path = os.path.join(world_dir, "corpus.jsonl")
  backend = make_backend("bm25", corpus_path=corpus_path,
                         index_dir=str(tmp_path_factory.mktemp("bm25_backbone")))
  corpus = [Document(r["id"], r["contents"], 0.0) for r in load_corpus(corpus_path)]
  entities = load_entities(os.path.join(world_dir, "entities.jsonl"))
  with open(os.path.join(world_dir, "demos.jsonl")) as f:
    demos = [json.loads(line) for line in f]
  return backend, corpus, entities, demos


def _hook_positions(row):
  """(segment index of each hook, the number of assistant turns before it)."""
  out, turns = [], 0
  for k, seg in enumerate(row["segments"]):
    if seg["role"] == "assistant":
      turns += 1
    elif seg["role"] == "hook":
      out.append((k, turns))
  return out


def test_following_rows_hold_a_rubric_their_next_action_meets_in_full(parts, tokenizer):
  backend, _, entities, demos = parts
  rows = rubric_following_demos(demos[:40], backend, 3, entities, max_calls=4, seed=1)
  multi = [d for d in demos[:40] if len(d["segments"]) >= 3]
  assert len(rows) == len(multi) > 0
  negatives = 0
  for row, demo, turns in zip(rows, multi, demo_turns(multi, backend, 3)):
    # Without its hooks, the row is the demonstration; a hook before every turn after the first.
    assert [s for s in row["segments"] if s["role"] != "hook"] == demo["segments"]
    hooks = _hook_positions(row)
    assert [t for _, t in hooks] == list(range(1, (len(demo["segments"]) + 1) // 2))
    for k, t in hooks:
      rubric = parse_rubric(row["segments"][k]["text"])
      action_text = row["segments"][k + 1]["text"]
      ctx = BranchContext(question=demo, turns=tuple(turns[:t]), max_calls=4)
      assert verify_score(rubric, ctx, action_text, entities) == pytest.approx(1.0)
      positive = [i for i in rubric.items if i.weight > 0]
      assert sum(i.weight for i in positive) == pytest.approx(1.0)
      action = ctx.parse(action_text)
      for item in rubric.items:  # every item is in the vocabulary, met iff its weight is > 0
        phrase = item.text[0].lower() + item.text[1:]
        assert bool(CRITERIA[phrase](ctx, action, entities)) == (item.weight > 0), item
      negatives += sum(i.weight < 0 for i in rubric.items)
    sft.check_demo(row, SEARCH_R1)  # an SFT row: hooks fed, actions learned
  assert negatives > 0  # the avoid criteria occur (negative_rate 0.5)


def test_following_rubric_names_the_kind_of_action_and_refuses_an_invalid_one(parts):
  backend, _, entities, demos = parts
  demo = next(d for d in demos if len(d["segments"]) >= 5)
  turns = demo_turns([demo], backend, 3)[0]
  ctx = BranchContext(question=demo, turns=tuple(turns[:1]), max_calls=4)
  rng = np.random.default_rng(0)
  search = following_rubric(ctx, demo["segments"][2]["text"], entities, rng, negative_rate=0.0)
  assert "The action searches" in search and "-" not in search
  answer = following_rubric(ctx, "<think>x</think>\n<answer> Orsk </answer>", entities, rng,
                            negative_rate=1.0)
  assert "The action answers" in answer and "[-" in answer
  with pytest.raises(ValueError, match="neither searches nor answers"):
    following_rubric(ctx, "no action here", entities, rng)


def test_backbone_demos_mix_the_three_kinds_and_tokenize_in_one_run(parts, tokenizer):
  backend, corpus, entities, demos = parts
  demos = demos[:60]
  rows = backbone.backbone_demos(demos, backend, topk=3, corpus=corpus, entities=entities,
                                 abstain_text="insufficient evidence", max_calls=4, seed=0,
                                 evidence_share=0.5, following_share=0.25)
  counts = backbone.kind_counts(rows)
  multi = sum(len(d["segments"]) >= 3 for d in demos)
  assert counts == {"search": 60, "evidence": 30, "following": round(0.25 * multi)}
  assert [r for r in rows if r["kind"] == "search"] == [dict(d, kind="search") for d in demos]
  evidence = [r for r in rows if r["kind"] == "evidence"]
  assert all(r["protocol"] == ANSWER_ONLY.name for r in evidence)
  for r in evidence:  # answered iff the evidence holds a gold answer, else the abstention
    target = r["segments"][0]["text"]
    assert target == (f"<answer> {r['golden_answers'][0]} </answer>" if r["sufficient"] else
                      "<answer> insufficient evidence </answer>")
  assert 0 < sum(r["sufficient"] for r in evidence) < len(evidence)
  examples = sft.tokenize_demos(tokenizer, rows, SEARCH_R1, also=[ANSWER_ONLY])
  assert len(examples) == len(rows)
  with pytest.raises(ValueError, match="field 'protocol'"):
    sft.tokenize_demos(tokenizer, rows, SEARCH_R1)  # without sft.protocols="answer_only"
  texts = list(backbone.backbone_texts(rows))
  assert any("insufficient evidence" in t for t in texts)
  assert any("[Rubric for the next step]" in t for t in texts)
  # The same seed draws the same rows.
  again = backbone.backbone_demos(demos, backend, topk=3, corpus=corpus, entities=entities,
                                  abstain_text="insufficient evidence", max_calls=4, seed=0,
                                  evidence_share=0.5, following_share=0.25)
  assert again == rows


class _ScriptedCompleter:
  """A Completer whose reply to each prompt (by its ids) is given: what the gate measures is then
  known exactly."""

  def __init__(self, tokenizer, replies):
    self.tokenizer, self.replies, self.calls = tokenizer, replies, 0

  def complete(self, prompts, *, max_new_tokens, stop=()):
    del max_new_tokens, stop
    self.calls += 1
    out = []
    for p in prompts:
      text = self.replies.get(tuple(int(i) for i in p), "<answer> nothing </answer>")
      ids = self.tokenizer.encode(text, add_special_tokens=False)
      out.append(type("C", (), {"token_ids": ids})())
    return out


def test_gate_measures_reading_and_following_from_the_model_s_own_replies(parts, tokenizer):
  from agentjax.agent.rollout import prompt_ids
  backend, corpus, entities, demos = parts
  rows = backbone.backbone_demos(demos[:30], backend, topk=3, corpus=corpus, entities=entities,
                                 abstain_text="insufficient evidence", max_calls=4, seed=2,
                                 evidence_share=1.0, following_share=1.0)
  evidence = [r for r in rows if r["kind"] == "evidence"]
  following = [r for r in rows if r["kind"] == "following"]
  # Reading: right on every sufficient set but the first; abstains on half the insufficient ones.
  replies, want_right, want_abst = {}, [], []
  insufficient_seen = 0
  for i, r in enumerate(evidence):
    ids = tuple(prompt_ids(tokenizer, ANSWER_ONLY, r["question"], True))
    if r["sufficient"]:
      good = i != next(j for j, e in enumerate(evidence) if e["sufficient"])
      replies[ids] = f"<answer> {r['golden_answers'][0] if good else 'Nobody'} </answer>"
      want_right.append(good)
    else:
      insufficient_seen += 1
      abstain = insufficient_seen % 2 == 1
      replies[ids] = "<answer> insufficient evidence </answer>" if abstain else \
          "<answer> Nobody </answer>"
      want_abst.append(abstain)
  got = backbone.evidence_accuracy(_ScriptedCompleter(tokenizer, replies), evidence,
                                   "insufficient evidence")
  assert got["sufficient_n"] == len(want_right) and got["insufficient_n"] == len(want_abst)
  assert got["accuracy_sufficient"] == pytest.approx(np.mean(want_right))
  assert got["abstain_insufficient"] == pytest.approx(np.mean(want_abst))
  assert got["abstain_sufficient"] == 0.0
  # Following: after a rubric the scripted model takes the teacher's action (which meets it);
  # without one it always answers "Nobody" (which meets a rubric only if the rubric asks for an
  # answer and names no entity from the documents).
  replies = {}
  n_hooks = 0
  for row in following:
    for k, _ in _hook_positions(row):
      ids = tuple(sft.demo_prefix_ids(tokenizer, row, k + 1))
      replies[ids] = row["segments"][k + 1]["text"]
      n_hooks += 1
  got = backbone.rubric_following(_ScriptedCompleter(tokenizer, replies), following, backend, 3,
                                  entities, 4)
  assert got["hooks"] == n_hooks > 0
  assert got["following_rate"] == 1.0
  assert got["unguided_rate"] < 0.5
