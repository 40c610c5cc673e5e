r"""A run's learning curves as PNG files (agentjax/plots.py), without TensorBoard.

    python launch/plot.py --workdir=runs/demo/igpo           # -> runs/demo/igpo/plots/*.png
    python launch/plot.py --workdir=runs/demo/sft            # -> runs/demo/sft/plots/sft_loss.png
    python launch/plot.py --workdir=runs/igpo --workdir=runs/grpo --out_dir=runs/plots  # overlaid

Reads {workdir}/metrics.jsonl and {workdir}/eval/<step>.json; writes reward.png, eval.png,
rollouts.png, loss.png and step_time.png for an RL run, sft_loss.png for an SFT run, and prints
each path. With several --workdir the runs are overlaid, one colour each, in --out_dir (default:
plots/ in the folder the workdirs share). Works on a run in progress: it plots the steps done.
A workdir without metrics, or a bad --smoothing, is a one-line error and exit status 2.
"""

from __future__ import annotations

from absl import app, flags

import common  # launch/common.py: the entry point (one-line errors, quiet logs)

_WORKDIR = flags.DEFINE_multi_string("workdir", None, "A run's workdir (repeat the flag to "
                                     "overlay runs).", required=True)
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Folder for the PNG files (default: "
                               "{workdir}/plots, or plots/ in the workdirs' common folder).")
_SMOOTHING = flags.DEFINE_float("smoothing", None, "Weight of the smoothed line's exponential "
                                "moving average, in [0, 1) (0: none; default: from the number of "
                                "steps, agentjax.plots.default_weight).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from agentjax.plots import default_out_dir, plot_runs
  workdirs = _WORKDIR.value
  out_dir = _OUT_DIR.value or default_out_dir(workdirs)
  try:
    paths = plot_runs(workdirs, out_dir, smoothing=_SMOOTHING.value)
  except (FileNotFoundError, ValueError, ImportError) as e:
    raise common.UserError(str(e)) from None
  if not paths:
    raise common.UserError(f"--workdir={','.join(workdirs)}: the runs log none of the keys the "
                           f"figures draw (agentjax/plots.py FIGURES); nothing written to "
                           f"{out_dir}")
  for path in paths:
    print(path)


if __name__ == "__main__":
  common.run(main)
