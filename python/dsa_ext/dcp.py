"""Decode context parallelism (DCP): the cross-rank merges (candidate packing and the
exact global top-K, the attention output merge). Rank-local lengths are in
:mod:`dsa_ext.seq_lens`.

A request's KV cache is split over W ranks: position p lives on rank (p // I) % W
(docs/ops.md section 1).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from . import _checks, _native
from .indexer_topk import check_topk_inputs
from .topk import check_selection

Tensor = torch.Tensor
#: all_gather hook: (output [W * rows, ...], input [rows, ...]) -> None, rank-major.
AllGather = Callable[[Tensor, Tensor], None]
#: reduce_scatter hook: (output [rows, ...], input [W * rows, ...]) -> None, summing.
ReduceScatter = Callable[[Tensor, Tensor], None]

# ---------------------------------------------------------------------------------------
# docs/ops.md section 6: exact global top-K across DCP ranks
# (candidate packing, all-gather, stable top-K of the gathered candidates)
# ---------------------------------------------------------------------------------------


def pack_dcp_topk_candidates(
    logits: Tensor,
    topk_indices: Tensor,
    rank: int,
    world_size: int,
    interleave: int = 1,
    row_starts: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Pack a rank's local top-K into lossless 64-bit candidate keys (docs/ops.md
    section 6a).

    For row ``i`` and column ``c`` with ``q = topk_indices[i, c]`` (a rank-local id)::

        col   = clamp(q + row_starts[i], 0, cols - 1)
        score = logits[i, col]                                  (raw fp32 bits)
        gid   = (q // I) * (W*I) + rank*I + q % I               (global position)
        key   = (ordered(score) << 32) | (~gid & 0xFFFFFFFF)    if q >= 0, else 0

    with ``ordered(u) = ~u`` if the sign bit of ``u`` is set, else ``u | 0x80000000``.
    The key is an unsigned 64-bit pattern stored in int64: sorted descending as unsigned
    it orders candidates by score descending (+NaN > +inf > ... > +0 > -0 > ... > -inf),
    then global id ascending, with invalid candidates (key 0) last. Both the score and
    the id are carried exactly (the reference server's fp32 id is exact only below 2^24).
    The format survives ``torch.cat(dim=1)`` and all-gathers, and
    ``stable_topk_from_candidates`` selects from it. A global id that would reach 2^31,
    and any id when ``logits`` has no column, is invalid (key 0); the clamp means no id
    reads out of bounds.

    Args:
        logits: fp32 ``[rows, cols]`` indexer scores of this rank's local positions;
            any strides.
        topk_indices: int32 ``[rows, K]`` local top-K ids, -1 = none; any strides.
        rank, world_size, interleave: the DCP layout (r, W, I).
        row_starts: optional int32 ``[rows]`` column of each row's local position 0.
        out: optional int64 ``[rows, K]`` output (any strides); with it nothing is
            allocated and the call is CUDA-graph capturable.

    Returns:
        ``out``: int64 ``[rows, K]`` candidate keys.

    Example::

        >>> logits = torch.tensor([[0.5, 2.0, -1.0]])
        >>> keys = dsa_ext.pack_dcp_topk_candidates(
        ...     logits, torch.tensor([[1, 0, -1]], dtype=torch.int32), rank=1, world_size=2)
        >>> dsa_ext.reference.decode_candidate_gids(keys)   # local 1 -> 3, local 0 -> 1
        tensor([[ 3,  1, -1]], dtype=torch.int32)
    """
    _checks.tensor("topk_indices", topk_indices, torch.int32, 2)
    _check_pack_inputs(logits, topk_indices, row_starts)
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"))
    rows, K = topk_indices.shape
    device = topk_indices.device
    out = _checks.output("out", out, torch.int64, (rows, K), device)
    _native.call("pack_dcp_topk_candidates", logits, topk_indices, rank, world_size,
                 interleave, row_starts, out)
    return out


def _check_pack_inputs(logits: Tensor, topk_indices: Tensor,
                       row_starts: Optional[Tensor]) -> None:
    """logits and row_starts against an already checked int32 [rows, K] topk_indices."""
    device = topk_indices.device
    _checks.tensor("logits", logits, torch.float32, 2, device)
    rows = topk_indices.shape[0]
    if logits.shape[0] != rows:
        raise ValueError(f"logits must have {rows} rows like topk_indices, "
                         f"got shape {tuple(logits.shape)}")
    if row_starts is not None:
        _checks.tensor("row_starts", row_starts, torch.int32, 1, device)
        _checks.shape("row_starts", row_starts, (rows,))


def _check_exchange(group, hook, hook_name: str, rank: int, world_size: int,
                    hooks_needed: Optional[str] = None) -> None:
    """`hooks_needed`: what to pass instead of a group, when more than `hook_name`."""
    if hook is not None:
        if group is not None:
            raise ValueError(f"pass either group or {hook_name}, not both")
        if not callable(hook):
            raise TypeError(f"{hook_name} must be callable, got {type(hook).__name__}")
        return
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"world_size is {world_size} but torch.distributed is not "
                         f"initialized; pass group= or {hooks_needed or hook_name + '='}")
    got = dist.get_world_size(group)
    if got != world_size:
        raise ValueError(f"world_size ({world_size}) must equal the group's size, got {got}")
    got = dist.get_rank(group)
    if got != rank:
        raise ValueError(f"rank ({rank}) must equal this process's rank in the group, "
                         f"got {got}")


#: backends seen without the fused collectives (then the list versions are used)
_UNFUSED: set = set()


def _unsupported(err: Exception, backend: tuple) -> None:
    """Remember a backend that lacks a fused collective; re-raise any other failure.

    Only a backend that says it does not implement the collective counts (gloo:
    "... does not support ..." at the call, before anything is sent); an error while a
    CUDA graph is being captured is re-raised, never taken for a missing collective.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise err
    if isinstance(err, NotImplementedError) or "does not support" in str(err):
        _UNFUSED.add(backend)
        return
    raise err


def _collective(op: str, fused_names, unfused, output: Tensor, input: Tensor, group,
                hook) -> None:
    """`hook(output, input)` if given; else the first fused torch.distributed collective of
    `fused_names` on `group`, and for good on a backend without it the list form
    `unfused(dist, world_size)`."""
    if hook is not None:
        hook(output, input)
        return
    import torch.distributed as dist
    backend = (op, str(dist.get_backend(group)))
    if backend not in _UNFUSED:
        fused = next(getattr(dist, name) for name in fused_names if hasattr(dist, name))
        try:
            fused(output, input, group=group)
            return
        except (RuntimeError, NotImplementedError) as err:
            _unsupported(err, backend)
    unfused(dist, dist.get_world_size(group))


def all_gather_into(output: Tensor, input: Tensor, group=None,
                    hook: Optional[AllGather] = None) -> None:
    """All-gather `input` [rows, ...] of every rank into `output` [W * rows, ...]
    (rank-major), through `hook` if given, else torch.distributed on `group`. No host
    sync; with NCCL capturable in a CUDA graph."""
    _collective("all_gather", ("all_gather_single", "all_gather_into_tensor"),
                lambda dist, w: dist.all_gather(list(output.chunk(w)), input, group=group),
                output, input, group, hook)


def reduce_scatter_into(output: Tensor, input: Tensor, group=None,
                        hook: Optional[ReduceScatter] = None) -> None:
    """Sum `input` [W * rows, ...] over ranks and keep this rank's block [rows, ...] in
    `output`, through `hook` if given, else torch.distributed on `group`."""
    _collective("reduce_scatter", ("reduce_scatter_single", "reduce_scatter_tensor"),
                lambda dist, w: _reduce_scatter_by_all_reduce(dist, w, output, input, group),
                output, input, group, hook)


def _reduce_scatter_by_all_reduce(dist, world_size: int, output: Tensor, input: Tensor,
                                  group) -> None:
    """reduce_scatter on a backend without one (gloo has neither form before torch 2.5):
    all-reduce a copy of `input`, keep this rank's block."""
    total = input.clone()
    dist.all_reduce(total, group=group)
    output.copy_(total.chunk(world_size)[dist.get_rank(group)])


def merge_topk_global(
    logits: Tensor,
    topk_indices: Tensor,
    k: int,
    *,
    rank: int,
    world_size: int,
    interleave: int = 1,
    group=None,
    all_gather: Optional[AllGather] = None,
    row_starts: Optional[Tensor] = None,
    sorted: bool = False,
) -> Tensor:
    """Exact global top-k across DCP ranks, written into ``topk_indices`` in place
    (docs/ops.md section 6d).

    Every rank packs its local top-K into candidate keys
    (:func:`pack_dcp_topk_candidates`), the W * K candidates per row are all-gathered
    (rank-major ``[W, rows, K]``), and ``stable_topk_from_candidates`` keeps the k best
    by score descending, then global id ascending. Afterwards, on every rank,
    ``topk_indices[:, :k]`` holds the same global token ids (-1 where the whole row has
    fewer than k valid tokens) and ``topk_indices[:, k:]`` is -1. Their order is that of
    ``stable_topk_from_candidates``: by default the order in which they appear in the
    gathered row (rank 0's local top-K columns first, then rank 1's, ...), with
    ``sorted=True`` score descending, then global id ascending.

    The set equals the unsharded top-k (and with ``sorted=True`` so does the order)
    when each rank's local top-K breaks ties like the global one, lower position first
    (local order follows global order on a rank, so a stable local top-K does it). With
    another local tie rule the merged set is still a valid top-k but may differ among
    equal scores.

    ``world_size == 1`` is a no-op (``topk_indices`` is returned untouched).

    Args:
        logits: fp32 ``[rows, cols]`` this rank's indexer logits (local positions).
        topk_indices: int32 ``[rows, K]``, ``K >= k``, this rank's local top-K ids
            (-1 = none); overwritten with global ids. Any strides.
        k: number of global ids to keep, ``1 <= k <= K``.
        rank, world_size, interleave: the DCP layout (r, W, I).
        group: a ``torch.distributed`` process group (NCCL on GPU, gloo on CPU); None is
            the default group.
        all_gather: instead of ``group``, a callable ``(output [W*rows, K] int64,
            input [rows, K] int64) -> None`` with ``all_gather_into_tensor`` semantics,
            for a server's own communicator.
        row_starts: optional int32 ``[rows]`` column of each row's local position 0.
        sorted: write the ids in descending score order instead of gathered order.

    Returns:
        ``topk_indices``. No host sync; with NCCL (or a capturable hook) the whole step
        can be captured in a CUDA graph.

    Example::

        >>> # on rank r of W, after the local indexer top-K (local ids)
        >>> dsa_ext.merge_topk_global(logits, local_topk, 2048, rank=r, world_size=W,
        ...                           group=dcp_group)   # local_topk now holds global ids
    """
    _checks.tensor("topk_indices", topk_indices, torch.int32, 2)
    K = topk_indices.shape[1]
    _checks.integer("k", k, 1)
    if k > K:
        raise ValueError(f"k must be <= topk_indices.shape[1] ({K}), got {k}")
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"))
    _checks.boolean("sorted", sorted)
    if world_size == 1:
        return topk_indices
    _checks.writable("topk_indices", topk_indices)
    # Everything the packing and the top-K need is checked here, before the collective:
    # no rank may fail (and stall the others) after it.
    _check_pack_inputs(logits, topk_indices, row_starts)
    rows = topk_indices.shape[0]
    check_selection(topk_indices.device, (world_size, rows, K), world_size * K, k, sorted)
    _check_exchange(group, all_gather, "all_gather", rank, world_size)
    return _merge_topk(logits, topk_indices, k, rank, world_size, interleave, group,
                       all_gather, row_starts, sorted)


def merge_topk_global_from_logits(
    logits: Tensor,
    k: int,
    *,
    rank: int,
    world_size: int,
    interleave: int = 1,
    group=None,
    all_gather: Optional[AllGather] = None,
    lengths: Optional[Tensor] = None,
    seq_lens: Optional[Tensor] = None,
    next_n: int = 1,
    row_starts: Optional[Tensor] = None,
    row_ends: Optional[Tensor] = None,
    sorted: bool = False,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Exact global top-k across DCP ranks, starting from this rank's logits
    (docs/ops.md sections 6 and 9): the local top-k is selected and packed into
    candidate keys in one kernel (``topk_to_candidates``), the ``W * k`` candidates per
    row are all-gathered and ``stable_topk_from_candidates`` keeps the k best. Every rank
    gets the same global ids in the same order (by default rank 0's local top-k first,
    each in ascending local position, then rank 1's, ...; ``sorted=True``: score
    descending, then global id ascending), -1 where the whole row has fewer than k
    tokens. The set (and with ``sorted=True`` the order) equals the unsharded
    ``topk_per_row`` of the whole rows when each rank's window holds its local positions
    of the row (for example ``lengths`` = the rank-local lengths of section 1).

    Args:
        logits: fp32 ``[rows, L]`` this rank's indexer logits (local positions).
        k: number of global ids, ``k >= 1`` (also each rank's local top-k).
        rank, world_size, interleave: the DCP layout (r, W, I).
        group, all_gather: the exchange, as :func:`merge_topk_global`.
        lengths, seq_lens, next_n, row_starts, row_ends: this rank's row windows, as
            ``topk_per_row`` (ids relative to the window start are the local positions).
        sorted: descending score order instead of gathered order.
        out: optional int32 ``[rows, k]`` output.

    Returns:
        int32 ``[rows, k]`` global ids (``out`` when given). No host sync.
    """
    rows = check_topk_inputs(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                             sorted)
    if logits.dtype is not torch.float32:
        raise TypeError(f"logits must be float32 (the candidate keys hold fp32 scores), "
                        f"got {logits.dtype}")
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"))
    device = logits.device
    if world_size > 1:  # the limits of the select over the gathered [W, rows, k]
        check_selection(device, (world_size, rows, k), world_size * k, k, sorted)
    out = _checks.output("out", out, torch.int32, (rows, k), device)
    if world_size == 1:  # the local top-K is the global one
        _native.call("topk_per_row", logits, k, lengths, seq_lens, next_n, row_starts,
                     row_ends, sorted, out)
        return out
    _check_exchange(group, all_gather, "all_gather", rank, world_size)
    packed = torch.empty((rows, k), dtype=torch.int64, device=device)
    _native.call("topk_to_candidates", logits, k, lengths, seq_lens, next_n, row_starts,
                 row_ends, rank, world_size, interleave, packed)
    _gather_and_select(packed, out, world_size, group, all_gather, sorted)
    return out


def _gather_and_select(packed: Tensor, out: Tensor, world_size: int, group, all_gather,
                       sorted: bool) -> None:
    """All-gathers every rank's packed candidates ``[rows, K]`` (rank-major) and writes the
    stable top-``out.shape[1]`` of each row into ``out``."""
    rows, K = packed.shape
    gathered = torch.empty((world_size, rows, K), dtype=torch.int64, device=packed.device)
    all_gather_into(gathered.view(world_size * rows, K), packed, group, all_gather)
    _native.call("stable_topk_from_candidates", gathered, out, sorted)


def _merge_topk(logits, topk_indices, k, rank, world_size, interleave, group, all_gather,
                row_starts, sorted=False) -> Tensor:
    """merge_topk_global after validation, for any world size (W = 1 included)."""
    rows, K = topk_indices.shape
    packed = torch.empty((rows, K), dtype=torch.int64, device=topk_indices.device)
    _native.call("pack_dcp_topk_candidates", logits, topk_indices, rank, world_size,
                 interleave, row_starts, packed)
    _gather_and_select(packed, topk_indices[:, :k], world_size, group, all_gather, sorted)
    if k < K:
        topk_indices[:, k:].fill_(-1)
    return topk_indices


# ---------------------------------------------------------------------------------------
# docs/ops.md section 7: attention output merge across DCP ranks (LSE)
# ---------------------------------------------------------------------------------------

_LN2 = math.log(2.0)


def _lse_base(name: str, base) -> bool:
    """True for base 2, False for base e; anything else raises."""
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"{name} must be 2.0 or math.e, got {type(base).__name__}")
    if base == 2:
        return True
    if base == math.e:
        return False
    raise ValueError(f"{name} must be 2.0 or math.e, got {base}")


def normalize_lse(lse: Tensor, num_tokens: int, num_heads: int, *,
                  base: float = 2.0) -> Tensor:
    """An attention kernel's LSE as ``(T, H)`` in base e (docs/ops.md section 7).

    Accepts ``(T, H)``, ``(T, H, 1)``, ``(T, 1, H)`` or any 3-D ``(a, b, H)`` with
    ``a * b == T``; a base-2 LSE (log2-sum-exp2) is multiplied by ln 2. Returns a view
    when no conversion is needed.

    Args:
        lse: floating LSE tensor in one of the shapes above.
        num_tokens, num_heads: T and H.
        base: 2.0 or ``math.e``, the base ``lse`` is in.

    Raises:
        ValueError naming the shape it got for any other shape; TypeError for a
        non-floating tensor.

    Example::

        >>> dsa_ext.normalize_lse(torch.zeros(4, 8, 1), 4, 8).shape
        torch.Size([4, 8])
    """
    _checks.tensor("lse", lse)
    if not lse.is_floating_point():
        raise TypeError(f"lse must be a floating tensor, got {lse.dtype}")
    T = _checks.integer("num_tokens", num_tokens, 0, None)
    H = _checks.integer("num_heads", num_heads, 1, None)
    base2 = _lse_base("base", base)
    shape = tuple(lse.shape)
    if shape == (T, H):
        out = lse
    elif len(shape) == 3 and shape in ((T, H, 1), (T, 1, H)):
        out = lse.reshape(T, H)
    elif len(shape) == 3 and shape[2] == H and shape[0] * shape[1] == T:
        out = lse.reshape(T, H)
    else:
        raise ValueError(
            f"lse must have shape (T, H), (T, H, 1), (T, 1, H) or (a, b, H) with a*b == T "
            f"for T={T}, H={H}; got {shape}")
    return out * _LN2 if base2 else out


def correct_attention_output(
    out: Tensor,
    lses: Tensor,
    rank: int,
    *,
    lse_base: float = 2.0,
    corrected: Optional[Tensor] = None,
    global_lse: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Weigh this rank's partial attention outputs by the all-gathered LSEs
    (docs/ops.md section 7).

    For every ``(b, h)``, with NaN and +inf LSEs taken as -inf::

        m = max_w lses[w, b, h]  (0 if that is -inf)
        G = m + log(sum_w exp(lses[w, b, h] - m))
        f = exp(lses[rank, b, h] - G)            (0 when the difference is NaN)
        corrected[h // (H/W), b, h % (H/W), :] = 0 if f == 0 else out[b, h, :] * f

    in base ``lse_base`` (exp2/log2 for 2.0), fp32 math. The output is head-block-major
    ``[W, B, H/W, D]``: block ``w`` holds the heads rank ``w`` keeps, so a reduce-scatter
    of ``corrected.view(W*B, H/W, D)`` sums the merged output of this rank's heads.
    A factor of exactly 0 forces 0, so a NaN partial from an empty shard cannot leak.

    Args:
        out: fp32 or bf16 ``[B, H, D]`` partial outputs over this rank's KV shard.
        lses: fp32 ``[W, B, H]`` every rank's LSE (rank-major), ``H % W == 0``.
        rank: this rank, ``0 <= rank < W``.
        lse_base: 2.0 or ``math.e``.
        corrected: optional ``[W, B, H/W, D]`` output of ``out``'s dtype.
        global_lse: optional fp32 ``[B, H]`` buffer for G (base ``lse_base``).

    Returns:
        ``(corrected, global_lse)``; ``global_lse`` is None unless given.

    Example::

        >>> c, g = dsa_ext.correct_attention_output(
        ...     torch.full((1, 2, 4), float("nan")),
        ...     torch.tensor([[[0., 0.]], [[float("-inf"), float("-inf")]]]),
        ...     1, global_lse=torch.empty(1, 2))          # c == 0, g == 0
    """
    _checks.tensor("out", out, ndim=3)
    if out.dtype not in _native.ATTENTION_DTYPES:
        raise TypeError(f"out must be float32 or bfloat16, got {out.dtype}")
    device = out.device
    _checks.tensor("lses", lses, torch.float32, 3, device)
    B, H, D = out.shape
    W = lses.shape[0]
    if W < 1:
        raise ValueError(f"lses must have at least one rank, got shape {tuple(lses.shape)}")
    _checks.shape("lses", lses, (W, B, H))
    if H % W != 0:
        raise ValueError(f"the number of heads ({H}) must be a multiple of the world size "
                         f"({W}) to scatter heads over ranks")
    _checks.integer("rank", rank, 0, W - 1)
    base2 = _lse_base("lse_base", lse_base)
    corrected = _checks.output("corrected", corrected, out.dtype, (W, B, H // W, D), device)
    if global_lse is not None:
        _checks.output("global_lse", global_lse, torch.float32, (B, H), device)
    _native.call("correct_attention_output", out, lses, rank, base2, corrected, global_lse)
    return corrected, global_lse


def merge_attention_outputs(
    out: Tensor,
    lse: Tensor,
    *,
    rank: int,
    world_size: int,
    group=None,
    lse_base: float = 2.0,
    return_lse: bool = False,
    all_gather: Optional[AllGather] = None,
    reduce_scatter: Optional[ReduceScatter] = None,
):
    """Merge partial attention outputs across DCP ranks (docs/ops.md section 7; the
    reference server's ``cp_lse_ag_out_rs``).

    Queries are all-gathered over heads, so every rank holds partial outputs for all
    ``H`` heads over its own KV shard. The LSEs are all-gathered to ``[W, B, H]``, each
    rank weighs its partials (:func:`correct_attention_output`: NaN/+inf LSE -> -inf,
    a zero weight forces 0), and a reduce-scatter over heads sums them: rank ``r`` gets
    the exact attention output of heads ``[r*H/W, (r+1)*H/W)``.

    ``world_size == 1`` returns ``out`` (and ``lse``) untouched.

    Args:
        out: fp32 or bf16 ``[B, H, D]`` partial outputs; any strides.
        lse: fp32 ``[B, H]`` partial LSEs in base ``lse_base`` (see
            :func:`normalize_lse` for other layouts).
        rank, world_size: this rank and W; ``H % W == 0``.
        group: a ``torch.distributed`` process group (None: the default group).
        lse_base: 2.0 or ``math.e``.
        return_lse: also return this rank's slice of the global LSE ``[B, H/W]``
            (fp32, base ``lse_base``).
        all_gather: optional hook ``(output [W*B, H], input [B, H]) -> None``.
        reduce_scatter: optional hook ``(output [B, H/W, D], input [W*B, H/W, D]) ->
            None`` summing over ranks (``reduce_scatter_tensor`` semantics).

    Returns:
        ``[B, H/W, D]`` of ``out``'s dtype, or ``(output, lse [B, H/W])``. No host sync.

    Example::

        >>> o = dsa_ext.merge_attention_outputs(out, lse, rank=r, world_size=W,
        ...                                     group=dcp_group)   # [B, H/W, D]
    """
    _checks.tensor("out", out, ndim=3)
    if out.dtype not in _native.ATTENTION_DTYPES:  # before any collective: no rank stalls
        raise TypeError(f"out must be float32 or bfloat16, got {out.dtype}")
    _lse_base("lse_base", lse_base)
    _checks.tensor("lse", lse, torch.float32, 2, out.device)
    _checks.dcp_layout(world_size, rank, 1, names=("world_size", "rank", "interleave"))
    B, H, D = out.shape
    _checks.shape("lse", lse, (B, H))
    if world_size == 1:
        return (out, lse) if return_lse else out
    if H % world_size != 0:
        raise ValueError(f"the number of heads ({H}) must be a multiple of world_size "
                         f"({world_size}) to scatter heads over ranks")
    if (all_gather is None) != (reduce_scatter is None):
        raise ValueError("pass both all_gather and reduce_scatter hooks, or neither")
    _check_exchange(group, all_gather, "all_gather", rank, world_size,
                    hooks_needed="all_gather= and reduce_scatter=")
    if reduce_scatter is not None and not callable(reduce_scatter):
        raise TypeError(f"reduce_scatter must be callable, got {type(reduce_scatter).__name__}")
    return _merge_attention(out, lse, rank, world_size, group, lse_base, return_lse,
                            all_gather, reduce_scatter)


def _merge_attention(out, lse, rank, world_size, group, lse_base, return_lse, all_gather,
                     reduce_scatter):
    """merge_attention_outputs after validation, for any world size (W = 1 included)."""
    B, H, D = out.shape
    Hl = H // world_size
    lses = torch.empty((world_size, B, H), dtype=torch.float32, device=out.device)
    all_gather_into(lses.view(world_size * B, H), lse.contiguous(), group, all_gather)
    global_lse = torch.empty((B, H), dtype=torch.float32, device=out.device) \
        if return_lse else None
    corrected = torch.empty((world_size, B, Hl, D), dtype=out.dtype, device=out.device)
    _native.call("correct_attention_output", out, lses, rank, _lse_base("lse_base", lse_base),
                 corrected, global_lse)
    merged = torch.empty((B, Hl, D), dtype=out.dtype, device=out.device)
    reduce_scatter_into(merged, corrected.view(world_size * B, Hl, D), group, reduce_scatter)
    if return_lse:
        return merged, global_lse[:, rank * Hl:(rank + 1) * Hl]
    return merged
