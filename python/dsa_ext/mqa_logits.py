"""Paged MQA logits of the indexer (docs/ops.md section 8): DeepGEMM's kernel when it is
installed, else the same math in plain torch.

DeepGEMM is an optional run-time dependency (the caller's, built with its own JIT): it is
looked up once per process (a failing import is not retried). Both API generations are
taken: ``fp8_fp4_paged_mqa_logits`` (DeepGEMM 2.x, q passed as ``(q, None)``) and the
older ``fp8_paged_mqa_logits``, each with ``get_paged_mqa_logits_metadata``.

The KV cache is in DeepGEMM's fused FP8 layout, or as separate values and scales for the
torch path: :func:`pack_fp8_kv_cache` and :func:`unpack_fp8_kv_cache` convert (both are
views or copies, no host sync).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _checks

Tensor = torch.Tensor

#: Bytes of the per-token fp32 scale that follows each block's fp8 values.
SCALE_BYTES = 4
#: Largest finite float8_e4m3fn value: quantize_fp8_kv_cache scales each token's amax to it.
FP8_E4M3_MAX = 448.0


@functools.lru_cache(maxsize=None)
def deep_gemm():
    """The deep_gemm module if it is importable and has the paged MQA logits API
    (``fp8_fp4_paged_mqa_logits`` or ``fp8_paged_mqa_logits``, and
    ``get_paged_mqa_logits_metadata``), else None (resolved once)."""
    try:
        import deep_gemm as module  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - absent or broken: use the torch fallback
        return None
    has_kernel = (hasattr(module, "fp8_fp4_paged_mqa_logits")
                  or hasattr(module, "fp8_paged_mqa_logits"))
    if has_kernel and hasattr(module, "get_paged_mqa_logits_metadata"):
        return module
    return None


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (read once per device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_mqa_logits_schedule(context_lens: Tensor, block_size: int) -> Tensor:
    """DeepGEMM's work split of one batch, ``get_paged_mqa_logits_metadata(context_lens,
    block_size, num_sms)``: int32 ``[num_sms + 1, 2]`` on the device, no host read.

    ``context_lens`` is the kernel's int32 ``[N, n]`` (contiguous); ``block_size`` is the
    KV block size (DeepGEMM's block_kv: 64 on sm_90, 32 or 64 on sm_100). ``num_sms`` is
    DeepGEMM's own setting (``deep_gemm.get_num_sms()``, which its kernel checks the
    schedule's size against) where it has one, else the device's.

    Raises:
        ValueError if deep_gemm is not importable.
    """
    dg = deep_gemm()
    if dg is None:
        raise ValueError("paged_mqa_logits_schedule needs deep_gemm with "
                         "get_paged_mqa_logits_metadata, which is not importable")
    return _schedule(dg, context_lens, block_size)


def _schedule(dg, context_lens: Tensor, block_size: int) -> Tensor:
    sms = dg.get_num_sms() if hasattr(dg, "get_num_sms") else num_sms(context_lens.device)
    return dg.get_paged_mqa_logits_metadata(context_lens.contiguous(), block_size, sms)


# ---------------------------------------------------------------------------------------
# The fused FP8 KV-cache layout
# ---------------------------------------------------------------------------------------


def pack_fp8_kv_cache(kv: Tensor, kv_scale: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """DeepGEMM's fused FP8 KV cache from values and per-token scales.

    ``kv`` float8_e4m3fn ``[num_blocks, block_size, D]`` and ``kv_scale`` fp32
    ``[num_blocks, block_size]`` -> uint8 ``[num_blocks, block_size, 1, D + 4]``: each
    block's bytes are its ``block_size * D`` fp8 values (token-major), then its
    ``block_size`` fp32 scales. (The 4-D shape is DeepGEMM's view of those bytes: row
    ``t`` of a block does not hold token ``t``'s scale.) ``out`` may be given.
    """
    _checks.tensor("kv", kv, torch.float8_e4m3fn, 3)
    nb, bs, D = kv.shape
    _checks.tensor("kv_scale", kv_scale, torch.float32, 2, kv.device)
    _checks.shape("kv_scale", kv_scale, (nb, bs))
    out = _checks.output("out", out, torch.uint8, (nb, bs, 1, D + SCALE_BYTES), kv.device)
    flat = out.view(nb, bs * (D + SCALE_BYTES))
    flat[:, :bs * D].copy_(kv.reshape(nb, bs * D).view(torch.uint8))
    flat[:, bs * D:].copy_(kv_scale.reshape(nb, bs).view(torch.uint8))
    return out


def unpack_fp8_kv_cache(kv_cache: Tensor) -> tuple[Tensor, Tensor]:
    """Views of a fused FP8 KV cache (:func:`pack_fp8_kv_cache`): the values
    float8_e4m3fn ``[num_blocks, block_size, D]`` and the scales fp32
    ``[num_blocks, block_size]``. ``kv_cache`` must be contiguous."""
    _checks.tensor("kv_cache", kv_cache, torch.uint8, 4)
    nb, bs, heads, width = kv_cache.shape
    if heads != 1 or width <= SCALE_BYTES or not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be a contiguous fused FP8 cache [num_blocks, "
                         f"block_size, 1, D + 4], got shape {tuple(kv_cache.shape)} and "
                         f"strides {kv_cache.stride()}")
    D = width - SCALE_BYTES
    flat = kv_cache.view(nb, bs * width)
    values = flat[:, :bs * D].view(torch.float8_e4m3fn).view(nb, bs, D)
    scales = flat[:, bs * D:].view(torch.float32)
    return values, scales


def quantize_fp8_kv_cache(x: Tensor) -> Tensor:
    """A fused FP8 KV cache of float keys ``x [num_blocks, block_size, D]``: each token is
    scaled by ``max(amax, 1e-4) / 448`` into float8_e4m3fn (the indexer's per-token
    quantization) and packed with :func:`pack_fp8_kv_cache`."""
    _checks.tensor("x", x, None, 3)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    scale = x.abs().float().amax(dim=-1).clamp(min=1e-4) / FP8_E4M3_MAX
    values = (x.float() / scale[..., None]).to(torch.float8_e4m3fn)
    return pack_fp8_kv_cache(values, scale)


# ---------------------------------------------------------------------------------------
# The logits
# ---------------------------------------------------------------------------------------


def _deep_gemm_refusal(q: Tensor, kv_cache: Tensor, weights: Tensor) -> Optional[str]:
    """Why the inputs cannot go to DeepGEMM (None: they can)."""
    if not q.is_cuda:
        return "the inputs are not on a CUDA device"
    if q.dtype is not torch.float8_e4m3fn:
        return f"q must be float8_e4m3fn for it, got {q.dtype}"
    if kv_cache.dim() != 4:
        return "kv_cache must be the fused 4-D uint8 layout for it (pack_fp8_kv_cache)"
    if weights.dtype is not torch.float32:
        return f"weights must be float32 for it, got {weights.dtype}"
    return None


def paged_mqa_logits(q: Tensor, kv_cache: Tensor, kv_scale: Optional[Tensor], weights: Tensor,
                     context_lens: Tensor, block_table: Tensor, max_context_len: int, *,
                     row_map: Optional[Tensor] = None,
                     schedule_metadata: Optional[Tensor] = None,
                     use_deep_gemm: Optional[bool] = None) -> Tensor:
    """Indexer logits over a paged KV cache, for native or flattened decode batches.

    Shapes: ``N`` query groups of ``n`` tokens (native: ``N = B``, ``n = next_n``;
    flattened: ``N = B * next_n``, ``n = 1``), ``H`` heads, head dim ``D``::

        q            [N, n, H, D]    fp8 (float8_e4m3fn) or fp32/bf16
        kv_cache     fused FP8 cache uint8 [num_blocks, block_size, 1, D + 4]
                     (pack_fp8_kv_cache; kv_scale must be None), or values
                     [num_blocks, block_size, D] (fp8, fp32 or bf16) with kv_scale fp32
                     [num_blocks, block_size] per-token scales (None = 1)
        weights      [N * n, H]      fp32 per-head weights
        context_lens [N, n]          int32 (what :class:`IndexerMetadataBuilder` returns)
        block_table  [R, NB]         int32; the table row of group g is ``row_map[g]``
                                     when ``row_map`` is given, else ``g``

    Output ``logits`` fp32 ``[N * n, max_context_len]`` (DeepGEMM's rows are padded: the
    row stride may exceed max_context_len); row ``i = g * n + j``::

        logits[i, p] = sum_h relu(q[g, j, h] . k[p] * kv_scale[p]) * weights[i, h]  p < ctx
                     = -inf                                                         p >= ctx
        with k[p] = kv_cache[block_table[row, p // block_size], p % block_size],
        ctx = context_lens[g, j].

    Both layouts of one batch give identical logits row for row. DeepGEMM computes it when
    it is importable and ``use_deep_gemm`` is not False, for fp8 ``q``, fp32 ``weights``
    and the fused cache on CUDA; its own limits apply (on sm_90: ``n`` in {1, 2}, ``H`` in
    {32, 64}, ``block_size`` 64; it raises otherwise) and it reads the table rows of
    positions ``< ctx`` unchecked. ``schedule_metadata`` is its
    :func:`paged_mqa_logits_schedule` of ``context_lens`` (computed here when None). The
    torch path reads a block id outside ``[0, num_blocks)`` as -inf logits.

    Raises:
        ValueError for mismatched shapes, a ``kv_scale`` beside a fused cache, or
        ``use_deep_gemm=True`` with DeepGEMM absent or inputs it does not take.
    """
    N, n, H, D = q.shape
    _checks.shape("context_lens", context_lens, (N, n))
    _checks.shape("weights", weights, (N * n, H))
    fused = kv_cache.dim() == 4
    if fused:
        if kv_scale is not None:
            raise ValueError("kv_scale must be None with a fused kv_cache (its scales are "
                             f"inside it), got a tensor of shape {tuple(kv_scale.shape)}")
        if kv_cache.shape[2:] != (1, D + SCALE_BYTES):
            raise ValueError(f"kv_cache must have shape [num_blocks, block_size, 1, {D + 4}] "
                             f"for head dim {D}, got {tuple(kv_cache.shape)}")
    dg = deep_gemm() if use_deep_gemm is not False else None
    refusal = "deep_gemm (with the paged MQA logits API) is not importable" if dg is None \
        else _deep_gemm_refusal(q, kv_cache, weights)
    if refusal is None:
        return _deep_gemm_logits(dg, q, kv_cache, weights, context_lens, block_table,
                                 max_context_len, row_map, schedule_metadata)
    if use_deep_gemm:
        raise ValueError(f"use_deep_gemm=True but {refusal}")
    if fused:
        kv_cache, kv_scale = unpack_fp8_kv_cache(kv_cache)
    num_blocks, block_size = kv_cache.shape[:2]
    rows = torch.arange(N, device=q.device) if row_map is None else row_map.long().clamp(min=0)
    p = torch.arange(max_context_len, device=q.device)
    blk_idx = p // block_size
    in_table = blk_idx < block_table.shape[1]  # past the table: no block, -inf
    blk_idx = blk_idx.clamp(max=block_table.shape[1] - 1)
    blocks = block_table[rows][:, blk_idx].long()                      # [N, P]
    valid_block = (blocks >= 0) & (blocks < num_blocks) & in_table
    blocks = torch.where(valid_block, blocks, torch.zeros_like(blocks))
    # 1-byte kinds (fp8) are gathered through a uint8 view: torch before 2.5 has no CPU
    # index kernel for fp8.
    raw = kv_cache.view(torch.uint8) if kv_cache.element_size() == 1 else kv_cache
    k = raw[blocks, p % block_size].view(kv_cache.dtype).float()       # [N, P, D]
    if kv_scale is not None:
        k = k * kv_scale[blocks, p % block_size].float()[..., None]
    scores = torch.einsum("gjhd,gpd->gjhp", q.float(), k).relu()        # [N, n, H, P]
    logits = (scores * weights.view(N, n, H, 1).float()).sum(dim=2)     # [N, n, P]
    ctx = context_lens.long()[..., None]
    logits = torch.where((p < ctx) & valid_block[:, None, :], logits,
                         torch.full_like(logits, float("-inf")))
    return logits.reshape(N * n, max_context_len)


def _deep_gemm_logits(dg, q, kv_cache, weights, context_lens, block_table, max_context_len,
                      row_map, schedule_metadata) -> Tensor:
    """DeepGEMM's kernel, then -inf from each row's length on."""
    N, n = context_lens.shape
    context_lens = context_lens.contiguous()
    # DeepGEMM reads one table row per query group.
    table = block_table if row_map is None else block_table.index_select(0, row_map.clamp(min=0))
    if schedule_metadata is None:
        schedule_metadata = _schedule(dg, context_lens, kv_cache.shape[1])
    # clean_logits=False: DeepGEMM's own cleaning takes 1-D lengths only (2.x asserts
    # against 2-D ones); columns past a row's length are left unwritten and set below.
    if hasattr(dg, "fp8_fp4_paged_mqa_logits"):
        logits = dg.fp8_fp4_paged_mqa_logits((q.contiguous(), None), kv_cache,
                                             weights.contiguous(), context_lens, table,
                                             schedule_metadata, max_context_len,
                                             clean_logits=False)
    else:
        logits = dg.fp8_paged_mqa_logits(q.contiguous(), kv_cache, weights.contiguous(),
                                         context_lens, table, schedule_metadata,
                                         max_context_len, clean_logits=False)
    cols = torch.arange(max_context_len, device=q.device)
    return logits.masked_fill_(cols >= context_lens.view(N * n, 1), float("-inf"))
