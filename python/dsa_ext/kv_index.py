"""Index conversion: request-local top-K token ids -> physical paged-KV slots
(docs/ops.md section 2)."""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _checks, _native

Tensor = torch.Tensor


def convert_req_index_to_global_index(
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    *,
    block_stride: Optional[int] = None,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave: int = 1,
    compact: bool = False,
    return_valid_counts: bool = False,
    idx_mapping: Optional[Tensor] = None,
    prefill_request_id: Optional[Tensor] = None,
    prefill_workspace_starts: Optional[Tensor] = None,
    prefill_workspace_rank_stride: int = 0,
    out: Optional[Tensor] = None,
    valid_counts: Optional[Tensor] = None,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Convert request-local token positions into physical paged-KV slot ids.

    For row ``t`` and column ``c`` with ``tok = token_indices[t, c]`` and
    ``req = req_id[t]`` (or ``idx_mapping[req_id[t]]``)::

        q    = tok                                    if dcp_world_size == 1
             = (tok // (W*I)) * I + tok % I           else; -1 if (tok // I) % W != dcp_rank
        slot = block_table[req, q // block_size] * block_stride + q % block_size

    ``-1`` marks "no token": ``tok < 0``, a token owned by another DCP rank, a block
    index past ``block_table.shape[1]``, a request id outside ``[0, R)`` (or outside
    ``idx_mapping``), or a slot outside ``[0, 2^31)``. None of these faults reads out of
    bounds. Rows with ``prefill_request_id[t] >= 0`` map into the all-gathered prefill
    workspace instead: ``owner(tok) * prefill_workspace_rank_stride +
    prefill_workspace_starts[prefill_request_id[t]] + q`` (remote tokens are valid).

    Args:
        req_id: int32 ``[T]``, the request (block-table row) of each token row.
        block_table: int32 ``[R, NB]``, physical block ids; any strides.
        token_indices: int32 ``[T, K]``, ``K >= 1``, request-local positions, -1 = none;
            any strides.
        block_size: tokens per KV block (``block_size % interleave == 0``).
        block_stride: slots between consecutive blocks (default ``block_size``).
        dcp_world_size, dcp_rank, interleave: the DCP layout (W, r, I).
        compact: write each row's valid slots to the front in ascending column order,
            ``-1`` after them, and the per-row counts to ``valid_counts``.
        return_valid_counts: also return int32 ``[T]`` valid counts.
        idx_mapping: optional int32 ``[N]`` map from ``req_id`` values to table rows.
        prefill_request_id: optional int32 ``[T]``; ``>= 0`` marks a prefill row.
        prefill_workspace_starts: int32 ``[P]`` workspace offset of each prefill request.
        prefill_workspace_rank_stride: workspace slots per rank.
        out: optional int32 ``[T, K]`` output (any strides); nothing is allocated and
            the call is CUDA-graph capturable when ``out`` (and ``valid_counts``) are
            given.
        valid_counts: optional int32 ``[T]`` buffer for the counts.

    Returns:
        ``out``, or ``(out, valid_counts)`` when ``return_valid_counts``.

    Raises:
        TypeError / ValueError naming the argument for a wrong dtype, rank, shape or
        device, ``K < 1``, ``block_size % interleave != 0`` or ``dcp_rank >= W``.

    Example::

        >>> bt = torch.tensor([[10]], dtype=torch.int32)
        >>> tok = torch.tensor([[0, 1, 2, 3, 4, 5, -1, -1]], dtype=torch.int32)
        >>> dsa_ext.convert_req_index_to_global_index(
        ...     torch.zeros(1, dtype=torch.int32), bt, tok, 4, dcp_world_size=2,
        ...     compact=True, return_valid_counts=True)
        (tensor([[40, 41, 42, -1, -1, -1, -1, -1]], dtype=torch.int32),
         tensor([3], dtype=torch.int32))
    """
    _checks.tensor("token_indices", token_indices, torch.int32, 2)
    device = token_indices.device
    T, K = token_indices.shape
    if K < 1:
        raise ValueError(f"token_indices must have at least one column, got shape {(T, K)}")
    block_stride = check_tables(req_id, block_table, block_size, block_stride, T, device)
    _checks.dcp_layout(dcp_world_size, dcp_rank, interleave, block_size)
    _checks.optional_tensor("idx_mapping", idx_mapping, torch.int32, 1, device)
    if prefill_request_id is not None:
        _checks.tensor("prefill_request_id", prefill_request_id, torch.int32, 1, device)
        _checks.shape("prefill_request_id", prefill_request_id, (T,))
        if prefill_workspace_starts is None:
            raise ValueError("prefill_workspace_starts is required with prefill_request_id")
        _checks.tensor("prefill_workspace_starts", prefill_workspace_starts, torch.int32, 1,
                       device)
        _checks.integer("prefill_workspace_rank_stride", prefill_workspace_rank_stride, 0)
    elif prefill_workspace_starts is not None:
        raise ValueError("prefill_workspace_starts is only used with prefill_request_id")
    out, valid_counts = slot_outputs(out, valid_counts, T, K, compact or return_valid_counts,
                                     device)
    _native.call("convert_req_index_to_global_index", req_id, block_table, token_indices,
                 block_size, block_stride, dcp_world_size, dcp_rank, interleave, compact,
                 idx_mapping, prefill_request_id, prefill_workspace_starts,
                 prefill_workspace_rank_stride, out, valid_counts)
    return (out, valid_counts) if return_valid_counts else out


def slot_outputs(out: Optional[Tensor], valid_counts: Optional[Tensor], rows: int, cols: int,
                 counts: bool, device: torch.device) -> tuple:
    """The int32 ``out [rows, cols]`` and ``valid_counts [rows]`` of a conversion: checked
    when given, allocated when not (``valid_counts`` only if ``counts`` are needed)."""
    out = _checks.output("out", out, torch.int32, (rows, cols), device)
    if valid_counts is not None or counts:
        valid_counts = _checks.output("valid_counts", valid_counts, torch.int32, (rows,), device)
    return out, valid_counts


def check_tables(req_id: Tensor, block_table: Tensor, block_size: int,
                 block_stride: Optional[int], T: int, device: torch.device) -> int:
    """Check the request ids of T rows, the block table and the block geometry; returns
    the block stride (default: the block size)."""
    _checks.tensor("req_id", req_id, torch.int32, 1, device)
    _checks.tensor("block_table", block_table, torch.int32, 2, device)
    _checks.shape("req_id", req_id, (T,))
    _checks.integer("block_size", block_size, 1)
    block_stride = block_size if block_stride is None else block_stride
    _checks.integer("block_stride", block_stride, block_size)
    return block_stride


def safe_lengths(valid_counts: Tensor, indices: Optional[Tensor] = None) -> Tensor:
    """Lengths a sparse-attention kernel can take: ``max(valid_counts, 1)``.

    Sparse attention kernels cannot take empty rows, so a row with no valid slot gets
    length 1; when the compacted ``indices`` ``[T, K]`` are given, the first entry of
    each such row is pointed at slot 0 (in place). Keep the raw counts to mask.

    Args:
        valid_counts: int32 ``[T]`` from ``convert_req_index_to_global_index``.
        indices: optional int32 ``[T, K]`` compacted slots, updated in place.

    Returns:
        int32 ``[T]``. No host sync; capturable in a CUDA graph.
    """
    _checks.tensor("valid_counts", valid_counts, torch.int32, 1)
    if indices is not None:
        _checks.tensor("indices", indices, torch.int32, 2, valid_counts.device)
        _checks.dim_at_least("indices", indices, 1, 1)
        if indices.shape[0] != valid_counts.shape[0]:
            raise ValueError(f"indices must have {valid_counts.shape[0]} rows like "
                             f"valid_counts, got shape {tuple(indices.shape)}")
        first = indices[:, 0]
        first.copy_(torch.where(valid_counts > 0, first, torch.zeros_like(first)))
    return valid_counts.clamp(min=1)
