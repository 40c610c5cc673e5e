"""The "mix" scripted policy of the rollout_mix bench (tests/agent_fixtures.py): its next-token
distributions against a NumPy reference of the script, at the scripted shape and at a larger
shape (shaped_transition_params). The bench itself is not run by the test suite:
`python launch/bench.py rollout_mix`."""

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models import masks
from agentjax.models.qwen import Qwen, QwenConfig
from tests import agent_fixtures as af


def _next_token_probs(cfg, params, ids):
  """[N, V] next-token probabilities after each one-token context ids[n]."""
  tokens = jnp.asarray(np.asarray(ids, np.int32)[:, None])
  valid = jnp.ones(tokens.shape, bool)
  logits = Qwen(cfg).apply({"params": params}, tokens, masks.positions_from_padding(valid),
                           masks.causal_padding_mask(valid))[0]
  return np.asarray(jax.nn.softmax(logits[:, 0].astype(jnp.float32), axis=-1))


def _reference(agent, vocab, mandatory, extra):
  """The script written out: {token: uniform successors} as [N, V] rows for its N tokens."""
  words = af.mix_words(agent, mandatory + extra)
  think, close = agent.ids(["<think>"]), agent.ids(["</think>"])
  search, answer = agent.ids(af.SEARCH), agent.ids(af.ANSWER)
  rule = {think[0]: [words[0]]}
  for a, b in zip(words[:mandatory - 1], words[1:mandatory]):
    rule[a] = [b]
  for w in words[mandatory - 1:]:  # the last fixed word and every optional word
    rule[w] = words[mandatory:] + close
  rule[close[0]] = [search[0], answer[0]]
  for seq in (search, answer):
    for a, b in zip(seq[:-1], seq[1:]):
      rule[a] = [b]
  for start in agent.turn_starts():
    rule[start] = think
  ids = sorted(rule)
  probs = np.zeros((len(ids), vocab))
  for n, x in enumerate(ids):
    probs[n, rule[x]] = 1.0 / len(rule[x])
  return ids, probs


def test_mix_policy_follows_the_script(scripted_world):
  tok, _, agent = scripted_world
  mandatory, extra = 3, 5
  words = af.mix_words(agent, mandatory + extra)
  for w in words:  # plain single tokens: no tag character can form a stop string
    assert not set(tok.decode([w])) & set("<>/") and tok.encode(tok.decode([w]),
                                                                 add_special_tokens=False) == [w]
  cfg, params = af.mix_params(agent, mandatory=mandatory, extra=extra)
  ids, want = _reference(agent, cfg.vocab_size, mandatory, extra)
  np.testing.assert_allclose(_next_token_probs(cfg, params, ids), want, atol=1e-6)
  # The same script at a wider, deeper shape (the benchmark's real-model variant): ids < hidden.
  shape = QwenConfig(model_type="qwen2", vocab_size=640, hidden_size=448, intermediate_size=64,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=112, rope_theta=1e4,
                     tie_word_embeddings=False, qkv_bias=True, qk_norm=False,
                     max_position_embeddings=4096)
  cfg, params = af.mix_params(agent, shape, mandatory=mandatory, extra=extra)
  ids, want = _reference(agent, shape.vocab_size, mandatory, extra)
  np.testing.assert_allclose(_next_token_probs(cfg, params, ids), want, atol=1e-6)
