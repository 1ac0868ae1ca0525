"""The release wheel (tools/build_wheel.sh runs this on it): its tag, its contents, the
linkage of its one binary.

Runs on the wheel named by DSA_EXT_WHEEL (skipped without it: a source checkout has no
wheel to look at). The linkage is checked against auditwheel's own manylinux_2_28 policy.
"""
import importlib.resources
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import RELEASE_ARCHS, cubin_archs, sm_names, tool_path

ROOT = Path(__file__).resolve().parents[1]
WHEEL = os.environ.get("DSA_EXT_WHEEL")
PLAT = "manylinux_2_28_x86_64"
NEWEST_GLIBC = (2, 28)

pytestmark = pytest.mark.skipif(not WHEEL, reason="set DSA_EXT_WHEEL=path/to/the.whl "
                                                  "(tools/build_wheel.sh does)")

#: the libraries the module loads: glibc's (libpthread, libdl and librt hold the old
#: symbol versions on glibc < 2.34) and libgcc_s; never libstdc++ (linked statically),
#: libtorch, the CUDA runtime (linked statically) or the driver (dlopen at first CUDA use)
NEEDED = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
          "ld-linux-x86-64.so.2", "libgcc_s.so.1"}


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
    assert plat_tags == PLAT, f"{name} is not tagged {PLAT} (alone)"
    tags = [line.split(": ", 1)[1] for line in
            wheel.read(f"{_dist_info(wheel)}/WHEEL").decode().splitlines()
            if line.startswith("Tag: ")]
    assert tags == [f"{python_tag}-{abi_tag}-{PLAT}"], tags
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


@pytest.fixture(scope="module")
def policy() -> dict:
    """auditwheel's policy for PLAT: the libraries and symbol versions it allows."""
    text = (importlib.resources.files("auditwheel") / "policy" /
            "manylinux-policy.json").read_text()
    name = PLAT.removesuffix("_x86_64")
    (entry,) = [p for p in json.loads(text) if p["name"] == name]
    return {"libs": set(entry["lib_whitelist"]),
            "versions": {prefix: set(versions) for prefix, versions in
                         entry["symbol_versions"]["x86_64"].items()}}


def _version_needs(module_so) -> dict[str, set[str]]:
    """{library: the symbol versions the module needs from it}, from .gnu.version_r."""
    text = _run("readelf", "-V", "-W", str(module_so))
    needs, library = {}, None
    for line in text[text.index("Version needs section"):].splitlines():
        if match := re.search(r"\bFile: (\S+)", line):
            library = match.group(1)
            needs[library] = set()
        elif (match := re.search(r"\bName: (\S+)", line)) and library is not None:
            needs[library].add(match.group(1))
    return needs


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(v) for v in name.split("_", 1)[1].split("."))


def test_linkage(module_so, policy):
    dynamic = _run("readelf", "-d", str(module_so))
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert needed == NEEDED, sorted(needed ^ NEEDED)
    assert needed - {"ld-linux-x86-64.so.2"} <= policy["libs"]  # the loader: always there
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic  # nothing grafted in

    needs = _version_needs(module_so)
    assert set(needs) <= needed and needs.get("libc.so.6"), needs
    versions = set().union(*needs.values())
    for version in sorted(versions):
        prefix, number = version.split("_", 1)
        assert number in policy["versions"].get(prefix, ()), f"{version} is not in {PLAT}"
    glibc = max(_version(v) for v in versions if v.startswith("GLIBC_"))
    assert glibc <= NEWEST_GLIBC, f"needs GLIBC_{'.'.join(map(str, glibc))}"
    # the C++ runtime is the module's own: no libstdc++ symbol versions at all
    assert not {v for v in versions if v.startswith(("GLIBCXX_", "CXXABI_"))}, versions

    exported = _run("nm", "-D", "--defined-only", str(module_so)).split()[2::3]
    assert exported == ["PyInit__C"], exported  # bundled runtimes stay private
    undefined = [line.split()[-1].split("@")[0]
                 for line in _run("nm", "-D", "--undefined-only", str(module_so)).splitlines()]
    foreign = [s for s in undefined if re.match(r"_ZN3c10|_ZN2at|cuda[A-Z]|cu[A-Z]", s)]
    assert undefined and not foreign, f"needs libtorch, CUDA runtime or driver symbols: {foreign}"


def test_machine_code_for_the_release_archs(module_so):
    """SASS for sm_90a and sm_100a, and no PTX (nothing is compiled at run time)."""
    listing = _run(tool_path("cuobjdump"), "--list-elf", str(module_so))
    assert cubin_archs(listing) == sm_names(RELEASE_ARCHS), listing
    assert not _run(tool_path("cuobjdump"), "--list-ptx", str(module_so)).strip()
