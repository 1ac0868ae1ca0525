"""Argument validation shared by every public op.

Each check names the argument, the rule and the value it got. Dtype and type problems
raise TypeError, everything else ValueError. Nothing here reads tensor data (that would
be a host sync); data-dependent faults are the kernels' business (they write -1).
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import torch

INT32_MAX = 2**31 - 1


def tensor(
    name: str,
    t,
    dtype: Optional[torch.dtype] = None,
    ndim: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Check that `t` is a tensor with the given dtype, rank and device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype is not dtype:
        raise TypeError(f"{name} must be {_dtype_name(dtype)}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is None:
        if not (t.is_cuda or t.is_cpu):
            raise ValueError(f"{name} must be on a CPU or CUDA device, got {t.device}")
    elif t.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs, got {t.device}")
    return t


def optional_tensor(name: str, t, dtype=None, ndim=None, device=None):
    return None if t is None else tensor(name, t, dtype, ndim, device)


def output(name: str, t: Optional[torch.Tensor], dtype: torch.dtype, size: Sequence[int],
           device: torch.device) -> torch.Tensor:
    """An op's output buffer: `t` checked (dtype, rank, shape, device, no element written
    twice) when given, else a new uninitialized tensor of that shape."""
    if t is None:
        return torch.empty(tuple(size), dtype=dtype, device=device)
    tensor(name, t, dtype, len(size), device)
    shape(name, t, size)
    writable(name, t)
    return t


def plain_buffer(t, dtype: torch.dtype, ndim: int, device: torch.device, rows: int) -> bool:
    """Whether `t` is buffer()'s common case, in one expression (these checks run on every
    batch): a plain contiguous tensor of that dtype, rank and device with at least `rows`
    entries along dim 0. False says nothing of what is wrong: buffer() says it."""
    return (type(t) is torch.Tensor and t.dtype is dtype and t.dim() == ndim and
            t.shape[0] >= rows and t.device == device and t.is_contiguous())


def buffer(name: str, t, dtype: torch.dtype, ndim: int, device: torch.device,
           rows: int) -> torch.Tensor:
    """A caller's output buffer of which an op writes the first `rows` rows: checked like
    tensor(), with at least `rows` entries along dim 0 and each element its own memory
    (writable)."""
    if plain_buffer(t, dtype, ndim, device, rows):
        return t
    tensor(name, t, dtype, ndim, device)
    dim_at_least(name, t, 0, rows)
    writable(name, t)
    return t


def writable(name: str, t: torch.Tensor) -> None:
    """Check that an output gives each element its own memory. A zero stride along a
    dimension of more than one element (an expanded tensor) would have several results
    stored to one address, and which one stays differs between runs on a GPU."""
    if t.is_contiguous():  # the common case, in a fraction of the time of the strides
        return
    strides = t.stride()
    for size, stride in zip(t.shape, strides):
        if stride == 0 and size > 1:
            raise ValueError(f"{name} must not have a zero stride along a dimension of "
                             f"more than one element (an expanded tensor), got shape "
                             f"{tuple(t.shape)} and strides {tuple(strides)}")


def shape(name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    if t.shape != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def dim_at_least(name: str, t: torch.Tensor, dim: int, minimum: int) -> None:
    if t.shape[dim] < minimum:
        raise ValueError(
            f"{name} must have at least {minimum} entries along dim {dim}, "
            f"got shape {tuple(t.shape)}")


def integer(name: str, value, minimum: Optional[int] = None,
            maximum: Optional[int] = INT32_MAX) -> int:
    """Check an integer (bool is refused; NumPy integers are taken) against an inclusive
    range. A torch.SymInt (a size while torch.compile traces with dynamic shapes) is
    known only when the graph runs: its range becomes a runtime assert of the graph (a
    host-side check of sizes, no device read). A tensor is refused although a 1-element
    integer tensor has __index__: reading it would be a host sync."""
    if type(value) is int and (minimum is None or value >= minimum) and \
            (maximum is None or value <= maximum):
        return value  # the common case, checked in one expression
    if isinstance(value, torch.SymInt):
        if minimum is not None:
            torch._check_value(value >= minimum,
                               lambda: f"{name} must be >= {minimum}, got {value}")
        if maximum is not None:
            torch._check_value(value <= maximum,
                               lambda: f"{name} must be <= {maximum}, got {value}")
        return value
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got a tensor of shape {tuple(value.shape)} "
                        "(pass int(t) if a host read is meant)")
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def boolean(name: str, value) -> bool:
    """Check a flag: a bool (a truthy int or tensor is refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def dcp_layout(world_size, rank, interleave, block_size: Optional[int] = None,
               names: Sequence[str] = ("dcp_world_size", "dcp_rank", "interleave"),
               all_ranks: bool = False) -> None:
    """Check a DCP layout (docs/ops.md section 1): W >= 1, 0 <= rank < W, I >= 1,
    BS % I == 0.

    `names` are the caller's argument names for (W, rank, I). rank None ("every rank at
    once") is accepted only where the caller says so with `all_ranks`.
    """
    w_name, r_name, i_name = names
    integer(w_name, world_size, 1)
    integer(i_name, interleave, 1)
    if rank is None and not all_ranks:
        raise TypeError(f"{r_name} must be an int, got None")
    if rank is not None:
        integer(r_name, rank, 0)
        if rank >= world_size:
            raise ValueError(f"{r_name} must be < {w_name} ({world_size}), got {rank}")
    if world_size * interleave > INT32_MAX:
        raise ValueError(
            f"{w_name} * {i_name} must be < 2^31, got {world_size} * {interleave}")
    if block_size is not None and block_size % interleave != 0:
        raise ValueError(
            f"block_size ({block_size}) must be a multiple of {i_name} ({interleave}): "
            "an interleave group may not straddle a KV block")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def int_tensor(name: str, t, dtypes=(torch.int32, torch.int64), ndim: Optional[int] = None,
               device: Optional[torch.device] = None) -> torch.Tensor:
    """Check a tensor whose dtype is one of `dtypes` (integer lengths, positions, ...)."""
    tensor(name, t, None, ndim, device)
    if t.dtype not in dtypes:
        names = " or ".join(_dtype_name(d) for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {t.dtype}")
    return t


def same_length(name: str, t: torch.Tensor, other: str, n: int, at_least: bool = False) -> None:
    """Check len(t) == n (or >= n), n being the length of argument `other`."""
    got = t.shape[0]
    if got < n or (not at_least and got != n):
        rule = "at least" if at_least else "exactly"
        raise ValueError(f"{name} must have {rule} {n} entries (like {other}), got {got}")
