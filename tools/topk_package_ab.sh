#!/usr/bin/env bash
# tools/topk_package_ab.sh OUT_DIR PKG_A PKG_B [TESTS_B]: the stable top-K A/B of two
# builds that tools/pack_prebuilt.sh packed (say main and a branch), on one GPU machine, in
# one call. A goes into site-packages (what a plain `import dsa_ext` gets), B into
# ~/.dsa_ext_ab/b (PYTHONPATH), where both stay for later calls while the machine is warm.
#   1. python -m dsa_ext with each;
#   2. tools/topk_lab.py --quick --score-kinds with A, then B; --quick with B, then A (the
#      alternation puts each package first once: times drift between runs);
#   3. with TESTS_B (B's tests/ folder, carried): B's CUDA tests of the stable top-K, then
#      racecheck and memcheck of its rank sort (-k rank_sort, the sanitizer profile).
# OUT_DIR gets the logs (each step with its exit code and seconds; the installs and the
# self-checks in steps.log) and lab_*.json. Exit code 1 if any step failed.
# Afterwards, the merge beside vLLM's CuTeDSL kernel takes B the same way:
#   PYTHONPATH=~/.dsa_ext_ab/b:<CuTeDSL> python3 side_by_side.py --only merge
# (../shared/peers/README.md: CuTeDSL goes over in two calls).
set -uo pipefail
if [[ $# -lt 3 || $# -gt 4 ]]; then
  echo "usage: tools/topk_package_ab.sh OUT_DIR PKG_A PKG_B [TESTS_B]" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
PKG_A="$(realpath "$2")"
PKG_B="$(realpath "$3")"
TESTS_B="${4:+$(realpath "$4")}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONUNBUFFERED=1
. "$REPO/tools/steps.sh"

SITE="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
B_DIR="$HOME/.dsa_ext_ab/b"
step install_a steps.log install_packed "$SITE" "$PKG_A"
step install_b steps.log install_packed "$B_DIR" "$PKG_B"
steps_passed || exit 1

cd /tmp  # the installed packages, not the source tree, are imported
LAB=(python3 "$REPO/tools/topk_lab.py")
step selfcheck_a steps.log python3 -m dsa_ext
step selfcheck_b steps.log env PYTHONPATH="$B_DIR" python3 -m dsa_ext
step lab_a_kinds lab_a_kinds.log "${LAB[@]}" --quick --score-kinds --json "$OUT/lab_a_kinds.json"
step lab_b_kinds lab_b_kinds.log env PYTHONPATH="$B_DIR" "${LAB[@]}" --quick --score-kinds \
  --json "$OUT/lab_b_kinds.json"
step lab_b lab_b.log env PYTHONPATH="$B_DIR" "${LAB[@]}" --quick --json "$OUT/lab_b.json"
step lab_a lab_a.log "${LAB[@]}" --quick --json "$OUT/lab_a.json"
if [ -n "$TESTS_B" ]; then
  PYTEST=(python3 -m pytest -q -ra -p no:cacheprovider --rootdir "$REPO" -c "$REPO/pyproject.toml")
  step tests_b tests_b.log env PYTHONPATH="$B_DIR" timeout -s INT 240 "${PYTEST[@]}" $(xdist_args) \
    -m cuda "$TESTS_B/test_stable_topk.py"
  for tool in racecheck memcheck; do
    step "${tool}_b" "${tool}_b.log" env PYTHONPATH="$B_DIR" DSA_EXT_HYPOTHESIS_PROFILE=sanitizer \
      timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 99 "${PYTEST[@]}" -m cuda \
      -k rank_sort "$TESTS_B/test_stable_topk.py"
  done
fi
steps_passed || exit 1
