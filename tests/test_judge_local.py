"""The "local" judge backend: a tiny random Qwen2 from a Hugging Face folder."""

import json

import pytest

from agentjax.agent.protocol import ANSWER, SEARCH, Action
from agentjax.agent.rollout import TurnRecord
from agentjax.judge import JudgeRequest, build_judge
from agentjax.judge.local import LocalJudge
from agentjax.judge.render import build_messages
from agentjax.sampling.complete import Completion
from configs.base import get_config

TEMPLATE = "Grade the last round of this trace.\n\n{{TRACE}}\n\nReply with a JSON object."


def _turn(k, observation=""):
  return TurnRecord(text=f"<think>step {k}</think>\n<search>capital {k}</search>",
                    action=Action(SEARCH, f"capital {k}"),
                    observation=observation or f"\n\n<information>Doc {k}: Orsk.</information>\n\n")


def _requests():
  """Trajectories of 2, 1 and 3 rounds; the last round of the third has a long observation."""
  answer = TurnRecord(text="<think>done</think>\n<answer>Orsk</answer>",
                      action=Action(ANSWER, "Orsk"))
  long_obs = "\n\n<information>" + "The quick brown fox. " * 40 + "</information>\n\n"
  return [JudgeRequest({"question": "What is the capital of Veltrana?"}, (_turn(0), answer)),
          JudgeRequest({"question": "Who was born in Orsk?"}, (_turn(0),)),
          JudgeRequest({"question": "Where?"}, (_turn(0), _turn(1), _turn(2, long_obs)))]


@pytest.fixture(scope="module")
def judge_config(chat_model_dir, tmp_path_factory):
  folder = chat_model_dir
  prompt = str(tmp_path_factory.mktemp("prompt") / "judge.md")
  with open(prompt, "w") as f:
    f.write(TEMPLATE)
  cfg = get_config("demo").judge
  cfg.backend, cfg.hf_path, cfg.prompt_path = "local", folder, prompt
  cfg.max_prompt_tokens, cfg.max_new_tokens = 200, 8
  return cfg


@pytest.fixture(scope="module")
def judge(judge_config):
  return build_judge(judge_config)


def test_one_batched_decode_per_judge_call_and_junk_replies_fail(judge, monkeypatch):
  assert isinstance(judge, LocalJudge)
  assert judge.identity()["backend"] == "local" and judge.identity()["model"] == "tiny-chat"
  requests = _requests()
  completer = judge.completer
  # Every round's prompt, built independently: the chat template over render's messages.
  expected = {(i, k): completer.chat_ids(build_messages(TEMPLATE, r, k))
              for i, r in enumerate(requests) for k in range(len(r.turns))}
  too_long = [key for key, ids in expected.items() if len(ids) > judge.max_prompt_tokens]
  assert too_long == [(2, 2)]  # the fixture's long observation; every other prompt fits
  calls = []
  real = completer.complete
  monkeypatch.setattr(completer, "complete", lambda p, **kw: calls.append((p, kw)) or real(p, **kw))

  verdicts = judge.judge(requests)

  assert [len(v) for v in verdicts] == [2, 1, 3]
  assert len(calls) == 1 and calls[0][1] == {"max_new_tokens": 8}  # greedy, one batch
  fitting = [ids for key, ids in expected.items() if key not in too_long]
  assert calls[0][0] == fitting
  # The replies are the one-at-a-time greedy completions of each prompt (batching changes
  # nothing), and a random model's text is no verdict: each round failed with the reason.
  alone = [completer.complete([ids], max_new_tokens=8)[0] for ids in fitting]
  keys = [key for key in expected if key not in too_long]
  for (i, k), c in zip(keys, alone):
    assert judge.last_replies[i][k] == c.text
    v = verdicts[i][k]
    assert not v.ok and (v.retrieval, v.thinking) == (0, 0)
    assert "no JSON object" in v.error and v.error.startswith("reply cut at max_new_tokens")
  v = verdicts[2][2]
  assert not v.ok and "exceeds judge.max_prompt_tokens=200" in v.error
  assert judge.last_replies[2][2] is None
  assert judge.judge([]) == [] and judge.judge([JudgeRequest({"question": "q"}, ())]) == [[]]


def test_replies_map_to_their_rounds_in_chunks_and_decode_faults_fail(judge, monkeypatch):
  """Injected replies: each verdict lands on its own round, with max_batch chunks sorted by
  length; a decode that raises fails its rounds instead of raising."""
  requests = _requests()
  prompts_seen = []

  def fake_complete(prompts, *, max_new_tokens):
    prompts_seen.append(len(prompts))
    out = []
    for ids in prompts:  # the verdict encodes the prompt's length: retrieval = parity
      reply = json.dumps({"analysis": f"n={len(ids)}", "retrieval_reward": len(ids) % 2,
                          "thinking_reward": 1})
      out.append(Completion(f"```json\n{reply}\n```", (1,), "stop", len(ids)))
    return out

  monkeypatch.setattr(judge.completer, "complete", fake_complete)
  monkeypatch.setattr(judge, "max_batch", 2)
  verdicts = judge.judge(requests)
  assert prompts_seen == [2, 2, 1]
  for i, r in enumerate(requests):
    for k in range(len(r.turns)):
      if (i, k) == (2, 2):
        assert not verdicts[i][k].ok
        continue
      n = len(judge.completer.chat_ids(build_messages(TEMPLATE, r, k)))
      assert verdicts[i][k].ok and verdicts[i][k].analysis == f"n={n}"
      assert (verdicts[i][k].retrieval, verdicts[i][k].thinking) == (n % 2, 1)

  def broken(prompts, *, max_new_tokens):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

  monkeypatch.setattr(judge.completer, "complete", broken)
  verdicts = judge.judge(requests[:2])
  assert all(not v.ok and "RESOURCE_EXHAUSTED" in v.error for row in verdicts for v in row)


def test_config_errors_name_the_field(judge_config, judge):
  bad = judge_config.copy_and_resolve_references()
  bad.hf_path = "/nonexistent/judge"
  with pytest.raises(ValueError, match="judge.hf_path"):
    build_judge(bad)
  with pytest.raises(ValueError, match="judge.max_batch"):
    LocalJudge(judge.completer, TEMPLATE, model_name="m", max_prompt_tokens=8, max_new_tokens=8,
               max_batch=-1)
  with pytest.raises(ValueError, match="TRACE"):
    LocalJudge(judge.completer, "no marker", model_name="m", max_prompt_tokens=8,
               max_new_tokens=8)
