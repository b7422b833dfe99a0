#!/usr/bin/env bash
# The H200 measurement of issue #7 as one device run. Measured 2026-12-04:
# install and smoke run take about 2 minutes, then jaxfid's unrolled t5-base
# train step was still compiling when the 600-second call limit came, 7
# minutes later. Next try: `bash benchmarks/h200.sh --scan-layers`
# (benchmarks/RESULTS.md, "The H200 run of 2026-12-04").
#
# The lent machine has its own CUDA 13 jax (0.11.2), flax, optax, orbax,
# torch 2.11 and transformers 5.17, no network, and not all of jaxfid's
# requirements (no gin-config, faiss-cpu, PyStemmer, tensorboardX). jaxfid
# is installed there like anywhere else, `pip install -e .`, from the
# machine's packages plus wheels carried in .whl: setup.py's ranges take the
# machine's jax as it is (step 0 fails if the install changed it). Before
# the run, here (with the registry; .whl/ is git-ignored):
#   bash benchmarks/h200.sh --fetch-wheels
# and call the device tool with command "bash benchmarks/h200.sh" and carry
# [".whl"]. pip takes a carried wheel only where the machine's package is
# missing or outside jaxfid's range (sentencepiece 0.2.2 there, say).
#
# 0. installs jaxfid; 1. prints the versions; 2. a tiny jaxfid-only smoke run
# (catches an API mismatch in seconds instead of after the reference's
# minutes); 3. the t5-base comparison of the issue, with remat full and dots
# for the dense train step. Everything goes to $OUT (the device tool brings
# it back). Arguments are added to step 3 (e.g. `bash benchmarks/h200.sh
# --hardware-rng` for one more train row with gin's USE_HARDWARE_RNG keys,
# about a minute).
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# jaxfid's requirements (the lock's versions; CPython 3.12 wheels) that the
# machine lacks or may have outside jaxfid's ranges. No jax: the machine's.
WHEELS="flax==0.12.12 optax==0.2.8 orbax-checkpoint==0.12.8 gin-config==0.5.0
  faiss-cpu==1.15.1 PyStemmer==3.1.0 tensorboardX==2.6.5 sentencepiece==0.2.3
  regex==2026.11.19 tqdm==4.70.1 matplotlib==3.11.2 etils==1.15.0
  tensorstore==0.1.86"
if [ "${1:-}" = --fetch-wheels ]; then
  rm -rf .whl && mkdir .whl || exit 1
  # shellcheck disable=SC2086
  exec python3 -m pip download --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .whl $WHEELS
fi
OUT=${OUT:-/tmp/jaxfid_h200}
mkdir -p "$OUT"
jax_before=$(python3 -c 'import importlib.metadata as m; print(m.version("jax"))') || exit 1
# --use-pep517: setuptools' legacy `develop` runs a nested pip with build
# isolation, which fetches setuptools from the (unreachable) registry.
python3 -m pip install --no-index --find-links .whl --no-build-isolation \
    --use-pep517 --no-cache-dir -e . >"$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; echo "jaxfid install failed" >&2; exit 1; }
jax_after=$(python3 -c 'import importlib.metadata as m; print(m.version("jax"))')
[ "$jax_before" = "$jax_after" ] \
  || { echo "installing jaxfid changed jax $jax_before -> $jax_after" >&2; exit 1; }
echo "jaxfid installed; jax $jax_after kept"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 - <<'EOF' 2>&1 | tee "$OUT/versions.txt" || exit 1
import flax, jax, optax, torch, transformers
print("jax", jax.__version__, jax.devices(), "flax", flax.__version__,
      "optax", optax.__version__, "torch", torch.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA",
      "transformers", transformers.__version__)
EOF
timeout 300 python3 benchmarks/fid_vs_pytorch.py --size tiny --batch-size 2 \
    --n-context 2 --text-maxlength 16 --answer-maxlength 4 \
    --decode-batch-sizes 2 --steps 1 --remat full,dots --fido-period 2 \
    --fido-mq --skip-torch >"$OUT/smoke.log" 2>&1 \
  || { tail -40 "$OUT/smoke.log"; echo "smoke run failed" >&2; exit 1; }
echo "smoke run passed"
python3 benchmarks/fid_vs_pytorch.py --size t5_base --batch-size 4 \
    --n-context 100 --text-maxlength 250 --answer-maxlength 20 \
    --decode-batch-sizes 1,16 --steps 10 --dtype bfloat16 --compile \
    --remat full,dots --fido-period 6 --fido-mq \
    --json-out "$OUT/h200_t5_base.json" "$@" 2>&1 | tee "$OUT/h200_t5_base.log"
