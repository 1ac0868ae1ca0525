"""What `topk_to_slots` costs over the ids alone, per shape, on the GPU.

    python tools/topk_to_slots_over_ids.py --peers .peers [--tag NAME] [--json OUT]

`--peers` is the folder holding ../shared/peers' timing.py (graph replay per launch, the
harness's timer). Per shape (fp32 randn rows, k = 2048, one block-table row per logits row,
64-token blocks): `topk_per_row` alone, `topk_to_slots` plain, `topk_to_slots` compacted
with valid counts, and the index conversion on its own over the same ids (compacted with
counts), each checked first against `topk_per_row` then the conversion. For an A/B of two
builds, run it once per build (PYTHONPATH pointing at each unpacked package), alternated.
Exits 1 if any output differs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import dsa_ext

K = 2048
SHAPES = [(1, 32768), (8, 32768), (4, 65536), (64, 32768), (256, 32768), (1024, 32768),
          (16, 131072), (64, 131072), (256, 131072)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", required=True)
    parser.add_argument("--tag", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.peers))
    from timing import bench_graph  # noqa: E402 - from the ignored folder

    one = torch.zeros(1, device="cuda")
    floor = bench_graph(lambda: one.add_(1.0), iters=20)
    tag = f"[{args.tag}] " if args.tag else ""
    print(f"{tag}{torch.cuda.get_device_name()}, dsa_ext {dsa_ext.__version__} from "
          f"{os.path.dirname(dsa_ext.__file__)}; launch floor {floor:.2f} us; k={K}")
    rows, ok_all = {}, True
    for B, L in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(B + L)
        x = torch.randn((B, L), device="cuda", generator=g)
        table = torch.randint(0, 1 << 20, (B, L // 64), device="cuda", generator=g,
                              dtype=torch.int32)
        req = torch.arange(B, device="cuda", dtype=torch.int32)
        ids = torch.empty((B, K), dtype=torch.int32, device="cuda")
        out = torch.empty_like(ids)
        counts = torch.empty(B, dtype=torch.int32, device="cuda")
        dsa_ext.topk_per_row(x, K, out=ids)
        convert = dsa_ext.convert_req_index_to_global_index
        ok = torch.equal(dsa_ext.topk_to_slots(x, K, req, table, 64),
                         convert(req, table, ids, 64))
        got = dsa_ext.topk_to_slots(x, K, req, table, 64, compact=True,
                                    return_valid_counts=True)
        want = convert(req, table, ids, 64, compact=True, return_valid_counts=True)
        ok = ok and all(torch.equal(a, b) for a, b in zip(got, want))
        ok_all = ok_all and ok
        t = dict(
            ids=bench_graph(lambda: dsa_ext.topk_per_row(x, K, out=ids), iters=20),
            plain=bench_graph(lambda: dsa_ext.topk_to_slots(x, K, req, table, 64, out=out),
                              iters=20),
            compact=bench_graph(lambda: dsa_ext.topk_to_slots(
                x, K, req, table, 64, compact=True, out=out, valid_counts=counts), iters=20),
            conversion=bench_graph(lambda: convert(
                req, table, ids, 64, compact=True, out=out, valid_counts=counts), iters=20))
        shape = f"{B}x{L // 1024}K"
        rows[shape] = dict(t, equal=ok, plan=list(dsa_ext._C.topk_per_row_plan(B, L, 0)))
        print(f"{tag}{shape:9} ids {t['ids']:7.2f}  plain {t['plain']:7.2f}  compacted+counts "
              f"{t['compact']:7.2f}  conversion alone {t['conversion']:6.2f}  equal {int(ok)}",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(floor_us=floor, tag=args.tag, rows=rows), fh, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
