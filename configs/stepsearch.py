r"""StepSearch (arXiv 2505.15107; agentjax/methods/stepsearch.py, docs/methods/stepsearch.md): PPO
with a critic whose search steps earn the information they retrieved about the gold documents,
less a penalty for documents retrieved before ("StePPO").

  python launch/train.py --config=configs/stepsearch.py:demo --workdir=runs/demo/stepsearch
  python launch/train.py --config=configs/stepsearch.py:qwen2.5-3b \
      --workdir=/mnt/shared/runs/stepsearch-3b --config.retrieval.url=http://10.0.0.2:8000/retrieve

Presets:
  demo, research   configs/ppo.py's demo and research presets (the critic from the policy's
                   start at 1e-4) with the estimator "stepsearch": the gold documents are
                   SynthWorld's hop chain, read from the corpus.
  qwen2.5-3b       the official code's 3B script (train.sh, verl's ppo_trainer.yaml; the paper's
                   numbers are its Table 1 at Qwen2.5-3B): 128 prompts x 1 rollout a step,
                   minibatches of 32, actor and critic lr 5e-7 (warm-up 0.285 and 0.05 of the
                   1120 steps, then constant), clip 0.2, entropy 0.001, one PPO epoch, gamma =
                   lam = 1, whitened advantages, 5 search turns (+ the answer turn), top-3
                   documents, F1 outcome, -1 without an answer, step scale 1.6 (the code's
                   effective value). The code puts its 0.001 KL in the reward; agentjax's KL is a
                   loss term (rl.kl_coef 0.001, k1): ours. Its search-key reward is not here
                   (agentjax/methods/stepsearch.py says why). The gold documents come from the
                   records' "gold_documents" (MuSiQue's supporting paragraphs).
"""

from configs import base, ppo

PRESETS = ("demo", "research", "qwen2.5-3b")
# StepSearch's own section (agentjax/methods/stepsearch.py DEFAULTS): the step rewards' scale
# (the code's effective 1.6; its intended 0.6) and the GAE settings.
STEPSEARCH = {"step_scale": 1.6, "gamma": 1.0, "lam": 1.0, "whiten": True}


def get_config(arg: str = "demo"):
  if arg not in PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(PRESETS)}")
  if arg in ("demo", "research"):
    config = ppo.get_config(arg)
  else:
    config = base.get_config("qwen2.5-3b")
    c = config
    c.rollout.group_size = 1
    c.rl.prompts_per_step = 128
    c.rl.minibatch_size = 32
    c.rl.ppo_epochs = 1
    c.rl.clip_low = c.rl.clip_high = 0.2
    c.rl.entropy_coef = 0.001
    c.rl.kl_coef = 0.001
    c.rl.kl_estimator = "k1"
    c.rl.reward_metric = "f1"
    c.rl.penalize_format = True
    c.rl.format_penalty = -1.0
    c.rollout.max_turns = 6
    c.retrieval.topk = 3
    c.train.steps = 1120
    c.optimizer.lr = 5e-7
    c.optimizer.warmup_steps = int(0.285 * 1120)
    c.optimizer.final_lr_ratio = 1.0
    c.critic.lr = 5e-7
    c.critic.lr_warmup_steps = int(0.05 * 1120)
    c.critic.final_lr_ratio = 1.0
  import ml_collections
  config.stepsearch = ml_collections.ConfigDict(dict(STEPSEARCH))
  config.algorithm = "stepsearch"
  config.preset = arg
  return config
