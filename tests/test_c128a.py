"""C128A metadata (docs/ops.md section 3): CPU and CUDA against the torch reference."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import c128a, reference
from conftest import assert_equal

I32, I64 = torch.int32, torch.int64
EXPANDED = "must not have a zero stride along a dimension of more than one element"
SENTINEL = 77


def make_buffers(rows, cap, device):
    return (torch.full((rows, cap), SENTINEL, dtype=I32, device=device),
            torch.full((rows,), SENTINEL, dtype=I32, device=device),
            torch.full((rows, cap), SENTINEL, dtype=I32, device=device))


def run_both(device, positions, ratio, Td, token_to_req, block_table, bs, slot_mapping, width,
             cap=None, buffers=None):
    """Run dsa_ext on `device`, the reference on the CPU; compare the views exactly."""
    T = positions.shape[0]
    cap = cap or width
    bufs = buffers or make_buffers(max(T, 1), cap, device)
    dev = [x.to(device) for x in (positions, token_to_req, block_table, slot_mapping)]
    dec, lens, pre = dsa_ext.build_c128a_topk_metadata(
        dev[0], ratio, Td, dev[1], dev[2], bs, dev[3], *bufs, width)
    want = reference.build_c128a_topk_metadata(positions, ratio, Td, token_to_req, block_table,
                                               bs, slot_mapping, width)
    ctx = dict(T=T, Td=Td, width=width, ratio=ratio, bs=bs)
    for got, w in zip((dec, lens, pre), want):
        assert_equal(got, w, **ctx)
    assert dec.stride(0) == bufs[0].stride(0) and pre.stride(0) == bufs[2].stride(0)
    for view, buf in ((dec, bufs[0]), (pre, bufs[2])):
        assert view.numel() == 0 or view.data_ptr() == buf.data_ptr()
    return dec, lens, pre, bufs


# ---------------------------------------------------------------------------------------
# Width and capacity (host ints)
# ---------------------------------------------------------------------------------------


def test_width_formula():
    w = dsa_ext.c128a_topk_width
    assert w(32768, 8192) == 256          # 32K tokens -> 256 compressed -> 256
    assert w(0, 8192) == 128              # at least the alignment
    assert w(100, 8192) == 128
    assert w(128 * 129, 8192) == 256      # next power of two
    assert w(1 << 20, 8192) == 8192       # capped at capacity
    assert w(1000, 1024, compress_ratio=4, alignment=64) == 256
    assert w(10, 256, compress_ratio=1, alignment=128) == 128


def test_capacity_formula():
    assert dsa_ext.c128a_capacity(1 << 20) == 8192
    assert dsa_ext.c128a_capacity(1) == 128
    assert dsa_ext.c128a_capacity(128 * 129) == 256
    assert dsa_ext.c128a_capacity(1000, compress_ratio=4, alignment=64) == 256


@pytest.mark.parametrize("args, kw, text", [
    ((1024, 1024), dict(compress_ratio=0), "compress_ratio must be >= 1, got 0"),
    ((1024, 1024), dict(compress_ratio=-128), "compress_ratio must be >= 1"),
    ((1024, 1024), dict(alignment=0), "alignment must be >= 1"),
    ((256 * 128, 200), {}, "must be a multiple of alignment (128)"),
    ((512 * 128, 256), {}, "capacity (256) is too small"),
    ((-1, 256), {}, "max_seq_len must be >= 0"),
])
def test_width_errors(args, kw, text):
    with pytest.raises(ValueError) as info:
        dsa_ext.c128a_topk_width(*args, **kw)
    assert text in str(info.value)


def test_capacity_errors():
    with pytest.raises(ValueError, match="compress_ratio must be >= 1"):
        dsa_ext.c128a_capacity(1024, compress_ratio=0)
    with pytest.raises(TypeError, match="max_model_len must be an int"):
        dsa_ext.c128a_capacity(1024.0)


# ---------------------------------------------------------------------------------------
# Vectors of docs/ops.md
# ---------------------------------------------------------------------------------------


def test_spec_vector_one(device):
    dec, lens, pre, bufs = run_both(
        device, torch.tensor([255, 511]), 128, 1, torch.tensor([0, 0], dtype=I32),
        torch.tensor([[3]], dtype=I32), 256, torch.tensor([0, 1]), 128, cap=256)
    assert dec.shape == (1, 128) and pre.shape == (1, 128)
    assert dec.stride() == (256, 1) and pre.stride() == (256, 1)
    assert dec[0, :3].tolist() == [768, 769, -1] and (dec[0, 2:] == -1).all()
    assert lens.tolist() == [2]
    assert pre[0, :5].tolist() == [0, 1, 2, 3, -1] and (pre[0, 4:] == -1).all()
    assert (bufs[0][:, 128:] == SENTINEL).all() and (bufs[2][:, 128:] == SENTINEL).all()


SPEC2 = dict(positions=torch.tensor([255, 511, 383, 639]),
             token_to_req=torch.tensor([0, 1, 0, 0], dtype=I32),
             block_table=torch.tensor([[3], [5]], dtype=I32),
             slot_mapping=torch.tensor([0, -1, 2, 3]))
SPEC2_DECODE = [[1536, 1537], []]
SPEC2_PREFILL = [[0, 1, 2], [0, 1, 2, 3, 4]]


def check_spec2(dec, lens, pre, bufs, width, untouched_from, views=True):
    assert dec.shape == (2, width) and pre.shape == (2, width)
    if views:
        assert dec.stride() == (512, 1) and pre.stride() == (512, 1)
    for got, rows in ((dec, SPEC2_DECODE), (pre, SPEC2_PREFILL)):
        for r, head in enumerate(rows):
            assert got[r].tolist() == head + [-1] * (width - len(head))
    assert lens.tolist() == [2, 0]
    assert (bufs[0][:2, untouched_from:] == SENTINEL).all()
    assert (bufs[2][:2, untouched_from:] == SENTINEL).all()


def test_spec_vector_two_width_256_then_128(device):
    bufs = make_buffers(4, 512, device)
    args = [SPEC2[k] for k in ("positions", "token_to_req", "block_table", "slot_mapping")]
    dec, lens, pre, _ = run_both(device, args[0], 128, 2, args[1], args[2], 512, args[3],
                                 256, buffers=bufs)
    check_spec2(dec, lens, pre, bufs, 256, 256)
    # Same buffers at width 128: columns [128, 256) keep what width 256 wrote.
    before = bufs[0][:2, 128:256].clone(), bufs[2][:2, 128:256].clone()
    dec, lens, pre, _ = run_both(device, args[0], 128, 2, args[1], args[2], 512, args[3],
                                 128, buffers=bufs)
    check_spec2(dec, lens, pre, bufs, 128, 256)
    assert torch.equal(bufs[0][:2, 128:256], before[0])
    assert torch.equal(bufs[2][:2, 128:256], before[1])


def test_builder_spec_vector(device):
    b = dsa_ext.C128AMetadataBuilder(512 * 128, 4, device)
    assert b.capacity == 512 and b.decode_buffer.shape == (4, 512)
    assert b.width(511 * 128) == 512 and b.width(200 * 128) == 256
    dec, lens, pre = b.build(SPEC2["positions"].to(device), 2,
                             SPEC2["token_to_req"].to(device), SPEC2["block_table"].to(device),
                             512, SPEC2["slot_mapping"].to(device), max_seq_len=640)
    assert dec.shape == (2, 128) and dec.stride() == (512, 1)
    assert dec[0, :3].tolist() == [1536, 1537, -1] and lens.tolist() == [2, 0]
    with pytest.raises(ValueError, match="more than max_num_tokens"):
        b.build(torch.zeros(5, dtype=I64, device=device), 0, SPEC2["token_to_req"].to(device),
                SPEC2["block_table"].to(device), 512, SPEC2["slot_mapping"].to(device), 640)
    with pytest.raises(TypeError, match="positions must be a torch.Tensor, got list"):
        b.build([5, 6], 0, SPEC2["token_to_req"].to(device), SPEC2["block_table"].to(device),
                512, SPEC2["slot_mapping"].to(device), 640)
    with pytest.raises(ValueError, match=r"width \(1024\) must be <= the capacity of "
                                         r"decode_buffer \(512 columns\)"):
        b.build(SPEC2["positions"].to(device), 2, SPEC2["token_to_req"].to(device),
                SPEC2["block_table"].to(device), 512, SPEC2["slot_mapping"].to(device), 640,
                width=1024)


@pytest.mark.cuda
def test_builder_refuses_inputs_on_another_device():
    b = dsa_ext.C128AMetadataBuilder(512 * 128, 4, "cuda")
    with pytest.raises(ValueError, match="positions must be on cuda:0 .the builder's device., "
                                         "got cpu"):
        b.build(SPEC2["positions"], 2, SPEC2["token_to_req"],
                SPEC2["block_table"], 512, SPEC2["slot_mapping"], 640)


def test_padding_out_of_range_and_negative_positions(device):
    positions = torch.tensor([1000, 1000, 1000, 1000, -5, 127, 1000])
    token_to_req = torch.tensor([0, 2, -1, 1, 0, 0, 0], dtype=I32)
    block_table = torch.tensor([[1, 2], [7, -1]], dtype=I32)
    slot_mapping = torch.tensor([3, 4, 5, 6, 7, -1, 0])
    dec, lens, pre, _ = run_both(device, positions, 128, 6, token_to_req, block_table, 4,
                                 slot_mapping, 16, cap=32)
    n = 1001 // 128  # 7
    assert dec[0, :n].tolist() == [4, 5, 6, 7, 8, 9, 10] and dec[0, n] == -1
    assert (dec[1] == -1).all() and (dec[2] == -1).all()  # request 2 and -1: no table row
    assert dec[3, :n].tolist() == [28, 29, 30, 31, -1, -1, -1]  # block -1 -> negative slot
    assert lens.tolist() == [7, 7, 7, 7, 0, 0]  # negative position and padding -> 0
    assert (dec[4] == -1).all() and (dec[5] == -1).all()
    assert pre[0, :8].tolist() == list(range(7)) + [-1]


@pytest.mark.parametrize("ratio", [1, 3, 128])
def test_positions_near_the_int64_limit(device, ratio):
    """(pos + 1) // ratio at pos = 2^63 - 1 is 2^63 // ratio, not an overflow: the length
    is the width, never more."""
    big = 2**63 - 1
    positions = torch.tensor([big, big - 1, big, big - 1])
    _, lens, pre, _ = run_both(device, positions, ratio, 2, torch.zeros(2, dtype=I32),
                               torch.tensor([[3, 5]], dtype=I32), 4, torch.tensor([0, 1]), 8)
    assert lens.tolist() == [8, 8]
    assert pre.tolist() == [list(range(8))] * 2


def test_block_index_past_table_and_empty(device):
    # 3000 // 1 compressed positions, only 2 blocks of 4: entries past 8 are -1.
    dec, lens, _, _ = run_both(device, torch.tensor([2999]), 1, 1,
                               torch.tensor([0], dtype=I32), torch.tensor([[0, 1]], dtype=I32),
                               4, torch.tensor([0]), 16)
    assert dec[0].tolist() == list(range(8)) + [-1] * 8 and lens.tolist() == [16]
    # No tokens at all, only decode, only prefill.
    run_both(device, torch.zeros(0, dtype=I64), 128, 0, torch.zeros(0, dtype=I32),
             torch.zeros(0, 1, dtype=I32), 4, torch.zeros(0, dtype=I64), 128)
    run_both(device, torch.tensor([300, 400]), 128, 2, torch.tensor([0, 0], dtype=I32),
             torch.tensor([[9]], dtype=I32), 8, torch.tensor([1, 2]), 128)
    run_both(device, torch.tensor([300, 400]), 128, 0, torch.zeros(0, dtype=I32),
             torch.zeros(0, 3, dtype=I32), 8, torch.zeros(0, dtype=I64), 128)


# ---------------------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------------------


@st.composite
def c128a_cases(draw):
    ratio = draw(st.sampled_from([1, 4, 128]))
    width = draw(st.sampled_from([4, 8, 12, 128, 256, 1000, 1024, 2048]))
    cap = width + draw(st.sampled_from([0, 4, 128]))
    T = draw(st.integers(0, 40))
    Td = draw(st.integers(0, T))
    R = draw(st.integers(0, 5))
    NB = draw(st.integers(1, 20))
    bs = draw(st.sampled_from([1, 2, 3, 4, 8, 64, 256]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    positions = torch.randint(-2, width * ratio * 2, (T,), generator=g, dtype=I64)
    token_to_req = torch.randint(-1, R + 2, (T,), generator=g, dtype=I32)
    # Large entries: slots past 2^31 - 1 (entry * bs + offset) must give -1.
    top = draw(st.sampled_from([1 << 22, 2**31 - 1]))
    full = torch.randint(-1, top, (R, NB * 2), generator=g, dtype=I32)
    block_table = full[:, ::2] if draw(st.booleans()) else full[:, :NB]
    slot_mapping = torch.randint(-1, 100, (T,), generator=g, dtype=I64)
    return positions, ratio, Td, token_to_req, block_table, bs, slot_mapping, width, cap


@given(c128a_cases())
def test_random_cases_cpu(case):
    *args, width, cap = case
    run_both(torch.device("cpu"), *args, width, cap=cap)


@pytest.mark.cuda
@given(c128a_cases())
def test_random_cases_cuda(case):
    *args, width, cap = case
    run_both(torch.device("cuda"), *args, width, cap=cap)


@pytest.mark.cuda
@pytest.mark.parametrize("bs", [1, 2, 3, 8])
@pytest.mark.parametrize("T, Td, width", [(4999, 2999, 1024), (70000, 40000, 12)])
def test_many_rows_every_run(T, Td, width, bs):
    # Every kind of chunk run (c128a_run: 1, 2, 4 entries per block-table load), and more
    # rows than the grid's y dimension (the blocks loop over rows); padding tokens and
    # invalid requests among them. At width 1024 the blocks hold two rows each: an odd T
    # leaves the last block half empty, and rows 2998 / 2999 share a block across the
    # decode / prefill boundary.
    g = torch.Generator().manual_seed(T + width + bs)
    R, NB = 7, (width + bs - 1) // bs
    positions = torch.randint(-2, width * 128 * 2, (T,), generator=g, dtype=I64)
    token_to_req = torch.randint(-1, R + 1, (T,), generator=g, dtype=I32)
    block_table = torch.randint(-1, 1 << 22, (R, NB), generator=g, dtype=I32)
    block_table[R // 2:] = torch.randint(2**31 - 2**20, 2**31 - 1, (R - R // 2, NB), generator=g,
                                         dtype=I32)  # slots past 2^31 - 1: -1
    slot_mapping = torch.randint(-1, 100, (T,), generator=g, dtype=I64)
    run_both(torch.device("cuda"), positions, 128, Td, token_to_req, block_table, bs,
             slot_mapping, width)


def test_returned_views_are_the_buffers_prefixes(device):
    # Buffers that are views with a storage offset: the returned views start there too.
    big = [torch.full((5, 600), SENTINEL, dtype=I32, device=device) for _ in range(2)]
    lens_big = torch.zeros(6, dtype=I32, device=device)
    bufs = (big[0][1:, 3:], lens_big[1:], big[1][2:, 5:])
    args = [SPEC2[k].to(device) for k in ("positions", "token_to_req", "block_table",
                                          "slot_mapping")]
    got = dsa_ext.build_c128a_topk_metadata(args[0], 128, 2, args[1], args[2], 512, args[3],
                                            *bufs, 256)
    for view, want in zip(got, (bufs[0][:2, :256], bufs[1][:2], bufs[2][:2, :256])):
        assert (view.data_ptr(), view.shape, view.stride()) == \
            (want.data_ptr(), want.shape, want.stride())
    check_spec2(*got, (bufs[0], None, bufs[2]), 256, 256, views=False)


@pytest.mark.cuda
def test_unaligned_buffers_take_the_scalar_path():
    # Views starting at column 1: rows not 16-byte aligned; width 999 not a multiple of 4.
    dev = torch.device("cuda")
    big = torch.full((3, 1002), SENTINEL, dtype=I32, device=dev)
    big2 = torch.full((3, 1002), SENTINEL, dtype=I32, device=dev)
    lens = torch.zeros(3, dtype=I32, device=dev)
    bufs = (big[:, 1:], lens, big2[:, 1:])
    run_both(dev, torch.tensor([5000, 90000, 128 * 999]), 128, 2, torch.tensor([0, 0], dtype=I32),
             torch.arange(64, dtype=I32).view(1, 64), 16, torch.tensor([0, 1]), 999,
             buffers=bufs)
    assert (big[:, 0] == SENTINEL).all() and (big[:, 1000:] == SENTINEL).all()


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def good_args():
    return dict(positions=torch.tensor([255, 511]), compress_ratio=128, num_decode_tokens=1,
                token_to_req=torch.zeros(2, dtype=I32), block_table=torch.tensor([[3]], dtype=I32),
                block_size=256, slot_mapping=torch.tensor([0, 1]),
                decode_buffer=torch.empty(2, 256, dtype=I32),
                decode_lens_buffer=torch.empty(2, dtype=I32),
                prefill_buffer=torch.empty(2, 256, dtype=I32), width=128)


BAD_INPUT = [
    (dict(positions=torch.tensor([255, 511], dtype=I32)), TypeError,
     "positions must be int64, got torch.int32"),
    (dict(slot_mapping=torch.tensor([0, 1], dtype=I32)), TypeError,
     "slot_mapping must be int64, got torch.int32"),
    (dict(token_to_req=torch.zeros(2, dtype=I64)), TypeError,
     "token_to_req must be int32, got torch.int64"),
    (dict(block_table=torch.tensor([3], dtype=I32)), ValueError,
     "block_table must be 2-D, got shape (1,)"),
    (dict(compress_ratio=0), ValueError, "compress_ratio must be >= 1, got 0"),
    (dict(num_decode_tokens=3), ValueError, "num_decode_tokens must be <= 2, got 3"),
    (dict(width=512), ValueError,
     "width (512) must be <= the capacity of decode_buffer (256 columns)"),
    (dict(width=0), ValueError, "width must be >= 1, got 0"),
    (dict(token_to_req=torch.zeros(0, dtype=I32)), ValueError,
     "token_to_req must have at least 1 entries (like num_decode_tokens), got 0"),
    (dict(prefill_buffer=torch.empty(0, 256, dtype=I32)), ValueError,
     "prefill_buffer must have at least 1 entries along dim 0, got shape (0, 256)"),
    (dict(decode_lens_buffer=torch.empty(2, 1, dtype=I32)), ValueError,
     "decode_lens_buffer must be 1-D, got shape (2, 1)"),
    (dict(decode_buffer=torch.empty(1, 256, dtype=I32).expand(2, 256)), ValueError,
     "decode_buffer %s" % EXPANDED),
    (dict(prefill_buffer=torch.empty(2, 1, dtype=I32).expand(2, 256)), ValueError,
     "prefill_buffer %s" % EXPANDED),
    (dict(decode_lens_buffer=torch.empty(1, dtype=I32).expand(2)), ValueError,
     "decode_lens_buffer %s" % EXPANDED),
    (dict(prefill_buffer=torch.empty(2, 64, dtype=I32)), ValueError,
     "width (128) must be <= the capacity of prefill_buffer (64 columns)"),
    (dict(num_decode_tokens=True), TypeError, "num_decode_tokens must be an int, got bool"),
    (dict(positions=torch.tensor(255)), ValueError, "positions must be 1-D, got shape ()"),
]


@pytest.mark.parametrize("change, error, text", BAD_INPUT)
def test_bad_input_names_the_argument(change, error, text):
    kw = {**good_args(), **change}
    with pytest.raises(error) as info:
        dsa_ext.build_c128a_topk_metadata(**kw)
    assert text in str(info.value)


@pytest.mark.parametrize("change, error, text", BAD_INPUT)
def test_common_case_check_passes_no_bad_input(change, error, text):
    """The one-expression check of a serving loop's arguments takes the good ones (the full
    checks are skipped for them) and none of the bad ones (each reaches the full checks)."""
    assert c128a._valid_common_case(**good_args())
    assert not c128a._valid_common_case(**{**good_args(), **change})


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, host syncs
# ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(device):
    def step(pos, req, table, slots, dbuf, lbuf, pbuf):
        dec, lens, pre = dsa_ext.build_c128a_topk_metadata(pos, 128, 2, req, table, 512,
                                                           slots, dbuf, lbuf, pbuf, 256)
        return dec + 0, lens * 1, pre + 0

    args = [SPEC2[k].to(device) for k in ("positions", "token_to_req", "block_table",
                                          "slot_mapping")]
    bufs = make_buffers(4, 512, device)
    torch._dynamo.reset()
    dec, lens, pre = torch.compile(step, fullgraph=True)(*args, *bufs)
    check_spec2(dec, lens, pre, bufs, 256, 256, views=False)


@pytest.mark.cuda
def test_cuda_graph_replay_new_inputs_and_two_widths_no_sync():
    dev = torch.device("cuda")
    T, Td, cap = 64, 40, 1024
    builder = dsa_ext.C128AMetadataBuilder(cap * 128, T, dev)
    positions = torch.zeros(T, dtype=I64, device=dev)
    token_to_req = torch.zeros(T, dtype=I32, device=dev)
    block_table = torch.zeros(8, 16, dtype=I32, device=dev)
    slot_mapping = torch.zeros(T, dtype=I64, device=dev)
    outs = {}

    def step(width):
        outs[width] = builder.build(positions, Td, token_to_req, block_table, 64, slot_mapping,
                                    max_seq_len=0, width=width)

    graphs = {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(256)  # eager: no host sync allowed
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(256), step(128)
        torch.cuda.current_stream().wait_stream(stream)
        for width in (256, 128):
            graphs[width] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[width]):
                step(width)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in range(3):
        g = torch.Generator().manual_seed(200 + seed)
        pos = torch.randint(-1, 256 * 128 * 2, (T,), generator=g, dtype=I64)
        req = torch.randint(-1, 9, (T,), generator=g, dtype=I32)
        table = torch.randint(-1, 1 << 20, (8, 16), generator=g, dtype=I32)
        slots = torch.randint(-1, 50, (T,), generator=g, dtype=I64)
        for dst, src in ((positions, pos), (token_to_req, req), (block_table, table),
                         (slot_mapping, slots)):
            dst.copy_(src)
        graphs[256].replay()
        after_256 = builder.decode_buffer[:, 128:256].clone()
        graphs[128].replay()
        want = {w: reference.build_c128a_topk_metadata(pos, 128, Td, req, table, 64, slots, w)
                for w in (256, 128)}
        # The last replay (width 128) wrote columns < 128 and the lengths ...
        assert_equal(builder.decode_buffer[:Td, :128], want[128][0], seed=seed)
        assert_equal(builder.decode_lens_buffer[:Td], want[128][1], seed=seed)
        assert_equal(builder.prefill_buffer[:T - Td, :128], want[128][2], seed=seed)
        # ... columns [128, 256) still hold what the width-256 replay wrote.
        assert_equal(builder.decode_buffer[:Td, 128:256], want[256][0][:, 128:], seed=seed)
        assert_equal(builder.prefill_buffer[:T - Td, 128:256], want[256][2][:, 128:],
                     seed=seed)
        assert torch.equal(builder.decode_buffer[:, 128:256], after_256)
        assert (builder.decode_buffer[:, 256:] == -1).all()  # never touched: initial -1
        assert outs[128][0].stride() == (cap, 1)


@pytest.mark.cuda
def test_spec_vector_two_in_graphs_at_256_then_128():
    dev = torch.device("cuda")
    args = [SPEC2[k].to(dev) for k in ("positions", "token_to_req", "block_table",
                                       "slot_mapping")]
    bufs = make_buffers(4, 512, dev)
    staged = [torch.zeros_like(a) for a in args]  # graph inputs, filled before replay

    def step(width):
        return dsa_ext.build_c128a_topk_metadata(staged[0], 128, 2, staged[1], staged[2], 512,
                                                 staged[3], *bufs, width)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(256), step(128)
    torch.cuda.current_stream().wait_stream(stream)
    for b in bufs:
        b.fill_(SENTINEL)
    graphs, outs = {}, {}
    for width in (256, 128):
        graphs[width] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[width]):
            outs[width] = step(width)
    for dst, src in zip(staged, args):
        dst.copy_(src)
    graphs[256].replay()
    check_spec2(*outs[256], bufs, 256, 256)
    graphs[128].replay()
    check_spec2(*outs[128], bufs, 128, 256)
    assert bufs[0][0, 128:256].tolist() == [-1] * 128  # left from the width-256 replay
