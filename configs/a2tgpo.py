r"""A²TGPO (arXiv 2605.06200; code github.com/CuSO4-Chen/A-TGPO): IGPO's information gain
normalized per (question, turn index), accumulated with a discount and divided by the square root
of the number of accumulated terms, plus the group-normalized outcome
(agentjax/methods/a2tgpo.py).

WHICH PARTS ARE IN:
  (i)   turn-group normalization ................ IN  (advantage estimator "a2tgpo")
  (ii)  variance-rescaled discounted accumulation IN  (same)
  (iii) adaptive turn-level clipping ............ IN  (the estimator's per-token loss input
        "clip_scale": each token's ratio clipped to [1 - c clip_low, 1 + c clip_high], c its
        turn's 1 + beta (2 sigmoid(g) - 1); a2tgpo.adaptive_clip=False: the fixed range). The
        paper preset runs it with the official loss's turn-level importance ratio
        (rl.loss="gspo_turn") and the official clip range.

  python launch/train.py --config=configs/a2tgpo.py:demo --workdir=runs/demo/a2tgpo
  python launch/train.py --config=configs/a2tgpo.py:qwen3-4b --workdir=/mnt/shared/runs/a2tgpo-4b \
      --config.model.hf_path=/models/Qwen3-4B --config.retrieval.url=http://10.0.0.2:8000/retrieve

Presets:
  demo      igpo's demo (configs/igpo.py:demo: the tiny model on SynthWorld, PPO loss, clip 0.2)
            with algorithm "a2tgpo" and its defaults below.
  research  igpo's research preset (SynthWorld v2, the research backbone; configs/base.py) the
            same way.
  qwen3-4b  the official training script (ATGPO_multihop_qwen3_4B): Qwen3-4B, 64 prompts x 16
            rollouts, PPO minibatches of 8 prompts (128 trajectories), lr 1e-6, no KL, EM reward,
            gamma 1, alpha 0.3, the turn-level ratio clipped to [1 - 3e-3, 1 + 4e-3], prompt 2000 +
            response 6192 tokens, the code's group std sqrt(population var + 1e-8). The rest is the
            base qwen3-8b preset's (our reading: the script's ppo_trainer_dr.yaml is not public;
            max turns 10, NQ + HotpotQA training data, a local retriever instead of its Bing
            search, token-mean aggregation (verl's default), 300 steps instead of 5 epochs).

The A²TGPO settings (config.a2tgpo; defaults and "our reading" notes in agentjax/methods/
a2tgpo.py): gamma, alpha, rescale ("sqrt_terms" | "sqrt_discounted" | "none"), scale_by_std,
clip_beta (the clip scale's half-width), adaptive_clip ((iii) on or off).
"""

import ml_collections

from configs import base, igpo

PRESETS = ("demo", "research", "qwen3-4b")


def get_config(arg: str = "demo"):
  if arg not in PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(PRESETS)}")
  config = igpo.get_config(arg) if arg in ("demo", "research") else base.get_config("qwen3-8b")
  config.preset = arg
  config.algorithm = "a2tgpo"
  config.a2tgpo = ml_collections.ConfigDict(dict(
      gamma=1.0,            # IGPO_GAMMA
      alpha=0.3,            # IGPO_ADV_RESCALE_ALPHA
      rescale="sqrt_terms",  # D / sqrt(accumulated terms): the paper and the code
      scale_by_std=True,    # norm_adv_by_std_in_grpo
      clip_beta=0.3,        # (iii)'s scale 1 + 0.3 (2 sigmoid(g) - 1) of the clip range
      adaptive_clip=True,   # (iii) applied (the paper's method; False: the fixed range)
  ))
  if arg == "qwen3-4b":
    config.model.hf_path = "models/Qwen3-4B"
    config.rollout.group_size = 16
    config.rl.prompts_per_step = 64
    config.rl.minibatch_size = 128
    config.rl.kl_coef = 0.0
    config.rl.reward_metric = "em"
    config.rl.loss = "gspo_turn"
    config.rl.clip_low = 3e-3
    config.rl.clip_high = 4e-3
    config.rl.aggregation = "token-mean"
    config.rl.std_estimator = "sqrt_var_eps"
    config.rl.std_eps = 1e-8
    config.rollout.max_total_tokens = 2000 + 6192
    config.optimizer.lr = 1e-6
  return config
