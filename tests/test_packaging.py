"""The built module: machine code for the promised archs, no libtorch/libcudart linkage."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dsa_ext
from dsa_ext import _C
from conftest import RELEASE_ARCHS, cubin_archs, sm_names, tool_path


def _run(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_no_torch_or_cuda_runtime_linkage():
    needed = [line for line in _run(tool_path("readelf"), "-d", _C.__file__).splitlines()
              if "(NEEDED)" in line]
    assert needed, "readelf found no NEEDED entries"
    for lib in ("libtorch", "libc10", "libcudart", "libcuda.so", "libnvrtc"):
        assert not any(lib in line for line in needed), f"{_C.__file__} links {lib}: {needed}"
    undefined = _run(tool_path("nm"), "-D", "--undefined-only", _C.__file__)
    assert "_ZN3c10" not in undefined and "_ZN2at" not in undefined


def test_sass_for_every_compiled_arch():
    listing = _run(tool_path("cuobjdump"), "--list-elf", _C.__file__)
    cubins = cubin_archs(listing)
    want = sm_names(dsa_ext.cuda_archs)
    assert want <= cubins, f"module holds {sorted(cubins)}, compiled for {dsa_ext.cuda_archs}"
    assert not any(".ptx" in line for line in listing.splitlines())


def test_cmake_default_is_the_release_archs():
    """Builds that set no CMAKE_CUDA_ARCHITECTURES (the release wheel: tests/test_wheel.py
    checks its machine code) target the promised archs."""
    text = (Path(__file__).resolve().parents[1] / "CMakeLists.txt").read_text()
    default = re.search(r'set\(CMAKE_CUDA_ARCHITECTURES "([^"]+)"\)', text)
    assert default and set(default.group(1).split(";")) == RELEASE_ARCHS, default


def test_import_needs_no_gpu():
    # A fresh interpreter that cannot see any GPU still imports and runs on the CPU.
    code = ("import torch, dsa_ext; t = torch.zeros(1, 4, dtype=torch.int32);"
            "print(dsa_ext.convert_req_index_to_global_index("
            "torch.zeros(1, dtype=torch.int32), torch.ones(1, 1, dtype=torch.int32), t, 4)"
            ".tolist())")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "[[4, 4, 4, 4]]"


def _module(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_self_check_help_prints_usage_and_runs_nothing():
    run = _module("dsa_ext", "--help")
    assert run.returncode == 0, run.stderr
    assert "usage: python -m dsa_ext [-h] [--json]" in run.stdout
    assert "passed" not in run.stdout  # no check ran


def test_self_check_json_times_op_and_reference_apart():
    run = _module("dsa_ext", "--json")
    assert run.returncode == 0, run.stderr
    # the report is the last line (an editable install's rebuild may print before it)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["version"] == dsa_ext.__version__
    assert report["cuda_archs"] == list(dsa_ext.cuda_archs)
    assert report["failed"] == 0 and report["passed"] == len(report["checks"]) >= 7
    for check in report["checks"]:
        assert check["ok"] and check["op_ms"] > 0 and check["reference_ms"] > 0, check
    assert "NumPy" not in run.stderr


def test_bench_usage_names_the_module():
    run = _module("dsa_ext.bench", "--help", timeout=120)
    assert run.returncode == 0, run.stderr
    assert "usage: python -m dsa_ext.bench" in run.stdout
