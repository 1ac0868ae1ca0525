"""How crowded the stable top-K rank sort's bins are, per score distribution (host model of
`_sort_by_rank` in cute_dsl_aot/stable_topk.py, sorted=True):

    python tools/stk_rank_bins.py [ROWS]    # rows a kind (default 8)

The rank sort bins the select's candidates (every key whose top digits reach the prefix of
the k-th key, once they fit the sort's S slots) into S bins and ranks each key against its
bin-mates, so its cost grows with the bin-mates a key; a row past
stable_topk.CROWDED_BIN_MATES (32) bin-mates a key on average takes the bitonic sort. For
k = K = 2048 at W = 2 and 4 (S = 4096, the r4_rank4096 / r8_rank4096 variants) and the
score kinds of `tools/topk_lab.py --score-kinds`, it prints the mean bin-mates a key (the
worst row's in brackets) of three binnings:
- `bits` (main): the top log2(S) bits of the key's distance below the largest key. Bins
  follow the keys' bits, about 16 a binade of either sign, so keys crowd where most of
  them lie (W = 2: the k-th key is the median, the candidates straddle 0).
- `value` (branch `value-bins`, measured and not merged, RESULTS.md fifty-second session):
  even bins in score value where the scores straddle 0; an outlier or heavy tails stretch
  the range and crowd every key into a few bins.
- `two_level` (proposed): `bits`, then each bin of c keys split into c sub-bins on the next
  20 bits of the distance: a key's bin is its `bits` bin's start plus
  `(next bits * c) >> 20`. The bins follow the keys wherever they lie.
"""
import sys

import numpy as np
import torch

from topk_lab import make_rows  # tools/ is the script's folder

MASK64 = (1 << 64) - 1
S = 4096
SUB_BITS = 20
KINDS = ("random", "one_sign", "outlier", "cauchy", "exp4", "ties")


def candidates(keys: list, sel: int) -> tuple:
    """(keys kept, their prefix) by the select of a sorting variant: 8-bit digits from
    the top, until the keys at or above the k-th key's prefix fit S."""
    kth = sorted(keys, reverse=True)[sel - 1]
    for p in range(8):
        mask = (MASK64 << (56 - 8 * p)) & MASK64
        cands = [x for x in keys if x & mask >= kth & mask]
        if len(cands) <= S:
            break
    return cands, kth & mask


def bits_bins(cands: list, prefix: int) -> tuple:
    """The kernel's bins: the range split is [prefix, top] (the select's prefix, not the
    smallest candidate)."""
    top = max(cands)
    shift = max((top - max(prefix, 1)).bit_length() - (S.bit_length() - 1), 0)
    return [(top - x) >> shift for x in cands], shift, top


def two_level_bins(cands: list, first: list, shift: int, top: int) -> list:
    """`first`, `shift`, `top`: bits_bins' answer for `cands`."""
    count = np.bincount(first, minlength=S)
    start = np.cumsum(count) - count
    bins = []
    for x, b in zip(cands, first):
        rest = (top - x) & ((1 << shift) - 1)
        rest = rest >> (shift - SUB_BITS) if shift > SUB_BITS else rest << (SUB_BITS - shift)
        bins.append(int(start[b]) + ((rest * int(count[b])) >> SUB_BITS))
    return bins


def value_bins(cands: list):
    words = np.array([x >> 32 for x in cands], dtype=np.uint32)
    scores = np.where(words & 0x80000000, words & 0x7FFFFFFF, ~words).astype(np.uint32)
    scores = scores.view(np.float32)
    top, low = scores.max(), scores.min()
    if not top > 0 > low:
        return None  # the branch keeps `bits` here
    scale = np.float32(S) / np.float32(top - low)
    return np.minimum(((top - scores) * scale).astype(np.int64), S - 1).tolist()


def mean_mates(bins: list) -> float:
    _, inverse, count = np.unique(np.asarray(bins), return_inverse=True, return_counts=True)
    return float((count[inverse] - 1).mean())


def main() -> int:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    g = torch.Generator().manual_seed(5)
    K = k = 2048
    print(f"mean bin-mates a key (worst of {rows} rows), k = K = {K}, S = {S}")
    for W in (2, 4):
        for kind in KINDS:
            keys = make_rows(kind, W, rows, K, k, g).transpose(0, 1).reshape(rows, W * K)
            got = {"bits": [], "value": [], "two_level": []}
            for row in keys.tolist():
                cands, prefix = candidates([x & MASK64 for x in row], k)
                first, shift, top = bits_bins(cands, prefix)
                got["bits"].append(mean_mates(first))
                value = value_bins(cands)
                got["value"].append(got["bits"][-1] if value is None else mean_mates(value))
                got["two_level"].append(mean_mates(two_level_bins(cands, first, shift, top)))
            print(f"W = {W} {kind:9s} " + "  ".join(
                f"{name} {np.mean(v):7.2f} ({max(v):7.2f})" for name, v in got.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
