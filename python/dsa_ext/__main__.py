"""``python -m dsa_ext``: what this install holds, and an end-to-end self-check.

Prints the version, the compiled CUDA architectures and the device it sees, then runs
every op on the GPU if there is one (else on the CPU) against the torch reference, with
the time of the op and of the reference each. Exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Callable

import torch

import dsa_ext
from dsa_ext import reference

CHECKS: list[tuple[str, Callable[[torch.device, "Clock"], None]]] = []


class Clock:
    """Wall time of the dsa_ext calls (`op`) and of the torch reference calls (`ref`) of
    one check, kept apart: the reference is plain torch and often far slower."""

    def __init__(self, device: torch.device):
        self.device = device
        self.op_s = 0.0
        self.ref_s = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def op(self, fn: Callable, *args, **kwargs):
        self._sync()
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        self._sync()
        self.op_s += time.perf_counter() - t0
        return result

    def ref(self, fn: Callable, *args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        self.ref_s += time.perf_counter() - t0
        return result


def check(name: str):
    def register(fn):
        CHECKS.append((name, fn))
        return fn
    return register


def _equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        bad = (got != want).nonzero()
        where = tuple(bad[0].tolist()) if bad.numel() else "shape"
        raise AssertionError(f"{name}: mismatch vs reference at {where}")


@check("convert_req_index_to_global_index")
def _check_convert(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(0)
    T, K, R, NB, BS = 64, 2048, 8, 64, 64
    block_table = torch.randint(0, 1 << 16, (R, NB), generator=g, dtype=torch.int32)
    req_id = torch.randint(-1, R + 1, (T,), generator=g, dtype=torch.int32)
    tok = torch.randint(-1, NB * BS * 2, (T, K), generator=g, dtype=torch.int32)
    for world, rank, interleave, compact in ((1, 0, 1, False), (4, 3, 16, True),
                                             (2, 0, 1, True)):
        want, want_counts = clock.ref(
            reference.convert_req_index_to_global_index,
            req_id, block_table, tok, BS, dcp_world_size=world, dcp_rank=rank,
            interleave=interleave, compact=compact)
        got, counts = clock.op(
            dsa_ext.convert_req_index_to_global_index,
            req_id.to(device), block_table.to(device), tok.to(device), BS,
            dcp_world_size=world, dcp_rank=rank, interleave=interleave, compact=compact,
            return_valid_counts=True)
        _equal("slots", got, want)
        _equal("valid_counts", counts, want_counts)


# ---------------------------------------------------------------------------------------
# Indexer metadata (docs/ops.md sections 1, 3, 4, 5)
# ---------------------------------------------------------------------------------------


@check("build_c128a_topk_metadata")
def _check_c128a(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(1)
    T, Td, width, cap, R, NB, bs = 96, 40, 1024, 2048, 8, 20, 64
    positions = torch.randint(-1, cap * 128, (T,), generator=g, dtype=torch.int64)
    token_to_req = torch.randint(-1, R + 1, (T,), generator=g, dtype=torch.int32)
    block_table = torch.randint(-1, 1 << 20, (R, NB), generator=g, dtype=torch.int32)
    slot_mapping = torch.randint(-1, 100, (T,), generator=g, dtype=torch.int64)
    bufs = (torch.full((T, cap), 7, dtype=torch.int32, device=device),
            torch.zeros(T, dtype=torch.int32, device=device),
            torch.full((T, cap), 7, dtype=torch.int32, device=device))
    got = clock.op(
        dsa_ext.build_c128a_topk_metadata,
        positions.to(device), 128, Td, token_to_req.to(device), block_table.to(device), bs,
        slot_mapping.to(device), *bufs, width)
    want = clock.ref(reference.build_c128a_topk_metadata, positions, 128, Td, token_to_req,
                     block_table, bs, slot_mapping, width)
    for name, a, b in zip(("decode", "decode_lens", "prefill"), got, want):
        _equal(name, a, b)
    if not ((bufs[0][:, width:] == 7).all() and (bufs[2][:, width:] == 7).all()):
        raise AssertionError("c128a: columns >= width were written")


@check("decode per-token lengths + DCP localization")
def _check_decode_lens(device: torch.device, clock: Clock) -> None:
    from dsa_ext.seq_lens import decode_context_lens
    g = torch.Generator().manual_seed(2)
    B, next_n = 64, 4
    S = torch.randint(0, 1 << 17, (B,), generator=g, dtype=torch.int32)
    S[::7] = 0
    dlen = torch.randint(0, next_n + 1, (B,), generator=g, dtype=torch.int32)
    dlen[S == 0] = 0
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), dlen.cumsum(0).to(torch.int32)])
    Td = int(qsl[-1])
    for kw in (dict(next_n=next_n), dict(query_start_loc=qsl)):
        n_tok = B * next_n if "next_n" in kw else Td
        for world, rank, interleave in ((1, 0, 1), (4, 1, 1), (2, None, 16)):
            want = clock.ref(reference.decode_context_lens, S, n_tok, dcp_world_size=world,
                             dcp_rank=rank, interleave=interleave, **kw)
            got = clock.op(
                decode_context_lens, S.to(device), n_tok, dcp_world_size=world, dcp_rank=rank,
                interleave=interleave, **{k: v.to(device) if torch.is_tensor(v) else v
                                          for k, v in kw.items()})
            for name, a, b in zip(("global", "local", "row_map"), got, want):
                _equal(name, a, b)
    _equal("local_seq_lens vector", clock.op(
        dsa_ext.seq_lens.local_seq_lens, torch.tensor([8, 9, 10], device=device), 1, 2, 1),
        torch.tensor([4, 4, 5]))


@check("prefill chunk metadata")
def _check_prefill(device: torch.device, clock: Clock) -> None:
    from dsa_ext.indexer import IndexerMetadataBuilder
    for world, interleave, ke in ((1, 1, list(range(1, 9))), (4, 1, [1, 1, 1, 1, 2, 2, 2, 2]),
                                  (4, 2, [1, 2, 2, 2, 2, 2, 2, 2])):
        b = IndexerMetadataBuilder(device, 1, 64, 4, 4096, dcp_world_size=world,
                                   interleave=interleave)
        (c,) = clock.op(b.build_prefill, torch.tensor([8], dtype=torch.int32, device=device),
                        torch.tensor([0, 8], dtype=torch.int32, device=device))
        _equal("cu_seqlen_ke", c.cu_seqlen_ke, torch.tensor(ke))
        _equal("cu_seqlen_ks", c.cu_seqlen_ks, torch.zeros(8, dtype=torch.int32))
    g = torch.Generator().manual_seed(3)
    S = torch.randint(50, 3000, (12,), generator=g, dtype=torch.int32)
    qlen = torch.randint(1, 50, (12,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)]).to(torch.int32)
    b = IndexerMetadataBuilder(device, 1, 64, 4, 1 << 16, dcp_world_size=4, dcp_rank=3,
                               interleave=2, max_kv_workspace=4000, max_logits_bytes=1 << 16)
    for c in clock.op(b.build_prefill, S.to(device), qsl.to(device)):
        want = clock.ref(
            reference.prefill_chunk_bounds, S[c.req_start:c.req_end],
            qsl[c.req_start:c.req_end + 1], c.token_start, c.token_end, dcp_world_size=4,
            dcp_rank=3, interleave=2)
        for name in ("cu_seqlen_ks", "cu_seqlen_ke", "token_to_seq", "local_cu_seq_lens"):
            _equal(name, getattr(c, name), want[name])


@check("pack_dcp_topk_candidates")
def _check_pack(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(1)
    rows, cols, K = 64, 4096, 2048
    logits = torch.randn(rows, cols, generator=g)
    logits[torch.rand(rows, cols, generator=g) < 0.01] = float("nan")
    ids = torch.randint(-1, cols + 16, (rows, K), generator=g, dtype=torch.int32)
    starts = torch.randint(0, 16, (rows,), generator=g, dtype=torch.int32)
    for world, rank, interleave, row_starts in ((1, 0, 1, None), (4, 3, 1, starts),
                                                (8, 5, 64, None)):
        want = clock.ref(reference.pack_dcp_topk_candidates, logits, ids, rank, world,
                         interleave, row_starts)
        got = clock.op(
            dsa_ext.pack_dcp_topk_candidates, logits.to(device), ids.to(device), rank, world,
            interleave, None if row_starts is None else row_starts.to(device))
        _equal("candidate keys", got, want)


@check("stable_topk_from_candidates")
def _check_stable_topk(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(4)
    rows, W, K = 32, 4, 2048
    scores = torch.randn(rows, W * K, generator=g)
    scores[:, ::3] = torch.randint(0, 4, (rows, (W * K + 2) // 3), generator=g).float()  # ties
    gids = torch.randperm(W * K * 4, generator=g)[:W * K].to(torch.int32).repeat(rows, 1)
    gids[torch.rand(rows, W * K, generator=g) < 0.1] = -1  # invalid candidates
    keys = reference.encode_candidate_keys(scores, gids)
    keys[1] = keys[1, 0]  # one row of identical keys
    keys[2, 100:] = 0  # one row with a shortfall
    gathered = keys.view(rows, W, K).transpose(0, 1)  # [W, rows, K], strided
    for cands in (keys, gathered):
        for k in (1, 100, 2048, 4096, 20000):
            for order in (False, True):
                if order and k > 16384:
                    continue  # past the sorting kernels' limit
                want = clock.ref(reference.stable_topk_from_candidates, cands, k,
                                 sorted=order)
                got = clock.op(dsa_ext.stable_topk_from_candidates, cands.to(device), k,
                               sorted=order)
                _equal(f"top-{k} of {tuple(cands.shape)} sorted={order}", got, want)


@check("topk_per_row / topk_to_slots")
def _check_topk_per_row(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(5)
    rows, L, k, B = 8, 8192, 2048, 4
    logits = torch.randn(rows, L, generator=g)
    logits[:, ::5] = torch.randint(0, 3, (rows, (L + 4) // 5), generator=g).float()  # ties
    logits[0, :100] = float("nan")
    seq_lens = torch.tensor([L, 3000, 1500, 17], dtype=torch.int32)  # decode, next_n = 2
    for bounds in ({}, {"seq_lens": seq_lens, "next_n": 2}):
        for order in (False, True):
            want = clock.ref(reference.topk_per_row, logits, k, sorted=order, **bounds)
            got = clock.op(dsa_ext.topk_per_row, logits.to(device), k, sorted=order,
                           **{n: v.to(device) if isinstance(v, torch.Tensor) else v
                              for n, v in bounds.items()})
            _equal(f"top-{k} of {rows}x{L} sorted={order} {sorted(bounds)}", got, want)
    req = torch.arange(rows, dtype=torch.int32) % B
    table = torch.randint(0, 1 << 16, (B, L // 64), generator=g, dtype=torch.int32)
    want, want_counts = clock.ref(reference.topk_to_slots, logits, k, req, table, 64,
                                  compact=True)
    got, counts = clock.op(dsa_ext.topk_to_slots, logits.to(device), k, req.to(device),
                           table.to(device), 64, compact=True, return_valid_counts=True)
    _equal("topk_to_slots", got, want)
    _equal("topk_to_slots valid_counts", counts, want_counts)


@check("topk_to_candidates")
def _check_topk_to_candidates(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(6)
    rows, L, k = 8, 8192, 1024
    logits = torch.randn(rows, L, generator=g)
    logits[:, ::5] = torch.randint(0, 3, (rows, (L + 4) // 5), generator=g).float()  # ties
    logits[0, :100] = float("nan")
    starts = torch.randint(-8, 600, (rows,), generator=g, dtype=torch.int32)  # prefill ks
    ends = starts + torch.randint(0, 4000, (rows,), generator=g, dtype=torch.int32)
    prefill = {"row_starts": starts, "row_ends": ends}
    for world, rank, interleave, bounds in ((1, 0, 1, {}), (4, 3, 16, prefill)):
        want = clock.ref(reference.topk_to_candidates, logits, k, rank, world, interleave,
                         **bounds)
        got = clock.op(dsa_ext.topk_to_candidates, logits.to(device), k, rank, world,
                       interleave, **{n: v.to(device) for n, v in bounds.items()})
        _equal(f"candidate keys of {rows}x{L} W={world} {sorted(bounds)}", got, want)


@check("merge_topk_global (fake W=4)")
def _check_topk_merge(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(7)
    W, I, rows, width, k, K = 4, 2, 8, 1024, 256, 260
    scores = torch.randn(rows, W * width, generator=g)
    scores[:, ::3] = torch.randint(0, 4, (rows, (W * width + 2) // 3), generator=g).float()
    lengths = torch.randint(0, W * width + 1, (rows,), generator=g)
    lengths[0] = 0  # a row with no token
    # Rank r's local logits and local top-K (local ids, lower position first among ties).
    logits, local_topk = [], []
    for r in range(W):
        logits.append(scores[:, reference.dcp_global_position(torch.arange(width), r, W, I)])
        local_lengths = reference.dcp_local_length(lengths, r, W, I).to(torch.int32)
        local_topk.append(reference.topk_per_row(logits[r], K, lengths=local_lengths))
    packed = [clock.ref(reference.pack_dcp_topk_candidates, logits[r], local_topk[r], r, W, I)
              for r in range(W)]
    gathered = torch.cat(packed).to(device)
    for order in (False, True):
        want = clock.ref(reference.merge_topk_global, logits, local_topk, k, I, sorted=order)
        for r in range(W):
            def all_gather(output, input, r=r):
                # This rank's keys come in through `input`; the others' are the reference's,
                # as the other ranks would send them.
                _equal(f"rank {r}'s packed keys", input, packed[r])
                output.copy_(gathered)
            topk = local_topk[r].to(device, copy=True)  # overwritten in place
            clock.op(dsa_ext.merge_topk_global, logits[r].to(device), topk, k, rank=r,
                     world_size=W, interleave=I, all_gather=all_gather, sorted=order)
            _equal(f"rank {r} sorted={order}", topk, want)


@check("merge_attention_outputs (fake W=4)")
def _check_lse_merge(device: torch.device, clock: Clock) -> None:
    g = torch.Generator().manual_seed(2)
    W, B, H, D = 4, 16, 32, 64
    outs = [torch.randn(B, H, D, generator=g) for _ in range(W)]
    lses = [torch.randn(B, H, generator=g) * 3 for _ in range(W)]
    lses[1][0] = float("-inf")
    outs[1][0] = float("nan")  # an empty shard's 0/0 must not leak
    want, want_lse = clock.ref(reference.merge_attention_outputs, outs, lses, 2.0)
    gathered = torch.cat(lses).to(device)
    corrected = [clock.op(dsa_ext.correct_attention_output, o.to(device),
                          gathered.view(W, B, H), r)[0]
                 for r, o in enumerate(outs)]
    for r in range(W):
        def reduce_scatter(output, input, r=r):
            # This rank's corrected blocks come in through `input`; the others' were
            # computed above, as the other ranks would.
            blocks = [input.view(W, B, H // W, D) if w == r else corrected[w]
                      for w in range(W)]
            output.copy_(sum(b[r] for b in blocks))
        got, got_lse = clock.op(
            dsa_ext.merge_attention_outputs, outs[r].to(device), lses[r].to(device), rank=r,
            world_size=W, return_lse=True,
            all_gather=lambda output, input: output.copy_(gathered),
            reduce_scatter=reduce_scatter)
        torch.testing.assert_close(got.cpu(), want[r], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_lse.cpu(), want_lse[r], rtol=1e-5, atol=1e-5)


def run_check(fn: Callable[[torch.device, Clock], None], device: torch.device) -> dict:
    """One check: a first run to warm up (cubin loading, allocator, caches), then a timed
    run. Returns its JSON record."""
    fn(device, Clock(device))
    clock = Clock(device)
    fn(device, clock)
    return {"ok": True, "op_ms": clock.op_s * 1e3, "reference_ms": clock.ref_s * 1e3}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dsa_ext",
        description="Print what this dsa_ext install holds (version, compiled CUDA "
                    "architectures, the device it sees) and check every op against the "
                    "plain torch reference, on the GPU if there is one, else on the CPU. "
                    "Exit code 1 if any check fails.")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the text report "
                             "(tracebacks of failed checks go to stderr)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = {"version": dsa_ext.__version__, "torch": torch.__version__,
              "cuda_archs": list(dsa_ext.cuda_archs)}
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(device)
        report["device"] = (f"{props.name} (sm_{props.major}{props.minor}, "
                            f"{props.multi_processor_count} SMs)")
    else:
        device = torch.device("cpu")
        report["device"] = "cpu (no CUDA device visible)"
    say = (lambda *a, **k: None) if args.json else print
    say(f"dsa_ext {report['version']}  torch {report['torch']}  "
        f"compiled for: {', '.join(report['cuda_archs'])}")
    say(f"device: {report['device']}")
    say(f"  {'':5} {'check':46} {'op ms':>9} {'reference ms':>13}")
    report["checks"] = []
    for name, fn in CHECKS:
        try:
            record = run_check(fn, device)
            say(f"  ok    {name:46} {record['op_ms']:9.2f} {record['reference_ms']:13.2f}")
        except Exception as err:  # noqa: BLE001 - report every failure, keep going
            record = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            say(f"  FAIL  {name}")
            traceback.print_exc()
        report["checks"].append({"name": name, **record})
    failed = sum(not c["ok"] for c in report["checks"])
    report["passed"], report["failed"] = len(CHECKS) - failed, failed
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['passed']} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
