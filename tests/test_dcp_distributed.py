"""DCP merges across real processes (gloo on loopback): every rank's merged top-K equals
the global top-K of the unsharded logits, and the merged sparse attention equals the
attention over the unsharded KV (spec 6 and 7)."""
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
