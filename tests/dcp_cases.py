"""Shared DCP test material: sharded top-K cases, a reference sparse attention, the
multi-process (gloo) worker and its launcher, and in-process fake exchanges."""
from __future__ import annotations

import math
import os
import socket
import sys
import time
from datetime import timedelta

import torch

from dsa_ext import reference

# ---------------------------------------------------------------------------------------
# Sharded indexer cases
# ---------------------------------------------------------------------------------------


def make_topk_case(seed: int, world: int, interleave: int, rows: int = 6, max_len: int = 80,
                   k: int = 16, extra_cols: int = 0, ties: bool = True,
                   row_starts: bool = False, device="cpu") -> dict:
    """Global indexer scores and every rank's local logits / local top-K (local ids).

    Lengths include 0 and values below W*I (empty shards); k may exceed a shard; with
    `ties` the scores take few distinct values (ties inside and across ranks); some -inf,
    +-0 and +NaN scores appear. Each rank's local top-K uses the reference total order
    (lower position first among ties), as the merge requires.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (rows,), generator=g)
    lengths[0] = 0
    if rows > 1:
        lengths[1] = min(max_len, int(torch.randint(1, world * interleave + 1, (1,),
                                                    generator=g)))
    if ties:
        scores = torch.randint(-3, 4, (rows, max_len), generator=g).float() * 0.5
    else:
        scores = torch.randn(rows, max_len, generator=g)
    special = torch.tensor([float("-inf"), -0.0, 0.0, float("nan")])
    mask = torch.rand(rows, max_len, generator=g) < 0.05
    scores[mask] = special[torch.randint(0, 4, (int(mask.sum()),), generator=g)]
    want = reference.indexer_topk(scores, k, lengths)
    K = k + extra_cols
    ranks = []
    for r in range(world):
        local_len = reference.dcp_local_length(lengths, r, world, interleave)
        width = reference.dcp_local_length(max_len, r, world, interleave)
        gpos = reference.dcp_global_position(torch.arange(width), r, world, interleave)
        local = scores[:, gpos]
        topk = reference.indexer_topk(local, K, local_len).contiguous()
        starts = None
        if row_starts:
            starts = torch.randint(0, 5, (rows,), generator=g, dtype=torch.int32)
            padded = torch.randn(rows, width + 5, generator=g)
            for i in range(rows):
                padded[i, int(starts[i]):int(starts[i]) + width] = local[i]
            local = padded
        ranks.append(dict(logits=local.to(device), topk=topk.to(device),
                          row_starts=None if starts is None else starts.to(device)))
    return dict(scores=scores, lengths=lengths, want=want, ranks=ranks, k=k, K=K,
                world=world, interleave=interleave)


# ---------------------------------------------------------------------------------------
# Reference sparse attention (fp64 inside)
# ---------------------------------------------------------------------------------------


def make_attention_inputs(seed: int, rows: int, max_len: int, heads: int = 8, dk: int = 16,
                          dv: int = 8) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, heads, dk, generator=g), torch.randn(rows, max_len, dk, generator=g),
            torch.randn(rows, max_len, dv, generator=g))


def sparse_attention(q, keys, values, selected, lse_base: float = 2.0):
    """Attention of q [B, H, Dk] over the tokens `selected` [B, n] (global ids, -1 = none).

    Returns (out fp32 [B, H, D], lse fp32 [B, H] in base `lse_base`); a row with no
    token gives NaN outputs and -inf LSE, like a kernel's empty split."""
    B, H, _ = q.shape
    D = values.shape[2]
    out = torch.full((B, H, D), float("nan"), dtype=torch.float64)
    lse = torch.full((B, H), float("-inf"), dtype=torch.float64)
    scale = 1.0 / math.sqrt(q.shape[2])
    for b in range(B):
        ids = selected[b][selected[b] >= 0].long()
        if ids.numel() == 0:
            continue
        s = (q[b].double() @ keys[b, ids].double().T) * scale  # [H, n]
        lse[b] = torch.logsumexp(s, dim=1)
        out[b] = torch.softmax(s, dim=1) @ values[b, ids].double()
    if lse_base == 2.0:
        lse = lse / math.log(2.0)
    return out.float(), lse.float()


def shard_selection(selected: torch.Tensor, rank: int, world: int, interleave: int):
    """The selected global ids this rank owns (others -> -1)."""
    sel = selected.long()
    mine = (sel >= 0) & (reference.dcp_owner(sel, world, interleave) == rank)
    return torch.where(mine, sel, torch.full_like(sel, -1))


# ---------------------------------------------------------------------------------------
# In-process fake exchanges (W ranks simulated in one process)
# ---------------------------------------------------------------------------------------


def fake_all_gather(all_inputs: list, rank: int):
    """An all_gather hook for `rank` that returns every rank's (precomputed) input."""
    def hook(output: torch.Tensor, input: torch.Tensor) -> None:
        assert torch.equal(input, all_inputs[rank]), "hook input differs from rank's input"
        output.copy_(torch.cat(all_inputs, dim=0))
    return hook




# ---------------------------------------------------------------------------------------
# Multi-process worlds (gloo on loopback)
# ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, fn, args: tuple = (), timeout: float = 150.0) -> None:
    """Run fn(rank, world, port, *args) in `world` spawned processes; raise on a failure
    or after `timeout` seconds (the processes are killed either way)."""
    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"world of {world} processes did not finish in {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(5)


def init_gloo(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))


def close_gloo() -> None:
    """End a worker whose checks all passed, after its last barrier.

    torch >= 2.5: destroy_process_group, and the worker returns. Before 2.5 gloo's teardown
    fails both ways (torch 2.4.1, 4 ranks): destroy_process_group hung about 1 run in 5,
    and a process that exits with the group alive aborted now and then at interpreter exit
    ("terminate called without an active exception", a joinable thread destroyed). So the
    worker leaves with os._exit(0), which runs no destructor; every collective is done by
    then, and a failure never gets here (the spawn wrapper reports its exception)."""
    import torch.distributed as dist
    if torch.__version__ >= (2, 5):
        dist.destroy_process_group()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str, **ctx) -> None:
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        bad = (got != want).nonzero()
        where = tuple(bad[0].tolist()) if bad.numel() else "shape"
        raise AssertionError(f"{what}: mismatch at {where} {ctx}\ngot  {got}\nwant {want}")


def merged_want(case: dict, sorted: bool = False) -> torch.Tensor:
    """[rows, k] ids merge_topk_global must write for `case`: with `sorted`, the unsharded
    top-K; by default the reference merge (the same set, in gathered order)."""
    if sorted:
        return case["want"]
    ranks = case["ranks"]
    starts = None if ranks[0]["row_starts"] is None else [r["row_starts"].cpu() for r in ranks]
    got = reference.merge_topk_global([r["logits"].cpu() for r in ranks],
                                      [r["topk"].cpu() for r in ranks], case["k"],
                                      case["interleave"], starts)[:, :case["k"]]
    assert_same(got.sort(dim=1).values, case["want"].sort(dim=1).values,
                "the reference merge's set")
    return got


def dcp_merge_worker(rank: int, world: int, port: int, seed: int, n_cases: int) -> None:
    """Every case: merged top-K == the reference merge (its set: the unsharded top-K; with
    sorted=True the unsharded top-K itself); merged attention == unsharded one."""
    import torch.distributed as dist

    import dsa_ext
    from dsa_ext import dcp
    init_gloo(rank, world, port)
    for i in range(n_cases):
        # odd cases: the list-based collectives (backends without the fused ones)
        dcp._UNFUSED.clear()
        if i % 2:
            dcp._UNFUSED.update({("all_gather", "gloo"), ("reduce_scatter", "gloo")})
        group = dist.group.WORLD if i % 4 < 2 else None
        interleave = (1, 2, 16)[i % 3]
        base = (2.0, math.e)[(i // 3) % 2]
        k = (4, 16, 40)[i % 3]
        case = make_topk_case(seed * 1000 + i, world, interleave, rows=5,
                              max_len=(24, 80, 150)[(i + 1) % 3], k=k,
                              extra_cols=(0, 3)[i % 2], ties=i % 4 != 3,
                              row_starts=i % 2 == 1)
        mine = case["ranks"][rank]
        topk = mine["topk"].clone()
        order = i % 3 == 2  # sorted=True in every third case
        dsa_ext.merge_topk_global(mine["logits"], topk, k, rank=rank, world_size=world,
                                  interleave=interleave, group=group,
                                  row_starts=mine["row_starts"], sorted=order)
        ctx = dict(rank=rank, case=i, interleave=interleave, k=k, sorted=order)
        assert_same(topk[:, :k], merged_want(case, order), "merged top-k", **ctx)
        assert (topk[:, k:] == -1).all(), f"columns >= k must be -1 {ctx}"

        q, keys, values = make_attention_inputs(seed * 1000 + i, 5, case["scores"].shape[1],
                                                heads=4 * world)
        sel = topk[:, :k]
        part_out, part_lse = sparse_attention(
            q, keys, values, shard_selection(sel, rank, world, interleave), base)
        full_out, full_lse = sparse_attention(q, keys, values, sel, base)
        dtype = torch.bfloat16 if i % 5 == 4 else torch.float32
        merged, lse = dsa_ext.merge_attention_outputs(
            part_out.to(dtype), part_lse, rank=rank, world_size=world, group=group,
            lse_base=base, return_lse=True)
        Hl = q.shape[1] // world
        heads = slice(rank * Hl, (rank + 1) * Hl)
        want_out = torch.nan_to_num(full_out[:, heads], nan=0.0)  # empty rows -> 0
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else \
            dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(merged.float(), want_out, **tol, msg=lambda m: f"{m} {ctx}")
        torch.testing.assert_close(lse, full_lse[:, heads], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"lse {m} {ctx}")
    dist.barrier()
    close_gloo()
