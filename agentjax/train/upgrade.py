"""The one upgrade of a config an older version recorded (a workdir's config.json, a
checkpoint's meta), so that the code reads every config field directly and the defaults live in
configs/base.py alone.

    config = ml_collections.ConfigDict(upgrade_recorded(json.load(open("runs/x/config.json"))))

ADDED lists every field added to the config after runs had been recorded without it, with the
value such a run ran with: the behaviour of the code before the field existed, which is not
always today's default (rl.ig_probe_tokens: "natural" today, "split" then). A recorded config
gains each missing field with that value; a field it has is never changed.

    config = recorded_config("runs/x")   # the run's config.json as a ConfigDict, upgraded

recorded_config is the one reader of a workdir's record (the launch scripts' --workdir default,
the server's): upgraded, without what is recorded beside the config fields (RECORDED_EXTRAS),
JSON's lists back to the tuples config fields hold.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Mapping

from ml_collections import config_dict

RECORD = "config.json"  # what a run's checkpointer writes into its workdir (Checkpointer)
# What a run's config.json records beside its config fields (builders.make_checkpointer: the
# judge's identity, the adapters and the backbone they were trained on): readers that rebuild
# the config from it drop these.
RECORDED_EXTRAS = ("judge_identity", "lora", "lora_backbone")

# (dotted field, the value a run recorded before the field existed ran with, what that meant)
ADDED: tuple[tuple[str, Any, str], ...] = (
    ("model.attention", "auto", "the attention implementation chosen for the platform"),
    ("model.attention_block", 512, "key/value blocks of 512 in the linear-memory attention"),
    ("mesh.sampler_devices", 0, "the sampler on the training mesh"),
    ("rollout.partial", "off", "every rollout finished by the parameters it began with"),
    ("rollout.engine", "turns", "the turn-synchronous engine (the only one then)"),
    ("rollout.slots", 0, "the slot engine's slots (unused by the turn engine)"),
    ("rollout.lanes", 2, "the slot engine's lanes (unused by the turn engine)"),
    ("rollout.refill_fraction", 0.125, "the slot engine's refill share (unused by it)"),
    ("rollout.repetition_penalty", 1.0, "no repetition penalty"),
    ("rollout.max_think_tokens", 0, "no thinking budget"),
    ("rollout.kv_window_min", 256, "the slot engine's smallest key window"),
    ("rollout.prefill_rows", 32, "prompts prefilled 32 at a time"),
    ("rollout.compact_factor", 2, "lanes compacted on a finer ladder (sampled tokens do not "
     "depend on it)"),
    ("rollout.row_bucket_factor", 2, "row-subset programs on powers of two of rows"),
    ("rollout.warm_up", False, "no warm-up of the rollout's programs (prompts prefilled at "
     "each chunk's own width)"),
    ("retrieval.query_prefix", "query: ", "the dense backend's query prefix (unused by others)"),
    ("retrieval.recall_target", 0.0, "exact dense search (unused by other backends)"),
    ("retrieval.devices", 0, "a dense index on every device (unused by other backends)"),
    ("retrieval.plugins", "", "no plugin modules: the built-in backends only"),
    ("retrieval.backend_kwargs", "", "no keyword arguments for a plugin's backend"),
    ("rl.ig_probe_tokens", "split", "IGPO's probes tokenized apart from the template"),
    ("rl.probe_width_multiple", 8, "probe widths on multiples of 8"),
    ("rl.probe_all", False, "IGPO's probes only for the methods that read them"),
    ("rl.off_policy_correction", "none", "no weighting by the sampler's log-probs"),
    ("rl.off_policy_cap", 2.0, "the cap of that weighting (unused without it)"),
    ("rl.micro_batch_size", 0, "each minibatch in one forward/backward pass"),
    ("rl.pack_tokens", 0, "padded rows, not packed ones"),
    ("rl.pack_rows_per_octave", 8, "packed row counts on a ladder of 8 sizes an octave"),
    ("rl.trim_batches", True, "batches cut to their longest trajectory"),
    ("train.jax_cache_dir", "", "no persistent compilation cache"),
    ("train.async_steps", 0, "synchronous steps"),
    ("train.stall_timeout_s", 0.0, "no progress watchdog"),
    ("train.final_eval", True, "the dev eval after the last step"),
    ("train.max_staleness", -1, "no bound on a rollout's staleness"),
    ("sft.protocols", "", "the trainer kind's own protocol"),
    ("critic.init", "policy", "the critic's trunk started from the policy"),
    ("critic.weight_decay", 0.01, "the critic's AdamW weight decay"),
    ("critic.clip_norm", 1.0, "the critic's gradient clipping"),
    ("coreact.generator_repetition_penalty", 1.0, "no repetition penalty in the rubric generator"),
    ("coreact.generator_max_think_tokens", 0, "no thinking budget for the rubric generator"),
    ("coreact.value_batch", 64, "Monte-Carlo branch values 64 continuations a batch"),
    # recorded beside the config fields (make_checkpointer): the adapters a run trained
    ("lora", None, "full fine-tuning: no adapters"),
)


def upgrade_recorded(recorded: Mapping[str, Any]) -> dict[str, Any]:
  """A copy of a recorded config (nested dicts, as JSON holds it) with every ADDED field it lacks
  filled with the value its run ran with. A section an old run did not record at all (e.g.
  coreact before Co-ReAct existed) is added only for the fields ADDED names."""
  out = copy.deepcopy(dict(recorded))
  for key, value, _ in ADDED:
    *parents, leaf = key.split(".")
    node = out
    for name in parents:
      node = node.setdefault(name, {})
      if not isinstance(node, dict):
        break
    else:
      node.setdefault(leaf, value)
  return out


class RecordError(ValueError):
  """A workdir's config.json that is not a run's readable config; the message names the file."""


def _as_fields(value: Any) -> Any:
  """JSON's lists back to the tuples config fields hold (a JSON file has no tuple)."""
  if isinstance(value, dict):
    return {k: _as_fields(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_as_fields(v) for v in value)
  return value


def recorded_config(workdir: str) -> Any:
  """The config the run in `workdir` recorded ({workdir}/config.json) as an ml_collections
  ConfigDict: upgraded to today's fields (upgrade_recorded), without RECORDED_EXTRAS, lists as
  tuples. None when the workdir holds no record; RecordError naming the file when it cannot be
  read or holds no config."""
  path = os.path.join(workdir, RECORD)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise RecordError(f"{path}: cannot be read ({e})") from e
  if not isinstance(recorded, dict):
    raise RecordError(f"{path}: holds {type(recorded).__name__}, not a run's config")
  recorded = upgrade_recorded(recorded)
  for key in RECORDED_EXTRAS:  # recorded beside the config, not config fields
    recorded.pop(key, None)
  return config_dict.ConfigDict(_as_fields(recorded))


__all__ = ["ADDED", "RECORD", "RECORDED_EXTRAS", "RecordError", "recorded_config",
           "upgrade_recorded"]
