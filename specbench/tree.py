"""Draft trees: choosing the nodes (EAGLE-2 / SGLang) and compiling them into verify buffers.

Letters: N tree nodes including the root (SGLang's num_draft_tokens), M = N - 1 draft nodes,
C expanded candidates, P cached prefix length.

A tree is given by `parents`: [N] int64 with parents[0] = -1 (the root, the last emitted token)
and parents[i] < i for every other node. Siblings keep their order: the order the rules try them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch


class TreeHost(NamedTuple):
    links: np.ndarray  # [3, N] int64: next_token, next_sibling, depth, the tree kernel's per-node inputs
    mask: np.ndarray  # [N, N] bool
    child_table: np.ndarray  # [N, Z] int64
    levels: int  # depth.max()
    children: tuple  # N tuples: each node's children in try order (the host walk's, specbench.rules)

    @property
    def next_token(self) -> np.ndarray:  # [N] int64, a view of links
        return self.links[0]

    @property
    def next_sibling(self) -> np.ndarray:  # [N] int64, a view of links
        return self.links[1]

    @property
    def depth(self) -> np.ndarray:  # [N] int64, a view of links
        return self.links[2]


@dataclass(frozen=True)
class TreeBuffers:
    """Everything one tree verify step needs, as SGLang's build_tree_kernel_efficient lays it out.

    parents:      [N] parent node, -1 for the root
    depth:        [N] 0 for the root; position ids are prefix length + depth
    mask:         [N, N] bool, mask[i, j]: node i attends to node j (j is i or an ancestor of i)
    next_token:   [N] first child of each node, -1 for a leaf (SGLang's retrive_next_token)
    next_sibling: [N] next sibling in try order, -1 for the last (retrive_next_sibling)
    index:        [N] row of each node in the verify forward's output (retrive_index); the
                  identity for one request, b * N + i when B requests are flattened
    child_table:  [N, Z] each node's children in try order, -1 after them (Z the most children
                  of one node): the batched walk's lookup
    host:         links (next_token, next_sibling and depth stacked; its rows are host.next_token,
                  .next_sibling, .depth), mask and child_table as numpy, the same memory as the
                  tensors above, the deepest level and each node's children: what a batch of trees
                  is assembled and walked from, with no torch dispatch per tree
    """

    parents: torch.Tensor
    depth: torch.Tensor
    mask: torch.Tensor
    next_token: torch.Tensor
    next_sibling: torch.Tensor
    index: torch.Tensor
    child_table: torch.Tensor
    host: TreeHost

    def children(self, node: int) -> list[int]:
        """Children of a node in try order."""
        return list(self.host.children[node])


def compile_tree(parents: torch.Tensor, offset: int = 0) -> TreeBuffers:
    """parents: [N] int64 (parents[0] = -1, parents[i] < i) -> buffers. `offset` shifts `index`
    (b * N for request b of a flattened batch). Pure: a function of the shape only.

    Built in Python lists and made tensors once: the runner compiles every live request's tree
    each round, and a tensor operation per node cost about 0.1 ms a tree of 8 nodes (CPU), a
    millisecond or more a round at batch 8 and up."""
    parents = parents.to(torch.int64).cpu()
    p = parents.tolist()
    N = len(p)
    if N < 1 or p[0] != -1:
        raise ValueError(f"parents[0] must be -1 (the root); got {p}")
    if any(not 0 <= p[i] < i for i in range(1, N)):
        raise ValueError(f"every node's parent must come before it; got {p}")
    depth = [0] * N
    mask = [[j == i for j in range(N)] for i in range(N)]
    next_token, next_sibling = [-1] * N, [-1] * N
    children: list[list[int]] = [[] for _ in range(N)]
    for i in range(1, N):
        depth[i] = depth[p[i]] + 1
        mask[i] = [a or b for a, b in zip(mask[i], mask[p[i]])]  # a node sees what its parent sees, and itself
        if children[p[i]]:
            next_sibling[children[p[i]][-1]] = i
        else:
            next_token[p[i]] = i
        children[p[i]].append(i)
    Z = max(map(len, children))
    table = [c + [-1] * (Z - len(c)) for c in children]
    as_array = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    links = as_array([next_token, next_sibling, depth])  # [3, N]: a batch packs it in one copy a tree
    host = TreeHost(links, np.array(mask, dtype=bool), as_array(table).reshape(N, Z), max(depth),
                    tuple(map(tuple, children)))
    return TreeBuffers(parents, torch.from_numpy(host.depth), torch.from_numpy(host.mask),
                       torch.from_numpy(host.next_token), torch.from_numpy(host.next_sibling),
                       torch.arange(offset, offset + N, dtype=torch.int64), torch.from_numpy(host.child_table), host)


def chain_parents(m: int) -> torch.Tensor:
    """The parents of a chain of m draft nodes, in proposal form (0 = root): [m] = 0, 1, ..., m-1."""
    return torch.arange(m, dtype=torch.int64)


def with_root(parents: torch.Tensor) -> torch.Tensor:
    """Proposal form ([M] in 0..M, 0 the root) -> tree form ([M+1], -1 for the root)."""
    return torch.cat([parents.new_full((1,), -1), parents.to(torch.int64)])


def select_nodes(parents: torch.Tensor, scores: torch.Tensor, max_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the max_nodes best expanded candidates, as EAGLE-2 and SGLang do, for one tree or B.

    parents: [C] (or [B, C]) the candidate each candidate was expanded from (-1: the root),
    earlier candidates first; scores: [C] (or [B, C]) cumulative draft log-probabilities.
    Returns (kept: [M] candidate indices in creation order, tree parents: [M] in 0..M, 0 = root),
    each [B, M] for B trees; M = min(max_nodes, C).

    A child's score is its parent's plus a log-probability <= 0, so with ties broken toward the
    earlier candidate (a stable sort) the best max_nodes always include every kept node's
    ancestors. Creation order puts parents before children and siblings in the drafter's
    preference order.
    """
    single = scores.dim() == 1
    if single:
        parents, scores = parents[None], scores[None]
    (B, C), m = scores.shape, min(max_nodes, scores.shape[1])
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :m]  # [B, m]
    kept = best.sort(dim=1).values  # [B, m] in creation order
    position = torch.zeros(B, C, dtype=torch.int64).scatter_(1, kept, torch.arange(1, m + 1).expand(B, m))
    above = parents.gather(1, kept)  # [B, m] each kept candidate's parent candidate, -1: the root
    tree_parents = torch.where(above >= 0, position.gather(1, above.clamp(min=0)), 0)  # [B, m] in 0..m
    orphans = ((above >= 0) & (tree_parents == 0)).nonzero()
    if orphans.shape[0]:
        b, j = orphans[0].tolist()
        raise ValueError(f"candidate {int(kept[b, j])} kept without its parent {int(above[b, j])}: "
                         "scores must not increase along a path")
    return (kept[0], tree_parents[0]) if single else (kept, tree_parents)


def attention_mask(prefix: int, mask: torch.Tensor, dtype: torch.dtype, device, depth: Optional[torch.Tensor] = None,
                   window: Optional[int] = None) -> torch.Tensor:
    """The verify forward's 4D additive mask: every node sees the cached prefix and its own
    ancestors. mask: [N, N] bool -> [1, 1, N, P + N] with 0 where attended and the dtype's
    minimum elsewhere (the form both eager and SDPA attention take). window (a sliding window's
    size; depth [N] then gives each node's position P + depth): a node sees only keys less than
    `window` positions before its own, as transformers' sliding-window layers do."""
    N = mask.shape[0]
    seen = torch.cat([torch.ones(N, prefix, dtype=torch.bool), mask.cpu()], dim=1)  # [N, P + N]
    if window is not None:
        at = prefix + depth.cpu()  # [N] the nodes' positions
        keys = torch.cat([torch.arange(prefix), at])  # [P + N] the keys' positions
        seen &= keys[None, :] > at[:, None] - window
    seen = seen.to(device)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)[None, None]
