"""Per-token sequence lengths (the ops of csrc/indexer/seq_lens.*): DCP-local lengths,
decode context lengths and prefill chunk bounds.

Every op here is CPU + CUDA, bit-identical, and reads nothing back to the host, so a
decode build is CUDA-graph capturable.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks, _native

Tensor = torch.Tensor


def local_seq_lens(seq_lens: torch.Tensor, rank: Optional[int], world_size: int,
                   interleave: int = 1, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Number of positions in ``[0, L)`` that DCP rank ``rank`` owns, for every length L.

    Per element, with W = ``world_size`` and I = ``interleave``::

        base  = (L // (I*W)) * I
        local = base + clamp(L - base*W - rank*I, 0, I)

    Localize per-token lengths only after expanding them per token: the local length of
    a difference is not the difference of local lengths (docs/ops.md section 1: W=2, rank 1,
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

        >>> dsa_ext.seq_lens.local_seq_lens(torch.tensor([8, 9, 10]), 1, 2)
        tensor([4, 4, 5])
        >>> dsa_ext.seq_lens.local_seq_lens(torch.tensor([5]), None, 2, 2)
        tensor([[3, 2]])
    """
    _checks.int_tensor("seq_lens", seq_lens)
    _checks.dcp_layout(world_size, rank, interleave, names=("world_size", "rank", "interleave"),
                       all_ranks=True)
    shape = tuple(seq_lens.shape) + ((world_size,) if rank is None else ())
    if out is None:
        out = torch.empty(shape, dtype=seq_lens.dtype, device=seq_lens.device)
    else:
        _checks.tensor("out", out, seq_lens.dtype, None, seq_lens.device)
        _checks.shape("out", out, shape)
        _checks.writable("out", out)
        if out.dim() > 1 and not (rank is None and out.dim() == 2) and not out.is_contiguous():
            raise ValueError("out must be contiguous when it has more than one dimension")
    _native.call("dcp_local_seq_lens", seq_lens, rank, world_size, interleave, out)
    return out


def _buffer(name: str, buf: Optional[Tensor], rows: int, cols: Optional[int], device):
    """A given int32 buffer with >= rows rows (and `cols` columns), or a new one."""
    shape = (rows,) if cols is None else (rows, cols)
    if buf is None:
        return torch.empty(shape, dtype=torch.int32, device=device)
    _checks.buffer(name, buf, torch.int32, len(shape), device, rows)
    if cols is not None and buf.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {tuple(buf.shape)}")
    return buf


def decode_context_lens(
    seq_lens: Tensor,
    num_decode_tokens: int,
    *,
    next_n: Optional[int] = None,
    query_start_loc: Optional[Tensor] = None,
    compress_ratio: int = 1,
    dcp_world_size: int = 1,
    dcp_rank: Optional[int] = 0,
    interleave: int = 1,
    out: Optional[Tensor] = None,
    local_out: Optional[Tensor] = None,
    row_map_out: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token context lengths of a decode batch, DCP-localized after expansion.

    Uniform batch (``next_n`` given, every request has ``next_n`` query tokens): token
    ``t = b * next_n + j`` sees ``max(S[b] - next_n + j + 1, 0)`` positions. Ragged batch
    (``query_start_loc`` given): token ``t`` of request ``b`` (``qsl[b] <= t < qsl[b+1]``,
    found on device by binary search) sees ``max(S[b] - dlen[b] - qsl[b] + t + 1, 0)``,
    ``dlen[b] = qsl[b+1] - qsl[b]``. Then ``len //= compress_ratio``; the local length is
    the section-1 local length of that per-token length. A token outside every request
    (``t >= B * next_n``, ``t >= qsl[B]``) gets length 0 and row map -1; a padding
    request (S = 0) gives 0.

    Args:
        seq_lens: int32 ``[B]`` sequence lengths (query tokens included).
        num_decode_tokens: host int ``Td`` (the caller knows it; nothing is read back).
        next_n: tokens per request of a uniform batch.
        query_start_loc: int32 ``[>= B + 1]`` for a ragged batch (then ``next_n`` unused).
        compress_ratio: ``>= 1``.
        dcp_world_size, dcp_rank, interleave: DCP layout; ``dcp_rank=None`` gives the
            local lengths of every rank (a trailing dimension of size W).
        out, local_out, row_map_out: optional int32 buffers with ``>= Td`` rows
            (``local_out``: ``[>= Td, W]`` for ``dcp_rank=None``); their first ``Td`` rows
            are written and views of them returned (capacity buffers: graph capturable).

    Returns:
        ``(global int32 [Td], local int32 [Td] or [Td, W], row_map int32 [Td])``;
        ``row_map[t]`` is token t's request (its block-table row), -1 for none. With
        ``next_n`` these reshape to the native ``[B, next_n]`` layout.

    Example::

        >>> S = torch.tensor([10, 7, 12, 0], dtype=torch.int32)
        >>> qsl = torch.tensor([0, 3, 4, 8, 8], dtype=torch.int32)
        >>> decode_context_lens(S, 8, query_start_loc=qsl)[0].tolist()
        [8, 9, 10, 7, 9, 10, 11, 12]
    """
    _checks.tensor("seq_lens", seq_lens, torch.int32, 1)
    device = seq_lens.device
    B = seq_lens.shape[0]
    _checks.integer("num_decode_tokens", num_decode_tokens, 0)
    if (next_n is None) == (query_start_loc is None):
        raise ValueError("give exactly one of next_n (uniform batch) and query_start_loc "
                         "(ragged batch)")
    if next_n is not None:
        _checks.integer("next_n", next_n, 1)
    else:
        _checks.tensor("query_start_loc", query_start_loc, torch.int32, 1, device)
        _checks.same_length("query_start_loc", query_start_loc, "seq_lens plus one", B + 1,
                            at_least=True)
    _checks.integer("compress_ratio", compress_ratio, 1)
    _checks.dcp_layout(dcp_world_size, dcp_rank, interleave, all_ranks=True)
    Td = num_decode_tokens
    out = _buffer("out", out, Td, None, device)
    local_out = _buffer("local_out", local_out, Td,
                        dcp_world_size if dcp_rank is None else None, device)
    row_map_out = _buffer("row_map_out", row_map_out, Td, None, device)
    _native.call("expand_decode_seq_lens", seq_lens, B, query_start_loc, next_n or 1, Td, compress_ratio,
                 dcp_rank, dcp_world_size, interleave, out, local_out, row_map_out)
    return out[:Td], local_out[:Td], row_map_out[:Td]


def decode_row_ends(seq_lens: Tensor, next_n: int, *, out: Optional[Tensor] = None) -> Tensor:
    """Top-k row bounds after the logits of a uniform decode batch (one device op)::

        row_end[i] = max(S[i // next_n] - next_n + i % next_n + 1, 0)    i < B * next_n

    Args:
        seq_lens: int32 ``[B]``. next_n: ``>= 1``. out: optional int32 ``[>= B*next_n]``
            (with it nothing is allocated).

    Returns:
        int32 ``[B * next_n]`` (a view of ``out`` when given).

    Example::

        >>> decode_row_ends(torch.tensor([10, 5], dtype=torch.int32), 2).tolist()
        [9, 10, 4, 5]
    """
    _checks.tensor("seq_lens", seq_lens, torch.int32, 1)
    _checks.integer("next_n", next_n, 1)
    B = seq_lens.shape[0]
    Td = B * next_n
    out = _buffer("out", out, Td, None, seq_lens.device)
    _native.call("expand_decode_seq_lens", seq_lens, B, None, next_n, Td, 1, 0, 1, 1, out,
                 None, None)
    return out[:Td]


def prefill_chunk_bounds(
    seq_lens: Tensor,
    query_start_loc: Tensor,
    row_starts: Tensor,
    token_start: int,
    token_end: int,
    *,
    compress_ratio: int = 1,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave: int = 1,
    ks: Optional[Tensor] = None,
    ke: Optional[Tensor] = None,
    token_to_seq: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token logits column bounds ``[ks, ke)`` of a prefill chunk (docs/ops.md
    section 5).

    For flat token ``g`` in ``[token_start, token_end)`` of request ``b``
    (``qsl[b] <= g < qsl[b+1]``, binary search on device), ``o = g - qsl[b]``::

        ks = row_starts[b]
        ke = row_starts[b] + local((S[b] - (qsl[b+1] - qsl[b]) + 1 + o) // compress_ratio)
        token_to_seq = b

    ``local`` is the DCP local length (identity for W = 1). A token in no request gets
    ``ks = ke = 0`` and ``token_to_seq = -1``.

    Args:
        seq_lens: int32 ``[R]`` of the chunk's requests.
        query_start_loc: int32 ``[>= R + 1]`` flat token starts of those requests.
        row_starts: int32 ``[>= R]``: where each request's (rank-local, compressed) KV
            starts in the chunk's gathered KV (``local_cu_seq_lens[:-1]``).
        token_start, token_end: host ints, the chunk's flat token range.
        ks, ke, token_to_seq: optional int32 ``[token_end - token_start]`` outputs.

    Returns:
        ``(ks, ke, token_to_seq)``, int32 ``[token_end - token_start]`` each.

    Example::

        >>> prefill_chunk_bounds(torch.tensor([8], dtype=torch.int32),
        ...     torch.tensor([0, 8], dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
        ...     0, 8, dcp_world_size=4)[1].tolist()
        [1, 1, 1, 1, 2, 2, 2, 2]
    """
    _checks.tensor("seq_lens", seq_lens, torch.int32, 1)
    device = seq_lens.device
    R = seq_lens.shape[0]
    _checks.tensor("query_start_loc", query_start_loc, torch.int32, 1, device)
    _checks.same_length("query_start_loc", query_start_loc, "seq_lens plus one", R + 1, True)
    _checks.tensor("row_starts", row_starts, torch.int32, 1, device)
    _checks.same_length("row_starts", row_starts, "seq_lens", R, True)
    _checks.integer("token_start", token_start, 0)
    _checks.integer("token_end", token_end, token_start)
    _checks.integer("compress_ratio", compress_ratio, 1)
    _checks.dcp_layout(dcp_world_size, dcp_rank, interleave)
    n = token_end - token_start
    outs = []
    for name, buf in (("ks", ks), ("ke", ke), ("token_to_seq", token_to_seq)):
        buf = _buffer(name, buf, n, None, device)
        _checks.shape(name, buf, (n,))
        outs.append(buf)
    _native.call("prefill_chunk_bounds", seq_lens, query_start_loc, row_starts,
                 token_start, token_end, compress_ratio, dcp_rank, dcp_world_size, interleave,
                 *outs)
    return tuple(outs)
