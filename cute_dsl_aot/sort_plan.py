"""Compile-time plan of the top-K kernel's register bitonic sort (pure Python, no CuTeDSL).

The sort orders ``size = 2^m`` keys held by ``size >> log_r`` threads, ``2^log_r`` keys
per thread. The bitonic network is the classic one: level ``L = 1..m``, then for bit
``j = L-1 .. 0`` a stage that compare-exchanges elements ``e`` and ``e | 1 << j`` (bit j
of e clear), larger key first when bit ``L`` of e is clear (always on the last level),
smaller first otherwise. After level m the keys are in descending order.

A stage is register-local when bit j is one of the thread's register bits. The plan
splits the stage sequence into windows, each with one *layout*: which element-index
bits select the register (``reg_bits``) and which select the thread (``thread_bits``,
thread-index bit i -> element bit ``thread_bits[i]``). Between windows the keys go
through shared memory: every thread stores its keys, one CTA barrier, every thread
loads the keys of the next layout.

Shared-memory address of element e: ``swizzle(e)`` (xor of e's higher nibbles into its
low nibble). A 64-bit access is served per half-warp; it is free of bank conflicts when
the 16 lanes' addresses differ in the low nibble, which holds when the four element
bits that lanes 0-15 vary (``thread_bits[0:4]``) are distinct modulo 4. The plan picks
such lane bits for every layout (see :func:`layout_for`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    reg_bits: tuple      # register index bit i <-> element bit reg_bits[i] (ascending)
    thread_bits: tuple   # thread index bit i <-> element bit thread_bits[i]

    def element(self, thread: int, reg: int) -> int:
        """Element index held by `thread` in register `reg`."""
        e = 0
        for i, b in enumerate(self.thread_bits):
            e |= ((thread >> i) & 1) << b
        for i, b in enumerate(self.reg_bits):
            e |= ((reg >> i) & 1) << b
        return e

    def thread_runs(self):
        """(thread shift, width, element shift) runs: thread bits [s, s + w) sit at element
        bits [d, d + w). The kernel deposits the thread index with one shift and mask per
        run."""
        runs = []
        for i, b in enumerate(self.thread_bits):
            if runs and runs[-1][0] + runs[-1][1] == i and runs[-1][2] + runs[-1][1] == b:
                s, w, d = runs[-1]
                runs[-1] = (s, w + 1, d)
            else:
                runs.append((i, 1, b))
        return runs


@dataclass(frozen=True)
class Window:
    layout: Layout
    stages: tuple        # (level L, bit j) in network order


def warp_local(a: Layout, b: Layout) -> bool:
    """Whether moving from layout a to b keeps every key in its warp (thread bits 5 and
    up select the warp): then the exchange needs only a warp barrier."""
    return a.thread_bits[5:] == b.thread_bits[5:]


def bitonic_stages(m: int):
    """Stages of the bitonic network over 2^m elements, in order."""
    return [(L, j) for L in range(1, m + 1) for j in range(L - 1, -1, -1)]


def swizzle(e: int, m: int) -> int:
    """Shared-memory slot of element e (a permutation of [0, 2^m))."""
    fold = 0
    for shift in range(4, m, 4):
        fold ^= e >> shift
    return e ^ (fold & 15)


def layout_for(reg_bits, m: int) -> Layout:
    """The layout with these register bits: lanes 0-15 get the lowest free element bit of
    each residue class modulo 4 (conflict-free 64-bit shared accesses after the swizzle),
    the other thread bits follow in ascending order."""
    free = [b for b in range(m) if b not in reg_bits]
    lanes = []
    for c in range(4):
        cls = [b for b in free if b % 4 == c]
        if cls:
            lanes.append(cls[0])
    for b in free:  # a residue class is missing: fill with the lowest remaining bits
        if len(lanes) == min(4, len(free)):
            break
        if b not in lanes:
            lanes.append(b)
    lanes.sort()
    rest = [b for b in free if b not in lanes]
    return Layout(tuple(sorted(reg_bits)), tuple(lanes + rest))


def merge_stages(m: int):
    """The last level of the network over 2^m elements: it turns a bitonic sequence
    (two halves sorted in opposite directions) into a descending one."""
    return [(m, j) for j in range(m - 1, -1, -1)]


def plan_windows(m: int, log_r: int, stages=None):
    """Windows of the network over 2^m keys (or of the given part of it, `stages` in
    network order) with 2^log_r keys per thread.

    Greedy from the end (optimal for covering a sequence with windows of at most log_r
    distinct bits): the last window then holds bits {0 .. log_r-1}, so each thread ends
    with consecutive elements. A window with fewer distinct bits is padded with the
    lowest unused bits."""
    assert 1 <= log_r < m
    windows = []
    bits, stages_w = [], []
    for L, j in reversed(bitonic_stages(m) if stages is None else stages):
        if j not in bits and len(bits) == log_r:
            windows.append((bits, stages_w))
            bits, stages_w = [], []
        if j not in bits:
            bits.append(j)
        stages_w.append((L, j))
    windows.append((bits, stages_w))
    plan = []
    for bits, stages in reversed(windows):
        reg = set(bits)
        for b in range(m):
            if len(reg) == log_r:
                break
            reg.add(b)
        plan.append(Window(layout_for(reg, m), tuple(reversed(stages))))
    return plan


def conflict_free(layout: Layout, m: int) -> bool:
    """Whether lanes 0-15 of every register access hit 16 distinct low nibbles."""
    lanes = min(16, 1 << len(layout.thread_bits))
    for r in range(1 << len(layout.reg_bits)):
        for half in range(0, 1 << len(layout.thread_bits), 32):
            for base in (half, half + 16):
                nibbles = {swizzle(layout.element(base + t, r), m) & 15 for t in range(lanes)}
                if len(nibbles) != lanes:
                    return False
    return True


def simulate(keys, log_r: int):
    """Run the planned network on a list of 2^m integers (as the kernel does, through the
    layouts); returns the list sorted descending. For tests of the plan."""
    n = len(keys)
    m = n.bit_length() - 1
    assert 1 << m == n
    return _run(list(keys), m, log_r, plan_windows(m, log_r))


def simulate_pair(keys, log_r: int):
    """The sort of a CTA pair, as the kernel runs it on 2^m integers: each CTA sorts one
    half descending, CTA 1 on negated keys (so its half ends ascending); one
    compare-exchange between the CTAs keeps the larger keys in CTA 0 and the smaller in
    CTA 1; each CTA then merges its half descending. Returns the concatenation."""
    n = len(keys)
    m = n.bit_length() - 1
    assert 1 << m == n and m >= 2
    half = n // 2
    sort = plan_windows(m - 1, log_r)
    merge = plan_windows(m - 1, log_r, merge_stages(m - 1))
    lo = _run(list(keys[:half]), m - 1, log_r, sort)
    hi = [-x for x in _run([-x for x in keys[half:]], m - 1, log_r, sort)]
    lo, hi = [max(a, b) for a, b in zip(lo, hi)], [min(a, b) for a, b in zip(lo, hi)]
    return _run(lo, m - 1, log_r, merge) + _run(hi, m - 1, log_r, merge)


def _run(data, m: int, log_r: int, windows):
    """The windows on 2^m integers, in place through the layouts."""
    n = len(data)
    for win in windows:
        lay = win.layout
        threads = n >> log_r
        regs = [[data[lay.element(t, r)] for r in range(1 << log_r)] for t in range(threads)]
        for L, j in win.stages:
            ri = lay.reg_bits.index(j)
            for t in range(threads):
                x = regs[t]
                for r in range(1 << log_r):
                    if (r >> ri) & 1:
                        continue
                    r2 = r | (1 << ri)
                    e = lay.element(t, r)
                    desc = L == m or not (e >> L) & 1
                    a, b = x[r], x[r2]
                    if (a < b) if desc else (a > b):
                        x[r], x[r2] = b, a
        for t in range(threads):
            for r in range(1 << log_r):
                data[lay.element(t, r)] = regs[t][r]
    return data
