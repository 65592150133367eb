"""The decode projections of a Llama-3.1-8B layer, each launched once inside a profiler range, for
Nsight Compute (issue 6, a and b: why the rows kernel at 9 rows streams below the one-row kernel).

    TRITON_CACHE_AUTOTUNING=1 python experiments/gemv_ncu.py   # tunes, outside the profiler
    TRITON_CACHE_AUTOTUNING=1 ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python experiments/gemv_ncu.py

The first run caches the tuning on disk: under ncu the autotuner's timing runs took longer than
a device call (results/2026-12-07-h100-ncu).

Each projection with the folds the layer gives it (wqkv + norm, wo + residual, w13 + norm +
SwiGLU, w2 + residual) at 1 row, at 9 rows as `project` runs it (split K where the autotuner
picks it) and at 9 rows unsplit (`gemv.split_k(False)`). At 9 rows as a layer past the first
runs them: the norms from the squares of x (`norm_squares`), the residual projections summing
their outputs' (`squares`); until 2026-12-07 the norms made their pass over x here. Tuning and warm-up run before the range, so
the profiled launches are these 12 alone, in this order; the script prints each launch's
config. Random bf16 weights; needs CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_bench import LLAMA_8B, projections  # noqa: E402

from specbench.kernels import gemv  # noqa: E402


def cases(device, dtype):
    for name, (N, K, folds) in projections(LLAMA_8B).items():
        w = torch.randn(N, K, device=device, dtype=dtype) / K**0.5
        out = N // 2 if "glu" in folds else N
        for M, split in ((1, True), (9, True), (9, False)):
            x = torch.randn(M, K, device=device, dtype=dtype)
            kw = {"residual": torch.randn(M, out, device=device, dtype=dtype)} if "residual" in folds else {
                "norm": torch.randn(K, device=device, dtype=dtype), "glu": "glu" in folds}
            # at 9 rows as every layer but the first: residual projections sum their outputs'
            # squares, norms take x's
            if M > 1 and "residual" in folds:
                kw["squares"] = True
            elif M > 1:
                kw["norm_squares"] = gemv.squares(x)
            yield f"{name} M={M}" + ("" if split else " unsplit"), x, w, kw, split, out


def main() -> int:
    device, dtype = torch.device("cuda"), torch.bfloat16
    calls = []
    for label, x, w, kw, split, out in cases(device, dtype):
        with gemv.split_k(split):
            for _ in range(3):  # tunes, then warms up
                gemv.project(x, w, eps=1e-5, **kw)
            config = str(gemv.tuner(x.shape[0], out, kw.get("glu", False), x.shape[1]).best_config)
        calls.append((label, x, w, kw, split, config))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, x, w, kw, split, _ in calls:
        with gemv.split_k(split):
            gemv.project(x, w, eps=1e-5, **kw)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for i, (label, *_, config) in enumerate(calls):
        print(f"launch {i}: {label}: {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
