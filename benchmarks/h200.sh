#!/usr/bin/env bash
# The H200 measurement of issue #7 as one device run (about 8-9 minutes once
# the machine is up; estimate, not measured).
#
# The lent machine has jax 0.11.2 (CUDA), flax, optax, torch 2.11 and
# transformers 5.17 (T5 declares sdpa there too) but no gin, seqio,
# tensorflow or faiss: the benchmark imports none of them. To pin this
# project's flax and optax, carry their wheels (before the run, here):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 -d .whl \
#       flax==0.12.8 optax==0.2.8
# and call the device tool with command "bash benchmarks/h200.sh" and carry
# [".whl"]. Without .whl the machine's own flax and optax are used.
#
# 1. prints the versions; 2. a tiny jaxfid-only smoke run (catches an API
# mismatch in seconds instead of after the reference's minutes); 3. the
# t5-base comparison of the issue, with remat full and dots for the dense
# train step. Everything goes to $OUT (the device tool brings it back).
# Arguments are added to step 3 (e.g. `bash benchmarks/h200.sh --hardware-rng`
# for one more train row with gin's USE_HARDWARE_RNG keys, about a minute).
set -o pipefail
OUT=${OUT:-/tmp/jaxfid_h200}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
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
