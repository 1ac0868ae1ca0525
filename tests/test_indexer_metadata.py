"""Indexer decode/prefill metadata (docs/ops.md sections 4 and 5) against the torch
reference."""
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsa_ext import indexer, reference
from dsa_ext.indexer import IndexerMetadataBuilder, decode_path, plan_prefill_chunks
from dsa_ext.mqa_logits import paged_mqa_logits
from dsa_ext.seq_lens import decode_context_lens, decode_row_ends, prefill_chunk_bounds
from conftest import assert_equal, capture_graph

I32 = torch.int32


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=I32, device=device)


# ---------------------------------------------------------------------------------------
# Decode path table
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap, next_n, fp4, declared, want", [
    ((10, 0), 1, False, False, "native"),
    ((10, 0), 3, False, False, "native"),
    ((10, 3), 8, True, False, "native"),   # SM100 family, FP4 cache: native (PR 45322)
    ((9, 0), 1, False, False, "native"),
    ((9, 0), 2, True, False, "native"),
    ((9, 0), 3, False, False, "flatten"),
    ((9, 0), 4, False, False, "flatten"),
    ((9, 0), 4, False, True, "native"),    # the kernel build declares next_n = 4
    ((9, 0), 3, False, True, "flatten"),
    ((8, 0), 2, False, False, "native"),
    ((8, 0), 4, False, True, "flatten"),   # "declared 4" is an SM90 rule only
    ((12, 0), 3, False, False, "flatten"),
])
def test_decode_path_table(cap, next_n, fp4, declared, want):
    assert decode_path(cap, next_n, fp4, declared) == want


def test_decode_path_logged_once_per_decision(caplog):
    indexer._LOGGED_DECISIONS.clear()
    with caplog.at_level(logging.INFO, logger="dsa_ext"):
        for _ in range(3):
            decode_path((9, 0), 3)
        decode_path((10, 0), 3)
    lines = [r.getMessage() for r in caplog.records if "decode path" in r.getMessage()]
    assert len(lines) == 2
    assert "flatten" in lines[0] and "sm90" in lines[0] and "next_n=3" in lines[0]
    assert "native" in lines[1]


def test_decode_path_errors():
    with pytest.raises(ValueError, match="next_n must be >= 1"):
        decode_path((9, 0), 0)
    with pytest.raises(ValueError, match=r"capability_major_minor must be \(major, minor\), "
                                         r"got \(9,\)"):
        decode_path((9,), 1)
    with pytest.raises(ValueError, match=r"capability_major_minor must be \(major, minor\), "
                                         "got 9"):
        decode_path(9, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_builder_on_cuda_without_cuda_names_the_device():
    with pytest.raises(ValueError, match="device is cuda, but this torch sees no CUDA device"):
        IndexerMetadataBuilder("cuda", 1, 64, 4, 4096)


# ---------------------------------------------------------------------------------------
# Per-token decode lengths: fixed vectors
# ---------------------------------------------------------------------------------------


def test_spec_ragged_example(device):
    S, qsl = i32([10, 7, 12, 0], device), i32([0, 3, 4, 8, 8], device)
    glob, local, row_map = decode_context_lens(S, 8, query_start_loc=qsl)
    assert glob.tolist() == [8, 9, 10, 7, 9, 10, 11, 12]
    assert local.tolist() == glob.tolist()
    assert row_map.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]


def test_uniform_formula_padding_and_row_ends(device):
    S = i32([10, 0, 2, 5], device)
    glob, _, row_map = decode_context_lens(S, 12, next_n=3)
    # max(S[b] - 3 + j + 1, 0)
    assert glob.tolist() == [8, 9, 10, 0, 0, 0, 0, 1, 2, 3, 4, 5]
    assert row_map.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert decode_row_ends(S, 3).tolist() == glob.tolist()
    assert_equal(decode_row_ends(S, 3), reference.decode_row_ends(S.cpu(), 3))
    # Tokens past B * next_n (capacity padding): length 0, no request.
    glob, _, row_map = decode_context_lens(S[:1], 5, next_n=3)
    assert glob.tolist() == [8, 9, 10, 0, 0] and row_map.tolist() == [0, 0, 0, -1, -1]


def test_compression_then_dcp(device):
    S = i32([1000], device)
    glob, local, _ = decode_context_lens(S, 2, next_n=2, compress_ratio=4, dcp_world_size=2,
                                         dcp_rank=None, interleave=2)
    assert glob.tolist() == [999 // 4, 1000 // 4]
    assert_equal(local, reference.local_seq_lens(glob.cpu(), None, 2, 2))
    assert local.shape == (2, 2)


def test_ragged_with_trailing_tokens_and_offset_start(device):
    S, qsl = i32([5, 9], device), i32([2, 4, 5], device)  # tokens 0, 1 and >= 5: no request
    glob, _, row_map = decode_context_lens(S, 7, query_start_loc=qsl)
    assert row_map.tolist() == [-1, -1, 0, 0, 1, -1, -1]
    assert glob.tolist() == [0, 0, 4, 5, 9, 0, 0]


# ---------------------------------------------------------------------------------------
# Per-token decode lengths: random sweeps
# ---------------------------------------------------------------------------------------


@st.composite
def decode_cases(draw):
    world = draw(st.integers(1, 8))
    interleave = draw(st.sampled_from([1, 2, 4, 16]))
    rank = draw(st.one_of(st.none(), st.integers(0, world - 1)))
    next_n = draw(st.integers(1, 8))
    B = draw(st.integers(0, 40))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    S = torch.randint(0, 5000, (B,), generator=g, dtype=I32)
    S[torch.rand(B, generator=g) < 0.2] = 0  # padding requests
    uniform = draw(st.booleans())
    if uniform:
        qsl, Td = None, B * next_n + draw(st.integers(0, 3))
    else:
        dlen = torch.randint(0, next_n + 1, (B,), generator=g, dtype=I32)
        dlen[S == 0] = 0
        S = torch.maximum(S, dlen)  # a request has at least its query tokens
        qsl = torch.cat([torch.zeros(1, dtype=I32), dlen.cumsum(0).to(I32)])
        Td = int(qsl[-1]) + draw(st.integers(0, 3))
    kw = dict(next_n=next_n if uniform else None, query_start_loc=qsl,
              compress_ratio=draw(st.sampled_from([1, 1, 4, 128])), dcp_world_size=world,
              dcp_rank=rank, interleave=interleave)
    return S, Td, kw


def run_decode_both(device, S, Td, kw):
    want = reference.decode_context_lens(S, Td, **kw)
    kw_dev = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = decode_context_lens(S.to(device), Td, **kw_dev)
    for a, b in zip(got, want):
        assert_equal(a, b, Td=Td, **{k: v for k, v in kw.items() if not torch.is_tensor(v)})
    return got


@given(decode_cases())
def test_random_decode_cpu(case):
    run_decode_both(torch.device("cpu"), *case)


@pytest.mark.cuda
@given(decode_cases())
def test_random_decode_cuda(case):
    run_decode_both(torch.device("cuda"), *case)


@given(next_n=st.integers(1, 8), B=st.integers(1, 30), seed=st.integers(0, 1000))
def test_uniform_equals_ragged_with_equal_lengths(next_n, B, seed):
    g = torch.Generator().manual_seed(seed)
    S = torch.randint(0, 3000, (B,), generator=g, dtype=I32)
    qsl = torch.arange(B + 1, dtype=I32) * next_n
    uni = decode_context_lens(S, B * next_n, next_n=next_n)
    rag = decode_context_lens(S, B * next_n, query_start_loc=qsl)
    for a, b in zip(uni, rag):
        assert torch.equal(a, b)
    assert torch.equal(uni[0], decode_row_ends(S, next_n))


# ---------------------------------------------------------------------------------------
# Prefill: docs/ops.md vectors, chunking
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("world, interleave, local_cu, ke", [
    (1, 1, [0, 8], list(range(1, 9))),
    (4, 1, [0, 2], [1, 1, 1, 1, 2, 2, 2, 2]),
    (4, 2, [0, 2], [1, 2, 2, 2, 2, 2, 2, 2]),
])
def test_prefill_spec_vectors(device, world, interleave, local_cu, ke):
    b = IndexerMetadataBuilder(device, 1, 64, 8, 4096, dcp_world_size=world, dcp_rank=0,
                               interleave=interleave)
    chunks = b.build_prefill(i32([8], device), i32([0, 8], device))
    assert len(chunks) == 1
    c = chunks[0]
    assert c.local_cu_seq_lens.tolist() == local_cu and c.cu_seq_lens.tolist() == [0, 8]
    assert c.cu_seqlen_ke.tolist() == ke and c.cu_seqlen_ks.tolist() == [0] * 8
    assert c.token_to_seq.tolist() == [0] * 8
    assert (c.total_seq_lens, c.local_total_seq_lens, c.max_local_total_seq_lens) == (
        8, local_cu[1], local_cu[1])
    assert (c.token_start, c.token_end, c.num_reqs, c.skip_kv_gather) == (0, 8, 1, False)


def test_prefill_max_local_total_is_max_over_ranks(device):
    # 9 positions over W=4, I=2: ranks own 3, 2, 2, 2 -> rank 3 still sizes for 3.
    b = IndexerMetadataBuilder(device, 1, 64, 8, 4096, dcp_world_size=4, dcp_rank=3,
                               interleave=2)
    (c,) = b.build_prefill(i32([9], device), i32([0, 4], device))
    assert c.local_total_seq_lens == 2 and c.max_local_total_seq_lens == 3
    assert c.cu_seqlen_ke.tolist() == [0, 1, 2, 2]  # positions 6..9 visible: local 0,1,2,2
    assert c.cu_seqlen_ks.tolist() == [0, 0, 0, 0]


def test_plan_prefill_chunks_greedy_and_split():
    plans = plan_prefill_chunks([100, 100, 250, 50, 50], [0, 10, 20, 520, 530, 540],
                                max_kv_workspace=300, max_logits_bytes=10**9)
    assert [(p.req_start, p.req_end) for p in plans] == [(0, 2), (2, 4), (4, 5)]
    S = [100, 100, 5000, 50, 50]
    qsl = [0, 10, 20, 520, 530, 540]
    with pytest.raises(ValueError, match=r"max_kv_workspace \(300\) must hold the KV of "
                                         r"every request: request 2 needs 5000"):
        plan_prefill_chunks(S, qsl, max_kv_workspace=300, max_logits_bytes=10**9)
    # Logits budget: 5000 columns x 4 bytes x rows <= 40000 -> 2 rows per slice.
    plans = plan_prefill_chunks(S, qsl, max_kv_workspace=10**6, max_logits_bytes=40000)
    split = [p for p in plans if p.req_start == 2]
    assert [(p.token_start, p.token_end) for p in split[:2]] == [(20, 22), (22, 24)]
    assert split[-1].token_end == 520 and len(split) == 250
    assert not split[0].skip_kv_gather and all(p.skip_kv_gather for p in split[1:])
    covered = sorted(t for p in plans for t in range(p.token_start, p.token_end))
    assert covered == list(range(540))


@pytest.mark.parametrize("S, qsl", [([0], [0, 0]), ([7], [0, 0]), ([7, 5], [0, 0, 0]),
                                     ([7, 5], [3, 3, 3])])
def test_plan_prefill_chunks_no_query_tokens_no_chunk(device, S, qsl):
    assert plan_prefill_chunks(S, qsl, max_kv_workspace=100, max_logits_bytes=1000) == []
    b = IndexerMetadataBuilder(device, 1, 64, 8, 4096, max_kv_workspace=100,
                               max_logits_bytes=1000)
    assert b.build_prefill(i32(S, device), i32(qsl, device)) == []


@pytest.mark.parametrize("qsl, kw, error, text", [
    ([0, 4], {}, ValueError, "query_start_loc must have len(seq_lens) + 1 = 3 entries, got 2"),
    ([0, 6, 2], {}, ValueError, "must be >= 0 and non-decreasing, got [0, 6, 2]"),
    ([-1, 6, 8], {}, ValueError, "must be >= 0 and non-decreasing, got [-1, 6, 8]"),
    ([0, 4, 8], dict(max_logits_bytes=-1), ValueError, "max_logits_bytes must be >= 4, got -1"),
    ([0, 4, 8], dict(max_kv_workspace=0), ValueError, "max_kv_workspace must be >= 1, got 0"),
    ([0, 4, 8], dict(compress_ratio=0), ValueError, "compress_ratio must be >= 1, got 0"),
    ([0, 4, 8], dict(dcp_world_size=0), ValueError, "dcp_world_size must be >= 1, got 0"),
    ([0, 4, 8], dict(interleave=2.0), TypeError, "interleave must be an int, got float"),
])
def test_plan_prefill_chunks_bad_input_names_the_argument(qsl, kw, error, text):
    args = {**dict(max_kv_workspace=100, max_logits_bytes=1000), **kw}
    with pytest.raises(error) as info:
        plan_prefill_chunks([10, 20], qsl, **args)
    assert text in str(info.value)


def test_plan_prefill_chunks_skips_only_empty_chunks():
    # Request 1 (no query token) closes no chunk of its own: it rides along with request 0;
    # request 2 does not fit the workspace with them and opens the next chunk.
    plans = plan_prefill_chunks([10, 20, 90], [0, 4, 4, 9], max_kv_workspace=100,
                                max_logits_bytes=10**6)
    assert [(p.req_start, p.req_end, p.token_start, p.token_end) for p in plans] == [
        (0, 2, 0, 4), (2, 3, 4, 9)]
    # A leading zero-query request that fills the workspace alone plans nothing.
    plans = plan_prefill_chunks([100, 50], [0, 0, 6], max_kv_workspace=100,
                                max_logits_bytes=10**6)
    assert [(p.req_start, p.req_end, p.token_start, p.token_end) for p in plans] == [
        (1, 2, 0, 6)]


@st.composite
def prefill_cases(draw):
    world = draw(st.integers(1, 8))
    interleave = draw(st.sampled_from([1, 2, 4, 16]))
    P = draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    qlen = torch.randint(1, 40, (P,), generator=g)
    S = qlen + torch.randint(0, 300, (P,), generator=g)
    start = draw(st.integers(0, 5))
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)]) + start
    kw = dict(dcp_world_size=world, dcp_rank=draw(st.integers(0, world - 1)),
              interleave=interleave, compress_ratio=draw(st.sampled_from([1, 4])),
              max_kv_workspace=draw(st.sampled_from([340, 400, 10**6])),
              max_logits_bytes=draw(st.sampled_from([4096, 10**5, 10**9])))
    return S.to(I32), qsl.to(I32), kw


def run_prefill_both(device, S, qsl, kw):
    b = IndexerMetadataBuilder(device, 1, 64, 8, 1 << 16, **kw)
    chunks = b.build_prefill(S.to(device), qsl.to(device))
    covered = []
    for c in chunks:
        want = reference.prefill_chunk_bounds(
            S[c.req_start:c.req_end], qsl[c.req_start:c.req_end + 1], c.token_start,
            c.token_end, compress_ratio=kw["compress_ratio"],
            dcp_world_size=kw["dcp_world_size"], dcp_rank=kw["dcp_rank"],
            interleave=kw["interleave"])
        for name in ("cu_seqlen_ks", "cu_seqlen_ke", "token_to_seq", "cu_seq_lens",
                     "local_cu_seq_lens"):
            assert_equal(getattr(c, name), want[name], field=name)
        for name in ("total_seq_lens", "local_total_seq_lens", "max_local_total_seq_lens"):
            assert getattr(c, name) == want[name], name
        assert (c.cu_seqlen_ke >= c.cu_seqlen_ks).all() and (c.token_to_seq >= 0).all()
        covered += range(c.token_start, c.token_end)
    assert covered == list(range(int(qsl[0]), int(qsl[-1])))  # every token exactly once
    # With the host copies given, the chunks are the same.
    again = b.build_prefill(S.to(device), qsl.to(device), seq_lens_cpu=S.tolist(),
                            query_start_loc_cpu=qsl.tolist())
    assert [(c.token_start, c.token_end) for c in again] == [
        (c.token_start, c.token_end) for c in chunks]


@given(prefill_cases())
def test_random_prefill_cpu(case):
    run_prefill_both(torch.device("cpu"), *case)


@pytest.mark.cuda
@given(prefill_cases())
def test_random_prefill_cuda(case):
    run_prefill_both(torch.device("cuda"), *case)


# ---------------------------------------------------------------------------------------
# Builder: decode metadata, native vs flattened
# ---------------------------------------------------------------------------------------


def decode_batch(B, next_n, NB, bs, seed, device):
    g = torch.Generator().manual_seed(seed)
    S = torch.randint(next_n, NB * bs, (B,), generator=g, dtype=I32)
    if B > 2:
        S[1] = 0  # a padding request
    table = torch.randint(0, 64, (B + 2, NB), generator=g, dtype=I32)
    qsl = torch.arange(B + 1, dtype=I32) * next_n
    return S.to(device), qsl.to(device), table.to(device)


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_builder_native_and_flatten_layouts(device, next_n):
    B, NB, bs = 5, 6, 16
    S, qsl, table = decode_batch(B, next_n, NB, bs, next_n, device)
    native = IndexerMetadataBuilder(device, next_n, bs, 8, NB * bs, capability=(10, 0))
    flat = IndexerMetadataBuilder(device, next_n, bs, 8, NB * bs, capability=(9, 0),
                                  materialize_block_table=True)
    assert native.path == "native" and native.reorder_batch_threshold == next_n
    assert flat.path == ("native" if next_n <= 2 else "flatten")
    a = native.build_decode(S, qsl, table, B, B * next_n, uniform=True)
    b = flat.build_decode(S, qsl, table, B, B * next_n, uniform=True)
    want = reference.decode_row_ends(S.cpu(), next_n)
    assert a.context_lens.shape == (B, next_n) and a.block_table.shape == (B, NB)
    if b.path == "flatten":
        assert b.context_lens.shape == (B * next_n, 1) and b.block_table_is_per_token
        assert_equal(b.block_table, table.cpu()[torch.arange(B).repeat_interleave(next_n)])
    for md in (a, b):
        assert_equal(md.context_lens.reshape(-1), want)
        assert_equal(md.row_ends, want)
        assert_equal(md.seq_lens_per_token, want)
        assert_equal(md.row_map, torch.arange(B, dtype=I32).repeat_interleave(next_n))
        assert md.max_context_len == NB * bs
    # Ragged batches are always flattened.
    r = native.build_decode(S, qsl, table, B, B * next_n, uniform=False)
    assert r.path == "flatten" and r.context_lens.shape == (B * next_n, 1)
    assert_equal(r.context_lens.reshape(-1), want)


def test_builder_dcp_keeps_global_lengths(device):
    S, qsl = i32([10, 7, 12, 0], device), i32([0, 3, 4, 8, 8], device)
    b = IndexerMetadataBuilder(device, 4, 64, 4, 4096, dcp_world_size=2, dcp_rank=1,
                               capability=(9, 0))
    md = b.build_decode(S, qsl, torch.zeros(4, 2, dtype=I32, device=device), 4, 8,
                        uniform=False)
    assert md.global_context_lens.reshape(-1).tolist() == [8, 9, 10, 7, 9, 10, 11, 12]
    want_local = reference.local_seq_lens(md.seq_lens_per_token.cpu(), 1, 2, 1)
    assert_equal(md.context_lens.reshape(-1), want_local)
    assert_equal(md.row_ends, want_local)
    assert md.context_lens.reshape(-1)[:3].tolist() == [4, 4, 5]


def test_builder_compression_and_interleave(device):
    S, qsl = i32([1000, 0, 517], device), i32([0, 2, 2, 4], device)
    b = IndexerMetadataBuilder(device, 2, 64, 4, 4096, dcp_world_size=4, dcp_rank=3,
                               interleave=16, compress_ratio=4, capability=(9, 0))
    for uniform in (True, False):
        md = b.build_decode(S, qsl if not uniform else None,
                            torch.zeros(3, 1, dtype=I32, device=device), 3,
                            6 if uniform else 4, uniform=uniform)
        want_g, want_l, _ = reference.decode_context_lens(
            S.cpu(), 6 if uniform else 4, next_n=2 if uniform else None,
            query_start_loc=None if uniform else qsl.cpu(), compress_ratio=4,
            dcp_world_size=4, dcp_rank=3, interleave=16)
        assert_equal(md.seq_lens_per_token, want_g, uniform=uniform)
        assert_equal(md.context_lens.reshape(-1), want_l, uniform=uniform)
    # Rank 3's share of 4096 // 4 = 1024 positions in groups of 16 over 4 ranks.
    assert md.max_context_len == 256
    assert md.max_context_len == reference.local_seq_lens(torch.tensor([1024]), 3, 4, 16).item()


def test_native_and_flattened_logits_are_identical():
    torch.manual_seed(0)
    B, next_n, H, D, bs, NB, num_blocks = 3, 4, 4, 32, 16, 5, 64
    S, qsl, table = decode_batch(B, next_n, NB, bs, 7, "cpu")
    native = IndexerMetadataBuilder("cpu", next_n, bs, B, NB * bs, capability=(10, 0))
    flat = IndexerMetadataBuilder("cpu", next_n, bs, B, NB * bs, capability=(9, 0))
    a = native.build_decode(S, qsl, table, B, B * next_n, uniform=True)
    b = flat.build_decode(S, qsl, table, B, B * next_n, uniform=True)
    assert (a.path, b.path) == ("native", "flatten")
    q = torch.randn(B, next_n, H, D).to(torch.float8_e4m3fn)
    kv = torch.randn(num_blocks, bs, D).to(torch.float8_e4m3fn)
    scale = torch.rand(num_blocks, bs) + 0.5
    w = torch.rand(B * next_n, H)
    ln = paged_mqa_logits(q, kv, scale, w, a.context_lens, a.block_table, a.max_context_len,
                          use_deep_gemm=False)
    lf = paged_mqa_logits(q.view(B * next_n, 1, H, D), kv, scale, w, b.context_lens,
                          b.block_table, b.max_context_len, row_map=b.row_map,
                          use_deep_gemm=False)
    assert ln.shape == (B * next_n, NB * bs)
    assert torch.equal(ln, lf)
    assert torch.equal(a.row_ends, b.row_ends)
    # -inf exactly from each row's end on, finite before it.
    cols = torch.arange(NB * bs)
    ends = a.row_ends.long()[:, None]
    assert torch.isinf(ln[cols >= ends]).all() and torch.isfinite(ln[cols < ends]).all()
    # A direct computation of one entry.
    i, p = 9, 1  # request 2 (request 1 is padding), inside its context
    g, j = divmod(i, next_n)
    k = kv[table[g, p // bs], p % bs].float() * scale[table[g, p // bs], p % bs]
    direct = ((q[g, j].float() @ k).relu() * w[i]).sum()
    assert torch.allclose(ln[i, p], direct, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    S, qsl = i32([10, 7]), i32([0, 3, 4])
    with pytest.raises(ValueError, match="exactly one of next_n"):
        decode_context_lens(S, 4)
    with pytest.raises(ValueError, match="exactly one of next_n"):
        decode_context_lens(S, 4, next_n=2, query_start_loc=qsl)
    with pytest.raises(ValueError, match=r"query_start_loc must have at least 3 entries .*, got 2"):
        decode_context_lens(S, 4, query_start_loc=qsl[:2])
    with pytest.raises(TypeError, match="seq_lens must be int32, got torch.int64"):
        decode_context_lens(S.long(), 4, next_n=2)
    with pytest.raises(ValueError, match=r"out must have at least 4 entries .*, got shape \(3,\)"):
        decode_context_lens(S, 4, next_n=2, out=torch.zeros(3, dtype=I32))
    with pytest.raises(ValueError, match=r"local_out must have 2 columns, got shape \(4, 3\)"):
        decode_context_lens(S, 4, next_n=2, dcp_world_size=2, dcp_rank=None,
                            local_out=torch.zeros(4, 3, dtype=I32))
    with pytest.raises(ValueError, match=r"dcp_rank must be < dcp_world_size \(2\), got 2"):
        decode_context_lens(S, 4, next_n=2, dcp_world_size=2, dcp_rank=2)
    with pytest.raises(ValueError, match="compress_ratio must be >= 1, got 0"):
        decode_context_lens(S, 4, next_n=2, compress_ratio=0)
    with pytest.raises(ValueError, match=r"row_starts must have at least 1 entries .*, got 0"):
        prefill_chunk_bounds(i32([8]), i32([0, 8]), i32([]), 0, 8)
    with pytest.raises(ValueError, match="token_end must be >= 4, got 2"):
        prefill_chunk_bounds(i32([8]), i32([0, 8]), i32([0]), 4, 2)
    b = IndexerMetadataBuilder("cpu", 2, 64, 2, 4096)
    with pytest.raises(ValueError, match="num_decode_tokens must be num_decode_reqs .*, got 3"):
        b.build_decode(S, qsl, torch.zeros(2, 4, dtype=I32), 2, 3, uniform=True)
    with pytest.raises(ValueError, match="num_decode_reqs must be <= 2, got 3"):
        b.build_decode(S, qsl, torch.zeros(2, 4, dtype=I32), 3, 6, uniform=True)
    with pytest.raises(ValueError, match="query_start_loc is required"):
        b.build_decode(S, None, torch.zeros(2, 4, dtype=I32), 2, 3, uniform=False)
    with pytest.raises(ValueError,
                       match=r"block_size \(6\) must be a multiple of interleave \(4\)"):
        IndexerMetadataBuilder("cpu", 2, 6, 2, 4096, dcp_world_size=2, interleave=4)
    with pytest.raises(ValueError, match=r"query_start_loc must have shape \(2,\), got \(3,\)"):
        b.build_prefill(i32([8]), i32([0, 8, 9]))


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(device):
    def step(S, qsl, glob, local, row_map, ks, ke, tts, row_starts):
        decode_context_lens(S, 8, query_start_loc=qsl, dcp_world_size=2, dcp_rank=1,
                            out=glob, local_out=local, row_map_out=row_map)
        prefill_chunk_bounds(S[:1], qsl[:2], row_starts, 0, 3, dcp_world_size=2, ks=ks,
                             ke=ke, token_to_seq=tts)
        return glob * 1, local * 1, row_map * 1, ke * 1

    S, qsl = i32([10, 7, 12, 0], device), i32([0, 3, 4, 8, 8], device)
    bufs = [torch.empty(8, dtype=I32, device=device) for _ in range(3)]
    pbufs = [torch.empty(3, dtype=I32, device=device) for _ in range(3)]
    torch._dynamo.reset()
    glob, local, row_map, ke = torch.compile(step, fullgraph=True)(
        S, qsl, *bufs, *pbufs, torch.zeros(1, dtype=I32, device=device))
    assert glob.tolist() == [8, 9, 10, 7, 9, 10, 11, 12]
    assert_equal(local, reference.local_seq_lens(glob.cpu(), 1, 2, 1))
    assert row_map.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert_equal(ke, reference.prefill_chunk_bounds(S.cpu()[:1], qsl.cpu()[:2], 0, 3,
                                                    dcp_world_size=2)["cu_seqlen_ke"])


@pytest.mark.cuda
@pytest.mark.parametrize("uniform, capability", [(True, (10, 0)), (True, (9, 0)),
                                                 (False, (9, 0))])
def test_decode_build_graph_replay_no_sync(uniform, capability):
    dev = torch.device("cuda")
    B, next_n, NB, bs = 16, 4, 8, 64
    b = IndexerMetadataBuilder(dev, next_n, bs, 32, NB * bs, dcp_world_size=4, dcp_rank=2,
                               interleave=2, capability=capability,
                               materialize_block_table=True)
    S = torch.zeros(B, dtype=I32, device=dev)
    qsl = torch.zeros(B + 1, dtype=I32, device=dev)
    table = torch.zeros(B, NB, dtype=I32, device=dev)
    Td = B * next_n if uniform else 40
    out = {}

    def step():
        out["md"] = b.build_decode(S, qsl, table, B, Td, uniform=uniform)

    graph = capture_graph(step)
    for seed in range(3):
        g = torch.Generator().manual_seed(300 + seed)
        dlen = torch.randint(0, next_n + 1, (B,), generator=g, dtype=I32)
        dlen[-1] += Td - int(dlen.sum()) if not uniform else 0
        dlen = dlen.clamp(min=0)
        new_qsl = (torch.arange(B + 1, dtype=I32) * next_n if uniform else
                   torch.cat([torch.zeros(1, dtype=I32), dlen.cumsum(0).to(I32)]))
        new_S = torch.randint(0, NB * bs, (B,), generator=g, dtype=I32)
        new_S[torch.rand(B, generator=g) < 0.2] = 0
        new_table = torch.randint(0, 1000, (B, NB), generator=g, dtype=I32)
        S.copy_(new_S), qsl.copy_(new_qsl), table.copy_(new_table)
        graph.replay()
        md = out["md"]
        want_g, want_l, want_map = reference.decode_context_lens(
            new_S, Td, next_n=next_n if uniform else None,
            query_start_loc=None if uniform else new_qsl, dcp_world_size=4, dcp_rank=2,
            interleave=2)
        assert_equal(md.seq_lens_per_token, want_g, seed=seed)
        assert_equal(md.context_lens.reshape(-1), want_l, seed=seed)
        assert_equal(md.row_map, want_map, seed=seed)
        if md.block_table_is_per_token:
            assert_equal(md.block_table, new_table[want_map.long().clamp(min=0)], seed=seed)


@pytest.mark.cuda
def test_prefill_build_reads_sizes_back_at_most_once():
    import warnings
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(9)
    S = torch.randint(100, 3000, (10,), generator=g, dtype=I32)
    qlen = torch.randint(1, 60, (10,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)]).to(I32)
    b = IndexerMetadataBuilder(dev, 1, 64, 4, 1 << 16, dcp_world_size=2, dcp_rank=1,
                               max_kv_workspace=3000, max_logits_bytes=1 << 15)
    S_dev, qsl_dev = S.to(dev), qsl.to(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            chunks = b.build_prefill(S_dev, qsl_dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(chunks) > 1 and len(syncs) <= 1, [str(w.message) for w in syncs]
    torch.cuda.set_sync_debug_mode("error")
    try:  # with the caller's host copies: no host read at all
        again = b.build_prefill(S_dev, qsl_dev, seq_lens_cpu=S.tolist(),
                                query_start_loc_cpu=qsl.tolist())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(again) == len(chunks)
    for c, d in zip(chunks, again):
        assert torch.equal(c.cu_seqlen_ke, d.cu_seqlen_ke)


def test_torch_compile_dynamic_shapes():
    # With dynamic shapes the sizes reaching the argument checks are SymInts.
    torch._dynamo.reset()
    row_ends = torch.compile(decode_row_ends, dynamic=True, fullgraph=True)
    for B in (3, 5, 9):
        S = torch.randint(0, 100, (B,), dtype=I32)
        assert_equal(row_ends(S, 2), reference.decode_row_ends(S, 2))


def test_numpy_integers_are_ints():
    np = pytest.importorskip("numpy")
    S = torch.tensor([10, 5], dtype=I32)
    assert decode_row_ends(S, np.int64(2)).tolist() == [9, 10, 4, 5]
    with pytest.raises(TypeError, match="next_n must be an int, got float"):
        decode_row_ends(S, 2.0)


def test_builder_needs_an_integer_rank():
    with pytest.raises(TypeError, match="dcp_rank must be an int, got None"):
        IndexerMetadataBuilder("cpu", next_n=2, block_size=64, max_num_reqs=4,
                               max_model_len=1024, dcp_world_size=2, dcp_rank=None)
