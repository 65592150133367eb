"""A/B: two versions of specbench.kernels.gemv, side by side in one process (issue 6, a and b).

A kernel change is measured against the version before it in the same run on the same GPU: one
commit's decode step replayed in 4.01 ms on one H200 host and 4.09 ms on another
(results/2026-12-04-h200-evening), more than most changes move it. The baseline is the module
as it was at another commit, put into the package beside the current one (untracked, so that it
travels to the GPU host with the working tree):

    git show 068bccc:kernels/gemv.py > kernels/_gemv_base.py
    python experiments/gemv_ab.py OUT --baseline specbench.kernels._gemv_base [--rows 1,2,4,9,16] [--qs 1,9]

--baseline specbench.kernels.gemv times the current module against itself: the noise floor.

projections  each projection of a Llama-3.1-8B layer with the folds the layer gives it
             (wqkv + norm, wo + residual, w13 + norm + SwiGLU, w2 + residual) at each row count:
             us a call for baseline and current, alternated over --rounds rounds (each a CUDA
             graph over weight copies larger than L2; the median of each), the autotuner's pick,
             and each one's largest error against the torch composition. A module whose project
             passes the norm's squares along (gemv.project's squares) runs as a layer runs it:
             its norms from the squares, its residual projections summing them for the next
forwards     the native engine's forward of q positions at context 512 (eager layers with
             engine.kernels, CUDA graphs), once with each module's `project`, alternated
             likewise, and the largest logit difference between the two (a module from before
             the squares: every norm makes its pass over x)

Random bf16 weights. Writes OUT/gemv_ab.json after each measurement (provenance: device,
versions, git SHA, date, the baseline module and its sha256) and prints a table last.
--tiny runs every code path on a 2-layer model, on the CPU too (a check of the script, not a
measurement: off CUDA both modules run the torch composition).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_bench import LLAMA_8B, TINY, build_hf, median_ms, over_copies, projections  # noqa: E402

from specbench import provenance  # noqa: E402
from specbench.engines import native as native_mod  # noqa: E402
from specbench.kernels import gemv  # noqa: E402


def alternated(runs: dict, rounds: int, measure) -> dict:
    """label -> [measure(run) in each round], the runs taken in turn within a round, so that drift
    over the process falls on all of them alike."""
    times = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            times[label].append(measure(run))
    return times


def record(row: dict, times: dict, unit: str) -> None:
    for label, ts in times.items():
        row[f"{label}_{unit}"], row[f"{label}_{unit}_all"] = statistics.median(ts), ts


def takes_squares(mod) -> bool:
    """Whether mod's `project` passes the norm's squares along (gemv.project's squares and
    norm_squares; modules from before them do not)."""
    return "norm_squares" in inspect.signature(mod.project).parameters


def engine_project(mod):
    """mod's `project` as native's block calls it; for a module from before the squares, one that
    takes and ignores them and returns none (its norms make their pass over x)."""
    if takes_squares(mod):
        return mod.project

    def project(*args, norm_squares=None, squares=False, **kwargs):
        y = mod.project(*args, **kwargs)
        return (y, None) if squares else y
    return project


def with_project(mod, fn):
    """fn, run with mod's `project` as the one native's block calls (a CUDA graph replays what its
    capture ran; off CUDA each forward calls it again)."""
    def run():
        with mock.patch.object(native_mod, "project", engine_project(mod)):
            return fn()
    return run


def as_in_a_layer(mod, x, folds: tuple) -> dict:
    """project's extra arguments for mod as a layer of the native engine passes them: a module
    with the squares takes its norm's from the projection before (here computed in torch, as the
    kernel sums them) and sums its residual output's for the next."""
    if not takes_squares(mod):
        return {}
    if "norm" in folds:
        return {"norm_squares": gemv.squares(x)}
    return {"squares": True} if "residual" in folds else {}


def projection_ab(modules: dict, shape: dict, rows, rounds: int, device, dtype, total: int) -> list:
    """modules: label -> gemv module. One row per projection and row count."""
    out = []
    g = torch.Generator(device=device).manual_seed(0)
    for name, (N, K, folds) in projections(shape).items():
        n_out = N // 2 if "glu" in folds else N
        copies = max(2, -(-total // (N * K * 2)))
        ws = [torch.randn(N, K, device=device, dtype=dtype, generator=g) / K**0.5 for _ in range(copies)]
        for M in rows:
            x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
            kw = {"glu": "glu" in folds}
            if "norm" in folds:
                kw["norm"] = 1 + 0.1 * torch.randn(K, device=device, dtype=dtype, generator=g)
            if "residual" in folds:
                kw["residual"] = torch.randn(M, n_out, device=device, dtype=dtype, generator=g)
            expected = gemv.reference(x, ws[0], eps=1e-5, **kw).float()
            row = {"name": name, "folds": "+".join(folds), "N": N, "K": K, "M": M}
            runs = {}
            for label, mod in modules.items():
                extra = as_in_a_layer(mod, x, folds)
                runs[label] = over_copies(lambda w, mod=mod, extra=extra: mod.project(x, w, eps=1e-5, **kw, **extra),
                                          ws, device)  # tunes, captures
                got = mod.project(x, ws[0], eps=1e-5, **kw, **extra)
                got = (got[0] if extra.get("squares") else got).float()
                row[f"{label}_max_rel_err"] = float((got - expected).abs().max() / expected.abs().max())
                row[f"{label}_config"] = str(getattr(mod.tuner(M, n_out, kw["glu"], K), "best_config", None))
            record(row, alternated(runs, rounds, lambda run: median_ms(run, device, n=5) / copies * 1e3), "us")
            print(json.dumps(row), flush=True)
            out.append(row)
        del ws
    return out


def forward_ab(modules: dict, native, ctx: int, qs, rounds: int, steps: int, device) -> list:
    """One engine per module, built and run with that module's `project`, over the same prompt;
    per q the forward's median ms in each round, and the largest logit difference."""
    prompt = torch.randint(0, native.s.vocab_size, (ctx,), device=device)
    engines = {}
    for label, mod in modules.items():
        engines[label] = native_mod.NativeEngine(native, 1, ctx + max(qs) + 8, kernels=True)
        with_project(mod, lambda: engines[label].prefill(0, prompt))()
    out = []
    for q in qs:
        tokens = torch.randint(0, native.s.vocab_size, (1, q), device=device)
        runs = {label: with_project(modules[label], lambda e=engine: e.forward(tokens)) for label, engine in engines.items()}
        first, *others = [run().float() for run in runs.values()]  # tunes, captures (lengths unchanged)
        row = {"q": q, "ctx": ctx, "max_abs_logit_diff": max((float((first - o).abs().max()) for o in others), default=0.0)}
        record(row, alternated(runs, rounds, lambda run: median_ms(run, device, n=steps)), "ms")
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--baseline", required=True, help="the module to compare against, e.g. specbench.kernels._gemv_base")
    ap.add_argument("--rows", default="1,2,4,9,16", help="input rows of the projections")
    ap.add_argument("--qs", default="1,9", help="positions per forward")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="projections,forwards")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    base = importlib.import_module(args.baseline)
    modules = {"base": base, "current": gemv}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else LLAMA_8B
    results = {"device": provenance.device_name(device), **provenance.versions(), "git_sha": provenance.git_sha(),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "baseline": args.baseline,
               "baseline_sha256": hashlib.sha256(Path(base.__file__).read_bytes()).hexdigest(),
               "shape": {k: v for k, v in shape.items() if k != "rope_scaling"}, "dtype": str(dtype)}
    try:
        import triton
        results["triton_version"] = triton.__version__
    except ImportError:
        pass
    args.out.mkdir(parents=True, exist_ok=True)

    def save():
        (args.out / "gemv_ab.json").write_text(json.dumps(results, indent=1) + "\n")

    parts = args.parts.split(",")
    if "projections" in parts:
        rows = [int(m) for m in args.rows.split(",")]
        results["projections"] = projection_ab(modules, shape, rows, args.rounds, device, dtype,
                                               1 << (20 if args.tiny else 30))
        save()
    if "forwards" in parts:
        native = native_mod.Transformer.from_hf(build_hf(shape, device, dtype))
        qs = [int(q) for q in args.qs.split(",")]
        results["forwards"] = forward_ab(modules, native, 32 if args.tiny else 512, qs, args.rounds,
                                         3 if args.tiny else 50, device)
        save()
    print(f"\n{results['device']}  torch {results['torch_version']}  triton {results.get('triton_version')}  "
          f"{results['date']}  sha {results['git_sha']}  baseline {args.baseline}")
    for r in results.get("projections", []):
        print(f"{r['name']:5s} {r['folds']:9s} M={r['M']:2d}  base {r['base_us']:8.2f} us  current "
              f"{r['current_us']:8.2f} us  current/base {r['current_us'] / r['base_us']:.3f}")
    for r in results.get("forwards", []):
        print(f"forward q={r['q']:2d} ctx {r['ctx']}  base {r['base_ms']:.3f} ms  current {r['current_ms']:.3f} ms"
              f"  current/base {r['current_ms'] / r['base_ms']:.3f}  logit diff {r['max_abs_logit_diff']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
