"""Issue 6: what the compiler makes of the decode kernels, without a GPU.

    python experiments/kernel_resources.py OUT [--arch 90] [--kernels gemv,attention] [--shape smollm2] [--rows 33]

Compiles specbench.kernels.gemv (each of its tile configurations, for each projection of a
Llama-3.1-8B layer, or of SmolLM2-135M's with --shape smollm2) and specbench.kernels.attention
(its launch at 1 and 9 positions, context 4096) for one CUDA architecture with the installed
Triton, and reads each binary's resources with the cuobjdump that ships with Triton: registers
a thread, bytes of stack (spills show there), shared memory, whether the main loop copies
asynchronously (cp.async: software pipelined), how many global loads come before the
pipeline's first copy (a peeled step or a pass over x there delays the pipeline's start by its
latency), the CTAs an SM can hold by those numbers (an estimate from the Hopper limits below;
the occupancy the hardware reaches can be lower), and a digest of the PTX without its line
numbers (ptx_digest: equal where two commits compile a kernel alike). Needs no GPU: ptxas runs
here.

Every argument is specialised as Triton's launcher specialises a GPU launch, by Triton's own
function (`launch_signature`): pointers 16-byte aligned, integers that 16 divides declared so,
an integer of 1 a constant. Without that nothing vectorizes or pipelines: until 2026-12-05 this
script declared only the pointers, and the attention kernel's prefix loop (its cache strides
undeclared) compiled with no cp.async. gemv's arguments are built as `project` passes them; the
attention kernel's are recorded from `attention.decode` itself.

What this measures is the compiler, not the kernels' speed, and it is the installed Triton's:
the H200 machines' Triton (3.6) may compile differently. Run it without TRITON_INTERPRET (the interpreter replaces the kernels it compiles).
Writes OUT/kernel_resources.json (with Triton's version, git SHA, date) and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_bench import SHAPES, projections  # noqa: E402  (experiments/ is on sys.path as a script)
from specbench import provenance  # noqa: E402
from specbench.kernels import attention, gemv  # noqa: E402

# Hopper (sm_90) per SM: 64 K registers (allocated per warp in units of 256), 228 KB of shared
# memory (1 KB of it reserved per CTA), 64 warps, 32 CTAs
REGS, SMEM, WARPS, CTAS = 65536, 233472, 64, 32


def launch_signature(fn, args: dict) -> tuple[dict, dict, dict]:
    """fn's signature, constants and attributes as Triton's launcher specialises a launch with
    these arguments (name -> value, meta tensors for pointers), by Triton's own specialisation
    function: an int of 1 becomes a constant, ints and pointers divisible by 16 are declared so
    (meta tensors sit at address 0: aligned, as torch's CUDA allocations are)."""
    const = {fn.arg_names[i] for i in fn.constexprs}
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = args[name]
        if name in const:
            signature[name], constexprs[(i,)] = "constexpr", value
            continue
        kind, key = native_specialize_impl(CUDABackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = key
        elif key:
            attrs[(i,)] = CUDABackend.parse_attr(key)
    return signature, constexprs, attrs


def compile_(fn, args: dict, num_warps: int, num_stages: int, arch: int, **options) -> dict:
    """fn compiled for sm_<arch> as a launch with `args` (every argument by name, constexprs
    included: `launch_signature`) compiles. -> registers, stack, shared bytes, cp.async count,
    global loads in the PTX before the first cp.async (None without one), CTAs an SM holds, and
    `ptx_digest`, equal for equal code."""
    signature, constexprs, attrs = launch_signature(fn, args)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages, **options})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(kernel.asm["cubin"])
        cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(path)], capture_output=True, text=True).stdout
    regs, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
    shared = kernel.metadata.shared
    per_warp = -(-regs * 32 // 256) * 256
    ctas = min(REGS // (per_warp * num_warps), SMEM // (shared + 1024), WARPS // num_warps, CTAS)
    ptx = kernel.asm["ptx"]
    copies = list(re.finditer(r"cp\.async\.c[ag]\.shared", ptx))
    return {"regs": regs, "stack": stack, "shared": shared, "cp_async": len(copies),
            "loads_before_pipeline": len(re.findall(r"ld\.global", ptx[:copies[0].start()])) if copies else None,
            "ctas_per_sm": ctas, "ptx_sha": ptx_digest(ptx)}


def meta(*size, dtype=torch.bfloat16) -> torch.Tensor:
    """A tensor argument with no memory: its dtype and strides are all a launch reads."""
    return torch.empty(*size, dtype=dtype, device="meta")


def recorded_launch(module, name: str, call) -> tuple[tuple, tuple, dict]:
    """The grid and arguments that call() launches module.<name> with: the kernel stood in for by
    a recorder for the call (its wrapper's own code computes them: strides, constants, options)."""
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(grid=grid, args=args, kwargs=kwargs)

    kernel = getattr(module, name)
    setattr(module, name, Recorder())
    try:
        call()
    finally:
        setattr(module, name, kernel)
    return seen["grid"], seen["args"], seen["kwargs"]


def ptx_digest(ptx: str) -> str:
    """12 hex digits of the PTX's sha256 without what moves with the source's layout (the .loc /
    .file lines, comments, the DWARF sections from the first .section on, and the $L__tmp labels
    that mark inlined functions' ranges for them): two commits compile a kernel alike where these
    match."""
    code = ptx.split("\t.section", 1)[0]
    code = [line for line in code.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:$)", line)]
    return hashlib.sha256("\n".join(code).encode()).hexdigest()[:12]


def gemv_rows(arch: int, shape: dict, names=None, M: int = 9) -> list:
    """Every tile configuration of the tuners `project` picks at one row and at M rows (the rows
    one with its split-K tiles), for each projection of a layer of `shape` with its folds, as
    `project` launches them (bf16): past TILE_ROWS rows without the norm fold and the squares
    (wide rows: the norm runs before, gemv.norm_rows)."""
    rows = []
    layer = projections(shape)
    for name in names or layer:
        rows_w, K, folds = layer[name]
        glu = "glu" in folds
        N = rows_w // 2 if glu else rows_w  # the kernels take N per half with glu
        flags = dict(NORM="norm" in folds, GLU=glu, RESIDUAL="residual" in folds, PDL=False)
        for kind, m in (("vector", 1), ("rows", M)):
            tuner = gemv.tuner(m, N, glu, K)
            args = dict(x_ptr=meta(m, K), w_ptr=meta(rows_w, K), y_ptr=meta(m, N), g_ptr=meta(K), r_ptr=meta(m, N),
                        N=N, K=K, eps=1e-5, **flags)
            if kind == "rows":  # the split-K partials and counts (the unsplit tiles leave them unread)
                # and the squares as a layer past its first passes them: the norms read x's, the
                # residual projections sum their outputs' (to TILE_ROWS rows)
                tiled = m <= gemv.TILE_ROWS
                args.update(p_ptr=meta(1, dtype=torch.float32), c_ptr=meta(1, dtype=torch.int32), M=m,
                            ROWS=1 << (m - 1).bit_length(), PRECISION="tf32",
                            xs_ptr=meta(m, -(-K // gemv.SQUARES_GROUP), dtype=torch.float32),
                            s_ptr=meta(m, -(-N // gemv.SQUARES_GROUP), dtype=torch.float32),
                            NORM=flags["NORM"] and tiled,
                            NORM_SQUARES=gemv.squares_width(K) if flags["NORM"] and tiled else 0,
                            SQUARES=flags["RESIDUAL"] and tiled, BLOCK_M=max(16, 1 << (m - 1).bit_length()))
            for config in gemv._k_fits(tuner.configs, {"K": K}):  # as the autotuner prunes them
                row = {"kernel": f"gemv_{kind}", "projection": name, "N": N, "K": K, **config.kwargs,
                       "num_warps": config.num_warps, "num_stages": config.num_stages}
                row.update(compile_(tuner.fn, {**args, **config.kwargs}, config.num_warps, config.num_stages, arch))
                row["programs"] = -(-N // config.kwargs["BLOCK_N"]) * config.kwargs.get("SPLIT_K", 1)
                rows.append(row)
    return rows


# (q, BLOCK_M, num_warps) of the attention launches compiled: the heuristic's (BLOCK_M None) at 1
# and 9 positions, and with --attention-tiles kernel_bench's attention_tiles alternatives at 9
ATTENTION_LAUNCHES = [(1, None, 4), (9, None, 4)]
ATTENTION_TILES = [(1, None, 8), (9, None, 8), (9, 32, 4), (9, 32, 8), (9, 16, 4), (9, 16, 8)]


def attention_rows(arch: int, shape: dict, S: int = 4096, launches=ATTENTION_LAUNCHES) -> list:
    """The attention kernel's launches at batch 1 (q positions, BLOCK_M None: the heuristic's)
    over a cache of S slots per layer ([B, Hkv, S, hd], as native's caches are), as
    `attention.decode` makes them for an H200's 132 SMs (its arguments recorded from the wrapper)."""
    rows = []
    HEADS, KV_HEADS = shape["num_attention_heads"], shape["num_key_value_heads"]
    HD = shape["hidden_size"] // HEADS
    sm_count = attention._sm_count
    attention._sm_count = lambda device: 132
    try:
        for q, block_m, num_warps in launches:
            caches = [meta(1, KV_HEADS, S, HD) for _ in range(2)]
            grid, args, kwargs = recorded_launch(attention, "_partials", lambda: attention.decode(
                meta(1, q, (HEADS + 2 * KV_HEADS) * HD), meta(1, q, 1, HD), meta(1, q, 1, HD), *caches,
                meta(1, dtype=torch.int64), meta(1, q, q, dtype=torch.int8), HEADS, KV_HEADS, block_m=block_m,
                num_warps=num_warps))
            fn = attention._partials
            named = {**dict(zip(fn.arg_names, args)), **{k: v for k, v in kwargs.items() if k in fn.arg_names}}
            options = {k: v for k, v in kwargs.items() if k not in fn.arg_names}
            row = {"kernel": "attention", "q": q, "context": S, "splits": named["SPLITS"], "BLOCK_M": named["BLOCK_M"],
                   "BLOCK_S": named["BLOCK_S"], "num_warps": options["num_warps"],
                   "programs": math.prod(grid)}
            row.update(compile_(fn, named, options.pop("num_warps"), 3, arch, **options))
            rows.append(row)
    finally:
        attention._sm_count = sm_count
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    ap.add_argument("--kernels", default="gemv,attention")
    ap.add_argument("--shape", default="llama8b", choices=list(SHAPES))
    ap.add_argument("--attention-tiles", action="store_true",
                    help="also the attention launches kernel_bench's attention_tiles times (BLOCK_M, warps at q = 9)")
    ap.add_argument("--projections", default="wqkv,wo,w13,w2", help="gemv's projections to compile")
    ap.add_argument("--rows", type=int, default=9,
                    help="gemv's rows kernel at this many rows (17 to 64: the wide rows' 32- or 64-row tiles)")
    args = ap.parse_args(argv)
    if not 2 <= args.rows <= gemv.WIDE_ROWS:
        ap.error(f"--rows={args.rows}: the rows kernel takes 2 to {gemv.WIDE_ROWS} rows")
    shape = SHAPES[args.shape]
    kernels = args.kernels.split(",")
    results = {"arch": f"sm_{args.arch}", "triton": triton.__version__, "host": platform.processor() or platform.machine(),
               "python": platform.python_version(), **provenance.versions(), "git_sha": provenance.git_sha(),
               "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"), "note": "compiled offline: no GPU ran",
               "shape": args.shape,
               "gemv_rows": args.rows,
               "rows": (gemv_rows(args.arch, shape, args.projections.split(","), args.rows) if "gemv" in kernels else [])
               + (attention_rows(args.arch, shape, launches=ATTENTION_LAUNCHES
                                 + (ATTENTION_TILES if args.attention_tiles else [])) if "attention" in kernels else [])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_resources.json").write_text(json.dumps(results, indent=1))
    print(f"{args.shape} shape, sm_{args.arch}, Triton {results['triton']}, {results['git_sha']}"
          "  (compiled offline; CTAs/SM estimated)")
    print(f"{'kernel':12s} {'what':10s} {'tile':>18s} {'regs':>5s} {'stack':>6s} {'smem KB':>8s} {'cp.async':>9s}"
          f" {'loads 1st':>9s} {'CTAs/SM':>8s} {'programs':>9s}")
    for r in results["rows"]:
        what = r.get("projection") or f"q={r['q']}"
        tile = (f"{r['BLOCK_N']}x{r['BLOCK_K']}/{r.get('SPLIT_K', 1)} w{r['num_warps']} s{r['num_stages']}" if "BLOCK_N" in r
                else f"splits {r['splits']} m{r['BLOCK_M']} w{r['num_warps']}")
        print(f"{r['kernel']:12s} {what:10s} {tile:>18s} {r['regs']:5d} {r['stack']:6d} {r['shared'] / 1024:8.1f}"
              f" {r['cp_async']:9d} {str(r['loads_before_pipeline']):>9s} {r['ctas_per_sm']:8d} {r['programs']:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
