"""The drafter protocol: every drafter proposes up to k tokens per round from one state object.

Letters: B requests, k draft tokens per round, V vocabulary, T tokens so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch


@dataclass(frozen=True)
class DraftState:
    tokens: list[torch.Tensor]  # B x [T_b] int64, prompt + generated so far (the last one not yet verified)
    k: int  # draft tokens wanted per request


@dataclass(frozen=True)
class DraftProposal:
    tokens: torch.Tensor  # [B, k] int64 draft tokens, -1 past each request's num_tokens
    num_tokens: torch.Tensor  # [B] int64 in 0..k; 0 means no proposal this round
    # [B, k, V] the distribution each token was drawn from, or None for a deterministic drafter
    # (n-gram, argmax): then q is the point mass on the token, and the rules treat it so.
    probs: Optional[torch.Tensor] = None


class Drafter(Protocol):
    name: str

    def propose(self, state: DraftState) -> DraftProposal: ...
