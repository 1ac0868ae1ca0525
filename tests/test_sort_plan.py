"""The register bitonic sort's compile-time plan (cute_dsl_aot/sort_plan.py), on the CPU:
the planned windows sort, every layout is a bijection, and every layout that the
exported variants use reads and writes shared memory without bank conflicts."""
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cute_dsl_aot"))
import sort_plan  # noqa: E402

# (log2 of the sort size, log2 of the keys per thread) of the exported variants
VARIANT_PLANS = [(9, 3), (10, 3), (11, 3), (12, 3), (13, 3), (14, 4)]


@pytest.mark.parametrize("m,log_r", [(3, 1), (5, 2), (6, 3), (8, 3), (9, 3), (10, 4), (11, 3)])
def test_plan_sorts_descending(m, log_r):
    rng = random.Random(m * 10 + log_r)
    for distinct in (2, 50, 1 << 30):
        keys = [rng.randrange(distinct) for _ in range(1 << m)]
        assert sort_plan.simulate(keys, log_r) == sorted(keys, reverse=True)


@pytest.mark.parametrize("m,log_r", VARIANT_PLANS)
def test_layouts_are_bijections(m, log_r):
    for window in sort_plan.plan_windows(m, log_r):
        lay = window.layout
        cells = {lay.element(t, r) for t in range(1 << (m - log_r)) for r in range(1 << log_r)}
        assert cells == set(range(1 << m))
        for L, j in window.stages:  # every stage of the window is register-local
            assert j in lay.reg_bits and 1 <= L <= m and j < L


@pytest.mark.parametrize("m,log_r", VARIANT_PLANS)
def test_shared_accesses_conflict_free(m, log_r):
    assert sorted(sort_plan.swizzle(e, m) for e in range(1 << m)) == list(range(1 << m))
    for window in sort_plan.plan_windows(m, log_r):
        assert sort_plan.conflict_free(window.layout, m), window.layout


def test_plan_covers_the_network():
    for m, log_r in VARIANT_PLANS:
        stages = [st for w in sort_plan.plan_windows(m, log_r) for st in w.stages]
        assert stages == sort_plan.bitonic_stages(m)
        last = sort_plan.plan_windows(m, log_r)[-1].layout
        assert last.reg_bits == tuple(range(log_r))  # each thread ends with consecutive keys


@pytest.mark.parametrize("m,log_r", VARIANT_PLANS)
def test_warp_local_transitions_keep_keys_in_their_warp(m, log_r):
    """A transition the kernel orders with a warp barrier only moves keys within warps."""
    windows = sort_plan.plan_windows(m, log_r)
    threads = 1 << (m - log_r)
    local = 0
    for a, b in zip(windows, windows[1:]):
        if not sort_plan.warp_local(a.layout, b.layout):
            continue
        local += 1
        for warp in range(threads // 32):
            owned = [{lay.element(t, r) for t in range(warp * 32, warp * 32 + 32)
                      for r in range(1 << log_r)} for lay in (a.layout, b.layout)]
            assert owned[0] == owned[1]
    assert local >= len(windows) // 3  # most transitions on the low bits stay in warps
