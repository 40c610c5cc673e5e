import json, sys
IGN = {"tokens_per_s", "sampled_tokens_per_s", "compiles"}
ign = lambda k: k.endswith("_s") or k in IGN
for name in sys.argv[1:]:
  new = [json.loads(l) for l in open(f"/tmp/study/runs/d_{name}/metrics.jsonl")]
  old = [json.loads(l) for l in open(f"/tmp/old/runs/d_{name}/metrics.jsonl")]
  for i, (o, n) in enumerate(zip(old, new)):
    common = sorted(k for k in set(o) & set(n) if not ign(k))
    diff = [k for k in common if o[k] != n[k]]
    kind = "eval" if any(k.startswith("eval/") for k in n) else "step"
    d = "; ".join(f"`{k}` {o[k]!r} → {n[k]!r}" for k in diff) or "none"
    only = sorted(set(o) ^ set(n))
    print(f"| {name}:demo | {i + 1} ({kind}, step {n.get('step')}) | {len(common)} | {d} | {', '.join(only) or '—'} |")
  if len(old) != len(new):
    print(f"| {name}:demo | line counts differ: old {len(old)}, new {len(new)} | | | |")
