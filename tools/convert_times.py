"""The index conversion's graph time per case, for an A/B of two builds on the GPU.

    PYTHONPATH=UNPACKED_BUILD python tools/convert_times.py --peers .peers --tag NAME

`--peers` is the folder holding ../shared/peers' timing.py (graph replay per launch, the
harness's timer) and side_by_side.py, whose make_remap_inputs makes the inputs. The cases
are side_by_side.py's conversion rows (fill 0.9, 2048-column block table, 64-token blocks,
the same seeds), dsa_ext alone: run it once per build (PYTHONPATH pointing at each unpacked
package), alternated, and compare the lines of one case. Each line ends with a checksum of
the case's outputs (slots weighted by column, plus the valid counts): equal checksums
between builds mean equal outputs.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import dsa_ext

BLOCK_SIZE = 64
TABLE_BLOCKS = 2048
CASES = [(T, 2048, W, compact) for T in (16, 64, 256, 1024, 4096, 16384)
         for W, compact in ((1, False), (1, True), (4, True))] + [(64, 512, 4, True),
                                                                 (1024, 512, 4, True)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", required=True)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.peers))
    from side_by_side import make_remap_inputs  # noqa: E402 - from the ignored folder
    from side_by_side_floor import launch_floor  # noqa: E402 - beside this file
    from timing import bench_graph  # noqa: E402

    tag = f"[{args.tag}] " if args.tag else ""
    print(f"{tag}{torch.cuda.get_device_name()}, dsa_ext from "
          f"{os.path.dirname(dsa_ext.__file__)}; launch floor {launch_floor():.2f} us",
          flush=True)
    for T, K, W, compact in CASES:
        req_id, table, idx = make_remap_inputs(T, K, BLOCK_SIZE, TABLE_BLOCKS, W, fill=0.9,
                                               seed=T + K + W)
        out = torch.empty_like(idx)
        counts = torch.zeros(T, dtype=torch.int32, device="cuda")

        def convert():
            dsa_ext.convert_req_index_to_global_index(
                req_id, table, idx, BLOCK_SIZE, dcp_world_size=W, dcp_rank=min(1, W - 1),
                interleave=1, compact=compact, return_valid_counts=compact, out=out,
                valid_counts=counts if compact else None)

        convert()
        weights = torch.arange(1, K + 1, device="cuda", dtype=torch.int64)
        checksum = int((out.to(torch.int64) * weights).sum()) + int(counts.sum())
        us = bench_graph(convert, iters=20, reps=7)
        print(f"{tag}T={T:5d} K={K} W={W} compact={int(compact)} {us:8.2f} us  "
              f"checksum {checksum}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
