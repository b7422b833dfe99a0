"""Packaging for jaxfid: `pip install -e .` (library + `jaxfid` command).

Dependencies are compatible ranges, as JAX libraries declare them: the lower
end of each is the version ``requirements-lock.txt`` pins (CPython 3.11,
what ``make test`` and CI run), the upper end of the JAX stack the newest
releases ``make test-latest`` runs (CPython 3.12). jaxfid requires ``jax``
only: its ``jaxlib`` (CPU, TPU or CUDA) is the one already installed, or the
one an accelerator extra pulls in the way JAX's own extras do:
``jaxfid[tpu]``, ``jaxfid[cuda12]``, ``jaxfid[cuda13]``. ``jaxfid[tpu]``
also installs on a CPU host (libtpu is a plain manylinux wheel), where its
libtpu is the compiler ``jaxfid bench compile`` sizes TPU jobs with; there
JAX stays on the CPU (jaxfid/runtime/platforms.py). ``jaxfid[gpu-aot]`` (jax's
cuda12 extra under the name of its use) is the GPU compiler the same
command sizes GPU jobs with, on any host. ``make test`` installs both with
``test`` and ``torch`` (requirements-lock.txt pins their libtpu and CUDA
plugin) for the tests that compile for TPU topologies and GPUs.

Other extras: ``seqio`` (TensorFlow, seqio, TFDS, tensorflow-text: only the
seqio tasks in ``tasks/`` need them; FiD files train without), ``bench``
(what benchmarks/ compares with: bm25s), ``serve`` (uvicorn and
Starlette: ``jaxfid serve``), ``test`` (pytest and what the tests compare
with, the seqio stack and the serve extra included) and ``torch`` (PyTorch,
the reference of the PyTorch-parity tests; they skip without it). The T5
SentencePiece vocabulary ships inside the package (``jaxfid/assets``).
"""
import os

from setuptools import find_packages, setup

# Tested at both ends: 0.10.2 (requirements-lock.txt, Python 3.11) and the
# newest 0.12 release (`make test-latest`, Python 3.12).
JAX = ">=0.10.2,<0.13"

INSTALL_REQUIRES = [
    f"jax{JAX}",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    # Imported directly (also orbax's and jax's dependencies; tensorstore and
    # ml_dtypes at orbax's and jax's floors, so a host's accelerator stack
    # satisfies them as it is): run
    # directories as URLs (etils.epath), T5X checkpoints (tensorstore),
    # bfloat16 arrays (ml_dtypes).
    "etils[epath]>=1.15.0",
    "tensorstore>=0.1.84",
    "ml_dtypes>=0.5.0",
    "gin-config>=0.5.0",
    "faiss-cpu>=1.15.1",
    "sentencepiece>=0.2.3",
    "PyStemmer>=3.1.0",
    "regex>=2026.11.19",
    "safetensors>=0.8.0",
    "numpy>=2.4.6,<3",
    # BM25 top-k's compiled scatter (scipy.sparse's csc_matvec)
    "scipy>=1.17.1",
    "tqdm>=4.70.1",
    "matplotlib>=3.11.2",
    "tensorboardX>=2.6.5",
]

# JAX's own accelerator extras, over the same range: `pip install
# 'jaxfid[tpu]'` on a TPU VM (or any host, to compile for TPU topologies:
# jax[tpu] pins the libtpu that matches the jax installed),
# 'jaxfid[cuda12]' / 'jaxfid[cuda13]' on a CUDA host without its JAX yet. An installed CUDA or TPU jax in the range is
# kept by a plain `pip install jaxfid`.
ACCELERATOR_EXTRAS = {
    name: [f"jax[{name}]{JAX}"] for name in ("tpu", "cuda12", "cuda13")}

# The GPU compiler of `jaxfid bench compile --topology h100-8` on any host
# (a CPU laptop too): JAX's CUDA 12 plugin with its CUDA libraries (cuDNN,
# cuBLAS, nvcc's ptxas), at the installed jax's version: jax's own cuda12
# extra. A 3.2 GB download, 4.9 GB installed (measured with the lock's jax
# 0.10.2). On a host without an NVIDIA GPU JAX stays on the CPU
# (jaxfid/runtime/platforms.py). `make test` installs it for the GPU compile
# tests (tests/test_bench_compile_gpu.py).
GPU_AOT_REQUIRES = [f"jax[cuda12]{JAX}"]

# The seqio tasks (tasks/, `jaxfid train` with MIXTURE_OR_TASK_NAME, `jaxfid
# eval`); tensorflow-text pins TensorFlow's minor release.
SEQIO_REQUIRES = [
    "seqio>=0.0.20",
    "tensorflow>=2.21.0,<2.22",
    "tensorflow-text>=2.21.1,<2.22",
    "tensorflow-datasets>=4.9.10",
]

# What benchmarks/ compares jaxfid with (bm25s: bench_bm25.py).
BENCH_REQUIRES = [
    "bm25s>=0.3.16",
]

# `jaxfid serve`: an ASGI server (uvicorn) and the routing, request and
# response layer under it (Starlette); imported only when the command runs.
SERVE_REQUIRES = [
    "uvicorn>=0.55.0",
    "starlette>=1.10.0",
]

# The suite's own needs; its seqio tests need SEQIO_REQUIRES, its BM25
# comparisons bm25s, its server tests SERVE_REQUIRES, and transformers
# writes the tiny HF checkpoints; pytest-xdist runs `make test` on two
# workers.
TEST_REQUIRES = [
    "pytest>=9.2.0",
    "pytest-xdist>=3.8.0",
    "transformers>=5.24.0,<6",
] + SEQIO_REQUIRES + BENCH_REQUIRES + SERVE_REQUIRES

# The PyTorch reference (transformers' T5) of the parity tests; without it
# those tests skip. A CPU wheel is enough (https://download.pytorch.org/whl/cpu).
TORCH_REQUIRES = [
    "torch>=2.13.0",
]

_here = os.path.dirname(os.path.abspath(__file__))
_readme = os.path.join(_here, "README.md")
LONG_DESCRIPTION = ""
if os.path.exists(_readme):
  with open(_readme, encoding="utf-8") as f:
    LONG_DESCRIPTION = f.read()

setup(
    name="jaxfid",
    version="0.1.0",
    description=("Retrieval-augmented T5 in JAX: Fusion-in-Decoder, ReAtt "
                 "and ReFusion"),
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
    ],
    # jaxfid/assets holds data only (the vocabulary, and LM-BFF's SST-2
    # 16-shot split under lmbff/); listed explicitly so that setuptools ships
    # it as package data of "jaxfid.assets".
    packages=find_packages(include=["jaxfid", "jaxfid.*", "tasks",
                                    "tasks.*"]) + ["jaxfid.assets"],
    # jaxfid serve's page (HTML, CSS, JavaScript).
    package_data={"jaxfid.assets": ["*", "lmbff/*", "lmbff/*/*/*"],
                  "jaxfid.serving": ["static/*"],
                  # bench compile's GPU target configs (jaxfid/aot/gpus.py)
                  "jaxfid.aot": ["gpu_targets/*"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require={"seqio": SEQIO_REQUIRES,
                    "bench": BENCH_REQUIRES,
                    "serve": SERVE_REQUIRES,
                    "test": TEST_REQUIRES,
                    "torch": TORCH_REQUIRES,
                    "gpu-aot": GPU_AOT_REQUIRES,
                    **ACCELERATOR_EXTRAS},
    entry_points={"console_scripts": ["jaxfid=jaxfid.cli:main"]},
    zip_safe=False,
)
