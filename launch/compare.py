r"""The SynthWorld studies: IGPO vs GRPO (docs/results/) and CW-GRPO vs GRPO
(docs/results/cw_grpo/), chosen by --study.

    python launch/compare.py                          # every size x method x seed, then the report
    python launch/compare.py --sizes=base --seeds=0   # a subset (finished runs are reused)
    python launch/compare.py --report_only            # tables + plots from the finished runs

The PPO rows were run on the base size beside GRPO and IGPO from the current base SFT
start (the CW-GRPO and DAC studies' one), reported in docs/results/ppo:

    python launch/compare.py --sizes=base --methods=grpo,igpo,ppo,ppo_turn,ppo_ig \
        --root=runs/ppo --sft_from=runs/cw_grpo --out=docs/results/ppo

    python launch/compare.py --study=cw_grpo          # runs/cw_grpo -> docs/results/cw_grpo
    python launch/compare.py --study=lora             # runs/lora -> docs/results/lora
    python launch/compare.py --study=dac              # runs/dac -> docs/results/dac
    # SynthWorld v2 from the research backbone (launch/backbone.py first), 100 steps a run
    python launch/compare.py --study=research         # runs/research -> docs/results/research
    # DAC there (its GRPO runs are the research study's): the DAC agent's eval before RL
    # (alpha*), then GRPO, GRPO-LoRA, DAC and DAC at alpha*/3, alpha*, 3 alpha*
    python launch/compare.py --study=dac_research     # runs/research -> docs/results/dac_research

The sweep (its layout under --root, resumable runs claimed with file locks, the report) and its
flags: agentjax/studies/sweep.py. Each study's methods, sizes and report (what it runs and what
it writes under --out): agentjax/studies/igpo.py, cw_grpo.py, lora.py, dac.py and research.py.
"""

from __future__ import annotations

from absl import flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)
from agentjax.studies import sweep

flags.adopt_module_key_flags(sweep)  # --helpshort lists them

if __name__ == "__main__":
  common.run(sweep.main)
