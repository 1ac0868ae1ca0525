"""Back-to-back launches: each op reads what the kernel right before it wrote.

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
    env = {**os.environ, "DSA_EXT_PDL": "0"}
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
