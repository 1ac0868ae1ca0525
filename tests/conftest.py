"""Shared fixtures: every op test runs on the CPU everywhere and on CUDA when present."""
import contextlib
import glob
import os
import shutil
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

# Random-case budgets: "dsa" for CI and GPU runs, "sanitizer" under compute-sanitizer
# (every launch is ~100x slower there). Tests take @given alone and inherit these.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dsa", max_examples=100, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("sanitizer", max_examples=6, deadline=None,
                          suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("DSA_EXT_HYPOTHESIS_PROFILE", "dsa"))

HAS_CUDA = torch.cuda.is_available()

# Under pytest-xdist every worker's torch would run a CPU thread per core: the workers then
# contend for the cores in the CPU references (on the 16-core GPU machine at 8 workers, one
# short-row sink test took 213 s). Each worker takes its share of the cores instead.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def cuda_sms() -> int:
    """SMs of the current CUDA device (the top-K launcher picks variants by rows per SM)."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@contextlib.contextmanager
def _overridden(setter: str, value, automatic):
    """Every launch inside runs with ``_C.<setter>(value)``; the automatic choice after."""
    from dsa_ext import _C  # noqa: PLC0415
    getattr(_C, setter)(value)
    try:
        yield
    finally:
        getattr(_C, setter)(automatic)


def forced_topk_variant(name: str):
    """Every stable top-K launch inside runs the exported variant `name` (CUDA)."""
    return _overridden("set_stable_topk_variant_override", name, "")


def forced_topk_plan(code: int):
    """Every per-row top-K launch inside runs plan `code` (``_C.set_topk_plan_override``)."""
    return _overridden("set_topk_plan_override", code, -1)


def forced_convert_plan(code: int):
    """Every conversion launch inside runs plan `code` (``_C.set_convert_plan_override``)."""
    return _overridden("set_convert_plan_override", code, -1)


#: The archs every release build carries SASS for (the CMake default): sm_90a (Hopper),
#: sm_100a (Blackwell).
RELEASE_ARCHS = {"90a-real", "100a-real"}


def tool_path(name: str) -> str:
    """A binutils / CUDA tool from PATH or from the nvidia-cuda-cuobjdump wheel; skips the
    test without it."""
    found = shutil.which(name)
    if found is None:
        wheel_bins = glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages",
                                            "nvidia", "*", "bin", name))
        found = wheel_bins[0] if wheel_bins else None
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def cubin_archs(listing: str) -> set:
    """The "sm_XX" names of the cubins in a `cuobjdump --list-elf` listing."""
    return {line.rsplit(".", 2)[-2] for line in listing.splitlines() if ".cubin" in line}


def sm_names(archs) -> set:
    """The "sm_XX" names of CMake arch entries ("90a-real" -> "sm_90a")."""
    return {"sm_" + arch.split("-")[0] for arch in archs}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True)
def _subnormals_kept():
    """Every test starts with IEEE subnormals. A CPU torch.compile on torch before 2.5
    loads inductor code built with -ffast-math, which turns on flush-to-zero for the
    whole process; the bit-exact comparisons and hypothesis' float strategies (which
    raise once they see subnormals flushed) need them."""
    torch.set_flush_denormal(False)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    """The device an op runs on; its results are compared with the CPU reference."""
    return torch.device(request.param)


def assert_equal(got: torch.Tensor, want: torch.Tensor, **ctx):
    """Exact comparison (dtype, shape, every element) that names the first mismatching
    coordinate and the case."""
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype} {ctx}"
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)} {ctx}"
    if not torch.equal(got, want):
        first = tuple((got != want).nonzero()[0].tolist())
        raise AssertionError(
            f"mismatch at {first}: got {got[first].item()} want {want[first].item()} {ctx}")


def capture_graph(step):
    """Run `step` eagerly and on a side stream, then capture it in a CUDA graph, all with
    host syncs turned into errors."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()  # eager: no host sync allowed
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return graph
