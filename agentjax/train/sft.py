"""Supervised fine-tuning on agent demonstrations (the warm start before RL).

A demonstration (SynthWorld's demos.jsonl) is a question plus alternating assistant and
observation segments. It becomes one token sequence laid out exactly as a rollout would lay it
out:

  prompt ids (chat template, as RolloutEngine.prompt_ids)        loss 0
  assistant segment 1  (<think>..</think>\\n<search> q </search>)   loss 1
  observation 1        (\\n\\n<information>Doc 1(..)..</information>\\n\\n)   loss 0
  ...
  assistant segment n  (<think>..</think>\\n<answer> a </answer>)   loss 1
  <|im_end|>                                                       loss 1 (learn to stop)

Each segment is encoded on its own, and an observation as prefix + body + suffix, because that is
how the rollout engine feeds observation tokens: SFT then sees the token boundaries RL will see.

    step = make_sft_step(Qwen(cfg), make_optimizer(3e-3, 20, 500))
    params, opt_state, metrics = step(params, opt_state, pack_batch(examples, max_len=512))
    # or the whole loop:
    params, history = run_sft(cfg, params, tokenizer, demos, steps=500, batch_size=16,
                              max_len=512, lr=3e-3, seed=0)

The loss is a token-mean next-token cross-entropy over loss-mask tokens, computed from hidden
states through `chunked_token_logprobs` (no [B, L, V] logits).
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentjax.agent.protocol import SEARCH_R1, Protocol, trajectory_error
from agentjax.agent.rollout import encode_text, observation_ids, prompt_ids
from agentjax.models import masks
from agentjax.models.logprobs import chunked_token_logprobs
from agentjax.models.lora import attach, frozen_backbone
from agentjax.models.qwen import Qwen, QwenConfig
from agentjax.train.checkpoint import abstract_state
from agentjax.train.optim import make_guarded_step, make_optimizer, make_schedule

log = logging.getLogger(__name__)

Example = tuple[Sequence[int], Sequence[bool]]  # (ids, loss_mask), one demonstration


# --------------------------------------------------------------------------- data (host)


def _end_of_turn_id(tokenizer: Any, use_chat_template: bool) -> int:
  """The token that ends the assistant's turn: what the rollout engine stops on."""
  if use_chat_template and "<|im_end|>" in tokenizer.get_vocab():
    return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
  if tokenizer.eos_token_id is None:
    raise ValueError("the tokenizer has no <|im_end|> and no eos_token: nothing ends a turn")
  return int(tokenizer.eos_token_id)


def _observation_ids(tokenizer: Any, text: str, protocol: Protocol) -> list[int]:
  """An observation's ids exactly as the rollout engine builds them (agent.rollout.observation_ids:
  prefix, body and suffix encoded separately). check_demo has made sure the text is framed by
  the protocol's prefix and suffix."""
  pre, suf = protocol.observation_prefix, protocol.observation_suffix
  return observation_ids(tokenizer, pre, text[len(pre):len(text) - len(suf)], suf)


def _demo_name(demo: Any, index: int | None) -> str:
  where = "demo" if index is None else f"demo {index}"
  if isinstance(demo, Mapping) and demo.get("id") is not None:
    where += f" (id {demo['id']!r})"
  return where


def check_demo(demo: Any, protocol: Protocol = SEARCH_R1, index: int | None = None) -> None:
  """Raises ValueError, naming the demo (index, id) and the field, unless the demonstration is a
  trajectory the rollout could produce under `protocol`, well-formed by the protocol's rule.

  The format rule is the one rollouts, the format penalty and eval use
  (agentjax.agent.protocol.trajectory_error): every assistant segment holds a valid action (a
  search, or an answer), and the last one, only the last, answers. Around it, the layout a
  rollout has: "question" a non-empty string; "protocol" (if given) `protocol.name`;
  "segments" a list of {"role", "text"} alternating assistant / observation, first and last an
  assistant one; every observation the protocol's rendering of a search result (its prefix ...
  its suffix), which is what the rollout feeds after a valid search. A "hook" segment (text a
  per-turn hook feeds before a turn, e.g. Co-ReAct's rubric suffix: agentjax/agent/guide.py)
  may stand right before any assistant segment but the first; it is fed, not learned.
  """
  where = _demo_name(demo, index)
  if not isinstance(demo, Mapping):
    raise ValueError(f"{where}: must be a mapping, got {type(demo).__name__}")
  if demo.get("protocol", protocol.name) != protocol.name:
    raise ValueError(f"{where}: field 'protocol': the demo is in protocol {demo['protocol']!r}, "
                     f"not {protocol.name!r}")
  question = demo.get("question")
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f"{where}: field 'question' must be a non-empty string, got {question!r}")
  segments = demo.get("segments")
  if not isinstance(segments, Sequence) or isinstance(segments, str) or not segments:
    raise ValueError(f"{where}: field 'segments' must be a non-empty list of segments")
  actions = []
  k_turn = 0  # position in the assistant / observation alternation (hooks stand outside it)
  for k, seg in enumerate(segments):
    field = f"segments[{k}]"
    if not isinstance(seg, Mapping) or not isinstance(seg.get("text"), str):
      raise ValueError(f"{where}: {field} must be {{'role': ..., 'text': <str>}}, got {seg!r:.80}")
    if seg.get("role") == "hook":
      if k_turn % 2 == 1 or k_turn == 0 or k + 1 >= len(segments) or \
          not isinstance(segments[k + 1], Mapping) or segments[k + 1].get("role") != "assistant":
        raise ValueError(f"{where}: {field} is a hook: it must stand right before an assistant "
                         "segment that is not the first")
      continue
    role = "assistant" if k_turn % 2 == 0 else "observation"
    k_turn += 1
    if seg.get("role") != role:
      raise ValueError(f"{where}: {field}.role is {seg.get('role')!r}, expected {role!r} "
                       "(segments alternate assistant / observation, starting with assistant)")
    text = seg["text"]
    if role == "observation":
      pre, suf = protocol.observation_prefix, protocol.observation_suffix
      if not (len(text) >= len(pre) + len(suf) and text.startswith(pre) and text.endswith(suf)):
        raise ValueError(f"{where}: {field}.text is not a {protocol.name} search result "
                         f"(it must start with {pre!r} and end with {suf!r})")
      continue
    actions.append(protocol.parse(text))
  if k_turn % 2 == 0:
    raise ValueError(f"{where}: field 'segments' ends with an observation; the last segment "
                     "must be the assistant's answer")
  found = trajectory_error(actions)
  if found is not None:
    turn, why = found
    at = [k for k, seg in enumerate(segments) if seg.get("role") == "assistant"][turn]
    raise ValueError(f"{where}: segments[{at}].text (turn {turn + 1}) is malformed under "
                     f"protocol {protocol.name!r}: {why}")


def tokenize_demo(tokenizer: Any, demo: Mapping[str, Any], protocol: Protocol = SEARCH_R1,
                  use_chat_template: bool = True, index: int | None = None
                  ) -> tuple[list[int], list[bool]]:
  """A demonstration as (ids, loss_mask), both of one length, laid out as in a rollout.

  Args:
    tokenizer: a transformers tokenizer (with a chat template when use_chat_template).
    demo: {"question", "segments": [{"role": "assistant" | "observation" | "hook", "text"}], and
      optionally "protocol" (checked against `protocol`)}; checked by `check_demo` first.
    protocol: the rollout protocol whose prompt the demo answers.
    use_chat_template: as RolloutConfig.use_chat_template.
    index: the demo's position in its file, named in errors.
  Returns:
    ids, and loss_mask: True on assistant tokens and the final end-of-turn token; False on the
    prompt, on observations and on hooks (encoded as the guided engine encodes them: text
    alone). Observations are not cut to RolloutConfig.max_obs_tokens.
  Raises:
    ValueError: a malformed demo (see check_demo), naming the demo and the field.
  """
  check_demo(demo, protocol, index)
  ids = prompt_ids(tokenizer, protocol, demo["question"], use_chat_template)
  mask = [False] * len(ids)
  for seg in demo["segments"]:
    seg_ids = _segment_ids(tokenizer, seg, protocol)
    ids += seg_ids
    mask += [seg["role"] == "assistant"] * len(seg_ids)
  ids.append(_end_of_turn_id(tokenizer, use_chat_template))
  mask.append(True)
  return ids, mask


def _segment_ids(tokenizer: Any, seg: Mapping[str, str], protocol: Protocol) -> list[int]:
  if seg["role"] == "observation":
    return _observation_ids(tokenizer, seg["text"], protocol)
  return encode_text(tokenizer, seg["text"])


def demo_prefix_ids(tokenizer: Any, demo: Mapping[str, Any], upto: int,
                    protocol: Protocol = SEARCH_R1, use_chat_template: bool = True) -> list[int]:
  """The ids a model reads before segment `upto` of a (checked) demonstration, laid out as
  tokenize_demo lays them out: what to complete to see the model's own turn there."""
  check_demo(demo, protocol)
  ids = prompt_ids(tokenizer, protocol, demo["question"], use_chat_template)
  for seg in demo["segments"][:upto]:
    ids += _segment_ids(tokenizer, seg, protocol)
  return ids


def tokenize_demos(tokenizer: Any, demos: Sequence[Mapping[str, Any]],
                   protocol: Protocol = SEARCH_R1, use_chat_template: bool = True,
                   also: Sequence[Protocol] = ()) -> list[Example]:
  """`tokenize_demo` of each demonstration; an error names the first malformed one by index.

  also: protocols a row may name besides `protocol` (its "protocol" field picks its prompt and
  format rule): a mixed corpus, e.g. search transcripts with DAC's answer_only evidence rows
  (agentjax/studies/backbone.py). A row without the field is in `protocol`."""
  by_name = {p.name: p for p in (protocol, *also)}
  return [tokenize_demo(tokenizer, d, by_name.get(d.get("protocol", protocol.name), protocol)
                        if isinstance(d, Mapping) else protocol, use_chat_template, index=i)
          for i, d in enumerate(demos)]


def pack_text(tokenizer: Any, texts: Iterable[str], max_len: int) -> list[Example]:
  """Plain text as language-model examples: each text encoded and followed by EOS, texts packed
  end to end into sequences of at most max_len tokens, every token in the loss.

  Used to pretrain a from-scratch model on the corpus, so that every token it will read in
  observations has a trained embedding (otherwise names seen only in held-out questions keep
  their random initialization)."""
  eos = tokenizer.eos_token_id
  out: list[Example] = []
  current: list[int] = []
  for text in texts:
    ids = encode_text(tokenizer, text)[:max_len - 1] + ([eos] if eos is not None else [])
    if current and len(current) + len(ids) > max_len:
      out.append((current, [True] * len(current)))
      current = []
    current = current + ids
  if current:
    out.append((current, [True] * len(current)))
  return out


def pack_batch(examples: Sequence[Example], max_len: int, pad_id: int = 0) -> dict[str, np.ndarray]:
  """Right-pads (and truncates) examples into fixed-shape arrays.

  Returns:
    {"tokens": [B, L] int32 (pad_id on padding), "loss_mask": [B, L] bool, "valid": [B, L] bool}
    with L = max_len. Tokens past max_len are dropped, loss and all.
  """
  b = len(examples)
  tokens = np.full((b, max_len), pad_id, np.int32)
  loss_mask = np.zeros((b, max_len), bool)
  valid = np.zeros((b, max_len), bool)
  for i, (ids, mask) in enumerate(examples):
    if len(ids) != len(mask):
      raise ValueError(f"example {i}: {len(ids)} ids but {len(mask)} loss-mask entries")
    n = min(len(ids), max_len)
    tokens[i, :n] = np.asarray(ids[:n], np.int32)
    loss_mask[i, :n] = np.asarray(mask[:n], bool)
    valid[i, :n] = True
  return {"tokens": tokens, "loss_mask": loss_mask, "valid": valid}


def pack_micro_batches(examples: Sequence[Example], max_len: int, pad_id: int = 0,
                       micro_batches: int = 1, length_buckets: Sequence[int] = ()
                       ) -> tuple[dict[str, np.ndarray], ...]:
  """The batch as `micro_batches` equal micro-batches, each `pack_batch`ed to its own length.

  With more than one, the examples are first sorted by length (stable), so short examples share
  micro-batches; each micro-batch is padded to the shortest of length_buckets + (max_len,) that
  holds its longest example. The loss over the micro-batches (sft_micro_batch_loss) is the loss
  of the whole batch (the same sums; only the rounding differs), at less cost: attention is
  quadratic in the padded length, and smaller blocks stay in cache. Every bucket is one more
  compile of the step's gradient program (make_sft_step), so keep the buckets few.

  Args:
    examples: the batch, (ids, loss_mask) pairs; a multiple of micro_batches of them.
    max_len: the longest length; longer examples are truncated (as in pack_batch).
    micro_batches: the number of micro-batches. 1: the examples in their order at max_len.
    length_buckets: the lengths a micro-batch may be padded to, below max_len.
  Returns:
    micro_batches dicts as pack_batch's, [len(examples) / micro_batches, L_k] each.
  Raises:
    ValueError: the batch does not split evenly, or a bucket is not a positive int.
  """
  if micro_batches < 1 or len(examples) % micro_batches:
    raise ValueError(f"micro_batches={micro_batches} must be >= 1 and divide the batch size "
                     f"{len(examples)}")
  bad = [b for b in length_buckets if isinstance(b, bool) or not isinstance(b, (int, np.integer))
         or b < 1]
  if bad:
    raise ValueError(f"length_buckets must be positive ints, got {list(length_buckets)}")
  if micro_batches == 1:  # one micro-batch: its longest example is the batch's; keep the order
    return (pack_batch(examples, max_len, pad_id),)
  buckets = sorted({int(b) for b in length_buckets if b < max_len} | {max_len})
  lengths = np.array([min(len(ids), max_len) for ids, _ in examples])
  order = np.argsort(lengths, kind="stable")
  size = len(examples) // micro_batches
  out = []
  for k in range(micro_batches):
    rows = order[k * size:(k + 1) * size]
    longest = int(lengths[rows].max())
    length = next(b for b in buckets if b >= longest)
    out.append(pack_batch([examples[i] for i in rows], length, pad_id))
  return tuple(out)


# --------------------------------------------------------------------------- loss


def _chunked_hits(logits_fn: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                  targets: jax.Array, chunk: int) -> jax.Array:
  """Whether each target is the argmax of logits_fn(hidden) [B, L] bool, a chunk at a time.

  "target logit >= max logit" rather than an argmax: a plain max reduction is cheaper on CPU
  than argmax's (value, index) one, and differs only on exact ties.
  """
  b, length, e = hidden.shape
  chunk = min(chunk, length)
  pad = -length % chunk
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  hs = hidden.reshape(b, -1, chunk, e).swapaxes(0, 1)      # [n, B, C, E]
  ts = targets.reshape(b, -1, chunk).swapaxes(0, 1)         # [n, B, C]

  def one(args):
    h, t = args
    logits = logits_fn(h)                                   # [B, C, V]
    return jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0] >= jnp.max(logits, axis=-1)

  return jax.lax.map(one, (hs, ts)).swapaxes(0, 1).reshape(b, -1)[:, :length]


def _sft_sums(model: Qwen, params: Any, tokens: jax.Array, loss_mask: jax.Array,
              valid: jax.Array, chunk: int, with_accuracy: bool
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(sum of target log-probs, sum of argmax hits, number) over the counted tokens of [B, L]
  arrays; see sft_loss. Sums, not means, so that micro-batches add up to their batch."""
  valid = valid.astype(bool)
  hidden, _ = model.apply({"params": params}, tokens, masks.positions_from_padding(valid),
                          masks.causal_padding_mask(valid), return_hidden=True)   # [B, L, E]

  def logits_fn(h):
    return model.apply({"params": params}, h, method=Qwen.logits)

  hidden, targets = hidden[:, :-1], tokens[:, 1:]
  weight = (loss_mask.astype(bool) & valid)[:, 1:].astype(jnp.float32)           # [B, L-1]
  logp, _ = chunked_token_logprobs(logits_fn, hidden, targets, chunk=chunk)
  if with_accuracy:
    hits = _chunked_hits(logits_fn, jax.lax.stop_gradient(hidden), targets, chunk)
    hits = jnp.sum(hits * weight)
  else:
    hits = jnp.zeros((), jnp.float32)
  return jnp.sum(logp * weight), hits, jnp.sum(weight)


def _sft_mean(sums: Sequence[tuple[jax.Array, jax.Array, jax.Array]]
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """sft_loss's (loss, metrics) from the _sft_sums of the batch's micro-batches."""
  logp, hits, n = (functools.reduce(operator.add, parts) for parts in zip(*sums))
  denom = jnp.maximum(n, 1.0)  # an all-masked batch gives loss 0, not NaN
  loss = -logp / denom
  return loss, {"loss": loss, "accuracy": hits / denom, "tokens": n}


def sft_loss(model: Qwen, params: Any, tokens: jax.Array, loss_mask: jax.Array,
             valid: jax.Array, chunk: int = 256, with_accuracy: bool = True
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Masked next-token cross-entropy, the mean over loss-mask tokens.

  Position j-1 predicts token j; token j counts iff loss_mask[j] and valid[j] (so the first token
  never counts: nothing predicts it).

  Args:
    model: Qwen(cfg).
    params: its parameters.
    tokens: [B, L] int32.
    loss_mask: [B, L] bool, the tokens to learn (assistant tokens and the final end of turn).
    valid: [B, L] bool, real (non-padding) tokens.
    chunk: positions per LM-head call.
    with_accuracy: also compute the argmax accuracy (one more forward pass of the LM head,
      without gradient).
  Returns:
    loss (scalar float32), and metrics {"loss", "accuracy" (argmax == target over the counted
    tokens; 0 when not computed), "tokens" (number of counted tokens)}.
  """
  return _sft_mean([_sft_sums(model, params, tokens, loss_mask, valid, chunk, with_accuracy)])


Batch = Mapping[str, jax.Array]  # {"tokens", "loss_mask", "valid"}, [B, L] each (pack_batch)


def sft_micro_batch_loss(model: Qwen, params: Any, micro_batches: Batch | Sequence[Batch],
                         chunk: int = 256, with_accuracy: bool = True
                         ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """sft_loss of a batch given as micro-batches (pack_micro_batches): the mean over the counted
  tokens of all of them, as if they were one batch.

  Args:
    micro_batches: one {"tokens", "loss_mask", "valid"} dict ([B_k, L_k] arrays) or a sequence
      of them; their lengths L_k may differ.
  Returns:
    as sft_loss.
  """
  if isinstance(micro_batches, Mapping):
    micro_batches = (micro_batches,)
  if not micro_batches:
    raise ValueError("sft_micro_batch_loss needs at least one micro-batch")
  return _sft_mean([_sft_sums(model, params, m["tokens"], m["loss_mask"], m["valid"], chunk,
                              with_accuracy) for m in micro_batches])


# --------------------------------------------------------------------------- optimizer and step


def make_sft_step(model: Qwen, optimizer: optax.GradientTransformation, chunk: int = 256,
                  with_accuracy: bool = True, policy: str | None = None
                  ) -> Callable[..., tuple[Any, Any, dict]]:
  """`step(params, opt_state, batch) -> (params, opt_state, metrics)` (the update is
  agentjax/train/optim.make_guarded_step's: donated, non-finite steps skipped).

  batch: a pack_batch dict, or a tuple of them (pack_micro_batches). The gradient is accumulated
  one micro-batch at a time, each by a program compiled per micro-batch shape ([B_k, L_k]: one
  per length bucket), then one update program: a run with length buckets compiles a few
  programs, not one per tuple of bucket lengths a batch can draw (15 for 4 micro-batches over 3
  buckets, each one tens of seconds on a GPU). The loss is the mean over the counted tokens of
  all micro-batches, as if they were one batch (sums, then one division). metrics: loss,
  accuracy, tokens (see sft_loss), grad_norm (before clipping), skipped.

  A LoRA model (model.lora set): `step(adapters, opt_state, batch, backbone)` trains the
  adapters {name: tree} on the frozen backbone; the loss runs adapter `policy` (default: the
  spec's policy, its first name).
  """
  spec = model.lora
  active = None if spec is None else (policy or spec.policy)

  def neg_logp_sum(params, micro, *backbone):
    if spec is not None:
      params = attach(frozen_backbone(backbone, "make_sft_step"), params, spec, active)
    logp, hits, n = _sft_sums(model, params, micro["tokens"], micro["loss_mask"],
                              micro["valid"], chunk, with_accuracy)
    return -logp, (logp, hits, n)

  # One program per micro-batch shape: (negated log-prob sum, its sums) and its gradient.
  micro_grad = jax.jit(jax.value_and_grad(neg_logp_sum, has_aux=True))
  add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=0)  # the running sum

  def mean_of_sums(params, total, *backbone):
    """make_guarded_step's loss_fn (with_grad): the accumulated sums -> (loss, metrics), grads."""
    del params, backbone
    grads, sums = total
    loss, metrics = _sft_mean([sums])
    denom = jnp.maximum(sums[2], 1.0)
    return (loss, metrics), jax.tree.map(lambda g: g / denom, grads)

  update = make_guarded_step(mean_of_sums, optimizer, with_grad=True)

  def step(params, opt_state, batch, *backbone):
    total = None
    for micro in ((batch,) if isinstance(batch, Mapping) else batch):
      (_, sums), grads = micro_grad(params, micro, *backbone)
      total = (grads, sums) if total is None else add(total, (grads, sums))
    return update(params, opt_state, total, *backbone)

  return step


# --------------------------------------------------------------------------- loop


def _round_robin_batches(n: int, batch_size: int, rng: np.random.Generator):
  """Endless batches of example indices: a fresh permutation per epoch, epochs chained (so a
  batch may straddle two epochs, and n < batch_size still gives full batches)."""
  order: list[int] = []
  while True:
    while len(order) < batch_size:
      order += rng.permutation(n).tolist()
    yield order[:batch_size]
    order = order[batch_size:]


def _sft_examples(cfg: QwenConfig, tokenizer: Any, demos: Sequence[Mapping[str, Any]],
                  protocol: Protocol, use_chat_template: bool, also_protocols: Sequence[Protocol],
                  extra_examples: Sequence[Example], max_len: int) -> list[Example]:
  """The demonstrations tokenized, then the extra examples; warns about truncation, and raises
  when a token id does not fit the model's vocabulary."""
  examples = tokenize_demos(tokenizer, demos, protocol, use_chat_template, also_protocols)
  examples += list(extra_examples)
  lengths = np.array([len(ids) for ids, _ in examples])
  if (lengths > max_len).any():
    log.warning("%d of %d demos exceed max_len=%d tokens (longest %d) and are truncated",
                int((lengths > max_len).sum()), len(examples), max_len, int(lengths.max()))
  top = max(max(ids) for ids, _ in examples)
  if top >= cfg.vocab_size:
    raise ValueError(f"token id {top} >= model vocab_size {cfg.vocab_size}: the tokenizer does "
                     "not fit the model")
  return examples


def _sft_restore(state: dict, checkpointer: Any) -> tuple[dict, int, int]:
  """(state, steps done, updates applied): the checkpointer's latest, or the fresh state at 0.
  Updates applied is the optimizer's own count (skipped steps do not advance it)."""
  if checkpointer is not None:
    restored = checkpointer.restore_or_none(abstract_state(state))
    if restored is not None:
      state, data_state, start = restored
      log.info("sft: resumed from %s at step %d", checkpointer.step_dir(start), start)
      return state, start, int(data_state["applied"])
  return state, 0, 0


def run_sft(cfg: QwenConfig, params: Any, tokenizer: Any, demos: Sequence[Mapping[str, Any]], *,
            steps: int, batch_size: int, max_len: int, lr: float, seed: int = 0,
            warmup_steps: int | None = None, weight_decay: float = 0.0, b2: float = 0.95,
            final_lr_ratio: float = 0.1,
            clip_norm: float | None = 1.0, protocol: Protocol = SEARCH_R1,
            use_chat_template: bool = True, chunk: int = 256, log_every: int = 10,
            callback: Callable[[int, dict[str, float]], None] | None = None,
            extra_examples: Sequence[Example] = (), checkpointer: Any = None,
            stop: Callable[[int], bool] | None = None, micro_batches: int = 1,
            length_buckets: Sequence[int] = (), target: Any = None,
            also_protocols: Sequence[Protocol] = ()
            ) -> tuple[Any, list[dict[str, float]]]:
  """Trains `params` on the demonstrations for `steps` steps; returns (params, history).

  target: an agentjax.train.adapters.TrainTarget with LoRA adapters: the adapters are trained
  on the frozen backbone `params` (one AdamW per adapter at `target.optimizer`'s rates) and
  returned in place of params.

  Preemptible like RL: with a `checkpointer` (agentjax.train.checkpoint.Checkpointer) the run
  resumes from its latest checkpoint ({params, opt_state}, and the number of applied updates),
  saves every checkpointer.save_every steps, and saves and returns early when `stop(steps_done)`
  says so (SIGTERM, a step budget). The batch order is a pure function of the seed and the step,
  so a resumed run sees the batches, and on one machine computes the losses, of an uninterrupted
  one. history then holds the steps of this call only.

  Batches are drawn from shuffled demos (a fresh permutation per epoch, from `seed`), every batch
  padded to [batch_size, max_len] so one compiled step serves the whole run, or, with
  micro_batches > 1, split by length into micro-batches padded to length_buckets
  (pack_micro_batches: the same loss, computed faster, for a compile per bucket). Demos longer
  than max_len are truncated (their tail, the answer included, is then not learned; a warning
  says how many). The `params` argument is donated to the first step: use the returned ones.

  Args:
    warmup_steps: default 5% of steps.
    extra_examples: pre-tokenized (ids, loss_mask) sequences drawn alongside the demos, e.g.
      `pack_text` of the corpus (plain language-model text).
    callback: called as callback(step, metrics) after every step (host floats).
    micro_batches, length_buckets: see pack_micro_batches; micro_batches must divide batch_size.
    also_protocols: protocols a demo may name besides `protocol` (tokenize_demos' `also`).
  Returns:
    params, and history: one dict per step {"step", "loss", "accuracy", "tokens", "grad_norm",
    "skipped", "lr" (the step's learning rate), "seconds" (wall time of the step)}.
  """
  if not demos:
    raise ValueError("run_sft needs at least one demonstration")
  if micro_batches < 1 or batch_size % micro_batches:
    raise ValueError(f"micro_batches={micro_batches} must be >= 1 and divide batch_size="
                     f"{batch_size}")
  examples = _sft_examples(cfg, tokenizer, demos, protocol, use_chat_template, also_protocols,
                           extra_examples, max_len)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  if warmup_steps is None:
    warmup_steps = max(1, steps // 20)
  schedule = make_schedule(lr, warmup_steps, steps, final_lr_ratio)
  frozen, model = (), Qwen(cfg)
  if target is not None and target.spec is not None:
    optimizer = target.optimizer_with(lr, warmup_steps, steps, weight_decay, clip_norm,
                                      final_lr_ratio, b2)
    params, frozen, model = target.trainable, target.frozen, target.model
  else:
    optimizer = make_optimizer(lr, warmup_steps, steps, weight_decay, clip_norm, final_lr_ratio,
                               b2)
  state, start, applied = _sft_restore(
      {"params": params, "opt_state": optimizer.init(params)}, checkpointer)
  step_fn = make_sft_step(model, optimizer, chunk=chunk)
  batches = _round_robin_batches(len(examples), batch_size, np.random.default_rng(seed))
  for _ in range(start):  # the batches a resumed run has already trained on
    next(batches)

  history: list[dict[str, float]] = []
  for i in range(start, steps):
    t0 = time.perf_counter()
    batch = pack_micro_batches([examples[j] for j in next(batches)], max_len, pad_id,
                               micro_batches, length_buckets)
    lr_now = float(schedule(applied))
    params, opt_state, metrics = step_fn(state["params"], state["opt_state"], batch, *frozen)
    state = {"params": params, "opt_state": opt_state}
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    applied += not metrics["skipped"]
    record = {"step": i, **metrics, "lr": lr_now, "seconds": time.perf_counter() - t0}
    history.append(record)
    if callback is not None:
      callback(i, record)
    if log_every and (i % log_every == 0 or i == steps - 1):
      log.info("sft step %d/%d loss %.4f acc %.3f tokens %d lr %.2e%s", i + 1, steps,
               record["loss"], record["accuracy"], record["tokens"], lr_now,
               " SKIPPED (non-finite)" if record["skipped"] else "")
    stopping = stop is not None and stop(i + 1)
    if checkpointer is not None:
      checkpointer.save(i + 1, state, {"applied": applied}, force=stopping or i + 1 == steps)
    if stopping:
      log.warning("sft: stopping at step %d with a checkpoint; re-run the command to resume",
                  i + 1)
      break
  params = state["params"]
  return params, history
