#!/usr/bin/env bash
# Prepares, on a machine with network access, everything tools/deepgemm_on_gpu.sh needs to
# build DeepGEMM from source on a GPU machine that has none: one compressed source tree.
#
# Usage: tools/deepgemm_fetch.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR OUT_DIR
#   DEEPGEMM_GIT_DIR  a git directory of github.com/deepseek-ai/DeepGEMM (bare is fine)
#   FMT_GIT_DIR       a git directory of github.com/fmtlib/fmt
#   OUT_DIR           receives deepgemm-src.tar.xz and DEEPGEMM_COMMIT; keep it out of git
#                     (e.g. /.dg/ in .git/info/exclude) and carry it to the GPU machine
# Env: DEEPGEMM_COMMIT (default 54e22612409371d6364144b69086735beb54e98b, the first with
#   fp8_fp4_paged_mqa_logits and its sm90 kernel split out), CUTLASS_WHEEL (default
#   sgl-deep-gemm==0.2.5: a PyPI wheel whose deep_gemm/include/ holds the CuTe/CUTLASS
#   headers; CUTLASS 4.8.1 there).
#
# DeepGEMM's submodules are not fetched: its fmt submodule commit is read from the tree and
# taken from FMT_GIT_DIR (fmt is header-only there), and the CuTe/CUTLASS headers come from
# the wheel (the only part of CUTLASS DeepGEMM's build and JIT use: include/cute and
# include/cutlass). Nothing of DeepGEMM belongs in this repository.
set -euo pipefail
DG_GIT="${1:?usage: deepgemm_fetch.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR OUT_DIR}"
FMT_GIT="${2:?usage: deepgemm_fetch.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR OUT_DIR}"
OUT="${3:?usage: deepgemm_fetch.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR OUT_DIR}"
COMMIT="${DEEPGEMM_COMMIT:-54e22612409371d6364144b69086735beb54e98b}"
CUTLASS_WHEEL="${CUTLASS_WHEEL:-sgl-deep-gemm==0.2.5}"
PY="${PYTHON:-python3}"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
SRC="$WORK/deepgemm"
mkdir -p "$SRC"

# The API this repository calls must be in the chosen commit.
for name in fp8_fp4_paged_mqa_logits fp8_paged_mqa_logits get_paged_mqa_logits_metadata; do
  git --git-dir="$DG_GIT" show "$COMMIT:deep_gemm/__init__.py" | grep -q "$name" \
    || { echo "DeepGEMM $COMMIT has no $name" >&2; exit 1; }
done
git --git-dir="$DG_GIT" archive "$COMMIT" | tar -x -C "$SRC"

# fmt at the commit DeepGEMM pins (a gitlink in its tree).
FMT_COMMIT="$(git --git-dir="$DG_GIT" ls-tree "$COMMIT" third-party/fmt | awk '{print $3}')"
mkdir -p "$SRC/third-party/fmt"
git --git-dir="$FMT_GIT" archive "$FMT_COMMIT" include | tar -x -C "$SRC/third-party/fmt"

# CuTe / CUTLASS headers from the wheel, where DeepGEMM's setup.py looks for them.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d "$WORK/wheel" "$CUTLASS_WHEEL"
mkdir -p "$SRC/third-party/cutlass/include"
(cd "$WORK/wheel" && "$PY" -m zipfile -e ./*.whl unpacked)
HEADERS="$WORK/wheel/unpacked/deep_gemm/include"
cp -r "$HEADERS/cute" "$HEADERS/cutlass" \
  "$SRC/third-party/cutlass/include/"

{
  echo "deepgemm $COMMIT"
  echo "fmt $FMT_COMMIT"
  echo "cutlass headers $CUTLASS_WHEEL ($(grep -h '#define CUTLASS_\(MAJOR\|MINOR\|PATCH\)' \
    "$SRC/third-party/cutlass/include/cutlass/version.h" | awk '{print $3}' | paste -sd.))"
} | tee "$OUT/DEEPGEMM_COMMIT"
cp "$OUT/DEEPGEMM_COMMIT" "$SRC/DEEPGEMM_COMMIT"
tar -C "$WORK" -cJf "$OUT/deepgemm-src.tar.xz" deepgemm
ls -la "$OUT"
