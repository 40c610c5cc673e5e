"""agentjax.sampling.complete: batched completion against one-at-a-time runs and transformers."""


import numpy as np
import pytest

from agentjax.compiles import CompileCounter
from agentjax.sampling.complete import Completer, PromptError

MAX_NEW = 12


@pytest.fixture(scope="module")
def setup(hf_checkpoint, chat_model_dir):
  """(Completer, transformers model, prompts): a tiny random Qwen2 with the 400-token tokenizer."""
  _, hf_model = hf_checkpoint("qwen2-chat")
  completer = Completer.from_hf(chat_model_dir, max_total_tokens=64)
  prompts = [completer.chat_ids([{"role": "user", "content": "capital of Veltrana?"}]),
             completer.encode("The quick brown"), completer.encode("Orsk")]
  return completer, hf_model, prompts


def _greedy_reference(hf_model, ids, max_new, eos_ids=()):
  """transformers' greedy generate of one prompt: the generated ids (EOS included)."""
  import torch

  with torch.no_grad():
    out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=int),
                            max_new_tokens=max_new, do_sample=False,
                            eos_token_id=list(eos_ids) or None, pad_token_id=0)
  return tuple(out[0, len(ids):].tolist())


def test_batched_greedy_equals_one_at_a_time_and_transformers(setup):
  completer, hf_model, prompts = setup
  batched = completer.complete(prompts, max_new_tokens=MAX_NEW)
  assert [c.prompt_tokens for c in batched] == [len(p) for p in prompts]
  for i, p in enumerate(prompts):
    alone = completer.complete([p], max_new_tokens=MAX_NEW)[0]
    assert alone == batched[i], i
  # The random model never reaches an EOS within MAX_NEW (asserted: the comparison is then exact
  # without modelling transformers' EOS padding).
  for i in (0, 1):
    ref = _greedy_reference(hf_model, prompts[i], MAX_NEW, completer.eos_ids)
    assert batched[i].token_ids == ref, i
    assert batched[i].finish_reason == "length" and len(ref) == MAX_NEW
    assert batched[i].text == b"".join(completer.byte_table[t] for t in ref).decode(
        "utf-8", errors="replace")


def test_stop_strings_cut_the_text_and_eos_ends_a_row(setup):
  completer, _, prompts = setup
  free = completer.complete(prompts, max_new_tokens=MAX_NEW)
  raw = [b"".join(completer.byte_table[t] for t in c.token_ids) for c in free]
  # A stop string from the middle of row 1's free-running text, spanning a token boundary when
  # the tokens allow it; row 0 and 2 stop there too only if it occurs in their text.
  ends = np.cumsum([len(completer.byte_table[t]) for t in free[1].token_ids])
  start = int(ends[2]) - 1
  stop = raw[1][start:start + 2].decode("utf-8")
  never = "\x07never\x07"
  out = completer.complete(prompts, max_new_tokens=MAX_NEW, stop=[never, stop])
  for c, r, f in zip(out, raw, free):
    at = r.find(stop.encode())
    if at < 0:
      assert c == f
      continue
    # Reference: the first token whose bytes reach past the stop's end completes it.
    cum = np.cumsum([len(completer.byte_table[t]) for t in f.token_ids])
    k = int(np.argmax(cum >= at + len(stop.encode()))) + 1
    assert c.token_ids == f.token_ids[:k]
    assert c.text == r[:at].decode("utf-8", errors="replace")
    assert c.finish_reason == "stop"
  assert out[1].finish_reason == "stop"

  # EOS: declare the 4th token row 2 emits an EOS id; the row ends there, the EOS not in text.
  eos_tok = free[2].token_ids[3]
  first = free[2].token_ids.index(eos_tok)
  with_eos = Completer(completer.cfg.replace(eos_token_id=eos_tok), completer.params,
                       completer.tokenizer, max_total_tokens=64)
  c = with_eos.complete([prompts[2]], max_new_tokens=MAX_NEW)[0]
  assert c.token_ids == free[2].token_ids[:first + 1] and c.finish_reason == "stop"
  assert c.text == b"".join(completer.byte_table[t]
                            for t in free[2].token_ids[:first]).decode("utf-8", errors="replace")


def test_context_budget_too_long_prompts_and_compile_reuse(setup):
  completer, _, prompts = setup
  full = completer.complete(prompts, max_new_tokens=MAX_NEW)
  tight = Completer(completer.cfg, completer.params, completer.tokenizer,
                    max_total_tokens=len(prompts[0]) + 3)
  out = tight.complete(prompts, max_new_tokens=MAX_NEW)
  assert out[0].token_ids == full[0].token_ids[:3] and out[0].finish_reason == "length"
  assert out[1] == full[1]  # short prompts keep their MAX_NEW tokens

  with pytest.raises(ValueError, match="prompt 1: 20 tokens do not fit max_total_tokens=20"):
    Completer(completer.cfg, completer.params, completer.tokenizer,
              max_total_tokens=20).complete([[1] * 5, [1] * 20], max_new_tokens=4)
  with pytest.raises(ValueError, match="prompt 2 is empty"):
    completer.complete([[1], [2], []], max_new_tokens=4)
  with pytest.raises(ValueError, match="prompt 0: token id 400 outside"):
    completer.complete([[1, 400]], max_new_tokens=4)
  with pytest.raises(PromptError, match="top_p"):  # a request's fault: a server's 400
    completer.complete([[1]], max_new_tokens=4, temperature=1.0, top_p=1.5)

  # Same buckets (3 or 4 rows -> 4, prompt block 32, cache 32, max_new 16) and a stop set of the
  # same padded shape ([4, 16]) as an earlier call: nothing compiles, not even the stop table.
  completer.complete(prompts, max_new_tokens=MAX_NEW, stop=["ab"])
  counter = CompileCounter()
  again = completer.complete([prompts[2], prompts[1], prompts[0], prompts[1]],
                             max_new_tokens=MAX_NEW - 2,
                             stop=["\x01\x01", "\x02", "\x03\x03\x03"])
  assert counter.count == 0
  assert [c.token_ids for c in again] == [full[i].token_ids[:MAX_NEW - 2] for i in (2, 1, 0, 1)]


def test_chunked_prefill_equals_one_block(setup, monkeypatch):
  completer, _, prompts = setup
  # 4 rows x 8 tokens a call: row 0's 18-token prompt is fed in 3 extends.
  chunked = Completer(completer.cfg, completer.params, completer.tokenizer,
                      max_total_tokens=64, prefill_tokens=32)
  from agentjax.sampling import complete as complete_module
  widths = []
  real = complete_module.extend
  monkeypatch.setattr(complete_module, "extend",
                      lambda m, p, s, tokens, *a: widths.append(tokens.shape) or real(m, p, s,
                                                                                     tokens, *a))
  assert chunked.complete(prompts, max_new_tokens=MAX_NEW) == completer.complete(
      prompts, max_new_tokens=MAX_NEW)
  assert widths[:3] == [(4, 8)] * 3 and widths[3:] == [(4, 32)]


def test_shared_prefix_is_attended_once_with_the_same_result(setup, monkeypatch):
  completer, hf_model, _ = setup
  wide = Completer(completer.cfg, completer.params, completer.tokenizer, max_total_tokens=256,
                   prefill_tokens=64)
  head = ("The quick brown fox jumps over the lazy dog. Who was born in which city? " * 4)
  prompts = [wide.chat_ids([{"role": "user", "content": head + tail}])
             for tail in ("Orsk", "Veltrana capital of the north", "Orsk")]
  from agentjax.sampling import complete as complete_module
  shared = complete_module._shared_prefix([np.array(p) for p in prompts])
  assert shared >= complete_module.MIN_SHARED_PREFIX
  # The prefix's cache has padding slots (a fine bucket above its length): they must be masked.
  assert complete_module._fine_bucket(shared) > shared
  calls = []
  real_generate = complete_module.generate
  monkeypatch.setattr(complete_module, "generate",
                      lambda *a: calls.append((a[2].tokens.shape, a[-1])) or real_generate(*a))
  batched = wide.complete(prompts, max_new_tokens=MAX_NEW)
  # The shared path ran: own caches hold the rest of each prompt + the reply only.
  (own_shape, prefix), = calls
  assert int(prefix.length) == shared
  assert own_shape == (4, complete_module._fine_bucket(max(map(len, prompts)) - shared + MAX_NEW))
  assert batched[0] == batched[2]
  assert [c.prompt_tokens for c in batched] == [len(p) for p in prompts]
  for i, p in enumerate(prompts[:2]):
    assert wide.complete([p], max_new_tokens=MAX_NEW)[0] == batched[i], i  # no prefix path
    ref = _greedy_reference(hf_model, p, MAX_NEW, wide.eos_ids)
    assert batched[i].token_ids == ref and len(ref) == MAX_NEW, i
  # The prefix length is data, not a shape: a call whose shared prefix is one token shorter, in
  # the same buckets, compiles nothing.
  shorter = [p[:5] + p[6:] for p in prompts]
  assert complete_module._fine_bucket(shared - 1) == complete_module._fine_bucket(shared)
  counter = CompileCounter()
  wide.complete(shorter, max_new_tokens=MAX_NEW)
  assert counter.count == 0 and int(calls[-1][1].length) == shared - 1


def test_shared_prefix_keeps_the_context_budget(setup):
  completer, _, _ = setup
  head = "The quick brown fox jumps over the lazy dog. " * 7
  prompts = [completer.encode(head + tail) for tail in ("Orsk", "Veltrana", "a")]
  from agentjax.sampling import complete as complete_module
  assert complete_module._shared_prefix([np.array(p) for p in prompts]) >= 64
  limit = max(map(len, prompts)) + 3
  tight = Completer(completer.cfg, completer.params, completer.tokenizer,
                    max_total_tokens=limit)
  out = tight.complete(prompts, max_new_tokens=MAX_NEW)
  wide = Completer(completer.cfg, completer.params, completer.tokenizer, max_total_tokens=256)
  for p, c in zip(prompts, out):  # each row: prompt + new tokens = the budget, as alone
    alone = wide.complete([p], max_new_tokens=limit - len(p))[0]
    assert c.token_ids == alone.token_ids and c.finish_reason == "length"
    assert len(p) + len(c.token_ids) == limit


def test_sampling_is_reproducible_per_seed(setup):
  completer, _, prompts = setup
  a = completer.complete(prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=5)
  b = completer.complete(prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=5)
  assert a == b
  assert all(len(c.token_ids) == 8 and max(c.token_ids) < 400 for c in a)
  with pytest.raises(ValueError, match="temperature"):
    completer.complete(prompts, max_new_tokens=4, temperature=-1.0)


def _greedy_with_penalty(hf_model, ids, max_new, penalty, eos_ids=()):
  import torch

  with torch.no_grad():
    out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=int),
                            max_new_tokens=max_new, do_sample=False, repetition_penalty=penalty,
                            eos_token_id=list(eos_ids) or None, pad_token_id=0)
  return tuple(out[0, len(ids):].tolist())


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_greedy_equals_transformers(setup, penalty):
  """Greedy decoding under a repetition penalty (above 1 discourages repeats, below 1 favours
  them) gives transformers' tokens, batched (rows of different lengths)."""
  completer, hf_model, prompts = setup
  plain = completer.complete(prompts, max_new_tokens=MAX_NEW)
  got = completer.complete(prompts, max_new_tokens=MAX_NEW, repetition_penalty=penalty)
  for i in range(len(prompts)):
    ref = _greedy_with_penalty(hf_model, prompts[i], MAX_NEW, penalty, completer.eos_ids)
    assert got[i].token_ids == ref[:len(got[i].token_ids)], i
    assert len(ref) == len(got[i].token_ids) or got[i].finish_reason == "stop", i
  assert any(g.token_ids != p.token_ids for g, p in zip(got, plain))  # the penalty acts


def test_repetition_penalty_counts_a_shared_prefix(setup, chat_model_dir, monkeypatch):
  """Prompts sharing a prefix longer than MIN_SHARED_PREFIX: the penalty feeds it to every row
  (the shared-prefix path would hide its tokens from the penalty) and matches transformers."""
  import agentjax.sampling.complete as complete_lib
  _, hf_model, prompts = setup
  completer = Completer.from_hf(chat_model_dir, max_total_tokens=128)
  head = (list(prompts[1]) * 40)[:complete_lib.MIN_SHARED_PREFIX + 8]
  shared = [head + list(prompts[0][:3]), head + list(prompts[2])]
  seen = []
  real = complete_lib.shared_prefix
  monkeypatch.setattr(complete_lib, "shared_prefix", lambda s: seen.append(1) or real(s))
  completer.complete(shared, max_new_tokens=4)
  assert seen  # without the penalty the prefix is shared
  seen.clear()
  got = completer.complete(shared, max_new_tokens=4, repetition_penalty=1.3)
  assert not seen
  for i, ids in enumerate(shared):
    ref = _greedy_with_penalty(hf_model, ids, 4, 1.3, completer.eos_ids)
    assert got[i].token_ids == ref[:len(got[i].token_ids)], i


def _budget_processor(open_id, close_id, budget):
  """The thinking budget as a transformers LogitsProcessor over the ids so far (an independent
  reading of SamplingParams.max_think_tokens): a row whose last `open_id` comes after its last
  `close_id` with `budget` ids after it may only produce `close_id`."""
  import torch
  from transformers import LogitsProcessor

  class Budget(LogitsProcessor):
    def __call__(self, input_ids, scores):
      for row, ids in enumerate(input_ids.tolist()):
        opens = [i for i, t in enumerate(ids) if t == open_id]
        closes = [i for i, t in enumerate(ids) if t == close_id]
        if opens and (not closes or opens[-1] > closes[-1]) and len(ids) - 1 - opens[-1] >= budget:
          scores[row] = -torch.inf
          scores[row, close_id] = 0.0
      return scores

  return Budget()


class _TagTokenizer:
  """The completer's tokenizer with two chosen ids standing for <think> and </think>."""

  def __init__(self, tokenizer, open_id, close_id):
    self._tok, self._tags = tokenizer, {"<think>": [open_id], "</think>": [close_id]}

  def encode(self, text, add_special_tokens=False):
    return self._tags.get(text) or self._tok.encode(text, add_special_tokens=add_special_tokens)

  def __getattr__(self, name):
    return getattr(self._tok, name)


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_thinking_budget_greedy_equals_transformers(setup, penalty):
  """max_think_tokens: greedy decoding where a token the model emits stands for <think> and
  another for </think> gives transformers' generate with the budget as a logits processor (and
  with its repetition penalty): the block is closed after `budget` tokens, a closed block and a
  row that never opens one are left alone. The tiny chat tokenizer has no one-token <think>:
  asked of it, the budget is refused naming the field."""
  import copy

  import torch
  completer, hf_model, prompts = setup
  with pytest.raises(PromptError, match="max_think_tokens.*one token"):
    completer.complete(prompts, max_new_tokens=4, max_think_tokens=3)
  plain = completer.complete(prompts, max_new_tokens=MAX_NEW, repetition_penalty=penalty)
  # <think>: a token some row r generates at step j, first there, absent from its prompt and not
  # again within the budget; </think>: a token that row never makes.
  budget = 3
  r, j = next((r, j) for r, c in enumerate(plain) for j, t in enumerate(c.token_ids)
              if j + 1 + budget < len(c.token_ids) and t not in prompts[r]
              and t not in c.token_ids[:j] + c.token_ids[j + 1:j + 2 + budget])
  row = plain[r].token_ids
  open_id = row[j]
  close_id = next(t for t in sum(prompts, []) if t not in row and t not in prompts[r])
  tagged = copy.copy(completer)
  tagged.tokenizer = _TagTokenizer(completer.tokenizer, open_id, close_id)
  got = tagged.complete(prompts, max_new_tokens=MAX_NEW, max_think_tokens=budget,
                        repetition_penalty=penalty)
  for i, ids in enumerate(prompts):
    with torch.no_grad():
      out = hf_model.generate(
          torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=int),
          max_new_tokens=MAX_NEW, do_sample=False, repetition_penalty=penalty,
          logits_processor=[_budget_processor(open_id, close_id, budget)],
          eos_token_id=list(completer.eos_ids) or None, pad_token_id=0)
    ref = tuple(out[0, len(ids):].tolist())
    assert got[i].token_ids == ref[:len(got[i].token_ids)], i
    assert len(ref) == len(got[i].token_ids) or got[i].finish_reason == "stop", i
  # The budget acted on row r: the same tokens up to `budget` after the opening, then the close.
  assert got[r].token_ids[:j + 1 + budget] == row[:j + 1 + budget]
  assert got[r].token_ids[j + 1 + budget] == close_id
