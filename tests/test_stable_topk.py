"""stable_topk_from_candidates (docs/ops.md section 6c): CPU and CUDA against the torch
reference, bit-exact."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import reference
from conftest import HAS_CUDA, capture_graph, cuda_sms, forced_topk_variant

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

INT32_MAX = 2**31 - 1
SPECIAL_SCORES = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0,
                  1e-45, -1e-45, 3.4e38, -3.4e38]


def make_scores_gids(kind: str, rows: int, n: int, seed: int):
    """fp32 scores and int32 global ids [rows, n] of one test regime."""
    g = torch.Generator().manual_seed(seed)
    gids = torch.randperm(max(n, 1) * 4, generator=g)[:n].to(torch.int32).repeat(rows, 1)
    if kind == "random":
        scores = torch.randn(rows, n, generator=g)
    elif kind == "ties":  # a few distinct values: order decided by the ids
        scores = torch.randint(0, 3, (rows, n), generator=g).float()
    elif kind == "bf16":  # low-precision scores: the low 16 score bits are all zero
        scores = torch.randn(rows, n, generator=g).bfloat16().float()
    elif kind == "equal":
        scores = torch.full((rows, n), 0.25)
    elif kind == "special":
        pick = torch.randint(0, len(SPECIAL_SCORES), (rows, n), generator=g)
        scores = torch.tensor(SPECIAL_SCORES)[pick]
        scores[:, ::7] = float("nan")
        nan_neg = torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.float32)
        scores[:, 3::11] = nan_neg  # a negative NaN ranks below -inf
    elif kind == "big_ids":  # ids near 2^31 - 1, ties on score
        scores = torch.randint(0, 2, (rows, n), generator=g).float()
        gids = (INT32_MAX - torch.randperm(max(n, 1) * 3, generator=g)[:n]).to(torch.int32)
        gids = gids.repeat(rows, 1)
    elif kind == "shortfall":  # most candidates invalid
        scores = torch.randn(rows, n, generator=g)
        invalid = torch.rand(rows, n, generator=g) < 0.8
        gids = torch.where(invalid, torch.full_like(gids, -1), gids)
    else:
        raise AssertionError(kind)
    # Different rows get different ids so row mix-ups show.
    if kind != "big_ids":
        gids = torch.where(gids >= 0, gids + torch.arange(rows, dtype=torch.int32)[:, None] * 7,
                           gids)
    return scores, gids


def make_keys(kind: str, rows: int, n: int, seed: int = 0) -> torch.Tensor:
    scores, gids = make_scores_gids(kind, rows, n, seed)
    return reference.encode_candidate_keys(scores, gids)


def run(cands: torch.Tensor, k: int, device: str, **kw) -> torch.Tensor:
    out = dsa_ext.stable_topk_from_candidates(cands.to(device), k, **kw)
    assert out.dtype == torch.int32 and out.device.type == device
    return out.cpu()


def check_equal(got: torch.Tensor, want: torch.Tensor, **ctx) -> None:
    got = got.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].tolist()
        raise AssertionError(f"first mismatch at {bad}: got {got[bad[0], bad[1]]}, want "
                             f"{want[bad[0], bad[1]]}; {ctx}")


def check(cands: torch.Tensor, k: int, device: str) -> None:
    """Both orders (the default position order and sorted=True) against the reference;
    on CUDA, sorted=True past the largest sort (min(k, N) > CUDA_MAX_SORTED) must raise."""
    for order in (False, True):
        if order and device == "cuda" and min(k, cands.shape[-1] * (
                cands.shape[0] if cands.dim() == 3 else 1)) > dsa_ext.topk.CUDA_MAX_SORTED:
            with pytest.raises(ValueError, match="sorted=True"):
                run(cands, k, device, sorted=True)
            continue
        check_equal(run(cands, k, device, sorted=order),
                    reference.stable_topk_from_candidates(cands, k, sorted=order),
                    shape=tuple(cands.shape), k=k, strides=cands.stride(), sorted=order)


# ---------------------------------------------------------------------------------------
# The key format and the reference itself
# ---------------------------------------------------------------------------------------


def test_encoding_orders_scores_then_ids():
    scores = torch.tensor([float("nan"), float("inf"), 1.0, 1.0, 0.0, -0.0, -1.0,
                           -float("inf"), 5.0])
    gids = torch.tensor([9, 8, 3, 4, 7, 6, 5, 2, -1], dtype=torch.int32)
    keys = reference.encode_candidate_keys(scores, gids)
    assert keys[-1] == 0
    assert reference.stable_topk_from_candidates(keys[None], 10, sorted=True).tolist() == [
        [9, 8, 3, 4, 7, 6, 5, 2, -1, -1]]
    assert reference.decode_candidate_gids(keys).tolist() == gids.tolist()


def test_encoding_extreme_ids():
    gids = torch.tensor([0, 1, INT32_MAX - 1, INT32_MAX], dtype=torch.int32)
    keys = reference.encode_candidate_keys(torch.zeros(4), gids)
    assert (keys != 0).all()
    assert reference.decode_candidate_gids(keys).tolist() == gids.tolist()
    assert reference.stable_topk_from_candidates(keys[None], 4).tolist() == [gids.tolist()]
    assert reference.stable_topk_from_candidates(keys[None], 4, sorted=True).tolist() == [
        gids.tolist()]


# Fixed row: positions 0..7 hold keys A, B, C, B, D, E, invalid, C (B and C passed twice):
# descending B, B, C, C, D, A, E.
FIXED_SCORES = [1.0, 3.0, 2.0, 3.0, 2.0, -float("inf"), 5.0, 2.0]
FIXED_GIDS = [10, 11, 12, 11, 13, 14, -1, 12]
FIXED_ORDERS = [  # (k, default order, sorted=True)
    (1, [11], [11]),
    (2, [11, 11], [11, 11]),
    (3, [11, 12, 11], [11, 11, 12]),  # C's copy at position 2, not 7
    (4, [11, 12, 11, 12], [11, 11, 12, 12]),
    (5, [11, 12, 11, 13, 12], [11, 11, 12, 12, 13]),
    (6, [10, 11, 12, 11, 13, 12], [11, 11, 12, 12, 13, 10]),
    (9, [10, 11, 12, 11, 13, 14, 12, -1, -1], [11, 11, 12, 12, 13, 10, 14, -1, -1]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,in_row_order,descending", FIXED_ORDERS)
def test_fixed_row_both_orders(device, k, in_row_order, descending):
    keys = reference.encode_candidate_keys(torch.tensor([FIXED_SCORES]),
                                           torch.tensor([FIXED_GIDS], dtype=torch.int32))
    assert reference.stable_topk_from_candidates(keys, k).tolist() == [in_row_order]
    assert reference.stable_topk_from_candidates(keys, k, sorted=True).tolist() == [descending]
    assert run(keys, k, device).tolist() == [in_row_order]
    assert run(keys, k, device, sorted=True).tolist() == [descending]


@pytest.mark.parametrize("device", DEVICES)
def test_default_order_is_gathered_position(device):
    """[W, rows, K]: position w * K + c, rank-major; the 2-D concatenation agrees."""
    scores = torch.tensor([[[0.5, 9.0, 1.0]], [[7.0, 0.1, 2.0]]])  # [W=2, rows=1, K=3]
    gids = torch.tensor([[[5, 1, 8]], [[0, 4, 3]]], dtype=torch.int32)
    keys = reference.encode_candidate_keys(scores, gids)
    want = [[1, 8, 0, 3]]  # the top 4 (9, 7, 2, 1) as they sit: rank 0's, then rank 1's
    assert reference.stable_topk_from_candidates(keys, 4).tolist() == want
    assert run(keys, 4, device).tolist() == want
    assert run(torch.cat([keys[0], keys[1]], dim=1), 4, device).tolist() == want
    assert run(keys, 4, device, sorted=True).tolist() == [[1, 0, 3, 8]]


# ---------------------------------------------------------------------------------------
# Against the reference
# ---------------------------------------------------------------------------------------

KINDS = ["random", "ties", "bf16", "equal", "special", "big_ids", "shortfall"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (37, 37), (37, 50), (300, 16), (1000, 999),
                                 (2053, 512), (3000, 2048)])
def test_matches_reference(device, kind, n, k):
    check(make_keys(kind, 3, n, seed=n + k), k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "ties"])
def test_many_rows(device, kind):
    check(make_keys(kind, 4096, 48, seed=1), 16, device)


@pytest.mark.parametrize("device", DEVICES)
def test_one_row_large(device):
    check(make_keys("random", 1, 16384, seed=2), 2048, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["ties", "random", "bf16"])
@pytest.mark.parametrize("n,k", [(8192, 512), (8193, 513), (16384, 1024), (16385, 1025),
                                 (8192, 2048), (8193, 2048), (16384, 2049), (4096, 4096),
                                 (16384, 4096), (16385, 100), (30000, 4096), (4097, 4097),
                                 (5000, 4100), (20000, 8192), (16384, 8193), (16384, 16384),
                                 (9000, 20000)])
def test_variant_boundaries(device, kind, n, k):
    """Around the limits of the CUDA variants (cute_dsl_aot/export.py VARIANTS): keys in
    registers for N <= 8192 and N <= 16384, streamed beyond; sort sizes 512 to 16384; two
    rows run on CTA pairs."""
    check(make_keys(kind, 2, n, seed=3), k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(8192, 512), (8192, 2048), (16384, 2048), (16384, 4096),
                                 (1000, 999)])
def test_variant_boundaries_many_rows(device, n, k):
    """More rows than CTA pairs fit the SMs side by side: one CTA a row."""
    check(make_keys("random", 150, n, seed=7), k, device)


def rows_for_two_ctas_per_sm(device: str) -> int:
    """More rows than SMs, where the launcher takes the 512-thread variants of 2 CTAs per
    SM (the CPU runs the H200's count)."""
    return cuda_sms() + 1 if device == "cuda" else 133


def check_variant(device: str, shape, k: int, prefix: str, sorted: bool) -> None:
    """On CUDA, the launcher's choice for this shape starts with `prefix`."""
    if device == "cuda":
        W, rows, K = shape
        chosen = dsa_ext._C.stable_topk_variant(W, rows, K, k, sorted,
                                                torch.cuda.current_device())
        assert chosen.startswith(prefix), (chosen, shape, k, sorted)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["ties", "random", "shortfall"])
@pytest.mark.parametrize("n,k,variant,unsorted", [
    (8192, 2048, "r8_rank4096", "d16_u"), (8192, 1000, "r8_rank2048", "d16_u"),
    (8192, 512, "r8_rank1024", "d16_u"), (4096, 2048, "r4_rank4096", "d8_u"),
    (4097, 2048, "r8_rank4096", "d16_u"), (600, 300, "r4_rank1024", "d8_u"),
    (8193, 2048, "r16_s2048", "r16_u"),
    (8192, 2049, "r8_rank8192", "d16_u"), (8192, 8192, "r8_rank8192", "d16_u")])
def test_variant_boundaries_two_ctas_per_sm(device, kind, n, k, variant, unsorted):
    """Past the SMs the default order takes the 512-thread variants of 2 or 3 CTAs per SM
    (16 keys per thread up to N = 8192, 8 up to N = 4096); sorting takes a rank sort of
    S = min(2 next_pow2(k), next_pow2(N)) keys while the row fits 8 keys per thread of
    1024 (4 up to N = 4096), the bitonic sort of 16 keys per thread past that."""
    rows = rows_for_two_ctas_per_sm(device)
    check_variant(device, (1, rows, n), k, variant, True)
    check_variant(device, (1, rows, n), k, unsorted, False)
    check(make_keys(kind, rows, n, seed=8), k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("W,K,k", [(4, 2048, 2048), (8, 1024, 1024), (3, 1500, 700)])
def test_two_ctas_per_sm_segments(device, W, K, k):
    """The same variants on [W, rows, K] candidates (each thread's 16 keys span the
    segments), rows strided as all_gather_into_tensor lays them out; one row holds the
    same key many times over (the select then uses all 64 bits)."""
    rows = rows_for_two_ctas_per_sm(device)
    cands = torch.stack([make_keys("random", rows, K, seed=90 + w) for w in range(W)])
    cands[:, 5, :] = cands[0, 5, 0]
    check_variant(device, (W, rows, K), k, "r8_rank", True)
    check_variant(device, (W, rows, K), k, "d16_u", False)
    check(cands, k, device)


@pytest.mark.cuda
def test_variant_choice_by_rows():
    """Sorting, K = 2048, k = 2048: a rank sort of 4096 keys at every row count (one CTA of
    1024 threads, 8 keys per thread at W = 4, 4 at W = 2); at W = 8 the bitonic sort,
    pairs while 2 x rows fit the SMs, then one CTA. The default order: one CTA of 1024
    threads while the rows fit the SMs, then 2 CTAs of 512 threads per SM at W = 4, 3 at
    W = 2."""
    dev, sms = torch.cuda.current_device(), cuda_sms()
    for rows in (1, sms // 2, sms, sms + 1, 4 * sms):
        assert dsa_ext._C.stable_topk_variant(4, rows, 2048, 2048, True, dev) == "r8_rank4096"
        assert dsa_ext._C.stable_topk_variant(2, rows, 2048, 2048, True, dev) == "r4_rank4096"
        unsorted = "d16_u" if rows > sms else "r8_u"
        assert dsa_ext._C.stable_topk_variant(4, rows, 2048, 2048, False, dev) == unsorted
    for rows, want in ((1, "p8_s2048"), (sms // 2, "p8_s2048"), (sms // 2 + 1, "r16_s2048"),
                       (4 * sms, "r16_s2048")):
        assert dsa_ext._C.stable_topk_variant(8, rows, 2048, 2048, True, dev) == want, rows
    for rows, want in ((1, "r4_u"), (sms, "r4_u"), (sms + 1, "d8_u"), (4 * sms, "d8_u")):
        assert dsa_ext._C.stable_topk_variant(2, rows, 2048, 2048, False, dev) == want, rows
    # Larger k: the rank sort of twice next_pow2(k), capped at the row; streamed rows.
    for W, K, k, want in ((4, 4096, 8192, "g_rank16384"), (4, 512, 512, "r4_rank1024"),
                          (4, 1024, 1024, "r4_rank2048"), (4, 8192, 16384, "g_s16384")):
        assert dsa_ext._C.stable_topk_variant(W, 64, K, k, True, dev) == want, (W, K, k)
    # The default order has no sort-size limit: W = 8 pairs hold 16 chunks, streamed past.
    for W, K, k, want in ((8, 2048, 16384, "p8_u"), (16, 2048, 5000, "g_u"),
                          (1, 40000, 20000, "g_u")):
        assert dsa_ext._C.stable_topk_variant(W, 1, K, k, False, dev) == want, (W, K, k)


@pytest.mark.parametrize("device", DEVICES)
def test_duplicate_keys(device):
    """The same candidate passed twice stays twice (equal keys are taken as needed)."""
    scores, gids = make_scores_gids("random", 2, 64, seed=4)
    keys = reference.encode_candidate_keys(scores, gids)
    keys = torch.cat([keys, keys, keys[:, :5]], dim=1)
    for k in (1, 3, 100, 200):
        check(keys, k, device)


def make_threshold_copies(rows: int, n: int, k: int, seed: int) -> torch.Tensor:
    """Rows in which the k-th largest key has many copies at scattered positions, so that
    only some of them are taken (the default order takes the lowest positions): copies
    from a few to most of the row, some rows with invalid keys, one row of copies only."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(rows):
        row = make_keys(("random", "ties", "shortfall")[r % 3], 1, n, seed=seed + r)[0]
        copies = max(2, int(n * (0.05, 0.3, 0.7)[r % 3]))
        at = torch.randperm(n, generator=g)[:copies]
        order = torch.sort(row ^ torch.iinfo(torch.int64).min, descending=True).indices
        pick = order[min(n - 1, max(0, k - 1 - copies // 2))]  # the copies straddle k
        row[at] = int(row[pick]) if row[pick] != 0 else int(row[order[0]])
        out.append(row)
    out[-1] = torch.full((n,), int(out[0][out[0] != 0][0]), dtype=torch.int64)
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(600, 100), (8192, 2048), (8192, 7000), (20000, 4096),
                                 (20000, 17000)])
@pytest.mark.parametrize("rows", [3, 100, 150])
def test_copies_at_the_threshold(device, n, k, rows):
    """Copies of one key straddle the k-th place: all 64 bits get selected and exactly the
    copies at the lowest positions are taken, in CTA pairs (3 rows), one CTA (100) and 2
    CTAs per SM (150 rows on the H200), with keys in registers and streamed (N = 20000)."""
    check(make_threshold_copies(rows, n, k, seed=n + k + rows), k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,k", [((1, 3, 40000), 20000), ((4, 2, 6000), 16385),
                                     ((8, 2, 2048), 16384), ((2, 130, 5000), 9000),
                                     ((1, 2, 70000), 70001)])
def test_default_order_any_k(device, shape, k):
    """The default order takes any k (no sort-size limit on CUDA): k past 16384, k = N,
    k > N, in pairs, one CTA and streamed rows."""
    W, rows, K = shape
    cands = torch.stack([make_keys("random", rows, K, seed=40 + w) for w in range(W)])
    cands[0, 0, ::3] = 0  # some invalid keys
    want = reference.stable_topk_from_candidates(cands, k)
    check_equal(run(cands, k, device), want, shape=shape, k=k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(8192, 2048), (16384, 2048), (20000, 4096), (3000, 100)])
def test_mixed_rows_early_stop(device, n, k):
    """Rows that stop the select after different passes in one launch: no valid key, one,
    exactly k, k + 1, heavy ties, equal scores, random, duplicates of one key, more copies
    of the top key than the sort holds (all 64 bits used), a top byte shared by half the
    row."""
    g = torch.Generator().manual_seed(n + k)
    rows = []
    for kind, valid in (("random", 0), ("random", 1), ("random", k), ("random", k + 1),
                        ("ties", n), ("equal", n), ("random", n), ("big_ids", n)):
        keys = make_keys(kind, 1, n, seed=valid + 1)[0]
        keys[torch.randperm(n, generator=g)[:n - min(valid, n)]] = 0
        rows.append(keys)
    dup = rows[-2].clone()
    dup[::2] = dup[0]
    rows.append(dup)
    many = rows[-3].clone()  # more copies of the top key than any sort holds: 8 passes
    sign = torch.iinfo(torch.int64).min
    many[: n * 5 // 8] = (many ^ sign).max() ^ sign  # the largest unsigned key
    rows.append(many)
    near = rows[-3].clone()  # top byte splits the row in two halves of ~n/2 keys
    near[: n // 2] = near[: n // 2] | (1 << 62)
    rows.append(near)
    check(torch.stack(rows), k, device)


def make_prefix_rows(n: int, k: int, seed: int) -> torch.Tensor:
    """Rows whose nonzero keys share long common prefixes (the CUDA select starts at the
    highest bit where two of them differ), each with n, k + 1, k and k - 1 valid keys (the
    rest key 0, at random positions), then one row per differing bit 0..63 (random low
    bits under a random shared prefix, a fifth of the keys invalid)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(4 * n, generator=g)[:n].to(torch.int32)
    one = torch.ones(n)
    x = torch.tensor(0.37)
    x_up = torch.nextafter(x, torch.tensor(1.0))  # differs from x in the last mantissa bit
    cases = [
        (one * 0.37, 5_000_000 + perm),  # equal scores, ids differing in low bits only
        (one * 0.37, INT32_MAX - perm),  # ids near 2^31 - 1
        (torch.where(torch.rand(n, generator=g) < 0.5, x, x_up), perm),  # last score bit
        (torch.where(torch.rand(n, generator=g) < 0.5, x, x_up), 1000 + perm % 3),
        (one * 0.37, 2 * 12345 + perm % 2),  # two distinct keys (bit 0), many copies
        (one * -2.5, torch.full((n,), 77, dtype=torch.int32)),  # one key, n copies
        (torch.rand(n, generator=g), perm),  # uniform [0, 1): clustered exponents
        (5.0 + 0.01 * torch.randn(n, generator=g), perm),  # narrow positive logits
    ]
    rows = []
    for scores, gids in cases:
        keys = reference.encode_candidate_keys(scores.float(), gids)
        for valid in (n, k + 1, k, k - 1, 1, 0):
            row = keys.clone()
            row[torch.randperm(n, generator=g)[:n - max(0, min(valid, n))]] = 0
            rows.append(row)
    base = torch.randint(-2**62, 2**62, (64,), generator=g) * 2 | 1
    for b in range(64):
        low = torch.randint(-2**62, 2**62, (n,), generator=g) * 2 + 1  # random 64 bits
        low_mask = -1 if b == 63 else (1 << (b + 1)) - 1  # bits 0..b
        prefix = base[b] & ~low_mask
        bit = -2**63 if b == 63 else 1 << b
        row = prefix | (low & low_mask)
        row[torch.rand(n, generator=g) < 0.2] = 0
        row[0] = prefix | bit  # bit b set ...
        row[1] = prefix | (bit - 1 if b < 63 else 2**63 - 1)  # ... and clear in another
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(40, 7), (3000, 100), (8192, 2048), (16384, 2048),
                                 (20000, 4096), (12000, 9000)])
def test_shared_prefix_rows(device, n, k):
    """Rows whose valid keys agree on long prefixes and differ in a single bit, mixed with
    invalid keys and shortfalls: the radix select must resolve every digit window."""
    check(make_prefix_rows(n, k, seed=n + k), k, device)


def make_run_rows(n: int, k: int, rows: int, seed: int) -> torch.Tensor:
    """Rows whose keys come in runs that share all but the low m bits of their high word
    (m = log2 of the CUDA sort size: the next power of two >= min(k, n), at least 512):
    runs of 1 to 9 keys, runs of one score (ordered by id) and of one key (duplicates),
    shortfalls, and negative NaN scores whose high words are below 2^m, next to the
    padding; each row type repeated with fresh numbers. (A sort of the 32-bit prefixes
    with the slot as tie-break must still order these runs by the full keys.)"""
    m = max(9, (min(k, n) - 1).bit_length())
    g = torch.Generator().manual_seed(seed)

    def keys(hi, gids):  # hi: the ordered score bits, [0, 2^32) (reference.ordered_score_bits)
        bits = torch.where(hi >= 2**31, hi - 2**31, ~hi & 0xFFFFFFFF)
        scores = torch.where(bits >= 2**31, bits - 2**32, bits).int().view(torch.float32)
        return reference.encode_candidate_keys(scores, gids)

    def run_heads(run):  # distinct prefixes (positive scores), each `run` times
        span = 2**(31 - m)
        choices = min(span, 4 * n)
        heads = torch.randperm(choices, generator=g)[: n // run + 1] * (span // choices) + span
        return heads.repeat_interleave(run)[:n].long() << m

    out = []
    while len(out) < rows:
        gids = torch.randperm(4 * n, generator=g)[:n].int()
        low = torch.randint(0, 2**m, (n,), generator=g)
        for run in (1, 2, 3, 5, 8, 9):
            out.append(keys(run_heads(run) | low, gids))
        same_score = keys(run_heads(8) | 5, gids)  # runs of equal scores: ids decide
        out.append(same_score)
        dup = same_score.clone()  # runs holding the same key twice
        dup[1::4] = dup[0::4]
        out.append(dup)
        for valid in (k - 1, 30):  # shortfall: padding after the last candidate
            row = keys(run_heads(2) | low, gids)
            row[torch.randperm(n, generator=g)[: n - valid]] = 0
            out.append(row)
            nan_neg = row.clone()  # high words below 2^m: negative NaN scores
            nz = nan_neg.nonzero()[:, 0]
            pick = nz[torch.randperm(len(nz), generator=g)[: max(1, valid // 3)]]
            nan_neg[pick] = keys(torch.randint(1, 2**m, (len(pick),), generator=g),
                                 gids[pick])
            out.append(nan_neg)
    return torch.stack(out[:rows])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(400, 100), (8192, 2048), (16384, 2048), (12000, 3000),
                                 (12000, 9000)])
@pytest.mark.parametrize("rows", [12, 150])
def test_runs_of_shared_prefixes(device, n, k, rows):
    """Runs of keys that agree on their high bits, with shortfalls and negative NaNs next
    to the padding, in CTA pairs (12 rows) and single CTAs (150 rows)."""
    check(make_run_rows(n, k, rows, seed=n + k + rows), k, device)


def make_shared_bit_rows(n: int, rows: int, seed: int) -> torch.Tensor:
    """Rows whose keys share whole bytes below the select's second digit (bits 48..55),
    so several passes each find every remaining key in one bin: scores that differ only
    in their lowest score byte, equal scores with ids that differ only in bits 0..5, two
    keys each repeated (equal below bit 48), bf16 scores with small ids, and the same
    with a few keys that break the shared bits. (Also the cases a select that skips
    shared bytes must get right.)"""
    g = torch.Generator().manual_seed(seed)
    base = torch.full((n,), 0x3F800000, dtype=torch.int64)
    out = []
    for r in range(rows):
        gids = torch.randperm(4 * n, generator=g)[:n].to(torch.int32) + r
        kind = r % 5
        if kind == 0:
            bits = base + torch.randint(0, 256, (n,), generator=g)
        elif kind == 1:
            bits = base.clone()
            gids = torch.randint(0, 64, (n,), generator=g, dtype=torch.int32)
        elif kind == 2:
            bits = base + (torch.randint(0, 2, (n,), generator=g) << 16)
            gids = torch.full((n,), 7 + r, dtype=torch.int32)
        else:
            scores = torch.randn(n, generator=g).bfloat16().float()
            bits = scores.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
            if kind == 4:  # a few full-precision scores among them
                bits[::97] ^= torch.randint(1, 1 << 16, (len(bits[::97]),), generator=g)
        scores = (bits & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        out.append(reference.encode_candidate_keys(scores, gids))
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(600, 300), (4000, 1000), (8192, 2048), (12000, 4000)])
@pytest.mark.parametrize("rows", [10, 100, 150])
def test_shared_low_bytes(device, n, k, rows):
    """Keys sharing whole bytes below the second digit, in CTA pairs (10 rows), one CTA
    of 1024 threads (100) and, past the SM count, 2 CTAs per SM (150 rows on the H200)."""
    check(make_shared_bit_rows(n, rows, seed=n + rows), k, device)


@pytest.mark.parametrize("device", DEVICES)
def test_all_invalid(device):
    check(torch.zeros(3, 40, dtype=torch.int64), 8, device)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_2d(device):
    """A [rows, N] view with a column stride and a padded row stride: read in place."""
    base = make_keys("ties", 6, 2 * 700, seed=5)
    view = base[::2, ::2]  # row stride 2800, column stride 2
    check(view, 129, device)
    transposed = make_keys("random", 300, 5, seed=6).t()  # [5, 300], column stride 5
    check(transposed, 77, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [5, 150])
@pytest.mark.parametrize("W,K,k", [(4, 512, 512), (8, 100, 333), (3, 1, 2), (1, 64, 64),
                                   (8, 2048, 2048), (4, 5000, 1000), (2, 3000, 6000),
                                   (3, 3000, 2000), (5, 1025, 700), (16, 1024, 1024)])
def test_gathered_3d(device, rows, W, K, k):
    """[W, rows, K] (all_gather_into_tensor layout) equals torch.cat along dim 1. On CUDA,
    5 rows run on CTA pairs and 150 rows on one CTA a row; the (segment, 1024-wide chunk)
    counts 3 * 3, 5 * 2 and 16 * 1 sit at the register variants' limits."""
    per_rank = [make_keys("ties", rows, K, seed=10 + w) for w in range(W)]
    gathered = torch.stack(per_rank)  # [W, rows, K]
    concat = torch.cat(per_rank, dim=1)  # [rows, W*K]
    check(gathered, k, device)
    assert torch.equal(run(gathered, k, device), run(concat, k, device))
    # A non-contiguous 3-D view: every other row of a bigger gather.
    bigger = torch.stack([make_keys("random", 2 * rows, K, seed=20 + w) for w in range(W)])
    check(bigger[:, ::2, :], k, device)


@pytest.mark.parametrize("device", DEVICES)
def test_out_buffer(device):
    cands = make_keys("random", 4, 100, seed=7).to(device)
    want = reference.stable_topk_from_candidates(cands.cpu(), 10)
    out = torch.full((4, 10), 123, dtype=torch.int32, device=device)
    assert dsa_ext.stable_topk_from_candidates(cands, 10, out=out) is out
    assert torch.equal(out.cpu(), want)
    strided = torch.full((10, 8), 123, dtype=torch.int32, device=device).t()[:4]  # [4, 10]
    dsa_ext.stable_topk_from_candidates(cands, 10, out=strided)
    assert torch.equal(strided.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows(device):
    out = dsa_ext.stable_topk_from_candidates(
        torch.zeros(0, 10, dtype=torch.int64, device=device), 4)
    assert out.shape == (0, 4)


def _random_keys(rows, n, data):
    score_values = st.one_of(st.sampled_from(SPECIAL_SCORES + [2.0, 2.0, -3.5]),
                             st.floats(width=32, allow_nan=True))
    id_values = st.one_of(st.sampled_from([-1, 0, 1, INT32_MAX]), st.integers(-5, INT32_MAX))
    scores = torch.tensor(data.draw(st.lists(score_values, min_size=rows * n,
                                             max_size=rows * n)), dtype=torch.float32)
    gids = torch.tensor(data.draw(st.lists(id_values, min_size=rows * n, max_size=rows * n)),
                        dtype=torch.int32)
    return reference.encode_candidate_keys(scores, gids).reshape(rows, n)


@given(rows=st.integers(1, 4), n=st.integers(1, 70), k=st.integers(1, 90), data=st.data())
def test_hypothesis_cpu(rows, n, k, data):
    check(_random_keys(rows, n, data), k, "cpu")


@pytest.mark.cuda
@given(rows=st.integers(1, 4), n=st.integers(1, 70), k=st.integers(1, 90), data=st.data())
def test_hypothesis_cuda(rows, n, k, data):
    check(_random_keys(rows, n, data), k, "cuda")


@pytest.mark.cuda
@given(rows=st.integers(1, 4), n=st.integers(1, 70), k=st.integers(1, 90), data=st.data(),
       variant=st.sampled_from(["r4_rank512", "g_rank8192"]))
def test_hypothesis_rank_sort_cuda(rows, n, k, data, variant):
    """The rank sort, forced (registers or streamed), on any scores and ids: its bins span
    whatever range the keys take (signs, infinities, NaNs), and rows whose keys crowd one
    bin (equal scores) take its bitonic fallback."""
    keys = _random_keys(rows, n, data)
    want = reference.stable_topk_from_candidates(keys, k, sorted=True)
    with forced_topk_variant(variant):
        got = run(keys, k, "cuda", sorted=True)
    check_equal(got, want, variant=variant, k=k)


# ---------------------------------------------------------------------------------------
# Errors, torch.compile, graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    good = torch.zeros(2, 8, dtype=torch.int64)
    f = dsa_ext.stable_topk_from_candidates
    with pytest.raises(TypeError, match="candidates must be int64, got torch.int32"):
        f(good.int(), 4)
    with pytest.raises(TypeError, match="candidates must be a torch.Tensor, got list"):
        f([[1, 2]], 4)
    with pytest.raises(ValueError, match=r"candidates must be 2-D .* or 3-D .*, got shape \(8,\)"):
        f(torch.zeros(8, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match=r"at least one candidate .*, got shape \(2, 0\)"):
        f(torch.zeros(2, 0, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match=r"at least one candidate .*, got shape \(0, 2, 5\)"):
        f(torch.zeros(0, 2, 5, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        f(good, 0)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        f(good, 2.0)
    with pytest.raises(TypeError, match="out must be int32, got torch.int64"):
        f(good, 4, out=torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4\), got \(2, 5\)"):
        f(good, 4, out=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"out must be 2-D, got shape \(8,\)"):
        f(good, 4, out=torch.zeros(8, dtype=torch.int32))
    with pytest.raises(TypeError, match="sorted must be a bool, got int"):
        f(good, 4, sorted=1)
    with pytest.raises(ValueError, match=r"out must not have a zero stride .*, got shape "
                                         r"\(2, 4\) and strides \(0, 1\)"):
        f(good, 4, out=torch.zeros(1, 4, dtype=torch.int32).expand(2, 4))


@pytest.mark.cuda
def test_errors_cuda():
    f = dsa_ext.stable_topk_from_candidates
    cands = torch.zeros(2, 20000, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="k must be <= 16384 on CUDA with sorted=True"):
        f(cands, 16385, sorted=True)
    assert (f(cands, 16385) == -1).all()  # the default order has no such limit
    with pytest.raises(ValueError, match="out must be on cuda"):
        f(cands, 4, out=torch.zeros(2, 4, dtype=torch.int32))
    # The kernel's 32-bit counters: N and k past 2^31 - 4096 are refused (no allocation)
    limit = dsa_ext.topk.CUDA_MAX_INDEX
    wide = torch.ones(1, 1, dtype=torch.int64, device="cuda").expand(1, limit + 1)
    with pytest.raises(ValueError, match=f"at most {limit} .* got shape \\(1, {limit + 1}\\)"):
        f(wide, 4)
    with pytest.raises(ValueError, match=f"k must be <= {limit} .* on CUDA, got {limit + 1}"):
        f(cands, limit + 1)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error without a CUDA driver")
def test_missing_driver_is_a_clear_error():
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed")
    except OSError:
        pass
    cands = torch.zeros(1, 4, dtype=torch.int64)
    out = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cannot load the CUDA driver"):
        dsa_ext._C.stable_topk_from_candidates(
            (cands.data_ptr(), 1, 1, 4, 0, 4, 1), (out.data_ptr(), 1, 2, 2, 1), False, 0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    cands = make_keys("ties", 3, 50, seed=8)

    @torch.compile(fullgraph=True)
    def merged(c):
        return (dsa_ext.stable_topk_from_candidates(c, 20) + 0,
                dsa_ext.stable_topk_from_candidates(c, 20, sorted=True) + 0)

    torch._dynamo.reset()
    got, got_sorted = merged(cands.to(device))
    assert torch.equal(got.cpu(), reference.stable_topk_from_candidates(cands, 20))
    assert torch.equal(got_sorted.cpu(),
                       reference.stable_topk_from_candidates(cands, 20, sorted=True))


def test_registered_op_and_fake():
    cands = make_keys("random", 3, 50, seed=9)
    for order in (False, True):
        out = torch.empty(3, 7, dtype=torch.int32)
        torch.ops.dsa_ext.stable_topk_from_candidates(cands, out, order)
        assert torch.equal(out, reference.stable_topk_from_candidates(cands, 7, sorted=order))
        torch.library.opcheck(torch.ops.dsa_ext.stable_topk_from_candidates,
                              (cands, torch.empty(3, 7, dtype=torch.int32), order))


@pytest.mark.cuda
@pytest.mark.parametrize("W,K,k", [(4, 2048, 2048), (8, 2048, 2048), (4, 6000, 3000),
                                   (2, 4096, 8192)])
@pytest.mark.parametrize("order", [False, True])
def test_cuda_no_host_sync(W, K, k, order):
    rows = 64
    host = torch.stack([make_keys("random", rows, K, seed=30 + w) for w in range(W)])
    cands = host.cuda()
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    dsa_ext.stable_topk_from_candidates(cands, k, out=out)  # loads the cubins first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dsa_ext.stable_topk_from_candidates(cands, k, out=out, sorted=order)
        allocated = dsa_ext.stable_topk_from_candidates(cands, k, sorted=order)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = dsa_ext.stable_topk_from_candidates(cands, k, sorted=order)
        torch.cuda.current_stream().wait_stream(side)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = reference.stable_topk_from_candidates(host, k, sorted=order)
    for got in (out, allocated, on_side):
        assert torch.equal(got.cpu(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("W,K,k", [(4, 2048, 2048), (8, 2048, 2048), (4, 6000, 3000),
                                   (2, 4096, 8192)])
@pytest.mark.parametrize("order", [False, True])
def test_cuda_graph_capture_replay(W, K, k, order):
    """Eager, side stream and capture with host syncs as errors, then replays on new data
    (the register, streaming and large-sort variants)."""
    rows = 64
    cands = torch.stack([make_keys("random", rows, K, seed=50 + w) for w in range(W)]).cuda()
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    graph = capture_graph(lambda: dsa_ext.stable_topk_from_candidates(cands, k, out=out,
                                                                      sorted=order))
    for seed, kind in ((60, "ties"), (70, "random"), (80, "shortfall")):
        new = torch.stack([make_keys(kind, rows, K, seed=seed + w) for w in range(W)])
        cands.copy_(new.cuda())
        out.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        check_equal(out, reference.stable_topk_from_candidates(new, k, sorted=order))


@pytest.mark.cuda
def test_cuda_runs_on_the_current_stream():
    """The launch goes to the current stream: it reads the candidates that stream writes
    behind a long sleep (on any other stream it would read the zeros)."""
    cands = make_keys("random", 8, 500, seed=11)
    src = cands.cuda()
    dst = torch.zeros_like(src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 50 ms of GPU clocks
        dst.copy_(src)
        got = dsa_ext.stable_topk_from_candidates(dst, 100)
    side.synchronize()
    assert torch.equal(got.cpu(), reference.stable_topk_from_candidates(cands, 100))


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_runs_on_the_tensors_device():
    """The launch goes to the candidates' device, not the current one."""
    cands = make_keys("random", 8, 500, seed=11)
    with torch.cuda.device(0):
        got = dsa_ext.stable_topk_from_candidates(cands.to("cuda:1"), 100)
    assert got.device.index == 1
    assert torch.equal(got.cpu(), reference.stable_topk_from_candidates(cands, 100))


def test_no_jit_stack_at_run_time():
    """Importing dsa_ext and running the op loads no Triton, CuTeDSL, cuda-python, TVM-FFI
    or NVRTC beyond what torch itself loaded (on the GPU when there is one, else the CPU)."""
    code = textwrap.dedent("""
        import sys, torch
        # Measured against what torch itself loaded (recent torch imports cuda-python when
        # it is installed, and a build venv may preload CuTeDSL through a .pth file).
        before = set(sys.modules)
        maps_before = open("/proc/self/maps").read()
        import dsa_ext
        from dsa_ext import reference
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        keys = reference.encode_candidate_keys(torch.randn(4, 300),
                                               torch.arange(1200, dtype=torch.int32).view(4, 300))
        out = dsa_ext.stable_topk_from_candidates(keys.to(dev), 64)
        assert torch.equal(out.cpu(), reference.stable_topk_from_candidates(keys, 64))
        if dev == "cuda":
            torch.cuda.synchronize()
        banned = [m for m in set(sys.modules) - before
                  if m.split(".")[0] in ("triton", "cutlass", "cutlass_dsl", "tvm_ffi", "cuda")
                  or m.startswith("nvidia_cutlass_dsl")]
        assert not banned, banned
        maps = open("/proc/self/maps").read()
        nvrtc = [line for line in maps.splitlines() if "libnvrtc" in line]
        assert "libnvrtc" in maps_before or not nvrtc, nvrtc[:3]
        print("ok", dev)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("ok")


@pytest.mark.cuda
def test_cuda_offsets_beyond_2_pow_31_elements():
    # Gathered [W=2, rows=2, K] candidates whose rank segments lie 2^31 + 64 elements
    # apart (a 16 GiB buffer): the kernel must form 64-bit addresses.
    seg = 2**31 + 64
    K, k = 64, 48
    big = torch.zeros(seg + 2 * K, dtype=torch.int64, device="cuda")
    cands = big.as_strided((2, 2, K), (seg, K, 1))
    want_src = make_keys("random", 2, 2 * K, seed=7)
    cands.copy_(want_src.view(2, 2, K).transpose(0, 1))
    got = dsa_ext.stable_topk_from_candidates(cands, k)
    want = reference.stable_topk_from_candidates(cands.cpu(), k)
    assert torch.equal(got.cpu(), want)
    del big, cands
    torch.cuda.empty_cache()


#: The default-order variants (cute_dsl_aot/variants.py) and a shape each can run.
DEFAULT_ORDER_VARIANTS = [("p8_u", 8, 1000),
                          ("d8_u", 2, 2048), ("d16_u", 4, 2048), ("r4_u", 2, 2048),
                          ("r8_u", 4, 2048), ("r16_u", 8, 2048), ("g_u", 8, 3000)]


#: Rows of make_small_bins: (keys in the bin, reached after the first pass, copy: None, or
#: "one" (the threshold key copied once, one copy taken) or "taken" (the key above it
#: copied over it: two copies, both taken), invalid keys among those below).
SMALL_BIN_ROWS = [(2, True, None, False), (31, False, "one", True), (32, True, None, True),
                  (33, False, "one", False), (32, False, "taken", False),
                  (2, False, None, True), (31, True, "one", False), (32, False, None, False),
                  (33, True, None, True), (32, True, "taken", True)]


def make_small_bins(rows: int, n: int, k: int, seed: int) -> torch.Tensor:
    """Rows whose k-th largest key sits in a bin of 2, 31, 32 or 33 distinct keys that share
    their top 16 bits, of which only about half are taken (SMALL_BIN_ROWS, in turn). The
    bin is what the first pass leaves when every key above it has another top byte, the
    second when half of them share its top byte. The default order of r4 / r8 resolves
    bins of up to 32 keys with one warp (stable_topk._resolve_small_bin); 33 takes another
    pass first."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(rows):
        size, first_pass, copy, invalid = SMALL_BIN_ROWS[r % len(SMALL_BIN_ROWS)]
        need = (size + 1) // 2  # bin keys taken: the bin is not taken whole
        above = min(k, n - size) - need
        below = n - above - size
        shared = 0 if first_pass else above // 2  # above keys with the bin's top byte
        top = torch.cat([torch.randint(0xC001, 0xC100, (shared,), generator=g),
                         torch.randint(0xC100, 0x10000, (above - shared,), generator=g),
                         torch.full((size,), 0xC000),
                         torch.randint(0x8000, 0xC000, (below,), generator=g)])
        low = torch.randint(0, 0x10000, (n,), generator=g)
        low[above:above + size] = torch.randperm(0x10000, generator=g)[:size]  # distinct
        gids = torch.randperm(4 * n, generator=g)[:n]
        ordered = (top << 16) | low  # the key's high word: ordered score bits
        keys = (ordered - 2**32) * 2**32 + (~gids & 0xFFFFFFFF)  # top >= 0x8000: negative
        bin_order = torch.sort(keys[above:above + size] ^ torch.iinfo(torch.int64).min,
                               descending=True).indices + above
        if copy == "one":  # the threshold key over the next: one of two copies taken
            keys[bin_order[need]] = keys[bin_order[need - 1]]
        elif copy == "taken":  # the key above the threshold over it: both copies taken
            keys[bin_order[need - 1]] = keys[bin_order[need - 2]]
        if invalid:
            keys[above + size:][torch.rand(below, generator=g) < 0.1] = 0
        out.append(keys[torch.randperm(n, generator=g)])
    return torch.stack(out)


def make_pair_copies(rows: int, n: int, k: int, seed: int) -> torch.Tensor:
    """Random rows in which the k-th largest key appears exactly twice (a candidate
    gathered twice), once on each side of the k-th place, or both above or both below it;
    and rows whose k-th place falls among equal scores of distinct ids (not copies)."""
    out = []
    for r in range(rows):
        row = make_keys("random" if r % 4 else "ties", 1, n, seed=seed + r)[0]
        order = torch.sort(row ^ torch.iinfo(torch.int64).min, descending=True).indices
        shift = (0, 1, -1, 0)[r % 4]  # which key the duplicate copies
        src = order[min(n - 1, max(0, k - 1 + shift))]
        dst = order[(k + 5 + r) % n] if r % 2 else order[(r * 7) % n]
        row[dst] = row[src]
        out.append(row)
    return torch.stack(out)


@pytest.mark.cuda
@pytest.mark.parametrize("variant,W,K", DEFAULT_ORDER_VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "shortfall", "pair_copies",
                                  "threshold_copies", "small_bins"])
def test_every_default_order_variant_matches_reference(variant, W, K, kind):
    """Each default-order variant, forced on a shape it can run, equals the reference:
    the select stops on a whole bin, on a bin of copies (found equal before all 64 bits,
    one CTA or a pair adding the AND / OR of both halves), after all 64 bits, or (r4 / r8)
    on a small bin that one warp resolves, with or without copies of its threshold key."""
    check_forced_variant(variant, W, K, min(W * K - 3, 2048), kind, sorted=False)


def check_forced_variant(variant: str, W: int, K: int, k: int, kind: str, sorted: bool) -> None:
    """Five rows of `kind` as [W, rows, K] candidates, run on the forced `variant` (CUDA),
    equal the reference."""
    rows, n = 5, W * K
    if kind == "pair_copies":
        flat = make_pair_copies(rows, n, k, seed=W + K)
    elif kind == "threshold_copies":
        flat = make_threshold_copies(rows, n, k, seed=W * K)
    elif kind == "small_bins":
        flat = make_small_bins(rows, n, k, seed=W * K)
    else:
        flat = make_keys(kind, rows, n, seed=W + K)
    cands = flat.view(rows, W, K).transpose(0, 1).contiguous()
    want = reference.stable_topk_from_candidates(cands, k, sorted=sorted)
    with forced_topk_variant(variant):
        assert dsa_ext._C.stable_topk_variant(W, rows, K, k, sorted, 0) == variant
        got = run(cands, k, "cuda", sorted=sorted)
    check_equal(got, want, variant=variant, kind=kind)


#: Sorting variants and a shape each can run: (variant, W, K); k stays within S.
SORTING_VARIANTS = [("d8_s512", 2, 2048), ("d8_s2048", 2, 2048), ("d16_s1024", 4, 2048),
                    ("r4_s512", 4, 1024), ("r4_s2048", 2, 2048), ("p4_s2048", 4, 1000),
                    ("p4_s4096", 4, 2048), ("p8_s2048", 8, 1000), ("r8_s4096", 4, 2048),
                    ("r16_s2048", 8, 2048), ("g_s1024", 8, 3000),
                    ("r4_rank512", 4, 1024), ("r4_rank4096", 2, 2048), ("r8_rank2048", 4, 2048),
                    ("r8_rank8192", 4, 2048), ("g_rank8192", 8, 3000), ("g_rank16384", 8, 3000)]


@pytest.mark.cuda
@pytest.mark.parametrize("variant,W,K", SORTING_VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "bf16", "shortfall", "pair_copies",
                                  "threshold_copies"])
def test_sorting_variants_match_reference(variant, W, K, kind):
    """Each sorting kind, forced, equals the reference (descending): the select stops when
    the candidates fit the sort, or on a bin of copies of the k-th key (found equal before
    all 64 bits, one CTA or a pair), whose copies are then taken as needed. A rank sort
    bins about one key a bin (random), a few (bf16: equal scores), or falls back to its
    bitonic sort when the bins crowd (ties)."""
    size = int(variant.rsplit("_", 1)[1].removeprefix("rank").removeprefix("s"))
    check_forced_variant(variant, W, K, min(W * K - 3, size - 5), kind, sorted=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(2048, 1000), (4096, 2045), (8192, 2048)])
def test_small_threshold_bins(device, n, k):
    """Bins of 2 to 33 keys at the k-th place, with and without a copied threshold key
    (make_small_bins, every row kind), in the variants the launcher picks for them."""
    check(make_small_bins(len(SMALL_BIN_ROWS), n, k, seed=n + k), k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,n,k", [(3, 4096, 2048), (64, 8192, 2048), (150, 4096, 1000)])
def test_a_duplicated_threshold_key(device, rows, n, k):
    """The side-by-side harness's case: a candidate gathered twice lands at the k-th
    place in some rows (both orders, every row count's variants)."""
    check(make_pair_copies(rows, n, k, seed=rows + n), k, device)


@pytest.mark.cuda
def test_variant_override_errors():
    """A name the build lacks is refused when set; a variant that cannot run the shape
    (8 keys per thread, 1024 threads: N <= 8192) is refused at launch, naming it."""
    with pytest.raises(ValueError, match="no variant named 'x9_u'"):
        dsa_ext._C.set_stable_topk_variant_override("x9_u")
    cands = make_keys("random", 2, 9000).cuda()
    with forced_topk_variant("r8_u"):
        with pytest.raises(ValueError, match="forced variant r8_u cannot run"):
            dsa_ext.stable_topk_from_candidates(cands, 100)
