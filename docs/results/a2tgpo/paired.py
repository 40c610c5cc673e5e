"""Paired test-F1 (and dev-F1) differences by seed from runs/a2tgpo results."""
import json, math, os, sys
from scipy import stats
root = sys.argv[1] if len(sys.argv) > 1 else "runs/a2tgpo"
seeds = [0, 1, 2]
methods = ["a2tgpo", "igpo", "grpo"]
res = {}
for m in methods:
  for s in seeds:
    p = os.path.join(root, "base", m, f"seed{s}", "result.json")
    if os.path.exists(p):
      r = json.load(open(p))
      res[(m, s)] = r
def ms(xs):
  n = len(xs); mu = sum(xs) / n
  sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan")
  return mu, sd, sd / math.sqrt(n) if n > 1 else float("nan")
out = {"per_run": {}, "methods": {}, "paired": {}}
for (m, s), r in sorted(res.items()):
  out["per_run"][f"{m}/seed{s}"] = {"dev_f1": r["dev"]["f1"], "test_f1": r["test"]["f1"],
                                    "dev_n": r["dev"]["n"], "test_n": r["test"]["n"],
                                    "minutes": r["minutes"]}
for m in methods:
  ss = [s for s in seeds if (m, s) in res]
  if not ss: continue
  for split in ("dev", "test"):
    mu, sd, se = ms([res[(m, s)][split]["f1"] for s in ss])
    out["methods"].setdefault(m, {"seeds": ss})[f"{split}_f1"] = {"mean": mu, "std": sd, "se": se}
for ref in ("grpo", "igpo"):
  for split in ("test", "dev"):
    ss = [s for s in seeds if ("a2tgpo", s) in res and (ref, s) in res]
    if len(ss) < 2: continue
    a = [res[("a2tgpo", s)][split]["f1"] for s in ss]; b = [res[(ref, s)][split]["f1"] for s in ss]
    d = [x - y for x, y in zip(a, b)]
    mu, sd, se = ms(d)
    t = stats.ttest_rel(a, b)
    out["paired"][f"a2tgpo-{ref}/{split}"] = {"seeds": ss, "diffs": d, "mean": mu, "se": se,
                                             "t": float(t.statistic), "p": float(t.pvalue)}
print(json.dumps(out, indent=1))
