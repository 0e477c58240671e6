"""The built-in gin configurables: the modules that define them, named in one place.

A gin file can name a configurable only once its module is imported. `register_builtins`
imports every module of the package that defines one, so any built-in gin file parses;
a user's own modules come in with `--import` (config.import_modules). Nothing below the
entry points imports this module: it sits at the top of the import graph
(tests/test_import_graph.py), and config.py, which parses, stays a leaf.
"""

from __future__ import annotations

from typing import Sequence

from evotrainer import config


def register_builtins() -> None:
  """Imports every module that defines gin configurables, so any gin file can name them.

  The imports (they bring in JAX) run on the first call, not when this module is imported.
  """
  import evotrainer.harness.diagnostics  # noqa: F401
  import evotrainer.harness.curriculum  # noqa: F401
  import evotrainer.harness.filters  # noqa: F401
  import evotrainer.harness.pipeline  # noqa: F401
  import evotrainer.harness.rewards  # noqa: F401
  import evotrainer.harness.validators  # noqa: F401
  # The domains' diagnostics and validators register in the harness's libraries (code,
  # SWE, then math: the library's order, which the controller's gap search walks), first,
  # before any task module imports its own.
  import evotrainer.tasks.code.diagnostics  # noqa: F401
  import evotrainer.tasks.swe.diagnostics  # noqa: F401
  import evotrainer.tasks.swe.validators  # noqa: F401
  import evotrainer.tasks.math.diagnostics  # noqa: F401
  import evotrainer.eval.heldout  # noqa: F401
  import evotrainer.model.config  # noqa: F401
  import evotrainer.model.source  # noqa: F401
  import evotrainer.modes.branch  # noqa: F401
  import evotrainer.modes.evolve  # noqa: F401
  import evotrainer.modes.sweep  # noqa: F401
  import evotrainer.run  # noqa: F401
  import evotrainer.sampling.sampler  # noqa: F401
  import evotrainer.sharding.mesh  # noqa: F401
  import evotrainer.tasks.code.task  # noqa: F401
  import evotrainer.tasks.math.task  # noqa: F401
  import evotrainer.tasks.swe.task  # noqa: F401
  import evotrainer.tokenizers  # noqa: F401
  import evotrainer.train  # noqa: F401
  import evotrainer.learner.step  # noqa: F401
  import evotrainer.learner.warmstart  # noqa: F401
  import evotrainer.tasks.datasets  # noqa: F401
  import evotrainer.evolution.escalation  # noqa: F401
  import evotrainer.evolution.gates  # noqa: F401
  import evotrainer.evolution.harness_evolution  # noqa: F401
  import evotrainer.evolution.promotion  # noqa: F401
  import evotrainer.evolution.search_space  # noqa: F401


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (),
          search_paths: Sequence[str] = (), finalize: bool = True) -> None:
  """`config.parse` with every built-in configurable registered first."""
  register_builtins()
  config.parse(gin_files, bindings, search_paths, finalize=finalize)
