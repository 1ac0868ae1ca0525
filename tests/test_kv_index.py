"""Index conversion (docs/ops.md section 2): CPU and CUDA against the torch reference."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import reference
from conftest import assert_equal, capture_graph, forced_convert_plan

I32 = torch.int32


def run_both(device, req_id, block_table, tok, block_size, **kw):
    """Run dsa_ext on `device` and the reference on the CPU; compare slots and counts."""
    want, want_counts = reference.convert_req_index_to_global_index(
        req_id, block_table, tok, block_size, **kw)
    args = [x.to(device) if isinstance(x, torch.Tensor) else x
            for x in (req_id, block_table, tok)]
    kw_dev = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got, counts = dsa_ext.convert_req_index_to_global_index(
        *args, block_size, return_valid_counts=True, **kw_dev)
    assert_equal(got, want, **{k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)})
    assert_equal(counts, want_counts)
    return got.cpu(), counts.cpu()


# ---------------------------------------------------------------------------------------
# Fixed vectors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_stride", [4, 12])
def test_spec_vector_dcp_compact(device, block_stride):
    tok = torch.full((1, 128), -1, dtype=I32)
    tok[0, :8] = torch.arange(8, dtype=I32)
    got, counts = run_both(device, torch.zeros(1, dtype=I32), torch.tensor([[10]], dtype=I32),
                           tok, 4, block_stride=block_stride, dcp_world_size=2, dcp_rank=0,
                           compact=True)
    assert counts.tolist() == [4]
    assert got[0, :4].tolist() == [10 * block_stride + i for i in range(4)]
    assert (got[0, 4:] == -1).all()


def test_plain_conversion(device):
    block_table = torch.tensor([[7, 3, -1], [2, 9, 4]], dtype=I32)
    tok = torch.tensor([[0, 5, 9, 12, -1], [11, 4, 3, 2, 100]], dtype=I32)
    got, counts = run_both(device, torch.tensor([1, 0], dtype=I32), block_table, tok, 4)
    # row 0 reads table row 1: 0 -> 2*4+0, 5 -> 9*4+1, 9 -> 4*4+1, 12 -> block 3: past NB.
    assert got.tolist() == [[8, 37, 17, -1, -1], [-1, 12, 31, 30, -1]]
    assert counts.tolist() == [3, 3]  # table entry -1 gives a negative slot -> -1


def test_world_one_equals_plain_for_any_interleave(device):
    g = torch.Generator().manual_seed(1)
    block_table = torch.randint(0, 1000, (3, 16), generator=g, dtype=I32)
    tok = torch.randint(-1, 16 * 8, (5, 77), generator=g, dtype=I32)
    req = torch.randint(0, 3, (5,), generator=g, dtype=I32)
    plain, _ = run_both(device, req, block_table, tok, 8)
    for interleave in (1, 2, 4, 8):
        dcp, _ = run_both(device, req, block_table, tok, 8, dcp_world_size=1,
                          interleave=interleave)
        assert torch.equal(plain, dcp)


# Layouts on both sides of the power-of-two path (block size, and world size and interleave
# when W > 1, powers of two with W * BS <= 2^31: shifts, masks and one compare that also
# rejects negative tokens) and of the general one, at the extremes of the token range. With
# W * BS = 2^31 only block 0 is reachable, so a second table column catches a negative token
# that the single compare would let through.
@pytest.mark.parametrize("block_size,world,interleave", [
    (64, 1, 1), (16, 1, 16), (3, 1, 1), (64, 4, 4), (12, 4, 4), (64, 3, 1), (64, 8, 64),
    (2**28, 8, 1), (2**29, 8, 1), (2**30, 2, 2), (2**30, 1, 1), (3 * 2**28, 2, 1)])
def test_pow2_and_general_layouts_at_the_extremes(device, block_size, world, interleave):
    g = torch.Generator().manual_seed(block_size % 1000 + world)
    edges = [-2**31, -2**31 + 1, -2**30, -block_size, -1, 0, 1, block_size - 1, block_size,
             2**31 - block_size, 2**31 - 2, 2**31 - 1]
    rand = torch.randint(-2**31, 2**31 - 1, (64,), generator=g, dtype=torch.int64).tolist()
    small = torch.randint(-3, min(4 * block_size * world, 2**31 - 1), (64,), generator=g).tolist()
    tok = torch.tensor([edges + rand + small] * 2, dtype=I32)
    block_table = torch.tensor([[0, 1, 1], [1, 0, 1]], dtype=I32)
    for rank in sorted({0, world - 1}):
        for compact in (False, True):
            run_both(device, torch.tensor([0, 1], dtype=I32), block_table, tok, block_size,
                     dcp_world_size=world, dcp_rank=rank,
                     interleave=interleave, compact=compact)


def test_out_of_range_requests_and_mapping(device):
    block_table = torch.arange(8, dtype=I32).reshape(2, 4)
    tok = torch.tensor([[0, 1, 2, 3]] * 5, dtype=I32)
    req = torch.tensor([0, 1, 2, -1, 1], dtype=I32)
    got, _ = run_both(device, req, block_table, tok, 1)
    assert got[2].tolist() == [-1] * 4 and got[3].tolist() == [-1] * 4
    mapping = torch.tensor([1, -1, 5], dtype=I32)  # 0 -> row 1; 1 -> none; 2 -> past R
    got, _ = run_both(device, req, block_table, tok, 1, idx_mapping=mapping)
    assert got[0].tolist() == [4, 5, 6, 7]
    assert (got[1:] == -1).all()


@pytest.mark.parametrize("compact", [False, True])
def test_empty_mapping_maps_every_request_to_none(device, compact):
    # torch gives a tensor with no elements a null data pointer: the mapping is still given,
    # and no request id is inside it.
    block_table = torch.tensor([[10], [20]], dtype=I32)
    tok = torch.tensor([[0, 1], [0, 1]], dtype=I32)
    req = torch.tensor([0, 1], dtype=I32)
    for mapping in (torch.empty(0, dtype=I32), torch.arange(4, dtype=I32)[:0]):
        got, counts = run_both(device, req, block_table, tok, 4, idx_mapping=mapping,
                               compact=compact)
        assert (got == -1).all() and (counts == 0).all()


def test_slot_overflow_is_invalid(device):
    block_table = torch.tensor([[2**30, 1]], dtype=I32)
    tok = torch.tensor([[0, 64, 65]], dtype=I32)
    got, _ = run_both(device, torch.zeros(1, dtype=I32), block_table, tok, 64)
    assert got.tolist() == [[-1, 64, 65]]  # 2^30 * 64 does not fit an int32 slot


def test_prefill_workspace_rows(device):
    block_table = torch.tensor([[100, 200]], dtype=I32)
    tok = torch.tensor([[0, 1, 2, 3, 4, -1]] * 3, dtype=I32)
    pid = torch.tensor([-1, 0, 1], dtype=I32)
    starts = torch.tensor([5, 50], dtype=I32)
    got, counts = run_both(device, torch.zeros(3, dtype=I32), block_table, tok, 4,
                           dcp_world_size=2, dcp_rank=1, prefill_request_id=pid,
                           prefill_workspace_starts=starts, prefill_workspace_rank_stride=1000,
                           compact=True)
    # decode row on rank 1 keeps odd positions 1, 3 -> local 0, 1 -> block 100
    assert got[0].tolist() == [400, 401, -1, -1, -1, -1]
    # prefill rows keep every position: owner * 1000 + start + local
    assert got[1].tolist() == [5, 1005, 6, 1006, 7, -1]
    assert got[2].tolist() == [50, 1050, 51, 1051, 52, -1]
    assert counts.tolist() == [2, 5, 5]


def test_compact_order_is_ascending_column(device):
    block_table = torch.arange(1, 65, dtype=I32).reshape(1, 64)
    tok = torch.tensor([[63, -1, 5, 40, -1, 0, 17]], dtype=I32)
    got, _ = run_both(device, torch.zeros(1, dtype=I32), block_table, tok, 1, compact=True)
    assert got.tolist() == [[64, 6, 41, 1, 18, -1, -1]]


@pytest.mark.parametrize("table_cols", [2048, 2049])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("world", [1, 2])
def test_wide_tables_on_many_rows(device, table_cols, compact, world):
    """Rows that fill the GPU with a table of 2048 columns (W = 1: the CUDA kernels copy it
    into shared memory) and of 2049 (gathered from global memory), every column reachable;
    invalid request ids, -1 tokens and tokens past the table among them."""
    g = torch.Generator().manual_seed(table_cols + 2 * compact + 4 * world)
    T, K, bs, R = 300, 2048, 64, 40
    table = torch.randint(-1, 1 << 20, (R, table_cols), generator=g, dtype=I32)
    tok = torch.randint(-1, table_cols * bs * world + 100, (T, K), generator=g, dtype=I32)
    req = torch.randint(-1, R + 1, (T,), generator=g, dtype=I32)
    run_both(device, req, table, tok, bs, dcp_world_size=world, dcp_rank=world - 1,
             compact=compact)
    if device.type == "cuda":  # without counts (other plans); compaction into the ids
        want, _ = reference.convert_req_index_to_global_index(
            req, table, tok, bs, dcp_world_size=world, dcp_rank=world - 1, compact=compact)
        tok_dev = tok.to(device)
        got = dsa_ext.convert_req_index_to_global_index(
            req.to(device), table.to(device), tok_dev, bs, dcp_world_size=world,
            dcp_rank=world - 1, compact=compact, out=tok_dev if compact else None)
        assert_equal(got, want)


# ---------------------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------------------


@st.composite
def conversion_cases(draw):
    world = draw(st.integers(1, 8))
    interleave = draw(st.sampled_from([1, 2, 4, 16, 64]))
    block_size = interleave * draw(st.sampled_from([1, 2, 3, 4]))
    K = draw(st.one_of(st.integers(1, 300), st.sampled_from([2048, 2049, 4096, 8192])))
    T = draw(st.integers(1, max(1, 4096 // K + 1)))
    R = draw(st.integers(1, 6))
    # Either side of the widest table the CUDA kernels copy into shared memory (2048
    # columns; with these few rows only forced 8-column plans do, see
    # test_wide_tables_on_many_rows).
    NB = draw(st.one_of(st.integers(1, 40), st.sampled_from([2048, 2049])))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    table_full = torch.randint(-1, 1 << 20, (R, NB + 3), generator=g, dtype=I32)
    block_table = table_full[:, :NB] if draw(st.booleans()) else table_full[:, :NB].clone()
    limit = NB * block_size * world + 50
    tok_full = torch.randint(-1, limit, (T, 2 * K), generator=g, dtype=I32)
    fill = torch.rand(T, 1, generator=g) * K
    tok_full[:, :K][torch.arange(K)[None, :] > fill] = -1  # ragged -1 tail
    tok = tok_full[:, ::2] if draw(st.booleans()) else tok_full[:, :K]  # strided columns
    req = torch.randint(-1, R + 1, (T,), generator=g, dtype=I32)
    kw = dict(dcp_world_size=world, dcp_rank=draw(st.integers(0, world - 1)),
              interleave=interleave, compact=draw(st.booleans()),
              block_stride=block_size * draw(st.sampled_from([1, 3])))
    if draw(st.booleans()):
        kw["idx_mapping"] = torch.randint(-1, R + 1, (R + 1,), generator=g, dtype=I32)
    if draw(st.booleans()):
        kw["prefill_request_id"] = torch.randint(-1, 3, (T,), generator=g, dtype=I32)
        kw["prefill_workspace_starts"] = torch.randint(-5, 1000, (2,), generator=g, dtype=I32)
        kw["prefill_workspace_rank_stride"] = draw(st.integers(0, 5000))
    return req, block_table, tok, block_size, kw


@given(conversion_cases())
def test_random_cases_cpu(case):
    req, block_table, tok, block_size, kw = case
    run_both(torch.device("cpu"), req, block_table, tok, block_size, **kw)


@pytest.mark.cuda
@given(conversion_cases())
def test_random_cases_cuda(case):
    req, block_table, tok, block_size, kw = case
    run_both(torch.device("cuda"), req, block_table, tok, block_size, **kw)


def test_out_buffers_and_strided_output(device):
    g = torch.Generator().manual_seed(3)
    block_table = torch.randint(0, 100, (2, 8), generator=g, dtype=I32).to(device)
    tok = torch.randint(-1, 32, (6, 40), generator=g, dtype=I32).to(device)
    req = torch.randint(0, 2, (6,), generator=g, dtype=I32).to(device)
    big = torch.full((6, 90), 7, dtype=I32, device=device)
    out = big[:, 5:85:2]  # strided view: columns between must stay untouched
    counts = torch.full((6,), 99, dtype=I32, device=device)
    res = dsa_ext.convert_req_index_to_global_index(
        req, block_table, tok, 4, compact=True, out=out, valid_counts=counts)
    assert res is out
    want, want_counts = reference.convert_req_index_to_global_index(
        req.cpu(), block_table.cpu(), tok.cpu(), 4, compact=True)
    assert_equal(out, want)
    assert_equal(counts, want_counts)
    untouched = torch.ones(90, dtype=torch.bool)
    untouched[5:85:2] = False
    assert (big[:, untouched] == 7).all()


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------

GOOD = dict(req_id=torch.zeros(2, dtype=I32), block_table=torch.zeros(1, 4, dtype=I32),
            token_indices=torch.zeros(2, 8, dtype=I32), block_size=4)


@pytest.mark.parametrize("change, error, text", [
    (dict(token_indices=torch.zeros(2, 8, dtype=torch.int64)), TypeError,
     "token_indices must be int32, got torch.int64"),
    (dict(req_id=torch.zeros(3, dtype=I32)), ValueError, "req_id must have shape (2,), got (3,)"),
    (dict(block_table=torch.zeros(4, dtype=I32)), ValueError,
     "block_table must be 2-D, got shape (4,)"),
    (dict(token_indices=torch.zeros(2, 0, dtype=I32)), ValueError,
     "token_indices must have at least one column, got shape (2, 0)"),
    (dict(block_size=0), ValueError, "block_size must be >= 1, got 0"),
    (dict(block_size=6, interleave=4, dcp_world_size=2), ValueError,
     "block_size (6) must be a multiple of interleave (4)"),
    (dict(dcp_world_size=2, dcp_rank=2), ValueError,
     "dcp_rank must be < dcp_world_size (2), got 2"),
    (dict(dcp_world_size=0), ValueError, "dcp_world_size must be >= 1, got 0"),
    (dict(dcp_rank=-1), ValueError, "dcp_rank must be >= 0, got -1"),
    (dict(block_stride=2), ValueError, "block_stride must be >= 4, got 2"),
    (dict(block_size=4.0), TypeError, "block_size must be an int, got float"),
    (dict(block_size=torch.tensor(4)), TypeError,
     "block_size must be an int, got a tensor of shape ()"),
    (dict(out=torch.zeros(2, 7, dtype=I32)), ValueError, "out must have shape (2, 8), got (2, 7)"),
    (dict(valid_counts=torch.zeros(2, dtype=torch.int64)), TypeError,
     "valid_counts must be int32, got torch.int64"),
    (dict(idx_mapping=torch.zeros(2, 2, dtype=I32)), ValueError,
     "idx_mapping must be 1-D, got shape (2, 2)"),
    (dict(prefill_request_id=torch.zeros(2, dtype=I32)), ValueError,
     "prefill_workspace_starts is required with prefill_request_id"),
    (dict(req_id=[0, 0]), TypeError, "req_id must be a torch.Tensor, got list"),
    (dict(out=torch.zeros(1, 8, dtype=I32).expand(2, 8)), ValueError,
     "out must not have a zero stride along a dimension of more than one element (an "
     "expanded tensor), got shape (2, 8) and strides (0, 1)"),
    (dict(valid_counts=torch.zeros(1, dtype=I32).expand(2)), ValueError,
     "valid_counts must not have a zero stride along a dimension of more than one element"),
])
def test_bad_input_names_the_argument(change, error, text):
    kw = {**GOOD, **change}
    with pytest.raises(error) as info:
        dsa_ext.convert_req_index_to_global_index(
            kw.pop("req_id"), kw.pop("block_table"), kw.pop("token_indices"),
            kw.pop("block_size"), **kw)
    assert text in str(info.value)


@pytest.mark.cuda
def test_mixed_devices_raise():
    with pytest.raises(ValueError, match="req_id must be on cuda"):
        dsa_ext.convert_req_index_to_global_index(
            GOOD["req_id"], GOOD["block_table"].cuda(), GOOD["token_indices"].cuda(), 4)


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(device):
    def step(req, table, tok, out, counts):
        dsa_ext.convert_req_index_to_global_index(
            req, table, tok, 4, dcp_world_size=2, dcp_rank=1, compact=True, out=out,
            valid_counts=counts)
        return out + 0, counts * 1

    g = torch.Generator().manual_seed(5)
    req = torch.randint(0, 2, (3,), generator=g, dtype=I32)
    table = torch.randint(0, 50, (2, 8), generator=g, dtype=I32)
    tok = torch.randint(-1, 64, (3, 16), generator=g, dtype=I32)
    args = [x.to(device) for x in (req, table, tok)]
    out = torch.empty(3, 16, dtype=I32, device=device)
    counts = torch.empty(3, dtype=I32, device=device)
    torch._dynamo.reset()
    got, got_counts = torch.compile(step, fullgraph=True)(*args, out, counts)
    want, want_counts = reference.convert_req_index_to_global_index(
        req, table, tok, 4, dcp_world_size=2, dcp_rank=1, compact=True)
    assert_equal(got, want)
    assert_equal(got_counts, want_counts)


@pytest.mark.cuda
def test_cuda_graph_replay_with_new_inputs_and_no_sync():
    g = torch.Generator().manual_seed(6)
    T, K = 33, 2048
    table = torch.randint(0, 1 << 16, (4, 64), generator=g, dtype=I32).cuda()
    req = torch.randint(0, 4, (T,), generator=g, dtype=I32).cuda()
    tok = torch.randint(-1, 64 * 64 * 2, (T, K), generator=g, dtype=I32).cuda()
    out = torch.empty_like(tok)
    counts = torch.empty(T, dtype=I32, device="cuda")

    def step():
        dsa_ext.convert_req_index_to_global_index(req, table, tok, 64, dcp_world_size=2,
                                                  dcp_rank=0, compact=True, out=out,
                                                  valid_counts=counts)

    graph = capture_graph(step)
    for seed in range(3):
        gen = torch.Generator().manual_seed(100 + seed)
        tok.copy_(torch.randint(-1, 64 * 64 * 2, (T, K), generator=gen, dtype=I32))
        req.copy_(torch.randint(0, 4, (T,), generator=gen, dtype=I32))
        graph.replay()
        want, want_counts = reference.convert_req_index_to_global_index(
            req.cpu(), table.cpu(), tok.cpu(), 64, dcp_world_size=2, dcp_rank=0, compact=True)
        assert_equal(out, want, seed=seed)
        assert_equal(counts, want_counts, seed=seed)


def test_safe_lengths(device):
    counts = torch.tensor([0, 3, 1, 0], dtype=I32, device=device)
    idx = torch.full((4, 3), -1, dtype=I32, device=device)
    idx[1] = torch.tensor([5, 6, 7])
    idx[2, 0] = 9
    lengths = dsa_ext.safe_lengths(counts, idx)
    assert lengths.tolist() == [1, 3, 1, 1]
    assert idx[:, 0].tolist() == [0, 5, 9, 0]
    assert counts.tolist() == [0, 3, 1, 0]  # the raw counts are kept for masking


@pytest.mark.cuda
def test_row_offsets_beyond_2_pow_31_elements():
    # Row 1 of token_indices and of out starts 2^31 + 64 elements after row 0 (8.6 GB
    # buffers): every offset must be computed in 64 bits.
    row_stride = 2**31 + 64
    K = 8
    big_in = torch.empty(row_stride + K, dtype=I32, device="cuda")
    big_out = torch.full((row_stride + K,), 7, dtype=I32, device="cuda")
    tok = big_in.as_strided((2, K), (row_stride, 1))
    out = big_out.as_strided((2, K), (row_stride, 1))
    tok.copy_(torch.tensor([[0, 1, 2, 3, -1, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0]], dtype=I32))
    table = torch.tensor([[10, 20]], dtype=I32, device="cuda")
    req = torch.zeros(2, dtype=I32, device="cuda")
    dsa_ext.convert_req_index_to_global_index(req, table, tok, 4, compact=True, out=out)
    want, _ = reference.convert_req_index_to_global_index(
        req.cpu(), table.cpu(), tok.cpu(), 4, compact=True)
    assert_equal(out, want)
    assert big_out[K:K + 16].eq(7).all()  # nothing written between the rows
    del big_in, big_out
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
# Every kernel plan (split rows in clusters, split rows without counts, one CTA per row)
# ---------------------------------------------------------------------------------------


def test_plan_override_takes_only_built_plans():
    from dsa_ext import _C
    with pytest.raises(ValueError, match="got 3"):
        _C.set_convert_plan_override(3)


@pytest.mark.cuda
def test_plans_by_shape():
    from dsa_ext import _C

    def plan(rows, cols, counts, stage_tokens=0):
        # (columns per thread, CTAs per row, or threads of one CTA; table staged)
        return tuple(_C.convert_index_plan(rows, cols, counts, stage_tokens, 0))

    assert plan(1, 2048, False) == (1, 8, 0, 0)
    assert plan(1, 2048, True) == (1, 8, 0, 0)
    assert plan(16, 8192, True) == (8, 4, 0, 0)  # counted rows: at most 4 parts
    assert plan(64, 2048, True) == (8, 1, 0, 0)  # one CTA a row: no exchange
    assert plan(16, 2048, True) == (2, 4, 0, 0)
    assert plan(24, 2048, True) == (8, 1, 0, 0)
    assert plan(1 << 14, 2048, True) == (8, 1, 0, 0)
    assert plan(1 << 14, 2048, False) == (4, 2, 0, 0)
    assert plan(64, 2048, False) == (4, 2, 0, 0)  # without counts, 2 columns to T = 33
    assert plan(32, 2048, False) == (2, 4, 0, 0)
    assert plan(1 << 14, 100, True) == (1, 1, 0, 0)
    assert plan(1 << 14, 8192, True) == (0, 1, 256, 0)  # many rows: no exchange
    assert plan(4, 1 << 15, True) == (0, 1, 256, 0)  # past one cluster's tiles
    # A table of 2048 columns (W = 1) is staged by CTAs of 2048 columns, which many rows
    # without counts then take too; at W = 4 (8192 tokens to pay) it is not.
    assert plan(1 << 14, 2048, True, 2048) == (8, 1, 0, 1)
    assert plan(1 << 14, 2048, False, 2048) == (8, 1, 0, 1)
    assert plan(64, 2048, True, 2048) == (8, 1, 0, 1)
    assert plan(64, 2048, False, 2048) == (8, 1, 0, 1)
    assert plan(16, 2048, True, 2048) == (2, 4, 0, 0)
    assert plan(1 << 14, 2048, False, 8192) == (4, 2, 0, 0)
    assert plan(1 << 14, 512, True, 512) == (2, 1, 0, 1)  # the CTA holds the whole row
    assert plan(1 << 14, 512, True, 2048) == (2, 1, 0, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("plan", [0, 1, 2, 4, 8])
@given(case=conversion_cases(), counts=st.booleans(), in_place=st.booleans())
def test_every_plan_matches_reference(plan, case, counts, in_place):
    """Forced plans on random shapes, with and without counts; compaction in place too
    (the output aliasing the token ids, which every part must read before any writes)."""
    req, block_table, tok, block_size, kw = case
    want, want_counts = reference.convert_req_index_to_global_index(
        req, block_table, tok, block_size, **kw)
    kw_dev = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    tok_dev = tok.cuda()
    out = tok_dev if in_place and kw["compact"] else None
    with forced_convert_plan(plan):
        got = dsa_ext.convert_req_index_to_global_index(
            req.cuda(), block_table.cuda(), tok_dev, block_size, return_valid_counts=counts,
            out=out, **kw_dev)
    if counts:
        got, got_counts = got
        assert_equal(got_counts, want_counts)
    assert_equal(got, want)
