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
    mass on each node. The frontier is a batch of topk rows whose caches are reordered by parent
    as in beam search.

Letters: W frontier rows, V vocabulary, k steps.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from specbench.config import ConfigError
from specbench.drafters.base import DraftProposal, DraftState
from specbench.sampling import SamplingParams, probs_from_logits, sample
from specbench.tree import select_nodes

SAMPLE_METHODS = ("greedy", "probabilistic")


class Stepper(Protocol):
    def sync(self, state: DraftState) -> torch.Tensor:
        """Bring the cache to the request's history (one row) -> logits [1, V] of the next token."""

    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [W] one new token per row -> logits [W, V] of the token after it."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows of the cache, in this order (a beam reorder; repeats allowed)."""

    def restart(self) -> None:
        """Forget the draft rows and tokens fed since `sync` (after a tree)."""


def check_sample_method(method: str) -> None:
    if method not in SAMPLE_METHODS:
        raise ConfigError("drafter.draft_sample_method", method, f"valid: {', '.join(SAMPLE_METHODS)}")


def is_chain(state: DraftState) -> bool:
    return state.topk == 1 and state.max_nodes >= state.k


@torch.inference_mode()
def draft(
    stepper: Stepper,
    state: DraftState,
    method: str,
    params: SamplingParams,
    generator: Optional[torch.Generator],
) -> DraftProposal:
    """One request's proposal (state.tokens has one row): a chain or a tree, by the state's shape."""
    assert len(state.tokens) == 1, "model drafters draft one request at a time"
    logits = stepper.sync(state)  # [1, V]
    if is_chain(state):
        return _chain(stepper, logits, state.k, method, params, generator)
    return _tree(stepper, logits, state)


def _chain(stepper, logits, k, method, params, generator) -> DraftProposal:
    greedy = method == "greedy" or params.greedy
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
    return DraftProposal(
        tokens=torch.stack(tokens, 1).cpu(),  # [1, k]
        num_tokens=torch.tensor([k]),
        probs=None if greedy else torch.stack(probs, 1),  # [1, k, V]
    )


def _tree(stepper, logits, state: DraftState) -> DraftProposal:
    topk = state.topk
    logp = torch.log_softmax(logits.float(), -1)  # [1, V]
    scores, tokens = logp[0].topk(topk)  # [W], [W]
    all_tokens, all_scores = [tokens], [scores]
    all_parents = [torch.full((topk,), -1, dtype=torch.int64)]
    frontier = torch.arange(topk)  # candidate ids of the frontier rows
    stepper.select(torch.zeros(topk, dtype=torch.int64, device=tokens.device))  # fork the history row
    for _ in range(state.k - 1):
        logp = torch.log_softmax(stepper.feed(tokens).float(), -1)  # [W, V]
        child_logp, child_tokens = logp.topk(topk, dim=-1)  # [W, topk]
        child_scores = (scores[:, None] + child_logp).flatten()  # [W * topk]
        first = sum(t.shape[0] for t in all_tokens)  # id of the first new candidate
        all_tokens.append(child_tokens.flatten())
        all_scores.append(child_scores)
        all_parents.append(frontier.repeat_interleave(topk))
        scores, best = child_scores.topk(topk)  # the next frontier
        tokens = child_tokens.flatten()[best]
        frontier = first + best.cpu()
        stepper.select(best // topk)  # each new row continues its parent's cache
    stepper.restart()
    kept, parents = select_nodes(torch.cat(all_parents), torch.cat(all_scores).cpu(), state.max_nodes)
    m = kept.shape[0]
    return DraftProposal(
        tokens=torch.cat(all_tokens).cpu()[kept].unsqueeze(0),  # [1, m]
        num_tokens=torch.tensor([m]),
        parents=parents.unsqueeze(0),  # [1, m]
    )
