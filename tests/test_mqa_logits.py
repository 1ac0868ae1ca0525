"""Paged MQA logits (docs/ops.md section 8): the fused FP8 KV-cache layout, the torch
path, and - on a GPU with deep_gemm installed - DeepGEMM's kernel against it, native
against flattened decode batches, and the decode-path table against what the kernel
takes."""
import pytest
import torch

from dsa_ext import decode_path, mqa_logits
from dsa_ext.indexer import IndexerMetadataBuilder
from dsa_ext.mqa_logits import (deep_gemm, pack_fp8_kv_cache, paged_mqa_logits,
                                paged_mqa_logits_schedule, quantize_fp8_kv_cache,
                                unpack_fp8_kv_cache)
from conftest import HAS_CUDA, capture_graph

I32, FP8 = torch.int32, torch.float8_e4m3fn

# ---------------------------------------------------------------------------------------
# The fused layout and the torch path (every machine)
# ---------------------------------------------------------------------------------------


def test_pack_layout_bytes():
    """Each block: its fp8 values token-major, then its fp32 scales."""
    kv = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]).to(FP8)          # 1 block, 2 tokens, D=2
    scale = torch.tensor([[0.5, 8.0]])
    packed = pack_fp8_kv_cache(kv, scale)
    assert packed.shape == (1, 2, 1, 6) and packed.dtype == torch.uint8
    flat = packed.view(-1)
    assert torch.equal(flat[:4], kv.view(torch.uint8).view(-1))
    assert torch.equal(flat[4:].view(torch.float32), scale.view(-1))
    values, scales = unpack_fp8_kv_cache(packed)
    assert torch.equal(values.view(torch.uint8), kv.view(torch.uint8))
    assert torch.equal(scales, scale)


def test_quantize_per_token():
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(1))
    x[0, 0] = 0  # an all-zero token keeps the 1e-4 floor of its scale
    values, scales = unpack_fp8_kv_cache(quantize_fp8_kv_cache(x))
    want_scale = x.abs().amax(-1).clamp(min=1e-4) / 448.0
    assert torch.equal(scales, want_scale)
    back = values.float() * scales[..., None]
    # e4m3 keeps 3 fraction bits: round to nearest is within 2^-4 relative (normals),
    # and within half the smallest subnormal step (2^-10 * scale) below them.
    assert (back - x).abs().le(2**-4 * x.abs() + 2**-10 * scales[..., None]).all()


def test_fused_cache_equals_separate_values_and_scales():
    g = torch.Generator().manual_seed(2)
    N, n, H, D, bs, nb = 3, 2, 4, 16, 8, 12
    q = torch.randn(N, n, H, D, generator=g).to(FP8)
    keys = torch.randn(nb, bs, D, generator=g)
    packed = quantize_fp8_kv_cache(keys)
    values, scales = unpack_fp8_kv_cache(packed)
    w = torch.rand(N * n, H, generator=g)
    ctx = torch.tensor([[5, 6], [0, 1], [17, 24]], dtype=I32)
    table = torch.randint(0, nb, (N, 3), generator=g, dtype=I32)
    fused = paged_mqa_logits(q, packed, None, w, ctx, table, 24, use_deep_gemm=False)
    split = paged_mqa_logits(q, values, scales, w, ctx, table, 24, use_deep_gemm=False)
    assert torch.equal(fused, split)


def test_positions_past_the_block_table_are_minus_inf():
    """A context longer than the block table holds: the positions past its last block
    have no key (-inf), they do not reuse the last block."""
    q = torch.ones(1, 1, 1, 2)
    kv = torch.arange(12, dtype=torch.float32).reshape(3, 2, 2)  # 3 blocks of 2 tokens
    table = torch.tensor([[1]], dtype=I32)  # one block: positions 0 and 1
    got = paged_mqa_logits(q, kv, None, torch.ones(1, 1), torch.tensor([[4]], dtype=I32),
                           table, 4, use_deep_gemm=False)
    assert got.tolist() == [[4.0 + 5.0, 6.0 + 7.0, float("-inf"), float("-inf")]]


def test_errors_name_the_argument():
    q, w = torch.zeros(2, 1, 1, 4).to(FP8), torch.ones(2, 1)
    ctx, table = torch.ones(2, 1, dtype=I32), torch.zeros(2, 1, dtype=I32)
    packed = pack_fp8_kv_cache(torch.zeros(1, 4, 4).to(FP8), torch.ones(1, 4))
    with pytest.raises(ValueError, match="kv_scale must be None with a fused kv_cache"):
        paged_mqa_logits(q, packed, torch.ones(1, 4), w, ctx, table, 4)
    with pytest.raises(ValueError,
                       match=r"kv_cache must have shape \[num_blocks, block_size, 1, 12\]"):
        paged_mqa_logits(torch.zeros(2, 1, 1, 8).to(FP8), packed, None, w, ctx, table, 4)
    with pytest.raises(TypeError, match="kv_scale must be float32, got torch.float16"):
        pack_fp8_kv_cache(torch.zeros(1, 4, 4).to(FP8), torch.ones(1, 4, dtype=torch.float16))
    if deep_gemm() is None or not HAS_CUDA:
        with pytest.raises(ValueError, match="use_deep_gemm=True but"):
            paged_mqa_logits(q, packed, None, w, ctx, table, 4, use_deep_gemm=True)


class StandInDeepGemm:
    """DeepGEMM's Python API as the call path sees it (2.x names, or only the older
    fp8_paged_mqa_logits), computing with the torch path and leaving what DeepGEMM leaves
    unwritten past each row's length as junk, in rows padded like DeepGEMM's."""

    def __init__(self, new_api):
        self.calls = []
        if new_api:
            self.fp8_fp4_paged_mqa_logits = self._new
        else:
            self.fp8_paged_mqa_logits = self._old

    def get_num_sms(self):
        return 3

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms):
        assert context_lens.dim() == 2 and context_lens.is_contiguous()
        self.calls.append(("schedule", block_kv, num_sms))
        return torch.zeros(num_sms + 1, 2, dtype=I32)

    def _new(self, q, kv_cache, weights, context_lens, block_table, schedule, max_len, *,
             clean_logits):
        q_fp, q_sf = q
        assert q_sf is None
        return self._old(q_fp, kv_cache, weights, context_lens, block_table, schedule,
                         max_len, clean_logits=clean_logits)

    def _old(self, q, kv_cache, weights, context_lens, block_table, schedule, max_len, *,
             clean_logits):
        assert not clean_logits and schedule.shape == (4, 2)
        assert block_table.shape[0] == q.shape[0]  # one table row per query group
        self.calls.append(("logits", tuple(q.shape)))
        exact = paged_mqa_logits(q, kv_cache, None, weights, context_lens, block_table,
                                 max_len, use_deep_gemm=False)
        padded = torch.full((exact.shape[0], max_len + 256), 7.0)
        padded[:, :max_len] = torch.where(torch.isinf(exact), 7.0, exact)
        return padded[:, :max_len]


@pytest.mark.parametrize("new_api", [True, False])
def test_deep_gemm_call_path_with_a_stand_in(new_api):
    """The DeepGEMM path passes DeepGEMM's arguments (2-D lengths, one table row per
    group, its schedule, clean_logits=False) and sets -inf past each row itself; native
    and flattened layouts give the torch path's logits."""
    g = torch.Generator().manual_seed(3)
    B, n, H, D, bs, nb, NB = 3, 2, 4, 16, 8, 20, 4
    q = torch.randn(B, n, H, D, generator=g).to(FP8)
    kv = quantize_fp8_kv_cache(torch.randn(nb, bs, D, generator=g))
    w = torch.rand(B * n, H, generator=g)
    S = torch.tensor([30, 0, 17], dtype=I32)
    table = torch.randint(0, nb, (B, NB), generator=g, dtype=I32)
    qsl = torch.arange(B + 1, dtype=I32) * n
    builder = IndexerMetadataBuilder("cpu", n, bs, B, NB * bs, capability=(10, 0))
    for uniform in (True, False):
        md = builder.build_decode(S, qsl, table, B, B * n, uniform=uniform)
        qq = q if uniform else q.view(B * n, 1, H, D)
        row_map = None if uniform else md.row_map
        want = paged_mqa_logits(qq, kv, None, w, md.context_lens, md.block_table,
                                md.max_context_len, row_map=row_map, use_deep_gemm=False)
        dg = StandInDeepGemm(new_api)
        got = mqa_logits._deep_gemm_logits(dg, qq, kv, w, md.context_lens, md.block_table,
                                           md.max_context_len, row_map, None)
        assert dg.calls == [("schedule", bs, 3), ("logits", tuple(qq.shape))]
        assert got.stride(0) == md.max_context_len + 256
        assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------
# DeepGEMM on a GPU
# ---------------------------------------------------------------------------------------

needs_deep_gemm = pytest.mark.skipif(deep_gemm() is None, reason="needs deep_gemm")
# The DeepSeek V3.2 indexer: 64 heads of 128, KV blocks of 64 (DeepGEMM's sm_90 block).
H, D, BS, MAX_LEN = 64, 128, 64, 4096
# Batch sizes per next_n: DeepGEMM JIT-compiles its schedule kernel per 32-row multiple
# of the batch, so these reuse few of them (native 64 rows; flattened 64, 128 or 256).
BATCH = {1: 64, 2: 64, 3: 40, 4: 64}


def decode_case(next_n, seed=0):
    """A decode batch on the GPU: lengths in [next_n, MAX_LEN], a random block per
    position, fp8 queries, a fused cache of quantized keys, fp32 weights."""
    g = torch.Generator().manual_seed(seed)
    B = BATCH[next_n]
    NB = MAX_LEN // BS
    S = torch.randint(next_n, MAX_LEN + 1, (B,), generator=g, dtype=I32)
    S[1] = 0  # a padding request
    table = torch.randperm(B * NB, generator=g).to(I32).view(B, NB)
    keys = torch.randn(B * NB, BS, D, generator=g)
    q = torch.randn(B, next_n, H, D, generator=g).to(FP8)
    w = torch.randn(B * next_n, H, generator=g) / H**0.5
    return dict(S=S.cuda(), table=table.cuda(), kv=quantize_fp8_kv_cache(keys).cuda(),
                q=q.cuda(), w=w.cuda())


def builds(c, next_n):
    """Native-layout ([B, next_n], an sm_100 build: native for any next_n) and flattened
    ([B * next_n, 1]: the same tokens as a ragged batch, which is always flattened)
    metadata of one batch."""
    B = c["S"].shape[0]
    qsl = torch.arange(B + 1, dtype=I32, device="cuda") * next_n
    native, flat = (
        IndexerMetadataBuilder("cuda", next_n, BS, B, MAX_LEN, capability=(10, 0),
                               materialize_block_table=True).build_decode(
            c["S"], qsl, c["table"], B, B * next_n, uniform=uniform)
        for uniform in (True, False))
    assert (native.path, flat.path) == ("native", "flatten")
    return native, flat


def logits_of(c, md, use_deep_gemm):
    q = c["q"] if md.path == "native" else c["q"].view(-1, 1, H, D)
    return paged_mqa_logits(q, c["kv"], None, c["w"], md.context_lens, md.block_table,
                            md.max_context_len, use_deep_gemm=use_deep_gemm)


def sm90_native_next_n():
    return [n for n in range(1, 5) if decode_path((9, 0), n) == "native"]


def on_sm90():
    return HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


def fp8_bound(c, md):
    """The largest |DeepGEMM - torch| an entry may show: 2^-9 of the sum of the absolute
    terms, sum_h |w_h| sum_d |q_hd k_d| s.

    Both compute with the same fp8 values (their products are exact in fp32); they differ
    in summation only. The torch path sums in fp32. DeepGEMM's WGMMA accumulates the 128
    products of each head in 4 steps of K = 32, at FP8 tensor-core accumulation precision
    (about 14 significant bits, DeepSeek-V3 report section 3.3.2: a rounding error under
    2^-13 of the magnitude so far per step), then applies the scale after its fp32 sum
    over heads. Each rounding is bounded by the magnitude of the partial sum, itself at
    most the sum of absolute terms, so the difference stays under (4 * 2^-13 + 2^-18) of
    it: 2^-11 with margin; the bound allows 4x that."""
    q = c["q"].float().abs() if md.path == "native" else c["q"].float().abs().view(-1, 1, H, D)
    values, scales = unpack_fp8_kv_cache(c["kv"])
    return 2.0**-9 * paged_mqa_logits(q, values.float().abs(), scales, c["w"].abs(),
                                      md.context_lens, md.block_table, md.max_context_len,
                                      use_deep_gemm=False)


def calc_diff(x, y):
    """DeepGEMM's own test measure: 1 - 2 sum(xy) / sum(x^2 + y^2)."""
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


@pytest.mark.cuda
@needs_deep_gemm
@pytest.mark.parametrize("next_n", sm90_native_next_n())
def test_native_and_flattened_deep_gemm_are_identical(next_n):
    """Every next_n the sm_90 table calls native: DeepGEMM's native and flattened logits
    are bit-identical, and so are the top-K row bounds and each row's top-K."""
    if not on_sm90():
        pytest.skip("checks the sm_90 table's native next_n on sm_90")
    c = decode_case(next_n)
    native, flat = builds(c, next_n)
    a, b = logits_of(c, native, True), logits_of(c, flat, True)
    assert torch.equal(native.row_ends, flat.row_ends)
    assert torch.equal(a, b)
    k = 512
    ta, tb = torch.topk(a, k, dim=1), torch.topk(b, k, dim=1)
    assert torch.equal(ta.values, tb.values) and torch.equal(ta.indices, tb.indices)


@pytest.mark.cuda
@needs_deep_gemm
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_deep_gemm_matches_torch_within_fp8_bound(next_n):
    """On the path the table picks (flattened where the kernel is not native), DeepGEMM
    agrees with the torch path within fp8_bound, with -inf at exactly the same places."""
    c = decode_case(next_n, seed=next_n)
    native, flat = builds(c, next_n)
    cap = torch.cuda.get_device_capability()
    md = native if decode_path(cap, next_n) == "native" else flat
    got, want = logits_of(c, md, True), logits_of(c, md, False)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    err = (got - want).abs()[finite]
    assert err.le(fp8_bound(c, md)[finite]).all(), f"max error {err.max().item()}"
    assert calc_diff(got[finite], want[finite]) < 5e-6  # DeepGEMM's fp32 threshold


@pytest.mark.cuda
@needs_deep_gemm
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_decode_path_table_is_what_the_sm90_kernel_takes(next_n):
    """What decode_path calls native on sm_90 runs natively in DeepGEMM; what it calls
    flatten DeepGEMM refuses natively (if it ever takes it, measure native against
    flattened, tools/deepgemm_check.py, and update indexer.DECODE_PATH_RULES)."""
    if not on_sm90():
        pytest.skip("the sm_90 rule needs an sm_90 device")
    c = decode_case(next_n)
    native, _ = builds(c, next_n)
    if decode_path((9, 0), next_n) == "native":
        assert logits_of(c, native, True).shape == (native.num_tokens, MAX_LEN)
    else:
        with pytest.raises(RuntimeError, match="next_n"):
            logits_of(c, native, True)
            torch.cuda.synchronize()


@pytest.mark.cuda
@needs_deep_gemm
def test_decode_metadata_and_deep_gemm_capture_in_one_graph():
    """build_decode (with DeepGEMM's schedule) and the logits replay in a CUDA graph with
    host syncs turned into errors, and the replay equals the eager result."""
    next_n = 2
    c = decode_case(next_n, seed=7)
    B = c["S"].shape[0]
    b = IndexerMetadataBuilder("cuda", next_n, BS, B, MAX_LEN, materialize_block_table=True,
                               deep_gemm_schedule=True)
    S = c["S"].clone()
    out = {}

    def step():
        md = b.build_decode(S, None, c["table"], B, B * next_n, uniform=True)
        assert md.schedule_metadata is not None
        out["logits"] = logits_of(c, md, True)

    graph = capture_graph(step)
    S.copy_(torch.clamp(c["S"] - 3, min=0))   # new lengths, same buffers
    graph.replay()
    md = b.build_decode(S, None, c["table"], B, B * next_n, uniform=True)
    eager = logits_of(c, md, True)
    assert torch.equal(out["logits"], eager)
    assert torch.equal(paged_mqa_logits_schedule(md.context_lens, BS), md.schedule_metadata)
