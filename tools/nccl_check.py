"""Multi-GPU DCP check: merge_topk_global and merge_attention_outputs across real ranks
over NCCL, one GPU per rank.

    python tools/nccl_check.py --world 2 [--backend nccl|gloo] [--json PATH]

Per rank (spawned processes, rank r on cuda:r with NCCL; gloo runs the same on the CPU):
1. sharded == unsharded: the merged top-K equals the global top-K of the unsharded
   scores for interleave 1 and 16, k 512, 2048 and 3000 (ties, -inf/NaN, empty shards),
   and merging each rank's attention over its share of that selection gives the
   attention over the whole selection (fp32 and bf16 partial outputs);
2. CUDA graph (NCCL only): merge_topk_global captured once, replayed on new inputs copied
   into the captured buffers, equals the eager call on those inputs;
3. timing (NCCL only): rows 1, 64 and 256, k = 2048, a 64K-token context split over the
   ranks: graph-replay device time per call, eager wall time per call, and the graph time
   of the all-gather alone (its share of the call); merge_attention_outputs for B = 64,
   H = 128, D = 512 (bf16), graph and eager.
Rank 0 prints the results (and writes them to --json). Keep NVLink multicast off
(NCCL_NVLS_ENABLE=0) on shared hosts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dcp_cases import (assert_same, make_attention_inputs, make_topk_case,  # noqa: E402
                       merged_want, run_world, shard_selection, sparse_attention)
from dsa_ext.bench import _pack_inputs, capture, eager_us, graph_us  # noqa: E402

CONTEXT = 65536  # tokens of the timed rows, split over the ranks


def _timed_inputs(rows: int, k: int, world: int, device, seed: int):
    return _pack_inputs(rows, k, device, seed, cols=CONTEXT // world)


def _check_attention(dsa_ext, topk, k: int, case: dict, case_seed: int, rank: int,
                     world: int, interleave: int, device, ctx: dict) -> None:
    """merge_attention_outputs over this rank's share of the merged selection == the
    attention over all of it (reference attention on the CPU, the merge on `device`)."""
    sel = topk[:, :k].cpu()
    q, keys, values = make_attention_inputs(case_seed, sel.shape[0],
                                            case["scores"].shape[1], heads=4 * world)
    part_out, part_lse = sparse_attention(q, keys, values,
                                          shard_selection(sel, rank, world, interleave))
    full_out, full_lse = sparse_attention(q, keys, values, sel)
    heads = slice(rank * 4, (rank + 1) * 4)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        merged, lse = dsa_ext.merge_attention_outputs(
            part_out.to(device, dtype), part_lse.to(device), rank=rank, world_size=world,
            return_lse=True)
        torch.testing.assert_close(merged.float().cpu(), torch.nan_to_num(full_out[:, heads]),
                                   rtol=tol, atol=tol, msg=lambda m: f"{m} {ctx} {dtype}")
        torch.testing.assert_close(lse.cpu(), full_lse[:, heads], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"lse {m} {ctx} {dtype}")


def _graph_and_timing(dsa_ext, rank: int, world: int, device) -> dict:
    """Steps 2 and 3 (NCCL). A function of its own so that its CUDA graphs, which hold
    NCCL kernels, are freed before the process group is destroyed (a run that still held
    one at that point hung at exit)."""
    import torch.distributed as dist
    report = {"timing": []}
    # 2. graph capture, replay on new inputs
    k, rows = 2048, 64
    logits, ids = _timed_inputs(rows, k, world, device, seed=rank)
    topk = ids.clone()

    def merge():
        topk.copy_(ids)
        dsa_ext.merge_topk_global(logits, topk, k, rank=rank, world_size=world)
    graph = capture([merge], launches=1)
    for seed in (7, 8):
        new_logits, new_ids = _timed_inputs(rows, k, world, device, seed=seed + rank)
        logits.copy_(new_logits)
        ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        want = new_ids.clone()
        dsa_ext.merge_topk_global(new_logits, want, k, rank=rank, world_size=world)
        assert_same(topk.cpu(), want.cpu(), "graph replay", rank=rank, seed=seed)
    report["graph_replay"] = "equal to eager on 2 new inputs"
    # 3. timing
    for rows in (1, 64, 256):
        logits, ids = _timed_inputs(rows, k, world, device, seed=rank)
        topk = ids.clone()
        packed = dsa_ext.pack_dcp_topk_candidates(logits, ids, rank, world)
        gathered = torch.empty((world * rows, k), dtype=torch.int64, device=device)

        def call():
            topk.copy_(ids)
            dsa_ext.merge_topk_global(logits, topk, k, rank=rank, world_size=world)

        def gather():
            dist.all_gather_into_tensor(gathered, packed)
        report["timing"].append(dict(
            rows=rows, k=k, cols_per_rank=CONTEXT // world,
            graph_us=round(graph_us([call], replays=10, before_replay=dist.barrier), 2),
            eager_us=round(eager_us([call], iters=50, before_run=dist.barrier), 2),
            all_gather_graph_us=round(
                graph_us([gather], replays=10, before_replay=dist.barrier), 2)))
    B, H, D = 64, 128, 512
    g = torch.Generator(device=device).manual_seed(rank)
    part_out = torch.randn(B, H, D, generator=g, device=device).to(torch.bfloat16)
    part_lse = torch.randn(B, H, generator=g, device=device)

    def merge_attention():
        dsa_ext.merge_attention_outputs(part_out, part_lse, rank=rank,
                                        world_size=world)
    report["attention_timing"] = dict(
        B=B, H=H, D=D, dtype="bfloat16",
        graph_us=round(graph_us([merge_attention], replays=10,
                                before_replay=dist.barrier), 2),
        eager_us=round(eager_us([merge_attention], iters=50, before_run=dist.barrier), 2))
    return report


def worker(rank: int, world: int, port: int, backend: str, json_path: str) -> None:
    import torch.distributed as dist

    import dsa_ext
    nccl = backend == "nccl"
    device = torch.device("cuda", rank) if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    report = {"world": world, "backend": backend, "checked": [], "timing": []}
    try:
        # 1. sharded == unsharded
        for interleave in (1, 16):
            for k in (512, 2048, 3000):
                case = make_topk_case(100 * interleave + k, world, interleave, rows=6,
                                      max_len=3 * k, k=k, ties=k != 2048, device=device)
                mine = case["ranks"][rank]
                ctx = dict(rank=rank, interleave=interleave, k=k)
                for order in (True, False):
                    topk = mine["topk"].clone()
                    dsa_ext.merge_topk_global(mine["logits"], topk, k, rank=rank,
                                              world_size=world, interleave=interleave,
                                              sorted=order)
                    assert_same(topk[:, :k].cpu(), merged_want(case, order), "merged top-k",
                                sorted=order, **ctx)
                    assert bool((topk[:, k:] == -1).all()), f"columns >= k must be -1 {ctx}"
                _check_attention(dsa_ext, topk, k, case, 100 * interleave + k, rank, world,
                                 interleave, device, ctx)
                report["checked"].append(ctx)
        if nccl:
            report.update(_graph_and_timing(dsa_ext, rank, world, device))
        dist.barrier()
        if rank == 0:
            if nccl:
                report["device"] = torch.cuda.get_device_name(device)
                report["torch"] = torch.__version__
                report["nccl"] = str(torch.cuda.nccl.version())
            print(json.dumps(report, indent=1), flush=True)
            if json_path:
                Path(json_path).write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if nccl:
            torch.cuda.synchronize()
        # gloo's teardown before torch 2.5 hangs now and then (the process exits anyway)
        if nccl or torch.__version__ >= (2, 5):
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--json", default="", help="write rank 0's report here")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.backend == "nccl" and torch.cuda.device_count() < args.world:
        sys.exit(f"needs {args.world} GPUs, found {torch.cuda.device_count()}")
    run_world(args.world, worker, args=(args.backend, args.json), timeout=600)


if __name__ == "__main__":
    main()
