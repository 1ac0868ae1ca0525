"""Small topk_per_row / topk_to_slots / topk_to_candidates runs over every plan kind (resident
and streamed clusters, one and several bitmap segments, randn, uniform and 16-value rows,
more ids per CTA than the ids kernel stages), each compared with the CPU, then streamed plans
on logits another stream rewrites meanwhile (every store must stay in its row), for
compute-sanitizer (memcheck, racecheck, synccheck); the default plan runs rows of at most 8192
columns on the short-row kernel, and plans 208 / 216 (with the default's 2 x 20000) the
register kernel:

    compute-sanitizer --tool racecheck python tools/topk_sanitize_cases.py

Prints the number of mismatches; exit code 1 if there is any.
"""
import torch

import dsa_ext
from dsa_ext import _C

g = torch.Generator().manual_seed(0)
cases = []
for B, L in ((2, 20000), (3, 4100), (1, 70000), (2, 300000), (5, 4096), (3, 8192), (4, 1500)):
    x = torch.randn(B, L, generator=g)
    x[-1] = torch.randint(0, 16, (L,), generator=g).float()
    cases.append(x)
# Uniform and 16-value rows of 128K columns: one CTA per row (plan 101) refines its capture
# floor to a second digit and selects from the list.
x = torch.rand(2, 131072, generator=g)
x[1] = torch.randint(0, 16, (x.shape[1],), generator=g).float()
cases.append(x)
bad = 0


def check(ok: bool, *what) -> None:
    """Counts and names a mismatch."""
    global bad
    if not ok:
        bad += 1
        print("mismatch:", *what, flush=True)


for plan in (-1, 1, 2, 3, 8, 101, 102, 108, 208, 216):
    _C.set_topk_plan_override(plan)
    for x in cases:
        for k, srt in ((2048, False), (512, True)):
            got = dsa_ext.topk_per_row(x.cuda(), k, sorted=srt).cpu()
            check(torch.equal(got, dsa_ext.topk_per_row(x, k, sorted=srt)), "ids", plan,
                  tuple(x.shape), k, srt)
    x = cases[0]
    table = torch.arange(4 * 400, dtype=torch.int32).reshape(4, 400)
    req = torch.tensor([0, 3], dtype=torch.int32)
    a = dsa_ext.topk_to_slots(x.cuda(), 2048, req.cuda(), table.cuda(), 64, compact=True)
    b = dsa_ext.topk_to_slots(x, 2048, req, table, 64, compact=True)
    check(torch.equal(a.cpu(), b), "slots", plan)
    holes = torch.randint(-1, 1 << 16, (4, 400), generator=g, dtype=torch.int32)
    a = dsa_ext.topk_to_slots(x.cuda(), 2048, req.cuda(), holes.cuda(), 64)
    check(torch.equal(a.cpu(), dsa_ext.topk_to_slots(x, 2048, req, holes, 64)), "plain slots",
          plan)
    a = dsa_ext.topk_to_slots(x.cuda(), 2048, req.cuda(), holes.cuda(), 64, compact=True,
                              return_valid_counts=True)
    b = dsa_ext.topk_to_slots(x, 2048, req, holes, 64, compact=True, return_valid_counts=True)
    check(torch.equal(a[0].cpu(), b[0]) and torch.equal(a[1].cpu(), b[1]), "compacted slots",
          plan)
    c = dsa_ext.topk_to_candidates(x.cuda(), 2048, 1, 4).cpu()
    check(torch.equal(c, dsa_ext.topk_to_candidates(x, 2048, 1, 4)), "candidates", plan)
# The 128K-column rows in bf16 (the capture's 64-bit mask) and with unaligned windows (a
# head captured whole), one CTA per row.
_C.set_topk_plan_override(101)
z = cases[-1]
ends = torch.full((2,), z.shape[1], dtype=torch.int32)
for zs in (z, z.bfloat16()):
    for kw in ({}, {"row_starts": torch.tensor([1, 3], dtype=torch.int32), "row_ends": ends}):
        got = dsa_ext.topk_per_row(zs.cuda(), 2048, **{n: v.cuda() for n, v in kw.items()})
        check(torch.equal(got.cpu(), dsa_ext.topk_per_row(zs, 2048, **kw)), "128K rows", zs.dtype,
              list(kw))
# The short-row kernel's sinks (default plan): slots compacted with counts (a block size
# of 12, and of 64, whose tables with and without holes take both tile paths), candidates.
_C.set_topk_plan_override(-1)
for x in (cases[4], cases[5]):
    req = torch.tensor([0, 5, -1, 2, 3][:x.shape[0]], dtype=torch.int32)
    for bs, low in ((12, -1), (64, -1), (64, 0)):
        table = torch.randint(low, 1 << 16, (6, x.shape[1] // bs + 1), generator=g,
                              dtype=torch.int32)
        for k in (7, 2048):
            a = dsa_ext.topk_to_slots(x.cuda(), k, req.cuda(), table.cuda(), bs, compact=True,
                                      return_valid_counts=True)
            b = dsa_ext.topk_to_slots(x, k, req, table, bs, compact=True, return_valid_counts=True)
            check(torch.equal(a[0].cpu(), b[0]) and torch.equal(a[1].cpu(), b[1]),
                  "short-row slots", tuple(x.shape), bs, low, k)
    for k in (7, 2048):
        c = dsa_ext.topk_to_candidates(x.cuda(), k, 1, 4).cpu()
        check(torch.equal(c, dsa_ext.topk_to_candidates(x, k, 1, 4)), "short-row candidates",
              tuple(x.shape), k)
# More ids per CTA than the ids kernel stages (kStagedSlots), one and several bitmap
# segments per slice, compacted with counts.
y = torch.randn(2, 140000, generator=g)
y[1] = torch.randint(0, 16, (y.shape[1],), generator=g).float()
tab = torch.randint(0, 1 << 16, (4, y.shape[1] // 64 + 1), generator=g, dtype=torch.int32)
tab[torch.rand(tab.shape, generator=g) < 0.15] = -1
req = torch.tensor([0, 3], dtype=torch.int32)
want = dsa_ext.topk_to_slots(y, 5000, req, tab, 64, compact=True, return_valid_counts=True)
for plan in (-1, 101):
    _C.set_topk_plan_override(plan)
    got = dsa_ext.topk_to_slots(y.cuda(), 5000, req.cuda(), tab.cuda(), 64, compact=True,
                                return_valid_counts=True)
    check(torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]),
          "slots past the stage", plan)
# A caller's race: another stream rewrites the logits while streamed plans (whose walks
# re-read them) run, with no ordering between the two. The ids are then unspecified, but
# every store stays in its own row: each launch writes rows 0-3 of its own [5, 2048] block,
# whose row 4 (a canary) must keep its value. Rows equal to neither input's ids show that
# the race was hit.
side = torch.cuda.Stream()
L, launches = 300000, 12
variants = (torch.randn(4, L, generator=g).cuda(),
            torch.randint(0, 16, (4, L), generator=g).float().cuda())
x = variants[0].clone()
table = torch.arange(4 * (L // 64 + 1), dtype=torch.int32, device="cuda").reshape(4, -1)
req = torch.arange(4, dtype=torch.int32, device="cuda")
clean = {srt: [dsa_ext.topk_per_row(v, 2048, sorted=srt) for v in variants]
         for srt in (False, True)}
for plan in (101, 102, 108):
    _C.set_topk_plan_override(plan)
    ids = torch.full((launches, 5, 2048), -7, dtype=torch.int32, device="cuda")
    slots = torch.full((launches, 5, 2048), -7, dtype=torch.int32, device="cuda")
    counts = torch.full((launches, 5), -7, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for j in range(40 * launches):
            x.copy_(variants[j % 2])
    for it in range(launches):
        dsa_ext.topk_per_row(x, 2048, sorted=it % 3 == 0, out=ids[it, :4])
        dsa_ext.topk_to_slots(x, 2048, req, table, 64, compact=it % 2 == 0, out=slots[it, :4],
                              return_valid_counts=True, valid_counts=counts[it, :4])
    torch.cuda.synchronize()
    raced = sum(int(((ids[it, :4] != clean[it % 3 == 0][0]).any(1)
                     & (ids[it, :4] != clean[it % 3 == 0][1]).any(1)).sum())
                for it in range(launches))
    print(f"plan {plan}: {raced} of {4 * launches} rows raced", flush=True)
    check(bool((ids[:, 4] == -7).all() and (slots[:, 4] == -7).all()
               and (counts[:, 4] == -7).all()), "raced: a store left its row", plan)
    check(bool(((counts[:, :4] >= 0) & (counts[:, :4] <= 2048)).all()), "raced: counts", plan)
_C.set_topk_plan_override(-1)
torch.cuda.synchronize()
print("sanitize cases: mismatches", bad)
raise SystemExit(1 if bad else 0)
