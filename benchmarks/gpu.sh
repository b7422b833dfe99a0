#!/usr/bin/env bash
# jaxfid's first GPU numbers in one device run of at most 8 minutes, on
# whatever GPU machine is lent (H100 or H200: it reads the card), issue #45:
#   0. install jaxfid from the machine's packages plus carried wheels;
#   1. versions and the card;
#   2. FiD-base's train step (100 passages x 250 tokens, 20 target tokens,
#      bfloat16, REMAT='full', SCAN_LAYERS=True) exactly as `jaxfid train`
#      jits it (benchmarks/gpu_step.py), at the largest batch `jaxfid bench
#      compile` found to fit that card (deviceless, below): 1 step to
#      compile, 20 timed, examples/s and MFU at the card's dense bf16 peak;
#   3. greedy decoding (the evaluation's program) at batch 1 and 16;
#   4. the HF PyTorch reference (benchmarks/fid_vs_pytorch.py --skip-jax:
#      sdpa, and torch.compile) on the same GPU with what time is left.
# Each step has its own timeout inside the 480 s (train: all but 150 s of
# what the install left; decode: all but 20 s of the rest; the reference
# only with more than 2 minutes left); results go to $OUT (the device tool
# brings it back) as JSON lines and logs.
#
# `bash benchmarks/gpu.sh --attention` instead runs, after 0 and 1, the
# attention comparison (issue #49): FiD-base's scanned train step at batch
# 16 with DROPOUT_RATE=0.0 (cuDNN's flash attention takes no attention
# dropout) and greedy decoding at batch 16, each with ATTENTION='reference'
# and then 'cudnn' (benchmarks/gpu_step.py --attentions): step times, the
# first step's loss of each (they agree to bfloat16 tolerance when cuDNN
# computes what the einsums do) and the decoded tokens' SHA-1. Both
# programs compile deviceless with either attention (docs/gpu.md, "cuDNN
# flash attention").
#
# The batches (per card) were sized deviceless on the 2-core CPU host with
# jax 0.10.2 + jax-cuda12-plugin 0.10.2 (benchmarks/RESULTS.md, "GPU
# programs, sized without a GPU"), each program compiled so:
#   jaxfid bench compile --topology h100-1 --gin_file=gin/fid/base.gin \
#       --gin.TARGET_MAXLENGTH=20 --gin.SCAN_LAYERS=True --gin.BATCH_SIZE=B
#   jaxfid bench compile --topology h100-1 --gin_file=gin/fid/base.gin \
#       --gin.ANSWER_MAXLENGTH=20 --gin.SCAN_LAYERS=True --program decode \
#       --gin.EVAL_BATCH_SIZE=16   (and 1; and for h200-1)
# The largest batch that fits each card: the scanned step needs 2.68 GB of
# arguments plus 3.17 GB per example. XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
# lets JAX use what the compiler counted (its default preallocation is 75%
# of the card): 80.7 GB of an H100, 143.8 of an H200.
#
# The lent machine has its own CUDA jax (0.11.2 on the H200 of 2026-12-04),
# flax, optax, orbax, torch and transformers, no network, and not all of
# jaxfid's requirements. Before the run, here (with the registry; .whl/ is
# git-ignored):
#   bash benchmarks/gpu.sh --fetch-wheels
# and call the device tool with command "bash benchmarks/gpu.sh" and carry
# [".whl"]. pip takes a carried wheel only where the machine's package is
# missing or outside jaxfid's range.
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
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
OUT=${OUT:-/tmp/jaxfid_gpu}
mkdir -p "$OUT"
BUDGET=${BUDGET:-480}  # seconds for the whole run
left() { echo $(( BUDGET - SECONDS )); }

# 0. install
jax_before=$(python3 -c 'import importlib.metadata as m; print(m.version("jax"))') || exit 1
# --use-pep517: setuptools' legacy `develop` runs a nested pip with build
# isolation, which fetches setuptools from the (unreachable) registry.
python3 -m pip install --no-index --find-links .whl --no-build-isolation \
    --use-pep517 --no-cache-dir -e . >"$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; echo "jaxfid install failed" >&2; exit 1; }
jax_after=$(python3 -c 'import importlib.metadata as m; print(m.version("jax"))')
[ "$jax_before" = "$jax_after" ] \
  || { echo "installing jaxfid changed jax $jax_before -> $jax_after" >&2; exit 1; }
echo "jaxfid installed in ${SECONDS}s; jax $jax_after kept"

# 1. versions and the card
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt" || exit 1
import importlib.metadata as m
import jax
print("jax", jax.__version__, "devices", jax.devices(),
      "kind", jax.devices()[0].device_kind,
      *(f"{n} {m.version(n)}" for n in ("flax", "optax", "torch",
                                        "transformers")
        if any(d.metadata["Name"] == n for d in m.distributions())))
PY
kind=$(python3 -c 'import jax; print(jax.devices()[0].device_kind)')
case "$kind" in
  *H100*) BATCH=${BATCH:-24} ;;  # 78.54 of 84.94 GB (16: 53.37)
  *H200*) BATCH=${BATCH:-44} ;;  # 141.99 of 151.40 GB (32: 104.86)
  *) echo "no batch sized for '$kind' (H100 and H200 are); set BATCH=N" >&2
     [ -n "${BATCH:-}" ] || exit 1 ;;
esac
BASE=(--gin_file=gin/fid/base.gin --gin.TARGET_MAXLENGTH=20
      --gin.DECODE_MAXLENGTH=20 --gin.SCAN_LAYERS=True)

# --attention: reference against cuDNN, train then decode, at batch 16
if [ "${1:-}" = --attention ]; then
  timeout "$(( $(left) / 2 ))" python3 benchmarks/gpu_step.py train \
      "${BASE[@]}" --gin.BATCH_SIZE=16 --gin.DROPOUT_RATE=0.0 --steps 10 \
      --attentions reference,cudnn --json-out "$OUT/attention_train.jsonl" \
      2>&1 | tee "$OUT/attention_train.log" | tail -3
  timeout "$(( $(left) - 10 ))" python3 benchmarks/gpu_step.py decode \
      "${BASE[@]}" --batch-sizes 16 --steps 5 --attentions reference,cudnn \
      --json-out "$OUT/attention_decode.jsonl" \
      2>&1 | tee "$OUT/attention_decode.log" | tail -3
  echo "done in ${SECONDS}s"
  exit 0
fi

# 2. the train step; if the largest batch fails (the card's allocator
# needs more than the compiler counted), once more at batch 16 (53.37 GB)
# while more than 200 s are left
train() {
  timeout "$(( $(left) - 150 ))" python3 benchmarks/gpu_step.py train \
      "${BASE[@]}" --gin.BATCH_SIZE="$1" --steps 20 \
      --json-out "$OUT/train_$1.jsonl" 2>&1 | tee "$OUT/train_$1.log" | tail -3
}
train "$BATCH" || { [ "$BATCH" != 16 ] && [ "$(left)" -gt 200 ] && train 16; }
echo "train done at ${SECONDS}s"

# 3. greedy decoding at batch 1 and 16
timeout "$(( $(left) - 20 ))" python3 benchmarks/gpu_step.py decode "${BASE[@]}" \
    --batch-sizes 1,16 --steps 5 --json-out "$OUT/decode.jsonl" \
    2>&1 | tee "$OUT/decode.log" | tail -3
echo "decode done at ${SECONDS}s"

# 4. the HF PyTorch reference, with what is left (sdpa, then torch.compile)
if [ "$(left)" -gt 120 ]; then
  timeout "$(( $(left) - 10 ))" python3 benchmarks/fid_vs_pytorch.py \
      --size t5_base --batch-size 4 --n-context 100 --text-maxlength 250 \
      --answer-maxlength 20 --decode-batch-sizes 1,16 --steps 10 \
      --dtype bfloat16 --compile --skip-jax --json-out "$OUT/torch.json" \
      2>&1 | tee "$OUT/torch.log" | tail -15
fi
echo "done in ${SECONDS}s"
