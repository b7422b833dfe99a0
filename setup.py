"""Packaging for jaxfid: `pip install -e .` (library + `jaxfid` command).

Dependencies are pinned to the versions the test suite runs against; the
``test`` extra adds what the tests compare with (PyTorch + Hugging Face
transformers as the reference T5, bm25s, pytest), the ``bench`` extra what
the benchmarks compare with (bm25s). The T5 SentencePiece vocabulary
ships inside the package (``jaxfid/assets``).
"""
import os

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "gin-config==0.5.0",
    "faiss-cpu==1.15.1",
    "seqio==0.0.20",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "sentencepiece==0.2.3",
    "protobuf==7.36.2",
    "PyStemmer==3.1.0",
    "regex==2026.11.19",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "tqdm==4.70.1",
    "matplotlib==3.11.2",
    "tensorboardX==2.6.5",
]

# What benchmarks/ compares jaxfid with (bm25s: bench_bm25.py).
BENCH_REQUIRES = [
    "bm25s==0.3.16",
]

TEST_REQUIRES = [
    "pytest==9.2.0",
    "torch==2.13.0",
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "scipy==1.17.1",
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
    # jaxfid/assets holds data only (the vocabulary, and LM-BFF's SST-2
    # 16-shot split under lmbff/); listed explicitly so that setuptools ships
    # it as package data of "jaxfid.assets".
    packages=find_packages(include=["jaxfid", "jaxfid.*", "tasks",
                                    "tasks.*"]) + ["jaxfid.assets"],
    package_data={"jaxfid.assets": ["*", "lmbff/*", "lmbff/*/*/*"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    # the tests also compare BM25 scores and index files with bm25s's
    extras_require={"test": TEST_REQUIRES + BENCH_REQUIRES,
                    "bench": BENCH_REQUIRES},
    entry_points={"console_scripts": ["jaxfid=jaxfid.cli:main"]},
    zip_safe=False,
)
