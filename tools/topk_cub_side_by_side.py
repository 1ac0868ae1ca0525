"""dsa_ext.topk_per_row beside CUB's DeviceBatchedTopK (CCCL 3.5.0) on short rows, same
inputs, one process.

    python tools/topk_cub_side_by_side.py --lib DIR [--json OUT]

DIR holds tools/build_cub_peer.sh's libraries (cub_topk_peer_<N>.so, N the segment bound
each was built for). That CCCL release keeps a row in one thread block's shared memory
(8192 fp32 columns at most) and implements only an unsorted, non-deterministic result, so
it is a peer for short rows alone (issue 19). Per shape: CUB's time with the tightest
bound that holds the row, dsa_ext's, the ratio (> 1: dsa_ext faster), whether dsa_ext's ids
equal the CPU's (order included) and torch.topk's set, and the launch floor, all from the
same CUDA-graph timer (dsa_ext.bench.graph_us). CUB's set is checked against torch.topk's
apart (`CUB unequal`) and does not make a row unequal: on the H200, 1024 x 4096 with k = 512
(randn, no ties), it returned another set in 9 of 20 runs on the same input.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re

import torch

import dsa_ext
from dsa_ext import _C
from dsa_ext.bench import graph_us, launch_floor_us

# (rows, columns, k): prefill chunks and short contexts.
SHAPES = [(64, 4096, 2048), (64, 8192, 2048), (256, 8192, 2048), (1024, 8192, 2048),
          (1024, 4096, 512), (4096, 2048, 512), (4096, 8192, 1024), (16384, 2048, 256)]


class CubTopk:
    """One library of tools/cub_topk_peer.cu: the k largest of each row, on the current
    stream (so that a CUDA graph captures it), into preallocated buffers."""

    def __init__(self, path: str, rows: int, cols: int, k: int, device):
        self.lib = ctypes.CDLL(path)
        self.lib.cub_topk_rows.restype = ctypes.c_int
        self.lib.cub_topk_rows.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        self.rows, self.cols, self.k = rows, cols, k
        self.vals = torch.empty((rows, k), dtype=torch.float32, device=device)
        self.ids = torch.empty((rows, k), dtype=torch.int32, device=device)
        size = ctypes.c_size_t(0)
        self._call(None, None, size)
        self.temp = torch.empty(max(size.value, 1), dtype=torch.uint8, device=device)
        self.temp_bytes = ctypes.c_size_t(size.value)

    def _call(self, x, temp, size):
        stream = torch.cuda.current_stream().cuda_stream
        err = self.lib.cub_topk_rows(
            x.data_ptr() if x is not None else None, self.cols, self.rows, self.cols, self.k,
            self.vals.data_ptr(), self.ids.data_ptr(),
            temp.data_ptr() if temp is not None else None, ctypes.byref(size), stream)
        if err != 0:
            raise RuntimeError(f"cub::DeviceBatchedTopK failed: cudaError {err}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._call(x, self.temp, self.temp_bytes)
        return self.ids


def libraries(folder: str) -> dict:
    found = {}
    for path in glob.glob(os.path.join(folder, "cub_topk_peer_*.so")):
        found[int(re.search(r"_(\d+)\.so$", path).group(1))] = path
    if not found:
        raise SystemExit(f"no cub_topk_peer_<N>.so in {folder}: run tools/build_cub_peer.sh")
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    libs = libraries(args.lib)
    device = torch.device("cuda")
    floor = launch_floor_us(device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, dsa_ext "
          f"{dsa_ext.__version__}; launch floor (1-element add_) {floor:.2f} us")
    print(f"{'shape':22} {'CUB us':>8} {'bound':>6} {'dsa_ext us':>10} {'ratio':>6} "
          f"{'equal':>6} {'plan':>14}")
    rows = []
    for B, L, k in SHAPES:
        bound = min((n for n in libs if n >= L), default=None)
        if bound is None:
            continue
        g = torch.Generator(device="cuda").manual_seed(B * 31 + L + k)
        x = torch.randn((B, L), device="cuda", generator=g)
        cub = CubTopk(libs[bound], B, L, k, device)
        ours = torch.empty((B, k), dtype=torch.int32, device="cuda")
        dsa_ext.topk_per_row(x, k, out=ours)
        theirs = cub(x)
        torch.cuda.synchronize()
        want = torch.topk(x, k, dim=1).indices.int().sort(dim=1).values
        equal = (torch.equal(ours.sort(dim=1).values, want)
                 and torch.equal(ours.cpu(), dsa_ext.topk_per_row(x.cpu(), k)))
        cub_equal = torch.equal(theirs.sort(dim=1).values, want)
        cub_us = graph_us([lambda: cub(x)])
        ours_us = graph_us([lambda: dsa_ext.topk_per_row(x, k, out=ours)])
        plan = tuple(_C.topk_per_row_plan(B, L, 0))
        shape = f"{B}x{L} k={k}"
        rows.append(dict(shape=shape, cub_us=cub_us, bound=bound, dsa_ext_us=ours_us,
                         ratio=cub_us / ours_us, equal=equal, cub_equal=cub_equal, plan=plan))
        print(f"{shape:22} {cub_us:8.2f} {bound:6d} {ours_us:10.2f} {cub_us / ours_us:6.2f} "
              f"{int(equal):>6} {str(plan):>14}" + ("" if cub_equal else "  CUB unequal"),
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(floor_us=floor, rows=rows), fh, indent=1)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
