"""Decode context parallelism (DCP): rank-local lengths and the cross-rank merges.

A request's KV cache is split over W ranks: position p lives on rank (p // I) % W
(spec section 1).
"""
from __future__ import annotations

# ---------------------------------------------------------------------------------------
# Rank-local lengths (spec section 1). Self-contained: the merges below do not use it.
# ---------------------------------------------------------------------------------------
from typing import Optional

import torch

from . import _C, _checks, _native


def _local_seq_lens_impl(seq_lens: torch.Tensor, rank: Optional[int], world_size: int,
                         interleave: int, out: torch.Tensor) -> None:
    n = seq_lens.numel()
    cols = world_size if rank is None else 1
    flat = seq_lens.reshape(n)
    if out.dim() == 1:
        out_desc = (out.data_ptr(), n, 1, out.stride(0), 1)
    elif out.dim() == 2 and rank is None:
        out_desc = _native.desc2(out)
    else:
        out_desc = _native.desc2(out.view(n, cols))
    device, stream = _native.place(seq_lens)
    _C.dcp_local_seq_lens(_native.desc1(flat), out_desc, seq_lens.dtype == torch.int64,
                          -1 if rank is None else rank, world_size, interleave, device, stream)


_local_seq_lens_op = _native.define(
    "dcp_local_seq_lens(Tensor seq_lens, int? rank, int world_size, int interleave, "
    "Tensor(a!) out) -> ()",
    _local_seq_lens_impl, _native.no_result)


def local_seq_lens(seq_lens: torch.Tensor, rank: Optional[int], world_size: int,
                   interleave: int = 1, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Number of positions in ``[0, L)`` that DCP rank ``rank`` owns, for every length L.

    Per element, with W = ``world_size`` and I = ``interleave``::

        base  = (L // (I*W)) * I
        local = base + clamp(L - base*W - rank*I, 0, I)

    Localize per-token lengths only after expanding them per token: the local length of
    a difference is not the difference of local lengths (spec section 1: W=2, rank 1,
    bounds [8, 9, 10] -> [4, 4, 5], while localizing 10 -> 5 first gives [3, 4, 5]).
    W = 1 returns the lengths unchanged for any I.

    Args:
        seq_lens: int32 or int64 lengths (>= 0), any shape, CPU or CUDA.
        rank: the rank, ``0 <= rank < world_size``; ``None`` for every rank at once.
        world_size: W >= 1.
        interleave: I >= 1 (``cp_kv_cache_interleave_size``).
        out: optional buffer of ``seq_lens``'s dtype and shape (``rank=None``: shape
            ``seq_lens.shape + (W,)``); with it nothing is allocated, nothing is read back
            and the call is CUDA-graph capturable. A multi-dimensional ``out`` must be
            contiguous.

    Returns:
        ``out``: ``seq_lens.shape`` for one rank, ``seq_lens.shape + (W,)`` for
        ``rank=None`` (column r = rank r).

    Raises:
        TypeError for a non-integer dtype; ValueError naming the argument for W < 1,
        I < 1, rank outside [0, W), a wrong ``out`` shape or device.

    Example::

        >>> dsa_ext.dcp.local_seq_lens(torch.tensor([8, 9, 10]), 1, 2)
        tensor([4, 4, 5])
        >>> dsa_ext.dcp.local_seq_lens(torch.tensor([5]), None, 2, 2)
        tensor([[3, 2]])
    """
    _checks.int_tensor("seq_lens", seq_lens)
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"))
    shape = tuple(seq_lens.shape) + ((world_size,) if rank is None else ())
    if out is None:
        out = torch.empty(shape, dtype=seq_lens.dtype, device=seq_lens.device)
    else:
        _checks.tensor("out", out, seq_lens.dtype, None, seq_lens.device)
        _checks.shape("out", out, shape)
        if out.dim() > 1 and not (rank is None and out.dim() == 2) and not out.is_contiguous():
            raise ValueError("out must be contiguous when it has more than one dimension")
    _native.call(_local_seq_lens_op, seq_lens, rank, world_size, interleave, out)
    return out
