"""The attention of a decode or verify step in one kernel: RoPE, the KV-cache write, attention.

After a layer's qkv projection, engines/native.py's `block` splits qkv, rotates q and k (RoPE),
writes k and v into the static cache at slots length .. length + q - 1 of each row, and attends
over the cache through a boolean mask: about ten small kernels per layer. `decode` does the
same in one launch, beside `reference`, the torch composition it replaces (with `rotate`,
`attend` and `mask` as native uses them):

    qkv       [B, q, (H + 2 Hkv) hd]  the projection's output: H query heads, Hkv key heads, Hkv value heads
    cos, sin  [B, q, 1, hd]           RoPE tables in the model dtype (already scaled)
    k_cache   [B, Hkv, S, hd]         one layer's cache (a view of [L, B, Hkv, S, hd]), written in place
    v_cache   [B, Hkv, S, hd]
    lengths   [B] int64               the entries each row holds before this step
    ancestors [B, q, q] bool or int8  which new inputs each input sees (diagonal set; tril for a chain)
    -> o      [B, q, H hd]            attention output, heads in order (head = kv_head * G + g)

Input i of row b sees the row's cache prefix [0, lengths[b]) and the new inputs j with
ancestors[b, i, j]. The q query heads that share a key/value head are one set of G q rows
(query head g, position i: row g q + i, native's order), so K and V are read once per kv head.

The kernel (`_partials`), grid (SPLITS + 1, tiles, B Hkv): flash decoding. Programs 0 .. SPLITS-1
of a (row, kv head, row tile) split the prefix [0, length) into chunks of whole BLOCK_S blocks,
at least MIN_BLOCKS of them, sized from the row's length inside the kernel: the grid depends on
shapes only (the call is captured in a CUDA graph) while short rows still spread over several
splits; the `ran` splits that hold a chunk work, the others return at once. Program SPLITS takes
the q new entries: it rotates their keys in registers, attends to them through `ancestors`, and
(row tile 0 only) writes k and v into the cache. The new entries are never read back from the
cache, and prefix programs read only slots below the length, so the write races with no read.
Each program keeps an online-softmax state (running max, sum, acc [BLOCK_M, hd]) in fp32 and
stores it as a partial, then counts itself done on an int32 of its (row, kv head, row tile);
the program that counts last (the ran + 1-th) merges the tile's partials into o, in o's
[B, q, H hd] layout, and zeroes the count. A second kernel (`_combine`) merged until
2026-12-04: on an H200 it took 7.8 us a layer in a 9-position verify forward at context 512
(results/2026-12-03-h200-night), more than the attention itself.

The merge is one online pass over the partials (the new entries', then the splits in order),
`merge_unroll` partials a step so that their loads are in flight together. Loading every
split's maxima at once and the accumulators four splits a load ([4, 16, hd] fp32) measured
slower (results/2026-12-04-h200-afternoon: 16.5 us a layer at one token against 8.9). How many
splits: kernel_bench's attention_tune on an H200 (results/2026-12-04-h200-evening) at batch 1,
one token, context 512: 13.3 us a call with 4 splits of 2 blocks against 14.0 with 8 of one;
context 4096: 19.8 with 8 splits against 26.3 with 32 (launch, L2 flush and events included).

Rounding as in torch: RoPE rounds x cos, rot sin and their sum to the dtype, so the cache gets
the reference's bits (compiled without FMA contraction for the same reason, and for bf16 the
products rounded in integer arithmetic, which no compiler contracts); scores are
fp32, scaled by hd^-0.5 (folded with log2 e for exp2); probabilities are cast to the value dtype
before the P V product, as `attend` does. Only the order of the fp32 sums and the online
softmax differ, and `attend` rounds its scores to a 16-bit dtype where the kernel does not.

Slots past the cache (lengths[b] + j >= S) are clamped to S - 1 as in the reference; the kernel
writes only the last such input there (as torch's CPU index_put does; CUDA leaves the winner
unspecified) and no input sees an input that did not fit, so outputs at such positions are
unspecified. lengths[b] <= S - 1 is assumed (the engine keeps a spare slot).

Under TRITON_INTERPRET=1 (CPU tests) the two loops whose bounds come from the lengths run as
while loops (COMPILED=False): the interpreter's range() cannot take a tensor bound with numpy 2.
Compiled, they are for loops, which Triton software-pipelines. The interpreter also cannot do
bf16 (it truncates casts to bf16 and multiplies bf16 dot operands as raw bits): fp16 and fp32
are what it checks; bf16 is checked on CUDA.

Letters: B rows (requests), q new inputs per row, S cache slots, H query heads, Hkv key/value
heads, G = H / Hkv, hd head size; M = G q query rows per kv head.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

try:
    import triton
    import triton.language as tl

    from .pdl import launch_options, wait_and_release
except ImportError:  # CPU installs without triton: `reference` still runs
    triton = None

LOG2E = 1.4426950408889634
SMS_CPU = 132  # what the launch heuristic assumes off CUDA (an H200's SM count)
# The prefix splits: about one program per SM, at most MAX_SPLITS, each at least MIN_BLOCKS
# BLOCK_S blocks long, so that a short prefix runs in fewer splits and the merge folds fewer
# partials. From kernel_bench's attention_tune on an H200 (results/2026-12-04-h200-evening).
MAX_SPLITS = 8
MIN_BLOCKS = 2
# A cache of at most this many keys (B S Hkv hd elements: K and V 8 MB in a 16-bit dtype) is
# short: its query rows tile by 16, each tile reading all of K and V again, from L2 mostly
# (50 MB on an H100). 16-row tiles run shorter programs and more of them. On an H100, the 8B
# shape at batch 1 (results/2026-12-07-h100-attention-tiles): at context 512 (0.57 M keys) one
# layer's call at 9 positions took 15.9 us with 16-row tiles against 17.7 with one 64-row
# tile, and the verify forward was 0.04 to 0.21 ms faster at 5 to 16 positions, 0.21 to 0.31
# ms at 17 to 33; at context 4096 (4.2 M keys, 17 MB of K and V a tile) a call at 9 positions
# took 27.9 us against 27.3, the forward 0.04 ms slower. Between the two, and batches above 1
# under the bound (SmolLM2-135M's up to 10922 slots in all), not measured.
SHORT_CACHE = 1 << 21
_SMS: dict = {}  # device index -> SM count


# --- the torch composition (engines/native.py's block) ----------------------------------------


# A KV cache's slots per row (S) are a multiple of this: engines/native.py's and specbench/heads.py's
# caches. The torch composition attends over every slot, masked, and its scores [.., S] are an
# operand of the product with V: with S odd, cuBLAS on an H100 ran that product with unaligned
# (align1) CUTLASS kernels, 16.5 us a layer, 36 % of a SmolLM2-135M decode step's kernel time
# (results/2026-12-05-h100-evening). Eight bf16 slots make a row of scores 16 bytes, as aligned
# kernels need.
SLOT_ALIGN = 8


def aligned_slots(n: int) -> int:
    """n slots rounded up to a multiple of SLOT_ALIGN: 641 -> 648."""
    return -(-n // SLOT_ALIGN) * SLOT_ALIGN


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, q, heads, hd]; cos, sin: [B, q, 1, hd] (halves rotated, as in Llama)."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attend(xq: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention for a few query rows over a long cache: two batched matrix products and a
    softmax in fp32 (as transformers' eager attention). At decode shapes this spreads the
    cache over the whole GPU where a fused kernel runs one block per (request, head).
    xq: [B, Hkv, G*q, hd]; k, v: [B, Hkv, S, hd]; mask: [B, 1, G*q, S] bool -> [B, Hkv, G*q, hd]."""
    scores = torch.matmul(xq, k.transpose(-1, -2)) * xq.shape[-1] ** -0.5  # [B, Hkv, G*q, S]
    weights = scores.float().masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype)
    return torch.matmul(weights, v)


def mask(lengths: torch.Tensor, ancestors: torch.Tensor, S: int, G: int) -> torch.Tensor:
    """lengths [B], ancestors [B, q, q] bool -> [B, 1, G*q, S] bool: input i of row b sees slot s
    when s < lengths[b], or s = lengths[b] + j (j < q) with ancestors[b, i, j]; the same for the
    G query heads of a kv head (rows in [G, q] order)."""
    B, q, _ = ancestors.shape
    rel = torch.arange(S, device=lengths.device) - lengths[:, None, None]  # [B, 1, S] slot - length
    inside = (rel >= 0) & (rel < q)
    seen = ancestors.gather(2, rel.clamp(0, q - 1).expand(B, q, S)) & inside  # [B, q, S]
    visible = (rel < 0) | seen
    return visible[:, None, None].expand(B, 1, G, q, S).reshape(B, 1, G * q, S)


def places(lengths: torch.Tensor, q: int, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the q new entries of each row go: rows [B, 1] and slots [B, q] = lengths + j,
    clamped to the last slot S - 1 (the index pair of reference's cache write)."""
    rows = torch.arange(lengths.shape[0], device=lengths.device)[:, None]  # [B, 1]
    slots = (lengths[:, None] + torch.arange(q, device=lengths.device)).clamp(max=S - 1)  # [B, q]
    return rows, slots


_mask, _places = mask, places  # reference() takes precomputed ones under the same names


def reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, lengths: torch.Tensor, ancestors: torch.Tensor, heads: int,
              kv_heads: int, mask: Optional[torch.Tensor] = None, attend: Callable = attend,
              places: Optional[tuple] = None) -> torch.Tensor:
    """decode() in torch, as native's block does it: -> o [B, q, heads*hd]; writes the caches.
    mask: [B, 1, G*q, S] bool as `mask` builds it, and places: (rows, slots) as `places` builds
    them, or None to build them here (native builds both once per forward, not per layer);
    attend: `attend`, or a function of the same signature (native's sdpa one)."""
    B, q, _ = qkv.shape
    S, hd = k_cache.shape[2], k_cache.shape[3]
    G = heads // kv_heads
    if mask is None:
        mask = _mask(lengths, ancestors, S, G)
    rows, slots = places if places is not None else _places(lengths, q, S)
    xq, xk, xv = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], -1)
    xq = rotate(xq.view(B, q, heads, hd), cos, sin)
    xk = rotate(xk.view(B, q, kv_heads, hd), cos, sin)
    k_cache[rows, :, slots] = xk  # advanced indices first: the value is [B, q, Hkv, hd]
    v_cache[rows, :, slots] = xv.view(B, q, kv_heads, hd)
    xq = xq.view(B, q, kv_heads, G, hd).permute(0, 2, 3, 1, 4).reshape(B, kv_heads, G * q, hd)
    o = attend(xq, k_cache, v_cache, mask)  # [B, Hkv, G*q, hd]
    return o.view(B, kv_heads, G, q, hd).permute(0, 3, 1, 2, 4).reshape(B, q, heads * hd)


# --- the kernels ------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _rope(x_ptr, x_off, cos_ptr, sin_ptr, cs_off, ok, HD: tl.constexpr):
        # x_off: [R, 1] offset of a head's element 0 in qkv; cs_off: [R, 1] of its position's cos
        # row; ok: [R, 1] -> [R, HD] rotated in x's dtype, rounded where torch rounds.
        rd = tl.arange(0, HD)[None, :]  # [1, HD]
        partner = (rd + HD // 2) % HD  # the other half: rot = cat(-x2, x1)
        x = tl.load(x_ptr + x_off + rd, mask=ok, other=0.0)
        xp = tl.load(x_ptr + x_off + partner, mask=ok, other=0.0).to(tl.float32)
        rot = tl.where(rd < HD // 2, -xp, xp)
        c = tl.load(cos_ptr + cs_off + rd, mask=ok, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + cs_off + rd, mask=ok, other=0.0).to(tl.float32)
        dtype = x.dtype
        a = _round(x.to(tl.float32) * c, dtype)
        b = _round(rot * s, dtype)
        return (a + b).to(dtype)

    @triton.jit
    def _round(x, dtype: tl.constexpr):
        # x: fp32 -> x rounded to dtype, as fp32. bf16 in integer arithmetic (to nearest even
        # on the top 16 bits; x finite): no float op between the product and the sum that a
        # compiler could contract into an FMA, enable_fp_fusion or not (torch.compile cannot
        # pass that option), so the keys are torch's bits under torch.compile too.
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(dtype).to(tl.float32)

    @triton.jit
    def _prefix_block(xq, k_row, v_row, start, hi, s_ks, s_vs, m_i, l_i, acc, QK_SCALE: tl.constexpr,
                      HD: tl.constexpr, BLOCK_S: tl.constexpr, PRECISION: tl.constexpr):
        # One online-softmax step over cache slots [start, start + BLOCK_S) below hi. xq:
        # [BLOCK_M, HD]; k_row, v_row: slot 0 of the (row, kv head); m_i, l_i: [BLOCK_M]; acc:
        # [BLOCK_M, HD] fp32. m_i stays finite: slot `start` is visible to every row.
        rd = tl.arange(0, HD)
        slot = start + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        s_ok = slot < hi
        k = tl.load(k_row + slot[:, None] * s_ks + rd[None, :], mask=s_ok[:, None], other=0.0)
        sc = tl.dot(xq, tl.trans(k), input_precision=PRECISION) * QK_SCALE  # [BLOCK_M, BLOCK_S]
        sc = tl.where(s_ok[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        v = tl.load(v_row + slot[:, None] * s_vs + rd[None, :], mask=s_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i * alpha + tl.sum(p, 1), acc

    @triton.jit
    def _partials(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, len_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr,
                  cnt_ptr, o_ptr, s_qb, s_qi, s_cb, s_ci, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ab, s_ai,
                  s_aj, s_ob, s_oi, S, QK_SCALE: tl.constexpr,
                  Q: tl.constexpr, G: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                  SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_Q: tl.constexpr,
                  MIN_BLOCKS: tl.constexpr, UNROLL: tl.constexpr, PRECISION: tl.constexpr, COMPILED: tl.constexpr,
                  PDL: tl.constexpr):
        # qkv: [B, Q, (H + 2 HKV) HD]; cos, sin: [B, Q, 1, HD]; k, v: [B, HKV, S, HD] (last dims
        # contiguous); len: [B] int64; anc: [B, Q, Q] int8; m, l: [B HKV, SPLITS + 1, M] fp32;
        # acc: [B HKV, SPLITS + 1, M, HD] fp32; cnt: [B HKV tiles] int32, zero; o: [B, Q, H HD].
        # Scores are in log2 units (QK_SCALE has log2 e).
        # QK_SCALE is a compile-time constant: under torch.compile a float argument arrives as
        # fp64, and would make the scores and the loop-carried max fp64.
        wait_and_release(PDL)  # qkv is the previous kernel's output
        split = tl.program_id(0)
        tile = tl.program_id(1)
        bh = tl.program_id(2)
        b = (bh // HKV).to(tl.int64)
        kvh = (bh % HKV).to(tl.int64)
        length = tl.minimum(tl.load(len_ptr + b), S).to(tl.int32)
        per, ran = _chunks(length, SPLITS, BLOCK_S, MIN_BLOCKS)
        if (split == SPLITS) | (split < ran):  # a split past the prefix neither works nor counts
            _program(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr, o_ptr,
                     s_qb, s_qi, s_cb, s_ci, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ab, s_ai, s_aj, s_ob, s_oi, S,
                     split, tile, bh, b, kvh, length, per, ran, QK_SCALE, Q, G, H, HKV, HD, SPLITS, BLOCK_M,
                     BLOCK_S, BLOCK_Q, UNROLL, PRECISION, COMPILED)

    @triton.jit
    def _chunks(length, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, MIN_BLOCKS: tl.constexpr):
        # The prefix [0, length) in chunks of `per` slots (whole BLOCK_S blocks, at least MIN_BLOCKS
        # of them), one per split: -> (per, ran), ran the splits with work (0 when length is 0).
        per = tl.maximum(tl.cdiv(tl.cdiv(length, BLOCK_S), SPLITS), MIN_BLOCKS) * BLOCK_S
        return per, tl.cdiv(length, per)

    @triton.jit
    def _program(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr, o_ptr,
                 s_qb, s_qi, s_cb, s_ci, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ab, s_ai, s_aj, s_ob, s_oi, S,
                 split, tile, bh, b, kvh, length, per, ran, QK_SCALE: tl.constexpr, Q: tl.constexpr,
                 G: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, SPLITS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_Q: tl.constexpr, UNROLL: tl.constexpr,
                 PRECISION: tl.constexpr, COMPILED: tl.constexpr):
        # One program of _partials that has work: prefix split `split` < ran (slots [split per,
        # (split + 1) per) below the length), or the new entries (split == SPLITS).
        M: tl.constexpr = G * Q
        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows g * Q + i
        r_ok = r < M
        i = r % Q
        head = kvh * G + r // Q
        rd = tl.arange(0, HD)
        xq = _rope(qkv_ptr, b * s_qb + i[:, None] * s_qi + head[:, None] * HD, cos_ptr, sin_ptr,
                   b * s_cb + i[:, None] * s_ci, r_ok[:, None], HD)  # [BLOCK_M, HD]
        part = (bh * (SPLITS + 1) + split).to(tl.int64) * M + r  # [BLOCK_M] partial row index
        if split < SPLITS:
            # Prefix chunk [lo, hi), not empty (split < ran)
            lo = split * per
            hi = tl.minimum(lo + per, length)
            k_row = k_ptr + b * s_kb + kvh * s_kh
            v_row = v_ptr + b * s_vb + kvh * s_vh
            m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            l_i = tl.zeros((BLOCK_M,), tl.float32)
            acc = tl.zeros((BLOCK_M, HD), tl.float32)
            if COMPILED:  # a for loop: software-pipelined
                for start in range(lo, hi, BLOCK_S):
                    m_i, l_i, acc = _prefix_block(xq, k_row, v_row, start, hi, s_ks, s_vs, m_i, l_i, acc,
                                                  QK_SCALE, HD, BLOCK_S, PRECISION)
            else:  # the interpreter's range() takes no tensor bounds (numpy >= 2)
                start = lo
                while start < hi:
                    m_i, l_i, acc = _prefix_block(xq, k_row, v_row, start, hi, s_ks, s_vs, m_i, l_i, acc,
                                                  QK_SCALE, HD, BLOCK_S, PRECISION)
                    start += BLOCK_S
            tl.store(m_ptr + part, m_i, mask=r_ok)
            tl.store(l_ptr + part, l_i, mask=r_ok)
            tl.store(acc_ptr + part[:, None] * HD + rd[None, :], acc, mask=r_ok[:, None])
        else:
            # The Q new entries, from qkv: input j fits when length + j < S.
            j = tl.arange(0, BLOCK_Q)  # [BLOCK_Q]
            j_in = j < Q
            fits = j_in & (length + j < S)
            k_new = _rope(qkv_ptr, b * s_qb + j[:, None] * s_qi + (H + kvh) * HD, cos_ptr, sin_ptr,
                          b * s_cb + j[:, None] * s_ci, j_in[:, None], HD)  # [BLOCK_Q, HD]
            v_new = tl.load(qkv_ptr + b * s_qb + j[:, None] * s_qi + (H + HKV + kvh) * HD + rd[None, :],
                            mask=j_in[:, None], other=0.0)  # [BLOCK_Q, HD]
            sees = tl.load(anc_ptr + b * s_ab + i[:, None] * s_ai + j[None, :] * s_aj,
                           mask=r_ok[:, None] & fits[None, :], other=0) != 0  # [BLOCK_M, BLOCK_Q]
            sc = tl.dot(xq, tl.trans(k_new), input_precision=PRECISION) * QK_SCALE
            sc = tl.where(sees, sc, float("-inf"))
            m_i = tl.max(sc, 1)  # -inf for a row that sees nothing new (padding, or past the cache)
            p = tl.exp2(sc - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
            acc = tl.dot(p.to(v_new.dtype), v_new, input_precision=PRECISION)  # [BLOCK_M, HD]
            tl.store(m_ptr + part, m_i, mask=r_ok)
            tl.store(l_ptr + part, tl.sum(p, 1), mask=r_ok)
            tl.store(acc_ptr + part[:, None] * HD + rd[None, :], acc, mask=r_ok[:, None])
            if tile == 0:
                # Slots clamp to S - 1 as in the reference; of the inputs clamped there only the
                # last one writes, so no two stores of this program hit one slot.
                slot = tl.minimum(length + j, S - 1)
                w_ok = (j_in & ((j == Q - 1) | (length + j < S - 1)))[:, None]
                tl.store(k_ptr + b * s_kb + kvh * s_kh + slot[:, None] * s_ks + rd[None, :], k_new, mask=w_ok)
                tl.store(v_ptr + b * s_vb + kvh * s_vh + slot[:, None] * s_vs + rd[None, :], v_new, mask=w_ok)
        # The last of the ran + 1 programs with work of this (row tile, row, kv head) to finish
        # merges their partials into o and sets the count back to zero for the next call. The
        # barrier puts every thread's stores before the count's release; the merge's loads
        # bypass L1.
        tl.debug_barrier()
        count = cnt_ptr + bh * tl.num_programs(1) + tile
        if tl.atomic_add(count, 1, sem="acq_rel") == ran:
            tl.atomic_xchg(count, 0)
            _merge(m_ptr, l_ptr, acc_ptr, o_ptr, (bh * (SPLITS + 1)).to(tl.int64) * M + r, r_ok,
                   ran, b * s_ob + i[:, None] * s_oi + head[:, None] * HD + rd[None, :],
                   M, HD, SPLITS, UNROLL, COMPILED)

    @triton.jit
    def _fold(m_ptr, l_ptr, acc_ptr, part, ok, top, den, num, HD: tl.constexpr):
        # Folds the partial at rows `part` [BLOCK_M] (where ok) into the running (top, den, num):
        # the online softmax's rescale, as a prefix block does it.
        rd = tl.arange(0, HD)
        m = tl.load(m_ptr + part, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(l_ptr + part, mask=ok, other=0.0, cache_modifier=".cg")  # noqa: E741
        acc = tl.load(acc_ptr + part[:, None] * HD + rd[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        new_top = tl.maximum(top, m)
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)  # -inf: nothing seen yet, weights 0
        old_w, w = tl.exp2(top - safe), tl.exp2(m - safe)
        return new_top, den * old_w + l * w, num * old_w[:, None] + acc * w[:, None]

    @triton.jit
    def _merge(m_ptr, l_ptr, acc_ptr, o_ptr, row0, r_ok, ran, o_off, M: tl.constexpr, HD: tl.constexpr,
               SPLITS: tl.constexpr, UNROLL: tl.constexpr, COMPILED: tl.constexpr):
        # Merges the partials of query rows row0 [BLOCK_M] (split 0's partial rows; r_ok: real
        # rows) into o at offsets o_off [BLOCK_M, HD]: the new entries' partial, then the `ran`
        # prefix splits in order, in one pass. UNROLL splits a step: their loads depend on no
        # fold, so they are in flight together (the fold's arithmetic is in registers).
        new = row0 + SPLITS * M
        lane = tl.zeros(r_ok.shape, tl.int32)  # s < ran as a block: the interpreter's & takes no scalar
        top = tl.full(row0.shape, float("-inf"), tl.float32)
        top, den, num = _fold(m_ptr, l_ptr, acc_ptr, new, r_ok, top, tl.zeros(top.shape, tl.float32),
                              tl.zeros((top.shape[0], HD), tl.float32), HD)
        if COMPILED:
            for s0 in range(0, ran, UNROLL):
                for u in tl.static_range(UNROLL):
                    live = r_ok & (lane + s0 + u < ran)
                    top, den, num = _fold(m_ptr, l_ptr, acc_ptr, row0 + (s0 + u) * M, live, top, den, num, HD)
        else:  # the interpreter's range() takes no tensor bounds
            s0 = 0
            while s0 < ran:
                for u in tl.static_range(UNROLL):
                    live = r_ok & (lane + s0 + u < ran)
                    top, den, num = _fold(m_ptr, l_ptr, acc_ptr, row0 + (s0 + u) * M, live, top, den, num, HD)
                s0 += UNROLL
        o = num / tl.where(den > 0, den, 1.0)[:, None]  # [BLOCK_M, HD]
        tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])

    INTERPRETED = not isinstance(_partials, triton.runtime.JITFunction)  # TRITON_INTERPRET=1 at import
else:
    INTERPRETED = False


def supported(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor] = None) -> bool:
    """The kernel's domain: triton, CUDA tensors (any device when TRITON_INTERPRET=1 was set before
    triton was imported), hd a power
    of two >= 16, fp16 / bf16 / fp32 throughout, last dimensions contiguous."""
    hd = k_cache.shape[-1]
    tensors = [qkv, k_cache] + ([v_cache] if v_cache is not None else [])
    return (triton is not None and (qkv.is_cuda or INTERPRETED)
            and hd >= 16 and hd & (hd - 1) == 0 and qkv.shape[-1] % hd == 0
            and qkv.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and all(t.dtype == qkv.dtype and t.device == qkv.device and t.stride(-1) == 1 for t in tensors))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The least power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


@torch.compiler.assume_constant_result  # read once at trace time under torch.compile
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return SMS_CPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def launch_shape(B: int, q: int, S: int, kv_heads: int, G: int, hd: int, sms: int, *,
                 splits: Optional[int] = None, block_m: Optional[int] = None,
                 block_s: Optional[int] = None, min_blocks: int = MIN_BLOCKS,
                 max_splits: int = MAX_SPLITS) -> tuple[int, int, int, int]:
    """(splits, BLOCK_M, BLOCK_S, tiles) from shapes only (the grid is (splits + 1, tiles,
    B * kv_heads)). The G*q query rows of a kv head tile by 16 (tl.dot's least size) where the
    cache is short (SHORT_CACHE), else by up to 64, in as few tiles as that allows. The prefix
    is split so that about one program runs per SM, into at most max_splits and no more splits
    than the cache has chunks of min_blocks BLOCK_S blocks (the least a split takes). Given
    values override the heuristic."""
    M = G * q
    block_m = block_m or (16 if B * S * kv_heads * hd <= SHORT_CACHE else min(64, max(16, _pow2(M))))
    block_s = block_s or (64 if hd <= 128 else 32)
    tiles = _cdiv(M, block_m)
    if splits is None:
        splits = min(max(_cdiv(sms, B * kv_heads * tiles), 1), max_splits, _cdiv(S, block_s * min_blocks))
    return splits, block_m, block_s, tiles


def merge_unroll(block_m: int) -> int:
    """Partials the merge folds a step: as many [BLOCK_M, hd] fp32 loads in flight as 64 query
    rows' worth (4 at BLOCK_M 16, 1 at 64), so that the merge's registers stay within a tile's."""
    return max(1, 64 // block_m)


def counters(B: int, q: int, kv_heads: int, G: int, device: torch.device) -> torch.Tensor:
    """Zeroed merge counts for `decode` over B rows of q inputs: one per (row, kv head, row
    tile), for the fewest rows a tile takes (16). Each call leaves them zero again, so the layers
    of a forward may share one buffer (a forward is one stream: its layers never overlap)."""
    return torch.zeros(B * kv_heads * _cdiv(G * q, 16), dtype=torch.int32, device=device)


def decode(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, lengths: torch.Tensor, ancestors: torch.Tensor, heads: int,
           kv_heads: int, counts: Optional[torch.Tensor] = None, *, splits: Optional[int] = None,
           block_m: Optional[int] = None, block_s: Optional[int] = None, min_blocks: int = MIN_BLOCKS,
           unroll: Optional[int] = None, num_warps: int = 4) -> torch.Tensor:
    """reference() in one Triton launch (see the module docstring): -> o [B, q, heads*hd] in
    qkv's dtype; writes the q new entries of each row into k_cache, v_cache. counts: a buffer
    from `counters` for these shapes, left zero (native makes one per forward), or None for a
    new one. splits, block_m, block_s, min_blocks, unroll (the merge's; `merge_unroll`),
    num_warps: overrides of the launch heuristic, for benchmarks and tests. Traceable by torch.compile(fullgraph=True): nothing here reads a
    tensor's values."""
    B, q, _ = qkv.shape
    S, hd = k_cache.shape[2], k_cache.shape[3]
    G = heads // kv_heads
    M = G * q
    splits, block_m, block_s, tiles = launch_shape(B, q, S, kv_heads, G, hd, _sm_count(qkv.device), splits=splits,
                                                   block_m=block_m, block_s=block_s, min_blocks=min_blocks)
    if counts is None:
        counts = counters(B, q, kv_heads, G, qkv.device)
    torch._check(counts.numel() >= B * kv_heads * tiles, lambda: "decode: counts too small for these shapes")
    parts = B * kv_heads * (splits + 1) * M
    m = torch.empty(parts, dtype=torch.float32, device=qkv.device)
    l = torch.empty(parts, dtype=torch.float32, device=qkv.device)  # noqa: E741
    acc = torch.empty(parts, hd, dtype=torch.float32, device=qkv.device)
    o = torch.empty(B, q, heads * hd, dtype=qkv.dtype, device=qkv.device)
    # int8 for the kernel (native converts once per forward); bool -> int8 is a copy of [B, q, q],
    # not a view: inductor cannot lower a bool view.
    anc = ancestors if ancestors.dtype == torch.int8 else ancestors.to(torch.int8)
    fp32 = qkv.dtype == torch.float32
    # No FMA contraction, or RoPE's x cos + rot sin would not round as torch's does. A compile
    # option of Triton's launcher, left out under torch.compile, which launches the kernel
    # itself: there bf16 keys still get torch's bits (_round rounds them in integers), fp16 and
    # fp32 keys may differ in the last bit. PDL (kernels/pdl.py) where it applies.
    pdl = launch_options(qkv.device, B * q)
    options = {} if torch.compiler.is_compiling() else {"enable_fp_fusion": False, **pdl}
    _partials[(splits + 1, tiles, B * kv_heads)](
        qkv, cos, sin, k_cache, v_cache, lengths, anc, m, l, acc, counts, o,
        qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        anc.stride(0), anc.stride(1), anc.stride(2), o.stride(0), o.stride(1), S,
        **constants(q, heads, kv_heads, hd, splits, block_m, block_s, fp32, min_blocks, unroll),
        COMPILED=not INTERPRETED, PDL=bool(pdl), num_warps=num_warps, **options)
    return o


def constants(q: int, heads: int, kv_heads: int, hd: int, splits: int, block_m: int, block_s: int,
              fp32: bool, min_blocks: int = MIN_BLOCKS, unroll: Optional[int] = None) -> dict:
    """_partials' compile-time arguments for a launch (`launch_shape`'s splits and blocks; the
    merge's unroll, `merge_unroll` unless given), but COMPILED and PDL."""
    return dict(QK_SCALE=hd**-0.5 * LOG2E, Q=q, G=heads // kv_heads, H=heads, HKV=kv_heads, HD=hd, SPLITS=splits,
                BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_Q=max(16, _pow2(q)), MIN_BLOCKS=min_blocks,
                UNROLL=unroll or merge_unroll(block_m), PRECISION="ieee" if fp32 else "tf32")
