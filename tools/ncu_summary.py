"""A short text from an Nsight Compute report, for reading off the GPU machine.

    python tools/ncu_summary.py REPORT.ncu-rep OUT.txt [--top N]

Per kernel: the launch, occupancy, throughput and stall metrics of the details page, then
the N SASS lines with the most warp-stall samples (from the source page) with their
dominant stall reasons. Needs the `ncu` command (run it where the report was taken).
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess

DETAILS = ("Duration", "Elapsed Cycles", "Registers Per Thread", "Achieved Occupancy",
           "Theoretical Occupancy", "Memory Throughput", "DRAM Throughput",
           "Compute (SM) Throughput", "Executed Ipc Active", "Issue Slots Busy",
           "No Eligible", "Warp Cycles Per Issued Instruction", "Active Warps Per Scheduler",
           "Grid Size", "Block Size", "Cluster Size", "Dynamic Shared Memory Per Block",
           "L1/TEX Hit Rate", "L2 Hit Rate")


def ncu_csv(report: str, *page: str) -> list:
    text = subprocess.run(["ncu", "-i", report, "--csv", "--page", *page],
                          capture_output=True, text=True, check=True).stdout
    return list(csv.reader(io.StringIO(text)))


def number(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def details(report: str, out) -> None:
    rows = ncu_csv(report, "details")
    if not rows:
        return
    header = rows[0]
    for r in rows[1:]:
        d = dict(zip(header, r))
        if any(k in d.get("Metric Name", "") for k in DETAILS):
            out.write(f"{d.get('ID')} {d.get('Kernel Name', '')[:60]} | {d.get('Metric Name')}"
                      f" = {d.get('Metric Value')} {d.get('Metric Unit')}\n")


def hot_lines(report: str, out, top: int) -> None:
    """The source page is one section per kernel: a kernel-name row, then a header row
    (Address, Source, Warp Stall Sampling ...), then one row per SASS instruction. A kernel
    profiled more than once is summarized once. Where the page has the warp instructions
    executed per line, they are printed too, with the lines that execute the most: where
    an issue-bound kernel spends its instructions."""
    header, body, kernel = None, [], "?"
    seen = set()

    def flush():
        if not header or not body or kernel in seen:
            return
        seen.add(kernel)
        samples = next(i for i, c in enumerate(header) if "Warp Stall Sampling (All" in c)
        reasons = [i for i, c in enumerate(header) if c.startswith("stall_")
                   and "Not Issued" not in c]
        executed = next((i for i, c in enumerate(header) if c == "Instructions Executed"), None)
        total = sum(number(r[samples]) for r in body) or 1.0
        count = sum(number(r[executed]) for r in body) if executed is not None else 0.0
        out.write(f"\n## {kernel[:120]} ({len(body)} SASS lines, {total:.0f} samples"
                  + (f", {count:.0f} warp instructions executed" if executed is not None else "")
                  + ")\n")
        for r in sorted(body, key=lambda r: -number(r[samples]))[:top]:
            why = sorted(((number(r[i]), header[i]) for i in reasons if number(r[i]) > 0),
                         reverse=True)[:3]
            ran = f"  executed {number(r[executed]):.0f}" if executed is not None else ""
            out.write(f"{100 * number(r[samples]) / total:5.1f}%  {r[1].strip()[:64]:64}  "
                      + ", ".join(f"{name}={v:.0f}" for v, name in why) + ran + "\n")
        if executed is not None and count > 0:
            out.write(f"-- the {top} lines executed most (share of {count:.0f}):\n")
            for r in sorted(body, key=lambda r: -number(r[executed]))[:top]:
                out.write(f"{100 * number(r[executed]) / count:5.1f}%  {r[0].strip():>8}  "
                          f"{r[1].strip()[:64]}\n")

    for r in ncu_csv(report, "source", "--print-source", "sass"):
        if any("Warp Stall Sampling (All" in c for c in r):
            flush()
            header, body = r, []
        elif header and len(r) == len(header):
            body.append(r)
        elif r and r[0] == "Kernel Name":
            flush()
            kernel, header, body = (r[1] if len(r) > 1 else "?"), None, []
    flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report")
    parser.add_argument("out")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.out, "w") as out:
        details(args.report, out)
        hot_lines(args.report, out, args.top)


if __name__ == "__main__":
    main()
