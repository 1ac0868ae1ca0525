"""../shared/peers' side_by_side.py with the launch floor beside it, in one process.

    cd .peers && VLLM_SRC=vllm python ../tools/side_by_side_floor.py [its arguments]

Times a do-nothing kernel (a 1-element add_) the way the harness times every op (CUDA-graph
replay per launch, timing.bench_graph) before and after the cases, so that the rows whose
times sit near the launch itself can be read against it (issue 15 asks for both numbers).
After the C128A cases it also times the write floor of each case it ran: torch filling a
contiguous int32 buffer of that case's output size (T x width), the same way.
Run from the folder that holds the harness (.peers/, see ../shared/peers/README.md).
"""
import os
import runpy
import sys

import torch

sys.path.insert(0, os.getcwd())
from timing import bench_graph  # noqa: E402 - the harness's own timing, from .peers/


def launch_floor() -> float:
    one = torch.zeros(1, device="cuda")
    return bench_graph(lambda: one.add_(1.0))


def write_floor(numel: int) -> float:
    buf = torch.empty(numel, dtype=torch.int32, device="cuda")
    return bench_graph(lambda: buf.fill_(-1))


def main() -> int:
    before = launch_floor()
    print(f"# launch floor (1-element add_, graph replay per launch) {before:.2f} us", flush=True)
    sys.argv = ["side_by_side.py"] + sys.argv[1:]
    harness = runpy.run_path("side_by_side.py", run_name="side_by_side")  # defines, no run
    try:
        code = harness["main"]() or 0
    except SystemExit as done:  # argparse's --help or a usage error
        code = done.code or 0
    print(f"# launch floor after the cases {launch_floor():.2f} us", flush=True)
    for case in harness["ROWS"]:
        if case["op"] == "c128a":
            T, width = case["T"], case["width"]
            print(f"# write floor T={T} width={width} ({T * width * 4 / 1e6:.1f} MB, contiguous "
                  f"int32 fill) {write_floor(T * width):.2f} us", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
