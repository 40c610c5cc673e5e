r"""Base config of every run: model, data, retrieval, rollouts, RL, optimizer, schedule, mesh.

The algorithm configs (igpo.py, grpo.py, drgrpo.py, rloo.py, reinforcepp.py, gspo.py, sft.py) start
from `get_config(arg)` and change what their method needs. The part after the colon picks a preset:

  demo         the tiny model on SynthWorld with local BM25, CPU, minutes (what `make demo` runs)
  research     SynthWorld v2 (1-4 hops, distractors) and the research backbone (4 layers, hidden
               256, from scratch on a mixed SFT corpus: launch/backbone.py), the run protocol's
               settings: constant lr after warm-up, 1000 eval questions
  qwen2.5-3b   the IGPO paper's settings: 32 prompts x 16 rollouts, lr 1e-6, KL 0.001
  qwen2.5-7b   (low_var_kl), clip 0.2, max 10 turns, temperature 1.0, gamma 1; NQ + HotpotQA
  qwen3-8b     train, the seven FlashRAG benchmarks for eval, a Search-R1 HTTP retriever

  python launch/train.py --config=configs/igpo.py:demo --workdir=runs/demo/igpo
  python launch/train.py --config=configs/igpo.py:qwen2.5-7b --workdir=/mnt/shared/runs/igpo7b \
      --config.model.hf_path=/models/Qwen2.5-7B-Instruct --config.retrieval.url=http://10.0.0.2:8000/retrieve

Any field can be overridden with --config.a.b=value; `agentjax.train.config.validate` checks the
whole config (naming the field) before anything compiles.
"""

import ml_collections

RUN_PRESETS = ("demo", "research", "qwen2.5-3b", "qwen2.5-7b", "qwen3-8b")
# Search-R1's seven evaluation benchmarks, each on its own split (agentjax.data.searchqa
# BENCHMARK_LISTS: test, or dev where FlashRAG has no test split).
FLASHRAG = "flashrag"
DEMO_ROOT = "runs/demo"  # where `make demo` writes SynthWorld, the tokenizer and the workdirs
RESEARCH_ROOT = "runs/research"  # SynthWorld v2, the backbone (launch/backbone.py), the studies


def get_config(arg: str = "demo") -> ml_collections.ConfigDict:
  if arg not in RUN_PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {list(RUN_PRESETS)}")
  c = ml_collections.ConfigDict()
  c.preset = arg
  c.seed = 0
  c.trainer = "rl"        # rl | sft | dac (two LoRA roles: configs/dac.py)
  c.algorithm = "grpo"    # advantage estimator, agentjax.rl.advantages.ADVANTAGE_ESTIMATORS

  # ---- model: a Hugging Face folder (weights + tokenizer), or a shape preset trained from scratch.
  c.model = ml_collections.ConfigDict()
  c.model.preset = ""           # agentjax.models.qwen PRESETS; used when hf_path is empty
  c.model.hf_path = ""          # HF folder: config.json, safetensors, tokenizer
  c.model.tokenizer_path = ""   # default: hf_path
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.remat_policy = "none"  # none | full | dots | dots_no_batch
  # Attention (agentjax/models/attention.py): auto (cudnn on GPU, splash on TPU, blockwise
  # elsewhere) | xla (materialized scores, quadratic memory) | blockwise | cudnn | splash;
  # attention_block: the blockwise query/key block (its score memory ~ block^2 per head).
  c.model.attention = "auto"
  c.model.attention_block = 512
  # Shape changes to a preset trained from scratch (0 keeps the preset's; ignored with hf_path).
  c.model.shape = ml_collections.ConfigDict(dict(
      hidden_size=0, intermediate_size=0, num_layers=0, num_heads=0, num_kv_heads=0, head_dim=0))
  # LoRA (agentjax/models/lora.py): named low-rank adapters on the frozen backbone. Gradients,
  # optimizer state and checkpoints then hold the adapters only; the KL reference is the backbone
  # itself (no second copy). A finished run writes each adapter as a PEFT folder
  # ({workdir}/adapters/<name>/) and hf_export as the backbone with the policy adapter merged.
  c.model.lora = ml_collections.ConfigDict()
  c.model.lora.adapters = ""     # "": full fine-tuning; "policy", or a comma list (first: the policy)
  c.model.lora.rank = 32
  # scale = alpha / rank (PEFT's). 0: alpha = rank (scale 1, so a learning rate keeps its meaning
  # across ranks; verl's LoRA recipes use alpha = rank = 32). Our reading: no paper here fixes it.
  c.model.lora.alpha = 0.0
  c.model.lora.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
  # How the sampler applies the adapter in its token loop: "merge" (into a copy of the kernels
  # once per rollout; the loop is the bare model's), "unmerged" (low-rank products every step, no
  # copy), "auto": merge on CPU with float32 kernels (the decode layout copies them anyway),
  # unmerged elsewhere (agentjax/models/lora.py LoraSpec.decode_mode; docs/BENCHMARKS.md, LoRA).
  c.model.lora.decode = "auto"
  # Per-adapter learning rates, "name=lr,..." (others: optimizer.lr), e.g. DAC's two roles.
  c.model.lora.lr = ""
  # Start adapters from PEFT folders, "name=path,..." (the rank, targets and shapes are checked).
  c.model.lora.init = ""

  # ---- data: benchmarks: FlashRAG JSONL under manual_dir, built by tfds into data_dir
  # (array_record).
  c.data = ml_collections.ConfigDict()
  # Entries: benchmark names, or paths to your own question files (.jsonl, .json, .parquet) or
  # folders of split files (docs/guides/data.md); a file is all of its split.
  c.data.train = "synthworld"   # comma-separated benchmarks mixed for training
  c.data.eval = "synthworld"    # comma-separated benchmarks; the first one is evaluated in training
  c.data.manual_dir = f"{DEMO_ROOT}/synthworld"
  c.data.data_dir = f"{DEMO_ROOT}/tfds"
  c.data.eval_split = "dev"
  c.data.eval_size = 0          # questions evaluated per benchmark (0: the whole split)

  # ---- retrieval: bm25 (local corpus), http (a Search-R1 retriever server), dense (an index
  # of launch/index.py searched in-process on the training mesh's devices), or your own (plugins).
  c.retrieval = ml_collections.ConfigDict()
  c.retrieval.backend = "bm25"
  c.retrieval.corpus_path = f"{DEMO_ROOT}/synthworld/corpus.jsonl"
  # bm25: the index cache (default: next to the corpus' hash); dense: the index folder
  c.retrieval.index_dir = ""
  c.retrieval.query_prefix = "query: "  # dense: before each query (e5's; bge: its instruction)
  c.retrieval.recall_target = 0.0       # dense: approximate search at this recall; 0: exact
  c.retrieval.devices = 0               # dense: the index on the first N devices; 0: all
  c.retrieval.url = ""
  c.retrieval.timeout_s = 30.0
  # Your own backend (docs/guides/data.md): modules (names or .py files, comma-separated) whose
  # import calls agentjax.retrieval.register_backend, imported when `backend` is not bm25, http or
  # dense; that backend's factory gets backend_kwargs, a JSON object ("": none).
  c.retrieval.plugins = ""
  c.retrieval.backend_kwargs = ""
  c.retrieval.topk = 3
  # A failed query is an error observation; a retriever that fails more than max_failure_rate of
  # a step's queries for max_failed_steps steps in a row is down: checkpoint and stop (exit != 0).
  c.retrieval.max_failure_rate = 0.5
  c.retrieval.max_failed_steps = 3   # 0: never stop for the retriever

  # ---- rollouts
  c.rollout = ml_collections.ConfigDict()
  c.rollout.protocol = "search_r1"   # search_r1 | tool_call
  c.rollout.group_size = 5
  c.rollout.max_turns = 4
  c.rollout.max_new_tokens = 256     # per turn
  c.rollout.max_obs_tokens = 512     # per observation
  c.rollout.max_total_tokens = 4096  # per trajectory, prompt included (KV cache budget)
  c.rollout.temperature = 1.0
  c.rollout.top_k = 0
  c.rollout.top_p = 1.0
  # transformers' repetition penalty (agentjax/sampling/sample.py SamplingParams) over each
  # trajectory's context and generated tokens, in training and eval rollouts; 1.0 is off. The
  # sampler's log-probs stay the model's own (no penalty), as the trainer recomputes them.
  c.rollout.repetition_penalty = 1.0
  # A thinking budget: a <think> block open this many tokens gets </think> as its next token
  # (the forced token keeps the model's own log-prob); 0 is off. The official Co-ReAct
  # generator's max_think_tokens (1500 at eval); the tokenizer must hold both tags as one token.
  c.rollout.max_think_tokens = 0
  c.rollout.use_chat_template = True
  # The rollout engine (agentjax/agent/slots.py): "slots" keeps the decode batch full (each
  # prompt prefilled once, freed slots refilled in flight, one lane's search overlapped with the
  # other lanes' decoding); "turns": every turn waits for the batch's slowest row (the
  # turn-synchronous engine verl and Search-R1 run).
  c.rollout.engine = "slots"
  c.rollout.slots = 0                # decode slots (KV-cache rows); 0: one per trajectory
  c.rollout.lanes = 2                # slot groups alternating on the device (1: no overlap)
  # A lane's decode call returns to the host once this share of its rows stopped: smaller leaves
  # fewer rows idle within a call, but makes more (and smaller) decode and retriever calls.
  c.rollout.refill_fraction = 0.125
  # Decode attends over the smallest window of kv_window_min x 2^k cache slots that covers its
  # rows' live context, not the whole max_total_tokens budget (each step's cost follows the
  # context, at a few programs per call shape). 0: every step reads the whole cache.
  c.rollout.kv_window_min = 256
  # Once no trajectory waits, a lane of N slots compacts its live rows into N / f^k slots
  # (f = compact_factor; 0: never): the sizes N, N/2, N/4, ..., 1 by default. A larger f makes
  # fewer programs (each size compiles its own decode, gathers and stores) and computes up to f
  # times the live rows. Our reading: vLLM captures its decode graphs at a fixed list of batch
  # sizes (cudagraph_capture_sizes) for the same reason.
  c.rollout.compact_factor = 2
  # A lane's feeds, stores and refills of k rows run on MIN_ROWS * f^j >= k rows (f: this; at
  # most the lane's size; 0: always the whole lane): f bounds their programs (each row count
  # compiles a gather, a feed per key window, a scatter, a store) at up to f times the rows fed.
  c.rollout.row_bucket_factor = 2
  # The slot engine prefills the prompts this many at a time and holds only their caches (the
  # next chunk when its first trajectory takes a slot); 0: all at once. Our reading: vLLM (verl's
  # rollout) bounds a prefill by tokens per batch (max_num_batched_tokens); rows are simpler to
  # reason about with one prompt per question.
  c.rollout.prefill_rows = 32
  # Before step 1, run every program the slot engine's rollouts can meet (training and eval) once
  # on inputs that change nothing (RolloutEngine.warm_up: lane sizes x key windows, row buckets,
  # the prompt cache at the run's longest prompt): the run compiles them up front, not at the
  # step whose schedule first meets one (on a pod, every process stalls then), and none after
  # step 1. Off here: on the fine ladders below (a paper preset's: 151 programs for training's
  # rollouts, as many for eval's; `python launch/precompile.py` lists them) it compiles about
  # twice what a run meets; on in the demo and research presets, whose coarse ladders make
  # ~45 (docs/BENCHMARKS.md "compiles"). Our reading: JetStream and vLLM warm their decode
  # shapes up before serving.
  c.rollout.warm_up = False
  # Asynchronous RL (train.async_steps >= 1): a rollout in flight when the trainer publishes newer
  # parameters "off": ends with those it started with; "continue": samples the rest with the
  # newest (read at each turn / decode call; its tokens tagged with their versions, the KV cache
  # of its context kept: PipelineRL's in-flight update); "restart": starts again with them.
  # Our reading (PipelineRL's in-flight update is "continue"); "off", the synchronous behaviour, is
  # the default.
  c.rollout.partial = "off"

  # ---- RL
  c.rl = ml_collections.ConfigDict()
  c.rl.prompts_per_step = 8          # questions per step; B = prompts_per_step * group_size
  c.rl.minibatch_size = 16           # trajectories per PPO update
  # Trajectories per device per forward/backward (scoring, updates, critic), like verl's
  # ppo_micro_batch_size_per_gpu; one optimizer step per minibatch either way. 0: one pass.
  c.rl.micro_batch_size = 0
  # Padding-free batches (agentjax/train/packing.py): scoring and the policy's updates run on rows
  # of this many tokens, several trajectories side by side (attention kept within each), instead
  # of one trajectory per row padded to the longest: multi-turn lengths differ by 10x, so most of
  # a padded pass is padding (metrics packing_efficiency vs padded_efficiency). A multiple of 128;
  # rollout.max_total_tokens keeps a packed row no wider than a padded one (a longer trajectory
  # widens its batch's rows to pack_tokens x 2^k). With it, micro_batch_size counts packed rows
  # in scoring. 0: padded rows. The critic's passes stay padded.
  c.rl.pack_tokens = 0
  # Packed row counts are rounded up on a ladder of this many sizes per power of two: each
  # count met compiles its own scoring and update programs; fewer steps, fewer programs and up
  # to 2^(1 / steps) - 1 of the rows padding (8: 9%; 2: 41%). Our reading (no paper sets it).
  c.rl.pack_rows_per_octave = 8
  # Scoring and updates run on the batch cut to its longest trajectory (rounded up to 128
  # slots: a width per 128 met, each its own programs). False: every step keeps the KV cache's
  # width, one set of programs; with rl.pack_tokens the model computes the packed rows either
  # way and the width costs only the index arithmetic; padded rows compute the whole width.
  c.rl.trim_batches = True
  c.rl.ppo_epochs = 1
  c.rl.reward_metric = "f1"          # f1 | em
  c.rl.format_penalty = 0.0          # reward of a trajectory with a format error (IGPO: -2)
  c.rl.penalize_format = False
  c.rl.gamma = 1.0                   # IGPO turn discount
  c.rl.igpo_norm = "joint"           # joint | separate
  c.rl.igpo_ig_weight = 1.0          # IGPO's turn rewards: 0 = outcome-only ablation
  c.rl.igpo_outcome_weight = 1.0     # IGPO's answer-turn reward: 0 = IG-only ablation
  # Group std of the estimators that divide by one (grpo, gspo, igpo, cw_grpo; reinforce++'s batch
  # whitening takes its ddof): "population" (ddof 0) + std_eps, "unbiased" (ddof 1) + std_eps
  # (verl: the Search-R1 / CW-GRPO code), "sqrt_var_eps" sqrt(population var + std_eps) (the
  # official IGPO code, std_eps 1e-8). The demo keeps population + 1e-6; the paper presets follow
  # each paper's code (below and in igpo.py).
  c.rl.std_estimator = "population"
  c.rl.std_eps = 1e-6
  # Run the ground-truth probes for every algorithm, not only IGPO (metrics only: ig_mean and
  # gt_entropy_reduction for a GRPO run; costs ~25% more scoring).
  c.rl.probe_all = False
  # log_prob | prob: IGPO's IG as a difference of mean log-probs (the official train.sh) or of
  # probabilities (the paper's §3.2); see configs/igpo.py.
  c.rl.ig_mode = "log_prob"
  # How the probe's gold answer is tokenized after the template's "<answer> " (rl/info_gain.py
  # PROBE_TOKENS): "natural", as the model writes it; "split", the head and the gold encoded
  # apart (a lone-space token, then the gold without its leading space: what the studies before
  # this default ran; set it to reproduce them). The demo re-checked with "natural" from the same
  # SFT export kept its gain and time (dev F1 +0.043, 4.2 paired s.e., RL 228 s; "split" +0.040,
  # 4.3 s.e., 230 s: docs/BENCHMARKS.md "demo"), so "natural" is the default.
  c.rl.ig_probe_tokens = "natural"
  # The probes' width: the longest probe (template + gold) rounded up to a multiple of this. Each
  # width the batches meet compiles the scoring pass again; a larger multiple makes fewer widths
  # (one, once it holds the longest gold) and scores more padding per turn boundary.
  c.rl.probe_width_multiple = 8
  c.rl.loss = "ppo"                  # ppo | gspo (agentjax.rl.losses.POLICY_LOSSES)
  # The sampler-vs-trainer gap (agentjax/rl/offpolicy.py): every step logs mismatch/* (the
  # sampler's log-probs against the scoring pass); a correction weights each token's
  # policy-gradient term: "none" (on-policy PPO), "tis" (min(pi_old / pi_sampler, cap): verl's
  # truncated importance sampling, cap 2 there), "decoupled" (AReaL's decoupled PPO: the weight,
  # tokens above the cap dropped). Ours to default off: on CPU in float32 the gap is ~0.
  c.rl.off_policy_correction = "none"
  c.rl.off_policy_cap = 2.0
  c.rl.clip_low = 0.2
  c.rl.clip_high = 0.2
  c.rl.kl_coef = 0.001
  c.rl.kl_estimator = "low_var_kl"
  c.rl.entropy_coef = 0.0
  c.rl.aggregation = "token-mean"
  c.rl.chunk = 256                   # vocab-chunked log-prob computation (tokens per chunk)

  # ---- PPO with a learned critic (algorithm = ppo | ppo_turn | ppo_round; configs/ppo.py,
  # agentjax/train/critic.py). Defaults are verl's, which the CW-GRPO and IGPO code run.
  c.ppo = ml_collections.ConfigDict()
  c.ppo.gamma = 1.0                  # GAE discount (verl / CW-GRPO / IGPO code: 1.0)
  c.ppo.lam = 1.0                    # GAE lambda (the same)
  c.ppo.whiten = True                # advantages whitened over the batch's sampled tokens (verl)
  # Turn rewards: the outcome on the answer turn (outcome_weight) and IGPO's information gain on
  # the earlier turns (ig_weight > 0 runs the ground-truth probes): "PPO + IG turn rewards".
  c.ppo.ig_weight = 0.0
  c.ppo.outcome_weight = 1.0
  # Value loss 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old +- value_clip (verl's
  # critic.cliprange_value 0.5; 0: unclipped), aggregated by rl.aggregation, times value_coef.
  # The critic has its own parameters and optimizer, so value_coef only scales its gradient
  # against critic.clip_norm and Adam's eps (verl has none: 1.0).
  c.ppo.value_clip = 0.5
  c.ppo.value_coef = 1.0

  # ---- the critic of the PPO estimators: a Qwen trunk + a scalar head (models/qwen/value.py)
  c.critic = ml_collections.ConfigDict()
  # "policy": the policy's initial weights and a fresh head (verl's critic path = the actor's);
  # with model.lora.adapters a fresh "value" LoRA adapter + head on the shared frozen backbone
  # instead (the bare backbone: a policy adapter started from model.lora.init is not copied).
  # Or a Hugging Face folder: a *ForTokenClassification (num_labels 1) checkpoint loads its head,
  # a causal LM gets a fresh one (full fine-tuning of the critic).
  c.critic.init = "policy"
  c.critic.lr = 1e-5                 # verl's critic.optim.lr (the CW-GRPO scripts')
  c.critic.lr_warmup_steps = 0       # RL steps of linear lr warm-up
  c.critic.final_lr_ratio = 1.0      # 1: constant after warm-up (verl's critic schedule)
  c.critic.weight_decay = 0.01
  c.critic.clip_norm = 1.0
  # RL steps at the start in which only the critic trains. verl's trainer.critic_warmup = N
  # gives N - 1 such steps (it compares N with a 1-based step); its default 0 is none in both.
  c.critic.warmup_steps = 0

  # ---- CW-GRPO's contribution weights (agentjax.rl.advantages.contribution_weighted_advantages)
  c.cw = ml_collections.ConfigDict()
  # Weights over a judged trajectory's rounds: softmax(gamma * c) over its non-answer rounds when
  # gamma < inf_threshold, else the official code's "infinite" branch c / max(sum c, 1e-6), whose
  # sum also counts the answer round's c (the code scores it too). The code reads gamma >= 10 as
  # infinite; its script runs gamma = 100.
  c.cw.gamma = 100.0
  c.cw.inf_threshold = 10.0
  # A correct trajectory (A > 0) whose every contribution is 0, in the infinite branch: "zero"
  # (the code: its non-answer rounds get advantage 0, only the answer round keeps A) or "uniform"
  # (every round keeps A, the softmax's limit). Counted as cw/fallback_rate.
  c.cw.all_zero_fallback = "zero"

  # ---- the judge (agentjax.judge): per-round retrieval / thinking verdicts for CW-GRPO
  c.judge = ml_collections.ConfigDict()
  c.judge.backend = "none"           # none | openai | local | oracle
  c.judge.prompt_path = ""           # "" = agentjax/judge/prompts/cw_grpo.md (the paper's criteria)
  # openai: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, launch/serve.py, ...)
  c.judge.base_url = "http://127.0.0.1:8001/v1"
  c.judge.model = "gpt-oss-120b"
  c.judge.api_key_env = "OPENAI_API_KEY"   # environment variable holding the key ("EMPTY" if unset)
  c.judge.temperature = 0.0
  # The judge's reply (its analysis and the JSON object); 0: not sent, the server's own limit
  # applies (the official code sends none: a reasoning judge such as gpt-oss counts its
  # reasoning tokens in max_tokens, and a cut reply is a failed round).
  c.judge.max_tokens = 0
  c.judge.max_concurrency = 64       # requests in flight (the code's pool: 64; its script: 128)
  c.judge.timeout_s = 120.0          # per request
  c.judge.max_retries = 3            # attempts after the first, with exponential backoff
  c.judge.retry_backoff_s = 1.0
  # local: a Flax Qwen judge from a Hugging Face folder, greedy, on the run's mesh
  c.judge.hf_path = ""
  c.judge.max_new_tokens = 512
  c.judge.max_prompt_tokens = 4096
  c.judge.max_batch = 0              # judge calls decoded together at most (0: all of the step's)
  # Which calls go out: the code judges rounds of trajectories whose outcome is > 0, the answer
  # round included (its score only enters the infinite branch's sum). Skipping groups whose
  # outcomes are all equal (advantage 0 for every member) changes no gradient.
  c.judge.answer_round = True
  c.judge.skip_collapsed_groups = True
  # Study controls (agentjax.judge.controls): "none", "flip" (each bit flipped with noise_p) or
  # "random" (each bit drawn with the judge's own marginal rate in the step).
  c.judge.noise = "none"
  c.judge.noise_p = 0.0

  # ---- DAC (trainer = "dac"; configs/dac.py, agentjax/dac/): a searcher and a generator, two LoRA
  # adapters ("searcher", "generator" in model.lora.adapters) on one frozen backbone. The paper gives
  # no reward table, prompt, hand-off or augmentation rule: every value here is our reading
  # (the paper, DAC arXiv:2606.10684, is silent), each one override away.
  c.dac = ml_collections.ConfigDict()
  # The generator's answers per evidence set (m); its advantages are grouped by "question" (every
  # answer to any evidence set of the question: the default) or by "evidence"
  # (the m answers to one evidence set: needs m >= 2; the DAC study of docs/results/dac ran it).
  # Why the default changed: grouped by evidence set, every answer of a group shares S, so an
  # S = 0 group's rewards are alpha or 0 and GRPO's z-score cancels alpha exactly (the study's
  # alpha runs were bit-identical), and an abstention there gets sqrt((1 - p) / p) (p: the
  # group's abstention share) whatever alpha is, about what a correct answer gets. The paper's
  # trade-off (abstaining pays when alpha exceeds the generator's accuracy times the odds of
  # sufficient evidence; DAC arXiv:2606.10684, its appendix on abstention) needs inputs with different S to share one baseline:
  # grouped by question they do, and alpha acts.
  c.dac.generator_samples = 4
  c.dac.generator_group = "question"
  # What the generator reads: the question and the searcher's deduplicated documents, in order;
  # True also gives it the text the searcher generated (its reasoning and queries, not the
  # documents again; cut to its last characters when it does not fit the budget).
  c.dac.generator_sees_reasoning = False
  # The searcher's documents shown at most (first retrieved first; fewer when the budget below
  # is reached); augmentation adds up to augment_k more.
  c.dac.max_evidence_docs = 8
  c.dac.generator_max_new_tokens = 64
  c.dac.generator_max_total_tokens = 1024  # the generator's prompt + answer budget
  # The one abstention answer, <answer> abstain_text </answer>, matched after normalization; it
  # never counts as correct.
  c.dac.abstain_text = "insufficient evidence"
  # Sufficiency S: some shown document contains a gold answer after normalization, as whole words
  # ("word") or as any substring ("substring": "10" is found in "100").
  c.dac.sufficiency_match = "word"
  # Generator reward: 1 answered and correct (EM); alpha abstained on S = 0; 0 abstained on S = 1;
  # 0 answered wrongly on S = 1; -insufficient_answer_penalty answered wrongly on S = 0; an
  # output with no valid answer: rl.format_penalty when rl.penalize_format, else 0. (DAC's
  # rewards replace rl.reward_metric; the searcher gets no format penalty: its hand-over may be
  # running out of turns.) The KL reference of both roles is the bare backbone, also for an
  # adapter started from model.lora.init (so with rl.kl_coef > 0 the KL pulls a warm-started
  # generator back towards a model that never abstained: the demo runs without KL).
  # (With generator_group="evidence" alpha acts only with an estimator that keeps the reward's
  # scale (drgrpo, rloo) or a non-zero insufficient_answer_penalty: see generator_group.)
  c.dac.alpha = 0.3
  c.dac.insufficient_answer_penalty = 0.0
  # Searcher reward, the mean over its evidence set's m generator answers of:
  # "sufficient_answered" S and a valid answer that is not an abstention (the cross-agent
  # signal),
  # "sufficient_only" S (no abstention term), "correct" S and C (the monolithic credit).
  c.dac.searcher_reward = "sufficient_answered"
  # Hard-positive augmentation (training only): a share augment_rate of the sufficient evidence
  # sets gets augment_k documents that the retriever returned (top augment_depth) for the
  # searcher's own queries but that hold no gold answer, shuffled in.
  c.dac.augment_rate = 0.5
  c.dac.augment_k = 2
  c.dac.augment_depth = 10

  # ---- Co-ReAct (configs/coreact.py, agentjax/coreact/; Co-ReAct arXiv:2605.23590): a rubric generator
  # trained with GRPO on a list-wise Spearman reward (trainer = "rubric") and rubric-guided agents
  # at inference. Values are the official code's unless marked "ours".
  c.coreact = ml_collections.ConfigDict()
  # Branch points (launch/collect_branches.py): JSONL rows of a context, K candidates and the
  # judges' rankings. The rubric trainer reads train / dev; collection writes them.
  c.coreact.branches_train = f"{DEMO_ROOT}/coreact/branches_train.jsonl"
  c.coreact.branches_dev = f"{DEMO_ROOT}/coreact/branches_dev.jsonl"
  # SynthWorld's entity names (the rubric executor's "entity" predicates read them; ours).
  c.coreact.entities_path = f"{DEMO_ROOT}/synthworld/entities.jsonl"
  # Collection: candidates sampled from the policy at each temperature (the code: 4 per model x 3
  # models), deduplicated, num_candidates kept by greedy BM25 diversity, ranked by num_judges
  # judges (ties allowed) and aggregated by Borda (sum of ranks); the rank-1 action continues.
  c.coreact.candidate_temperatures = (0.7, 1.0, 1.3)   # ours (the code's models are not ours)
  c.coreact.candidates_per_temperature = 4
  # Extra candidate generators, comma-separated: Hugging Face folders, or "openai:<model>" for
  # config.judge's endpoint (base_url, api_key_env). "": the policy only.
  c.coreact.extra_generators = ""
  c.coreact.num_candidates = 4                  # diversity_top_k
  c.coreact.num_judges = 3
  # Judges in ranking mode: "oracle" (SynthWorld's value-to-go from the gold chain; ours),
  # "montecarlo" (graded values: the success rate of policy continuations after each candidate;
  # ours), "openai" (config.judge's endpoint; judge_models, comma-separated, one model per judge,
  # or config.judge.model for all), "local" (config.judge.hf_path).
  c.coreact.judge_backend = "oracle"
  c.coreact.judge_models = ""
  # The oracle judges: value-to-go gamma^(steps to a correct answer); each judge adds Gaussian
  # noise of this std to the values before ranking (0: J identical judges; ours).
  c.coreact.oracle_gamma = 0.8
  c.coreact.oracle_noise = 0.05
  # The montecarlo judges: each judge's value of a candidate is the mean return of its own
  # value_rollouts continuations of the policy after it (sampled at value_temperature, to an
  # answer or rollout.max_turns; value_batch rows per decode call), a return being the answer's
  # value_metric ("em": success; "f1") against the golden answers (ours).
  c.coreact.value_rollouts = 4
  c.coreact.value_temperature = 1.0
  c.coreact.value_metric = "em"
  c.coreact.value_batch = 64
  c.coreact.collect_split = "train"              # questions collected from (dev: held-out rows)
  c.coreact.collect_questions = 200
  # The rubric applier that ranks the K candidates by a rubric and counts its atomic criteria:
  # "executor" (SynthWorld's predicate vocabulary, deterministic; ours), "openai" / "local" (an
  # LLM applying the rubric, as the code's Gemini judge; config.judge's endpoint / hf_path).
  c.coreact.applier = "executor"
  # Reward: 0 if the response's 4-gram repeat rate > repeat_threshold; else spearman_weight *
  # (rho + 1) / 2 + atomic_weight * atomic / N + format_weight * format (format = 0.5 [min_items
  # <= N <= max_items] + 0.5 [|sum of positive w - 1| < weight_tol]); rho NaN -> nan_score; N < 2
  # or a failed applier call: the rank and atomic terms are 0. rank_reward swaps the list-wise
  # term for "pairwise" (accuracy over the expert's strictly ordered pairs) or "top1" (the
  # rubric's best is the expert's best) for the study (ours).
  c.coreact.spearman_weight = 0.75
  c.coreact.atomic_weight = 0.15
  c.coreact.format_weight = 0.10
  c.coreact.repeat_threshold = 0.40
  c.coreact.repeat_ngram = 4
  c.coreact.min_items = 3
  c.coreact.max_items = 5
  c.coreact.weight_tol = 0.15
  c.coreact.nan_score = 0.5
  c.coreact.rank_reward = "listwise"            # listwise | pairwise | top1
  # Inference (launch/eval.py --agent=coreact | best_of_n): the rubric generator (a Hugging Face
  # folder: its own model, or the merged export of a LoRA run), no rubric at step 1, the rubric as
  # a shadow suffix (removed from the context after the step; persist=True keeps it: ablation),
  # verify: the applier's weighted score of the action, below verify_threshold the step is
  # retried max_retries times with feedback and the retry accepted.
  c.coreact.generator_path = ""
  c.coreact.generator_temperature = 0.0
  c.coreact.generator_max_new_tokens = 128
  c.coreact.generator_max_total_tokens = 2048
  # The official eval decodes rubrics with transformers' repetition penalty 1.1
  # (its agent/workflows/co_react_eval.yaml): greedy rubrics otherwise repeat lines.
  c.coreact.generator_repetition_penalty = 1.1
  # ... and with max_think_tokens 1500 (a budget our demo's 128-token rubrics never reach).
  c.coreact.generator_max_think_tokens = 1500
  c.coreact.verify = True
  c.coreact.verify_threshold = 0.6
  c.coreact.max_retries = 1
  c.coreact.persist = False
  c.coreact.best_of_n = 4                       # Best-of-N: actions sampled per step
  c.coreact.best_of_n_select = "rubric"         # rubric | self (the policy's mean log-prob)

  # ---- optimizer: AdamW, global-norm clipping, warmup + cosine
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.lr = 1e-6
  c.optimizer.warmup_steps = 10
  c.optimizer.final_lr_ratio = 0.1
  c.optimizer.weight_decay = 0.01
  c.optimizer.clip_norm = 1.0
  c.optimizer.b2 = 0.999

  # ---- schedule, logging, checkpoints
  c.train = ml_collections.ConfigDict()
  c.train.steps = 200
  c.train.log_every = 1
  c.train.eval_every = 50            # 0: only at the end
  c.train.eval_at_start = False
  c.train.final_eval = True          # the dev eval after the last step (or launch/eval.py later)
  c.train.eval_batch = 64            # questions per greedy eval rollout
  c.train.checkpoint_every = 50
  c.train.keep_checkpoints = 3
  c.train.export_hf = True           # {workdir}/hf_export at the end
  # Compiled programs kept in this folder and read back by a resume or the next run with the same
  # shapes (jax's persistent compilation cache; MaxText's jax_cache_dir): "{workdir}" is the run's
  # workdir; a shared folder lets a sweep's runs share programs (the study runner sets
  # {root}/jax_cache); "": off. A folder set through JAX_COMPILATION_CACHE_DIR wins.
  c.train.jax_cache_dir = "{workdir}/jax_cache"
  # Non-finite updates are skipped; this many in a row (across steps) stop the run with a
  # checkpoint of the last good parameters. 0: never stop.
  c.train.max_skipped_updates = 5
  # A run that makes no progress (a rollout's turn, a compile, a step, a checkpoint write) for
  # this long writes every thread's stack to {workdir}/stall-p{process}-{time}.txt and exits
  # with code 75 (agentjax/watchdog.py), for its scheduler to restart it from the last
  # checkpoint, instead of hanging (a retriever that never answers, a collective a lost process
  # never joins). 30 min: torch.distributed's NCCL timeout; longer than any one compile or turn
  # we have seen, so only a hang trips it. 0: off.
  c.train.stall_timeout_s = 1800.0
  # Asynchronous RL, colocated (agentjax/train/pipeline.py): the rollouts of the next
  # async_steps steps are produced (on a worker thread) while this step updates, step j's by the
  # parameters of step max(j - async_steps, the step the run started from). 0: the synchronous
  # step. stale: how the staleness bound is kept. "wait": a step's rollout waits for the
  # parameters async_steps updates before it, so none is older. "drop" (with rollout.partial
  # "continue" and max_staleness < async_steps): rollouts run async_steps ahead and a trajectory
  # that started more than max_staleness versions before its update is left out of it (loss
  # mask zeroed; it still counts in its group's statistics: our reading); a step with no fresh
  # trajectory is produced again. "drop" pays when rollouts are the bottleneck (they then
  # move to newer parameters in flight); when updates are, every rollout is stale by the time
  # it is used and each step is produced again: use "wait". max_staleness: -1 (default) is
  # async_steps; "drop" needs 0 <= max_staleness < async_steps.
  c.train.async_steps = 0
  c.train.stale = "wait"
  c.train.max_staleness = -1

  # ---- SFT warm start (trainer = "sft"; see configs/sft.py)
  c.sft = ml_collections.ConfigDict()
  c.sft.demos = f"{DEMO_ROOT}/synthworld/demos.jsonl"
  # A corpus JSONL whose passages are mixed in as plain language-model text (a from-scratch model
  # otherwise never trains the embeddings of names it only meets in held-out questions). "": none.
  c.sft.corpus_path = ""
  c.sft.steps = 500
  c.sft.batch_size = 16
  c.sft.max_len = 1024
  c.sft.lr = 1e-5
  c.sft.checkpoint_every = 100       # SFT steps between checkpoints (0: only at exit/SIGTERM)
  # Each batch as micro-batches of examples sorted by length, each padded to the shortest of
  # length_buckets (or max_len) that holds it: the same loss, faster (agentjax.train.sft.
  # pack_micro_batches); each bucket compiles the step's gradient program once more.
  c.sft.micro_batches = 1
  c.sft.length_buckets = ()
  # Protocols a demonstration may name besides rollout.protocol (its "protocol" field), for a
  # mixed corpus: e.g. "answer_only" for DAC's evidence-set rows (agentjax/studies/backbone.py).
  c.sft.protocols = ""

  # ---- device mesh: -1 takes the remaining devices (agentjax/parallel/rules.py maps axes)
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # Asynchronous RL's split placement (train.async_steps >= 1): the last sampler_devices devices
  # run the rollouts (a data x sampler_tensor mesh), the others train (the mesh above); the
  # updated weights are copied to the sampler for each step's rollout (async/weight_copy_s).
  # 0: colocated, every device does both.
  c.mesh.sampler_devices = 0
  c.mesh.sampler_tensor = 1

  if arg == "demo":
    _demo(c)
  elif arg == "research":
    _research(c)
  else:
    _paper(c, arg)
  return c


def warm_start_sft(c, protocol: str, demos: str, steps: int, max_len: int) -> None:
  """A demo role's warm start (DAC's generator, Co-ReAct's rubric generator): SFT of `steps`
  batches of 16 demonstrations in the role's one-turn `protocol` (its prompt built elsewhere),
  no corpus text, lr 1e-3, one micro-batch of fixed shape, a checkpoint every 100 steps."""
  c.trainer = "sft"
  c.rollout.protocol = protocol
  c.rollout.max_turns = 1
  c.sft.demos = demos
  c.sft.corpus_path = ""
  c.sft.steps = steps
  c.sft.batch_size = 16
  c.sft.max_len = max_len
  c.sft.lr = 1e-3
  c.sft.micro_batches = 1
  c.sft.length_buckets = ()
  c.sft.checkpoint_every = 100


def _demo(c):
  """A small Qwen trained from scratch on SynthWorld in minutes on a laptop CPU. `make demo` runs
  sft.py:demo into runs/demo/sft (demonstrations + the corpus as plain text), then this from its
  export. One retrieved passage per search keeps trajectories short (~200-350 tokens)."""
  c.model.hf_path = f"{DEMO_ROOT}/sft/hf_export"
  c.model.preset = "tiny"
  c.model.shape.hidden_size = 128
  c.model.shape.intermediate_size = 384
  c.model.shape.head_dim = 32
  c.model.tokenizer_path = f"{DEMO_ROOT}/synthworld/tokenizer"
  c.retrieval.topk = 1
  c.rollout.group_size = 8
  c.rollout.max_turns = 4
  c.rollout.max_new_tokens = 64
  c.rollout.max_obs_tokens = 128
  c.rollout.max_total_tokens = 512
  c.rl.prompts_per_step = 8
  c.rl.minibatch_size = 32
  c.rl.kl_coef = 0.0
  c.optimizer.lr = 3e-5
  c.optimizer.warmup_steps = 2
  c.optimizer.weight_decay = 0.0
  c.optimizer.b2 = 0.99
  c.train.steps = 30
  c.train.eval_every = 0
  c.train.checkpoint_every = 10
  c.data.eval_size = 500
  c.train.eval_batch = 100
  # Few programs (a CPU run's first steps were otherwise mostly compiling): every program of the
  # rollouts compiled before step 1, training's and eval's (rollout.warm_up), none after. One lane
  # shape (no compaction), feeds on 4, 16 or all rows of a lane; eval on the training's slots and
  # prompt chunks (64 slots, 8 prompts a prefill), so that it runs the training's feed, gather,
  # scatter and refill programs; one batch width for scoring and updates (no trim), packed rows
  # on powers of two, probes on multiples of 32. None changes a sampled token or a loss
  # (tested); each costs some padding (docs/BENCHMARKS.md "compiles").
  c.rollout.warm_up = True
  c.rollout.compact_factor = 0
  c.rollout.row_bucket_factor = 4
  c.rollout.slots = 64
  c.rollout.prefill_rows = 8
  c.rl.trim_batches = False
  c.rl.pack_rows_per_octave = 1
  c.rl.probe_width_multiple = 32
  c.sft.steps = 1000
  c.sft.batch_size = 16
  c.sft.max_len = 384
  c.sft.lr = 3e-3
  c.sft.corpus_path = f"{DEMO_ROOT}/synthworld/corpus.jsonl"
  # Demos are ~200-350 tokens, the packed corpus ~380: 4 micro-batches at 256 or 384 tokens cost
  # ~0.65 of one [16, 384] batch per step, for 3-4 compiles (launch/bench.py sft_step).
  c.sft.micro_batches = 4
  c.sft.length_buckets = (256,)


def _research(c):
  """SynthWorld v2 and the research backbone (sized to a protocol that
  finishes on a 2-core CPU), on a CPU: the demo's settings but for what the world and the
  protocol change. The backbone is a from-scratch Qwen2 of 4 layers, hidden 128 (1,050,240
  parameters with its 2048-token BPE), warm-started by configs/sft.py:research on the mixed
  corpus of agentjax/studies/backbone.py. It ships in the repository (backbones/research_v2:
  the final export and an early one, with the command that rebuilds them; launch/backbone.py)
  and every study starts from it.

  Ours, not a paper's: top 2 passages per search (a distractor still sits in the top 2 of 95% of
  hop queries; the needed passage is missing from it for 1.7%: synthworld_v2.md); 6 turns (a
  4-hop question needs 5 with its answer) in 1024 tokens; a constant lr after 5 warm-up steps
  (a decayed lr freezes a short run's end), lr 1e-4, 30 steps; 500 eval questions.
  The first research backbone (hidden 256, top 3, 1536 tokens, 3.3 h of SFT) is
  `--config.model.shape.hidden_size=256 --config.model.shape.intermediate_size=768
  --config.model.shape.head_dim=64 --config.retrieval.topk=3` (docs/results/backbone.md)."""
  _demo(c)
  root = RESEARCH_ROOT
  c.model.hf_path = f"{root}/backbone/sft/hf_export"
  c.model.preset = "tiny"
  c.model.shape.hidden_size = 128
  c.model.shape.intermediate_size = 384
  c.model.shape.num_layers = 4
  c.model.shape.num_heads = 4
  c.model.shape.num_kv_heads = 2
  c.model.shape.head_dim = 32
  c.model.tokenizer_path = f"{root}/backbone/tokenizer"
  c.data.manual_dir = f"{root}/synthworld"
  c.data.data_dir = f"{root}/tfds"
  c.data.eval_size = 500
  c.retrieval.corpus_path = f"{root}/synthworld/corpus.jsonl"
  c.retrieval.index_dir = f"{root}/bm25_index"
  c.retrieval.topk = 2
  c.rollout.max_turns = 6
  c.rollout.max_obs_tokens = 192
  c.rollout.max_total_tokens = 1024
  # Padding-free scoring and updates: a padded batch here was 0.47-0.70 real tokens (1-4 hop
  # trajectories), packed rows 0.85-0.93, with the same losses; over a GRPO run's first 6 steps
  # scoring took 0.74 and updates 0.83 of the padded time, compiles included
  # (docs/results/research/README.md, "Step time": measured at 1536 tokens and top 3).
  c.rl.pack_tokens = 1024
  c.rl.ig_probe_tokens = "natural"  # the gold's tokens as the model writes them (base.py)
  # 1e-4 (the demo's 3e-5 x 3.3) for 30 steps: about the movement the earlier 100 steps at 3e-5
  # had (a pilot of 8 IGPO steps from the early start, seed 100: no instability).
  c.optimizer.lr = 1e-4
  c.optimizer.warmup_steps = 5
  c.optimizer.final_lr_ratio = 1.0
  c.train.steps = 30
  c.train.checkpoint_every = 10
  c.sft.demos = f"{root}/backbone/demos.jsonl"
  c.sft.corpus_path = f"{root}/synthworld/corpus.jsonl"
  c.sft.protocols = "answer_only"  # the corpus' evidence rows (DAC's generator prompt)
  c.sft.steps = 4000  # launch/backbone.py: a 2000-step schedule, then on to 4000 (~1.7 s a step)
  c.sft.max_len = 1024
  c.sft.lr = 2e-3
  c.sft.micro_batches = 4
  c.sft.length_buckets = (256, 512)


def _paper(c, arg):
  """IGPO paper settings (Qwen2.5-3B/7B-Instruct; Qwen3-8B with the same recipe); the group std of
  verl's GRPO (unbiased + 1e-6), as the paper's baselines ran in verl."""
  hf = {"qwen2.5-3b": "Qwen2.5-3B-Instruct", "qwen2.5-7b": "Qwen2.5-7B-Instruct",
        "qwen3-8b": "Qwen3-8B"}[arg]
  c.model.hf_path = f"models/{hf}"
  c.model.dtype = "bfloat16"
  c.model.remat_policy = "full"
  c.data.train = "nq,hotpotqa"
  c.data.eval = FLASHRAG
  c.data.manual_dir = "data/flashrag"
  c.data.data_dir = "data/tfds"
  c.data.eval_split = "test"
  c.data.eval_size = 512
  c.retrieval.backend = "http"
  c.retrieval.corpus_path = ""
  c.retrieval.url = "http://127.0.0.1:8000/retrieve"
  c.rollout.group_size = 16
  c.rollout.max_turns = 10
  c.rollout.max_new_tokens = 512
  c.rollout.max_obs_tokens = 512
  c.rollout.max_total_tokens = 8192
  c.rollout.temperature = 1.0
  c.rl.prompts_per_step = 32
  c.rl.minibatch_size = 128
  c.rl.kl_coef = 0.001
  c.rl.kl_estimator = "low_var_kl"
  c.rl.clip_low = c.rl.clip_high = 0.2
  c.rl.gamma = 1.0
  # The baselines of the IGPO paper's Table 2 ran in its verl code: verl's GRPO divides by the
  # unbiased std + 1e-6 (torch.std) and its REINFORCE++ whitens with the unbiased variance.
  # configs/igpo.py replaces this with the IGPO code's own form.
  c.rl.std_estimator = "unbiased"
  c.rl.std_eps = 1e-6
  c.optimizer.lr = 1e-6
  c.train.steps = 300
  c.train.eval_every = 50
  c.train.eval_batch = 256
  # What fits the papers' 8 x 80 GB (launch/fit.py; docs/BENCHMARKS.md "fit"): tensor parallelism
  # over 4 devices (the heads, MLP and vocabulary: 4 divides 28 and 32 heads and 4 or 8 KV heads;
  # Qwen2.5-3B's 2 KV heads take 2) and FSDP over the rest; one trajectory per device per
  # forward/backward; 256 KV-cache rows (2 lanes x 128 of the 512 trajectories: each 8192-slot
  # row of a 7B model is 0.46 GB of bf16 KV).
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 2 if arg == "qwen2.5-3b" else 4
  c.rl.micro_batch_size = 1
  c.rollout.slots = 256
