"""Where a batch-1 decode step of the Llama-3.1-8B shape spends its time (issue 6, a; with
--shape smollm2 the default model's, whose verify forwards the synthetic control times: c).

  gemv      each projection shape alone, F.linear (cuBLAS) against the Triton kernel of
            specbench.kernels.gemv, at 1, 9 and 16 rows, and at 1 and 9 rows with the norm,
            activation or residual folded in against the same in torch: GB/s against the copy bandwidth.
            Weights rotate over copies larger than L2, so nothing is served from cache.
  variants  the engine's decode step (prefill 512, CUDA graphs; --q 9: a verify forward of 9
            positions; --q 1,2,3: each in turn) per variant: ms, graph replay
            alone, and the profiler's kernel table of the replay (summed kernel time against
            wall time: the difference is launch gaps and tails).

    python experiments/decode_profile.py OUT [--variants eager,layer,...] [--q 1,2,9] [--shape smollm2] [--no-gemv] [--tiny]

Writes OUT/decode_profile.json after each measurement and prints tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from engine_bench import SHAPES, TINY, build_hf, copy_bandwidth, median_ms, over_copies, projections  # noqa: E402

from specbench import provenance  # noqa: E402
from specbench.engines.native import NativeEngine, Transformer  # noqa: E402
from specbench.kernels import gemv, pdl  # noqa: E402

# name -> (compile, mode, scope, kernels, coordinate descent tuning)
VARIANTS = {
    "eager": (False, None, "layer", False, False),
    "eager_kernels": (False, None, "layer", True, False),
    "eager_kernels_pdl": (False, None, "layer", True, False),  # with kernels/pdl.py's early launch
    "layer": (True, None, "layer", False, False),
    "layer_kernels": (True, None, "layer", True, False),
    "layer_cdt": (True, None, "layer", False, True),
    "layer_autotune": (True, "max-autotune-no-cudagraphs", "layer", False, False),
    "layer_autotune_kernels": (True, "max-autotune-no-cudagraphs", "layer", True, False),
    "model": (True, None, "model", False, False),
    "model_kernels": (True, None, "model", True, False),
}


def gemv_table(shape: dict, device, dtype, bandwidth: float, total: int = 1 << 30) -> list:
    mats = {name: (N, K) for name, (N, K, _) in projections(shape).items()}
    mats["output"] = (shape["vocab_size"], shape["hidden_size"])
    rows = []
    for name, (N, K) in mats.items():
        size = N * K * 2
        copies = max(2, -(-total // size))  # over 1 GiB in all on a GPU: far more than L2
        ws = [torch.randn(N, K, device=device, dtype=dtype) for _ in range(copies)]
        for M in (1, 9, 16):
            x = torch.randn(M, K, device=device, dtype=dtype)
            row = {"name": name, "N": N, "K": K, "M": M, "MB": size / 1e6}
            for impl, fn in (("cublas", F.linear), ("triton", gemv.project)):
                if impl == "triton" and not gemv.supported(x, ws[0]):
                    continue
                try:
                    ms = median_ms(over_copies(lambda w: fn(x, w), ws, device), device, n=5) / copies
                    row[f"{impl}_us"] = ms * 1e3
                    row[f"{impl}_of_copy_bw"] = size / (ms / 1e3) / bandwidth
                except Exception as e:
                    row[f"{impl}_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            if "triton_us" in row and "cublas_us" in row:
                y0, y1 = F.linear(x, ws[0]), gemv.project(x, ws[0])
                row["max_rel_err"] = float((y0.float() - y1.float()).abs().max() / y0.float().abs().max())
            print(row, flush=True)
            rows.append(row)
        for M in (1, 9) if name in ("wqkv", "wo", "w13", "w2") and device.type == "cuda" else ():
            # the norm / activation / residual folded in, as the layer calls it
            x = torch.randn(M, K, device=device, dtype=dtype)
            g = torch.randn(K, device=device, dtype=dtype)
            r = torch.randn(M, N // 2 if name == "w13" else N, device=device, dtype=dtype)
            extra = {"wqkv": dict(norm=g), "w13": dict(norm=g, glu=True), "wo": dict(residual=r),
                     "w2": dict(residual=r)}[name]
            row = {"name": name + "_fused", "N": N, "K": K, "M": M, "MB": size / 1e6}
            y0 = gemv.project(x, ws[0], eps=1e-5, kernel=False, **extra).float()
            # triton: as project() runs it; triton_unsplit: the rows kernel without split K,
            # side by side
            for impl, kernel, split in (("torch", False, True), ("triton", True, True)) + (
                    (("triton_unsplit", True, False),) if M > 1 else ()):
                with gemv.split_k(split):
                    fn = lambda x, w: gemv.project(x, w, eps=1e-5, kernel=kernel, **extra)  # noqa: E731
                    ms = median_ms(over_copies(lambda w: fn(x, w), ws, device), device, n=5) / copies
                    row[f"{impl}_us"], row[f"{impl}_of_copy_bw"] = ms * 1e3, size / (ms / 1e3) / bandwidth
                    if kernel:
                        y1 = fn(x, ws[0]).float()
                        row[f"{impl}_max_rel_err"] = float((y0 - y1).abs().max() / y0.abs().max())
                        tuner = gemv.tuner(M, N // 2 if name == "w13" else N, name == "w13", K)
                        row[f"{impl}_config"] = str(tuner.best_config)  # the autotuner's pick for this call
            print(row, flush=True)
            rows.append(row)
    return rows


def kernel_table(prof, steps: int) -> dict:
    totals, counts = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            counts[e.name] += 1
    top = sorted(totals.items(), key=lambda kv: -kv[1])
    return {"kernel_us_per_step": sum(totals.values()) / steps,
            "launches_per_step": sum(counts.values()) / steps,
            "top": [{"name": n[:120], "us_per_step": t / steps, "count_per_step": counts[n] / steps} for n, t in top[:25]]}


def variant(native, name: str, ctx: int, device, steps: int, q: int = 1) -> dict:
    """The forward of q chain positions (q = 1: a decode step; more: a verify forward)."""
    compile, mode, scope, kernels, cdt = VARIANTS[name]
    torch._dynamo.reset()
    import torch._inductor.config as inductor_config
    inductor_config.coordinate_descent_tuning = cdt
    t = time.perf_counter()
    with pdl.enabled(name.endswith("_pdl"), rows=16):  # PDL is decided at capture; on verify forwards too
        engine = NativeEngine(native, 1, ctx + 128, compile=compile, compile_mode=mode, compile_scope=scope,
                              kernels=kernels)
        engine.prefill(0, torch.randint(0, native.s.vocab_size, (ctx,), device=device))
        token = torch.randint(0, native.s.vocab_size, (1, q), device=device)
        logits = engine.forward(token).clone()  # compiles and captures
    out = {"build_s": time.perf_counter() - t}
    reference = NativeEngine(native, 1, ctx + 128, cuda_graphs=False)
    reference.cache_k.copy_(engine.cache_k), reference.cache_v.copy_(engine.cache_v)
    reference.lengths.copy_(engine.lengths)
    expected = reference.forward(token)
    out["max_abs_logit_diff"] = float((logits.float() - expected.float()).abs().max())
    del reference

    def step():
        engine.forward(token)

    out["ms"] = median_ms(step, device, n=steps)
    if engine.cuda_graphs:
        graph = engine._graphs[(q, False)][0]
        out["replay_ms"] = median_ms(graph.replay, device, n=steps)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
        out.update(kernel_table(prof, 10))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--variants", default="eager,eager_kernels,layer,layer_kernels,layer_cdt")
    ap.add_argument("--no-gemv", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--q", default="1", help="positions per forward, comma-separated: 1 decodes, more verify a chain")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama8b")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else SHAPES[args.shape]
    qs = [int(q) for q in args.q.split(",")]
    ctx, steps = (32, 3) if args.tiny else (512, 50)
    results = {"device": provenance.device_name(device), "torch": torch.__version__,
               "git_sha": provenance.git_sha(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ctx": ctx, "q": qs, "shape": "tiny" if args.tiny else args.shape}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    def save():
        (out / "decode_profile.json").write_text(json.dumps(results, indent=1, default=str) + "\n")

    results["copy_bandwidth"] = copy_bandwidth(device, 0.05 if args.tiny else 4.0)
    if not args.no_gemv:
        results["gemv"] = gemv_table(shape, device, dtype, results["copy_bandwidth"], 1 << (20 if args.tiny else 30))
        save()
    model = build_hf(shape, device, dtype)
    results["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    results["floor_ms"] = results["weight_bytes"] / results["copy_bandwidth"] * 1e3
    native = Transformer.from_hf(model)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    runs = [(name, q, name if len(qs) == 1 else f"{name} q={q}") for name in args.variants.split(",") for q in qs]
    for name, q, key in runs:
        t = time.perf_counter()
        try:
            results[key] = variant(native, name, ctx, device, steps, q)
        except Exception as e:
            traceback.print_exc()
            results[key] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        r = results[key]
        print(f"[{time.perf_counter() - t:6.1f} s] {key}: " + json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
        for k in r.get("top", [])[:12]:
            print(f"      {k['us_per_step']:8.1f} us  x{k['count_per_step']:5.0f}  {k['name']}")
        save()
    print(f"\nfloor {results['floor_ms']:.2f} ms  copy {results['copy_bandwidth'] / 1e12:.2f} TB/s")
    for _, _, key in runs:
        r = results[key]
        if "ms" in r:
            print(f"{key:16s} {r['ms']:6.2f} ms  x{r['ms'] / results['floor_ms']:.2f} floor  "
                  f"replay {r.get('replay_ms', float('nan')):.2f}  kernels {r.get('kernel_us_per_step', 0) / 1e3:.2f} ms "
                  f"launches {r.get('launches_per_step', 0):.0f}  logit diff {r['max_abs_logit_diff']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
