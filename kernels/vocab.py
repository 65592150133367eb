"""What the verification kernels share: Gumbel-max over a vocabulary row, in tiles.

Letters: B requests, V vocabulary, S programs that split one row's vocabulary.

Sampling from supplied noise. A draw from r / sum(r) (r >= 0, unnormalised) is the first
argmax_v r(v) * w(v) with w(v) = 1 / E(v), E i.i.d. Exp(1): r(v) / E(v) is an exponential race
that v wins with probability r(v) / sum r (the Gumbel-max trick in exponentiated form:
log r + G with G = -log E standard Gumbel). vLLM samples the same way (argmax p / Exp(1)). The
kernels and their torch references both form r * w with one correctly rounded fp32 multiply and
take the first index of the maximum, so on identical inputs they pick identical tokens. (The ratio
tests take logs: compiled Triton's logf flushes subnormal inputs to zero, torch's does not, so the
two could part on a probability below 1.2e-38; nowhere else.)

Packed keys. A score s >= 0 and its column v are packed into one int64,
(bits(s) << 32) + (2^31 - 1 - v); for non-negative floats the bit pattern orders like the value,
so the largest key is the largest score and, among equal scores, the smallest column: torch's
argmax. One max over keys then serves a tile, a row, and the S programs that split a row.

The interpreter. `triton.jit` reads TRITON_INTERPRET when a function is defined, and triton's own
tl.* helpers are jit functions defined when triton is imported: with it set before triton's first
import, every kernel here runs on CPU tensors in Triton's numpy interpreter (slow: tests use tiny
V); without it, they compile for CUDA. Loop bounds over the vocabulary are compile-time constants
(V, TILES): faster compiled code, and triton 3.6's interpreter cannot take a tensor bound under
numpy >= 2.4 (triton-lang/triton#9171). One compile per vocabulary and split count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def interpreted(kernel) -> bool:
    """Whether a kernel runs in Triton's interpreter (decided when its module was imported)."""
    return not isinstance(kernel, triton.runtime.JITFunction)


def check_device(kernel, tensor: torch.Tensor) -> None:
    """A compiled kernel needs CUDA tensors; the interpreter takes any."""
    if tensor.device.type != "cuda" and not interpreted(kernel):
        raise ValueError(
            f"Triton kernel on {tensor.device.type} tensors: run on CUDA, or set TRITON_INTERPRET=1 "
            "before triton is first imported (Triton's CPU interpreter)"
        )


def inverse_exponential(shape, generator, device) -> torch.Tensor:
    """w = 1 / E, E ~ Exp(1) i.i.d.: the noise for one Gumbel-max draw per row. -> fp32 [shape]."""
    e = torch.empty(shape, device=device, dtype=torch.float32).exponential_(generator=generator)
    return e.clamp_(min=torch.finfo(torch.float32).tiny).reciprocal_()  # finite even for E = 0


def launch_shape(B: int, V: int, device: torch.device, block_v: int | None, splits: int | None) -> tuple[int, int, int]:
    """(block_v, splits, tiles): each request's row is split over `splits` programs of `tiles`
    tiles of block_v columns. Enough programs to fill the GPU (4 per SM), at most one per tile.
    The asked-for splits is rounded to a power of two, so a vocabulary compiles a handful of
    variants, not one per B."""
    if block_v is None:
        block_v = 2048 if device.type == "cuda" else min(256, triton.next_power_of_2(V))
    n_tiles = triton.cdiv(V, block_v)
    if splits is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        splits = triton.next_power_of_2(max(1, triton.cdiv(4 * sms, B)))
    tiles = triton.cdiv(n_tiles, min(splits, n_tiles))
    return block_v, triton.cdiv(n_tiles, tiles), tiles


@triton.jit
def pack(score, index):
    """score >= 0 (fp32), index (int) -> int64 key: max key = max score, then smallest index."""
    bits = score.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # -0.0 packs as 0.0
    return (bits.to(tl.int64) << 32) + (2147483647 - index).to(tl.int64)


@triton.jit
def unpack(key):
    """int64 key -> its index (int64)."""
    return 2147483647 - (key - ((key >> 32) << 32))


@triton.jit
def _keep_first_max(best, best_col, score, cols):
    """Per-lane running maximum: a lane sees its columns in increasing order, so a strict > keeps
    the first column of a tie. Masked columns score 0 past V and never beat a real column."""
    better = score > best
    return tl.where(better, score, best), tl.where(better, cols, best_col)


@triton.jit
def row_key(row, V: tl.constexpr, BLOCK: tl.constexpr):
    """argmax of one row of V probabilities (first index), as a packed key."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_col = lanes
    for start in range(0, V, BLOCK):
        cols = start + lanes
        p = tl.load(row + cols, mask=cols < V, other=0.0)
        best, best_col = _keep_first_max(best, best_col, p, cols)
    return tl.max(pack(best, best_col), axis=0)


@triton.jit
def residual_keys(p_row, q_row, w_row, v_lo, q_cols, zero, V: tl.constexpr, TILES: tl.constexpr, BLOCK: tl.constexpr):
    """TILES tiles of BLOCK columns from v_lo, of one position: r = max(0, p - q) (q read only
    in columns below q_cols: V or 0), with the tokens in `zero` ([Z] int64, -1 pads) set to 0. One read of p, q, w.

    -> (max r, key of the best r * w, key of the best p * w): the caller draws from r, or from p
    when r has no mass (max r <= 0), without a second pass."""
    lanes = tl.arange(0, BLOCK)
    zero = zero.to(tl.int32)
    best_r = tl.full([BLOCK], -1.0, tl.float32)
    best_p = tl.full([BLOCK], -1.0, tl.float32)
    col_r = lanes
    col_p = lanes
    r_max = tl.zeros([BLOCK], tl.float32)
    for t in range(TILES):
        cols = v_lo + t * BLOCK + lanes
        m = cols < V
        p = tl.load(p_row + cols, mask=m, other=0.0)
        w = tl.load(w_row + cols, mask=m, other=0.0)
        q = tl.load(q_row + cols, mask=cols < q_cols, other=0.0)
        hit = cols < 0  # [BLOCK] a column of `zero`
        for z in tl.static_range(zero.shape[0]):  # Z scalar compares (the [Z] lookups are hoisted)
            hit = hit | (cols == tl.max(tl.where(tl.arange(0, zero.shape[0]) == z, zero, -1), axis=0))
        r = tl.where(hit, 0.0, tl.maximum(p - q, 0.0))
        r_max = tl.maximum(r_max, r)
        best_r, col_r = _keep_first_max(best_r, col_r, r * w, cols)
        best_p, col_p = _keep_first_max(best_p, col_p, p * w, cols)
    return tl.max(r_max, axis=0), tl.max(pack(best_r, col_r), axis=0), tl.max(pack(best_p, col_p), axis=0)


@triton.jit
def choose(r_max, key_r, key_p):
    """The drawn token: from the residual when it has mass, else from p."""
    return unpack(tl.where(r_max > 0, key_r, key_p))


@triton.jit
def merge_splits(part_m, part_r, part_p, counts, b, s, r_max, key_r, key_p, out, SPLITS: tl.constexpr):
    """The S = SPLITS programs of request b merge their keys inside the kernel: each stores its
    (max r, key of r, key of p) in slot (b, s) and counts itself done on counts[b]; the last to
    count, whichever it is, reduces the S slots, writes the drawn token at `out` and sets the
    count back to zero for the next launch. (A second kernel did the merge before, and a
    sampled round's rule is host-bound: the chain kernel's launch took 0.12 to 0.15 ms against
    0.15 to 0.17 with the second launch, on one H100 host, results/2026-12-07-h100-merged-split.)
    As the attention kernel's merge: the barrier puts every thread's stores before the count's
    release; the last program's loads bypass L1 (other programs wrote them)."""
    tl.store(part_m + b * SPLITS + s, r_max)
    tl.store(part_r + b * SPLITS + s, key_r)
    tl.store(part_p + b * SPLITS + s, key_p)
    tl.debug_barrier()
    if tl.atomic_add(counts + b, 1, sem="acq_rel") == SPLITS - 1:
        tl.atomic_xchg(counts + b, 0)
        m = tl.zeros([], tl.float32)  # r >= 0
        kr = tl.full([], -1, tl.int64)
        kp = tl.full([], -1, tl.int64)
        for i in tl.static_range(SPLITS):
            m = tl.maximum(m, tl.load(part_m + b * SPLITS + i, cache_modifier=".cg"))
            kr = tl.maximum(kr, tl.load(part_r + b * SPLITS + i, cache_modifier=".cg"))
            kp = tl.maximum(kp, tl.load(part_p + b * SPLITS + i, cache_modifier=".cg"))
        tl.store(out, choose(m, kr, kp))


_PARTIALS: dict = {}  # (B, S, device) -> the split programs' keys and counts, reused launch after launch


def partials(B: int, S: int, device) -> tuple:
    """([B, S] fp32 max r, [B, S] int64 keys of r, of p, [B] int32 counts, zero) for a launch
    split S ways (`merge_splits`): the same four buffers for every launch of that shape (no
    allocation a sampled round). Launches on one stream never overlap, and each leaves the
    counts zero."""
    key = (B, S, torch.device(device))
    if key not in _PARTIALS:
        _PARTIALS[key] = (torch.empty((B, S), dtype=torch.float32, device=device),
                          torch.empty((B, S), dtype=torch.int64, device=device),
                          torch.empty((B, S), dtype=torch.int64, device=device),
                          torch.zeros(B, dtype=torch.int32, device=device))
    return _PARTIALS[key]
