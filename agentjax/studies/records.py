"""A finished run's compact record, kept in the repository: a lost machine loses only
the runs in flight, and a study's report rebuilds from the repository alone.

    path = write_record(out, "backbone/igpo/3", result, workdir, code)
    # path: {out}/runs/backbone/igpo/seed3.json.gz
    study = collect_records(out, sizes, methods, seeds, steps)  # what reporting.collect returns

A record (gzip JSON, tens of KB) holds the run's spec, the commit of the code that ran it (and
whether its tree had uncommitted changes), the config it recorded (config.json), every step's
metrics (metrics.jsonl) and its result.json (the final dev and test evals, per question). A
size's start (its eval before RL and the start measurements) is {out}/runs/{size}/start.json.gz.
A sweep that finds a run's record does not run it again (agentjax/studies/sweep.py), and with
--commit_records commits each record as soon as it is written (commit_record).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from typing import Any, Mapping

from agentjax.studies.runs import DAC_START, GENERATOR_SFT

RECORDS = "runs"  # the records' folder under a study's out folder
MAX_RECORD_BYTES = 1 << 20  # a run's compressed record stays small enough to commit


# A size's stages before RL whose record is one per size: the DAC agent's eval before RL (its
# alpha*) and the generator's warm start.
STAGES = (DAC_START, GENERATOR_SFT)


def record_path(out: str, spec: str) -> str:
  """{out}/runs/{size}/{method}/seed{k}.json.gz; {out}/runs/{size}/start.json.gz for the size's
  start (method "sft") and {out}/runs/{size}/{stage}.json.gz for another stage before RL
  (STAGES)."""
  size, method, seed = spec.split("/")
  if method == "sft":
    return os.path.join(out, RECORDS, size, "start.json.gz")
  if method in STAGES:
    return os.path.join(out, RECORDS, size, f"{method}.json.gz")
  return os.path.join(out, RECORDS, size, method, f"seed{seed}.json.gz")


def is_stage(spec: str) -> bool:
  """Whether `spec` is a size's stage before RL (its record holds its result alone)."""
  return spec.split("/")[1] in ("sft",) + STAGES


def code_version(folder: str) -> dict[str, Any]:
  """{"commit": HEAD of the git checkout holding `folder`, "dirty": whether its tracked files
  differ from HEAD}; {"commit": None} outside a checkout (a record then says it does not know)."""
  def git(*args: str) -> str:
    return subprocess.run(["git", "-C", folder, *args], check=True, capture_output=True,
                          text=True).stdout.strip()
  try:
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
  except (OSError, subprocess.CalledProcessError):
    return {"commit": None, "dirty": None}


def _dump(path: str, obj: Any) -> int:
  """gzip JSON written beside `path` and renamed over it (a killed writer leaves no partial
  record); the gzip header's mtime is 0 (the record says when it was written). Returns the
  compressed size."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  data = gzip.compress(json.dumps(obj, sort_keys=True).encode(), mtime=0)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
  return len(data)


def read_record(path: str) -> dict[str, Any] | None:
  """The record at `path`, or None when there is none. A corrupt record raises ValueError naming
  the file (it is evidence: never silently skipped or overwritten)."""
  if not os.path.exists(path):
    return None
  try:
    with gzip.open(path, "rt") as f:
      return json.load(f)
  except (OSError, EOFError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a readable run record ({type(e).__name__}: {e}); move it "
                     "aside and run the spec again") from None


def write_record(out: str, spec: str, result: Mapping[str, Any], workdir: str | None,
                 code: Mapping[str, Any]) -> str:
  """Writes the record of a finished run (`result`: its result.json; `workdir`: its RL workdir,
  whose config.json and metrics.jsonl it keeps; None for a size's start). Refuses to write one
  over MAX_RECORD_BYTES compressed. Returns the path."""
  record: dict[str, Any] = {"spec": spec, "code": dict(code), "result": dict(result)}
  if workdir is not None:
    with open(os.path.join(workdir, "config.json")) as f:
      record["config"] = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      record["metrics"] = [json.loads(line) for line in f if line.strip()]
  return _keep(record_path(out, spec), spec, record)


def _keep(path: str, spec: str, record: dict[str, Any]) -> str:
  """`record` (with the time it is written) at `path`, refused (removed, ValueError) when over
  MAX_RECORD_BYTES compressed; returns the path."""
  record["written"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  size = _dump(path, record)
  if size > MAX_RECORD_BYTES:
    os.remove(path)
    raise ValueError(f"{spec}: its record is {size} bytes compressed, over {MAX_RECORD_BYTES}")
  return path


def files_record_path(out: str, spec: str) -> str:
  """{out}/runs/{spec}.json.gz for a study whose runs are jobs named by path ("collect/train",
  "grpo/listwise/0" -> runs/grpo/listwise/seed0.json.gz: a last numeric part is the seed)."""
  parts = spec.split("/")
  if len(parts) > 1 and parts[-1].isdigit():
    parts[-1] = f"seed{parts[-1]}"
  return os.path.join(out, RECORDS, *parts[:-1], parts[-1] + ".json.gz")


def write_files_record(out: str, spec: str, root: str, relpaths, code: Mapping[str, Any],
                       extra: Mapping[str, Any] | None = None) -> str:
  """The record of a finished job whose outputs are files under `root` (the Co-ReAct study's):
  the text of each of `relpaths` (relative to root), so restore_files can lay them out again
  where the report and the later jobs read them, and `extra` (e.g. a model export's sha256).
  Refuses to write one over MAX_RECORD_BYTES compressed. Returns the path."""
  files = {}
  for rel in relpaths:
    with open(os.path.join(root, rel)) as f:
      files[rel] = f.read()
  return _keep(files_record_path(out, spec), spec,
               {"spec": spec, "code": dict(code), "files": files, **dict(extra or {})})


def restore_files(path: str, root: str) -> list[str]:
  """The files a record keeps (write_files_record) written under `root` where they are missing
  (each written beside and renamed into place); returns the relative paths written. A file
  present is left as it is."""
  record = read_record(path)
  written = []
  for rel, text in (record or {}).get("files", {}).items():
    target = os.path.join(root, rel)
    if os.path.exists(target):
      continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(f"{target}.tmp{os.getpid()}", "w") as f:
      f.write(text)
    os.replace(f"{target}.tmp{os.getpid()}", target)
    written.append(rel)
  return written


def commit_record(path: str, message: str, attempts: int = 5) -> bool:
  """`git add` and `git commit --only` of one record in the checkout holding it: other staged or
  unstaged changes of that checkout stay out of the commit. Retries while another git process
  holds the index lock. Returns whether a commit was made (False when the record was already
  committed as it is)."""
  path = os.path.abspath(path)  # git runs in the record's folder: a relative path would miss
  folder = os.path.dirname(path)
  for attempt in range(attempts):
    try:
      subprocess.run(["git", "-C", folder, "add", "--", path], check=True, capture_output=True,
                     text=True)
      done = subprocess.run(["git", "-C", folder, "commit", "-q", "-m", message, "--only", "--",
                             path], capture_output=True, text=True)
      if done.returncode == 0:
        return True
      if "nothing to commit" in done.stdout + done.stderr or "no changes added" in (
          done.stdout + done.stderr):
        return False
      raise subprocess.CalledProcessError(done.returncode, "git commit", done.stdout, done.stderr)
    except subprocess.CalledProcessError as e:
      if "index.lock" not in (e.stderr or "") or attempt == attempts - 1:
        raise RuntimeError(f"committing {path} failed: {e.stderr or e.stdout}") from None
      time.sleep(2.0 * (attempt + 1))
  return False


def collect_records(out: str, sizes, methods, seeds, steps: int, say=print,
                    out_of=None) -> dict:
  """reporting.collect's structure from the records under {out}/runs alone (each run's result
  gains its record's "code"). out_of(spec): the out folder holding that spec's record when it is
  not `out` (a run another study keeps: Study.borrow)."""
  from agentjax.studies.reporting import collect_runs
  where = (lambda spec: record_path(out_of(spec) if out_of else out, spec))  # noqa: E731

  def start_of(size):
    start = read_record(where(f"{size}/sft/0"))
    return None if start is None else start["result"]

  def run_of(spec):
    rec = read_record(where(spec))
    if rec is None:
      return None
    return (dict(rec["result"], code=rec["code"]), [m for m in rec["metrics"] if "reward" in m],
            where(spec))
  return collect_runs(sizes, methods, seeds, steps, start_of, run_of, say)


__all__ = ["MAX_RECORD_BYTES", "RECORDS", "STAGES", "code_version", "collect_records",
           "commit_record", "files_record_path", "is_stage", "read_record", "record_path",
           "restore_files", "write_files_record", "write_record"]
