r"""Entry point: `python -m evotrainer.launch --gin_file=gin/math.gin`.

Flags:
  --gin_file            gin files, parsed in order (repeatable).
  --gin_bindings        extra bindings, e.g. "run.mode = 'sample'" (repeatable).
  --gin_search_paths    extra directories searched for gin files and includes.
  --import              Python modules to import first, so that their gin configurables
                        (a user's own reward part, diagnostic, ...) can be named in gin.
  --workdir             run directory (default: runs/<name of the last gin file>).
  --sweep_file          the sweep file of run.mode='sweep' (sets `sweep.file`).
  --resume_from         start from the ledger and skills of an earlier sweep or evolution
                        workdir (sets `evolve.resume_from`).
  --approve             with --workdir only: approve the gate a human-gated run
                        (`evolve.human_gated = True`) is waiting at, and exit.
  --coordinator_address, --num_processes, --process_id
                        multi-host set-up (else the EVO_* environment variables; on a TPU
                        VM pod set EVO_TPU_POD=1 and nothing else).

Modes (`run.mode`):
  sample   build the policy (tiny model from scratch or a local HF checkpoint), sample
           completions for held-out problems, score them, and report.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "gin files, parsed in order.")
flags.DEFINE_multi_string("gin_bindings", [], "gin bindings applied after the files.")
flags.DEFINE_multi_string("gin_search_paths", [], "extra gin search directories.")
flags.DEFINE_multi_string("import", [], "modules to import before parsing gin.")
flags.DEFINE_string("workdir", None, "run directory (default runs/<gin file stem>).")
flags.DEFINE_string("sweep_file", None, "sweep file of run.mode='sweep' (sweep.file).")
flags.DEFINE_string("resume_from", None, "an earlier sweep/evolution workdir to start from "
                    "(evolve.resume_from).")
flags.DEFINE_bool("approve", False, "approve the gate the human-gated run in --workdir "
                  "waits at, and exit.")
flags.DEFINE_string("coordinator_address", None, "multi-host coordinator host:port.")
flags.DEFINE_integer("num_processes", None, "multi-host process count.")
flags.DEFINE_integer("process_id", None, "multi-host id of this process.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger().setLevel(logging.WARNING)
  if FLAGS.approve:
    from evotrainer.evolution.controller import GateError, approve_gate
    if not FLAGS.workdir:
      raise app.UsageError("--approve needs --workdir (the run that waits)")
    try:
      print(approve_gate(FLAGS.workdir))
    except GateError as e:
      sys.exit(f"approve: {e}")
    return
  from evotrainer import config as config_lib
  from evotrainer.run import run
  from evotrainer.sharding.mesh import initialize_distributed

  config_lib.LAUNCH.update(gin_files=list(FLAGS.gin_file),
                           gin_bindings=list(FLAGS.gin_bindings),
                           gin_search_paths=list(FLAGS.gin_search_paths),
                           imports=list(FLAGS["import"].value))
  try:
    config_lib.import_modules(FLAGS["import"].value)
    own = [f"sweep.file = {FLAGS.sweep_file!r}"] if FLAGS.sweep_file else []
    own += [f"evolve.resume_from = {FLAGS.resume_from!r}"] if FLAGS.resume_from else []
    config_lib.parse(FLAGS.gin_file, [*FLAGS.gin_bindings, *own], FLAGS.gin_search_paths)
  except config_lib.ConfigError as e:
    sys.exit(f"configuration error: {e}")
  initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  workdir = FLAGS.workdir or os.path.join("runs", pathlib.Path(FLAGS.gin_file[-1]).stem)
  from evotrainer.evolution.sweep_file import SweepError
  try:
    run(workdir)
  except SweepError as e:
    sys.exit(f"sweep error: {e}")


def run_main() -> None:
  app.run(main)


if __name__ == "__main__":
  run_main()
