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
  so that a fault has something to break. The end-to-end tests that need one share the
  cached warm start when they run in the same xdist worker (each worker has its own
  session caches)."""
  return [*launch_caches, "warm_start.steps = 1500", "warm_start.target_accuracy = 0.3"]

