"""Plain torch reference implementations: the executable spec.

Written for clarity, not speed; used by the tests and by ``python -m dsa_ext``. Each
function follows a section of the op contracts (spec/ops.md) line by line and works on
CPU tensors (int64 arithmetic throughout, so nothing here can overflow).
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------
# Section 1: DCP ownership math
# ---------------------------------------------------------------------------------------


def dcp_owner(p, world: int, interleave: int):
    """Rank that owns global position p."""
    return (p // interleave) % world


def dcp_local_position(p, world: int, interleave: int):
    """Position of p inside its owner's shard."""
    return (p // (world * interleave)) * interleave + p % interleave


def dcp_global_position(q, rank: int, world: int, interleave: int):
    """Inverse of dcp_local_position on rank `rank`."""
    return (q // interleave) * (world * interleave) + rank * interleave + q % interleave


def dcp_local_length(L, rank: int, world: int, interleave: int):
    """Number of positions in [0, L) owned by `rank`."""
    base = (L // (interleave * world)) * interleave
    rem = L - base * world
    if isinstance(rem, Tensor):
        return base + (rem - rank * interleave).clamp(0, interleave)
    return base + min(max(rem - rank * interleave, 0), interleave)


# ---------------------------------------------------------------------------------------
# Section 2: index conversion
# ---------------------------------------------------------------------------------------


def convert_req_index_to_global_index(
    req_id: Tensor, block_table: Tensor, token_indices: Tensor, block_size: int, *,
    block_stride: Optional[int] = None, dcp_world_size: int = 1, dcp_rank: int = 0,
    interleave: int = 1, compact: bool = False, idx_mapping: Optional[Tensor] = None,
    prefill_request_id: Optional[Tensor] = None,
    prefill_workspace_starts: Optional[Tensor] = None,
    prefill_workspace_rank_stride: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (slots int32 [T, K], valid counts int32 [T])."""
    W, r, I = dcp_world_size, dcp_rank, interleave
    stride = block_size if block_stride is None else block_stride
    tok = token_indices.long()
    T, K = tok.shape
    R, NB = block_table.shape

    # Which block-table row each token row reads; out of range -> no request.
    req = req_id.long()
    if idx_mapping is not None:
        req = _gather_or(idx_mapping.long(), req, -1)
    req_ok = (req >= 0) & (req < R)

    owner = dcp_owner(tok, W, I)
    q = dcp_local_position(tok, W, I)
    blk = q // block_size
    valid = (tok >= 0) & (owner == r) & (blk < NB) & req_ok[:, None]
    table = _gather_or(block_table.long().reshape(-1), req[:, None] * NB + blk, 0)
    slot = table * stride + q % block_size

    if prefill_request_id is not None:
        pid = prefill_request_id.long()
        starts = _gather_or(prefill_workspace_starts.long(), pid, -1)
        ws_slot = owner * prefill_workspace_rank_stride + starts[:, None] + q
        ws_valid = (tok >= 0) & (starts[:, None] >= 0)
        is_prefill = (pid >= 0)[:, None]
        slot = torch.where(is_prefill, ws_slot, slot)
        valid = torch.where(is_prefill, ws_valid, valid)

    valid &= (slot >= 0) & (slot < 2**31)
    slot = torch.where(valid, slot, torch.full_like(slot, -1))
    counts = valid.sum(dim=1).to(torch.int32)
    if compact:
        out = torch.full((T, K), -1, dtype=torch.int64)
        for t in range(T):
            kept = slot[t][valid[t]]  # boolean indexing keeps column order
            out[t, : kept.numel()] = kept
        slot = out
    return slot.to(torch.int32), counts


def _gather_or(values: Tensor, index: Tensor, fill: int) -> Tensor:
    """values[index] where 0 <= index < len(values), else `fill`."""
    inside = (index >= 0) & (index < values.shape[0])
    safe = torch.where(inside, index, torch.zeros_like(index))
    picked = values[safe] if values.shape[0] else torch.zeros_like(index)
    return torch.where(inside, picked, torch.full_like(index, fill))


# ---------------------------------------------------------------------------------------
# Section 6: DCP top-K merge
# ---------------------------------------------------------------------------------------

_TOP_BIT = -(2**63)  # int64 with only bit 63 set


def encode_candidate_keys(scores: Tensor, gids: Tensor) -> Tensor:
    """Pack (fp32 score, int32 global id) pairs into int64 candidate keys (spec 6a).

    The int64 holds the bits of the unsigned key
    ``(ordered(bits(score)) << 32) | (~gid & 0xFFFFFFFF)``, with
    ``ordered(u) = ~u if u & 0x80000000 else u | 0x80000000``; invalid ids (gid < 0)
    give key 0. Larger unsigned key = better candidate.
    """
    u = scores.to(torch.float32).contiguous().view(torch.int32).long() & 0xFFFFFFFF
    ordered = torch.where(u >= 2**31, u ^ 0xFFFFFFFF, u | 0x80000000)  # in [0, 2^32)
    hi = torch.where(ordered >= 2**31, ordered - 2**32, ordered)  # same bits as int32
    g = gids.long()
    key = hi * 2**32 + ((~g) & 0xFFFFFFFF)  # the int64 with bits (ordered << 32) | ~gid
    return torch.where(g < 0, torch.zeros_like(key), key)


def decode_candidate_keys(keys: Tensor) -> Tensor:
    """Global ids of int64 candidate keys: -1 for key 0, else the int32 ~(low 32 bits)."""
    low = (~keys.long()) & 0xFFFFFFFF
    gid = torch.where(low >= 2**31, low - 2**32, low)
    return torch.where(keys == 0, torch.full_like(gid, -1), gid).to(torch.int32)


def stable_topk_from_candidates(candidates: Tensor, k: int) -> Tensor:
    """Global ids of each row's k largest keys, largest first; -1 past the candidates.

    candidates: int64 ``[rows, N]`` or ``[W, rows, K]`` (row r: ``candidates[:, r, :]``).
    Keys compare as unsigned 64-bit integers: flipping the top bit makes the signed int64
    order equal to that order. Equal keys are identical candidates, so ties cannot show.
    """
    if candidates.dim() == 3:
        W, rows, K = candidates.shape
        candidates = candidates.permute(1, 0, 2).reshape(rows, W * K)  # rank-major
    rows, n = candidates.shape
    signed = candidates.long() ^ _TOP_BIT
    ordered, _ = torch.sort(signed, dim=1, descending=True, stable=True)
    keys = ordered[:, :k] ^ _TOP_BIT
    ids = decode_candidate_keys(keys)
    if k > n:
        ids = torch.cat([ids, torch.full((rows, k - n), -1, dtype=torch.int32)], dim=1)
    return ids
