"""DCP attention-output merge (docs/ops.md section 7): normalize_lse, the LSE correction
(CPU and CUDA against the fp64 torch reference), merge_attention_outputs through a fake
exchange."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ext
from dsa_ext import dcp, reference
from conftest import capture_graph as _capture
from dcp_cases import (fake_all_gather, make_attention_inputs,
                        shard_selection, sparse_attention)

F32, BF16 = torch.float32, torch.bfloat16
NAN, INF = float("nan"), float("inf")
BASES = [2.0, math.e]

# CPU (glibc) and CUDA (libdevice) exp/log differ by a few ulp, and the reference runs in
# fp64: fp32 outputs agree to ~1e-6 relative; bf16 outputs to one bf16 ulp (2^-8 rel).
# The zero / -inf / NaN rules are exact on every path.
TOL = {F32: dict(rtol=1e-5, atol=1e-6), BF16: dict(rtol=2**-7, atol=1e-5)}


def check_correction(device, out, lses, rank, base, **kw):
    want, want_g = reference.correct_attention_output(out, lses, rank, base)
    B, H, _ = out.shape
    g = torch.empty(B, H, device=device)
    got, got_g = dsa_ext.correct_attention_output(out.to(device), lses.to(device), rank,
                                                  lse_base=base, global_lse=g, **kw)
    got, got_g = got.cpu(), got_g.cpu()
    assert got.dtype == out.dtype and got.shape == want.shape
    # exact rules: this rank's heads whose LSE is -inf (NaN and +inf count as -inf) get a
    # factor of exactly 0, so exactly 0 whatever the partial holds (an empty shard's NaN);
    # NaN exactly where the reference has it
    lse = lses[rank]
    dead = torch.isnan(lse) | torch.isinf(lse)  # [B, H]
    W = lses.shape[0]
    dead = dead.reshape(B, W, H // W).permute(1, 0, 2)[..., None].expand(got.shape)
    assert (got[dead] == 0).all(), "a rank with a -inf LSE must contribute exactly 0"
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got_g), torch.isinf(want_g))
    torch.testing.assert_close(got.float(), want.float(), equal_nan=True, **TOL[out.dtype])
    torch.testing.assert_close(got_g, want_g, rtol=1e-6, atol=1e-6)
    return got, got_g


# ---------------------------------------------------------------------------------------
# Vector of docs/ops.md and fixed cases
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_spec_vector_empty_shard(device, base, dtype):
    out = torch.full((1, 2, 8), NAN, dtype=dtype)
    lses = torch.tensor([[[0.0, 0.0]], [[-INF, -INF]]])
    got, g = check_correction(device, out, lses, 1, base)
    assert (got == 0).all() and not torch.isnan(got).any()
    assert g.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("base", BASES)
def test_nan_and_plus_inf_lse_count_as_empty(device, base):
    out = torch.ones(1, 4, 2)
    lses = torch.tensor([[[1.0, NAN, INF, -INF]], [[1.0, 2.0, 3.0, -INF]]])
    got, g = check_correction(device, out, lses, 0, base)
    half = 0.5
    assert got[0, 0, 0].tolist() == [half, half]          # equal LSEs: half each
    assert (got[1, 0] == 0).all()                           # heads 1, 2: NaN / +inf -> 0
    assert (got[0, 0, 1] == 0).all() and (got[1, 0, 0] == 0).all()
    assert g[0, 1].item() == 2.0 and g[0, 2].item() == 3.0  # the other rank alone
    assert g[0, 3].item() == -INF                           # all empty: G = -inf, output 0


def test_world_one_merge_is_identity(device):
    out = torch.randn(2, 4, 8, device=device)
    lse = torch.randn(2, 4, device=device)
    assert dsa_ext.merge_attention_outputs(out, lse, rank=0, world_size=1) is out
    o, l_ = dsa_ext.merge_attention_outputs(out, lse, rank=0, world_size=1, return_lse=True)
    assert o is out and l_ is lse


# ---------------------------------------------------------------------------------------
# Random corrections
# ---------------------------------------------------------------------------------------


@st.composite
def correction_cases(draw):
    W = draw(st.integers(1, 8))
    B = draw(st.integers(0, 5))
    H = W * draw(st.integers(1, 4))
    D = draw(st.sampled_from([1, 3, 8, 64, 72]))
    dtype = draw(st.sampled_from([F32, BF16]))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    lses = torch.randn(W, B, H, generator=g) * 10
    special = torch.tensor([NAN, INF, -INF])
    mask = torch.rand(lses.shape, generator=g) < 0.25
    lses[mask] = special[torch.randint(0, 3, (int(mask.sum()),), generator=g)]
    full = torch.randn(B, H + 1, 2 * D, generator=g)
    full[torch.rand(full.shape, generator=g) < 0.05] = NAN
    layout = draw(st.sampled_from(["dense", "strided_d", "heads_view"]))
    out = {"dense": full[:, :H, :D].contiguous(), "strided_d": full[:, :H, ::2],
           "heads_view": full[:, 1:, :D]}[layout].to(dtype)
    if draw(st.booleans()):
        lses = lses.transpose(1, 2).contiguous().transpose(1, 2)  # strided lses
    return out, lses, draw(st.integers(0, W - 1)), draw(st.sampled_from(BASES))


@given(correction_cases())
def test_random_corrections_cpu(case):
    check_correction(torch.device("cpu"), *case)


@pytest.mark.cuda
@given(correction_cases())
def test_random_corrections_cuda(case):
    check_correction(torch.device("cuda"), *case)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("base", BASES)
def test_cuda_equals_cpu(dtype, base):
    """The CPU and CUDA paths differ only by the exp/log last-ulp rounding."""
    g = torch.Generator().manual_seed(7)
    W, B, H, D = 4, 64, 128, 512
    lses = torch.randn(W, B, H, generator=g) * 5
    lses[0, :3] = -INF
    lses[:, 5] = -INF
    out = torch.randn(B, H, D, generator=g).to(dtype)
    out[5] = NAN
    cpu, cpu_g = dsa_ext.correct_attention_output(out, lses, 2, lse_base=base,
                                                  global_lse=torch.empty(B, H))
    gpu, gpu_g = dsa_ext.correct_attention_output(out.cuda(), lses.cuda(), 2, lse_base=base,
                                                  global_lse=torch.empty(B, H, device="cuda"))
    assert torch.equal(gpu.cpu() == 0, cpu == 0)
    assert not torch.isnan(gpu).any()
    torch.testing.assert_close(gpu.cpu().float(), cpu.float(), **TOL[dtype])
    torch.testing.assert_close(gpu_g.cpu(), cpu_g, rtol=1e-6, atol=1e-6)


def test_large_batch_stride_64bit_offsets(device):
    """Element offsets past 2^31 in the partial outputs (4 GiB of bf16 address space)."""
    n = 2**31 + 4096
    try:
        storage = torch.empty(n, dtype=BF16, device=device)
    except (RuntimeError, MemoryError):
        if torch.device(device).type != "cpu":
            raise  # a GPU that cannot hold 4 GiB fails the test, it does not skip it
        pytest.skip("cannot reserve 4 GiB of address space")
    out = storage.as_strided((2, 4, 16), (2**31 + 1000, 16, 1))
    out.copy_(torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0)))
    lses = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(1)).to(device)
    got, _ = dsa_ext.correct_attention_output(out, lses, 1)
    want, _ = reference.correct_attention_output(out.cpu(), lses.cpu(), 1)
    del storage, out
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[BF16])


# ---------------------------------------------------------------------------------------
# merge_attention_outputs through a fake in-process exchange of W ranks
# ---------------------------------------------------------------------------------------


def fake_reduce_scatter(all_corrected: list, rank: int):
    """reduce_scatter hook for `rank`: sums block `rank` of every rank's corrected output
    (the other ranks' are precomputed; this rank's comes in through the hook)."""
    def hook(output, input):
        W = len(all_corrected)
        blocks = [input if w == rank else all_corrected[w] for w in range(W)]
        total = sum(b.view(W, *output.shape)[rank].double() for b in blocks)
        output.copy_(total.to(output.dtype))
    return hook


@pytest.mark.parametrize("base", BASES)
def test_merge_attention_torch_compile_fullgraph(device, base):
    # The composite traces whole (its correction is the registered op) and computes what
    # the eager call does, bit for bit.
    W, B, H, D = 4, 3, 8, 16
    g = torch.Generator().manual_seed(7)
    lses = [(torch.randn(B, H, generator=g) * 2).to(device) for _ in range(W)]
    lses[2][0] = float("-inf")
    out = torch.randn(B, H, D, generator=g).to(device)
    gathered = torch.cat(lses)

    def ag(o, i):
        o.copy_(gathered)

    def rs(o, i):  # rank 1's block only: the other ranks contribute zeros
        o.copy_(i.view(W, *o.shape)[1])

    def step(out, lse):
        return dsa_ext.merge_attention_outputs(out, lse, rank=1, world_size=W, lse_base=base,
                                               return_lse=True, all_gather=ag,
                                               reduce_scatter=rs)

    want = step(out, lses[1])
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(out, lses[1])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def merge_attention_on(device, base, dtype, world, interleave, B=5, L=70, picks=24, seed=3):
    """Every rank's merge through fake exchanges against the unsharded attention (and the
    reference merge against it too)."""
    H = 4 * world
    g = torch.Generator().manual_seed(world * 10 + interleave + seed)
    selected = torch.randint(-1, L, (B, picks), generator=g)
    selected[0] = -1                       # a row without any token: output 0, LSE -inf
    if B > 1:
        selected[1, 3:] = -1               # few tokens: some ranks' shards are empty
    q, keys, values = make_attention_inputs(seed, B, L, heads=H)
    parts = [sparse_attention(q, keys, values, shard_selection(selected, r, world, interleave),
                              base) for r in range(world)]
    full_out, full_lse = sparse_attention(q, keys, values, selected, base)
    outs = [p[0].to(dtype).to(device) for p in parts]
    lses = [p[1].to(device) for p in parts]
    stacked = torch.stack(lses)
    corrected = [dsa_ext.correct_attention_output(outs[r], stacked, r, lse_base=base)[0]
                 .view(world * B, H // world, -1) for r in range(world)]
    Hl = H // world
    tol = TOL[F32] if dtype == F32 else dict(rtol=2e-2, atol=2e-2)
    for r in range(world):
        merged, lse = dsa_ext.merge_attention_outputs(
            outs[r], lses[r], rank=r, world_size=world, lse_base=base, return_lse=True,
            all_gather=fake_all_gather(lses, r),
            reduce_scatter=fake_reduce_scatter(corrected, r))
        assert merged.shape == (B, Hl, full_out.shape[2]) and merged.dtype == dtype
        heads = slice(r * Hl, (r + 1) * Hl)
        want = torch.nan_to_num(full_out[:, heads], nan=0.0)
        torch.testing.assert_close(merged.cpu().float(), want, **tol)
        assert (merged[0] == 0).all()
        torch.testing.assert_close(lse.cpu(), full_lse[:, heads], rtol=1e-5, atol=1e-5)
    # the reference merge agrees as well
    ref_outs, ref_lses = reference.merge_attention_outputs(
        [o.cpu() for o in outs], [x.cpu() for x in lses], base)
    for r in range(world):
        torch.testing.assert_close(ref_outs[r].float(),
                                   torch.nan_to_num(full_out[:, r * Hl:(r + 1) * Hl]), **tol)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("world, interleave", [(4, 1), (4, 16), (2, 2)])
def test_merge_attention_fake_exchange_equals_unsharded(device, base, dtype, world,
                                                        interleave):
    merge_attention_on(device, base, dtype, world, interleave)


merge_attention_cases = st.fixed_dictionaries(dict(
    base=st.sampled_from(BASES), dtype=st.sampled_from([F32, BF16]), world=st.integers(2, 8),
    interleave=st.sampled_from([1, 2, 16]), B=st.integers(1, 6), L=st.integers(1, 200),
    picks=st.integers(1, 40), seed=st.integers(0, 2**31 - 1)))


@given(merge_attention_cases)
def test_merge_attention_random_cases_cpu(c):
    merge_attention_on(torch.device("cpu"), **c)


@pytest.mark.cuda
@given(merge_attention_cases)
def test_merge_attention_random_cases_cuda(c):
    merge_attention_on(torch.device("cuda"), **c)


# ---------------------------------------------------------------------------------------
# normalize_lse
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 4), (6, 4, 1), (6, 1, 4), (2, 3, 4), (3, 2, 4)])
@pytest.mark.parametrize("base", BASES)
def test_normalize_lse_shapes(shape, base):
    lse = torch.randn(shape)
    got = dsa_ext.normalize_lse(lse, 6, 4, base=base)
    assert got.shape == (6, 4)
    want = lse.reshape(6, 4) * (math.log(2.0) if base == 2.0 else 1.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_normalize_lse_base_e_is_a_view():
    lse = torch.randn(6, 4, 1)
    assert dsa_ext.normalize_lse(lse, 6, 4, base=math.e).data_ptr() == lse.data_ptr()


@pytest.mark.parametrize("lse, T, H, error, text", [
    (torch.zeros(4, 6), 6, 4, ValueError, "got (4, 6)"),
    (torch.zeros(6, 4, 2), 6, 4, ValueError, "got (6, 4, 2)"),
    (torch.zeros(24), 6, 4, ValueError, "got (24,)"),
    (torch.zeros(1, 6, 4, 1), 6, 4, ValueError, "got (1, 6, 4, 1)"),
    (torch.zeros(6, 4, dtype=torch.int32), 6, 4, TypeError, "lse must be a floating tensor"),
    (torch.zeros(6, 4), 6, 0, ValueError, "num_heads must be >= 1"),
    ([0.0], 1, 1, TypeError, "lse must be a torch.Tensor"),
])
def test_normalize_lse_errors(lse, T, H, error, text):
    with pytest.raises(error) as info:
        dsa_ext.normalize_lse(lse, T, H)
    assert text in str(info.value)


def test_normalize_lse_bad_base():
    with pytest.raises(ValueError, match="base must be 2.0 or math.e, got 10"):
        dsa_ext.normalize_lse(torch.zeros(2, 2), 2, 2, base=10)


# ---------------------------------------------------------------------------------------
# Errors of the correction / merge
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, error, text", [
    (dict(out=torch.zeros(2, 4, 8, dtype=torch.float16)), TypeError,
     "out must be float32 or bfloat16, got torch.float16"),
    (dict(lses=torch.zeros(2, 2, 4, dtype=torch.float64)), TypeError, "lses must be float32"),
    (dict(lses=torch.zeros(2, 3, 4)), ValueError, "lses must have shape (2, 2, 4)"),
    (dict(lses=torch.zeros(3, 2, 4)), ValueError, "heads (4) must be a multiple"),
    (dict(rank=2), ValueError, "rank must be <= 1"),
    (dict(lse_base=10.0), ValueError, "lse_base must be 2.0 or math.e"),
    (dict(corrected=torch.zeros(2, 2, 2, 9)), ValueError, "corrected must have shape"),
    (dict(global_lse=torch.zeros(2, 5)), ValueError, "global_lse must have shape (2, 4)"),
    (dict(corrected=torch.zeros(2, 2, 2, 1).expand(2, 2, 2, 8)), ValueError,
     "corrected must not have a zero stride along a dimension of more than one element"),
    (dict(global_lse=torch.zeros(2, 1).expand(2, 4)), ValueError,
     "global_lse must not have a zero stride along a dimension of more than one element"),
])
def test_correction_bad_input_names_the_argument(change, error, text):
    kw = dict(out=torch.zeros(2, 4, 8), lses=torch.zeros(2, 2, 4), rank=1)
    kw.update(change)
    with pytest.raises(error) as info:
        dsa_ext.correct_attention_output(kw.pop("out"), kw.pop("lses"), kw.pop("rank"), **kw)
    assert text in str(info.value)


@pytest.mark.parametrize("change, error, text", [
    (dict(lse=torch.zeros(2, 5)), ValueError, "lse must have shape (2, 4)"),
    (dict(world_size=3), ValueError, "heads (4) must be a multiple of world_size (3)"),
    (dict(rank=2), ValueError, "rank must be < world_size (2)"),
    (dict(all_gather=lambda o, i: None), ValueError, "both all_gather and reduce_scatter"),
    (dict(), ValueError, "not initialized; pass group= or all_gather= and reduce_scatter="),
])
def test_merge_attention_bad_input_names_the_argument(change, error, text):
    kw = dict(out=torch.zeros(2, 4, 8), lse=torch.zeros(2, 4), rank=0, world_size=2)
    kw.update(change)
    with pytest.raises(error) as info:
        dsa_ext.merge_attention_outputs(kw.pop("out"), kw.pop("lse"), **kw)
    assert text in str(info.value)


# ---------------------------------------------------------------------------------------
# CUDA graphs, host syncs, NCCL
# ---------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_correction_graph_replay_and_no_sync():
    W, B, H, D = 4, 64, 128, 512
    out = torch.empty(B, H, D, dtype=BF16, device="cuda")
    lses = torch.empty(W, B, H, device="cuda")
    corrected = torch.empty(W, B, H // W, D, dtype=BF16, device="cuda")
    g_lse = torch.empty(B, H, device="cuda")
    graph = _capture(lambda: dsa_ext.correct_attention_output(
        out, lses, 1, corrected=corrected, global_lse=g_lse))
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        out.copy_(torch.randn(B, H, D, generator=gen))
        new_lses = torch.randn(W, B, H, generator=gen) * 3
        new_lses[1, seed] = -INF
        lses.copy_(new_lses)
        graph.replay()
        want, want_g = reference.correct_attention_output(out.cpu(), lses.cpu(), 1)
        torch.testing.assert_close(corrected.cpu().float(), want.float(), **TOL[BF16])
        torch.testing.assert_close(g_lse.cpu(), want_g, rtol=1e-6, atol=1e-6)
        assert (corrected[:, seed] == 0).all()


@pytest.mark.cuda
def test_merge_attention_hooks_graph_capture():
    """The whole merge (gather hook, correction, reduce-scatter hook) is capturable."""
    W, B, H, D = 4, 8, 16, 64
    gen = torch.Generator().manual_seed(1)
    lses = [(torch.randn(B, H, generator=gen) * 2).cuda() for _ in range(W)]
    out = torch.randn(B, H, D, generator=gen).cuda()
    gathered = torch.cat(lses)
    results = {}

    def ag(o, i):
        o.copy_(gathered)

    def rs(o, i):  # rank 0 alone: the other ranks contribute zeros
        o.copy_(i.view(W, *o.shape)[0])

    def step():
        results["out"] = dsa_ext.merge_attention_outputs(
            out, lses[0], rank=0, world_size=W, all_gather=ag, reduce_scatter=rs)

    graph = _capture(step)
    graph.replay()
    want, _ = reference.correct_attention_output(out.cpu(), gathered.view(W, B, H).cpu(), 0)
    torch.testing.assert_close(results["out"].cpu(), want[0], **TOL[F32])


@pytest.mark.cuda
def test_nccl_world_one_collectives_and_capture(tmp_path):
    """Single-process NCCL group: the public ops are no-ops at W = 1, and the collective
    pipelines (all-gather, pack, select / correction, reduce-scatter) run and capture."""
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        logits = torch.randn(16, 300, device="cuda")
        local = reference.indexer_topk(logits.cpu(), 64).cuda()
        topk = local.clone()
        assert dsa_ext.merge_topk_global(logits, topk, 32, rank=0, world_size=1) is topk
        assert torch.equal(topk, local)
        dcp._merge_topk(logits, topk, 32, 0, 1, 1, None, None, None)  # through NCCL
        assert torch.equal(topk[:, :32], local[:, :32]) and (topk[:, 32:] == -1).all()

        out = torch.randn(4, 8, 32, device="cuda")
        lse = torch.randn(4, 8, device="cuda")
        merged = dcp._merge_attention(out, lse, 0, 1, None, 2.0, False, None, None)
        torch.testing.assert_close(merged, out, rtol=1e-6, atol=0)  # one rank: factor 1
        buf = {}
        graph = _capture(lambda: buf.__setitem__(
            "m", dcp._merge_attention(out, lse, 0, 1, None, 2.0, False, None, None)))
        out.mul_(2)
        graph.replay()
        torch.testing.assert_close(buf["m"], out, rtol=1e-6, atol=0)
    finally:
        dist.destroy_process_group()
