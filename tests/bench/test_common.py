"""bench.common.packages: the versions every benchmark JSON records."""

from __future__ import annotations

import platform

import flax
import jax
import numpy as np
import optax

from bench import common


def test_packages_are_the_installed_versions():
  got = common.packages()
  assert got["python"] == platform.python_version()
  assert got["jax"] == jax.__version__ and got["numpy"] == np.__version__
  assert got["flax"] == flax.__version__ and got["optax"] == optax.__version__
  assert set(got) == {"python", *common.PACKAGES}


def test_a_package_that_is_not_installed_is_none(monkeypatch):
  monkeypatch.setattr(common, "PACKAGES", ("jax", "no-such-package-evotrainer"))
  got = common.packages()
  assert got["no-such-package-evotrainer"] is None and got["jax"] == jax.__version__


def test_extra_packages_are_recorded_too():
  got = common.packages(("no-such-package-evotrainer", "numpy"))
  assert got["no-such-package-evotrainer"] is None and got["numpy"] == np.__version__
  assert set(got) == {"python", *common.PACKAGES, "no-such-package-evotrainer"}
