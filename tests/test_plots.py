"""Learning curves (agentjax/plots.py, launch/plot.py) and progress bars (agentjax/bars.py), on
metrics files written here: no model is built."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from agentjax import bars
from agentjax.plots import (default_out_dir, default_weight, eval_stderr, plot_run, plot_runs,
                            read_run, smooth)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_metrics(workdir, rows, raw_tail: str = "") -> str:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")  # NaN is written as the token NaN, as the trainer writes it
    f.write(raw_tail)
  return str(workdir)


def _rl_run(workdir, steps: int = 12) -> str:
  """An RL run as the trainer writes it: a step row per step (one reward NaN, one row without
  "loss"), eval rows at steps 0 and `steps` with their eval/<step>.json, and a half-written last
  line (a kill mid-append)."""
  rng = np.random.default_rng(0)
  rows = [{"eval/f1": 0.2, "eval/em": 0.1, "eval/seconds": 1.0, "step": 0}]
  for step in range(1, steps + 1):
    row = {"reward": float(rng.uniform(0.05, 0.5)), "f1": 0.3, "turns": 2.0,
           "format_error_rate": 0.1, "loss": -0.1, "entropy": 3.0, "step_s": 2.0, "step": step}
    if step == 4:
      row["reward"] = float("nan")
    if step == 7:
      del row["loss"]
    rows.append(row)
  rows.append({"eval/f1": 0.3, "eval/em": 0.2, "eval/seconds": 1.0, "step": steps})
  _write_metrics(workdir, rows, raw_tail='{"reward": 0.3, "st')
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  for step, f1s in ((0, [0.0, 0.5, 0.1]), (steps, [1.0, 0.0, 0.4, 0.2])):
    with open(os.path.join(workdir, "eval", f"{step}.json"), "w") as f:
      json.dump({"step": step, "f1": float(np.mean(f1s)),
                 "per_question": [{"id": f"q{i}", "f1": v, "em": float(v == 1.0)}
                                  for i, v in enumerate(f1s)]}, f)
  return str(workdir)


def _assert_png(path):
  with open(path, "rb") as f:
    data = f.read()
  assert data[:8] == PNG_MAGIC and len(data) > 1000, path


# ------------------------------------------------------------------------------ figures


def test_an_rl_run_gets_its_figures_as_valid_pngs(tmp_path):
  workdir = _rl_run(tmp_path / "igpo")
  paths = plot_run(workdir)
  names = ["reward", "eval", "rollouts", "loss", "step_time"]
  assert paths == [os.path.join(workdir, "plots", f"{n}.png") for n in names]
  for path in paths:
    _assert_png(path)
  run = read_run(workdir)
  steps, rewards = run.series["reward"]
  assert steps.tolist() == list(range(1, 13))  # the half-written last line is skipped
  assert math.isnan(rewards[3]) and np.isfinite(np.delete(rewards, 3)).all()
  assert 7 not in run.series["loss"][0].tolist()  # a row without the key is no point of it
  assert run.series["eval/f1"][0].tolist() == [0, 12] and run.kind == "rl"


def test_an_sft_run_gets_its_loss_figure_only(tmp_path):
  workdir = _write_metrics(tmp_path / "sft", [
      {"step": s, "loss": 7.0 / s, "accuracy": 0.1 * s, "tokens": 100.0, "lr": 1e-3}
      for s in range(1, 6)])
  out = tmp_path / "elsewhere"
  assert plot_run(workdir, str(out)) == [str(out / "sft_loss.png")]
  _assert_png(out / "sft_loss.png")


def test_a_single_step_is_plotted(tmp_path):
  workdir = _write_metrics(tmp_path / "one", [{"reward": 0.25, "loss": 0.1, "step": 1}])
  paths = plot_run(workdir)
  assert os.path.join(workdir, "plots", "reward.png") in paths
  for path in paths:
    _assert_png(path)


def test_an_empty_or_missing_metrics_file_is_a_clear_error(tmp_path):
  empty = _write_metrics(tmp_path / "empty", [], raw_tail="\n")
  with pytest.raises(ValueError, match=r"metrics.jsonl: no metric rows yet"):
    plot_run(empty)
  with pytest.raises(FileNotFoundError, match=r"nope.metrics.jsonl: no such file"):
    plot_run(str(tmp_path / "nope"))
  assert not os.path.exists(os.path.join(empty, "plots"))


def test_runs_overlaid_in_one_folder(tmp_path):
  a, b = _rl_run(tmp_path / "runs" / "igpo"), _rl_run(tmp_path / "runs" / "grpo", steps=6)
  out = default_out_dir([a, b])
  assert out == str(tmp_path / "runs" / "plots")
  paths = plot_runs([a, b], out)
  assert [os.path.basename(p) for p in paths] == ["reward.png", "eval.png", "rollouts.png",
                                                  "loss.png", "step_time.png"]
  assert default_out_dir([a]) == os.path.join(a, "plots")


def test_eval_error_bars_are_the_standard_error_over_questions(tmp_path):
  workdir = _rl_run(tmp_path / "run")
  values = np.array([1.0, 0.0, 0.4, 0.2])
  assert eval_stderr(workdir, 12, "f1") == pytest.approx(values.std(ddof=1) / 2.0)
  assert eval_stderr(workdir, 5, "f1") is None  # no eval at that step


def test_plot_cli_overlays_runs_and_fails_in_one_line(tmp_path):
  a, b = _rl_run(tmp_path / "a"), _rl_run(tmp_path / "b")
  out = tmp_path / "cmp"
  proc = subprocess.run([sys.executable, "launch/plot.py", f"--workdir={a}", f"--workdir={b}",
                         f"--out_dir={out}", "--smoothing=0.5"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == [str(out / f"{n}.png") for n in
                                 ("reward", "eval", "rollouts", "loss", "step_time")]
  proc = subprocess.run([sys.executable, "launch/plot.py", f"--workdir={tmp_path / 'none'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"error: {tmp_path / 'none' / 'metrics.jsonl'}: no such file (is "
      f"'{tmp_path / 'none'}' a run's workdir? the trainer writes metrics.jsonl after the run's "
      f"first step)"]


# ------------------------------------------------------------------------------ smoothing


def _ema_reference(values, weight):
  """The debiased EMA in closed form: at i, the weight^(age) weighted mean of the finite values
  up to i, ages counted in finite values; NaN before the first finite one."""
  x = np.asarray(values, np.float64)
  finite = np.isfinite(x)
  out = np.full(len(x), np.nan)
  for i in range(len(x)):
    seen = x[:i + 1][finite[:i + 1]]
    if seen.size:
      w = weight ** np.arange(seen.size - 1, -1, -1, dtype=np.float64)
      out[i] = (w * seen).sum() / w.sum()
  return out


@pytest.mark.parametrize("weight", [0.0, 0.5, 0.8, 0.95])
def test_smoothing_matches_the_closed_form(weight):
  values = np.random.default_rng(1).uniform(0.07, 0.5, 40)
  values[[0, 9, 10, 25]] = [np.nan, np.nan, np.inf, np.nan]
  np.testing.assert_allclose(smooth(values, weight), _ema_reference(values, weight),
                             rtol=1e-12, equal_nan=True)
  if weight == 0.0:  # no smoothing: the values, gaps carrying the last one
    assert smooth([0.1, np.nan, 0.3], 0.0)[1] == 0.1


def test_smoothing_weight_is_checked_and_chosen_by_length():
  with pytest.raises(ValueError, match=r"smoothing weight=1.0: must be in \[0, 1\)"):
    smooth([1.0], 1.0)
  assert default_weight(30) == pytest.approx(0.8) and default_weight(1000) == pytest.approx(0.95)
  assert default_weight(10**6) == pytest.approx(0.95) and default_weight(1) == pytest.approx(0.8)


# ------------------------------------------------------------------------------ progress bars


def test_lines_mode_stays_short_for_many_steps(monkeypatch):
  monkeypatch.setenv(bars.ENV, "lines")
  out = io.StringIO()
  with bars.progress_bar(100_000, "sft", stream=out, primary=True) as bar:
    for step in range(100_000):
      bar.update(1)
      bar.set_postfix_str(f"loss {1.0 / (step + 1):.3g}", refresh=False)
  text = out.getvalue()
  lines = text.splitlines()
  # The first line, one per tenth of the run (a few more only if the loop took over 30 s), no
  # carriage returns.
  assert 11 <= len(lines) <= 14 and "\r" not in text
  assert lines[0].startswith("sft: 0/100000 steps (0%)")
  assert lines[-1].startswith("sft: 100000/100000 steps (100%)") and "| loss 1e-05" in lines[-1]


def test_lines_mode_without_a_total_reports_at_start_and_end(monkeypatch):
  monkeypatch.setenv(bars.ENV, "lines")
  out = io.StringIO()
  bar = bars.progress_bar(None, "eval", unit="question", stream=out, primary=True)
  for _ in range(5000):
    bar.update(1)
  bar.close()
  bar.close()  # a second close writes nothing
  lines = out.getvalue().splitlines()
  assert lines[0] == "eval: 0 questions, 0 s" and lines[-1].startswith("eval: 5000 questions")
  assert len(lines) <= 3


def test_progress_mode_follows_the_environment_and_the_process(monkeypatch):
  tty = types.SimpleNamespace(isatty=lambda: True)
  monkeypatch.delenv(bars.ENV, raising=False)
  assert bars.progress_mode(io.StringIO(), primary=True) == "lines"  # not a terminal
  assert bars.progress_mode(tty, primary=True) == "bar"
  assert bars.progress_mode(tty, primary=False) == "off"  # only process 0 draws
  monkeypatch.setenv(bars.ENV, "off")
  out = io.StringIO()
  with bars.progress_bar(10, "x", stream=out, primary=True) as bar:
    bar.update(10)
  assert out.getvalue() == ""
  monkeypatch.setenv(bars.ENV, "lines")
  assert bars.progress_mode(tty, primary=True) == "lines"
  monkeypatch.setenv(bars.ENV, "sometimes")
  with pytest.raises(ValueError, match=r"AGENTJAX_PROGRESS='sometimes': must be one of auto, "
                                       r"bar, lines, off"):
    bars.progress_mode(io.StringIO(), primary=True)


def test_train_bar_keeps_the_step_postfix_across_an_eval_row(tmp_path, monkeypatch, capsys):
  from agentjax.train.trainer import MetricsWriter
  monkeypatch.setenv(bars.ENV, "lines")
  writer = MetricsWriter(str(tmp_path), 2, 0, prefix="igpo")
  writer.write(1, {"reward": 0.25, "step_s": 3.0}, ("reward", "step_s"))
  writer.write(1, {"eval/f1": 0.5})  # an eval's row: no postfix of its own
  assert writer.bar.postfix == "reward 0.25 step_s 3"
  writer.write(2, {"reward": 0.5, "step_s": 3.0}, ("reward", "step_s"))
  writer.close()
  lines = capsys.readouterr().err.splitlines()
  assert lines[0].startswith("igpo: 0/2 steps")
  assert lines[1].startswith("igpo: 1/2 steps") and lines[1].endswith("| reward 0.25 step_s 3")
  assert lines[-1].startswith("igpo: 2/2 steps") and lines[-1].endswith("| reward 0.5 step_s 3")
  assert len(lines) == 3


def test_evaluate_reports_questions_done(monkeypatch, capsys):
  from agentjax.train.evaluation import evaluate
  monkeypatch.setenv(bars.ENV, "lines")

  class Engine:
    def run(self, params, questions, rng):
      n = len(questions)
      return types.SimpleNamespace(answers=np.array(["paris"] * n, object),
                                   answered=np.ones(n, bool), num_turns=np.ones(n, int),
                                   format_valid=np.ones(n, bool)), {}

  records = [{"id": str(i), "question": "q", "golden_answers": ["Paris"]} for i in range(5)]
  out = evaluate(Engine(), None, records, batch_size=2)
  assert out["f1"] == 1.0
  lines = capsys.readouterr().err.splitlines()
  assert lines[0].startswith("eval: 0/5 questions") and lines[1].endswith("| F1 1.000")
  assert lines[-1].startswith("eval: 5/5 questions (100%)") and lines[-1].endswith("| F1 1.000")
