"""Chain rejection sampling in one Triton kernel per round, beside its torch reference.

Letters: B requests, k draft tokens, V vocabulary, S programs splitting one request's vocabulary.

Both functions take the same inputs, randomness included, and emit the same tokens:

    target_probs: [B, k+1, V] fp32  p at each draft position and at the bonus position
    draft_tokens: [B, k] int64      -1 where a request proposed fewer than k
    draft_probs:  [B, k, V] fp32    q (rule standard only; None otherwise)
    uniforms:     [B, k] fp32       one coin per draft position, in [0, 1)
    noise:        [B, V] fp32       w = 1 / Exp(1) (specbench.kernels.vocab): the one token each
                                    request draws (recovered or bonus) is argmax r * w
    -> (tokens [B, k+1] int64 with -1 after the last emitted one, num_accepted [B] int64)

Rules (specbench.rules has the proofs). The ratio test is in log space, as vLLM's kernel:
    standard      accept x when log u < log p(x) - log q(x); residual max(0, p - q)
    onehot        q is the point mass on x: accept when log u < log p(x); residual p with x zeroed
    target_only   the same on a chain (one candidate per level)
    thresholded   accept when log u < log p(x) - log threshold_acc, or p(x) >= threshold_single
    greedy        accept when x == argmax p (first index); emit argmax p where the round ends
The accepted prefix ends at the first refusal or the first -1. A refusal emits a token drawn from
the residual at that position (from p when the residual has no mass, e.g. p == q); a round that
ends on a -1 or after all k emits a bonus token drawn from p there.

The kernel. Every program repeats the accept test of its request (k gathers of p(x), q(x) and u,
vectorised: a few hundred bytes), so nothing is launched before the vocabulary pass. The
vocabulary pass reads the stopping position's p row, its q row (standard, on a refusal only)
and the noise row once, in tiles of BLOCK columns, keeping per-lane packed keys of r * w and
p * w. One program per request cannot keep an H200 busy at small B, so each request's row is
split over S programs (grid [B, S]) that each write their best keys; the last of a request's S
programs to finish reduces them and writes the drawn token (vocab.merge_splits), so a round is
one launch. With S = 1 the program writes it itself. Greedy is one program per request (grid
[B]): it reads p row by row from position 0 and stops at the first mismatch, so it reads only
the rows up to where the round ends.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from specbench.kernels.vocab import (
    check_device, interpreted, choose, inverse_exponential, launch_shape, merge_splits, partials, residual_keys, row_key,
    unpack,
)

RULES = ("standard", "onehot", "target_only", "thresholded", "greedy")


def draw_noise(B: int, k: int, V: int, generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uniforms [B, k], noise [B, V]) from one torch.Generator."""
    uniforms = torch.rand((B, k), generator=generator, device=device)
    return uniforms, inverse_exponential((B, V), generator, device)


def _check(rule, target_probs, draft_tokens, draft_probs, uniforms, noise) -> None:
    B, k1, V = target_probs.shape
    if rule not in RULES:
        raise ValueError(f"rule={rule}: unknown rule; valid rules: {', '.join(RULES)}")
    assert target_probs.dtype == torch.float32 and k1 >= 2, (target_probs.dtype, target_probs.shape)
    assert draft_tokens.shape == (B, k1 - 1), (draft_tokens.shape, target_probs.shape)
    if rule == "standard":
        assert draft_probs is not None and draft_probs.shape == (B, k1 - 1, V), "standard needs draft_probs [B, k, V]"
    if rule != "greedy":
        assert uniforms.shape == (B, k1 - 1) and noise.shape == (B, V), (uniforms.shape, noise.shape)


# --- the torch reference ---------------------------------------------------------------------


def chain_torch(
    rule: str,
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    uniforms: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's semantics in torch (see the module docstring). Distributionally identical to
    specbench.rules.verify_chain, which draws its randomness differently."""
    _check(rule, target_probs, draft_tokens, draft_probs, uniforms, noise)
    B, k1, V = target_probs.shape
    k = k1 - 1
    rows = torch.arange(B, device=target_probs.device)
    valid = draft_tokens >= 0  # [B, k]
    x = draft_tokens.clamp(min=0)
    p_x = target_probs[:, :k].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, k]
    if rule == "greedy":
        accepted = x == target_probs[:, :k].argmax(-1)
    elif rule == "standard":
        q_x = draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        accepted = uniforms.log() < p_x.log() - q_x.log()
    else:
        log_acc = torch.tensor(math.log(threshold_acc), dtype=torch.float32)  # fp32, as the kernel's
        accepted = (uniforms.log() < p_x.log() - log_acc.to(p_x.device)) | (p_x >= threshold_single)
    num_accepted = (accepted & valid).long().cumprod(-1).sum(-1)  # [B]

    p_last = target_probs[rows, num_accepted]  # [B, V]
    if rule == "greedy":
        last = p_last.argmax(-1)
    else:
        at = num_accepted.clamp(max=k - 1)
        rejected = (num_accepted < k) & valid[rows, at]  # [B]; else a bonus from p
        if rule == "standard":
            residual = (p_last - draft_probs[rows, at]).clamp(min=0)
        else:
            residual = p_last.scatter(-1, x[rows, at].unsqueeze(-1), 0.0)
        residual = torch.where(rejected.unsqueeze(-1), residual, p_last)
        empty = residual.amax(-1, keepdim=True) <= 0  # p == q: no residual mass, draw from p
        last = (torch.where(empty, p_last, residual) * noise).argmax(-1)

    positions = torch.arange(k1, device=target_probs.device)
    tokens = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(positions < num_accepted.unsqueeze(-1), tokens, -1)
    tokens[rows, num_accepted] = last
    return tokens, num_accepted


# --- the kernels -----------------------------------------------------------------------------


@triton.jit
def _chain_kernel(
    P, Q, X, U, W, tokens, num, part_m, part_r, part_p, counts,
    k, log_acc, threshold_single, V: tl.constexpr,
    STANDARD: tl.constexpr, KB: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, SPLITS: tl.constexpr,
):
    """grid [B, S]: program (b, s) tests request b's drafts, then scans its TILES tiles of
    BLOCK columns of the residual where the round ends."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    j = tl.arange(0, KB)  # KB >= k + 1 lanes: positions 0..k
    x = tl.load(X + b * k + j, mask=j < k, other=-1)
    valid = x >= 0
    xc = tl.where(valid, x, 0)
    p_x = tl.load(P + (b * (k + 1) + j) * V + xc, mask=valid, other=0.0)
    log_u = tl.log(tl.load(U + b * k + j, mask=valid, other=1.0))
    if STANDARD:
        q_x = tl.load(Q + (b * k + j) * V + xc, mask=valid, other=1.0)
        ok = log_u < tl.log(p_x) - tl.log(q_x)
    else:
        ok = (log_u < tl.log(p_x) - log_acc) | (p_x >= threshold_single)
    a = tl.min(tl.where(ok & valid, KB, j), axis=0)  # accepted prefix: first refusal or -1
    x_a = tl.max(tl.where(j == a, x, -1), axis=0)  # the refused draft, -1 for a bonus
    rejected = x_a >= 0

    if STANDARD:
        q_cols = tl.where(rejected, V, 0)  # a bonus reads no q
        zero = tl.full([1], -1, tl.int64)
    else:
        q_cols = a * 0
        zero = tl.zeros([1], tl.int64) + tl.where(rejected, x_a, -1)
    p_row = P + (b * (k + 1) + a) * V
    q_row = Q + (b * k + tl.minimum(a, k - 1)) * V
    r_max, key_r, key_p = residual_keys(p_row, q_row, W + b * V, s * TILES * BLOCK, q_cols, zero, V, TILES, BLOCK)

    row = tl.where(j < a, x, -1)
    if SPLITS == 1:
        row = tl.where(j == a, choose(r_max, key_r, key_p), row)
    if s == 0:  # split: the drawn token at a is merge_splits', written by whichever program is last
        tl.store(tokens + b * (k + 1) + j, row, mask=(j < k + 1) & ((j != a) | (SPLITS == 1)))
        tl.store(num + b, a.to(tl.int64))
    if SPLITS > 1:
        merge_splits(part_m, part_r, part_p, counts, b, s, r_max, key_r, key_p, tokens + b * (k + 1) + a, SPLITS)


@triton.jit
def _chain_greedy_kernel(P, X, tokens, num, k, V: tl.constexpr, KB: tl.constexpr, BLOCK: tl.constexpr):
    """grid [B]: argmax of p row after row, stopping at the first draft that is not it."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KB)
    x = tl.load(X + b * k + j, mask=j < k, other=-1)
    a = tl.program_id(0) * 0  # int32 0: accepted so far
    best = b * 0 - 1
    going = a == 0
    while going:
        best = unpack(row_key(P + (b * (k + 1) + a) * V, V, BLOCK))
        x_a = tl.max(tl.where(j == a, x, -1), axis=0)  # -1 at a == k: the bonus position
        going = (x_a >= 0) & (x_a == best)
        a += going.to(tl.int32)
    row = tl.where(j < a, x, tl.where(j == a, best, -1))
    tl.store(tokens + b * (k + 1) + j, row, mask=j < k + 1)
    tl.store(num + b, a.to(tl.int64))


INTERPRETED = interpreted(_chain_kernel)  # TRITON_INTERPRET=1 when this module was imported


def launch(
    rule, target_probs, draft_tokens, draft_probs, uniforms, noise, *,
    threshold_single=1.0, threshold_acc=1.0, block_v=None, splits=None, num_warps=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """chain_triton with the launch shape exposed: tiles of block_v columns, `splits` programs
    per request (None: enough to fill the GPU), num_warps per program."""
    _check(rule, target_probs, draft_tokens, draft_probs, uniforms, noise)
    check_device(_chain_kernel, target_probs)
    B, k1, V = target_probs.shape
    k = k1 - 1
    device = target_probs.device
    tokens = torch.empty((B, k1), dtype=torch.int64, device=device)
    num = torch.empty(B, dtype=torch.int64, device=device)
    if B == 0:
        return tokens, num
    target_probs, draft_tokens = target_probs.contiguous(), draft_tokens.contiguous()
    KB = triton.next_power_of_2(k1)
    warps = num_warps or (8 if device.type == "cuda" else 4)
    if rule == "greedy":
        block_v = block_v or (4096 if device.type == "cuda" else min(256, triton.next_power_of_2(V)))
        _chain_greedy_kernel[(B,)](target_probs, draft_tokens, tokens, num, k, V=V, KB=KB, BLOCK=block_v, num_warps=warps)
        return tokens, num
    block_v, S, tiles = launch_shape(B, V, device, block_v, splits)
    parts = partials(B, S, device) if S > 1 else (tokens,) * 4  # unused at S = 1
    q = draft_probs.contiguous() if rule == "standard" else target_probs  # never read unless standard
    log_acc = float(np.float32(math.log(threshold_acc)))  # rounded to fp32 as the reference's tensor, no dispatch
    _chain_kernel[(B, S)](
        target_probs, q, draft_tokens, uniforms.contiguous(), noise.contiguous(), tokens, num, *parts,
        k, log_acc, float(threshold_single), V=V,
        STANDARD=rule == "standard", KB=KB, BLOCK=block_v, TILES=tiles, SPLITS=S, num_warps=warps,
    )
    return tokens, num


def chain_triton(
    rule: str,
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    uniforms: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel: same inputs and outputs as `chain_torch`."""
    return launch(rule, target_probs, draft_tokens, draft_probs, uniforms, noise,
                  threshold_single=threshold_single, threshold_acc=threshold_acc)
