"""The table of docs/results/refactor_check_signals.md: for each LABEL OLD NEW triple (two
metrics.jsonl files), line by line, the keys compared, those whose values differ and those in one
run only. Wall-clock keys (…_s, …/seconds, tokens_per_s, compiles) are not compared.

    python docs/results/refactor_check_signals.py igpo:research \
        runs/refactor_check/old/igpo/metrics.jsonl runs/refactor_check/new/igpo/metrics.jsonl ...

(runs/refactor_check/TAG/NAME: where refactor_check_signals.sh puts its runs by default.)
"""
import json
import sys

IGNORED = {"tokens_per_s", "sampled_tokens_per_s", "compiles", "seconds"}


def ignored(key):
  return key.endswith("_s") or key.endswith("/seconds") or key in IGNORED


def rows(label, old_path, new_path):
  old = [json.loads(line) for line in open(old_path)]
  new = [json.loads(line) for line in open(new_path)]
  for i, (o, n) in enumerate(zip(old, new)):
    common = sorted(k for k in set(o) & set(n) if not ignored(k))
    diff = "; ".join(f"`{k}` {o[k]!r} → {n[k]!r}" for k in common if o[k] != n[k]) or "none"
    kind = "eval" if any(k.startswith("eval/") for k in n) else "step"
    only = ", ".join(sorted(set(o) ^ set(n))) or "—"
    yield f"| {label} | {i + 1} ({kind}, step {n.get('step')}) | {len(common)} | {diff} | {only} |"
  if len(old) != len(new):
    yield f"| {label} | line counts differ: old {len(old)}, new {len(new)} | | | |"


if __name__ == "__main__":
  args = sys.argv[1:]
  print("| run | metrics.jsonl line | keys compared | keys whose values differ (old → new) | "
        "keys in one run only |")
  print("| --- | --- | --- | --- | --- |")
  for j in range(0, len(args), 3):
    for row in rows(*args[j:j + 3]):
      print(row)
