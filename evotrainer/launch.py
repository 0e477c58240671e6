r"""Entry point: `python -m evotrainer.launch --gin_file=gin/math.gin`.

Flags:
  --gin_file            gin files, parsed in order (repeatable).
  --gin_bindings        extra bindings, e.g. "run.mode = 'sample'" (repeatable).
  --gin_search_paths    extra directories searched for gin files and includes.
  --import              Python modules to import first, so that their gin configurables
                        (a user's own reward part, diagnostic, ...) can be named in gin.
  --workdir             run directory (default: runs/<name of the last gin file>); or a
                        gs:// URL (evotrainer/paths.py) in every mode but `branch` (an
                        evolution's controller works in its local mirror:
                        evotrainer/evolution/ledger/mirror.py).
  --sweep_file          the sweep file of run.mode='sweep' (sets `sweep.file`).
  --resume_from         start from the ledger and skills of an earlier sweep or evolution
                        workdir, a local one (sets `evolve.resume_from`).
  --approve=GATE        with --workdir only: approve the gate GATE (diagnosis, design,
                        backtest, verification) a human-gated run is waiting at, and exit;
                        refused when another gate (or none) waits.
  --new_segment         accept a relaunch whose configuration differs from the workdir's
                        run (else refused with the differences), recorded as a new segment.
  --verbose             print the traceback of a known failure (always in error.log).
  --coordinator_address, --num_processes, --process_id
                        multi-host set-up (else the EVO_* environment variables; on a TPU
                        VM pod set EVO_TPU_POD=1 and nothing else).

Multi-process runs (several hosts, or local processes for a test): `train`, `branch`
and `sample` run on all processes, process 0 writing the files. `evolve` and `sweep` run
one controller, process 0's, and train each branch as a child on every process together
(evotrainer/evolution/pod.py); they need a workdir every host shares (a file system, not
gs://: their branches' checkpoints are written by every process).

Known failures (configuration, data, checkpoint, ledger, disk, permissions, memory,
workdir lock or fingerprint) end with one line `error (<kind>): ...` and exit code 2.
The workdir is locked for the run's life (a second process stops naming the holder) and
its configuration fingerprinted (evotrainer/workdir.py). A run started by an evolution's
controller or a benchmark (`EVOTRAINER_PARENT_PID` in its environment) ends when that
process ends, however it ends (evotrainer/lifetime.py).

Modes (`run.mode`):
  sample   build the policy (tiny model from scratch or a local HF checkpoint), sample
           completions for held-out problems, score them, and report.
  test     score a model trained earlier (`test.model`) on `EvalConfig.num_test` test
           problems, as a run scores its own (evotrainer/modes/scoring.py).
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

from absl import app, flags

from evotrainer import lifetime

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "gin files, parsed in order.")
flags.DEFINE_multi_string("gin_bindings", [], "gin bindings applied after the files.")
flags.DEFINE_multi_string("gin_search_paths", [], "extra gin search directories.")
flags.DEFINE_multi_string("import", [], "modules to import before parsing gin.")
flags.DEFINE_string("workdir", None, "run directory (default runs/<gin file stem>).")
flags.DEFINE_string("sweep_file", None, "sweep file of run.mode='sweep' (sweep.file).")
flags.DEFINE_string("resume_from", None, "an earlier sweep/evolution workdir to start from "
                    "(evolve.resume_from).")
flags.DEFINE_string("approve", None, "GATE: approve the gate the human-gated run in "
                    "--workdir waits at (its name, e.g. 'design', as gate.json and the run's "
                    "message say), and exit; a gate other than the waiting one is refused.")
flags.DEFINE_bool("new_segment", False, "accept a relaunch whose configuration differs "
                  "from the run in --workdir, recording the change as a new segment.")
flags.DEFINE_bool("verbose", False, "print the full traceback of a known failure (it is "
                  "always written to <workdir>/error.log).")
flags.DEFINE_string("coordinator_address", None, "multi-host coordinator host:port.")
flags.DEFINE_integer("num_processes", None, "multi-host process count.")
flags.DEFINE_integer("process_id", None, "multi-host id of this process.")

# Run modes that refuse a gs:// workdir (evotrainer/paths.py; docs/multihost.md#remote-workdirs-gs).
_LOCAL_ONLY_MODES = ("branch",)
# Run modes whose controller works in the local mirror of a gs:// workdir.
_CONTROLLER_MODES = ("evolve", "sweep")
# Which flags each run mode reads; any other given flag is an error in that mode.
_MODE_FLAGS = {"sweep": {"sweep_file", "resume_from", "new_segment"},
               "evolve": {"resume_from", "new_segment"},
               "train": {"new_segment"}, "branch": {"new_segment"},
               "ledger": set(), "sample": set(), "test": set()}


def _fail(kind: str, message: str) -> None:
  """Prints a known failure as `error (<kind>): message` and exits with code 2."""
  from evotrainer.errors import EXIT_KNOWN
  print(f"error ({kind}): {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_KNOWN)


def _gin_value(binding: str, default):
  """The value gin binds to `binding`, `default` when none."""
  import gin
  try:
    return gin.query_parameter(binding)
  except ValueError:
    return default


def _mode() -> str:
  return _gin_value("run.mode", "train")  # run()'s default


def _check_flags(mode: str, workdir: str) -> None:
  """Flags a mode does not read are errors; so is --resume_from into another run."""
  given = {"sweep_file": FLAGS.sweep_file, "resume_from": FLAGS.resume_from,
           "new_segment": FLAGS.new_segment}
  unused = [f"--{k}" for k, v in given.items() if v and k not in _MODE_FLAGS.get(mode, ())]
  if unused:
    _fail("config", f"{', '.join(unused)} is not used by run.mode='{mode}'; drop it (or set "
                    f"run.mode: --sweep_file is for 'sweep', --resume_from for 'evolve' "
                    f"and 'sweep')")
  from evotrainer import paths
  remote = paths.is_remote(workdir)
  try:
    paths.check(workdir)
  except paths.RemotePathError as e:
    _fail("config", f"--workdir={workdir}: {e}")
  if remote and mode in _LOCAL_ONLY_MODES:
    _fail("config", f"run.mode='{mode}' needs a local --workdir, not {workdir}: a branch "
                    f"is the child of an evolution or sweep, which trains it in a local "
                    f"directory (a gs:// workdir's mirror) and uploads it")
  if remote and mode in _CONTROLLER_MODES and _gin_value("evolve.human_gated", False):
    _fail("config", f"evolve.human_gated = True needs a local --workdir, not {workdir}: "
                    f"its gates are files (gate.json, approve) in the workdir that a person "
                    f"or --approve writes; use a local workdir (or a gcsfuse mount)")
  if FLAGS.resume_from and paths.is_remote(FLAGS.resume_from):
    _fail("config", f"--resume_from={FLAGS.resume_from}: the workdir to start from must be "
                    f"local (its ledger is copied and its checkpoints are read in place); "
                    f"copy it down first (gsutil -m cp -r)")
  from evotrainer.evolution.ledger.mirror import ledger_exists, open_ledger
  if mode == "ledger" and not ledger_exists(workdir):
    _fail("config", f"run.mode='ledger': no ledger in {workdir} "
                    f"({paths.as_path(workdir) / 'ledger.sqlite'} does not exist); "
                    f"check --workdir")
  if FLAGS.resume_from and ledger_exists(workdir):
    with open_ledger(workdir) as led:
      source = led.get_meta("resumed_from")
    if source != os.path.abspath(FLAGS.resume_from):
      _fail("config", f"--resume_from={FLAGS.resume_from}: {workdir} already holds a run "
                      f"(its own ledger{', started from ' + source if source else ''}); "
                      f"--resume_from only starts a new workdir: drop the flag to continue "
                      f"this run, or use a new --workdir")


def _approve() -> None:
  from evotrainer.evolution.controller import GateError, approve_gate
  if not FLAGS.workdir:
    raise app.UsageError("--approve=GATE needs --workdir (the run that waits)")
  try:
    print(approve_gate(FLAGS.workdir, FLAGS.approve))
  except GateError as e:
    _fail("gate", f"approve: {e}")


def _parse_config():
  """Imports --import's modules and parses the gin files and bindings (with the flags
  that set a binding); returns the command line the workdir's fingerprint records."""
  from evotrainer import config as config_lib
  from evotrainer import registry
  command_line = config_lib.CommandLine(
      gin_files=tuple(FLAGS.gin_file), gin_bindings=tuple(FLAGS.gin_bindings),
      gin_search_paths=tuple(FLAGS.gin_search_paths), imports=tuple(FLAGS["import"].value),
      flags=("--new_segment",) if FLAGS.new_segment else ())
  try:
    config_lib.import_modules(FLAGS["import"].value)
    own = [f"sweep.file = {FLAGS.sweep_file!r}"] if FLAGS.sweep_file else []
    own += [f"evolve.resume_from = {FLAGS.resume_from!r}"] if FLAGS.resume_from else []
    registry.parse(FLAGS.gin_file, [*FLAGS.gin_bindings, *own], FLAGS.gin_search_paths)
  except config_lib.ConfigError as e:
    _fail("config", str(e))
  config_lib.compilation_cache()
  return command_line


def _join_processes(mode: str, workdir: str):
  """Starts the multi-process runtime when one is configured; an evolution or sweep
  across processes joins its pod (one controller, process 0's: pod.py). Returns (the
  pod's hosts or None, whether this process is the primary one)."""
  from evotrainer import paths
  from evotrainer.sharding.mesh import initialize_distributed
  multi = initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                 FLAGS.process_id)
  if not multi:
    return None, True
  hosts = None
  if mode in _CONTROLLER_MODES:
    if paths.is_remote(workdir):
      _fail("config", f"run.mode='{mode}' across processes needs a --workdir every host "
                      f"shares (a file system or a gcsfuse mount), not {workdir}: its "
                      f"branches' checkpoints are written by every process, and a gs:// "
                      f"workdir's branches train in process 0's local mirror")
    from evotrainer.evolution import pod
    hosts = pod.join()
  return hosts, __import__("jax").process_index() == 0


def _note_segment(mode: str, workdir: str) -> None:
  """A relaunch whose configuration differs (accepted by --new_segment) is a new segment:
  the workdir's fingerprint and the ledger both record it."""
  from evotrainer import workdir as workdir_lib
  from evotrainer.evolution.ledger.mirror import record_segment
  if mode in ("train", "branch", "evolve", "sweep"):
    if workdir_lib.check_fingerprint(workdir, new_segment=FLAGS.new_segment):
      record_segment(workdir)


def _fail_known(known, e: Exception, workdir: str, primary: bool) -> None:
  """Ends a known failure in one line; process 0 writes the traceback to error.log (a
  gs:// workdir's stays in its local mirror)."""
  from evotrainer import errors, paths
  local = (None if paths.is_remote(workdir) and paths.scheme(workdir) not in paths.SCHEMES
           else paths.mirror_dir(workdir))
  where = (errors.write_traceback(local / "error.log", e)
           if primary and local is not None and local.is_dir() else None)
  if FLAGS.verbose:
    import traceback
    traceback.print_exc()
  # Our own refusals say everything; for the rest the traceback may help.
  hint = where and not FLAGS.verbose and known[0] not in ("lock", "workdir", "config")
  _fail(known[0], known[1] + (f" [traceback: {where}]" if hint else ""))


def _run_locked(mode: str, workdir: str, command_line) -> None:
  """Runs the mode holding the workdir's lock (one process per workdir; a ledger reader
  needs none). A known failure ends in one line; across processes, the others are told
  how this one ended."""
  from evotrainer import errors, workdir as workdir_lib
  from evotrainer.run import run
  lock = hosts = None
  primary = True  # until the processes are joined
  left = ["", "stopped"]  # what the other processes of a multi-process evolve are told
  try:
    hosts, primary = _join_processes(mode, workdir)
    if mode != "ledger" and primary:
      lock = workdir_lib.WorkdirLock(workdir).acquire()
      _note_segment(mode, workdir)
    run(workdir, command_line=command_line)
    left = None
  except Exception as e:  # pylint: disable=broad-except  (known failures: one line)
    known = errors.explain(e)
    left = list(known) if known else ["", f"{type(e).__name__}: {str(e)[:500]}"]
    if known is None:
      raise
    _fail_known(known, e, workdir, primary)
  finally:
    if hosts is not None:
      hosts.leave(left)
    if lock is not None:
      lock.release()


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger().setLevel(logging.WARNING)
  if FLAGS.approve is not None:
    _approve()
    return
  command_line = _parse_config()
  workdir = FLAGS.workdir or os.path.join("runs", pathlib.Path(FLAGS.gin_file[-1]).stem)
  mode = _mode()
  _check_flags(mode, workdir)
  _run_locked(mode, workdir, command_line)


def run_main() -> None:
  lifetime.die_with_launcher()  # started by a controller or a benchmark: end with it
  app.run(main)


if __name__ == "__main__":
  run_main()
