r"""DAC (Divide and Cooperate): a searcher and a generator as two LoRA adapters on one frozen
backbone, the generator answering from the searcher's evidence or abstaining, its abstention part
of the searcher's reward (agentjax/dac/; DAC, arXiv:2606.10684). There is no public implementation:
every choice below that the paper leaves open is a config.dac field (configs/base.py), our
reading, with its alternatives one override away.

  # the demo (after `make demo`): the generator's warm start, then both roles
  python launch/dac_demos.py                     # runs/demo/dac/generator_demos.jsonl
  python launch/train.py --config=configs/dac.py:generator_sft --workdir=runs/demo/dac/generator_sft
  python launch/train.py --config=configs/dac.py:demo --workdir=runs/demo/dac
  python launch/eval.py --config=configs/dac.py:demo --workdir=runs/demo/dac   # coverage, EM, F1
  # the paper's settings
  python launch/train.py --config=configs/dac.py:qwen2.5-7b --workdir=/mnt/shared/runs/dac7b \
      --config.retrieval.url=http://10.0.0.2:8000/retrieve

Presets:
  demo           SynthWorld on a CPU, the demo RL settings of every method (configs/base.py),
                 LoRA rank 32 (alpha 32) at 3e-4 for both roles (the LoRA study's rate), the
                 generator adapter started from `generator_sft`'s PEFT export.
  generator_sft  the generator's warm start on the demo: LoRA SFT of the "generator" adapter on
                 generator demonstrations (launch/dac_demos.py: the searcher demonstrations'
                 evidence, answered when it holds the answer, abstained on when it does not).
                 An instruction-tuned Qwen follows the abstention instruction from the start;
                 the demo's from-scratch model has never seen it, and without this RL could never
                 sample an abstention (our stand-in, not the paper's).
  research       SynthWorld v2 from the research backbone (configs/base.py research):
                 both roles from the backbone, which learned the generator's reading in its SFT
                 (no generator warm start), LoRA rank 32 at 3e-4 as the demo, 2 answers per
                 evidence set, the searcher's first 12 documents as the evidence (4 hops x top
                 3); `python launch/compare.py --study=dac_research`.
  qwen2.5-7b     the paper's: AdamW (0.9, 0.999), weight decay 0.01, 500 steps, checkpoints
  qwen3-8b       every 100; searcher / generator lr 1e-6 / 1e-6 (Qwen2.5-7B-Instruct) and
                 2e-6 / 1e-5 (Qwen3-8B). Not stated by the paper, ours: LoRA rank 32 (a secondary
                 source), alpha 32, all 7 projections; GRPO per role with the IGPO presets'
                 rollout settings (16 per question, 10 turns, KL 0.001 low_var_kl, clip 0.2),
                 Search-R1 protocol and retriever.

The generator's GRPO groups (dac.generator_group): "question" by default, every answer to any
evidence set of a question in one group. Grouped per evidence set ("evidence", one override away;
the DAC study of docs/results/dac ran it), every answer in a group shares its sufficiency S, so
the z-score cancels alpha exactly (the study's alpha runs were identical) and an abstention on
insufficient evidence earns about as much as a correct answer whatever alpha is; the paper's
trade-off (abstain when alpha exceeds the generator's accuracy times the odds of sufficient
evidence) needs answers to sets of different S to share one baseline. configs/base.py has the
details.

The roles' adapters are "searcher" and "generator" (model.lora.adapters). Exports: each adapter
as a PEFT folder, {workdir}/adapters/searcher/ and {workdir}/adapters/generator/ (hf_export is off:
one merged model would hold only one role).
"""

from configs import base

PRESETS = ("demo", "generator_sft", "research", "qwen2.5-7b", "qwen3-8b")
DEMO_DIR = f"{base.DEMO_ROOT}/dac"  # generator demos, the generator warm start
GENERATOR_DEMOS = f"{DEMO_DIR}/generator_demos.jsonl"
GENERATOR_INIT = f"{DEMO_DIR}/generator_sft/adapters/generator"
LORA_LR = 3e-4  # the LoRA study's demo rate (docs/results/lora)


def get_config(arg: str = "demo"):
  if arg not in PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(PRESETS)}")
  config = base.get_config("demo" if arg in ("demo", "generator_sft") else arg)
  config.preset = arg
  config.trainer = "dac"
  config.algorithm = "grpo"
  c = config
  c.model.lora.adapters = "searcher,generator"
  c.model.lora.rank = 32
  c.model.lora.alpha = 32.0
  c.train.export_hf = False
  if arg in ("demo", "generator_sft"):
    # The demo's tokenizer was trained on SynthWorld text, where "insufficient evidence" never
    # occurs: it splits into byte tokens whose output embeddings the from-scratch model never
    # trained and a LoRA cannot sharpen (greedy decoding writes it, sampling at temperature 1
    # garbles it, so no sampled abstention would ever count). These words are all frequent there.
    c.dac.abstain_text = "I need to search"
  if arg == "generator_sft":
    # LoRA SFT of the generator alone (trainer sft trains the first adapter) on prompts the DAC
    # rollout builds (protocol answer_only: the prompt is the generator's whole instruction).
    base.warm_start_sft(c, "answer_only", GENERATOR_DEMOS, steps=400, max_len=512)
    c.model.lora.adapters = "generator"
    return config
  if arg == "research":
    # Both roles start from the research backbone (adapters at B = 0): its SFT corpus held the
    # generator's evidence rows (the generator prompt, up to dac.max_evidence_docs = 8 passages,
    # "insufficient evidence" when the gold passage is missing), so it needs no warm start
    # (gate: accuracy 0.785 on sufficient sets, abstention 0.999 on insufficient ones).
    c.optimizer.lr = LORA_LR
    c.rl.pack_tokens = 0  # DAC's two roles score and update padded rows (train/config.py)
    # Every document of the longest chain: 4 hops x top k (top 3 on the first research backbone: at
    # 8 the last hop's passage of a 4-hop question was cut, 4-hop F1 0.00 before RL, dev F1 0.492;
    # at 12 dev F1 0.561, docs/results/dac_research/README.md). With top 2 (the shipped
    # backbone) that is 8, the SFT corpus' own bound.
    c.dac.max_evidence_docs = 4 * c.retrieval.topk
    c.dac.generator_samples = 2  # the demo's: a step about twice a monolithic one on a CPU
    c.dac.generator_max_new_tokens = 32
    c.dac.generator_max_total_tokens = 768  # the corpus' evidence rows: 431 tokens at most
    return config
  if arg == "demo":
    c.optimizer.lr = LORA_LR
    c.model.lora.init = f"generator={GENERATOR_INIT}"
    # Two answers per evidence set (the generator's GRPO group; base.py's default is 4): keeps a
    # demo step about twice a monolithic one on a CPU.
    c.dac.generator_samples = 2
    c.dac.max_evidence_docs = 4
    c.dac.generator_max_new_tokens = 32
    c.dac.generator_max_total_tokens = 768
    return config
  # The paper's training settings (DAC, arXiv:2606.10684, appendix on training details: betas
  # (0.9, 0.999), weight decay 0.01, 500 steps, checkpoints every 100, each role's learning rate);
  # everything else is the IGPO presets' (base._paper).
  c.optimizer.b2 = 0.999
  c.optimizer.weight_decay = 0.01
  c.train.steps = 500
  c.train.checkpoint_every = 100
  c.train.eval_every = 100
  rates = {"qwen2.5-7b": (1e-6, 1e-6), "qwen3-8b": (2e-6, 1e-5)}[arg]
  c.optimizer.lr = rates[0]
  c.model.lora.lr = f"searcher={rates[0]:g},generator={rates[1]:g}"
  c.dac.generator_samples = 4
  c.dac.max_evidence_docs = 10
  c.dac.generator_max_new_tokens = 256
  c.dac.generator_max_total_tokens = 8192
  # Memory (launch/fit.py; docs/BENCHMARKS.md "fit"): Qwen3-8B's 8 KV heads make an 8192-slot
  # row twice Qwen2.5-7B's, so half base._paper's KV-cache rows (2 lanes x 64).
  if arg == "qwen3-8b":
    c.rollout.slots = 128
  return config
