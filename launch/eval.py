r"""EM, F1 and accuracy per benchmark, from a run's checkpoint or a Hugging Face folder.

  python launch/eval.py --workdir=runs/demo/igpo      # with the config the run recorded
  python launch/eval.py --workdir=runs/demo/igpo --config.data.eval_split=test
  python launch/eval.py --config=configs/igpo.py:qwen2.5-7b --hf_path=models/Qwen2.5-7B-Instruct \
      --config.data.eval_size=0 --output=results/qwen7b_test.json
  # CW-GRPO's evaluation: its 400-question mix, 4 samples per question at temperature 1
  python launch/eval.py --config=configs/cw_grpo.py:qwen3-8b --workdir=/mnt/shared/runs/cw8b \
      --config.data.eval=cw_grpo_400 --samples=4 --temperature=1.0
  # DAC: the searcher then the generator (both adapters of the run); an abstention is wrong
  python launch/eval.py --config=configs/dac.py:demo --workdir=runs/demo/dac
  # Co-ReAct: the policy guided by a rubric generator's rubrics (shadow suffix, verify, retry)
  python launch/eval.py --config=configs/coreact.py:demo --hf_path=runs/demo/sft/hf_export \
      --agent=coreact --rubric_generator=runs/demo/coreact/rubric/hf_export
  # the rubric generator itself: held-out Spearman of its rubrics (greedy, or sampled)
  python launch/eval.py --config=configs/coreact.py:demo --hf_path=runs/demo/coreact/rubric/hf_export \
      --temperature=1.0 --samples=4
  # Best-of-N: 4 sampled actions per step, the one the rubric scores highest (or --select=self:
  # the policy's own mean log-prob)
  python launch/eval.py --config=configs/coreact.py:agent --hf_path=runs/demo/sft/hf_export \
      --agent=best_of_n --select=rubric --rubric_generator=runs/demo/coreact/rubric/hf_export \
      --temperature=1.0

Benchmarks: config.data.eval (comma-separated names, or a named list such as cw_grpo_400 that
fixes each member's split and size: agentjax/data/searchqa.py BENCHMARK_LISTS), split
config.data.eval_split, the first config.data.eval_size questions of each (0: all), with the
config's retriever and rollout limits. Greedy, one rollout per question, unless --temperature:
then --samples rollouts per question sampled at that temperature, seeded by config.seed.
Accuracy is the share of samples whose answer EM > 0; "overall" is the mean over every sample of
the mix (CW-GRPO's code), "average" the macro average over benchmarks
(agentjax/train/evaluation.py). A DAC run (trainer "dac") is evaluated as it trains: the searcher
gathers evidence, the generator answers or abstains; an abstention scores 0, and each benchmark
also reports coverage (the share answered), accuracy when answered, and the abstention rate with
its precision and recall against insufficient evidence.

--agent picks the agent on the policy: "react" (the rollout engine as training runs it), "coreact"
or "best_of_n" (agentjax/coreact/guided.py with config.coreact's settings: verify,
verify_threshold, max_retries, persist, best_of_n, best_of_n_select; the rubric generator is
--rubric_generator or config.coreact.generator_path, the applier config.coreact.applier). Every
agent's result also reports the redundant-query rate (the share of searches whose normalized
query repeats an earlier query of the same trajectory) and the steps to answer (the mean turns
of the trajectories that answered); a guided agent's JSON records its settings, the generator
and applier identities and its counts (rubrics, verify retries, mean verify score).

With --workdir and no --config, the config is the one the run recorded ({workdir}/config.json),
with any --config.* overrides on top; each such command is appended to {workdir}/overrides.jsonl
(launch/common.py). Prints a table, writes JSON (per-sample answers and the judge identity included) to --output
(default {workdir}/eval_{split}_{step}[_samples{S}_t{T}].json, or
{hf_path}_eval_{split}[...].json beside the folder), and prints one JSON line last. Multi-host:
the same flags as launch/train.py; process 0 writes.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

import common  # launch/common.py: the entry point, the run config, multi-host flags
from agentjax.coreact import AGENTS, SELECTS  # names only: no jax import

_CONFIG = common.define_config("Config file and preset (default, with --workdir: the config the "
                               "run recorded).")
_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir: evaluate its checkpoint.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_HF_PATH = flags.DEFINE_string("hf_path", None, "A Hugging Face folder to evaluate instead.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON output path.")
_SAMPLES = flags.DEFINE_integer("samples", 1, "Rollouts per question (> 1 needs --temperature).")
_TEMPERATURE = flags.DEFINE_float("temperature", None,
                                  "Sampling temperature (> 0); unset: greedy decoding.")
_AGENT = flags.DEFINE_enum("agent", "react", list(AGENTS),
                           "The agent: plain ReAct, rubric-guided Co-ReAct, or Best-of-N.")
_GENERATOR = flags.DEFINE_string("rubric_generator", None,
                                 "The rubric generator's Hugging Face folder (default "
                                 "config.coreact.generator_path).")
_SELECT = flags.DEFINE_enum("select", None, list(SELECTS),
                            "Best-of-N selection (default config.coreact.best_of_n_select).")


def _write_rubric_result(result):
  """A rubric generator's held-out scores: the JSON file, then one JSON line of the means."""
  import jax
  if jax.process_index() != 0:
    return
  sampled = "" if _TEMPERATURE.value is None else \
      f"_samples{_SAMPLES.value}_t{_TEMPERATURE.value:g}"
  output = _OUTPUT.value or os.path.join(
      _WORKDIR.value or os.path.dirname(os.path.abspath(_HF_PATH.value)),
      f"eval_rubrics{sampled}.json")
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output, "w") as f:
    json.dump(result, f, indent=1)
  print(f"per-branch results: {output}")
  scores = {k: v for k, v in result["rubric"].items() if k != "per_question"}
  print(json.dumps({"eval": result["source"], "split": result["split"],
                    "samples": result["samples"], "temperature": result["temperature"],
                    "rubric": {k: round(v, 4) if isinstance(v, float) else v
                               for k, v in scores.items()}}))


def _rounded(scores):
  return {k: round(v, 4) for k, v in scores.items()}


def main(_):
  if (_WORKDIR.value is None) == (_HF_PATH.value is None):
    raise app.UsageError("give exactly one of --workdir or --hf_path")
  if _SAMPLES.value < 1:
    raise app.UsageError(f"--samples={_SAMPLES.value}: must be >= 1")
  if _TEMPERATURE.value is not None and not _TEMPERATURE.value > 0:
    raise app.UsageError(f"--temperature={_TEMPERATURE.value}: must be > 0 (unset: greedy)")
  if _SAMPLES.value > 1 and _TEMPERATURE.value is None:
    raise app.UsageError(f"--samples={_SAMPLES.value} needs --temperature: greedy samples are "
                         f"identical")
  config, agent = _CONFIG.value, _AGENT.value
  if agent != "react" and config.trainer == "rubric":
    # A rubric-trainer config (configs/coreact.py:demo): the guided agent is its search agent.
    # (--agent=react with such a config evaluates the rubric generator on its held-out branch
    # points instead.)
    from configs.coreact import agent_config
    config = agent_config(config)
  if agent != "react" and config.trainer == "dac":
    raise app.UsageError(f"--agent={agent}: a DAC run is evaluated as its two roles (react)")
  if agent == "react" and (_GENERATOR.value or _SELECT.value):
    raise app.UsageError("--rubric_generator / --select need --agent=coreact or best_of_n")
  if _SELECT.value:
    config.coreact.best_of_n_select = _SELECT.value
  if agent == "best_of_n" and _TEMPERATURE.value is None:
    raise app.UsageError("--agent=best_of_n needs --temperature: greedy proposals are identical")
  needs_generator = agent == "coreact" or (agent == "best_of_n" and
                                           config.coreact.best_of_n_select == "rubric")
  if needs_generator and not (_GENERATOR.value or config.coreact.generator_path):
    raise app.UsageError(f"--agent={agent} needs a rubric generator: --rubric_generator=<HF "
                         f"folder> or --config.coreact.generator_path")
  common.init_distributed()
  _CONFIG.record()
  import jax
  from agentjax.train.evaluation import ABSTENTION_SCORES, eval_benchmarks, format_table
  guided = []  # the engine eval_benchmarks builds, to read its settings and counts after

  def make_engine(config, engine, mesh):
    from agentjax.coreact.guided import make_guided_engine
    guided.append(make_guided_engine(
        config, engine.cfg, engine.tokenizer, engine.backend, engine.config, agent,
        generator_path=_GENERATOR.value, mesh=mesh, lora=engine.model.lora))
    return guided[-1]

  result = eval_benchmarks(config, workdir=_WORKDIR.value, hf_path=_HF_PATH.value,
                           step=_STEP.value, samples=_SAMPLES.value,
                           temperature=_TEMPERATURE.value,
                           make_engine=None if agent == "react" else make_engine)
  if "rubric" in result:  # a rubric generator (trainer "rubric"): held-out branch points
    _write_rubric_result(result)
    return
  result["agent"] = {"name": agent}
  if guided:
    engine = guided[0]
    result["agent"].update(engine.settings.describe(), stats=engine.summary())
    if engine.rubric_source is not None and hasattr(engine.rubric_source, "identity"):
      result["agent"]["rubric_generator"] = dict(engine.rubric_source.identity(),
                                                 stats=dict(engine.rubric_source.stats))
    if engine.applier is not None:
      result["agent"]["applier"] = engine.applier.identity()
  if jax.process_index() != 0:
    return
  split = result["split"]
  sampled = "" if _TEMPERATURE.value is None else \
      f"_samples{_SAMPLES.value}_t{_TEMPERATURE.value:g}"
  if agent != "react":  # beside the plain eval, not over it
    sampled = f"_{agent}{sampled}"
  if _OUTPUT.value:
    output = _OUTPUT.value
  elif _WORKDIR.value:  # one file per evaluated step (and sampling)
    output = os.path.join(_WORKDIR.value,
                          f"eval_{split}_{os.path.basename(result['source'])}{sampled}.json")
  else:  # beside the folder, named after it
    folder = os.path.abspath(_HF_PATH.value).rstrip("/")
    output = f"{folder}_eval_{split}{sampled}.json"
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output, "w") as f:
    json.dump(result, f, indent=1)
  print(format_table(result))
  print(f"per-question results: {output}")
  print(json.dumps({"eval": result["source"], "split": split, "samples": result["samples"],
                    "temperature": result["temperature"], "judge": result["judge"],
                    "agent": {k: v for k, v in result["agent"].items() if k != "stats"},
                    **{name: {"accuracy": round(b["accuracy"], 4), "em": round(b["em"], 4),
                              "f1": round(b["f1"], 4), "n": b["n"],
                              **{k: None if b[k] is None else round(b[k], 4)
                                 for k in ("redundant_query_rate", "steps_to_answer")
                                 if k in b},
                              # DAC: coverage, accuracy when answered, abstention rate/P/R
                              **{k: round(b[k], 4) for k in ABSTENTION_SCORES if k in b}}
                       for name, b in result["benchmarks"].items()},
                    "overall": _rounded(result["overall"]),
                    "average": _rounded(result["average"])}))


if __name__ == "__main__":
  common.run(main)
