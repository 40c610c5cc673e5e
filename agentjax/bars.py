r"""Progress bars for the long stages: SFT and RL steps, evaluation, the demo's stages.

    with progress_bar(total=500, desc="eval", unit="question") as bar:
      for batch in batches:
        ...
        bar.update(len(batch))
        bar.set_postfix_str(f"F1 {f1:.3f}")

How a bar is drawn depends on where stderr goes, or on the AGENTJAX_PROGRESS environment
variable:

  auto   (default) a tqdm bar when stderr is a terminal; "lines" otherwise (a CI log, nohup,
         a notebook, a pipe)
  bar    always a tqdm bar
  lines  one plain line per report, never a carriage return: when the bar starts, every
         `every_s` seconds (30) or every 1/`lines` of the total (10 reports for a run), and when
         it closes; a log of a 10,000-step run holds about a dozen lines of it
  off    nothing

Only process 0 of a multi-process run draws (the others get a silent bar): every process runs
the same loop, and one bar per process would repeat each line. A bar never changes what a run
computes; it only reads the counts it is given.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

ENV = "AGENTJAX_PROGRESS"
MODES = ("auto", "bar", "lines", "off")


def progress_mode(stream: TextIO | None = None, *, primary: bool | None = None) -> str:
  """"bar", "lines" or "off": AGENTJAX_PROGRESS resolved for `stream` (default stderr) on this
  process (`primary` None: whether this is process 0). A value outside MODES raises ValueError."""
  value = os.environ.get(ENV, "auto").strip().lower() or "auto"
  if value not in MODES:
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: must be one of {', '.join(MODES)} "
                     f"(e.g. {ENV}=off to turn progress bars off)")
  if primary is None:
    import jax
    primary = jax.process_index() == 0
  if value == "off" or not primary:
    return "off"
  if value != "auto":
    return value
  stream = sys.stderr if stream is None else stream
  isatty = getattr(stream, "isatty", None)
  return "bar" if isatty is not None and isatty() else "lines"


def progress_bar(total: int | None = None, desc: str = "", *, unit: str = "step",
                 initial: int = 0, leave: bool = True, stream: TextIO | None = None,
                 every_s: float = 30.0, lines: int = 10, primary: bool | None = None) -> Any:
  """A progress bar of `total` `unit`s (None: unknown), drawn as AGENTJAX_PROGRESS says (module
  docstring) on `stream` (default stderr).

  The returned object has tqdm's update(n), set_postfix_str(s), set_description(s), close(), n
  and total, and is a context manager. leave=False clears a terminal bar when it closes (a bar
  inside another stage's, e.g. an eval during training). every_s and lines pace the "lines"
  mode."""
  stream = sys.stderr if stream is None else stream
  mode = progress_mode(stream, primary=primary)
  if mode == "bar":
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream,
                dynamic_ncols=True, mininterval=0.5, leave=leave, disable=False)
  return LineProgress(total, desc, unit=unit, initial=initial,
                      stream=stream if mode == "lines" else None, every_s=every_s, lines=lines)


def _duration(seconds: float) -> str:
  if seconds < 60:
    return f"{seconds:.0f} s"
  if seconds < 3600:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


class LineProgress:
  """The "lines" mode of progress_bar (and, with no stream, the silent one): a plain line when
  the bar starts, whenever `every_s` seconds or total/`lines` units have passed since the last
  line, and at close if anything happened since; e.g.

      sft: 120/1000 steps (12%), 1.2 min, 0.61 s/step, ~9.0 min left | loss 1.234 lr 0.003
  """

  def __init__(self, total: int | None, desc: str = "", *, unit: str = "step", initial: int = 0,
               stream: TextIO | None = None, every_s: float = 30.0, lines: int = 10):
    self.total, self.desc, self.unit, self.n = total, desc, unit, initial
    self.stream, self.every_s = stream, every_s
    self.every_n = max(1, math.ceil(total / lines)) if total and lines > 0 else None
    self.postfix = ""
    self._start_n, self._start = initial, time.monotonic()
    self._last_n, self._last = initial, self._start
    self._closed = False
    self._emit()

  def __enter__(self) -> "LineProgress":
    return self

  def __exit__(self, *_) -> None:
    self.close()

  def line(self) -> str:
    """The report as of now."""
    elapsed = time.monotonic() - self._start
    count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
    parts = [f"{count} {self.unit}s"]
    if self.total:
      parts[0] += f" ({100 * self.n / self.total:.0f}%)"
    parts.append(_duration(elapsed))
    done = self.n - self._start_n
    if done > 0 and elapsed > 0:
      per = elapsed / done
      parts.append(f"{per:.3g} s/{self.unit}" if per >= 1e-3 else f"{done / elapsed:.3g} "
                   f"{self.unit}s/s")
      if self.total and self.n < self.total:
        parts.append(f"~{_duration(per * (self.total - self.n))} left")
    text = ", ".join(parts)
    return (f"{self.desc}: " if self.desc else "") + text + (
        f" | {self.postfix}" if self.postfix else "")

  def _emit(self) -> None:
    if self.stream is not None:
      self.stream.write(self.line() + "\n")
      self.stream.flush()
    self._last_n, self._last = self.n, time.monotonic()

  def update(self, n: int = 1) -> None:
    self.n += n
    if self._closed or self.stream is None:
      return
    if ((self.every_n is not None and self.n - self._last_n >= self.every_n)
        or time.monotonic() - self._last >= self.every_s):
      self._emit()

  def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
    del refresh  # a line shows the postfix of its moment
    self.postfix = s

  def set_description(self, desc: str = "", refresh: bool = True) -> None:
    del refresh
    self.desc = desc

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    if self.stream is not None and self.n != self._last_n:
      self._emit()
