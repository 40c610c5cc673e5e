"""The notebooks run top to bottom (AGENTJAX_NB_QUICK sizes) in a Jupyter kernel of this
interpreter, and what they show holds up: the quickstart's metrics, table and plot; the
information gains, with the log-probs behind them recomputed by transformers' own Qwen2 from the
exported model."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
KERNEL = "agentjax-notebook-test"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
  """A folder for JUPYTER_PATH holding a kernelspec that runs this very interpreter (a
  "python3" spec elsewhere on the machine, e.g. in ~/.local, may point at another Python)."""
  path = tmp_path_factory.mktemp("jupyter")
  spec = path / "kernels" / KERNEL
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "agentjax test", "language": "python"}))
  return str(path)


def execute(name: str, workdir: str, kernels: str) -> nbformat.NotebookNode:
  """Runs notebooks/{name} as a reader would (cwd notebooks/), quick sizes, files in workdir;
  a cell that raises fails the test with its traceback (nbclient's CellExecutionError)."""
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  for cell in nb.cells:  # the quickstart is committed with its outputs: start from none
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
  nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.executable)"))
  os.makedirs(workdir, exist_ok=True)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JUPYTER_PATH", kernels)
    mp.setenv("AGENTJAX_NB_QUICK", "1")
    mp.setenv("AGENTJAX_NB_WORKDIR", workdir)
    try:
      NotebookClient(nb, timeout=600, kernel_name=KERNEL,
                     resources={"metadata": {"path": NOTEBOOKS}}).execute()
    finally:  # the executed notebook, to look at when something fails
      nbformat.write(nb, os.path.join(workdir, f"executed_{name}"))
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors, errors
  assert f"KERNEL {sys.executable}" in text_of(nb.cells[-1])
  return nb


def saved(name: str) -> nbformat.NotebookNode:
  return nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)


def test_quickstart_is_committed_with_the_outputs_of_one_full_run():
  """What a reader sees before running anything (on GitHub, on Colab): every code cell's output
  of one run at the default sizes, top to bottom, without errors or a path of this machine."""
  nb = saved("quickstart.ipynb")
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
      "re-run the whole notebook (notebooks/README.md: Tests and outputs)"
  assert all(c.outputs for c in code[:-1] if "print(" in c.source)
  assert not [o for c in code for o in c.outputs if o.output_type == "error"]
  printed = "".join(text_of(c) for c in code)
  assert "QUICK=False" in printed  # the default sizes, not the tests' smoke run
  assert "overrides: none | none" in printed  # `make demo`'s configs as they are
  assert ROOT not in json.dumps(nb)
  assert images(nb) == 1
  assert "step " in printed and "IGPO:" in printed
  assert "paired stderr" in printed and "2-hop (" in printed  # the before/after summary


def test_info_gain_is_committed_without_outputs():
  # Its outputs depend on whether `make demo` ran in the clone: they are left to the reader's run.
  nb = saved("info_gain.ipynb")
  assert all(not c.outputs and c.execution_count is None
             for c in nb.cells if c.cell_type == "code")


def test_notebooks_name_the_repository_of_setup_py():
  """One address: setup.py's url is what the notebooks clone and what their Colab badge opens
  (set it there when the repository moves)."""
  with open(os.path.join(ROOT, "setup.py")) as f:
    url = re.search(r'url="(https://github.com/([^"]+))"', f.read())
  assert url, "setup.py: url= of the repository"
  with open(os.path.join(NOTEBOOKS, "README.md")) as f:
    readme = f.read()
  for name in ("quickstart.ipynb", "info_gain.ipynb"):
    nb = saved(name)
    assert f'REPO_URL = "{url.group(1)}.git"' in nb.cells[1].source, name
    badge = f"https://colab.research.google.com/github/{url.group(2)}/blob/main/notebooks/{name}"
    assert f"]({badge})" in nb.cells[0].source and f"]({badge})" in readme, name
  assert readme.count("colab.research.google.com/github/") == 2


def text_of(cell) -> str:
  return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def images(nb) -> int:
  return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
             for o in c.outputs if o.output_type in ("display_data", "execute_result"))


@pytest.mark.slow  # executes the notebook end to end (SFT + RL steps)
def test_quickstart(tmp_path, kernels):
  workdir = str(tmp_path / "quickstart")
  nb = execute("quickstart.ipynb", workdir, kernels)
  with open(os.path.join(workdir, "igpo", "config.json")) as f:
    config = json.load(f)
  assert config["algorithm"] == "igpo" and config["model"]["hf_path"].endswith("hf_export")
  steps, every = config["train"]["steps"], config["train"]["eval_every"]
  with open(os.path.join(workdir, "igpo", "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  train = [r for r in rows if "reward" in r]
  assert [r["step"] for r in train] == list(range(1, steps + 1))
  for key in ("reward", "f1", "ig_mean", "collapse_fraction", "entropy", "kl", "turns"):
    assert all(math.isfinite(r[key]) for r in train), key
  assert all(r["entropy"] > 0 for r in train)  # a real policy was sampled and updated
  assert [r["step"] for r in rows if "eval/f1" in r] == list(range(0, steps + 1, every))
  with open(os.path.join(workdir, "sft", "metrics.jsonl")) as f:  # the SFT warm start ran
    sft = [json.loads(line) for line in f]
  assert sft and all(math.isfinite(r["loss"]) for r in sft)
  assert os.path.getsize(os.path.join(workdir, "quickstart_metrics.png")) > 10_000
  assert images(nb) == 1
  # The table printed above the plot: a header, then one line per step with the logged values.
  lines = [ln.split() for c in nb.cells for ln in text_of(c).splitlines()]
  header = next(i for i, ln in enumerate(lines) if ln[:3] == ["step", "reward", "f1"])
  for row, line in zip(train, lines[header + 1:header + 1 + steps]):
    assert [float(x) for x in line] == pytest.approx(
        [row["step"]] + [row[k] for k in lines[header][1:]], abs=1e-4)


@pytest.mark.slow
def test_info_gain(tmp_path, kernels):
  workdir = str(tmp_path / "info_gain")
  nb = execute("info_gain.ipynb", workdir, kernels)
  with open(os.path.join(workdir, "info_gain.json")) as f:
    out = json.load(f)
  trajectories = out["trajectories"]
  demos = [t for t in trajectories if t["source"] == "demonstration"]
  assert len(demos) >= 2 and all(t["turns"] for t in demos)  # always searches to show
  assert {len(t["turns"]) for t in demos} == {1, 2}  # 1- and 2-hop questions
  printed = "".join(text_of(c) for c in nb.cells)
  assert "max |packed - one pass per boundary| =" in printed
  assert images(nb) == 1

  for t in trajectories:
    v, ig, n = np.array(t["values"]), np.array(t["ig"]), t["num_turns"]
    assert len(t["turns"]) == n - 1  # one row per search turn
    # IG of turn k is v after it minus v before it; the answer turn and padding get none.
    np.testing.assert_allclose(ig[:n - 1], np.diff(v[:n]), atol=1e-5)
    assert not ig[n - 1:].any()
    np.testing.assert_allclose(ig.sum(), v[n - 1] - v[0], atol=1e-4)  # it telescopes
    for k, row in enumerate(t["turns"]):
      assert row["before"] == pytest.approx(v[k]) and row["after"] == pytest.approx(v[k + 1])
      if t["printed"]:  # the table shows the stored numbers
        assert f"{row['before']:>9.3f}{row['after']:>9.3f}{row['ig']:>+8.3f}" in printed

  # Independent check of the values: transformers' Qwen2 on the exported weights, one plain
  # forward per (trajectory, boundary) over context + probe, no packing.
  import torch
  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(out["model_dir"], dtype=torch.float32).eval()
  for t in trajectories[:4]:
    probe = [tok for tok, ok in zip(t["probe_tokens"], t["probe_valid"]) if ok]
    scored = [s for s, ok in zip(t["probe_score"], t["probe_valid"]) if ok]
    for step in range(t["num_turns"]):
      context = t["tokens"][:t["turn_ends"][step]]
      seq = torch.tensor([context + probe])
      with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0].double(), -1).numpy()
      picks = [logp[len(context) + j - 1, probe[j]] for j in range(len(probe)) if scored[j]]
      assert t["values"][step] == pytest.approx(float(np.mean(picks)), abs=2e-4), (t["id"], step)
