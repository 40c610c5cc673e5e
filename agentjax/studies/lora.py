r"""The LoRA study (`python launch/compare.py --study=lora`: runs/lora ->
docs/results/lora).

The wide size, its SFT start trained by the sweep, IGPO (configs/igpo.py:demo, the IGPO study's
`igpo` method, ground-truth probes included) with full fine-tuning (full_ft) against LoRA rank 32,
alpha 32 (scale 1) on all 7 projections of the frozen backbone at lr LORA_LR (lora_r32); nothing
else differs. Every run's result.json also records the process's peak RSS and the bytes of its
train state (trained params + optimizer state, counted from the arrays the trainer builds). Its
report (--out): results.md (dev/test F1 with per-hop, the paired per-seed test difference, step
time, memory), results.json, f1_vs_step.png.
"""

from __future__ import annotations

from agentjax.studies.reporting import mean_std, pm, step_seconds, vs_reference
from agentjax.studies.runs import SPLITS


# LoRA's study: the same IGPO run with the backbone frozen and rank-32 adapters trained on every
# projection. alpha = rank (scale 1); lr 10x full fine-tuning's demo 3e-5 (LoRA's usual ratio; not
# tuned here, see docs/results/lora/README.md).
LORA_RANK = 32
LORA_LR = 3e-4
LORA_METHODS = {
    "full_ft": ("igpo", {}),
    "lora_r32": ("igpo", {"model.lora.adapters": "policy", "model.lora.rank": LORA_RANK,
                          "model.lora.alpha": float(LORA_RANK),
                          "model.lora.lr": f"policy={LORA_LR:g}"}),
}


def summarize_lora(study: dict, reference: str = "full_ft") -> dict:
  """Per size and method of the LoRA study: mean ± std over seeds of dev/test F1 (per hop), the
  test gain over the SFT start, step time and memory; and each method against `reference` (full
  fine-tuning) seed by seed: the paired per-question test F1 difference and its standard error
  (same questions), and the training F1 difference paired by step (same questions a step)."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs, start = s["runs"], s["start"]
    ref = {r["seed"]: r for r in runs.get(reference, [])}
    t = {"start": {split: {k: start[split][k] for k in ("f1", "em", "per_hop")}
                   for split in SPLITS}, "methods": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs), "overrides": rs[0].get("overrides")}
      for split in SPLITS:
        row[f"{split}_f1"] = mean_std([r[split]["f1"] for r in rs])
        for hop in rs[0][split]["per_hop"]:
          row[f"{split}_{hop}"] = mean_std([r[split]["per_hop"][hop] for r in rs])
        row[f"{split}_gain"] = mean_std(
            [paired_gain(start[split]["f1_by_id"], r[split]["f1_by_id"])[0] for r in rs])
      steps = [step_seconds(r["curve"]) for r in rs]
      row["step_s"] = mean_std([a for a, _ in steps])
      row["step_s_after_first"] = mean_std([b for _, b in steps])
      row["minutes"] = mean_std([r.get("minutes", 0.0) for r in rs])
      if all("peak_rss_mib" in r for r in rs):
        row["peak_rss_mib"] = mean_std([r["peak_rss_mib"] for r in rs])
      if all("train_state" in r for r in rs):
        row["train_state"] = rs[0]["train_state"]  # the same arrays for every seed
        row["checkpoint_bytes"] = [r.get("checkpoint_bytes") for r in rs]
      paired = [r for r in rs if r["seed"] in ref]
      if method != reference and paired:
        row["vs_reference"] = dict(
            vs_reference(reference, ref, paired),
            dev_f1_points=[round(100 * (r["dev"]["f1"] - ref[r["seed"]]["dev"]["f1"]), 2)
                           for r in paired])
      t["methods"][method] = row
    table[size] = t
  return table


def _mib(n: float) -> str:
  return f"{n / 2**20:.1f} MiB"


def markdown_lora(table: dict, steps: int, hardware: str) -> str:
  """results.md of the LoRA study: F1 table, the paired comparison with full fine-tuning, and
  step time and memory."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    hops = sorted(st["dev"]["per_hop"])
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f}, test F1 "
              f"{st['test']['f1']:.3f}. IGPO, {steps} RL steps; mean ± sample std over seeds.", "",
              "| method | seeds | dev F1 | " + " | ".join(f"dev {h}" for h in hops)
              + " | test F1 | " + " | ".join(f"test {h}" for h in hops)
              + " | test gain vs SFT |", "| --- " * (5 + 2 * len(hops)) + "|"]
    for method, r in t["methods"].items():
      lines.append(f"| {method} | {r['seeds']} | {pm(r['dev_f1'])} | "
                   + " | ".join(pm(r[f"dev_{h}"]) for h in hops) + f" | {pm(r['test_f1'])} | "
                   + " | ".join(pm(r[f"test_{h}"]) for h in hops)
                   + f" | {pm(r['test_gain'], sign='+')} |")
    vs = {m: r["vs_reference"] for m, r in t["methods"].items() if "vs_reference" in r}
    if vs:
      lines += ["", "Against full fine-tuning, seed by seed (same seed: same training questions; "
                "test: the same 500 questions, paired per question, ± its standard error):", "",
                "| method | seeds | Δ test F1 per seed, points | Δ dev F1 per seed, points | "
                "training F1 − full_ft (paired by step) |", "| --- " * 5 + "|"]
      for m, v in vs.items():
        cells = ", ".join(f"{d:+.1f} ± {e:.1f}" for d, e in
                          zip(v["test_f1_points"], v["test_f1_stderr_points"]))
        lines.append(f"| {m} | {', '.join(v['seeds'])} | {cells} | "
                     + ", ".join(f"{d:+.1f}" for d in v["dev_f1_points"])
                     + f" | {pm(v['train_f1_paired_by_step'], sign='+')} |")
    lines += ["", "Cost (step_s: the trainer's seconds per RL step, metrics.jsonl; peak RSS: "
              "ru_maxrss of the run's process, which also loads the model and runs both evals; "
              "train state: bytes of the trained params + optimizer state from the arrays, "
              "float32):", "",
              "| method | step s (all steps) | step s (steps 2+) | minutes a run | peak RSS "
              "| trained params | trained params bytes | optimizer state bytes | train state "
              "(params + optimizer) | frozen backbone | checkpoint on disk |",
              "| --- " * 11 + "|"]
    for method, r in t["methods"].items():
      ts = r.get("train_state")
      mem = ["—"] * 6
      if ts:
        disk = [b for b in r["checkpoint_bytes"] if b is not None]
        mem = [f"{ts['trained_params']:,}", _mib(ts["trained_bytes"]),
               _mib(ts["opt_state_bytes"]), _mib(ts["trained_bytes"] + ts["opt_state_bytes"]),
               _mib(ts["frozen_bytes"]) if ts["frozen_bytes"] else "— (trained)",
               _mib(sum(disk) / len(disk)) if disk else "—"]
      rss = f"{pm(r['peak_rss_mib'], 0)} MiB" if "peak_rss_mib" in r else "—"
      lines.append(f"| {method} | {pm(r['step_s'], 2)} | {pm(r['step_s_after_first'], 2)} | "
                   f"{pm(r['minutes'], 1)} | {rss} | " + " | ".join(mem) + " |")
    lines.append("")
  return "\n".join(lines)


LORA_PANELS = (("f1", "f1_vs_step", "training F1"),)
