"""Export the CuTeDSL top-K kernels ahead of time: cubins plus a manifest, no GPU needed.

Usage (one process per arch is used internally; CUTE_DSL_ARCH is set for each):

    python cute_dsl_aot/export.py --out cute_dsl_aot/out --arch sm_90a --arch sm_100a
    python cute_dsl_aot/export.py --out DIR --arch sm_90a                  # one arch

The build passes the "a" archs of CMAKE_CUDA_ARCHITECTURES (the one arch list).

Writes, per arch, ``stable_topk_<variant>_<arch>.cubin`` and ``stable_topk_<arch>.json``
(entry names, launch geometry, parameter layout: the facts of ``variants.py``). The build
embeds them (``cute_dsl_aot/embed.py``); a build without nvidia-cutlass-dsl takes an
exported folder through ``DSA_EXT_CUBIN_DIR``. Output is byte-for-byte reproducible.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variants import ABI_VERSION, PARAMS, VARIANTS, smem_bytes  # noqa: E402


def export_arch(arch: str, out_dir: str, keep_ptx: bool = False) -> dict:
    """Compile every variant for `arch` (CUTE_DSL_ARCH must equal it) and write the files."""
    if os.environ.get("CUTE_DSL_ARCH") != arch:
        raise RuntimeError(f"set CUTE_DSL_ARCH={arch} in the environment to export {arch}")
    # No compile cache on disk: exports for several archs may run in parallel (the build
    # does), and every export should really compile.
    os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import make_fake_tensor

    import stable_topk

    exported = []
    # CuTeDSL writes the kept cubin (and PTX) into a dump folder: use a scratch one.
    scratch = tempfile.mkdtemp(prefix="dsa_topk_export_")
    options = f"--gpu-arch {arch} --keep-cubin --dump-dir {scratch}"
    if keep_ptx:
        options += " --keep-ptx"
    for v in VARIANTS:
        fn = stable_topk.make_stable_topk(v)
        cand = make_fake_tensor(
            cutlass.Int64, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
            stride=(cute.sym_int64(), cute.sym_int64(), cute.sym_int64()), assumed_align=8)
        out = make_fake_tensor(
            cutlass.Int32, (cute.sym_int(), cute.sym_int()),
            stride=(cute.sym_int64(), cute.sym_int64()), assumed_align=4)
        compiled = cute.compile(fn, cand, out, Int32(1), cuda.CUstream(0),
                                options=options)
        entries = list(compiled.kernel_info)
        if len(entries) != 1:
            raise RuntimeError(f"expected one kernel, got {entries}")
        cubin_name = f"stable_topk_{v.name}_{arch}.cubin"
        with open(os.path.join(out_dir, cubin_name), "wb") as fh:
            fh.write(compiled.artifacts.CUBIN)
        if keep_ptx:
            with open(os.path.join(out_dir, cubin_name[:-6] + ".ptx"), "w") as fh:
                fh.write(compiled.artifacts.PTX)
        exported.append({
            "name": v.name,
            "cubin": cubin_name,
            "entry": entries[0],
            "block": [v.threads, 1, 1],
            "cluster": [v.cluster, 1, 1],
            "dynamic_smem": smem_bytes(v),
            "sort_size": v.sort_size,
            "keys_per_thread": v.keys_per_thread,
            "ctas_per_sm": v.ctas_per_sm,
            "ranked": v.ranked,
        })
    manifest = {"arch": arch, "abi_version": ABI_VERSION, "params": PARAMS,
                "variants": exported}
    shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out_dir, f"stable_topk_{arch}.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--arch", action="append", required=True,
                        help="arch to export, e.g. sm_90a (repeatable)")
    parser.add_argument("--keep-ptx", action="store_true", help="also write the PTX")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    archs = args.arch
    if len(archs) == 1 and os.environ.get("CUTE_DSL_ARCH") == archs[0]:
        export_arch(archs[0], args.out, args.keep_ptx)
        return
    # CuTeDSL picks its target once per process: one child process per arch.
    for arch in archs:
        env = dict(os.environ, CUTE_DSL_ARCH=arch)
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--arch", arch]
        subprocess.run(cmd + (["--keep-ptx"] if args.keep_ptx else []), env=env, check=True)


if __name__ == "__main__":
    main()
