"""Indexer metadata (docs/ops.md sections 4 and 5): the decode-path table for speculative
decoding, the prefill chunk planner and the builder that owns the capacity buffers. The
device ops it runs are in :mod:`dsa_ext.seq_lens`.

Every device step here is a dsa_ext op (CPU + CUDA, bit-identical) or plain torch work on
device tensors: nothing reads device data back to the host, so a decode build is
CUDA-graph capturable. A prefill build reads the request sizes back at most once (to
chunk them), and not at all when the caller passes host copies it already has.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from . import _checks, _native, mqa_logits

Tensor = torch.Tensor
logger = logging.getLogger("dsa_ext")

# ---------------------------------------------------------------------------------------
# Decode path: native next_n or flattened (one table, one place to extend)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodePathRule:
    """Which next_n the paged MQA logits kernel handles natively on a device family.

    ``native_next_n=None`` means every next_n; ``declarable_next_n`` are native only when
    the kernel build declares them (``kernel_declares_next_n_4``); ``fp4_native_next_n``
    overrides ``native_next_n`` with an FP4 indexer cache (``...`` = same).
    """
    family: str
    majors: tuple  # compute-capability majors of the family; () = every other device
    native_next_n: Optional[frozenset]
    declarable_next_n: frozenset = frozenset()
    fp4_native_next_n: object = ...


#: First matching rule wins; the last rule (majors=()) is the default.
DECODE_PATH_RULES: tuple[DecodePathRule, ...] = (
    # SM100 family (B200/GB200/B300): any next_n, FP8 or FP4 cache (multi-atom split).
    DecodePathRule("sm100 family", (10,), None),
    # SM90 (H100/H200): next_n in {1, 2}; 4 where the kernel build declares it. DeepGEMM
    # since 7f2a703 (2.x, 54e2261 included) asserts next_n in {1, 2} on sm_90; builds
    # before it instantiate any next_n there (vLLM's notes: {1, 2, 4}).
    DecodePathRule("sm90", (9,), frozenset({1, 2}), frozenset({4})),
    DecodePathRule("other", (), frozenset({1, 2})),
)

_LOGGED_DECISIONS: set = set()


def decode_path(capability_major_minor: Sequence[int], next_n: int,
                fp4_indexer_cache: bool = False,
                kernel_declares_next_n_4: bool = False) -> str:
    """``"native"`` if the paged MQA logits kernel takes ``next_n`` query tokens per request
    on this device, else ``"flatten"`` (B x next_n single-token pseudo-requests).

    Table-driven (:data:`DECODE_PATH_RULES`); each distinct decision is logged once on the
    ``dsa_ext`` logger at INFO.

    Example::

        >>> dsa_ext.decode_path((9, 0), 4), dsa_ext.decode_path((10, 0), 4)
        ('flatten', 'native')
    """
    try:
        major, minor = (int(v) for v in capability_major_minor)
    except (TypeError, ValueError):
        raise ValueError("capability_major_minor must be (major, minor), got "
                         f"{capability_major_minor!r}") from None
    _checks.integer("next_n", next_n, 1)
    rule = next(r for r in DECODE_PATH_RULES if not r.majors or major in r.majors)
    native = rule.native_next_n
    if fp4_indexer_cache and rule.fp4_native_next_n is not ...:
        native = rule.fp4_native_next_n
    if native is None:
        path = "native"
    else:
        allowed = set(native) | (set(rule.declarable_next_n) if kernel_declares_next_n_4 else set())
        path = "native" if next_n in allowed else "flatten"
    key = (major, minor, next_n, bool(fp4_indexer_cache), bool(kernel_declares_next_n_4), path)
    if key not in _LOGGED_DECISIONS:
        _LOGGED_DECISIONS.add(key)
        logger.info("DSA indexer decode path: %s (sm_%d%d, %s rule, next_n=%d, "
                    "fp4_indexer_cache=%s, kernel_declares_next_n_4=%s)", path, major, minor,
                    rule.family, next_n, fp4_indexer_cache, kernel_declares_next_n_4)
    return path


def _local_length(length: int, rank: int, world_size: int, interleave: int) -> int:
    """The DCP local length (docs/ops.md section 1) of one host int: the host-side sizes
    of the chunk plans and totals (the device computes the same rule in dcp_math.h)."""
    length = max(length, 0)
    base = (length // (interleave * world_size)) * interleave
    return base + min(max(length - base * world_size - rank * interleave, 0), interleave)


# ---------------------------------------------------------------------------------------
# Prefill chunking (host: works on the one host copy of the sizes)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillChunkPlan:
    """One chunk: requests [req_start, req_end), flat tokens [token_start, token_end)."""
    req_start: int
    req_end: int
    token_start: int
    token_end: int
    skip_kv_gather: bool  # a later query slice of a split request: its KV is gathered


def plan_prefill_chunks(seq_lens: Sequence[int], query_start_loc: Sequence[int], *,
                        max_kv_workspace: int, max_logits_bytes: int, compress_ratio: int = 1,
                        dcp_world_size: int = 1, interleave: int = 1
                        ) -> list[PrefillChunkPlan]:
    """Greedy chunking of prefill requests (host lists, no device work).

    A request's KV columns are its compressed length localized on rank 0, the largest
    share of any rank, so every rank plans the same chunks. A chunk takes requests while
    its KV columns stay ``<= max_kv_workspace`` and ``rows x KV columns x 4 bytes <=
    max_logits_bytes``. A request whose logits do not fit alone gets its own chunk(s),
    split on the query dimension into slices of ``max(1, max_logits_bytes // (4 * kv))``
    rows; slices after the first have ``skip_kv_gather=True``. Requests without query
    tokens get no chunk of their own (a batch of only such requests plans none).

    Raises:
        ValueError if one request's KV columns exceed ``max_kv_workspace`` (no split on
        the query dimension makes its KV fit the workspace), if ``query_start_loc`` does
        not hold ``len(seq_lens) + 1`` non-negative, non-decreasing offsets, or for a
        budget, ratio, world size or interleave below its minimum (TypeError for a
        non-integer one).
    """
    P = len(seq_lens)
    if len(query_start_loc) != P + 1:
        raise ValueError(f"query_start_loc must have len(seq_lens) + 1 = {P + 1} entries, "
                         f"got {len(query_start_loc)}")
    if query_start_loc[0] < 0 or any(query_start_loc[b + 1] < query_start_loc[b]
                                     for b in range(P)):
        raise ValueError("query_start_loc must be >= 0 and non-decreasing, got "
                         f"{list(query_start_loc)}")
    _checks.integer("max_kv_workspace", max_kv_workspace, 1, None)
    _checks.integer("max_logits_bytes", max_logits_bytes, 4, None)
    _checks.integer("compress_ratio", compress_ratio, 1)
    _checks.integer("dcp_world_size", dcp_world_size, 1)
    _checks.integer("interleave", interleave, 1)
    W, I = dcp_world_size, interleave
    plans: list[PrefillChunkPlan] = []
    start, kv_cols, rows = 0, 0, 0

    def close(end: int) -> None:
        # A chunk without query tokens has no logits rows to compute: none is planned.
        if query_start_loc[end] > query_start_loc[start]:
            plans.append(PrefillChunkPlan(start, end, query_start_loc[start],
                                          query_start_loc[end], False))

    for b in range(P):
        kv = _local_length(seq_lens[b] // compress_ratio, 0, W, I)
        q = query_start_loc[b + 1] - query_start_loc[b]
        if kv > max_kv_workspace:
            raise ValueError(f"max_kv_workspace ({max_kv_workspace}) must hold the KV of "
                             f"every request: request {b} needs {kv} (local, compressed)")
        if (kv_cols + kv <= max_kv_workspace
                and (rows + q) * (kv_cols + kv) * 4 <= max_logits_bytes):
            kv_cols, rows = kv_cols + kv, rows + q
            continue
        close(b)
        start, kv_cols, rows = b, kv, q
        if q * kv * 4 <= max_logits_bytes:
            continue
        # Logits too large: its own chunk, split on the query dimension.
        step = max(1, max_logits_bytes // (4 * max(kv, 1)))
        t0, t1 = query_start_loc[b], query_start_loc[b + 1]
        for s in range(t0, max(t1, t0 + 1), step):
            plans.append(PrefillChunkPlan(b, b + 1, s, min(s + step, t1), s > t0))
        start, kv_cols, rows = b + 1, 0, 0
    close(P)
    return plans


@dataclass
class PrefillChunkMetadata:
    """Metadata of one prefill chunk (docs/ops.md section 5), on the builder's device."""
    req_start: int
    req_end: int
    num_reqs: int
    token_start: int
    token_end: int
    skip_kv_gather: bool
    cu_seqlen_ks: Tensor       # int32 [token_end - token_start]
    cu_seqlen_ke: Tensor       # int32 [token_end - token_start]
    token_to_seq: Tensor       # int32 [token_end - token_start], chunk-local request
    cu_seq_lens: Tensor        # int32 [num_reqs + 1], global compressed KV lengths
    local_cu_seq_lens: Tensor  # int32 [num_reqs + 1], this rank's share
    total_seq_lens: int
    local_total_seq_lens: int
    max_local_total_seq_lens: int  # max over ranks: every rank sizes buffers alike


# ---------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------


@dataclass
class DecodeMetadata:
    """Everything the paged MQA logits kernel and the top-k after it take for a decode batch.

    ``context_lens`` is what the kernel takes: DCP-local (this rank's KV shard) lengths,
    ``[B, next_n]`` on the native path, ``[B * next_n, 1]`` flattened (ragged batches are
    always flattened: ``[Td, 1]``). ``global_context_lens`` has the same layout, unsharded.
    """
    path: str                     # "native" or "flatten"
    next_n: int
    num_reqs: int
    num_tokens: int
    context_lens: Tensor          # int32, see above
    global_context_lens: Tensor   # int32, same layout
    seq_lens_per_token: Tensor    # int32 [Td], global (the LSE merge needs them)
    row_ends: Tensor              # int32 [Td]: top-k bounds over this rank's logits columns
    row_map: Tensor               # int32 [Td]: block-table row of each token (-1: none)
    block_table: Tensor           # native: table[:B]; flatten: table, or materialized rows
    block_table_is_per_token: bool
    max_context_len: int          # host int: logits columns (this rank's share of max_model_len)
    schedule_metadata: Optional[Tensor] = field(default=None)


class IndexerMetadataBuilder:
    """Decides the decode path once, owns capacity buffers, builds indexer metadata.

    Args:
        device: a torch device (its capability picks the decode path; the CPU counts as
            "other") — or pass ``capability`` explicitly.
        next_n: 1 + number of speculative tokens (``reorder_batch_threshold = next_n``).
        block_size: KV block size (tokens per block).
        max_num_reqs: most decode requests per batch.
        max_model_len: longest sequence; ``max_context_len`` (the logits columns) is this
            rank's share of ``max_model_len // compress_ratio``.
        dcp_world_size, dcp_rank, interleave: DCP layout (``block_size % interleave == 0``).
        compress_ratio: lengths //= ratio (1 = none).
        fp4_indexer_cache, kernel_declares_next_n_4: decode-path table inputs.
        materialize_block_table: on flattened builds, also copy each token's block-table
            row into a ``[max_num_reqs * next_n, NB]`` buffer (DeepGEMM reads a table; a
            kernel that takes the row map needs no copy).
        max_kv_workspace: prefill KV-workspace budget in (local, compressed) KV entries.
        max_logits_bytes: prefill logits budget, rows x KV columns x 4 bytes.
        deep_gemm_schedule: also compute DeepGEMM's ``get_paged_mqa_logits_metadata``
            schedule in ``build_decode`` (needs deep_gemm; ``block_size`` is its block_kv).

    Example::

        >>> b = IndexerMetadataBuilder("cuda", next_n=4, block_size=64, max_num_reqs=256,
        ...                            max_model_len=131072, dcp_world_size=4, dcp_rank=1)
        >>> md = b.build_decode(seq_lens, qsl, block_table, 256, 1024, uniform=True)
    """

    def __init__(self, device, next_n: int, block_size: int, max_num_reqs: int,
                 max_model_len: int, *, dcp_world_size: int = 1, dcp_rank: int = 0,
                 interleave: int = 1, compress_ratio: int = 1,
                 fp4_indexer_cache: bool = False, kernel_declares_next_n_4: bool = False,
                 capability: Optional[Sequence[int]] = None,
                 materialize_block_table: bool = False, deep_gemm_schedule: bool = False,
                 max_kv_workspace: int = 1 << 18, max_logits_bytes: int = 1 << 30):
        self.device = _native.resolve_device(device)
        _checks.integer("next_n", next_n, 1)
        _checks.integer("block_size", block_size, 1)
        _checks.integer("max_num_reqs", max_num_reqs, 1)
        _checks.integer("max_model_len", max_model_len, 1)
        _checks.integer("compress_ratio", compress_ratio, 1)
        _checks.integer("max_kv_workspace", max_kv_workspace, 1, None)
        _checks.integer("max_logits_bytes", max_logits_bytes, 4, None)
        _checks.dcp_layout(dcp_world_size, dcp_rank, interleave, block_size)
        if capability is None:
            capability = (torch.cuda.get_device_capability(self.device)
                          if self.device.type == "cuda" else (0, 0))
        self.capability = tuple(capability)
        self.next_n, self.block_size = next_n, block_size
        self.max_num_reqs, self.max_model_len = max_num_reqs, max_model_len
        self.world, self.rank, self.interleave = dcp_world_size, dcp_rank, interleave
        self.compress_ratio = compress_ratio
        self.max_kv_workspace, self.max_logits_bytes = max_kv_workspace, max_logits_bytes
        self.reorder_batch_threshold = next_n
        self.path = decode_path(self.capability, next_n, fp4_indexer_cache,
                                kernel_declares_next_n_4)
        # Logits columns: this rank's share of the longest (compressed) context, which bounds
        # every local context length the builder gives this rank.
        self.max_context_len = _local_length(max_model_len // compress_ratio, dcp_rank,
                                             dcp_world_size, interleave)
        cap = max_num_reqs * next_n
        i32 = dict(dtype=torch.int32, device=self.device)
        self._global = torch.zeros(cap, **i32)
        self._local = torch.zeros(cap, **i32)
        self._row_map = torch.full((cap,), -1, **i32)
        self._views: dict = {}  # (B, Td, native) -> views of the buffers
        self._table = None
        if materialize_block_table:  # ragged batches are flattened on every path
            self._table = torch.zeros(cap, -(-max_model_len // block_size), **i32)
        self._schedule = deep_gemm_schedule
        if deep_gemm_schedule and (self.device.type != "cuda" or mqa_logits.deep_gemm() is None):
            raise ValueError("deep_gemm_schedule=True needs a CUDA device and deep_gemm "
                             "with get_paged_mqa_logits_metadata")

    # -- decode ------------------------------------------------------------------------

    def build_decode(self, seq_lens: Tensor, query_start_loc: Optional[Tensor],
                     block_table: Tensor, num_decode_reqs: int, num_decode_tokens: int,
                     uniform: bool) -> DecodeMetadata:
        """Decode metadata with no host read (sizes are the caller's host ints).

        Args:
            seq_lens: int32 ``[>= num_decode_reqs]`` (decode requests first).
            query_start_loc: int32 ``[>= num_decode_reqs + 1]``; may be None if uniform.
            block_table: int32 ``[>= num_decode_reqs, NB]``.
            num_decode_reqs, num_decode_tokens: host ints B and Td.
            uniform: every decode request has exactly ``next_n`` tokens
                (``Td == B * next_n``); else ragged (always flattened).
        """
        B, Td, n = num_decode_reqs, num_decode_tokens, self.next_n
        _checks.integer("num_decode_reqs", num_decode_reqs, 0, self.max_num_reqs)
        _checks.integer("num_decode_tokens", num_decode_tokens, 0, self.max_num_reqs * n)
        _checks.tensor("seq_lens", seq_lens, torch.int32, 1, self.device)
        _checks.dim_at_least("seq_lens", seq_lens, 0, B)
        _checks.tensor("block_table", block_table, torch.int32, 2, self.device)
        _checks.dim_at_least("block_table", block_table, 0, B)
        if uniform:
            if Td != B * n:
                raise ValueError(f"num_decode_tokens must be num_decode_reqs * next_n = "
                                 f"{B * n} for a uniform batch, got {Td}")
            query_start_loc = None
        else:
            if query_start_loc is None:
                raise ValueError("query_start_loc is required for a ragged batch")
            _checks.tensor("query_start_loc", query_start_loc, torch.int32, 1, self.device)
            _checks.same_length("query_start_loc", query_start_loc, "num_decode_reqs plus one",
                                B + 1, at_least=True)
        # One launch: global and local per-token lengths and the row map, into the
        # capacity buffers (the views below are cached: slicing costs host time).
        _native.call("expand_decode_seq_lens", seq_lens, B, query_start_loc, n, Td, self.compress_ratio,
                     self.rank, self.world, self.interleave, self._global, self._local,
                     self._row_map)
        native = uniform and self.path == "native"
        glob, local, row_map, glob_2d, local_2d = self._decode_views(B, Td, native)
        table, per_token = (block_table[:B] if block_table.shape[0] != B else block_table), False
        if not native and self._table is not None and Td:
            nb = min(block_table.shape[1], self._table.shape[1])
            rows = self._table[:Td, :nb]
            if B:
                rows.copy_(torch.index_select(block_table[:B, :nb], 0, row_map.clamp(min=0)))
            table, per_token = rows, True
        schedule = None
        if self._schedule and Td:
            schedule = mqa_logits.paged_mqa_logits_schedule(local_2d, self.block_size)
        return DecodeMetadata(
            path="native" if native else "flatten", next_n=n, num_reqs=B, num_tokens=Td,
            context_lens=local_2d, global_context_lens=glob_2d, seq_lens_per_token=glob,
            row_ends=local, row_map=row_map,
            block_table=table, block_table_is_per_token=per_token,
            max_context_len=self.max_context_len, schedule_metadata=schedule)

    def _decode_views(self, B: int, Td: int, native: bool) -> tuple:
        key = (B, Td, native)
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 4096:
                self._views.clear()
            shape = (B, self.next_n) if native else (Td, 1)
            glob, local, row_map = self._global[:Td], self._local[:Td], self._row_map[:Td]
            views = self._views[key] = (glob, local, row_map, glob.view(shape),
                                        local.view(shape))
        return views

    # -- prefill -----------------------------------------------------------------------

    def build_prefill(self, seq_lens: Tensor, query_start_loc: Tensor, *,
                      seq_lens_cpu: Optional[Sequence[int]] = None,
                      query_start_loc_cpu: Optional[Sequence[int]] = None
                      ) -> list[PrefillChunkMetadata]:
        """Prefill chunk metadata (docs/ops.md section 5).

        Args:
            seq_lens: int32 ``[P]`` of the prefill requests.
            query_start_loc: int32 ``[P + 1]`` flat token starts of those requests (the
                first need not be 0; token_start/token_end use the same numbering).
            seq_lens_cpu, query_start_loc_cpu: host copies the caller already has; without
                them the sizes are read back once (the only host read of a build).

        Returns:
            One :class:`PrefillChunkMetadata` per chunk (see :func:`plan_prefill_chunks`).
        """
        _checks.tensor("seq_lens", seq_lens, torch.int32, 1, self.device)
        P = seq_lens.shape[0]
        _checks.tensor("query_start_loc", query_start_loc, torch.int32, 1, self.device)
        _checks.shape("query_start_loc", query_start_loc, (P + 1,))
        if seq_lens_cpu is None or query_start_loc_cpu is None:
            host = torch.cat([seq_lens, query_start_loc]).cpu().tolist()  # the one read
            seq_lens_cpu, query_start_loc_cpu = host[:P], host[P:]
        S, qsl = [int(v) for v in seq_lens_cpu], [int(v) for v in query_start_loc_cpu]
        if len(S) != P or len(qsl) != P + 1:
            raise ValueError("seq_lens_cpu / query_start_loc_cpu must have P and P + 1 "
                             f"entries like seq_lens (P = {P})")
        W, r, I, ratio = self.world, self.rank, self.interleave, self.compress_ratio
        plans = plan_prefill_chunks(S, qsl, max_kv_workspace=self.max_kv_workspace,
                                    max_logits_bytes=self.max_logits_bytes,
                                    compress_ratio=ratio, dcp_world_size=W, interleave=I)
        chunks = []
        i32 = dict(dtype=torch.int32, device=self.device)
        for p in plans:
            # The arguments were checked above: the chunk's ops are called directly.
            s_dev = seq_lens[p.req_start:p.req_end]
            kv = torch.div(s_dev, ratio, rounding_mode="floor")
            local_kv = torch.empty_like(kv)
            _native.call("dcp_local_seq_lens", kv, r, W, I, local_kv)
            zero = torch.zeros(1, **i32)
            cu = torch.cat([zero, kv.cumsum(0, dtype=torch.int32)])
            local_cu = torch.cat([zero, local_kv.cumsum(0, dtype=torch.int32)])
            n = p.token_end - p.token_start
            ks, ke, tts = torch.empty(n, **i32), torch.empty(n, **i32), torch.empty(n, **i32)
            _native.call("prefill_chunk_bounds", s_dev,
                         query_start_loc[p.req_start:p.req_end + 1], local_cu, p.token_start,
                         p.token_end, ratio, r, W, I, ks, ke, tts)
            kv_host = [s // ratio for s in S[p.req_start:p.req_end]]
            chunks.append(PrefillChunkMetadata(
                req_start=p.req_start, req_end=p.req_end, num_reqs=p.req_end - p.req_start,
                token_start=p.token_start, token_end=p.token_end,
                skip_kv_gather=p.skip_kv_gather, cu_seqlen_ks=ks, cu_seqlen_ke=ke,
                token_to_seq=tts, cu_seq_lens=cu, local_cu_seq_lens=local_cu,
                total_seq_lens=sum(kv_host),
                local_total_seq_lens=sum(_local_length(k, r, W, I) for k in kv_host),
                max_local_total_seq_lens=max(
                    sum(_local_length(k, rr, W, I) for k in kv_host) for rr in range(W))))
        return chunks
