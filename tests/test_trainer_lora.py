"""LoRA in the trainer: adapters-only state and checkpoints, exact resume, the backbone as the KL
reference, a refused foreign backbone, per-adapter learning rates, PEFT and merged exports, SFT."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.models import lora as lora_lib
from agentjax.models.qwen.checkpoint import load_hf, save_hf
from agentjax.train.checkpoint import CheckpointMismatchError
from agentjax.train.optim import make_adapter_optimizer
from agentjax.train.trainer import train
from tests.trainer_fixtures import run_metrics, tiny_config

TIMING = ("rollout_s", "scoring_s", "update_s", "step_s", "search_s", "tokens_per_s",
          "sampled_tokens_per_s", "eval/seconds", "compiles")


def _lora_config(world_dir, tokenizer_dir, tmp, trainer="rl"):
  c = tiny_config(world_dir, tokenizer_dir, tmp, algorithm="sft" if trainer == "sft" else "igpo",
                  steps=2)
  # Two adapters: the second rides along untrained (as DAC's roles will share one backbone).
  # One decoder layer (the tiny preset has 2): compiling the layers is most of a run's time, and
  # nothing checked here depends on depth (the adapters' per-layer PEFT names and their mapping
  # are tests/test_lora_peft.py's, on the 2-layer presets).
  c.model.shape.num_layers = 1
  c.model.lora.adapters = "policy,other"
  c.model.lora.rank = 4
  c.model.lora.alpha = 8.0
  c.model.lora.lr = "policy=1e-2"  # B starts at 0: a larger rate moves the policy in 2 steps
  c.train.eval_every = 0
  return c


def _metrics(workdir):
  return run_metrics(workdir, "reward")


@pytest.fixture(scope="module")
def lora_runs(world_dir, tokenizer, tmp_path_factory):
  """A: 2 LoRA IGPO steps uninterrupted. B: the same stopped after 1 step, then resumed."""
  tmp = str(tmp_path_factory.mktemp("lora_runs"))
  config = _lora_config(world_dir, tokenizer.name_or_path, tmp)
  a = train(config, os.path.join(tmp, "a"))
  train(config, os.path.join(tmp, "b"), stop_after=1)
  b = train(config, os.path.join(tmp, "b"))
  return config, tmp, a, b


def _backbone(config):
  """The run's backbone (the tiny preset from scratch), as the trainer loads it."""
  from agentjax.parallel import make_mesh
  from agentjax.train.trainer import load_model
  cfg, params, _ = load_model(config, make_mesh(-1, 1, 1))
  return cfg, params


def test_state_and_checkpoints_hold_the_adapters_only(lora_runs):
  import orbax.checkpoint as ocp
  config, tmp, a, _ = lora_runs
  assert sorted(a["params"]) == ["other", "policy"]
  leaves = jax.tree_util.tree_flatten_with_path(a["params"])[0]
  assert leaves and all(getattr(p[-1], "key", None) in ("lora_a", "lora_b") for p, _ in leaves)
  meta = ocp.StandardCheckpointer().metadata(os.path.join(tmp, "a", "checkpoints", "2", "state"))
  tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
  paths = [jax.tree_util.keystr(p, simple=True, separator="/")
           for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  params = [p for p in paths if p.startswith("params/")]
  assert params and all(p.endswith(("/lora_a", "/lora_b")) for p in params), params[:5]
  assert not any(p.endswith(("/kernel", "embed_tokens", "/scale", "/bias")) for p in paths)
  recorded = json.load(open(os.path.join(tmp, "a", "config.json")))["lora_backbone"]
  cfg, backbone = _backbone(config)
  # The adapter this run does not train is still its initialization (B = 0), both exported.
  spec = lora_lib.LoraSpec(("policy", "other"), 4, 8.0)
  from agentjax.models.qwen import init_adapters
  fresh = init_adapters(cfg, spec, jax.random.fold_in(jax.random.key(config.seed), 1))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a["params"]["other"]),
               jax.device_get(fresh["other"]))
  assert sorted(os.listdir(os.path.join(tmp, "a", "adapters"))) == ["other", "policy"]
  assert recorded == {"path": "preset:tiny", "fingerprint": lora_lib.fingerprint(backbone)}


def test_adapters_train_against_the_backbone_as_reference(lora_runs):
  _, tmp, a, _ = lora_runs
  rows = _metrics(os.path.join(tmp, "a"))
  assert [r["step"] for r in rows] == [1, 2]
  # Step 1 starts at B = 0: policy == backbone, so the KL to the reference is 0; then it moves.
  assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7) and rows[1]["kl"] > 0
  assert all(r["skipped_updates"] == 0 for r in rows)
  b = [np.abs(np.asarray(x)).max() for x in jax.tree.leaves(
      jax.tree.map(lambda x: x, {k: v["lora_b"] for k, v in
                                 a["params"]["policy"]["layers_0"]["mlp"].items()}))]
  assert max(b) > 0


def test_resumed_lora_run_repeats_the_uninterrupted_one(lora_runs):
  _, tmp, a, b = lora_runs
  rows_a, rows_b = _metrics(os.path.join(tmp, "a")), _metrics(os.path.join(tmp, "b"))
  assert [r["step"] for r in rows_b] == [1, 2]
  for ra, rb in zip(rows_a, rows_b):
    for key, value in ra.items():
      if key not in TIMING and not key.startswith("sys/"):
        assert rb[key] == value, (ra["step"], key)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a["params"]),
               jax.device_get(b["params"]))


def test_exports_are_the_merged_policy_and_a_peft_folder_peft_loads(lora_runs, tmp_path):
  import torch
  from peft import PeftModel
  from transformers import AutoModelForCausalLM
  config, tmp, a, _ = lora_runs
  cfg, backbone = _backbone(config)
  spec = lora_lib.LoraSpec(("policy",), 4, 8.0)
  merged = lora_lib.merge(backbone, a["params"]["policy"], spec.scale)
  _, exported = load_hf(a["hf_export"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
               jax.device_get(exported), jax.device_get(merged))
  # The run's PEFT folder on the transformers model of the same backbone: the export's logits.
  base_dir = save_hf(str(tmp_path / "backbone"), cfg, backbone)
  ids = torch.tensor([[3, 17, 99, 5, 42, 7]])
  with torch.no_grad():
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    bare = base(ids).logits.numpy()  # before peft injects the adapter into `base` in place
    peft_model = PeftModel.from_pretrained(base, os.path.join(tmp, "a", "adapters", "policy"))
    got = peft_model(ids).logits.numpy()
    want = AutoModelForCausalLM.from_pretrained(a["hf_export"], dtype=torch.float32)(ids).logits
  np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4 * np.abs(got).max())
  assert np.abs(got - bare).max() > 1e-4  # the trained adapter changes the logits


def test_restore_policy_gives_the_merged_policy(lora_runs):
  from agentjax.parallel import make_mesh
  from agentjax.train.trainer import restore_policy
  config, tmp, a, _ = lora_runs
  _, params, _, source = restore_policy(config, os.path.join(tmp, "a"), make_mesh(-1, 1, 1))
  assert source.endswith(os.path.join("checkpoints", "2"))
  _, exported = load_hf(a["hf_export"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
               jax.device_get(params), jax.device_get(exported))


def test_resume_onto_another_backbone_is_refused_naming_both(lora_runs, tmp_path):
  config, tmp, _, _ = lora_runs
  workdir = str(tmp_path / "moved")
  shutil.copytree(os.path.join(tmp, "b"), workdir)
  # What a backbone rewritten under the same path looks like: another fingerprint on record.
  path = os.path.join(workdir, "config.json")
  stored = json.load(open(path))
  stored["lora_backbone"] = {"path": "/models/other-qwen", "fingerprint": "0123456789abcdef"}
  json.dump(stored, open(path, "w"))
  longer = config.copy_and_resolve_references()
  longer.train.steps = 3
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  with pytest.raises(CheckpointMismatchError) as e:
    train(longer, workdir)
  assert "/models/other-qwen" in str(e.value) and "0123456789abcdef" in str(e.value)
  assert "preset:tiny" in str(e.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def _adamw_reference(grads_steps, lrs, clip, b1=0.9, b2=0.99, eps=1e-8, wd=0.0):
  """NumPy AdamW per adapter (its own lr, constant), after one global-norm clip of all grads."""
  params = {k: np.zeros_like(v) for k, v in grads_steps[0].items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  for t, grads in enumerate(grads_steps, start=1):
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    factor = min(1.0, clip / norm)
    for k, g in grads.items():
      g = g * factor
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      mhat, vhat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
      lr = lrs[k.split("/")[0]]
      params[k] = params[k] - lr * (mhat / (np.sqrt(vhat) + eps) + wd * params[k])
  return params


def test_each_adapter_trains_at_its_own_rate():
  rng = np.random.default_rng(0)
  shapes = {"searcher/x/lora_a": (3, 2), "searcher/x/lora_b": (2, 4),
            "generator/x/lora_a": (3, 2), "generator/x/lora_b": (2, 4)}
  steps = [{k: rng.normal(size=s).astype(np.float32) * (1 + i) for k, s in shapes.items()}
           for i in range(3)]

  def tree(flat):
    out = {}
    for k, x in flat.items():
      name, mod, leaf = k.split("/")
      out.setdefault(name, {}).setdefault(mod, {})[leaf] = jnp.asarray(x)
    return out

  lrs = {"searcher": 1e-2, "generator": 1e-3}
  # warmup 0 and final ratio 1: a constant rate, so the reference needs no schedule.
  opt = make_adapter_optimizer(lrs, 0, 10, weight_decay=0.0, clip_norm=1.0, final_lr_ratio=1.0,
                               b2=0.99)
  params = tree({k: np.zeros(s, np.float32) for k, s in shapes.items()})
  state = opt.init(params)
  for grads in steps:
    updates, state = opt.update(tree(grads), state, params)
    params = optax.apply_updates(params, updates)
  want = _adamw_reference(steps, lrs, clip=1.0)
  for k, x in want.items():
    name, mod, leaf = k.split("/")
    np.testing.assert_allclose(np.asarray(params[name][mod][leaf]), x, rtol=2e-5, atol=1e-7)
  # The rates differ by 10x and so do the first moves (Adam's step is ~lr in size).
  s, g = params["searcher"]["x"]["lora_a"], params["generator"]["x"]["lora_a"]
  assert np.abs(s).mean() > 5 * np.abs(g).mean()


def test_sft_with_lora_exports_adapters_and_the_merged_model(world_dir, tokenizer, tmp_path):
  from agentjax.models.qwen.peft import load_peft
  config = _lora_config(world_dir, tokenizer.name_or_path, str(tmp_path), trainer="sft")
  out = train(config, str(tmp_path / "sft"))
  assert out["step"] == config.sft.steps
  cfg, backbone = _backbone(config)
  spec = lora_lib.LoraSpec(("policy",), 4, 8.0)
  adapter = load_peft(str(tmp_path / "sft" / "adapters" / "policy"), cfg, spec)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(adapter),
               jax.device_get(out["params"]["policy"]))
  assert max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(adapter)) > 0
  _, exported = load_hf(out["hf_export"])
  merged = lora_lib.merge(backbone, adapter, spec.scale)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
               jax.device_get(exported), jax.device_get(merged))


def test_an_adapter_the_run_does_not_train_is_not_decayed():
  """AdamW's decoupled weight decay would shrink an adapter with zero gradients at every step."""
  params = {"policy": {"x": {"lora_a": jnp.ones((3, 2))}},
            "other": {"x": {"lora_a": jnp.ones((3, 2))}}}
  opt = make_adapter_optimizer({"policy": 1e-2, "other": 1e-2}, 0, 10, weight_decay=0.1,
                               clip_norm=1.0, final_lr_ratio=1.0, frozen=("other",))
  state = opt.init(params)
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, state = opt.update(grads, state, params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(np.asarray(new["other"]["x"]["lora_a"]), 1.0)
  assert float(new["policy"]["x"]["lora_a"][0, 0]) < 1.0  # decayed: decay does apply to a trained one
