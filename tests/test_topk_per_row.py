"""The indexer's per-row top-K (docs/ops.md section 9): CPU and CUDA against the reference."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import reference
from dsa_ext.topk import CUDA_MAX_SORTED
from conftest import assert_equal, capture_graph, forced_convert_plan, forced_topk_plan

I32 = torch.int32
BOUNDS = ("lengths", "seq_lens", "next_n", "row_starts", "row_ends")


def run_both(device, logits, k, **kw):
    """Run dsa_ext on `device` and the reference on the CPU; compare ids exactly."""
    want = reference.topk_per_row(logits, k, **kw)
    kw_dev = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
    got = dsa_ext.topk_per_row(logits.to(device), k, **kw_dev)
    ctx = {n: v for n, v in kw.items() if not isinstance(v, torch.Tensor)}
    assert_equal(got, want, k=k, shape=tuple(logits.shape), dtype=logits.dtype, **ctx)
    return got.cpu()


def ids(*rows):
    return torch.tensor(rows, dtype=I32)


# ---------------------------------------------------------------------------------------
# Fixed vectors
# ---------------------------------------------------------------------------------------


def test_doc_example(device):
    x = torch.tensor([[0.1, 3.0, -1.0, 3.0, 2.0]])
    assert run_both(device, x, 3).tolist() == [[1, 3, 4]]
    got = run_both(device, x, 3, row_starts=ids(2), row_ends=ids(5), sorted=True)
    assert got.tolist() == [[1, 2, 0]]


def test_special_values_follow_the_bit_order(device):
    nan, inf = float("nan"), math.inf
    neg_nan = -torch.tensor(nan)  # sign bit set: the lowest key
    x = torch.tensor([[1.0, -0.0, nan, -inf, 0.0, inf, neg_nan.item(), -1.0]])
    # +NaN > +inf > 1 > +0 > -0 > -1 > -inf > -NaN
    got = run_both(device, x, 8, sorted=True)
    assert got.tolist() == [[2, 5, 0, 4, 1, 7, 3, 6]]
    assert run_both(device, x, 4).tolist() == [[0, 2, 4, 5]]


def test_ties_go_to_the_lower_column(device):
    x = torch.zeros(2, 300)
    x[1, 100:] = 1.0
    got = run_both(device, x, 150)
    assert got[0].tolist() == list(range(150))
    assert got[1].tolist() == list(range(100, 250))
    got = run_both(device, x, 150, sorted=True)
    assert got[1].tolist() == list(range(100, 250))


def test_short_rows_give_every_column_then_minus_one(device):
    x = torch.tensor([[5.0, 1.0, 3.0]])
    assert run_both(device, x, 5).tolist() == [[0, 1, 2, -1, -1]]
    assert run_both(device, x, 5, sorted=True).tolist() == [[0, 2, 1, -1, -1]]
    assert run_both(device, x, 1).tolist() == [[0]]
    empty = torch.zeros(3, 0)
    assert run_both(device, empty, 2).tolist() == [[-1, -1]] * 3


def test_bf16_is_ordered_by_its_fp32_value(device):
    x = torch.tensor([[1.0, 1.0078125, -2.0, 3.5, float("inf"), 0.0]], dtype=torch.bfloat16)
    assert run_both(device, x, 3, sorted=True).tolist() == [[4, 3, 1]]


# ---------------------------------------------------------------------------------------
# Row bounds
# ---------------------------------------------------------------------------------------


def test_lengths_clamp_past_the_row(device):
    x = torch.arange(40, dtype=torch.float32).repeat(4, 1)
    got = run_both(device, x, 4, lengths=ids(10, -3, 100, 0))
    assert got.tolist() == [[6, 7, 8, 9], [-1] * 4, [36, 37, 38, 39], [-1] * 4]


def test_decode_rule_for_next_n(device):
    x = torch.arange(32, dtype=torch.float32).repeat(6, 1)
    # rows 0..2 see S[0] - 3 + j + 1 = 8, 9, 10; rows 3..5 see 1, 2, 3 - 2 (S = 1)
    got = run_both(device, x, 2, seq_lens=ids(10, 1), next_n=3, sorted=True)
    assert got.tolist() == [[7, 6], [8, 7], [9, 8], [-1, -1], [-1, -1], [0, -1]]


def test_decode_lengths_per_token(device):
    x = torch.arange(16, dtype=torch.float32).repeat(4, 1)
    seq = torch.tensor([[3, 20], [0, 5]], dtype=I32)
    got = run_both(device, x, 2, seq_lens=seq)
    assert got.tolist() == [[1, 2], [14, 15], [-1, -1], [3, 4]]
    strided = torch.tensor([[3, 9, 20], [0, 9, 5]], dtype=I32)[:, ::2]
    assert torch.equal(run_both(device, x, 2, seq_lens=strided, next_n=2), got)


def test_prefill_windows_clamp(device):
    x = torch.arange(20, dtype=torch.float32).repeat(5, 1)
    ks = ids(3, -5, 18, 25, 7)
    ke = ids(8, 2, 40, 30, 6)
    got = run_both(device, x, 3, row_starts=ks, row_ends=ke)
    # windows [3, 8), [0, 2), [18, 20), [20, 20), [7, 7): ids relative to the start
    assert got.tolist() == [[2, 3, 4], [0, 1, -1], [0, 1, -1], [-1] * 3, [-1] * 3]


# ---------------------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------------------


@st.composite
def topk_cases(draw, max_cols=6000):
    rows = draw(st.integers(1, 6))
    L = draw(st.one_of(st.integers(0, 300), st.integers(0, max_cols),
                       st.sampled_from([2047, 2048, 2049, 4096, 4100])))
    k = draw(st.one_of(st.integers(1, 64), st.integers(1, max(1, L + 5)),
                       st.sampled_from([1, 512, 2048, 4096])))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    values = draw(st.sampled_from(["randn", "ties", "few", "special"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if values == "randn":
        x = torch.randn(rows, L, generator=g)
    elif values == "ties":
        x = torch.randint(0, 16, (rows, L), generator=g).float()
    elif values == "few":
        x = torch.randint(0, 2, (rows, L), generator=g).float()
    else:
        table = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan,
                              -math.nan, 1e-40, -1e-40, 3.0e38])
        x = table[torch.randint(0, len(table), (rows, L), generator=g)]
    x = x.to(dtype)
    kind = draw(st.sampled_from(["full", "lengths", "decode", "decode2d", "range"]))
    kw = {}
    bound = lambda n: torch.randint(-8, L + 9, (n,), generator=g, dtype=I32)  # noqa: E731
    if kind == "lengths":
        kw["lengths"] = bound(rows)
    elif kind == "decode":
        next_n = draw(st.integers(1, 3))
        x = x.repeat(next_n, 1)
        kw = dict(seq_lens=bound(rows), next_n=next_n)
    elif kind == "decode2d":
        x = x.repeat(2, 1)
        kw = dict(seq_lens=bound(2 * rows).reshape(rows, 2))
    elif kind == "range":
        kw = dict(row_starts=bound(rows), row_ends=bound(rows))
    # CUDA sorts at most CUDA_MAX_SORTED ids a row (past it sorted=True raises: its own test)
    kw["sorted"] = draw(st.booleans()) and min(k, L) <= CUDA_MAX_SORTED
    return x, k, kw


@given(topk_cases())
def test_random_cases_cpu(case):
    x, k, kw = case
    run_both(torch.device("cpu"), x, k, **kw)


@pytest.mark.cuda
@given(topk_cases())
def test_random_cases_cuda(case):
    x, k, kw = case
    run_both(torch.device("cuda"), x, k, **kw)


def test_long_row_on_cpu():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, 1 << 20, generator=g)
    x[0, 1000:1100] = 4.5  # a tie block at the threshold region
    for sorted_ in (False, True):
        run_both(torch.device("cpu"), x, 4096, sorted=sorted_)


def test_default_order_is_independent_of_the_batch(device):
    g = torch.Generator().manual_seed(12)
    x = torch.randint(0, 8, (9, 5000), generator=g).float()
    whole = dsa_ext.topk_per_row(x.to(device), 777)
    for i in range(9):
        assert torch.equal(dsa_ext.topk_per_row(x[i:i + 1].to(device), 777), whole[i:i + 1])


# ---------------------------------------------------------------------------------------
# Layouts and buffers
# ---------------------------------------------------------------------------------------


def test_row_stride_and_strided_out(device):
    g = torch.Generator().manual_seed(13)
    base = torch.randn(5, 3001, generator=g).to(device)
    x = base[:, 1:2990]  # row stride 3001, rows start unaligned
    big = torch.full((5, 300), 7, dtype=I32, device=device)
    out = big[:, 3:203:2]
    res = dsa_ext.topk_per_row(x, 100, out=out)
    assert res is out
    assert_equal(out, reference.topk_per_row(x.cpu(), 100))
    untouched = torch.ones(300, dtype=torch.bool)
    untouched[3:203:2] = False
    assert (big[:, untouched] == 7).all()


def test_unaligned_windows(device):
    """Windows starting at every offset modulo 8 (the kernel's vector loads begin past an
    unaligned head)."""
    g = torch.Generator().manual_seed(14)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(16, 5000, generator=g).to(dtype)
        ks = torch.arange(16, dtype=I32)
        ke = 4990 - torch.arange(16, dtype=I32) * 3
        for sorted_ in (False, True):
            run_both(device, x, 1000, row_starts=ks, row_ends=ke, sorted=sorted_)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------

X = torch.zeros(4, 10)


@pytest.mark.parametrize("args, kw, error, text", [
    ((torch.zeros(4, 10, dtype=torch.float16), 2), {}, TypeError,
     "logits must be float32 or bfloat16, got torch.float16"),
    ((torch.zeros(10), 2), {}, ValueError, "logits must be 2-D, got shape (10,)"),
    ((torch.zeros(10, 4).t(), 2), {}, ValueError, "logits must have column stride 1"),
    ((X, 0), {}, ValueError, "k must be >= 1, got 0"),
    ((X, 2.0), {}, TypeError, "k must be an int, got float"),
    ((X, 2), dict(lengths=torch.zeros(4, dtype=torch.int64)), TypeError,
     "lengths must be int32, got torch.int64"),
    ((X, 2), dict(lengths=torch.zeros(3, dtype=I32)), ValueError,
     "lengths must have shape (4,), got (3,)"),
    ((X, 2), dict(seq_lens=torch.zeros(3, dtype=I32)), ValueError,
     "logits must have seq_lens.shape[0] * 1 = 3 rows, got 4"),
    ((X, 2), dict(seq_lens=torch.zeros(2, dtype=I32), next_n=3), ValueError,
     "logits must have seq_lens.shape[0] * 3 = 6 rows, got 4"),
    ((X, 2), dict(seq_lens=torch.zeros(2, 2, dtype=I32), next_n=3), ValueError,
     "next_n (3) applies to 1-D seq_lens"),
    ((X, 2), dict(next_n=2), ValueError, "next_n (2) applies to 1-D seq_lens"),
    ((X, 2), dict(next_n=0), ValueError, "next_n must be >= 1, got 0"),
    ((X, 2), dict(row_starts=torch.zeros(4, dtype=I32)), ValueError,
     "row_starts and row_ends must be given together, got only row_starts"),
    ((X, 2), dict(lengths=torch.zeros(4, dtype=I32), seq_lens=torch.zeros(4, dtype=I32)),
     ValueError, "pass at most one kind of row bounds, got lengths and seq_lens"),
    ((X, 2), dict(sorted=1), TypeError, "sorted must be a bool, got int"),
    ((X, 2), dict(out=torch.zeros(4, 3, dtype=I32)), ValueError,
     "out must have shape (4, 2), got (4, 3)"),
    ((X, 2), dict(out=torch.zeros(4, 2, dtype=torch.int64)), TypeError,
     "out must be int32, got torch.int64"),
    ((X, 2), dict(out=torch.zeros(4, 1, dtype=I32).expand(4, 2)), ValueError,
     "out must not have a zero stride along a dimension of more than one element"),
    (([[1.0]], 2), {}, TypeError, "logits must be a torch.Tensor, got list"),
])
def test_bad_input_names_the_argument(args, kw, error, text):
    with pytest.raises(error) as info:
        dsa_ext.topk_per_row(*args, **kw)
    assert text in str(info.value)


@pytest.mark.cuda
def test_cuda_limits_and_devices():
    with pytest.raises(ValueError, match="lengths must be on cuda"):
        dsa_ext.topk_per_row(X.cuda(), 2, lengths=torch.zeros(4, dtype=I32))
    with pytest.raises(ValueError, match="k must be <= 16384 on CUDA with sorted=True"):
        dsa_ext.topk_per_row(torch.zeros(1, 20000, device="cuda"), 16385, sorted=True)


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(device):
    def step(x, ks, ke, out):
        dsa_ext.topk_per_row(x, 64, row_starts=ks, row_ends=ke, out=out)
        return out + 0

    g = torch.Generator().manual_seed(15)
    x = torch.randn(3, 500, generator=g)
    ks, ke = ids(0, 10, 400), ids(500, 300, 450)
    out = torch.empty(3, 64, dtype=I32, device=device)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(x.to(device), ks.to(device), ke.to(device), out)
    assert_equal(got, reference.topk_per_row(x, 64, row_starts=ks, row_ends=ke))


@pytest.mark.cuda
@pytest.mark.parametrize("sorted_", [False, True])
def test_cuda_graph_replay_with_new_inputs_and_no_sync(sorted_):
    B, next_n, L, k = 8, 4, 40000, 2048
    x = torch.empty(B * next_n, L, device="cuda")
    seq = torch.empty(B, dtype=I32, device="cuda")
    out = torch.empty(B * next_n, k, dtype=I32, device="cuda")

    def step():
        dsa_ext.topk_per_row(x, k, seq_lens=seq, next_n=next_n, sorted=sorted_, out=out)

    x.copy_(torch.randn(B * next_n, L))
    seq.fill_(L)
    graph = capture_graph(step)
    for seed in range(3):
        gen = torch.Generator().manual_seed(200 + seed)
        x.copy_(torch.randint(0, 50, (B * next_n, L), generator=gen).float())
        seq.copy_(torch.randint(-5, L + 100, (B,), generator=gen, dtype=I32))
        graph.replay()
        want = reference.topk_per_row(x.cpu(), k, seq_lens=seq.cpu(), next_n=next_n,
                                      sorted=sorted_)
        assert_equal(out, want, seed=seed)


# ---------------------------------------------------------------------------------------
# Every kernel plan (cluster sizes, resident and streamed slices)
# ---------------------------------------------------------------------------------------


def test_plan_override_takes_only_built_plans():
    from dsa_ext import _C
    for code in (0, 17, 100, 117, 200, 217):
        with pytest.raises(ValueError, match=f"got {code}"):
            _C.set_topk_plan_override(code)


@pytest.mark.cuda
def test_plans_by_shape():
    from dsa_ext import _C
    plan = lambda rows, L: tuple(_C.topk_per_row_plan(rows, L, 0))  # noqa: E731
    # (cluster, slice, resident, short rows, register kernel's CTAs a row): resident slices
    # of at most 4096 columns whose clusters run at once take the register kernel, at 16
    # CTAs a row where 8 give longer slices.
    fits = lambda c: _C.topk_whole_sm_clusters(0, c)  # noqa: E731
    assert plan(1, 32768) == (8, 4096, 1, 0, 8)
    assert plan(8, 16384) == (8, 2048, 1, 0, 8)
    assert plan(1, 65536) == (8, 8192, 1, 0, 16 if fits(16) >= 1 else 0)
    assert plan(2, 50000) == (8, 6250, 1, 0, 16 if fits(16) >= 2 else 0)
    assert plan(1, 65537)[4] == 0  # 4097 columns a CTA at 16
    assert plan(64, 32768) == (2, 16384, 1, 0, 0)
    assert plan(256, 32768) == (1, 32768, 0, 0, 0)  # past one wave: streamed
    # 16 rows of 128K: the most CTAs a row (at most 8) whose 16 clusters run at once at one
    # CTA per SM; a GPC holds whole clusters, so how many fit depends on the chip (the
    # thirty-fourth session's H100s: 15 clusters of 8, 17 of 6).
    cluster, slice_, resident, short, registers = plan(16, 131072)
    assert (slice_, resident, short, registers) == ((131072 + cluster - 1) // cluster, 1, 0, 0)
    assert 16 <= fits(cluster) or cluster == 3  # 3: the fewest whose slices stay resident
    assert cluster == 8 or fits(cluster + 1) < 16
    assert plan(8, 131072) == (8, 16384, 1, 0, 0) or fits(8) < 8  # (15 of 8 fit an H100)
    assert plan(64, 131072) == (2, 65536, 0, 0, 0)  # past one CTA's shared memory: streamed
    assert plan(128, 131072) == (2, 65536, 0, 0, 0)  # one wave of two CTAs per row
    assert plan(256, 131072) == (1, 131072, 0, 0, 0)  # one wave of one, not two of two
    assert plan(512, 131072) == (1, 131072, 0, 0, 0)
    assert plan(1, 1 << 20) == (8, 131072, 0, 0, 0)
    # Rows of at most 8192 columns: the short-row kernel (unsorted ids).
    assert plan(100000, 100)[3] == 1
    assert plan(64, 8192)[3] == 1 and plan(64, 8193)[3] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("L", [1, 100, 1024, 1025, 2048, 2049, 4095, 4096, 4097, 8192])
def test_short_row_kernel_equals_the_cpu(L):
    """Rows of at most 8192 columns take the short-row kernel (each of its widths of 4, 8
    and 16 keys per thread, 256 and 512 threads): many rows of randn, 4-value (ties at the
    threshold) and special values, full or clamped lengths, fp32 and bf16, against the CPU
    and the forced cluster plan."""
    from dsa_ext import _C
    assert _C.topk_per_row_plan(300, L, 0)[3] == 1
    g = torch.Generator().manual_seed(L)
    x = torch.randn(300, L, generator=g)
    x[100:200] = torch.randint(0, 4, (100, L), generator=g).float()
    table = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1.0])
    x[200:] = table[torch.randint(0, len(table), (100, L), generator=g)]
    lengths = torch.randint(-2, L + 3, (300,), generator=g, dtype=I32)
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        for k in (1, 7, 512, 2048, max(1, L - 1)):
            for kw in ({}, {"lengths": lengths}):
                want = dsa_ext.topk_per_row(xs, k, **kw)
                kw_dev = {n: v.cuda() for n, v in kw.items()}
                got = dsa_ext.topk_per_row(xs.cuda(), k, **kw_dev)
                assert_equal(got, want, L=L, k=k, dtype=dtype, lengths=bool(kw))
                with forced_topk_plan(1):
                    assert_equal(dsa_ext.topk_per_row(xs.cuda(), k, **kw_dev), want, L=L, k=k,
                                 dtype=dtype, lengths=bool(kw), plan=1)


def short_rows(rows, L, tied, seed):
    """Rows for the short-row kernel's sinks: randn, the first `tied` of 4 values, and
    lengths past both ends of the row. Returns the generator for the tables too."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, L, generator=g)
    x[:tied] = torch.randint(0, 4, (tied, L), generator=g).float()
    lengths = torch.randint(-2, L + 3, (rows,), generator=g, dtype=I32)
    return g, x, lengths


@pytest.mark.cuda
@pytest.mark.parametrize("L", [100, 2048, 4097, 8192])
def test_short_row_kernel_sinks_equal_the_cpu(L):
    """The short-row kernel's slot and candidate sinks: windows shorter and longer than k,
    ties, missing requests and invalid table entries, slots in place (with and without
    valid counts) and compacted, prefill windows for the candidates; against the reference
    and the forced cluster plan."""
    assert dsa_ext._C.topk_per_row_plan(200, L, 0)[3] == 1
    cuda = torch.device("cuda")
    rows = 200
    g, x, lengths = short_rows(rows, L, 50, L + 1)
    # Block size 12 (not a power of two); the table covers 3/4 of the row: blocks past it.
    table = torch.randint(0, 1 << 16, (5, (3 * L) // 48 + 1), generator=g, dtype=I32)
    table[torch.rand(table.shape, generator=g) < 0.15] = -1
    req = torch.randint(-1, 6, (rows,), generator=g, dtype=I32)
    starts = torch.randint(-3, L, (rows,), generator=g, dtype=I32)
    xb = x.to(torch.bfloat16)
    for k in (7, 512, 2048):
        # The reference selections, once each: every conversion and plan below reuses them.
        ids = {(xs is xb, n): reference.topk_per_row(xs, k, **kw)
               for xs in (x, xb) for n, kw in enumerate(({}, {"lengths": lengths}))}
        ids_window = reference.topk_per_row(x, k, row_starts=starts, row_ends=lengths)
        for plan in (-1, 1):
            with forced_topk_plan(plan):
                for n, kw in enumerate(({}, {"lengths": lengths})):
                    for xs, compact, counts in ((x, False, True), (x, False, False),
                                                (x, True, True), (xb, True, True)):
                        slots_both(cuda, xs, k, req, table, 12, counts=counts, compact=compact,
                                   ids=ids[xs is xb, n], **kw)
                candidates_both(cuda, x, k, 1, 4, 2, ids=ids[False, 0])
                candidates_both(cuda, x, k, 3, 4, 1, ids=ids_window, row_starts=starts,
                                row_ends=lengths)


@pytest.mark.cuda
@pytest.mark.parametrize("L", [100, 2048, 4000, 8192])
def test_short_row_slots_power_of_two_blocks(L):
    """The short-row slot sink with a power-of-two block size (decode_slots): tiles whose ids
    all have slots (written as they are) beside tiles with invalid ones (the scan), one tile
    of the conversion or several (k past 2048), windows shorter than k, slots past 2^31."""
    assert dsa_ext._C.topk_per_row_plan(96, L, 0)[3] == 1
    cuda = torch.device("cuda")
    rows = 96
    g, x, lengths = short_rows(rows, L, 16, L + 2)
    # Requests 0 and 1 cover the row (1 with one entry whose slot is past 2^31 at stride
    # 3 * 64), 2 has every third block invalid, 3 only the first half; 4 and -1 none.
    table = torch.randint(0, 1 << 16, (4, L // 64 + 1), generator=g, dtype=I32)
    table[1, L // 128] = (1 << 31) // 128
    table[2, ::3] = -1
    table[3, L // 128:] = -1
    req = torch.randint(-1, 5, (rows,), generator=g, dtype=I32)
    req[:8] = 0
    for k in (7, 2048, 3000, 5000, 8192):
        for kw in ({}, {"lengths": lengths}):
            ids = reference.topk_per_row(x, k, **kw)  # once for the conversions below
            for compact in (False, True):
                for stride in (64, 3 * 64):
                    slots_both(cuda, x, k, req, table, 64, compact=compact, block_stride=stride,
                               ids=ids, **kw)
            slots_both(cuda, x, k, req, table, 64, counts=False, ids=ids, **kw)


PLANS = [1, 2, 3, 5, 6, 8, 16, 101, 104, 108, 201, 205, 208, 216]


@pytest.mark.cuda
@pytest.mark.parametrize("plan", PLANS)
@given(case=topk_cases(max_cols=20000))
def test_every_plan_matches_reference(plan, case):
    x, k, kw = case
    with forced_topk_plan(plan):
        run_both(torch.device("cuda"), x, k, **kw)


@pytest.mark.cuda
@pytest.mark.parametrize("L, plan", [(1 << 20, -1), ((1 << 20) + 3, -1), (300000, 8),
                                     (400000, 16)])
def test_long_rows_on_cuda_equal_the_cpu(L, plan):
    g = torch.Generator().manual_seed(L)
    x = torch.randn(2, L, generator=g)
    x[1] = torch.randint(0, 16, (L,), generator=g).float()
    with forced_topk_plan(plan):
        for k, sorted_ in ((2048, False), (4096, True), (70000, False)):
            got = dsa_ext.topk_per_row(x.cuda(), k, sorted=sorted_)
            assert_equal(got, dsa_ext.topk_per_row(x, k, sorted=sorted_), L=L, k=k)


def special_row(L, g):
    """randn with 16 each of +NaN, -NaN, +inf and -inf at random columns."""
    special = torch.randn(L, generator=g)
    at = torch.randint(0, L, (64,), generator=g)
    special[at[:16]] = math.nan
    special[at[16:32]] = -math.nan
    special[at[32:48]] = math.inf
    special[at[48:]] = -math.inf
    return special


def capture_rows(L, dtype, seed):
    """Rows for each path of the streamed capture (capture_floor in
    topk_candidates.cuh): the floor at or below the threshold digit (randn, 16 values,
    uniform), the list overflowing (ascending, a rising trend), the floor above the
    threshold digit (descending; all equal, whose floor the fill rule raises), and special
    values (NaN, +-inf) in every slice."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(L, generator=g), torch.randint(0, 16, (L,), generator=g).float(),
            torch.rand(L, generator=g), torch.sort(torch.randn(L, generator=g)).values,
            torch.sort(torch.randn(L, generator=g), descending=True).values,
            torch.full((L,), 0.5), torch.linspace(0, 8, L) + torch.randn(L, generator=g)]
    special = special_row(L, g)
    rows.append(special)
    return torch.stack(rows).to(dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# Slices of kCaptureMinSlice (32768) columns capture in fp32, walk in bf16; longer ones capture
# in both; (32767, 101), (20000, 101) and (131072, 104) walk; one CTA of 131072 and 140000
# columns marks two and three bitmap segments from its list.
@pytest.mark.parametrize("L, plan", [(131072, 102), (131075, 102), (40000, 101), (32768, 101),
                                     (32767, 101), (20000, 101), (131072, 104), (131072, 101),
                                     (140000, 101)])
def test_streamed_capture_paths(dtype, L, plan):
    x = capture_rows(L, dtype, L + plan)
    with forced_topk_plan(plan):
        # 6000: past the stage, so a captured list of several segments counts its totals.
        for k in (1, 512, 2048, 4096, 6000, 10111, 10112):
            run_both(torch.device("cuda"), x, k)
            # Unaligned slices and ragged windows: the captured head and tail columns.
            starts = torch.arange(8, dtype=I32) * 3 + 1
            run_both(torch.device("cuda"), x, k, row_starts=starts,
                     row_ends=torch.full((8,), L, dtype=I32) - starts)
        # The sorted rewrite and topk_to_slots' ids share the captured selection.
        run_both(torch.device("cuda"), x, 2048, sorted=True)
        table = torch.arange(8 * (L // 64 + 1), dtype=I32).reshape(8, -1) * 3
        slots_both(torch.device("cuda"), x, 2048, torch.arange(8, dtype=I32), table, 64,
                   compact=True)


@pytest.mark.cuda
@pytest.mark.parametrize("plan", [102, 101, 104])
def test_streamed_single_key_bin(plan):
    # A first-digit bin that holds one key (heavy ties) ends the selection after pass 1,
    # from the candidate list (a rare top value) or from a walk (a third of the row).
    L = 131072
    g = torch.Generator().manual_seed(plan)
    rare = (torch.rand(4, L, generator=g) < 0.02).float() * 2
    rare += torch.randint(0, 2, (4, L), generator=g)  # 3 and 2 about 1% each, then 1 and 0
    common = torch.randint(0, 3, (4, L), generator=g).float()
    x = torch.cat([rare, common])
    lengths = torch.arange(8, dtype=I32) * 9000 + 60000
    with forced_topk_plan(plan):
        for dtype in (torch.float32, torch.bfloat16):
            for k in (1, 512, 2048, 4096):
                run_both(torch.device("cuda"), x.to(dtype), k)
                run_both(torch.device("cuda"), x.to(dtype), k, lengths=lengths)


def resident_rows(L, seed):
    """Rows for each path of the resident candidate walk (collect_resident_candidates in
    topk_candidates.cuh): randn (the list ends the selection in pass 1), 16 values (a
    bin past the list: the slice is walked), a cluster of 1500 keys one above another in
    the low 10 bits beside randn (for k = 500: the list serves passes 1 and 2), and special
    values."""
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randn(L, generator=g)
    at = torch.randperm(L, generator=g)[:1500]
    bits = torch.tensor(3.0).view(I32) + torch.randint(0, 1024, (1500,), generator=g, dtype=I32)
    cluster[at] = bits.view(torch.float32)
    special = special_row(L, g)
    return torch.stack([torch.randn(L, generator=g),
                        torch.randint(0, 16, (L,), generator=g).float(), cluster, special])


@pytest.mark.cuda
# One CTA of up to 45056 keys (several 32-key flushes a thread, a last partial batch), and
# clusters of 2 and 8; unaligned lengths leave a checked batch.
@pytest.mark.parametrize("L, plan", [(45056, 1), (44979, 1), (32768, 2), (16389, 2),
                                     (32768, 8), (4099, 8)])
def test_resident_collect_paths(L, plan):
    x = resident_rows(L, L + plan)
    starts = torch.arange(4, dtype=I32) * 5 + 1
    with forced_topk_plan(plan):
        for dtype in (torch.float32, torch.bfloat16):
            for k in (1, 500, 2048, 4096):
                run_both(torch.device("cuda"), x.to(dtype), k)
                run_both(torch.device("cuda"), x.to(dtype), k, row_starts=starts,
                         row_ends=torch.full((4,), L, dtype=I32) - starts)
        table = torch.arange(4 * (L // 64 + 1), dtype=I32).reshape(4, -1) * 3
        req = torch.arange(4, dtype=I32)
        slots_both(torch.device("cuda"), x, 500, req, table, 64, compact=True)
        slots_both(torch.device("cuda"), x, 500, req, table, 64, counts=False)
        candidates_both(torch.device("cuda"), x, 500, 1, 4, 2)


@pytest.mark.cuda
# The register kernel: full and partial slices (their ends past the row's), clusters of 1
# to 16 (-1: the default plan's 16 CTAs a row).
@pytest.mark.parametrize("L, plan", [(32768, 208), (4000, 201), (4096, 201), (2050, 201),
                                     (16389, 205), (33000, 209), (65536, 216), (60001, -1)])
def test_register_kernel_paths(L, plan):
    from dsa_ext import _C
    x = resident_rows(L, L + plan)
    starts = torch.arange(4, dtype=I32) * 5 + 1
    lengths = torch.tensor([L, L - 7, 2048, 1], dtype=I32)
    if plan < 0 and _C.topk_whole_sm_clusters(0, 16) < 4:
        pytest.skip("4 clusters of 16 do not fit this device at once")
    with forced_topk_plan(plan):
        assert _C.topk_per_row_plan(4, L, 0)[4] == (plan - 200 if plan > 0 else 16)
        for dtype in (torch.float32, torch.bfloat16):
            for k in (1, 500, 2048, 4096):
                run_both(torch.device("cuda"), x.to(dtype), k)
                run_both(torch.device("cuda"), x.to(dtype), k, lengths=lengths)
                run_both(torch.device("cuda"), x.to(dtype), k, row_starts=starts,
                         row_ends=torch.full((4,), L, dtype=I32) - starts)
            run_both(torch.device("cuda"), x.to(dtype), 2048, sorted=True)  # cluster kernel
        candidates_both(torch.device("cuda"), x, 500, 1, 4, 2)
        candidates_both(torch.device("cuda"), x, 2048, 0, 2, 1)
        # Slots of these selections (the ids, then their conversion in place; at one CTA a
        # row the cluster kernel's plain slot sink): entries -1 / -2 and a table too narrow
        # for the rows' last blocks at block size 3 (invalid slots), convert_pow2 (64,
        # strides 64 and 192) and the general division (3); plain, counted, compacted.
        g = torch.Generator().manual_seed(L)
        table = torch.randint(-2, 1 << 16, (3, L // 3 - 5), generator=g, dtype=I32)
        req = torch.tensor([0, 2, -1, 1], dtype=I32)
        for bs, stride in ((64, 64), (64, 192), (3, 3)):
            for dtype in (torch.float32, torch.bfloat16):
                for k in (500, 2048, 4096):
                    slots_both(torch.device("cuda"), x.to(dtype), k, req, table, bs,
                               counts=False, block_stride=stride)
                slots_both(torch.device("cuda"), x.to(dtype), 2048, req, table, bs,
                           counts=False, block_stride=stride, lengths=lengths)
                slots_both(torch.device("cuda"), x.to(dtype), 2048, req, table, bs,
                           counts=False, block_stride=stride, row_starts=starts,
                           row_ends=torch.full((4,), L, dtype=I32) - starts)
            for k in (500, 4096):
                slots_both(torch.device("cuda"), x, k, req, table, bs, block_stride=stride)
                slots_both(torch.device("cuda"), x, k, req, table, bs, block_stride=stride,
                           compact=True)
                slots_both(torch.device("cuda"), x, k, req, table, bs, block_stride=stride,
                           compact=True, counts=False, lengths=lengths)


@pytest.mark.cuda
@pytest.mark.parametrize("plan", [2, 8])
def test_resident_register_builds(plan):
    # A resident launch whose clusters all fit the chip at one CTA per SM runs the build
    # with the whole SM's registers; more rows than fit run the 64-register build. Both
    # against the CPU, on the same rows, every sink.
    g = torch.Generator().manual_seed(plan)
    many = torch.randn(600, 8192 + 3, generator=g)
    many[1::2] = torch.randint(0, 16, (300, many.shape[1]), generator=g).float()
    table = torch.arange(600 * 130, dtype=I32).reshape(600, 130) * 3
    with forced_topk_plan(plan):
        for rows in (1, 600):
            x = many[:rows]
            req = torch.arange(rows, dtype=I32)
            for dtype in (torch.float32, torch.bfloat16):
                run_both(torch.device("cuda"), x.to(dtype), 2048)
            slots_both(torch.device("cuda"), x, 2048, req, table, 64, compact=True)
            candidates_both(torch.device("cuda"), x, 2048, 1, 4, 2)


@pytest.mark.cuda
def test_streamed_capture_register_builds():
    # More CTAs than fit at one CTA per SM run the 64-register build: a merged slice (plan
    # 101, two bitmap segments, every tie taken) positions its ids from the list
    # (list_positions), one-segment slices (plan 102, 64K) visit their bitmap words. The
    # ids, ragged windows, the sorted rewrite and the DCP candidates against the CPU.
    x = capture_rows(131072, torch.float32, 7).repeat(20, 1)  # 160 rows: past 148 SMs
    starts = (torch.arange(160, dtype=I32) % 5) * 3
    ends = torch.full((160,), 131072, dtype=I32) - starts
    for plan in (101, 102):
        with forced_topk_plan(plan):
            for k in (1, 2048, 4096):
                run_both(torch.device("cuda"), x, k)
            run_both(torch.device("cuda"), x, 2048, row_starts=starts, row_ends=ends)
            run_both(torch.device("cuda"), x, 2048, sorted=True)
            candidates_both(torch.device("cuda"), x, 2048, 1, 4, 2)


@pytest.mark.cuda
def test_streamed_capture_multi_segment_bf16():
    # Slices past the bitmaps (kSegmentColumns) mark their segments from the captured list
    # (or walk them where it overflowed); the last segment holds 3 columns.
    L = 2 * 131072 + 5
    x = capture_rows(L, torch.bfloat16, L)
    with forced_topk_plan(102):
        for k in (512, 2048):
            run_both(torch.device("cuda"), x, k)


# ---------------------------------------------------------------------------------------
# topk_to_slots: the top-K through the index conversion (one kernel on short rows and on
# plain slots of one-CTA-per-SM launches in clusters of 1-2, else the ids kernel and the
# conversion in place)
# ---------------------------------------------------------------------------------------


def slots_both(device, x, k, req_id, table, block_size, counts=True, ids=None, **kw):
    """topk_to_slots on `device` equals the reference; with `counts`, its valid counts too
    (without them neither kernel counts the valid slots: other paths). `ids`: the reference
    selection of these rows and bounds (reference.topk_per_row), for callers that check
    several conversions of one selection (the reference's sort is the slow part)."""
    if ids is None:
        want, want_counts = reference.topk_to_slots(x, k, req_id, table, block_size, **kw)
    else:  # reference.topk_to_slots, its selection given
        want, want_counts = reference.convert_req_index_to_global_index(
            req_id, table, ids, block_size, block_stride=kw.get("block_stride"),
            compact=kw.get("compact", False))
    dev = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
    result = dsa_ext.topk_to_slots(x.to(device), k, req_id.to(device), table.to(device),
                                   block_size, return_valid_counts=counts, **dev)
    got, got_counts = result if counts else (result, None)
    ctx = {n: v for n, v in kw.items() if not isinstance(v, torch.Tensor)}
    assert_equal(got, want, k=k, shape=tuple(x.shape), **ctx)
    if counts:
        assert_equal(got_counts, want_counts, k=k, **ctx)
        got_counts = got_counts.cpu()
    return got.cpu(), got_counts


def test_slots_vector(device):
    x = torch.tensor([[0.5, 2.0, -1.0, 3.0, 1.0, 9.0]] * 3)
    table = torch.tensor([[10, -1], [7, 8]], dtype=I32)
    req = ids(0, 1, 5)  # row 2: no such request
    got, counts = slots_both(device, x, 4, req, table, 4)
    # ids 1, 3, 4, 5: row 0 -> 41, 43, then block 1 holds -1 (a negative slot): invalid
    assert got.tolist() == [[41, 43, -1, -1], [29, 31, 32, 33], [-1] * 4]
    assert counts.tolist() == [2, 4, 0]
    got, _ = slots_both(device, x, 4, req, table, 4, compact=True, block_stride=16)
    assert got.tolist() == [[161, 163, -1, -1], [113, 115, 128, 129], [-1] * 4]


@st.composite
def slots_cases(draw, max_cols=6000):
    x, k, kw = draw(topk_cases(max_cols))
    kw.pop("sorted")
    rows, L = x.shape
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    # 3: the general conversion (convert_pow2 fails), beside the kernels' shift paths
    block_size = draw(st.sampled_from([1, 3, 4, 64]))
    blocks = draw(st.integers(1, max(1, L // block_size + 2)))
    table = torch.randint(-2, 1 << 16, (3, blocks), generator=g, dtype=I32)
    req = torch.randint(-1, 4, (rows,), generator=g, dtype=I32)
    kw["compact"] = draw(st.booleans())
    kw["block_stride"] = block_size * draw(st.sampled_from([1, 3]))
    return x, k, req, table, block_size, kw


@given(slots_cases())
def test_slots_random_cases_cpu(case):
    x, k, req, table, block_size, kw = case
    slots_both(torch.device("cpu"), x, k, req, table, block_size, **kw)


@pytest.mark.cuda
@pytest.mark.parametrize("plan", [-1, 1, 3, 8, 104, 205])
@given(case=slots_cases(max_cols=20000), counts=st.booleans())
def test_slots_every_plan_matches_reference(plan, case, counts):
    x, k, req, table, block_size, kw = case
    want, want_counts = reference.topk_to_slots(x, k, req, table, block_size, **kw)
    dev = {n: v.cuda() if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
    with forced_topk_plan(plan):
        got = dsa_ext.topk_to_slots(x.cuda(), k, req.cuda(), table.cuda(), block_size,
                                    return_valid_counts=counts, **dev)
    if counts:
        got, got_counts = got
        assert_equal(got_counts, want_counts)
    assert_equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("plan, L, k", [(1, 20000, 6000), (2, 300000, 12000), (101, 300000, 9000)])
@pytest.mark.parametrize("compact", [False, True])
def test_slots_past_the_stage_keep_column_order(plan, L, k, compact):
    """More selected ids per CTA than the ids kernel stages (kStagedSlots: it writes them
    from its bitmaps; without counts these plans take the cluster kernel's plain slot sink,
    which stages and converts them a chunk at a time), with one bitmap segment per slice
    (plan 1) and several (150K- and 300K-column slices): in place and compacted slots in
    column order, and the valid counts."""
    g = torch.Generator().manual_seed(L + k)
    x = torch.randn(2, L, generator=g)
    x[1] = torch.randint(0, 16, (L,), generator=g).float()
    table = torch.randint(0, 1 << 16, (3, L // 64 + 1), generator=g, dtype=I32)
    table[torch.rand(table.shape, generator=g) < 0.15] = -1  # invalid slots to compact out
    req = torch.tensor([0, 2], dtype=I32)
    with forced_topk_plan(plan):
        slots_both(torch.device("cuda"), x, k, req, table, 64, compact=compact)
        if not compact:  # no counts asked for
            want, _ = reference.topk_to_slots(x, k, req, table, 64)
            got = dsa_ext.topk_to_slots(x.cuda(), k, req.cuda(), table.cuda(), 64)
            assert_equal(got, want, k=k, L=L)


@pytest.mark.cuda
@pytest.mark.parametrize("convert_plan", [0, 1, 8])
@pytest.mark.parametrize("compact", [False, True])
def test_slots_in_place_conversion_every_plan(convert_plan, compact):
    """Rows past the short-row kernel in clusters of 8 (top-K plan 8) take the ids kernel,
    then the conversion in place on `out`: under each conversion plan (0: one CTA per row,
    tile after tile; 1, 8: split rows, whose compacting parts write only once every part of
    the row has read its ids), with and without valid counts."""
    g = torch.Generator().manual_seed(77 + convert_plan)
    x = torch.randn(6, 20000, generator=g)
    table = torch.randint(0, 1 << 16, (3, 20000 // 64 + 1), generator=g, dtype=I32)
    table[torch.rand(table.shape, generator=g) < 0.2] = -1  # invalid slots to compact out
    req = torch.tensor([0, 1, 2, -1, 1, 0], dtype=I32)
    with forced_topk_plan(8), forced_convert_plan(convert_plan):
        for counts in (True, False):
            slots_both(torch.device("cuda"), x, 4096, req, table, 64, counts=counts,
                       compact=compact)


@pytest.mark.cuda
def test_slots_graph_replay_and_compile():
    rows, L, k = 16, 30000, 2048
    g = torch.Generator().manual_seed(21)
    x = torch.randn(rows, L, generator=g).cuda()
    table = torch.randint(0, 1 << 16, (4, L // 64 + 1), generator=g, dtype=I32).cuda()
    req = torch.randint(0, 4, (rows,), generator=g, dtype=I32).cuda()
    lens = torch.randint(0, L, (rows,), generator=g, dtype=I32).cuda()
    out = torch.empty(rows, k, dtype=I32, device="cuda")
    counts = torch.empty(rows, dtype=I32, device="cuda")

    def step():
        dsa_ext.topk_to_slots(x, k, req, table, 64, lengths=lens, compact=True, out=out,
                              valid_counts=counts)

    graph = capture_graph(step)
    for seed in range(2):
        gen = torch.Generator().manual_seed(300 + seed)
        x.copy_(torch.randint(0, 30, (rows, L), generator=gen).float())
        lens.copy_(torch.randint(-3, L + 3, (rows,), generator=gen, dtype=I32))
        graph.replay()
        want, want_counts = reference.topk_to_slots(x.cpu(), k, req.cpu(), table.cpu(), 64,
                                                    lengths=lens.cpu(), compact=True)
        assert_equal(out, want, seed=seed)
        assert_equal(counts, want_counts, seed=seed)
    torch._dynamo.reset()
    compiled = torch.compile(lambda: (step(), out + 0)[1], fullgraph=True)
    assert_equal(compiled(), want)


def test_slots_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"req_id must have shape \(4,\), got \(3,\)"):
        dsa_ext.topk_to_slots(X, 2, torch.zeros(3, dtype=I32), torch.zeros(1, 2, dtype=I32), 4)
    with pytest.raises(ValueError, match="block_stride must be >= 4, got 2"):
        dsa_ext.topk_to_slots(X, 2, torch.zeros(4, dtype=I32), torch.zeros(1, 2, dtype=I32), 4,
                              block_stride=2)
    with pytest.raises(ValueError, match=r"valid_counts must have shape \(4,\)"):
        dsa_ext.topk_to_slots(X, 2, torch.zeros(4, dtype=I32), torch.zeros(1, 2, dtype=I32), 4,
                              valid_counts=torch.zeros(5, dtype=I32))


# ---------------------------------------------------------------------------------------
# topk_to_candidates: the top-K packed into DCP candidate keys, one kernel
# ---------------------------------------------------------------------------------------


def candidates_both(device, x, k, rank, world, interleave, ids=None, **kw):
    """topk_to_candidates on `device` equals the reference; `ids` as in slots_both."""
    if ids is None:
        want = reference.topk_to_candidates(x, k, rank, world, interleave, **kw)
    else:  # reference.topk_to_candidates, its selection given
        want = reference.pack_dcp_topk_candidates(x, ids, rank, world, interleave,
                                                  kw.get("row_starts"))
    dev = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
    got = dsa_ext.topk_to_candidates(x.to(device), k, rank, world, interleave, **dev)
    assert_equal(got, want, k=k, shape=tuple(x.shape), rank=rank, world=world)
    return got.cpu()


def test_candidates_vector(device):
    x = torch.tensor([[0.5, 2.0, -1.0, 4.0]])
    keys = candidates_both(device, x, 5, 1, 2, 1)
    assert reference.decode_candidate_gids(keys).tolist() == [[1, 3, 5, 7, -1]]
    # a row start past the row: no column, every key invalid; a negative start reads
    # the clamped column as the unfused pack does
    x2 = torch.tensor([[0.5, 2.0, -1.0, 4.0]] * 2)
    keys = candidates_both(device, x2, 2, 0, 1, 1, row_starts=ids(-2, 9), row_ends=ids(4, 9))
    assert reference.decode_candidate_gids(keys).tolist() == [[1, 3], [-1, -1]]


@st.composite
def candidates_cases(draw, max_cols=6000):
    x, k, kw = draw(topk_cases(max_cols))
    kw.pop("sorted")
    world = draw(st.integers(1, 8))
    return x.float(), k, draw(st.integers(0, world - 1)), world, draw(
        st.sampled_from([1, 2, 64])), kw


@given(candidates_cases())
def test_candidates_random_cases_cpu(case):
    candidates_both(torch.device("cpu"), *case[:5], **case[5])


@pytest.mark.cuda
@pytest.mark.parametrize("plan", [-1, 2, 16, 108, 205])
@given(case=candidates_cases(max_cols=20000))
def test_candidates_every_plan_matches_reference(plan, case):
    with forced_topk_plan(plan):
        candidates_both(torch.device("cuda"), *case[:5], **case[5])


def test_candidates_then_merge_equals_the_unsharded_topk():
    """DCP: each rank's fused candidates, gathered and merged, give the top-K of the whole
    (unsharded) rows."""
    g = torch.Generator().manual_seed(22)
    world, interleave, L, k = 4, 2, 4000, 300
    full = torch.randint(0, 40, (3, L), generator=g).float()
    position = torch.arange(L)
    gathered = []
    for r in range(world):
        local = full[:, reference.dcp_owner(position, world, interleave) == r]
        gathered.append(dsa_ext.topk_to_candidates(local.contiguous(), k, r, world, interleave))
    merged = dsa_ext.stable_topk_from_candidates(torch.stack(gathered), k, sorted=True)
    assert_equal(merged, reference.topk_per_row(full, k, sorted=True))


def test_candidates_torch_compile_fullgraph(device):
    def step(x, ks, ke, out):
        dsa_ext.topk_to_candidates(x, 64, 1, 4, 2, row_starts=ks, row_ends=ke, out=out)
        return out + 0

    g = torch.Generator().manual_seed(23)
    x = torch.randn(3, 500, generator=g)
    ks, ke = ids(0, 10, 400), ids(500, 300, 450)
    out = torch.empty(3, 64, dtype=torch.int64, device=device)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(x.to(device), ks.to(device), ke.to(device), out)
    assert_equal(got, reference.topk_to_candidates(x, 64, 1, 4, 2, row_starts=ks,
                                                   row_ends=ke))


@pytest.mark.cuda
def test_candidates_graph_replay_with_new_inputs_and_no_sync():
    rows, L, k = 16, 30000, 2048
    x = torch.empty(rows, L, device="cuda")
    ks = torch.zeros(rows, dtype=I32, device="cuda")
    ke = torch.full((rows,), L, dtype=I32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int64, device="cuda")

    def step():
        dsa_ext.topk_to_candidates(x, k, 2, 4, 16, row_starts=ks, row_ends=ke, out=out)

    x.copy_(torch.randn(rows, L))
    graph = capture_graph(step)
    for seed in range(2):
        gen = torch.Generator().manual_seed(310 + seed)
        x.copy_(torch.randint(0, 30, (rows, L), generator=gen).float())
        starts = torch.randint(-3, 2000, (rows,), generator=gen, dtype=I32)
        ks.copy_(starts)
        ke.copy_(starts + torch.randint(0, L, (rows,), generator=gen, dtype=I32))
        graph.replay()
        want = reference.topk_to_candidates(x.cpu(), k, 2, 4, 16, row_starts=ks.cpu(),
                                            row_ends=ke.cpu())
        assert_equal(out, want, seed=seed)


def test_candidates_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="logits must be float32 .* got torch.bfloat16"):
        dsa_ext.topk_to_candidates(X.bfloat16(), 2, 0, 2)
    with pytest.raises(ValueError, match=r"rank must be < world_size \(2\), got 2"):
        dsa_ext.topk_to_candidates(X, 2, 2, 2)
    with pytest.raises(TypeError, match="out must be int64"):
        dsa_ext.topk_to_candidates(X, 2, 0, 2, out=torch.zeros(4, 2, dtype=I32))


# ---------------------------------------------------------------------------------------
# merge_topk_global_from_logits: logits -> fused candidates -> exchange -> stable top-K
# ---------------------------------------------------------------------------------------


def rank_windows(case, rank):
    """This rank's window bounds: its local lengths, after its row start when padded."""
    r = case["ranks"][rank]
    local_len = reference.dcp_local_length(case["lengths"], rank, case["world"],
                                           case["interleave"]).to(I32)
    if r["row_starts"] is None:
        return dict(lengths=local_len.to(r["logits"].device))
    starts = r["row_starts"]
    return dict(row_starts=starts, row_ends=starts + local_len.to(starts.device))


def merge_from_logits_on(device, seed, world, interleave, rows=7, max_len=120, k=12,
                         ties=True, row_starts=False):
    """Every rank's merge from its logits, through a fake exchange of the reference's
    candidates: the stacked candidates' default order, or with sorted=True the unsharded
    top-K; the default order holds the unsharded set."""
    from dcp_cases import fake_all_gather, make_topk_case
    case = make_topk_case(seed, world, interleave, rows=rows, max_len=max_len, k=k,
                          ties=ties, row_starts=row_starts, device=device)
    packed = [reference.topk_to_candidates(r["logits"].cpu(), k, rank, world, interleave,
                                           **{n: v.cpu() for n, v in
                                              rank_windows(case, rank).items()})
              for rank, r in enumerate(case["ranks"])]
    gathered_order = reference.stable_topk_from_candidates(torch.stack(packed), k)
    for rank, r in enumerate(case["ranks"]):
        for order in (False, True):
            got = dsa_ext.merge_topk_global_from_logits(
                r["logits"], k, rank=rank, world_size=world, interleave=interleave,
                all_gather=fake_all_gather([p.to(device) for p in packed], rank),
                sorted=order, **rank_windows(case, rank))
            want = (reference.topk_per_row(case["scores"], k, lengths=case["lengths"],
                                           sorted=True) if order else gathered_order)
            assert_equal(got, want, rank=rank, seed=seed, sorted=order)
    unsharded = reference.topk_per_row(case["scores"], k, lengths=case["lengths"])
    assert torch.equal(gathered_order.sort(dim=1).values, unsharded.sort(dim=1).values)


@pytest.mark.parametrize("world, interleave", [(4, 1), (2, 16), (4, 2)])
def test_merge_from_logits_equals_the_unsharded_topk(device, world, interleave):
    for seed in range(3):
        merge_from_logits_on(device, 40 + seed, world, interleave, row_starts=seed == 1)


merge_from_logits_cases = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**31 - 1), world=st.integers(2, 8),
    interleave=st.sampled_from([1, 2, 16, 64]), rows=st.integers(1, 6),
    max_len=st.integers(1, 300), k=st.integers(1, 60), ties=st.booleans(),
    row_starts=st.booleans()))


@given(merge_from_logits_cases)
def test_merge_from_logits_random_cases_cpu(c):
    merge_from_logits_on(torch.device("cpu"), **c)


@pytest.mark.cuda
@given(merge_from_logits_cases)
def test_merge_from_logits_random_cases_cuda(c):
    merge_from_logits_on(torch.device("cuda"), **c)


def test_merge_from_logits_world_one_is_the_local_topk(device):
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(41)).to(device)
    got = dsa_ext.merge_topk_global_from_logits(x, 7, rank=0, world_size=1)
    assert_equal(got, reference.topk_per_row(x.cpu(), 7))


def test_merge_from_logits_torch_compile_fullgraph(device):
    """The composite traces whole (its candidates and top-K are the registered ops); the
    exchange is a hook that puts this rank's candidates beside the other ranks'."""
    world, interleave, rows, width, k = 2, 2, 4, 300, 40
    g = torch.Generator().manual_seed(42)
    scores = torch.randint(0, 20, (rows, world * width), generator=g).float()
    local = [scores[:, reference.dcp_global_position(torch.arange(width), r, world,
                                                      interleave)] for r in range(world)]
    other = reference.topk_to_candidates(local[1], k, 1, world, interleave).to(device)

    def gather(output, input):
        output[:rows].copy_(input)
        output[rows:].copy_(other)

    def step(logits):
        return dsa_ext.merge_topk_global_from_logits(
            logits, k, rank=0, world_size=world, interleave=interleave, all_gather=gather,
            sorted=True) + 0

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(local[0].to(device))
    assert_equal(got, reference.topk_per_row(scores, k, sorted=True))


@pytest.mark.cuda
def test_merge_from_logits_graph_replay_with_new_inputs_and_no_sync():
    world, interleave, rows, width, k = 4, 16, 8, 4096, 512
    logits = torch.empty(rows, width, device="cuda")
    lengths = torch.empty(rows, dtype=I32, device="cuda")
    others = torch.empty(world, rows, k, dtype=torch.int64, device="cuda")
    out = torch.empty(rows, k, dtype=I32, device="cuda")
    rank = 1

    def gather(output, input):
        mine = output.view(world, rows, k)
        mine.copy_(others)
        mine[rank].copy_(input)

    def step():
        dsa_ext.merge_topk_global_from_logits(logits, k, rank=rank, world_size=world,
                                              interleave=interleave, all_gather=gather,
                                              lengths=lengths, out=out)

    logits.normal_()
    lengths.fill_(width)
    graph = capture_graph(step)
    position = torch.arange(world * width)
    for seed in range(2):
        gen = torch.Generator().manual_seed(320 + seed)
        scores = torch.randint(0, 50, (rows, world * width), generator=gen).float()
        total = torch.randint(0, world * width + 1, (rows,), generator=gen)
        packed = []
        for r in range(world):
            mine = scores[:, reference.dcp_owner(position, world, interleave) == r]
            local_len = reference.dcp_local_length(total, r, world, interleave).to(I32)
            packed.append(reference.topk_to_candidates(mine, k, r, world, interleave,
                                                       lengths=local_len))
            if r == rank:
                logits.copy_(mine)
                lengths.copy_(local_len)
        others.copy_(torch.stack(packed))
        out.fill_(-7)
        graph.replay()
        assert_equal(out, reference.stable_topk_from_candidates(torch.stack(packed), k),
                     seed=seed)
        unsharded = reference.topk_per_row(scores, k, lengths=total.to(I32))
        assert torch.equal(out.cpu().sort(dim=1).values, unsharded.sort(dim=1).values)


def test_merge_from_logits_checks_before_the_exchange():
    with pytest.raises(TypeError, match="logits must be float32"):
        dsa_ext.merge_topk_global_from_logits(X.bfloat16(), 2, rank=0, world_size=2,
                                              all_gather=lambda o, i: None)
    with pytest.raises(ValueError, match="not initialized"):
        dsa_ext.merge_topk_global_from_logits(X, 2, rank=0, world_size=2)
