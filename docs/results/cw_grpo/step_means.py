import json, sys, os
for wd in sys.argv[1:]:
  ms = [json.loads(l) for l in open(os.path.join(wd, "metrics.jsonl"))]
  steps = [m for m in ms if "reward" in m]
  keys = ["reward", "f1", "collapse_fraction", "zero_adv_fraction"] + sorted({k for m in steps for k in m if k.startswith(("cw/", "judge/"))})
  out = {"workdir": wd, "steps": len(steps)}
  for k in keys:
    vals = [m[k] for m in steps if k in m and m[k] is not None]
    out[k] = {"mean": sum(vals) / len(vals) if vals else None, "n_steps": len(vals)}
  ev = sorted(os.listdir(os.path.join(wd, "eval")))
  out["trainer_evals"] = {e: {k: v for k, v in json.load(open(os.path.join(wd, "eval", e))).items() if k != "per_question"} for e in ev}
  print(json.dumps(out, indent=1))
