"""Drafting with a model, shared by every model drafter: chains and EAGLE-2 / SGLang trees.

A model drafter (draft model, layer-skip, EAGLE heads) provides a *stepper*: a draft model with
a KV cache of its own that continues token sequences. This module turns a stepper into
proposals:

chain (topk = 1): k autoregressive steps; `greedy` takes the argmax (q is then treated as the
    point mass: vLLM's draft_sample_method="greedy"), `probabilistic` samples at the run's
    temperature / top-k / top-p and returns q for the standard rule.
tree (topk > 1, or num_draft_tokens set): EAGLE-2's expansion. Step 1 keeps the root's top-k
    tokens; every later step expands each of the topk best nodes of the previous step into its
    topk children, scores them by cumulative draft log-probability, and keeps the topk best as
    the next frontier. After k steps the num_draft_tokens - 1 best of all expanded nodes form
    the tree (specbench.tree.select_nodes). Top-k is a deterministic choice, so q is the point
    mass on each node. `expand_trees` does this bookkeeping for B requests at once over any
    `feed` of the frontier; a stepper feeds one request's frontier as a batch of topk rows whose
    caches are reordered by parent as in beam search.

Per request (`draft`), B requests are drafted in batch order (so one generator samples them in
that order): each request id keeps a stepper of its own (`Steppers`), whose cache is extended
round after round whatever else was drafted in between, until the drafter's
`release(request_ids)` drops it. A drafter's batched `chain` (NativeChain, EagleChain) drafts
the B chains together, and the B trees too through its `propose_tree` (both have one: the
per-request path then serves only a NativeChain whose model could not be built), which feeds
expand_trees the B frontiers at once and lays the trees out with tree_proposal.

Letters: B requests, M draft columns (k for chains, max_nodes for trees), W frontier rows,
V vocabulary, k steps.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional, Protocol

import torch

from specbench.config import ConfigError
from specbench.drafters.base import DraftProposal, DraftState
from specbench.sampling import SamplingParams, probs_from_logits, sample
from specbench.tree import select_nodes

SAMPLE_METHODS = ("greedy", "probabilistic")


class Stepper(Protocol):
    def sync(self, tokens: torch.Tensor, features: Optional[torch.Tensor]) -> torch.Tensor:
        """Bring the cache to one request's history, tokens [T] (features [T - 1, D] or None)
        -> logits [1, V] of the next token."""

    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [W] one new token per row -> logits [W, V] of the token after it."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows of the cache, in this order (a beam reorder; repeats allowed)."""

    def restart(self) -> None:
        """Forget the draft rows and tokens fed since `sync` (after a tree)."""


class Steppers(dict):
    """Request id -> its stepper, made by `make` at the request's first draft."""

    def __init__(self, make: Callable[[], Stepper]):
        super().__init__()
        self.make = make

    def __missing__(self, request_id: Hashable) -> Stepper:
        self[request_id] = stepper = self.make()
        return stepper

    def release(self, request_ids: Iterable[Hashable]) -> None:
        """Forget these requests' steppers and caches (unknown ids are ignored)."""
        for request_id in request_ids:
            self.pop(request_id, None)


class ChainsAndTrees:
    """propose / release of a model drafter: chains and trees through its batched `chain`
    (drafters/native_chain.py, drafters/eagle_chain.py: `propose` and `propose_tree`) when that
    can run (`ready()`), and otherwise request by request through its `steppers`. The drafter
    sets steppers, chain, method, params and generator in `attach`."""

    def propose(self, state: DraftState) -> DraftProposal:
        if is_chain(state):
            if self.chain.ready():
                return self.chain.propose(state, self.method, self.params, self.generator)
        else:
            trees = getattr(self.chain, "propose_tree", None)
            if trees is not None and self.chain.ready():
                return trees(state)
        return draft(self.steppers, state, self.method, self.params, self.generator)

    def restart(self) -> None:
        """Back to the first draws of its stream (sampled drafts), so that each measured decode
        of a run (run.timed_decodes) draws what the first did. Its per-request caches need no
        reset: the runner releases each request as it finishes."""
        if self.generator is not None:
            self.generator.manual_seed(self.seed)

    def release(self, request_ids) -> None:
        """Forget finished requests: their steppers, rows and caches."""
        request_ids = tuple(request_ids)
        self.steppers.release(request_ids)
        self.chain.release(request_ids)


def check_sample_method(method: str) -> None:
    if method not in SAMPLE_METHODS:
        raise ConfigError("drafter.draft_sample_method", method, f"valid: {', '.join(SAMPLE_METHODS)}")


def is_chain(state: DraftState) -> bool:
    return state.topk == 1 and state.max_nodes >= state.k


@torch.inference_mode()
def draft(
    steppers: Steppers,
    state: DraftState,
    method: str,
    params: SamplingParams,
    generator: Optional[torch.Generator],
) -> DraftProposal:
    """B requests' proposals, each from its request's stepper: chains or trees, by the state's shape."""
    B, ids = len(state.tokens), state.ids
    chain, greedy = is_chain(state), method == "greedy" or params.greedy
    M = state.k if chain else state.max_nodes
    tokens = torch.full((B, M), -1, dtype=torch.int64)  # [B, M]
    parents = None if chain else torch.zeros((B, M), dtype=torch.int64)  # [B, M], 0 in unused columns
    num = torch.zeros(B, dtype=torch.int64)  # [B]
    probs = []  # B x [k, V] (probabilistic chains)
    for b, request_id in enumerate(ids):
        stepper = steppers[request_id]
        features = None if state.features is None else state.features[b]
        logits = stepper.sync(state.tokens[b], features)  # [1, V]
        if chain:
            row, q = _chain(stepper, logits, state.k, greedy, params, generator)  # [k], [k, V] or None
            probs.append(q)
        else:
            row, tree_parents = _tree(stepper, logits, state)  # [m], [m]
            parents[b, : row.shape[0]] = tree_parents
        tokens[b, : row.shape[0]] = row
        num[b] = row.shape[0]
    q = None if greedy or not chain else torch.stack(probs)  # [B, k, V]: chains fill their k columns
    return DraftProposal(tokens, num, q, parents)


def _chain(stepper, logits, k, greedy, params, generator) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """-> tokens [k] on the CPU, q [k, V] (None when greedy)."""
    tokens, probs = [], []
    for i in range(k):
        if greedy:
            token = logits.argmax(-1)  # [1]
        else:
            q = probs_from_logits(logits, params)  # [1, V]
            token = sample(q, generator)
            probs.append(q)
        tokens.append(token)
        if i + 1 < k:
            logits = stepper.feed(token)
    return torch.cat(tokens).cpu(), None if greedy else torch.cat(probs)


def _tree(stepper, logits, state: DraftState) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens [m] and parents [m] in 0..m on the CPU, m <= state.max_nodes."""

    def feed(tokens, rows):  # [1, W], [1, W] -> [1, W, V]
        stepper.select(rows[0])  # fork the history row, then each row continues its parent's cache
        return stepper.feed(tokens[0])[None]

    tokens, parents = expand_trees(logits, state, feed)  # [1, m] each
    stepper.restart()
    return tokens[0], parents[0]


def expand_trees(logits: torch.Tensor, state: DraftState, feed) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's expansion of B trees at once. logits: [B, V] each root's next-token logits;
    feed(tokens [B, W], rows [B, W]) -> logits [B, W, V] after each request's new frontier,
    whose node j continues the previous frontier's node rows[b, j] (the root at step 1).
    -> (tokens [B, m], parents [B, m] in 0..m) on the CPU, m = min(state.max_nodes, the
    candidates): every request's tree has as many nodes. The nodes are picked for the B trees
    at once (select_nodes over [B, C]): one by one they cost about 140 host operations a request
    (results/2026-12-05-h100: about 9,100 a round at batch 48)."""
    B, topk = logits.shape[0], state.topk
    logp = torch.log_softmax(logits.float(), -1)  # [B, V]
    scores, tokens = logp.topk(topk, dim=-1)  # [B, W], [B, W]
    all_tokens, all_scores = [tokens], [scores]
    all_parents = [torch.full((B, topk), -1, dtype=torch.int64)]
    frontier = torch.arange(topk).expand(B, topk)  # candidate ids of the frontier nodes
    rows = torch.zeros(B, topk, dtype=torch.int64, device=tokens.device)  # step 1 expands the root
    for _ in range(state.k - 1):
        logp = torch.log_softmax(feed(tokens, rows).float(), -1)  # [B, W, V]
        child_logp, child_tokens = logp.topk(topk, dim=-1)  # [B, W, topk]
        child_scores = (scores[:, :, None] + child_logp).flatten(1)  # [B, W * topk]
        first = sum(t.shape[1] for t in all_tokens)  # id of the first new candidate
        all_tokens.append(child_tokens.flatten(1))
        all_scores.append(child_scores)
        all_parents.append(frontier.repeat_interleave(topk, dim=1))
        scores, best = child_scores.topk(topk, dim=-1)  # the next frontier, [B, W]
        tokens = child_tokens.flatten(1).gather(1, best)
        frontier = first + best.cpu()
        rows = best // topk  # each new node continues its parent
    candidates = torch.cat(all_tokens, 1).cpu()  # [B, C]
    parents, scores = torch.cat(all_parents, 1), torch.cat(all_scores, 1).cpu()  # [B, C], [B, C]
    kept, tree_parents = select_nodes(parents, scores, state.max_nodes)  # [B, m], [B, m]
    return candidates.gather(1, kept), tree_parents


def tree_proposal(trees: tuple, max_nodes: int) -> DraftProposal:
    """expand_trees' (tokens [B, m], parents [B, m]) -> a tree proposal laid out as `draft` lays
    it out: [B, M] tokens (-1 past m) and parents (0 past m), M = max_nodes."""
    row_tokens, row_parents = trees
    (B, m), M = row_tokens.shape, max_nodes
    tokens = torch.cat([row_tokens, row_tokens.new_full((B, M - m), -1)], 1)  # [B, M]
    parents = torch.cat([row_parents, row_parents.new_zeros(B, M - m)], 1)  # [B, M]
    return DraftProposal(tokens, torch.full((B,), m, dtype=torch.int64), None, parents)
