"""The top-K kernel's launch facts, in one place (standard library only).

``export.py`` compiles every entry of :data:`VARIANTS` and writes its facts into the
manifest, ``embed.py`` copies the manifest into the C++ table ``kEmbeddedKernels``, and the
C++ launcher (``choose_variant`` in ``csrc/dcp/stable_topk.cpp``) picks from that table.

Launch: grid ``(rows * cluster, 1, 1)``, block ``(threads, 1, 1)``, cluster ``(2, 1, 1)``
for a pair (else none), dynamic shared memory :func:`smem_bytes`, parameters
:data:`PARAMS` in order.
"""
from __future__ import annotations

from dataclasses import dataclass

ABI_VERSION = 5  # must match kCubinAbiVersion (csrc/dcp/cubin_loader.h): the build checks it

#: Kernel parameters in order, as the launcher must pass them. A dynamic cute.Tensor is
#: passed by value as {void* data; int32 shape[#dynamic]; int64 stride[#dynamic]}.
PARAMS = [
    "cand: {const int64* data; int32 shape[3] (W, rows, K); int64 stride[3]}",
    "out: {int32* data; int32 shape[2] (rows, k); int64 stride[2]}",
    "sel: int32 = min(k, W*K)",
]

RADIX_BITS = 8
NUM_BINS = 1 << RADIX_BITS
CTL_WORDS = 8  # shared control words of the select (see stable_topk.py)
COPY_WORDS = 4  # after each histogram's bins: AND and OR of the keys it counted
SMEM_BUDGET = 200 * 1024  # two sort buffers when they fit, else one
STREAM_GROUP = 8  # (segment, chunk) pairs a streamed variant writes per block-wide scan
RESOLVE_KEYS = 32  # a default-order bin of at most this many keys is resolved by one warp


@dataclass(frozen=True)
class Variant:
    """One exported kernel.

    sort_size: 0 for the default order (selected keys written in position order, any k),
        else S, the keys the sort orders (sorted=True, ``next_pow2(min(k, N)) <= S``).
    keys_per_thread: keys each thread holds in registers, one per (segment, block-wide
        chunk) pair (``W * ceil(K / threads) <= keys_per_thread * cluster``); 0 streams the
        row from global memory on every pass (any N).
    log_r: log2 of the keys per sorting thread (sorting variants).
    pair: a cluster of two CTAs per row, each holding one half of the row.
    ctas_per_sm: CTAs an SM must hold at once (registers capped to fit).
    ranked: sorting by rank (a counting sort of the select's candidates, ``{kind}_rank{S}``;
        the launcher runs it with ``S = min(2 next_pow2(min(k, N)), next_pow2(N))`` at
        least next_pow2(min(k, N)), so that the select stops early) instead of the bitonic
        sort of S slots (``{kind}_s{S}``).
    """
    name: str
    threads: int
    sort_size: int
    keys_per_thread: int
    log_r: int
    pair: bool
    ctas_per_sm: int
    ranked: bool = False

    @property
    def cluster(self) -> int:
        return 2 if self.pair else 1

    @property
    def sorted(self) -> bool:
        return self.sort_size > 0

    @property
    def resolves_small_bins(self) -> bool:
        """Default order: the select stops at a bin of at most RESOLVE_KEYS keys, which one
        warp resolves (see _RESOLVING)."""
        return not self.sorted and self.name.split("_")[0] in _RESOLVING


def sort_buffers(sort_size: int) -> int:
    two = 2 * sort_size * 8 + histograms(False) * (NUM_BINS + COPY_WORDS) * 4 + CTL_WORDS * 4
    return 2 if two <= SMEM_BUDGET else 1


def histograms(pair: bool) -> int:
    return 3 if pair else 2  # a histogram is reused two passes later (see the passes)


def scan_entries(v: Variant) -> int:
    """Warp counts one block-wide scan of the position-order write covers."""
    return (v.keys_per_thread or STREAM_GROUP) * (v.threads // 32)


def smem_bytes(v: Variant) -> int:
    """Dynamic shared memory of a variant, in this order (each 16-byte aligned): the sort
    buffers (sorting variants) or the scan's counts and bases and, where it resolves small
    bins, their keys (default order), the histograms, the control words."""
    if v.ranked:
        data = v.sort_size * (8 + 4) + 32 * 8  # the keys, their bins, the warps' largest keys
    elif v.sorted:
        data = sort_buffers(v.sort_size) * v.sort_size * 8
    else:
        data = 2 * scan_entries(v) * 4 + (RESOLVE_KEYS * 8 if v.resolves_small_bins else 0)
    return data + histograms(v.pair) * (NUM_BINS + COPY_WORDS) * 4 + CTL_WORDS * 4


#: Fastest first within each kind; the launcher takes the first that fits the shape:
#: pairs only while 2 x rows fit the SMs, 2 CTAs per SM only once the rows outnumber the
#: SMs (3 per SM: for a sort, twice over), keys in registers when the row's (segment,
#: chunk) pairs fit, else streamed. Sorting: the rank variant (see _RANKED) of exactly
#: the launcher's S where one holds the row, else the bitonic variant of the smallest S
#: with next_pow2(min(k, N)) <= S. The notes below are the bitonic sorts' (measured
#: before the rank sorts took W <= 4). H200 (132 SMs), k = K = 2048 unless named, graph us:
#: - A pair sorts with 4 keys per thread: each CTA sorts half the keys, and twice the
#:   sorting warps of 8 keys per thread hide more latency (64 rows: 14.6 against 15.2).
#: - d16 (512 threads, 2 CTAs per SM) against r8, W = 4, sorting: 132 rows +7%, 200 rows
#:   -15%, 264 -13%, 396 -3%, 528 -11%, 792 -13%, 1024 -13%. (S = 1024 / 512 at 1024 rows:
#:   -5.6% / -2.6%; S = 4096: -1.4%, not exported.)
#: - r4 / d8: the same kinds with fewer keys per thread, for rows of at most 4096
#:   candidates (W = 2), which the wider ones would run with half their register slots
#:   empty. Default order: one CTA (r4) beats a pair up to 132 rows (1 / 64 rows: 4.8 /
#:   5.7 us, against 6.6 / 8.6 for p4); 3 CTAs per SM (d8) beat d16 from 256 rows (10.6 /
#:   27.5 against 13.3 / 47.2 at 256 / 1024 rows). Sorting, W = 2: r4 against p4 at 1 / 64
#:   rows 9.81 / 13.36 against 10.29 / 17.35; at 256 rows d16 24.49, d8 26.96; at 1024
#:   rows d8 63.37 against d16 75.64 (W = 4, K = k = 512: 27.71 against 47.91).
#: - d8 sorts with all its 512 threads (4 keys each): 63.4 against 64.9 us for 256
#:   threads of 8 (1024 rows); the other kinds sort with 8 keys per thread (d16: 75.6
#:   against 78.2 for 4 per thread; r8 at W = 4: 102.0 against 107.9).
_SHAPES = (("d8", 512, 8, False, 3), ("d16", 512, 16, False, 2), ("r4", 1024, 4, False, 1),
           ("p4", 1024, 4, True, 1), ("p8", 1024, 8, True, 1), ("r8", 1024, 8, False, 1),
           ("r16", 1024, 16, False, 1), ("g", 1024, 0, False, 1))
_SMALL_SORTS = ("d8", "r4")  # rows of at most 4096 candidates: sorts of at most 2048 keys
#: The default order has no p4: one CTA of 8 keys per thread (r8) holds the same rows and
#: beats the pair since the write takes one ballot a key (W = 4, K = 2048, 1 / 64 rows:
#: 7.95 / 7.74 us against 8.32 / 8.48), so r8 comes before p8 there; a pair still beats
#: 16 keys per thread (W = 8, 64 rows: p8 12.5 against r16 14.1).
_DEFAULT_ORDER = ("d8", "d16", "r4", "r8", "p8", "r16", "g")
#: Default-order kinds whose select stops once the threshold bin holds at most
#: RESOLVE_KEYS keys and lets one warp rank them, instead of counting passes over the whole
#: row until the bin is taken whole (a copied threshold key took two more). H200, graph
#: us, against the passes: k = 512, 64 rows (r4) 5.3 -> 4.3; W = 4, 1 / 64 rows (r8) 8.1 ->
#: 7.5 / 7.9 -> 7.4. Left out: the kinds at their register cap (d8, d16: 2-3 CTAs an SM;
#: r16: 64 registers on 1024 threads), where it cost 0.8 us at 1024 rows (W = 2 / 4; d8
#: spilled 8 bytes more) and 0.9 / 3 us at 256 / 1024 rows (W = 8, r16); pairs and
#: streamed kinds (no warp sees all the bin's keys in its own CTA's registers).
_RESOLVING = ("r4", "r8")


def _sort_log_r(kind: str, pair: bool, threads: int = 1024, size: int = 0) -> int:
    """log2 of the keys per sorting thread (see the table's notes; a rank sort's bitonic
    fallback, for crowded bins, sorts S slots with all its threads at most)."""
    base = 2 if pair or kind == "d8" else 3
    return max(base, (size // threads).bit_length() - 1)


#: Rank sorts: kinds and sizes (S up to the keys a kind holds). They beat the bitonic
#: sorts where the rows fit 4 or 8 keys a thread (H200, k = 2048, graph us, rows 1 / 64 /
#: 256 / 1024: W = 4, r8_rank4096 7.4 / 7.6 / 15.2 / 64.7 against the bitonic choice
#: 12.7 / 13.2 / 21.2 / 77.4; W = 2, r4_rank4096 5.9 / 9.3 / 17.3 / 59.5 against 9.9 /
#: 11.0 / 19.7 / 59.8), and for k = 8192 (g_rank16384 34.0 against g_s8192 56.1, 64
#: rows); at W = 8 the bitonic sorts win (r16 kinds spill; pairs at few rows).
_RANKED = (("r4", (512, 1024, 2048, 4096)), ("r8", (512, 1024, 2048, 4096, 8192)),
           ("g", (8192, 16384)))

VARIANTS = tuple(
    Variant(f"{kind}_u", threads, 0, items, 0, pair, ctas)
    for order_kind in _DEFAULT_ORDER
    for kind, threads, items, pair, ctas in _SHAPES if kind == order_kind
) + tuple(
    Variant(f"{kind}_rank{size}", threads, size, items, _sort_log_r(kind, pair, threads, size),
            pair, ctas, ranked=True)
    for rank_kind, sizes in _RANKED
    for kind, threads, items, pair, ctas in _SHAPES if kind == rank_kind
    for size in sizes
) + tuple(
    Variant(f"{kind}_s{size}", threads, size, items, _sort_log_r(kind, pair), pair, ctas)
    for size in (512, 1024, 2048, 4096, 8192)
    for kind, threads, items, pair, ctas in _SHAPES
    if kind == "g" or (size <= 4096 and (kind not in ("d16",) + _SMALL_SORTS or size <= 2048))
) + (Variant("g_s16384", 1024, 16384, 0, 4, False, 1),)
