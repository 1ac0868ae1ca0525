"""The bridge to the compiled module, and the only module that calls it: each op's
boundary is declared here once.

Every public op follows one pattern:

1. the public function validates its arguments once (``_checks``), allocates missing
   ``out=`` buffers, and calls :func:`call` with the op's name; composite ops (the DCP
   merges, the prefill builder) call the ops they are made of the same way, after
   validating their own arguments once;
2. :func:`call` runs the implementation directly in eager mode (a few microseconds of
   host time) and goes through ``torch.ops.dsa_ext.<name>`` while ``torch.compile`` is
   tracing, so the op stays one opaque node with a fake implementation;
3. the implementation, declared below with :func:`op`, turns tensors into descriptors
   (plain integers: pointer, sizes, strides in elements) and calls ``dsa_ext._C``, which
   never sees libtorch.

The declaration is the implementation's annotated signature: the torch schema is derived
from it, and the C++ entry point takes the same parameters in the same order, under the
same names (``py::arg`` in csrc/bindings.cpp), followed by the values the implementation
derives (``derived=``) and the device and stream. tests/test_boundary.py checks every
link: the C++ declaration's names against the bound names, those against the
declaration, and the implementation's call against both. Calls stay positional: a
keyword call through pybind11 costs more than a microsecond per op.
"""
from __future__ import annotations

import inspect
import typing
from typing import Callable, Optional

import torch

from . import _C

Tensor = torch.Tensor


_LIB = torch.library.Library("dsa_ext", "DEF")


def desc(t: Tensor) -> tuple:
    """(data_ptr, sizes..., strides...) of a tensor, strides in elements: the C++ side's
    Desc1 to Desc4 (csrc/common/strided.h) for 1-D to 4-D tensors."""
    return (t.data_ptr(), *t.shape, *t.stride())


_ABSENT = {ndim: (0,) * (1 + 2 * ndim) for ndim in (1, 2)}


#: The data pointer passed for a given tensor with no elements (torch gives those a null
#: data_ptr, which the C++ side reads as "absent"): never dereferenced, its size is 0.
_EMPTY_DATA = 16


def optional_desc(t: Optional[Tensor], ndim: int) -> tuple:
    """desc of t; all zeros (null data: absent) for None, as an `ndim`-D descriptor. A
    given tensor with no elements stays present (an empty `idx_mapping` maps every
    request to -1; read as absent, it would map none)."""
    if t is None:
        return _ABSENT[ndim]
    return (t.data_ptr() or _EMPTY_DATA, *t.shape, *t.stride())


def desc1_prefix(t: Tensor, n: int) -> tuple:
    """desc of t[:n] (1-D) without building the view (a slice costs ~1 us of host time)."""
    return (t.data_ptr(), n, *t.stride())


def desc2_prefix(t: Tensor, rows: int, cols: int) -> tuple:
    """desc of t[:rows, :cols] (2-D) without building the view. (`t.stride()` once:
    `t.stride(i)` parses its argument and costs twice as much per call.)"""
    return (t.data_ptr(), rows, cols, *t.stride())


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # a few hundred ns
except AttributeError:  # pragma: no cover - older or CPU-only builds of torch
    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def place(t: torch.Tensor) -> tuple[int, int]:
    """(device index, stream handle) for a launch on t's device; (-1, 0) on the CPU."""
    if not t.is_cuda:
        return -1, 0
    index = t.get_device()
    return index, _raw_stream(index)


def resolve_device(device) -> torch.device:
    """A torch.device with its index filled in ("cuda" -> the current CUDA device), so it
    compares equal to the device of the tensors allocated on it."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {device}, but this torch sees no CUDA device "
                         f"(torch {torch.__version__})")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


# ---------------------------------------------------------------------------------------
# Declaring and calling ops
# ---------------------------------------------------------------------------------------

_SCHEMA_TYPES = {Tensor: "Tensor", Optional[Tensor]: "Tensor?", int: "int",
                 Optional[int]: "int?", bool: "bool", float: "float"}

#: name -> implementation, for :func:`call`; :data:`DERIVED`: name -> the extra
#: values the implementation passes to the C++ entry point after the op's parameters.
IMPLS: dict[str, Callable] = {}
DERIVED: dict[str, tuple[str, ...]] = {}


def schema_of(fn: Callable, mutates: tuple[str, ...]) -> str:
    """The torch schema of an op implementation, from its annotated signature."""
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)
    unknown = set(mutates) - set(params)
    if unknown:
        raise TypeError(f"{fn.__name__}: mutates names no parameter: {sorted(unknown)}")
    args, aliases = [], iter("abcdefghijklmnopqrstuvwxyz")
    for name in params:
        kind = _SCHEMA_TYPES.get(hints[name])
        if kind is None:
            raise TypeError(f"{fn.__name__}: parameter {name} has no schema type: "
                            f"{hints[name]}")
        if name in mutates:
            if not kind.startswith("Tensor"):
                raise TypeError(f"{fn.__name__}: mutated parameter {name} is not a tensor")
            kind = kind.replace("Tensor", f"Tensor({next(aliases)}!)")
        args.append(f"{kind} {name}")
    return f"{fn.__name__}({', '.join(args)}) -> ()"


def op(*, mutates: tuple[str, ...], derived: tuple[str, ...] = ()) -> Callable:
    """Register the decorated implementation as ``torch.ops.dsa_ext.<its name>`` for CPU
    and CUDA, with a fake that only declares the writes to ``mutates`` (every op writes
    its out= buffers and returns nothing)."""
    def register(fn: Callable) -> Callable:
        name = fn.__name__
        _LIB.define(schema_of(fn, mutates))
        _LIB.impl(name, fn, "CPU")
        _LIB.impl(name, fn, "CUDA")
        torch.library.register_fake(f"dsa_ext::{name}", _no_result, lib=_LIB)
        IMPLS[name] = fn
        DERIVED[name] = derived
        return fn
    return register


def _no_result(*args) -> None:
    return None


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def call(name: str, *args):
    """Run op `name`: directly in eager mode, through the dispatcher when tracing (`name`
    is a constant, so the lookup traces on every torch version)."""
    if _is_compiling():
        return getattr(torch.ops.dsa_ext, name)(*args)
    return IMPLS[name](*args)


# ---------------------------------------------------------------------------------------
# The ops (docs/ops.md has their contracts)
# ---------------------------------------------------------------------------------------


@op(mutates=("out", "valid_counts"))
def convert_req_index_to_global_index(
        req_id: Tensor, block_table: Tensor, token_indices: Tensor, block_size: int,
        block_stride: int, dcp_world_size: int, dcp_rank: int, interleave: int,
        compact: bool, idx_mapping: Optional[Tensor], prefill_request_id: Optional[Tensor],
        prefill_workspace_starts: Optional[Tensor], prefill_workspace_rank_stride: int,
        out: Tensor, valid_counts: Optional[Tensor]) -> None:
    device, stream = place(token_indices)
    _C.convert_req_index_to_global_index(
        desc(req_id), desc(block_table), desc(token_indices), block_size, block_stride,
        dcp_world_size, dcp_rank, interleave, compact, optional_desc(idx_mapping, 1),
        optional_desc(prefill_request_id, 1), optional_desc(prefill_workspace_starts, 1),
        prefill_workspace_rank_stride, desc(out), optional_desc(valid_counts, 1), device,
        stream)


@op(mutates=("out",), derived=("is_int64",))
def dcp_local_seq_lens(seq_lens: Tensor, rank: Optional[int], world_size: int,
                       interleave: int, out: Tensor) -> None:
    n = seq_lens.numel()
    cols = world_size if rank is None else 1
    if out.dim() == 1 and rank is None:  # a 0-D length: one row of W columns
        out_desc = (out.data_ptr(), 1, cols, 0, out.stride(0))
    elif out.dim() == 1:
        out_desc = (out.data_ptr(), n, 1, out.stride(0), 1)
    elif out.dim() == 2 and rank is None:
        out_desc = desc(out)
    else:
        out_desc = desc(out.view(n, cols))
    device, stream = place(seq_lens)
    flat = seq_lens.reshape(n)  # a copy when the strides do not flatten: alive until the call
    _C.dcp_local_seq_lens(desc(flat), -1 if rank is None else rank, world_size, interleave,
                          out_desc, seq_lens.dtype == torch.int64, device, stream)


@op(mutates=("decode_buffer", "decode_lens_buffer", "prefill_buffer"))
def build_c128a_topk_metadata(
        positions: Tensor, token_to_req: Tensor, block_table: Tensor, slot_mapping: Tensor,
        decode_buffer: Tensor, decode_lens_buffer: Tensor, prefill_buffer: Tensor,
        compress_ratio: int, block_size: int, num_decode_tokens: int, width: int) -> None:
    T, Td = positions.shape[0], num_decode_tokens
    device, stream = place(positions)
    _C.build_c128a_topk_metadata(
        desc(positions), desc(token_to_req), desc(block_table), desc(slot_mapping),
        desc2_prefix(decode_buffer, Td, width), desc1_prefix(decode_lens_buffer, Td),
        desc2_prefix(prefill_buffer, T - Td, width), compress_ratio, block_size, Td, width,
        device, stream)


@op(mutates=("global_lens", "local_lens", "row_map"))
def expand_decode_seq_lens(
        seq_lens: Tensor, num_reqs: int, query_start_loc: Optional[Tensor], next_n: int,
        num_decode_tokens: int, compress_ratio: int, dcp_rank: Optional[int],
        dcp_world_size: int, interleave: int, global_lens: Tensor,
        local_lens: Optional[Tensor], row_map: Optional[Tensor]) -> None:
    Td = num_decode_tokens
    if local_lens is None:
        local_desc = _ABSENT[2]
    elif local_lens.dim() == 1:
        local_desc = (local_lens.data_ptr(), Td, 1, local_lens.stride(0), 1)
    else:
        local_desc = desc2_prefix(local_lens, Td, local_lens.shape[1])
    device, stream = place(seq_lens)
    _C.expand_decode_seq_lens(
        desc(seq_lens), num_reqs, optional_desc(query_start_loc, 1), next_n, Td,
        compress_ratio, -1 if dcp_rank is None else dcp_rank, dcp_world_size, interleave,
        desc1_prefix(global_lens, Td), local_desc,
        _ABSENT[1] if row_map is None else desc1_prefix(row_map, Td), device, stream)


@op(mutates=("ks", "ke", "token_to_seq"))
def prefill_chunk_bounds(
        seq_lens: Tensor, query_start_loc: Tensor, row_starts: Tensor, token_start: int,
        token_end: int, compress_ratio: int, dcp_rank: int, dcp_world_size: int,
        interleave: int, ks: Tensor, ke: Tensor, token_to_seq: Tensor) -> None:
    R = seq_lens.shape[0]
    device, stream = place(seq_lens)
    _C.prefill_chunk_bounds(
        desc(seq_lens), desc1_prefix(query_start_loc, R + 1), desc1_prefix(row_starts, R),
        token_start, token_end, compress_ratio, dcp_rank, dcp_world_size, interleave,
        desc(ks), desc(ke), desc(token_to_seq), device, stream)


@op(mutates=("out",))
def pack_dcp_topk_candidates(logits: Tensor, topk_indices: Tensor, rank: int,
                             world_size: int, interleave: int, row_starts: Optional[Tensor],
                             out: Tensor) -> None:
    device, stream = place(topk_indices)
    _C.pack_dcp_topk_candidates(desc(logits), desc(topk_indices), rank, world_size,
                                interleave, optional_desc(row_starts, 1), desc(out), device,
                                stream)


def _candidates_desc(t: Tensor) -> tuple:
    """desc of the candidates as 3-D [W, rows, K]; a 2-D [rows, N] input is W = 1."""
    if t.dim() == 2:
        return (t.data_ptr(), 1, t.shape[0], t.shape[1], 0, t.stride(0), t.stride(1))
    return desc(t)


@op(mutates=("out",))
def stable_topk_from_candidates(candidates: Tensor, out: Tensor, sorted: bool) -> None:
    device, stream = place(candidates)
    _C.stable_topk_from_candidates(_candidates_desc(candidates), desc(out), sorted, device,
                                   stream)


def _seq_lens_desc(seq_lens: Optional[Tensor]) -> tuple:
    """desc of decode lengths as 2-D: [B] as [B, 1], [B, next_n] as it is."""
    if seq_lens is None:
        return _ABSENT[2]
    if seq_lens.dim() == 1:
        return (seq_lens.data_ptr(), seq_lens.shape[0], 1, seq_lens.stride(0), 0)
    return desc(seq_lens)


@op(mutates=("out",), derived=("is_bf16", "seq_lens_2d"))
def topk_per_row(logits: Tensor, k: int, lengths: Optional[Tensor],
                 seq_lens: Optional[Tensor], next_n: int, row_starts: Optional[Tensor],
                 row_ends: Optional[Tensor], sorted: bool, out: Tensor) -> None:
    device, stream = place(logits)
    _C.topk_per_row(desc(logits), k, optional_desc(lengths, 1), _seq_lens_desc(seq_lens),
                    next_n, optional_desc(row_starts, 1), optional_desc(row_ends, 1), sorted,
                    desc(out), logits.dtype == torch.bfloat16,
                    seq_lens is not None and seq_lens.dim() == 2, device, stream)


@op(mutates=("out", "valid_counts"), derived=("is_bf16", "seq_lens_2d"))
def topk_to_slots(logits: Tensor, k: int, lengths: Optional[Tensor],
                  seq_lens: Optional[Tensor], next_n: int, row_starts: Optional[Tensor],
                  row_ends: Optional[Tensor], req_id: Tensor, block_table: Tensor,
                  block_size: int, block_stride: int, compact: bool, out: Tensor,
                  valid_counts: Optional[Tensor]) -> None:
    device, stream = place(logits)
    _C.topk_to_slots(desc(logits), k, optional_desc(lengths, 1), _seq_lens_desc(seq_lens),
                     next_n, optional_desc(row_starts, 1), optional_desc(row_ends, 1),
                     desc(req_id), desc(block_table), block_size, block_stride, compact,
                     desc(out), optional_desc(valid_counts, 1),
                     logits.dtype == torch.bfloat16,
                     seq_lens is not None and seq_lens.dim() == 2, device, stream)


@op(mutates=("out",), derived=("seq_lens_2d",))
def topk_to_candidates(logits: Tensor, k: int, lengths: Optional[Tensor],
                       seq_lens: Optional[Tensor], next_n: int, row_starts: Optional[Tensor],
                       row_ends: Optional[Tensor], rank: int, world_size: int,
                       interleave: int, out: Tensor) -> None:
    device, stream = place(logits)
    _C.topk_to_candidates(desc(logits), k, optional_desc(lengths, 1),
                          _seq_lens_desc(seq_lens), next_n, optional_desc(row_starts, 1),
                          optional_desc(row_ends, 1), rank, world_size, interleave, desc(out),
                          seq_lens is not None and seq_lens.dim() == 2, device, stream)


#: The element types correct_attention_output takes, as the C++ OutDtype values.
ATTENTION_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


@op(mutates=("corrected", "global_lse"), derived=("out_dtype",))
def correct_attention_output(partial: Tensor, lses: Tensor, rank: int, base2: bool,
                             corrected: Tensor, global_lse: Optional[Tensor]) -> None:
    device, stream = place(partial)
    _C.correct_attention_output(desc(partial), desc(lses), rank, base2, desc(corrected),
                                optional_desc(global_lse, 2), ATTENTION_DTYPES[partial.dtype],
                                device, stream)
