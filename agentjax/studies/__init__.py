"""The studies on SynthWorld, as a library (their command lines: launch/compare.py and
launch/coreact_study.py).

  runs       the run layout under a study's root, model sizes, run configs, eval rows
  reporting  what the reports share: collected runs, mean ± std over seeds, paired differences,
             table cells, figures with a seed band
  sweep      the sweep runner (STUDIES, the runs as claimed subprocesses) and its flags
  igpo, cw_grpo, lora, dac   one study each: its methods, summary, tables and figures
  coreact    the Co-ReAct study: its jobs, their scheduler and its report
"""
