#!/usr/bin/env bash
# Everything a GPU machine should check, in one run:
#   build (no network) -> self-check -> full test suite (GPU tests included) ->
#   compute-sanitizer memcheck over the GPU tests -> benchmark.
# Usage: tools/gpu_check.sh OUT_DIR      (DSA_EXT_SKIP_BENCH=1: everything but the benches;
#   DSA_EXT_ARCHS=90a-real: build for that arch list only; DSA_EXT_PREBUILT=PKG.tar.xz:
#   install what tools/pack_prebuilt.sh packed on another machine instead of building)
#   OUT_DIR receives build.log, selfcheck.log, pytest.log, sanitizer.log (memcheck,
#   racecheck and initcheck), bench.txt, side_by_side.txt / .json (vLLM's kernels beside
#   dsa_ext's on the same inputs, with the launch floor: tools/side_by_side_floor.py; when
#   .peers/ holds the harness of ../shared/peers),
#   topk_side_by_side.txt / .json (vLLM's per-row top-K beside dsa_ext's, when VLLM_SO
#   names its unpacked library), deepgemm/ (DeepGEMM built from source and checked against
#   dsa_ext's decode path, when DSA_EXT_DEEPGEMM_SRC names what tools/deepgemm_fetch.sh
#   prepared) and results.json (environment, step exit codes, bench numbers).
# Needs: python3 with torch (CUDA), pybind11, scikit-build-core, cmake, ninja, nvcc,
# compute-sanitizer. CuTeDSL cubins are exported on a build machine (the GPU machine has
# no nvidia-cutlass-dsl): if cute_dsl_aot/out/ exists it is used via DSA_EXT_CUBIN_DIR.
set -uo pipefail
OUT="${1:?usage: tools/gpu_check.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
REPO="$(pwd)"

export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
if [ -d "$REPO/cute_dsl_aot/out" ] && [ -z "${DSA_EXT_CUBIN_DIR:-}" ]; then
  export DSA_EXT_CUBIN_DIR="$REPO/cute_dsl_aot/out"
fi
PY=python3
. "$REPO/tools/steps.sh"
XDIST="$(xdist_args $PY)"  # the test suite spread over workers when pytest-xdist is there

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  # The device copy of the tree may carry no usable git metadata: let the caller say.
  echo "commit ${DSA_EXT_COMMIT:-$(git -C "$REPO" rev-parse --verify -q HEAD || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  nvcc --version | tail -2
} >"$OUT/build.log" 2>&1

if [ -n "${DSA_EXT_PREBUILT:-}" ]; then  # packed elsewhere (tools/pack_prebuilt.sh): no build
  SITE="$($PY -c 'import site; print(site.getsitepackages()[0])')"
  step build build.log install_packed "$SITE" "$DSA_EXT_PREBUILT"
else
  step build build.log $PY -m pip install --no-build-isolation --no-deps -v \
    ${DSA_EXT_ARCHS:+-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=$DSA_EXT_ARCHS} "$REPO"
fi
# Run from outside the source tree so the installed wheel is what gets imported.
cd /tmp
step selfcheck selfcheck.log $PY -m dsa_ext
PYTEST=($PY -m pytest -q -ra -p no:cacheprovider --rootdir "$REPO" -c "$REPO/pyproject.toml")
# --durations: on the H200 the suite has outrun 230 s at -n 12 (RESULTS.md); the slowest
# tests are listed at the end of pytest.log (SIGINT at the limit: pytest still reports).
step pytest pytest.log timeout -s INT 300 "${PYTEST[@]}" $XDIST --durations=30 "$REPO/tests"
step sanitizer sanitizer.log env DSA_EXT_HYPOTHESIS_PROFILE=sanitizer timeout 240 \
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 --target-processes all \
  "${PYTEST[@]}" -m cuda "$REPO/tests"
# CUDA API errors are left to the ops' own checks: NCCL probes kernels of other archs.
# Shared-memory races: the top-K sort orders some stages with warp barriers only, and
# the index conversion scans its run counts in shared memory.
step racecheck sanitizer.log env DSA_EXT_HYPOTHESIS_PROFILE=sanitizer timeout 150 \
  compute-sanitizer --tool racecheck --error-exitcode 99 \
  "${PYTEST[@]}" -m cuda -k "(matches_reference and random) or random_cases_cuda or spec_vector" \
  "$REPO/tests/test_stable_topk.py" "$REPO/tests/test_kv_index.py"
# The per-row top-K's candidate list, bitmaps and staged ids, every plan kind.
step racecheck_topk sanitizer.log timeout 150 compute-sanitizer --tool racecheck \
  --error-exitcode 99 $PY "$REPO/tools/topk_sanitize_cases.py"
# The sort skips slots past the gathered count: no read of shared memory nobody wrote.
step initcheck sanitizer.log env DSA_EXT_HYPOTHESIS_PROFILE=sanitizer timeout 120 \
  compute-sanitizer --tool initcheck --report-api-errors no --error-exitcode 99 \
  "${PYTEST[@]}" -m cuda -k "matches_reference or early_stop" "$REPO/tests/test_stable_topk.py"
if [ "${DSA_EXT_SKIP_BENCH:-0}" = 1 ]; then  # checks only, e.g. when device time is short
  STATUS[bench]=0
else
  step bench bench.txt timeout 180 $PY -m dsa_ext.bench --json "$OUT/bench.json"
fi
# The peer, same inputs, same run: ../shared/peers/README.md says how .peers/ is filled.
STATUS[side_by_side]=0
if [ "${DSA_EXT_SKIP_BENCH:-0}" != 1 ] && [ -f "$REPO/.peers/side_by_side.py" ]; then
  cd "$REPO/.peers"
  step side_by_side side_by_side.txt env VLLM_SRC="$REPO/.peers/vllm" \
    timeout 400 $PY "$REPO/tools/side_by_side_floor.py" --json "$OUT/side_by_side.json"
  cd /tmp
fi
# vLLM's compiled per-row top-K beside dsa_ext's (VLLM_SO: its unpacked library, see
# ../shared/peers/README.md); the peer harness is read from .peers/.
STATUS[topk_side_by_side]=0
if [ "${DSA_EXT_SKIP_BENCH:-0}" != 1 ] && [ -n "${VLLM_SO:-}" ] && [ -f "$VLLM_SO" ]; then
  step topk_side_by_side topk_side_by_side.txt timeout 200 $PY \
    "$REPO/tools/topk_per_row_side_by_side.py" --peers "$REPO/.peers" --sweep \
    --json "$OUT/topk_side_by_side.json"
fi

# DeepGEMM (the caller's dependency, JIT and all) built here and run through dsa_ext's
# decode path: tools/deepgemm_on_gpu.sh, its logs in deepgemm/.
STATUS[deepgemm]=0
if [ -n "${DSA_EXT_DEEPGEMM_SRC:-}" ]; then
  step deepgemm deepgemm.log timeout 420 bash "$REPO/tools/deepgemm_on_gpu.sh" \
    "$DSA_EXT_DEEPGEMM_SRC" "$OUT/deepgemm" --check
fi

$PY - "$OUT" <<EOF
import json, os, subprocess, sys
out = sys.argv[1]
status = {"build": ${STATUS[build]}, "selfcheck": ${STATUS[selfcheck]},
          "pytest": ${STATUS[pytest]}, "sanitizer": ${STATUS[sanitizer]},
          "racecheck": ${STATUS[racecheck]}, "racecheck_topk": ${STATUS[racecheck_topk]},
          "initcheck": ${STATUS[initcheck]}, "deepgemm": ${STATUS[deepgemm]},
          "bench": ${STATUS[bench]}, "side_by_side": ${STATUS[side_by_side]},
          "topk_side_by_side": ${STATUS[topk_side_by_side]}}
bench = {}
path = os.path.join(out, "bench.json")
if os.path.exists(path):
    bench = json.load(open(path))
    os.remove(path)
head = open(os.path.join(out, "build.log")).read().splitlines()[:4]
json.dump({"environment": head, "status": status, "bench": bench},
          open(os.path.join(out, "results.json"), "w"), indent=1)
print("summary:", status)
EOF
tail -n 25 "$OUT/bench.txt" 2>/dev/null
steps_passed || exit 1
