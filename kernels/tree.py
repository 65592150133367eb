"""Target-only tree verification (SGLang's tree_speculative_sampling_target_only) in Triton,
beside its torch reference.

Letters: B requests, N tree nodes per request (the root included), D levels, V vocabulary,
Z the most children of one node, S programs splitting one request's vocabulary.

The tree, flat, as SGLang lays it out (specbench.tree.TreeBuffers for one request):

    node_tokens:  [B, N] int64  the token of each node; node 0 is the root (its token unread),
                                -1 on padding nodes (unreachable)
    first_child:  [B, N] int64  the first child of each node in try order, -1 for a leaf
                                (SGLang's retrive_next_token)
    next_sibling: [B, N] int64  the next sibling in try order, -1 for the last
                                (SGLang's retrive_next_sibling)
    target_probs: [B, N, V] fp32  p at each node: the target's next-token distribution there
    uniforms:     [B, D] fp32   one coin per level; D >= the depth of every tree
    noise:        [B, V] fp32   w = 1 / Exp(1), for the one token drawn per request

Walk (specbench.rules.verify_siblings, a level at a time): at node n with children c_1, c_2, ...
in order and the level's coin u, child c_j is accepted when p_n(c_j) > 0 and
u * threshold_acc < sum_{i<=j} p_n(c_i) or p_n(c_j) >= threshold_single; the first accepted
child becomes the next node. When every child is refused the round ends with a draw from p_n with
the children zeroed (from p_n when that leaves no mass); at a leaf it ends with a bonus draw from
p_n. Greedy: the child equal to argmax p_n is accepted, and the round ends with argmax p_n.
The sum is accumulated left to right in fp32 in both implementations, so they agree exactly.

Both functions return a TreeVerify: tokens [B, D+1] (the accepted tokens, then the drawn one, -1
after), path [B, D+1] (the accepted nodes, root 0 first, -1 after), num_accepted [B], tried [B]
(levels at which children were tested: the accepted ones, plus the refused one).

The kernel: every program loads its request's tree (N tokens and links, D coins) into registers
and walks it there, one gather of p_n(children) per level. The closing draw reads p_n and the
noise once, split over S programs per request like the chain kernel (specbench.kernels.chain),
with a tiny kernel reducing their keys. Greedy reads the full row at every node it visits,
one program per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from specbench.kernels.vocab import (
    check_device, interpreted, choose, inverse_exponential, launch_shape, merge_splits, partials, residual_keys, row_key,
    unpack,
)

RULES = ("target_only", "thresholded", "greedy")


@dataclass(frozen=True)
class TreeVerify:
    tokens: torch.Tensor  # [B, D+1] emitted: accepted drafts, then the drawn token; -1 after
    path: torch.Tensor  # [B, D+1] accepted nodes, the root (0) first; -1 after
    num_accepted: torch.Tensor  # [B]
    tried: torch.Tensor  # [B] levels tested: num_accepted, plus 1 when the round ended on a refusal


def draw_noise(B: int, D: int, V: int, generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uniforms [B, D], noise [B, V]) from one torch.Generator."""
    uniforms = torch.rand((B, D), generator=generator, device=device)
    return uniforms, inverse_exponential((B, V), generator, device)


def most_children(first_child: torch.Tensor, next_sibling: torch.Tensor) -> int:
    """Z: the most children of any node, counted along each sibling list. [B, N] -> int."""
    count = torch.zeros_like(first_child)
    c = first_child.clone()
    for _ in range(first_child.shape[1] - 1):  # a list holds at most N - 1 nodes
        live = c >= 0
        count += live.long()
        c = torch.where(live, next_sibling.gather(1, c.clamp(min=0)), c)
    return int(count.max()) if count.numel() else 0


def _check(rule, target_probs, node_tokens, first_child, next_sibling, uniforms, noise) -> None:
    if rule not in RULES:
        raise ValueError(f"rule={rule}: the tree kernel takes {', '.join(RULES)} (SGLang's target-only walk)")
    B, N, V = target_probs.shape
    assert target_probs.dtype == torch.float32, target_probs.dtype
    assert node_tokens.shape == first_child.shape == next_sibling.shape == (B, N), (node_tokens.shape, target_probs.shape)
    if rule != "greedy":
        assert uniforms.shape[0] == B and noise.shape == (B, V), (uniforms.shape, noise.shape)


# --- the torch reference ---------------------------------------------------------------------


def tree_torch(
    rule: str,
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    first_child: torch.Tensor,
    next_sibling: torch.Tensor,
    uniforms: torch.Tensor,
    noise: Optional[torch.Tensor],
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    max_children: Optional[int] = None,
) -> TreeVerify:
    """The kernel's semantics in torch, batched over requests (see the module docstring).
    max_children (Z) bounds the sibling loop; None: N - 1."""
    _check(rule, target_probs, node_tokens, first_child, next_sibling, uniforms, noise)
    B, N, V = target_probs.shape
    D = uniforms.shape[1]
    Z = N - 1 if max_children is None else max_children
    device = target_probs.device
    rows = torch.arange(B, device=device)
    node = torch.zeros(B, dtype=torch.int64, device=device)
    depth = torch.zeros(B, dtype=torch.int64, device=device)
    going = torch.ones(B, dtype=torch.bool, device=device)
    refused = torch.zeros(B, dtype=torch.bool, device=device)
    tokens = torch.full((B, D + 1), -1, dtype=torch.int64, device=device)
    path = torch.full((B, D + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    for _ in range(D + 1):  # a level per pass; the last one can only end the round
        first = first_child[rows, node]  # [B]
        active = going & (first >= 0)
        if rule == "greedy":
            best = target_probs[rows, node].argmax(-1)  # [B]
        else:
            coin = uniforms[rows, depth.clamp(max=max(D - 1, 0))] if D else torch.ones(B, device=device)
        c, cum = first.clone(), torch.zeros(B, device=device)
        chosen = torch.full((B,), -1, dtype=torch.int64, device=device)
        for _ in range(Z):  # siblings in try order
            live = active & (c >= 0) & (chosen < 0)
            cc = c.clamp(min=0)
            token = node_tokens[rows, cc]
            if rule == "greedy":
                ok = token == best
            else:
                p_c = target_probs[rows, node, token.clamp(min=0)]
                cum = torch.where(live, cum + p_c, cum)
                ok = (p_c > 0) & ((coin * threshold_acc < cum) | (p_c >= threshold_single))
            chosen = torch.where(live & ok, c, chosen)
            c = torch.where(live, next_sibling[rows, cc], c)
        accepted = chosen >= 0  # only where a node has children, so depth + 1 <= D
        tokens[rows, depth] = torch.where(accepted, node_tokens[rows, chosen.clamp(min=0)], tokens[rows, depth])
        depth = depth + accepted.long()
        path[rows, depth] = torch.where(accepted, chosen, path[rows, depth])
        refused |= going & (first >= 0) & ~accepted
        node = torch.where(accepted, chosen, node)
        going &= accepted

    p_last = target_probs[rows, node]  # [B, V]
    if rule == "greedy":
        last = p_last.argmax(-1)
    else:
        zero = torch.zeros(B, V, dtype=torch.bool, device=device)
        c = torch.where(refused, first_child[rows, node], -1)
        for _ in range(Z):  # every child of the node where the round ended was tried and refused
            live = c >= 0
            zero[rows[live], node_tokens[rows, c.clamp(min=0)][live]] = True
            c = torch.where(live, next_sibling[rows, c.clamp(min=0)], c)
        residual = p_last.masked_fill(zero, 0.0)
        empty = residual.amax(-1, keepdim=True) <= 0
        last = (torch.where(empty, p_last, residual) * noise).argmax(-1)
    tokens[rows, depth] = last
    return TreeVerify(tokens=tokens, path=path, num_accepted=depth, tried=depth + refused.long())


# --- the kernels -----------------------------------------------------------------------------


@triton.jit
def _take(vec, lanes, i):
    """vec[i] for an int vector, -1 when i is not a lane (i = -1)."""
    return tl.max(tl.where(lanes == i, vec, -1), axis=0)


@triton.jit
def _tree_kernel(
    P, TOK, FC, NS, U, W, tokens, path, num, tried, part_m, part_r, part_p, counts,
    N, D, threshold_single, threshold_acc, V: tl.constexpr,
    GREEDY: tl.constexpr, NB: tl.constexpr, DB: tl.constexpr, ZB: tl.constexpr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, SPLITS: tl.constexpr,
):
    """grid [B, S] (greedy: [B, 1]): program (b, s) walks request b's tree, then scans its
    TILES tiles of BLOCK columns of the distribution the closing token is drawn from."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    i = tl.arange(0, NB)
    tok = tl.load(TOK + b * N + i, mask=i < N, other=-1)
    fc = tl.load(FC + b * N + i, mask=i < N, other=-1)
    ns = tl.load(NS + b * N + i, mask=i < N, other=-1)
    d = tl.arange(0, DB)  # DB >= D + 1 lanes: levels 0..D
    u = tl.load(U + b * D + d, mask=d < D, other=1.0)
    out_tok = tl.full([DB], -1, tl.int64)
    out_path = tl.where(d == 0, 0, -1).to(tl.int64)

    node = b * 0  # typed zeros: loop-carried values keep one type (int64, int32)
    depth = s * 0
    best = b * 0 - 1
    first = b * 0
    refused = depth != 0
    going = depth == 0
    while going:
        first = _take(fc, i, node)
        row = P + (b * N + node) * V
        if GREEDY:
            best = unpack(row_key(row, V, BLOCK))
        else:
            coin = tl.sum(tl.where(d == depth, u, 0.0), axis=0)
            p_i = tl.load(row + tl.where(tok >= 0, tok, 0), mask=(tok >= 0) & (i > node), other=0.0)  # children come later
        c = first
        cum = tl.zeros([], tl.float32)
        chosen = b * 0 - 1
        while (c >= 0) & (chosen < 0):
            if GREEDY:
                ok = _take(tok, i, c) == best
            else:
                p_c = tl.sum(tl.where(i == c, p_i, 0.0), axis=0)
                cum += p_c
                ok = (p_c > 0) & ((coin * threshold_acc < cum) | (p_c >= threshold_single))
            chosen = tl.where(ok, c, chosen)
            c = _take(ns, i, c)
        accepted = chosen >= 0
        out_tok = tl.where(d == tl.where(accepted, depth, -1), _take(tok, i, chosen), out_tok)
        depth += accepted.to(tl.int32)
        out_path = tl.where(d == tl.where(accepted, depth, -1), chosen, out_path)
        refused = (first >= 0) & (chosen < 0)
        node = tl.where(accepted, chosen, node)
        going = accepted

    if GREEDY:
        out_tok = tl.where(d == depth, best, out_tok)
    else:
        # The refused children of the closing node, in order, are zeroed in the draw.
        z = tl.arange(0, ZB)
        zero = tl.full([ZB], -1, tl.int64)
        c = tl.where(refused, first, -1)
        n_zero = s * 0
        while c >= 0:
            zero = tl.where(z == n_zero, _take(tok, i, c), zero)
            n_zero += 1
            c = _take(ns, i, c)
        p_row = P + (b * N + node) * V
        r_max, key_r, key_p = residual_keys(p_row, P, W + b * V, s * TILES * BLOCK, 0, zero, V, TILES, BLOCK)
        if SPLITS == 1:
            out_tok = tl.where(d == depth, choose(r_max, key_r, key_p), out_tok)
        else:
            merge_splits(part_m, part_r, part_p, counts, b, s, r_max, key_r, key_p, tokens + b * (D + 1) + depth, SPLITS)
    if s == 0:  # split: the drawn token at depth is merge_splits', written by whichever program is last
        tl.store(tokens + b * (D + 1) + d, out_tok, mask=(d < D + 1) & ((d != depth) | (SPLITS == 1)))
        tl.store(path + b * (D + 1) + d, out_path, mask=d < D + 1)
        tl.store(num + b, depth.to(tl.int64))
        tl.store(tried + b, (depth + refused.to(tl.int32)).to(tl.int64))


INTERPRETED = interpreted(_tree_kernel)  # TRITON_INTERPRET=1 when this module was imported


def launch(
    rule, target_probs, node_tokens, first_child, next_sibling, uniforms, noise, *,
    threshold_single=1.0, threshold_acc=1.0, max_children=None, block_v=None, splits=None, num_warps=None,
) -> TreeVerify:
    """tree_triton with the launch shape exposed (see specbench.kernels.chain.launch)."""
    _check(rule, target_probs, node_tokens, first_child, next_sibling, uniforms, noise)
    check_device(_tree_kernel, target_probs)
    B, N, V = target_probs.shape
    D = uniforms.shape[1]
    device = target_probs.device
    Z = max(1, N - 1 if max_children is None else max_children)
    tokens = torch.empty((B, D + 1), dtype=torch.int64, device=device)
    path = torch.empty((B, D + 1), dtype=torch.int64, device=device)
    num = torch.empty(B, dtype=torch.int64, device=device)
    tried = torch.empty(B, dtype=torch.int64, device=device)
    if B == 0:
        return TreeVerify(tokens=tokens, path=path, num_accepted=num, tried=tried)
    if rule == "greedy":
        block_v = block_v or (4096 if device.type == "cuda" else min(256, triton.next_power_of_2(V)))
        S, tiles = 1, 1
    else:
        block_v, S, tiles = launch_shape(B, V, device, block_v, splits)
    parts = partials(B, S, device) if S > 1 else (tokens,) * 4  # unused at S = 1
    noise = noise if noise is not None else target_probs  # greedy reads no noise
    _tree_kernel[(B, S)](
        target_probs.contiguous(), node_tokens.contiguous(), first_child.contiguous(), next_sibling.contiguous(),
        uniforms.contiguous(), noise.contiguous(), tokens, path, num, tried, *parts,
        N, D, float(threshold_single), float(threshold_acc), V=V,
        GREEDY=rule == "greedy", NB=triton.next_power_of_2(N), DB=triton.next_power_of_2(D + 1),
        ZB=triton.next_power_of_2(Z), BLOCK=block_v, TILES=tiles, SPLITS=S, num_warps=num_warps or (8 if device.type == "cuda" else 4),
    )
    return TreeVerify(tokens=tokens, path=path, num_accepted=num, tried=tried)


def tree_triton(
    rule: str,
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    first_child: torch.Tensor,
    next_sibling: torch.Tensor,
    uniforms: torch.Tensor,
    noise: Optional[torch.Tensor],
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    max_children: Optional[int] = None,
) -> TreeVerify:
    """The kernel: same inputs and outputs as `tree_torch`."""
    return launch(rule, target_probs, node_tokens, first_child, next_sibling, uniforms, noise,
                  threshold_single=threshold_single, threshold_acc=threshold_acc, max_children=max_children)
