"""The launch scripts' command line (launch/common.py): a workdir's recorded config as the default
with --config.* overrides on top (and their history), one-line user errors with exit status 2,
--verbose, quiet logs."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest
from absl import flags

from configs import igpo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_common():
  """launch/common.py as a module (the scripts import it as `common`, beside them)."""
  if "launch_common" not in sys.modules:
    spec = importlib.util.spec_from_file_location("launch_common",
                                                  os.path.join(ROOT, "launch", "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["launch_common"] = module
  return sys.modules["launch_common"]


common = _load_common()


def _record_run(workdir, **changes):
  """A workdir as a run's checkpointer leaves it: config.json (the demo IGPO config with
  `changes`, the fields recorded beside it, one field of a later version missing)."""
  config = igpo.get_config("demo")
  for dotted, value in changes.items():
    section, field = dotted.split(".")
    config[section][field] = value
  recorded = json.loads(json.dumps(config.to_dict()))
  recorded.update(judge_identity={"backend": "none"}, lora=None)  # beside the config fields
  del recorded["train"]["final_eval"]  # as a run recorded before the field existed
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(recorded, f)


def _define(argv, **kwargs):
  """define_config on its own flag values (with --workdir, as the scripts define it), parsed."""
  values = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  source = common.define_config("the run config", argv=argv, flag_values=values, **kwargs)
  if source.error is None:
    values(argv)
  return source


def test_a_workdirs_recorded_config_is_the_base_and_its_overrides_are_recorded(tmp_path):
  workdir = str(tmp_path / "run")
  _record_run(workdir, **{"model.tokenizer_path": "", "train.steps": 20})
  source = _define(["train.py", f"--workdir={workdir}", "--config.train.steps=40",
                    "--config.train.final_eval=False"])
  assert source.error is None and source.source() == "recorded"
  config = source.value
  assert config.train.steps == 40 and config.train.final_eval is False
  assert config.model.tokenizer_path == ""  # the run's own value, not the config file's
  assert config.algorithm == "igpo" and config.rl.igpo_norm == "separate"
  assert "judge_identity" not in config and "lora" not in config  # not config fields
  assert isinstance(config.sft.length_buckets, tuple)  # JSON's list back to the field's tuple
  assert source.overrides == {"train.steps": 40, "train.final_eval": False}

  path = source.record("train.py")
  again = _define(["eval.py", f"--workdir={workdir}"])
  again.record("eval.py")
  with open(path) as f:
    lines = [json.loads(line) for line in f]
  assert [(r["script"], r["config"], r["overrides"]) for r in lines] == [
      ("train.py", "recorded", {"train.steps": 40, "train.final_eval": False}),
      ("eval.py", "recorded", {})]
  assert all(r["time"].endswith("+00:00") for r in lines)
  assert again.value.train.steps == 20  # an override applies to its own command only


def test_a_config_file_wins_over_the_record_and_takes_overrides(tmp_path):
  workdir = str(tmp_path / "run")
  _record_run(workdir, **{"train.steps": 20})
  source = _define(["train.py", "--config=configs/grpo.py:demo", f"--workdir={workdir}",
                    "--config.train.steps=3"])
  assert source.source() == "configs/grpo.py:demo" and source.value.algorithm == "grpo"
  assert source.value.train.steps == 3 and source.overrides == {"train.steps": 3}


def test_no_config_and_no_record_is_a_one_line_error(tmp_path):
  source = _define(["train.py", f"--workdir={tmp_path}/new"])
  with pytest.raises(common.UserError, match=r"^--config: missing: .*/new holds no recorded "
                     r"config \(config.json\).*--config=configs/igpo.py:demo"):
    source.check()
  assert _define(["serve.py"], required=False).check() is None  # serve.py --hf_path needs none


def test_a_default_config_file_takes_overrides_and_a_misspelling_is_one_line():
  """define_config(default=...): the default file when the command line gives none (soak.py,
  backbone.py); it is loaded as the flag is defined, so a misspelled override is found then."""
  source = _define(["soak.py", "--config.train.steps=3"], default="configs/igpo.py:demo")
  assert source.error is None and source.source() == "configs/igpo.py:demo"
  assert source.value.train.steps == 3 and source.value.algorithm == "igpo"
  given = _define(["soak.py", "--config=configs/grpo.py:demo"], default="configs/igpo.py:demo")
  assert given.source() == "configs/grpo.py:demo" and given.value.algorithm == "grpo"
  bad = _define(["soak.py", "--config.train.stpes=3"], default="configs/igpo.py:demo")
  assert str(bad.error) == ("--config.train.stpes: config.train has no field 'stpes'; did you "
                            "mean config.train.steps or config.train.stale?")
  values = flags.FlagValues()  # a script without --workdir: the error names no workdir
  missing = common.define_config("c", argv=["x.py"], flag_values=values,
                                 example="configs/coreact.py:collect")
  values(["x.py"])
  with pytest.raises(common.UserError, match=r"^--config: missing; give a config file and "
                     r"preset, e.g. --config=configs/coreact.py:collect$"):
    missing.check()


def test_a_misspelled_override_names_the_closest_fields(tmp_path):
  workdir = str(tmp_path / "run")
  _record_run(workdir)
  source = _define(["train.py", f"--workdir={workdir}", "--config.train.stpes=40"])
  assert str(source.error) == ("--config.train.stpes: config.train has no field 'stpes'; "
                               "did you mean config.train.steps or config.train.stale?")
  config = igpo.get_config("demo")
  with pytest.raises(common.UserError, match=r"config has no field 'trian'; did you mean "
                     r"config.train.steps\?$"):
    common.check_overrides(config, ["trian.steps"])
  with pytest.raises(common.UserError, match=r"config.train has no field 'nonexistent'; its "
                     r"fields: async_steps, .*, steps"):
    common.check_overrides(config, ["train.nonexistent"])
  with pytest.raises(common.UserError, match=r"config.train.steps is the int 30, not a section"):
    common.check_overrides(config, ["train.steps.x"])
  common.check_overrides(config, ["train.steps", "model.lora.rank"])  # real fields pass


def test_a_config_missing_a_field_names_the_closest_fields_it_has():
  """A config file that misspells a field: validation names the field it lacks and the
  misspelling (config.unknown_field's suggestion)."""
  from agentjax.models.qwen.config import ConfigError
  from agentjax.train import config as config_lib
  config = igpo.get_config("demo")
  config.rollout.group_sise = config.rollout.group_size
  del config.rollout["group_size"]
  with pytest.raises(ConfigError, match=r"^config.rollout.group_size is missing \(a config "
                     r"starts from configs/base.py's get_config\): config.rollout has no field "
                     r"'group_size'; did you mean config.rollout.group_sise\?$"):
    config_lib.validate(config)


def test_an_unreadable_record_is_one_line_naming_the_file(tmp_path):
  for text, why in (("{not json", r"cannot be read \(Expecting property name"),
                    ("[1, 2]", "holds list, not a run's config")):
    (tmp_path / "config.json").write_text(text)
    source = _define(["eval.py", f"--workdir={tmp_path}"])
    with pytest.raises(common.UserError, match=rf"^{tmp_path}/config.json: {why}.*; give the "
                       r"run's --config instead$"):
      source.check()


def test_a_checkpoint_mismatch_says_omitting_config_continues_the_run(tmp_path, monkeypatch):
  from agentjax.train.checkpoint import CheckpointMismatchError
  workdir = str(tmp_path / "run")
  _record_run(workdir)
  source = _define(["eval.py", "--config=configs/igpo.py:demo", f"--workdir={workdir}"])
  monkeypatch.setattr(common, "_CONFIGS", [source])
  e = CheckpointMismatchError("config field 'model.tokenizer_path' differs from the run that "
                              "wrote the checkpoints in x (latest step 20): stored '', current "
                              "'tok'. Use a fresh workdir, or set it back to '' to resume.")
  message = common.user_error_message(e)
  assert "\n" not in message and "stored '', current 'tok'" in message
  assert message.endswith(f"; or omit --config to continue the recorded run ({workdir}/"
                          f"config.json, with --config.* overrides on top)")
  assert common.user_error_message(RuntimeError("a bug")) is None  # not a user error


def test_quiet_logs_keep_agentjax_info_and_every_warning():
  def passes(name, level, msg="x"):
    record = logging.LogRecord(name, level, __file__, 1, msg, None, None)
    return all(f.filter(record) for f in handler.filters)

  handler = logging.NullHandler()
  root = logging.getLogger()
  level = root.level
  root.addHandler(handler)
  try:
    common.quiet_logs(verbose=False)
    assert passes("agentjax.train.trainer", logging.INFO) and passes("__main__", logging.INFO)
    assert not passes("absl", logging.INFO)  # orbax's and tfds's INFO lines come through absl
    assert not passes("jax._src.dispatch", logging.INFO)
    assert passes("orbax", logging.WARNING) and passes("absl", logging.ERROR)
    assert not passes("jax._src.xla_bridge", logging.WARNING,
                      "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    common.quiet_logs(verbose=True)
    assert passes("absl", logging.INFO) and passes("jax._src.xla_bridge", logging.INFO,
                                                   "Unable to initialize backend 'tpu'")
  finally:
    root.removeHandler(handler)
    root.setLevel(level)


def _launch(*args):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def test_a_bad_override_exits_2_with_one_line_and_verbose_shows_the_traceback(tmp_path):
  workdir = str(tmp_path / "run")
  args = ["launch/train.py", "--config=configs/igpo.py:demo", f"--workdir={workdir}",
          "--config.train.nonexistent=1"]
  proc = _launch(*args)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      "error: --config.train.nonexistent: config.train has no field 'nonexistent'; its "
      "fields: " + ", ".join(sorted(igpo.get_config("demo").train.keys()))]
  assert not os.path.exists(workdir)  # nothing ran
  verbose = _launch(*args, "--verbose")
  assert verbose.returncode == 2 and "Traceback (most recent call last)" in verbose.stderr
  assert verbose.stderr.splitlines()[-1] == proc.stderr.strip()


def test_the_demos_misspelled_override_is_one_line(tmp_path):
  """The demo's two config flags have default files, loaded as the flags are defined: a
  misspelling there is one line too (it was a traceback raised at import)."""
  proc = _launch("launch/demo.py", f"--root={tmp_path / 'demo'}", "--rl_config.train.stpes=3")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      "error: --rl_config.train.stpes: rl_config.train has no field 'stpes'; did you mean "
      "rl_config.train.steps or rl_config.train.stale?"]
  assert not os.path.exists(tmp_path / "demo")


@pytest.mark.slow
def test_eval_and_train_continue_a_finished_run_from_its_workdir(world_dir, tiny_tokenizer_dir,
                                                                 tmp_path):
  """A tiny run's commands as a user types them: train with a config file, then eval and more
  steps with --workdir alone; the config file again with a changed field is refused in one
  line that says how to continue."""
  workdir = str(tmp_path / "run")
  tiny = ["--config.model.hf_path=", "--config.model.preset=tiny",
          f"--config.model.tokenizer_path={tiny_tokenizer_dir}",
          f"--config.data.manual_dir={world_dir}", f"--config.data.data_dir={tmp_path}/tfds",
          "--config.data.eval_size=4", f"--config.retrieval.corpus_path={world_dir}/corpus.jsonl",
          f"--config.retrieval.index_dir={tmp_path}/bm25", "--config.rollout.group_size=2",
          "--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=24",
          "--config.rollout.max_total_tokens=512", "--config.rl.prompts_per_step=2",
          "--config.rl.minibatch_size=2", "--config.train.eval_batch=4",
          "--config.train.checkpoint_every=1", "--config.train.steps=1",
          "--config.train.final_eval=False"]
  first = _launch("launch/train.py", "--config=configs/igpo.py:demo", f"--workdir={workdir}",
                  *tiny)
  assert first.returncode == 0, first.stderr[-3000:]
  assert json.loads(first.stdout.splitlines()[-1])["evals"] == {}  # final_eval off
  assert "orbax" not in first.stderr and "checkpoint_manager" not in first.stderr  # quiet

  ev = _launch("launch/eval.py", f"--workdir={workdir}")
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert json.loads(ev.stdout.splitlines()[-1])["eval"].endswith("checkpoints/1")
  more = _launch("launch/train.py", f"--workdir={workdir}", "--config.train.steps=2")
  assert more.returncode == 0, more.stderr[-3000:]
  assert json.loads(more.stdout.splitlines()[-1])["step"] == 2

  changed = _launch("launch/train.py", "--config=configs/igpo.py:demo", f"--workdir={workdir}",
                    *tiny, "--config.seed=7")
  assert changed.returncode == 2, changed.stderr[-3000:]
  error = changed.stderr.strip().splitlines()[-1]  # after the run's own INFO lines
  assert error.startswith("error: config field 'seed' differs") and "Traceback" not in \
      changed.stderr
  assert "stored 0, current 7" in error and "omit --config to continue the recorded run" in error
  with open(os.path.join(workdir, "overrides.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert [(r["script"], r.get("config"), r.get("overrides", {}).get("train.steps"),
           "error" in r) for r in history] == [
      ("train.py", "configs/igpo.py:demo", 1, False), ("eval.py", "recorded", None, False),
      ("train.py", "recorded", 2, False), ("train.py", "configs/igpo.py:demo", 1, False),
      ("train.py", None, None, True)]
