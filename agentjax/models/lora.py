"""Low-rank adapters (LoRA): several named adapters on one frozen backbone.

    spec = LoraSpec(names=("searcher", "generator"), rank=32, alpha=64.0)
    model = Qwen(cfg, lora=spec)                          # every targeted Linear gains lora_a/b
    adapters = init_adapters(model, jax.random.key(0))  # {name: adapter tree}, B = 0
    full = attach(backbone, adapters, spec, "searcher")   # the params `model.apply` takes
    logits, _ = model.apply({"params": full}, tokens, positions, mask)

A targeted projection computes y = x . W + (alpha / rank) . (x . A[i]) . B[i], with W the frozen
kernel [*in, *out], A [*in, r] and B [r, *out] the adapter's (A random, B zero: a fresh adapter
changes nothing). Dropout is 0 (not implemented).

The trainable state is `adapters`, a mapping name -> tree with the model's path to each targeted
Linear and the leaves `lora_a` [*in, r], `lora_b` [r, *out]: checkpoints, optimizers (one per
adapter when their settings differ) and PEFT exports work on it by name. `attach` stacks the
adapters (in `spec.names` order) into the leaves the model holds, lora_a [A, *in, r] and lora_b
[A, r, *out], and sets the scalar int32 leaf `lora_index`, the adapter a forward pass uses (-1:
none, the bare backbone). The index is data, not a static argument: one compiled program (a
rollout's sampler, a scoring pass) serves every adapter, and switching between turns compiles
nothing. The backbone's arrays are shared, never copied, by `attach`.

Stacked leaves carry the logical axes ("adapters", <the kernel's in axes>, "lora_rank") and
("adapters", "lora_rank", <the kernel's out axes>): the rules table shards an adapter's in and
out dims like the kernel it adapts (embed over fsdp, heads and mlp over tensor).

`merge` folds one adapter into a copy of the kernels (W + s . A . B): the Hugging Face export of a
LoRA run, and the decode layout when `LoraSpec.decode == "merge"` (see agentjax.sampling.sampler).

Why not qwix (tried first, 0.1.8, on this model): its LoRA intercepts our Linear's dot_general in
the checkpoint layout and matches a merged kernel (o_proj's two contracted dims, remat and a
jitted while_loop included), but it looks for the weight only as dot_general's right operand, so
with the decode loop's out-major kernels (the left operand) it creates no adapter and raises
nothing: the sampler would silently drop the adapter. It finds weights by shape heuristics (an
activation shaped like a kernel got the adapter), holds one unnamed adapter per weight with no
per-call selection or "none", and has no merge. Written here, the adapter is a few lines of
the model's own Linear, explicit in both layouts, with named stacked adapters and logical axes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

# The projections an adapter may target (the names of the model's Linear modules).
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DECODE_MODES = ("auto", "merge", "unmerged")
LORA_LEAVES = ("lora_a", "lora_b")
INDEX_LEAF = "lora_index"

# Nested dicts <-> {path tuple: leaf}: every tree operation here is a filter or an update of these.
_flatten, _unflatten = traverse_util.flatten_dict, traverse_util.unflatten_dict


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """Which adapters a model holds and their shape (hashable: a static attribute of the model).

  names: the adapters, in the order of their stacked axis (the first is the run's policy).
  rank, alpha: the low-rank dim r and the scale numerator (scale = alpha / r, as PEFT).
  targets: the Linear modules adapted, a subset of ALL_TARGETS.
  decode: how the sampler's token loop applies the selected adapter: "merge" (into a copy of the
    kernels once per rollout, then the bare program), "unmerged" (the low-rank products at every
    step, no copy), or "auto" (`decode_mode`): merge on CPU with float32 kernels, where the decode
    layout copies the kernels anyway, unmerged otherwise (docs/BENCHMARKS.md, LoRA decode).
  """

  names: tuple[str, ...]
  rank: int
  alpha: float
  targets: tuple[str, ...] = ALL_TARGETS
  decode: str = "auto"

  def __post_init__(self):
    if not self.names or len(set(self.names)) != len(self.names):
      raise ValueError(f"lora names must be distinct and non-empty, got {self.names!r}")
    for name in self.names:
      if not name.isidentifier():
        raise ValueError(f"lora adapter name {name!r} must be an identifier (letters, digits, _)")
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
      raise ValueError(f"lora rank must be a positive integer, got {self.rank!r}")
    if not self.alpha > 0:
      raise ValueError(f"lora alpha must be positive, got {self.alpha!r}")
    unknown = sorted(set(self.targets) - set(ALL_TARGETS))
    if unknown or not self.targets:
      raise ValueError(f"lora targets {unknown or list(self.targets)} are not projections of the "
                       f"model; expected a non-empty subset of {list(ALL_TARGETS)}")
    if self.decode not in DECODE_MODES:
      raise ValueError(f"lora decode must be one of {DECODE_MODES}, got {self.decode!r}")

  def decode_mode(self, backend: str, param_dtype: str) -> str:
    """"merge" or "unmerged" for a model with `param_dtype` kernels on `backend`.

    auto merges only on CPU with float32 kernels: there the decode layout (out-major kernels)
    is a copy of the kernels anyway, so merging into it costs no memory and the token loop runs
    at the bare model's speed. Elsewhere merging would hold a second copy of every adapted kernel
    (GPU/TPU keep the checkpoint layout), and merged into bfloat16 kernels a small adapter's
    delta is mostly rounded away (the sampler would not sample the policy it scores), so the
    low-rank products run in the loop instead. An explicit "merge" with non-float32 kernels is
    refused for that reason."""
    if self.decode == "auto":
      return "merge" if backend == "cpu" and param_dtype == "float32" else "unmerged"
    if self.decode == "merge" and param_dtype != "float32":
      raise ValueError(f"lora decode='merge' with {param_dtype} kernels would round the adapter's "
                       "delta away in the merged copy; use decode='unmerged' or 'auto'")
    return self.decode

  @property
  def policy(self) -> str:
    """The adapter a run's algorithm trains and samples by default: the first name."""
    return self.names[0]

  @property
  def scale(self) -> float:
    return float(self.alpha) / self.rank

  def index(self, name: str | None) -> int:
    """The stacked position of adapter `name` (None: -1, no adapter)."""
    if name is None:
      return -1
    if name not in self.names:
      raise KeyError(f"no adapter named {name!r}; this model holds {list(self.names)}")
    return self.names.index(name)


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, index: jax.Array, scale: float,
               in_dims: int, dtype: Any) -> jax.Array:
  """The low-rank term scale . (x . A[index]) . B[index], zero when index < 0.

  x [..., *in]; a [A, *in, r]; b [A, r, *out]; index scalar int32. Returns [..., *out].
  """
  a_k = _select(a, index).astype(dtype)   # [*in, r]
  b_k = _select(b, index).astype(dtype)   # [r, *out]
  x_in = tuple(range(x.ndim - in_dims, x.ndim))
  xa = jax.lax.dot_general(x, a_k, ((x_in, tuple(range(in_dims))), ((), ())))  # [..., r]
  # The scale (0 for no adapter) multiplies the rank-r activations, not the [..., *out] result:
  # no extra full-width elementwise pass (and its buffer) per projection.
  xa = xa * jnp.where(index >= 0, scale, 0.0).astype(dtype)
  return jax.lax.dot_general(xa, b_k, (((xa.ndim - 1,), (0,)), ((), ())))       # [..., *out]


# --------------------------------------------------------------------------- adapter trees


def _lora_only(tree: Mapping[str, Any], fn) -> dict[str, Any]:
  """The lora_a / lora_b leaves of a nested dict (each through `fn`), nested again."""
  return _unflatten({k: fn(v) for k, v in _flatten(tree).items() if k[-1] in LORA_LEAVES})


def adapter_template(full_abstract: Any) -> Any:
  """The per-adapter tree (shapes without the stacked axis) from a LoRA model's abstract params:
  only the paths of lora_a / lora_b leaves, each [*in, r] / [r, *out]."""
  return _lora_only(full_abstract, lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype))


def adapter_logical_axes(full_axes: Any) -> Any:
  """Logical axes of one adapter's tree: the stacked leaves' axes without "adapters"."""
  return _lora_only(full_axes, lambda spec: jax.sharding.PartitionSpec(*tuple(spec)[1:]))


def frozen_backbone(frozen: tuple[Any, ...], where: str) -> Any:
  """The backbone of an update's frozen arguments (`step(adapters, opt_state, batch, backbone)`),
  with an error that says what is missing when the caller forgot it."""
  if len(frozen) != 1:
    raise TypeError(f"{where}: a LoRA model's update takes the frozen backbone params as its "
                    f"4th argument, step(adapters, opt_state, batch, backbone); got "
                    f"{len(frozen)} extra arguments")
  return frozen[0]


def select_like(template: Mapping[str, Any], tree: Mapping[str, Any]) -> dict[str, Any]:
  """The part of `tree` at the paths of `template` (a dict subtree of it)."""
  flat = _flatten(tree)
  return _unflatten({k: flat[k] for k in _flatten(template)})


def attach(backbone: Mapping[str, Any], adapters: Mapping[str, Any], spec: LoraSpec,
           active: str | None | jax.Array) -> dict[str, Any]:
  """The params of `Qwen(cfg, lora=spec)`: the backbone's arrays (shared, not copied), every
  adapter stacked in spec.names order, and lora_index = the active adapter (a name, None for
  the bare backbone, or an int32 array when the caller selects by data).

  adapters must hold every name of spec.names, each with the same tree (`init_adapters`)."""
  missing = [n for n in spec.names if n not in adapters]
  if missing:
    raise KeyError(f"adapters {missing} of the model's lora spec are not given "
                   f"(have {sorted(adapters)})")
  full = _flatten(backbone)
  full.update(_flatten(_stack([adapters[n] for n in spec.names])))
  full = _unflatten(full)
  index = spec.index(active) if active is None or isinstance(active, str) else active
  full[INDEX_LEAF] = jnp.asarray(index, jnp.int32)
  return full


@jax.jit
def _stack(trees: list[Any]) -> Any:
  """The adapters' trees stacked leaf by leaf on a new leading axis [A, ...]: one program (an
  eager stack per leaf would dispatch hundreds of ops per rollout at 7B)."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def detach(full: Mapping[str, Any]) -> dict[str, Any]:
  """The backbone part of a LoRA model's params (no lora leaves, no index)."""
  return _unflatten({k: v for k, v in _flatten(full).items()
                     if k[-1] not in LORA_LEAVES and k != (INDEX_LEAF,)})


def merge(backbone: Mapping[str, Any], adapter: Mapping[str, Any], scale: float) -> dict[str, Any]:
  """The backbone with one adapter folded in: kernel + scale . A . B for each adapted kernel
  (a new array for those; every other leaf is the backbone's own). Checkpoint layout
  ([*in, *out] kernels). Runs in float32 and casts back to the kernel's dtype."""
  flat, extra = _flatten(backbone), _flatten(adapter)
  for path in {k[:-1] for k in extra}:
    flat[path + ("kernel",)] = _merged_kernel(flat[path + ("kernel",)], extra[path + ("lora_a",)],
                                              extra[path + ("lora_b",)], scale)
  return _unflatten(flat)


def merge_selected(full: Mapping[str, Any], scale: float) -> dict[str, Any]:
  """A LoRA model's params (stacked adapters, lora_index) -> plain params with the selected
  adapter merged into the kernels (index < 0: the kernels as they are).

  One jitted program over the adapted kernels only (the index is data: it serves every
  adapter); every other leaf (embedding, norms, biases) is the input's own array, not a copy.
  Call it outside jit (inside, the whole tree would be an output: a fresh copy)."""
  flat = _flatten(full)
  nodes = {k[:-1]: (flat[k[:-1] + ("kernel",)], flat[k], flat[k[:-1] + ("lora_b",)])
           for k in flat if k[-1] == "lora_a"}
  plain = {k: v for k, v in flat.items() if k[-1] not in LORA_LEAVES and k != (INDEX_LEAF,)}
  for path, kernel in _merge_kernels(nodes, flat[(INDEX_LEAF,)], float(scale)).items():
    plain[path + ("kernel",)] = kernel
  return _unflatten(plain)


@functools.partial(jax.jit, static_argnums=2)
def _merge_kernels(nodes, index, scale):
  """{path: (kernel [*in, *out], lora_a [A, *in, r], lora_b [A, r, *out])} -> {path: kernel with
  adapter `index` merged} (scale 0 for index < 0)."""
  gate = jnp.where(index >= 0, scale, 0.0)
  return {path: _merged_kernel(kernel, _select(a, index), _select(b, index), gate)
          for path, (kernel, a, b) in nodes.items()}


def _select(stack: jax.Array, index: jax.Array) -> jax.Array:
  """stack[index] of a stacked-adapter leaf [A, ...], index clipped into range (-1 -> 0: the
  caller zeroes the scale for "no adapter")."""
  k = jnp.clip(index, 0, stack.shape[0] - 1)
  return jax.lax.dynamic_index_in_dim(stack, k, keepdims=False)


def _merged_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale) -> jax.Array:
  """kernel [*in, *out] + scale . A [*in, r] . B [r, *out], in float32, cast back to the
  kernel's dtype."""
  delta = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
  return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


# --------------------------------------------------------------------------- the backbone's identity


def fingerprint(params: Any, samples: int = 1024) -> str:
  """A short hash naming a backbone: every leaf's path, shape, dtype and `samples` values taken
  at a fixed stride through it (exact values, so any mesh or host count gives the same hash).

  Checkpoints of a LoRA run record it; resuming against a backbone with another fingerprint is
  refused. Reads a strided sample only, never the whole weights onto one host."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  sampled = _strided_samples(tuple(leaf for _, leaf in flat), samples)
  h = hashlib.sha256()
  for (path, leaf), values in zip(flat, sampled):
    h.update(jax.tree_util.keystr(path, simple=True, separator="/").encode())
    h.update(repr((tuple(leaf.shape), str(leaf.dtype))).encode())
    h.update(np.asarray(values, np.float32).tobytes())
  return h.hexdigest()[:16]


def _strided_samples(leaves: Sequence[jax.Array], samples: int) -> list[np.ndarray]:
  # One program per tree of shapes (cached by jit); its outputs replicated so that every process
  # can read them.
  from jax.experimental import multihost_utils
  out = _sample_leaves(list(leaves), samples)
  if any(not o.is_fully_addressable for o in out):
    out = multihost_utils.process_allgather(out, tiled=True)
  return [np.asarray(jax.device_get(o)) for o in out]


@functools.partial(jax.jit, static_argnums=1)
def _sample_leaves(leaves, samples):
  """About `samples` values of each leaf on a strided grid over its dims: a strided slice of
  each dim, so a sharded leaf gives up only the sampled values (no flatten, no gather of it)."""
  out = []
  for x in leaves:
    per_dim = max(1, int(np.ceil(samples ** (1.0 / max(x.ndim, 1)))))
    index = tuple(slice(None, None, max(1, -(-n // per_dim))) for n in x.shape)
    out.append(x[index].reshape(-1).astype(jnp.float32))
  return out
