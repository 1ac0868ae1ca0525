"""Paged MQA logits of the indexer: DeepGEMM's kernel when it is installed, else the same
math in plain torch.

DeepGEMM is an optional run-time dependency: it is looked up once per process (a failing
import is not retried) and the SM count its scheduler takes is read once per device.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _checks

Tensor = torch.Tensor


@functools.lru_cache(maxsize=None)
def deep_gemm():
    """The deep_gemm module if it is importable and has the paged MQA logits API, else
    None (resolved once)."""
    try:
        import deep_gemm as module  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - absent or broken: use the torch fallback
        return None
    if hasattr(module, "fp8_paged_mqa_logits") and hasattr(
            module, "get_paged_mqa_logits_metadata"):
        return module
    return None


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (read once per device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_mqa_logits(q: Tensor, kv_cache: Tensor, kv_scale: Optional[Tensor], weights: Tensor,
                     context_lens: Tensor, block_table: Tensor, max_context_len: int, *,
                     row_map: Optional[Tensor] = None,
                     schedule_metadata: Optional[Tensor] = None,
                     use_deep_gemm: Optional[bool] = None) -> Tensor:
    """Indexer logits over a paged KV cache, for native or flattened decode batches.

    Shapes: ``N`` query groups of ``n`` tokens (native: ``N = B``, ``n = next_n``;
    flattened: ``N = B * next_n``, ``n = 1``), ``H`` heads, head dim ``D``::

        q            [N, n, H, D]    fp8 (float8_e4m3fn) or fp32/bf16
        kv_cache     [num_blocks, block_size, D]  same kinds; kv_scale [num_blocks, block_size]
                     fp32 per-token scale (None = 1)
        weights      [N * n, H]      fp32 per-head weights
        context_lens [N, n]          int32 (what :class:`IndexerMetadataBuilder` returns)
        block_table  [R, NB]         int32; the table row of group g is ``row_map[g]``
                                     when ``row_map`` is given, else ``g``

    Output ``logits`` fp32 ``[N * n, max_context_len]``; row ``i = g * n + j``::

        logits[i, p] = sum_h relu(q[g, j, h] . k[p] * kv_scale[p]) * weights[i, h]  p < ctx
                     = -inf                                                         p >= ctx
        with k[p] = kv_cache[block_table[row, p // block_size], p % block_size],
        ctx = context_lens[g, j].

    Both layouts of one batch give identical logits row for row. With DeepGEMM installed
    (``fp8_paged_mqa_logits``, fp8 inputs, CUDA) it is called instead; it needs
    ``kv_cache`` in its packed ``[num_blocks, block_size, 1, D + 4]`` uint8 layout and a
    per-token table, so a row map is materialized for it.
    """
    N, n, H, D = q.shape
    _checks.shape("context_lens", context_lens, (N, n))
    _checks.shape("weights", weights, (N * n, H))
    dg = deep_gemm() if use_deep_gemm is not False else None
    if dg is not None and q.is_cuda and kv_cache.dim() == 4:
        table = block_table if row_map is None else block_table[row_map.clamp(min=0).long()]
        if schedule_metadata is None:
            schedule_metadata = dg.get_paged_mqa_logits_metadata(
                context_lens, kv_cache.shape[1], num_sms(q.device))
        return dg.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, table,
                                       schedule_metadata, max_context_len, clean_logits=True)
    if use_deep_gemm:
        raise ValueError("use_deep_gemm=True but deep_gemm (with fp8_paged_mqa_logits) is not "
                         "importable, or the inputs are not in its layout")
    num_blocks, block_size = kv_cache.shape[:2]
    rows = torch.arange(N, device=q.device) if row_map is None else row_map.long().clamp(min=0)
    p = torch.arange(max_context_len, device=q.device)
    blk_idx = (p // block_size).clamp(max=block_table.shape[1] - 1)
    blocks = block_table[rows][:, blk_idx].long()                      # [N, P]
    valid_block = (blocks >= 0) & (blocks < num_blocks)
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
