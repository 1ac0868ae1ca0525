"""How many radix passes the stable top-K's default-order select runs per row (host model of
`_radix_select` in cute_dsl_aot/stable_topk.py), on rows built the way ../shared/peers'
side_by_side.py builds its merge cases:

    python tools/stk_select_passes.py [ROWS]

Each rank's local top-K there is `randint` ids, so ids repeat within a rank (about 4
repeated pairs in 512 ids of 32K columns), and a repeated id packs to two equal keys. The
model follows the kernel's rules: 8-bit digits from the top; a pass counts the keys of the
current bin and the scan picks the bin of the `need`-th key; the default order stops when
that bin is taken whole (`bucket == need`), or when a pass that tracks the AND and OR of
the keys it counts finds them equal (copies of one key). A pass tracks after a pass that
did not split the bin, or once the bin holds at most TRACK_BELOW keys. The kinds that
resolve small bins (variants._RESOLVING: r4, r8) also stop once the bin holds at most
RESOLVE_KEYS keys, and one warp ranks them: that step is counted as a pass here.

Prints, per shape, id kind and rule (passes only, or with the resolve), the share of rows
by passes run, the share of rows whose k-th key has a copy, and the chance that a batch of
64 rows holds a row of more than 3 passes (a launch waits for its slowest row). Unique ids
are the control. On the H200 the k = 512 rows (64 rows, r4) took 4.5-5.4 us with passes
only, by draw, and 4.2-4.6 with the resolve (RESULTS.md, twenty-fourth session).
"""
import sys
from collections import Counter

import torch

from topk_lab import harness_rows  # tools/ is the script's folder

TRACK_BELOW = 64  # stable_topk.TRACK_BELOW
RESOLVE_KEYS = 32  # variants.RESOLVE_KEYS
USUAL_PASSES = 3  # what almost every randn row takes
MASK64 = (1 << 64) - 1


def select_passes(keys: list, sel: int, resolve: bool = False) -> tuple:
    """(passes run, stopped on copies) for one row of unsigned keys (key 0: invalid);
    with `resolve`, a bin of at most RESOLVE_KEYS keys ends the select one step later."""
    live = [x for x in keys if x != 0]
    need = min(sel, len(live))
    if need == 0:
        return 1, False
    prefix, mask, bucket, prev_bucket = 0, 0, 0, -1
    for p in range(8):
        shift = 56 - 8 * p
        counted = [x for x in live if x & mask == prefix]
        tracking = p >= 1 and (bucket == prev_bucket or bucket <= TRACK_BELOW)
        if tracking:
            both_and, both_or = MASK64, 0
            for x in counted:
                both_and &= x
                both_or |= x
            if both_and == both_or:
                return p + 1, True
        hist = Counter((x >> shift) & 255 for x in counted)
        above = 0
        for digit in range(255, -1, -1):
            if above + hist.get(digit, 0) >= need:
                break
            above += hist.get(digit, 0)
        prev_bucket, bucket = bucket, hist.get(digit, 0)
        prefix |= digit << shift
        mask = (MASK64 << shift) & MASK64
        need -= above
        if bucket == need:
            return p + 1, False
        if resolve and bucket <= RESOLVE_KEYS:  # one warp ranks the bin's keys
            ranked = sorted((x for x in live if x & mask == prefix), reverse=True)
            threshold = ranked[need - 1]
            return p + 2, ranked.count(threshold) > need - ranked.index(threshold)
    return 8, True


def main() -> int:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    g = torch.Generator().manual_seed(0)
    for K, W, k in ((512, 4, 512), (1024, 4, 1024), (2048, 2, 2048), (2048, 4, 2048)):
        for unique in (False, True):
            keys = [[x & MASK64 for x in row]
                    for row in harness_rows(g, unique, rows, K, W).tolist()]
            copied = sum(row.count(sorted(row, reverse=True)[k - 1]) > 1 for row in keys)
            for resolve in (False, True):
                runs = Counter(select_passes(row, k, resolve)[0] for row in keys)
                slow = sum(n for p, n in runs.items() if p > USUAL_PASSES) / rows
                batch = 1 - (1 - slow) ** 64
                shares = ", ".join(f"{p}: {100 * n / rows:.1f}%"
                                   for p, n in sorted(runs.items()))
                print(f"K={K} W={W} k={k} {'unique ids' if unique else 'random ids'}"
                      f"{', resolve' if resolve else ''}: passes {shares}; k-th key copied "
                      f"in {100 * copied / rows:.1f}% of rows; a 64-row batch has a row of "
                      f"more than {USUAL_PASSES} passes with p = {batch:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
