"""Micro-batches: a minibatch's forward/backward (or a batch's scoring) in slices of rows.

    n = num_micro(rows, micro_batch)                         # micro_batch: global rows per pass
    out = map_micro(fn, micro_batch, tokens, valid)          # scoring: fn per slice, lax.map
    vg = accumulate(partial_loss, totals_fn, micro_batch)    # updates: grads summed, lax.scan
    (loss, metrics), grads = vg(params, minibatch, *frozen)

`micro_batch` counts the rows of one pass over all devices: rl.micro_batch_size (per device, like
verl's ppo_micro_batch_size_per_gpu) times the devices the batch is sharded over (`global_micro`);
0 runs the whole batch in one pass. Only one slice's activations are live at a time (the body of a
lax.map / lax.scan). Slice i holds rows i, i + n, i + 2n, ...: with the batch sharded over D
devices in contiguous blocks (the "batch" rule, data x fsdp) and rows / n a multiple of D, every
slice keeps rows / (n D) rows on each device, so slicing moves no data between devices.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from agentjax.parallel import constrain
from agentjax.rl.losses import combine_micro_metrics

Array = jax.Array


def global_micro(micro_batch_size: int, mesh: jax.sharding.Mesh | None) -> int:
  """Rows of one pass over all devices: micro_batch_size (per device; 0: the whole batch) times
  the mesh's data x fsdp devices, the axes the "batch" rule shards rows over."""
  if not micro_batch_size:
    return 0
  shards = 1 if mesh is None else mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1)
  return int(micro_batch_size) * shards


def num_micro(rows: int, micro_batch: int) -> int:
  """How many passes a batch of `rows` takes: 1 when micro_batch is 0 or >= rows; rows /
  micro_batch otherwise (a ValueError unless it divides)."""
  if micro_batch <= 0 or micro_batch >= rows:
    return 1
  if rows % micro_batch:
    raise ValueError(f"a micro-batch of {micro_batch} rows does not divide a batch of {rows} "
                     f"(rl.micro_batch_size x the data x fsdp devices must divide the minibatch)")
  return rows // micro_batch


def split(x: Array, n: int) -> Array:
  """[B, ...] -> [n, B / n, ...]; slice i holds rows i, i + n, ... (module docstring)."""
  y = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
  return constrain(y, (None, "batch") + (None,) * (x.ndim - 1))


def merge(y: Array) -> Array:
  """split's inverse: [n, B / n, ...] -> [B, ...]."""
  return y.swapaxes(0, 1).reshape(y.shape[0] * y.shape[1], *y.shape[2:])


def map_micro(fn: Callable[..., Any], micro_batch: int, *args: Any) -> Any:
  """fn(*args) computed `micro_batch` rows at a time (lax.map; call it inside a jit).

  args: pytrees of [B, ...] arrays; fn's outputs: pytrees of [B, ...] arrays, each row depending
  on its own input rows only (scoring). B need not be a multiple of micro_batch: the last row is
  repeated to fill the last slice, and its copies are cut from the outputs."""
  rows = jax.tree.leaves(args)[0].shape[0]
  if micro_batch <= 0 or micro_batch >= rows:
    return fn(*args)
  pad = -rows % micro_batch
  if pad:  # real rows, not zeros: an all-padding row could give NaN where nothing is visible
    idx = jnp.minimum(jnp.arange(rows + pad), rows - 1)
    args = jax.tree.map(lambda x: x[idx], args)
  n = (rows + pad) // micro_batch
  out = jax.lax.map(lambda a: fn(*a), jax.tree.map(lambda x: split(x, n), args))
  return jax.tree.map(lambda y: merge(y)[:rows], out)


def accumulate(partial_loss: Callable[..., tuple[Array, dict[str, Array]]],
               totals_fn: Callable[[Any], dict[str, Array]], micro_batch: int,
               combine: Callable[..., dict[str, Array]] = combine_micro_metrics,
               grad_shardings: Any = None) -> Callable[..., Any]:
  """value_and_grad of a loss over a minibatch, summed over its micro-batches (lax.scan).

  partial_loss(params, mb, totals, *frozen) -> (loss share, metric shares) of micro-batch mb,
    given `totals = totals_fn(minibatch)` of the whole minibatch (rl/losses.py: the shares of
    the micro-batches add up to the one-shot loss and metrics).
  combine(stacked metrics [n], totals) -> the minibatch's metrics (default: shares summed,
    losses.MAX_METRICS maxed).
  grad_shardings: None or a tree of shardings like params: the float32 accumulator is kept in
    it (the params' sharding) rather than left to the compiler.
  Returns vg(params, minibatch, *frozen) -> ((loss, metrics), grads), grads in the params'
  dtypes, for optim.make_guarded_step(vg, optimizer, with_grad=True).
  """
  grad_fn = jax.value_and_grad(partial_loss, has_aux=True)

  def place(tree):
    return tree if grad_shardings is None else jax.lax.with_sharding_constraint(tree,
                                                                                grad_shardings)

  def value_and_grad(params, minibatch, *frozen):
    totals = totals_fn(minibatch)
    n = num_micro(jax.tree.leaves(minibatch)[0].shape[0], micro_batch)
    if n == 1:
      (loss, metrics), grads = grad_fn(params, minibatch, totals, *frozen)
      return (loss, combine(jax.tree.map(lambda x: x[None], metrics), totals)), grads

    # The params (and a frozen backbone) ride in the carry behind an optimization barrier: left
    # loop-invariant, XLA hoists their FSDP all-gathers out of the loop and every layer's
    # gathered weights stay live at once (docs/BENCHMARKS.md "fit": 7B update 68.4 -> ~61.7 GB).
    def body(carry, mb):
      (p, fz), acc = carry
      p, fz = jax.lax.optimization_barrier((p, fz))
      (loss, metrics), grads = grad_fn(p, mb, totals, *fz)
      acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
      return ((p, fz), place(acc)), (loss, metrics)

    zeros = place(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
    (_, grads), (losses, metrics) = jax.lax.scan(
        body, ((params, frozen), zeros), jax.tree.map(lambda x: split(x, n), minibatch))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (jnp.sum(losses), combine(metrics, totals)), grads

  return value_and_grad


__all__ = ["accumulate", "global_micro", "map_micro", "merge", "num_micro", "split"]
