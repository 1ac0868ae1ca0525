"""DCP candidate packing and the global top-K merge (docs/ops.md section 6): CPU and CUDA
against the torch reference, the key format, sharded merges through a fake in-process
exchange."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import dcp, reference
from conftest import assert_equal, capture_graph as _capture
from dcp_cases import fake_all_gather, make_topk_case, merged_want

I32, I64, F32 = torch.int32, torch.int64, torch.float32
NAN, INF = float("nan"), float("inf")


def run_both(device, logits, topk, rank, world, interleave=1, row_starts=None):
    """Pack on `device` and with the reference on the CPU; compare bit for bit."""
    want = reference.pack_dcp_topk_candidates(logits, topk, rank, world, interleave,
                                              row_starts)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    got = dsa_ext.pack_dcp_topk_candidates(dev(logits), dev(topk), rank, world, interleave,
                                           dev(row_starts))
    assert got.dtype == I64 and got.shape == topk.shape
    assert_equal(got, want, rank=rank, world=world, interleave=interleave)
    return got.cpu()


# ---------------------------------------------------------------------------------------
# The key format
# ---------------------------------------------------------------------------------------


def test_key_layout_fixed_vector():
    # score 1.0 (0x3F800000 -> ordered 0xBF800000), gid 5 (low word ~5 = 0xFFFFFFFA)
    key = reference.encode_candidate_keys(torch.tensor([1.0]), torch.tensor([5]))
    assert key.item() == (0xBF800000 << 32 | 0xFFFFFFFA) - 2**64
    assert reference.decode_candidate_gids(key).tolist() == [5]
    assert reference.encode_candidate_keys(torch.tensor([1.0]), torch.tensor([-1])).item() == 0
    assert reference.encode_candidate_keys(torch.tensor([1.0]), torch.tensor([2**31])).item() == 0
    # the smallest valid key: lowest score bits (a negative NaN, 0xFFFFFFFF), largest gid
    lowest = torch.tensor([-1], dtype=I32).view(F32)
    top = reference.encode_candidate_keys(lowest, torch.tensor([2**31 - 1]))
    assert top.item() == 2**31 and reference.decode_candidate_gids(top).item() == 2**31 - 1


def test_total_order_of_special_scores(device):
    # the pack op itself orders these; descending: +NaN, +inf, 1, +0, -0, -1, -inf, invalid
    scores = torch.tensor([[-INF, -1.0, -0.0, 0.0, 1.0, INF, NAN, 3.0]])
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, -1]], dtype=I32)
    keys = run_both(device, scores, ids, 0, 1)
    order = reference.stable_topk_from_candidates(keys, 8, sorted=True)
    assert order.tolist() == [[6, 5, 4, 3, 2, 1, 0, -1]]


def test_ties_break_by_lower_global_id_across_ranks(device):
    # W=2, I=1: rank 0 owns even positions, rank 1 odd; all scores equal.
    logits = torch.zeros(1, 4)
    ids = torch.tensor([[3, 2, 1, 0]], dtype=I32)
    packed = torch.cat([run_both(device, logits, ids, r, 2) for r in range(2)], dim=1)
    assert reference.stable_topk_from_candidates(packed, 5, sorted=True).tolist() == [
        [0, 1, 2, 3, 4]]
    # the top 4 in gathered order: rank 0's (ids 2, 0), then rank 1's (ids 3, 1)
    assert reference.stable_topk_from_candidates(packed, 4).tolist() == [[2, 0, 3, 1]]


def test_spec_fields(device):
    logits = torch.tensor([[0.5, 2.0, -1.0, 7.0], [1.0, 2.0, 3.0, 4.0]])
    ids = torch.tensor([[1, 0, -1, 9], [0, 1, 2, -5]], dtype=I32)
    starts = torch.tensor([0, 2], dtype=I32)
    keys = run_both(device, logits, ids, 1, 2, 2, starts)
    # gid(q) = (q // 2) * 4 + 2 + q % 2; id 9 reads the clamped column 3 (7.0)
    assert reference.decode_candidate_gids(keys).tolist() == [[3, 2, -1, 19], [2, 3, 6, -1]]
    scores = (keys >> 32).to(I32) & 0x7FFFFFFF  # high word of positive scores
    assert scores[0, 3].item() == torch.tensor(7.0).view(I32).item()
    assert scores[1, 1].item() == torch.tensor(4.0).view(I32).item()  # column 1 + 2 = 3
    assert scores[1, 2].item() == torch.tensor(4.0).view(I32).item()  # 2 + 2 clamped to 3


def test_gid_overflow_and_empty_logits_are_invalid(device):
    ids = torch.tensor([[2**31 - 1, 0]], dtype=I32)
    keys = run_both(device, torch.ones(1, 3), ids, 1, 2)  # gid of 2^31-1 on rank 1 >= 2^31
    assert reference.decode_candidate_gids(keys).tolist() == [[-1, 1]]
    keys = run_both(device, torch.ones(1, 0), ids, 0, 1)
    assert (keys == 0).all()


def test_world_one_is_identity_ids(device):
    ids = torch.tensor([[4, 0, 2, -1]], dtype=I32)
    for interleave in (1, 2, 64):
        keys = run_both(device, torch.randn(1, 5), ids, 0, 1, interleave)
        assert reference.decode_candidate_gids(keys).tolist() == [[4, 0, 2, -1]]


# ---------------------------------------------------------------------------------------
# Random cases (strided views, -1 entries, special scores, row_starts)
# ---------------------------------------------------------------------------------------


@st.composite
def pack_cases(draw):
    world = draw(st.integers(1, 8))
    interleave = draw(st.sampled_from([1, 2, 64]))
    rows = draw(st.integers(0, 9))
    cols = draw(st.integers(0, 300))
    K = draw(st.one_of(st.integers(1, 70), st.sampled_from([512, 513, 2048])))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(rows, 2 * cols + 1, generator=g)
    special = torch.tensor([NAN, -NAN, INF, -INF, 0.0, -0.0, 1e-45, -1e-45])
    mask = torch.rand(full.shape, generator=g) < 0.2
    full[mask] = special[torch.randint(0, 8, (int(mask.sum()),), generator=g)]
    layout = draw(st.sampled_from(["dense", "cols", "transposed"]))
    if layout == "cols":
        logits = full[:, 1::2][:, :cols]
    elif layout == "transposed":
        logits = full[:, :cols].t().contiguous().t()
    else:
        logits = full[:, :cols]
    ids_full = torch.randint(-2, cols + 8, (rows, 3 * K), generator=g, dtype=I32)
    ids_layout = draw(st.sampled_from(["dense", "step", "offset"]))
    if ids_layout == "step":
        topk = ids_full[:, ::3]
    elif ids_layout == "offset":
        topk = ids_full[:, 1:K + 1]
    else:
        topk = ids_full[:, :K].contiguous()
    starts = None
    if draw(st.booleans()):
        starts = torch.randint(-3, cols + 3, (rows, 2), generator=g, dtype=I32)[:, 0]
    return logits, topk, draw(st.integers(0, world - 1)), world, interleave, starts


@given(pack_cases())  # examples from the shared profiles (tests/conftest.py)
def test_random_cases_cpu(case):
    run_both(torch.device("cpu"), *case)


@pytest.mark.cuda
@given(pack_cases())
def test_random_cases_cuda(case):
    run_both(torch.device("cuda"), *case)


def test_large_row_stride_64bit_offsets(device):
    """Element offsets past 2^31 (8 GiB of logits): only the touched pages are real."""
    n = 2**31 + 4096
    try:
        storage = torch.empty(n, dtype=F32, device=device)
    except (RuntimeError, MemoryError):
        if torch.device(device).type != "cpu":
            raise  # a GPU that cannot hold 8 GiB fails the test, it does not skip it
        pytest.skip("cannot reserve 8 GiB of address space")
    logits = storage.as_strided((2, 64), (2**31 + 1000, 1))  # inside the storage
    logits.copy_(torch.randn(2, 64, generator=torch.Generator().manual_seed(0)))
    ids = torch.randint(-1, 64, (2, 128), generator=torch.Generator().manual_seed(1),
                        dtype=I32).to(device)
    got = dsa_ext.pack_dcp_topk_candidates(logits, ids, 1, 4, 2)
    want = reference.pack_dcp_topk_candidates(logits.cpu(), ids.cpu(), 1, 4, 2)
    del storage, logits
    assert_equal(got, want)


def test_out_buffer_strided(device):
    logits = torch.randn(3, 20).to(device)
    ids = torch.randint(-1, 20, (3, 10), dtype=I32).to(device)
    big = torch.full((3, 25), 7, dtype=I64, device=device)
    out = big[:, 2:22:2]
    res = dsa_ext.pack_dcp_topk_candidates(logits, ids, 0, 2, out=out)
    assert res is out
    assert_equal(out, reference.pack_dcp_topk_candidates(logits.cpu(), ids.cpu(), 0, 2))
    untouched = torch.ones(25, dtype=torch.bool)
    untouched[2:22:2] = False
    assert (big[:, untouched] == 7).all()


# ---------------------------------------------------------------------------------------
# Pack + concatenation + selection == global top-K of the unsharded row
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("interleave", [1, 2, 64])
def test_pack_cat_select_equals_global_topk(device, world, interleave):
    for seed in range(3):
        case = make_topk_case(seed, world, interleave, rows=5, max_len=400, k=24,
                              ties=seed != 2, row_starts=seed == 1, device=device)
        packed = [dsa_ext.pack_dcp_topk_candidates(r["logits"], r["topk"], rank, world,
                                                   interleave, r["row_starts"])
                  for rank, r in enumerate(case["ranks"])]
        for order in (True, False):
            got = reference.stable_topk_from_candidates(torch.cat(packed, dim=1).cpu(),
                                                        case["k"], sorted=order)
            assert_equal(got, merged_want(case, order), seed=seed, sorted=order)
            # the op on the all-gathered layout [W, rows, K] selects the same, in the same
            # order
            got3 = dsa_ext.stable_topk_from_candidates(torch.stack(packed), case["k"],
                                                       sorted=order)
            assert_equal(got3, got, seed=seed, sorted=order)


@pytest.mark.parametrize("world, interleave", [(4, 1), (2, 16), (4, 2)])
def test_merge_topk_global_fake_exchange(device, world, interleave):
    for seed in range(3):
        case = make_topk_case(10 + seed, world, interleave, rows=7, max_len=120, k=12,
                              extra_cols=seed, row_starts=seed == 1, device=device)
        packed = [dsa_ext.pack_dcp_topk_candidates(r["logits"], r["topk"], rank, world,
                                                   interleave, r["row_starts"])
                  for rank, r in enumerate(case["ranks"])]
        for rank, r in enumerate(case["ranks"]):
            for order in (False, True):
                topk = r["topk"].clone()
                res = dsa_ext.merge_topk_global(r["logits"], topk, case["k"], rank=rank,
                                                world_size=world, interleave=interleave,
                                                all_gather=fake_all_gather(packed, rank),
                                                row_starts=r["row_starts"], sorted=order)
                assert res is topk
                assert_equal(topk[:, :case["k"]], merged_want(case, order), rank=rank,
                             seed=seed, sorted=order)
                assert (topk[:, case["k"]:] == -1).all()


@st.composite
def merge_cases(draw):
    """A sharded case for merge_topk_global: any world of 2-8 ranks, interleave, k (often
    past a shard), row count and length, extra local columns, ties, row starts."""
    return dict(seed=draw(st.integers(0, 2**31 - 1)), world=draw(st.integers(2, 8)),
                interleave=draw(st.sampled_from([1, 2, 16, 64])), rows=draw(st.integers(1, 6)),
                max_len=draw(st.integers(1, 300)), k=draw(st.integers(1, 60)),
                extra_cols=draw(st.integers(0, 4)), ties=draw(st.booleans()),
                row_starts=draw(st.booleans()), sorted=draw(st.booleans()))


def merge_on(device, c):
    """Every rank's merge through a fake exchange against the reference merge."""
    case = make_topk_case(c["seed"], c["world"], c["interleave"], rows=c["rows"],
                          max_len=c["max_len"], k=c["k"], extra_cols=c["extra_cols"],
                          ties=c["ties"], row_starts=c["row_starts"], device=device)
    world, interleave, k = c["world"], c["interleave"], c["k"]
    packed = [dsa_ext.pack_dcp_topk_candidates(r["logits"], r["topk"], rank, world,
                                               interleave, r["row_starts"])
              for rank, r in enumerate(case["ranks"])]
    want = merged_want(case, c["sorted"])
    for rank, r in enumerate(case["ranks"]):
        topk = r["topk"].clone()
        dsa_ext.merge_topk_global(r["logits"], topk, k, rank=rank, world_size=world,
                                  interleave=interleave, all_gather=fake_all_gather(packed, rank),
                                  row_starts=r["row_starts"], sorted=c["sorted"])
        assert_equal(topk[:, :k], want, rank=rank, **c)
        assert (topk[:, k:] == -1).all()


@given(merge_cases())
def test_merge_topk_global_random_cases_cpu(c):
    merge_on(torch.device("cpu"), c)


@pytest.mark.cuda
@given(merge_cases())
def test_merge_topk_global_random_cases_cuda(c):
    merge_on(torch.device("cuda"), c)


@pytest.mark.parametrize("order", [False, True])
def test_merge_topk_global_torch_compile_fullgraph(device, order):
    # The composite traces whole: its pack and top-K are the registered ops themselves.
    world, interleave = 4, 2
    case = make_topk_case(21, world, interleave, rows=5, max_len=90, k=9, extra_cols=1,
                          row_starts=True, device=device)
    packed = [dsa_ext.pack_dcp_topk_candidates(r["logits"], r["topk"], rank, world,
                                               interleave, r["row_starts"])
              for rank, r in enumerate(case["ranks"])]
    gathered = torch.cat(packed)

    def gather(output, input):
        output.copy_(gathered)

    def step(logits, topk, starts):
        dsa_ext.merge_topk_global(logits, topk, case["k"], rank=1, world_size=world,
                                  interleave=interleave, all_gather=gather,
                                  row_starts=starts, sorted=order)
        return topk + 0

    r = case["ranks"][1]
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(r["logits"], r["topk"].clone(),
                                              r["row_starts"])
    assert_equal(got[:, :case["k"]], merged_want(case, order), sorted=order)
    assert (got[:, case["k"]:] == -1).all()


def test_merge_topk_global_world_one_is_noop(device):
    topk = torch.tensor([[3, 1, -1]], dtype=I32, device=device)
    before = topk.clone()
    dsa_ext.merge_topk_global(torch.randn(1, 5, device=device), topk, 2, rank=0, world_size=1)
    assert torch.equal(topk, before)


def test_merge_topk_pipeline_world_one_equals_local_topk(device):
    # the collective path itself with W = 1 (used by the NCCL single-GPU test too)
    logits = torch.randn(4, 50)
    topk = reference.indexer_topk(logits, 10).to(device)
    want = topk.clone()
    dcp._merge_topk(logits.to(device), topk, 7, 0, 1, 1, None,
                    fake_all_gather([dsa_ext.pack_dcp_topk_candidates(
                        logits.to(device), want, 0, 1)], 0), None)
    assert_equal(topk[:, :7], want[:, :7].cpu())
    assert (topk[:, 7:] == -1).all()


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------

GOOD = dict(logits=torch.zeros(2, 8), topk_indices=torch.zeros(2, 4, dtype=I32), rank=0,
            world_size=2)


@pytest.mark.parametrize("change, error, text", [
    (dict(logits=torch.zeros(2, 8, dtype=torch.float16)), TypeError,
     "logits must be float32, got torch.float16"),
    (dict(topk_indices=torch.zeros(2, 4, dtype=I64)), TypeError,
     "topk_indices must be int32, got torch.int64"),
    (dict(logits=torch.zeros(3, 8)), ValueError, "logits must have 2 rows"),
    (dict(topk_indices=torch.zeros(8, dtype=I32)), ValueError, "topk_indices must be 2-D"),
    (dict(rank=2), ValueError, "rank must be < world_size (2), got 2"),
    (dict(world_size=0), ValueError, "world_size must be >= 1"),
    (dict(interleave=0), ValueError, "interleave must be >= 1"),
    (dict(row_starts=torch.zeros(3, dtype=I32)), ValueError, "row_starts must have shape (2,)"),
    (dict(row_starts=torch.zeros(2, dtype=I64)), TypeError, "row_starts must be int32"),
    (dict(out=torch.zeros(2, 4, dtype=I32)), TypeError, "out must be int64"),
    (dict(out=torch.zeros(2, 5, dtype=I64)), ValueError, "out must have shape (2, 4)"),
])
def test_pack_bad_input_names_the_argument(change, error, text):
    kw = {**GOOD, **change}
    with pytest.raises(error) as info:
        dsa_ext.pack_dcp_topk_candidates(**kw)
    assert text in str(info.value)


@pytest.mark.parametrize("change, error, text", [
    (dict(k=0), ValueError, "k must be >= 1"),
    (dict(k=5), ValueError, "k must be <= topk_indices.shape[1] (4), got 5"),
    (dict(world_size=2), ValueError, "torch.distributed is not initialized"),
    (dict(world_size=2, all_gather=lambda o, i: None, group=object()), ValueError,
     "either group or all_gather"),
    (dict(world_size=2, all_gather=3), TypeError, "all_gather must be callable"),
    (dict(sorted=1), TypeError, "sorted must be a bool, got int"),  # checked at W = 1 too
    (dict(world_size=2, all_gather=lambda o, i: None,
          topk_indices=torch.zeros(1, 4, dtype=I32).expand(2, 4)), ValueError,
     "topk_indices must not have a zero stride along a dimension of more than one element"),
])
def test_merge_bad_input_names_the_argument(change, error, text):
    kw = dict(logits=torch.zeros(2, 8), topk_indices=torch.zeros(2, 4, dtype=I32), k=2,
              rank=0, world_size=1)
    kw.update(change)
    with pytest.raises(error) as info:
        dsa_ext.merge_topk_global(**kw)
    assert text in str(info.value)


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(device):
    def step(logits, ids, starts, out):
        dsa_ext.pack_dcp_topk_candidates(logits, ids, 1, 4, 2, starts, out=out)
        return out ^ 1

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 40, generator=g)
    ids = torch.randint(-1, 40, (3, 16), generator=g, dtype=I32)
    starts = torch.randint(0, 4, (3,), generator=g, dtype=I32)
    out = torch.empty(3, 16, dtype=I64, device=device)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(logits.to(device), ids.to(device),
                                              starts.to(device), out)
    want = reference.pack_dcp_topk_candidates(logits, ids, 1, 4, 2, starts)
    assert_equal(got, want ^ 1)


@pytest.mark.cuda
def test_cuda_graph_replay_with_new_inputs_and_no_sync():
    rows, cols, K = 64, 5000, 2048
    logits = torch.empty(rows, cols, device="cuda")
    ids = torch.empty(rows, K, dtype=I32, device="cuda")
    starts = torch.zeros(rows, dtype=I32, device="cuda")
    out = torch.empty(rows, K, dtype=I64, device="cuda")
    logits.normal_()
    ids.random_(-1, cols)
    graph = _capture(lambda: dsa_ext.pack_dcp_topk_candidates(logits, ids, 3, 4, 16, starts,
                                                              out=out))
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        logits.copy_(torch.randn(rows, cols, generator=g))
        ids.copy_(torch.randint(-1, cols, (rows, K), generator=g, dtype=I32))
        starts.copy_(torch.randint(0, 50, (rows,), generator=g, dtype=I32))
        graph.replay()
        want = reference.pack_dcp_topk_candidates(logits.cpu(), ids.cpu(), 3, 4, 16,
                                                  starts.cpu())
        assert_equal(out, want, seed=seed)


@pytest.mark.cuda
def test_mixed_devices_raise():
    with pytest.raises(ValueError, match="logits must be on cuda"):
        dsa_ext.pack_dcp_topk_candidates(torch.zeros(2, 8), GOOD["topk_indices"].cuda(), 0, 2)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["dense", "strided_ids", "odd_k"])
def test_cuda_equals_cpu_bit_exact(layout):
    g = torch.Generator().manual_seed(11)
    rows, cols, K = 64, 10000, 2048 if layout != "odd_k" else 2047
    logits = torch.randn(rows, cols, generator=g)
    logits[torch.rand(rows, cols, generator=g) < 0.01] = NAN
    ids_full = torch.randint(-1, cols + 50, (rows, 2 * K), generator=g, dtype=I32)
    ids = ids_full[:, ::2] if layout == "strided_ids" else ids_full[:, :K].contiguous()
    starts = torch.randint(-2, 40, (rows,), generator=g, dtype=I32)
    for world, rank, interleave in ((1, 0, 1), (4, 2, 1), (8, 7, 64)):
        cpu = dsa_ext.pack_dcp_topk_candidates(logits, ids, rank, world, interleave, starts)
        gpu = dsa_ext.pack_dcp_topk_candidates(logits.cuda(), ids.cuda(), rank, world,
                                               interleave, starts.cuda())
        assert_equal(gpu, cpu, world=world, layout=layout)


@pytest.mark.cuda
@pytest.mark.parametrize("K", [3, 17])  # both block sizes (1024 threads from 2^20 keys)
def test_more_rows_than_one_grid_column(K):
    """Rows past the launch grid's 65535 (the kernel strides over them) against the CPU."""
    g = torch.Generator().manual_seed(12)
    rows, cols = 65535 + 300, 40
    logits = torch.randn(rows, cols, generator=g)
    ids = torch.randint(-1, cols, (rows, K), generator=g, dtype=I32)
    cpu = dsa_ext.pack_dcp_topk_candidates(logits, ids, 1, 2)
    assert_equal(dsa_ext.pack_dcp_topk_candidates(logits.cuda(), ids.cuda(), 1, 2), cpu)


@pytest.mark.cuda
def test_merge_topk_global_fake_exchange_graph_capture():
    """pack + all-gather hook + stable top-K captured in one CUDA graph, no host sync."""
    world, interleave, k = 4, 2, 64
    case = make_topk_case(21, world, interleave, rows=16, max_len=600, k=k, ties=True,
                          device="cuda")
    packed = [dsa_ext.pack_dcp_topk_candidates(r["logits"], r["topk"], rank, world, interleave)
              for rank, r in enumerate(case["ranks"])]
    gathered = torch.cat(packed)
    mine = case["ranks"][1]
    topk = mine["topk"].clone()

    def step():
        topk.copy_(mine["topk"])
        dsa_ext.merge_topk_global(mine["logits"], topk, k, rank=1, world_size=world,
                                  interleave=interleave,
                                  all_gather=lambda o, i: o.copy_(gathered))

    graph = _capture(step)
    topk.fill_(-7)
    graph.replay()
    assert_equal(topk, merged_want(case))
