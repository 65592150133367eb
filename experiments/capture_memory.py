"""GPU memory a CUDA-graph capture leaves behind, by the stream its warm-up runs on (issue 6, 4).

A draft model's greedy drafting (one CUDA graph more than sampled drafting) peaked 0.06 to 0.07
GB higher on an H100 (results/2026-12-06-h100-fullwarmup). The suspect: PyTorch keeps a cuBLAS
workspace per (handle, stream), from the caching allocator, for the life of the process (32 MiB
on Hopper), and specbench.graphs.capture used to warm up on a new side stream at every capture.
It now warms up on one side stream per device. This script captures the same small matrix
product N times each way, side by side in one process, and reports the allocated memory each
capture added:

  new_stream  a new torch.cuda.Stream for every capture's warm-up (the code before 2026-12-06)
  shared      specbench.graphs.capture as it is

    python experiments/capture_memory.py OUT [--captures 8] [--width 1024]

Writes OUT/capture_memory.json (with provenance) and prints the table. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specbench import graphs, provenance


def capture_on_a_new_stream(run):
    """graphs.capture before 2026-12-06: the warm-up on a stream of its own."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


def added_mib(capture, captures: int, width: int) -> list:
    """MiB allocated after each of `captures` captures of x @ w (x [8, width], w [width, width]), from before the first."""
    x = torch.randn(8, width, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
    kept = []  # the graphs and outputs stay alive, as a runner's do
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    grown = []
    for _ in range(captures):
        kept.append(capture(lambda: x @ w))
        torch.cuda.synchronize()
        grown.append((torch.cuda.memory_allocated() - start) / 2**20)
    return grown


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--captures", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("capture_memory: needs CUDA (graphs are captured on a GPU only)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {"new_stream": added_mib(capture_on_a_new_stream, args.captures, args.width),
            "shared": added_mib(graphs.capture, args.captures, args.width)}
    record = {"rows": rows, "captures": args.captures, "width": args.width,
              "device": torch.cuda.get_device_name(), "git_sha": provenance.git_sha(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **provenance.versions()}
    (args.out / "capture_memory.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'warm-up stream':>14} " + " ".join(f"{f'after {i + 1}':>9}" for i in range(args.captures)) + "  (MiB allocated)")
    for name, grown in rows.items():
        print(f"{name:>14} " + " ".join(f"{g:>9.1f}" for g in grown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
