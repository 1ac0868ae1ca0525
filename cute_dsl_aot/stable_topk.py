"""Stable global top-K of packed DCP candidates, written in CuTeDSL (docs/ops.md section 6c).

Each candidate is one int64 whose bits are the unsigned key

    key = (ordered(score_bits) << 32) | (~gid & 0xFFFFFFFF),   invalid candidate: key = 0

so "score descending, then gid ascending, invalid last" is "key descending as an unsigned
64-bit integer". Row r's candidates are ``cand[w, r, c]`` of a 3-D ``[W, rows, K]`` tensor
with arbitrary strides (a 2-D input is ``W = 1``); position ``p = w * K + c`` orders them.
The output is a 2-D int32 ``[rows, k]`` tensor with arbitrary strides. With
``sel = min(k, N)``, one CTA per row, or a cluster of two (``pair``: CTA 0 holds the first
half of the row's (segment, chunk) pairs, CTA 1 the rest; histograms are added through
distributed shared memory):

1. Load (:func:`_load_keys`): register variants hold one key per (segment, block-wide
   chunk) pair in registers for the whole kernel; streamed variants read the row from
   global memory on every pass. Key 0 (an invalid candidate, or no candidate) decodes to
   -1 like a shortfall, so only nonzero keys are selected:
   ``sel_eff = min(sel, nonzero keys)``.
2. Radix select (:func:`_radix_select`), up to 8 passes of 8-bit digits from the top: a
   shared histogram of the digit of every nonzero key that matches the prefix found so
   far (histograms used in rotation, so a pass needs two barriers); one warp scans the
   256 bins from the top (adding the peer CTA's bins in a pair) and picks the digit
   holding the ``need``-th largest key. Result: a masked prefix P (mask M) such that the
   top ``sel_eff`` keys are all keys with ``key & M > P`` plus ``need`` of the ``bucket``
   keys with ``key & M == P``. The default order runs until the bin is taken whole
   (``bucket == need``), a sorting variant until the candidate set ``{key & M >= P}``
   fits its sort (``sel_eff - need + bucket <= S``); both stop early when the bin holds
   copies of one key (then P is that key, and ``need`` of its copies are taken: the
   default order those at the lowest positions). The default order of the kinds in
   ``variants._RESOLVING`` also stops once the bin holds at most RESOLVE_KEYS keys: they
   are gathered into shared memory and one warp ranks them (:func:`_resolve_small_bin`),
   which gives the threshold key itself (P, all 64 bits) and its copies, so a row takes
   no more passes than it needs to bring the bin down to a few keys. After a pass that
   did not split the bin, or (default order and pairs) once the bin is small
   (``TRACK_BELOW``), the next pass also folds the keys it counts (that bin) into an AND
   and an OR beside its histogram, which are equal exactly when the bin holds copies of
   one key - so a duplicated candidate at the threshold stops the row there instead of
   after all 8 passes (a sort of exactly ``sel_eff`` keys has no room for the extra
   copies).
3. Default order (:func:`_write_in_position_order`): one ordered stream compaction of the
   row. When the select stopped on a whole bin (the usual case) every key ``>= prefix``
   is taken: one ballot per key gives each warp's count, one warp scans the counts of the
   block in position order (register index, then warp) and every taken key goes to
   ``out[row, keys taken before it]``. When it stopped on copies of one key, two ballots
   (above it; a copy of it) and ``out[row, keys above before it + min(copies before it,
   need)]``. Streamed variants do this per group of chunks with running totals. In a
   pair, CTA 1's counts start at the row's totals (known from the select) minus its own,
   so the CTAs exchange nothing. Positions ``sel_eff .. k-1`` get -1. No shared buffer of
   keys, no sort, any ``k``.
4. ``sorted=True``, rank variants (:func:`_sort_by_rank`): the select stops once the
   candidates (keys ``>= prefix``) fit S, a counting sort bins them by the top
   ``log2(S)`` bits of their distance below the largest one (a histogram, its scan, a
   scatter) and each key's output position is its bin's start plus the keys of its bin
   above it; a row whose bins crowd (equal scores) runs the bitonic sort below on the
   scattered keys instead.
   ``sorted=True``, bitonic variants (:func:`_gather_and_sort`): the candidates are
   gathered into shared memory (one shared atomic per warp for its slots, so the order
   is arbitrary, the set exact and the slots need no swizzle; in a pair slot i lives in CTA
   ``i >> (log2(S) - 1)``), stored with the top bit flipped so that a signed compare is
   the unsigned order, padded with key 0 to ``S`` slots; a bitonic sort held in
   registers orders them descending (``sort_plan.py``: ``2^log_r`` keys per thread, the
   keys pass through shared memory only between windows of stages); a pair sorts a half
   per CTA and merges across them (:func:`_pair_sort`). The ids of the first ``sel_eff``
   slots are written, then -1. Meanwhile the threads that do not sort prefetch into L2
   the row ``%nsmid`` times the CTAs per SM rows ahead (single CTAs only).

The variants and their launch facts (threads, keys per thread, sort size, pair, CTAs per
SM, shared memory, parameters) are ``variants.py``. The host guarantees ``rows >= 1``,
``1 <= sel``, ``N`` and ``sel <= 2^31 - 4096`` (the 32-bit loop counters step up to
2,048 past their bound), ``next_pow2(sel) <= S`` for a sorting variant and, for the
register variants, ``W * ceil(K / num_threads) <= keys_per_thread`` (twice that for a pair).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

import sort_plan
import variants
from variants import COPY_WORDS, CTL_WORDS, NUM_BINS, RADIX_BITS, RESOLVE_KEYS, STREAM_GROUP

NUM_PASSES = 64 // RADIX_BITS
# Shared control words: 0 digit, 1 keys above the bin, 2 bin count (after a small bin's
# resolve: keys above its threshold key, copies of it), 3 gather slots (also the resolve's),
# 5 keys to select, 6 the position-order scan's block total, 7 the rank sort's crowding.
CTL_SCAN_TOTAL = 6
CTL_CROWD = 7  # the rank sort: the sum over keys of the keys sharing their bin
CROWDED_BIN_MATES = 32  # more bin-mates a key on average: the bitonic sort is cheaper
SIGN_BIT = -(1 << 63)  # int64 with only the top bit set; also the flipped key 0
SORT_BARRIER = 1  # named barrier of the sorting threads
GATHER_GROUP = 8  # register keys gathered per warp atomic (their hits and ballots stay live)
TRACK_BELOW = 64  # a bin of at most this many keys is checked for copies of one key
COPIES_SHIFT = 16  # the scan packs (keys above, copies of the threshold) into one int32
RANK_UNROLL = 8  # shuffles in flight while a warp ranks a small bin (divides RESOLVE_KEYS)


def _as_int64(u: int) -> int:
    """The int64 with the same bits as the unsigned 64-bit value u."""
    return u - (1 << 64) if u >= (1 << 63) else u


def _asm(result_type, operands, text: str, constraints: str):
    return llvm.inline_asm(result_type, [x.ir_value() for x in operands], text, constraints,
                           has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def _cluster_addr(tensor: cute.Tensor, index, rank: Int32) -> Int32:
    """Shared::cluster address of tensor[index] in CTA `rank`'s shared memory (PAIR)."""
    local = Int32(llvm.ptrtoint(T.i32(), (tensor.iterator + index).llvm_ptr))
    return Int32(_asm(T.i32(), [local, Int32(rank)], "mapa.shared::cluster.u32 $0, $1, $2;",
                      "=r,r,r"))


def _cluster_load_i32(addr: Int32) -> Int32:
    return Int32(_asm(T.i32(), [addr], "ld.shared::cluster.u32 $0, [$1];", "=r,r"))


def _cluster_store_i64(addr: Int32, value: Int64):
    _asm(None, [addr, value], "st.shared::cluster.u64 [$0], $1;", "r,l")


def _cluster_load_i64(addr: Int32) -> Int64:
    return Int64(_asm(T.i64(), [addr], "ld.shared::cluster.u64 $0, [$1];", "=l,r"))


def _cluster_add_i32(addr: Int32, value: Int32) -> Int32:
    return Int32(_asm(T.i32(), [addr, value], "atom.shared::cluster.add.u32 $0, [$1], $2;",
                      "=r,r,r"))


def _num_sms() -> Int32:
    """%nsmid: an upper bound of the SM ids (the SM count, or a little more)."""
    return Int32(_asm(T.i32(), [], "mov.u32 $0, %nsmid;", "=r"))


@cute.jit
def _prefetch_row(cand: cute.Tensor, row: Int32, ahead: Int32, t: Int32,
                  nt: cutlass.Constexpr[int]):
    """Thread t of nt pulls row ``row + ahead`` of every segment (if it exists) into L2,
    one 128-byte line (16 keys) each."""
    if ahead < cand.shape[1] - row:  # no Int32 overflow near 2^31 rows
        row = row + ahead
        lines = (cand.shape[2] + 15) // 16
        seg_stride, row_stride, col_stride = cand.stride
        for j in cutlass.range(t, cand.shape[0] * lines, nt):
            w = j // lines
            off = (Int64(w) * seg_stride + Int64(row) * row_stride
                   + Int64((j - w * lines) * 16) * col_stride)
            addr = Int64(llvm.ptrtoint(T.i64(), (cand.iterator + off).llvm_ptr))
            _asm(None, [addr], "prefetch.global.L2 [$0];", "l")


def _swizzle(e: Int32, m: int) -> Int32:
    """sort_plan.swizzle on the device (only for m > 4 bits)."""
    fold = e >> 4
    for shift in range(8, m, 4):
        fold = fold ^ (e >> shift)
    return e ^ (fold & 15)


@cute.jit
def _streamed_key(cand: cute.Tensor, w: Int32, row: Int32, c: Int32) -> Int64:
    """Streaming variants: cand[w, row, c], key 0 past the segment's end."""
    key = Int64(0)
    if c < cand.shape[2]:
        key = cand[w, row, c]
    return key


@cute.jit
def _count_digit(key: Int64, mask: Int64, prefix: Int64,
                 shift: cutlass.Constexpr[int], s_hist: cute.Tensor):
    """Step 1 for one key: if the key is nonzero and ``key & mask == prefix``, count its
    digit ``(key >> shift) & 255``; returns whether it did. Key 0 (an invalid candidate,
    or no candidate) is never selected. The shared atomic increment adds the lanes of a
    warp that hit one bin at once (ATOMS.POPC.INC), so tied rows do not serialize on
    their bin."""
    hit = (key != 0) & ((key & mask) == prefix)
    if cutlass.const_expr(shift == 64 - RADIX_BITS):
        # The first pass counts every nonzero key: no branch around the increment, key 0
        # goes to the word after the bins (the first copy word, which the first pass's
        # histogram does not use: it is reset before that histogram tracks copies).
        digit = Int32(cutlass.select_(hit, Int32(key >> shift) & (NUM_BINS - 1),
                                      Int32(NUM_BINS)))
        cute.arch.atomic_add((s_hist.iterator + digit).llvm_ptr, Int32(1))
    else:
        if hit:
            digit = Int32((key >> shift) & (NUM_BINS - 1))
            cute.arch.atomic_add((s_hist.iterator + digit).llvm_ptr, Int32(1))
    return hit


@cute.jit
def _count_and_track(key: Int64, mask: Int64, prefix: Int64, shift: cutlass.Constexpr[int],
                     s_hist: cute.Tensor, acc_and: Int64, acc_or: Int64):
    """_count_digit, and the counted key folded into this thread's running AND / OR of
    the counted keys (see _merge_copy_words)."""
    hit = _count_digit(key, mask, prefix, shift, s_hist)
    return (Int64(cutlass.select_(hit, acc_and & key, acc_and)),
            Int64(cutlass.select_(hit, acc_or | key, acc_or)))


@cute.jit
def _merge_copy_words(acc_and: Int64, acc_or: Int64, lane: Int32, rank: Int32,
                      s_hist: cute.Tensor, pair: cutlass.Constexpr[bool]):
    """The AND and the OR of every key a pass counts, in the four words after the bins
    (COPY_WORDS: AND high, AND low, OR high, OR low): the counted keys are all copies of
    one key exactly when the two are equal. One warp reduction per word, then one shared
    atomic per word from lane 0 of a warp that counted a key (a counted key is nonzero);
    in a pair into both CTAs' words, so that each reads the row's from its own."""
    words = [Int32(acc_and >> 32), Int32(acc_and), Int32(acc_or >> 32), Int32(acc_or)]
    words = [cute.arch.warp_redux_sync(w, "and" if i < 2 else "or") for i, w in enumerate(words)]
    if lane == 0:
        if (words[2] | words[3]) != 0:
            for i in cutlass.range_constexpr(COPY_WORDS):
                op = "and" if i < 2 else "or"
                ptr = (s_hist.iterator + (NUM_BINS + i)).llvm_ptr
                if cutlass.const_expr(i < 2):
                    cute.arch.atomic_and(ptr, words[i])
                else:
                    cute.arch.atomic_or(ptr, words[i])
                if cutlass.const_expr(pair):
                    _asm(None, [_cluster_addr(s_hist, NUM_BINS + i, rank ^ 1), words[i]],
                         f"red.shared::cluster.{op}.b32 [$0], $1;", "r,r")


@cute.jit
def _reset_histogram(s_hist: cute.Tensor, tidx: Int32):
    """Zero the bins, and set the copy words to the identities of AND (all ones) and OR."""
    if tidx < NUM_BINS + COPY_WORDS:
        s_hist[tidx] = Int32(cutlass.select_((tidx >= NUM_BINS) & (tidx < NUM_BINS + 2),
                                             Int32(-1), Int32(0)))


@cute.jit
def _warp_slots(count: Int32, lane: Int32, s_ctl: cute.Tensor,
                pair: cutlass.Constexpr[bool]) -> Int32:
    """First of `count` consecutive gather slots for this warp (one shared atomic on
    s_ctl[3] by lane 0; CTA 0's with `pair`), broadcast to the warp."""
    base = Int32(0)
    if lane == 0:
        if count != 0:
            if cutlass.const_expr(pair):
                base = _cluster_add_i32(_cluster_addr(s_ctl, 3, Int32(0)), count)
            else:
                base = cute.arch.atomic_add((s_ctl.iterator + 3).llvm_ptr, count)
    return cute.arch.shuffle_sync(base, 0)


@cute.jit
def _store_flipped(hit: Int32, s_keys: cute.Tensor, slot: Int32, key: Int64):
    if hit != 0:
        s_keys[slot] = key ^ Int64(SIGN_BIT)


@cute.jit
def _store_split(hit: Int32, s_keys: cute.Tensor, i: Int32, key: Int64,
                 half_bits: cutlass.Constexpr[int]):
    """Gather slot i of a pair: CTA i >> half_bits holds it (CTA 1 negated, see
    _pair_sort), at its index within the half."""
    if hit != 0:
        target = i >> half_bits
        flipped = key ^ Int64(SIGN_BIT)
        value = Int64(cutlass.select_(target != 0, ~flipped, flipped))
        local = i & ((1 << half_bits) - 1)
        _cluster_store_i64(_cluster_addr(s_keys, local, target), value)


def _gather(keys, floor: Int64, lane: Int32, lanes_below: Int32, s_keys: cute.Tensor,
            s_ctl: cute.Tensor, m: int, pair: bool = False):
    """Step 2 for a few keys per thread (all 32 lanes of each warp call it together):
    every key above `floor` (unsigned) goes to the next free slot of the gather buffer
    (top bit flipped). One shared atomic per warp for all of these keys. The slots are
    filled in no particular order, so they need no swizzle: the sort reads element e from
    slot swizzle(e), which is just another order of the same keys."""
    lowest = floor ^ Int64(SIGN_BIT)  # signed compare of flipped values = unsigned
    hits, ballots = [], []
    count = Int32(0)
    for key in keys:
        above = (key ^ Int64(SIGN_BIT)) > lowest
        hit = Int32(cutlass.select_(above, Int32(1), Int32(0)))
        ballot = cute.arch.vote_ballot_sync(above)
        hits.append(hit)
        ballots.append(ballot)
        count = count + cute.arch.popc(ballot)
    base = _warp_slots(count, lane, s_ctl, pair)
    for key, hit, ballot in zip(keys, hits, ballots):
        if pair:
            _store_split(hit, s_keys, base + cute.arch.popc(ballot & lanes_below), key, m - 1)
        else:
            _store_flipped(hit, s_keys, base + cute.arch.popc(ballot & lanes_below), key)
        base = base + cute.arch.popc(ballot)


@cute.jit
def _write_gid(out: cute.Tensor, row: Int32, pos: Int32, k: Int32, sel_eff: Int32,
               flipped: Int64):
    """Step 4 for one sorted slot: out[row, pos] (if pos < k) = gid, or -1 past sel_eff."""
    if pos < k:
        gid = Int32(-1)
        if pos < sel_eff:
            gid = Int32(~(flipped ^ Int64(SIGN_BIT)))  # low 32 bits of ~key
        out[row, pos] = gid


def _deposit(tidx: Int32, layout: sort_plan.Layout) -> Int32:
    """Element index bits of thread `tidx` in `layout` (its register bits zero)."""
    e = Int32(0)
    for s, w, d in layout.thread_runs():
        e = e | (((tidx >> s) & ((1 << w) - 1)) << d)
    return e


def _register_sort(tidx: Int32, bufs, m: int, log_r: int, num_sorters: int, out: cute.Tensor,
                   row: Int32, k: Int32, sel_eff: Int32):
    """Steps 3 and 4, run by threads ``tidx < num_sorters`` only (plain Python: traced
    once, fully unrolled). ``bufs[0]`` holds the gathered keys in any order;
    windows alternate between the buffers (or reuse one with an extra barrier)."""
    x, _, e_base, e_reg = _sort_windows(tidx, bufs, m, log_r, num_sorters,
                                        sort_plan.plan_windows(m, log_r),
                                        lambda slots: [bufs[0][s] for s in slots])
    for r in range(1 << log_r):  # the last window's layout
        _write_gid(out, row, e_base | e_reg[r], k, sel_eff, x[r])


def _pair_sort(tidx: Int32, bufs, rank: Int32, m: int, log_r: int, num_sorters: int,
               out: cute.Tensor, row: Int32, k: Int32, sel_eff: Int32):
    """Steps 3 and 4 of a CTA pair, by threads ``tidx < num_sorters`` of both CTAs (the
    other threads take part in the two cluster barriers only). CTA r holds the gather
    slots ``r * H .. r * H + H - 1`` (``H = 2^(m-1)``), CTA 1 bitwise negated, which
    reverses the order: both sort their half descending, so CTA 1's ends ascending in
    the keys and the two halves form a bitonic sequence. The compare-exchange of the
    network's last level across the halves goes through distributed shared memory (CTA
    0 keeps the larger key of each pair, CTA 1 the smaller); each CTA then finishes the
    level on its half and writes output positions ``r * H ...``."""
    half = m - 1
    # The exchange buffer (bufs[2]) is read by the peer: nothing overwrites it later.
    xbuf = bufs[2]
    bufs = bufs[:2]
    x, slots, _, _ = _sort_windows(tidx, bufs, half, log_r, num_sorters,
                                   sort_plan.plan_windows(half, log_r),
                                   lambda slots: [bufs[0][s] for s in slots])
    for r in range(1 << log_r):
        xbuf[slots[r]] = Int64(cutlass.select_(rank != 0, ~x[r], x[r]))
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()

    def exchange(slots):
        kept = []
        for s in slots:
            own = xbuf[s]
            peer = _cluster_load_i64(_cluster_addr(xbuf, s, rank ^ 1))
            lower = own < peer
            larger = Int64(cutlass.select_(lower, peer, own))
            smaller = Int64(cutlass.select_(lower, own, peer))
            kept.append(Int64(cutlass.select_(rank == 0, larger, smaller)))
        return kept

    x, _, e_base, e_reg = _sort_windows(tidx, bufs, half, log_r, num_sorters,
                                        sort_plan.plan_windows(half, log_r,
                                                               sort_plan.merge_stages(half)),
                                        exchange)
    cute.arch.cluster_arrive()  # this CTA is done reading the peer's exchange buffer
    for r in range(1 << log_r):
        _write_gid(out, row, (rank << half) + (e_base | e_reg[r]), k, sel_eff, x[r])
    cute.arch.cluster_wait()  # the peer is done reading ours: shared memory may go


def _sort_windows(tidx: Int32, bufs, m: int, log_r: int, num_sorters: int, windows,
                  load_first):
    """The register network of `windows` over 2^m slots; the first window's keys come
    from ``load_first(slots)``, later windows exchange through ``bufs[0]`` and
    ``bufs[1]``. Returns the keys, their slots, and the element index parts of the last
    window's layout."""
    regs = 1 << log_r
    x = slots = None
    for wi, win in enumerate(windows):
        lay = win.layout
        src = bufs[wi % len(bufs)]
        if wi > 0:  # the previous window's keys go out at their own slots
            # When every warp keeps its elements (the same element bits behind the warp
            # bits), a warp only exchanges keys with itself: a warp barrier orders it.
            # That also covers the buffer's reuse: its last readers were the same warps
            # (or a CTA-wide barrier lies in between).
            if sort_plan.warp_local(windows[wi - 1].layout, lay):
                sync = cute.arch.sync_warp
            else:
                def sync():
                    cute.arch.barrier(barrier_id=SORT_BARRIER, number_of_threads=num_sorters)
            if len(bufs) == 1:  # the readers of the last window are done: overwrite
                sync()
            for r in range(regs):
                src[slots[r]] = x[r]
            sync()
        e_base = _deposit(tidx, lay)
        e_reg = [lay.element(0, r) for r in range(regs)]
        slot_base = _swizzle(e_base, m)  # the swizzle is xor-linear
        slots = [slot_base ^ sort_plan.swizzle(e, m) for e in e_reg]
        x = load_first(slots) if wi == 0 else [src[slots[r]] for r in range(regs)]
        ascending = {}  # runtime direction per level: bit L of the thread's elements
        for L, j in win.stages:
            ri = lay.reg_bits.index(j)
            if L < m and L not in lay.reg_bits and L not in ascending:
                ascending[L] = ((e_base >> L) & 1) != 0
            for r in range(regs):
                if (r >> ri) & 1:
                    continue
                r2 = r | (1 << ri)
                a, b = x[r], x[r2]
                if L == m:
                    swap = a < b
                elif L in lay.reg_bits:
                    swap = a < b if not (e_reg[r] >> L) & 1 else b < a
                else:
                    swap = (a < b) != ascending[L]  # equal keys may swap: no change
                x[r] = Int64(cutlass.select_(swap, b, a))
                x[r2] = Int64(cutlass.select_(swap, a, b))
    return x, slots, e_base, e_reg


@cute.jit
def _load_keys(cand: cute.Tensor, row: Int32, tidx: Int32, seg: Int32, chunk: Int32,
               count: Int32, n: cutlass.Constexpr[int], nt: cutlass.Constexpr[int]):
    """Load: the keys of ``n`` consecutive (segment, block-wide chunk) pairs from pair
    (seg, chunk), the first ``count`` of them real; key j of thread t is
    ``cand[w, row, c0 + t]`` of the j-th pair (w, c0 = chunk * nt), key 0 past the segment
    or past ``count``. The offset moves from pair to pair by one of two steps (to the next
    chunk, or from a segment's last chunk to the next segment's first); each load is
    predicated, so they all go out back to back."""
    seg_stride, row_stride, col_stride = cand.stride
    seg_len = cand.shape[2]
    chunks = (seg_len + (nt - 1)) // nt
    step = Int64(nt) * col_stride
    wrap_step = seg_stride - Int64(chunks - 1) * step
    off = (Int64(row) * row_stride + Int64(seg) * seg_stride
           + Int64(chunk * nt + tidx) * col_stride)
    lim = seg_len - chunk * nt  # this pair's columns left from its first
    keys = []
    for j in cutlass.range_constexpr(n):
        key = Int64(0)
        if (tidx < lim) & (count > j):
            key = cute.make_tensor(cand.iterator + off, cute.make_layout(1))[0]
        keys.append(key)
        if cutlass.const_expr(j + 1 < n):
            last = chunk == chunks - 1
            off = off + Int64(cutlass.select_(last, wrap_step, step))
            lim = Int32(cutlass.select_(last, seg_len, lim - nt))
            chunk = Int32(cutlass.select_(last, Int32(0), chunk + 1))
    return keys


@cute.jit
def _count_keys(cand: cute.Tensor, regs, row: Int32, tidx: Int32, lane: Int32, mask: Int64,
                prefix: Int64, shift: cutlass.Constexpr[int], s_hist: cute.Tensor,
                nt: cutlass.Constexpr[int], items: cutlass.Constexpr[int],
                rank: Int32, pair: cutlass.Constexpr[bool],
                tracking: cutlass.Constexpr[bool]):
    """Step 1 over the row (``regs``, or streamed from ``cand`` when empty); ``tracking``:
    also the AND / OR of the counted keys (_merge_copy_words)."""
    acc_and = Int64(-1)
    acc_or = Int64(0)
    if cutlass.const_expr(items > 0):
        for jr in cutlass.range_constexpr(items):
            if cutlass.const_expr(tracking):
                acc_and, acc_or = _count_and_track(regs[jr], mask, prefix, shift, s_hist,
                                                   acc_and, acc_or)
            else:
                _count_digit(regs[jr], mask, prefix, shift, s_hist)
    else:
        for w in cutlass.range(cand.shape[0]):
            for c0 in cutlass.range(0, cand.shape[2], nt):
                key = _streamed_key(cand, w, row, c0 + tidx)
                if cutlass.const_expr(tracking):
                    acc_and, acc_or = _count_and_track(key, mask, prefix, shift, s_hist,
                                                       acc_and, acc_or)
                else:
                    _count_digit(key, mask, prefix, shift, s_hist)
    if cutlass.const_expr(tracking):
        _merge_copy_words(acc_and, acc_or, lane, rank, s_hist, pair)


@cute.jit
def _unsigned_greater(a: Int64, b: Int64):
    """a > b with both read as unsigned 64-bit keys."""
    return (a ^ Int64(SIGN_BIT)) > (b ^ Int64(SIGN_BIT))


@cute.jit
def _resolve_small_bin(regs, mask: Int64, prefix: Int64, need: Int32, bucket: Int32,
                       tidx: Int32, lane: Int32, s_small: cute.Tensor, s_ctl: cute.Tensor,
                       items: cutlass.Constexpr[int]):
    """Default order, register variants: the select's bin (the ``bucket`` nonzero keys
    with ``key & mask == prefix``, at most RESOLVE_KEYS) holds the ``need``-th largest key
    but is not taken whole. Its keys are gathered into ``s_small`` (one shared atomic per
    register slot of a warp that holds one of them), and warp 0 ranks them (a key against
    every other by shuffles) to find the threshold key ``t``: ``above`` bin keys are
    greater than it and ``c`` are copies of it, with ``above < need <= above + c``. Returns ``(t, need - above, c)``:
    the top keys are every key ``>= t`` when ``need - above == c``, else the keys ``> t``
    and ``need - above`` of its ``c`` copies. This replaces the one or more counting
    passes over the whole row that would split the bin further (a copied key takes two)."""
    lanes_below = Int32(cute.arch.lanemask_lt())
    for j in cutlass.range_constexpr(items):
        key = regs[j]
        hit = (key != 0) & ((key & mask) == prefix)
        ballot = cute.arch.vote_ballot_sync(hit)
        if ballot != 0:
            base = _warp_slots(cute.arch.popc(ballot), lane, s_ctl, False)
            if hit:
                s_small[base + cute.arch.popc(ballot & lanes_below)] = key
    cute.arch.sync_threads()
    if tidx < 32:
        mine = Int64(0)  # key 0 is below every bin key and equal to none
        if lane < bucket:
            mine = s_small[lane]
        greater = Int32(0)
        equal = Int32(0)
        # Lanes from `bucket` on hold key 0, which counts for no bin key: the loop may
        # read past the bin in steps of RANK_UNROLL independent shuffles.
        for i0 in cutlass.range(0, bucket, RANK_UNROLL):
            for u in cutlass.range_constexpr(RANK_UNROLL):
                other = cute.arch.shuffle_sync(mine, i0 + u)
                greater = greater + Int32(cutlass.select_(_unsigned_greater(other, mine),
                                                          Int32(1), Int32(0)))
                equal = equal + Int32(cutlass.select_(other == mine, Int32(1), Int32(0)))
        is_threshold = (lane < bucket) & (greater < need) & (need <= greater + equal)
        ballot = cute.arch.vote_ballot_sync(is_threshold)
        first = cute.arch.popc((ballot & (Int32(0) - ballot)) - Int32(1))
        threshold = cute.arch.shuffle_sync(mine, first)
        above = cute.arch.shuffle_sync(greater, first)
        copies = cute.arch.shuffle_sync(equal, first)
        cute.arch.sync_warp()  # every lane has read its s_small slot
        if lane == 0:
            s_small[0] = threshold
            s_ctl[1] = above
            s_ctl[2] = copies
    cute.arch.sync_threads()
    return s_small[0], need - s_ctl[1], s_ctl[2]


@cute.jit
def _radix_select(cand: cute.Tensor, regs, row: Int32, tidx: Int32, lane: Int32,
                  rank: Int32, sel: Int32, s_hists, s_ctl: cute.Tensor, s_small,
                  nt: cutlass.Constexpr[int], items: cutlass.Constexpr[int],
                  pair: cutlass.Constexpr[bool], sort_size: cutlass.Constexpr[int],
                  resolvable: cutlass.Constexpr[bool]):
    """Radix select over the row's nonzero keys (``regs``, or streamed from ``cand`` when
    empty). Returns ``(prefix, sel_eff, need, bucket, copies)``: the top ``sel_eff`` keys
    are the ``sel_eff - need`` keys whose digits so far exceed ``prefix`` plus ``need`` of
    the ``bucket`` keys that match it; ``copies`` is 1 if those ``bucket`` keys are all
    copies of the key ``prefix`` (all 8 passes ran, or a pass found them equal). Stop:
    the bin is taken whole (``sort_size == 0``, the default order) or the candidates fit
    the sort, or the bin holds copies of one key. With ``resolvable`` (the default order
    of the kinds in variants._RESOLVING) the select also stops once the bin holds at most
    RESOLVE_KEYS keys, and one warp resolves it (_resolve_small_bin: ``prefix`` is then
    the full threshold key)."""
    num_hists = 3 if pair else 2  # variants.histograms
    prefix = Int64(0)
    mask = Int64(0)
    sel_eff = sel  # min(sel, nonzero keys), set by the first pass
    need = sel
    bucket = Int32(0)
    prev_bucket = Int32(-1)  # the bin before the last
    running = Int32(1)
    copies = Int32(0)
    for p in cutlass.range_constexpr(NUM_PASSES):
        shift = 64 - RADIX_BITS * (p + 1)
        s_hist = s_hists[p % num_hists]
        # Whether the keys a pass counts (the last pass's bin) are copies of one key,
        # which no pass can split (all 64 bits would be used), is tracked after a pass
        # that did not split the bin (many copies, or two), so that the passes over large
        # bins pay nothing; and, by the default order and by pairs (whose passes each
        # cost a cluster barrier), already once the bin is small (a few copies). A
        # single CTA's sort gains less from that early stop than the tracking of its last
        # small bins costs (H200, sorting, 1024 rows W = 8: 145.9 against 141.9 us; 64
        # rows k = 512: 7.5 against 7.2); a pair's gains (1 row W = 4: 12.8 against 13.7).
        track = p >= 1
        unsplit = bucket == prev_bucket
        if cutlass.const_expr(sort_size == 0 or pair):
            unsplit = unsplit | (bucket <= TRACK_BELOW)
        tracking = Int32(cutlass.select_(unsplit, Int32(1), Int32(0)))
        if running != 0:
            # This pass counts into s_hist (reset before the last barrier) and resets the
            # next one, whose last readers (this CTA's scan two passes ago; in a pair also
            # the peer's, which precedes the peer's last cluster barrier) are done.
            if cutlass.const_expr(p + 1 < NUM_PASSES):
                _reset_histogram(s_hists[(p + 1) % num_hists], tidx)
            if cutlass.const_expr(track):
                if tracking != 0:
                    _count_keys(cand, regs, row, tidx, lane, mask, prefix, shift, s_hist,
                                nt, items, rank, pair, True)
                else:
                    _count_keys(cand, regs, row, tidx, lane, mask, prefix, shift, s_hist,
                                nt, items, rank, pair, False)
            else:
                _count_keys(cand, regs, row, tidx, lane, mask, prefix, shift, s_hist, nt,
                            items, rank, pair, False)
            if cutlass.const_expr(pair):  # both halves of the row are counted
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
            else:
                cute.arch.sync_threads()
            if cutlass.const_expr(track):
                # Every thread reads the same words: the stop is uniform (across a pair).
                if tracking != 0:
                    words = [s_hist[NUM_BINS + i] for i in range(COPY_WORDS)]
                    if (words[0] == words[2]) & (words[1] == words[3]):
                        prefix = ((Int64(words[0]) << 32)
                                  | (Int64(words[1]) & Int64(0xFFFFFFFF)))
                        copies = Int32(1)
                        running = Int32(0)
        if running != 0:
            if tidx < 32:
                # Lane l owns bins 255-8l .. 248-8l (descending): an inclusive scan over
                # lanes counts the keys in all higher bins.
                per_lane = NUM_BINS // 32
                counts = [s_hist[NUM_BINS - 1 - per_lane * lane - j] for j in range(per_lane)]
                if cutlass.const_expr(pair):  # plus the peer CTA's histogram
                    counts = [counts[j] + _cluster_load_i32(_cluster_addr(
                                  s_hist, NUM_BINS - 1 - per_lane * lane - j, rank ^ 1))
                              for j in range(per_lane)]
                lane_sum = Int32(0)
                for j in cutlass.range_constexpr(per_lane):
                    lane_sum = lane_sum + counts[j]
                incl = _warp_inclusive_scan(lane_sum, lane)
                run = incl - lane_sum
                need_scan = need
                if cutlass.const_expr(p == 0):
                    # Only nonzero keys were counted: select min(sel, their count);
                    # positions past it decode key 0 anyway (-1).
                    total = cute.arch.shuffle_sync(incl, 31)
                    need_scan = cutlass.min(need, total)
                    if lane == 0:
                        s_ctl[5] = need_scan
                        if need_scan == 0:  # no nonzero key: an empty selection
                            s_ctl[0] = Int32(0)
                            s_ctl[1] = Int32(0)
                            s_ctl[2] = Int32(0)
                if run < need_scan:
                    if need_scan <= incl:
                        found = Int32(0)
                        for j in cutlass.range_constexpr(per_lane):
                            if found == 0:
                                if run + counts[j] >= need_scan:
                                    s_ctl[0] = NUM_BINS - 1 - per_lane * lane - j
                                    s_ctl[1] = run
                                    s_ctl[2] = counts[j]
                                    found = Int32(1)
                            run = run + counts[j]
            cute.arch.sync_threads()
            digit_sel = s_ctl[0]
            above = s_ctl[1]
            prev_bucket = bucket
            bucket = s_ctl[2]
            if cutlass.const_expr(p == 0):
                sel_eff = s_ctl[5]
                need = sel_eff
            prefix = prefix | (Int64(digit_sel) << shift)
            mask = Int64(_as_int64(((1 << (RADIX_BITS * (p + 1))) - 1) << shift))
            need = need - above
            if cutlass.const_expr(sort_size == 0):
                # The default order writes every key with key & mask > prefix and the whole
                # bin, so it needs the bin taken whole (or copies of one key).
                if bucket == need:
                    running = Int32(0)
                if cutlass.const_expr(resolvable):
                    if bucket <= RESOLVE_KEYS:
                        running = Int32(0)
            else:
                # Every key with key & mask >= prefix (the keys above the bin plus the whole
                # bin) fits the sort: the top sel_eff of those are the answer. An exact hit
                # (bucket == need) always fits.
                if (sel_eff - need) + bucket <= sort_size:
                    running = Int32(0)
    if cutlass.const_expr(resolvable):
        # Stopped with the bin neither taken whole nor found to be copies: a small bin.
        if (bucket != need) & (copies == 0) & (running == 0):
            prefix, need, bucket = _resolve_small_bin(regs, mask, prefix, need, bucket, tidx,
                                                      lane, s_small, s_ctl, items)
            copies = Int32(cutlass.select_(bucket != need, Int32(1), Int32(0)))
    # Still running after all 64 bits: the bin holds copies of the key prefix.
    return prefix, sel_eff, need, bucket, copies | running


@cute.jit
def _warp_inclusive_scan(value: Int32, lane: Int32) -> Int32:
    for s in cutlass.range_constexpr(5):
        off = 1 << s
        v = cute.arch.shuffle_sync_up(value, offset=off)
        if lane >= off:
            value = value + v
    return value


@cute.jit
def _block_scan(entries, lane: Int32, warp: Int32, s_counts: cute.Tensor,
                s_bases: cute.Tensor, s_ctl: cute.Tensor, n: cutlass.Constexpr[int],
                nw: cutlass.Constexpr[int]):
    """Exclusive scan of one int32 per (register j, warp) in position order (j, then warp):
    lane 0 of each warp stores its ``entries``; warp 0 scans them, each lane a run of
    consecutive ones, into ``s_bases`` and the block total into the control words."""
    if lane == 0:
        for j in cutlass.range_constexpr(n):
            s_counts[j * nw + warp] = entries[j]
    cute.arch.sync_threads()
    if warp == 0:
        per_lane = n * nw // 32
        vals = [s_counts[lane * per_lane + e] for e in range(per_lane)]
        lane_sum = Int32(0)
        for e in cutlass.range_constexpr(per_lane):
            lane_sum = lane_sum + vals[e]
        incl = _warp_inclusive_scan(lane_sum, lane)
        run = incl - lane_sum
        for e in cutlass.range_constexpr(per_lane):
            s_bases[lane * per_lane + e] = run
            run = run + vals[e]
        if lane == 31:
            s_ctl[CTL_SCAN_TOTAL] = incl
    cute.arch.sync_threads()


@cute.jit
def _classify(key: Int64, prefix: Int64):
    """(above the threshold, a copy of it) for one key; see _write_block_with_copies."""
    return _unsigned_greater(key, prefix), key == prefix


def _row_of(out: cute.Tensor, row: Int32) -> cute.Tensor:
    """out[row, :] as a 1-D tensor (its address computed once)."""
    return cute.make_tensor(out.iterator + Int64(row) * out.stride[0],
                            cute.make_layout(out.shape[1], stride=out.stride[1]))


@cute.jit
def _write_block(keys, floor: Int64, above_base: Int32, from_end, above_row: Int32,
                 out_row: cute.Tensor, lane: Int32, warp: Int32, lanes_below: Int32,
                 s_counts: cute.Tensor, s_bases: cute.Tensor, s_ctl: cute.Tensor,
                 n: cutlass.Constexpr[int], nw: cutlass.Constexpr[int]) -> Int32:
    """Write, when the select stopped on a whole bin: every key ``>= floor`` (unsigned;
    ``floor`` is the prefix, or 1 so that key 0 is never taken) of one block of
    (register, thread) positions goes to ``out_row`` at the count of such keys before it,
    in position order; the count before the block is ``above_base``, or with
    ``from_end`` (CTA 1 of a pair) the row's ``above_row`` minus this block's. One ballot
    a key, twice. Returns the block's count."""
    lowest = floor ^ Int64(SIGN_BIT)  # signed compare of flipped values = unsigned
    entries = [cute.arch.popc(cute.arch.vote_ballot_sync((keys[j] ^ Int64(SIGN_BIT)) >= lowest))
               for j in range(n)]
    _block_scan(entries, lane, warp, s_counts, s_bases, s_ctl, n, nw)
    total = s_ctl[CTL_SCAN_TOTAL]
    if from_end:
        above_base = above_row - total
    for j in cutlass.range_constexpr(n):
        # Compared again rather than kept across the scan: fewer live registers.
        taken = (keys[j] ^ Int64(SIGN_BIT)) >= lowest
        before = s_bases[j * nw + warp] + cute.arch.popc(
            cute.arch.vote_ballot_sync(taken) & lanes_below)
        if taken:
            out_row[above_base + before] = Int32(~keys[j])
    return total


@cute.jit
def _write_block_with_copies(keys, prefix: Int64, need: Int32, above_base: Int32,
                             copies_base: Int32, from_end, above_row: Int32,
                             copies_row: Int32, out_row: cute.Tensor, lane: Int32,
                             warp: Int32, lanes_below: Int32, s_counts: cute.Tensor,
                             s_bases: cute.Tensor, s_ctl: cute.Tensor,
                             n: cutlass.Constexpr[int], nw: cutlass.Constexpr[int]) -> Int32:
    """Write, when the select stopped on copies of the key ``prefix`` (all 64 bits used):
    as _write_block for the keys above it (``key > prefix``; the prefix is nonzero); a
    copy of it (``key == prefix``) is taken if fewer than ``need`` copies come before it.
    A taken key goes to ``keys above before it + min(copies before it, need)``; the counts
    before the block are ``above_base`` and ``copies_base``, or with ``from_end`` the row's
    ``above_row`` / ``copies_row`` minus this block's. Both counts of a warp travel in one
    int32 (copies in the high half: a block holds < 2^16 keys). Returns the block's packed
    total."""
    entries = []
    for j in cutlass.range_constexpr(n):
        is_above, is_copy = _classify(keys[j], prefix)
        entries.append(cute.arch.popc(cute.arch.vote_ballot_sync(is_above))
                       + (cute.arch.popc(cute.arch.vote_ballot_sync(is_copy)) << COPIES_SHIFT))
    _block_scan(entries, lane, warp, s_counts, s_bases, s_ctl, n, nw)
    total = s_ctl[CTL_SCAN_TOTAL]
    if from_end:
        above_base = above_row - (total & ((1 << COPIES_SHIFT) - 1))
        copies_base = copies_row - (total >> COPIES_SHIFT)
    for j in cutlass.range_constexpr(n):
        is_above, is_copy = _classify(keys[j], prefix)
        ballot_a = cute.arch.vote_ballot_sync(is_above)
        ballot_c = cute.arch.vote_ballot_sync(is_copy)
        before = (s_bases[j * nw + warp] + cute.arch.popc(ballot_a & lanes_below)
                  + (cute.arch.popc(ballot_c & lanes_below) << COPIES_SHIFT))
        above_before = above_base + (before & ((1 << COPIES_SHIFT) - 1))
        copies_before = copies_base + (before >> COPIES_SHIFT)
        if is_above | (is_copy & (copies_before < need)):
            out_row[above_before + cutlass.min(copies_before, need)] = Int32(~keys[j])
    return total


@cute.jit
def _write_in_position_order(cand: cute.Tensor, out: cute.Tensor, regs, row: Int32,
                             tidx: Int32, lane: Int32, rank: Int32, prefix: Int64,
                             sel_eff: Int32, need: Int32, bucket: Int32, copies: Int32,
                             s_counts: cute.Tensor, s_bases: cute.Tensor, s_ctl: cute.Tensor,
                             nt: cutlass.Constexpr[int], items: cutlass.Constexpr[int],
                             pair: cutlass.Constexpr[bool]):
    """Default order: the ids of the top ``sel_eff`` keys in position order, then -1. The
    select stopped on a whole bin (every key ``>= prefix`` is taken: one ballot a key) or,
    rarely, on copies of one key (_write_block_with_copies)."""
    nw = nt // 32
    warp = tidx // 32
    lanes_below = Int32(cute.arch.lanemask_lt())
    out_row = _row_of(out, row)
    from_end = rank != 0
    floor = Int64(cutlass.select_(prefix == 0, Int64(1), prefix))
    if cutlass.const_expr(items > 0):
        if copies == 0:
            if out.stride[1] == 1:  # the usual output: no 64-bit multiply per key
                _write_block(regs, floor, Int32(0), from_end, sel_eff,
                             cute.make_tensor(out_row.iterator, cute.make_layout(out.shape[1])),
                             lane, warp, lanes_below, s_counts, s_bases, s_ctl, items, nw)
            else:
                _write_block(regs, floor, Int32(0), from_end, sel_eff, out_row, lane, warp,
                             lanes_below, s_counts, s_bases, s_ctl, items, nw)
        else:
            _write_block_with_copies(regs, prefix, need, Int32(0), Int32(0), from_end,
                                     sel_eff - need, bucket, out_row, lane, warp,
                                     lanes_below, s_counts, s_bases, s_ctl, items, nw)
    else:
        # Streamed: groups of STREAM_GROUP chunks of one segment, with running counts.
        chunks = (cand.shape[2] + (nt - 1)) // nt
        above_before = Int32(0)
        copies_before = Int32(0)
        for w in cutlass.range(cand.shape[0]):
            for c0 in cutlass.range(0, chunks, STREAM_GROUP):
                keys = _load_keys(cand, row, tidx, w, c0, chunks - c0, STREAM_GROUP, nt)
                if copies == 0:
                    above_before = above_before + _write_block(
                        keys, floor, above_before, from_end, sel_eff, out_row, lane, warp,
                        lanes_below, s_counts, s_bases, s_ctl, STREAM_GROUP, nw)
                else:
                    total = _write_block_with_copies(
                        keys, prefix, need, above_before, copies_before, from_end,
                        sel_eff - need, bucket, out_row, lane, warp, lanes_below, s_counts,
                        s_bases, s_ctl, STREAM_GROUP, nw)
                    above_before = above_before + (total & ((1 << COPIES_SHIFT) - 1))
                    copies_before = copies_before + (total >> COPIES_SHIFT)
    step = nt * (2 if pair else 1)
    for i in cutlass.range(sel_eff + rank * nt + tidx, out.shape[1], step):
        out_row[i] = Int32(-1)


@cute.jit
def _gather_and_sort(cand: cute.Tensor, out: cute.Tensor, regs, row: Int32, tidx: Int32,
                     lane: Int32, rank: Int32, prefix: Int64, sel_eff: Int32, need: Int32,
                     bucket: Int32, copies: Int32, bufs, s_ctl: cute.Tensor,
                     nt: cutlass.Constexpr[int], items: cutlass.Constexpr[int],
                     sort_size: cutlass.Constexpr[int],
                     log_r: cutlass.Constexpr[int], pair: cutlass.Constexpr[bool],
                     ctas_per_sm: cutlass.Constexpr[int]):
    """sorted=True: gather the candidates, pad the sort, sort, decode and write."""
    S = sort_size
    m = S.bit_length() - 1
    num_sorters = S >> log_r
    k = out.shape[1]
    s_keys = bufs[0]
    lanes_below = Int32(cute.arch.lanemask_lt())
    # Stopped: gather every key with key & mask >= prefix (n_cand of them). All 64 bits
    # used (copies): the ``need`` keys taken from the bin all equal the prefix, so gather
    # the keys above it and write ``need`` copies of the prefix.
    num_above = sel_eff - need
    n_cand = num_above + bucket
    if copies != 0:
        n_cand = sel_eff
    fill_from = cutlass.select_(copies != 0, num_above, n_cand)
    if cutlass.const_expr(pair):  # each CTA fills its half of the slots (see _pair_sort)
        half_lo = rank * (S // 2)
        for i in cutlass.range(cutlass.max(fill_from, half_lo) + tidx, half_lo + S // 2, nt):
            flipped = Int64(cutlass.select_(i < n_cand, prefix ^ Int64(SIGN_BIT),
                                            Int64(SIGN_BIT)))
            s_keys[i - half_lo] = Int64(cutlass.select_(rank != 0, ~flipped, flipped))
    else:
        for i in cutlass.range(fill_from + tidx, S, nt):
            s_keys[i] = Int64(cutlass.select_(i < n_cand, prefix ^ Int64(SIGN_BIT),
                                              Int64(SIGN_BIT)))
    # The gathered keys are those above `floor` (unsigned): key & mask >= prefix is
    # key >= prefix (the prefix has no bits outside the mask), and key 0 is never
    # gathered; with all 64 bits used, key > prefix. With nothing to gather (no nonzero
    # key, or all the keys taken are copies of the prefix) the sweep is skipped.
    floor = Int64(cutlass.select_(copies != 0, prefix,
                                  cutlass.select_(prefix == 0, prefix, prefix - 1)))
    if fill_from != 0:  # the gathered keys take slots 0 .. fill_from - 1
        if cutlass.const_expr(items > 0):
            for g0 in cutlass.range_constexpr(0, items, GATHER_GROUP):
                _gather(regs[g0:g0 + GATHER_GROUP], floor, lane, lanes_below, s_keys, s_ctl,
                        m, pair)
        else:
            for w in cutlass.range(cand.shape[0]):
                for c0 in cutlass.range(0, cand.shape[2], nt):
                    _gather([_streamed_key(cand, w, row, c0 + tidx)], floor, lane,
                            lanes_below, s_keys, s_ctl, m)
    if cutlass.const_expr(pair):  # CTA 1's keys have landed; it is done
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        cute.arch.sync_threads()
    if cutlass.const_expr(pair):
        if tidx < num_sorters // 2:
            halves = [s_keys, cute.make_tensor(s_keys.iterator + S // 2,
                                               cute.make_layout((S // 2,))), bufs[1]]
            _pair_sort(tidx, halves, rank, m, log_r, num_sorters // 2, out, row, k, sel_eff)
        else:  # the two cluster barriers of the sorting threads' exchange
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
    elif tidx < num_sorters:
        _register_sort(tidx, bufs, m, log_r, num_sorters, out, row, k, sel_eff)
    elif cutlass.const_expr(nt > num_sorters):
        # Idle during the sort: pull into L2 the row that this CTA's place likely runs
        # next (CTAs start in row order as places free up), so that with more rows than
        # places the next CTA's loads hit L2 (H200, W = 8 or streamed rows: -5 to -7% at
        # 1024 rows; W = 4 register rows: -0.3%).
        _prefetch_row(cand, row, _num_sms() * ctas_per_sm, tidx - num_sorters,
                      nt - num_sorters)
    if rank == 0:
        for i in cutlass.range(S + tidx, k, nt):  # k > S: slots past the sort
            out[row, i] = Int32(-1)


@cute.jit
def _fold_max(key: Int64, floor_f: Int64, acc: Int64) -> Int64:
    """The running maximum of the flipped keys above the flipped floor."""
    f = key ^ Int64(SIGN_BIT)
    return Int64(cutlass.select_(f > floor_f, cutlass.max(acc, f), acc))


@cute.jit
def _warp_max(v: Int64) -> Int64:
    for s in cutlass.range_constexpr(5):
        v = cutlass.max(v, cute.arch.shuffle_sync_bfly(v, offset=1 << (4 - s)))
    return v


@cute.jit
def _rank_bin(f: Int64, top: Int64, shift: Int32, nbins: cutlass.Constexpr[int]) -> Int32:
    """Bin of a flipped key: bits ``shift ..`` of its distance below the largest key, so
    larger keys take lower bins (the distance is below ``nbins << shift``; the arithmetic
    shift's sign bits are masked off)."""
    return Int32(((top - f) >> Int64(shift)) & (nbins - 1))


@cute.jit
def _bin_key(key: Int64, floor_f: Int64, top: Int64, shift: Int32, s_bins: cute.Tensor,
             s_keys: cute.Tensor, scatter: cutlass.Constexpr[bool],
             nbins: cutlass.Constexpr[int]):
    """Count a key above the floor in its bin, or (``scatter``) put it at its bin's next
    free slot of ``s_keys`` (flipped)."""
    f = key ^ Int64(SIGN_BIT)
    if f > floor_f:
        ptr = (s_bins.iterator + _rank_bin(f, top, shift, nbins)).llvm_ptr
        slot = cute.arch.atomic_add(ptr, Int32(1))
        if cutlass.const_expr(scatter):
            s_keys[slot] = f


@cute.jit
def _bin_row(cand: cute.Tensor, regs, row: Int32, tidx: Int32, floor_f: Int64, top: Int64,
             shift: Int32, s_bins: cute.Tensor, s_keys: cute.Tensor,
             scatter: cutlass.Constexpr[bool], nt: cutlass.Constexpr[int],
             items: cutlass.Constexpr[int], nbins: cutlass.Constexpr[int]):
    """_bin_key over the row (``regs``, or streamed from ``cand`` when empty)."""
    if cutlass.const_expr(items > 0):
        for j in cutlass.range_constexpr(items):
            _bin_key(regs[j], floor_f, top, shift, s_bins, s_keys, scatter, nbins)
    else:
        for w in cutlass.range(cand.shape[0]):
            for c0 in cutlass.range(0, cand.shape[2], nt):
                _bin_key(_streamed_key(cand, w, row, c0 + tidx), floor_f, top, shift, s_bins,
                         s_keys, scatter, nbins)


@cute.jit
def _scan_bins(s_bins: cute.Tensor, s_warp: cute.Tensor, s_ctl: cute.Tensor, tidx: Int32,
               lane: Int32, nt: cutlass.Constexpr[int], nbins: cutlass.Constexpr[int]):
    """The bin counts become their exclusive prefix sums (each thread a run of bins); the
    sum of their squares (each key's bin-mates, summed) goes to s_ctl[CTL_CROWD]."""
    per = max(1, nbins // nt)
    owners = nbins // per
    warp = tidx // 32
    vals = []
    for e in cutlass.range_constexpr(per):
        v = Int32(0)
        if tidx < owners:
            v = s_bins[tidx * per + e]
        vals.append(v)
    own = Int32(0)
    crowd = Int32(0)
    for e in cutlass.range_constexpr(per):
        own = own + vals[e]
        crowd = crowd + vals[e] * vals[e]
    incl = _warp_inclusive_scan(own, lane)
    if lane == 31:
        s_warp[warp] = incl
    crowd = cute.arch.warp_redux_sync(crowd, "add")
    if lane == 0:
        if crowd != 0:
            cute.arch.atomic_add((s_ctl.iterator + CTL_CROWD).llvm_ptr, crowd)
    cute.arch.sync_threads()
    total = Int32(0)
    if lane < nt // 32:
        total = s_warp[lane]
    warps_incl = _warp_inclusive_scan(total, lane)
    run = cute.arch.shuffle_sync(warps_incl - total, warp) + incl - own
    if tidx < owners:
        for e in cutlass.range_constexpr(per):
            s_bins[tidx * per + e] = run
            run = run + vals[e]
    cute.arch.sync_threads()


@cute.jit
def _sort_by_rank(cand: cute.Tensor, out: cute.Tensor, regs, row: Int32, tidx: Int32,
                  lane: Int32, prefix: Int64, sel_eff: Int32, need: Int32, bucket: Int32,
                  copies: Int32, s_keys: cute.Tensor, s_bins: cute.Tensor,
                  s_top: cute.Tensor, s_warp: cute.Tensor, s_ctl: cute.Tensor,
                  nt: cutlass.Constexpr[int], items: cutlass.Constexpr[int],
                  nbins: cutlass.Constexpr[int], log_r: cutlass.Constexpr[int]):
    """sorted=True: every key the select kept goes to its output position, its rank in
    descending order. The keys are binned by their distance below the largest one (a
    counting sort on ``log2(nbins)`` bits, taken from the top of the range they span) and
    a key's rank is its bin's start plus the keys of its bin above it (equal keys, copies
    of one candidate, by slot). A bin holds about one key unless keys crowd within
    ``2^shift`` of each other (many equal scores): its keys then compare with each other,
    and past CROWDED_BIN_MATES bin-mates a key on average the row takes the bitonic sort."""
    out_row = _row_of(out, row)
    k = out.shape[1]
    num_above = sel_eff - need
    n_sort = num_above + bucket  # every key & mask >= prefix, the select's candidates
    floor = Int64(cutlass.select_(prefix == 0, prefix, prefix - 1))
    if copies != 0:  # the need taken copies of the prefix go after the keys above it
        n_sort = num_above
        floor = prefix
    floor_f = floor ^ Int64(SIGN_BIT)
    m = nbins.bit_length() - 1  # log2 of the bins (and of the bitonic sort's slots)
    num_sorters = nbins >> log_r
    # The largest key (flipped: a signed maximum).
    top = Int64(SIGN_BIT)
    if cutlass.const_expr(items > 0):
        for j in cutlass.range_constexpr(items):
            top = _fold_max(regs[j], floor_f, top)
    else:
        for w in cutlass.range(cand.shape[0]):
            for c0 in cutlass.range(0, cand.shape[2], nt):
                top = _fold_max(_streamed_key(cand, w, row, c0 + tidx), floor_f, top)
    top = _warp_max(top)
    if lane == 0:
        s_top[tidx // 32] = top
    cute.arch.sync_threads()
    top = Int64(SIGN_BIT)
    if lane < nt // 32:
        top = s_top[lane]
    top = _warp_max(top)
    # The bins split the range [floor + 1, top] on its top log2(nbins) bits.
    span_bits = 64 - Int32(cute.arch.clz(top - (floor_f + 1)))
    shift = cutlass.max(span_bits - m, Int32(0))
    _bin_row(cand, regs, row, tidx, floor_f, top, shift, s_bins, s_keys, False, nt, items,
             nbins)
    cute.arch.sync_threads()
    _scan_bins(s_bins, s_warp, s_ctl, tidx, lane, nt, nbins)
    _bin_row(cand, regs, row, tidx, floor_f, top, shift, s_bins, s_keys, True, nt, items,
             nbins)
    if s_ctl[CTL_CROWD] > CROWDED_BIN_MATES * n_sort:  # uniform: read after the scan
        # Keys crowd into few bins (many equal scores): the bitonic sort, whose cost does
        # not depend on the keys, orders the S slots (the copies and key 0 as padding).
        for i in cutlass.range(n_sort + tidx, nbins, nt):
            s_keys[i] = Int64(cutlass.select_(i < sel_eff, prefix ^ Int64(SIGN_BIT),
                                              Int64(SIGN_BIT)))
        cute.arch.sync_threads()
        if tidx < num_sorters:
            _register_sort(tidx, [s_keys], m, log_r, num_sorters, out, row, k, sel_eff)
        for i in cutlass.range(nbins + tidx, k, nt):
            out_row[i] = Int32(-1)
    else:
        _write_ranks(out_row, k, prefix, sel_eff, num_above, n_sort, copies, top, shift,
                     s_keys, s_bins, tidx, nt, nbins)


@cute.jit
def _write_ranks(out_row: cute.Tensor, k: Int32, prefix: Int64, sel_eff: Int32,
                 num_above: Int32, n_sort: Int32, copies: Int32, top: Int64, shift: Int32,
                 s_keys: cute.Tensor, s_bins: cute.Tensor, tidx: Int32,
                 nt: cutlass.Constexpr[int], nbins: cutlass.Constexpr[int]):
    """Each binned key to its rank: its bin's start plus the keys of its bin above it."""
    cute.arch.sync_threads()
    # Bin d now spans slots s_bins[d - 1] .. s_bins[d] - 1 (its scatter moved each start
    # to the next bin's).
    for i in cutlass.range(tidx, n_sort, nt):
        f = s_keys[i]
        d = _rank_bin(f, top, shift, nbins)
        start = Int32(0)
        if d > 0:
            start = s_bins[d - 1]
        rank = start
        for j in cutlass.range(start, s_bins[d]):
            g = s_keys[j]
            rank = rank + Int32(cutlass.select_((g > f) | ((g == f) & (j < i)), Int32(1),
                                                Int32(0)))
        if rank < sel_eff:
            out_row[rank] = Int32(~(f ^ Int64(SIGN_BIT)))
    if copies != 0:
        for i in cutlass.range(num_above + tidx, sel_eff, nt):
            out_row[i] = Int32(~prefix)
    for i in cutlass.range(sel_eff + tidx, k, nt):
        out_row[i] = Int32(-1)


def make_stable_topk(v: variants.Variant):
    """Build the kernel and its host launcher for one variant (``variants.Variant``)."""
    NT = v.threads
    ITEMS = v.keys_per_thread
    PAIR = v.pair
    S = v.sort_size
    CTAS_PER_SM = v.ctas_per_sm
    LOG_R = v.log_r
    RANKED = v.ranked
    assert not RANKED or not PAIR
    assert NT % 32 == 0 and NT >= NUM_BINS + COPY_WORDS
    assert not PAIR or ITEMS > 0
    if v.sorted:
        assert S & (S - 1) == 0 and S >= 512
        assert (S >> LOG_R) % 32 == 0 and (S >> LOG_R) <= NT
        num_bufs = variants.sort_buffers(S)
    else:
        scan_n = variants.scan_entries(v)
        assert scan_n % 32 == 0
        # The scan packs two counts of a block into one int32: < 2^16 keys a block.
        assert (ITEMS or STREAM_GROUP) * NT < (1 << COPIES_SHIFT)
    num_hists = variants.histograms(PAIR)
    RESOLVE = v.resolves_small_bins  # the bin's keys come from this CTA's registers
    assert not RESOLVE or (ITEMS > 0 and not PAIR and RESOLVE_KEYS % RANK_UNROLL == 0)

    @cute.kernel
    def stable_topk_kernel(cand: cute.Tensor, out: cute.Tensor, sel: Int32):
        # Launched as a programmatic dependent launch: wait for the previous kernel in
        # the stream (and its writes), then let the next one start launching.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        row = block
        rank = Int32(0)
        if cutlass.const_expr(PAIR):
            row = block // 2
            rank = cute.arch.block_idx_in_cluster()
        lane = tidx % 32

        smem = cutlass.utils.SmemAllocator()
        s_small = None
        if cutlass.const_expr(RANKED):
            s_keys = smem.allocate_tensor(Int64, cute.make_layout((S,)), byte_alignment=16)
            s_bins = smem.allocate_tensor(Int32, cute.make_layout((S,)), byte_alignment=16)
            s_top = smem.allocate_tensor(Int64, cute.make_layout((32,)), byte_alignment=16)
        elif cutlass.const_expr(S > 0):
            bufs = [smem.allocate_tensor(Int64, cute.make_layout((S,)), byte_alignment=16)
                    for _ in range(num_bufs)]
        else:
            s_counts = smem.allocate_tensor(Int32, cute.make_layout((scan_n,)),
                                            byte_alignment=16)
            s_bases = smem.allocate_tensor(Int32, cute.make_layout((scan_n,)),
                                           byte_alignment=16)
            if cutlass.const_expr(RESOLVE):
                s_small = smem.allocate_tensor(Int64, cute.make_layout((RESOLVE_KEYS,)),
                                               byte_alignment=16)
        s_hists = [smem.allocate_tensor(Int32, cute.make_layout((NUM_BINS + COPY_WORDS,)),
                                        byte_alignment=16) for _ in range(num_hists)]
        s_ctl = smem.allocate_tensor(Int32, cute.make_layout((CTL_WORDS,)), byte_alignment=16)
        if tidx < CTL_WORDS:
            s_ctl[tidx] = Int32(0)
        if cutlass.const_expr(RANKED):
            for i in cutlass.range(tidx, S, NT):
                s_bins[i] = Int32(0)
        _reset_histogram(s_hists[0], tidx)

        # ---- 1. load: register variants, one key per (segment, chunk) pair ---------------
        regs = []
        if cutlass.const_expr(ITEMS > 0):
            chunks = (cand.shape[2] + (NT - 1)) // NT
            pairs = cand.shape[0] * chunks
            first = Int32(0)
            count = pairs
            if cutlass.const_expr(PAIR):  # CTA 0 the first half, CTA 1 the rest
                half = (pairs + 1) // 2
                first = rank * half
                count = Int32(cutlass.select_(rank == 0, half, pairs - half))
            seg = first // chunks
            regs = _load_keys(cand, row, tidx, seg, first - seg * chunks, count, ITEMS, NT)
        cute.arch.sync_threads()  # control words and the first histogram are zero

        # ---- 2. radix select ------------------------------------------------------------
        prefix, sel_eff, need, bucket, copies = _radix_select(
            cand, regs, row, tidx, lane, rank, sel, s_hists, s_ctl, s_small, NT, ITEMS, PAIR,
            S, RESOLVE)

        # ---- 3. write in position order, or 4. gather and sort ----------------------------
        if cutlass.const_expr(RANKED):
            _sort_by_rank(cand, out, regs, row, tidx, lane, prefix, sel_eff, need, bucket,
                          copies, s_keys, s_bins, s_top, s_hists[0], s_ctl, NT, ITEMS, S, LOG_R)
        elif cutlass.const_expr(S > 0):
            _gather_and_sort(cand, out, regs, row, tidx, lane, rank, prefix, sel_eff, need,
                             bucket, copies, bufs, s_ctl, NT, ITEMS, S, LOG_R, PAIR,
                             CTAS_PER_SM)
        else:
            if cutlass.const_expr(PAIR):  # done reading the peer's histograms ...
                cute.arch.cluster_arrive()
            _write_in_position_order(cand, out, regs, row, tidx, lane, rank, prefix, sel_eff,
                                     need, bucket, copies, s_counts, s_bases, s_ctl, NT, ITEMS,
                                     PAIR)
            if cutlass.const_expr(PAIR):  # ... and the peer too: shared memory may go
                cute.arch.cluster_wait()

    @cute.jit
    def stable_topk(cand: cute.Tensor, out: cute.Tensor, sel: Int32, stream):
        rows = cand.shape[1]
        if cutlass.const_expr(PAIR):
            stable_topk_kernel(cand, out, sel).launch(
                grid=(rows * 2, 1, 1), block=(NT, 1, 1), cluster=(2, 1, 1), stream=stream)
        elif cutlass.const_expr(CTAS_PER_SM > 1):
            # Registers capped so that CTAS_PER_SM CTAs fit an SM. (A carveout given here
            # keeps CuTeDSL from querying a GPU for it; the loader leaves the carveout to
            # the driver, which sizes it for the occupancy.)
            stable_topk_kernel(cand, out, sel).launch(
                grid=(rows, 1, 1), block=(NT, 1, 1), stream=stream,
                min_blocks_per_mp=CTAS_PER_SM, preferred_smem_carveout=100)
        else:
            stable_topk_kernel(cand, out, sel).launch(
                grid=(rows, 1, 1), block=(NT, 1, 1), stream=stream)

    return stable_topk
