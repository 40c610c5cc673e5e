"""Checkpointer: exact round trip, keep-last-K, resume, config/shape checks, corrupt steps.

The FSDP restore runs on 8 fake devices in a subprocess (tests/checkpoint_multidevice_check.py).
"""

from __future__ import annotations

import copy
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.models.qwen import QwenConfig, init_params
from agentjax.train import CheckpointError, CheckpointMismatchError, Checkpointer
from tests.test_sharding import run_with_fake_devices

CONFIG = {"model": {"preset": "tiny", "hf_path": None, "param_dtype": "float32"},
          "optimizer": {"name": "adamw", "learning_rate": 1e-3}, "seed": 0}
COMPAT = ["model.preset", "model.hf_path", "model.param_dtype", "optimizer.name"]


@pytest.fixture(scope="module")
def train_state():
  """Tiny Qwen params, adamw state after one update (mu/nu/count nonzero), step, typed key."""
  params = init_params(QwenConfig.preset("tiny"), jax.random.key(0))
  tx = optax.adamw(1e-3)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  updates, opt_state = tx.update(grads, tx.init(params), params)
  return {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
          "step": jnp.int32(1), "rng": jax.random.key(42)}


def abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def make(workdir, config=CONFIG, **kw):
  kw.setdefault("save_every", 10)
  kw.setdefault("keep", 3)
  return Checkpointer(workdir, config=config, compat_keys=COMPAT, **kw)


def with_step(state, step):
  return {**state, "step": jnp.int32(step)}


def assert_state_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    assert a.dtype == b.dtype, jax.tree_util.keystr(path)
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def snapshot(root):
  """{relative path: bytes} of every file under root."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for f in files:
      path = os.path.join(dirpath, f)
      with open(path, "rb") as fh:
        out[os.path.relpath(path, root)] = fh.read()
  return out


def test_round_trip_exact_with_typed_key_and_data_state(tmp_path, train_state):
  data_state = {"position": 1234, "epoch": 2, "files": ["a.jsonl", "b.jsonl"], "host": {"seen": 9}}
  with make(tmp_path) as ckpt:
    assert ckpt.restore_or_none(abstract(train_state)) is None  # fresh workdir
    assert not ckpt.maybe_save(5, train_state, data_state)     # not a multiple of save_every
    assert not ckpt.maybe_save(0, train_state, data_state)     # step 0 is never periodic
    assert ckpt.maybe_save(10, train_state, data_state)
    assert not ckpt.save(10, train_state, data_state, force=True)  # same step again: no-op
  assert ckpt.all_steps() == [10]
  assert json.loads((tmp_path / "config.json").read_text()) == CONFIG

  with make(tmp_path) as ckpt:
    state, got_data, step = ckpt.restore_or_none(abstract(train_state))
  assert step == 10 and got_data == data_state
  assert_state_equal(state, train_state)
  # The key is a usable typed key again, drawing the same numbers.
  assert jax.random.key_impl(state["rng"]) == jax.random.key_impl(train_state["rng"])
  np.testing.assert_array_equal(jax.random.uniform(state["rng"], (4,)),
                                jax.random.uniform(train_state["rng"], (4,)))
  # Targets from jax.eval_shape carry no sharding: restored replicated, same values.
  with make(tmp_path) as ckpt:
    state, _, _ = ckpt.restore_or_none(jax.eval_shape(lambda: train_state))
  assert_state_equal(state, train_state)


def test_relative_workdir_saves_and_restores(tmp_path, train_state, monkeypatch):
  # `make demo` writes to runs/demo: orbax itself refuses relative paths at the first save.
  monkeypatch.chdir(tmp_path)
  with make("runs/rel") as ckpt:
    assert ckpt.save(3, train_state, {"position": 7}, force=True)
  with make("runs/rel") as ckpt:
    state, data, step = ckpt.restore_or_none(abstract(train_state))
  assert step == 3 and data == {"position": 7}
  assert_state_equal(state, train_state)
  assert sorted(os.listdir(tmp_path / "runs" / "rel" / "checkpoints")) == ["3"]


def test_keep_last_k_resume_latest_and_nothing_lost_on_restart(tmp_path, train_state):
  with make(tmp_path, save_every=1, keep=2) as ckpt:
    for step in range(1, 5):
      assert ckpt.maybe_save(step, with_step(train_state, step), {"position": step * 100})
  assert ckpt.all_steps() == [3, 4]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4"]

  # A restart that crashes before its first save deletes nothing.
  before = snapshot(tmp_path / "checkpoints")
  make(tmp_path, save_every=1, keep=1).close()
  assert snapshot(tmp_path / "checkpoints") == before

  # A run that did not resume may not save at or below the latest step.
  with make(tmp_path, save_every=1, keep=1) as ckpt:
    with pytest.raises(CheckpointError, match="already holds step 4"):
      ckpt.save(4, train_state, force=True)
    with pytest.raises(CheckpointError, match="already holds step 4"):
      ckpt.save(2, train_state, force=True)
  assert snapshot(tmp_path / "checkpoints") == before

  with make(tmp_path, save_every=1, keep=2) as ckpt:
    state, data_state, step = ckpt.restore_or_none(abstract(train_state))
    assert (step, data_state, int(state["step"])) == (4, {"position": 400}, 4)
    assert not ckpt.save(4, state, data_state, force=True)  # the resumed step: no-op
    assert ckpt.maybe_save(5, with_step(state, 5), {"position": 500})
  assert ckpt.all_steps() == [4, 5]
  with make(tmp_path) as ckpt:
    assert ckpt.restore_or_none(abstract(train_state), step=4)[1] == {"position": 400}


def test_config_mismatch_names_field(tmp_path, train_state):
  with make(tmp_path) as ckpt:
    ckpt.save(10, train_state, force=True)
  changed = copy.deepcopy(CONFIG)
  changed["model"]["param_dtype"] = "bfloat16"
  with make(tmp_path, config=changed) as ckpt:
    with pytest.raises(CheckpointMismatchError,
                       match=r"'model.param_dtype'.*stored 'float32', current 'bfloat16'"):
      ckpt.restore_or_none(abstract(train_state))
  # Saving into that workdir without restoring is refused the same way.
  with make(tmp_path, config=changed) as ckpt:
    with pytest.raises(CheckpointMismatchError, match="model.param_dtype"):
      ckpt.save(20, train_state, force=True)
  assert ckpt.all_steps() == [10]
  # A field outside compat_keys (the learning rate) may change.
  lr = copy.deepcopy(CONFIG)
  lr["optimizer"]["learning_rate"] = 3e-4
  with make(tmp_path, config=lr) as ckpt:
    assert ckpt.restore_or_none(abstract(train_state))[2] == 10


def test_a_compat_key_added_later_takes_its_recorded_value_for_older_workdirs(tmp_path,
                                                                              train_state):
  """A workdir written before a compat key existed (its config.json lacks it) is upgraded
  (train/upgrade.py: "lora" -> None, full fine-tuning) and resumes when the current value is
  that one, and is refused naming it otherwise; a key the upgrade does not know is refused;
  `check_stored` then sees the upgraded stored config before any array is read."""
  from agentjax.train.upgrade import ADDED
  assert ("lora", None) in [(k, v) for k, v, _ in ADDED]
  with make(tmp_path) as ckpt:  # the older run: no "lora" record
    ckpt.save(10, train_state, force=True)
  newer = dict(copy.deepcopy(CONFIG), lora=None)
  seen = []
  with Checkpointer(tmp_path, save_every=10, config=newer, compat_keys=tuple(COMPAT) + ("lora",),
                    check_stored=seen.append) as ckpt:
    assert ckpt.restore_or_none(abstract(train_state))[2] == 10
  assert seen and seen[0]["lora"] is None and CONFIG["model"].items() <= seen[0]["model"].items()
  novel = copy.deepcopy(newer)
  novel["model"]["novel"] = 1
  with Checkpointer(tmp_path, save_every=10, config=novel,
                    compat_keys=tuple(COMPAT) + ("model.novel",)) as c:
    with pytest.raises(CheckpointMismatchError, match="'model.novel'"):  # not upgraded: refused
      c.restore_or_none(abstract(train_state))
  lora = dict(newer, lora={"adapters": ["policy"], "rank": 8})
  with Checkpointer(tmp_path, save_every=10, config=lora,
                    compat_keys=tuple(COMPAT) + ("lora",)) as ckpt:
    with pytest.raises(CheckpointMismatchError, match=r"'lora'.*stored None"):
      ckpt.restore_or_none(abstract(train_state))

  def refuse(stored):
    raise CheckpointMismatchError("not this backbone")

  with Checkpointer(tmp_path, save_every=10, config=newer, compat_keys=tuple(COMPAT) + ("lora",),
                    check_stored=refuse) as ckpt:
    with pytest.raises(CheckpointMismatchError, match="not this backbone"):
      ckpt.restore_or_none(abstract(train_state))


def test_shape_dtype_and_structure_mismatch_name_the_leaf(tmp_path, train_state):
  with make(tmp_path) as ckpt:
    ckpt.save(10, train_state, force=True)
  target = abstract(train_state)
  emb = target["params"]["embed_tokens"]

  wrong_shape = copy.copy(target)
  wrong_shape["params"] = {**target["params"], "embed_tokens": jax.ShapeDtypeStruct(
      (1024, 64), emb.dtype, sharding=emb.sharding)}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError, match=r"params/embed_tokens: shape mismatch: "
                       r".* stores \(512, 64\), target is \(1024, 64\)"):
      ckpt.restore_or_none(wrong_shape)

  wrong_dtype = copy.copy(target)
  wrong_dtype["params"] = {**target["params"], "embed_tokens": jax.ShapeDtypeStruct(
      emb.shape, jnp.bfloat16, sharding=emb.sharding)}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError,
                       match=r"params/embed_tokens: dtype mismatch.*bfloat16"):
      ckpt.restore_or_none(wrong_dtype)

  missing = copy.copy(target)
  missing["params"] = {k: v for k, v in target["params"].items() if k != "norm"}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError,
                       match=r"not in the target: \['params/norm/scale'\]"):
      ckpt.restore_or_none(missing)
    with pytest.raises(CheckpointError, match="refusing to save"):  # a failed restore: no saves
      ckpt.save(20, train_state, force=True)


def test_typed_and_plain_key_mismatch_names_the_leaf(tmp_path):
  # "rng" is a typed key, "legacy" the uint32 key data of jax.random.PRNGKey: restoring either
  # into the other kind would hand the trainer a wrong-typed key, so both are refused.
  state = {"rng": jax.random.key(7), "keys": jax.random.split(jax.random.key(1), 3),
           "legacy": jax.random.PRNGKey(5)}
  with make(tmp_path) as ckpt:
    ckpt.save(10, state, force=True)
  target = abstract(state)
  with make(tmp_path) as ckpt:  # the right target: exact, typed, same impl
    got, _, _ = ckpt.restore_or_none(target)
  assert_state_equal(got, state)
  assert jax.random.key_impl(got["keys"]) == jax.random.key_impl(state["keys"])

  plain_target = {**target, "rng": jax.ShapeDtypeStruct((2,), jnp.uint32)}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError,
                       match=r"^rng: .* stores a PRNG key \(key<fry>.*target is a plain uint32"):
      ckpt.restore_or_none(plain_target)
  typed_target = {**target, "legacy": jax.ShapeDtypeStruct((), jax.random.key(0).dtype)}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError,
                       match=r"^legacy: the target is a PRNG key .* plain uint32 array"):
      ckpt.restore_or_none(typed_target)
  wrong_shape = {**target, "keys": jax.ShapeDtypeStruct((4,), jax.random.key(0).dtype)}
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError, match=r"^keys: shape mismatch: .* stores "
                       r"\(3, 2\), target is \(4, 2\) \(a key<fry> key of shape \(4,\)\)"):
      ckpt.restore_or_none(wrong_shape)


def test_checkpoint_of_another_format_is_refused(tmp_path, train_state):
  # Format 1 stored typed keys as plain uint32 data listed in the meta item; read as format 2,
  # its keys would come back as plain arrays (or be refused leaf by leaf). Say so up front.
  with make(tmp_path) as ckpt:
    ckpt.save(10, train_state, force=True)
  meta_file = tmp_path / "checkpoints" / "10" / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  meta_file.write_text(json.dumps({**meta, "format": 1, "prng_keys": {}}))
  with make(tmp_path) as ckpt:
    with pytest.raises(CheckpointMismatchError, match=r"has format 1; this agentjax reads format"):
      ckpt.restore_or_none(abstract(train_state))


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_corrupt_checkpoint_is_reported_and_never_overwritten(tmp_path, train_state, damage):
  with make(tmp_path, save_every=1, keep=3) as ckpt:
    ckpt.save(1, with_step(train_state, 1), {"position": 1}, force=True)
    ckpt.save(2, with_step(train_state, 2), {"position": 2}, force=True)
  step_dir = tmp_path / "checkpoints" / "2"
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs]
  biggest = max(files, key=os.path.getsize)  # the OCDBT data file holding the arrays
  if damage == "truncate":
    with open(biggest, "r+b") as fh:
      fh.truncate(os.path.getsize(biggest) // 2)
  else:
    os.remove(biggest)
  before = snapshot(tmp_path / "checkpoints")

  ckpt = make(tmp_path, save_every=1, keep=1)
  with pytest.raises(CheckpointError, match=f"checkpoint {step_dir} is corrupt"):
    ckpt.restore_or_none(abstract(train_state))
  # The failed run may not write anything, at that step or after it (keep=1 would age it out).
  for step in (2, 3):
    with pytest.raises(CheckpointError, match="refusing to save"):
      ckpt.save(step, with_step(train_state, step), force=True)
  ckpt.close()
  assert snapshot(tmp_path / "checkpoints") == before

  # Nor may a run that skips the restore.
  with make(tmp_path, save_every=1, keep=1) as ckpt:
    with pytest.raises(CheckpointError, match="never overwritten"):
      ckpt.save(2, with_step(train_state, 2), force=True)
  assert snapshot(tmp_path / "checkpoints") == before

  # The step before it still restores, explicitly.
  with make(tmp_path) as ckpt:
    state, data_state, step = ckpt.restore_or_none(abstract(train_state), step=1)
  assert (step, data_state, int(state["step"])) == (1, {"position": 1}, 1)
  assert snapshot(tmp_path / "checkpoints") == before


def test_fsdp_sharded_restore_on_2x2x2_mesh(tmp_path):
  out = run_with_fake_devices("tests.checkpoint_multidevice_check", str(tmp_path), timeout=300)
  assert "CHECKPOINT_SHARDED_OK" in out
