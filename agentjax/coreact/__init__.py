"""Co-ReAct: rubrics as step-level collaborators for ReAct search agents (Co-ReAct,
arXiv:2605.23590; official code github.com/ZBWpro/Co-ReAct).

context.py   BranchContext: the trajectory so far at a branch point (every stage reads it)
rubric.py    the rubric format, its parser, the reward (list-wise Spearman), prompts, phase hints
executor.py  SynthWorld's rubric applier: criteria in a small predicate vocabulary
appliers.py  rubric appliers (executor / openai / local): rank candidates, score an action
rankers.py   judges in ranking mode (oracle value-to-go / montecarlo continuations / openai /
             local) for branch collection
branches.py  branch-point collection (launch/collect_branches.py)
task.py      the rubric generator as a single-turn RL task (trainer "rubric")
warmstart.py the demo generator's warm-start demonstrations
guided.py    rubric-guided agents at inference: shadow suffix, verify-retry, Best-of-N
"""

# The rank term of the rubric reward: the official list-wise Spearman, or the study's pairwise
# accuracy / top-1 match (config.coreact.rank_reward).
RANK_REWARDS = ("listwise", "pairwise", "top1")
# Agents launch/eval.py runs, and how Best-of-N picks its action (config.coreact.best_of_n_select).
AGENTS = ("react", "coreact", "best_of_n")
SELECTS = ("rubric", "self")
# How a montecarlo judge scores a continuation's answer (config.coreact.value_metric).
VALUE_METRICS = ("em", "f1")


def build_named(registry: dict, field: str, config, mesh=None):
  """registry[config.<field>](config, mesh=mesh), or a ValueError naming the field and the known
  names (the appliers' and the rankers' registries)."""
  section, key = field.split(".")
  name = config[section][key]
  if name not in registry:
    raise ValueError(f"config.{field}: unknown backend {name!r}; known: {sorted(registry)}")
  return registry[name](config, mesh=mesh)
