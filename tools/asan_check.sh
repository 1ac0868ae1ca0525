#!/usr/bin/env bash
# tools/asan_check.sh: the CPU implementations under AddressSanitizer and UBSan, no GPU.
#
# Builds the extension with -fsanitize=address,undefined on its C++ sources (the CPU
# loops with the shared __host__ __device__ index math, the entry points; the .cu files,
# kernels and their launchers, are not instrumented and the CPU tests do not reach them)
# into a scratch folder, then runs the test suite's CPU cases against that build with the
# sanitizer runtimes preloaded. torch's CPU tensors come from malloc, so every read or
# write past a tensor that a CPU loop makes, and every undefined operation (overflow of a
# signed index, a shift too far), stops the run with a report. compute-sanitizer covers the
# kernels the same way on a GPU (tools/gpu_check.sh).
#
# Not run: tests/test_packaging.py and tests/test_wheel.py (they check the release build's
# linkage, which the sanitizer runtime changes). Uses the Python it runs under (pip,
# pytest, hypothesis and torch installed); the build requirements come through pip's
# build isolation. Exits non-zero on any failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PATH="/usr/local/cuda/bin:$PATH"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

LIBASAN="$(gcc -print-file-name=libasan.so)"
LIBUBSAN="$(gcc -print-file-name=libubsan.so)"
for lib in "$LIBASAN" "$LIBUBSAN"; do
  if [[ ! -f "$lib" ]]; then
    echo "asan_check.sh: gcc has no $(basename "$lib") (install its sanitizer runtime)" >&2
    exit 1
  fi
done

echo "== building with -fsanitize=address,undefined"
SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# One arch keeps the build short: the device code is the same for any arch list.
"$PYTHON" -m pip install -q --no-deps --target "$WORK/pkg" -Cbuild-dir="$WORK/build" \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  "-Ccmake.define.CMAKE_CXX_FLAGS=$SANITIZE" \
  "-Ccmake.define.CMAKE_MODULE_LINKER_FLAGS=-fsanitize=address,undefined" "$ROOT"

echo "== the CPU tests against the sanitized build"
export LD_PRELOAD="$LIBASAN $LIBUBSAN"
export ASAN_OPTIONS=detect_leaks=0  # CPython and torch keep their allocations at exit
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH="$WORK/pkg"
cd "$WORK"
"$PYTHON" -c "import dsa_ext; assert dsa_ext.__file__.startswith('$WORK/pkg'), dsa_ext.__file__"
"$PYTHON" -m dsa_ext
cd "$ROOT"
"$PYTHON" -m pytest -q -p no:cacheprovider --ignore=tests/test_packaging.py \
  --ignore=tests/test_wheel.py tests
