r"""The IGPO study: IGPO vs GRPO and the other estimators on SynthWorld (docs/results/;
`python launch/compare.py`, --study=igpo).

Every method starts from the same SFT warm start of its model size and runs the demo RL settings
(configs/base.py `_demo`: 8 questions x 8 rollouts a step, lr 3e-5, top-1 BM25, 4 turns) for
--steps steps; only the advantage estimator (and its reward) differs:

  igpo          configs/igpo.py:demo (IG turn rewards + outcome, separate normalization)
  outcome_only  the same with rl.igpo_ig_weight=0 (IGPO's F1-only ablation; with separate
                normalization and gamma 1 its advantages are exactly GRPO's, see METHODS)
  ig_only       the same with rl.igpo_outcome_weight=0 (IGPO's IG-only ablation)
  grpo, rloo, reinforcepp   configs/{grpo,rloo,reinforcepp}.py:demo
  ppo           configs/ppo.py:demo (a critic from the SFT start, token-level GAE)
  ppo_turn      the same with turn-level GAE (algorithm ppo_turn)
  ppo_ig        the same as ppo with IGPO's information gain as turn rewards (ppo.ig_weight=1)

Every run computes the ground-truth probes (rl.probe_all) so that the IG and ground-truth entropy
of GRPO-family policies are measured the same way as IGPO's. Sizes (runs.SIZES; trained from
scratch by SFT on the demo's hasty-teacher demonstrations, configs/sft.py:demo):

  base   the demo model: hidden 128, 2 layers, 4 heads of 32 (2 KV), MLP 384
  wide   hidden 256, 2 layers, 8 heads of 32 (4 KV), MLP 768

The report (--out): results.md (tables), results.json, f1_vs_step.png, f1_minus_grpo_vs_step.png,
collapse_vs_step.png, gt_entropy_vs_step.png.
"""

from __future__ import annotations

from agentjax.studies.reporting import WINDOW, grpo_f1, mean_std, moving, plot_seed_bands, pm
from agentjax.studies.runs import SPLITS


# method: (config file, config overrides by dotted key). Under the demo's separate normalization
# with gamma = 1, outcome_only gives exactly GRPO's advantages (every IG pool is all zero, so z =
# 0): it is kept as the paper's ablation and as a check that the IGPO path reproduces GRPO.
METHODS = {
    "igpo": ("igpo", {}),
    "grpo": ("grpo", {}),
    "outcome_only": ("igpo", {"rl.igpo_ig_weight": 0.0}),
    "ig_only": ("igpo", {"rl.igpo_outcome_weight": 0.0}),
    "rloo": ("rloo", {}),
    "reinforcepp": ("reinforcepp", {}),
    # PPO with a learned critic (configs/ppo.py:demo): token-level GAE, turn-level GAE, and
    # token-level GAE with IGPO's information gain as turn rewards.
    "ppo": ("ppo", {}),
    "ppo_turn": ("ppo", {"algorithm": "ppo_turn"}),
    "ppo_ig": ("ppo", {"ppo.ig_weight": 1.0}),
    # A²TGPO: configs/a2tgpo.py:demo (igpo's demo with algorithm "a2tgpo" and its config.a2tgpo
    # section: (i) turn-group normalization, (ii) rescaled accumulation, (iii) adaptive clip).
    "a2tgpo": ("a2tgpo", {}),
}


def summarize(study: dict, target_gain: float) -> dict:
  """Per size and method: mean ± std over seeds of every reported figure."""
  from agentjax.data.demo_world import paired_gain
  table = {}
  for size, s in study.items():
    runs = s["runs"]
    # Every method sees the same questions at a given step of a seed, so a seed's start (its
    # first WINDOW steps' training F1, averaged over the methods) is a common baseline.
    by_seed = {}
    for rs in runs.values():
      for r in rs:
        by_seed.setdefault(r["seed"], []).append(
            sum(m["f1"] for m in r["curve"][:WINDOW]) / WINDOW)
    targets = {seed: sum(v) / len(v) + target_gain for seed, v in by_seed.items()}
    grpo = grpo_f1(runs)
    table[size] = {"start": {split: {k: s["start"][split][k] for k in ("f1", "em", "per_hop")}
                             for split in SPLITS},
                   "target_train_f1": targets, "methods": {}}
    for method, rs in runs.items():
      row = {"seeds": len(rs)}
      for split in SPLITS:
        row[f"{split}_f1"] = mean_std([r[split]["f1"] for r in rs])
        for hop in rs[0][split]["per_hop"]:
          row[f"{split}_{hop}"] = mean_std([r[split]["per_hop"][hop] for r in rs])
        gains = [paired_gain(s["start"][split]["f1_by_id"], r[split]["f1_by_id"]) for r in rs]
        row[f"{split}_gain"] = mean_std([g for g, _ in gains])
        row[f"{split}_gain_stderr_per_seed"] = [round(e, 4) for _, e in gains]
      reached = []
      for r in rs:
        avg = moving([m["f1"] for m in r["curve"]])
        hit = [m["step"] for m, a in zip(r["curve"], avg)
               if a is not None and a >= targets[r["seed"]]]
        reached.append(hit[0] if hit else None)
      row["steps_to_target"] = reached
      # Training F1 minus GRPO's at the same step of the same seed (same questions), averaged
      # over the steps: sample efficiency with the question-to-question variance paired out.
      paired = [sum(m["f1"] - g for m, g in zip(r["curve"], grpo[r["seed"]])) / len(r["curve"])
                for r in rs if r["seed"] in grpo]
      row["train_f1_minus_grpo"] = mean_std(paired) if paired else None
      row["collapse_fraction"] = mean_std(
          [sum(m["collapse_fraction"] for m in r["curve"]) / len(r["curve"]) for r in rs])
      # Groups whose every sampled token got a zero advantage (the estimator's own collapse;
      # runs made before the trainer logged it are left out).
      zero = [sum(m["zero_adv_fraction"] for m in r["curve"]) / len(r["curve"]) for r in rs
              if all("zero_adv_fraction" in m for m in r["curve"])]
      row["zero_adv_fraction"] = mean_std(zero) if zero else None
      # Ground-truth entropy reduction of the policy's own searches (nats per answer token, from
      # before the first turn to after the last search), first WINDOW steps and last WINDOW.
      for name, window in (("first", slice(0, WINDOW)), ("last", slice(-WINDOW, None))):
        row[f"gt_entropy_reduction_{name}"] = mean_std(
            [sum(m["gt_entropy_reduction"] for m in r["curve"][window])
             / len(r["curve"][window]) for r in rs])
      row["minutes"] = mean_std([r.get("minutes", 0.0) for r in rs])
      # PPO's critic: how much of the returns' variance its values explain, as scored.
      if all("critic/explained_variance" in m for r in rs for m in r["curve"]):
        for name, window in (("first", slice(0, WINDOW)), ("last", slice(-WINDOW, None))):
          for key in ("explained_variance", "value_loss"):
            row[f"critic_{key}_{name}"] = mean_std(
                [sum(m[f"critic/{key}"] for m in r["curve"][window]) / len(r["curve"][window])
                 for r in rs])
      table[size]["methods"][method] = row
  return table


def markdown(table: dict, steps: int, hardware: str) -> str:
  """The tables of results.md: one per model size, a row per method (mean ± std over seeds)."""
  lines = []
  for size, t in table.items():
    st = t["start"]
    hops = sorted(st["dev"]["per_hop"])
    per_hop = {split: ", ".join(f"{h} {st[split]['per_hop'][h]:.3f}" for h in hops)
               for split in SPLITS}
    targets = ", ".join(f"seed {k} {v:.3f}" for k, v in sorted(t["target_train_f1"].items()))
    lines += [f"### {size} model ({hardware})", "",
              f"SFT start (greedy, whole splits): dev F1 {st['dev']['f1']:.3f} "
              f"({per_hop['dev']}), test F1 {st['test']['f1']:.3f} ({per_hop['test']}). "
              f"Target training F1 ({WINDOW}-step average): {targets}.", "",
              "| method | seeds | dev F1 | " + " | ".join(f"dev {h}" for h in hops)
              + " | test F1 | " + " | ".join(f"test {h}" for h in hops)
              + " | test gain vs SFT | steps to target | training F1 − GRPO (paired by step) "
              f"| outcome-collapse fraction | zero-advantage fraction | GT entropy reduction, "
              f"first {WINDOW} → last {WINDOW} steps |",
              "| --- " * (10 + 2 * len(hops)) + "|"]
    for method, r in t["methods"].items():
      hit = [s for s in r["steps_to_target"] if s is not None]
      steps_txt = (f"{sum(hit) / len(hit):.1f} ({len(hit)}/{r['seeds']} reached)" if hit
                   else f"not in {steps} (0/{r['seeds']})")
      lines.append(
          f"| {method} | {r['seeds']} | {pm(r['dev_f1'])} | "
          + " | ".join(pm(r[f"dev_{h}"]) for h in hops) + f" | {pm(r['test_f1'])} | "
          + " | ".join(pm(r[f"test_{h}"]) for h in hops)
          + f" | {pm(r['test_gain'], sign='+')} | {steps_txt} | "
          f"{pm(r['train_f1_minus_grpo'], sign='+')} | {pm(r['collapse_fraction'])} | "
          f"{pm(r['zero_adv_fraction'])} | "
          f"{r['gt_entropy_reduction_first'][0]:.3f} → {r['gt_entropy_reduction_last'][0]:.3f} |")
    lines.append("")
    if any("critic_explained_variance_first" in r for r in t["methods"].values()):
      lines += [f"The critics (mean ± std over seeds of each run's first / last {WINDOW} steps; "
                "explained variance of the returns by the values the batch was scored with):", "",
                f"| method | critic explained variance, first {WINDOW} → last {WINDOW} steps | "
                f"critic value loss, first {WINDOW} → last {WINDOW} steps |", "| --- " * 3 + "|"]
      for method, r in t["methods"].items():
        if "critic_explained_variance_first" in r:
          lines.append(f"| {method} | " + " | ".join(
              f"{pm(r[f'critic_{k}_first'])} → {pm(r[f'critic_{k}_last'])}"
              for k in ("explained_variance", "value_loss")) + " |")
      lines.append("")
  return "\n".join(lines)


IGPO_PANELS = (("f1", "f1_vs_step", "training F1"),
               ("f1_minus_grpo", "f1_minus_grpo_vs_step", "training F1 − GRPO, paired by step"),
               ("collapse_fraction", "collapse_vs_step", "outcome-collapse fraction"),
               ("gt_entropy_reduction", "gt_entropy_vs_step", "GT entropy reduction (nats)"))


def plot(study: dict, out: str) -> list[str]:
  """The IGPO study's figures: one per IGPO_PANELS metric vs step (plot_seed_bands)."""
  return plot_seed_bands(study, out, IGPO_PANELS)
