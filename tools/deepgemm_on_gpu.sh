#!/usr/bin/env bash
# Builds DeepGEMM from source on a GPU machine without network access and installs it into
# the python there (against that torch, with that nvcc), then runs DeepGEMM's own paged MQA
# logits test once; with --check, first dsa_ext's DeepGEMM checks and the decode-step
# example, after it the GPU tests.
#
# Usage: tools/deepgemm_on_gpu.sh SRC_DIR OUT_DIR [--check]
#   SRC_DIR  what tools/deepgemm_fetch.sh prepared (deepgemm-src.tar.xz, DEEPGEMM_COMMIT),
#            carried to the GPU machine in a git-ignored folder
#   OUT_DIR  receives deepgemm_build.log (environment, build, step exit codes),
#            deepgemm_test.log (DeepGEMM's test_paged_mqa_logits, DG_MQA_NUM_CASES of its
#            cases, default 1), and with --check: deepgemm_check.log/.json
#            (tools/deepgemm_check.py), pytest.log (tests/test_mqa_logits.py and
#            test_decode_step_example.py), decode_step.log (examples/decode_step.py, W = 1 and
#            2) and deepgemm_jit.tar.gz (DeepGEMM's JIT cache: untar it into
#            DG_JIT_CACHE_DIR on the next machine to skip the compiles); and the wheel it
#            built (DEEPGEMM_WHEEL=that file installs it instead of building again; with
#            LD_PRELOAD as the log says when the build needed it)
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
. "$REPO/tools/steps.sh"

BUILD=/tmp/deepgemm-build
rm -rf "$BUILD" && mkdir -p "$BUILD/lib" "$BUILD/wheel"
tar -xJf "$SRC/deepgemm-src.tar.xz" -C "$BUILD"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  cat "$SRC/DEEPGEMM_COMMIT"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  nvcc --version | tail -2
  echo "CUDA_HOME=$CUDA_HOME CC=${CC:-} CXX=${CXX:-}"
  ${CXX:-${CC:-g++}} --version | head -1
} >"$LOG" 2>&1

# torch's CUDA headers include the cuBLAS, cuSPARSE and cuSOLVER headers, and DeepGEMM
# links NVRTC and the CUDA runtime: from the toolkit where it has them, else from the
# nvidia-* wheels torch was installed with (their libraries carry only versioned names,
# so unversioned links for the linker go into $BUILD/lib). Only the build sees these
# paths (BUILD_PATHS): DeepGEMM's JIT compiles with the toolkit alone.
SITE="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
BUILD_CPATH="${CPATH:-}"
for header in cublasLt.h cusparse.h cusolverDn.h nvrtc.h; do
  dir="$(find "$CUDA_HOME/include" "$SITE/nvidia" -maxdepth 3 -name "$header" -printf '%h\n' \
         2>/dev/null | head -1)"
  echo "$header: ${dir:-not found}" >>"$LOG"
  [ -n "$dir" ] && BUILD_CPATH="$dir${BUILD_CPATH:+:$BUILD_CPATH}"
done
for lib in nvrtc cudart; do
  file="$(find "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$SITE/nvidia" -name "lib$lib.so*" \
          2>/dev/null | sort | head -1)"
  echo "lib$lib: ${file:-not found}" >>"$LOG"
  [ -n "$file" ] && ln -sf "$file" "$BUILD/lib/lib$lib.so" \
    && export LD_LIBRARY_PATH="$(dirname "$file")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
BUILD_PATHS=(CPATH="$BUILD_CPATH" LIBRARY_PATH="$BUILD/lib${LIBRARY_PATH:+:$LIBRARY_PATH}")

# DeepGEMM's first call JIT-compiles (schedule kernel) and runs. It is probed under a
# SIGSEGV handler that prints a native backtrace (file:line in DeepGEMM via addr2line):
# in the first run on the H200 image (torch 2.11, g++ from /opt/gcc) every first call
# (DeepGEMM's own test included) died with SIGSEGV inside get_paged_mqa_logits_metadata,
# before its JIT wrote anything. A build whose first call crashes is retried with the
# compiler's own libstdc++ preloaded, then rebuilt with the system g++ (when that is
# another compiler), then with libstdc++ linked statically.
cat >"$BUILD/segv_backtrace.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
static void on_segv(int sig) {
  void *frames[64];
  int n = backtrace(frames, 64);
  for (int i = 0; i < n; i++) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname)
      fprintf(stderr, "BT %s 0x%lx %s\n", info.dli_fname,
              (unsigned long)((char *)frames[i] - (char *)info.dli_fbase),
              info.dli_sname ? info.dli_sname : "?");
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_segv); }
C
gcc -shared -fPIC -o "$BUILD/segv_backtrace.so" "$BUILD/segv_backtrace.c" >>"$LOG" 2>&1
PROBE='import torch, deep_gemm as dg
ctx = torch.full((64, 2), 1000, dtype=torch.int32, device="cuda")
m = dg.get_paged_mqa_logits_metadata(ctx, 64, dg.get_num_sms())
torch.cuda.synchronize()
print("first call ok:", dg.__version__, tuple(m.shape))'

probe() {  # probe LABEL [LIB_TO_PRELOAD]: DeepGEMM's first call; backtrace on a crash
  local label="$1" preload="${2:-}"
  echo "== first_call ($label)" >>"$LOG"
  # DG_JIT_DEBUG: DeepGEMM says how far its JIT got (the generated code, nvcc's command).
  DG_JIT_DEBUG=1 LD_PRELOAD="$BUILD/segv_backtrace.so${preload:+ $preload}" timeout 120 \
    $PY -c "$PROBE" >"$BUILD/probe.log" 2>&1
  local rc=$?
  grep -v '^BT ' "$BUILD/probe.log" | tail -40 >>"$LOG"
  grep '^BT ' "$BUILD/probe.log" | head -40 | while read -r _ lib off sym; do
    case "$lib" in
      *deep_gemm*) echo "  $(addr2line -f -C -i -e "$lib" "$off" | paste -sd' ') [$sym]" ;;
      *) echo "  $lib $off [$sym]" ;;
    esac
  done >>"$LOG" 2>&1
  echo "== first_call ($label): exit $rc" | tee -a "$LOG"
  STATUS[deepgemm_first_call]=$rc
  return $rc
}

build_and_install() {  # build_and_install LABEL [ENV...]: a wheel into $BUILD/wheel, installed
  rm -rf "$BUILD/wheel" && mkdir -p "$BUILD/wheel"
  cd "$BUILD/deepgemm"
  # DG_USE_LOCAL_VERSION=0: version 2.6.1 without a "+local" tag, so the wheel's name
  # survives the trip back from the GPU machine.
  step "deepgemm_build_$1" deepgemm_build.log env "${BUILD_PATHS[@]}" DG_USE_LOCAL_VERSION=0 \
    "${@:2}" timeout 400 \
    $PY -m pip wheel --no-build-isolation --no-deps --no-index -v -w "$BUILD/wheel" .
  cd /tmp
  step "deepgemm_install_$1" deepgemm_build.log $PY -m pip install --force-reinstall \
    --no-deps --no-index "$BUILD"/wheel/*.whl
}

if [ -n "${DEEPGEMM_WHEEL:-}" ]; then  # a wheel an earlier run of this script built
  step deepgemm_install_given deepgemm_build.log $PY -m pip install --no-deps --no-index \
    "$DEEPGEMM_WHEEL"
  probe given
else
  build_and_install default
  if ! probe default; then
    CXXLIB="$(${CXX:-${CC:-g++}} -print-file-name=libstdc++.so.6)"
    echo "runtime libstdc++ of _C: $(ldd "$($PY -c 'import deep_gemm._C as c; print(c.__file__)' \
      2>/dev/null)" 2>/dev/null | grep stdc++); compiler's: $CXXLIB" >>"$LOG"
    SYSTEM_CXX=/usr/bin/g++
    if [ -f "$CXXLIB" ] && probe "preloaded $CXXLIB" "$CXXLIB"; then
      export LD_PRELOAD="$CXXLIB"
      echo "LD_PRELOAD=$CXXLIB for the steps below" | tee -a "$LOG"
    elif [ -x "$SYSTEM_CXX" ] && [ "$(realpath "$SYSTEM_CXX")" != "$(realpath "$(command -v \
         "${CXX:-${CC:-g++}}")")" ] && { "$SYSTEM_CXX" --version | head -1 >>"$LOG"
         build_and_install system_cxx CC="$SYSTEM_CXX" CXX="$SYSTEM_CXX" \
           LDSHARED="$SYSTEM_CXX -shared"; probe system_cxx; }; then
      echo "built with $SYSTEM_CXX" | tee -a "$LOG"
    else
      build_and_install static_libstdcxx LDFLAGS="-static-libstdc++ -static-libgcc"
      probe static_libstdcxx
    fi
  fi
  cp "$BUILD"/wheel/*.whl "$OUT/" 2>>"$LOG"
fi
if [ "$CHECK" = --check ] && [ "${STATUS[deepgemm_first_call]}" = 0 ]; then
  step check deepgemm_check.log timeout 150 $PY "$REPO/tools/deepgemm_check.py" \
    --commit-file "$SRC/DEEPGEMM_COMMIT" --json "$OUT/deepgemm_check.json"
  step example decode_step.log timeout 90 $PY "$REPO/examples/decode_step.py"
  step example_dcp2 decode_step.log timeout 90 $PY "$REPO/examples/decode_step.py" --dcp 2
fi
# DeepGEMM's own test of the paged MQA logits (its test file, its tolerances).
cd "$BUILD/deepgemm/tests"
step deepgemm_test deepgemm_test.log env DG_MQA_NUM_CASES="${DG_MQA_NUM_CASES:-1}" \
  timeout 150 $PY -c 'import random, torch, test_attention as t
torch.manual_seed(0); random.seed(0); t.test_paged_mqa_logits()'
cd /tmp
if [ "$CHECK" = --check ] && [ "${STATUS[deepgemm_first_call]}" = 0 ]; then
  step pytest pytest.log timeout 150 $PY -m pytest -q -ra -p no:cacheprovider \
    --rootdir "$REPO" -c "$REPO/pyproject.toml" \
    "$REPO/tests/test_mqa_logits.py" "$REPO/tests/test_decode_step_example.py"
  tar -C "$DG_JIT_CACHE_DIR" -czf "$OUT/deepgemm_jit.tar.gz" . 2>>"$LOG"
fi

{
  echo "== steps"
  for name in "${!STATUS[@]}"; do echo "$name ${STATUS[$name]}"; done | sort
} | tee -a "$LOG"
steps_passed || exit 1
