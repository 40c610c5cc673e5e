"""The critic of PPO: the Qwen decoder without its LM head and a scalar head on its hidden states.

    module = QwenValue(cfg)
    params = value_params_from_policy(cfg, policy_params, rng, mesh)   # or load_value_hf(folder)
    values = jax.jit(sequence_values, static_argnums=0)(module, params, tokens, valid)  # [B, L]
    save_value_hf("path/to/critic", cfg, params)   # transformers loads it back

This is verl's critic (AutoModelForTokenClassification with num_labels=1, OpenRLHF's and
AReaL's alike): Qwen2ForTokenClassification's `model` trunk and `score = nn.Linear(E, 1,
bias=True)` applied to every position's final-norm hidden state (its dropout is identity in eval
mode, and the critic trains without dropout). The parameter tree mirrors the Hugging Face names:

    {"model": <Qwen params without lm_head>, "score": {"kernel": [E, 1], "bias": [1]}}

so a Qwen2/Qwen3 *ForTokenClassification folder loads into it tensor by tensor, and a causal-LM
folder (the policy's checkpoint) gives the trunk with the LM head dropped and a fresh head.

Alignment (`sequence_values`): the value of token t is the value of the state in which t is
sampled, i.e. the head on hidden[:, t-1], exactly as the log-prob of t comes from the logits at
t-1 (agentjax/models/logprobs.py). A token with no real slot before it (each row's first token)
and padding get 0.

With LoRA the critic is a value adapter plus the head on the policy's frozen backbone
(`value_params_with_adapter`): QwenValue(cfg, lora=LoraSpec(("value",), ...)) runs the shared
backbone's arrays with that adapter selected.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from agentjax.models import lora as lora_lib
from agentjax.models import masks
from agentjax.models.lora import LoraSpec
from agentjax.models.qwen import checkpoint
from agentjax.models.qwen.config import ConfigError, QwenConfig
from agentjax.models.qwen.model import Linear, Qwen, _dummy_inputs
from agentjax.models.safetensors_io import SafetensorsFolder
from agentjax.parallel import constrain, logical_to_sharding

Array = jax.Array
_F32 = jnp.float32
# The head's Hugging Face tensors (GenericForTokenClassification's `score` nn.Linear): weight
# [num_labels, E] (= our kernel [E, 1] transposed) and bias [num_labels].
SCORE_WEIGHT, SCORE_BIAS = "score.weight", "score.bias"
_TOKEN_CLS, _CAUSAL_LM = "ForTokenClassification", "ForCausalLM"


def _score_layer(cfg: QwenConfig, name: str | None = "score") -> Linear:
  """The value head: hidden [..., E] -> [..., 1], run in float32 (a value's small differences
  must not round to bf16), kernel normal(0.02) and bias 0 (transformers' init) in param_dtype."""
  return Linear((1,), ("embed", None), use_bias=True, bias_axes=(None,), dtype=_F32,
                param_dtype=jnp.dtype(cfg.param_dtype), name=name)


class QwenValue(nn.Module):
  """The critic: the Qwen decoder (no LM head) and a scalar head on its final hidden states."""

  cfg: QwenConfig
  lora: LoraSpec | None = None

  def setup(self):
    self.model = Qwen(self.cfg, lora=self.lora, with_lm_head=False, name="model")
    self.score = _score_layer(self.cfg)

  def __call__(self, tokens: Array, positions: Array, attention_mask: Array) -> Array:
    """Per-slot values. tokens, positions [B, Q] int32; attention_mask [B, Q, Q] bool (as Qwen).

    Returns [B, Q] float32: the head on each slot's hidden state (the value of the state after
    reading tokens[:, :q + 1]; `sequence_values` aligns it to the tokens sampled there)."""
    hidden, _ = self.model(tokens, positions, attention_mask, return_hidden=True)  # [B, Q, E]
    values = self.score(hidden.astype(_F32))[..., 0]
    return constrain(values, ("batch", "length"))


def sequence_values(module: QwenValue, params: Any, tokens: Array, valid: Array) -> Array:
  """Values of padded sequences, aligned with the tokens they precede (one forward pass).

  Args:
    module: a QwenValue.
    params: its params (`value_params_from_policy`, `load_value_hf`, `value_params_with_adapter`).
    tokens, valid: [B, L]; real tokens may be left- or right-padded.
  Returns:
    [B, L] float32: values[:, t] = the head on hidden[:, t - 1], the state in which token t is
    sampled, where slot t - 1 and slot t are both real (sequence_logprobs' rule); 0 elsewhere
    (each row's first real token, padding).
  """
  valid = valid.astype(bool)
  per_slot = module.apply({"params": params}, tokens, masks.positions_from_padding(valid),
                          masks.causal_padding_mask(valid))                         # [B, L]
  prev = jnp.concatenate([jnp.zeros_like(per_slot[:, :1]), per_slot[:, :-1]], axis=1)
  has_prev = jnp.concatenate([jnp.zeros_like(valid[:, :1]), valid[:, :-1]], axis=1) & valid
  return jnp.where(has_prev, prev, 0.0)


# --------------------------------------------------------------------------- parameters


@functools.lru_cache(maxsize=None)
def _abstract_boxed(cfg: QwenConfig, lora: LoraSpec | None) -> Any:
  # Cached: every caller maps over it into new trees (unbox, get_partition_spec), never edits it.
  return jax.eval_shape(lambda r: QwenValue(cfg, lora).init(r, *_dummy_inputs())["params"],
                        jax.random.key(0))


def value_logical_axes(cfg: QwenConfig, lora: LoraSpec | None = None) -> Any:
  """Pytree (like the value params) of PartitionSpecs of logical axis names: the trunk's as
  model.param_logical_axes, the head kernel ("embed", None), its bias (None,)."""
  return nn.get_partition_spec(_abstract_boxed(cfg, lora))


def value_abstract(cfg: QwenConfig, lora: LoraSpec | None = None) -> Any:
  """Pytree of jax.ShapeDtypeStruct with the value params' shapes (nothing allocated)."""
  return nn.meta.unbox(_abstract_boxed(cfg, lora))


def value_shardings(cfg: QwenConfig, mesh: jax.sharding.Mesh,
                    lora: LoraSpec | None = None) -> Any:
  """NamedShardings for the value params on `mesh`, by the rules table in agentjax/parallel."""
  return logical_to_sharding(value_logical_axes(cfg, lora), value_abstract(cfg, lora), mesh)


def init_value_head(cfg: QwenConfig, rng: Array, mesh: jax.sharding.Mesh | None = None) -> Any:
  """A fresh head {"kernel": [E, 1] normal(0.02), "bias": [1] zeros} in param_dtype, placed by
  the rules table on `mesh` (default: where jit puts it, the first device)."""
  return _jitted_head_init(cfg, mesh)(rng)


@functools.lru_cache(maxsize=None)
def _jitted_head_init(cfg: QwenConfig, mesh: jax.sharding.Mesh | None):
  def init(r):
    hidden = jnp.zeros((1, cfg.hidden_size), _F32)
    return nn.meta.unbox(_score_layer(cfg, name=None).init(r, hidden)["params"])

  shardings = value_shardings(cfg, mesh)["score"] if mesh is not None else None
  return jax.jit(init, out_shardings=shardings)


def _trunk_cfg(cfg: QwenConfig) -> QwenConfig:
  """The config whose Qwen params (and checkpoint._param_map) are exactly the trunk: a tied
  model has no lm_head leaf, and tie_word_embeddings changes nothing else in the tree."""
  return cfg.replace(tie_word_embeddings=True)


def _value_param_map(cfg: QwenConfig, with_head: bool = True) -> checkpoint.ParamMap:
  """Our value param path -> (Hugging Face tensor name, layout kind): the causal LM's trunk
  under "model" (the HF names are the same), and the head (score.weight [1, E] is our kernel
  [E, 1] transposed, score.bias [1] as is)."""
  out = {("model",) + path: hf for path, hf in checkpoint._param_map(_trunk_cfg(cfg)).items()}
  if with_head:
    out[("score", "kernel")] = (SCORE_WEIGHT, "T")
    out[("score", "bias")] = (SCORE_BIAS, "copy")
  return out


def _paths(tree: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
  return traverse_util.flatten_dict(dict(tree))


def _check_tree(got: Mapping[str, Any], want: Mapping[str, Any], what: str) -> None:
  """Same leaf paths and shapes as `want`, or a ValueError naming the first leaf that differs."""
  got_paths, want_paths = _paths(got), _paths(want)
  for path in want_paths:
    if path not in got_paths:
      raise ValueError(f"{what}: leaf {'/'.join(path)} is missing")
  for path in got_paths:
    if path not in want_paths:
      raise ValueError(f"{what}: unexpected leaf {'/'.join(path)} (not a parameter of the "
                       "value model's trunk)")
  for path, leaf in want_paths.items():
    if tuple(got_paths[path].shape) != tuple(leaf.shape):
      raise ValueError(f"{what}: leaf {'/'.join(path)} has shape "
                       f"{list(got_paths[path].shape)}, expected {list(leaf.shape)}")


def value_params_from_policy(cfg: QwenConfig, policy_params: Any, rng: Array,
                             mesh: jax.sharding.Mesh | None = None) -> Any:
  """The critic initialized from the policy (verl's default): {"model": copies of the policy's
  trunk arrays (lm_head dropped, tied or not), "score": init_value_head(cfg, rng, mesh)}.

  Copies, made under jit and placed by the value shardings: the policy's buffers are donated to
  its optimizer updates, which would delete arrays the critic shared."""
  trunk = {k: v for k, v in policy_params.items() if k != "lm_head"}
  _check_tree(trunk, value_abstract(cfg)["model"], "value_params_from_policy: policy params")
  return {"model": _jitted_copy(cfg, mesh)(trunk), "score": init_value_head(cfg, rng, mesh)}


@functools.lru_cache(maxsize=None)
def _jitted_copy(cfg: QwenConfig, mesh: jax.sharding.Mesh | None):
  dtypes = jax.tree.map(lambda leaf: leaf.dtype, value_abstract(cfg)["model"])
  shardings = value_shardings(cfg, mesh)["model"] if mesh is not None else None
  # A jit output is a fresh buffer even when it equals an input (nothing is donated here).
  return jax.jit(lambda trunk: jax.tree.map(lambda x, d: jnp.copy(x).astype(d), trunk, dtypes),
                 out_shardings=shardings)


def value_params_with_adapter(backbone: Mapping[str, Any], adapter: Any, head: Any,
                              spec: LoraSpec) -> dict[str, Any]:
  """The params of QwenValue(cfg, lora=spec), a critic sharing the policy's frozen backbone:
  {"model": lora.attach(backbone minus lm_head, {name: adapter}, spec, name), "score": head}.

  spec holds one adapter name (e.g. "value"), the one selected. No array of the backbone is
  copied (attach shares them), so this runs inside the critic's jitted step."""
  if len(spec.names) != 1:
    raise ValueError(f"value_params_with_adapter: the value model's lora spec must hold one "
                     f"adapter, got names {list(spec.names)}")
  name = spec.names[0]
  trunk = {k: v for k, v in backbone.items() if k != "lm_head"}
  return {"model": lora_lib.attach(trunk, {name: adapter}, spec, name), "score": head}


# --------------------------------------------------------------------------- Hugging Face folders


def _read_hf_config(path: str) -> dict[str, Any]:
  with open(os.path.join(path, "config.json")) as f:  # QwenConfig.from_hf_folder checked it
    return json.load(f)


def _is_token_classification(path: str, hf: Mapping[str, Any], folder: SafetensorsFolder
                             ) -> bool:
  """True for a *ForTokenClassification folder (its head is loaded), False for a causal LM
  (head initialized); from config.json's architectures, else from the tensors."""
  config_path = os.path.join(path, "config.json")
  archs = hf.get("architectures") or []
  if any(str(a).endswith(_TOKEN_CLS) for a in archs):
    is_cls = True
  elif any(str(a).endswith(_CAUSAL_LM) for a in archs):
    is_cls = False
  elif archs:
    raise ConfigError(f"{config_path}: architectures {archs} is neither a value model "
                      f"(Qwen2/Qwen3{_TOKEN_CLS}) nor a causal LM (*{_CAUSAL_LM})")
  else:
    is_cls = SCORE_WEIGHT in folder
  if not is_cls:
    return False
  id2label = hf.get("id2label")
  # transformers' rule: num_labels is len(id2label); without id2label, the field, else 2.
  num_labels = len(id2label) if id2label else hf.get("num_labels", 2)
  if num_labels != 1:
    source = "len(id2label)" if id2label else "num_labels"
    raise ConfigError(f"{config_path}: num_labels is {num_labels} ({source}); a value model has "
                      "num_labels=1 (one score per token)")
  if hf.get("token_classification_bias", True) is False:
    raise ConfigError(f"{config_path}: token_classification_bias=false is not supported (the "
                      "value head has a bias)")
  return True


def load_value_hf(path: str, mesh: jax.sharding.Mesh | None = None, rng: Array | None = None,
                  **config_overrides: Any) -> tuple[QwenConfig, Any]:
  """Loads a value model from a Hugging Face folder (config.json + safetensors).

  The folder is either a Qwen2/Qwen3 *ForTokenClassification with num_labels=1 (a critic saved
  by save_value_hf, verl or transformers: score.weight [1, E] and score.bias [1] become the
  head) or a causal LM (its lm_head is ignored and the head initialized from `rng`, default
  key 0). Every tensor's name, shape and dtype is checked before any data is read; each
  device's block is then read on its own from the memory-mapped file.

  Args:
    path: checkpoint folder.
    mesh: place parameters by the rules table (value_shardings); default: the first device.
    rng: the fresh head's key for a causal-LM folder.
    config_overrides: QwenConfig fields to change (param_dtype, dtype, remat_policy, ...).
  Returns:
    (config, {"model": trunk params, "score": {"kernel": [E, 1], "bias": [1]}}).
  """
  cfg = QwenConfig.from_hf_folder(path, **config_overrides)
  folder = SafetensorsFolder(path)
  with_head = _is_token_classification(path, _read_hf_config(path), folder)
  mapping, abstract = _value_param_map(cfg, with_head), value_abstract(cfg)
  # A causal LM's lm_head.weight is allowed and ignored.
  checkpoint.check_tensors(folder, checkpoint.expected_tensors(mapping, abstract),
                           set() if with_head else {"lm_head.weight"},
                           f"{cfg.model_type} value model" if with_head
                           else f"{cfg.model_type} causal LM")
  shardings = value_shardings(cfg, mesh) if mesh is not None else None
  params = checkpoint.arrays_from_tensors(mapping, abstract, folder, shardings)
  if not with_head:
    params["score"] = init_value_head(cfg, jax.random.key(0) if rng is None else rng, mesh)
  return cfg, params


def value_hf_config(cfg: QwenConfig) -> dict[str, Any]:
  """config.json of the value model: the causal LM's (QwenConfig.to_hf_dict) as a
  Qwen2ForTokenClassification (Qwen3ForTokenClassification for qwen3) with one label and no
  classifier dropout (the critic trains without it)."""
  hf = cfg.to_hf_dict()
  hf["architectures"] = [("Qwen3" if cfg.model_type == "qwen3" else "Qwen2") + _TOKEN_CLS]
  hf["id2label"], hf["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
  hf["classifier_dropout"] = 0.0
  return hf


def save_value_hf(path: str, cfg: QwenConfig, params: Any, tokenizer: Any = None) -> str:
  """Exports value params as a folder transformers' AutoModelForTokenClassification loads
  (Qwen2ForTokenClassification, or Qwen3's, with num_labels=1).

  Written with checkpoint.staged_folder: beside the target, then swapped in whole, so a crash
  never leaves a partial folder and an existing export survives a failed write. On multi-host
  runs every process must call this (parameters are gathered); process 0 writes. A LoRA critic
  is exported with its adapter merged first (lora.merge). Returns the absolute path.
  """
  lora_leaves = [p for p in _paths(params["model"])
                 if p[-1] in lora_lib.LORA_LEAVES or p == (lora_lib.INDEX_LEAF,)]
  if lora_leaves:
    raise ValueError(f"save_value_hf: params['model'] holds LoRA leaves ({'/'.join(lora_leaves[0])}"
                     "); merge the adapter into the backbone first (lora.merge)")
  return checkpoint.write_hf_folder(path, checkpoint.tensors_of(_value_param_map(cfg), params),
                                   value_hf_config(cfg), tokenizer)
