"""dsa_ext.topk_per_row beside vLLM's compiled per-row top-K kernels, same inputs, one run.

    VLLM_SO=/root/peer/C_stable.so python tools/topk_per_row_side_by_side.py \
        --peers .peers [--sweep] [--json OUT]

`--peers` is a folder holding ../shared/peers' rowwise_topk_peer.py and timing.py (an
ignored folder: nothing of vLLM enters the project). Per shape: the fastest vLLM kernel
(persistent, cooperative, per_row), dsa_ext's time, the ratio (> 1: dsa_ext faster),
whether dsa_ext's ids equal the CPU's (order included) and torch.topk's set (rows without
ties), and the launch floor of a do-nothing kernel. A vLLM kernel whose set differs from
torch.topk's on a row without ties is named in a note (`vLLM unequal`) and does not make
the row unequal: on the H200, 64 x 128K randn, run 20 times on the same input, the
persistent kernel gave a set other than torch.topk's in 0-3 runs and the cooperative one
in 6-10, whatever ran before. `--sweep` also times every forced cluster size of dsa_ext.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import dsa_ext
from dsa_ext import _C

K = 2048
SHAPES = [(1, 32768), (64, 32768), (256, 32768), (1, 131072), (64, 131072), (256, 131072),
          (16, 131072)]  # the six of issue 19, then 16 rows (a 1024-thread cluster each)
SWEEP = [1, 2, 3, 4, 6, 8, 12, 16]


def logits_for(B: int, L: int, seed: int, distinct: int = 0) -> torch.Tensor:
    """randn scores (distinct 0), `distinct` integers, or uniform in [0, 1) (distinct -1)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if distinct < 0:
        return torch.rand((B, L), device="cuda", generator=g)
    if distinct:
        return torch.randint(0, distinct, (B, L), generator=g, device="cuda").float()
    return torch.randn((B, L), device="cuda", generator=g)


def same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.sort(dim=1).values, b.sort(dim=1).values)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", required=True)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.peers))
    from rowwise_topk_peer import peer_ops  # noqa: E402 - from the ignored folder
    from timing import bench_graph  # noqa: E402

    peers = peer_ops()
    one = torch.zeros(1, device="cuda")
    floor = bench_graph(lambda: one.add_(1.0), iters=20)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, dsa_ext "
          f"{dsa_ext.__version__}; launch floor (1-element add_) {floor:.2f} us; k={K}")
    cases = [(B, L, 0, torch.float32) for B, L in SHAPES]
    # 3 distinct scores: a threshold bin past the candidate list (the passes walk the slice).
    # Uniform [0, 1) (on a 2^-24 grid: ties possible): a quarter of the keys share the
    # first digit's top bin.
    cases += [(64, 32768, 16, torch.float32), (64, 131072, 16, torch.float32),
              (64, 131072, 3, torch.float32), (256, 131072, 16, torch.float32),
              (256, 131072, -1, torch.float32),
              (64, 32768, 0, torch.bfloat16), (64, 131072, 0, torch.bfloat16)]
    rows = []
    print(f"{'shape':22} {'vLLM best':>16} {'dsa_ext us':>10} {'ratio':>6} {'equal':>6} "
          f"{'plan':>12}")
    for B, L, distinct, dtype in cases:
        x = logits_for(B, L, B * 7 + L, distinct)
        n = torch.full((B,), L, dtype=torch.int32, device="cuda")
        ours_in = x.to(dtype)
        ours = torch.empty((B, K), dtype=torch.int32, device="cuda")
        dsa_ext.topk_per_row(ours_in, K, out=ours)
        torch.cuda.synchronize()
        want = torch.topk(ours_in.float(), K, dim=1).indices.int()
        ref = dsa_ext.topk_per_row(ours_in.cpu(), K)  # CPU: bit-identical, order included
        # Which comparisons failed, if any: ours against torch.topk's set (no ties) and
        # against the CPU; each peer's set against torch.topk's (no ties), noted apart.
        unequal = [] if distinct or same_sets(ours, want) else ["torch.topk"]
        unequal += [] if torch.equal(ours.cpu(), ref) else ["cpu"]
        peer_unequal = []
        best, best_name = float("inf"), "-"
        if dtype is torch.float32:
            for name, fn in peers.items():
                if name == "cooperative" and B > 64:
                    continue
                theirs = torch.empty((B, K), dtype=torch.int32, device="cuda")
                fn(x, n, theirs, K)
                torch.cuda.synchronize()
                if not distinct and not same_sets(theirs, want):  # ties: sets may differ
                    peer_unequal.append(name)
                t = bench_graph(lambda: fn(x, n, theirs, K), iters=20)
                if t < best:
                    best, best_name = t, name
        us = bench_graph(lambda: dsa_ext.topk_per_row(ours_in, K, out=ours), iters=20)
        plan = tuple(_C.topk_per_row_plan(B, L, 0))
        tag = ((f" ties{distinct}" if distinct > 0 else " uniform" if distinct else "") +
               (" bf16" if dtype is torch.bfloat16 else ""))
        shape = f"{B}x{L // 1024}K{tag}"
        equal = not unequal
        row = dict(shape=shape, vllm_us=best, vllm_kernel=best_name, dsa_ext_us=us,
                   ratio=best / us, equal=equal, unequal=unequal, vllm_unequal=peer_unequal,
                   plan=plan)
        if args.sweep:
            row["sweep"] = {}
            for code in SWEEP:
                _C.set_topk_plan_override(code)
                try:
                    dsa_ext.topk_per_row(ours_in, K, out=ours)
                    torch.cuda.synchronize()
                    ok = torch.equal(ours.cpu(), ref)
                    row["sweep"][code] = (round(bench_graph(
                        lambda: dsa_ext.topk_per_row(ours_in, K, out=ours), iters=20), 2), ok)
                except RuntimeError as err:
                    row["sweep"][code] = str(err)[:80]
                finally:
                    _C.set_topk_plan_override(-1)
        rows.append(row)
        peer_text = f"{best:6.2f} {best_name:>9}" if best < float("inf") else f"{'-':>16}"
        print(f"{shape:22} {peer_text} {us:10.2f} {best / us:6.2f} {int(equal):>6} "
              f"{str(plan):>12}" + (f"  differs from {unequal}" if unequal else "")
              + (f"  vLLM unequal {peer_unequal}" if peer_unequal else "")
              + (f"  sweep {row['sweep']}" if args.sweep else ""),
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(floor_us=floor, rows=rows), fh, indent=1)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
