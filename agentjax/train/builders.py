"""The builders of a run, shared by the trainer loop, evaluation, serving and the studies: the
model and tokenizer, the retriever, the rollout agents, the questions and their order, the train
state and its checkpointer, and the restore of a trained policy.

    cfg, params, tokenizer = load_model(config, mesh)
    engine, eval_engine = make_agents(config, cfg, tokenizer, make_search_backend(config), mesh)
    optimizer, state = init_train_state(config, cfg, params, mesh)

(agentjax/train/trainer.py is the loop that strings them together.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from agentjax.agent import RolloutConfig, RolloutEngine
from agentjax.judge import judge_identity
from agentjax.models.qwen import QwenConfig, init_params, param_shardings
from agentjax.models.qwen.checkpoint import load_hf
from agentjax.models.tokenizer import load_tokenizer
from agentjax.parallel import make_mesh
from agentjax.parallel.host import primary_first
from agentjax.retrieval import SearchBackend, make_backend
from agentjax.retrieval.plugins import PluginError, resolve_backend
from agentjax.retrieval.shared import PrimarySearch
from agentjax.sampling import SamplingParams
from agentjax.train import config as config_lib
from agentjax.train.adapters import TrainTarget
from agentjax.train.checkpoint import Checkpointer, abstract_state
from agentjax.train.critic import Critic, needs_critic
from agentjax.train.kinds import trainer_kind
from agentjax.train.optim import opt_state_shardings
from agentjax.train.step import schedule_args, updates_per_step
from agentjax.train.upgrade import RECORDED_EXTRAS  # re-exported: the trainer reads it here

log = logging.getLogger(__name__)

# Config fields whose change makes a workdir's checkpoints unusable (compared at restore).
COMPAT_KEYS = ("trainer", "algorithm", "seed", "model.preset", "model.hf_path",
               "model.tokenizer_path", "model.param_dtype", "data.train", "rl.prompts_per_step",
               "rl.loss", "optimizer.weight_decay", "optimizer.clip_norm", "lora", "critic.init",
               "critic.weight_decay", "critic.clip_norm")
# SFT also depends on these (its batch order and its data).
SFT_COMPAT_KEYS = ("sft.demos", "sft.corpus_path", "sft.batch_size", "sft.max_len")
EXPORT_DIR = "hf_export"




def load_model(config: Any, mesh: jax.sharding.Mesh) -> tuple[QwenConfig, Any, Any]:
  """(QwenConfig, params placed on `mesh` by the rules table, tokenizer) from config.model."""
  m = config.model
  numerics = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy,
                  # .get: configs recorded before these keys existed read the defaults
                  attention=m.get("attention", "auto"),
                  attention_block=m.get("attention_block", 512))
  tokenizer = load_tokenizer(os.path.expanduser(m.tokenizer_path or m.hf_path))
  if m.hf_path:
    cfg, params = load_hf(os.path.expanduser(m.hf_path), mesh=mesh, **numerics)
  else:
    # From scratch: the preset's shape, its vocabulary sized to the tokenizer (a multiple of 64).
    vocab = -(-len(tokenizer) // 64) * 64
    shape = {"vocab_size": vocab, **{k: v for k, v in m.shape.items() if v}}
    cfg = QwenConfig.preset(m.preset, **shape, **numerics)
    params = init_params(cfg, jax.random.key(config.seed), mesh=mesh)
  if len(tokenizer) > cfg.vocab_size:
    raise config_lib.ConfigError(
        f"config.model.tokenizer_path={m.tokenizer_path or m.hf_path!r}: the tokenizer has "
        f"{len(tokenizer)} tokens but the model's vocabulary is {cfg.vocab_size}")
  return cfg, params, tokenizer


def make_search_backend(config: Any, mesh: jax.sharding.Mesh | None = None) -> SearchBackend:
  """config.retrieval's backend; a dense index is placed with its rows over `mesh`'s devices
  (every process searches it with the same queries: a collective, like BM25 a pure function).
  A backend that is not built in is the user's: retrieval.plugins are imported (they register
  it) and its factory is called with retrieval.backend_kwargs (agentjax/retrieval/plugins.py)."""
  r = config.retrieval
  if r.backend == "dense":
    if r.devices and mesh is not None:  # the first N devices of the mesh hold the index
      mesh = make_mesh(devices=list(mesh.devices.flat)[:r.devices])
    return make_backend("dense", index_dir=os.path.expanduser(r.index_dir),
                        corpus_path=os.path.expanduser(r.corpus_path) if r.corpus_path else None,
                        mesh=mesh, query_prefix=r.query_prefix,
                        recall_target=r.recall_target or None)
  if r.backend == "bm25":
    with primary_first("bm25-index"):  # one process builds the on-disk index, the others load it
      return make_backend("bm25", corpus_path=os.path.expanduser(r.corpus_path),
                          index_dir=os.path.expanduser(r.index_dir) if r.index_dir else None)
  if r.backend == "http":
    backend = make_backend("http", url=r.url, timeout_s=r.timeout_s)
  else:  # the user's own (agentjax/retrieval/plugins.py): retrieval.plugins register it
    try:
      factory, kwargs = resolve_backend(r)
    except PluginError as e:
      raise config_lib.ConfigError(str(e)) from None
    backend = factory(**kwargs)
  # A remote retriever may answer hosts differently (a timeout on one): process 0 asks for all,
  # as it does for the user's own backends, which may be remote. (BM25 is a pure function of the
  # query on every host, so it needs no broadcast.)
  return PrimarySearch(backend) if jax.process_count() > 1 else backend


def sampling_params(config: Any, greedy: bool = False, temperature: float | None = None
                    ) -> SamplingParams:
  """The rollout's sampling settings: greedy, or config.rollout's temperature (or `temperature`)
  with its top-k / top-p filters; the repetition penalty and thinking budget of rollout in both
  (the engine reads the <think> ids from its tokenizer)."""
  r = config.rollout
  rules = dict(repetition_penalty=float(r.repetition_penalty),
               max_think_tokens=int(r.max_think_tokens))
  if greedy:
    return SamplingParams(greedy=True, **rules)
  return SamplingParams(temperature=float(r.temperature if temperature is None else temperature),
                        top_k=r.top_k, top_p=r.top_p, **rules)


def rollout_config(config: Any, greedy: bool = False) -> RolloutConfig:
  """The rollout settings of training (sampled, group_size per question) or of eval (greedy, one
  trajectory per question)."""
  r = config.rollout
  sampling = sampling_params(config, greedy=greedy)
  return RolloutConfig(protocol=r.protocol, group_size=1 if greedy else r.group_size,
                       max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                       max_obs_tokens=r.max_obs_tokens, max_total_tokens=r.max_total_tokens,
                       topk=config.retrieval.topk, sampling=sampling,
                       use_chat_template=r.use_chat_template,
                       engine=r.engine, slots=r.slots, lanes=r.lanes,
                       refill_fraction=r.refill_fraction, kv_window_min=r.kv_window_min,
                       prefill_rows=r.prefill_rows,
                       compact_factor=r.compact_factor, row_bucket_factor=r.row_bucket_factor,
                       partial=r.partial)


def make_agents(config: Any, cfg: QwenConfig, tokenizer: Any, backend: SearchBackend,
                mesh: jax.sharding.Mesh, lora: Any = None,
                eval_sampling: SamplingParams | None = None, eval_only: bool = False,
                train_mesh: jax.sharding.Mesh | None = None) -> tuple[Any, Any]:
  """(training agent, eval agent): RolloutEngines, or the trainer kind's agents (DAC's
  DacAgents: searcher and generator; eval: one answer per evidence set). The eval agent rolls
  out one trajectory per question, greedy unless `eval_sampling`. eval_only: no training agent
  (None). train_mesh: the training agent's mesh when not `mesh` (the sampler's devices of a
  split placement; the eval agent runs on `mesh`, with the trainer's parameters)."""
  train_rollout = rollout_config(config)
  eval_rollout = rollout_config(config, greedy=True)
  if eval_sampling is not None:
    eval_rollout = dataclasses.replace(eval_rollout, sampling=eval_sampling)
  kind = trainer_kind(config)
  if kind.make_agent is not None:  # DAC: the searcher and the generator (eval: one answer a set)
    make = lambda rollout, samples, on: kind.make_agent(  # noqa: E731
        config, cfg, tokenizer, backend, rollout, on, lora, samples)
  else:
    make = lambda rollout, samples, on: RolloutEngine(  # noqa: E731
        cfg, tokenizer, backend, rollout, mesh=on, lora=lora)
  return (None if eval_only else make(train_rollout, None, train_mesh or mesh)), \
      make(eval_rollout, 1, mesh)


def load_questions(config: Any, names: Sequence[str], split: str,
                   field: str = "data.train") -> list[dict[str, Any]]:
  """Question records of `split` of each entry, concatenated in entry order; each gains
  "benchmark" (the entry). An entry is a benchmark (tfds search_qa, built from data.manual_dir on
  first use) or a path to the user's own question file or folder (agentjax.data.qa_files, read
  directly; a file gives all its questions whatever the split). A benchmark without that split,
  missing benchmark files or a bad question file raise ConfigError naming `field` (the config
  entry that asked for it: "data.train", "data.eval" or "data.eval_split")."""
  from agentjax.data.qa_files import QAFormatError, load_qa_path
  from agentjax.data.searchqa import is_benchmark, load_split
  out = []
  for name in names:
    if not is_benchmark(name):  # the user's own file: every process reads it, nothing is built
      entry = "data.train" if field == "data.train" else "data.eval"
      try:
        records = load_qa_path(name, split)
      except QAFormatError as e:
        raise config_lib.ConfigError(f"config.{entry}={name!r}: {e}") from None
      out += [dict(rec, benchmark=name) for rec in records]
      continue
    with primary_first(f"tfds:{name}:{split}"):  # one process builds, the others read
      try:
        records = load_split(name, split, data_dir=os.path.expanduser(config.data.data_dir),
                             manual_dir=os.path.expanduser(config.data.manual_dir))
      except (FileNotFoundError, QAFormatError) as e:  # no benchmark files, or a bad line
        raise config_lib.ConfigError(f"config.data.manual_dir={config.data.manual_dir!r}: "
                                     f"{e}") from None
      except ValueError as e:
        if "has no split" not in str(e):
          raise
        raise config_lib.ConfigError(f"config.{field}={split!r}: {e}") from None
    out += [dict(rec, benchmark=name) for rec in records]
  return out


@dataclasses.dataclass
class QuestionStream:
  """Endless, deterministic question order: epoch e is a permutation seeded by (seed, e).

  `take(position, n)` is a pure function of the position, so the data state of a checkpoint is
  one integer (questions consumed so far)."""
  records: list[dict[str, Any]]
  seed: int

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.records))

  def take(self, position: int, n: int) -> list[dict[str, Any]]:
    size = len(self.records)
    out, epoch, order = [], -1, None
    for p in range(position, position + n):
      if p // size != epoch:
        epoch = p // size
        order = self._order(epoch)
      out.append(self.records[int(order[p % size])])
    return out


def init_train_state(config: Any, cfg: QwenConfig, params: Any, mesh: jax.sharding.Mesh,
                     target: TrainTarget | None = None, with_critic: bool = True
                     ) -> tuple[optax.GradientTransformation, dict[str, Any]]:
  """(optimizer, state): state = {"params", "opt_state", "rng"}, sharded by the rules table
  (parameters and Adam moments FSDP-sharded alike; the step counter and the key replicated);
  a PPO run's state also holds {"critic": {"params", "opt_state"}} (Critic.init_state) unless
  with_critic is False.

  target: what is trained (agentjax/train/adapters.py); default: built from config (the whole
  model, or LoRA adapters on `params` when config.model.lora.adapters is set)."""
  target = target or TrainTarget.build(config, cfg, params, mesh)
  lr, warmup, total, final_ratio = schedule_args(config)
  optimizer = target.optimizer(config, lr, warmup, total, final_ratio, config.optimizer.b2)
  trainable = target.trainable
  shardings = target.shardings(mesh) or param_shardings(cfg, mesh)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_state_shardings(
      optimizer, trainable, shardings, mesh))(trainable)
  # Created under jit: device_put cannot target devices of other processes.
  rng = jax.jit(lambda: jax.random.key(config.seed),
                out_shardings=NamedSharding(mesh, PartitionSpec()))()
  state = {"params": trainable, "opt_state": opt_state, "rng": rng}
  if with_critic and needs_critic(config):  # PPO: the value model and its optimizer state
    critic = Critic.build(config, target, updates_per_step(config))
    state["critic"] = critic.init_state(config, params, mesh)
  return optimizer, state


def make_checkpointer(config: Any, workdir: str, target: TrainTarget | None = None
                      ) -> Checkpointer:
  """The run's Checkpointer (RL, or SFT for a supervised trainer kind).

  config.json also records the judge's identity (backend, model, prompt hash): CW-GRPO's numbers
  depend on the judge, and the prompt file can change under the same path; and with LoRA the
  adapters' spec and the backbone (path, fingerprint) they only make sense on: a resume onto
  another backbone is refused after the compat keys matched, before any array is read."""
  target = target or TrainTarget.of(config)
  recorded = dict(config.to_dict(), **target.recorded())
  if trainer_kind(config).supervised:
    return Checkpointer(workdir, save_every=config.sft.checkpoint_every or None,
                        keep=config.train.keep_checkpoints, config=recorded,
                        compat_keys=COMPAT_KEYS + SFT_COMPAT_KEYS,
                        check_stored=target.check_backbone)
  recorded["judge_identity"] = judge_identity(config.judge)
  return Checkpointer(workdir, save_every=config.train.checkpoint_every,
                      keep=config.train.keep_checkpoints, config=recorded,
                      compat_keys=COMPAT_KEYS,
                      check_stored=target.check_backbone)


def restore_trainable(config: Any, workdir: str, mesh: jax.sharding.Mesh, *,
                      step: int | None = None, purpose: str = "restore"
                      ) -> tuple[QwenConfig, TrainTarget, Any, Any, str]:
  """(cfg, target, trained params, tokenizer, checkpoint dir) of a run at `step` (default: the
  latest): the full train state is the restore target (orbax reads it shard by shard into
  place, FSDP included); only its params are kept (with LoRA: {name: adapter}, on
  target.backbone). FileNotFoundError without a checkpoint. A PPO run's critic is not built:
  its part of the target is abstract (orbax reads it, and it is dropped)."""
  cfg, params, tokenizer = load_model(config, mesh)
  target = TrainTarget.build(config, cfg, params, mesh)
  _, state = init_train_state(config, cfg, params, mesh, target, with_critic=False)
  restore_target = abstract_state(state)
  if needs_critic(config):
    critic = Critic.build(config, target, updates_per_step(config))
    restore_target["critic"] = critic.abstract_state(mesh)
  workdir = os.path.expanduser(workdir)
  ckpt = make_checkpointer(config, workdir, target)
  try:
    restored = ckpt.restore_or_none(restore_target, step=step)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints to {purpose}")
  return cfg, target, restored[0]["params"], tokenizer, str(ckpt.step_dir(restored[2]))


def restore_policy(config: Any, workdir: str, mesh: jax.sharding.Mesh, *,
                   step: int | None = None, purpose: str = "restore", role: str | None = None
                   ) -> tuple[QwenConfig, Any, Any, str]:
  """(cfg, params, tokenizer, checkpoint dir) of a run's policy at `step` (default: the latest),
  for eval and serving (`restore_trainable`). A LoRA run's policy comes back as plain params: the
  backbone with the policy adapter merged (or adapter `role`). A run of a kind with roles (DAC)
  has no single policy: it needs `role` ("searcher" or "generator")."""
  if trainer_kind(config).roles and role is None:
    raise config_lib.ConfigError(
        f"config.trainer={config.trainer!r}: {workdir} holds {len(trainer_kind(config).roles)} "
        f"roles (adapters {config.model.lora.adapters})"
        f" and no single policy to {purpose}; evaluate both with launch/eval.py, or merge one "
        f"role's PEFT folder ({workdir}/adapters/<role>/) with launch/merge_lora.py and use that "
        f"Hugging Face folder")
  cfg, target, trainable, tokenizer, source = restore_trainable(config, workdir, mesh, step=step,
                                                                purpose=purpose)
  return cfg, target.merged(trainable, role), tokenizer, source


__all__ = ["COMPAT_KEYS", "EXPORT_DIR", "QuestionStream", "RECORDED_EXTRAS", "SFT_COMPAT_KEYS", "init_train_state", "load_model", "load_questions", "make_agents", "make_checkpointer", "make_search_backend", "opt_state_shardings", "restore_policy", "restore_trainable", "rollout_config"]
