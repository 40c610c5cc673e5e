r"""Co-ReAct: a rubric generator trained with GRPO on a list-wise Spearman reward, and agents that
take its rubric at each step (agentjax/coreact/; Co-ReAct, arXiv:2605.23590). Settings are the
official code's (github.com/ZBWpro/Co-ReAct: rubric_rl/train_grpo*.sh, rubric_rl/reward_fn.py,
agent/workflows/co_react_eval.yaml) unless marked "ours".

  # the demo (after `make demo`): branch points, the generator's warm start, GRPO, guided eval
  python launch/collect_branches.py --config=configs/coreact.py:demo --split=train
  python launch/collect_branches.py --config=configs/coreact.py:demo --split=dev
  python launch/coreact_demos.py                 # runs/demo/coreact/rubric_demos.jsonl
  python launch/train.py --config=configs/coreact.py:rubric_sft --workdir=runs/demo/coreact/rubric_sft
  python launch/train.py --config=configs/coreact.py:demo --workdir=runs/demo/coreact/rubric
  python launch/eval.py --config=configs/coreact.py:demo --hf_path=runs/demo/sft/hf_export \
      --agent=coreact --rubric_generator=runs/demo/coreact/rubric/hf_export
  # the paper's rubric generator
  python launch/train.py --config=configs/coreact.py:qwen3-14b --workdir=/mnt/shared/runs/rubric14b \
      --config.coreact.applier=openai --config.judge.base_url=http://10.0.0.3:8001/v1 \
      --config.judge.model=gemini-2.5-pro

Presets:
  (collect and agent are the agent's side of the demo: launch/collect_branches.py and
  launch/eval.py --agent=... given :demo run them through agent_config, below.)
  collect     branch points on SynthWorld: the demo SFT agent's trajectories, 4 candidates per
              temperature (0.7, 1.0, 1.3), deduplicated, 4 kept by BM25 diversity, ranked by 3
              noisy oracle judges (value-to-go from the gold chain), Borda; the rank-1 continues.
  rubric_sft  the generator's warm start (ours: a from-scratch demo model has never written a
              rubric): SFT of the demo agent's model (full fine-tuning: see the preset) on rubrics
              drawn at random from the executor's criterion vocabulary (well-formed, uninformed
              by the context: what GRPO then has to make discriminative).
  demo        GRPO of the rubric generator (trainer "rubric"): group 8, 8 branch points a step,
              the executor applier, the official reward (0.75 / 0.15 / 0.10, 4-gram gate 0.40),
              KL 0.005 low_var_kl (the reference: the warm start), clip 0.2, temperature 1.0,
              constant rate after warm-up; full fine-tuning from rubric_sft's export at 1e-4
              (ours); one PPO update per step (minibatch = the step's 64 rubrics; ours).
  agent       the guided agent's eval settings on the demo: the demo SFT agent (sample it at the
              code's 0.7 with launch/eval.py --temperature=0.7), the rubric generator greedy,
              verify 0.6, one retry.
  research_collect, research_rubric_sft, research, research_agent
              the same four on SynthWorld v2 from the research backbone (configs/base.py
              research: top 3, 6 turns, a 1536-token context, where verify has room to retry;
              the backbone saw rubric suffixes in its SFT), under runs/research/coreact
              (`python launch/coreact_study.py --family=research`).
  qwen3-14b   the code's 14B trainer: 32 prompts x 8, lr 2e-6 constant after 10 warm-up steps,
              KL 0.005 low_var_kl, clip 0.2, no entropy bonus, temperature 1.0, prompt 8192 /
              response 2048, 2 epochs (train.steps: set it to 2 x rows / 32 of your branch set;
              125 is the eval config's checkpoint). Full fine-tuning, as verl's.
  qwen3-8b    the code's 8B trainer: 64 prompts x 8, lr 3e-6, KL 0.005, clip 0.2 (verl's
              default); the code's 8B script does not state the rest: ours, copied from
              qwen3-14b (10 warm-up steps, low_var_kl, temperature 1.0, 8192 / 2048; train.steps
              = 2 x rows / 64 for 2 epochs).
  Every preset samples the generator's GRPO rollouts with the 14B script's repetition penalty
  1.1 (rollout.repetition_penalty; the 8B script does not state one: ours, copied), and the
  guided agent's generator decodes with the eval's 1.1 and max_think_tokens 1500
  (coreact.generator_repetition_penalty, coreact.generator_max_think_tokens). One PPO update
  per step (minibatch = the step's batch) is ours.
"""

import copy

from configs import base

# The demo's four presets, and the same four on SynthWorld v2 from the research backbone
# (research_*: "research" is the GRPO preset, as "demo" is the demo's).
DEMO_PRESETS = ("demo", "collect", "rubric_sft", "agent")
RESEARCH_PRESETS = ("research", "research_collect", "research_rubric_sft", "research_agent")
PRESETS = DEMO_PRESETS + RESEARCH_PRESETS + ("qwen3-14b", "qwen3-8b")
DEMO_DIR = f"{base.DEMO_ROOT}/coreact"
RESEARCH_DIR = f"{base.RESEARCH_ROOT}/coreact"


def family(arg: str) -> tuple[str, str]:
  """(base preset, role) of a CPU preset: "research_collect" -> ("research", "collect"),
  "research" -> ("research", "demo"), "agent" -> ("demo", "agent")."""
  if arg in RESEARCH_PRESETS:
    return "research", ("demo" if arg == "research" else arg.removeprefix("research_"))
  return "demo", arg


def _rubric_rollout(c, max_new_tokens: int, max_total_tokens: int) -> None:
  """The rubric generator as a single-turn policy: its prompt is the whole instruction."""
  c.trainer = "rubric"
  c.algorithm = "grpo"
  c.rollout.protocol = "rubric"
  c.rollout.max_turns = 1
  c.rollout.group_size = 8
  c.rollout.temperature = 1.0
  c.rollout.repetition_penalty = 1.1  # the official rubric_rl/train_grpo_qwen3_14b.sh
  c.rollout.max_new_tokens = max_new_tokens
  c.rollout.max_total_tokens = max_total_tokens
  c.rl.kl_coef = 0.005
  c.rl.kl_estimator = "low_var_kl"
  c.rl.clip_low = c.rl.clip_high = 0.2
  c.rl.entropy_coef = 0.0
  c.judge.backend = "none"


def get_config(arg: str = "demo"):
  if arg not in PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(PRESETS)}")
  demo = arg in DEMO_PRESETS + RESEARCH_PRESETS
  world, role = family(arg) if demo else ("qwen3-8b", arg)
  folder = RESEARCH_DIR if world == "research" else DEMO_DIR
  config = base.get_config(world)
  config.preset = arg
  c = config
  if demo:
    c.coreact.generator_path = f"{folder}/rubric/hf_export"
    c.coreact.generator_max_new_tokens = 96
    c.coreact.generator_max_total_tokens = 1024
  if role in ("collect", "agent"):
    # The agent: the demo SFT policy (base's demo model) with its rollout settings. Collection
    # samples at coreact.candidate_temperatures; eval is greedy unless launch/eval.py is given
    # --temperature (the code's search agent: 0.7).
    c.coreact.collect_questions = 200
    return config
  if role == "rubric_sft":
    # Full fine-tuning, not a LoRA adapter: the demo model never saw a digit or a bracket
    # ("1. [0.20]"), and its tied embeddings of those byte tokens are untrained; an adapter
    # cannot train them, so a LoRA-tuned generator writes rubrics greedily but sampled ones at
    # temperature 1 (GRPO's rollouts) come out as byte garbage that never parses (measured:
    # docs/results/coreact). The generator is then its own model, started from the agent's.
    base.warm_start_sft(c, "rubric", f"{folder}/rubric_demos.jsonl", steps=200, max_len=1024)
    return config
  if role == "demo":
    _rubric_rollout(c, max_new_tokens=96, max_total_tokens=1024)
    c.model.hf_path = f"{folder}/rubric_sft/hf_export"
    c.optimizer.lr = 1e-4              # ours (the demo RL presets' 3e-5, x3 for a 40-step run)
    c.optimizer.warmup_steps = 2
    c.optimizer.final_lr_ratio = 1.0   # constant after warm-up, as the code's trainers
    c.rl.prompts_per_step = 8
    c.rl.minibatch_size = 64           # one PPO update per step (ours)
    c.train.steps = 40
    c.train.eval_every = 10
    c.train.eval_at_start = True
    c.train.eval_batch = 32
    c.train.checkpoint_every = 10
    c.data.eval_size = 0
    return config
  # The paper's rubric generator, trained as the official rubric_rl/train_grpo_qwen3_14b.sh
  # (qwen3-14b) and rubric_rl/train_grpo.sh (qwen3-8b) train it; the paper gives no settings.
  _rubric_rollout(c, max_new_tokens=2048, max_total_tokens=8192 + 2048)
  c.model.hf_path = {"qwen3-14b": "models/Qwen3-14B", "qwen3-8b": "models/Qwen3-8B"}[arg]
  c.rl.prompts_per_step = {"qwen3-14b": 32, "qwen3-8b": 64}[arg]
  c.rl.minibatch_size = c.rl.prompts_per_step * c.rollout.group_size
  c.optimizer.lr = {"qwen3-14b": 2e-6, "qwen3-8b": 3e-6}[arg]
  c.optimizer.warmup_steps = 10
  c.optimizer.final_lr_ratio = 1.0   # constant after warm-up
  c.train.steps = 125
  c.train.checkpoint_every = 10
  c.train.eval_every = 25
  c.coreact.branches_train = "data/coreact/branches_train.jsonl"
  c.coreact.branches_dev = "data/coreact/branches_dev.jsonl"
  c.coreact.applier = "openai"
  # The code's eval: the rubric generator at temperature 0, 2048 new tokens.
  c.coreact.generator_max_new_tokens = 2048
  c.coreact.generator_max_total_tokens = 8192 + 2048
  # Memory (launch/fit.py; docs/BENCHMARKS.md "fit"): tensor parallelism over all 8 devices (40
  # heads, 8 KV heads: the 10240-slot KV rows split 8 ways), 32 KV-cache rows (2 lanes x 16),
  # and the 8192-token prompts prefilled 16 at a time.
  c.mesh.tensor = 8
  c.rollout.slots = 32
  c.rollout.prefill_rows = 16
  return config


# The sections a Co-ReAct config shares with its agent's (agent_config copies them).
SHARED_SECTIONS = ("coreact", "data", "retrieval", "judge")


def agent_config(config):
  """The config of the search agent that a Co-ReAct config's branch collection and guided eval
  run: a trainer-"rubric" config holds the rubric generator's rollout (protocol "rubric", one
  turn), so the agent's model and rollout settings come from its preset family ("agent" for the
  demo presets, base's qwen3-8b for the paper's), with this config's coreact, data, retrieval,
  judge sections and seed. Any other config is the agent's already and is returned as it is.
  (launch/collect_branches.py and launch/eval.py --agent=coreact|best_of_n call it, so every
  stage runs from configs/coreact.py:demo.)"""
  if config.trainer != "rubric":
    return config
  if config.preset in DEMO_PRESETS + RESEARCH_PRESETS:
    agent = get_config("research_agent" if family(config.preset)[0] == "research" else "agent")
  else:
    agent = base.get_config("qwen3-8b")
  with agent.unlocked():
    for section in SHARED_SECTIONS:
      agent[section] = copy.deepcopy(config[section])
    agent.seed = config.seed
  return agent
