#!/usr/bin/env python3
"""One DSA indexer decode step as a server runs it, stage by stage and as a whole:

    IndexerMetadataBuilder.build_decode
    -> paged MQA logits (DeepGEMM when importable, else the torch fallback)
    -> per-row top-K (dsa_ext.topk_per_row)
    -> with --dcp W: merge_topk_global over an in-process exchange of the W ranks
    -> convert_req_index_to_global_index(compact=True)
    -> safe_lengths

On a GPU each stage is captured in a CUDA graph and so is the whole step; the table gives
each stage's time per graph replay and the whole step's. Without a GPU (or with
--device cpu) it runs small shapes on the CPU, timed eagerly, and prints the same table.
Under --dcp W the W ranks run in this one process, stage by stage (every rank's stage,
then the next stage); times are per rank, the mean over the W ranks.

    python examples/decode_step.py                 # GPU: B=64, next_n=2, 32K contexts
    python examples/decode_step.py --dcp 2 --json step.json
    python examples/decode_step.py --device cpu    # small shapes
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

import dsa_ext
from dsa_ext import mqa_logits

STAGES = ("metadata", "logits", "topk", "merge", "convert", "safe_lengths")

#: Defaults per device: (batch, context, heads, head_dim, topk). The GPU ones are the
#: DeepSeek V3.2 indexer's (64 heads of 128, top-2048) over 32K-token contexts.
DEFAULTS = {"cuda": (64, 32768, 64, 128, 2048), "cpu": (4, 1024, 8, 32, 128)}


@dataclass
class Config:
    device: str
    batch: int
    next_n: int
    context: int
    block_size: int
    heads: int
    head_dim: int
    topk: int
    dcp: int
    iters: int
    seed: int


def parse_args(argv=None) -> tuple[Config, str | None]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--batch", type=int, help="decode requests B (GPU 64, CPU 4)")
    p.add_argument("--next-n", type=int, default=2, help="query tokens per request")
    p.add_argument("--context", type=int,
                   help="longest context in tokens; requests get 1/2 to all of it "
                        "(GPU 32768, CPU 1024)")
    p.add_argument("--block-size", type=int, default=64, help="KV block size")
    p.add_argument("--heads", type=int, help="indexer heads (GPU 64, CPU 8)")
    p.add_argument("--head-dim", type=int, help="indexer head dim (GPU 128, CPU 32)")
    p.add_argument("--topk", type=int, help="top-K per token (GPU 2048, CPU 128)")
    p.add_argument("--dcp", type=int, default=1, help="DCP world size W")
    p.add_argument("--iters", type=int, default=50, help="timed replays (or CPU steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the table as JSON to this path")
    a = p.parse_args(argv)
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    batch, context, heads, head_dim, topk = DEFAULTS[device]
    cfg = Config(device, a.batch or batch, a.next_n, a.context or context, a.block_size,
                 a.heads or heads, a.head_dim or head_dim, a.topk or topk, a.dcp, a.iters,
                 a.seed)
    if cfg.topk > cfg.context:
        p.error(f"--topk ({cfg.topk}) must be <= --context ({cfg.context})")
    return cfg, a.json


# ---------------------------------------------------------------------------------------
# Inputs: one KV cache, block table and builder per DCP rank; queries are replicated
# ---------------------------------------------------------------------------------------


@dataclass
class Rank:
    rank: int
    builder: dsa_ext.IndexerMetadataBuilder
    kv_cache: torch.Tensor      # fused FP8 cache of this rank's tokens
    block_table: torch.Tensor   # int32 [B, NB] of this rank's blocks
    topk_ids: torch.Tensor      # int32 [Td, k] out= buffers
    slots: torch.Tensor
    counts: torch.Tensor


def make_inputs(cfg: Config):
    dev = torch.device(cfg.device)
    g = torch.Generator().manual_seed(cfg.seed)
    B, n, W, bs = cfg.batch, cfg.next_n, cfg.dcp, cfg.block_size
    Td = B * n
    seq_lens = torch.randint(max(cfg.context // 2, n), cfg.context + 1, (B,), generator=g,
                             dtype=torch.int32)
    q = torch.randn(B, n, cfg.heads, cfg.head_dim, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(Td, cfg.heads, generator=g) / math.sqrt(cfg.heads)
    longest_local = -(-cfg.context // W)       # a rank's share of the longest context
    local_blocks = -(-longest_local // bs)
    use_dg = dev.type == "cuda" and mqa_logits.deep_gemm() is not None
    ranks = []
    for r in range(W):
        table = torch.randperm(B * local_blocks, generator=g).to(torch.int32)
        keys = torch.randn(B * local_blocks, bs, cfg.head_dim, generator=g)
        builder = dsa_ext.IndexerMetadataBuilder(
            dev, n, bs, B, cfg.context, dcp_world_size=W, dcp_rank=r,
            materialize_block_table=True, deep_gemm_schedule=use_dg)
        i32 = dict(dtype=torch.int32, device=dev)
        ranks.append(Rank(r, builder, mqa_logits.quantize_fp8_kv_cache(keys).to(dev),
                          table.view(B, local_blocks).to(dev),
                          torch.empty(Td, cfg.topk, **i32), torch.empty(Td, cfg.topk, **i32),
                          torch.empty(Td, **i32)))
    return seq_lens.to(dev), q.to(dev), weights.to(dev), ranks


# ---------------------------------------------------------------------------------------
# The stages
# ---------------------------------------------------------------------------------------


class InProcessExchange:
    """The all-gather of merge_topk_global among W ranks that run in this process in rank
    order. Rank 0's call packs every rank's candidates (each rank's logits and local
    top-K ids, which no merge has overwritten yet) into one ``[W * rows, K]`` buffer and
    every rank's call copies that buffer: the result of an ``all_gather_into_tensor``
    over W processes, on one stream (so it captures in the step's graph)."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.local = [None] * world_size   # (logits, local top-K ids) of each rank

    def all_gather_for(self, rank: int):
        def all_gather(out: torch.Tensor, inp: torch.Tensor) -> None:
            W, rows = self.world_size, inp.shape[0]
            if rank == 0:
                for w in range(1, W):
                    logits, ids = self.local[w]
                    dsa_ext.pack_dcp_topk_candidates(logits, ids, w, W,
                                                     out=out[w * rows:(w + 1) * rows])
                out[:rows].copy_(inp)
                self.gathered = out
            else:
                out.copy_(self.gathered)
        return all_gather


def local_topk(logits: torch.Tensor, row_ends: torch.Tensor, k: int,
               out: torch.Tensor) -> torch.Tensor:
    """Each row's k best columns below its row end (ids, then -1)."""
    return dsa_ext.topk_per_row(logits, k, lengths=row_ends, out=out)


class DecodeStep:
    """The stages of one decode step over every rank; each stage keeps its outputs for
    the next (``self.state[rank]``)."""

    def __init__(self, cfg: Config, seq_lens, q, weights, ranks):
        self.cfg, self.seq_lens, self.q, self.weights, self.ranks = (
            cfg, seq_lens, q, weights, ranks)
        self.exchange = InProcessExchange(cfg.dcp)
        self.state = [dict() for _ in ranks]

    def metadata(self):
        B, n = self.cfg.batch, self.cfg.next_n
        for rk, st in zip(self.ranks, self.state):
            st["md"] = rk.builder.build_decode(self.seq_lens, None, rk.block_table, B, B * n,
                                               uniform=True)

    def logits(self):
        for rk, st in zip(self.ranks, self.state):
            md = st["md"]
            q = self.q if md.path == "native" else self.q.view(-1, 1, *self.q.shape[2:])
            # materialize_block_table: a flattened build has one table row per token.
            st["logits"] = mqa_logits.paged_mqa_logits(
                q, rk.kv_cache, None, self.weights, md.context_lens, md.block_table,
                md.max_context_len, schedule_metadata=md.schedule_metadata)

    def topk(self):
        for rk, st in zip(self.ranks, self.state):
            local_topk(st["logits"], st["md"].row_ends, self.cfg.topk, rk.topk_ids)
            self.exchange.local[rk.rank] = (st["logits"], rk.topk_ids)

    def merge(self):
        W = self.cfg.dcp
        if W == 1:
            return
        for rk, st in zip(self.ranks, self.state):
            dsa_ext.merge_topk_global(st["logits"], rk.topk_ids, self.cfg.topk, rank=rk.rank,
                                      world_size=W,
                                      all_gather=self.exchange.all_gather_for(rk.rank))

    def convert(self):
        for rk, st in zip(self.ranks, self.state):
            dsa_ext.convert_req_index_to_global_index(
                st["md"].row_map, rk.block_table, rk.topk_ids, self.cfg.block_size,
                dcp_world_size=self.cfg.dcp, dcp_rank=rk.rank, compact=True,
                return_valid_counts=True, out=rk.slots, valid_counts=rk.counts)

    def safe_lengths(self):
        for rk, st in zip(self.ranks, self.state):
            st["lengths"] = dsa_ext.safe_lengths(rk.counts, rk.slots)

    def run(self):
        for name in STAGES:
            getattr(self, name)()


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def time_on_gpu(step: DecodeStep, iters: int) -> dict:
    """Per-stage graphs (each replays one stage of every rank on the previous stages'
    outputs) and one graph of the whole step: microseconds per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # eager warm-up: DeepGEMM's JIT, top-K cubin loads
        step.run()
        step.run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graphs = {}
    for name in STAGES:
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            getattr(step, name)()
    whole = torch.cuda.CUDAGraph()
    with torch.cuda.graph(whole):
        step.run()

    def replay_us(graph) -> float:
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters

    times = {name: replay_us(g) for name, g in graphs.items()}
    times["step"] = replay_us(whole)   # last: leaves the whole step's outputs in place
    return times


def time_on_cpu(step: DecodeStep, iters: int) -> dict:
    """Eager steps; each stage timed inside every step (stages rewrite their outputs in
    place, so they run in order)."""
    step.run()
    totals = dict.fromkeys(STAGES + ("step",), 0.0)
    for _ in range(iters):
        t_step = time.perf_counter()
        for name in STAGES:
            t0 = time.perf_counter()
            getattr(step, name)()
            totals[name] += time.perf_counter() - t0
        totals["step"] += time.perf_counter() - t_step
    return {name: t * 1e6 / iters for name, t in totals.items()}


def check(step: DecodeStep) -> list[str]:
    """What must hold of the step's outputs: each token row selects min(k, its length)
    tokens over all ranks, each rank's compacted slots are its valid ones first, and
    safe_lengths is max(count, 1)."""
    cfg, problems = step.cfg, []
    md = step.state[0]["md"]
    want = md.seq_lens_per_token.clamp(max=cfg.topk).cpu()
    total = sum(rk.counts.cpu().long() for rk in step.ranks)
    if not torch.equal(total, want.long()):
        problems.append(f"selected tokens per row {total.tolist()} != min(k, length) "
                        f"{want.tolist()}")
    for rk, st in zip(step.ranks, step.state):
        counts, slots = rk.counts.cpu(), rk.slots.cpu()
        cols = torch.arange(cfg.topk)[None, :]
        valid = cols < counts[:, None]
        if not ((slots >= 0) == valid)[counts > 0].all():
            problems.append(f"rank {rk.rank}: compacted slots are not valid-first")
        if not torch.equal(st["lengths"].cpu(), counts.clamp(min=1)):
            problems.append(f"rank {rk.rank}: safe_lengths != max(counts, 1)")
    return problems


def main(argv=None) -> dict:
    cfg, json_path = parse_args(argv)
    torch.manual_seed(cfg.seed)
    step = DecodeStep(cfg, *make_inputs(cfg))
    on_gpu = cfg.device == "cuda"
    times = time_on_gpu(step, cfg.iters) if on_gpu else time_on_cpu(step, cfg.iters)
    W = cfg.dcp
    md = step.state[0]["md"]
    logits_kernel = ("DeepGEMM " + getattr(mqa_logits.deep_gemm(), "__version__", "")
                     if on_gpu and mqa_logits.deep_gemm() is not None else "torch fallback")
    result = dict(config=asdict(cfg), path=md.path, logits=logits_kernel,
                  topk="dsa_ext.topk_per_row", timing="CUDA-graph replay" if on_gpu else "eager CPU",
                  us_per_rank={k: v / W for k, v in times.items()}, problems=check(step))
    device_name = torch.cuda.get_device_name() if on_gpu else "CPU"
    print(f"decode step on {device_name}: B={cfg.batch} next_n={cfg.next_n} "
          f"context<={cfg.context} block={cfg.block_size} H={cfg.heads} D={cfg.head_dim} "
          f"k={cfg.topk} DCP W={W}; path {md.path}, logits {logits_kernel}, "
          f"top-K {result['topk']}; {result['timing']}, {cfg.iters} iterations")
    print(f"| stage | us{' per rank' if W > 1 else ''} | share of step |")
    print("|---|---:|---:|")
    step_us = result["us_per_rank"]["step"]
    for name in STAGES:
        if name == "merge" and W == 1:
            continue
        us = result["us_per_rank"][name]
        print(f"| {name} | {us:.1f} | {100 * us / step_us:.0f}% |")
    print(f"| whole step (one graph) | {step_us:.1f} | |" if on_gpu else
          f"| whole step | {step_us:.1f} | |")
    print("check: " + ("ok" if not result["problems"] else "; ".join(result["problems"])))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["problems"] else 0)
