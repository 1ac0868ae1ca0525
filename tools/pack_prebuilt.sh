#!/usr/bin/env bash
# tools/pack_prebuilt.sh SRC OUT.tar.xz [PYTHON]: dsa_ext built from the source tree SRC for
# another machine, packed small, so that machine need not build (a GPU machine whose time
# is counted: tools/gpu_check.sh takes it as DSA_EXT_PREBUILT=OUT.tar.xz and extracts it
# into site-packages; about 1.5 MB for sm_90a, against 3.7 MB for the wheel zip).
#
# PYTHON: an interpreter of the target's Python minor version (the extension's ABI), with
# scikit-build-core and pybind11 (default python3). The module links neither libtorch nor a
# shared CUDA runtime, so the target's torch does not matter; its driver must serve this
# machine's CUDA toolkit. DSA_EXT_ARCHS (default 90a-real) and DSA_EXT_CUBIN_DIR (the
# exported top-K cubins, else nvidia-cutlass-dsl in PYTHON exports them) as for a build.
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: tools/pack_prebuilt.sh SRC OUT.tar.xz [PYTHON]" >&2
  exit 2
fi
SRC="$(cd "$1" && pwd)"
OUT="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
PYTHON="${3:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir="$WORK/build" \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="${DSA_EXT_ARCHS:-90a-real}" -w "$WORK/wheel" "$SRC"
mkdir "$WORK/files"
(cd "$WORK/files" && "$PYTHON" -m zipfile -e "$WORK"/wheel/*.whl . &&
  tar -cf - dsa_ext dsa_ext-*.dist-info) | xz -9e -T2 > "$OUT"
echo "$OUT: $(stat -c %s "$OUT") bytes ($("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])'))"
