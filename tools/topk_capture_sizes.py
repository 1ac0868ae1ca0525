"""How many keys a streamed CTA of the per-row top-K captures while counting (host model of
count_and_capture / capture_floor in csrc/indexer/topk_candidates.cuh), for a few row
kinds:

    python tools/topk_capture_sizes.py [K ...]

The floor is set once, from the first batch of loads (16K fp32 keys a CTA), as the higher
of the first digit (the top 11 bits of the order key) of the r-th largest key of the batch,
r = ceil(MARGIN * k * batch / row), and the lowest digit whose keys in the batch, scaled to
the slice, fit FILL of the list; every key of the slice at or above the floor is captured.
The capture is used when the floor is at or below the row's threshold digit (else: "floor
above") and the list of LIST keys holds it (else: "overflow"); either miss walks the slice.
Prints, per row kind and slice, the mean and largest captured count over TRIALS rows and
the share of CTAs that walk.
"""
import sys

import numpy as np

LIST = 10112  # list_capacity(false)
BATCH = 16384  # kThreads * kLoadsInFlight vectors of 4 fp32 keys
MARGIN = 2  # kFloorMargin
FILL = 9 / 10  # kFloorFillNum / kFloorFillDen
TRIALS = 40


def order_keys(x):
    b = x.astype(np.float32).view(np.uint32)
    return np.where(b >> 31, ~b, b | 0x80000000).astype(np.uint32)


def digit_at_rank(hist, r):
    """The digit of the r-th largest key (1-based) of histogram `hist`."""
    return 2047 - int(np.searchsorted(np.cumsum(hist[::-1]), r))


def floor_of(first, n, row, k):
    """capture_floor: the floor from the digits `first` of a slice of n columns."""
    seen = first.size
    if seen == 0:
        return 0
    hist = np.bincount(first, minlength=2048)
    r = min(-(-MARGIN * k * seen // row), seen)
    floor = digit_at_rank(hist, r)
    fit = int(FILL * LIST * seen // n)
    if fit < seen:
        floor = max(floor, digit_at_rank(hist, fit + 1) + 1)
    return floor


def ctas(x, k, cluster):
    """(captured, used) per CTA of one row."""
    digit = order_keys(x) >> 21
    d0 = np.sort(digit)[::-1][k - 1]  # the row's threshold digit
    per = (x.size + cluster - 1) // cluster
    out = []
    for r in range(cluster):
        sl = digit[r * per:(r + 1) * per]
        floor = floor_of(sl[:BATCH], sl.size, x.size, k)
        size = int((sl >= floor).sum())
        out.append((size, "floor above" if floor > d0 else "overflow" if size > LIST else ""))
    return out


def main():
    ks = [int(a) for a in sys.argv[1:]] or [512, 2048, 4096]
    g = np.random.default_rng(0)
    kinds = {
        "randn": lambda n: g.standard_normal(n),
        "16 values": lambda n: g.integers(0, 16, n).astype(np.float32),
        "uniform": lambda n: g.random(n),
        "ascending": lambda n: np.sort(g.standard_normal(n)),
        "descending": lambda n: np.sort(g.standard_normal(n))[::-1].copy(),
        "rising": lambda n: np.linspace(0, 8, n) + g.standard_normal(n),
    }
    for k in ks:
        for name, make in kinds.items():
            for n, cluster in ((131072, 2), (32768, 1)):
                got = [c for _ in range(TRIALS) for c in ctas(make(n), k, cluster)]
                sizes = np.array([s for s, _ in got])
                walks = {w: sum(1 for _, v in got if v == w) / len(got)
                         for w in ("floor above", "overflow")}
                print(f"k {k:5d} {name:10s} {n // cluster // 1024:3d}K slice: captured mean "
                      f"{sizes.mean():6.0f} max {sizes.max():6d}; walks: floor above "
                      f"{walks['floor above']:.2f}, overflow {walks['overflow']:.2f}")


if __name__ == "__main__":
    main()
