"""The table of docs/results/refactor_check.md: for each NAME, the old and the new run's
metrics.jsonl ({old}/d_NAME and {new}/d_NAME), line by line, the keys compared, those whose values
differ and those in one run only. Wall-clock keys (..._s, tokens_per_s, sampled_tokens_per_s,
compiles) are not compared.

    python docs/results/refactor_check_table.py igpo ppo cw_grpo \\
        [--old=runs/refactor_check/old] [--new=runs/refactor_check/new]

--old / --new: the folders holding the old and the new tree's d_NAME runs (each tree's runs/ when
the runs were made with --workdir=$R/runs/d_$NAME, as in docs/results/refactor_check.md).
"""
import argparse
import json
import os

IGN = {"tokens_per_s", "sampled_tokens_per_s", "compiles"}
ign = lambda k: k.endswith("_s") or k in IGN


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("names", nargs="+", help="configs whose demo runs are compared (d_NAME)")
  parser.add_argument("--old", default="runs/refactor_check/old",
                      help="folder holding the old tree's d_NAME runs")
  parser.add_argument("--new", default="runs/refactor_check/new",
                      help="folder holding the new tree's d_NAME runs")
  args = parser.parse_args()
  for name in args.names:
    paths = {side: os.path.join(folder, f"d_{name}", "metrics.jsonl")
             for side, folder in (("old", args.old), ("new", args.new))}
    for side, path in paths.items():
      if not os.path.isfile(path):
        parser.error(f"--{side}={getattr(args, side)}: no {path} (give the folder that holds the "
                     f"{side} tree's d_{name}/ run)")
    new = [json.loads(l) for l in open(paths["new"])]
    old = [json.loads(l) for l in open(paths["old"])]
    for i, (o, n) in enumerate(zip(old, new)):
      common = sorted(k for k in set(o) & set(n) if not ign(k))
      diff = [k for k in common if o[k] != n[k]]
      kind = "eval" if any(k.startswith("eval/") for k in n) else "step"
      d = "; ".join(f"`{k}` {o[k]!r} → {n[k]!r}" for k in diff) or "none"
      only = sorted(set(o) ^ set(n))
      print(f"| {name}:demo | {i + 1} ({kind}, step {n.get('step')}) | {len(common)} | {d} | "
            f"{', '.join(only) or '—'} |")
    if len(old) != len(new):
      print(f"| {name}:demo | line counts differ: old {len(old)}, new {len(new)} | | | |")


if __name__ == "__main__":
  main()
