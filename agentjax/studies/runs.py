"""The studies' run layout and run configs: model sizes, where a finished run leaves its result
under a study's root, the demo configs pointed at the root's world, and eval rows read as the
reports read them. Shared by the sweep (agentjax/studies/sweep.py) and every study."""

from __future__ import annotations

import json
import os


SIZES = {
    "base": {},  # the demo preset's shape
    "wide": dict(hidden_size=256, intermediate_size=768, num_heads=8, num_kv_heads=4),
    # The research backbone (the research preset's shape), shipped in the repository
    # (backbones/research_v2/final; launch/backbone.py makes it, never a study), and its early
    # SFT checkpoint (backbones/research_v2/early): the research study's two regimes.
    "backbone": {},
    "backbone_early": {},
}


DAC_START = "dac_start"  # pseudo-method: the DAC agent before RL (the generator's warm start)
GENERATOR_SFT = "generator_sft"  # {root}/{size}/generator_sft: the generator's warm start


SPLITS = ("dev", "test")


def result_path(root: str, spec: str) -> str:
  """Where a finished size/method/seed run (or size/sft/0: the SFT start's eval) leaves its
  result; a run whose result exists is not run again."""
  size, method, seed = spec.split("/")
  if method == "sft":
    return os.path.join(root, size, "start.json")
  if method == GENERATOR_SFT:
    return os.path.join(root, size, GENERATOR_SFT, "result.json")
  return os.path.join(root, size, method, f"seed{seed}", "result.json")


def point_at_world(config, root: str, size: str) -> None:
  """Paths of a demo config moved under `root`, and the model shape of `size`."""
  from agentjax.data.demo_world import use_demo_world
  use_demo_world(config, root)
  for k, v in SIZES[size].items():
    config.model.shape[k] = v


def sft_config(root: str, size: str):
  from configs import sft
  config = sft.get_config("demo")
  point_at_world(config, root, size)
  return config


def split_result(root: str, split: str, rows: list[dict]) -> dict:
  """Eval rows ({"id", "f1", "em", ...} a question) as the report reads them; acc is the CW-GRPO
  code's accuracy, the share of questions whose EM is > 0."""
  from agentjax.data.demo_world import f1_by_hops, hops_by_id
  n = len(rows)
  hops = hops_by_id(os.path.join(root, "synthworld", f"{split}.jsonl"))
  return {"f1": sum(q["f1"] for q in rows) / n, "em": sum(q["em"] for q in rows) / n,
          "acc": sum(q["em"] > 0 for q in rows) / n, "n": n,
          "per_hop": {f"{h}-hop": f1 for h, f1 in f1_by_hops(rows, hops).items()},
          "f1_by_id": {q["id"]: q["f1"] for q in rows},
          "em_by_id": {q["id"]: q["em"] for q in rows}, **answer_scores(rows),
          # an agent that may abstain (DAC): per question, for the paired abstention tests
          **({"abstained_by_id": {q["id"]: float(q["abstained"]) for q in rows},
              "sufficient_by_id": {q["id"]: float(q["sufficient"]) for q in rows}}
             if rows and all("abstained" in q for q in rows) else {})}


def answer_scores(rows: list[dict]) -> dict:
  """Coverage (share of questions answered: not abstained, not invalid), accuracy when answered
  (EM > 0) and, for an agent that may abstain (rows with "abstained" and "sufficient": DAC), the
  abstention rate and its precision P(S = 0 | abstained) and recall P(abstained | S = 0)
  (evaluation.row_means); a monolithic agent never abstains (rate 0, no precision or recall)."""
  from agentjax.train.evaluation import ABSTENTION_SCORES, row_means
  if rows and all("abstained" in q for q in rows):
    means = row_means(rows)
    return {k: means[k] for k in ABSTENTION_SCORES}
  answered = [q for q in rows if q["answer"] is not None]
  return {"coverage": len(answered) / len(rows) if rows else 0.0,
          "accuracy_answered": (sum(q["em"] > 0 for q in answered) / len(answered)
                                if answered else 0.0), "abstain_rate": 0.0}


def write_json(path: str, obj) -> None:
  """`obj` as JSON at `path` (its folder made if missing), written beside it and renamed over it."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f)
  os.replace(tmp, path)  # a killed run never leaves a half-written result


def read_json(path: str):
  """The JSON object in `path`, or None when there is no such file (a run not finished)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
