"""Skinny projections for decode: y = x W^T with few rows in x, read at the bandwidth floor.

At batch 1 a decode step is a chain of matrix-vector products over the weights, so a step
costs what streaming the weights once costs, plus every kernel launch between them. `project`
computes a decoder layer's projections with what surrounds them folded in, one kernel each:

    norm       y = rms_norm(x, gamma) W^T     the RMSNorm as a prologue (x is tiny, re-read)
    glu        y = silu(x W_gate^T) * (x W_up^T) for W = [W_gate; W_up], the MLP's activation
    residual   y = r + x W^T                  the residual add as an epilogue

and falls back to the same composition in torch wherever the kernel does not apply (CPU, more
than 16 rows, odd widths): one function is both the kernel's entry and its reference. The
kernel rounds to the input dtype wherever the torch composition does, so the two agree to the
last bit but for the order of the fp32 sums.

One program owns BLOCK_N output columns (rows of W; with glu the matching rows of both
halves) and walks K in BLOCK_K tiles. One input row keeps a [BLOCK_N, BLOCK_K] fp32 partial
sum reduced once at the end; 2 to 16 rows are padded to 16 for a tensor-core product.

Letters: M input rows, K input width, N output width (H per half with glu).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: project() runs the torch composition
    triton = None


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
    _CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=3)
                for bn in (4, 8, 16) for bk in (256, 512) for w in (4, 8)]

    @triton.jit
    def _rstd(x_ptr, K: tl.constexpr, eps, BLOCK_K: tl.constexpr):
        rk = tl.arange(0, BLOCK_K)
        ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(x_ptr + k0 + rk).to(tl.float32)
            ss += v * v
        return tl.rsqrt(tl.sum(ss, axis=0) / K + eps)

    @triton.autotune(configs=_CONFIGS, key=["N", "K", "NORM", "GLU", "RESIDUAL"])
    @triton.jit
    def _vector_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, N, K: tl.constexpr, eps,
                       NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # x: [K], w: [N, K] (GLU: [2N, K]), y, r: [N], g: [K]; K % BLOCK_K == 0 (the caller checks).
        # K is a compile-time constant: a few widths per model, and loops the compiler can unroll.
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
        n_ok = rn < N
        dtype = y_ptr.dtype.element_ty
        if NORM:
            rstd = _rstd(x_ptr, K, eps, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]  # [BLOCK_N, BLOCK_K]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + k0 + rk)
            if NORM:  # rounded as rms_norm rounds: h to the dtype, then times gamma in the dtype
                h = (x.to(tl.float32) * rstd).to(dtype).to(tl.float32)
                x = (h * tl.load(g_ptr + k0 + rk).to(tl.float32)).to(dtype)
            x = x.to(tl.float32)[None, :]
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
            acc += w.to(tl.float32) * x
            if GLU:
                up = tl.load(w_ptrs + N * K + k0, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
                acc_up += up.to(tl.float32) * x
        y = tl.sum(acc, axis=1).to(dtype).to(tl.float32)  # [BLOCK_N], rounded like F.linear's output
        if GLU:
            up = tl.sum(acc_up, axis=1).to(dtype).to(tl.float32)
            y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up
        if RESIDUAL:
            y = y.to(dtype).to(tl.float32) + tl.load(r_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, y.to(dtype), mask=n_ok)

    @triton.autotune(configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=3)
                              for bn in (16, 32, 64) for bk in (128, 256) for w in (4, 8)], key=["M", "N", "K"])
    @triton.jit
    def _rows_kernel(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # x: [M <= 16, K], w: [N, K], y: [M, N]: the rows padded to 16 for one tensor-core product
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
        rm = tl.arange(0, 16)  # [16]
        n_ok, m_ok = rn < N, rm < M
        w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]  # [BLOCK_N, BLOCK_K]
        x_ptrs = x_ptr + rm[:, None] * K + rk[None, :]  # [16, BLOCK_K]
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs + k0, mask=m_ok[:, None], other=0.0)
            acc += tl.dot(x, tl.trans(w))  # [16, BLOCK_N]
        y_ptrs = y_ptr + rm[:, None] * N + rn[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The kernels' domain: CUDA, at most 16 rows, K a multiple of 512, contiguous weights."""
    M = x.numel() // x.shape[-1]
    return (triton is not None and x.is_cuda and M <= 16 and x.shape[-1] % 512 == 0
            and w.is_contiguous() and x.dtype == w.dtype)


def project(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None, *,
            norm: Optional[torch.Tensor] = None, eps: float = 1e-6, glu: bool = False,
            residual: Optional[torch.Tensor] = None, kernel: bool = True) -> torch.Tensor:
    """x: [..., K], w: [N, K] (glu: [2H, K]), norm: [K] gamma, residual: [..., N] ->
    [..., N] (glu: [..., H]). The Triton kernel where `kernel` and `supported`, one row with
    anything folded in or up to 16 rows of a plain product; else `reference`."""
    M = x.numel() // x.shape[-1]
    if not (kernel and b is None and supported(x, w)) or (M > 1 and (norm is not None or glu or residual is not None)):
        return reference(x, w, b, norm=norm, eps=eps, glu=glu, residual=residual)
    *lead, K = x.shape
    N = w.shape[0] // 2 if glu else w.shape[0]
    x2 = x.reshape(M, K)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    if M == 1:
        r = residual.reshape(N) if residual is not None else y
        _vector_kernel[grid](x2, w, y, norm if norm is not None else x2, r, N, K, eps,
                             NORM=norm is not None, GLU=glu, RESIDUAL=residual is not None)
    else:
        _rows_kernel[grid](x2, w, y, M, N, K)
    return y.view(*lead, N)
