"""GPU lab of the stable top-K: both orders against the reference on many shapes, then
graph-replay timings of the default order and of sorted=True per variant.

    python tools/topk_lab.py [--json OUT.json] [--quick] [--variants] [--harness-rows]
                             [--score-kinds]

1. Correctness: random, tied, shortfall and threshold-copy rows over W in {1, 2, 4, 8,
   16}, K from 1 to 40000, k from 1 past N, rows that pick every variant (CTA pairs, one
   CTA, two CTAs per SM, streamed), strided 3-D views; the CUDA output must equal
   ``dsa_ext.reference`` (computed on the GPU with torch) bit for bit, in both orders.
2. Timing (CUDA-graph replay, per launch, the pattern of ``dsa_ext.bench``; several input
   copies so that replays do not run from a warm L2): the peer's shapes, k = K = 2048 for
   W in {2, 4, 8} and rows in {1, 64, 256, 1024}, and k = K in {512, 1024} at W = 4, 64
   rows, and each side of the launcher's variant boundaries (pairs / one CTA / two CTAs
   per SM) at W = 4; each row gives the variant run and both orders' times. With
   ``--variants``, also every exported sorting variant that can run the row (bitonic
   ``*_s{S}`` and rank ``*_rank{S}``), forced, its time and whether its ids equal the
   launcher's choice's.
3. With ``--harness-rows``: the side-by-side harness's k = 512 rows (64 rows, W = 4,
   K = 512; each rank's local top-K is random ids, which repeat) from four seeds, the same
   with unique ids, and unique ids with the k-th key copied into the (k+1)-th place of one
   row / of every row, in both orders, each checked against the reference. Before the
   small-bin resolve the default order took 4.5-5.4 us on the seeds and 6.3 us with every
   row copied (H200, RESULTS.md, twenty-fourth session).
4. With ``--score-kinds``: both orders' times on rows whose scores are not randn, where a
   sort's bins may crowd (k = K = 2048; W = 2 at 64, 256 and 1024 rows, W = 4 at 1024
   rows): one sign (``|x| + 0.1``), one outlier of 1000 a row, Cauchy, ``exp(4x)`` of
   either sign, and the side-by-side harness's rows, each checked against the reference.
   On main the W = 2 1024-row outlier and Cauchy rows took 93 us sorted against 62 on
   randn (H100, RESULTS.md, fifty-second session).
Exit code 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

import dsa_ext
from dsa_ext import reference
from dsa_ext.bench import graph_us

SIGN = torch.iinfo(torch.int64).min


def make_rows(kind: str, W: int, rows: int, K: int, k: int, g: torch.Generator) -> torch.Tensor:
    """[W, rows, K] int64 keys of one kind, built on the CPU."""
    n = W * K
    gids = torch.randperm(4 * n, generator=g)[:n].to(torch.int32).repeat(rows, 1)
    gids = gids + torch.arange(rows, dtype=torch.int32)[:, None] * 3
    if kind == "ties":
        scores = torch.randint(0, 3, (rows, n), generator=g).float()
    else:
        scores = torch.randn(rows, n, generator=g)
    if kind == "one_sign":
        scores = scores.abs() + 0.1
    elif kind == "outlier":
        scores[:, 0] = 1000.0
    elif kind == "cauchy":
        scores = torch.tan(torch.pi * (torch.rand(rows, n, generator=g) - 0.5))
    elif kind == "exp4":  # either sign, over many binades
        scores = torch.exp(4 * scores) * torch.randn(rows, n, generator=g).sign()
    if kind == "shortfall":
        gids[torch.rand(rows, n, generator=g) < 0.8] = -1
    keys = reference.encode_candidate_keys(scores, gids)
    if kind == "copies":  # the k-th key repeated at scattered positions
        for r in range(rows):
            order = torch.sort(keys[r] ^ SIGN, descending=True).indices
            at = torch.randperm(n, generator=g)[:max(2, n // 4)]
            keys[r, at] = int(keys[r, order[min(n - 1, max(0, k - 1 - len(at) // 2))]])
    return keys.view(rows, W, K).transpose(0, 1).contiguous()


def correctness(quick: bool) -> list:
    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator().manual_seed(1)
    shapes = [(W, K) for W in (1, 2, 4, 8, 16) for K in (1, 37, 512, 1000, 2048, 3000, 6000)]
    shapes += [(1, 16384), (1, 20000), (1, 40000), (2, 9000)]
    rows_choices = (1, 5, sms // 2, sms, sms + 1, 300)
    failures, checked = [], 0
    for W, K in shapes:
        n = W * K
        ks = sorted({1, max(1, K // 2), K, min(n, 2048), n, n + 7, 20000})
        for k in ks:
            for rows in (rows_choices[::2] if quick else rows_choices):
                if rows * n > 2_000_000:
                    continue
                kind = ("random", "ties", "shortfall", "copies")[checked % 4]
                host = make_rows(kind, W, rows, K, k, g)
                cands = host.cuda()
                view = cands
                if checked % 5 == 4:  # a strided view: every other row of a bigger buffer
                    big = torch.zeros(W, 2 * rows, K, dtype=torch.int64, device="cuda")
                    big[:, ::2] = cands
                    view = big[:, ::2]
                for order in (False, True):
                    if order and min(k, n) > dsa_ext.topk.CUDA_MAX_SORTED:
                        continue
                    variant = dsa_ext._C.stable_topk_variant(W, rows, K, k, order, dev)
                    got = dsa_ext.stable_topk_from_candidates(view, k, sorted=order)
                    want = reference.stable_topk_from_candidates(view, k, sorted=order)
                    checked += 1
                    if not torch.equal(got, want):
                        bad = (got != want).nonzero()[0].tolist()
                        failures.append(dict(W=W, K=K, k=k, rows=rows, kind=kind, sorted=order,
                                             variant=variant, first_mismatch=bad))
                        print("MISMATCH", failures[-1], flush=True)
    torch.cuda.synchronize()
    print(f"correctness: {checked} checks, {len(failures)} mismatches", flush=True)
    return failures


SORT_KINDS = ("d8", "d16", "r4", "p4", "p8", "r8", "r16", "g")
SORT_SIZES = (512, 1024, 2048, 4096, 8192, 16384)


def forced_sorting_times(calls: list, outs: list) -> dict:
    """{variant: (us, ids equal to the launcher's choice's)} for every exported sorting
    variant that can run the shape of `calls` (forced, sorted=True)."""
    want = outs[0].clone()
    times = {}
    for name in (f"{kind}_{tag}{size}" for kind in SORT_KINDS for size in SORT_SIZES
                 for tag in ("s", "rank")):
        try:
            dsa_ext._C.set_stable_topk_variant_override(name)
        except ValueError:  # not exported
            continue
        try:
            outs[0].fill_(7)
            calls[0]()
            torch.cuda.synchronize()
        except (ValueError, RuntimeError):  # cannot run this shape
            continue
        else:
            times[name] = (round(graph_us(calls), 2), bool(torch.equal(outs[0], want)))
        finally:
            dsa_ext._C.set_stable_topk_variant_override("")
    return times


def l2_copies(W: int, rows: int, K: int) -> int:
    """Input copies for a graph of replays whose inputs together outgrow the L2."""
    return max(2, min(8, (64 << 20) // (W * rows * K * 8)))


def timing(variants: bool) -> list:
    dev = torch.cuda.current_device()
    g = torch.Generator().manual_seed(2)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cases = [(W, rows, 2048, 2048) for W in (2, 4, 8) for rows in (1, 64, 256, 1024)]
    cases += [(4, 64, 512, 512), (4, 64, 1024, 1024)]
    # Each side of the launcher's variant boundaries (W = 4): the last rows on CTA pairs
    # and the first on one CTA, the last on one CTA and the first on 2 CTAs per SM.
    cases += [(4, rows, 2048, 2048) for rows in (sms // 2, sms // 2 + 1, sms, sms + 1)]
    results = []
    for W, rows, K, k in cases:
        inputs = [make_rows("random", W, rows, K, k, g).cuda()
                  for _ in range(l2_copies(W, rows, K))]
        outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in inputs]
        row = dict(W=W, rows=rows, K=K, k=k)
        for order in (False, True):
            name = "sorted" if order else "default"
            row[f"{name}_variant"] = dsa_ext._C.stable_topk_variant(W, rows, K, k, order, dev)
            calls = [lambda c=c, o=o, s=order: dsa_ext.stable_topk_from_candidates(
                c, k, out=o, sorted=s) for c, o in zip(inputs, outs)]
            row[f"{name}_us"] = round(graph_us(calls), 2)
            if order and variants:
                row["sorted_forced"] = forced_sorting_times(calls, outs)
        row["sorted_over_default"] = round(row["sorted_us"] / row["default_us"], 2)
        row["default_ns_per_row"] = round(1000 * row["default_us"] / rows, 1)
        print(row, flush=True)
        results.append(row)
    return results


def harness_rows(g: torch.Generator, unique: bool, rows: int = 64, K: int = 512,
                 W: int = 4) -> torch.Tensor:
    """[rows, W * K] candidates built as ../shared/peers' side_by_side.py builds its merge
    rows (each rank's logits, then its local top-K ids, from `g`), packed by dsa_ext on
    g's device. tools/stk_select_passes.py builds its rows here too."""
    device = g.device
    ncols = 131072 // W
    packs = []
    for rank in range(W):
        logits = torch.randn((rows, ncols), device=device, generator=g)
        if unique:
            ids = torch.stack([torch.randperm(ncols, device=device, generator=g)[:K]
                               for _ in range(rows)]).to(torch.int32)
        else:
            ids = torch.randint(0, ncols, (rows, K), dtype=torch.int32, device=device,
                                generator=g)
        packs.append(dsa_ext.pack_dcp_topk_candidates(logits, ids, rank, W))
    return torch.cat(packs, dim=1).contiguous()


def copy_kth(cands: torch.Tensor, k: int, rows) -> torch.Tensor:
    """cands with the k-th largest key of each of `rows` also written over the (k+1)-th."""
    cands = cands.clone()
    order = torch.argsort(cands ^ SIGN, dim=1, descending=True, stable=True)
    for r in rows:
        cands[r, order[r, k]] = cands[r, order[r, k - 1]]
    return cands


def checked_times(inputs: list, k: int, row: dict, failures: list) -> None:
    """Both orders over `inputs` (one call each, graph-replayed): their times into `row`,
    and `row` into `failures` (printed) for each order whose output of inputs[0] differs
    from the reference's."""
    case = dict(row)
    for order in (False, True):
        outs = [torch.empty(c.shape[-2], k, dtype=torch.int32, device="cuda") for c in inputs]
        calls = [lambda c=c, o=o, s=order: dsa_ext.stable_topk_from_candidates(
            c, k, out=o, sorted=s) for c, o in zip(inputs, outs)]
        calls[0]()
        want = reference.stable_topk_from_candidates(inputs[0], k, sorted=order)
        if not torch.equal(outs[0], want):
            failures.append(dict(case, sorted=order))
            print("MISMATCH", failures[-1], flush=True)
        row["sorted_us" if order else "default_us"] = round(graph_us(calls), 2)


def harness_rows_timing() -> tuple:
    """(rows of results, mismatches) of section 3 of the module docstring."""
    k = 512
    def generator(seed: int) -> torch.Generator:
        return torch.Generator(device="cuda").manual_seed(seed)

    unique = harness_rows(generator(77), True)
    cases = [(f"harness seed {s}", harness_rows(generator(1000 + s), False)) for s in range(4)]
    cases += [("unique ids", unique), ("unique ids, one row copied", copy_kth(unique, k, [5])),
              ("unique ids, every row copied", copy_kth(unique, k, range(unique.shape[0])))]
    results, failures = [], []
    for name, cands in cases:
        row = dict(rows=name)
        checked_times([cands], k, row, failures)
        print(row, flush=True)
        results.append(row)
    return results, failures


SCORE_KINDS = ("random", "one_sign", "outlier", "cauchy", "exp4", "harness")


def score_kinds_timing() -> tuple:
    """(rows of results, mismatches) of section 4 of the module docstring."""
    g = torch.Generator().manual_seed(5)
    K = k = 2048
    results, failures = [], []
    for W, rows in ((2, 64), (2, 256), (2, 1024), (4, 1024)):
        copies = l2_copies(W, rows, K)
        for kind in SCORE_KINDS:
            if kind == "harness":
                inputs = [harness_rows(torch.Generator(device="cuda").manual_seed(100 + c),
                                       False, rows=rows, K=K, W=W) for c in range(copies)]
            else:
                inputs = [make_rows(kind, W, rows, K, k, g).cuda() for _ in range(copies)]
            row = dict(W=W, rows=rows, kind=kind)
            checked_times(inputs, k, row, failures)
            print(row, flush=True)
            results.append(row)
    return results, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer correctness rows")
    parser.add_argument("--variants", action="store_true",
                        help="also time every sorting variant, forced")
    parser.add_argument("--harness-rows", action="store_true",
                        help="also time the harness's k = 512 rows and their copies")
    parser.add_argument("--score-kinds", action="store_true",
                        help="also time rows of other score distributions (outliers, heavy "
                        "tails, one sign)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    failures = correctness(args.quick)
    report = dict(device=torch.cuda.get_device_name(), failures=failures,
                  timing=timing(args.variants))
    if args.harness_rows:
        report["harness_rows"], more = harness_rows_timing()
        failures += more
    if args.score_kinds:
        report["score_kinds"], more = score_kinds_timing()
        failures += more
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
