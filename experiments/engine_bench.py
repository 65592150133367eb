"""The native engine on a Llama-3.1-8B-shaped model with random bf16 weights (issue 6, a, b, memory).

  a. decode TPOT at batch 1 against the bandwidth floor (weight bytes over the device-to-device
     copy bandwidth measured in this run, bytes read plus bytes written), against transformers'
     static cache with a torch.compile(mode="reduce-overhead") decode step, and against
     transformers' `generate`;
  b. the verify forward's cost t(q), q = 1..33 positions, at context 512 and 4096 (compiled
     layers: each q its own compile; --dynamic auto adds dynamo's default, q symbolic);
  m. memory: batch 48 at context 4096 (weights, KV cache, peak) and its decode step.
  fused: the decode step with matmul against fused attention over batches and contexts.

    python experiments/engine_bench.py OUT [--parts a,b,m] [--kernels] [--shape smollm2] [--tiny]

--shape smollm2 times SmolLM2-135M's shape instead (the default model, random weights: no carry),
where a step is kernel launches more than weight bytes and the floor says little.
--tiny runs every code path on a 2-layer model (CPU is fine) to check the script, not to time.
Writes OUT/engine_bench.json (every number, with provenance) and prints a table last.
Timing: CUDA events around many steps after warm-up, the median of several repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from specbench import provenance
from specbench.engines.native import NativeEngine, Transformer
from specbench.kernels import attention as attention_mod
from specbench.kernels import gemv as gemv_mod
from specbench.kernels import pdl as pdl_mod

LLAMA_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192),
)
SMOLLM2_135M = dict(  # HuggingFaceTB/SmolLM2-135M-Instruct's config: the default model
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
SHAPES = {"llama8b": LLAMA_8B, "smollm2": SMOLLM2_135M}
DYNAMIC = {"false": False, "auto": None, "true": True}  # --dynamic -> NativeEngine's compile_dynamic
TINY = dict(LLAMA_8B, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def clock(device) -> callable:
    """A stopwatch in ms: CUDA events on a GPU, perf_counter after a synchronize elsewhere."""
    if device.type == "cuda":
        def measure(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
    else:
        def measure(fn, n):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            return 1e3 * (time.perf_counter() - t) / n
    return measure


def median_ms(fn, device, n: int, repeats: int = 5, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    measure = clock(device)
    return statistics.median(measure(fn, n) for _ in range(repeats))


def over_copies(fn, ws: list, device) -> callable:
    """A run of fn(w) for each weight copy w in ws (together far larger than L2, so that no call
    finds its weights in cache), captured in one CUDA graph (a plain loop off CUDA); fn is called
    on two copies first, so that autotuning stays outside the graph. Time it with median_ms and
    divide by len(ws)."""
    for w in ws[:2]:
        fn(w)
    if device.type != "cuda":
        return lambda: [fn(w) for w in ws]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in ws:
            fn(w)
    return graph.replay


def projections(shape: dict) -> dict:
    """A decoder layer's projections as the native engine's block calls gemv.project: name ->
    (N, K, folds), N the weight's rows (with glu both halves), folds what the layer folds in:
    norm (its RMSNorm before), glu (SwiGLU after), residual (added after)."""
    D, H = shape["hidden_size"], shape["intermediate_size"]
    qkv = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) * (D // shape["num_attention_heads"])
    return {"wqkv": (qkv, D, ("norm",)), "wo": (D, D, ("residual",)), "w13": (2 * H, D, ("norm", "glu")),
            "w2": (D, H, ("residual",))}


def copy_bandwidth(device, gib: float) -> float:
    """Device-to-device copy, bytes read plus bytes written, in bytes/s."""
    n = int(gib * 2**30) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, n=10)
    return 2 * src.numel() * 4 / (ms / 1e3)


def build_hf(shape: dict, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**shape)).to(dtype)
    return model.eval()


def native_decode(native, ctx: int, device, compile: bool, steps: int, mode=None, scope="layer",
                  kernels: bool = False, pdl: bool = False) -> dict:
    """Decode steps at batch 1 after a prefill of ctx random tokens: the engine's own loop
    (inputs copied in, one graph replay, lengths moved), and the graph replay alone. The token
    lives on the device, as a sampled one does. pdl=True: the kernels with programmatic dependent
    launch (kernels/pdl.py; off by default)."""
    if mode is not None:
        torch._dynamo.reset()  # compiled code is cached per function: forget the default mode's
    with pdl_mod.enabled(pdl):  # PDL is decided at capture
        engine = NativeEngine(native, 1, ctx + steps * 8 + 64, compile=compile, compile_mode=mode,
                              compile_scope=scope, kernels=kernels)
        prompt = torch.randint(0, native.s.vocab_size, (ctx,), device=device)
        engine.prefill(0, prompt)
        token = torch.randint(0, native.s.vocab_size, (1, 1), device=device)
        engine.forward(token)  # captures the graph
    done = [0]

    def step():  # one decode step, the sampled token excluded; the cache returns to ctx every 8 steps
        engine.forward(token)
        engine.advance([[0]])
        done[0] += 1
        if done[0] % 8 == 0:
            engine.lengths[0] = ctx

    ms = median_ms(step, device, n=steps)
    out = {"ms": ms}
    if engine.cuda_graphs:
        graph = engine._graphs[(1, False)][0]
        out["replay_ms"] = median_ms(graph.replay, device, n=steps)
    return out


def hf_static_compiled(model, ctx: int, device, steps: int) -> dict:
    """transformers' fast path: StaticCache and a torch.compile(mode="reduce-overhead") step."""
    from transformers import StaticCache

    from specbench.engines.hf import cache_kwarg

    arg = cache_kwarg(model)
    cache = StaticCache(config=model.config, max_cache_len=ctx + steps * 8 + 64)
    prompt = torch.randint(0, model.config.vocab_size, (1, ctx), device=device)
    with torch.inference_mode():
        model(input_ids=prompt, cache_position=torch.arange(ctx, device=device), use_cache=True, **{arg: cache})
    step_fn = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    token = torch.randint(0, model.config.vocab_size, (1, 1), device=device)
    position = [ctx]

    def step():
        pos = torch.tensor([position[0]], device=device)
        with torch.inference_mode():
            step_fn(input_ids=token, cache_position=pos, position_ids=pos[None], use_cache=True, **{arg: cache})
        position[0] = ctx + (position[0] + 1 - ctx) % 8

    t = time.perf_counter()
    for _ in range(3):  # compile and record the graphs
        step()
    compile_s = time.perf_counter() - t
    return {"ms": median_ms(step, device, n=steps), "compile_s": compile_s}


def hf_generate(model, ctx: int, device) -> dict:
    """`generate` (dynamic cache, greedy): the per-token cost from the difference of two lengths."""
    prompt = torch.randint(0, model.config.vocab_size, (1, ctx), device=device)

    def gen(n):
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    gen(2)
    short, long = 4, 20
    measure = clock(device)
    t_short = statistics.median(measure(lambda: gen(short), 1) for _ in range(2))
    t_long = statistics.median(measure(lambda: gen(long), 1) for _ in range(2))
    return {"ms": (t_long - t_short) / (long - short)}


def verify_curve(native, ctx: int, device, compile: bool, qs, steps: int, kernels: bool = False,
                 dynamic: Optional[bool] = False) -> dict:
    """t(q): one forward of q chain positions at batch 1 over ctx cached tokens. dynamic: the
    engine's compile_dynamic (False: each q compiled on its own; None: dynamo's default, q
    symbolic from the second q on, so t(1) alone is specialised). The tokens live on the device,
    as part a's decode token does. Until 2026-12-07 they came from the host: `forward`'s blocking
    copy to the device synchronises the stream, so each step also paid the wait for the step
    before and the launch of its own replay."""
    engine = NativeEngine(native, 1, ctx + max(qs) + 8, compile=compile, kernels=kernels, compile_dynamic=dynamic)
    engine.prefill(0, torch.randint(0, native.s.vocab_size, (ctx,), device=device))
    times = {}
    for q in qs:
        tokens = torch.randint(0, native.s.vocab_size, (1, q), device=device)
        times[q] = median_ms(lambda: engine.forward(tokens), device, n=steps)  # lengths unchanged: same ctx
        print(f"    t({q}) at context {ctx}: {times[q]:.3f} ms", flush=True)  # in the log if a limit cuts the curve
    return times


@contextmanager
def attention_launch(block_m: Optional[int] = None, max_splits: Optional[int] = None):
    """The attention kernel's launch forced inside the block, in place of launch_shape's
    heuristic: block_m, the query rows a program, for forwards of more than one row; max_splits,
    the most slices a cache prefix splits into (kernels/attention.py's MAX_SPLITS), for every
    forward. None leaves the heuristic's; explicit arguments stand. Engines built inside the
    block capture it."""
    heuristic = attention_mod.launch_shape

    def forced(B, q, *args, **kwargs):
        if block_m and B * q > 1 and kwargs.get("block_m") is None:
            kwargs["block_m"] = block_m
        if max_splits and "max_splits" not in kwargs:
            kwargs["max_splits"] = max_splits
        return heuristic(B, q, *args, **kwargs)

    attention_mod.launch_shape = forced
    try:
        yield
    finally:
        attention_mod.launch_shape = heuristic


def memory_batch48(native, ctx: int, device, rows: int, steps: int, compile: bool, kernels: bool = False) -> dict:
    """rows requests at ctx tokens each: the cache allocated, filled with random values (not
    zeros), and one decode step for all rows."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    engine = NativeEngine(native, rows, ctx + 16, compile=compile, kernels=kernels)
    for cache in (engine.cache_k, engine.cache_v):
        for layer in cache:
            layer.normal_()
    engine.lengths.fill_(ctx)
    tokens = torch.randint(0, native.s.vocab_size, (rows, 1), device=device)  # on the device, as part a's
    ms = median_ms(lambda: engine.forward(tokens), device, n=steps)
    out = {"rows": rows, "ctx": ctx, "step_ms": ms, "tokens_per_s": rows / (ms / 1e3),
           "kv_cache_gb": 2 * engine.cache_k.numel() * engine.cache_k.element_size() / 1e9,
           "kv_bytes_per_token": engine.kv_bytes_per_token}
    if device.type == "cuda":
        out["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        out["device_memory_gb"] = torch.cuda.get_device_properties(device).total_memory / 1e9
    return out


def attention_crossover(native, device, ctxs, batches, steps: int) -> list:
    """The decode step (eager layers in CUDA graphs) with the matmul attention, with PyTorch's
    fused kernel, and with engine.kernels (specbench.kernels.attention and gemv) at each batch
    and context: where FUSED_FROM (engines/native.py) should sit, and what the kernels change."""
    from specbench.engines import native as native_mod

    rows = []
    saved = native_mod.FUSED_FROM
    try:
        for ctx in ctxs:
            for B in batches:
                row = {"ctx": ctx, "rows": B}
                for name, threshold, kernels in (("matmul_ms", 1 << 30, False), ("fused_ms", 0, False),
                                                 ("kernel_ms", 0, True)):
                    native_mod.FUSED_FROM = threshold
                    engine = NativeEngine(native, B, ctx + 16, kernels=kernels)
                    engine.lengths.fill_(ctx)
                    tokens = torch.randint(0, native.s.vocab_size, (B, 1), device=device)
                    row[name] = median_ms(lambda: engine.forward(tokens), device, n=steps)
                row["fused_over_matmul"] = row["fused_ms"] / row["matmul_ms"]
                row["kernel_over_best"] = row["kernel_ms"] / min(row["fused_ms"], row["matmul_ms"])
                print(row, flush=True)
                rows.append(row)
    finally:
        native_mod.FUSED_FROM = saved
    return rows


def attempt(results: dict, key: str, fn, out: Path):
    """One measurement; its failure is recorded, and everything so far is written at once."""
    t = time.perf_counter()
    try:
        results[key] = fn()
    except Exception as e:  # one failed measurement must not lose the others
        traceback.print_exc()
        results[key] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    print(f"[{time.perf_counter() - t:6.1f} s] {key}: {results[key]}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_bench.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="a,b,m",
                    help="a, b, m, fused (the attention crossover); autotune and model add a's "
                         "max-autotune variants (one layer, the whole forward)")
    ap.add_argument("--shape", default="llama8b", choices=list(SHAPES))
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model, few steps: checks the script")
    ap.add_argument("--qs", default="1-33", help="b's positions per forward: a range A-B or a list (1,9: the goal's pair alone)")
    ap.add_argument("--kernels", action="store_true",
                    help="engine.kernels: a adds each native variant with the kernels beside it; b and m run with them, in eager layers")
    ap.add_argument("--dynamic", default="false",
                    help="b's compiled curves: engine.compile_dynamic, a list of false (each q compiled on its own), "
                         "auto (dynamo's default) and true")
    ap.add_argument("--attention-block-m", default="",
                    help="with --kernels: b also times each curve with the attention kernel's BLOCK_M forced to "
                         "each of these (a list of 16, 32, 64) where a forward has more than one row")
    ap.add_argument("--attention-max-splits", default="",
                    help="with --kernels: b also times each curve with the attention's cache prefix split into at "
                         "most each of these many slices (a list; the heuristic's bound is kernels/attention.py's "
                         "MAX_SPLITS), every forward, one row too")
    ap.add_argument("--b-pdl", action="store_true",
                    help="with --kernels: b also times each curve with programmatic dependent launch for forwards of up "
                         "to 16 rows (kernels/pdl.py; off by default, and otherwise for one-row forwards only)")
    ap.add_argument("--b-max-rows", default="",
                    help="with --kernels: b also times each curve with the projection kernels taking forwards of at "
                         "most each of these many rows (a list, 16 to 64: gemv.max_rows; the default is "
                         "gemv.MAX_ROWS, 33); 16 is torch's projections past 16 rows, main's before 2026-12-08")
    ap.add_argument("--b-contexts", default="512,4096", help="b's context lengths (--tiny: 32,128)")
    ap.add_argument("--b-without-kernels", action="store_true",
                    help="with --kernels: b also times each curve without them (compiled layers, as the runner's rows ran)")
    args = ap.parse_args(argv)
    if set(args.dynamic.split(",")) - set(DYNAMIC):
        ap.error(f"--dynamic={args.dynamic}: valid: {', '.join(DYNAMIC)}")
    def kernels_ints(flag: str, value: str, ok, what: str) -> list:
        # a comma-separated list of integers each passing ok, with --kernels; else one line naming the flag
        items = value.split(",") if value else []
        if items and not (args.kernels and all(v.strip().isdigit() and ok(int(v)) for v in items)):
            ap.error(f"{flag}={value}: {what}, with --kernels")
        return [int(v) for v in items]

    block_ms = kernels_ints("--attention-block-m", args.attention_block_m, lambda v: v in (16, 32, 64),
                            "a list of 16, 32, 64")
    max_splits = kernels_ints("--attention-max-splits", args.attention_max_splits, lambda v: v >= 1,
                              "a list of positive integers")
    max_rows = kernels_ints("--b-max-rows", args.b_max_rows, lambda v: gemv_mod.TILE_ROWS <= v <= gemv_mod.WIDE_ROWS,
                            f"a list of {gemv_mod.TILE_ROWS} to {gemv_mod.WIDE_ROWS}")
    contexts = args.b_contexts.split(",")
    if not all(c.strip().isdigit() and int(c) > 0 for c in contexts):
        ap.error(f"--b-contexts={args.b_contexts}: a list of positive integers")
    contexts = (32, 128) if args.tiny else tuple(int(c) for c in contexts)
    kernels = args.kernels
    parts = set(args.parts.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else SHAPES[args.shape]
    steps = 5 if args.tiny else 50
    ctx = 64 if args.tiny else 512
    import importlib.metadata

    import transformers

    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = None
    results = {"device": provenance.device_name(device), "torch": torch.__version__,
               "transformers": transformers.__version__, "triton": triton_version,
               "git_sha": provenance.git_sha(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "shape_name": "tiny" if args.tiny else args.shape,
               "shape": {k: v for k, v in shape.items() if k != "rope_scaling"}, "dtype": str(dtype), "ctx": ctx,
               "kernels": kernels, "gemv_max_rows": gemv_mod.MAX_ROWS}
    model = build_hf(shape, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results["weight_bytes"] = weight_bytes
    attempt(results, "copy_bandwidth", lambda: copy_bandwidth(device, 0.05 if args.tiny else 4.0), args.out)
    results["floor_ms"] = weight_bytes / results["copy_bandwidth"] * 1e3
    native = Transformer.from_hf(model)

    if "a" in parts:
        for suffix in ("", "_kernels") if kernels else ("",):
            k = bool(suffix)
            attempt(results, "native_graphs" + suffix, lambda: native_decode(native, ctx, device, False, steps, kernels=k), args.out)
            attempt(results, "native_compiled_graphs" + suffix,
                    lambda: native_decode(native, ctx, device, True, steps, kernels=k), args.out)
        if kernels:  # the same kernels, each launched early, while its predecessor drains (PDL)
            attempt(results, "native_graphs_kernels_pdl",
                    lambda: native_decode(native, ctx, device, False, steps, kernels=True, pdl=True), args.out)
        attempt(results, "hf_static_compiled", lambda: hf_static_compiled(model, ctx, device, steps), args.out)
        attempt(results, "hf_generate", lambda: hf_generate(model, ctx, device), args.out)
    if "b" in parts or "m" in parts:
        del model  # the native copy is all that is left to time
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "b" in parts:
        lo, _, hi = args.qs.partition("-")
        qs = list(range(int(lo), int(hi) + 1)) if hi else [int(q) for q in args.qs.split(",")]
        for c in contexts:
            for name in args.dynamic.split(","):  # curves beside the default's are named by their setting
                # with the kernels, eager layers: as fast as compiled ones (a), and no compile per q
                attempt(results, f"verify_ctx{c}" + ("" if name == "false" else f"_dynamic_{name}"),
                        lambda: verify_curve(native, c, device, not kernels, qs, max(steps // 2, 1), kernels,
                                             DYNAMIC[name]), args.out)
            def kernels_curve(setting):  # the kernels' curve inside `setting`, decided at capture
                with setting:
                    return verify_curve(native, c, device, False, qs, max(steps // 2, 1), True)
            if kernels and args.b_pdl:
                attempt(results, f"verify_ctx{c}_pdl", lambda: kernels_curve(pdl_mod.enabled(True, rows=16)), args.out)
            for n in max_rows:
                attempt(results, f"verify_ctx{c}_rows{n}", lambda: kernels_curve(gemv_mod.max_rows(n)), args.out)
            for block_m in block_ms:
                attempt(results, f"verify_ctx{c}_block_m{block_m}", lambda: kernels_curve(attention_launch(block_m)),
                        args.out)
            for n in max_splits:
                attempt(results, f"verify_ctx{c}_max_splits{n}",
                        lambda: kernels_curve(attention_launch(max_splits=n)), args.out)
            if kernels and args.b_without_kernels:
                attempt(results, f"verify_ctx{c}_torch",
                        lambda: verify_curve(native, c, device, True, qs, max(steps // 2, 1)), args.out)
    if "m" in parts:
        attempt(results, "memory_batch48_ctx4096",
                lambda: memory_batch48(native, 128 if args.tiny else 4096, device, 48, steps, not kernels, kernels),
                args.out)
    if "fused" in parts:
        attempt(results, "attention_crossover", lambda: attention_crossover(
            native, device, (128,) if args.tiny else (512, 4096), (1, 4) if args.tiny else (1, 2, 4, 8, 16, 32, 48),
            max(steps // 2, 1)), args.out)
    if "a" in parts and "autotune" in parts:  # last: Triton matmul templates tuned per shape (slow to compile)
        attempt(results, "native_autotune_graphs",
                lambda: native_decode(native, ctx, device, True, steps, "max-autotune-no-cudagraphs", kernels=kernels),
                args.out)
    if "a" in parts and "model" in parts:  # the whole forward compiled: fusion across layers (slower to compile)
        attempt(results, "native_model_autotune_graphs",
                lambda: native_decode(native, ctx, device, True, steps, "max-autotune-no-cudagraphs", "model"), args.out)
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    floor = r["floor_ms"]
    print(f"\n{r.get('shape_name', 'llama8b')} shape, {r['device']}  torch {r['torch']}  transformers {r['transformers']}  {r['date']}  sha {r['git_sha']}")
    print(f"weights {r['weight_bytes'] / 1e9:.2f} GB, copy bandwidth {r['copy_bandwidth'] / 1e12:.2f} TB/s, floor {floor:.2f} ms")
    print("a. decode at batch 1                     ms/token   x floor")
    native_keys = ("native_graphs", "native_graphs_kernels", "native_graphs_kernels_pdl", "native_compiled_graphs",
                   "native_compiled_graphs_kernels", "native_autotune_graphs", "native_model_autotune_graphs")
    for key in native_keys + ("hf_static_compiled", "hf_generate"):
        v = r.get(key, {})
        if "ms" in v:
            print(f"   {key:34s} {v['ms']:8.2f}  {v['ms'] / floor:7.2f}" + (f"   (replay alone {v['replay_ms']:.2f})" if "replay_ms" in v else ""))
        elif v:
            print(f"   {key:34s} {v}")
    best = min((r[k]["ms"] for k in native_keys if "ms" in r.get(k, {})), default=None)
    for key in ("hf_static_compiled", "hf_generate"):
        if best and "ms" in r.get(key, {}):
            print(f"   native vs {key}: {r[key]['ms'] / best:.1f} x faster")
    for key in [k for k in r if k.startswith("verify_ctx")]:
        t = r[key]
        if "error" in t:
            print(f"b. {key}: {t}")
            continue
        t = {int(q): v for q, v in t.items()}
        row = "  ".join(f"{q}:{t[q]:.2f}" for q in (1, 2, 4, 5, 8, 9, 16, 17, 24, 33, 48, 64) if q in t)
        ratio = f"   t(9)/t(1) = {t[9] / t[1]:.3f}" if 1 in t and 9 in t else ""
        print(f"b. {key} t(q) ms  {row}{ratio}")
    m = r.get("memory_batch48_ctx4096")
    if m:
        print(f"m. batch 48, ctx 4096: {m}")


if __name__ == "__main__":
    sys.exit(main())
