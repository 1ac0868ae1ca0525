#!/usr/bin/env bash
# Builds tools/cub_topk_peer.cu against CCCL 3.5.0's headers (PyPI's nvidia-cuda-cccl
# 13.3.5, header only; the CUDA 13.0 toolkit's own CCCL predates DeviceBatchedTopK) into
# OUT_DIR/cub_topk_peer_<N>.so for segment bounds N = 2048, 4096 and 8192 (the bound
# selects CUB's kernel; 8192 is the largest that compiles), for sm_90a. A measurement tool: nothing of it enters dsa_ext.
#   tools/build_cub_peer.sh OUT_DIR [CCCL_WHEEL]
# Without CCCL_WHEEL the wheel is downloaded (pip download), so build where there is a
# network and carry OUT_DIR (about 1 MB) to the GPU machine, e.g. inside .peers/.
set -euo pipefail
out=$(realpath -m "$1")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $# -ge 2 ]; then
  cp "$2" "$work/"
else
  python3 -m pip download -q --no-deps "nvidia-cuda-cccl==13.3.5.0.6" -d "$work"
fi
python3 -m zipfile -e "$work"/nvidia_cuda_cccl-*.whl "$work/cccl"
include=$(dirname "$(find "$work/cccl" -path '*/cub/device/device_batched_topk.cuh')")/../..
pids=()
for n in 2048 4096 8192; do
  PATH=/usr/local/cuda/bin:$PATH nvcc -O3 -std=c++17 -arch=sm_90a -Xcompiler -fPIC -shared \
    -cudart shared --expt-relaxed-constexpr -DPEER_MAX_COLS=$n -I "$include" \
    "$here/cub_topk_peer.cu" -o "$out/cub_topk_peer_$n.so" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # each build's status (set -e)
ls "$out"/cub_topk_peer_*.so
