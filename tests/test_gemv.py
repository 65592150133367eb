"""specbench.kernels.gemv: the decode projections against their torch composition.

On CPU the kernels run through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
without CUDA) at fixed tile sizes, since the autotuner needs a GPU; on CUDA through `project`.
fp32: only the order of the sums differs, so the tolerance is relative 1e-5 (5e-3 for the rows
kernel on a GPU, set when its products were TF32; they are full fp32 now, input_precision
"ieee", and 1e-5 there awaits a GPU run). fp16 checks the rounding points themselves (bf16 only
on a GPU: the interpreter's tl.dot multiplies bf16 bit patterns as integers, and its casts to
bf16 truncate). Run on an H200 on 2026-12-03: everything here passed at cb48cd2 (the rows
kernel's folds included) and at ced1021 (one unrolled rstd prologue, deeper rows tiles). On
2026-12-04 at bfdc9e5 the split-K cases and 6 of the 9 bf16 cases passed on an H200 before the
call's limit; the rest did not run there with split K.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
from specbench.kernels import gemv  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # on CPU the interpreter; on a GPU the compiled kernels
FOLDS = {"plain": {}, "norm": {"norm": True}, "glu": {"norm": True, "glu": True}, "residual": {"residual": True}}


def _case(fold: str, M: int, K: int = 512, N: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = 2 * N if FOLDS[fold].get("glu") else N
    x, w = torch.randn(M, K, generator=g), torch.randn(rows, K, generator=g) / K**0.5
    kw = {}
    if FOLDS[fold].get("norm"):
        kw["norm"] = 1 + 0.1 * torch.randn(K, generator=g)
    if FOLDS[fold].get("glu"):
        kw["glu"] = True
    if FOLDS[fold].get("residual"):
        kw["residual"] = torch.randn(M, N, generator=g)
    return x.to(DEVICE), w.to(DEVICE), {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in kw.items()}


def _launch(x, w, kw, split_k: int = 1, counts=None, block_k: int = 0, loop_stages: int = 0, block_n: int = 16,
            norm_squares=None, squares: bool = False):
    """The kernels at fixed tiles (the interpreter has no autotuner); y as project() returns it.
    split_k > 1: the rows kernel with K in that many slices, over `counts` (zeros if None);
    block_k: the K tile (0: 256 for the one-row kernel, 128 for the rows kernel); loop_stages:
    the one-row kernel's (0: its plain loop, else tl.range's software pipeline); block_n: the
    rows kernel's column tile; norm_squares, squares: the rows kernel's, as project() passes
    them (squares: returns (y, s))."""
    M, K = x.shape
    N = w.shape[0] // 2 if kw.get("glu") else w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    r = kw["residual"].reshape(M, N) if "residual" in kw else y
    folds = dict(NORM="norm" in kw, GLU=bool(kw.get("glu")), RESIDUAL="residual" in kw)
    if M == 1:
        gemv._vector_kernel.fn[(triton.cdiv(N, 8),)](
            x, w, y, kw.get("norm", x), r, N, K, 1e-5, **folds, PDL=False, BLOCK_N=8, BLOCK_K=block_k or 256,
            LOOP_STAGES=loop_stages)
    else:
        parts = torch.full((split_k * 2 * M * N,), float("nan"), device=x.device)  # each slot written before read
        counts = torch.zeros(triton.cdiv(N, 16), dtype=torch.int32, device=x.device) if counts is None else counts
        s = torch.full((M, triton.cdiv(N, gemv.SQUARES_GROUP)), float("nan"), device=x.device)
        width = gemv.squares_width(K) if norm_squares is not None else 0
        gemv._rows_kernel.fn[(triton.cdiv(N, block_n), split_k)](
            x, w, y, kw.get("norm", x), r, parts, counts, y if norm_squares is None else norm_squares, s, M, 16, N,
            K, 1e-5, "ieee", **folds, NORM_SQUARES=width, SQUARES=squares, PDL=False, BLOCK_N=block_n,
            BLOCK_K=block_k or 128, SPLIT_K=split_k, BLOCK_M=max(16, 1 << (M - 1).bit_length()))
        if squares:
            return y, s
    return y


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("loop_stages", [0, 3], ids=["plain", "pipelined"])
def test_one_row_kernel_matches_the_torch_composition(fold, loop_stages):
    x, w, kw = _case(fold, M=1)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    got = _launch(x, w, kw, loop_stages=loop_stages)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fold", list(FOLDS))
def test_one_row_kernel_with_1024_wide_tiles(fold):
    """The wide tuner's K tile (_WIDE_CONFIGS): K = 2048 in two steps, the peeled first and one
    of the loop's."""
    x, w, kw = _case(fold, M=1, K=2048)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    got = _launch(x, w, kw, block_k=1024)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("M", [2, 9, 16, 17, 33, 64])
def test_few_rows_kernel_matches_the_torch_composition(fold, M):
    """2 to 16 rows in a 16-row tile; 17 to 32 in 32 and 33 to 64 in 64 (wide rows, where
    project applies the norm beforehand; the kernel's own fold is checked here too)."""
    x, w, kw = _case(fold, M=M)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    tol = 5e-3 if CUDA else 1e-5  # see the module docstring
    torch.testing.assert_close(_launch(x, w, kw), expected, rtol=tol, atol=tol * expected.abs().max().item())


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("M, K, block_k", [(1, 576, 256), (1, 192, 256), (9, 576, 256), (9, 96, 128)])
def test_kernels_mask_the_last_tile_where_block_k_does_not_divide_k(fold, M, K, block_k):
    """SmolLM2-135M's width, 576, in 256-wide tiles (the last one reaches 192 past K), and a K
    narrower than one tile. Unmasked, the columns past K would be the next row's weights and x
    (the last row's past the end, here random too: each tensor sits at the start of a larger
    one), so a missing mask moves these sums by about their own size; the norm's rstd must
    cover exactly K. fp32: relative 1e-5, as the tiling tests above."""
    def overhung(t):  # t at the start of a random buffer 256 elements longer
        buf = torch.randn(t.numel() + 256, generator=torch.Generator().manual_seed(1)).to(t.device)
        buf[:t.numel()] = t.flatten()
        return buf[:t.numel()].view(t.shape)

    x, w, kw = _case(fold, M=M, K=K)
    x, w = overhung(x), overhung(w)
    if "norm" in kw:
        kw["norm"] = overhung(kw["norm"])
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    got = _launch(x, w, kw, block_k=block_k)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_matches_the_unsplit_kernel_and_leaves_its_counts_zero(fold, split_k):
    """K = 512 in 2 or 4 slices of 256 or 128 (the tile's BLOCK_K is 128, so each slice takes 1
    to 2 steps): the last program of each column tile adds the slices' partials in order and
    applies the folds. Against the torch composition (fp32: relative 1e-5; a slice left out or
    counted twice moves outputs by about a quarter), and twice over the same counts, which each
    launch must leave zero for the next (3 column tiles of 16 for N = 40, the last one ragged)."""
    x, w, kw = _case(fold, M=9)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    counts = torch.zeros(triton.cdiv(40, 16), dtype=torch.int32, device=x.device)
    for _ in range(2):
        got = _launch(x, w, kw, split_k=split_k, counts=counts)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        assert counts.eq(0).all()


@pytest.mark.parametrize("fold", ["residual", "plain"])
@pytest.mark.parametrize("block_n, split_k", [(16, 1), (32, 1), (32, 2)])
def test_rows_kernel_sums_its_output_squares_by_group(fold, block_n, split_k):
    """squares=True: y's squares summed by 16 columns, one sum per (row, group), written by the
    epilogue (the split tile's last program's included). N = 40: 3 groups, the last one 8 wide, the
    second tile of 32 columns reaching 24 past N (masked to nothing). fp32, relative 1e-5: a
    group left out or summed twice moves a row's sum by about a third."""
    x, w, kw = _case(fold, M=9)
    y, s = _launch(x, w, kw, split_k=split_k, block_n=block_n, squares=True)
    torch.testing.assert_close(y, gemv.reference(x, w, eps=1e-5, **kw), rtol=1e-5, atol=1e-5 * y.abs().max().item())
    assert s.shape == (9, 3)
    torch.testing.assert_close(s, gemv.squares(y), rtol=1e-5, atol=0)


@pytest.mark.parametrize("fold", ["norm", "glu"])
@pytest.mark.parametrize("K", [512, 576, 96])
def test_norm_from_squares_is_the_norm_from_a_pass(fold, K):
    """norm_squares: the rstd from x's squares by group (K = 512: 32 groups; SmolLM2's 576: 36,
    read in a 64-wide tile; 96: 6 in 8), not from a pass over x. fp32: relative 1e-5 of the torch
    composition (an rstd from squares of other rows, or of too few groups, misses it by far)."""
    x, w, kw = _case(fold, M=9, K=K)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    got = _launch(x, w, kw, norm_squares=gemv.squares(x), block_k=128 if K % 128 == 0 else 256)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    wrong = gemv.squares(x).roll(1, 0)  # another row's squares
    got = _launch(x, w, kw, norm_squares=wrong, block_k=128 if K % 128 == 0 else 256)
    assert not torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * expected.abs().max().item())


def test_a_residual_projections_squares_feed_the_next_norm_in_fp16():
    """As a layer chains them: wo's residual output and its squares, then w13's norm from those.
    fp16, where the norm's rounding points show (test_kernels_round_where_the_torch_composition_rounds):
    the chain differs from the torch composition's only where the sums' order tips a rounding."""
    o, wo, kw = _case("residual", M=9, K=256, N=512)
    _, w13, kw13 = _case("glu", M=9, K=512, N=64, seed=1)
    o, wo, w13 = o.half(), wo.half(), w13.half()
    r, gamma = kw["residual"].half(), kw13["norm"].half()
    x, s = _launch(o, wo, {"residual": r}, squares=True)
    got = _launch(x, w13, {"norm": gamma, "glu": True}, norm_squares=s)
    expected = gemv.reference(gemv.reference(o, wo, residual=r), w13, norm=gamma, glu=True, eps=1e-5)
    assert (got != expected).float().mean().item() < 0.01
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3 * expected.abs().max().item())


def test_every_rows_tile_holds_whole_squares_groups():
    """The epilogue sums a tile's squares by gemv.SQUARES_GROUP columns (a reshape of the tile):
    every column tile the rows tuners may pick is a multiple of it."""
    configs = gemv._ROWS_CONFIGS + gemv._SPLIT_CONFIGS
    assert all(c.kwargs["BLOCK_N"] % gemv.SQUARES_GROUP == 0 for c in configs)


def test_project_refuses_squares_of_another_shape(monkeypatch):
    """norm_squares must be x's, [M, cdiv(K, 16)] fp32: squares of a wider or narrower x, or
    another row count, are a one-line error naming the argument, before any launch."""
    monkeypatch.setattr(gemv, "supported", lambda x, w: True)  # the rows path, on any device
    monkeypatch.setattr(gemv, "tuner", lambda M, N, glu, K: gemv._rows_kernel)
    x, w, kw = _case("norm", M=9)
    for bad in (torch.zeros(9, 31), torch.zeros(8, 32), torch.zeros(9, 32, dtype=torch.float64)):
        with pytest.raises(ValueError, match="norm_squares"):
            gemv.project(x, w, eps=1e-5, norm_squares=bad.to(x.device), **kw)


def test_split_k_off_picks_the_unsplit_tuner_and_restores():
    """gemv.split_k(False), as the benchmarks time both ways: the rows kernel's unsplit tuner
    inside the block, the split one again after it; an LM head's width (N > SPLIT_MAX_N) and a
    single row never split."""
    assert gemv.tuner(9, 4096, False, 4096) is gemv._rows_split_kernel
    assert gemv.tuner(9, 14336, True, 4096) is gemv._rows_split_glu_kernel
    with gemv.split_k(False):
        assert gemv.tuner(9, 4096, False, 4096) is gemv._rows_kernel
        assert gemv.tuner(9, 14336, True, 4096) is gemv._rows_glu_kernel
    assert gemv.tuner(9, 4096, False, 4096) is gemv._rows_split_kernel
    assert gemv.tuner(9, 128256, False, 4096) is gemv._rows_kernel
    assert gemv.tuner(1, 4096, False, 4096) is gemv._vector_wide_kernel  # 1024-wide K tiles fit
    assert gemv.tuner(1, 4096, False, 1536) is gemv._vector_kernel


def test_split_k_rounds_where_the_torch_composition_rounds():
    """fp16, norm + glu, 4 slices: the folds applied once, to the whole sum (as the unsplit
    kernel's rounding test checks)."""
    x, w, kw = _case("glu", M=9, N=256)
    x, w, kw["norm"] = x.half(), w.half(), kw["norm"].half()
    got, expected = _launch(x, w, kw, split_k=4), gemv.reference(x, w, eps=1e-5, **kw)
    assert (got != expected).float().mean().item() < 0.01


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("M", [1, 9])
def test_kernels_round_where_the_torch_composition_rounds(fold, M):
    """fp16, where a rounding step left out (h before gamma, gate and up, silu, y before the
    residual) moves 25 to 55% of these outputs by an ulp: the kernels may differ from the torch
    composition only where the order of the fp32 sums tips a rounding (well under 1%)."""
    x, w, kw = _case(fold, M=M, N=256)
    x, w = x.half(), w.half()
    kw = {k: (v.half() if torch.is_tensor(v) else v) for k, v in kw.items()}
    got, expected = _launch(x, w, kw), gemv.reference(x, w, eps=1e-5, **kw)
    assert got.dtype == expected.dtype == torch.float16
    assert (got != expected).float().mean().item() < 0.01
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3 * expected.abs().max().item())


def test_project_falls_back_outside_the_kernels_domain():
    """CPU tensors, a bias, MAX_ROWS + 1 rows, a residual to broadcast, weights of another dtype: the
    torch composition itself (on a GPU, folds on 3 rows take the kernel instead)."""
    x, w, kw = _case("glu", M=3)
    x, w, kw = x.cpu(), w.cpu(), {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()}
    assert not gemv.supported(x, w)  # CPU tensors: only the interpreter runs the kernels there
    assert torch.equal(gemv.project(x, w, eps=1e-5, **kw), gemv.reference(x, w, eps=1e-5, **kw))
    x, w, _ = _case("plain", M=3)
    b = torch.randn(w.shape[0], device=x.device)
    assert torch.equal(gemv.project(x, w, b), gemv.reference(x, w, b))
    r = torch.randn(w.shape[0], device=x.device)  # [N] against a [3, N] product
    assert torch.equal(gemv.project(x, w, residual=r), gemv.reference(x, w, residual=r))
    wide, _, _ = _case("plain", M=gemv.MAX_ROWS + 1)
    assert not gemv.supported(wide, w)
    assert torch.equal(gemv.project(wide, w), gemv.reference(wide, w))
    assert not gemv.supported(x[:1], w.double())


@pytest.mark.skipif(not CUDA, reason="the autotuned launch needs a GPU; the kernels run above through the interpreter")
@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("M", [1, 9, 16, 33, 48])
def test_project_on_cuda_in_bf16(fold, M):
    """33 rows: the default's widest (wide rows, the norm by norm_rows); 48 inside
    gemv.max_rows(48)."""
    x, w, kw = _case(fold, M=M, K=4096, N=1000)
    x, w = x.cuda().bfloat16(), w.cuda().bfloat16()
    kw = {k: (v.cuda().bfloat16() if torch.is_tensor(v) else v) for k, v in kw.items()}
    expected = gemv.project(x, w, eps=1e-5, kernel=False, **kw).float()
    with gemv.max_rows(max(M, gemv.MAX_ROWS)):
        assert gemv.supported(x, w)
        got = gemv.project(x, w, eps=1e-5, **kw).float()
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


@pytest.mark.skipif(not CUDA, reason="every tile compiled once: a GPU's work; the interpreter runs fixed tiles above")
@pytest.mark.parametrize("kernel", ["one-row", "rows"])
def test_every_tile_on_cuda_in_bf16(kernel):
    """Each tile configuration the autotuners choose among, launched once on the 8B shape's
    width with the norm and residual folds: the CUDA tests tune over a few of them
    (tests/conftest.py's few_tiles), the benchmarks over all. One row for the one-row kernel's
    tiles; 9 rows for the rows kernel's, split K included, its counts left zero."""
    M = 1 if kernel == "one-row" else 9
    x, w, kw = _case("norm", M=M, K=4096, N=1000)
    kw["residual"] = torch.randn(M, 1000, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    x, w = x.bfloat16(), w.bfloat16()
    kw = {k: (v.bfloat16() if torch.is_tensor(v) else v) for k, v in kw.items()}
    expected = gemv.reference(x, w, eps=1e-5, **kw).float()
    N, K = w.shape
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    folds = dict(NORM=True, GLU=False, RESIDUAL=True, PDL=False)
    if kernel == "one-row":
        configs = gemv._CONFIGS + gemv._PIPELINED_CONFIGS + gemv._WIDE_CONFIGS + gemv._PIPELINED_WIDE_CONFIGS
    else:
        configs = gemv._k_fits(gemv._ROWS_CONFIGS + gemv._SPLIT_CONFIGS, {"K": K})
        counts = torch.zeros(triton.cdiv(N, 16), dtype=torch.int32, device=x.device)
        parts = torch.empty(max(gemv.SPLITS) * M * N, dtype=torch.float32, device=x.device)
    assert len(configs) == (20 if kernel == "one-row" else 22)
    for c in configs:
        y.fill_(float("nan"))
        meta = dict(**c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
        grid = (triton.cdiv(N, c.kwargs["BLOCK_N"]), c.kwargs.get("SPLIT_K", 1))
        if kernel == "one-row":
            gemv._vector_kernel.fn[grid[:1]](x, w, y, kw["norm"], kw["residual"], N, K, 1e-5, **folds, **meta)
        else:
            gemv._rows_kernel.fn[grid](x, w, y, kw["norm"], kw["residual"], parts, counts, y, y, M, 16, N, K, 1e-5,
                                       "tf32", **folds, NORM_SQUARES=0, SQUARES=False, BLOCK_M=16, **meta)
            assert not counts.any(), c
        assert (y.float() - expected).abs().max() <= 0.02 * expected.abs().max(), c


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("K", [576, 2048], ids=["masked", "two-tiles"])
def test_norm_rows_is_rms_norm_in_one_launch(dtype, K):
    """norm_rows against rms_norm: fp32 to 1e-6 (the sum's order), fp16 to one rounding of the
    output (its rstd rounds the same way but for that order); 576 masks its one 1024-wide tile,
    2048 takes two. bf16 runs in test_project_on_cuda_in_bf16 (the interpreter truncates it)."""
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(40, K, generator=g)).to(dtype).to(DEVICE)
    gamma = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(DEVICE)
    got, expected = gemv.norm_rows(x, gamma, 1e-5), gemv.rms_norm(x, gamma, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    else:  # at most one ulp apart, and most entries equal
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
        assert (got == expected).float().mean() > 0.99


def test_max_rows_sets_the_kernels_domain_then_restores():
    """MAX_ROWS 33 by default; max_rows(n) sets it inside its block, refuses n outside
    [TILE_ROWS, WIDE_ROWS] with the value named, and restores it after an exception too."""
    assert gemv.MAX_ROWS == 33
    with gemv.max_rows(16):
        assert gemv.MAX_ROWS == 16
    with pytest.raises(RuntimeError), gemv.max_rows(64):
        assert gemv.MAX_ROWS == 64
        raise RuntimeError
    assert gemv.MAX_ROWS == 33
    for n in (15, 65):
        with pytest.raises(ValueError, match=f"max_rows: {n}"), gemv.max_rows(n):
            pass


@pytest.mark.parametrize("fold", list(FOLDS))
def test_wide_rows_apply_the_norm_beforehand(monkeypatch, fold):
    """project at 33 rows: the rows kernel in a 64-row tile, the norm applied first by
    norm_rows (the launch has no NORM fold and sums no squares, so squares=True gives None),
    within fp32's 1e-5 of the composition; inside gemv.max_rows(16) the torch composition. The
    kernels run through the interpreter at one tile (the autotuner needs a GPU), and
    `supported`'s CUDA check is stood in for."""
    launched = []

    class OneTile:  # the rows tuner's launch at one configuration
        def __getitem__(self, grid):
            config = dict(BLOCK_N=16, BLOCK_K=128, SPLIT_K=1)

            def launch(*args, **kwargs):
                launched.append(kwargs)
                return gemv._rows_kernel.fn[grid(config)](*args, **kwargs, **config)
            return launch

    monkeypatch.setattr(gemv, "supported", lambda x, w: x.numel() // x.shape[-1] <= gemv.MAX_ROWS)
    monkeypatch.setattr(gemv, "tuner", lambda M, N, glu, K: OneTile())
    normed = []
    norm_rows = gemv.norm_rows
    monkeypatch.setattr(gemv, "norm_rows", lambda x, gamma, eps: normed.append(x.shape) or norm_rows(x, gamma, eps))
    x, w, kw = _case(fold, M=33)
    expected = gemv.reference(x, w, eps=1e-5, **kw)
    with gemv.max_rows(16):
        assert torch.equal(gemv.project(x, w, eps=1e-5, **kw), expected) and not launched  # torch's
    got, s = gemv.project(x, w, eps=1e-5, squares=True, **kw)
    (call,) = launched
    assert (call["BLOCK_M"], call["NORM"], call["SQUARES"], call["GLU"]) == (64, False, False, fold == "glu")
    assert normed == ([(33, 512)] if "norm" in kw else [])
    assert s is None
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_decode_profile_and_attention_crossover_run_tiny(tmp_path):
    """experiments/decode_profile.py and engine_bench.py --parts fused on a 2-layer model, on the
    CPU in fp32 even where there is a GPU (bf16 there would move the logits past 1e-4): every
    code path runs and the JSON holds each variant's step time."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    run = lambda *a: subprocess.run([sys.executable, *map(str, a)], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, env=env)
    out = run(root / "experiments" / "decode_profile.py", tmp_path, "--tiny", "--variants", "eager,eager_kernels")
    assert out.returncode == 0, out.stderr[-2000:]
    profile = json.loads((tmp_path / "decode_profile.json").read_text())
    assert profile["eager"]["ms"] > 0 and profile["eager_kernels"]["max_abs_logit_diff"] < 1e-4
    assert {r["name"] for r in profile["gemv"]} == {"wqkv", "wo", "w13", "w2", "output"}
    out = run(root / "experiments" / "engine_bench.py", tmp_path, "--tiny", "--parts", "fused")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "engine_bench.json").read_text())["attention_crossover"]
    assert [r["rows"] for r in rows] == [1, 4] and all(r["matmul_ms"] > 0 and r["fused_ms"] > 0 for r in rows)


def test_engine_bench_attention_launch_forces_then_restores():
    """engine_bench's attention_launch: inside the block a forward of several rows gets the forced
    BLOCK_M (and the tiles it implies), one row keeps the heuristic's; a forced max_splits bounds
    every forward's splits; explicit arguments stand; after the block, the heuristic."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import engine_bench

    from specbench.kernels import attention

    shape = dict(S=4096, kv_heads=8, G=4, hd=128, sms=132)  # the 8B shape: 36 query rows a kv head at q = 9
    assert attention.launch_shape(1, 9, **shape) == (8, 64, 64, 1)  # splits at MAX_SPLITS
    with engine_bench.attention_launch(32):
        assert attention.launch_shape(1, 9, **shape)[1:4:2] == (32, 2)
        assert attention.launch_shape(1, 1, **shape)[1] == 16  # one row: the heuristic's
        assert attention.launch_shape(1, 9, block_m=16, **shape)[1:4:2] == (16, 3)  # an explicit override stands
    with engine_bench.attention_launch(max_splits=16):
        assert attention.launch_shape(1, 9, **shape) == (16, 64, 64, 1)  # cdiv(132 SMs, 8 programs) = 17 -> 16
        assert attention.launch_shape(1, 1, **shape)[0] == 16
        assert attention.launch_shape(1, 9, max_splits=4, **shape)[0] == 4
    assert attention.launch_shape(1, 9, **shape) == (8, 64, 64, 1)


def test_gemv_ab_runs_tiny_against_itself(tmp_path):
    """experiments/gemv_ab.py on a 2-layer model on the CPU, the current module as its own
    baseline (A/A): a row per projection and row count with both timings, and per q a forward
    with each module's project whose logits agree exactly (the same function on the same
    inputs; off CUDA both run the torch composition)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "gemv_ab.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--tiny", "--baseline", "specbench.kernels.gemv",
                          "--rows", "1,9", "--qs", "1,3", "--rounds", "2"], capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    ab = json.loads((tmp_path / "gemv_ab.json").read_text())
    assert ab["baseline"] == "specbench.kernels.gemv" and len(ab["baseline_sha256"]) == 64
    assert [(r["name"], r["M"]) for r in ab["projections"]] == [
        (name, M) for name in ("wqkv", "wo", "w13", "w2") for M in (1, 9)]
    assert all(len(r["base_us_all"]) == len(r["current_us_all"]) == 2 and r["current_max_rel_err"] < 1e-6
               for r in ab["projections"])
    assert [r["q"] for r in ab["forwards"]] == [1, 3]
    assert all(r["base_ms"] > 0 and r["current_ms"] > 0 and r["max_abs_logit_diff"] == 0 for r in ab["forwards"])


def _kernel_resources(out, *args) -> list:
    """experiments/kernel_resources.py OUT *args, run without TRITON_INTERPRET (the interpreter
    would hand it Python functions) -> its rows."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "kernel_resources.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), str(out), *args], capture_output=True, text=True, timeout=900,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "kernel_resources.json").read_text())["rows"]


def test_kernel_resources_compiles_the_attention_offline(tmp_path):
    """experiments/kernel_resources.py compiles the attention kernel for sm_90 with the installed
    Triton and reads its registers with Triton's cuobjdump: no GPU needed. Without TRITON_INTERPRET
    (the interpreter would hand it Python functions). Its arguments are recorded from
    attention.decode and specialised as Triton's launcher does on a GPU: with the cache's strides
    declared divisible by 16 the prefix loop is software-pipelined (cp.async); compiled without
    that, as this script did until 2026-12-05, it was not, and no K or V load vectorised."""
    rows = _kernel_resources(tmp_path, "--kernels", "attention")
    assert [r["q"] for r in rows] == [1, 9]
    # context 4096 at batch 1: 8 prefix splits (attention.MAX_SPLITS) and the new entries' program,
    # for each of the 8 kv heads
    assert all(0 < r["regs"] <= 255 and r["ctas_per_sm"] >= 1 and r["programs"] == 72 for r in rows), rows
    assert all(r["cp_async"] > 0 for r in rows), rows


def test_rows_kernel_starts_its_pipeline_before_the_norm_pass(tmp_path):
    """Compiled for sm_90 offline (experiments/kernel_resources.py, no GPU): in every rows-kernel
    configuration of the two projections with a norm fold (wqkv; w13 with SwiGLU), the software
    pipeline's first asynchronous copies are the first global loads in the PTX, so that the
    first weight tiles stream in while the norm's rstd is computed (from the squares of the
    projection before, as kernel_resources compiles it: every layer but the first). Before
    2026-12-05 a peeled first step and the pass over x came first: 35 to 89 loads. And the one-row kernel's loop is
    software-pipelined (cp.async) in exactly its LOOP_STAGES configurations."""
    every = _kernel_resources(tmp_path, "--kernels", "gemv", "--projections", "wqkv,w13")
    rows = [r for r in every if r["kernel"] == "gemv_rows"]
    assert {r["projection"] for r in rows} == {"wqkv", "w13"}
    assert all(r["cp_async"] > 0 and r["loads_before_pipeline"] == 0 for r in rows), rows
    one_row = [r for r in every if r["kernel"] == "gemv_vector"]
    assert one_row and any(r.get("LOOP_STAGES") for r in one_row)
    assert all((r["cp_async"] > 0) == bool(r.get("LOOP_STAGES")) for r in one_row), one_row


def test_pdl_applies_to_forwards_of_at_most_max_rows(monkeypatch):
    """kernels/pdl.py: a launch asks for PDL only inside `enabled(True)`, for forwards of at most
    MAX_ROWS tokens (1 unless `enabled` says more), and both come back after the block. The
    device check (CUDA, Hopper) is stubbed true: this CPU has none."""
    pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
    from specbench.kernels import pdl

    cuda = torch.device("cuda")
    monkeypatch.setattr(pdl, "applies", lambda device: pdl.ENABLED)
    assert pdl.launch_options(cuda, 1) == {}
    with pdl.enabled(True):
        assert pdl.launch_options(cuda, 1) == {"launch_pdl": True} and pdl.launch_options(cuda, 2) == {}
    with pdl.enabled(True, rows=16):
        assert pdl.launch_options(cuda, 16) == {"launch_pdl": True} and pdl.launch_options(cuda, 17) == {}
    assert (pdl.ENABLED, pdl.MAX_ROWS) == (False, 1) and pdl.launch_options(cuda, 1) == {}


def test_few_tiles_keeps_one_tile_of_each_kind():
    """tests/conftest.py's few_tiles, which the CUDA tests tune over: the rows tuner with split K
    keeps one unsplit and one split tile; the wide one-row tuner one of each of its four kinds.
    (On a GPU the session's tuners hold these already: few_tiles of few_tiles is the same.)"""
    from conftest import few_tiles

    kinds = lambda configs: sorted((c.kwargs.get("SPLIT_K", 1), c.kwargs.get("LOOP_STAGES", 0),  # noqa: E731
                                    c.kwargs["BLOCK_K"] == 1024) for c in configs)
    assert kinds(few_tiles(gemv._rows_split_kernel.configs)) == [(1, 0, False), (2, 0, False)]
    assert kinds(few_tiles(gemv._vector_wide_kernel.configs)) == [(1, 0, False), (1, 0, True), (1, 3, False),
                                                                  (1, 3, True)]
