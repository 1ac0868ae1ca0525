"""How launches are ordered and set up: each op reads what the kernel right before it
wrote, and an op's first call may come inside a CUDA graph capture.

Every kernel is launched as a programmatic dependent launch (it may start while the
previous kernel in the stream still runs, and waits for it before touching memory). These
chains make each op depend on the op before it, through the same buffers every step (the
next pack overwrites the keys the last top-K read), eagerly and inside one CUDA graph, so
a pack or top-K kernel (CTA pairs, one CTA of 1024 threads, two CTAs of 512 threads per
SM) that touched memory before its wait would show a wrong result.
"""
import os
import subprocess
import sys

import pytest
import torch

import dsa_ext
from conftest import assert_equal, capture_graph, cuda_sms, forced_topk_variant

COLS, K, STEPS = 8192, 2048, 6


def _inputs(rows, device):
    g = torch.Generator().manual_seed(7)
    # Distinct scores per step; ids are a random permutation prefix with 5% of them -1.
    logits = [torch.randn(rows, COLS, generator=g).to(device) for _ in range(STEPS)]
    ids = torch.argsort(torch.rand(rows, COLS, generator=g), dim=1)[:, :K].to(torch.int32)
    ids[torch.rand(rows, K, generator=g) < 0.05] = -1
    return logits, ids.to(device)


def _chain(logits, ids, keys):
    """STEPS times: pack this step's scores of `ids`, then reorder `ids` by them."""
    for step_logits in logits:
        dsa_ext.pack_dcp_topk_candidates(step_logits, ids, 0, 1, out=keys)
        dsa_ext.stable_topk_from_candidates(keys, K, out=ids)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("rows_per_sm,variant", [(0, "p8_u"), (1, "r4_u"),
                                                 (1, "r8_u"), (4, "d8_u"), (4, "d16_u")])
def test_chained_pack_and_topk_see_each_others_writes(mode, rows_per_sm, variant):
    rows = max(1, rows_per_sm * cuda_sms())
    with forced_topk_variant(variant):
        _check_chain(mode, rows)


def _check_chain(mode, rows):
    logits, ids = _inputs(rows, "cpu")
    want = ids.clone()
    _chain(logits, want, torch.empty(rows, K, dtype=torch.int64))
    logits, ids = _inputs(rows, "cuda")
    start = ids.clone()
    keys = torch.empty(rows, K, dtype=torch.int64, device="cuda")
    if mode == "eager":
        _chain(logits, ids, keys)
    else:
        graph = capture_graph(lambda: _chain(logits, ids, keys))  # runs it twice first
        ids.copy_(start)
        graph.replay()
    assert_equal(ids, want, mode=mode, rows=rows)


@pytest.mark.cuda
def test_self_check_with_programmatic_launch_off():
    # DSA_EXT_PDL=0 (read once per process) launches every kernel in plain stream order.
    # The child's CPU references take this worker's share of the cores (conftest).
    env = {**os.environ, "DSA_EXT_PDL": "0", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    code = ("import sys, dsa_ext, dsa_ext.__main__ as m;"
            "assert not dsa_ext._C.programmatic_launch_enabled(); sys.exit(m.main())")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_programmatic_launch_is_on_by_default():
    env = {k: v for k, v in os.environ.items() if k != "DSA_EXT_PDL"}
    code = "import dsa_ext; print(dsa_ext._C.programmatic_launch_enabled())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert run.stdout.strip() == "True"


#: A fresh process whose first call of each op is inside a CUDA graph capture (global
#: capture mode, torch.cuda.graph's default): the ops' one-time setup on the device
#: (loading the exported cubins, kernel attributes, occupancy queries) must not break the
#: capture. The replay is compared with the CPU.
_FIRST_CALL_IN_CAPTURE = r"""
import torch, dsa_ext
g = torch.Generator().manual_seed(5)
rows, L, K = 4, 4096, 256
logits = torch.randn(rows, L, generator=g)
ids = torch.argsort(torch.rand(rows, L, generator=g), dim=1)[:, :K].to(torch.int32)
req = torch.tensor([0, 1, 0, 1], dtype=torch.int32)
table = torch.randint(0, 1000, (2, L // 64), generator=g, dtype=torch.int32)
positions = torch.randint(0, 1 << 16, (rows,), generator=g)

def step(x):
    out = {}
    out["convert"] = dsa_ext.convert_req_index_to_global_index(
        x["req"], x["table"], x["ids"], 64, compact=True, out=x["slots"],
        valid_counts=x["counts"])
    out["c128a"] = dsa_ext.build_c128a_topk_metadata(
        x["positions"], 128, 2, x["req"], x["table"], 64, x["positions"], x["dec"],
        x["lens"], x["pre"], 512)
    out["pack"] = dsa_ext.pack_dcp_topk_candidates(x["logits"], x["ids"], 0, 1, out=x["keys"])
    out["stable"] = dsa_ext.stable_topk_from_candidates(x["keys"], 64, out=x["sel"])
    out["stable_sorted"] = dsa_ext.stable_topk_from_candidates(
        x["keys"], 64, out=x["sel_sorted"], sorted=True)
    out["per_row"] = dsa_ext.topk_per_row(x["logits"], 128, out=x["top"])
    out["to_slots"] = dsa_ext.topk_to_slots(x["logits"], 128, x["req"], x["table"], 64,
                                            out=x["top_slots"])
    return out

def inputs(device):
    x = dict(logits=logits, ids=ids, req=req, table=table, positions=positions)
    x = {k: v.to(device) for k, v in x.items()}
    i32 = dict(dtype=torch.int32, device=device)
    x.update(slots=torch.empty(rows, K, **i32), counts=torch.empty(rows, **i32),
             dec=torch.empty(rows, 512, **i32), lens=torch.empty(rows, **i32),
             pre=torch.empty(rows, 512, **i32),
             keys=torch.empty(rows, K, dtype=torch.int64, device=device),
             sel=torch.empty(rows, 64, **i32), sel_sorted=torch.empty(rows, 64, **i32),
             top=torch.empty(rows, 128, **i32), top_slots=torch.empty(rows, 128, **i32))
    return x

x = inputs("cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    got = step(x)
graph.replay()
torch.cuda.synchronize()
want = step(inputs("cpu"))
for name, w in want.items():
    w = w if isinstance(w, tuple) else (w,)
    o = got[name] if isinstance(got[name], tuple) else (got[name],)
    for a, b in zip(o, w):
        assert torch.equal(a.cpu(), b), name
print("ok")
"""


@pytest.mark.cuda
def test_first_call_of_each_op_inside_a_capture():
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL_IN_CAPTURE], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def _table_chain(x, compact):
    """Per step: a conversion writes the block table (its slots are the step's block ids),
    then topk_to_slots and the index conversion read that table."""
    outs = []
    for s in range(len(x["logits"])):
        dsa_ext.convert_req_index_to_global_index(x["table_req"], x["base_table"],
                                                  x["table_ids"][s], 16, out=x["table"])
        slots = dsa_ext.topk_to_slots(x["logits"][s], K, x["req"], x["table"], 64,
                                      compact=compact, out=x["slots"][s])
        converted = dsa_ext.convert_req_index_to_global_index(
            x["req"], x["table"], x["ids"][s], 64, compact=compact, out=x["converted"][s])
        outs += [slots, converted]
    return outs


def _table_inputs(rows, cols, device, steps=3):
    g = torch.Generator().manual_seed(11)
    R, NB = 4, cols // 64
    x = dict(
        logits=[torch.randn(rows, cols, generator=g) for _ in range(steps)],
        ids=[torch.randint(-8, cols, (rows, K), generator=g, dtype=torch.int32)
             for _ in range(steps)],
        req=torch.randint(0, R, (rows,), generator=g, dtype=torch.int32),
        table_req=torch.arange(R, dtype=torch.int32),
        base_table=torch.randint(0, 50, (R, NB // 16 + 1), generator=g, dtype=torch.int32),
        table_ids=[torch.randint(-1, NB, (R, NB), generator=g, dtype=torch.int32)
                   for _ in range(steps)])
    x = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
         for k, v in x.items()}
    i32 = dict(dtype=torch.int32, device=device)
    x.update(table=torch.empty(R, NB, **i32),
             slots=[torch.empty(rows, K, **i32) for _ in range(steps)],
             converted=[torch.empty(rows, K, **i32) for _ in range(steps)])
    return x


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("compact", [False, True])
def test_slots_read_the_table_the_kernel_before_wrote(mode, compact):
    # topk_to_slots' conversion (the second launch here) reads its rows' requests and
    # tables before it waits for the ids kernel, which writes neither: what the kernel
    # before the ids kernel wrote must be final by then. The index conversion on its own
    # must wait before reading the table its predecessor writes.
    rows, cols = 16, 32768
    cluster = dsa_ext._C.topk_per_row_plan(rows, cols, torch.cuda.current_device())[0]
    assert compact or cluster > 2 or rows * cluster > cuda_sms(), "not the two-launch path"
    want = _table_chain(_table_inputs(rows, cols, "cpu"), compact)
    x = _table_inputs(rows, cols, "cuda")
    if mode == "eager":
        got = _table_chain(x, compact)
    else:
        graph = capture_graph(lambda: _table_chain(x, compact))  # runs it twice first
        for t in x["slots"] + x["converted"]:
            t.fill_(-7)
        graph.replay()
        got = [t for pair in zip(x["slots"], x["converted"]) for t in pair]
    for i, (g, w) in enumerate(zip(got, want)):
        assert_equal(g, w, mode=mode, compact=compact, step=i // 2, op=("slots", "convert")[i % 2])
