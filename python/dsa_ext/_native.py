"""The bridge to the compiled module: tensor descriptors, placement, op registration.

Every public op follows one pattern:

1. the public function validates its arguments once (``_checks``), allocates missing
   ``out=`` buffers, and calls :func:`call`;
2. :func:`call` runs the implementation directly in eager mode (a few microseconds of
   host time) and goes through ``torch.ops.dsa_ext.<name>`` while ``torch.compile`` is
   tracing, so the op stays one opaque node with a fake implementation;
3. the implementation turns tensors into descriptors (plain integers: pointer, sizes,
   strides in elements) and calls ``dsa_ext._C``, which never sees libtorch.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch


_LIB = torch.library.Library("dsa_ext", "DEF")

_NO_DESC1 = (0, 0, 0)


def desc1(t: Optional[torch.Tensor]) -> tuple:
    """(data_ptr, size, stride) of a 1-D tensor; all zeros when absent."""
    if t is None:
        return _NO_DESC1
    return (t.data_ptr(), *t.shape, *t.stride())


def desc2(t: torch.Tensor) -> tuple:
    """(data_ptr, rows, cols, row_stride, col_stride) of a 2-D tensor."""
    return (t.data_ptr(), *t.shape, *t.stride())


def desc1_prefix(t: torch.Tensor, n: int) -> tuple:
    """desc1 of t[:n] without building the view (a slice costs ~1 us of host time)."""
    return (t.data_ptr(), n, t.stride(0))


def desc2_prefix(t: torch.Tensor, rows: int, cols: int) -> tuple:
    """desc2 of t[:rows, :cols] without building the view."""
    return (t.data_ptr(), rows, cols, t.stride(0), t.stride(1))


def desc3(t: torch.Tensor) -> tuple:
    """(data_ptr, size0, size1, size2, stride0, stride1, stride2) of a 3-D tensor."""
    return (t.data_ptr(), *t.shape, *t.stride())


def desc4(t: torch.Tensor) -> tuple:
    """(data_ptr, size0..size3, stride0..stride3) of a 4-D tensor."""
    return (t.data_ptr(), *t.shape, *t.stride())


def desc2_or_none(t: Optional[torch.Tensor]) -> tuple:
    """desc2 of t; all zeros when absent."""
    return (0, 0, 0, 0, 0) if t is None else desc2(t)


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
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def define(schema: str, impl: Callable, fake: Callable) -> Callable:
    """Register ``torch.ops.dsa_ext.<name>`` for CPU and CUDA with a fake, return impl."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CPU")
    _LIB.impl(name, impl, "CUDA")
    torch.library.register_fake(f"dsa_ext::{name}", fake, lib=_LIB)
    impl._dsa_op_name = name
    return impl


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def call(impl: Callable, *args):
    """Run a registered op: directly in eager mode, through the dispatcher when tracing."""
    if _is_compiling():
        return getattr(torch.ops.dsa_ext, impl._dsa_op_name)(*args)
    return impl(*args)


def no_result(*args) -> None:
    """Fake implementation of an op that only writes its out= buffers."""
    return None
