"""How many keys a streamed CTA of the per-row top-K captures while counting (host model of
count_and_capture in csrc/indexer/topk_per_row.cu), for a few row kinds:

    python tools/topk_capture_sizes.py [K]

Per batch of loads (16K fp32 keys a CTA) the batch is counted into the first-digit
histogram (the top 11 bits of the order key), the floor is raised to the digit of the k-th
largest key counted so far, and the batch's keys at or above the floor are captured. Prints
the captured count of each CTA's slice (the list holds 10240) and checks that the floor
never passed the row's threshold digit.
"""
import sys

import numpy as np


def order_keys(x):
    b = x.astype(np.float32).view(np.uint32)
    return np.where(b >> 31, ~b, b | 0x80000000).astype(np.uint32)


def captured(x, k, cluster, batch=16384):
    digit = order_keys(x) >> 21
    d0 = np.sort(digit)[::-1][k - 1]  # the row's threshold digit
    per = (x.size + cluster - 1) // cluster
    sizes, safe = [], True
    for r in range(cluster):
        sl = digit[r * per:(r + 1) * per]
        hist = np.zeros(2048, np.int64)
        size = 0
        for b0 in range(0, sl.size, batch):
            part = sl[b0:b0 + batch]
            np.add.at(hist, part, 1)
            at_or_above = np.cumsum(hist[::-1])[::-1]
            floor = int(np.nonzero(at_or_above >= k)[0].max()) if at_or_above[0] >= k else 0
            safe &= floor <= d0
            size += int((part >= floor).sum())
        sizes.append(size)
    return sizes, safe


def main():
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    g = np.random.default_rng(0)
    kinds = {
        "randn": lambda n: g.standard_normal(n),
        "16 values": lambda n: g.integers(0, 16, n).astype(np.float32),
        "uniform": lambda n: g.random(n),
        "ascending": lambda n: np.sort(g.standard_normal(n)),
        "descending": lambda n: np.sort(g.standard_normal(n))[::-1].copy(),
    }
    for name, make in kinds.items():
        for n, cluster in ((131072, 2), (32768, 1)):
            sizes, safe = captured(make(n), k, cluster)
            print(f"{name:11s} {n:7d} columns, {cluster} CTAs: captured {sizes}, floor safe {safe}")


if __name__ == "__main__":
    main()
