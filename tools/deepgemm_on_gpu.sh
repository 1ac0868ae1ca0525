#!/usr/bin/env bash
# Builds DeepGEMM from source on a GPU machine without network access and installs it into
# the python there (against that torch, with that nvcc), then runs DeepGEMM's own paged MQA
# logits test once; with --check, then runs dsa_ext's DeepGEMM checks and the decode-step
# example.
#
# Usage: tools/deepgemm_on_gpu.sh SRC_DIR OUT_DIR [--check]
#   SRC_DIR  what tools/deepgemm_fetch.sh prepared (deepgemm-src.tar.xz, DEEPGEMM_COMMIT),
#            carried to the GPU machine in a git-ignored folder
#   OUT_DIR  receives deepgemm_build.log (environment, build, step exit codes),
#            deepgemm_test.log (DeepGEMM's test_paged_mqa_logits, DG_MQA_NUM_CASES of its
#            cases, default 1), and with --check: deepgemm_check.log/.json
#            (tools/deepgemm_check.py), pytest.log (the cuda tests of test_mqa_logits.py and
#            test_indexer_metadata.py), decode_step.log (examples/decode_step.py, W = 1 and
#            2) and deepgemm_jit.tar.gz (DeepGEMM's JIT cache: untar it into
#            DG_JIT_CACHE_DIR on the next machine to skip the compiles); and the wheel it
#            built (DEEPGEMM_WHEEL=that file installs it instead of building again)
# --check needs dsa_ext importable (installed, or PYTHONPATH=python with a built _C).
#
# DeepGEMM compiles its kernels at run time (JIT, with this nvcc) into DG_JIT_CACHE_DIR
# (default /tmp/deepgemm-jit): that is DeepGEMM's business as the caller's dependency;
# dsa_ext itself compiles nothing at run time.
set -uo pipefail
SRC="$(cd "${1:?usage: deepgemm_on_gpu.sh SRC_DIR OUT_DIR [--check]}" && pwd)"
mkdir -p "${2:?usage: deepgemm_on_gpu.sh SRC_DIR OUT_DIR [--check]}"
OUT="$(cd "$2" && pwd)"
CHECK="${3:-}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export DG_JIT_CACHE_DIR="${DG_JIT_CACHE_DIR:-/tmp/deepgemm-jit}"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}"
LOG="$OUT/deepgemm_build.log"
declare -A STATUS

step() {  # step NAME LOG CMD...: run CMD with output in OUT/LOG, record its exit code
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  echo "== $name" | tee -a "$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  STATUS[$name]=$?
  echo "== $name: exit ${STATUS[$name]} after $((SECONDS - t0)) s" | tee -a "$OUT/$log"
}

BUILD=/tmp/deepgemm-build
rm -rf "$BUILD" && mkdir -p "$BUILD/lib" "$BUILD/wheel"
tar -xJf "$SRC/deepgemm-src.tar.xz" -C "$BUILD"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  cat "$SRC/DEEPGEMM_COMMIT"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  nvcc --version | tail -2
  echo "CUDA_HOME=$CUDA_HOME"
} >"$LOG" 2>&1

# torch's CUDA headers include the cuBLAS, cuSPARSE and cuSOLVER headers, and DeepGEMM
# links NVRTC and the CUDA runtime: from the toolkit where it has them, else from the
# nvidia-* wheels torch was installed with (their libraries carry only versioned names,
# so unversioned links for the linker go into $BUILD/lib).
SITE="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for header in cublasLt.h cusparse.h cusolverDn.h nvrtc.h; do
  dir="$(find "$CUDA_HOME/include" "$SITE/nvidia" -maxdepth 3 -name "$header" -printf '%h\n' \
         2>/dev/null | head -1)"
  echo "$header: ${dir:-not found}" >>"$LOG"
  [ -n "$dir" ] && export CPATH="$dir${CPATH:+:$CPATH}"
done
for lib in nvrtc cudart; do
  file="$(find "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$SITE/nvidia" -name "lib$lib.so*" \
          2>/dev/null | sort | head -1)"
  echo "lib$lib: ${file:-not found}" >>"$LOG"
  [ -n "$file" ] && ln -sf "$file" "$BUILD/lib/lib$lib.so"
done
export LIBRARY_PATH="$BUILD/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MAX_JOBS="$(nproc)"

if [ -n "${DEEPGEMM_WHEEL:-}" ]; then  # a wheel an earlier run of this script built
  cp "$DEEPGEMM_WHEEL" "$BUILD/wheel/"
  STATUS[deepgemm_build]=0
else
  cd "$BUILD/deepgemm"
  step deepgemm_build deepgemm_build.log timeout 400 \
    $PY -m pip wheel --no-build-isolation --no-deps --no-index -v -w "$BUILD/wheel" .
  cp "$BUILD"/wheel/*.whl "$OUT/" 2>>"$LOG"
fi
cd /tmp
step deepgemm_install deepgemm_build.log $PY -m pip install --no-deps --no-index "$BUILD"/wheel/*.whl
step deepgemm_import deepgemm_build.log $PY -c \
  'import deep_gemm; print(deep_gemm.__version__, deep_gemm.__file__)'
# DeepGEMM's own test of the paged MQA logits (its test file, its tolerances).
cd "$BUILD/deepgemm/tests"
step deepgemm_test deepgemm_test.log env DG_MQA_NUM_CASES="${DG_MQA_NUM_CASES:-1}" \
  timeout 300 $PY -c 'import random, torch, test_attention as t
torch.manual_seed(0); random.seed(0); t.test_paged_mqa_logits()'
cd /tmp

if [ "$CHECK" = --check ]; then
  step check deepgemm_check.log timeout 300 $PY "$REPO/tools/deepgemm_check.py" \
    --commit-file "$SRC/DEEPGEMM_COMMIT" --json "$OUT/deepgemm_check.json"
  step pytest pytest.log timeout 300 $PY -m pytest -q -ra -p no:cacheprovider \
    --rootdir "$REPO" -c "$REPO/pyproject.toml" -m cuda \
    "$REPO/tests/test_mqa_logits.py" "$REPO/tests/test_indexer_metadata.py"
  step example decode_step.log timeout 200 $PY "$REPO/examples/decode_step.py"
  step example_dcp2 decode_step.log timeout 200 $PY "$REPO/examples/decode_step.py" --dcp 2
  tar -C "$DG_JIT_CACHE_DIR" -czf "$OUT/deepgemm_jit.tar.gz" . 2>>"$LOG"
fi

{
  echo "== steps"
  for name in "${!STATUS[@]}"; do echo "$name ${STATUS[$name]}"; done | sort
} | tee -a "$LOG"
for name in "${!STATUS[@]}"; do [ "${STATUS[$name]}" = 0 ] || exit 1; done
