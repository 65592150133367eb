"""Skinny projections for decode: y = x W^T with few rows in x, read at the bandwidth floor.

At batch 1 a decode step is a chain of matrix-vector products over the weights, so a step
costs what streaming the weights once costs, plus every kernel launch between them. `project`
computes a decoder layer's projections with what surrounds them folded in, one kernel each:

    norm       y = rms_norm(x, gamma) W^T     the RMSNorm as a prologue (x is tiny, re-read)
    glu        y = silu(x W_gate^T) * (x W_up^T) for W = [W_gate; W_up], the MLP's activation
    residual   y = r + x W^T                  the residual add as an epilogue

and falls back to the same composition in torch wherever the kernels do not apply (CPU, a
bias, more than MAX_ROWS rows, mixed dtypes): one function is both the kernels' entry and their
reference. Both kernels take every fold, so a speculative verify forward (2 to 16 positions, or
a few rows) runs each projection in one kernel as a decode step does. The kernels round to the
input dtype wherever the torch composition does, so the two agree to the last bit but for the
order of the fp32 sums (fp32 inputs multiply in full precision: tl.dot without TF32).

One program owns BLOCK_N output columns (rows of W; with glu the matching rows of both
halves) and walks K in BLOCK_K tiles, the last one masked where BLOCK_K does not divide K
(SmolLM2-135M's 576; the 8B shape's widths compile as without the mask). One input row keeps
a [BLOCK_N, BLOCK_K] fp32 partial sum reduced once at the end; 2 to 16 rows are padded to 16
for a tensor-core product into a [16, BLOCK_N] fp32 sum (with glu a second one for the up
half), with the norm's per-row rstd from a first pass over x.

Split K (rows kernel, SPLIT_K > 1 in its tile configurations). Every program re-reads its
slice of x, so a program's bytes are BLOCK_N weight rows plus M rows of x: with 9 rows and
BLOCK_N 16 that is 1.56 times the weights through the SM. Wide tiles cut that, but leave
the small projections with too few programs (the 8B shape's wqkv at BLOCK_N 64: 96 programs
for 132 SMs). So the rows kernel may split K into SPLIT_K slices, each program one slice of
a column tile: it stores its fp32 [M, BLOCK_N] partial sums, counts itself done on an int32
per column tile, and the last of the tile's SPLIT_K programs to count adds the partials in
slice order (the same sum whichever program is last), applies the folds and resets the
count to zero. The counts are one buffer per device, kept (zero between launches), so that
a launch allocates no zeroed memory: a memset would be a launch of its own.

Norms from squares (rows kernel). The norm's rstd needs the whole of each row of x, so every
program of the rows kernel reads all M rows of x for it, each split-K slice too: at 9 rows
the 8B shape's wqkv in 64-wide tiles and 4 slices makes 384 programs read 72 KB each, 28 MB
through the SMs beside the weights' 50 MB. The residual projections write what the next norm
reads (the residual stream), so their epilogue also sums the squares of its rounded outputs by
GROUP = 16 columns into fp32 [M, N / 16] (`project`'s squares=True), and the next norm takes
its rstd from those (norm_squares: 1 KB a row at K = 4096) instead of a pass. The rstd then
differs from the pass's in the order of its fp32 sum only. The one-row kernel keeps its pass
(one row: 8 KB).

Wide rows. 17 to 64 rows (a tree verify's nodes, a batch's chains) run the rows kernel in
32- or 64-row tiles, the norm applied once beforehand (`norm_rows`, one launch), not folded.
Folded, every program re-normalised all of x, whose arithmetic grows with the rows: on an H200
(results/2026-12-07-h200-rows-ab) at 33 rows wqkv took 43.2 us against torch's 40.6, w13 158
against 92, and the 33-position forward 8.57 ms against 6.66. With the norm applied beforehand
in torch, on an H100 (results/2026-12-07-h100-wide), forwards of 17 to 33 positions took 0.30 to
0.44 ms less than with torch's projections (at 33: 7.57 against 8.01 ms, context 512). So the
kernels take up to MAX_ROWS = 33 rows by default (the positions goal b measures; 34 to 64 only
inside `max_rows(64)`, not yet timed), and `max_rows(16)` gives back torch's projections past
16 rows for a side-by-side run. The one-launch norm replaced torch's rms_norm (8 launches) after
that run; it has not been timed on a GPU.

Tried and dropped there too: gamma loaded a step ahead in the rows kernel (its [1, BLOCK_K]
tile is too narrow for cp.async, so each step waits for it): no gain, the 9-position forward
1.01x slower with the autotuner's new picks.

Letters: M input rows, K input width, N output width (H per half with glu).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    from .pdl import launch_options, wait_and_release
except ImportError:  # CPU installs without triton: project() runs the torch composition
    triton = None


# A residual projection may also return its output's squares summed by this many columns
# (`project`'s squares), for the next projection's norm (norm_squares).
SQUARES_GROUP = 16
# The most rows the kernels take (B q): MAX_ROWS, 33 by default (module docstring: wide rows),
# TILE_ROWS to WIDE_ROWS inside `max_rows`. TILE_ROWS: the rows kernel's least tile (tl.dot's
# 16), and the most it takes with the folded norm, squares and under torch.compile.
TILE_ROWS = 16
WIDE_ROWS = 64
MAX_ROWS = 33


def squares(y: torch.Tensor) -> torch.Tensor:
    """In torch, what the rows kernel's epilogue sums with squares=True: y [M, N] -> [M,
    cdiv(N, SQUARES_GROUP)] fp32, the squares of y's entries summed by SQUARES_GROUP columns."""
    pad = -y.shape[-1] % SQUARES_GROUP
    return F.pad(y.float() ** 2, (0, pad)).view(y.shape[0], -1, SQUARES_GROUP).sum(-1)


def squares_width(K: int) -> int:
    """The rows kernel's NORM_SQUARES for x of width K: cdiv(K, SQUARES_GROUP) groups a row, read
    in a tile of the next power of two."""
    return 1 << (-(-K // SQUARES_GROUP) - 1).bit_length()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalised in fp32, scaled in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def reference(x, w, b=None, *, norm=None, eps=1e-6, glu=False, residual=None):
    """project() in torch: x [..., K], w [N, K] (glu: [2H, K]) -> [..., N] (glu: [..., H])."""
    if norm is not None:
        x = rms_norm(x, norm, eps)
    y = F.linear(x, w, b)
    if glu:
        gate, up = y.chunk(2, -1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


if triton is not None:
    GROUP = tl.constexpr(SQUARES_GROUP)
    _CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "LOOP_STAGES": 0}, num_warps=w, num_stages=3)
                for bn in (4, 8, 16) for bk in (256, 512) for w in (4, 8)]
    # Twice the bytes a program has in flight at a step, for K a multiple of 1024 (`tuner`): the
    # one-row kernel's loop is a load and its products a step (but in _PIPELINED_CONFIGS), so a
    # program waits out one memory latency per tile. On an H200 (results/2026-12-04-h200) the
    # small projections streamed at 0.72 (wo) and 0.82 (wqkv) of the copy bandwidth.
    _WIDE_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": 1024, "LOOP_STAGES": 0}, num_warps=w, num_stages=3)
                     for bn in (4, 8) for w in (4, 8)]

    @triton.jit
    def _in_k(ok, cols, K: tl.constexpr, BLOCK_K: tl.constexpr):
        # A tile's mask: ok (its rows, [R, 1]) where BLOCK_K divides K, so that those kernels
        # compile as without this; else ok & cols < K, cols [1, BLOCK_K] the tile's columns of K
        # (the last tile overhangs K: SmolLM2-135M's 576 in 256-wide tiles).
        if K % BLOCK_K != 0:
            ok = ok & (cols < K)
        return ok

    @triton.jit
    def _rstd(x_ptr, x_off, x_ok, cols, K: tl.constexpr, eps, BLOCK_K: tl.constexpr):
        # x_off: the offsets of an [R, BLOCK_K] tile of x at k = 0, x_ok: its row mask, cols: its
        # columns [1, BLOCK_K] -> rstd: [R] (1 / eps ** 0.5 on masked rows). Unrolled, so that
        # the loads from L2 may overlap: on the 8B shape's wqkv (H200, results/2026-12-03-h200-night)
        # the norm fold cost 2.4 us at one row and 5.1 us at 9 rows as a loop, 1.1 and 2.2 us
        # unrolled (single runs, about 1 us of noise).
        ss = tl.zeros(x_off.shape, dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            v = tl.load(x_ptr + k0 + x_off, mask=_in_k(x_ok, k0 + cols, K, BLOCK_K), other=0.0).to(tl.float32)
            ss += v * v
        return tl.rsqrt(tl.sum(ss, axis=1) / K + eps)

    @triton.jit
    def _rstd_from_squares(s_ptr, rm, m_ok, K: tl.constexpr, eps, WIDTH: tl.constexpr, BLOCK_M: tl.constexpr):
        # s: [M, cdiv(K, GROUP)] the squares of x's rows summed by GROUP columns (a projection's
        # SQUARES; WIDTH: a power of two at least that wide), rm: [BLOCK_M] rows (m_ok: real
        # ones) -> rstd: [BLOCK_M], as _rstd's from x itself. In [BLOCK_M, 64] loads, unrolled: one
        # [16, 256] fp32 tile (the 8B shape's) held 32 registers a thread beside the pipeline's.
        CHUNK: tl.constexpr = 64 if WIDTH > 64 else WIDTH
        n_groups: tl.constexpr = (K + GROUP - 1) // GROUP
        ss = tl.zeros((BLOCK_M, CHUNK), tl.float32)
        for c0 in tl.static_range(0, WIDTH, CHUNK):
            groups = c0 + tl.arange(0, CHUNK)  # [CHUNK], past cdiv(K, GROUP) masked
            ss += tl.load(s_ptr + rm[:, None] * n_groups + groups[None, :],
                          mask=m_ok[:, None] & (groups < n_groups)[None, :], other=0.0)
        return tl.rsqrt(tl.sum(ss, axis=1) / K + eps)

    @triton.jit
    def _x_tile(x_ptr, g_ptr, x_off, g_off, ok, cols, rstd, NORM: tl.constexpr, K: tl.constexpr,
                BLOCK_K: tl.constexpr, dtype: tl.constexpr):
        # A tile of x at offsets x_off (rows where ok; cols [1, BLOCK_K]: its columns of K, for
        # the last tile's mask), normalised with rstd where NORM (a scalar, or [rows, 1]) and
        # rounded as rms_norm rounds: h to the dtype, then times gamma [g_off] in the dtype.
        x = tl.load(x_ptr + x_off, mask=_in_k(ok, cols, K, BLOCK_K), other=0.0)
        if NORM:
            h = (x.to(tl.float32) * rstd).to(dtype).to(tl.float32)
            if K % BLOCK_K == 0:
                g = tl.load(g_ptr + g_off)
            else:
                g = tl.load(g_ptr + g_off, mask=cols < K, other=0.0)
            x = (h * g.to(tl.float32)).to(dtype)
        return x

    @triton.jit
    def _norm_kernel(x_ptr, g_ptr, y_ptr, K: tl.constexpr, eps, BLOCK_K: tl.constexpr):
        # Program m: row m of x [M, K] -> y [M, K], rms_norm(x, gamma)'s row rounded as rms_norm
        # rounds (_rstd's pass, then _x_tile's); gamma: [K]
        dtype = y_ptr.dtype.element_ty
        row = tl.program_id(0).to(tl.int64) * K
        cols = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
        ok = tl.full((1, 1), 1, tl.int1)
        rstd = _rstd(x_ptr + row, cols, ok, cols, K, eps, BLOCK_K)[:, None]  # [1, 1]
        for k0 in tl.static_range(0, K, BLOCK_K):
            h = _x_tile(x_ptr + row + k0, g_ptr + k0, cols, cols, ok, k0 + cols, rstd, True, K, BLOCK_K, dtype)
            tl.store(y_ptr + row + k0 + cols, h, mask=_in_k(ok, k0 + cols, K, BLOCK_K))

    @triton.jit
    def _vector_step(x_ptr, g_ptr, w_ptrs, k0, x_off, x_ok, n_ok, rstd, acc, acc_up, N, K: tl.constexpr,
                     NORM: tl.constexpr, GLU: tl.constexpr, BLOCK_K: tl.constexpr, dtype: tl.constexpr):
        # The one-row kernel's step at k0: the [BLOCK_N, BLOCK_K] products of its weight tile (and
        # the up half's, GLU) with x's tile, added to acc (acc_up) -> acc, acc_up
        x = _x_tile(x_ptr + k0, g_ptr + k0, x_off, x_off, x_ok, k0 + x_off, rstd, NORM, K, BLOCK_K,
                    dtype).to(tl.float32)
        w_ok = _in_k(n_ok[:, None], k0 + x_off, K, BLOCK_K)
        w = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x
        if GLU:
            up = tl.load(w_ptrs + N * K + k0, mask=w_ok, other=0.0, eviction_policy="evict_first")
            acc_up += up.to(tl.float32) * x
        return acc, acc_up

    @triton.jit
    def _vector_kernel_fn(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, N, K: tl.constexpr, eps,
                       NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, PDL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LOOP_STAGES: tl.constexpr):
        # x: [K], w: [N, K] (GLU: [2N, K]), y, r: [N], g: [K]. K is a compile-time constant: a
        # few widths per model, loops the compiler can unroll, and the last tile's mask (_in_k)
        # only where BLOCK_K does not divide K.
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
        n_ok = rn < N
        dtype = y_ptr.dtype.element_ty
        w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]  # [BLOCK_N, BLOCK_K]
        # The first weight tile depends on no earlier kernel: with PDL it streams in while the
        # previous kernel finishes. Then the first step, then the loop over the rest of K.
        x_off = rk[None, :]  # [1, BLOCK_K]: x as one row, as the rows kernel tiles it (and its columns)
        w_ok = _in_k(n_ok[:, None], x_off, K, BLOCK_K)
        w = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy="evict_first")
        if GLU:
            up = tl.load(w_ptrs + N * K, mask=w_ok, other=0.0, eviction_policy="evict_first")
        wait_and_release(PDL)  # x (and the residual) are the previous kernel's
        # the residual now, so that its latency is not the epilogue's (tiny: [BLOCK_N])
        r = tl.load(r_ptr + rn, mask=n_ok, other=0.0) if RESIDUAL else 0.0
        x_ok = x_off < K  # [1, BLOCK_K]: all true where BLOCK_K divides K
        rstd = _rstd(x_ptr, x_off, x_ok, x_off, K, eps, BLOCK_K)[:, None] if NORM else 1.0  # [1, 1]
        x = _x_tile(x_ptr, g_ptr, x_off, x_off, x_ok, x_off, rstd, NORM, K, BLOCK_K, dtype)  # [1, BLOCK_K]
        x = x.to(tl.float32)
        acc = w.to(tl.float32) * x  # [BLOCK_N, BLOCK_K]
        acc_up = up.to(tl.float32) * x if GLU else acc
        if LOOP_STAGES == 0:  # a load and its products a step: the loads wait out their latency
            for k0 in range(BLOCK_K, K, BLOCK_K):
                acc, acc_up = _vector_step(x_ptr, g_ptr, w_ptrs, k0, x_off, x_ok, n_ok, rstd, acc, acc_up, N, K,
                                           NORM, GLU, BLOCK_K, dtype)
        else:  # software-pipelined: the next LOOP_STAGES - 1 tiles stream into shared memory (cp.async)
            for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=LOOP_STAGES):
                acc, acc_up = _vector_step(x_ptr, g_ptr, w_ptrs, k0, x_off, x_ok, n_ok, rstd, acc, acc_up, N, K,
                                           NORM, GLU, BLOCK_K, dtype)
        y = tl.sum(acc, axis=1).to(dtype).to(tl.float32)  # [BLOCK_N], rounded like F.linear's output
        if GLU:
            up = tl.sum(acc_up, axis=1).to(dtype).to(tl.float32)
            y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up
        if RESIDUAL:
            y = y.to(dtype).to(tl.float32) + r.to(tl.float32)
        tl.store(y_ptr + rn, y.to(dtype), mask=n_ok)

    # Four with the loop software-pipelined (LOOP_STAGES 3: tl.range's cp.async into shared
    # memory), beside the unpipelined ones, for the autotuner to weigh; not timed yet. Offline
    # (sm_90, Triton 3.6, the 8B shape) each takes at most 2 registers more than the same tile
    # unpipelined, mostly fewer (wqkv 8 x 512, 4 warps: 64 against 80, an estimated 8 CTAs an SM
    # against 6), and 8 to 40 KB of shared memory (results/2026-12-05-cpu-one-row-pipelined).
    _PIPELINED_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "LOOP_STAGES": 3}, num_warps=w, num_stages=3)
                          for bn, bk, w in ((4, 512, 4), (8, 512, 4), (8, 256, 8))]
    _PIPELINED_WIDE_CONFIGS = [triton.Config({"BLOCK_N": 4, "BLOCK_K": 1024, "LOOP_STAGES": 3}, num_warps=8,
                                             num_stages=3)]

    _VECTOR_KEY = ["N", "K", "NORM", "GLU", "RESIDUAL"]
    _vector_kernel = triton.autotune(configs=_CONFIGS + _PIPELINED_CONFIGS, key=_VECTOR_KEY)(_vector_kernel_fn)
    _vector_wide_kernel = triton.autotune(configs=_CONFIGS + _PIPELINED_CONFIGS + _WIDE_CONFIGS + _PIPELINED_WIDE_CONFIGS,
                                          key=_VECTOR_KEY)(_vector_kernel_fn)

    # The last four: deeper tiles for the long rows of w2 (K = 14336 in the 8B shape), where the
    # rows kernel streamed at 0.72 of the copy bandwidth against the one-row kernel's 0.92; with
    # them 0.75 (results/2026-12-03-h200-night), within noise. The weight tile as tl.dot's left
    # operand ("swap AB", [BLOCK_N, BLOCK_K] x [BLOCK_K, 16], four more configurations) was never
    # the autotuner's pick at 9 rows on the 8B shape's projections (results/2026-12-04-h200), and
    # is gone again.
    _ROWS_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1}, num_warps=w, num_stages=s)
                     for bn, bk, w, s in [(bn, bk, w, 3) for bn in (16, 32, 64) for bk in (128, 256) for w in (4, 8)]
                     + [(16, 512, 4, 3), (16, 512, 8, 3), (16, 256, 4, 4), (32, 128, 4, 4)]]
    # Split K (module docstring): wide column tiles, K in 2 or 4 slices. Chosen where the
    # autotuner measures them faster; at 9 rows on the 8B shape's wqkv, wo and w2 the unsplit
    # kernel streamed at 0.58 to 0.75 of the copy bandwidth (results/2026-12-04-h200). On an
    # H200 (results/2026-12-04-h200-afternoon): wo + residual 12.9 us split (64 x 128, 4 slices)
    # against 15.0 unsplit; wqkv + norm even (each slice still makes the rstd's pass over x); a
    # 9-position verify forward 4.85 ms against 5.04.
    # Six tiles, not the 16 of BLOCK_N x BLOCK_K x SPLIT_K x stages: tuning each projection at
    # each bucket of rows took most of a 10-minute device call on a fresh machine with 16.
    SPLITS = (2, 4)
    _SPLIT_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=4, num_stages=3)
                      for bn in (32, 64) for bk, sk in ((128, 2), (128, 4), (256, 2))]

    # Tuned per power-of-two bucket of rows (ROWS: 2, 4, 8, 16, and 32, 64: wide rows;
    # BLOCK_M pads the first four to 16 anyway), not per row count: a sweep over q = 1 .. 16
    # then tunes 4 times a projection, not 15.
    _ROWS_KEY = ["ROWS", "N", "K", "NORM", "GLU", "RESIDUAL", "NORM_SQUARES", "SQUARES"]

    @triton.jit
    def _rows_epilogue(acc, acc_up, r, y_ptr, s_ptr, pid, rm, rn, m_ok, mn_ok, N, GLU: tl.constexpr,
                       RESIDUAL: tl.constexpr, SQUARES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
        # acc, acc_up: [BLOCK_M, BLOCK_N] fp32 sums of columns rn for rows rm, r: the residual tile
        # (RESIDUAL) -> y (the folds applied); SQUARES: y's squares summed by GROUP columns -> s
        dtype = y_ptr.dtype.element_ty
        y = acc.to(dtype).to(tl.float32)  # rounded like F.linear's output
        if GLU:
            up = acc_up.to(dtype).to(tl.float32)
            y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up
        if RESIDUAL:
            y = y.to(dtype).to(tl.float32) + r.to(tl.float32)
        y = y.to(dtype)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=mn_ok)
        if SQUARES:  # s: [M, cdiv(N, GROUP)] fp32, this tile's BLOCK_N / GROUP groups of each row
            v = tl.where(mn_ok, y.to(tl.float32), 0.0)
            sq = tl.sum(tl.reshape(v * v, (BLOCK_M, BLOCK_N // GROUP, GROUP)), axis=2)  # [BLOCK_M, BLOCK_N / GROUP]
            groups = pid * (BLOCK_N // GROUP) + tl.arange(0, BLOCK_N // GROUP)
            n_groups = (N + GROUP - 1) // GROUP
            tl.store(s_ptr + rm[:, None] * n_groups + groups[None, :], sq,
                     mask=m_ok[:, None] & (groups < n_groups)[None, :])

    @triton.jit
    def _rows_kernel_fn(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, p_ptr, c_ptr, xs_ptr, s_ptr, M, ROWS, N,
                        K: tl.constexpr, eps, PRECISION: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr,
                        RESIDUAL: tl.constexpr, NORM_SQUARES: tl.constexpr, SQUARES: tl.constexpr, PDL: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                        BLOCK_M: tl.constexpr):
        # x: [M <= BLOCK_M, K], w: [N, K] (GLU: [2N, K]), y, r: [M, N], g: [K]; K % (SPLIT_K BLOCK_K)
        # == 0 with SPLIT_K > 1 (_k_fits), else any K (_in_k); ROWS: the autotuner's key only.
        # NORM_SQUARES > 0: the norm's rstd from xs [M, cdiv(K, GROUP)], x's squares summed by
        # GROUP columns (a power of two >= cdiv(K, GROUP), their tile's width), not from a pass
        # over x; SQUARES: y's -> s [M, cdiv(N, GROUP)], for the next projection's norm.
        # Grid (column tiles, SPLIT_K). With SPLIT_K > 1, p: [SPLIT_K, M, N] fp32 partials (GLU:
        # [SPLIT_K, 2, M, N]) and c: [column tiles] int32, zero. The rows padded to BLOCK_M for one
        # tensor-core product a tile.
        # Nothing is peeled off the loop (unlike _vector_kernel, whose early first tile is for
        # PDL): the software pipeline's first copies are the first loads a program issues, and the
        # norm's pass over x runs inside the first step while they stream in. With a peeled first
        # step the pipeline began only after that step's loads and the pass: in the sm_90 PTX
        # (Triton 3.9, offline) 35 to 89 global loads came before its first copy for wqkv and w13,
        # 2 to 20 for wo and w2 (results/2026-12-05-cpu-gemv-pipeline; test_gemv checks it).
        pid = tl.program_id(0)
        ks = tl.program_id(1)
        KC: tl.constexpr = K // SPLIT_K  # this program's slice of K: [ks KC, (ks + 1) KC)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        rk = ks * KC + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        rm = tl.arange(0, BLOCK_M)  # [BLOCK_M]
        n_ok, m_ok = rn < N, rm < M
        mn_ok = m_ok[:, None] & n_ok[None, :]
        dtype = y_ptr.dtype.element_ty
        w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]  # [BLOCK_N, BLOCK_K]
        x_off = rm[:, None] * K + rk[None, :]  # [BLOCK_M, BLOCK_K]
        x_ok = m_ok[:, None]
        wait_and_release(PDL)  # x and the residual are the previous kernels' (PDL: kernels/pdl.py's MAX_ROWS)
        # the residual tile now, so that its latency is not the epilogue's (tiny: [BLOCK_M, BLOCK_N])
        r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mn_ok, other=0.0) if RESIDUAL else 0.0
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        rstd = tl.full((BLOCK_M, 1), 1.0, tl.float32)
        for k0 in range(0, KC, BLOCK_K):
            if NORM:
                if k0 == 0:
                    if NORM_SQUARES > 0:  # from the squares the projection before summed
                        rstd = _rstd_from_squares(xs_ptr, rm, m_ok, K, eps, NORM_SQUARES, BLOCK_M)[:, None]
                    else:
                        # a pass over the whole of each row of x for its rstd (x is tiny: re-read
                        # from cache), every slice included: the norm rounds h = x rstd before the
                        # product. In tiles at least 256 wide where 256 divides K: beside the
                        # pipeline's state, the 8B shape's 32 unrolled 128-wide loads cost BLOCK_K
                        # 128 tiles registers (sm_90, Triton 3.6, offline: w13 32 x 128, 4 warps,
                        # 181 registers against 128 with 256-wide loads, an estimated 2 CTAs an SM
                        # against 4; no configuration lost one; results/2026-12-05-cpu-pass-width).
                        # SmolLM2's 576 keeps BLOCK_K: 5 loads, and 256 would mask a third of the last.
                        PASS_K: tl.constexpr = 256 if BLOCK_K < 256 and K % 256 == 0 else BLOCK_K
                        cols = tl.arange(0, PASS_K)[None, :]
                        rstd = _rstd(x_ptr, rm[:, None] * K + cols, x_ok, cols, K, eps, PASS_K)[:, None]
            x = _x_tile(x_ptr + k0, g_ptr + k0, x_off, rk[None, :], x_ok, k0 + rk[None, :], rstd, NORM, K, BLOCK_K,
                        dtype)  # [BLOCK_M, BLOCK_K]
            w_ok = _in_k(n_ok[:, None], k0 + rk[None, :], K, BLOCK_K)
            w = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy="evict_first")
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
            if GLU:
                up = tl.load(w_ptrs + N * K + k0, mask=w_ok, other=0.0, eviction_policy="evict_first")
                acc_up += tl.dot(x, tl.trans(up), input_precision=PRECISION)
        if SPLIT_K == 1:
            _rows_epilogue(acc, acc_up, r, y_ptr, s_ptr, pid, rm, rn, m_ok, mn_ok, N, GLU, RESIDUAL, SQUARES, BLOCK_N,
                           BLOCK_M)
        else:
            part = p_ptr + rm[:, None] * N + rn[None, :]  # [BLOCK_M, BLOCK_N] in slice 0, gate half
            slice_size = M * N
            if GLU:
                slice_size = 2 * M * N
            tl.store(part + ks * slice_size, acc, mask=mn_ok)
            if GLU:
                tl.store(part + ks * slice_size + M * N, acc_up, mask=mn_ok)
            # As the attention kernel's merge: the barrier puts every thread's stores before the
            # count's release; the last program's loads bypass L1 (other programs wrote them).
            tl.debug_barrier()
            if tl.atomic_add(c_ptr + pid, 1, sem="acq_rel") == SPLIT_K - 1:
                tl.atomic_xchg(c_ptr + pid, 0)
                acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                acc_up = acc
                for s in tl.static_range(SPLIT_K):  # in slice order, whichever program is last
                    acc += tl.load(part + s * slice_size, mask=mn_ok, other=0.0, cache_modifier=".cg")
                    if GLU:
                        acc_up += tl.load(part + s * slice_size + M * N, mask=mn_ok, other=0.0, cache_modifier=".cg")
                _rows_epilogue(acc, acc_up, r, y_ptr, s_ptr, pid, rm, rn, m_ok, mn_ok, N, GLU, RESIDUAL, SQUARES,
                               BLOCK_N, BLOCK_M)

    def _k_fits(configs, named_args, **kwargs):
        # the configurations whose slices tile K (K % (SPLIT_K BLOCK_K) == 0); the unsplit ones
        # all fit, masking their last tile where BLOCK_K does not divide K
        K = named_args["K"] if "K" in named_args else kwargs["K"]
        split = lambda c: c.kwargs.get("SPLIT_K", 1)  # noqa: E731
        return [c for c in configs if split(c) == 1 or K % (split(c) * c.kwargs["BLOCK_K"]) == 0]

    # Four autotuners over the one kernel. glu's tiles stop at BLOCK_N 32: a program reads BLOCK_N
    # rows of each half (64 would stream 128 weight rows a tile, twice the plain kernel's most, and
    # fill twice its shared memory over 3 stages) and keeps two [16, BLOCK_N] fp32 sums. The split
    # ones run outside torch.compile only: it traces no pruning function, and the kept counts
    # are a global it should not capture. So under torch.compile the unsplit ones.
    _glu = lambda configs: [c for c in configs if c.kwargs["BLOCK_N"] <= 32]  # noqa: E731
    _rows_kernel = triton.autotune(configs=_ROWS_CONFIGS, key=_ROWS_KEY)(_rows_kernel_fn)
    _rows_glu_kernel = triton.autotune(configs=_glu(_ROWS_CONFIGS), key=_ROWS_KEY)(_rows_kernel_fn)
    _rows_split_kernel = triton.autotune(configs=_ROWS_CONFIGS + _SPLIT_CONFIGS, key=_ROWS_KEY,
                                         prune_configs_by={"early_config_prune": _k_fits})(_rows_kernel_fn)
    _rows_split_glu_kernel = triton.autotune(configs=_glu(_ROWS_CONFIGS + _SPLIT_CONFIGS), key=_ROWS_KEY,
                                             prune_configs_by={"early_config_prune": _k_fits})(_rows_kernel_fn)

_COUNTS: dict = {}  # device index -> int32 [n] split-K counts, zero between launches
# Split K is tried for outputs up to this wide (the 8B shape's wqkv, wo, w2 and each half of
# w13), not for an LM head: 128256 columns fill the GPU unsplit (1.0 of the copy bandwidth at 9
# rows, results/2026-12-04-h200), and its partials would take 4 x 4 x M x N bytes a call.
SPLIT_MAX_N = 16384


@contextmanager
def split_k(on: bool):
    """Split K allowed (SPLIT_MAX_N as it is) or not (0) inside the block, as it was after it:
    for benchmarks that time the rows kernel both ways (a CUDA graph keeps what held at its
    capture)."""
    global SPLIT_MAX_N
    saved = SPLIT_MAX_N
    SPLIT_MAX_N = saved if on else 0
    try:
        yield
    finally:
        SPLIT_MAX_N = saved


def split_counts(device: torch.device, n: int) -> torch.Tensor:
    """The split-K counts for n column tiles on `device`: one zeroed buffer per device, grown
    (a new one; the old ones stay alive for CUDA graphs captured over them) when n outgrows it.
    Every launch leaves its counts zero, and launches on one stream never overlap."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    kept = _COUNTS.setdefault(index, [])
    if not kept or kept[-1].numel() < n:
        kept.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return kept[-1]


@contextmanager
def max_rows(n: int):
    """Inside the block the kernels take forwards of up to n rows (TILE_ROWS to WIDE_ROWS), the
    torch composition more; after it, MAX_ROWS as before. For benchmarks (a CUDA graph keeps
    what held at its capture): max_rows(16) is torch's projections past 16 rows."""
    global MAX_ROWS
    if not TILE_ROWS <= n <= WIDE_ROWS:
        raise ValueError(f"max_rows: {n}, not in [{TILE_ROWS}, {WIDE_ROWS}]")
    saved = MAX_ROWS
    MAX_ROWS = n
    try:
        yield
    finally:
        MAX_ROWS = saved


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The kernels' domain: CUDA, at most MAX_ROWS rows (16 under torch.compile: wide rows have
    not run there), contiguous weights of x's dtype (any K: a width BLOCK_K does not divide
    masks its last tile)."""
    M = x.numel() // x.shape[-1]
    most = TILE_ROWS if torch.compiler.is_compiling() else MAX_ROWS
    return triton is not None and x.is_cuda and M <= most and w.is_contiguous() and x.dtype == w.dtype


def project(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None, *,
            norm: Optional[torch.Tensor] = None, eps: float = 1e-6, glu: bool = False,
            residual: Optional[torch.Tensor] = None, kernel: bool = True,
            norm_squares: Optional[torch.Tensor] = None, squares: bool = False):
    """x: [..., K], w: [N, K] (glu: [2H, K]), norm: [K] gamma, residual: [..., N] ->
    [..., N] (glu: [..., H]). The Triton kernel where `kernel` and `supported`, for 1 to 16 rows
    with any of the folds (gamma and the residual in x's dtype, the residual of y's shape: no
    broadcasting), and to MAX_ROWS rows (past 16 the norm applied beforehand by
    `norm_rows`); else `reference`, which a bias always takes.

    Norms from squares (module docstring): squares=True returns (y, s), s [M, cdiv(N,
    SQUARES_GROUP)] fp32 the squares of y's (rounded) entries summed by SQUARES_GROUP columns
    (`squares` in torch), written by the rows kernel's epilogue, or None where it did not sum
    them (one row, more than 16, the torch composition); norm_squares: x's s, from which the rows
    kernel then takes the norm's rstd instead of its pass over x."""
    *lead, K = x.shape
    M = x.numel() // K
    N = w.shape[0] // 2 if glu else w.shape[0]
    folds_fit = ((norm is None or (norm.dtype == x.dtype and norm.is_contiguous()))
                 and (residual is None or (residual.dtype == x.dtype and tuple(residual.shape) == (*lead, N))))
    if not (kernel and b is None and folds_fit and supported(x, w)):
        y = reference(x, w, b, norm=norm, eps=eps, glu=glu, residual=residual)
        return (y, None) if squares else y
    x2 = x.reshape(M, K)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if M > TILE_ROWS and norm is not None:  # wide rows: the norm once, not re-done by every program
        x2, norm, norm_squares = norm_rows(x2, norm, eps), None, None
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    r = residual.reshape(M, N).contiguous() if residual is not None else y  # y: a pointer left unread
    g = norm if norm is not None else x2
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta.get("SPLIT_K", 1))  # noqa: E731
    pdl = launch_options(x.device, M)
    folds = dict(NORM=norm is not None, GLU=glu, RESIDUAL=residual is not None, PDL=bool(pdl), **pdl)
    kernel = tuner(M, N, glu, K)
    if M == 1:  # the one-row kernel's pass reads 1 row of x: it neither takes nor gives squares
        kernel[grid](x2, w, y, g, r, N, K, eps, **folds)
        return (y.view(*lead, N), None) if squares else y.view(*lead, N)
    # fp32: full-precision products, not tl.dot's default TF32
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    rows = 1 << (M - 1).bit_length()  # the bucket: 2, 4, 8, 16 (32, 64: wide rows)
    if kernel in (_rows_split_kernel, _rows_split_glu_kernel):
        parts = torch.empty(max(SPLITS) * (2 if glu else 1) * M * N, dtype=torch.float32, device=x.device)
        counts = split_counts(x.device, triton.cdiv(N, 16))  # the narrowest tile's count of column tiles
    else:  # pointers left unread
        parts = counts = y
    width, xs = 0, y  # (y: a pointer left unread)
    if norm is not None and norm_squares is not None:
        groups = triton.cdiv(K, SQUARES_GROUP)
        if norm_squares.shape != (M, groups) or norm_squares.dtype != torch.float32 or not norm_squares.is_contiguous():
            raise ValueError(f"norm_squares: {tuple(norm_squares.shape)} {norm_squares.dtype}, not [{M}, {groups}] "
                             "contiguous float32 (x's squares by squares=True)")
        width, xs = squares_width(K), norm_squares
    summed = squares and M <= TILE_ROWS  # past 16 rows the next norm is norm_rows' pass: no squares
    s = torch.empty(M, triton.cdiv(N, SQUARES_GROUP), dtype=torch.float32, device=x.device) if summed else y
    kernel[grid](x2, w, y, g, r, parts, counts, xs, s, M, rows, N, K, eps, precision, NORM_SQUARES=width,
                 SQUARES=summed, BLOCK_M=max(TILE_ROWS, rows), **folds)
    if squares:
        return y.view(*lead, N), s if summed else None
    return y.view(*lead, N)


def norm_rows(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [M, K] contiguous, gamma: [K] of x's dtype -> rms_norm(x, gamma, eps) in one launch, one
    program a row, rounded where rms_norm rounds (its fp32 sum of squares in another order). The
    norm of forwards past TILE_ROWS rows, which the rows kernel does not fold: torch's rms_norm
    is 8 launches a norm, 520 a forward of the 8B shape (65 norms: two a layer and the last)."""
    M, K = x.shape
    y = torch.empty_like(x)
    _norm_kernel[(M,)](x, gamma, y, K, eps, BLOCK_K=min(1024, triton.next_power_of_2(K)), num_warps=4)
    return y


def tuner(M: int, N: int, glu: bool, K: int):
    """The autotuned kernel `project` launches for M rows of K inputs and N outputs (glu: N per
    half): the one-row kernel's tuner with the 1024-wide K tiles (K a multiple of 1024) or
    without, or the rows kernel's tuner with split K (outside torch.compile, N up to
    SPLIT_MAX_N) or without."""
    if M == 1:
        return _vector_wide_kernel if K % 1024 == 0 else _vector_kernel
    if torch.compiler.is_compiling() or N > SPLIT_MAX_N:
        return _rows_glu_kernel if glu else _rows_kernel
    return _rows_split_glu_kernel if glu else _rows_split_kernel
