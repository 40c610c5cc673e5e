"""Choosing the next token: greedy, temperature, top-k, top-p."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings (hashable: a jit static argument).

  greedy ignores the temperature and the filters. top_k = 0 and top_p = 1.0 disable those
  filters. repetition_penalty: transformers' (RepetitionPenaltyLogitsProcessor, before the
  temperature and the filters, greedy included): the logit of every token that occurs in the
  row's context (prompt and generated tokens, as the decode state holds them) is divided by it
  when positive and multiplied by it when negative; 1.0 is off.
  max_think_tokens: a thinking budget (the official Co-ReAct generator's `max_think_tokens`): a
  row whose context holds an open `<think>` block with this many tokens after it gets the
  closing tag as its next token instead of what it sampled (close_long_thoughts); 0 is off.
  think_tags: the ids of `<think>` and `</think>` that budget reads (single tokens; the rollout
  engine and the Completer fill them in from their tokenizer, sampling.text.think_tag_ids).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  repetition_penalty: float = 1.0
  max_think_tokens: int = 0
  think_tags: tuple[int, int] | None = None

  def __post_init__(self):
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
    if isinstance(self.max_think_tokens, bool) or not isinstance(self.max_think_tokens, int) \
        or self.max_think_tokens < 0:
      raise ValueError(f"max_think_tokens must be an int >= 0 (0: off), got "
                       f"{self.max_think_tokens!r}")
    if self.think_tags is not None and (len(self.think_tags) != 2 or
                                        min(self.think_tags) < 0):
      raise ValueError(f"think_tags must be the ids (open, close) of <think> and </think>, got "
                       f"{self.think_tags!r}")
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 (or greedy=True), got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def _argmax_vocab_major(x: jax.Array) -> jax.Array:
  """argmax over axis 0 of [V, B] (the first index of the maximum, as jnp.argmax) -> [B] int32.

  As a max, then the smallest index holding it: two plain reductions that XLA:CPU vectorizes,
  ~4x faster than its variadic argmax reduce over the major axis (5.7 ms a decode step at V =
  151936, B = 16). A NaN counts as the maximum, as in jnp.argmax.
  """
  top = jnp.max(x, axis=0)
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
  hit = (x == top[None]) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, index, x.shape[0]), axis=0)


def filter_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
  """The logits that sampling draws from: temperature, then top-k, then top-p (transformers' order).

  Ties are kept or dropped together, so the result depends on the values only, not on where the
  tokens sit in the vocabulary (bf16 logits tie often):
    top-k keeps every token >= the k-th largest value (more than k on a tie there), exactly as
      transformers' TopKLogitsWarper and vLLM;
    top-p keeps a token iff the mass of the strictly more probable tokens (after top-k,
      renormalized) is < top_p. Without ties this is TopPLogitsWarper's rule (it removes the
      tokens whose ascending cumulative mass is <= 1 - top_p); a tie group at the nucleus boundary
      is kept whole, where TopPLogitsWarper keeps the part that torch.sort happens to put last.

  Args:
    logits: [B, V] next-token logits.
    params: the sampling settings (greedy is not looked at).
  Returns:
    [B, V] float32: logits / temperature, the filtered-out tokens at -inf. Its softmax is the
    renormalized sampling distribution.
  """
  scaled = logits.astype(jnp.float32) / params.temperature
  if params.top_k == 0 and params.top_p >= 1.0:
    return scaled
  vocab = scaled.shape[-1]
  # Only the k best are sorted (sorting a 150k vocabulary every step is expensive); each token is
  # then kept or dropped by comparing its value with one threshold per row, which keeps ties whole.
  top_vals = jax.lax.top_k(scaled, min(params.top_k, vocab) if params.top_k > 0 else vocab)[0]
  threshold = top_vals[:, -1:]                                              # [B, 1]
  if params.top_p < 1.0:
    # Normalized over everything top-k keeps, including ties of the k-th value beyond the k.
    log_z = jax.nn.logsumexp(jnp.where(scaled >= threshold, scaled, -jnp.inf), axis=-1,
                             keepdims=True)
    probs = jnp.exp(top_vals - log_z)
    # Mass ranked above each candidate. For the first of a tie group that is the strictly-greater
    # mass, so when it passes, the threshold (a value) admits the whole group.
    before = jnp.cumsum(probs, axis=-1) - probs
    threshold = jnp.min(jnp.where(before < params.top_p, top_vals, jnp.inf), axis=-1,
                        keepdims=True)
  return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def penalize_repeats(logits: jax.Array, context: tuple[jax.Array, jax.Array], penalty: float,
                     vocab_major: bool = False) -> jax.Array:
  """transformers' repetition penalty: logits of tokens present in each row's context divided by
  `penalty` where positive (>= 0), multiplied by it where negative.

  Args:
    logits: [B, V], or [V, B] with vocab_major=True.
    context: (tokens [B, S] int32, valid [B, S] bool): each row's context, its valid slots
      counted (a decode state's tokens and valid: a rewound slot is not valid, so not counted).
  Cost: one [B, S] scatter into a [B, V] mask per call (only when the penalty is on).
  """
  tokens, valid = context
  b, vocab = tokens.shape[0], logits.shape[0 if vocab_major else 1]
  rows = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], tokens.shape)
  seen = jnp.zeros((b, vocab), bool).at[rows, jnp.where(valid, tokens, vocab)].set(
      True, mode="drop")
  if vocab_major:
    seen = seen.T
  logits = logits.astype(jnp.float32)
  return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


def token_logprobs(logits: jax.Array, tokens: jax.Array, vocab_major: bool = False
                   ) -> jax.Array:
  """log softmax(logits)[tokens] per row ([B]) as logit - logsumexp: no [B, V] log-softmax is
  materialized (every decode step computes it)."""
  logits = logits.astype(jnp.float32)
  if vocab_major:
    return logits[tokens, jnp.arange(logits.shape[1])] - jax.nn.logsumexp(logits, axis=0)
  chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
  return chosen - jax.nn.logsumexp(logits, axis=-1)


def close_long_thoughts(tokens: jax.Array, context: tuple[jax.Array, jax.Array],
                        params: SamplingParams) -> jax.Array:
  """The thinking budget: `</think>` in place of the sampled token of every row whose context
  holds an open `<think>` (its last `<think>` after its last `</think>`) followed by at least
  params.max_think_tokens valid tokens; the other rows keep theirs.

  Args:
    tokens: [B] int32 sampled next tokens.
    context: (tokens [B, S] int32, valid [B, S] bool): each row's context in position order
      (prompt included, so a block opened by the prompt counts from there).
  Returns:
    [B] int32. Cost: three [B, S] reductions per call (only when the budget is on).
  """
  if params.think_tags is None:
    raise ValueError("max_think_tokens needs think_tags (the ids of <think> and </think>; the "
                     "rollout engine and the Completer set them from their tokenizer)")
  ctx, valid = context
  open_id, close_id = params.think_tags
  pos = jnp.arange(ctx.shape[1], dtype=jnp.int32)[None, :]
  last = lambda tag: jnp.max(jnp.where(valid & (ctx == tag), pos, -1), axis=1)  # noqa: E731
  opened, closed = last(open_id), last(close_id)
  thought = jnp.sum(valid & (pos > opened[:, None]), axis=1, dtype=jnp.int32)
  force = (opened > closed) & (thought >= params.max_think_tokens)
  return jnp.where(force, jnp.int32(close_id), tokens)


def _with_rules(sample, logits, params, vocab_major, context):
  """sample(logits) with the repetition penalty applied to the logits it chooses from and the
  thinking budget to what it chose; the log-probabilities stay the model's own (temperature 1,
  no penalty, a forced `</think>` at the model's probability of it): what the trainer's scoring
  pass recomputes, as verl's actor does for a rollout sampled with a penalty."""
  penalty, budget = params.repetition_penalty != 1.0, params.max_think_tokens > 0
  if not (penalty or budget):
    return sample(logits)
  if context is None:
    raise ValueError("repetition_penalty and max_think_tokens need the rows' context "
                     "(tokens, valid)")
  tokens, _ = sample(penalize_repeats(logits, context, params.repetition_penalty, vocab_major)
                     if penalty else logits)
  if budget:
    tokens = close_long_thoughts(tokens, context, params)
  return tokens, token_logprobs(logits, tokens, vocab_major)


def sample_token(rng: jax.Array, logits: jax.Array, params: SamplingParams,
                 vocab_major: bool = False,
                 context: tuple[jax.Array, jax.Array] | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row.

  Args:
    logits: [B, V] float32 next-token logits, or [V, B] with vocab_major=True (the decode loop's
      layout; greedy and plain temperature sampling then need no transpose).
    context: (tokens [B, S], valid [B, S]) of each row, read when params.repetition_penalty
      or params.max_think_tokens is on (penalize_repeats, close_long_thoughts).
  Returns:
    tokens [B] int32, and their log-probabilities [B] under the temperature-1 distribution
    (the policy's own probability, which the PPO ratio compares against; without the
    repetition penalty).
  """
  noise = lambda z, _: z + jax.random.gumbel(rng, z.shape, jnp.float32)  # noqa: E731
  return _with_rules(lambda z: _sample(noise, z, params, vocab_major), logits, params,
                       vocab_major, context)


def sample_token_rows(keys: jax.Array, logits: jax.Array, params: SamplingParams,
                      vocab_major: bool = False,
                      context: tuple[jax.Array, jax.Array] | None = None
                      ) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row, row b with its own key keys[b] (as sample_token otherwise).

  Row b's token depends only on keys[b] and row b's logits, not on the other rows or on where
  row b sits in the batch: the slot engine keys a row by its trajectory and position, so a
  trajectory samples the same tokens in whichever slot and decode call it runs.

  Args:
    keys: [B] PRNG key array (greedy ignores it).
    logits: [B, V], or [V, B] with vocab_major=True.
    context: as sample_token's (the repetition penalty's and the thinking budget's).
  Returns:
    tokens [B] int32 and their temperature-1 log-probabilities [B].
  """
  if keys.shape != (logits.shape[1 if vocab_major else 0],):
    raise ValueError(f"keys {keys.shape} must have one key per row of logits {logits.shape} "
                     f"(vocab_major={vocab_major})")

  def perturb(z, major):
    # Row b's noise is gumbel(keys[b], [V]): the draw is [B, V]. Vocab-major logits are added to
    # it as z.T, which XLA fuses into the sum and the argmax after it (on CPU, 2x faster than
    # drawing the noise in the [V, B] layout, which costs a copy of the noise).
    vocab = z.shape[0] if major else z.shape[1]
    noise = jax.vmap(lambda key: jax.random.gumbel(key, (vocab,), jnp.float32))(keys)
    return (z.T + noise).T if major else z + noise

  return _with_rules(lambda z: _sample(perturb, z, params, vocab_major), logits, params,
                       vocab_major, context)


def _sample(perturb, logits: jax.Array, params: SamplingParams,
            vocab_major: bool) -> tuple[jax.Array, jax.Array]:
  """sample_token's body with the noise as an argument: perturb(z, vocab_major) -> z plus
  Gumbel(0, 1) noise, z the scaled logits [V, B] when vocab_major, else [B, V]."""
  logits = logits.astype(jnp.float32)
  if vocab_major:
    if params.greedy:
      tokens = _argmax_vocab_major(logits)
    elif params.top_k > 0 or params.top_p < 1.0:
      return _sample(perturb, logits.T, params, False)  # the filters work on [B, V]
    else:  # Gumbel-max, as jax.random.categorical does, with the faster argmax
      tokens = _argmax_vocab_major(perturb(logits / params.temperature, True))
    return tokens, token_logprobs(logits, tokens, vocab_major=True)
  if params.greedy:
    tokens = jnp.argmax(logits, axis=-1)
  else:  # Gumbel-max over the whole vocabulary (jax.random.categorical's own sum and argmax);
    # the filtered-out tokens sit at -inf
    tokens = jnp.argmax(perturb(filter_logits(logits, params), False), axis=-1)
  tokens = tokens.astype(jnp.int32)
  return tokens, token_logprobs(logits, tokens)
