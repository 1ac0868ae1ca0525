#!/usr/bin/env python3
"""DeepGEMM's paged MQA logits against dsa_ext's decode-path table, on the GPU it runs on.

For next_n = 1..4 at decode-step shapes (B requests, contexts up to --context tokens,
64 heads of 128, KV blocks of 64), one table row each:
  - what indexer.decode_path says for this device (and for sm_90);
  - whether DeepGEMM takes the batch natively ([B, next_n]) or refuses it (its message);
  - native == flattened ([B * next_n, 1]) bit for bit, when both run;
  - DeepGEMM against the torch path: the largest |difference| as a share of the fp8
    bound of tests/test_mqa_logits.py (2^-9 of the sum of absolute terms), and
    DeepGEMM's own calc_diff measure;
  - microseconds per CUDA-graph replay of paged_mqa_logits (DeepGEMM, then the -inf past
    each row), native and flattened, schedules built beforehand as build_decode does.

    python tools/deepgemm_check.py --json check.json [--commit-file .dg/DEEPGEMM_COMMIT]

Exit code 1 if the table and the kernel disagree or an equality or bound fails.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from dsa_ext import decode_path
from dsa_ext.bench import graph_us
from dsa_ext.indexer import IndexerMetadataBuilder
from dsa_ext.mqa_logits import (deep_gemm, paged_mqa_logits, quantize_fp8_kv_cache,
                                unpack_fp8_kv_cache)

H, D, BS = 64, 128, 64
#: Requests per next_n (--batch for the others): DeepGEMM JIT-compiles its schedule
#: kernel per 32-row multiple of the batch; 40 x 3 = 120 rows flattened shares the
#: 128-row one of 64 x 2 (and the tests use the same batches).
BATCH_NEXT_N_3 = 40


def case(B, next_n, context, seed):
    g = torch.Generator().manual_seed(seed)
    NB = -(-context // BS)
    S = torch.randint(max(context // 2, next_n), context + 1, (B,), generator=g,
                      dtype=torch.int32)
    table = torch.randperm(B * NB, generator=g).to(torch.int32).view(B, NB)
    kv = quantize_fp8_kv_cache(torch.randn(B * NB, BS, D, generator=g))
    q = torch.randn(B, next_n, H, D, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(B * next_n, H, generator=g) / H**0.5
    return {k: v.cuda() for k, v in dict(S=S, table=table, kv=kv, q=q, w=w).items()}


def metadata(c, next_n, context, native):
    """Native layout (an sm_100 build, native for any next_n) or flattened (the same
    tokens as a ragged batch), with DeepGEMM's schedule."""
    B = c["S"].shape[0]
    b = IndexerMetadataBuilder("cuda", next_n, BS, B, context, capability=(10, 0),
                               materialize_block_table=True, deep_gemm_schedule=True)
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda") * next_n
    return b.build_decode(c["S"], qsl, c["table"], B, B * next_n, uniform=native)


def logits(c, md, use_deep_gemm=True, absolute=False):
    q, kv, w, scale = c["q"], c["kv"], c["w"], None
    if absolute:  # the fp8 bound's sum of absolute terms
        values, scale = unpack_fp8_kv_cache(kv)
        q, kv, w = q.float().abs(), values.float().abs(), w.abs()
    if md.path == "flatten":
        q = q.view(-1, 1, H, D)
    return paged_mqa_logits(q, kv, scale, w, md.context_lens, md.block_table,
                            md.max_context_len, schedule_metadata=md.schedule_metadata,
                            use_deep_gemm=use_deep_gemm)


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def check_next_n(next_n, B, context, iters):
    cap = torch.cuda.get_device_capability()
    row = dict(next_n=next_n, batch=B, table_here=decode_path(cap, next_n),
               table_sm90=decode_path((9, 0), next_n))
    c = case(B, next_n, context, seed=next_n)
    flat = metadata(c, next_n, context, native=False)
    native = metadata(c, next_n, context, native=True)
    lf = logits(c, flat)
    try:
        ln = logits(c, native)
        torch.cuda.synchronize()
        row["deep_gemm_native"] = "runs"
        row["native_equals_flattened"] = bool(torch.equal(ln, lf))
        row["native_us"] = graph_us([lambda: logits(c, native)], launches=iters)
    except RuntimeError as e:
        row["deep_gemm_native"] = "refused: " + str(e).splitlines()[0][-160:]
    row["flattened_us"] = graph_us([lambda: logits(c, flat)], launches=iters)
    want = logits(c, flat, use_deep_gemm=False)
    finite = torch.isfinite(want)
    row["same_inf"] = bool(torch.equal(torch.isinf(lf), torch.isinf(want)))
    bound = 2.0**-9 * logits(c, flat, use_deep_gemm=False, absolute=True)
    ratio = ((lf - want).abs() / bound.clamp(min=torch.finfo(torch.float32).tiny))[finite]
    row["max_err_over_bound"] = ratio.max().item()
    row["max_abs_err"] = (lf - want).abs()[finite].max().item()
    row["calc_diff"] = calc_diff(lf[finite], want[finite])
    del want, bound, ratio, finite
    torch.cuda.empty_cache()
    # The sm_90 table against the kernel: native where it runs, flatten where refused
    # (or, if it runs, where native is not faster).
    agrees = True
    if cap[0] == 9:
        runs = row["deep_gemm_native"] == "runs"
        if row["table_sm90"] == "native":
            agrees = runs and row["native_equals_flattened"]
        elif runs:
            agrees = row["native_us"] >= row["flattened_us"]
    row["table_agrees"] = agrees
    row["ok"] = (agrees and row["same_inf"] and row["max_err_over_bound"] <= 1
                 and row["calc_diff"] < 5e-6)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--commit-file", help="DEEPGEMM_COMMIT written by tools/deepgemm_fetch.sh")
    p.add_argument("--json")
    a = p.parse_args(argv)
    dg = deep_gemm()
    if dg is None or not torch.cuda.is_available():
        print("needs a CUDA device and deep_gemm with the paged MQA logits API")
        return 2
    env = dict(gpu=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability(),
               torch=torch.__version__, deep_gemm=getattr(dg, "__version__", "?"),
               deep_gemm_source=open(a.commit_file).read().strip() if a.commit_file else None,
               api="fp8_fp4_paged_mqa_logits" if hasattr(dg, "fp8_fp4_paged_mqa_logits")
               else "fp8_paged_mqa_logits", batch=a.batch, context=a.context, heads=H,
               head_dim=D, block_size=BS)
    print(json.dumps(env))
    rows = [check_next_n(n, BATCH_NEXT_N_3 if n == 3 else a.batch, a.context, a.iters)
            for n in range(1, 5)]
    print("| next_n | B | table (sm_90) | DeepGEMM native | native == flat | native us | "
          "flattened us | max err / bound | calc_diff | ok |")
    print("|---|---:|---|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        native_us = f"{r['native_us']:.1f}" if "native_us" in r else "-"
        print(f"| {r['next_n']} | {r['batch']} | {r['table_sm90']} | {r['deep_gemm_native']} | "
              f"{r.get('native_equals_flattened', '-')} | {native_us} | "
              f"{r['flattened_us']:.1f} | {r['max_err_over_bound']:.3g} | "
              f"{r['calc_diff']:.2g} | {r['ok']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
