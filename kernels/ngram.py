"""Prompt-lookup (n-gram) drafting in one Triton kernel, beside its torch reference.

Letters: B requests, T padded history length, k draft tokens, E candidate match ends.

The reference is specbench.drafters.ngram.ngram_propose_batch; `ngram_triton` takes the same
arguments and returns the same (drafts [B, k] int64 with -1 past each row's count, num [B]):

    tokens:  [B, T] int64, row b valid in [0, lengths[b])
    lengths: [B] int64

The kernel is one program per request. For every candidate end e <= L - 2 (a tile of BLOCK ends
at a time) it counts run[e], the common suffix of t[..e] and t[..L-1] capped at MAX_N (MAX_N
shifted loads of the tile, all hitting cache after the first), and keeps a per-lane max of the
packed key run * (T + 1) + e where run >= min_n. One max then gives the longest n and, among
those, the rightmost end; the k tokens after it are the drafts. Each history is read once:
L * 8 bytes per request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specbench.kernels.vocab import check_device, interpreted


@triton.jit
def _ngram_kernel(TOKENS, LENGTHS, drafts, num, T, min_n, k, MAX_N: tl.constexpr, KB: tl.constexpr, BLOCK: tl.constexpr):
    """grid [B]: request b's longest, then rightmost, earlier occurrence of its suffix."""
    b = tl.program_id(0).to(tl.int64)
    L = tl.load(LENGTHS + b)
    row = TOKENS + b * T
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1, tl.int64)
    start = L * 0
    while start < L - 1:  # ends e <= L - 2 leave a token after the match; a tile at a time
        e = start + lanes
        alive = e <= L - 2
        run = tl.zeros([BLOCK], tl.int64)
        for j in tl.static_range(MAX_N):  # t[e - j] against the suffix's t[L - 1 - j]
            h = tl.load(row + e - j, mask=alive & (e >= j), other=-1)
            suffix = tl.load(row + tl.maximum(L - 1 - j, 0))
            alive = alive & (e >= j) & (h == suffix)
            run += alive.to(tl.int64)
        key = tl.where((e <= L - 2) & (run >= min_n), run * (T + 1) + e, -1)
        best = tl.maximum(best, key)
        start += BLOCK
    top = tl.max(best, axis=0)
    kk = tl.arange(0, KB)
    pos = tl.where(top >= 0, top % (T + 1) + 1 + kk, L)  # after the match's end; no match: past L
    valid = (pos < L) & (kk < k)
    picked = tl.load(row + pos, mask=valid, other=-1)
    tl.store(drafts + b * k + kk, tl.where(valid, picked, -1), mask=kk < k)
    tl.store(num + b, tl.sum(valid.to(tl.int64), axis=0))


INTERPRETED = interpreted(_ngram_kernel)  # TRITON_INTERPRET=1 when this module was imported


def launch(tokens, lengths, min_n: int, max_n: int, k: int, *, block=None, num_warps=None) -> tuple[torch.Tensor, torch.Tensor]:
    """ngram_triton with the launch shape exposed: block candidate ends per tile."""
    assert tokens.dim() == 2 and lengths.shape == (tokens.shape[0],), (tokens.shape, lengths.shape)
    check_device(_ngram_kernel, tokens)
    B, T = tokens.shape
    device = tokens.device
    drafts = torch.full((B, k), -1, dtype=torch.int64, device=device)
    num = torch.zeros(B, dtype=torch.int64, device=device)
    if T < 2 or k < 1 or B == 0:  # a match needs one token before the suffix and one after it
        return drafts, num
    block = block or (1024 if device.type == "cuda" else min(256, triton.next_power_of_2(T)))
    _ngram_kernel[(B,)](
        tokens.to(torch.int64).contiguous(), lengths.to(device=device, dtype=torch.int64).contiguous(), drafts, num,
        T, min_n, k, MAX_N=max_n, KB=triton.next_power_of_2(k), BLOCK=block, num_warps=num_warps or 4,
    )
    return drafts, num


def ngram_triton(tokens: torch.Tensor, lengths: torch.Tensor, min_n: int, max_n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel: same arguments and outputs as specbench.drafters.ngram.ngram_propose_batch."""
    return launch(tokens, lengths, min_n, max_n, k)
