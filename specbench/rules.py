"""Acceptance rules: pure, batched functions over tensors with an explicit torch.Generator.

Letters: B requests, k draft tokens, V vocabulary. Vocabulary as in Leviathan et al. (arXiv
2211.17192): a draft token is *accepted*; at the first rejection a *recovered* token is drawn
from the residual distribution; when all k are accepted a *bonus* token is drawn from p at
position k+1. A round therefore emits between 1 and k+1 tokens.

Let p be the target's distribution at a position (temperature / top-k / top-p already applied),
q the draft's, x the draft token.

standard     accept x with min(1, p(x)/q(x)); on rejection draw from max(0, p - q) / Z.
             P(emit y) = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y): lossless, and the
             acceptance rate is sum_y min(p, q) = 1 - TV(p, q).
onehot       vLLM's default draft_sample_method="greedy": q is the point mass on x, so accept
             with p(x) and on rejection draw from p with x zeroed. The same proof with q = delta_x.
target_only  SGLang's TreeSpeculativeSamplingTargetOnly: one coin u per level, candidates tried in
             order, candidate j accepted when u < sum_{i<=j} p(c_i). On a chain (one candidate per
             level) this is "accept with p(x), else p with x zeroed": onehot in distribution.
thresholded  target_only with SGLang's relaxations: accept when u < sum p(c_i) / threshold_acc or
             p(c_j) >= threshold_single. Both 1.0 is target_only; below 1 it is lossy.
greedy       temperature 0: accept iff x == argmax p; emit the argmax at the first mismatch.

Drafts may be shorter than k for some requests (an n-gram drafter finds fewer tokens): mark the
missing positions with -1. A request whose drafts are all accepted up to such a position gets its
bonus token from p at that position.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch

from specbench.config import IMPLS
from specbench.sampling import sample

RULES = ("standard", "onehot", "target_only", "thresholded", "greedy")
NEEDS_DRAFT_PROBS = ("standard",)
SIBLING_RULES = ("standard", "onehot", "target_only", "thresholded", "greedy")  # all take trees
# On a tree level whose siblings are distinct tokens, recursive rejection (onehot; standard, the
# siblings being point masses) accepts c_j with p(c_j) and, every sibling refused, emits y with
# p(y): the law of target_only at thresholds 1 (verify_siblings proves both). A level's outcome
# is its emitted token, so whole walks have one law too, and the runner walks these rules as
# target_only (tree_rule_for_round), through the tree kernel where rule.impl takes it.
TARGET_ONLY_LAW = ("onehot", "standard")


def _target_only_choice(p_candidates, coin, threshold_single: float, threshold_acc: float):
    """SGLang's per-level test. p_candidates: [..., m] target mass of the siblings in order,
    coin: [...] one uniform per level -> [...] index of the accepted sibling, -1 for none
    (torch tensors, or numpy arrays: the host's tree walk).

    Sibling j is accepted when it has mass and u < sum_{i<=j} p(c_i) / threshold_acc, or
    p(c_j) >= threshold_single; the first such sibling wins."""
    cumulative = p_candidates.cumsum(-1)
    ok = (p_candidates > 0) & ((coin[..., None] < cumulative / threshold_acc) | (p_candidates >= threshold_single))
    return _first(ok)


def _first(ok):
    """ok: [..., m] bool (torch or numpy) -> [...] the index of the first True, -1 for none."""
    where = torch.where if isinstance(ok, torch.Tensor) else np.where
    return where(ok.any(-1), (ok * 1).argmax(-1), -1)


@dataclass(frozen=True)
class SiblingResult:
    token: torch.Tensor  # [B] the emitted token
    accepted: torch.Tensor  # [B] index of the accepted candidate, -1 when all were refused


def verify_siblings(
    rule: str,
    target_probs: torch.Tensor,
    candidates: torch.Tensor,
    *,
    generator: Optional[torch.Generator] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> SiblingResult:
    """One tree level: m sibling candidates tried in order against one target distribution.

    target_probs: [B, V]; candidates: [B, m] int64 (-1 pads a shorter list).
    target_only / thresholded: one coin, inverse-CDF over the candidates first; when every
    candidate is refused, draw from p with the candidates zeroed. Lossless at thresholds 1.0:
    P(emit c_j) = p(c_j), and any other y has (1 - sum p(c)) * p(y) / (1 - sum p(c)) = p(y).
    onehot / standard: recursive rejection sampling (SpecInfer), one coin per candidate: accept
    c_j with r_j(c_j), else r_{j+1} = r_j with c_j zeroed and renormalised. Siblings are the
    drafter's top-k, a deterministic choice, so each one's q is the point mass on it and the
    two rules coincide. P(emit c_j) = prod_{i<j} (1 - r_i(c_i)) r_j(c_j) = p(c_j): lossless.
    greedy: the first candidate equal to argmax p, else the argmax.
    """
    _check_sibling_rule(rule, threshold_single, threshold_acc)
    if rule == "greedy":
        return _greedy_siblings(target_probs.argmax(-1), candidates)
    accepted = _sibling_choice(rule, target_probs, candidates, generator, threshold_single, threshold_acc)  # [B]
    recovered = _recovered(target_probs, candidates, generator)  # [B]
    rows = torch.arange(target_probs.shape[0], device=target_probs.device)
    token = torch.where(accepted >= 0, candidates[rows, accepted.clamp(min=0)], recovered)
    return SiblingResult(token=token, accepted=accepted)


def _check_sibling_rule(rule: str, threshold_single: float, threshold_acc: float) -> None:
    if rule not in SIBLING_RULES:
        raise ValueError(f"rule={rule}: sibling candidates (a tree level) take {', '.join(SIBLING_RULES)}")
    if rule != "thresholded" and (threshold_single, threshold_acc) != (1.0, 1.0):
        raise ValueError(f"rule={rule} takes no thresholds; use rule thresholded")


def _sibling_choice(rule: str, p: torch.Tensor, candidates: torch.Tensor, generator,
                    threshold_single: float, threshold_acc: float) -> torch.Tensor:
    """A sampled rule's decision at one level: p [B, V], candidates [B, m] (-1 pads) -> [B] the
    accepted candidate's index, -1 when every one is refused (then the level emits _recovered)."""
    valid = candidates >= 0  # [B, m]
    c = candidates.clamp(min=0)
    if rule in ("onehot", "standard"):  # one coin per candidate
        coins = torch.rand(c.shape, generator=generator, device=p.device)
        return _recursive_choice(p.gather(-1, c), p.sum(-1), c, valid, coins)
    p_c = p.gather(-1, c).masked_fill(~valid, 0.0)  # [B, m]
    coin = torch.rand(c.shape[0], generator=generator, device=p.device)
    return _target_only_choice(p_c, coin, threshold_single, threshold_acc)


def _recovered(p: torch.Tensor, candidates: torch.Tensor, generator) -> torch.Tensor:
    """The token a level emits when every candidate is refused, under every sampled rule: a draw
    from p with the candidates zeroed (p itself where that leaves no mass; a leaf's bonus, no
    candidates, is a draw from p). p [B, V], candidates [B, m] (-1 pads) -> [B]."""
    valid = candidates >= 0
    # padding (clamped to token 0) must not zero token 0: amax of the valid flags per token
    tried = torch.zeros_like(p).scatter_reduce(-1, candidates.clamp(min=0), valid.to(p.dtype), "amax")
    residual = p * (1 - tried)
    return sample(torch.where(residual.sum(-1, keepdim=True) > 0, residual, p), generator)


def _greedy_siblings(best: torch.Tensor, candidates: torch.Tensor) -> SiblingResult:
    """best: [B] argmax p; candidates: [B, m] (-1 pads) -> the first candidate equal to it."""
    hit = (candidates == best[:, None]) & (candidates >= 0)  # [B, m]
    return SiblingResult(token=best, accepted=_first(hit))


def _recursive_choice(p_c, total, c, valid, coins):
    """Recursive rejection's decisions for all m candidates at once. p_c: [B, m] p at each
    candidate, total: [B] p's sum, c, valid, coins: [B, m] -> [B] the first accepted, -1 none
    (torch tensors, or numpy arrays: the host's tree walk).

    Candidate j meets r_j, p with the refused c_0 .. c_{j-1} zeroed (unnormalised), and is
    accepted when coins_j sum(r_j) < r_j(c_j). Whether j is reached does not change r_j, so
    every test is made at once from p at the candidates: a candidate repeating an earlier valid
    one has r_j(c_j) = 0, and each distinct refused token takes its p off the mass once."""
    earlier = np.tri(c.shape[1], k=-1, dtype=bool)  # [m, m] earlier[j, i]: i < j
    if isinstance(c, torch.Tensor):
        earlier = torch.from_numpy(earlier).to(c.device)
    repeat = ((c[:, :, None] == c[:, None, :]) & valid[:, None, :] & earlier).any(-1)  # [B, m]
    p_c = p_c * (valid & ~repeat)  # [B, m] r_j(c_j): what each candidate takes off when refused
    mass = total[:, None] - (p_c.cumsum(-1) - p_c)  # [B, m] sum(r_j)
    return _first((p_c > 0) & (coins * mass < p_c))


class TreeResult(NamedTuple):  # a tuple, not a frozen dataclass: a batch of 48 builds 48 a round
    path: list  # accepted tree nodes, the root (0) first
    tokens: list  # emitted: the accepted drafts, then the recovered or bonus token
    tried: int  # depths at which drafts were tested: the accepted ones, plus a refused level

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify_tree(
    rule: str,
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    tree,
    *,
    generator: Optional[torch.Generator] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    impl: str = "torch",
) -> TreeResult:
    """Walk one request's draft tree from the root, a level at a time: `verify_trees` for one.

    target_probs: [N, V] p at every node (the verify forward under the tree mask); node_tokens:
    [N] (node 0 the root); tree: specbench.tree.TreeBuffers. At each node its children are
    tried in order by `verify_siblings`; an accepted child becomes the next node, a refusal
    emits the recovered token and ends the round, and a leaf emits a bonus token from p there.
    """
    return verify_trees(rule, target_probs[None], node_tokens[None], [tree], generator=generator,
                        threshold_single=threshold_single, threshold_acc=threshold_acc, impl=impl)[0]


def verify_trees(
    rule: str,
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    trees: list,
    *,
    generator: Optional[torch.Generator] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    impl: str = "torch",
) -> list[TreeResult]:
    """Walk A requests' draft trees, one per request, every request at once.

    target_probs: [A, q, V]; node_tokens: [A, q] (column 0 each request's root); trees: A
    specbench.tree.TreeBuffers, request a's with m_a <= q nodes (its rows past m_a are not read).
    impl="torch": D + 1 levels (D the deepest tree), each request at its current node with its
    children as the candidates, as `verify_siblings` decides them. Greedy: on the device, one
    copy to the host at the end. Sampled rules: `_walk_sampled`, the walks in numpy from one
    copy of p at every node's children and every level's coins [A, D + 1, ...] (drawn for every
    request, still walking or not); the token of the level where each walk stops (recovered, or
    a leaf's bonus: a leaf has no candidates) is drawn once for all, on the device.
    impl="triton": every tree in one kernel launch (specbench.kernels.tree), the trees padded to
    the most nodes, on coins [A, D] and noise [A, V] drawn once for the batch.
    Both impls give the same law, and the same tokens under greedy, but not the same draws from a
    seed.
    """
    _check_impl(impl)
    A, q = node_tokens.shape
    if target_probs.shape[:2] != (A, q) or len(trees) != A:
        raise ValueError(f"target_probs {tuple(target_probs.shape)}, node_tokens {(A, q)} and {len(trees)} trees "
                         "must agree: [A, q, V], [A, q], A trees")
    sizes = [int(t.parents.shape[0]) for t in trees]
    if any(m > q for m in sizes):
        raise ValueError(f"trees of {max(sizes)} nodes do not fit in q = {q} verify positions")
    if A == 0:
        return []
    if impl == "triton":
        return _verify_trees_kernel(rule, target_probs, node_tokens, trees, generator, threshold_single, threshold_acc)
    _check_sibling_rule(rule, threshold_single, threshold_acc)
    device = target_probs.device
    D = max(t.host.levels for t in trees)
    Z = max(1, max(t.child_table.shape[1] for t in trees))
    table = np.full((A, max(sizes), Z), -1, dtype=np.int64)  # [A, N, Z] children in try order
    for a, t in enumerate(trees):  # numpy: no torch dispatch per tree
        table[a, : sizes[a], : t.child_table.shape[1]] = t.host.child_table
    if rule != "greedy":
        return _walk_sampled(rule, target_probs, node_tokens, table, D, generator, threshold_single, threshold_acc)
    table = torch.from_numpy(table).to(device)
    rows = torch.arange(A, device=device)
    node = torch.zeros(A, dtype=torch.int64, device=device)  # [A] each walk's current node
    going = torch.ones(A, dtype=torch.bool, device=device)
    tried = torch.zeros(A, dtype=torch.int64, device=device)
    path = torch.full((A, D + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    emitted = torch.full((A, D + 1), -1, dtype=torch.int64, device=device)
    best = target_probs.argmax(-1)  # [A, q]: one pass over V, not one a level
    for level in range(D + 1):  # the walks at depth `level`; at D every one is at a leaf or done
        children = table[rows, node]  # [A, Z]
        candidates = torch.where(children >= 0, node_tokens.gather(1, children.clamp(min=0)), -1)
        result = _greedy_siblings(best[rows, node], candidates)
        emitted[:, level] = torch.where(going, result.token, -1)
        tried += going & (children[:, 0] >= 0)  # a leaf's level tests nothing
        going &= result.accepted >= 0
        if level < D:
            node = torch.where(going, children[rows, result.accepted.clamp(min=0)], node)
            path[:, level + 1] = torch.where(going, node, -1)
    return _tree_results(torch.cat([path, emitted, tried[:, None]], 1).tolist(), D)  # [A, 2D + 3], the one sync


def _tree_results(host: list, D: int) -> list[TreeResult]:
    """Each walk's row [path (D + 1, -1 after its end), emitted (D + 1), tried] -> its TreeResult."""
    results = []
    for row in host:
        walked = [n for n in row[: D + 1] if n >= 0]
        results.append(TreeResult(path=walked, tokens=row[D + 1 : D + 1 + len(walked)], tried=row[-1]))
    return results


def _walk_sampled(rule, target_probs, node_tokens, table: np.ndarray, D: int, generator,
                  threshold_single: float, threshold_acc: float) -> list[TreeResult]:
    """verify_trees under a sampled rule: everything a walk can read, at every node, comes to
    the host in one copy (p at each node's children [A, N, Z], p's sums [A, N], the coins of
    every level), the A walks go down their trees in numpy, a level at a time, and the token of
    the level where each walk stops (recovered, or a leaf's bonus) is drawn on the device for
    all of them at once: two synchronisations and about 20 device operations a round, however
    deep and wide the trees. table: [A, N, Z] each node's children in try order, -1 after them."""
    device = target_probs.device
    A, N, Z = table.shape
    kids = torch.from_numpy(table).to(device)  # [A, N, Z]
    kid_tokens = node_tokens.gather(1, kids.clamp(min=0).view(A, N * Z)).view(A, N, Z)  # [A, N, Z] the children's tokens
    p = target_probs[:, :N]  # [A, N, V]
    recursive = rule in ("onehot", "standard")  # a coin per candidate, else one a level
    coins = torch.rand((A, D + 1, Z) if recursive else (A, D + 1), generator=generator, device=device)
    packed = torch.cat([p.gather(-1, kid_tokens).flatten(1).double(), p.sum(-1).double(), coins.flatten(1).double(),
                        kid_tokens.flatten(1).double()], 1).cpu().numpy()  # token ids are exact in float64
    p_c, total, coins, tokens = np.split(packed, np.cumsum([N * Z, N, coins[0].numel()]), axis=1)
    p_c, coins, tokens = p_c.reshape(A, N, Z), coins.reshape(A, D + 1, -1), tokens.reshape(A, N, Z).astype(np.int64)

    ar = np.arange(A)
    node = np.zeros(A, dtype=np.int64)  # [A] each walk's current node
    going = np.ones(A, dtype=bool)
    tried = np.zeros(A, dtype=np.int64)
    stop_level = np.zeros(A, dtype=np.int64)
    path = np.full((A, D + 1), -1, dtype=np.int64)
    path[:, 0] = 0
    emitted = np.full((A, D + 1), -1, dtype=np.int64)
    for level in range(D + 1):  # the walks at depth `level`; at D every one is at a leaf or done
        children = table[ar, node]  # [A, Z]
        valid = children >= 0
        if recursive:
            accepted = _recursive_choice(p_c[ar, node], total[ar, node], tokens[ar, node], valid, coins[:, level])
        else:
            accepted = _target_only_choice(p_c[ar, node] * valid, coins[:, level, 0], threshold_single, threshold_acc)
        stops = going & (accepted < 0)
        stop_level[stops] = level
        kept = going & ~stops
        emitted[kept, level] = tokens[ar, node, accepted.clip(min=0)][kept]
        tried += going & valid[:, 0]  # a leaf's level tests nothing
        going = kept
        if level < D:
            node = np.where(going, children[ar, accepted.clip(min=0)], node)
            path[:, level + 1] = np.where(going, node, -1)
    # every walk stopped once, at `node`: the refused candidates there (none at a leaf) are zeroed
    stop = torch.from_numpy(np.where(table[ar, node] >= 0, tokens[ar, node], -1)).to(device)  # [A, Z]
    rows, at = torch.arange(A, device=device), torch.from_numpy(node).to(device)
    emitted[ar, stop_level] = _recovered(target_probs[rows, at], stop, generator).cpu().numpy()
    return _tree_results(np.concatenate([path, emitted, tried[:, None]], 1).tolist(), D)


# --- temperature 0 on the host: the runner's greedy rounds, from one copy of the argmaxes --------


def greedy_chain_host(best: list, drafts: list) -> tuple[list, int]:
    """One request's chain under greedy, in Python: best [k + 1] the target's argmax at each
    position, drafts [m], m <= k -> (the emitted tokens best[: a + 1], a accepted drafts), what
    verify_chain("greedy") gives the request."""
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return best[: a + 1], a


def greedy_tree_host(best: list, node_tokens: list, children: tuple) -> TreeResult:
    """One request's tree under greedy, in Python: best [N] the target's argmax at each node,
    node_tokens [N] (node 0 the root), children: each node's children in try order
    (TreeBuffers.host.children) -> what verify_trees("greedy") gives the request. The walk
    takes the first child whose token is the argmax; a node without one emits the argmax."""
    node, path, emitted, tried = 0, [0], [], 0
    while True:  # a for-else, not next() over a generator: 2 to 2.7 x faster (batch 48 walks 48 a round)
        target = best[node]
        emitted.append(target)
        kids = children[node]
        if not kids:  # a leaf tests nothing
            return TreeResult(path=path, tokens=emitted, tried=tried)
        tried += 1
        for node in kids:
            if node_tokens[node] == target:
                break
        else:
            return TreeResult(path=path, tokens=emitted, tried=tried)
        path.append(node)


@dataclass(frozen=True)
class VerifyResult:
    tokens: torch.Tensor  # [B, k+1] emitted tokens, -1 after the last one
    num_accepted: torch.Tensor  # [B] accepted draft tokens, 0..k


def verify_chain(
    rule: str,
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    *,
    generator: Optional[torch.Generator] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    impl: str = "torch",
) -> VerifyResult:
    """Verify a chain of k drafts per request against the target in one call.

    target_probs: [B, k+1, V]  p at each draft position and at the bonus position
    draft_tokens: [B, k]       int64, -1 where a request proposed fewer than k
    draft_probs:  [B, k, V]    q, needed by `standard` only
    threshold_single, threshold_acc: used by `thresholded` only (SGLang's defaults, 1.0)
    impl: torch (below) or triton (specbench.kernels.chain: one kernel, the ratio test in log
          space and a Gumbel-max draw, on coins and noise drawn from `generator`)
    """
    _check_impl(impl)
    B, k1, V = target_probs.shape
    k = k1 - 1
    if rule not in RULES:
        raise ValueError(f"rule={rule}: unknown rule; valid rules: {', '.join(RULES)}")
    if tuple(draft_tokens.shape) != (B, k):
        raise ValueError(f"draft_tokens has shape {tuple(draft_tokens.shape)}, expected {(B, k)}")
    if rule in NEEDS_DRAFT_PROBS:
        if draft_probs is None:
            raise ValueError(
                f"rule={rule} needs draft_probs [B, k, V] and got None; "
                "a deterministic drafter's q is the point mass on its token (rule onehot)"
            )
        if tuple(draft_probs.shape) != (B, k, V):
            raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(B, k, V)}")
    if rule != "thresholded" and (threshold_single, threshold_acc) != (1.0, 1.0):
        raise ValueError(f"rule={rule} takes no thresholds; use rule thresholded")
    if k == 0:  # a zero-width proposal: a decode step, its token drawn from p (greedy: p's argmax)
        p = target_probs[:, 0]  # [B, V]
        token = p.argmax(-1) if rule == "greedy" else sample(p, generator)
        return VerifyResult(tokens=token.unsqueeze(-1), num_accepted=torch.zeros(B, dtype=torch.long, device=p.device))
    if impl == "triton":
        return _verify_chain_kernel(rule, target_probs, draft_tokens, draft_probs, generator, threshold_single, threshold_acc)

    positions = torch.arange(k + 1, device=target_probs.device)  # [k+1]
    if rule == "greedy":  # every position's argmax, once: an accepted draft equals it, and so does the last token
        best = target_probs.argmax(-1)  # [B, k+1]
        num_accepted = (draft_tokens == best[:, :k]).long().cumprod(-1).sum(-1)  # [B]; -1 equals no argmax
        return VerifyResult(tokens=torch.where(positions <= num_accepted.unsqueeze(-1), best, -1),
                            num_accepted=num_accepted)

    rows = torch.arange(B, device=target_probs.device)
    valid = draft_tokens >= 0  # [B, k]
    x = draft_tokens.clamp(min=0)  # [B, k]
    p_x = target_probs[:, :k].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, k]
    u = torch.rand((B, k), generator=generator, device=target_probs.device)  # [B, k]
    if rule == "standard":
        q_x = draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, k]
        accepted = u * q_x < p_x  # u < p/q without dividing by q
    elif rule == "onehot":
        accepted = u < p_x
    else:  # target_only, thresholded: a chain is a tree with one candidate per level
        accepted = _target_only_choice(p_x.unsqueeze(-1), u, threshold_single, threshold_acc) == 0
    accepted &= valid
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B] length of the accepted prefix

    p_last = target_probs[rows, num_accepted]  # [B, V] p where the round ends
    # A rejection happened where the round ends before k on a real draft; otherwise the
    # last token is the bonus, drawn from p itself.
    at = num_accepted.clamp(max=k - 1)
    rejected = (num_accepted < k) & valid[rows, at]  # [B]
    if rule == "standard":
        residual = (p_last - draft_probs[rows, at]).clamp(min=0)
    else:  # the draft is a point mass (onehot) or tried-and-refused candidate: zero it
        residual = p_last.scatter(-1, x[rows, at].unsqueeze(-1), 0.0)
    # p == q exactly leaves no residual mass; rejection then has probability 0, but keep
    # the draw well defined.
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(rejected.unsqueeze(-1) & ~empty, residual, p_last)
    last = sample(residual, generator)

    tokens = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(positions < num_accepted.unsqueeze(-1), tokens, -1)
    tokens[rows, num_accepted] = last
    return VerifyResult(tokens=tokens, num_accepted=num_accepted)


# --- impl="triton": the same rules in specbench.kernels ------------------------------------


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl}: valid impls: {', '.join(IMPLS)} (resolve auto with resolve_impl)")


def resolve_impl(impl: str, device: torch.device, rule: str, trees: bool) -> str:
    """rule.impl as sampled rounds run it. auto: the Triton kernel where one runs the round (a
    CUDA device, triton installed, and for trees a rule the tree kernel walks, TARGET_ONLY_LAW's
    as target_only), torch otherwise."""
    if impl != "auto":
        return impl
    if device.type != "cuda" or importlib.util.find_spec("triton") is None:
        return "torch"
    if not trees:
        return "triton"  # the chain kernel takes every rule
    from specbench.kernels import tree

    return "triton" if rule in tree.RULES or rule in TARGET_ONLY_LAW else "torch"


def distinct_siblings(drafts: np.ndarray, parents: np.ndarray, num) -> bool:
    """drafts, parents: [A, M] a round's proposal (parents in 0..M, 0 the root), num: [A] each
    request's nodes -> whether no node has two children with one token."""
    A, M = parents.shape
    if M < 2:
        return True
    # (parent, token) as one key; nodes past num[a] get keys of their own (negative, distinct)
    keys = (parents.astype(np.int64) << 32) | drafts.astype(np.int64)
    keys = np.where(np.arange(M) < np.asarray(num)[:, None], keys, -1 - np.arange(M))
    keys.sort(axis=1)
    return not (keys[:, 1:] == keys[:, :-1]).any()


def tree_rule_for_round(rule: str, impl: str, drafts: np.ndarray, parents: np.ndarray, num) -> tuple[str, str]:
    """(rule, impl) a sampled tree round is verified with: TARGET_ONLY_LAW's rules as
    target_only (the same law) where every node's children are distinct tokens, else as asked,
    in torch if the tree kernel does not walk the rule. drafts, parents, num: distinct_siblings'."""
    if rule not in TARGET_ONLY_LAW:
        return rule, impl
    if distinct_siblings(drafts, parents, num):
        return "target_only", impl
    return rule, "torch"  # the tree kernel walks no recursive rule


def _verify_chain_kernel(rule, target_probs, draft_tokens, draft_probs, generator, threshold_single, threshold_acc) -> VerifyResult:
    """One kernel per round; the coins [B, k] and the noise [B, V] come from `generator`."""
    from specbench.kernels import load

    chain = load("chain", target_probs.device, "rule.impl")
    B, k1, V = target_probs.shape
    uniforms = noise = None
    if rule != "greedy":
        uniforms, noise = chain.draw_noise(B, k1 - 1, V, generator, target_probs.device)
    tokens, num = chain.chain_triton(
        rule, target_probs.float(), draft_tokens, None if draft_probs is None else draft_probs.float(), uniforms, noise,
        threshold_single=threshold_single, threshold_acc=threshold_acc,
    )
    return VerifyResult(tokens=tokens, num_accepted=num)


def _verify_trees_kernel(rule, target_probs, node_tokens, trees, generator, threshold_single, threshold_acc) -> list[TreeResult]:
    """All A requests' trees in one launch: packed [A, N] (N the most nodes, -1 padding), coins
    [A, D] (D the deepest tree) and noise [A, V] drawn once for the batch."""
    hosts = [t.host for t in trees]
    N = max(h.links.shape[1] for h in hosts)
    D = max(h.levels for h in hosts)
    Z = max(h.child_table.shape[1] for h in hosts)  # the most children of one node, over the batch
    walks = torch.from_numpy(pack_trees(hosts, None, N)).to(target_probs.device)  # [3, A, N], one copy
    walks[2] = torch.where(walks[2] >= 0, node_tokens[:, :N].to(walks.device), -1)  # depth -> token, on the device
    rows = tree_kernel_step(rule, target_probs[:, :N], walks, D, Z, generator, threshold_single, threshold_acc)
    return tree_kernel_results(rows.tolist(), D)


def pack_trees(hosts: list, node_tokens: Optional[np.ndarray], N: int) -> np.ndarray:
    """hosts: A specbench.tree.TreeHost (None: no tree, a row whose root only draws a token),
    node_tokens: [A, >= N] -> [3, A, N] int64, the tree kernel's inputs: each node's first
    child, next sibling and token, -1 on padding nodes (node_tokens None: each node's depth in
    place of its token, for tokens that are on the device). In numpy (no torch dispatch per
    tree), for one copy to the device. One tree for every request (a fixed tree shape) is
    broadcast; the host's work per tree is what grows with A."""
    A = len(hosts)
    walks = np.full((3, A, N), -1, dtype=np.int64)  # first child, next sibling, depth (then the tokens)
    if A and hosts[0] is not None and all(h is hosts[0] for h in hosts):
        walks[:, :, : hosts[0].links.shape[1]] = hosts[0].links[:, None, :]
    else:
        for a, h in enumerate(hosts):
            if h is not None:
                walks[:, a, : h.links.shape[1]] = h.links
    if node_tokens is not None:
        walks[2] = np.where(walks[2] >= 0, node_tokens[:, :N], -1)  # a node has a depth: its token
    return walks


def tree_kernel_step(rule, target_probs, walks, D: int, Z: int, generator, threshold_single=1.0,
                     threshold_acc=1.0) -> torch.Tensor:
    """The device side of _verify_trees_kernel: target_probs [A, N, V], walks [3, A, N]
    (pack_trees': first child, next sibling, token; on the device), D >= the deepest tree,
    Z >= the most children of a node -> [A, 2 (D + 1) + 2] int64: path, tokens, num_accepted,
    tried (tree_kernel_results reads it).
    No host synchronisation: capturable in a CUDA graph (specbench.sampled)."""
    from specbench.kernels import load

    kernel = load("tree", target_probs.device, "rule.impl")
    if rule not in kernel.RULES:
        raise ValueError(f"rule={rule}: impl=triton verifies trees with {', '.join(kernel.RULES)} (SGLang's target-only walk)")
    if rule != "thresholded" and (threshold_single, threshold_acc) != (1.0, 1.0):
        raise ValueError(f"rule={rule} takes no thresholds; use rule thresholded")
    A, _, V = target_probs.shape
    device = target_probs.device
    if rule == "greedy":
        uniforms, noise = torch.zeros((A, D), device=device), None
    else:
        uniforms, noise = kernel.draw_noise(A, D, V, generator, device)
    out = kernel.tree_triton(
        rule, target_probs.float(), walks[2], walks[0], walks[1], uniforms, noise,
        threshold_single=threshold_single, threshold_acc=threshold_acc, max_children=Z,
    )
    return torch.cat([out.path, out.tokens, out.num_accepted[:, None], out.tried[:, None]], 1)


def tree_kernel_results(rows: list, D: int) -> list[TreeResult]:
    """tree_kernel_step's rows, on the host (A lists) -> each request's TreeResult."""
    return [TreeResult(path=row[: a + 1], tokens=row[D + 1 : D + 2 + a], tried=row[-1])
            for row in rows for a in (row[-2],)]
