r"""PPO with a learned critic: a value model (Qwen trunk + scalar head) and GAE advantages.

  python launch/train.py --config=configs/ppo.py:demo --workdir=runs/demo/ppo
  python launch/train.py --config=configs/ppo.py:demo-turn --workdir=runs/demo/ppo_turn
  python launch/train.py --config=configs/ppo.py:qwen2.5-7b --workdir=/mnt/shared/runs/ppo-7b

The estimator (config.algorithm, agentjax/rl/advantages.py):
  ppo         token-level GAE over the sampled tokens (observations skipped, not counted as
              steps), each turn's reward on its last sampled token (verl's "gae": the CW-GRPO
              code's PPO script; its MT-PPO script runs it on its judge's per-round rewards,
              which agentjax does not compute: ppo.ig_weight puts IGPO's IG there instead. The
              IGPO code has no PPO script: its paper's Table 2 PPO ran in its verl, whose GAE
              is this one)
  ppo_turn    turn-level GAE: one value per turn (at its first sampled token), every token of a
              turn takes the turn's advantage (AReaL's gae_timestep_unit="turn")
  ppo_round   the CW-GRPO code's "gae-round" (compute_gae_round_advantage_return, which its
              R3-RAG script runs): token-level GAE with each turn its own episode
Turn rewards: the outcome on the answer turn; with ppo.ig_weight > 0 also IGPO's information
gain on the earlier turns ("PPO + IG turn rewards": demo-ig, and demo-round, whose turns learn
from their own rewards only). A turn cut off before its first sampled token gives its reward to
the previous action (verl drops it). The critic
(agentjax/train/critic.py): the policy's initial weights and a fresh head, its own AdamW
(critic.lr), verl's clipped value loss (ppo.value_clip 0.5); with LoRA a "value" adapter + head
on the shared backbone. Checkpoints hold both models; the KL reference is the frozen initial
policy; a finished run also writes {workdir}/critic_export (a Qwen2ForTokenClassification folder).

Presets:
  demo, demo-turn, demo-round, demo-ig   the demo RL settings of every method (configs/base.py),
      the critic from the policy's start (the demo's SFT export),
      critic lr 1e-4 (ours: 10x verl's 1e-5 for a from-scratch 1M-parameter model that trains 30
      steps; the policy's demo lr is 3e-5), no critic-only warm-up (verl's 0: every method of
      the comparison updates its policy at every step).
  research, research-ig   the same on SynthWorld v2 and the research backbone (configs/base.py);
      research-ig with IGPO's information gain as the earlier turns' rewards.
  qwen2.5-3b, qwen2.5-7b, qwen3-8b   the IGPO paper's Table 2 comparison "under the same
      configuration": everything as configs/igpo.py's preset except the estimator (the igpo
      preset's group std settings are unused by PPO); the critic as verl's defaults, which the
      IGPO code's config carries (critic lr 1e-5, cliprange_value 0.5, gamma = lam = 1,
      critic_warmup 0). The paper states no critic setting: these are the code's defaults.
      The turn-level variants are one override away (--config.algorithm=ppo_turn).
  cw-qwen3-8b   the CW-GRPO code's PPO script (run_qwen3-8b_search_multiturn_ppo.sh): 128
      prompts x 1 rollout, minibatch 32, actor lr 1e-6 (warm-up int(0.285 * 200) = 56 steps),
      critic lr 1e-5 (warm-up int(0.015 * 200) = 3 steps), both constant after it, KL loss 0.001
      low_var_kl, EM outcome at the last token, gamma = lam = 1, 200 steps; the rest as
      configs/cw_grpo.py:qwen3-8b without its judge.
"""

from configs import base, cw_grpo, igpo

DEMO = {"demo": "ppo", "demo-turn": "ppo_turn", "demo-round": "ppo_round", "demo-ig": "ppo"}
RESEARCH = {"research": "ppo", "research-ig": "ppo"}
PAPER = ("qwen2.5-3b", "qwen2.5-7b", "qwen3-8b")
PRESETS = tuple(DEMO) + tuple(RESEARCH) + PAPER + ("cw-qwen3-8b",)


def get_config(arg: str = "demo"):
  if arg not in PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(PRESETS)}")
  if arg in DEMO or arg in RESEARCH:
    config = base.get_config("demo" if arg in DEMO else "research")
    config.algorithm = {**DEMO, **RESEARCH}[arg]
    config.critic.lr = 1e-4
    if arg in ("demo-ig", "demo-round", "research-ig"):  # gae-round: turns learn from their own
      config.ppo.ig_weight = 1.0
  elif arg in PAPER:
    config = igpo.get_config(arg)
    config.algorithm = "ppo"
  else:
    config = cw_grpo.get_config("qwen3-8b")
    config.algorithm = "ppo"
    config.judge.backend = "none"
    config.rollout.group_size = 1
    config.rl.prompts_per_step = 128
    config.rl.minibatch_size = 32
    config.critic.lr = 1e-5
    config.critic.lr_warmup_steps = 3   # verl: int(0.015 * 200)
    config.critic.final_lr_ratio = 1.0
  config.preset = arg
  return config
