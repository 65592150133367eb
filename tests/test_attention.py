"""specbench.kernels.attention: the decode/verify attention kernel against its torch composition,
and that composition against the layer spelled out.

On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), at
about 0.3 s a call, so the shapes are tiny (S <= 100, hd 16 / 32) and block_s=16 stands in for
the default 64 where a test needs several blocks or splits. The caches start random and are
views of an [L, B, Hkv, S, hd] tensor, as in the engine, so a write to a wrong slot, row, head
or layer shows in a torch.equal of the whole tensor.

Dtypes. fp32: o within 1e-5 relative (max abs difference / max abs), caches bit-identical.
fp16: caches bit-identical (RoPE rounds where torch rounds); o within 4e-3 relative: `attend`
rounds its scores to fp16 (|score| up to ~4 here, so ~2e-3 absolute) where the kernel keeps
them in fp32, and both round the probabilities and o to fp16 (2^-11 relative). A second check
holds the kernel at least as close as `reference` to an fp64 truth. bf16 runs on CUDA only:
Triton 3.6's interpreter truncates fp32 -> bf16 casts (no round to nearest even) and its
tl.dot multiplies bf16 operands as their raw uint16 bits, so no bf16 kernel result there can
match anything.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
import triton.language as tl  # noqa: E402

from specbench.kernels import attention  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
L = 2  # cache layers; the tests use layer 1


def chain_ancestors(B: int, q: int) -> torch.Tensor:
    """[B, q, q] bool, expanded (stride 0 over B) as NativeEngine.forward passes a chain's."""
    return torch.ones(q, q, dtype=torch.bool, device=DEVICE).tril().expand(B, q, q)


def tree_ancestors(B: int, q: int, g: torch.Generator) -> torch.Tensor:
    """[B, q, q] bool: per row a random tree over q nodes (node 0 the root, each node's parent
    earlier), ancestors[b, i, j] when j is i or an ancestor of i."""
    out = torch.zeros(B, q, q, dtype=torch.bool)
    for b in range(B):
        for i in range(q):
            if i:
                out[b, i] = out[b, int(torch.randint(0, i, (1,), generator=g))]
            out[b, i, i] = True
    return out.to(DEVICE)


def make_case(B, q, H, Hkv, hd, S, lengths, tree=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, q, (H + 2 * Hkv) * hd, generator=g)
    half = torch.rand(B, q, 1, hd // 2, generator=g) * 8  # angles, as Transformer.forward makes them
    angles = torch.cat([half, half], -1)
    cache_k = torch.randn(L, B, Hkv, S, hd, generator=g)
    cache_v = torch.randn(L, B, Hkv, S, hd, generator=g)
    ancestors = tree_ancestors(B, q, g) if tree else chain_ancestors(B, q)
    to = dict(device=DEVICE, dtype=dtype)
    return dict(qkv=qkv.to(**to), cos=angles.cos().to(**to), sin=angles.sin().to(**to), cache_k=cache_k.to(**to),
                cache_v=cache_v.to(**to), lengths=torch.tensor(lengths, device=DEVICE), ancestors=ancestors,
                heads=H, kv_heads=Hkv)


def run(fn, case, **kw):
    """fn (reference or decode) on fresh copies of the case's caches, at layer 1 -> (o, caches)."""
    cache_k, cache_v = case["cache_k"].clone(), case["cache_v"].clone()
    o = fn(case["qkv"], case["cos"], case["sin"], cache_k[1], cache_v[1], case["lengths"], case["ancestors"],
           case["heads"], case["kv_heads"], **kw)
    return o, cache_k, cache_v


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def brute_mask(lengths, ancestors, S, G) -> torch.Tensor:
    """Transformer.forward's mask, slot by slot."""
    B, q, _ = ancestors.shape
    out = torch.zeros(B, 1, G * q, S, dtype=torch.bool)
    for b in range(B):
        n = int(lengths[b])
        for i in range(q):
            for s in range(S):
                visible = s < n or (s - n < q and bool(ancestors[b, i, s - n]))
                for g in range(G):
                    out[b, 0, g * q + i, s] = visible
    return out


# --- the torch pieces ---------------------------------------------------------------------------


def test_mask_matches_a_slot_by_slot_loop():
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([0, 5, 12, 9])  # 12 + 4 = S: the last slots; 9: one short of them
    ancestors = tree_ancestors(4, 4, g).cpu()
    ancestors[1] = torch.ones(4, 4, dtype=torch.bool).tril()
    got = attention.mask(lengths, ancestors, 16, 3)
    assert got.shape == (4, 1, 12, 16) and got.dtype == torch.bool
    assert torch.equal(got, brute_mask(lengths, ancestors, 16, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_spelled_out(dtype):
    """reference() (what engines/native.py's block runs without the kernel) against the same
    layer spelled out step by step, with the mask by the loop: equal outputs and caches."""
    B, q, H, Hkv, hd, S = 3, 5, 8, 2, 16, 24
    case = make_case(B, q, H, Hkv, hd, S, [0, 7, S - q], tree=True, dtype=dtype)
    case = {k: v.cpu() if torch.is_tensor(v) else v for k, v in case.items()}
    G = H // Hkv
    mask = brute_mask(case["lengths"], case["ancestors"], S, G)

    cache_k, cache_v = case["cache_k"].clone(), case["cache_v"].clone()
    rows = torch.arange(B)[:, None]
    slots = (case["lengths"][:, None] + torch.arange(q)).clamp(max=S - 1)
    xq, xk, xv = case["qkv"].split([H * hd, Hkv * hd, Hkv * hd], -1)
    xq = attention.rotate(xq.view(B, q, H, hd), case["cos"], case["sin"])
    xk = attention.rotate(xk.view(B, q, Hkv, hd), case["cos"], case["sin"])
    cache_k[1][rows, :, slots] = xk
    cache_v[1][rows, :, slots] = xv.view(B, q, Hkv, hd)
    xq = xq.view(B, q, Hkv, G, hd).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * q, hd)
    o = attention.attend(xq, cache_k[1], cache_v[1], mask)
    o = o.view(B, Hkv, G, q, hd).permute(0, 3, 1, 2, 4).reshape(B, q, H * hd)

    places = attention.places(case["lengths"], q, S)
    assert torch.equal(places[0], rows) and torch.equal(places[1], slots)
    for given, where in ((None, None), (mask, None), (mask, places)):
        got, got_k, got_v = run(attention.reference, case, mask=given, places=where)
        assert torch.equal(got, o) and torch.equal(got_k, cache_k) and torch.equal(got_v, cache_v)


# --- the kernel against the reference -----------------------------------------------------------

# (B, q, G, Hkv, hd, S, lengths, tree, overrides): lengths take in 0 and lengths + q == S; no S is
# a multiple of a block; the overrides force one split, several, and several row tiles.
CASES = {
    "decode-one": (1, 1, 1, 2, 16, 37, [20], False, {}),
    "chain-splits": (3, 4, 4, 2, 32, 50, [0, 17, 46], False, {"splits": 3, "block_s": 16, "min_blocks": 1}),
    "tree-one-split": (3, 9, 1, 2, 16, 45, [36, 0, 13], True, {"splits": 1, "block_s": 16}),
    "tree-tiles": (1, 9, 4, 1, 32, 70, [61], True, {"splits": 4, "block_s": 16, "block_m": 16, "min_blocks": 1}),
    "tree-heuristic": (3, 4, 4, 1, 16, 100, [96, 0, 70], True, {}),
    "chain-more-splits-than-blocks-used": (3, 9, 1, 1, 16, 60, [2, 51, 30], False,
                                           {"splits": 4, "block_s": 16, "min_blocks": 1}),
    "tree-wide": (1, 33, 8, 1, 16, 90, [57], True, {}),  # 264 query rows: 5 tiles of 64, BLOCK_Q 64
    # 5 and 3 splits ran; the merge folds 4 a step (BLOCK_M 16): a full step and a masked one
    "decode-merge-splits": (2, 1, 4, 2, 16, 140, [130, 40], False, {"splits": 7, "block_s": 16, "min_blocks": 1}),
    "decode-merge-one-a-step": (2, 1, 4, 2, 16, 140, [130, 40], False,
                                {"splits": 7, "block_s": 16, "min_blocks": 1, "unroll": 1}),
    "decode-merge-three-a-step": (2, 1, 4, 2, 16, 140, [130, 40], False,
                                  {"splits": 7, "block_s": 16, "min_blocks": 1, "unroll": 3}),
    # at least 2 blocks a split: 5 splits launched (140 slots), 5 and 2 ran
    "decode-min-blocks": (2, 1, 4, 2, 16, 140, [130, 40], False, {"block_s": 16}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_matches_reference_fp32(name):
    B, q, G, Hkv, hd, S, lengths, tree, kw = CASES[name]
    case = make_case(B, q, G * Hkv, Hkv, hd, S, lengths, tree)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    o, k, v = run(attention.decode, case, **kw)
    assert o.shape == (B, q, G * Hkv * hd) and o.dtype == torch.float32
    assert relative(o, o_ref) < 1e-5, relative(o, o_ref)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_decode_reads_only_the_prefix_and_its_own_inputs():
    """Slots from a row's length on hold inf before the call: the kernel must read neither the
    slots past its new entries nor the new entries' own slots (it takes them from qkv), or o
    turns inf / nan. It overwrites exactly the new entries' slots."""
    B, q, S = 2, 4, 40
    case = make_case(B, q, 8, 2, 16, S, [5, 20], tree=True)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    for row, n in enumerate((5, 20)):
        for cache, ref in ((case["cache_k"], k_ref), (case["cache_v"], v_ref)):
            cache[:, row, :, n:] = float("inf")
            ref[1, row, :, n + q :] = float("inf")
            ref[0, row, :, n:] = float("inf")
    o, k, v = run(attention.decode, case, splits=2, block_s=16, min_blocks=1)
    assert torch.isfinite(o).all() and relative(o, o_ref) < 1e-5
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_decode_past_the_cache_end():
    """lengths + q > S: slots clamp to S - 1. Inputs that fit (length + i < S - 1) attend as in
    the reference; the last slot holds the last input's k and v; nothing is written past S."""
    B, q, H, Hkv, hd, S = 2, 6, 4, 2, 16, 30
    case = make_case(B, q, H, Hkv, hd, S, [27, 4], tree=True)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    o, k, v = run(attention.decode, case, splits=2, block_s=16, min_blocks=1)
    assert relative(o[0, : S - 1 - 27], o_ref[0, : S - 1 - 27]) < 1e-5 and relative(o[1], o_ref[1]) < 1e-5
    assert torch.equal(k[..., : S - 1, :], k_ref[..., : S - 1, :]) and torch.equal(v[..., : S - 1, :], v_ref[..., : S - 1, :])
    xk = case["qkv"][0, q - 1, H * hd : (H + Hkv) * hd].view(1, 1, Hkv, hd)
    last_k = attention.rotate(xk, case["cos"][:1, q - 1 : q], case["sin"][:1, q - 1 : q])[0, 0]
    assert torch.equal(k[1, 0, :, S - 1], last_k)
    assert torch.equal(v[1, 0, :, S - 1], case["qkv"][0, q - 1, (H + Hkv) * hd :].view(Hkv, hd))
    assert torch.equal(k[1, 1], k_ref[1, 1]) and torch.equal(k[0], case["cache_k"][0])


def test_decode_fp16_caches_bit_identical_and_o_close():
    B, q, G, Hkv, hd, S = 3, 4, 4, 2, 32, 50
    case = make_case(B, q, G * Hkv, Hkv, hd, S, [0, 17, 46], tree=True, dtype=torch.float16)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    o, k, v = run(attention.decode, case, splits=3, block_s=16, min_blocks=1)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert relative(o, o_ref) < 4e-3, relative(o, o_ref)
    # fp64 attention over the same fp16 q (rotated and rounded as both do) and the same caches
    H = G * Hkv
    xq = attention.rotate(case["qkv"][..., : H * hd].view(B, q, H, hd), case["cos"], case["sin"]).double()
    xq = xq.view(B, q, Hkv, G, hd).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * q, hd)
    mask = attention.mask(case["lengths"], case["ancestors"], S, G)
    truth = attention.attend(xq, k_ref[1].double(), v_ref[1].double(), mask)
    truth = truth.view(B, Hkv, G, q, hd).permute(0, 3, 1, 2, 4).reshape(B, q, H * hd)
    assert relative(o, truth) <= 1.25 * relative(o_ref, truth), (relative(o, truth), relative(o_ref, truth))


@pytest.mark.skipif(not CUDA, reason="bf16: Triton's interpreter truncates bf16 casts and tl.dot reads bf16 as raw bits")
def test_decode_bf16_caches_bit_identical_and_o_close():
    B, q, G, Hkv, hd, S = 3, 9, 4, 2, 128, 300
    case = make_case(B, q, G * Hkv, Hkv, hd, S, [0, 120, S - q], tree=True, dtype=torch.bfloat16)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    o, k, v = run(attention.decode, case)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert relative(o, o_ref) < 3e-2, relative(o, o_ref)  # bf16 scores in attend: 2^-8 relative


@triton.jit
def _round_kernel(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(y_ptr + r, attention._round(tl.load(x_ptr + r), tl.bfloat16))


def test_bf16_rounding_in_integers_is_torchs():
    """The kernel's RoPE rounds its bf16 products in integer arithmetic (no FMA contraction can
    reach it under torch.compile): against torch's fp32 -> bf16 cast on random values of every
    magnitude and sign, and on the ties, which go to the even neighbour."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-40, 40, (4096,), generator=g).float())
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-100 * (1 + 2**-8), 0.0, -0.0])
    x[: len(ties)] = ties
    x, y = x.to(DEVICE), torch.empty(4096, device=DEVICE)
    _round_kernel[(1,)](x, y, N=4096)
    assert torch.equal(y.view(torch.int32), x.bfloat16().float().view(torch.int32))


# --- launch contract ------------------------------------------------------------------------------


def test_launch_shape_depends_on_shapes_only():
    # Llama-3.1-8B at batch 1, one input: 8 programs before splitting; one per SM would be 17
    # splits, MAX_SPLITS (8) caps them
    assert attention.launch_shape(1, 1, 4097, 8, 4, 128, 132) == (8, 16, 64, 1)
    assert attention.launch_shape(1, 1, 4097, 8, 4, 128, 132, max_splits=64) == (17, 16, 64, 1)
    assert attention.launch_shape(8, 9, 4097, 8, 4, 128, 132) == (3, 64, 64, 1)  # 64 programs a split
    assert attention.launch_shape(64, 1, 4097, 8, 4, 128, 132) == (1, 16, 64, 1)
    # no more splits than the cache has chunks of MIN_BLOCKS (2) blocks: 522 slots, 5 of 128
    assert attention.launch_shape(1, 1, 522, 8, 4, 128, 132) == (5, 16, 64, 1)
    assert attention.launch_shape(1, 1, 522, 8, 4, 128, 132, min_blocks=1) == (8, 16, 64, 1)
    assert attention.launch_shape(1, 33, 100, 8, 8, 128, 132, min_blocks=1, block_m=64) == (2, 64, 64, 5)
    assert attention.launch_shape(1, 33, 100, 8, 8, 128, 132) == (1, 16, 64, 17)  # a short cache
    assert attention.launch_shape(1, 33, 100, 8, 8, 128, 132, block_m=64) == (1, 64, 64, 5)
    assert attention.launch_shape(1, 1, 4097, 8, 4, 256, 132)[2] == 32
    # query rows: 9 positions of the 8B shape are 36 rows a kv head. A short cache (at most
    # SHORT_CACHE keys) tiles them by 16, a longer one in one 64-row tile
    assert attention.launch_shape(1, 9, 536, 8, 4, 128, 132) == (5, 16, 64, 3)
    assert attention.launch_shape(1, 33, 560, 8, 4, 128, 132) == (2, 16, 64, 9)
    assert attention.launch_shape(1, 9, 4120, 8, 4, 128, 132) == (8, 64, 64, 1)
    assert attention.launch_shape(8, 9, 536, 8, 4, 128, 132) == (3, 64, 64, 1)
    assert attention.launch_shape(1, 9, attention.SHORT_CACHE // 1024 + 1, 8, 4, 128, 132)[1] == 64
    assert attention.launch_shape(1, 9, attention.SHORT_CACHE // 1024, 8, 4, 128, 132)[1] == 16
    assert attention.launch_shape(2, 4, 999, 2, 4, 64, 132, splits=5, block_m=32, block_s=16) == (5, 32, 16, 1)


def test_supported():
    qkv = torch.zeros(1, 2, 6 * 16, device=DEVICE)
    cache = torch.zeros(1, 2, 8, 16, device=DEVICE)
    assert attention.supported(qkv, cache, cache)
    assert not attention.supported(torch.zeros(1, 2, 6 * 24, device=DEVICE), torch.zeros(1, 2, 8, 24, device=DEVICE))
    assert not attention.supported(torch.zeros(1, 2, 6 * 8, device=DEVICE), torch.zeros(1, 2, 8, 8, device=DEVICE))
    assert not attention.supported(qkv.double(), cache.double())
    assert not attention.supported(qkv, cache, cache.half())


@pytest.mark.skipif(not CUDA, reason="torch.compile traces the interpreter's Python, not a Triton kernel, on CPU")
def test_decode_compiles_fullgraph_and_replays_in_a_cuda_graph():
    case = make_case(2, 4, 8, 2, 64, 500, [100, 300], tree=True, dtype=torch.bfloat16)
    compiled = torch.compile(attention.decode, fullgraph=True)
    o_ref, k_ref, v_ref = run(attention.reference, case)
    o, k, v = run(compiled, case)
    differ = [int((k != k_ref).sum()), int((v != v_ref).sum())]
    assert differ == [0, 0] and relative(o, o_ref) < 3e-2, (differ, relative(o, o_ref))
    cache_k, cache_v = case["cache_k"].clone(), case["cache_v"].clone()
    args = lambda: (case["qkv"], case["cos"], case["sin"], cache_k[1], cache_v[1], case["lengths"],  # noqa: E731
                    case["ancestors"], 8, 2)
    attention.decode(*args())  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.decode(*args())
    case["lengths"].copy_(torch.tensor([0, 450], device=DEVICE))  # new lengths, same graph
    cache_k.copy_(case["cache_k"])
    cache_v.copy_(case["cache_v"])
    graph.replay()
    o_ref, k_ref, v_ref = run(attention.reference, case)
    assert torch.equal(cache_k, k_ref) and torch.equal(cache_v, v_ref) and relative(out, o_ref) < 3e-2
