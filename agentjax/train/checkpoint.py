"""Trainer checkpoints: train state + data position under {workdir}/checkpoints, resumed by rerun.

    ckpt = Checkpointer(workdir, save_every=1000, keep=3, config=config.to_dict(),
                        compat_keys=["model.preset", "model.param_dtype", "optimizer.name"])
    restored = ckpt.restore_or_none(abstract_state)    # ShapeDtypeStructs carrying .sharding
    if restored is None:
      state, data_state, step = init_state(), None, 0
    else:
      state, data_state, step = restored                 # arrays arrive in the target shardings
    while step < total_steps:
      state = train_step(state, batch); step += 1
      ckpt.maybe_save(step, state, data_state={"position": it.position})
    ckpt.save(step, state, data_state={"position": it.position}, force=True)
    ckpt.close()                                          # waits for the async write

Layout: {workdir}/config.json (the run's config, written by process 0 at its first save) and
{workdir}/checkpoints/<step>/{state,meta}: `state` is the train-state pytree (orbax
StandardSave: OCDBT/zarr, every process writes its own shards), `meta` a JSON item with the
caller's data_state and the config. Typed PRNG keys (jax.random.key) are orbax's business: it
writes their key data plus the key impl in its array metadata and wraps them back on restore
(orbax-checkpoint >= 0.12.0; see setup.py).

Safety, in the order a restart meets it:
  - The config stored in the workdir is compared with the current one on `compat_keys` before
    any array is read; a difference raises CheckpointMismatchError naming the field.
  - The stored array metadata is compared with the abstract target leaf by leaf; a missing,
    extra, reshaped or retyped leaf raises CheckpointMismatchError naming its path, as does a
    leaf stored as a PRNG key whose target is a plain array, or the reverse (found once read).
  - A step that cannot be read (truncated or missing file) raises CheckpointError naming the
    step directory. Nothing is deleted or rewritten: this Checkpointer then refuses to save, and
    no Checkpointer saves a step at or below the latest on disk, so the evidence stays.
  - Saves go through orbax's temporary directories, renamed into place only when complete; a run
    that dies mid-save (or before its first save) leaves every earlier step as it was.

Multi-host: every process must call save/maybe_save/restore_or_none with the same step (orbax
synchronizes and writes each process's shards; the JSON item is written by the primary host).
Only the config.json write is process-0 logic, and it is outside orbax.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec

from agentjax.models.safetensors_io import CheckpointError as _ModelCheckpointError
from agentjax.train.upgrade import upgrade_recorded

PyTree = Any

_STATE, _META = "state", "meta"
# Bumped if the meta item's layout or the array encoding changes. Format 1 stored typed PRNG keys
# as plain uint32 arrays, listed in meta["prng_keys"]; format 2 leaves keys to orbax.
_FORMAT = 2
_MISSING = "<missing>"


class CheckpointError(_ModelCheckpointError):
  """A checkpoint step that cannot be read or must not be written; the message names the step."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint incompatible with the current run: a config field, or a leaf's shape/dtype."""


# ---------------------------------------------------------------------------------------- helpers


def _path_str(path: tuple[Any, ...]) -> str:
  """'opt_state/0/mu/layers_0/mlp/up_proj/kernel': dict keys, indices and namedtuple fields alike.

  orbax stores namedtuples (optax states) as dicts, so GetAttrKey('mu') on our side must name
  the same leaf as DictKey('mu') in its metadata tree: keystr(simple=True) renders both as 'mu'.
  """
  return jax.tree_util.keystr(path, simple=True, separator="/")


def _is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _get_dotted(config: Mapping[str, Any] | None, dotted: str) -> Any:
  node: Any = config
  for part in dotted.split("."):
    if not isinstance(node, Mapping) or part not in node:
      return _MISSING
    node = node[part]
  return node


def _to_json(obj: Any, what: str) -> Any:
  """obj as it will read back from JSON (tuples become lists, int keys strings)."""
  try:
    return json.loads(json.dumps(obj))
  except (TypeError, ValueError) as e:
    raise TypeError(f"{what} must be JSON-serializable (dicts, lists, str, numbers, bools, None): "
                    f"{e}") from e


def _root_cause(e: BaseException) -> str:
  """First line of the innermost error: tensorstore's names the array and the file (orbax's
  wrapper names only a slice index, followed by a page of TensorStore spec)."""
  while e.__cause__ is not None:
    e = e.__cause__
  text = str(e).strip()
  first = text.splitlines()[0].split(" [tensorstore_spec")[0][:500] if text else ""
  return f"{type(e).__name__}: {first}"


def _replicated() -> NamedSharding:
  # Fully replicated over every device of every process: the one default that is a valid global
  # sharding on a multi-host pod (a per-process SingleDeviceSharding is not). Auto axis type, as
  # agentjax.parallel.make_mesh, so jitted code may consume it without sharding type errors.
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("replica",),
                           axis_types=(jax.sharding.AxisType.Auto,))
  return NamedSharding(mesh, PartitionSpec())


# ------------------------------------------------------------------------------------ Checkpointer


def _check_fields(stored: Any, config: Any, compat_keys: Sequence[str], directory: Any,
                  step: int) -> None:
  """Raises CheckpointMismatchError on the first of `compat_keys` whose value differs between
  the stored config and `config` (the checkpoints' latest step named)."""
  for key in compat_keys:
    old, new = _get_dotted(stored, key), _get_dotted(config, key)
    if old != new:
      raise CheckpointMismatchError(
          f"config field {key!r} differs from the run that wrote the checkpoints in "
          f"{directory} (latest step {step}): stored {old!r}, current {new!r}. "
          f"Use a fresh workdir, or set {key} back to {old!r} to resume.")


def check_before_loading(workdir: str | os.PathLike[str], config: Mapping[str, Any],
                         compat_keys: Sequence[str]) -> None:
  """The compat check a Checkpointer makes at restore, made before anything is loaded: when
  {workdir} holds finished checkpoints and its config.json, a differing `compat_keys` field
  raises CheckpointMismatchError now rather than after the model and the retriever loaded
  (minutes at 7B). Reads only the folder listing and config.json; a workdir without either is
  left to the Checkpointer."""
  workdir = os.fspath(workdir)
  if "://" in workdir:
    return  # remote folders: the Checkpointer checks at restore
  folder = os.path.join(workdir, "checkpoints")
  path = os.path.join(workdir, "config.json")
  steps = [int(n) for n in (os.listdir(folder) if os.path.isdir(folder) else []) if n.isdigit()]
  if not steps or not os.path.isfile(path):
    return
  try:
    with open(path) as f:
      stored = json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from e
  if isinstance(stored, Mapping):
    _check_fields(upgrade_recorded(stored), _to_json(dict(config), "config"), compat_keys,
                  folder, max(steps))


class Checkpointer:
  """Periodic, async, keep-last-K checkpoints of a train state pytree, with automatic resume.

  Args:
    workdir: the run's directory (local path or anything etils.epath opens, e.g. gs://...).
      Checkpoints go to {workdir}/checkpoints/<step>, the config to {workdir}/config.json.
    save_every: maybe_save saves when step % save_every == 0 (step 0 excluded, as in big_vision;
      step counts optimizer updates done). 0 or None: only forced saves.
    keep: how many of the latest steps to keep on disk; None keeps all.
    config: a JSON-able dict describing the run (e.g. ml_collections' config.to_dict()); written
      to config.json at the first save, compared on `compat_keys` at restore. None: no check.
    compat_keys: dotted config keys whose change makes old checkpoints unusable, e.g.
      ["model.preset", "model.hf_path", "model.param_dtype", "optimizer.name"].
    async_save: write in a background thread (orbax's default); save() returns once the arrays
      are copied off the devices, so the caller may donate/overwrite the state right after.
      A stored config is upgraded first (train/upgrade.py): a key added since it was written
      compares as the value its run ran with, so older workdirs stay resumable.
    check_stored: called with the stored config after the compat keys matched, before any array
      is read; raises CheckpointMismatchError for what keys cannot express (a LoRA run's
      backbone fingerprint).
  """

  def __init__(self, workdir: str | os.PathLike[str], *, save_every: int | None,
               keep: int | None = 3, config: Mapping[str, Any] | None = None,
               compat_keys: Sequence[str] = (), async_save: bool = True,
               check_stored: Callable[[Mapping[str, Any]], None] | None = None):
    if save_every is not None and (not isinstance(save_every, int) or save_every < 0):
      raise ValueError(f"save_every must be a non-negative int or None, got {save_every!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
      raise ValueError(f"keep must be a positive int or None, got {keep!r}")
    workdir = os.fspath(workdir)
    # orbax refuses relative local paths (at the first save); gs:// and other URLs stay as given.
    self.workdir = epath.Path(workdir if "://" in workdir else os.path.abspath(workdir))
    self.directory = self.workdir / "checkpoints"
    self.config_path = self.workdir / "config.json"
    self.save_every = save_every or 0
    self.keep = keep
    self.config = None if config is None else _to_json(dict(config), "config")
    self.compat_keys = tuple(compat_keys)
    self.check_stored = check_stored
    if self.compat_keys and self.config is None:
      raise ValueError("compat_keys given without a config to compare")
    self._config_checked = False   # stored config compared with ours (at restore or first save)
    self._config_written = False
    self._own_steps: set[int] = set()  # steps this run saved or restored
    self._poisoned: str | None = None  # why saving is refused after a failed restore
    options = ocp.CheckpointManagerOptions(
        create=True,
        enable_async_checkpointing=async_save,
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        # Left False on purpose: a leftover *.orbax-checkpoint-tmp-* dir may be the only trace
        # of what a crashed run was writing, and it is never mistaken for a finished step.
        cleanup_tmp_directories=False,
    )
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={_STATE: ocp.StandardCheckpointHandler(),
                       _META: ocp.JsonCheckpointHandler()})

  # -------------------------------------------------------------------------------- queries

  def all_steps(self) -> list[int]:
    """Finished steps on disk, ascending (temporary dirs of unfinished saves are not steps)."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def should_save(self, step: int) -> bool:
    """Whether maybe_save(step, ...) writes a checkpoint (the periodic rule only)."""
    return self.save_every > 0 and step > 0 and step % self.save_every == 0

  # ----------------------------------------------------------------------------------- save

  def maybe_save(self, step: int, state: PyTree, data_state: Any = None) -> bool:
    """Saves if `step` is a multiple of save_every; returns whether a save was started."""
    return self.save(step, state, data_state, force=False)

  def save(self, step: int, state: PyTree, data_state: Any = None, *, force: bool = False) -> bool:
    """Starts an (async) save of `state` and `data_state` at `step`; returns whether it did.

    Args:
      step: the number of updates `state` has seen; becomes the step directory's name.
      state: pytree of jax.Arrays (any sharding; typed PRNG keys allowed), numpy arrays, scalars.
      data_state: JSON-able data-iterator position and host-side metadata, returned verbatim
        (up to JSON: tuples come back as lists) by restore_or_none. Written by the primary host.
      force: save even when `step` is not a multiple of save_every (at exit, at preemption).

    Saving the step this run just saved or restored again is a no-op (returns False), so a
    final save(force=True) after a periodic save of the same step is harmless.

    Raises:
      CheckpointError: a restore failed earlier in this run, or `step` is at or below a step
        already on disk that this run did not write (two runs in one workdir, or a restart that
        did not resume): existing checkpoints are never overwritten.
      CheckpointMismatchError: the workdir holds checkpoints of an incompatible config.
    """
    step = int(step)
    if not force and not self.should_save(step):
      return False
    if self._poisoned is not None:
      raise CheckpointError(f"refusing to save step {step} to {self.directory}: {self._poisoned}")
    latest = self.latest_step()
    if latest is not None and step <= latest:
      if step == latest and step in self._own_steps:
        return False
      raise CheckpointError(
          f"refusing to save step {step}: {self.directory} already holds step {latest} "
          f"(steps {self.all_steps()}), which this run did not resume from; existing checkpoints "
          f"are never overwritten. Resume with restore_or_none() or use a fresh workdir.")
    meta = {"format": _FORMAT, "step": step, "data_state": _to_json(data_state, "data_state"),
            "config": self.config}
    if latest is not None and not self._config_checked:
      self._check_config(self._stored_config(None), latest)
    self._write_config()
    try:
      saved = self._manager.save(
          step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state),
                                           _META: ocp.args.JsonSave(meta)}), force=True)
    except ocp.checkpoint_manager.StepAlreadyExistsError as e:
      raise CheckpointError(f"refusing to overwrite {self.step_dir(step)}: {e}") from e
    if saved:
      self._own_steps.add(step)
    return bool(saved)

  def _write_config(self) -> None:
    """config.json from process 0, once per run: the latest run's view of the workdir."""
    if self._config_written or self.config is None:
      return
    self._config_written = True
    if jax.process_index() != 0:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    tmp = self.workdir / f"config.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(self.config, indent=2, sort_keys=True) + "\n")
    tmp.replace(self.config_path)  # os.replace locally: readers see the old file or the new one

  # -------------------------------------------------------------------------------- restore

  def restore_or_none(self, abstract_state: PyTree, *,
                      step: int | None = None) -> tuple[PyTree, Any, int] | None:
    """Restores the latest step (or `step`) into the target shardings; None if there is none.

    Args:
      abstract_state: pytree shaped like the saved state whose leaves are jax.ShapeDtypeStruct
        (with .sharding: e.g. FSDP NamedShardings, so parameters and optimizer state are read
        shard by shard straight into place) or jax.Arrays (their sharding is used). A leaf
        without a sharding is restored fully replicated. Typed PRNG key leaves are supported.
      step: a specific step instead of the latest (e.g. to inspect the one before a corrupt
        step; saving at or below the latest step on disk stays refused until it is moved out).

    Returns:
      (state, data_state, step), state with the structure and shardings of abstract_state, or
      None when the workdir has no finished checkpoint.

    Raises:
      CheckpointMismatchError: a compat_keys field differs from the stored config, or a leaf is
        missing, extra, or has another shape/dtype than stored; the message names it.
      CheckpointError: the step cannot be read (a truncated or missing file); the message names
        the step directory, which is left untouched. Either error also disables saving for this
        Checkpointer, so a run that catches it cannot overwrite or age out the evidence.
    """
    self._manager.reload()  # another process or run may have written since __init__
    if step is None:
      step = self.latest_step()
      if step is None:
        return None
    elif step not in self._manager.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; "
                            f"steps: {self.all_steps()}")
    step = int(step)
    try:
      return self._restore(abstract_state, step)
    except CheckpointError as e:
      self._poisoned = f"restoring step {step} failed ({type(e).__name__})"
      raise

  def _restore(self, abstract_state: PyTree, step: int) -> tuple[PyTree, Any, int]:
    step_dir = self.step_dir(step)
    meta = self._read(step, lambda: self._manager.restore(
        step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))[_META], "its meta item")
    if not isinstance(meta, Mapping) or "format" not in meta:
      raise CheckpointError(f"checkpoint {step_dir} is corrupt or not an agentjax checkpoint: "
                            f"its meta item is {type(meta).__name__}, not the expected dict")
    if meta["format"] != _FORMAT:
      raise CheckpointMismatchError(
          f"checkpoint {step_dir} has format {meta['format']!r}; this agentjax reads format "
          f"{_FORMAT} (format 1 stored PRNG keys as raw uint32 data, before orbax handled typed "
          f"keys). Resume it with the agentjax version that wrote it, or use a fresh workdir.")
    self._check_config(self._stored_config(meta), step)

    target = self._abstract_target(abstract_state)
    stored = self._read(step, lambda: self._manager.item_metadata(step)[_STATE], "its metadata")
    if stored is None:
      raise CheckpointError(f"checkpoint {step_dir} is corrupt: the array metadata of its "
                            f"'{_STATE}' item is missing or unreadable")
    self._check_arrays(stored, target, step_dir)

    state = self._read(step, lambda: self._manager.restore(
        step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(target)}))[_STATE],
        "its arrays")
    self._check_keys(state, target, step_dir)
    self._own_steps.add(step)
    return state, meta.get("data_state"), step

  def _read(self, step: int, fn, what: str) -> Any:
    """Runs an orbax read; any failure becomes a CheckpointError naming the step directory."""
    try:
      return fn()
    except CheckpointError:
      raise
    except Exception as e:  # tensorstore raises ValueError/bare Exception; files FileNotFoundError
      raise CheckpointError(
          f"checkpoint {self.step_dir(step)} is corrupt or unreadable (reading {what}): "
          f"{_root_cause(e)}. It has not been modified; move it out of "
          f"{self.directory} to resume from the step before it (steps on disk: "
          f"{self.all_steps()}).") from e

  # ------------------------------------------------------------------------------- checks

  def _stored_config(self, meta: Mapping[str, Any] | None) -> Any:
    """The workdir's config.json, else the config recorded in the step's meta item, upgraded
    (train/upgrade.py: a field added since it was written has the value its run ran with)."""
    if self.config_path.exists():
      try:
        stored = json.loads(self.config_path.read_text())
      except ValueError as e:
        raise CheckpointError(f"{self.config_path} is not valid JSON: {e}") from e
    else:
      stored = None if meta is None else meta.get("config")
    return upgrade_recorded(stored) if isinstance(stored, Mapping) else stored

  def _check_config(self, stored: Any, step: int) -> None:
    if self.compat_keys and stored is not None:
      _check_fields(stored, self.config, self.compat_keys, self.directory, step)
    if self.check_stored is not None and isinstance(stored, Mapping):
      self.check_stored(stored)  # the caller's own checks, after the fields (e.g. the backbone)
    self._config_checked = True

  @staticmethod
  def _abstract_target(abstract_state: PyTree) -> PyTree:
    """ShapeDtypeStructs with shardings for orbax (replicated where the leaf carries none)."""
    default = None

    def convert(x):
      nonlocal default
      if not isinstance(x, (jax.ShapeDtypeStruct, jax.Array)):
        return x  # numpy arrays and Python scalars: orbax restores them as such
      sharding = getattr(x, "sharding", None)
      if sharding is None:
        default = default or _replicated()
        sharding = default
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(convert, abstract_state)

  @staticmethod
  def _check_arrays(stored: PyTree, target: PyTree, step_dir: epath.Path) -> None:
    """Leaf sets, shapes and dtypes of the stored metadata vs the target, before any read."""
    have = {_path_str(p): m for p, m in jax.tree_util.tree_flatten_with_path(stored)[0]}
    want = {_path_str(p): t for p, t in jax.tree_util.tree_flatten_with_path(target)[0]}
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or extra:

      def more(names: list[str]) -> str:
        return f"{names[:5]}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")

      parts = []
      if missing:
        parts.append(f"missing from the checkpoint: {more(missing)}")
      if extra:
        parts.append(f"in the checkpoint but not in the target: {more(extra)}")
      raise CheckpointMismatchError(f"{step_dir} does not match the target state structure: "
                                    + "; ".join(parts))
    for name, t in want.items():
      m = have[name]
      if not hasattr(t, "shape") or getattr(m, "shape", None) is None:
        continue
      what = ""
      if _is_key(t):
        # orbax's metadata describes what is on disk, a key's uint32 key data (trailing dims).
        what = f" (a {t.dtype} key of shape {tuple(t.shape)})"
        t = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(t.shape, t.dtype))
      if tuple(m.shape) != tuple(t.shape):
        raise CheckpointMismatchError(f"{name}: shape mismatch: {step_dir} stores "
                                      f"{tuple(m.shape)}, target is {tuple(t.shape)}{what}")
      if getattr(m, "dtype", None) is not None and np.dtype(m.dtype) != np.dtype(t.dtype):
        raise CheckpointMismatchError(f"{name}: dtype mismatch: {step_dir} stores "
                                      f"{np.dtype(m.dtype)}, target is {np.dtype(t.dtype)}{what}")

  @staticmethod
  def _check_keys(restored: PyTree, target: PyTree, step_dir: epath.Path) -> None:
    """Refuses a typed-key target read from plain stored data, the reverse, or another impl.

    The array metadata shows only the key data, so this is found after the read; orbax returns
    what is on disk (a key where one was saved) whatever the target says.
    """
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(restored)[0],
                                 jax.tree.leaves(target)):
      if not (_is_key(got) or _is_key(want)) or got.dtype == want.dtype:
        continue
      name = _path_str(path)
      if not _is_key(got):
        raise CheckpointMismatchError(f"{name}: the target is a PRNG key ({want.dtype}) but "
                                      f"{step_dir} stores it as a plain {got.dtype} array")
      if not _is_key(want):
        raise CheckpointMismatchError(
            f"{name}: {step_dir} stores a PRNG key ({got.dtype}, "
            f"{jax.random.key_impl(got)}) but the target is a plain {want.dtype} array")
      raise CheckpointMismatchError(f"{name}: PRNG key type differs: {step_dir} stores "
                                    f"{got.dtype} ({jax.random.key_impl(got)}), target "
                                    f"{want.dtype}")

  # ---------------------------------------------------------------------------- lifecycle

  def wait(self) -> None:
    """Blocks until the in-flight async save is on disk (and raises if it failed)."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases orbax's threads. Call at exit on every process."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def abstract_state(state: PyTree) -> PyTree:
  """ShapeDtypeStructs carrying each leaf's sharding: the restore target of a checkpoint."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)
