"""Export the CuTeDSL top-K kernels ahead of time: cubins plus a manifest, no GPU needed.

Usage (one process per arch is used internally; CUTE_DSL_ARCH is set for each):

    python cute_dsl_aot/export.py --out cute_dsl_aot/out                  # sm_90a and sm_100a
    python cute_dsl_aot/export.py --out DIR --arch sm_90a                  # one arch

Writes, per arch, ``stable_topk_<variant>_<arch>.cubin`` and ``stable_topk_<arch>.json``
(entry names, launch geometry, parameter layout). The build embeds them
(``cute_dsl_aot/embed.py``); a build without nvidia-cutlass-dsl takes an exported folder
through ``DSA_EXT_CUBIN_DIR``. Output is byte-for-byte reproducible.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ARCHS = ("sm_90a", "sm_100a")

#: (name, threads per CTA, sort size S, keys per thread in registers, log2 of the keys
#: per sorting thread, a CTA pair per row, CTAs per SM). The launcher picks the first
#: variant with next_pow2(min(k, N)) <= S and W * ceil(K / threads) <= keys_per_thread
#: (times 2 for a pair; 0: streamed, any N), skipping pairs when 2 * rows exceeds the
#: SMs and variants of 2 CTAs per SM while the rows fit the SMs one CTA each.
#: - A pair sorts with 4 keys per thread: each CTA sorts half the keys, and twice the
#:   sorting warps of 8 keys per thread hide more latency (H200, 64 rows, k = 2048: 14.6
#:   against 15.2 us).
#: - d16 (512 threads, 2 CTAs per SM) against r8, H200 (132 SMs), W = 4, K = 2048,
#:   k = S = 2048 (seventh session's select): 132 rows +7%, 200 rows -15%, 264 -13%,
#:   396 -3%, 528 -11%, 792 -13%, 1024 -13%. (Older select, S = 1024 / 512 at 1024
#:   rows: -5.6% / -2.6%; S = 4096: -1.4%, not exported.)
VARIANTS = tuple(
    (f"{kind}_s{size}", threads, size, items, 2 if kind[0] == "p" else 3, kind[0] == "p",
     ctas)
    for size in (512, 1024, 2048, 4096, 8192)
    for kind, threads, items, ctas in (("p4", 1024, 4, 1), ("p8", 1024, 8, 1),
                                       ("d16", 512, 16, 2), ("r8", 1024, 8, 1),
                                       ("r16", 1024, 16, 1), ("g", 1024, 0, 1))
    if kind == "g" or (size <= 4096 and (kind != "d16" or size <= 2048))
) + (("g_s16384", 1024, 16384, 0, 4, False, 1),)

#: Kernel parameters in order, as the launcher must pass them. A dynamic cute.Tensor is
#: passed by value as {void* data; int32 shape[#dynamic]; int64 stride[#dynamic]}.
PARAMS = [
    "cand: {const int64* data; int32 shape[3] (W, rows, K); int64 stride[3]}",
    "out: {int32* data; int32 shape[2] (rows, k); int64 stride[2]}",
    "sel: int32 = min(k, W*K)",
]
ABI_VERSION = 3


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

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stable_topk

    variants = []
    # CuTeDSL writes the kept cubin (and PTX) into a dump folder: use a scratch one.
    scratch = tempfile.mkdtemp(prefix="dsa_topk_export_")
    options = f"--gpu-arch {arch} --keep-cubin --dump-dir {scratch}"
    if keep_ptx:
        options += " --keep-ptx"
    for name, threads, sort_size, items, log_r, pair, ctas_per_sm in VARIANTS:
        fn = stable_topk.make_stable_topk(threads, sort_size, items, log_r, pair,
                                          ctas_per_sm)
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
        cubin_name = f"stable_topk_{name}_{arch}.cubin"
        with open(os.path.join(out_dir, cubin_name), "wb") as fh:
            fh.write(compiled.artifacts.CUBIN)
        if keep_ptx:
            with open(os.path.join(out_dir, cubin_name[:-6] + ".ptx"), "w") as fh:
                fh.write(compiled.artifacts.PTX)
        variants.append({
            "name": name,
            "cubin": cubin_name,
            "entry": entries[0],
            "block": [threads, 1, 1],
            "cluster": [2 if pair else 1, 1, 1],
            "dynamic_smem": stable_topk.smem_bytes(sort_size, pair),
            "sort_size": sort_size,
            "keys_per_thread": items,
            "ctas_per_sm": ctas_per_sm,
        })
    manifest = {"arch": arch, "abi_version": ABI_VERSION, "params": PARAMS,
                "variants": variants}
    shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out_dir, f"stable_topk_{arch}.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--arch", action="append", choices=ARCHS,
                        help="arch to export (repeatable; default: all)")
    parser.add_argument("--keep-ptx", action="store_true", help="also write the PTX")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    archs = args.arch or list(ARCHS)
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
