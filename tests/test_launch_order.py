"""Back-to-back launches: each op reads what the kernel right before it wrote.

Every kernel is launched as a programmatic dependent launch (it may start while the
previous kernel in the stream still runs, and waits for it before touching memory). These
chains make each op depend on the op before it, through the same buffers every step (the
next pack overwrites the keys the last top-K read), eagerly and inside one CUDA graph, so
a kernel that touched memory before its wait would show a wrong result.
"""
import os
import subprocess
import sys

import pytest
import torch

import dsa_ext
from conftest import assert_equal, capture_graph

ROWS, COLS, K, STEPS = 64, 32768, 2048, 6


def _inputs(device):
    g = torch.Generator().manual_seed(7)
    # Distinct scores per step; ids are a random permutation prefix with 5% of them -1.
    logits = [torch.randn(ROWS, COLS, generator=g).to(device) for _ in range(STEPS)]
    ids = torch.argsort(torch.rand(ROWS, COLS, generator=g), dim=1)[:, :K].to(torch.int32)
    ids[torch.rand(ROWS, K, generator=g) < 0.05] = -1
    return logits, ids.to(device)


def _chain(logits, ids, keys):
    """STEPS times: pack this step's scores of `ids`, then reorder `ids` by them."""
    for step_logits in logits:
        dsa_ext.pack_dcp_topk_candidates(step_logits, ids, 0, 1, out=keys)
        dsa_ext.stable_topk_from_candidates(keys, K, out=ids)


def _cpu_result():
    logits, ids = _inputs("cpu")
    _chain(logits, ids, torch.empty(ROWS, K, dtype=torch.int64))
    return ids


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_chained_pack_and_topk_see_each_others_writes(mode):
    want = _cpu_result()
    logits, ids = _inputs("cuda")
    start = ids.clone()
    keys = torch.empty(ROWS, K, dtype=torch.int64, device="cuda")
    if mode == "eager":
        _chain(logits, ids, keys)
    else:
        graph = capture_graph(lambda: _chain(logits, ids, keys))  # runs the chain 3 times
        ids.copy_(start)
        graph.replay()
    assert_equal(ids, want, mode=mode)


@pytest.mark.cuda
def test_self_check_with_programmatic_launch_off():
    # DSA_EXT_PDL=0 (read once per process) launches every kernel in plain stream order.
    env = {**os.environ, "DSA_EXT_PDL": "0"}
    run = subprocess.run([sys.executable, "-m", "dsa_ext"], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr
