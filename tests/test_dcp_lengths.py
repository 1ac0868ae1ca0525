"""DCP local lengths and their use after per-token expansion (docs/ops.md sections 1
and 4)."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsa_ext import reference, seq_lens
from dsa_ext.seq_lens import decode_context_lens
from conftest import assert_equal, capture_graph

I32, I64 = torch.int32, torch.int64


def naive_local_length(L: int, rank: int, world: int, interleave: int) -> int:
    return sum(1 for p in range(L) if (p // interleave) % world == rank)


# ---------------------------------------------------------------------------------------
# Fixed vectors
# ---------------------------------------------------------------------------------------


def test_spec_vector_localize_after_expansion(device):
    bounds = torch.tensor([8, 9, 10], dtype=I32, device=device)
    assert seq_lens.local_seq_lens(bounds, 1, 2, 1).tolist() == [4, 4, 5]
    # The wrong order (localize the request length, then subtract offsets) differs.
    wrong = seq_lens.local_seq_lens(torch.tensor([10], dtype=I32), 1, 2, 1) - torch.tensor([2, 1, 0])
    assert wrong.tolist() == [3, 4, 5]
    # The decode expansion localizes per token: S=10, next_n=3, W=2, rank 1.
    glob, local, _ = decode_context_lens(torch.tensor([10], dtype=I32, device=device), 3,
                                         next_n=3, dcp_world_size=2, dcp_rank=1)
    assert glob.tolist() == [8, 9, 10] and local.tolist() == [4, 4, 5]


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("interleave", [1, 2, 4])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_every_length_every_rank_equals_naive_count(device, world, interleave, dtype):
    L = torch.arange(33, dtype=dtype, device=device)
    every = seq_lens.local_seq_lens(L, None, world, interleave)
    assert every.shape == (33, world) and every.dtype == dtype
    for rank in range(world):
        want = torch.tensor([naive_local_length(n, rank, world, interleave) for n in range(33)],
                            dtype=dtype)
        assert_equal(seq_lens.local_seq_lens(L, rank, world, interleave), want, rank=rank)
        assert_equal(every[:, rank], want, rank=rank)
    assert_equal(every.sum(dim=1, dtype=dtype), L)  # every position has exactly one owner


@pytest.mark.parametrize("interleave", [1, 2, 4, 16])
def test_world_one_is_identity(device, interleave):
    L = torch.randint(0, 1 << 20, (100,), dtype=I64, device=device)
    assert_equal(seq_lens.local_seq_lens(L, 0, 1, interleave), L)


def test_shapes_strides_and_out(device):
    base = torch.arange(24, dtype=I32, device=device).view(4, 6)
    lens = base[:, ::2]  # non-contiguous 2-D input
    got = seq_lens.local_seq_lens(lens, None, 4, 2)
    assert got.shape == (4, 3, 4)
    assert_equal(got, reference.local_seq_lens(lens.cpu(), None, 4, 2))
    out = torch.full((4, 3), -7, dtype=I32, device=device)
    res = seq_lens.local_seq_lens(lens, 3, 4, 2, out=out)
    assert res is out
    assert_equal(out, reference.local_seq_lens(lens.cpu(), 3, 4, 2))
    strided_out = torch.full((20,), -7, dtype=I64, device=device)
    one_d = torch.arange(10, dtype=I64, device=device)
    seq_lens.local_seq_lens(one_d, 1, 2, out=strided_out[::2])
    assert_equal(strided_out[::2], reference.local_seq_lens(one_d.cpu(), 1, 2, 1))
    assert (strided_out[1::2] == -7).all()
    assert seq_lens.local_seq_lens(torch.empty(0, dtype=I32, device=device), None, 3).shape == (0, 3)


def random_lengths(n: int, big: bool, seed: int) -> torch.Tensor:
    """n lengths, negative ones included (lengths are data: they must give a defined 0),
    int64 up to 2^40 (`big`) or int32."""
    g = torch.Generator().manual_seed(seed)
    high = (1 << 40) if big else (1 << 30)
    return torch.randint(-(1 << 20), high, (n,), generator=g, dtype=I64).to(I64 if big else I32)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_lengths_that_do_not_flatten_as_a_view(device, dtype):
    """A 2-D input whose strides do not flatten (a column slice, a transpose): the op reads
    a flattened copy, which must stay alive until the kernel or loop has read it."""
    base = torch.arange(40000, dtype=dtype, device=device).view(10000, 4) * 7
    for lens in (base[:, :2], base.t()[:3]):
        for rank in (None, 1):
            want = reference.local_seq_lens(lens.cpu(), rank, 4, 2)
            for _ in range(3):  # the freed copy's memory gets reused by the next calls
                assert_equal(seq_lens.local_seq_lens(lens, rank, 4, 2), want, rank=rank)


@given(world=st.integers(1, 8), interleave=st.sampled_from([1, 2, 4, 16]),
       data=st.data(), n=st.integers(0, 300), big=st.booleans())
def test_random_lengths_vs_reference(world, interleave, data, n, big):
    rank = data.draw(st.one_of(st.none(), st.integers(0, world - 1)))
    L = random_lengths(n, big, seed=n)
    assert_equal(seq_lens.local_seq_lens(L, rank, world, interleave),
                 reference.local_seq_lens(L, rank, world, interleave))


@pytest.mark.cuda
@given(world=st.integers(1, 8), interleave=st.sampled_from([1, 2, 4, 16]), data=st.data(),
       n=st.integers(0, 3000), big=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_lengths_cuda_vs_reference(world, interleave, data, n, big, seed):
    rank = data.draw(st.one_of(st.none(), st.integers(0, world - 1)))
    L = random_lengths(n, big, seed)
    assert_equal(seq_lens.local_seq_lens(L.cuda(), rank, world, interleave),
                 reference.local_seq_lens(L, rank, world, interleave))


def test_negative_lengths_own_nothing(device):
    L = torch.tensor([-5, -1, 0, 3], dtype=I32, device=device)
    assert seq_lens.local_seq_lens(L, 1, 2).tolist() == [0, 0, 0, 1]
    assert reference.dcp_local_length(-5, 1, 2, 1) == 0


def test_zero_dim_length_all_ranks_into_strided_out(device):
    buf = torch.full((8,), -7, dtype=I32, device=device)
    L = torch.tensor(5, dtype=I32, device=device)
    res = seq_lens.local_seq_lens(L, None, 4, 1, out=buf[::2])
    assert res.tolist() == [2, 1, 1, 1]
    assert buf[1::2].eq(-7).all()  # the skipped elements stay untouched


# ---------------------------------------------------------------------------------------
# Errors, torch.compile
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kw, error, text", [
    ((torch.zeros(3), 0, 2), {}, TypeError, "seq_lens must be int32 or int64, got torch.float32"),
    (([1, 2], 0, 2), {}, TypeError, "seq_lens must be a torch.Tensor"),
    ((torch.zeros(3, dtype=I32), 2, 2), {}, ValueError, "rank must be < world_size (2), got 2"),
    ((torch.zeros(3, dtype=I32), -1, 2), {}, ValueError, "rank must be >= 0"),
    ((torch.zeros(3, dtype=I32), 0, 0), {}, ValueError, "world_size must be >= 1"),
    ((torch.zeros(3, dtype=I32), 0, 2, 0), {}, ValueError, "interleave must be >= 1"),
    ((torch.zeros(3, dtype=I32), None, 2), dict(out=torch.zeros(3, dtype=I32)), ValueError,
     "out must have shape (3, 2)"),
    ((torch.zeros(3, dtype=I32), 0, 2), dict(out=torch.zeros(3, dtype=I64)), TypeError,
     "out must be int32"),
    ((torch.zeros(3, dtype=I32), None, 2), dict(out=torch.zeros(1, 2, dtype=I32).expand(3, 2)),
     ValueError, "out must not have a zero stride along a dimension of more than one element"),
])
def test_bad_input_names_the_argument(args, kw, error, text):
    with pytest.raises(error) as info:
        seq_lens.local_seq_lens(*args, **kw)
    assert text in str(info.value)


def test_torch_compile_fullgraph(device):
    def step(lens, out):
        seq_lens.local_seq_lens(lens, None, 4, 2, out=out)
        return out * 1

    lens = torch.arange(40, dtype=I32, device=device)
    out = torch.empty(40, 4, dtype=I32, device=device)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(lens, out)
    assert_equal(got, reference.local_seq_lens(lens.cpu(), None, 4, 2))


@pytest.mark.cuda
def test_cuda_graph_replay_with_new_inputs_and_no_sync():
    lens = torch.zeros(1000, dtype=I64, device="cuda")
    every = torch.empty(1000, 4, dtype=I64, device="cuda")
    mine = torch.empty(1000, dtype=I64, device="cuda")

    def step():
        seq_lens.local_seq_lens(lens, None, 4, 16, out=every)
        seq_lens.local_seq_lens(lens, 3, 4, 16, out=mine)

    graph = capture_graph(step)
    for seed in range(2):
        L = random_lengths(1000, True, seed=400 + seed)
        lens.copy_(L)
        graph.replay()
        assert_equal(every, reference.local_seq_lens(L, None, 4, 16), seed=seed)
        assert_equal(mine, reference.local_seq_lens(L, 3, 4, 16), seed=seed)


def test_host_local_length_is_the_rule():
    # The planner's and builder's host-side helper against the reference, exhaustively.
    from dsa_ext.indexer import _local_length
    for world in (1, 2, 3, 4):
        for interleave in (1, 2, 4):
            for rank in range(world):
                for L in range(-3, 41):
                    assert _local_length(L, rank, world, interleave) == \
                        reference.dcp_local_length(L, rank, world, interleave), \
                        (L, rank, world, interleave)
