"""Test set-up: 8 fake CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session, shared by every launcher subprocess
# (the product's default is ~/.cache/evotrainer/jax: config.compilation_cache); tests
# never write to the user's home.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="evotrainer-jax-cache-")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: end-to-end tests (still run in CI)")
  # pytest-xdist's own marker; also known when the suite runs without xdist.
  config.addinivalue_line("markers", "xdist_group(name): run in the same xdist worker")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
  """Every `slow` test runs in one xdist worker (pytest.ini: `-n 2 --dist loadgroup`):
  they are the multi-process and launcher runs, each using more than one core, so two at
  once would only slow both; the other worker runs the fast tests meanwhile. They also
  share that worker's session caches (`launch_caches`, `solving_warm_start`)."""
  for item in items:
    if item.get_closest_marker("slow") and not item.get_closest_marker("xdist_group"):
      item.add_marker(pytest.mark.xdist_group("slow"))


@pytest.fixture(scope="session")
def devices():
  assert jax.device_count() == 8, "tests expect 8 fake CPU devices"
  return jax.devices()


@pytest.fixture(scope="session")
def launch_caches(tmp_path_factory):
  """`--gin_bindings` for a tokenizer and a warm-start cache shared by the launcher tests.

  Both caches are keyed by a hash of every input (texts and vocabulary size; model,
  initial parameters, tokenizer, training tokens and optimizer settings), so a test loads
  an entry only where it would have trained the very same thing: the first launch that
  needs the tiny warm start trains it, later ones with the same inputs load it.
  """
  root = tmp_path_factory.mktemp("launch-caches")
  return [f"make_tokenizer.cache_dir = '{root}/tok'", f"warm_start.cache_dir = '{root}/ws'"]


@pytest.fixture(scope="session")
def solving_warm_start(launch_caches):
  """`launch_caches` plus the main job's warm start (up to 1500 steps, stopping at 30% of
  training problems solved) instead of tiny.gin's 20 steps: a root that solves problems,
  so that a fault has something to break. The (slow) end-to-end tests that need one
  share the cached warm start: slow tests run in one xdist worker."""
  return [*launch_caches, "warm_start.steps = 1500", "warm_start.target_accuracy = 0.3"]

