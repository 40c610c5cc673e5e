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


# ------------------------------------------------------------------ the "mix" policy (rollout_mix)

MIX_MANDATORY = 7  # thinking words every turn writes after "<think>"
MIX_EXTRA = 32     # optional thinking words; each turn adds a geometric number of them, mean this


def mix_words(agent: ScriptedAgent, count: int) -> list[int]:
  """`count` distinct plain-word token ids (ASCII letters only: no tag characters, so no stop
  string or tag can form across them; each its text's one token), none of the script's tags,
  phrases, turn starts or EOS."""
  reserved = set(agent.ids(THINK + SEARCH + ANSWER)) | agent.turn_starts()
  words = []
  for i in range(len(agent.tok)):
    text = agent.tok.decode([i])
    if (i not in reserved and i != agent.tok.eos_token_id and text.isascii() and text.isalpha()
        and agent.tok.encode(text, add_special_tokens=False) == [i]):  # one token, round trip
      words.append(i)
  if len(words) < count:
    raise ValueError(f"the tokenizer has {len(words)} plain-word tokens, the mix needs {count}")
  return words[:count]


def mix_successors(agent: ScriptedAgent, mandatory: int = MIX_MANDATORY,
                   extra: int = MIX_EXTRA) -> dict[int, list[int]]:
  """The mix policy's successor rule: turns of random length and trajectories of random turns.

  Every turn: "<think>", `mandatory` words in a fixed order, then from the last of them and from
  each of `extra` further words, one of those `extra` words or "</think>" uniformly (so the number
  of extra words is geometric: P(k) = (extra / (extra + 1))^k / (extra + 1), mean `extra`), then
  the search or the answer of the script with probability 1/2 each. A turn is at least
  mandatory + 5 tokens; one cut off by rollout.max_new_tokens is an invalid action (the
  trajectory gets the invalid-action observation and goes on).
  """
  words = mix_words(agent, mandatory + extra)
  think, close = agent.ids(["<think>"]), agent.ids(["</think>"])
  search, answer = agent.ids(SEARCH), agent.ids(ANSWER)
  fixed, optional = words[:mandatory], words[mandatory:]
  succ = chain(think + fixed)
  for w in [fixed[-1]] + optional:
    succ[w] = optional + close
  succ[close[0]] = [search[0], answer[0]]
  succ.update(chain(search))
  succ.update(chain(answer))
  for last in agent.turn_starts():
    succ[last] = think[:1]
  return succ


def shaped_transition_params(cfg, successors, fallback: int, alpha: float = 30.0, seed: int = 0):
  """transition_params (agentjax/models/qwen/scripted.py) for a model of any shape whose
  hidden_size exceeds every id the script uses (e.g. qwen2.5-1.5b with the scripted tokenizer):
  the same successor rule, at that shape's compute (benchmarks; the speed, not the output, is the
  real model's). Token x < hidden_size embeds as the one-hot e_x; larger ids embed as zeros (the
  script never reaches them). Needs an untied head. Params in cfg.param_dtype."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from agentjax.models.qwen import init_params

  h, v = cfg.hidden_size, cfg.vocab_size
  used = set(successors) | {fallback} | {y for ys in successors.values() for y in ys}
  if max(used) >= min(h, v) or cfg.tie_word_embeddings:
    raise ValueError(f"shaped_transition_params needs an untied head and every scripted id "
                     f"(max {max(used)}) < hidden_size {h} and < vocab_size {v}")
  params = init_params(cfg, jax.random.key(seed))
  dtype = params["embed_tokens"].dtype
  params["embed_tokens"] = jnp.eye(v, h, dtype=dtype)
  head = np.zeros((h, v), np.float32)
  head[:, fallback] = 1.0
  for x, ys in successors.items():
    head[x] = 0.0
    head[x, list(ys)] = 1.0
  # The final RMSNorm scales a one-hot to sqrt(h): divide it out so listed logits equal alpha.
  params["lm_head"] = jnp.asarray(head * (alpha / np.sqrt(h)), dtype)
  for i in range(cfg.num_layers):
    layer = params[f"layers_{i}"]
    layer["self_attn"]["o_proj"]["kernel"] = jnp.zeros_like(layer["self_attn"]["o_proj"]["kernel"])
    layer["mlp"]["down_proj"]["kernel"] = jnp.zeros_like(layer["mlp"]["down_proj"]["kernel"])
  return params


def mix_params(agent: ScriptedAgent, cfg=None, mandatory: int = MIX_MANDATORY,
               extra: int = MIX_EXTRA, seed: int = 0):
  """(QwenConfig, params) of the mix policy (mix_successors): the scripted shape (agent.cfg), or
  `cfg`'s shape (shaped_transition_params). Sample it at temperature 1."""
  succ = mix_successors(agent, mandatory, extra)
  if cfg is None:
    return agent.cfg, transition_params(agent.cfg, succ, fallback=agent.tok.eos_token_id,
                                        seed=seed)
  return cfg, shaped_transition_params(cfg, succ, fallback=agent.tok.eos_token_id, seed=seed)
