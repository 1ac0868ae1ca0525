"""Benchmarks: ``python -m dsa_ext.bench [--json PATH] [--filter TEXT]``.

Per case: the per-launch device time from CUDA-graph replays (many launches in one graph,
median over several replays, inputs rotated so they don't sit in L2 unless they are small
enough to live there in production too; rows marked "L2-warm" reuse one input copy, as
when the op reads what the kernel before it wrote), the eager wall time of one call
(host overhead included), the bytes the op must move at least (each input read once, each
output written once), GB/s and the share of the device's copy bandwidth measured in the
same run (an SM kernel reading and writing each byte once; a plain copy_ would run on the
copy engines and understate the ceiling).

Speed against vLLM's own kernels is measured side by side, on the same inputs in one run,
by the harness the repository's RESULTS.md names; this bench prints no peer numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import dsa_ext
from . import reference


@dataclass
class Case:
    op: str
    shape: str
    bytes_moved: int
    #: returns a list of zero-argument callables, one per rotated input copy
    make: Callable[[torch.device, int], list]
    #: one input copy, left in L2 between launches: the op reads what the previous kernel
    #: just wrote (the logits the indexer wrote, the candidates the all-gather wrote)
    l2_warm: bool = False


CASES: list[Case] = []


def case(op, shape, bytes_moved, l2_warm=False):
    def register(make):
        CASES.append(Case(op, shape + (" L2-warm" if l2_warm else ""), bytes_moved, make,
                          l2_warm))
        return make
    return register


# ---------------------------------------------------------------------------------------
# Timers
# ---------------------------------------------------------------------------------------


def capture(calls: list, launches: int) -> torch.cuda.CUDAGraph:
    """Runs every call once on a side stream (lazy loads, allocator warm-up), then
    captures `launches` calls, cycling through `calls`, in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            calls[i % len(calls)]()
    return graph


def graph_us(calls: list, launches: int = 20, replays: int = 15,
             before_replay: Optional[Callable[[], None]] = None) -> float:
    """Median per-launch device time of `launches` calls captured in one CUDA graph.

    `before_replay` runs before every replay (a process-group barrier, so that ranks
    whose graphs hold collectives start together)."""
    graph = capture(calls, launches)
    before_replay = before_replay or (lambda: None)
    before_replay()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        before_replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def eager_us(calls: list, iters: int = 200,
             before_run: Optional[Callable[[], None]] = None) -> float:
    """Wall time per eager call (host overhead and launch included), median of 5 runs.

    `before_run` runs before every run, outside the timing (a process-group barrier)."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        if before_run is not None:
            before_run()
        t0 = time.perf_counter()
        for i in range(iters):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(runs)


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth (bytes read + written per second) of an SM kernel."""
    x = torch.rand(nbytes // 8, device=device)
    y = torch.empty_like(x)
    calls = [lambda: torch.mul(x, 1.0, out=y)]
    us = graph_us(calls, launches=5, replays=7)
    return 2 * x.numel() * 4 / (us * 1e-6) / 1e9


def launch_floor_us(device: torch.device) -> float:
    """Per-launch time of a kernel that does almost nothing, from the same graph timer."""
    x = torch.zeros(1, device=device)
    return graph_us([lambda: x.add_(1.0)])


def copies_for(nbytes: int, device: torch.device) -> int:
    """Input copies to rotate so that the rotation does not fit in L2 (max 16)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(16, -(-3 * l2 // max(nbytes, 1))))


# ---------------------------------------------------------------------------------------
# Cases: index conversion (docs/ops.md section 2), K = 2048 with compaction
# ---------------------------------------------------------------------------------------


# Workload: 128K-token contexts (NB = 2048 blocks of 64), 16 token rows per request
# (prefill chunks, or decode with speculative tokens), top-K ids uniform over the
# context with 10% -1 padding.
_CONVERT_NB, _CONVERT_BS, _ROWS_PER_REQ = 2048, 64, 16


def _convert_inputs(T: int, K: int, device, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    R = max(T // _ROWS_PER_REQ, 1)
    block_table = torch.randint(0, 1 << 20, (R, _CONVERT_NB), generator=g, dtype=torch.int32)
    req_id = torch.randint(0, R, (T,), generator=g, dtype=torch.int32)
    tok = torch.randint(0, _CONVERT_NB * _CONVERT_BS, (T, K), generator=g, dtype=torch.int32)
    tok[torch.rand(T, K, generator=g) < 0.1] = -1
    return [x.to(device) for x in (req_id, block_table, tok)]


def _register_convert(T: int, world: int, K: int = 2048):
    # token_indices read + slots written + req_id/counts + each block-table row once
    R = max(T // _ROWS_PER_REQ, 1)
    nbytes = 2 * T * K * 4 + 2 * T * 4 + R * _CONVERT_NB * 4

    @case("convert_req_index (compact)", f"T={T} K={K} W={world}", nbytes)
    def make(device, copies):
        calls = []
        for i in range(copies):
            req_id, block_table, tok = _convert_inputs(T, K, device, seed=i)
            out = torch.empty_like(tok)
            counts = torch.empty(T, dtype=torch.int32, device=device)
            calls.append(lambda r=req_id, b=block_table, t=tok, o=out, c=counts:
                         dsa_ext.convert_req_index_to_global_index(
                             r, b, t, _CONVERT_BS, dcp_world_size=world, dcp_rank=world - 1,
                             compact=True, out=o, valid_counts=c))
        return calls


for _T in (1, 64, 1024, 16384):
    _register_convert(_T, 1)
    _register_convert(_T, 4)


# ---------------------------------------------------------------------------------------
# Cases: indexer metadata (docs/ops.md sections 3 and 4): C128A metadata, a whole decode
# metadata build
# ---------------------------------------------------------------------------------------


def _c128a_inputs(T: int, width: int, device, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ratio, bs, NB = 128, 64, width // 64 + 1
    Td = T // 2
    R = max(Td // 4, 1)
    positions = torch.randint(0, width * ratio, (T,), generator=g, dtype=torch.int64)
    token_to_req = torch.randint(0, R, (T,), generator=g, dtype=torch.int32)
    block_table = torch.randint(0, 1 << 16, (R, NB), generator=g, dtype=torch.int32)
    slot_mapping = torch.randint(0, 1 << 20, (T,), generator=g, dtype=torch.int64)
    slot_mapping[torch.rand(T, generator=g) < 0.05] = -1
    return Td, bs, [x.to(device) for x in (positions, token_to_req, block_table, slot_mapping)]


def _register_c128a(T: int, width: int):
    # decode + prefill rows written, decode lens written, positions/slots/req ids read
    nbytes = T * width * 4 + T * (8 + 8 + 4 + 4)

    @case("c128a_topk_metadata", f"T={T} width={width}", nbytes)
    def make(device, copies):
        builder = dsa_ext.C128AMetadataBuilder(width * 128, T, device)
        calls = []
        for i in range(copies):
            Td, bs, (pos, req, table, slots) = _c128a_inputs(T, width, device, seed=i)
            calls.append(lambda p=pos, r=req, t=table, s=slots, Td=Td, bs=bs:
                         builder.build(p, Td, r, t, bs, s, max_seq_len=width * 128,
                                       width=width))
        return calls


_register_c128a(256, 1024)
_register_c128a(1024, 8192)


def _register_decode_build(B: int, next_n: int, world: int):
    nbytes = B * 4 + B * next_n * 4 * 3  # seq lens read; global, local, row map written

    @case("indexer decode metadata build", f"B={B} next_n={next_n} W={world}", nbytes)
    def make(device, copies):
        from .indexer import IndexerMetadataBuilder
        builder = IndexerMetadataBuilder(device, next_n, 64, B, 1 << 17, dcp_world_size=world,
                                         dcp_rank=world - 1, capability=(9, 0))
        calls = []
        for i in range(copies):
            g = torch.Generator(device="cpu").manual_seed(i)
            seq_lens = torch.randint(next_n, 1 << 17, (B,), generator=g,
                                     dtype=torch.int32).to(device)
            qsl = (torch.arange(B + 1, dtype=torch.int32) * next_n).to(device)
            table = torch.randint(0, 1 << 16, (B, (1 << 17) // 64), generator=g,
                                  dtype=torch.int32).to(device)
            calls.append(lambda s=seq_lens, q=qsl, t=table:
                         builder.build_decode(s, q, t, B, B * next_n, uniform=True))
        return calls


_register_decode_build(256, 4, 4)


# Cases: DCP top-K merge and attention-output merge (docs/ops.md sections 6 and 7)
# ---------------------------------------------------------------------------------------

_DCP_COLS = 32768  # local logits width: a 128K context over W = 4 ranks


def _pack_inputs(rows: int, K: int, device, seed: int, cols: int = _DCP_COLS):
    """Random logits and distinct random ids per row (5% -1), generated on the device."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(rows, cols, generator=g, device=device)
    ids = torch.argsort(torch.rand(rows, cols, generator=g, device=device), dim=1)[:, :K]
    ids = ids.to(torch.int32).contiguous()
    ids[torch.rand(rows, K, generator=g, device=device) < 0.05] = -1
    return logits, ids


def _register_pack(rows: int, K: int = 2048, world: int = 4, l2_warm: bool = False):
    # ids read + keys written + one fp32 score gathered per candidate
    nbytes = rows * K * (4 + 8 + 4)

    @case("pack_dcp_topk_candidates", f"rows={rows} K={K} W={world} cols={_DCP_COLS}",
          nbytes, l2_warm)
    def make(device, copies):
        calls = []
        for i in range(copies):
            logits, ids = _pack_inputs(rows, K, device, seed=i)
            out = torch.empty(rows, K, dtype=torch.int64, device=device)
            calls.append(lambda lg=logits, t=ids, o=out: dsa_ext.pack_dcp_topk_candidates(
                lg, t, world - 1, world, 1, out=o))
        return calls


for _rows in (64, 1024):
    _register_pack(_rows)
_register_pack(64, l2_warm=True)


def _fake_gather_from(gathered: torch.Tensor):
    """An all_gather hook standing in for the collective: one device copy of the
    (precomputed) gathered candidates of all ranks."""
    def hook(output, input):
        output.copy_(gathered)
    return hook


# ids read, keys written, a score gathered; W ranks' keys read, ids written (64 rows, W = 4)
_MERGE_BYTES = 64 * 2048 * (4 + 8 + 4 + 4 * 8 + 4)


def _packed_ranks(rows: int, k: int, world: int, device, seed: int):
    """One rank's scores and local top-K, and every rank's packed candidates of them."""
    logits, ids = _pack_inputs(rows, k, device, seed=seed)
    return logits, ids, [dsa_ext.pack_dcp_topk_candidates(logits, ids, r, world)
                         for r in range(world)]


@case("merge_topk_global (fake exchange)", "rows=64 k=2048 W=4", _MERGE_BYTES)
def _make_merge_topk(device, copies, rows=64, k=2048, world=4):
    # pack + a device copy for the all-gather + stable top-K of W*K candidates.
    # topk_indices is overwritten in place with global ids, so later calls re-pack those
    # (same shapes and work per call).
    calls = []
    for i in range(copies):
        logits, ids, packed = _packed_ranks(rows, k, world, device, i)
        hook = _fake_gather_from(torch.cat(packed))
        calls.append(lambda lg=logits, t=ids, h=hook: dsa_ext.merge_topk_global(
            lg, t, k, rank=0, world_size=world, all_gather=h))
    return calls


@case("pack + stable_topk (no exchange)", "rows=64 k=2048 W=4", _MERGE_BYTES)
def _make_pack_select(device, copies, rows=64, k=2048, world=4):
    # merge_topk_global without the all-gather: this rank's pack, then the stable top-K
    # of the W ranks' candidates (gathered once up front)
    calls = []
    for i in range(copies):
        logits, ids, packed = _packed_ranks(rows, k, world, device, i)
        gathered = torch.stack(packed)
        mine, out = torch.empty_like(gathered[0]), torch.empty_like(ids)

        def call(lg=logits, t=ids, p=mine, g=gathered, o=out):
            dsa_ext.pack_dcp_topk_candidates(lg, t, 0, world, out=p)
            dsa_ext.stable_topk_from_candidates(g, k, out=o)
        calls.append(call)
    return calls


def _register_correction(dtype: torch.dtype, B=64, H=128, D=512, world=4):
    size = torch.finfo(dtype).bits // 8
    nbytes = 2 * B * H * D * size + world * B * H * 4

    @case(f"merge_attention_outputs correction ({str(dtype)[6:]})",
          f"B={B} H={H} D={D} W={world}", nbytes)
    def make(device, copies):
        calls = []
        for i in range(copies):
            g = torch.Generator(device="cpu").manual_seed(i)
            out = torch.randn(B, H, D, generator=g).to(dtype).to(device)
            lses = (torch.randn(world, B, H, generator=g) * 4).to(device)
            corrected = torch.empty(world, B, H // world, D, dtype=dtype, device=device)
            g_lse = torch.empty(B, H, device=device)
            calls.append(lambda o=out, x=lses, c=corrected, gl=g_lse:
                         dsa_ext.correct_attention_output(o, x, 1, corrected=c,
                                                          global_lse=gl))
        return calls


for _dtype in (torch.bfloat16, torch.float32):
    _register_correction(_dtype)


# ---------------------------------------------------------------------------------------
# Cases: stable global top-K of all-gathered DCP candidates (docs/ops.md section 6c),
# k = 2048
# ---------------------------------------------------------------------------------------


def _register_stable_topk(rows: int, world: int, K: int = 2048, k: int = 2048,
                          ties: bool = False, l2_warm: bool = False, sorted: bool = False):
    nbytes = world * rows * K * 8 + rows * k * 4  # candidates read once, ids written
    tags = (" ties" if ties else "") + (" sorted" if sorted else "")

    @case("stable_topk_from_candidates", f"rows={rows} W={world} k={k}{tags}", nbytes, l2_warm)
    def make(device, copies):
        calls = []
        for i in range(copies):
            g = torch.Generator(device=device).manual_seed(i)
            if ties:  # few distinct scores: the order comes from the ids
                scores = torch.randint(0, 4, (world, rows, K), generator=g, device=device)
            else:
                scores = torch.randn(world, rows, K, generator=g, device=device)
            gids = torch.randint(0, 1 << 24, (world, rows, K), generator=g, device=device)
            cands = reference.encode_candidate_keys(scores.float(), gids)
            out = torch.empty(rows, k, dtype=torch.int32, device=device)
            calls.append(lambda c=cands, o=out:
                         dsa_ext.stable_topk_from_candidates(c, k, out=o, sorted=sorted))
        return calls


for _rows in (1, 64, 1024):
    for _world in (2, 4, 8):
        _register_stable_topk(_rows, _world)
_register_stable_topk(64, 4, sorted=True)
_register_stable_topk(1024, 4, sorted=True)
_register_stable_topk(64, 4, ties=True)
_register_stable_topk(64, 4, l2_warm=True)


# ---------------------------------------------------------------------------------------
# Cases: the indexer's per-row top-K (docs/ops.md section 9), k = 2048
# ---------------------------------------------------------------------------------------


def topk_logits(rows: int, L: int, device, seed: int, dtype=torch.float32,
                distinct: int = 0) -> torch.Tensor:
    """randn logits, or with `distinct` only that many distinct values (heavy ties)."""
    g = torch.Generator(device=device).manual_seed(seed)
    if distinct:
        x = torch.randint(0, distinct, (rows, L), generator=g, device=device).float()
    else:
        x = torch.randn(rows, L, generator=g, device=device)
    return x.to(dtype)


def _register_topk_per_row(rows: int, L: int, k: int = 2048, dtype=torch.float32,
                           distinct: int = 0, next_n: int = 0, ragged: bool = False,
                           sorted: bool = False):
    nbytes = rows * L * dtype.itemsize + rows * k * 4  # logits read once, ids written
    tags = ((" bf16" if dtype is torch.bfloat16 else "") +
            (f" ties{distinct}" if distinct else "") + (f" next_n={next_n}" if next_n else "") +
            (" ragged" if ragged else "") + (" sorted" if sorted else ""))

    @case("topk_per_row", f"{rows}x{L} k={k}{tags}", nbytes)
    def make(device, copies):
        calls = []
        for i in range(copies):
            x = topk_logits(rows, L, device, i, dtype, distinct)
            out = torch.empty(rows, k, dtype=torch.int32, device=device)
            kw = {}
            g = torch.Generator().manual_seed(i)
            if next_n:  # decode: every request's context ends near L
                kw = dict(seq_lens=torch.randint(L // 2, L + 1, (rows // next_n,), generator=g,
                                                 dtype=torch.int32).to(device), next_n=next_n)
            elif ragged:  # prefill: windows [ks, ke) of random lengths inside the row
                ks = torch.randint(0, L // 4, (rows,), generator=g, dtype=torch.int32)
                ke = ks + torch.randint(1, 3 * L // 4, (rows,), generator=g, dtype=torch.int32)
                kw = dict(row_starts=ks.to(device), row_ends=ke.to(device))
            calls.append(lambda x=x, o=out, kw=kw:
                         dsa_ext.topk_per_row(x, k, out=o, sorted=sorted, **kw))
        return calls


def _register_topk_to_outputs(rows: int, L: int, op: str, k: int = 2048):
    """topk_to_slots (compacted, block table of 64-token blocks; on rows past 8192 columns
    the ids kernel, then the conversion in place) or topk_to_candidates (rank 1 of 4, one
    kernel)."""
    out_bytes = rows * k * (8 if op == "topk_to_candidates" else 4)
    nbytes = rows * L * 4 + out_bytes + (rows * (L // 64 + 1) * 4 if op == "topk_to_slots" else 0)

    @case(op, f"{rows}x{L} k={k}" + (" compact" if op == "topk_to_slots" else " W=4"), nbytes)
    def make(device, copies):
        calls = []
        for i in range(copies):
            x = topk_logits(rows, L, device, i)
            if op == "topk_to_slots":
                g = torch.Generator().manual_seed(i)
                table = torch.randint(0, 1 << 20, (rows, L // 64 + 1), generator=g,
                                      dtype=torch.int32).to(device)
                req = torch.arange(rows, dtype=torch.int32, device=device)
                out = torch.empty(rows, k, dtype=torch.int32, device=device)
                counts = torch.empty(rows, dtype=torch.int32, device=device)
                calls.append(lambda x=x, t=table, r=req, o=out, c=counts:
                             dsa_ext.topk_to_slots(x, k, r, t, 64, compact=True, out=o,
                                                   valid_counts=c))
            else:
                out = torch.empty(rows, k, dtype=torch.int64, device=device)
                calls.append(lambda x=x, o=out:
                             dsa_ext.topk_to_candidates(x, k, 1, 4, out=o))
        return calls


for _L in (32768, 131072):
    for _rows in (1, 64, 256):
        _register_topk_per_row(_rows, _L)
    _register_topk_per_row(64, _L, dtype=torch.bfloat16)
    _register_topk_per_row(64, _L, distinct=16)
_register_topk_per_row(64, 32768, next_n=4)
_register_topk_per_row(64, 32768, ragged=True)
_register_topk_per_row(64, 32768, sorted=True)
_register_topk_per_row(1, 1 << 20)
_register_topk_per_row(4096, 2048, k=512)  # short rows: the short-row kernel
for _rows in (1, 64):
    _register_topk_to_outputs(_rows, 32768, "topk_to_slots")
    _register_topk_to_outputs(_rows, 32768, "topk_to_candidates")


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def run(filter_text: str = "", device: Optional[torch.device] = None) -> dict:
    device = device or torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    copy_gbs = copy_bandwidth_gbs(device)
    floor_us = launch_floor_us(device)
    rows = []
    for c in CASES:
        if filter_text and filter_text not in f"{c.op} {c.shape}":
            continue
        calls = c.make(device, 1 if c.l2_warm else copies_for(c.bytes_moved, device))
        g_us = graph_us(calls)
        e_us = eager_us(calls)
        gbs = c.bytes_moved / (g_us * 1e-6) / 1e9
        rows.append(dict(op=c.op, shape=c.shape, graph_us=g_us, eager_us=e_us, gbs=gbs,
                         copy_share=gbs / copy_gbs))
        del calls
    return dict(device=props.name, torch=torch.__version__, dsa_ext=dsa_ext.__version__,
                copy_gbs=copy_gbs, launch_floor_us=floor_us, rows=rows)


def format_table(result: dict) -> str:
    lines = [f"dsa_ext {result['dsa_ext']} on {result['device']} (torch {result['torch']}); "
             f"device copy bandwidth {result['copy_gbs']:.0f} GB/s; launch floor "
             f"(1-element add_) {result['launch_floor_us']:.2f} us per graph launch",
             f"{'op':34} {'shape':27} {'graph us':>9} {'eager us':>9} {'GB/s':>7} "
             f"{'% copy':>7}"]
    for r in result["rows"]:
        lines.append(f"{r['op']:34} {r['shape']:27} {r['graph_us']:9.2f} {r['eager_us']:9.2f} "
                     f"{r['gbs']:7.0f} {100 * r['copy_share']:6.1f}%")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsa_ext.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--filter", default="", help="only cases whose op/shape contain this")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dsa_ext.bench needs a CUDA device")
        return 2
    result = run(args.filter)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
