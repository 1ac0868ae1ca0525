"""DCP top-K merge: the exact, stable global top-K of packed candidates
(docs/ops.md section 6c)."""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks, _native

Tensor = torch.Tensor

#: Largest min(k, N) the CUDA kernel sorts with ``sorted=True`` (its biggest sorting
#: variant keeps that many keys in shared memory; see cute_dsl_aot/variants.py). The
#: default order and the CPU have no such limit.
CUDA_MAX_SORTED = 16384

#: Largest N (candidates per row) and k on CUDA: the kernel counts columns and output
#: positions in 32 bits, and its loops step up to 2,048 past their bound.
CUDA_MAX_INDEX = 2**31 - 4096


def check_selection(device: torch.device, shape: tuple, n: int, k: int,
                    sorted: bool) -> None:
    """The order flag and the limits of the top-K on candidates of `shape` (`n` per
    row), `k` >= 1 ids."""
    _checks.boolean("sorted", sorted)
    if max(shape) > _checks.INT32_MAX:
        raise ValueError(f"candidates dimensions must be < 2^31, got shape {shape}")
    if device.type == "cuda" and n > CUDA_MAX_INDEX:
        raise ValueError(f"candidates must hold at most {CUDA_MAX_INDEX} (2^31 - 4096) "
                         f"candidates per row on CUDA, got shape {shape}")
    if device.type == "cuda" and k > CUDA_MAX_INDEX:
        raise ValueError(f"k must be <= {CUDA_MAX_INDEX} (2^31 - 4096) on CUDA, got {k}")
    if device.type == "cuda" and sorted and min(k, n) > CUDA_MAX_SORTED:
        raise ValueError(f"k must be <= {CUDA_MAX_SORTED} on CUDA with sorted=True when "
                         f"N = {n} > {CUDA_MAX_SORTED}, got {k}")


def stable_topk_from_candidates(candidates: Tensor, k: int, out: Optional[Tensor] = None, *,
                                sorted: bool = False) -> Tensor:
    """Exact global top-K of packed DCP candidates, in a deterministic order.

    Each candidate is one int64 holding the unsigned 64-bit key (the format of
    ``pack_dcp_topk_candidates``; ``reference.encode_candidate_keys`` builds it)::

        key = (ordered(bits(score)) << 32) | (~gid & 0xFFFFFFFF)    # 0 if gid < 0
        ordered(u) = ~u if u & 0x80000000 else u | 0x80000000

    For each row, ``out[row]`` lists the global ids of the ``k`` largest keys compared as
    unsigned 64-bit integers (score descending, ``+NaN`` above ``+inf``, ``+0`` above
    ``-0``; then global id ascending), then ``-1``: invalid candidates (key 0) are never
    selected and, like a shortfall (fewer than ``k`` candidates), leave ``-1``.

    Order of the ids: by default, the order in which the selected candidates appear in the
    row, position ``p = w * K + c`` of ``candidates[w, row, c]`` (rank-major as
    all-gathered; the column of a 2-D input). Where the row holds the same key more than
    once (a candidate passed twice) and only some of its copies make the top ``k``, the
    copies at the lowest positions are taken. This order costs nothing extra on CUDA and
    is identical across runs, batch sizes, ranks and CPU/CUDA. ``sorted=True`` orders the
    ids by descending key instead (score descending, then id ascending).

    The selected set (and with ``sorted=True`` the order) matches an unsharded top-K
    exactly when each rank's local top-K breaks ties by lower position first (any other
    local tie rule still yields a valid top-K, possibly a different one among equal
    scores).

    Args:
        candidates: int64 ``[rows, N]`` (any strides, e.g. ``torch.cat`` of per-rank
            packed ``[rows, K]`` tensors along dim 1) or ``[W, rows, K]`` (any strides,
            e.g. the output of ``all_gather_into_tensor``: row r's candidates are
            ``candidates[:, r, :]``); ``N = W * K >= 1``. Read in place, never copied.
        k: number of ids per row, ``k >= 1`` (``k > N`` fills with ``-1``). On CUDA
            ``k`` and ``N`` are at most ``CUDA_MAX_INDEX`` (2^31 - 4096), and with
            ``sorted=True`` ``min(k, N) <= CUDA_MAX_SORTED`` (16384).
        out: optional int32 ``[rows, k]`` output (any strides). With ``out`` given the
            call allocates nothing and is CUDA-graph capturable.
        sorted: descending key order instead of position order.

    Returns:
        int32 ``[rows, k]`` global ids (``out`` when given). No host synchronization.

    Raises:
        TypeError: a dtype other than int64 candidates / int32 ``out``, a non-bool
            ``sorted``.
        ValueError: a wrong rank, shape or device, or ``k`` out of range.

    Example::

        >>> from dsa_ext.reference import encode_candidate_keys
        >>> scores = torch.tensor([[0.5, 2.0, 0.5, -1.0]])
        >>> gids = torch.tensor([[7, 3, 1, -1]], dtype=torch.int32)
        >>> keys = encode_candidate_keys(scores, gids)
        >>> dsa_ext.stable_topk_from_candidates(keys, 5)
        tensor([[ 7,  3,  1, -1, -1]], dtype=torch.int32)
        >>> dsa_ext.stable_topk_from_candidates(keys, 2)  # 3 and 1 outrank 7
        tensor([[3, 1]], dtype=torch.int32)
        >>> dsa_ext.stable_topk_from_candidates(keys, 5, sorted=True)
        tensor([[ 3,  1,  7, -1, -1]], dtype=torch.int32)
    """
    _checks.tensor("candidates", candidates, torch.int64)
    if candidates.dim() == 2:
        rows, n = candidates.shape
    elif candidates.dim() == 3:
        rows, n = candidates.shape[1], candidates.shape[0] * candidates.shape[2]
    else:
        raise ValueError("candidates must be 2-D [rows, N] or 3-D [W, rows, K], got shape "
                         f"{tuple(candidates.shape)}")
    if n < 1:
        raise ValueError("candidates must hold at least one candidate per row, got shape "
                         f"{tuple(candidates.shape)}")
    _checks.integer("k", k, 1)
    device = candidates.device
    check_selection(device, tuple(candidates.shape), n, k, sorted)
    out = _checks.output("out", out, torch.int32, (rows, k), device)
    _native.call("stable_topk_from_candidates", candidates, out, sorted)
    return out
