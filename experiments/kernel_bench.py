"""Issue 7: the Triton verification and n-gram kernels against the memory-bandwidth floor and
against their torch references.

    python experiments/kernel_bench.py OUT [--kernels chain,tree,ngram,tune,attention,attention_tune,attention_tiles,norm] [--tiny]

Grid. chain: B in {1, 8, 48, 256} x k in {1, 4, 8} x V in {49152, 128256, 151936}, fp32
probabilities, rules standard, onehot and greedy. tree: SGLang's default shape (topk 4, depth 5,
8 draft tokens: the root's 4 children and a chain of 4 below the first), the same B and V, rules
target_only and greedy. ngram: B in {1, 8, 48, 256} x T in {1024, 4096}, n in 2..5, k = 8.
tune (at the goal shape B = 256, k = 8, V = 128256, standard): the kernel over a few launch
shapes (tile width, warps, programs per request), to pick the defaults on a new GPU.
attention (issue 6; not in the default list): specbench.kernels.attention.decode against the
engine's torch composition, one layer of Llama-3.1-8B (32 query heads, 8 key/value heads, hd
128, bf16), B in {1, 8, 48} x q in {1, 9} x S in {512, 4096} cached tokens, each side replayed
from a CUDA graph; its floor: the cache prefix read once, the new entries written, qkv and o.
"equal" there means o within 2e-2 of the reference relative to its largest entry (bf16; the
reference rounds its scores to bf16, the kernel does not). attention_tune (not in the default
list either): the same at B in {1, 8} x q in {1, 9} x S in {512, 4096}, over the least blocks a
prefix split takes (min_blocks 1, 2, 4, 8) and the partials the merge folds a step (unroll).
attention_tiles (nor this): B = 1, q in {1, 9}, S in {512, 4096}, over the query rows a program
takes (BLOCK_M 16, 32, 64: at q = 9 the 36 rows of a kv head in 3, 2 or 1 tiles) and its warps
(4, 8). Compiled offline for sm_90 (results/2026-12-05-cpu-launch-specialized), BLOCK_M 64 with
4 warps, at q = 9 the heuristic's until 2026-12-07 (since then at S = 4096 only: a short cache
tiles by 16), takes 255 registers and spills 32 bytes; 32 rows take 192.
norm (issue 6; not in the default list): the 65 RMSNorms of a forward of the 8B shape past 16
rows (M in {17, 33, 64}, K = 4096, bf16) in one CUDA graph, gemv.norm_rows (one launch a norm)
against rms_norm in torch (8 launches); "equal" there means within 1e-2 of the reference
relative to its largest entry (a bf16 rounding step is 2^-8 of an entry), and same_fraction
gives the share of entries equal bit for bit.

Inputs. p = softmax(3 z), q = softmax(3 z') with independent Gaussian z, z' per position; a
draft is the argmax of p with probability 0.7, else a draw from q. So greedy accepts about 0.7
per position, and the sampled rules mostly refuse early: where the round ends decides which rows
are read, and the floor below counts exactly those.

The floor: the bytes a kernel must move for the outcome it computed, per request,
  chain standard / onehot / target_only: read the k drafts (8 B each), k coins and the k
      gathers p(x) (4 B each; standard also q(x)), then the full rows where the round ends: p,
      q (standard, and only on a refusal: a bonus reads no q) and the noise (4 V B each); write
      k + 1 tokens and the count (8 B each). The rows of p at positions the accept test did not
      stop at are not read.
  chain greedy: the drafts, then the whole p row at every position up to where the round ends
      (the argmax needs all of it), and the outputs.
  tree target_only: the 9 node tokens and 2 x 9 links (8 B each), 5 coins, the gathers p_n(c)
      of the children tried, the closing p row and the noise row, the outputs (tokens, path,
      count, tried). greedy: the whole p row at every node visited, no coins or noise.
  ngram: each history once (T x 8 B), its length, the k drafts and the count.
GB/s = floor bytes / kernel time; "of copy" divides by the device-to-device copy bandwidth
measured in this run (bytes read plus bytes written; engine_bench.copy_bandwidth, 4 GiB).

The split. One program per request tests the drafts (a few hundred bytes), but one program per
request cannot pull 0.5 MB rows fast enough at small B, so each request's vocabulary pass is
split over S programs (S a power of two, B x S >= 4 programs per SM) that each write their best
packed keys; a one-program-per-request kernel reduces them (specbench.kernels.chain). Greedy
reads row after row until the first mismatch and stays one program per request.

Timing. CUDA events around each call, the L2 cache flushed before it (a 512 MB write outside
the events: the inputs of small B fit in H200's 50 MB L2, which would flatter the floor), the
median of `reps` calls after warm-up; the torch reference (chain_torch / tree_torch /
ngram_propose_batch, the same inputs) the same way. Kernel and reference outputs are compared
once per shape. Writes OUT/kernel_bench.json after every measurement (provenance: device,
versions, git SHA, date) and prints a table last.

--tiny runs two shapes of each kernel on the CPU under TRITON_INTERPRET=1 (set here before the
kernels are imported) to check the script, not to time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the interpreter: chosen when triton is first imported, so first
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine_bench import copy_bandwidth, median_ms  # noqa: E402  (experiments/ is on sys.path as a script)
from specbench import provenance  # noqa: E402
from specbench.drafters.ngram import ngram_propose_batch  # noqa: E402
from specbench.kernels import attention, chain, gemv, ngram, tree  # noqa: E402
from specbench.tree import compile_tree  # noqa: E402

GRID_B = (1, 8, 48, 256)
GRID_K = (1, 4, 8)
GRID_V = (49152, 128256, 151936)
GRID_T = (1024, 4096)
# attention (Llama-3.1-8B's heads): batch x positions x cached context
ATTENTION = dict(heads=32, kv_heads=8, head_dim=128)
GRID_ATTENTION = [(B, q, S) for S in (512, 4096) for B in (1, 8, 48) for q in (1, 9)]
# (q, BLOCK_M) over S in (512, 4096) at B = 1, each with 4 and 8 warps; BLOCK_M None: the heuristic's
GRID_ATTENTION_TILES = [(1, None), (9, None), (9, 64), (9, 32), (9, 16)]
# attention_tune: the least blocks a split takes and the partials the merge folds a step, at the
# batches where the prefix splits (at 48 it does not)
GRID_ATTENTION_TUNE = [(B, q, S) for S in (512, 4096) for B in (1, 8) for q in (1, 9)]
GOAL = dict(B=256, k=8, V=128256)
# norm: rows past the rows kernel's 16-row tile, the 8B shape's width; 65 norms a forward
GRID_NORM = [(M, 4096) for M in (17, 33, 64)]
NORM_COUNT = 65
SGLANG_TREE = [-1, 0, 0, 0, 0, 1, 5, 6, 7]  # topk 4, depth 5, 8 draft tokens + the root
FLUSH_BYTES = 512 * 2**20


def timer(device, reps: int):
    """ms per call: CUDA events around each call after an L2 flush, median of reps; on the CPU
    (--tiny) engine_bench's perf_counter clock."""
    if device.type != "cuda":
        return lambda fn: median_ms(fn, device, n=1, repeats=reps, warmup=1)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)

    def measure(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    return measure


def graphed(fn, device):
    """fn captured in a CUDA graph (after one eager call) -> its replay; on the CPU fn itself."""
    if device.type != "cuda":
        return fn
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# --- chain ------------------------------------------------------------------------------------


def chain_inputs(B, k, V, device, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    p = torch.softmax(3 * torch.randn(B, k + 1, V, device=device, generator=g), -1)
    q = torch.softmax(3 * torch.randn(B, k, V, device=device, generator=g), -1)
    from_q = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, k)
    drafts = torch.where(torch.rand(B, k, device=device, generator=g) < 0.7, p[:, :k].argmax(-1), from_q)
    uniforms, noise = chain.draw_noise(B, k, V, g, device)
    return p, drafts, q, uniforms, noise


def chain_floor(rule, B, k, V, tokens, num, drafts) -> int:
    """Bytes by the module docstring's definition, for the outcome (tokens, num) computed."""
    outputs = B * (k + 2) * 8
    if rule == "greedy":
        return B * k * 8 + int((num + 1).sum()) * V * 4 + outputs
    at = num.clamp(max=k - 1)
    rows = torch.arange(B, device=num.device)
    refused = int(((num < k) & (drafts[rows, at] >= 0)).sum())
    per_request = k * 8 + k * 4 + k * 4 * (2 if rule == "standard" else 1) + 2 * V * 4
    return B * per_request + (refused * V * 4 if rule == "standard" else 0) + outputs


def bench_chain(rule, B, k, V, inputs, device, measure, launch=None) -> dict:
    p, drafts, q, uniforms, noise = inputs
    q = q if rule == "standard" else None
    args = (rule, p, drafts, q, uniforms, noise)
    out = chain.launch(*args, **(launch or {}))
    ref = chain.chain_torch(*args)
    kernel_ms = measure(lambda: chain.launch(*args, **(launch or {})))
    torch_ms = measure(lambda: chain.chain_torch(*args))
    return dict(kernel="chain", rule=rule, B=B, shape=f"k={k}", k=k, V=V, launch=launch or "default",
                equal=same(out, ref), mean_accepted=out[1].double().mean().item(), kernel_ms=kernel_ms,
                torch_ms=torch_ms, floor_bytes=chain_floor(rule, B, k, V, *out, drafts))


# --- tree -------------------------------------------------------------------------------------


def tree_inputs(B, V, device, seed=0):
    """The SGLang-shaped tree for every request; the root's children a draw of 4 distinct tokens
    from p at the root, each chain node the argmax of its parent's p with probability 0.7."""
    shape = compile_tree(torch.tensor(SGLANG_TREE))
    N = len(SGLANG_TREE)
    g = torch.Generator(device).manual_seed(seed)
    p = torch.softmax(3 * torch.randn(B, N, V, device=device, generator=g), -1)
    tokens = torch.zeros(B, N, dtype=torch.int64, device=device)
    tokens[:, 1:5] = torch.multinomial(p[:, 0], 4, generator=g)
    tokens[:, 1] = torch.where(torch.rand(B, device=device, generator=g) < 0.7, p[:, 0].argmax(-1), tokens[:, 1])
    for i in range(5, N):
        parent = int(shape.parents[i])
        drawn = torch.multinomial(p[:, parent], 1, generator=g).squeeze(-1)
        tokens[:, i] = torch.where(torch.rand(B, device=device, generator=g) < 0.7, p[:, parent].argmax(-1), drawn)
    links = [t.to(device).expand(B, N).contiguous() for t in (shape.next_token, shape.next_sibling)]
    D = int(shape.depth.max())
    uniforms, noise = tree.draw_noise(B, D, V, g, device)
    return p, tokens, *links, uniforms, noise


def tree_floor(rule, B, V, out) -> int:
    N, D = len(SGLANG_TREE), out.tokens.shape[1] - 1
    outputs = B * (2 * (D + 1) + 2) * 8
    if rule == "greedy":
        return B * 3 * N * 8 + int((out.num_accepted + 1).sum()) * V * 4 + outputs
    gathers = B * (4 + D) * 4  # p_n(c): at most the root's 4 children and one child per chain level
    return B * (3 * N * 8 + D * 4 + 2 * V * 4) + gathers + outputs


def bench_tree(rule, B, V, inputs, device, measure) -> dict:
    args = (rule, *inputs)
    out = tree.tree_triton(*args, max_children=4)
    ref = tree.tree_torch(*args, max_children=4)
    kernel_ms = measure(lambda: tree.tree_triton(*args, max_children=4))
    torch_ms = measure(lambda: tree.tree_torch(*args, max_children=4))
    fields = ("tokens", "path", "num_accepted", "tried")
    return dict(kernel="tree", rule=rule, B=B, shape=f"N={len(SGLANG_TREE)}", V=V,
                equal=same([getattr(out, f) for f in fields], [getattr(ref, f) for f in fields]),
                mean_accepted=out.num_accepted.double().mean().item(), kernel_ms=kernel_ms, torch_ms=torch_ms,
                floor_bytes=tree_floor(rule, B, V, out))


# --- n-gram -----------------------------------------------------------------------------------


def ngram_inputs(B, T, device, k=8, seed=0):
    """Random text over 32000 tokens; the last 6 tokens repeat an earlier stretch, so every
    request has a match of n >= 5 somewhere in its history."""
    g = torch.Generator(device).manual_seed(seed)
    tokens = torch.randint(0, 32000, (B, T), device=device, generator=g)
    start = torch.randint(0, T - 6 - k, (B,), device=device, generator=g)
    cols = start[:, None] + torch.arange(6, device=device)
    tokens[:, T - 6 :] = tokens.gather(1, cols)
    return tokens, torch.full((B,), T, dtype=torch.int64, device=device)


def bench_ngram(B, T, device, measure, k=8, min_n=2, max_n=5) -> dict:
    tokens, lengths = ngram_inputs(B, T, device, k)
    out = ngram.ngram_triton(tokens, lengths, min_n, max_n, k)
    ref = ngram_propose_batch(tokens, lengths, min_n, max_n, k)
    kernel_ms = measure(lambda: ngram.ngram_triton(tokens, lengths, min_n, max_n, k))
    torch_ms = measure(lambda: ngram_propose_batch(tokens, lengths, min_n, max_n, k))
    return dict(kernel="ngram", rule=f"n={min_n}..{max_n}", B=B, shape=f"T={T}", T=T, k=k, V=0,
                equal=same(out, ref), mean_drafted=out[1].double().mean().item(), kernel_ms=kernel_ms,
                torch_ms=torch_ms, floor_bytes=int(lengths.sum()) * 8 + B * 8 + B * (k + 1) * 8)


# --- decode attention (specbench.kernels.attention) ------------------------------------------


def attention_inputs(B, q, S, device, dtype, seed=0):
    """One layer at Llama-3.1-8B's heads: qkv [B, q, 48 x 128], RoPE tables, a cache of S + q + 1
    slots holding S random entries per row, chain ancestors."""
    H, Hkv, hd = ATTENTION.values()
    g = torch.Generator(device).manual_seed(seed)
    qkv = torch.randn(B, q, (H + 2 * Hkv) * hd, device=device, generator=g).to(dtype)
    angles = torch.rand(B, q, 1, hd, device=device, generator=g) * 6.28
    cache = torch.randn(2, B, Hkv, S + q + 1, hd, device=device, generator=g).to(dtype)
    lengths = torch.full((B,), S, dtype=torch.int64, device=device)
    ancestors = torch.ones(q, q, dtype=torch.bool, device=device).tril().expand(B, q, q)
    return qkv, angles.cos().to(dtype), angles.sin().to(dtype), cache[0], cache[1], lengths, ancestors


def bench_attention(B, q, S, device, measure, launch=None) -> dict:
    """decode() against reference() (the engine's torch path: RoPE, index_put, two matmuls and
    an fp32 softmax), each inside a CUDA graph on the GPU as the engine runs them. The floor:
    the cache prefix read once (K and V), q new entries written, qkv read and o written.
    launch: decode()'s overrides of its launch heuristic (attention_tune), or None."""
    H, Hkv, hd = ATTENTION.values()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    qkv, cos, sin, k, v, lengths, ancestors = attention_inputs(B, q, S, device, dtype)
    mask = attention.mask(lengths, ancestors, k.shape[2], H // Hkv)
    args = (qkv, cos, sin, k, v, lengths, ancestors, H, Hkv)
    ref = attention.reference(*args, mask=mask)
    launch = launch or {}
    out = attention.decode(*args, **launch)
    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())

    kernel_ms = measure(graphed(lambda: attention.decode(*args, **launch), device))
    torch_ms = measure(graphed(lambda: attention.reference(*args, mask=mask), device))
    size = qkv.element_size()
    floor = (2 * B * Hkv * S * hd + 2 * B * Hkv * q * hd + qkv.numel() + B * q * H * hd) * size
    return dict(kernel="attention", rule="decode", B=B, shape=f"q={q},S={S}", q=q, S=S, V=0, equal=err < 2e-2,
                max_rel_err=err, kernel_ms=kernel_ms, torch_ms=torch_ms, floor_bytes=floor,
                launch=" ".join(f"{key}={value}" for key, value in launch.items()))


# --- the norm of wide rows (specbench.kernels.gemv.norm_rows) -----------------------------------


def bench_norm(M, K, device, measure, count=NORM_COUNT) -> dict:
    """`count` norms of x [M, K] (the 8B shape's forward: two a layer and the last) in one CUDA
    graph on the GPU, gemv.norm_rows (one launch each) against gemv.rms_norm (torch's 8); their
    outputs compared to 1e-2 of the largest (equal) and bit for bit (same_fraction). The floor:
    x read and y written, gamma read, count times."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(M, K, generator=g, device=device).to(dtype)
    gamma = (1 + 0.1 * torch.randn(K, generator=g, device=device)).to(dtype)
    got, ref = gemv.norm_rows(x, gamma, 1e-5), gemv.rms_norm(x, gamma, 1e-5)
    same = float((got == ref).float().mean())
    err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())

    def norms(norm):
        def run():
            for _ in range(count):
                norm(x, gamma, 1e-5)
        return run

    kernel_ms = measure(graphed(norms(gemv.norm_rows), device))
    torch_ms = measure(graphed(norms(gemv.rms_norm), device))
    floor = count * (2 * M * K + K) * x.element_size()
    return dict(kernel="norm", rule="rms_norm", B=M, shape=f"M={M},K={K},x{count}", q=M, S=0, V=0,
                equal=err < 1e-2, max_rel_err=err, same_fraction=same, kernel_ms=kernel_ms, torch_ms=torch_ms,
                floor_bytes=floor)


# --- the run ----------------------------------------------------------------------------------


def attempt(results: dict, out: Path, fn) -> None:
    """One measurement, with its bandwidth and speedup; a failure is recorded, and everything so
    far is written at once."""
    t = time.perf_counter()
    try:
        row = fn()
        row["gbps"] = row["floor_bytes"] / (row["kernel_ms"] / 1e3) / 1e9
        row["of_copy"] = row["gbps"] * 1e9 / results["copy_bandwidth"]
        row["speedup"] = row["torch_ms"] / row["kernel_ms"]
    except Exception as e:  # one failed shape must not lose the others
        traceback.print_exc()
        row = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    results["rows"].append(row)
    print(f"[{time.perf_counter() - t:6.1f} s] {row}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_bench.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--kernels", default="chain,tree,ngram,tune")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per measurement (median)")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    parts = set(args.kernels.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = None
    results = dict(device=provenance.device_name(device), torch=torch.__version__, triton=triton_version,
                   git_sha=provenance.git_sha(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   interpreted=chain.INTERPRETED, l2_flush_bytes=FLUSH_BYTES if device.type == "cuda" else 0,
                   copy_bandwidth=copy_bandwidth(device, 0.01 if args.tiny else 4.0), rows=[])
    print(f"copy bandwidth {results['copy_bandwidth'] / 1e12:.3f} TB/s", flush=True)
    measure = timer(device, 2 if args.tiny else args.reps)
    Bs, ks, Vs = ((2,), (2,), (96,)) if args.tiny else (GRID_B, GRID_K, GRID_V)

    if "chain" in parts:
        for V in Vs:
            for k in ks:
                for B in Bs:
                    inputs = chain_inputs(B, k, V, device)
                    for rule in ("standard", "greedy") if args.tiny else ("standard", "onehot", "greedy"):
                        attempt(results, args.out, lambda: bench_chain(rule, B, k, V, inputs, device, measure))
                    del inputs
    if "tree" in parts:
        for V in Vs:
            for B in Bs:
                inputs = tree_inputs(B, V, device)
                for rule in ("target_only", "greedy"):
                    attempt(results, args.out, lambda: bench_tree(rule, B, V, inputs, device, measure))
                del inputs
    if "ngram" in parts:
        for T in ((32,) if args.tiny else GRID_T):
            for B in Bs:
                attempt(results, args.out, lambda: bench_ngram(B, T, device, measure, k=4 if args.tiny else 8))
    if "attention" in parts:
        for B, q, S in [(2, 3, 40)] if args.tiny else GRID_ATTENTION:
            attempt(results, args.out, lambda: bench_attention(B, q, S, device, measure))
    if "attention_tune" in parts:
        for B, q, S in [(2, 1, 40)] if args.tiny else GRID_ATTENTION_TUNE:
            block_m = attention.launch_shape(B, q, S, ATTENTION["kv_heads"], 4, 128, 132)[1]
            for min_blocks in (1, 2) if args.tiny else (1, 2, 4, 8):
                for unroll in sorted({1, attention.merge_unroll(block_m), 2}):
                    launch = dict(min_blocks=min_blocks, unroll=unroll)
                    attempt(results, args.out, lambda: bench_attention(B, q, S, device, measure, launch))
    if "attention_tiles" in parts:
        for S in (40,) if args.tiny else (512, 4096):
            for q, block_m in GRID_ATTENTION_TILES:
                for num_warps in (4, 8):
                    launch = dict(num_warps=num_warps, **({"block_m": block_m} if block_m else {}))
                    attempt(results, args.out, lambda: bench_attention(1, q, S, device, measure, launch))
    if "norm" in parts:
        for M, K in [(17, 576)] if args.tiny else GRID_NORM:
            attempt(results, args.out, lambda: bench_norm(M, K, device, measure, 3 if args.tiny else NORM_COUNT))
    if "tune" in parts and not args.tiny:
        inputs = chain_inputs(GOAL["B"], GOAL["k"], GOAL["V"], device)
        for block_v in (1024, 2048, 4096):
            for num_warps in (4, 8):
                for splits in (1, 2, 4):
                    launch = dict(block_v=block_v, num_warps=num_warps, splits=splits)
                    attempt(results, args.out, lambda: bench_chain("standard", *GOAL.values(), inputs, device, measure, launch))
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(f"\n{r['device']}  torch {r['torch']}  triton {r['triton']}  {r['date']}  sha {r['git_sha']}")
    flushed = "; L2 flushed before every call" if r["l2_flush_bytes"] else ""
    print(f"copy bandwidth {r['copy_bandwidth'] / 1e12:.2f} TB/s (read + write){flushed}")
    print(f"{'kernel':7s} {'rule':12s} {'B':>4s} {'shape':>7s} {'V':>7s} {'kernel us':>10s} {'torch us':>10s}"
          f" {'speedup':>8s} {'GB/s':>7s} {'of copy':>8s} {'equal':>6s}  launch")
    for row in r["rows"]:
        if "error" in row:
            print(f"   {row}")
            continue
        print(f"{row['kernel']:7s} {row['rule']:12s} {row['B']:4d} {row['shape']:>7s} {row['V']:7d}"
              f" {1e3 * row['kernel_ms']:10.1f} {1e3 * row['torch_ms']:10.1f} {row['speedup']:8.1f} {row['gbps']:7.0f}"
              f" {row['of_copy']:8.2f} {str(row['equal']):>6s}  {row.get('launch', '')}")
    goal = [row for row in r["rows"] if row.get("kernel") == "chain" and row.get("rule") == "standard"
            and all(row.get(key) == value for key, value in GOAL.items()) and "error" not in row]
    for row in goal:
        print(f"goal B=256 k=8 V=128256 standard, launch {row['launch']}: {row['of_copy']:.2f} of copy bandwidth (>= 0.70),"
              f" {row['speedup']:.1f} x torch (>= 5)")


if __name__ == "__main__":
    sys.exit(main())
