"""The indexer's per-row top-K: logits rows -> the k best column ids of each row
(docs/ops.md section 9)."""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _checks, _native, kv_index
from .topk import CUDA_MAX_SORTED

Tensor = torch.Tensor

#: Score dtypes the per-row top-K reads.
LOGITS_DTYPES = (torch.float32, torch.bfloat16)


def topk_per_row(
    logits: Tensor,
    k: int,
    *,
    lengths: Optional[Tensor] = None,
    seq_lens: Optional[Tensor] = None,
    next_n: int = 1,
    row_starts: Optional[Tensor] = None,
    row_ends: Optional[Tensor] = None,
    sorted: bool = False,
    out: Optional[Tensor] = None,
) -> Tensor:
    """The ``k`` best column ids of each logits row, exact and deterministic.

    Row ``i`` takes the columns ``[start, end)`` of ``logits[i]`` (ids relative to
    ``start``), with the bounds given by at most one of::

        (default)              start = 0, end = L
        lengths                start = 0, end = lengths[i]
        seq_lens [B], next_n   start = 0, end = seq_lens[i // next_n] - next_n + i % next_n + 1
        seq_lens [B, n]        start = 0, end = seq_lens[i // n, i % n]
        row_starts, row_ends   start = row_starts[i], end = row_ends[i]

    Bounds past ``[0, L]`` are clamped (``start`` into ``[0, L]``, ``end`` into
    ``[start, L]``) on the device: nothing is read out of bounds and nothing is read
    back to the host.

    The selection: the ``k`` largest scores of the window, compared by the order of the
    DCP merge on the raw bits (``+NaN`` highest, then ``+inf``, ..., ``+0`` above
    ``-0``, ..., ``-inf``, ``-NaN`` lowest; a bf16 score is the fp32 value of its
    bits), ties broken toward the lower column. A window of fewer than ``k`` columns gives
    all of them, then ``-1``.

    Order: by default ascending column id (the valid ids, then ``-1``); ``sorted=True``
    orders them by descending score, the lower column first among equal scores. Both are
    identical across runs, batch sizes and CPU/CUDA.

    Args:
        logits: fp32 or bf16 ``[rows, L]``; any row stride, column stride 1 (when
            ``L > 1``); ``rows, L < 2^31``.
        k: ids per row, ``1 <= k < 2^31``. On CUDA with ``sorted=True``,
            ``min(k, L) <= 16384``.
        lengths: optional int32 ``[rows]``.
        seq_lens: optional int32 ``[B]`` (then ``rows == B * next_n``) or ``[B, n]``
            (``rows == B * n``; ``next_n`` 1 or ``n``).
        next_n: decode query tokens per request, with 1-D ``seq_lens`` (the causal MTP
            rule above).
        row_starts, row_ends: optional int32 ``[rows]``, given together (the ``ks`` /
            ``ke`` of ``IndexerMetadataBuilder.build_prefill``).
        sorted: descending score order instead of column order.
        out: optional int32 ``[rows, k]`` output (any strides); with it the call
            allocates nothing and can be captured in a CUDA graph.

    Returns:
        int32 ``[rows, k]`` (``out`` when given).

    Raises:
        TypeError: a wrong dtype (logits, bounds, ``out``), a non-int ``k`` or
            ``next_n``, a non-bool ``sorted``.
        ValueError: a wrong rank, shape, stride or device, ``k < 1``, two kinds of
            bounds at once, ``row_starts`` without ``row_ends`` or the reverse, on CUDA
            with ``sorted=True`` ``min(k, L) > 16384``.

    Example::

        >>> logits = torch.tensor([[0.1, 3.0, -1.0, 3.0, 2.0]])
        >>> dsa_ext.topk_per_row(logits, 3)
        tensor([[1, 3, 4]], dtype=torch.int32)
        >>> dsa_ext.topk_per_row(logits, 3, row_starts=torch.tensor([2], dtype=torch.int32),
        ...                      row_ends=torch.tensor([5], dtype=torch.int32), sorted=True)
        tensor([[1, 2, 0]], dtype=torch.int32)
    """
    rows = check_topk_inputs(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                             sorted)
    out = _checks.output("out", out, torch.int32, (rows, k), logits.device)
    _native.call("topk_per_row", logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                 sorted, out)
    return out


def check_topk_inputs(logits: Tensor, k: int, lengths: Optional[Tensor],
                      seq_lens: Optional[Tensor], next_n: int, row_starts: Optional[Tensor],
                      row_ends: Optional[Tensor], sorted: bool) -> int:
    """Validate the logits, k, the row bounds and the order flag; returns the row count."""
    _checks.tensor("logits", logits, None, 2)
    if logits.dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    rows, L = logits.shape
    if max(rows, L) > _checks.INT32_MAX:
        raise ValueError(f"logits dimensions must be < 2^31, got shape {(rows, L)}")
    if L > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must have column stride 1, got strides {logits.stride()}")
    _checks.integer("k", k, 1)
    _checks.integer("next_n", next_n, 1)
    _checks.boolean("sorted", sorted)
    device = logits.device
    given = [name for name, t in (("lengths", lengths), ("seq_lens", seq_lens),
                                  ("row_starts", row_starts)) if t is not None]
    if len(given) > 1:
        raise ValueError(f"pass at most one kind of row bounds, got {' and '.join(given)}")
    if (row_starts is None) != (row_ends is None):
        raise ValueError("row_starts and row_ends must be given together, got only "
                         + ("row_starts" if row_ends is None else "row_ends"))
    if row_ends is not None and lengths is not None:
        raise ValueError("pass at most one kind of row bounds, got lengths and row_ends")
    if next_n != 1 and (seq_lens is None or seq_lens.dim() == 2 and
                        seq_lens.shape[1] != next_n):
        raise ValueError(f"next_n ({next_n}) applies to 1-D seq_lens [B] (or equals "
                         "seq_lens.shape[1])")
    for name, t in (("lengths", lengths), ("row_starts", row_starts), ("row_ends", row_ends)):
        if t is not None:
            _checks.tensor(name, t, torch.int32, 1, device)
            _checks.shape(name, t, (rows,))
    if seq_lens is not None:
        _checks.tensor("seq_lens", seq_lens, torch.int32, None, device)
        if seq_lens.dim() == 1:
            per_request = next_n
        elif seq_lens.dim() == 2:
            per_request = seq_lens.shape[1]
        else:
            raise ValueError(f"seq_lens must be 1-D or 2-D, got shape {tuple(seq_lens.shape)}")
        if seq_lens.shape[0] * per_request != rows:
            raise ValueError(f"logits must have seq_lens.shape[0] * {per_request} = "
                             f"{seq_lens.shape[0] * per_request} rows, got {rows}")
    if device.type == "cuda" and sorted and min(k, L) > CUDA_MAX_SORTED:
        raise ValueError(f"k must be <= {CUDA_MAX_SORTED} on CUDA with sorted=True when "
                         f"L = {L} > {CUDA_MAX_SORTED}, got {k}")
    return rows


def topk_to_slots(
    logits: Tensor,
    k: int,
    req_id: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    lengths: Optional[Tensor] = None,
    seq_lens: Optional[Tensor] = None,
    next_n: int = 1,
    row_starts: Optional[Tensor] = None,
    row_ends: Optional[Tensor] = None,
    block_stride: Optional[int] = None,
    compact: bool = False,
    return_valid_counts: bool = False,
    out: Optional[Tensor] = None,
    valid_counts: Optional[Tensor] = None,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """The per-row top-K converted to paged-KV slots::

        convert_req_index_to_global_index(req_id, block_table,
                                          topk_per_row(logits, k, <bounds>), block_size,
                                          block_stride=block_stride, compact=compact)

    with no ids buffer: on CUDA, rows of at most 8192 columns convert each selected id as
    it is written (one kernel), and so do plain slots (no ``compact``, no valid counts) of
    launches whose rows take clusters of at most 2 CTAs and fit the chip at one CTA per SM;
    other rows write the ids into ``out`` and convert them there (two launches;
    docs/ops.md sections 2 and 9). The ids are in
    ``topk_per_row``'s default order (ascending column); ``compact`` moves the valid
    slots to the front in that order and ``valid_counts`` counts the slots that are valid
    after the conversion.

    Args:
        logits, k, lengths, seq_lens, next_n, row_starts, row_ends: as
            :func:`topk_per_row`.
        req_id: int32 ``[rows]``, the block-table row of each logits row.
        block_table: int32 ``[R, NB]`` physical block ids; any strides.
        block_size: tokens per KV block; block_stride: slots between blocks (default
            ``block_size``).
        compact, return_valid_counts, out, valid_counts: as
            ``convert_req_index_to_global_index`` (``out`` int32 ``[rows, k]``,
            ``valid_counts`` int32 ``[rows]``).

    Returns:
        ``out``, or ``(out, valid_counts)`` when ``return_valid_counts``.

    Raises:
        TypeError / ValueError naming the argument, as the two ops it composes.

    Example::

        >>> logits = torch.tensor([[0.5, 2.0, -1.0, 3.0, 1.0]])
        >>> dsa_ext.topk_to_slots(logits, 3, torch.zeros(1, dtype=torch.int32),
        ...                       torch.tensor([[10, 20]], dtype=torch.int32), 4)
        tensor([[41, 43, 80]], dtype=torch.int32)
    """
    rows = check_topk_inputs(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                             False)
    device = logits.device
    block_stride = kv_index.check_tables(req_id, block_table, block_size, block_stride, rows,
                                         device)
    out, valid_counts = kv_index.slot_outputs(out, valid_counts, rows, k,
                                              compact or return_valid_counts, device)
    _native.call("topk_to_slots", logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                 req_id, block_table, block_size, block_stride, compact, out, valid_counts)
    return (out, valid_counts) if return_valid_counts else out


def topk_to_candidates(
    logits: Tensor,
    k: int,
    rank: int,
    world_size: int,
    interleave: int = 1,
    *,
    lengths: Optional[Tensor] = None,
    seq_lens: Optional[Tensor] = None,
    next_n: int = 1,
    row_starts: Optional[Tensor] = None,
    row_ends: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """A DCP rank's per-row top-K packed into candidate keys, in one kernel::

        pack_dcp_topk_candidates(logits, topk_per_row(logits, k, <bounds>), rank,
                                 world_size, interleave, row_starts=row_starts)

    (docs/ops.md sections 6a and 9): the keys the DCP all-gather and
    ``stable_topk_from_candidates`` take, without the ``[rows, k]`` round trip of the
    local ids. A shortfall (a window of fewer than ``k`` columns) gives the invalid key 0.

    Args:
        logits: fp32 ``[rows, L]`` this rank's local logits, as :func:`topk_per_row`.
        k, lengths, seq_lens, next_n, row_starts, row_ends: as :func:`topk_per_row`.
        rank, world_size, interleave: the DCP layout (r, W, I).
        out: optional int64 ``[rows, k]`` output (any strides).

    Returns:
        int64 ``[rows, k]`` candidate keys (``out`` when given).

    Example::

        >>> logits = torch.tensor([[0.5, 2.0, -1.0]])
        >>> keys = dsa_ext.topk_to_candidates(logits, 2, rank=1, world_size=2)
        >>> dsa_ext.reference.decode_candidate_gids(keys)   # local 0, 1 -> global 1, 3
        tensor([[1, 3]], dtype=torch.int32)
    """
    rows = check_topk_inputs(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                             False)
    if logits.dtype is not torch.float32:
        raise TypeError(f"logits must be float32 (the candidate keys hold fp32 scores), "
                        f"got {logits.dtype}")
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"))
    out = _checks.output("out", out, torch.int64, (rows, k), logits.device)
    _native.call("topk_to_candidates", logits, k, lengths, seq_lens, next_n, row_starts,
                 row_ends, rank, world_size, interleave, out)
    return out
