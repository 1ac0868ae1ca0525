"""Benchmark stable_topk_from_candidates on a GPU: per-launch time from CUDA-graph replays.

Usage: python cute_dsl_aot/bench_stable_topk.py [--json OUT.json]

For each case: fresh random candidates ([W, rows, K] as all_gather_into_tensor gives),
a graph of 20 launches, the median of 10 replays divided by 20; the baseline is the
reference server's approach (int64 keys + torch.topk + gather), timed the same way.
Also the eager per-call wall time (host overhead included). Checks the result first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import dsa_ext
from dsa_ext import reference

CASES = [  # (rows, W, K, k, kind)
    (64, 4, 2048, 2048, "random"), (1024, 4, 2048, 2048, "random"),
    (64, 8, 2048, 2048, "random"), (1024, 8, 2048, 2048, "random"),
    (64, 4, 2048, 2048, "ties"), (64, 4, 1024, 512, "random"),
    (64, 8, 4096, 2048, "random"), (64, 4, 4096, 8192, "random"),
]


def make(rows, W, K, kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        scores = torch.randint(0, 4, (W, rows, K), generator=g).float()
    else:
        scores = torch.randn(W, rows, K, generator=g)
    gids = torch.randperm(W * K, generator=g)[: W * K].view(W, 1, K).expand(W, rows, K)
    return reference.encode_candidate_keys(scores, gids.to(torch.int32).contiguous())


def graph_time_us(fn, launches=20, replays=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def baseline(cands, k, out):
    """Reference-server style: flip the top bit, torch.topk on int64, decode."""
    rows = cands.shape[1]
    flat = cands.permute(1, 0, 2).reshape(rows, -1) ^ (-(2**63))
    top = torch.topk(flat, min(k, flat.shape[1]), dim=1).values ^ (-(2**63))
    out[:, : top.shape[1]] = (~top).to(torch.int32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, dsa_ext {dsa_ext.__version__}, torch "
          f"{torch.__version__}")
    print(f"{'rows':>6} {'W':>3} {'K':>6} {'k':>6} {'kind':>7} {'dsa_ext us':>11} "
          f"{'torch.topk us':>14} {'speedup':>8} {'eager us':>9}")
    results = []
    for i, (rows, W, K, k, kind) in enumerate(CASES):
        host = make(rows, W, K, kind, seed=i)
        cands = host.cuda()
        out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
        dsa_ext.stable_topk_from_candidates(cands, k, out=out)
        torch.cuda.synchronize()
        ok = torch.equal(out.cpu(), reference.stable_topk_from_candidates(host, k))
        t = graph_time_us(lambda: dsa_ext.stable_topk_from_candidates(cands, k, out=out))
        base_out = torch.empty_like(out)
        tb = graph_time_us(lambda: baseline(cands, k, base_out))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            dsa_ext.stable_topk_from_candidates(cands, k, out=out)
        eager = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"{rows:>6} {W:>3} {K:>6} {k:>6} {kind:>7} {t:>11.1f} {tb:>14.1f} "
              f"{tb / t:>7.2f}x {eager:>9.1f}{'' if ok else '  MISMATCH'}")
        results.append(dict(rows=rows, W=W, K=K, k=k, kind=kind, us=t, torch_topk_us=tb,
                            eager_us=eager, correct=ok))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
