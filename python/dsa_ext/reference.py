"""Plain torch reference implementations: the executable spec.

Written for clarity, not speed; used by the tests and by ``python -m dsa_ext``. Each
function follows a section of the op contracts (docs/ops.md) line by line and works on
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
    """Number of positions in [0, L) owned by `rank` (0 for L <= 0)."""
    L = L.clamp(min=0) if isinstance(L, Tensor) else max(L, 0)
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
# Section 1 (applied): rank-local lengths of many lengths
# ---------------------------------------------------------------------------------------


def local_seq_lens(seq_lens: Tensor, rank: Optional[int], world: int,
                   interleave: int) -> Tensor:
    """Rank-local lengths; rank None -> a trailing dimension of size `world`."""
    L = seq_lens.long()
    if rank is None:
        cols = [dcp_local_length(L, r, world, interleave) for r in range(world)]
        return torch.stack(cols, dim=-1).to(seq_lens.dtype)
    return dcp_local_length(L, rank, world, interleave).to(seq_lens.dtype)


# ---------------------------------------------------------------------------------------
# Section 3: C128A metadata
# ---------------------------------------------------------------------------------------


def build_c128a_topk_metadata(positions: Tensor, ratio: int, num_decode_tokens: int,
                              token_to_req: Tensor, block_table: Tensor, block_size: int,
                              slot_mapping: Tensor, width: int
                              ) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (decode int32 [Td, width], decode_lens int32 [Td], prefill int32 [T-Td, width])."""
    Td = num_decode_tokens
    T = positions.shape[0]
    R, NB = block_table.shape
    # n_t = min((pos + 1) // ratio, width); a negative position gives 0. (pos + 1) // r is
    # written pos // r + (pos % r + 1) // r, the first term capped at width first: no
    # overflow at pos = 2^63 - 1.
    pos = positions.long()
    n = ((pos // ratio).clamp(max=width) + (pos % ratio + 1) // ratio).clamp(0, width)
    i = torch.arange(width, dtype=torch.int64)

    # Decode rows: slot of compressed position i through the request's block-table row.
    dn = torch.where(slot_mapping[:Td].long() >= 0, n[:Td], torch.zeros_like(n[:Td]))
    req = token_to_req[:Td].long()
    blk = (i // block_size)[None, :].expand(Td, width)
    entry_ok = (req >= 0)[:, None] & (req < R)[:, None] & (blk < NB) & (i[None, :] < dn[:, None])
    table = _gather_or(block_table.long().reshape(-1), req[:, None] * NB + blk, 0)
    slot = table * block_size + (i % block_size)[None, :]
    entry_ok &= (slot >= 0) & (slot < 2**31)
    decode = torch.where(entry_ok, slot, torch.full_like(slot, -1))

    # Prefill rows: the compressed positions themselves.
    pn = n[Td:]
    prefill = torch.where(i[None, :] < pn[:, None], i[None, :].expand(T - Td, width),
                          torch.full((T - Td, width), -1, dtype=torch.int64))
    return decode.to(torch.int32), dn.to(torch.int32), prefill.to(torch.int32)


# ---------------------------------------------------------------------------------------
# Section 4: decode per-token context lengths
# ---------------------------------------------------------------------------------------


def decode_token_requests(num_decode_tokens: int, num_reqs: int, next_n: Optional[int] = None,
                          query_start_loc: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(request of each token or -1, one past the request's last token) for a decode batch."""
    req = torch.full((num_decode_tokens,), -1, dtype=torch.int64)
    end = torch.zeros(num_decode_tokens, dtype=torch.int64)
    if query_start_loc is None:
        for t in range(num_decode_tokens):
            if t // next_n < num_reqs:
                req[t], end[t] = t // next_n, (t // next_n + 1) * next_n
    else:
        qsl = query_start_loc.long().tolist()
        for b in range(num_reqs):
            for t in range(max(qsl[b], 0), min(qsl[b + 1], num_decode_tokens)):
                req[t], end[t] = b, qsl[b + 1]
    return req, end


def decode_context_lens(seq_lens: Tensor, num_decode_tokens: int, *,
                        next_n: Optional[int] = None, query_start_loc: Optional[Tensor] = None,
                        compress_ratio: int = 1, dcp_world_size: int = 1,
                        dcp_rank: Optional[int] = 0, interleave: int = 1
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token context lengths of a decode batch (docs/ops.md section 4).

    Token t of request b sees max(S[b] - end_b + t + 1, 0) positions, end_b = one past
    b's last token (uniform: b = t // next_n, end_b = (b + 1) * next_n, which is
    max(S[b] - next_n + j + 1, 0)), then // compress_ratio, then DCP-localized.
    Returns (global int32 [Td], local int32 [Td] or [Td, W] for rank None, row map int32 [Td]).
    """
    req, end = decode_token_requests(num_decode_tokens, seq_lens.shape[0], next_n,
                                     query_start_loc)
    S = _gather_or(seq_lens.long(), req, 0)
    t = torch.arange(num_decode_tokens, dtype=torch.int64)
    length = torch.where(req >= 0, (S - end + t + 1).clamp(min=0), torch.zeros_like(S))
    length = length // compress_ratio
    local = local_seq_lens(length, dcp_rank, dcp_world_size, interleave)
    return length.to(torch.int32), local.to(torch.int32), req.to(torch.int32)


def decode_row_ends(seq_lens: Tensor, next_n: int) -> Tensor:
    """Top-k row bounds: row_end[i] = S[i // next_n] - next_n + i % next_n + 1 (>= 0)."""
    i = torch.arange(seq_lens.shape[0] * next_n)
    return (seq_lens.long()[i // next_n] - next_n + i % next_n + 1).clamp(min=0).to(torch.int32)


# ---------------------------------------------------------------------------------------
# Section 5: prefill chunk metadata
# ---------------------------------------------------------------------------------------


def prefill_chunk_bounds(seq_lens: Tensor, query_start_loc: Tensor, token_start: int,
                         token_end: int, *, compress_ratio: int = 1, dcp_world_size: int = 1,
                         dcp_rank: int = 0, interleave: int = 1) -> dict:
    """docs/ops.md section 5 for one chunk: requests = all of seq_lens, tokens
    [token_start, token_end).

    ks = row_start(b), ke = row_start(b) + local((S[b] - query_len + 1 + o) // ratio), where
    row_start is the cumulative rank-local compressed KV length.
    """
    W, r, I = dcp_world_size, dcp_rank, interleave
    S = seq_lens.long().tolist()
    qsl = query_start_loc.long().tolist()
    kv = [s // compress_ratio for s in S]
    local_kv = [int(dcp_local_length(k, r, W, I)) for k in kv]
    cu = [0]
    local_cu = [0]
    for k, lk in zip(kv, local_kv):
        cu.append(cu[-1] + k)
        local_cu.append(local_cu[-1] + lk)
    ks, ke, tts = [], [], []
    for gt in range(token_start, token_end):
        b = next((b for b in range(len(S)) if qsl[b] <= gt < qsl[b + 1]), -1)
        if b < 0:
            ks.append(0), ke.append(0), tts.append(-1)
            continue
        o = gt - qsl[b]
        start_pos = S[b] - (qsl[b + 1] - qsl[b])
        visible = max(start_pos + 1 + o, 0) // compress_ratio
        ks.append(local_cu[b])
        ke.append(local_cu[b] + int(dcp_local_length(visible, r, W, I)))
        tts.append(b)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return dict(cu_seqlen_ks=i32(ks), cu_seqlen_ke=i32(ke), token_to_seq=i32(tts),
                cu_seq_lens=i32(cu), local_cu_seq_lens=i32(local_cu),
                total_seq_lens=cu[-1], local_total_seq_lens=local_cu[-1],
                max_local_total_seq_lens=max(
                    sum(int(dcp_local_length(k, rr, W, I)) for k in kv) for rr in range(W)))


# Section 6: DCP top-K merge
#
# A candidate is one int64 holding the bits of an unsigned 64-bit key:
#   key = (ordered(score_bits) << 32) | (~gid & 0xFFFFFFFF); key = 0 when invalid,
# ordered(u) = ~u if the sign bit is set else u | 0x80000000. Descending unsigned key
# order = score descending, then global id ascending, invalid last.
# ---------------------------------------------------------------------------------------

_U32 = 0xFFFFFFFF


def ordered_score_bits(scores: Tensor) -> Tensor:
    """fp32 scores -> int64 in [0, 2^32) whose order is the total score order."""
    u = scores.to(torch.float32).contiguous().view(torch.int32).long() & _U32
    return torch.where(u >= 2**31, ~u & _U32, u | 2**31)


def encode_candidate_keys(scores: Tensor, gids: Tensor) -> Tensor:
    """int64 keys of (fp32 score, global id) pairs; a gid outside [0, 2^31) gives key 0."""
    ordered = ordered_score_bits(scores)
    hi = torch.where(ordered >= 2**31, ordered - 2**32, ordered)  # the high word, signed
    gids = gids.long()
    key = hi * 2**32 + (~gids & _U32)  # exact: no int64 overflow
    valid = (gids >= 0) & (gids < 2**31)
    return torch.where(valid, key, torch.zeros_like(key))


def decode_candidate_gids(keys: Tensor) -> Tensor:
    """int32 global ids of keys; -1 for the invalid key 0."""
    gid = ~keys & _U32
    return torch.where(keys == 0, torch.full_like(gid, -1), gid).to(torch.int32)


def stable_topk_from_candidates(cands: Tensor, k: int, sorted: bool = False) -> Tensor:
    """int32 [rows, k] global ids of the k largest keys of each row (compared unsigned:
    score descending, then gid ascending); -1 where a row has fewer than k valid (nonzero)
    candidates. `cands` is int64 [rows, N] or the all-gathered [W, rows, K] (rank-major:
    candidate n of row i is cands[n // K, i, n % K], position n = w * K + c).

    Which candidates: the k largest keys; among copies of one key (a candidate passed
    twice) at the selection's boundary, the lowest positions. Their order: position
    ascending (the order in which they appear in the row), or with `sorted`, descending
    key order. The ids of the selected keys come first, then -1."""
    if cands.dim() == 3:
        W, rows, K = cands.shape
        cands = cands.permute(1, 0, 2).reshape(rows, W * K)
    rows, N = cands.shape
    # Unsigned order == signed order of the keys with the top bit flipped; the stable sort
    # keeps equal keys in position order, so the copies taken are the lowest positions.
    signed = cands ^ torch.iinfo(torch.int64).min
    ordered = torch.sort(signed, dim=1, descending=True, stable=True)
    keys = ordered.values[:, :k] ^ torch.iinfo(torch.int64).min
    if not sorted:
        # The selected positions in ascending order, key 0 (invalid) moved past the end.
        positions = torch.where(keys != 0, ordered.indices[:, :k], N)
        positions = torch.sort(positions, dim=1).values
        keys = torch.where(positions < N, cands.gather(1, positions.clamp(max=N - 1)), 0)
    out = torch.full((rows, k), -1, dtype=torch.int32, device=cands.device)
    out[:, : keys.shape[1]] = decode_candidate_gids(keys)
    return out


def indexer_topk(logits: Tensor, k: int, lengths: Optional[Tensor] = None) -> Tensor:
    """Per-row top-k column ids of fp32 logits [rows, L] in the same total order (score
    descending, lower column first among ties; +NaN highest, -inf low); columns >=
    lengths[row] are not candidates; -1 fills a shortfall. This is the tie rule a rank's
    local top-K must follow for the DCP merge to equal the unsharded top-K."""
    return topk_per_row(logits, k, lengths=lengths, sorted=True)


# ---------------------------------------------------------------------------------------
# Section 9: the indexer's per-row top-K
# ---------------------------------------------------------------------------------------


def row_windows(rows: int, L: int, lengths: Optional[Tensor] = None,
                seq_lens: Optional[Tensor] = None, next_n: int = 1,
                row_starts: Optional[Tensor] = None, row_ends: Optional[Tensor] = None
                ) -> tuple[Tensor, Tensor]:
    """int64 [rows] (start, end) of each row's column window, clamped into [0, L]."""
    start = torch.zeros(rows, dtype=torch.int64)
    end = torch.full((rows,), L, dtype=torch.int64)
    if lengths is not None:
        end = lengths.long()
    elif seq_lens is not None and seq_lens.dim() == 2:
        end = seq_lens.long().reshape(-1)
    elif seq_lens is not None:
        i = torch.arange(rows)
        end = seq_lens.long()[i // next_n] - next_n + i % next_n + 1
    elif row_starts is not None:
        start, end = row_starts.long(), row_ends.long()
    start = start.clamp(0, L)
    end = torch.maximum(end.clamp(max=L), start)
    return start, end


def topk_per_row(logits: Tensor, k: int, *, lengths: Optional[Tensor] = None,
                 seq_lens: Optional[Tensor] = None, next_n: int = 1,
                 row_starts: Optional[Tensor] = None, row_ends: Optional[Tensor] = None,
                 sorted: bool = False) -> Tensor:
    """int32 [rows, k] (docs/ops.md section 9): in each row's window [start, end), the k
    largest (score, lower column) pairs as the DCP merge's candidate keys (the column
    relative to start as the id), in ascending id order (the keys' position order) or
    with `sorted` descending; -1 fills a shortfall."""
    rows, L = logits.shape
    if L == 0:
        return torch.full((rows, k), -1, dtype=torch.int32)
    start, end = row_windows(rows, L, lengths, seq_lens, next_n, row_starts, row_ends)
    col = torch.arange(L).expand(rows, L)
    inside = (col >= start[:, None]) & (col < end[:, None])
    ids = torch.where(inside, col - start[:, None], torch.full_like(col, -1))
    # Inside a window the id grows with the column: position order is id order.
    return stable_topk_from_candidates(encode_candidate_keys(logits.cpu(), ids), k,
                                       sorted=sorted)


def topk_to_slots(logits: Tensor, k: int, req_id: Tensor, block_table: Tensor,
                  block_size: int, *, block_stride: Optional[int] = None,
                  compact: bool = False, **bounds) -> tuple[Tensor, Tensor]:
    """(slots int32 [rows, k], valid counts int32 [rows]): the conversion (section 2) of
    the per-row top-K ids."""
    ids = topk_per_row(logits, k, **bounds)
    return convert_req_index_to_global_index(req_id, block_table, ids, block_size,
                                             block_stride=block_stride, compact=compact)


def topk_to_candidates(logits: Tensor, k: int, rank: int, world_size: int,
                       interleave: int = 1, **bounds) -> Tensor:
    """int64 [rows, k] candidate keys (section 6a) of the per-row top-K ids, the score
    columns offset by the raw row_starts as pack_dcp_topk_candidates takes them."""
    ids = topk_per_row(logits, k, **bounds)
    return pack_dcp_topk_candidates(logits, ids, rank, world_size, interleave,
                                    bounds.get("row_starts"))


def pack_dcp_topk_candidates(logits: Tensor, topk_indices: Tensor, rank: int,
                             world_size: int, interleave: int = 1,
                             row_starts: Optional[Tensor] = None) -> Tensor:
    """int64 [rows, K] candidate keys of a rank's local top-K (docs/ops.md section 6a)."""
    rows, cols = logits.shape
    local = topk_indices.long()
    start = 0 if row_starts is None else row_starts.long()[:, None]
    col = (local + start).clamp(0, max(cols - 1, 0))
    if cols:
        score = logits.gather(1, col)
    else:
        score = torch.zeros(local.shape, dtype=torch.float32, device=logits.device)
    gid = dcp_global_position(local, rank, world_size, interleave)
    valid = (local >= 0) & (cols > 0)
    return encode_candidate_keys(score, torch.where(valid, gid, torch.full_like(gid, -1)))


def merge_topk_global(logits: list, topk_indices: list, k: int, interleave: int = 1,
                      row_starts: Optional[list] = None, sorted: bool = False) -> Tensor:
    """int32 [rows, K] that every rank's ``topk_indices`` holds after the DCP merge
    (docs/ops.md section 6d): rank r's local logits ``logits[r]`` and local top-K ``topk_indices[r]`` [rows, K]
    are packed, stacked rank-major ([W, rows, K], as all-gathered) and the k best kept
    (in the order of :func:`stable_topk_from_candidates`); columns k.. are -1. With one
    rank the local ids are returned unchanged."""
    world = len(logits)
    if world == 1:
        return topk_indices[0].clone()
    starts = row_starts if row_starts is not None else [None] * world
    gathered = torch.stack([pack_dcp_topk_candidates(logits[r], topk_indices[r], r, world,
                                                     interleave, starts[r])
                            for r in range(world)])
    out = torch.full(topk_indices[0].shape, -1, dtype=torch.int32, device=gathered.device)
    out[:, :k] = stable_topk_from_candidates(gathered, k, sorted)
    return out


# ---------------------------------------------------------------------------------------
# Section 7: DCP attention output merge (LSE)
# ---------------------------------------------------------------------------------------


def correct_attention_output(partial: Tensor, lses: Tensor, rank: int,
                             lse_base: float = 2.0) -> tuple[Tensor, Tensor]:
    """This rank's weighted partial outputs [W, B, H/W, D] (head-block-major, the dtype
    of `partial`) and the global LSE G [B, H] (fp32, base `lse_base`), computed in fp64.

    partial [B, H, D] over this rank's KV shard; lses [W, B, H] of every rank."""
    W, B, H = lses.shape
    D = partial.shape[2]
    base2 = lse_base == 2.0
    lse = lses.double()
    lse = torch.where(torch.isnan(lse) | (lse == float("inf")),
                      torch.full_like(lse, float("-inf")), lse)
    m = lse.max(dim=0).values
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    exp = torch.exp2 if base2 else torch.exp
    log = torch.log2 if base2 else torch.log
    g = m + log(exp(lse - m).sum(dim=0))
    diff = lse[rank] - g
    factor = torch.where(torch.isnan(diff), torch.zeros_like(diff), exp(diff))
    weighted = partial.double() * factor[:, :, None]
    weighted = torch.where(factor[:, :, None] == 0, torch.zeros_like(weighted), weighted)
    corrected = weighted.to(partial.dtype).reshape(B, W, H // W, D).permute(1, 0, 2, 3)
    return corrected.contiguous(), g.float()


def merge_attention_outputs(partials: list, lses: list, lse_base: float = 2.0
                            ) -> tuple[list, list]:
    """Every rank's merged output [B, H/W, D] and LSE slice [B, H/W] (docs/ops.md section
    7), from all ranks' partial outputs [B, H, D] and LSEs [B, H]; the reduction runs in
    fp64."""
    W = len(partials)
    stacked = torch.stack(lses)
    parts = [correct_attention_output(p, stacked, r, lse_base) for r, p in enumerate(partials)]
    total = sum(c.double() for c, _ in parts)  # [W, B, H/W, D]
    g = parts[0][1]
    Hl = g.shape[1] // W
    outs = [total[r].to(partials[0].dtype) for r in range(W)]
    return outs, [g[:, r * Hl:(r + 1) * Hl] for r in range(W)]
