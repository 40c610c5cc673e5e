"""Every `python launch/<script>.py ...` command in a ```bash block of README.md and
docs/guides/*.md parses as written, without running a model:

- the script exists;
- the script's own flag parser accepts the command (each `--flag` is one the script defines,
  each value parses, no required flag is missing; a positional argument only where the script
  takes one: launch/bench.py's benchmark name);
- a `--config=<file>:<preset>` (or demo.py's `--sft_config` / `--rl_config`) loads with the
  command's `--config.a.b=v` overrides applied and passes agentjax's config validation
  (agentjax.train.config.validate);
- a command with a `--workdir` and no `--config` (a run continued, evaluated or served with the
  config it recorded) is given a workdir whose config.json records the config its name stands
  for (`runs/demo/<m>` -> configs/<m>.py:demo, else configs/base.py:demo); the script reads it as
  it reads a real run's, applies the overrides, and the result is validated the same way.

Paths in the commands need not exist: only parsing and validation run (validation's own checks
that a folder or file is there are answered "yes"). A file a guide defines, a ```python block
whose first line is `# <name>.py` (a retrieval plugin), is written where the commands run: a
scratch folder that links every top-level entry of the repository. One checker process
imports agentjax once and forks a child per command, so that each script defines its flags in a
fresh flag registry (absl's is global) and the whole check takes seconds.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = re.compile(r"^(?:\./)?launch/(\w+)\.py$")
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}


def doc_files() -> list[str]:
  return [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "guides", "*.md")))


def bash_blocks(text: str) -> list[tuple[int, str]]:
  """(line number of the block's first line, body) of each ```bash block."""
  return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
          for m in re.finditer(r"^```bash[^\n]*\n(.*?)^```", text, re.S | re.M)]


def _split(line: str) -> list[list[str]]:
  """Simple commands of one shell line, as argument lists; a quoted argument that holds a
  launch command (`gcloud ... --command="cd x && python launch/train.py ..."`) is split too."""
  lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  lexer.commenters = "#"
  out, current = [], []
  for token in lexer:
    if token in _SEPARATORS or set(token) <= set("&|;()<>"):
      out.append(current)
      current = []
    elif "launch/" in token and re.search(r"\s", token):
      out.append(current)
      out.extend(_split(token.split("=", 1)[1] if token.startswith("--") else token))
      current = []
    else:
      current.append(token)
  out.append(current)
  return [c for c in out if c]


def launch_commands() -> list[tuple[str, str, list[str]]]:
  """(where, script, args) of every `python launch/<script>.py` command of the docs."""
  found = []
  for path in doc_files():
    text = open(path).read()
    name = os.path.relpath(path, ROOT)
    for first, body in bash_blocks(text):
      lines = body.split("\n")
      i = 0
      while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
          i += 1
          line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        for words in _split(line):
          for j, word in enumerate(words[:-1]):
            if _PYTHON.match(word) and _SCRIPT.match(words[j + 1]):
              where = f"{name}:{first + start}"
              seen = sum(w == where or w.startswith(where + "#") for w, _, _ in found)
              found.append((where + (f"#{seen + 1}" if seen else ""),
                            words[j + 1].removeprefix("./"), words[j + 2:]))
              break
  return found


COMMANDS = launch_commands()


def defined_files() -> dict[str, str]:
  """{name: text} of each ```python block of the docs whose first line is `# <name>.py`."""
  files = {}
  for path in doc_files():
    for m in re.finditer(r"^```python[^\n]*\n(#\s*([\w.-]+\.py)\b[^\n]*\n.*?)^```",
                         open(path).read(), re.S | re.M):
      files[m.group(2)] = m.group(1)
  return files


def _sandbox() -> str:
  """A scratch folder holding a link to every top-level entry of the repository and the files
  the docs define: the commands' relative paths resolve as in the repository."""
  folder = tempfile.mkdtemp(prefix="guide_commands_")
  for name in os.listdir(ROOT):
    os.symlink(os.path.join(ROOT, name), os.path.join(folder, name))
  for name, text in defined_files().items():
    if not os.path.lexists(os.path.join(folder, name)):
      with open(os.path.join(folder, name), "w") as f:
        f.write(text)
  return folder


class _PathsExist:
  """`os` as agentjax.train.config sees it during the check: every path it asks about exists."""

  def __init__(self, real):
    self._real = real
    self.path = type("path", (), {"isdir": staticmethod(lambda p: True),
                                  "isfile": staticmethod(lambda p: True),
                                  "__getattr__": lambda _, n: getattr(real.path, n)})()

  def __getattr__(self, name):
    return getattr(self._real, name)


# ---------------------------------------------------------------------------------------------
# The checker (run as a script: one process, a forked child per command).
# ---------------------------------------------------------------------------------------------


def _standin(workdir: str) -> str:
  """The config module a workdir's name stands for: runs/demo/<m> -> configs/<m>.py (demo
  preset), else configs/base.py."""
  method = os.path.basename(os.path.normpath(workdir))
  return method if os.path.isfile(os.path.join(ROOT, "configs", f"{method}.py")) else "base"


def _recorded_workdir(args: list[str]) -> list[str]:
  """A command that names a --workdir but no --config reads the run's recorded config: point
  --workdir at a fresh folder whose config.json records the config its name stands for (the
  demo preset of configs/<m>.py), so the check never depends on what runs/ holds here."""
  import importlib
  if any(a == "--config" or a.startswith("--config=") for a in args):
    return args
  out = []
  for arg in args:
    if arg.startswith("--workdir="):
      workdir = arg.split("=", 1)[1]
      module = _standin(workdir)
      folder = os.path.join(tempfile.mkdtemp(prefix="workdir_", dir=os.getcwd()),
                            os.path.basename(os.path.normpath(workdir)) or "run")
      os.makedirs(folder)
      config = importlib.import_module(f"configs.{module}").get_config("demo")
      with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config.to_dict(), f)
      arg = f"--workdir={folder}"
    out.append(arg)
  return out


def _check_argparse(module: dict, args: list[str]) -> None:
  """An argparse script: its main() parses `args`; stopped right after parsing."""
  import argparse

  class Parsed(Exception):
    pass

  original = argparse.ArgumentParser.parse_args

  def parse_then_stop(self, argv=None, namespace=None):
    original(self, argv, namespace)
    raise Parsed

  argparse.ArgumentParser.parse_args = parse_then_stop
  try:
    module["main"](args)
  except Parsed:
    return
  except SystemExit as e:
    raise AssertionError(f"argparse rejected the command (exit {e.code})") from None
  raise AssertionError("main() returned without parsing its arguments")


def _check(script: str, args: list[str]) -> None:
  """Raises on the first problem of one command (in a forked child: flags are global)."""
  import io
  import runpy

  from absl import flags

  from agentjax.train import config as config_module
  from agentjax.train.config import validate

  path = os.path.join(ROOT, script)
  assert os.path.isfile(path), f"{script} does not exist"
  args = _recorded_workdir(args)
  sys.argv = [path] + args
  sys.path.insert(0, os.path.join(ROOT, "launch"))
  source = open(path).read()
  module = runpy.run_path(path, run_name="guide_check")
  if "argparse.ArgumentParser" in source and "from absl" not in source:
    err, sys.stderr = sys.stderr, io.StringIO()
    try:
      _check_argparse(module, args)
    except AssertionError as e:
      raise AssertionError(f"{e}: {sys.stderr.getvalue().strip()}") from None
    finally:
      sys.stderr = err
    return
  err, sys.stderr = sys.stderr, io.StringIO()  # a parser that prints its error and exits 2
  try:
    positional = flags.FLAGS(sys.argv)[1:]
    # The launch scripts' run config (launch/common.py): what its entry point checks after
    # parsing (a missing config file, overrides a recorded config lacks, no config at all).
    for source in getattr(sys.modules.get("common"), "_CONFIGS", ()):
      source.check()
  except SystemExit as e:
    raise AssertionError(f"exit {e.code}: {sys.stderr.getvalue().strip()}") from None
  finally:
    sys.stderr = err
  if script == "launch/bench.py":
    assert len(positional) == 1 and positional[0] in module["BENCHES"], (
        f"launch/bench.py takes one benchmark name of {sorted(module['BENCHES'])}, "
        f"got {positional}")
  else:
    assert not positional, f"{script} takes no positional arguments, got {positional}"
  for name in list(flags.FLAGS):
    if type(flags.FLAGS[name]).__name__ != "_ConfigFlag":
      continue
    config = flags.FLAGS[name].value
    if config is None:
      assert not any(a.startswith(f"--{name}.") for a in args), (
          f"--{name}.* overrides, but {script} read no config to apply them to")
      continue
    config_module.os = _PathsExist(os)
    try:
      validate(config)
    finally:
      config_module.os = os


# What the children share, imported once: the config checks, the data entries they resolve
# (tensorflow-datasets), the recorded-config readers, the names eval.py imports. None of these
# defines an agentjax flag (checked), so each child's registry holds its own script's flags
# (and libraries' own, e.g. tensorflow-datasets' debug flag).
_SHARED = ("agentjax.train.config", "agentjax.data.searchqa", "agentjax.train.builders",
           "agentjax.train.upgrade", "agentjax.coreact", "ml_collections.config_flags")


def _preimport() -> None:
  import importlib

  from absl import flags
  before = set(flags.FLAGS)
  for name in _SHARED:
    importlib.import_module(name)
  ours = [n for n in set(flags.FLAGS) - before
          if (flags.FLAGS.find_module_defining_flag(n) or "").startswith(("agentjax", "launch"))]
  assert not ours, f"a shared import defined agentjax flags: {ours}"


def _run_checker(commands: list[tuple[str, str, list[str]]]) -> dict[str, str]:
  """{where: "" or the error} for each command, one forked child each."""
  import shutil
  sys.path.insert(0, ROOT)
  _preimport()
  sandbox = _sandbox()
  os.chdir(sandbox)
  results = {}
  try:
    _check_all(commands, results)
  finally:
    os.chdir(ROOT)
    for name in os.listdir(sandbox):  # the links first: nothing they point to is touched
      if os.path.islink(os.path.join(sandbox, name)):
        os.unlink(os.path.join(sandbox, name))
    shutil.rmtree(sandbox)
  return results


def _check_all(commands: list[tuple[str, str, list[str]]], results: dict[str, str]) -> None:
  for where, script, args in commands:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(read)
      try:
        _check(script, args)
        message = ""
      except BaseException as e:  # noqa: BLE001  (SystemExit included: reported, not raised)
        message = f"{type(e).__name__}: {e}".strip() or type(e).__name__
      with os.fdopen(write, "w") as f:
        f.write(message)
      os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
      message = f.read()
    _, status = os.waitpid(pid, 0)
    if status and not message:
      message = f"the checker's child died (wait status {status})"
    results[where] = message


def check_commands(commands: list[tuple[str, str, list[str]]]) -> dict[str, str]:
  """{where: "" or the problem} of each command, from the checker run as a subprocess."""
  with tempfile.TemporaryDirectory() as tmp:
    spec = os.path.join(tmp, "commands.json")
    with open(spec, "w") as f:
      json.dump(commands, f)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), spec], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checked() -> dict[str, str]:
  return check_commands(COMMANDS)


def test_docs_have_launch_commands():
  """The extraction finds the commands (a broken parser would make every other test vacuous)."""
  where = {w.split(":")[0] for w, _, _ in COMMANDS}
  assert "README.md" in where
  scripts = {s for _, s, _ in COMMANDS}
  assert {"launch/train.py", "launch/eval.py"} <= scripts
  assert len(COMMANDS) >= 20


def test_split_handles_continuations_and_nested_commands():
  text = ("```bash\n"
          "python launch/train.py --config=configs/igpo.py:demo \\\n"
          "    --workdir=runs/x   # a comment --not_a_flag\n"
          "ssh host --command=\"cd agentjax && .venv/bin/python launch/eval.py --workdir=w\"\n"
          "```\n")
  blocks = bash_blocks(text)
  assert len(blocks) == 1
  lines = blocks[0][1].split("\n")
  joined = lines[0][:-1] + " " + lines[1]
  assert _split(joined) == [["python", "launch/train.py", "--config=configs/igpo.py:demo",
                             "--workdir=runs/x"]]
  assert [".venv/bin/python", "launch/eval.py", "--workdir=w"] in _split(lines[2])


def test_checker_rejects_bad_commands():
  """The checker fails a misspelled flag, a wrong field, an invalid value, a missing script, a
  stray argument and a bad override of a recorded config (so that the tests below can fail)."""
  bad = [("bad:flag", "launch/retriever.py", ["--corpus=c.jsonl", "--prot=8000"]),
         ("bad:field", "launch/fit.py", ["--config=configs/igpo.py:demo",
                                          "--config.rollout.nonexistent=1"]),
         ("bad:value", "launch/fit.py", ["--config=configs/grpo.py:demo",
                                          "--config.rollout.group_size=1"]),
         ("bad:script", "launch/nonexistent.py", []),
         ("bad:argparse", "launch/merge_lora.py", ["--base=b", "--adapter=a", "--out=o",
                                                    "--dtypee=x"]),
         ("bad:positional", "launch/retriever.py", ["--corpus=c.jsonl", "extra"]),
         ("bad:recorded", "launch/train.py", ["--workdir=runs/demo/igpo",
                                               "--config.train.stepz=60"]),
         ("good:recorded", "launch/train.py", ["--workdir=runs/demo/igpo",
                                                "--config.train.steps=60"]),
         ("good", "launch/merge_lora.py", ["--base=b", "--adapter=a", "--out=o"])]
  results = check_commands(bad)
  assert "prot" in results["bad:flag"]
  assert "nonexistent" in results["bad:field"]
  assert "group_size" in results["bad:value"]
  assert "does not exist" in results["bad:script"]
  assert "dtypee" in results["bad:argparse"]
  assert "positional" in results["bad:positional"]
  assert "stepz" in results["bad:recorded"]
  assert results["good:recorded"] == "" and results["good"] == ""


@pytest.mark.parametrize("where,script,args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_doc_command_parses(checked, where, script, args):
  problem = checked[where]
  assert not problem, f"{where}: python {script} {' '.join(args)}\n  {problem}"


def _slug(heading: str) -> str:
  """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
  text = re.sub(r"[`*_]", "", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_doc_links_resolve():
  """Every relative link of the README, docs/README.md and the guides names a file or folder
  that exists, and an anchor into a Markdown file names one of its headings."""
  problems = []
  for path in doc_files() + [os.path.join(ROOT, "docs", "README.md")]:
    text = re.sub(r"^```.*?^```", "", open(path).read(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"^[a-z]+:", target):
        continue
      file, _, anchor = target.partition("#")
      resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
      where = f"{os.path.relpath(path, ROOT)}: {target}"
      if not os.path.exists(resolved):
        problems.append(f"{where}: no such file")
      elif anchor and resolved.endswith(".md"):
        headings = re.findall(r"^#+\s+(.+)$", open(resolved).read(), re.M)
        if anchor not in {_slug(h) for h in headings}:
          problems.append(f"{where}: no heading with that anchor")
  assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_fit_command_of_the_guide_runs():
  """The scaling guide's seconds-long fit check, run as written: its JSON says the demo fits."""
  [(where, script, args)] = [c for c in COMMANDS if c[0].startswith("docs/guides/scaling-and-fit")
                             and c[1] == "launch/fit.py" and "--model_preset=tiny" in c[2]]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  done = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, f"{where}: {done.stderr[-3000:]}"
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["fits"] is True and result["devices"] == 2 and result["num_programs"] > 0


if __name__ == "__main__":
  with open(sys.argv[1]) as f:
    todo = [tuple(c) for c in json.load(f)]
  print(json.dumps(_run_checker(todo)))
