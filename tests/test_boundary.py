"""The Python -> C++ boundary: each op is declared once (python/dsa_ext/_native.py) and
the C++ entry point takes the same parameters in the same order under the same names."""
import re

import pytest
import torch

import dsa_ext  # noqa: F401 - registers the ops
from dsa_ext import _C, _native

OPS = sorted(_native.IMPLS)


def cpp_parameter_names(fn) -> list[str]:
    """Parameter names of a bound function, from pybind11's signature line."""
    signature = fn.__doc__.splitlines()[0]
    return re.findall(r"[(,] ?(\w+): ", signature)


def test_every_public_op_is_declared():
    assert OPS == sorted([
        "build_c128a_topk_metadata", "convert_req_index_to_global_index",
        "correct_attention_output", "dcp_local_seq_lens", "expand_decode_seq_lens",
        "pack_dcp_topk_candidates", "prefill_chunk_bounds", "stable_topk_from_candidates"])


@pytest.mark.parametrize("name", OPS)
def test_cpp_entry_point_takes_the_declared_parameters(name):
    import inspect
    declared = list(inspect.signature(_native.IMPLS[name]).parameters)
    want = declared + list(_native.DERIVED[name]) + ["device", "stream"]
    assert cpp_parameter_names(getattr(_C, name)) == want


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
