"""A scripted search agent for engine tests: a real Qwen model whose next token follows a script.

The tokenizer is the tiny byte-level BPE plus the protocol tags and a few phrases as added tokens,
so each scripted step is one token and the script is unambiguous. See
agentjax/models/qwen/scripted.py for how the parameters realize the script.
"""

from __future__ import annotations

import json

from agentjax.agent.protocol import SEARCH_R1, TOOL_CALL
from agentjax.models.qwen.scripted import chain, transition_config, transition_params
from agentjax.models.tokenizer import load_tokenizer
from agentjax.sampling import bucket
from tests import hf_fixtures

TOOL_JSON = json.dumps({"name": "search", "arguments": {"query": "Zorvath founder"}})
PHRASES = ["Let me look.", "Zorvath founder", "Aldric", TOOL_JSON, "{broken json"]
TAGS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>",
        "</information>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

THINK = ["<think>", "Let me look.", "</think>"]
SEARCH = ["<search>", "Zorvath founder", "</search>"]
EMPTY_SEARCH = ["<search>", "</search>"]
ANSWER = ["<answer>", "Aldric", "</answer>"]
TOOL_SEARCH = ["<tool_call>", TOOL_JSON, "</tool_call>"]
TOOL_BROKEN = ["<tool_call>", "{broken json", "</tool_call>"]


def scripted_tokenizer(folder: str):
  hf_fixtures.make_tokenizer_dir(folder)
  tok = load_tokenizer(folder)
  tok.add_tokens(TAGS + PHRASES)
  tok.save_pretrained(folder)
  return load_tokenizer(folder)


class ScriptedAgent:
  """Builds params for scripts like THINK -> (SEARCH | ANSWER) on a tokenizer."""

  def __init__(self, tokenizer):
    self.tok = tokenizer
    self.cfg = transition_config(bucket(len(tokenizer), 64))

  def ids(self, pieces):
    out = []
    for piece in pieces:
      ids = self.tok.encode(piece, add_special_tokens=False)
      assert len(ids) == 1, (piece, ids)
      out += ids
    return out

  def turn_starts(self):
    """Last token of every context a turn can start from (prompt, observations, messages)."""
    enc = lambda s: self.tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = self.tok.apply_chat_template([{"role": "user", "content": "q"}],
                                          add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
    lasts = {prompt[-1]}
    for proto in (SEARCH_R1, TOOL_CALL):
      lasts.add(enc(proto.observation_suffix)[-1])
      lasts.add(enc(proto.invalid_message)[-1])
    return lasts

  def params(self, *actions, seed=0, extra_starts=()):
    """Each turn: THINK then one of `actions` (uniformly when sampling; the first when greedy).

    A turn starts after any of turn_starts() or extra_starts (texts whose last token starts it).
    """
    think = self.ids(THINK)
    succ = chain(think)
    for action in actions:
      ids = self.ids(action)
      for a, bs in chain(ids).items():
        succ.setdefault(a, []).extend(b for b in bs if b not in succ[a])
      succ.setdefault(think[-1], []).append(ids[0])
    starts = self.turn_starts() | {self.tok.encode(t, add_special_tokens=False)[-1]
                                   for t in extra_starts}
    for last in starts:
      succ[last] = [think[0]]
    return transition_params(self.cfg, succ, fallback=self.tok.eos_token_id, seed=seed)
