"""The stable top-K's sorting variants side by side on one GPU: at each shape, the
launcher's choice for ``sorted=True`` and then every exported sorting variant that can run
it (forced through ``_C.set_stable_topk_variant_override``), each checked against the CPU
op; graph-replay us per launch (``dsa_ext.bench.graph_us``). Candidates are packed like
``../shared/peers/side_by_side.py``'s: per rank, 131072 / W columns of randn (or 16
distinct, or bf16-rounded) scores at random column ids.

    python tools/stable_topk_variants.py [--choice-only] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json

import torch

import dsa_ext
from dsa_ext.bench import graph_us

#: (rows, K, W, k, scores)
SHAPES = [(rows, 2048, W, 2048, "randn") for W in (2, 4, 8) for rows in (1, 64, 256, 1024)] + [
    (64, 512, 4, 512, "randn"), (64, 1024, 4, 1024, "randn"), (64, 4096, 4, 8192, "randn"),
    (16, 8192, 4, 16384, "randn"), (64, 2048, 4, 2048, "bf16"), (1024, 2048, 4, 2048, "bf16"),
    (1, 2048, 4, 2048, "ties16"), (64, 2048, 4, 2048, "ties16"), (1024, 2048, 4, 2048, "ties16"),
    (1024, 2048, 2, 2048, "ties16")]
KINDS = ("d8", "d16", "r4", "p4", "p8", "r8", "r16", "g")
SIZES = (512, 1024, 2048, 4096, 8192, 16384)


def candidates(rows: int, K: int, W: int, scores: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    cols = 131072 // W
    packs = []
    for rank in range(W):
        if scores == "ties16":
            logits = torch.randint(0, 16, (rows, cols), device="cuda", generator=g).float()
        else:
            logits = torch.randn((rows, cols), device="cuda", generator=g)
            if scores == "bf16":
                logits = logits.bfloat16().float()
        ids = torch.randint(0, cols, (rows, K), dtype=torch.int32, device="cuda", generator=g)
        packs.append(dsa_ext.pack_dcp_topk_candidates(logits, ids, rank, W))
    return torch.stack(packs)  # [W, rows, K]


def time_forced(fn, out: torch.Tensor, want: torch.Tensor, name: str):
    """(us, equal) with `name` forced, or None where it cannot run the shape."""
    C = dsa_ext._C
    try:
        C.set_stable_topk_variant_override(name)
    except ValueError:
        return None  # not in this build
    try:
        out.fill_(7)
        try:
            fn()
        except (ValueError, RuntimeError):
            return None  # cannot run this shape
        torch.cuda.synchronize()
        return round(graph_us([fn]), 2), bool(torch.equal(out.cpu(), want))
    finally:
        C.set_stable_topk_variant_override("")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--choice-only", action="store_true", help="skip the forced variants")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows_out, failures = [], 0
    for rows, K, W, k, scores in SHAPES:
        cand = candidates(rows, K, W, scores, seed=rows * 7 + W)
        want = dsa_ext.stable_topk_from_candidates(cand.cpu(), k, sorted=True)
        out = torch.empty((rows, k), dtype=torch.int32, device="cuda")
        fn = lambda: dsa_ext.stable_topk_from_candidates(cand, k, out=out, sorted=True)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        row = dict(rows=rows, K=K, W=W, k=k, scores=scores,
                   chosen=dsa_ext._C.stable_topk_variant(W, rows, K, k, True,
                                                         torch.cuda.current_device()),
                   us=round(graph_us([fn]), 2), equal=bool(torch.equal(out.cpu(), want)),
                   forced={})
        failures += not row["equal"]
        if not args.choice_only:
            for kind in KINDS:
                for size in SIZES:
                    for name in (f"{kind}_s{size}", f"{kind}_rank{size}"):
                        got = time_forced(fn, out, want, name)
                        if got is not None:
                            row["forced"][name] = got
                            failures += not got[1]
        best = sorted(row["forced"].items(), key=lambda item: item[1][0])[:4]
        print(f"{rows:5d} x {K} x {W} k={k:5d} {scores:6s} {row['chosen']:12s} "
              f"{row['us']:8.2f} us equal={int(row['equal'])}  fastest: "
              + ", ".join(f"{n} {t:.2f}" for n, (t, _) in best), flush=True)
        rows_out.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows_out, fh, indent=1)
    print(f"# {len(rows_out)} shapes, {failures} outputs unequal to the CPU op")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
