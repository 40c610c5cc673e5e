"""What the launch scripts share: their entry point (quiet logs, one-line errors), the run config
a command starts from, and the multi-host flags with jax.distributed start-up.

    _CONFIG = common.define_config("Config file and preset, e.g. configs/igpo.py:demo.")
    _WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")

    def main(_):
      config = _CONFIG.value      # --config's file, or the config {workdir}/config.json records
      ...

    if __name__ == "__main__":
      common.run(main)            # instead of app.run(main)

The config: with --config=<file>:<preset>, that file (as ml_collections' config flags read it);
without it, the config the run in --workdir recorded ({workdir}/config.json, upgraded as the
checkpointer reads it: agentjax/train/upgrade.py), so `train.py --workdir=runs/x` continues a run
and `eval.py --workdir=runs/x` evaluates it with the config it trained with. --config.a.b=value
overrides apply on top of either. Each command that uses a workdir appends one JSON line to
{workdir}/overrides.jsonl: {"time", "script", "config" (the file and preset, or "recorded"),
"overrides" ({dotted field: value})}, and an {"time", "script", "error"} line when it then stops
on a user error: the run's history of commands.

Errors: a user's mistake (a config field that cannot work, a misspelled or mistyped override, a
checkpoint of another config, a mesh that does not fit the devices, a missing file or folder, a
bad flag) is printed as one line `error: <field>=<value>: <why>; <suggestion>` on stderr, with
exit status 2; --verbose prints the traceback before it. Other failures keep their traceback and
status (train.py: 3 for a diverged run or an unreachable retriever).

Logs: agentjax's INFO lines and every library's warnings; --verbose restores every library's
INFO lines (orbax's checkpoint chatter, tfds's dataset notes, jax's backend probes).
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import json
import logging
import os
import re
import sys
import traceback
from typing import Any, Callable, Iterator, Mapping, Sequence

from absl import app, flags
from ml_collections import config_dict, config_flags
from ml_collections.config_flags import config_flags as config_flag_classes

_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() "
                                 "(auto-detected on TPU pods and SLURM/GPU clusters).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0 (implies "
                                   "--distributed).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process' index.")
VERBOSE = flags.DEFINE_bool("verbose", False, "Print a user error's traceback, and every "
                            "library's INFO log lines (default: agentjax's and warnings).")

RECORD = "config.json"  # what a run's checkpointer writes into its workdir (upgrade.RECORD)
HISTORY = "overrides.jsonl"
USER_ERROR_STATUS = 2
# Errors that are the user's: (module, class). Looked up in sys.modules (a class can only be
# raised once its module is loaded), so importing this module loads neither jax nor agentjax
# (launch/fit.py sets its fake devices before jax loads).
_USER_ERRORS = (("agentjax.models.qwen.config", "ConfigError"),
                ("agentjax.train.checkpoint", "CheckpointMismatchError"),
                ("agentjax.parallel.mesh", "MeshError"),
                ("agentjax.models.tokenizer", "TokenizerError"),
                ("agentjax.retrieval.base", "CorpusError"),
                ("agentjax.retrieval.plugins", "PluginError"),
                ("agentjax.data.qa_files", "QAFormatError"),
                # a Hugging Face folder the command was given that is not one (a training
                # checkpoint that cannot be read is a failure of the run: its traceback stays)
                ("agentjax.models.safetensors_io", "CheckpointError"))




def _verbose_in(argv: Sequence[str]) -> bool:
  """--verbose in a command line not parsed yet."""
  return any(a.lower() in ("--verbose", "-verbose", "--verbose=true", "--verbose=1")
             for a in argv[1:])


# XLA's and TensorFlow's C++ INFO lines ("XLA service ... initialized"): read once, as they load.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if _verbose_in(sys.argv) else "1")


def init_distributed() -> None:
  """Starts jax.distributed when asked; call before anything touches a device."""
  import jax
  if _DISTRIBUTED.value or _COORDINATOR.value:
    # Only CPU collectives read this; it must be set before the backends start.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)


class UserError(Exception):
  """A mistake on the command line; its message is the one line printed."""


# ------------------------------------------------------------------------------ the run config


def flag_value(argv: Sequence[str], name: str) -> str | None:
  """The value of --name in argv (--name=v or --name v; the last one wins), None if absent."""
  value = None
  for i, arg in enumerate(argv):
    if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith((f"--{name}=", f"-{name}=")):
      value = arg.split("=", 1)[1]
  return value


def override_paths(argv: Sequence[str], name: str = "config") -> list[str]:
  """The dotted fields --name.a.b=... overrides in argv, in order."""
  paths = []
  for arg in argv:
    m = re.match(rf"^--?(?:no)?{name}\.([^=]+)", arg)
    if m and m.group(1) not in paths:
      paths.append(m.group(1))
  return paths


def recorded_config(workdir: str) -> config_dict.ConfigDict | None:
  """The config the run in `workdir` recorded ({workdir}/config.json), as
  agentjax/train/upgrade.py's recorded_config reads it (upgraded to today's fields, without what
  is recorded beside them); None when the workdir holds no record. UserError naming the file
  when it cannot be read."""
  if not os.path.isfile(os.path.join(workdir, RECORD)):
    return None  # (without importing agentjax.train, which loads jax)
  from agentjax.train.upgrade import RecordError
  from agentjax.train.upgrade import recorded_config as read_record
  try:
    return read_record(workdir)
  except RecordError as e:
    raise UserError(f"{e}; give the run's --config instead") from e


def check_overrides(config: Any, paths: Sequence[str], name: str = "config") -> None:
  """UserError naming the first of `paths` (dotted fields of --name.* overrides) that `config`
  does not have, with the closest fields it has."""
  from agentjax.train.config import unknown_field
  for path in paths:
    if "[" in path:  # an index into a field: ml_collections checks it
      continue
    node = config
    for part in path.split("."):
      if not hasattr(node, "keys") or part not in node:
        raise UserError(f"--{name}.{path}: {unknown_field(config, path, name)}")
      node = node[part]


class RunConfig:
  """The config a command runs with: --config's file, else the workdir's record; see the module
  docstring. `value` is the ConfigDict with the command line's overrides applied."""

  def __init__(self, flag: Any, name: str, argv: Sequence[str], required: bool,
               flag_values: flags.FlagValues):
    self.name, self.required, self._flag, self._flag_values = name, required, flag, flag_values
    self.file = flag_value(argv, name)  # --config=<file>:<preset>, or None
    self.workdir = flag_value(argv, "workdir")
    self.recorded = None  # the record the config came from, when --config was not given
    self.default: str | None = None  # the default file and preset, when it is the config
    self.example = "configs/igpo.py:demo"  # a file and preset the missing config's error names
    self.error: UserError | None = None  # found while defining: run() reports it

  @property
  def value(self) -> Any:
    return self._flag.value

  @property
  def overrides(self) -> dict[str, Any]:
    """{dotted field: value} of the --config.* overrides the command line gave."""
    if self.value is None:
      return {}
    return dict(self._flag_values[self.name].override_values)

  def source(self) -> str:
    """Where the config came from: the --config argument, "recorded", or the default file."""
    if self.file is not None:
      return self.file
    return self.default if self.default is not None and not self.recorded else "recorded"

  def check(self) -> None:
    """UserError when the command has no config and needs one, or its file cannot be loaded
    (after flags are parsed)."""
    if self.error is not None:
      raise self.error
    missing = _missing_file(self.name, self.file or self.default)
    if missing:
      raise UserError(missing)
    if self.value is None and self.required:
      where = (f": {self.workdir} holds no recorded config ({RECORD}) to continue from"
               if self.workdir else ": no --workdir with a recorded config was given"
               if "workdir" in self._flag_values else "")
      raise UserError(f"--{self.name}: missing{where}; give a config file and preset, e.g. "
                      f"--{self.name}={self.example}")

  def record(self, script: str | None = None) -> str | None:
    """Appends this command's line to {workdir}/overrides.jsonl (process 0 of the job only);
    returns the file's path, or None when there is no workdir or this is not process 0."""
    if not self.workdir or self.value is None:
      return None
    if "jax" in sys.modules:
      import jax
      if jax.process_index() != 0:
        return None
    line = {"script": script or os.path.basename(sys.argv[0]), "config": self.source(),
            "overrides": self.overrides}
    path = _append_history(self.workdir, line)
    _HISTORY_WRITTEN.append((self.workdir, line["script"]))
    return path


_CONFIGS: list[RunConfig] = []
_HISTORY_WRITTEN: list[tuple[str, str]] = []  # (workdir, script) of the lines written here


def _append_history(workdir: str, line: Mapping[str, Any]) -> str:
  path = os.path.join(workdir, HISTORY)
  os.makedirs(workdir, exist_ok=True)
  stamped = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             **line}
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(stamped, default=str) + "\n")
  return path


def define_config(help_string: str, *, name: str = "config", required: bool = True,
                  default: str | None = None, example: str = "configs/igpo.py:demo",
                  lock_config: bool = True, argv: Sequence[str] | None = None,
                  flag_values: flags.FlagValues = flags.FLAGS) -> RunConfig:
  """Defines --{name}: a config file and preset, or, when none is given and --workdir holds a
  run's record, that record, else `default` (a file and preset); --{name}.a.b=value overrides
  any of them. Reads argv (default sys.argv) for --{name} and --workdir now, before flags are
  parsed, since the flag's kind depends on them. `required`: run() stops with a one-line error
  when there is no config at all, naming `example` (a file and preset) as one to give."""
  given_argv = argv
  argv = list(sys.argv if argv is None else argv)
  source = RunConfig(None, name, argv, required, flag_values)
  source.example = example
  recorded = None
  if source.file is None and source.workdir:
    try:
      recorded = recorded_config(source.workdir)
    except UserError as e:
      source.error = e
  if recorded is not None:
    source.recorded = os.path.join(source.workdir, RECORD)
    # ml_collections parses the overrides as it defines the flag: an error found now is
    # reported by run() (the flag is then defined without them).
    try:
      check_overrides(recorded, override_paths(argv, name), name)
      flag = config_flags.DEFINE_config_dict(name, recorded, help_string,
                                             flag_values=flag_values, lock_config=lock_config,
                                             sys_argv=argv)
    except Exception as e:  # noqa: BLE001
      source.error = _override_error(e, name, argv)
      flag = config_flags.DEFINE_config_dict(name, recorded, help_string,
                                             flag_values=flag_values, lock_config=lock_config,
                                             sys_argv=argv[:1])
  else:
    # A default file is loaded, and the overrides applied to it, as the flag is defined (a file
    # the command line gives: as flags are parsed); not when the command line gives one, whose
    # fields the default's may not have.
    default = source.default = default if source.file is None else None
    try:
      flag = config_flags.DEFINE_config_file(name, default, help_string, flag_values=flag_values,
                                             lock_config=lock_config,
                                             sys_argv=None if given_argv is None else argv)
    except Exception as e:  # noqa: BLE001  (run() reports it; a bug in the file goes on)
      if default is None or _missing_file(name, default):
        raise
      source.error = _override_error(e, name, argv, default, lock_config)
      flag = config_flags.DEFINE_config_file(name, default, help_string, flag_values=flag_values,
                                             lock_config=lock_config, sys_argv=argv[:1])
  source._flag = flag
  if source.recorded:  # --helpshort names the record instead of printing the whole config
    flag_values[name].default_as_str = repr(source.recorded)
  caller = sys._getframe(1).f_globals.get("__name__")  # noqa: SLF001  (its --helpshort lists it)
  flag_values.register_key_flag_for_module(sys.argv[0] if caller == "__main__" else caller,
                                           flag_values[name])
  if flag_values is flags.FLAGS:  # the command's own: run() checks it, errors name it
    _CONFIGS.append(source)
  return source


# ------------------------------------------------------------------------------------ errors


def _override_error(e: BaseException, name: str, argv: Sequence[str], spec: str | None = None,
                    lock_config: bool = True) -> UserError:
  """The UserError for what applying argv's --{name}.* overrides raised as the flag was defined;
  with `spec` (the file and preset they were applied to), a misspelled field is named with the
  closest fields that config has."""
  if isinstance(e, UserError):
    return e
  if spec is not None and isinstance(e, (AttributeError, KeyError)):
    try:
      config = config_flag_classes.ConfigFileFlagParser(name, lock_config).parse(spec)
      check_overrides(config, override_paths(argv, name), name)
    except UserError as found:
      return found
    except Exception:  # noqa: BLE001  (the error as ml_collections put it, below)
      pass
  return UserError(f"--{name}: {_one_line(e)}")


def _one_line(e: BaseException) -> str:
  """An exception's message on one line: a message carrying a traceback (ml_collections wraps a
  config file's error in one) is cut to its last line, other newlines become spaces."""
  text = str(e).strip()
  if isinstance(e, KeyError) and e.args:  # str() of a KeyError is its key's repr
    text = str(e.args[0])
  if "Traceback (most recent call last)" in text:
    last = [line for line in text.splitlines() if line.strip()][-1].strip()
    head = text.split("Traceback", 1)[0].replace("Error whilst parsing config file:", "")
    text = head.strip() + " " + re.sub(r"^[\w.]*(Error|Exception): ", "", last)
  if isinstance(e, flags.Error):  # absl's "flag --x=1: why"
    text = re.sub(r"^flag (--)", r"\1", text)
  return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _user_error_types() -> tuple[type[BaseException], ...]:
  types: list[type[BaseException]] = [UserError, app.UsageError, flags.Error, FileNotFoundError,
                                      NotADirectoryError]
  for module, cls in _USER_ERRORS:
    if module in sys.modules:
      types.append(getattr(sys.modules[module], cls))
  return tuple(types)


def user_error_message(e: BaseException, argv: Sequence[str] = ()) -> str | None:
  """The one line for a user error (without "error: "), None when `e` is not one.

  A misspelled --config.* override (ml_collections raises AttributeError or KeyError naming
  only the last part) is named with the closest fields the config has; a --config file that
  does not exist (an OSError naming ml_collections' module) with the closest files."""
  if isinstance(e, (AttributeError, KeyError)):
    for name, config in _base_configs(argv):
      try:
        check_overrides(config, override_paths(argv, name), name)
      except UserError as found:
        return str(found)
    return None
  if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
    for name, spec in _config_files(argv):
      missing = _missing_file(name, spec)
      if missing:
        return missing
  train_checkpoint = sys.modules.get("agentjax.train.checkpoint")
  if not isinstance(e, _user_error_types()) or (
      train_checkpoint is not None and isinstance(e, train_checkpoint.CheckpointError)
      and not isinstance(e, train_checkpoint.CheckpointMismatchError)):
    return None
  if isinstance(e, FileNotFoundError) and e.filename is not None and e.strerror:
    message = f"{e.filename}: {e.strerror}"
  else:
    message = _one_line(e)
  if train_checkpoint is not None and isinstance(e, train_checkpoint.CheckpointMismatchError):
    for source in _CONFIGS:
      if source.file is not None and source.workdir and \
         os.path.isfile(os.path.join(source.workdir, RECORD)):
        message = (f"{message.rstrip('.')}; or omit --{source.name} to continue the recorded "
                   f"run ({os.path.join(source.workdir, RECORD)}, with --{source.name}.* "
                   f"overrides on top)")
  return message


def _config_files(argv: Sequence[str]) -> Iterator[tuple[str, str | None]]:
  """(name, the file and preset argv or the default gives) of every config flag defined."""
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    if config_flag_classes.is_config_flag(flag) and \
       isinstance(flag.parser, config_flag_classes.ConfigFileFlagParser):
      default = getattr(flag, "default_unparsed", None)  # absent when argv gives the file
      default = default if isinstance(default, str) else None
      yield name, flag_value(argv, name) or default


def _base_configs(argv: Sequence[str]) -> Iterator[tuple[str, Any]]:
  """(name, config before overrides) of every config flag argv overrides: its file loaded
  again, or the config it was defined with (a run's record)."""
  files = dict(_config_files(argv))
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    if not config_flag_classes.is_config_flag(flag) or not override_paths(argv, name):
      continue
    if name not in files:
      yield name, flag.default
    elif files[name] is not None:
      try:
        yield name, flag.parser.parse(files[name])
      except Exception:  # noqa: BLE001  (a broken file: its own error is reported instead)
        continue


def _missing_file(name: str, spec: str | None) -> str | None:
  """The one line for a --name=<file>:<preset> whose file does not exist (ml_collections defers
  that error to the config's first use), with the closest files beside it."""
  if spec is None:
    return None
  path = spec.split(":", 1)[0]
  if os.path.isfile(path):
    return None
  folder = os.path.dirname(path) or "."
  files = sorted(os.path.join(os.path.dirname(path), f) for f in os.listdir(folder)
                 if f.endswith(".py") and not f.startswith("_")) if os.path.isdir(folder) else []
  close = difflib.get_close_matches(path, files, n=3)
  hint = (f"did you mean {' or '.join(close)}?" if close else
          f"the config files there: {', '.join(files)}" if files else
          "e.g. --config=configs/igpo.py:demo (run from the repository's root)")
  return f"--{name}={spec}: no such file {path!r}; {hint}"


def _verbose(argv: Sequence[str]) -> bool:
  """--verbose, from argv when flags are not parsed (a flag error, or an argparse script)."""
  return VERBOSE.value if flags.FLAGS.is_parsed() else _verbose_in(argv)


def exit_on_user_error(e: BaseException, argv: Sequence[str] = ()) -> None:
  """Prints `e` as one line and exits with status 2 when it is a user error; returns otherwise."""
  message = user_error_message(e, argv)
  if message is None:
    return
  if _verbose(argv):
    traceback.print_exception(e)
  while _HISTORY_WRITTEN:  # the command's line is followed by how it ended
    workdir, script = _HISTORY_WRITTEN.pop()
    with contextlib.suppress(OSError):
      _append_history(workdir, {"script": script, "error": message})
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()
  sys.exit(USER_ERROR_STATUS)


@contextlib.contextmanager
def user_errors(argv: Sequence[str] | None = None) -> Iterator[None]:
  """Runs the block; a user error raised in it ends the process with its one line (status 2)."""
  argv = list(sys.argv if argv is None else argv)
  try:
    yield
  except Exception as e:  # noqa: BLE001  (anything else is re-raised as it was)
    exit_on_user_error(e, argv)
    raise


# -------------------------------------------------------------------------------------- logs


class _QuietLibraries(logging.Filter):
  """Below WARNING, only agentjax's records (and the running script's) pass: a filter on the
  root's handlers, since libraries set their own loggers' levels (bm25s sets DEBUG as it is
  imported) and orbax and tfds log through absl's logger. jax's "Unable to initialize backend"
  notes (every machine without a TPU) are dropped at any level."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name == "jax._src.xla_bridge" and \
       str(record.msg).startswith("Unable to initialize backend"):
      return False
    return record.levelno >= logging.WARNING or record.name in ("__main__", "agentjax") or \
        record.name.startswith("agentjax.")


def quiet_logs(verbose: bool) -> None:
  """agentjax's INFO lines and every library's warnings (verbose: every INFO line)."""
  root = logging.getLogger()
  root.setLevel(logging.INFO)
  for handler in root.handlers:
    for f in [f for f in handler.filters if isinstance(f, _QuietLibraries)]:
      handler.removeFilter(f)
    if not verbose:
      handler.addFilter(_QuietLibraries())


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a flag error as one line (status 2) instead of a usage dump."""
  try:
    for source in _CONFIGS:  # found while defining the flags, before any could be parsed
      if source.error is not None:
        raise source.error
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001
    exit_on_user_error(e, argv)
    raise


def run(main: Callable[[list[str]], Any]) -> None:
  """app.run(main) with the launch scripts' conventions (the module docstring): quiet logs,
  the run config's checks, one-line user errors with status 2, --verbose."""
  argv = list(sys.argv)
  flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[VERBOSE.name])  # --helpshort

  def checked_main(args: list[str]) -> Any:
    quiet_logs(VERBOSE.value)
    with user_errors(argv):
      for source in _CONFIGS:
        source.check()
      return main(args)

  app.run(checked_main, flags_parser=_parse_flags)


__all__ = ["HISTORY", "RECORD", "RunConfig", "UserError", "VERBOSE", "check_overrides",
           "define_config", "exit_on_user_error", "flag_value", "init_distributed",
           "override_paths", "quiet_logs", "recorded_config", "run", "user_error_message",
           "user_errors"]
