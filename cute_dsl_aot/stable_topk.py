"""Stable global top-K of packed DCP candidates, written in CuTeDSL (spec section 6c).

Each candidate is one int64 whose bits are the unsigned key

    key = (ordered(score_bits) << 32) | (~gid & 0xFFFFFFFF),   invalid candidate: key = 0

so "score descending, then gid ascending, invalid last" is "key descending as an unsigned
64-bit integer". Per row (one CTA per row), with ``sel = min(k, N)``:

0. Key 0 (an invalid candidate) decodes to -1 like a shortfall slot, so the kernel
   selects among the nonzero keys only: ``sel`` below stands for
   ``sel_eff = min(min(k, N), number of nonzero keys)`` (from the first pass's histogram
   total), and output positions ``>= sel_eff`` are -1.
1. Radix select, up to 8 passes of 8-bit digits from the top: a shared-memory histogram
   of the digit of every nonzero key that matches the prefix found so far; one warp scans the 256
   bins from the top and picks the digit holding the ``need``-th largest key. Result: a
   masked prefix P (mask M) such that the top ``sel`` keys are all keys with
   ``key & M > P`` plus ``need`` keys with ``key & M == P``. The select stops early, after
   any pass, once the candidate set ``C = {key & M >= P}`` (the keys above the chosen bin
   plus the whole bin, ``n_cand = sel - need + bucket`` keys) holds at most
   ``stop_limit = min(max_sel, max(2 * n_sort, EARLY_STOP_MIN))`` keys: every key outside
   C is smaller than every key in C, so the top ``sel`` keys of C are the answer (an exact
   hit, ``bucket == need``, is the case ``n_cand == sel``). If it never stops, all 64 bits
   were used: the ``need`` keys taken from the bin are equal, so which copies are taken
   does not matter (``n_cand == sel``).
2. Gather the ``n_cand`` keys into shared memory (warp-aggregated atomics; the order is
   arbitrary, the set is exact). ``n_sort_dyn = max(2, next_pow2(n_cand))``.
3. Bitonic sort descending in shared memory (keys stored with the top bit flipped so that
   a signed compare is the unsigned order): an all-descending network over
   ``n_sort_dyn`` slots that skips the compare-exchanges with the (virtual, key 0)
   slots past ``n_cand``, and on its last level sorts only the top half when
   ``sel <= n_sort_dyn / 2``.
4. Write ``out[row, i]`` for ``i < k``: decoded gid of the i-th key, -1 for key 0 and for
   ``i >= sel`` (sorted keys ``sel .. n_cand - 1`` are not written).

Candidates are read as a 3-D tensor ``[W, rows, K]`` with arbitrary strides (row r's
candidates are ``cand[w, r, :]`` for every w); a 2-D input is ``W = 1``. The output is a
2-D int32 ``[rows, k]`` tensor with arbitrary strides.

Variants differ in threads per CTA, the sort capacity ``max_sel`` and whether the row is
loaded once into registers (``items_per_thread`` keys per thread, N at most
``num_threads * items_per_thread``) or streamed from global memory on every pass.

Launch: grid ``(rows, 1, 1)``, block ``(num_threads, 1, 1)``, the dynamic shared memory
from :func:`smem_bytes`; no cluster. The host guarantees ``rows >= 1``,
``1 <= sel <= max_sel``, ``n_sort = max(2, next_pow2(sel)) <= max_sel`` and, for the
register variants, ``N <= num_threads * items_per_thread``.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

RADIX_BITS = 8
NUM_BINS = 1 << RADIX_BITS
NUM_PASSES = 64 // RADIX_BITS
EARLY_STOP_MIN = 256  # the select may stop with up to this many candidates (see below)
CTL_WORDS = 8  # shared control words: digit, above, bucket count, gt counter, eq counter
SIGN_BIT = -(1 << 63)  # int64 with only the top bit set


def _as_int64(u: int) -> int:
    """The int64 with the same bits as the unsigned 64-bit value u."""
    return u - (1 << 64) if u >= (1 << 63) else u


def smem_bytes(max_sel: int) -> int:
    """Dynamic shared memory of a variant: keys, histogram, control words (in this order,
    each 16-byte aligned)."""
    return max_sel * 8 + NUM_BINS * 4 + CTL_WORDS * 4


@cute.jit
def _count_digit(key: Int64, valid: Int32, mask: Int64, prefix: Int64,
                 shift: cutlass.Constexpr[int], lanes_below: Int32, s_hist: cute.Tensor):
    """Step 1 for one key per thread (all 32 lanes of each warp call it together): if the
    key is valid, nonzero and ``key & mask == prefix``, count its digit ``(key >> shift) & 255``.
    Lanes with the same digit are combined (match.any) into one shared atomic, so tied
    rows do not serialize on one bin."""
    digit = Int32(NUM_BINS)  # no bin
    if valid != 0:
        if key != 0:  # key 0 (invalid candidate) is never selected: it decodes to -1
            if (key & mask) == prefix:
                digit = Int32((key >> shift) & (NUM_BINS - 1))
    peers = Int32(cute.arch.match_sync(-1, digit))
    if digit < NUM_BINS:
        if (peers & lanes_below) == 0:  # the lowest lane of its group adds for all
            cute.arch.atomic_add((s_hist.iterator + digit).llvm_ptr, cute.arch.popc(peers))


@cute.jit
def _gather_one(key: Int64, in_row: Int32, mask: Int64, prefix: Int64, need: Int32,
                num_above: Int32, lane: Int32, lanes_below: Int32, s_keys: cute.Tensor,
                s_ctl: cute.Tensor):
    """Step 2 for one key per thread (all 32 lanes of each warp call it together): nonzero
    keys with ``key & mask > prefix`` (unsigned) go to ``s_keys[0, num_above)`` and the first
    ``need`` keys with ``key & mask == prefix`` to ``s_keys[num_above, num_above + need)``
    (the caller passes the number of bin keys to take), stored with
    the top bit flipped. Slots come from warp-aggregated shared atomics (s_ctl[3], [4])."""
    masked = key & mask
    is_gt = Int32(0)
    is_eq = Int32(0)
    if in_row != 0:
        if key != 0:  # key 0 is never gathered (the select runs over nonzero keys)
            if (masked ^ Int64(SIGN_BIT)) > (prefix ^ Int64(SIGN_BIT)):  # unsigned >
                is_gt = Int32(1)
            if masked == prefix:
                is_eq = Int32(1)
    ballot_gt = cute.arch.vote_ballot_sync(is_gt != 0)
    if ballot_gt != 0:
        base = Int32(0)
        if lane == 0:
            base = cute.arch.atomic_add((s_ctl.iterator + 3).llvm_ptr,
                                        cute.arch.popc(ballot_gt))
        base = cute.arch.shuffle_sync(base, 0)
        if is_gt != 0:
            pos = base + cute.arch.popc(ballot_gt & lanes_below)
            s_keys[pos] = key ^ Int64(SIGN_BIT)
    ballot_eq = cute.arch.vote_ballot_sync(is_eq != 0)
    if ballot_eq != 0:
        base = Int32(0)
        if lane == 0:
            base = cute.arch.atomic_add((s_ctl.iterator + 4).llvm_ptr,
                                        cute.arch.popc(ballot_eq))
        base = cute.arch.shuffle_sync(base, 0)
        if is_eq != 0:
            rank = base + cute.arch.popc(ballot_eq & lanes_below)
            if rank < need:
                s_keys[num_above + rank] = key ^ Int64(SIGN_BIT)


def make_stable_topk(num_threads: int, max_sel: int, items_per_thread: int = 0):
    """Build the kernel and its host launcher for one variant.

    num_threads: threads per CTA (multiple of 32, >= NUM_BINS).
    max_sel: capacity of the shared-memory key buffer (a power of two): the variant
        handles rows with ``next_pow2(min(k, N)) <= max_sel``.
    items_per_thread: 0 streams the row from global memory on every pass (any N); > 0
        loads it once into registers, ``items_per_thread`` keys per thread (N at most
        ``num_threads * items_per_thread``), and reads only registers afterwards.
    """
    assert num_threads % 32 == 0 and num_threads >= NUM_BINS
    assert max_sel & (max_sel - 1) == 0 and max_sel >= 2
    NT = num_threads
    ITEMS = items_per_thread
    log2_max_sel = max_sel.bit_length() - 1

    @cute.kernel
    def stable_topk_kernel(cand: cute.Tensor, out: cute.Tensor, sel: Int32, n_sort: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        num_segments = cand.shape[0]
        seg_len = cand.shape[2]
        k = out.shape[1]

        smem = cutlass.utils.SmemAllocator()
        s_keys = smem.allocate_tensor(Int64, cute.make_layout((max_sel,)), byte_alignment=16)
        s_hist = smem.allocate_tensor(Int32, cute.make_layout((NUM_BINS,)), byte_alignment=16)
        s_ctl = smem.allocate_tensor(Int32, cute.make_layout((CTL_WORDS,)), byte_alignment=16)

        if tidx < CTL_WORDS:
            s_ctl[tidx] = Int32(0)

        # Register-resident variants: key j of this thread is the row's flat candidate
        # f = j * NT + tidx (f = w * K + c); slots with f >= N load a clamped duplicate
        # and are skipped by every pass.
        n_total = num_segments * seg_len
        regs = []
        if cutlass.const_expr(ITEMS > 0):
            for j in cutlass.range_constexpr(ITEMS):
                flat = cutlass.min(j * NT + tidx, n_total - 1)
                seg = flat // seg_len
                regs.append(cand[seg, row, flat - seg * seg_len])

        # ---- 1. radix select --------------------------------------------------------
        lanes_below = Int32(cute.arch.lanemask_lt())
        prefix = Int64(0)
        mask = Int64(0)
        sel_eff = sel  # min(sel, nonzero keys), set by the first pass
        need = sel
        take = sel  # keys taken from the chosen bin (set when the select stops)
        active = Int32(1)
        # Candidate-set bound for the early stop: the sort buffer, and at most twice the
        # exact sort size (n_sort = next_pow2(sel)) or EARLY_STOP_MIN keys.
        stop_limit = cutlass.min(cutlass.max(n_sort * 2, Int32(EARLY_STOP_MIN)),
                                 Int32(max_sel))
        for p in cutlass.range_constexpr(NUM_PASSES):
            shift = 64 - RADIX_BITS * (p + 1)
            if active != 0:
                if tidx < NUM_BINS:
                    s_hist[tidx] = Int32(0)
                cute.arch.sync_threads()
                if cutlass.const_expr(ITEMS > 0):
                    for jr in cutlass.range_constexpr(ITEMS):
                        rvalid = Int32(0)
                        if jr * NT + tidx < n_total:
                            rvalid = Int32(1)
                        _count_digit(regs[jr], rvalid, mask, prefix, shift, lanes_below,
                                     s_hist)
                else:
                    for w in cutlass.range(num_segments):
                        for c0 in cutlass.range(0, seg_len, NT):
                            c = c0 + tidx
                            key = Int64(0)
                            valid = Int32(0)
                            if c < seg_len:
                                key = cand[w, row, c]
                                valid = Int32(1)
                            _count_digit(key, valid, mask, prefix, shift, lanes_below,
                                         s_hist)
                cute.arch.sync_threads()
                if tidx < 32:
                    # Lane l owns bins 255-8l .. 248-8l (descending): an inclusive scan
                    # over lanes counts the keys in all higher bins.
                    per_lane = NUM_BINS // 32
                    counts = [s_hist[NUM_BINS - 1 - per_lane * lane - j]
                              for j in range(per_lane)]
                    lane_sum = Int32(0)
                    for j in cutlass.range_constexpr(per_lane):
                        lane_sum = lane_sum + counts[j]
                    incl = lane_sum
                    for s in cutlass.range_constexpr(5):
                        off = 1 << s
                        v = cute.arch.shuffle_sync_up(incl, offset=off)
                        if lane >= off:
                            incl = incl + v
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
                bucket = s_ctl[2]
                if cutlass.const_expr(p == 0):
                    sel_eff = s_ctl[5]
                    need = sel_eff
                prefix = prefix | (Int64(digit_sel) << shift)
                mask = Int64(_as_int64(((1 << (RADIX_BITS * (p + 1))) - 1) << shift))
                need = need - above
                # Early stop once every key with key & mask >= prefix (the ``num_above``
                # keys above the bin plus the whole bin) fits the sort: the top ``sel``
                # of those are the answer. An exact hit (bucket == need) always fits.
                if (sel_eff - need) + bucket <= stop_limit:
                    take = bucket
                    active = Int32(0)
        if active != 0:
            take = need  # all 64 bits used: the bin's keys are equal, any ``need`` do

        # ---- 2. gather the selected keys --------------------------------------------
        num_above = sel_eff - need
        n_cand = num_above + take  # sel_eff <= n_cand <= max_sel (n_cand may be 0)
        # Sort size: max(2, next_pow2(n_cand)) <= max_sel (uniform across the CTA).
        n_sort_dyn = Int32(2)
        for lg in cutlass.range_constexpr(1, log2_max_sel):
            if n_cand > (1 << lg):
                n_sort_dyn = Int32(1 << (lg + 1))
        if cutlass.const_expr(ITEMS > 0):
            for jr in cutlass.range_constexpr(ITEMS):
                rin_row = Int32(0)
                if jr * NT + tidx < n_total:
                    rin_row = Int32(1)
                _gather_one(regs[jr], rin_row, mask, prefix, take, num_above, lane, lanes_below,
                            s_keys, s_ctl)
        else:
            for w in cutlass.range(num_segments):
                for c0 in cutlass.range(0, seg_len, NT):
                    c = c0 + tidx
                    key = Int64(0)
                    in_row = Int32(0)
                    if c < seg_len:
                        key = cand[w, row, c]
                        in_row = Int32(1)
                    _gather_one(key, in_row, mask, prefix, take, num_above, lane,
                                lanes_below, s_keys, s_ctl)
        cute.arch.sync_threads()

        # ---- 3. bitonic sort, descending --------------------------------------------
        # All-descending bitonic network over n_sort_dyn slots: level ``size`` starts
        # with a flip stage (slot lo = block + j against hi = block + size - 1 - j =
        # lo ^ (size - 1), j < size / 2), then half-cleaners with strides size/4 .. 1
        # (lo against lo + stride); every compare-exchange puts the larger key at lo.
        # Slots n_cand .. n_sort_dyn - 1 stand for key 0 (the smallest key): a
        # compare-exchange with hi >= n_cand would be a no-op on them, so it is skipped
        # and those slots are never read or written (no padding).
        # On the final level (size == n_sort_dyn) the flip stage leaves the top half of
        # the keys in slots [0, half) as a bitonic sequence; when sel <= half only that
        # half is sorted further (i < half / 2).
        # Compare-exchange i of a stage with stride s <= 32 (a flip stage counts as
        # stride size / 2) touches elements inside the 64-element block
        # 2 * (i & ~31) + [0, 64): the 32 lanes of a warp (consecutive i, 32-aligned since
        # NT % 32 == 0) own that block alone. Between two such stages a warp barrier
        # orders the shared-memory accesses; a CTA barrier is needed only around stages
        # with stride > 32.
        half = n_sort_dyn >> 1
        lim_last = half
        if sel_eff <= half:
            lim_last = half >> 1
        for lvl in cutlass.range_constexpr(1, log2_max_sel + 1):
            size = 1 << lvl
            if size <= n_sort_dyn:
                lim = half
                if size == n_sort_dyn:
                    lim = lim_last
                for sl in cutlass.range_constexpr(lvl - 1, -1, -1):
                    stride = 1 << sl
                    i_end = half if sl == lvl - 1 else lim
                    for i in cutlass.range(tidx, i_end, NT):
                        lo = ((i >> sl) << (sl + 1)) | (i & (stride - 1))
                        hi = lo + stride
                        if cutlass.const_expr(sl == lvl - 1):
                            hi = lo ^ (size - 1)  # flip stage
                        if hi < n_cand:
                            a = s_keys[lo]
                            b = s_keys[hi]
                            if a < b:
                                s_keys[lo] = b
                                s_keys[hi] = a
                    next_stride = stride >> 1 if sl > 0 else size  # next level: size
                    if cutlass.const_expr(stride > 32 or next_stride > 32):
                        cute.arch.sync_threads()
                    else:
                        cute.arch.sync_warp()
        cute.arch.sync_threads()  # the last level run may have ended on a warp barrier

        # ---- 4. decode and write --------------------------------------------------------
        for i in cutlass.range(tidx, k, NT):
            gid = Int32(-1)
            if i < sel_eff:
                key = s_keys[i] ^ Int64(SIGN_BIT)
                if key != 0:
                    gid = Int32(~key)  # low 32 bits of ~key
            out[row, i] = gid

    @cute.jit
    def stable_topk(cand: cute.Tensor, out: cute.Tensor, sel: Int32, n_sort: Int32,
                    stream):
        rows = cand.shape[1]
        stable_topk_kernel(cand, out, sel, n_sort).launch(
            grid=(rows, 1, 1), block=(NT, 1, 1), stream=stream)

    return stable_topk
