"""The Python -> C++ boundary: each op is declared once (python/dsa_ext/_native.py) and
the C++ entry point takes the same parameters in the same order under the same names.

Checked link by link: the C++ declaration's parameter names are the py::arg names of its
binding, those are the declaration's names, and the implementation passes each argument
in its declared position."""
import inspect
import pathlib
import re
import typing

import pytest
import torch

import dsa_ext  # noqa: F401 - registers the ops
from dsa_ext import _C, _native

OPS = sorted(_native.IMPLS)
CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc"


def cpp_parameter_names(fn) -> list[str]:
    """Parameter names of a bound function, from pybind11's signature line."""
    signature = fn.__doc__.splitlines()[0]
    return re.findall(r"[(,] ?(\w+): ", signature)


def test_every_public_op_is_declared():
    assert OPS == sorted([
        "build_c128a_topk_metadata", "convert_req_index_to_global_index",
        "correct_attention_output", "dcp_local_seq_lens", "expand_decode_seq_lens",
        "pack_dcp_topk_candidates", "prefill_chunk_bounds", "stable_topk_from_candidates",
        "topk_per_row", "topk_to_candidates", "topk_to_slots"])


def declared_parameters(name: str) -> list[str]:
    return list(inspect.signature(_native.IMPLS[name]).parameters)


def header_parameter_names(name: str) -> list[str]:
    """Parameter names of the C++ declaration `void name(...);` in csrc/*/*.h."""
    found = []
    for header in sorted(CSRC.glob("*/*.h")):
        found += re.findall(rf"\bvoid {name}\(([^;{{]*)\);", header.read_text())
    assert len(found) == 1, f"{name}: {len(found)} declarations"
    return [param.split()[-1].lstrip("&*") for param in found[0].split(",")]


@pytest.mark.parametrize("name", OPS)
def test_cpp_entry_point_takes_the_declared_parameters(name):
    want = declared_parameters(name) + list(_native.DERIVED[name]) + ["device", "stream"]
    assert cpp_parameter_names(getattr(_C, name)) == want


@pytest.mark.parametrize("name", OPS)
def test_cpp_declaration_names_its_parameters_as_bound(name):
    assert header_parameter_names(name) == cpp_parameter_names(getattr(_C, name))


class _Recorder:
    """Stands in for dsa_ext._C: records the arguments of each call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


@pytest.mark.parametrize("name", OPS)
def test_implementation_passes_each_argument_in_its_position(name, monkeypatch):
    # Every tensor parameter gets its own allocation (told apart by data pointer), every
    # int its own value; the implementation must hand each to the C++ parameter of its
    # name.
    impl = _native.IMPLS[name]
    hints = typing.get_type_hints(impl)
    args = {}
    for i, param in enumerate(declared_parameters(name)):
        kind = hints[param]
        if kind in (torch.Tensor, typing.Optional[torch.Tensor]):
            args[param] = torch.zeros(4, 4)
        elif kind is bool:
            args[param] = True
        else:
            args[param] = 101 + i
    recorder = _Recorder()
    monkeypatch.setattr(_native, "_C", recorder)
    impl(**args)
    ((called, passed),) = recorder.calls
    assert called == name
    for position, cpp_name in enumerate(cpp_parameter_names(getattr(_C, name))):
        if cpp_name not in args:
            continue  # derived values, device and stream
        value, got = args[cpp_name], passed[position]
        if isinstance(value, torch.Tensor):
            assert got[0] == value.data_ptr(), f"{cpp_name} is not passed at {position}"
        else:
            assert got == value, f"{cpp_name} is not passed at {position}"


@pytest.mark.parametrize("name", OPS)
def test_schema_is_the_declaration(name):
    schema = str(getattr(torch.ops.dsa_ext, name).default._schema)
    declared = _native.schema_of(_native.IMPLS[name], ())
    strip = lambda s: re.sub(r"\([a-z]!\)", "", s.split("::", 1)[-1])  # noqa: E731
    assert strip(schema).replace(" ", "") == strip(declared).replace(" ", "")


def test_schema_marks_the_mutated_tensors():
    schema = str(torch.ops.dsa_ext.convert_req_index_to_global_index.default._schema)
    assert "Tensor(a!) out" in schema and "Tensor(b!)? valid_counts" in schema
    assert "Tensor req_id" in schema and "int? " not in schema


def test_schema_rejects_a_mutated_non_tensor():
    def bad(x: torch.Tensor, n: int) -> None:
        pass
    with pytest.raises(TypeError, match="mutated parameter n is not a tensor"):
        _native.schema_of(bad, ("n",))
    with pytest.raises(TypeError, match="mutates names no parameter"):
        _native.schema_of(bad, ("out",))
