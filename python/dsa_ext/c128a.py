"""C128A compressed-attention top-K metadata (docs/ops.md section 3).

With compression ratio 128 every token attends to the compressed KV entries of its
first ``(position + 1) // 128`` compressed positions. Decode tokens need those entries'
physical slots (through the block table), prefill tokens their positions. The buffers
are allocated once at capacity and every build returns views of them whose row stride
stays the capacity, so a CUDA graph captured at one width replays correctly at another.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks, _native

Tensor = torch.Tensor

#: Width granularity of the C128A top-K buffers (the sparse attention kernel's tile).
C128A_TOPK_ALIGNMENT = 128


def _ratio_alignment(compress_ratio, alignment) -> None:
    _checks.integer("compress_ratio", compress_ratio)
    if compress_ratio <= 0:
        raise ValueError(f"compress_ratio must be >= 1, got {compress_ratio}")
    _checks.integer("alignment", alignment)
    if alignment <= 0:
        raise ValueError(f"alignment must be >= 1, got {alignment}")


def c128a_capacity(max_model_len: int, compress_ratio: int = 128,
                   alignment: int = C128A_TOPK_ALIGNMENT) -> int:
    """Columns of the C128A buffers: ``roundup(ceil(max_model_len / ratio), alignment)``.

    Example::

        >>> dsa_ext.c128a_capacity(1 << 20)   # 1M tokens -> 8192 compressed positions
        8192
    """
    _ratio_alignment(compress_ratio, alignment)
    _checks.integer("max_model_len", max_model_len, 1, None)
    compressed = -(-max_model_len // compress_ratio)
    return -(-compressed // alignment) * alignment


def c128a_topk_width(max_seq_len: int, capacity: int, compress_ratio: int = 128,
                     alignment: int = C128A_TOPK_ALIGNMENT) -> int:
    """Active top-K width of one batch (host ints only, no device work)::

        width = min(max(next_pow2(max(max_seq_len // ratio, 1)), alignment), capacity)

    Raises:
        ValueError if ``compress_ratio <= 0`` or ``alignment <= 0``, if the width is not a
        multiple of ``alignment`` (a capacity that is not), or if it is smaller than
        ``max_seq_len // compress_ratio`` (the capacity is too small for the batch).

    Example::

        >>> dsa_ext.c128a_topk_width(32768, capacity=8192)   # 32K tokens -> 256 columns
        256
    """
    _ratio_alignment(compress_ratio, alignment)
    _checks.integer("max_seq_len", max_seq_len, 0, None)
    _checks.integer("capacity", capacity, 1, None)
    needed = max_seq_len // compress_ratio
    pow2 = 1 << (max(needed, 1) - 1).bit_length()
    width = min(max(pow2, alignment), capacity)
    if width % alignment != 0:
        raise ValueError(f"C128A width {width} (capacity {capacity}) must be a multiple of "
                         f"alignment ({alignment})")
    if width < needed:
        raise ValueError(f"capacity ({capacity}) is too small: max_seq_len {max_seq_len} "
                         f"needs {needed} compressed columns (ratio {compress_ratio})")
    return width


def build_c128a_topk_metadata(
    positions: Tensor,
    compress_ratio: int,
    num_decode_tokens: int,
    token_to_req: Tensor,
    block_table: Tensor,
    block_size: int,
    slot_mapping: Tensor,
    decode_buffer: Tensor,
    decode_lens_buffer: Tensor,
    prefill_buffer: Tensor,
    width: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fill the C128A top-K metadata of one batch into capacity buffers (one launch).

    With ``n_t = min((positions[t] + 1) // compress_ratio, width)`` (0 for a negative
    position), ``Td = num_decode_tokens`` and ``bs = block_size``::

        decode[t, i]   = block_table[token_to_req[t], i // bs] * bs + i % bs   i < n_t
                       = -1                                                  n_t <= i < width
        decode_lens[t] = n_t, or 0 (and an all -1 row) if slot_mapping[t] < 0  (padding)
        prefill[t - Td, i] = i if i < n_t else -1                            t >= Td

    A request id outside ``[0, Rd)``, a block index past ``NB`` or a slot outside
    ``[0, 2^31)`` gives -1 entries (never an out-of-bounds read). Only columns
    ``[0, width)`` of the first ``Td`` / ``T - Td`` buffer rows are written; columns
    ``>= width`` are never touched.

    Args:
        positions: int64 ``[T]``, token positions (decode tokens first).
        compress_ratio: compression ratio (128 for C128A), ``>= 1``.
        num_decode_tokens: host int ``Td``, ``0 <= Td <= T``.
        token_to_req: int32 ``[>= Td]``, block-table row of each decode token.
        block_table: int32 ``[Rd, NB]``, compressed-KV block ids; any strides.
        block_size: block size in compressed units (KV block size // ratio), ``>= 1``.
        slot_mapping: int64 ``[>= Td]``; ``< 0`` marks a padding decode token.
        decode_buffer: int32 ``[>= Td, capacity]``, ``capacity >= width``.
        decode_lens_buffer: int32 ``[>= Td]``.
        prefill_buffer: int32 ``[>= T - Td, capacity]``.
        width: active width (:func:`c128a_topk_width`), ``1 <= width <= capacity``.

    Returns:
        ``(decode_buffer[:Td, :width], decode_lens_buffer[:Td], prefill_buffer[:T-Td, :width])``:
        views whose row stride is the buffers' (capacity), so a CUDA graph captured at
        one width stays valid. Allocates nothing, reads nothing back to the host.

    Raises:
        TypeError / ValueError naming the argument for a wrong dtype, rank, size or
        device, ``compress_ratio < 1``, ``width`` outside ``[1, capacity]``.

    Example::

        >>> dec, lens, pre = dsa_ext.build_c128a_topk_metadata(
        ...     torch.tensor([255, 511]), 128, 1, torch.zeros(2, dtype=torch.int32),
        ...     torch.tensor([[3]], dtype=torch.int32), 256, torch.tensor([0, 1]),
        ...     torch.empty(2, 256, dtype=torch.int32), torch.empty(2, dtype=torch.int32),
        ...     torch.empty(2, 256, dtype=torch.int32), 128)
        >>> dec[0, :3].tolist(), lens.tolist(), pre[0, :5].tolist()
        ([768, 769, -1], [2], [0, 1, 2, 3, -1])
    """
    _validate(positions, compress_ratio, num_decode_tokens, token_to_req, block_table,
              block_size, slot_mapping, decode_buffer, decode_lens_buffer, prefill_buffer,
              width)
    Td, T = num_decode_tokens, positions.shape[0]
    _native.call("build_c128a_topk_metadata", positions, token_to_req, block_table,
                 slot_mapping, decode_buffer, decode_lens_buffer, prefill_buffer,
                 compress_ratio, block_size, Td, width)
    return _filled_views(decode_buffer, decode_lens_buffer, prefill_buffer, T, Td, width)


def _filled_views(decode_buffer, decode_lens_buffer, prefill_buffer, T, Td, width) -> tuple:
    """The filled parts of the buffers, ``[:Td, :width]``, ``[:Td]``, ``[:T - Td, :width]``,
    made by as_strided: each in about half the host time of a slice (the function form
    takes about 0.1 us less than the method)."""
    return (torch.as_strided(decode_buffer, (Td, width), decode_buffer.stride()),
            torch.as_strided(decode_lens_buffer, (Td,), decode_lens_buffer.stride()),
            torch.as_strided(prefill_buffer, (T - Td, width), prefill_buffer.stride()))


def _width_fits(width, name, columns) -> None:
    if width > columns:
        raise ValueError(f"width ({width}) must be <= the capacity of {name} "
                         f"({columns} columns)")


_I32, _I64 = torch.int32, torch.int64


def _valid_common_case(positions, compress_ratio, num_decode_tokens, token_to_req,
                       block_table, block_size, slot_mapping, decode_buffer,
                       decode_lens_buffer, prefill_buffer, width) -> bool:
    """The arguments of a serving loop (plain tensors of the right dtypes on one device,
    contiguous buffers, in-range ints) in one expression, in about half the host time of
    the checks below; False sends any other call through them, which name what is wrong."""
    Td = num_decode_tokens
    if type(positions) is not Tensor or positions.dim() != 1 or type(Td) is not int:
        return False
    T, device = positions.shape[0], positions.device
    return (positions.dtype is _I64 and (positions.is_cuda or positions.is_cpu)
            and type(compress_ratio) is int and 1 <= compress_ratio <= _checks.INT32_MAX
            and 0 <= Td <= T
            and type(block_size) is int and 1 <= block_size <= _checks.INT32_MAX
            and type(width) is int and 1 <= width <= _checks.INT32_MAX
            and type(token_to_req) is Tensor and token_to_req.dtype is _I32
            and token_to_req.dim() == 1 and token_to_req.device == device
            and token_to_req.shape[0] >= Td
            and type(block_table) is Tensor and block_table.dtype is _I32
            and block_table.dim() == 2 and block_table.device == device
            and type(slot_mapping) is Tensor and slot_mapping.dtype is _I64
            and slot_mapping.dim() == 1 and slot_mapping.device == device
            and slot_mapping.shape[0] >= Td
            and _checks.plain_buffer(decode_buffer, _I32, 2, device, Td)
            and decode_buffer.shape[1] >= width
            and _checks.plain_buffer(prefill_buffer, _I32, 2, device, T - Td)
            and prefill_buffer.shape[1] >= width
            and _checks.plain_buffer(decode_lens_buffer, _I32, 1, device, Td))


def _validate(positions, compress_ratio, num_decode_tokens, token_to_req, block_table,
              block_size, slot_mapping, decode_buffer, decode_lens_buffer, prefill_buffer,
              width) -> None:
    if _valid_common_case(positions, compress_ratio, num_decode_tokens, token_to_req,
                          block_table, block_size, slot_mapping, decode_buffer,
                          decode_lens_buffer, prefill_buffer, width):
        return
    device = _validate_inputs(positions, compress_ratio, num_decode_tokens, token_to_req,
                              block_table, block_size, slot_mapping, width)
    Td, T = num_decode_tokens, positions.shape[0]
    _checks.buffer("decode_buffer", decode_buffer, torch.int32, 2, device, Td)
    _width_fits(width, "decode_buffer", decode_buffer.shape[1])
    _checks.buffer("prefill_buffer", prefill_buffer, torch.int32, 2, device, T - Td)
    _width_fits(width, "prefill_buffer", prefill_buffer.shape[1])
    _checks.buffer("decode_lens_buffer", decode_lens_buffer, torch.int32, 1, device, Td)


def _validate_inputs(positions, compress_ratio, num_decode_tokens, token_to_req, block_table,
                     block_size, slot_mapping, width) -> torch.device:
    """Everything but the output buffers; returns the inputs' device."""
    _checks.tensor("positions", positions, torch.int64, 1)
    device = positions.device
    T = positions.shape[0]
    _checks.integer("compress_ratio", compress_ratio, 1)
    _checks.integer("num_decode_tokens", num_decode_tokens, 0, T)
    _checks.integer("block_size", block_size, 1)
    _checks.integer("width", width, 1)
    Td = num_decode_tokens
    _checks.tensor("token_to_req", token_to_req, torch.int32, 1, device)
    _checks.same_length("token_to_req", token_to_req, "num_decode_tokens", Td, at_least=True)
    _checks.tensor("block_table", block_table, torch.int32, 2, device)
    _checks.tensor("slot_mapping", slot_mapping, torch.int64, 1, device)
    _checks.same_length("slot_mapping", slot_mapping, "num_decode_tokens", Td, at_least=True)
    return device


class C128AMetadataBuilder:
    """Owns the C128A buffers (allocated once at capacity) and builds each batch into them.

    Args:
        max_model_len: longest sequence served; sets ``capacity``.
        max_num_tokens: most tokens per batch (rows of each buffer).
        device: where the buffers live.
        compress_ratio, alignment: as in :func:`c128a_topk_width`.

    Example::

        >>> b = dsa_ext.C128AMetadataBuilder(65536, 256, "cuda")
        >>> dec, lens, pre = b.build(positions, num_decode_tokens, token_to_req, block_table,
        ...                          block_size, slot_mapping, max_seq_len=4096)
    """

    def __init__(self, max_model_len: int, max_num_tokens: int, device,
                 compress_ratio: int = 128, alignment: int = C128A_TOPK_ALIGNMENT):
        self.capacity = c128a_capacity(max_model_len, compress_ratio, alignment)
        _checks.integer("max_num_tokens", max_num_tokens, 1)
        self.compress_ratio = compress_ratio
        self.alignment = alignment
        self.max_num_tokens = max_num_tokens
        self.device = _native.resolve_device(device)
        shape = (max_num_tokens, self.capacity)
        self.decode_buffer = torch.full(shape, -1, dtype=torch.int32, device=self.device)
        self.decode_lens_buffer = torch.zeros(max_num_tokens, dtype=torch.int32,
                                              device=self.device)
        self.prefill_buffer = torch.full(shape, -1, dtype=torch.int32, device=self.device)
        self._views: dict = {}  # (T, Td, width) -> output views (making them costs host time)

    def width(self, max_seq_len: int) -> int:
        """Active width for a batch whose longest sequence is ``max_seq_len`` (host int)."""
        return c128a_topk_width(max_seq_len, self.capacity, self.compress_ratio,
                                self.alignment)

    def build(self, positions: Tensor, num_decode_tokens: int, token_to_req: Tensor,
              block_table: Tensor, block_size: int, slot_mapping: Tensor,
              max_seq_len: int, width: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
        """:func:`build_c128a_topk_metadata` into the owned buffers.

        ``max_seq_len`` is the host-side maximum the caller already has (no device read);
        ``width`` overrides the width derived from it (e.g. a width fixed for a graph).
        """
        # (a positions that is no 1-D tensor is _validate's error, which names it)
        if isinstance(positions, torch.Tensor) and positions.dim() == 1 and \
                positions.shape[0] > self.max_num_tokens:
            raise ValueError(f"positions has {positions.shape[0]} tokens, more than "
                             f"max_num_tokens ({self.max_num_tokens})")
        if width is None:
            width = self.width(max_seq_len)
        # The owned buffers were made right (__init__): only the batch's inputs and how
        # they meet the buffers (device, rows above, width) are checked.
        device = _validate_inputs(positions, self.compress_ratio, num_decode_tokens,
                                  token_to_req, block_table, block_size, slot_mapping, width)
        if device != self.device:
            raise ValueError(f"positions must be on {self.device} (the builder's device), "
                             f"got {device}")
        _width_fits(width, "decode_buffer", self.capacity)
        bufs = (self.decode_buffer, self.decode_lens_buffer, self.prefill_buffer)
        T, Td = positions.shape[0], num_decode_tokens
        _native.call("build_c128a_topk_metadata", positions, token_to_req, block_table,
                     slot_mapping, *bufs, self.compress_ratio, block_size, Td, width)
        key = (T, Td, width)
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 4096:
                self._views.clear()
            views = self._views[key] = _filled_views(*bufs, T, Td, width)
        return views
