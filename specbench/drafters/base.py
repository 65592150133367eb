"""The drafter protocol: every drafter proposes a chain or a tree of draft tokens from one state.

Letters: B requests, M draft nodes, V vocabulary, T tokens so far, D feature width.

A proposal is a chain or a tree over M draft nodes. Node 0 is the *root*: the last emitted
token, which the target has not seen yet. Draft node i (column i of `tokens`) is tree node i+1,
and `parents[:, i]` names its parent in 0..M (0: the root). Parents come before children and
siblings appear in the order the rules try them (the drafter's preference, best first). A chain
is the tree whose parents are 0, 1, ..., M-1; it is given as `parents=None`.

Drafters hold no per-round bookkeeping that the runner must call: each proposal is a function
of the state, which carries the whole history. A drafter with a KV cache of its own keeps one per
request id, keyed by the tokens it has seen, and crops it to the common prefix with the new
history (that is how it rolls back rejected drafts); its `release(request_ids)`, which the runner
calls for finished requests when the drafter has one, frees them. A drafter that keeps anything
from one decode to the next (a stream of its own: sampled drafts, the synthetic control's coins;
ngram_trie's trie of every text it was told) has `restart()`: back to as it was built, called
before each measured decode of a run so that its repeats are alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class DraftState:
    tokens: Sequence[torch.Tensor]  # B x [T_b] int64, prompt + generated so far (the last one not yet verified)
    k: int  # draft depth: tokens per chain, steps per tree (SGLang's speculative_num_steps)
    topk: int = 1  # children expanded per node (SGLang's eagle_topk); 1 asks for a chain
    num_draft_tokens: Optional[int] = None  # tree nodes including the root; None: k * topk + 1
    # B x [T_b - 1, D] the target's features at every verified position (drafters that declare
    # `feature_layers`), None for the others. Row t is the target's state after reading token t.
    features: Optional[Sequence[torch.Tensor]] = None
    # The same features in one buffer, where the runner keeps them: request b's are
    # feature_buffer[feature_rows[b], : T_b - 1] ([rows, room, D]), for a drafter that gathers
    # every request's new ones at once; None where the caller has no such buffer.
    feature_buffer: Optional[torch.Tensor] = None
    feature_rows: tuple = ()
    request_ids: tuple = ()  # B ids, stable over a request's rounds (cross-request drafters)
    # B x [T_b] int64 numpy: the same histories as `tokens`, in the same memory. The runner keeps
    # them per request, so that host-side drafters read them with no torch dispatch per request.
    host: Optional[list] = None

    def host_tokens(self) -> list[np.ndarray]:
        """B x [T_b] int64 numpy histories: `host`, or `tokens` seen as numpy."""
        return self.host if self.host is not None else [host_array(t) for t in self.tokens]

    @property
    def max_nodes(self) -> int:
        """Draft nodes wanted, the root excluded."""
        return (self.num_draft_tokens or self.k * self.topk + 1) - 1

    @property
    def ids(self) -> tuple:
        """The B request ids: request_ids, or 0 .. B-1 where the caller gave none; distinct."""
        ids = self.request_ids or tuple(range(len(self.tokens)))
        assert len(ids) == len(self.tokens) and len(set(ids)) == len(ids), ids
        return ids


@dataclass(frozen=True)
class DraftProposal:
    tokens: torch.Tensor  # [B, M] int64 draft tokens, -1 past each request's num_tokens
    num_tokens: torch.Tensor  # [B] int64 in 0..M; 0 means no proposal this round
    # [B, M, V] the distribution each token was drawn from, or None for a deterministic drafter
    # (n-gram, argmax, top-k trees): then q is the point mass on the token, and the rules treat it so.
    probs: Optional[torch.Tensor] = None
    parents: Optional[torch.Tensor] = None  # [B, M] int64 in 0..M, None for a chain

    @property
    def is_chain(self) -> bool:
        return self.parents is None


class Drafter(Protocol):
    name: str
    # Hidden-state indices of the target (as in transformers' output_hidden_states: 0 is the
    # embedding output, L the final-norm output) that the drafter reads, concatenated in order.
    # Empty for drafters that read tokens only.
    feature_layers: tuple = ()

    def propose(self, state: DraftState) -> DraftProposal: ...


def host_array(tokens) -> np.ndarray:
    """A history [T] (a tensor or numpy) as int64 numpy: the same memory when it is an int64 CPU
    tensor, so that per-request bookkeeping runs in numpy, with no torch dispatch per token."""
    if isinstance(tokens, torch.Tensor):  # token ids: integers, never part of a graph to detach from
        tokens = (tokens if tokens.device.type == "cpu" else tokens.cpu()).numpy()
    return tokens.reshape(-1).astype(np.int64, copy=False)
