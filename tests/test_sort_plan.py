"""The register bitonic sort's compile-time plan (cute_dsl_aot/sort_plan.py), on the CPU:
the planned windows sort (one CTA, and the split network of a CTA pair), every layout is
a bijection, and every layout that the exported variants use reads and writes shared
memory without bank conflicts."""
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cute_dsl_aot"))
import sort_plan  # noqa: E402
import variants  # noqa: E402

# (log2 of the keys one CTA sorts, log2 of the keys per thread) of the exported sorting
# variants: a pair's CTA sorts half of S with the full network, then merges it
_SINGLE = sorted({(v.sort_size.bit_length() - 1, v.log_r)
                  for v in variants.VARIANTS if v.sorted and not v.pair})
_HALVES = sorted({(v.sort_size.bit_length() - 2, v.log_r)
                  for v in variants.VARIANTS if v.sorted and v.pair})
VARIANT_PLANS = _SINGLE + _HALVES


def exported_windows():
    """(m, log_r, windows) of every plan an exported variant runs."""
    for m, log_r in _SINGLE:
        yield m, log_r, sort_plan.plan_windows(m, log_r)
    for m, log_r in _HALVES:
        yield m, log_r, sort_plan.plan_windows(m, log_r)
        yield m, log_r, sort_plan.plan_windows(m, log_r, sort_plan.merge_stages(m))


def test_exported_variants_have_plans():
    assert _SINGLE and _HALVES


@pytest.mark.parametrize("m,log_r", [(3, 1), (5, 2), (6, 3), (8, 3), (9, 3), (10, 4), (11, 3)])
def test_plan_sorts_descending(m, log_r):
    rng = random.Random(m * 10 + log_r)
    for distinct in (2, 50, 1 << 30):
        keys = [rng.randrange(distinct) for _ in range(1 << m)]
        assert sort_plan.simulate(keys, log_r) == sorted(keys, reverse=True)


@pytest.mark.parametrize("m,log_r", [(3, 1), (5, 2), (9, 2), (10, 2), (11, 2), (12, 2),
                                     (10, 3)])
def test_pair_plan_sorts_descending(m, log_r):
    rng = random.Random(m * 10 + log_r + 1)
    for distinct in (1, 2, 50, 1 << 30):
        keys = [rng.randrange(distinct) for _ in range(1 << m)]
        assert sort_plan.simulate_pair(keys, log_r) == sorted(keys, reverse=True)


def test_layouts_are_bijections():
    for m, log_r, windows in exported_windows():
        for window in windows:
            lay = window.layout
            cells = {lay.element(t, r)
                     for t in range(1 << (m - log_r)) for r in range(1 << log_r)}
            assert cells == set(range(1 << m))
            for L, j in window.stages:  # every stage of the window is register-local
                assert j in lay.reg_bits and 1 <= L <= m and j < L


def test_shared_accesses_conflict_free():
    for m, log_r, windows in exported_windows():
        assert sorted(sort_plan.swizzle(e, m) for e in range(1 << m)) == list(range(1 << m))
        for window in windows:
            assert sort_plan.conflict_free(window.layout, m), (m, log_r, window.layout)


def test_plan_covers_the_network():
    for m, log_r in VARIANT_PLANS:
        for part in (None, sort_plan.merge_stages(m)):
            windows = sort_plan.plan_windows(m, log_r, part)
            stages = [st for w in windows for st in w.stages]
            assert stages == (sort_plan.bitonic_stages(m) if part is None else part)
            # each thread ends with consecutive keys
            assert windows[-1].layout.reg_bits == tuple(range(log_r))


@pytest.mark.parametrize("m,log_r", _SINGLE)
def test_warp_local_transitions_keep_keys_in_their_warp(m, log_r):
    """A transition the kernel orders with a warp barrier only moves keys within warps."""
    windows = sort_plan.plan_windows(m, log_r)
    check_warp_local_transitions(windows, m, log_r)
    local = sum(sort_plan.warp_local(a.layout, b.layout) for a, b in zip(windows, windows[1:]))
    # With 8 keys a thread, most transitions on the low bits stay in warps; with 4 (the d8
    # sorts, 3 CTAs per SM) a warp covers 128 keys and most transitions cross warps.
    assert local >= (len(windows) // 3 if log_r >= 3 else 3)


@pytest.mark.parametrize("m,log_r", _HALVES)
def test_pair_warp_local_transitions_keep_keys_in_their_warp(m, log_r):
    check_warp_local_transitions(sort_plan.plan_windows(m, log_r), m, log_r)
    check_warp_local_transitions(
        sort_plan.plan_windows(m, log_r, sort_plan.merge_stages(m)), m, log_r)


def check_warp_local_transitions(windows, m, log_r):
    threads = 1 << (m - log_r)
    for a, b in zip(windows, windows[1:]):
        if not sort_plan.warp_local(a.layout, b.layout):
            continue
        for warp in range(threads // 32):
            owned = [{lay.element(t, r) for t in range(warp * 32, warp * 32 + 32)
                      for r in range(1 << log_r)} for lay in (a.layout, b.layout)]
            assert owned[0] == owned[1]
