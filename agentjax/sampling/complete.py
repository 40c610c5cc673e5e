"""Batched text completion with the KV-cache sampler: many prompts, one decode batch.

    completer = Completer.from_hf("path/to/Qwen2.5-0.5B-Instruct", max_total_tokens=4096)
    ids = [completer.chat_ids([{"role": "user", "content": "Hi"}]), completer.encode("1, 2,")]
    out = completer.complete(ids, max_new_tokens=64, stop=["\\n\\n"])   # one Completion per prompt

Every prompt of a call is one row of a single `init_state` / `extend` / `generate` run (the
sampler in agentjax/sampling/sampler.py): prompts are fed in one forward pass, then one
`lax.while_loop` decodes every row until each stops on its own (EOS, a stop string, its token
budget). Shapes are bucketed so that a stream of calls compiles a few programs, not one per call:

  rows         next power of two >= len(prompts) up to 16, then next multiple of 16 (padding rows
               are inactive; a judge step's 40 calls decode as 48 rows, not 64)
  prompt block next power of two >= the longest part fed (>= 16), at most the power of two
               <= prefill_tokens / rows (>= 8): longer parts are fed in several `extend` calls,
               which bounds the [rows, heads, block, cache] attention scores of one call (on a
               2-core CPU at the demo shape, 16 rows x 64 prompt tokens a call prefill twice as
               fast per row as 16 x 256)
  cache        next power of two >= min(max_total_tokens, longest prompt + max_new_tokens);
               with a shared prefix (below), the prefix cache and the own caches are
               `_fine_bucket` sizes instead (4 per octave), so programs are bounded by the
               product rows x prefix size x own size x max_new x sampling settings
  max_new      next power of two >= max_new_tokens (>= 16), capped at the cache; each row's exact
               limit, min(its length + max_new_tokens, max_total_tokens) (with a shared prefix of
               P tokens: min(own length + max_new_tokens, max_total_tokens - P)), is its budget, a
               [B] vector the decode loop compares with every row's length
  stop strings [M, Ls] padded to M in {0, 4, 8, ...} (by repeating a stop) and Ls in {16, 32, ...}
               (left zero padding: stops are right-aligned and matched over their own length)

A prefix common to every prompt of a call (a judge's instructions, a system prompt), when at least
MIN_SHARED_PREFIX tokens, is prefilled once in a one-row cache of `_fine_bucket` slots that every
row attends to (sampler.SharedPrefix: read once per decode step for all rows, not copied per row);
each row's own cache then holds only the rest of its prompt and its reply, `_fine_bucket` of the
longest rest + max_new_tokens slots. A judge step's 40 calls share ~1500 of ~1900 prompt tokens:
a decode step reads the prefix once plus 40 short caches instead of 40 full-length ones.

The sampling settings (temperature, top_p) are static arguments of `generate`: each distinct
setting compiles its own decode loop; greedy (temperature 0) is one setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.parallel.host import to_host
from agentjax.sampling.eos import eos_token_ids
from agentjax.sampling.sample import SamplingParams
from agentjax.sampling.sampler import (STOP_EOS, STOP_STRING, DecodeState, SharedPrefix, bucket,
                                       decode_layout, extend, generate, init_state, shared_prefix)
from agentjax.sampling.stops import StopTable
from agentjax.sampling.text import token_byte_table, with_think_tags

# Distinct stop-string sets whose padded tables are kept (a server sees the same few again).
_STOP_CACHE_SIZE = 64
# A prefix shared by every prompt of a call is prefilled once, and attended to as one shared
# cache, when it is at least this long (shorter ones are fed per row: they cost little, and the
# shared path is a second family of compiled programs).
MIN_SHARED_PREFIX = 64



class PromptError(ValueError):
  """A request's prompts or settings that the Completer refuses (an empty or too long prompt,
  an id outside the vocabulary, a bad max_new_tokens, temperature or stop string): the caller's
  fault, unlike any other error of a call (a server maps this one to 400, the rest to 500)."""

@dataclasses.dataclass(frozen=True)
class Completion:
  """One prompt's completion.

  text: the generated text, decoded from token_ids; without the final EOS token and cut before
    the first stop string when one matched (as OpenAI's API returns it).
  token_ids: the exact sampled ids, the EOS token or the token completing a stop string included.
  finish_reason: "stop" (an EOS token or a stop string) or "length" (max_new_tokens or the
    max_total_tokens context budget).
  prompt_tokens: the prompt's length.
  """
  text: str
  token_ids: tuple[int, ...]
  finish_reason: str
  prompt_tokens: int


class Completer:
  """Batched text completion with agentjax's KV-cache sampler (init_state / extend / generate,
  StopTable, token_byte_table).

  Not re-entrant: calls on one Completer must not overlap (a server serializes them and batches
  concurrent requests into one `complete`).
  """

  def __init__(self, cfg: QwenConfig, params: Any, tokenizer: Any, *,
               max_total_tokens: int = 4096, mesh: jax.sharding.Mesh | None = None,
               prefill_tokens: int = 1024):
    """
    Args:
      cfg, params: the model (params on `mesh` when one is given).
      tokenizer: its transformers tokenizer.
      max_total_tokens: the context budget of a row, prompt and generated tokens together.
      mesh: place the decode state by the rules table (batch over data and fsdp).
      prefill_tokens: prompt tokens (rows x width) fed per `extend` call, about.
    """
    if max_total_tokens < 2:
      raise ValueError(f"max_total_tokens must be >= 2, got {max_total_tokens}")
    if prefill_tokens < 1:
      raise ValueError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
    self.prefill_tokens = int(prefill_tokens)
    self.cfg, self.params, self.tokenizer, self.mesh = cfg, params, tokenizer, mesh
    self.max_total_tokens = int(max_total_tokens)
    self.model = Qwen(cfg)
    # The decode loop's layout, made once (on CPU a second copy of the projection kernels, kept for
    # the Completer's life; `extend` uses the checkpoint layout).
    self.decode_model, self.decode_params = decode_layout(self.model, params)
    self.byte_table = token_byte_table(tokenizer, cfg.vocab_size)
    self.eos_ids = eos_token_ids(cfg, tokenizer, chat=True)
    self._eos = jax.device_put(np.asarray(self.eos_ids, np.int32))
    # Token bytes are built once; each stop-string set only adds its small [M, Ls] arrays.
    self._no_stops = _pad_stops(StopTable.build(self.byte_table, ()), 0)
    self._stop_tables: dict[tuple[str, ...], StopTable] = {}

  @classmethod
  def from_hf(cls, path: str, *, max_total_tokens: int = 4096,
              mesh: jax.sharding.Mesh | None = None, dtype: str | None = None,
              prefill_tokens: int = 1024) -> "Completer":
    """A Completer of a Hugging Face folder (config.json, safetensors, tokenizer).

    dtype: parameter and compute dtype ("float32", "bfloat16"); default: the config's float32.
    """
    from agentjax.models.qwen.checkpoint import load_hf
    from agentjax.models.tokenizer import load_tokenizer

    overrides = {} if dtype is None else {"param_dtype": dtype, "dtype": dtype}
    cfg, params = load_hf(path, mesh=mesh, **overrides)
    tokenizer = load_tokenizer(path, require_chat_template=False)
    return cls(cfg, params, tokenizer, max_total_tokens=max_total_tokens, mesh=mesh,
               prefill_tokens=prefill_tokens)

  # ------------------------------------------------------------------ text -> ids (host)

  def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt ids of a chat: the tokenizer's chat template with the assistant turn opened."""
    if not getattr(self.tokenizer, "chat_template", None):
      raise ValueError("the tokenizer has no chat_template; chat prompts need one")
    return [int(i) for i in self.tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, return_dict=False)]

  def encode(self, text: str) -> list[int]:
    """Token ids of plain text (no BOS/EOS added)."""
    return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

  # ------------------------------------------------------------------ completion

  def stop_table(self, stop: Sequence[str]) -> StopTable:
    """The padded StopTable of a stop-string set (cached; equal shapes share one program)."""
    key = tuple(stop)
    if not key:
      return self._no_stops
    if key not in self._stop_tables:
      if any(not isinstance(s, str) or not s for s in key):
        raise PromptError(f"stop strings must be non-empty strings, got {list(key)!r}")
      if len(self._stop_tables) >= _STOP_CACHE_SIZE:
        self._stop_tables.pop(next(iter(self._stop_tables)))
      # Only the stop arrays come from build: the token bytes are the ones built once.
      stops = _pad_stops(StopTable.build((), key), bucket(len(key), minimum=4))
      self._stop_tables[key] = stops.replace(token_bytes=self._no_stops.token_bytes,
                                             token_len=self._no_stops.token_len)
    return self._stop_tables[key]

  def complete(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 0.0, top_p: float = 1.0, stop: Sequence[str] = (),
               seed: int = 0, repetition_penalty: float = 1.0,
               max_think_tokens: int = 0) -> list[Completion]:
    """Completes every prompt in one decode batch.

    Args:
      prompts: P token-id sequences, each non-empty and shorter than max_total_tokens.
      max_new_tokens: generated tokens per prompt at most (fewer when the context budget ends).
      temperature: 0 is greedy (then top_p is not used); > 0 samples.
      top_p: nucleus sampling mass in (0, 1].
      stop: strings that end a completion (matched on the generated bytes, inside the loop).
      seed: the sampling key (unused when greedy). Sampled rows depend on the whole batch
        (the noise is drawn per decode step for every row), greedy rows do not.
      repetition_penalty: transformers' (SamplingParams), over each prompt and its reply; 1.0
        is off. With it on, a prefix shared by the prompts is fed to every row (not shared):
        the penalty reads the tokens in each row's own cache.
      max_think_tokens: the thinking budget (SamplingParams; the official Co-ReAct generator's
        `max_think_tokens`): a `<think>` block open this many tokens gets `</think>` as its next
        token; 0 is off. With it on, a shared prefix is fed to every row too.
    Returns:
      P Completions, in the order of `prompts`.
    Raises:
      PromptError (a ValueError) naming the prompt's index when a prompt is empty, holds an id
      outside the vocabulary, or does not fit (len >= max_total_tokens); and for bad settings.
    """
    if max_new_tokens < 1:
      raise PromptError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
      raise PromptError(f"temperature must be >= 0, got {temperature}")
    try:
      rules = dict(repetition_penalty=float(repetition_penalty),
                   max_think_tokens=int(max_think_tokens))
      sampling = SamplingParams(greedy=True, **rules) if temperature == 0 \
          else SamplingParams(temperature=float(temperature), top_p=float(top_p), **rules)
      sampling = with_think_tags(sampling, self.tokenizer)
    except ValueError as e:  # a bad top_p: the request's fault
      raise PromptError(str(e)) from None
    table = self.stop_table(stop)
    prompts = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
    for i, ids in enumerate(prompts):
      if not len(ids):
        raise PromptError(f"prompt {i} is empty")
      if len(ids) >= self.max_total_tokens:
        raise PromptError(f"prompt {i}: {len(ids)} tokens do not fit max_total_tokens="
                         f"{self.max_total_tokens} (prompt and at least one new token)")
      if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
        bad = int(ids.max() if ids.max() >= 0 else ids.min())
        raise PromptError(f"prompt {i}: token id {bad} outside the vocabulary "
                          f"[0, {self.cfg.vocab_size})")
    if not prompts:
      return []

    n = len(prompts)
    rows = bucket(n, minimum=1) if n <= 16 else -(-n // 16) * 16
    # The penalty and the thinking budget read each row's own cache, which a shared prefix is not.
    per_row = sampling.repetition_penalty != 1.0 or sampling.max_think_tokens > 0
    shared = _shared_prefix(prompts) if n > 1 and not per_row else 0
    if shared < MIN_SHARED_PREFIX:
      shared = 0
    # Each row's own tokens (after the shared prefix) and its own slots' limit; padding rows have
    # length and budget 0 and are never active.
    lengths = np.zeros(rows, np.int32)
    lengths[:n] = [len(p) - shared for p in prompts]
    room = self.max_total_tokens - shared
    longest = int(lengths.max())
    cache_len = (_fine_bucket(min(room, longest + max_new_tokens)) if shared else
                 bucket(min(room, longest + max_new_tokens)))
    max_new = min(bucket(max_new_tokens), cache_len)
    budget = np.where(lengths > 0, np.minimum(lengths + max_new_tokens, room), 0)
    block = np.zeros((rows, longest), np.int32)
    for b, ids in enumerate(prompts):
      block[b, :len(ids) - shared] = ids[shared:]

    # Host arrays go in by device_put (jnp.asarray would compile a copy program per shape).
    turn, gen_turn, one_turn, active, budget = jax.device_put(
        (np.full(rows, -1, np.int32), np.zeros(rows, np.int32), np.full(1, -1, np.int32),
         lengths > 0, budget.astype(np.int32)))
    prefix = None
    if shared:
      one = init_state(self.cfg, 1, _fine_bucket(shared), jax.random.key(seed))
      head = prompts[0][None, :shared].astype(np.int32)
      one = self._feed(one, head, np.array([shared], np.int32), one_turn)
      prefix = shared_prefix(one)
      if self.mesh is not None:  # replicated: every row's queries read all of it
        prefix = jax.device_put(prefix, jax.sharding.NamedSharding(
            self.mesh, jax.sharding.PartitionSpec()))
    state = init_state(self.cfg, rows, cache_len, jax.random.key(seed), mesh=self.mesh)
    state = self._feed(state, block, lengths, turn, prefix)
    state, gen = generate(self.decode_model, self.decode_params, state, active, gen_turn,
                          (table, self._eos, budget), sampling, max_new, prefix)
    new_tokens, num_new, reason = to_host((gen.new_tokens, gen.num_new, gen.stop_reason))
    del state
    stops = [s.encode("utf-8") for s in stop]
    return [self._completion(new_tokens[b, :num_new[b]], int(reason[b]), stops, len(prompts[b]))
            for b in range(n)]

  def _feed(self, state: DecodeState, block: np.ndarray, lengths: np.ndarray,
            turn: jax.Array, prefix: SharedPrefix | None = None) -> DecodeState:
    """Feeds row b's first lengths[b] tokens of block [B, L] (after `prefix` when given) in
    `extend` calls of a bucketed width (see the module docstring); a row whose tokens have
    ended is left as it is."""
    longest = int(lengths.max())
    if longest == 0:
      return state
    chunk = 1 << max(3, (self.prefill_tokens // len(lengths)).bit_length() - 1)  # pow2 <= tokens/B
    width = min(bucket(longest), chunk)
    block = np.pad(block, ((0, 0), (0, -(-longest // width) * width - block.shape[1])))
    for lo in range(0, block.shape[1], width):
      part, fed = jax.device_put((block[:, lo:lo + width],
                                  np.clip(lengths - lo, 0, width).astype(np.int32)))
      state = extend(self.model, self.params, state, part, fed, turn, prefix)
    return state

  def _completion(self, ids: np.ndarray, reason: int, stops: Sequence[bytes],
                  prompt_tokens: int) -> Completion:
    ids = tuple(int(t) for t in ids)
    text = b"".join(self.byte_table[t] for t in (ids[:-1] if reason == STOP_EOS else ids))
    if reason == STOP_STRING:
      # The loop stops at the first token completing any stop: cut at the earliest stop start.
      text = text[:min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))]
    return Completion(text=text.decode("utf-8", errors="replace"), token_ids=ids,
                      finish_reason="stop" if reason in (STOP_EOS, STOP_STRING) else "length",
                      prompt_tokens=prompt_tokens)


def _shared_prefix(prompts: Sequence[np.ndarray]) -> int:
  """Length of the prefix common to every prompt, leaving each prompt at least one token of its
  own (the row's next-token logits come from its last fed token)."""
  limit = min(len(p) for p in prompts) - 1
  first = prompts[0][:limit]
  same = np.ones(limit, bool)
  for p in prompts[1:]:
    same &= p[:limit] == first
  return int(limit if same.all() else np.argmin(same))


def _fine_bucket(n: int) -> int:
  """n rounded up to a multiple of an eighth of its power-of-two bucket (>= 16) for the caches a
  decode step reads in full: 1500 -> 1536 where bucket gives 2048. bucket(n) is the top of n's
  octave, so this is four shapes per octave and at most ~25% padding (1025 -> 1280); from 64 to
  4096 tokens, 28 sizes in all."""
  step = max(16, bucket(n) // 8)
  return -(-n // step) * step


def _pad_stops(table: StopTable, rows: int) -> StopTable:
  """The table with its stops padded to [rows, bucket(Ls)]: extra rows repeat the first stop
  (a duplicate matches when the original does, so nothing changes), extra columns are zeros on
  the left (stops are right-aligned and compared over their own length only)."""
  stops, stop_len = np.asarray(table.stops), np.asarray(table.stop_len)
  width = bucket(stops.shape[1])
  stops = np.pad(stops, ((0, 0), (width - stops.shape[1], 0)))
  if len(stops):
    pick = np.minimum(np.arange(rows), len(stops) - 1)
    pick[len(stops):] = 0
    stops, stop_len = stops[pick], stop_len[pick]
  stops, stop_len = jax.device_put((stops, stop_len))
  return table.replace(stops=stops, stop_len=stop_len)


__all__ = ["Completer", "Completion"]
