"""The release wheel (tools/build_wheel.sh runs this on it): its tag, its contents, the
linkage of its one binary.

Runs on the wheel named by DSA_EXT_WHEEL (skipped without it: a source checkout has no
wheel to look at); DSA_EXT_WHEEL_PLAT is the platform tag it must carry.
"""
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEEL = os.environ.get("DSA_EXT_WHEEL")
PLAT = os.environ.get("DSA_EXT_WHEEL_PLAT", "manylinux_2_28_x86_64")

pytestmark = pytest.mark.skipif(not WHEEL, reason="set DSA_EXT_WHEEL=path/to/the.whl "
                                                  "(tools/build_wheel.sh does)")

#: newest symbol versions of each tag (the manylinux policies, as auditwheel has them)
NEWEST = {
    "manylinux_2_28_x86_64": {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11)},
    "manylinux_2_34_x86_64": {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)},
}

#: the libraries the module may load: glibc's and the C++ runtime, never libtorch, the
#: CUDA runtime (linked statically) or the driver (dlopen at first CUDA use)
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
               "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1"}


def _project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    with zipfile.ZipFile(WHEEL) as zf:
        yield zf


@pytest.fixture(scope="module")
def module_so(wheel, tmp_path_factory) -> Path:
    (name,) = [n for n in wheel.namelist() if re.fullmatch(r"dsa_ext/_C\..*\.so", n)]
    return Path(wheel.extract(name, tmp_path_factory.mktemp("wheel")))


def _dist_info(wheel) -> str:
    return f"dsa_ext-{_project_version()}.dist-info"


def test_tag(wheel):
    version = _project_version()
    name = Path(WHEEL).name
    match = re.fullmatch(rf"dsa_ext-{re.escape(version)}-(cp3\d+)-(cp3\d+)-(.+)\.whl", name)
    assert match, name
    python_tag, abi_tag, plat_tags = match.groups()
    assert python_tag == abi_tag
    assert PLAT in plat_tags.split("."), f"{name} is not tagged {PLAT}"
    assert "linux_x86_64" not in plat_tags.split("."), name  # PyPI refuses the bare tag
    tags = [line.split(": ", 1)[1] for line in
            wheel.read(f"{_dist_info(wheel)}/WHEEL").decode().splitlines()
            if line.startswith("Tag: ")]
    assert f"{python_tag}-{abi_tag}-{PLAT}" in tags, tags
    assert "Root-Is-Purelib: false" in wheel.read(f"{_dist_info(wheel)}/WHEEL").decode()


def test_contents(wheel):
    info = _dist_info(wheel)
    names = {n for n in wheel.namelist() if not n.endswith("/")}  # auditwheel adds folders
    package = {n for n in names if n.startswith("dsa_ext/")}
    sources = {f"dsa_ext/{p.name}" for p in (ROOT / "python" / "dsa_ext").glob("*.py")}
    binaries = {n for n in package if n.endswith(".so")}
    assert package == sources | binaries, sorted(package ^ (sources | binaries))
    assert len(binaries) == 1 and next(iter(binaries)).startswith("dsa_ext/_C."), binaries
    for source in sources:  # the shipped Python is the checkout's
        assert wheel.read(source) == (ROOT / "python" / source).read_bytes(), source
    others = names - package
    assert others == {f"{info}/{n}" for n in
                      ("METADATA", "WHEEL", "RECORD", "licenses/LICENSE")}, sorted(others)
    assert wheel.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert sorted(requires) == ["numpy", "torch>=2.4.1"], requires


def _run(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_linkage(module_so):
    dynamic = _run("readelf", "-d", str(module_so))
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert needed and needed <= SYSTEM_LIBS, sorted(needed - SYSTEM_LIBS)
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic  # nothing grafted in
    symbols = _run("objdump", "-T", str(module_so))
    for prefix, newest in NEWEST[PLAT].items():
        versions = {tuple(int(v) for v in m.split("."))
                    for m in re.findall(rf"\b{prefix}_(\d+(?:\.\d+)+)\b", symbols)}
        assert versions, f"no {prefix} symbol versions found"
        assert max(versions) <= newest, (
            f"needs {prefix}_{'.'.join(map(str, max(versions)))}, newer than {PLAT} allows")
    undefined = [line.split()[-1].split("@")[0]
                 for line in _run("nm", "-D", "--undefined-only", str(module_so)).splitlines()]
    foreign = [s for s in undefined if re.match(r"_ZN3c10|_ZN2at|cuda[A-Z]|cu[A-Z]", s)]
    assert undefined and not foreign, f"needs libtorch, CUDA runtime or driver symbols: {foreign}"
