"""DCP merges across real processes (gloo on loopback): every rank's merged top-K equals
the global top-K of the unsharded logits, and the merged sparse attention equals the
attention over the unsharded KV (docs/ops.md sections 6 and 7)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from dcp_cases import dcp_merge_worker, run_world

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


@pytest.mark.parametrize("world", [2, 4])
def test_merges_equal_unsharded(world):
    # each case cycles interleave 1/2/16, k 4/16/40 (larger than small shards), ties,
    # empty rows and shards, row_starts, both LSE bases and a bf16 merge
    run_world(world, dcp_merge_worker, args=(world, 12), timeout=150)


def test_nccl_check_tool_on_gloo(tmp_path):
    """tools/nccl_check.py, the multi-GPU check, runs its sharded == unsharded part on gloo."""
    report = tmp_path / "report.json"
    tool = Path(__file__).resolve().parents[1] / "tools" / "nccl_check.py"
    subprocess.run([sys.executable, str(tool), "--world", "2", "--backend", "gloo",
                    "--json", str(report)], check=True, timeout=300)
    checked = json.loads(report.read_text())["checked"]
    assert {(c["interleave"], c["k"]) for c in checked} == {
        (i, k) for i in (1, 16) for k in (512, 2048, 3000)}
