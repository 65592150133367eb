"""Prompt-lookup (n-gram) drafting: copy what followed the last time the current suffix occurred.

For a history t[0..T-1] the drafter looks for the longest n in [min_n, max_n] whose suffix
t[T-n..T-1] occurs earlier, at some start i with i + n <= T - 1 (so not the suffix itself, and
at least one token follows the match), and proposes the up-to-k tokens that follow it,
t[i+n : min(i+n+k, T)]. Among matches of that longest n the rightmost (most recent) one wins:
vLLM v0.32.0's GPU speculator (v1/worker/gpu/spec_decode/ngram/speculator.py, which `ngram` and
`ngram_gpu` both select in the V2 model runner) packs (n, position) into one score and takes the
maximum. vLLM's older CPU proposer (v1/spec_decode/ngram_proposer.py, a KMP over the reversed
history) keeps the earliest of the longest matches instead. No match: no proposal this round.

Letters: B requests, k draft tokens, T tokens so far, E candidate match end positions (T - 1).
"""

from __future__ import annotations

import torch

from specbench.config import IMPLS, ConfigError, NgramConfig
from specbench.drafters.base import DraftProposal, DraftState
from specbench.kernels import load


def ngram_propose_batch(
    tokens: torch.Tensor, lengths: torch.Tensor, min_n: int, max_n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-lookup drafts for B right-padded histories at once.

    tokens: [B, T] int64, row b valid in [0, lengths[b]); lengths: [B].
    Returns (drafts [B, k] int64 with -1 past each row's count, num_tokens [B] int64 in 0..k).

    Instead of one search per n, every candidate end position e (the last token of a match)
    gets run[e], the length of the common suffix of t[..e] and t[..T-1], capped at max_n. A
    match of length n ending at e exists exactly when run[e] >= n, so the longest n is max(run)
    and, among ends reaching it, the rightmost e is the rightmost start e - n + 1. Both are
    picked by one max over the packed key run * (T + 1) + e. Only the C ends whose token is the
    row's last token can have run >= 1, so only those are extended ([C, n], not [B, E, n]).
    """
    assert tokens.dim() == 2 and lengths.shape == (tokens.shape[0],), (tokens.shape, lengths.shape)
    B, T = tokens.shape
    device = tokens.device
    drafts = torch.full((B, k), -1, dtype=torch.int64, device=device)
    num = torch.zeros(B, dtype=torch.int64, device=device)
    if T < 2 or k < 1:  # a match needs one token before the suffix and one after it
        return drafts, num

    lengths = lengths.to(device=device, dtype=torch.int64)
    ends = torch.arange(T - 1, device=device)  # [E] e <= T-2 leaves a token after the match
    last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])  # [B, 1] t[L - 1]
    # e <= L - 2 keeps a token after the match inside the row (and the row's padding unread)
    rows, cand = ((tokens[:, :-1] == last) & (ends[None, :] <= lengths[:, None] - 2)).nonzero(as_tuple=True)  # [C]
    back = torch.arange(max_n, device=device)  # [n] offset j back from the end
    # History side: t[e - j]; suffix side: t[L - 1 - j]. Indices are clamped, then masked:
    # e - j >= 0 keeps the window inside the history; with e <= L-2 it also keeps the suffix
    # side inside the row (L - 1 - j > e - j >= 0), so run <= L - 1 on its own.
    hist_idx = cand[:, None] - back[None, :]  # [C, n]
    suf_idx = (lengths[rows, None] - 1 - back[None, :]).clamp(min=0)  # [C, n]
    same = (tokens[rows[:, None], hist_idx.clamp(min=0)] == tokens[rows[:, None], suf_idx]) & (hist_idx >= 0)
    run = same.long().cumprod(dim=1).sum(dim=1)  # [C] consecutive matches from j = 0
    key = torch.where(run >= min_n, run * (T + 1) + cand, -1)  # [C]
    best = torch.full((B,), -1, dtype=torch.int64, device=device).scatter_reduce(0, rows, key, "amax")  # [B]
    found = best >= 0  # [B]

    start = best % (T + 1) + 1  # [B] first token after the match end
    pos = start[:, None] + torch.arange(k, device=device)[None, :]  # [B, k]
    valid = found[:, None] & (pos < lengths[:, None])  # [B, k]
    picked = tokens.gather(1, pos.clamp(max=T - 1))  # [B, k]
    drafts = torch.where(valid, picked, drafts)
    num = valid.sum(dim=1)
    return drafts, num


def ngram_propose(tokens: torch.Tensor, min_n: int, max_n: int, k: int) -> torch.Tensor:
    """Prompt-lookup draft for one history. tokens: [T] int64 -> [<=k] int64 (empty: no match)."""
    assert tokens.dim() == 1, tokens.shape
    lengths = torch.tensor([tokens.shape[0]], device=tokens.device)
    drafts, num = ngram_propose_batch(tokens[None, :], lengths, min_n, max_n, k)  # [1, k], [1]
    return drafts[0, : int(num[0])]


class NgramDrafter:
    """vLLM's ``method="ngram"`` drafter: no model, a lookup in each request's own history."""

    name = "ngram"

    def __init__(self, min_n: int, max_n: int, impl: str = "torch"):
        if not 1 <= min_n <= max_n:
            raise ConfigError("drafter.min_n", min_n, f"need 1 <= min_n <= max_n (max_n={max_n})")
        if impl not in IMPLS:
            raise ConfigError("drafter.impl", impl, f"valid impls: {', '.join(IMPLS)}")
        self.min_n = min_n
        self.max_n = max_n
        self.impl = impl  # triton: specbench.kernels.ngram, on the GPU when there is one

    @classmethod
    def from_config(cls, cfg: NgramConfig) -> NgramDrafter:
        return cls(min_n=cfg.min_n, max_n=cfg.max_n, impl=getattr(cfg, "impl", "torch"))

    def propose(self, state: DraftState) -> DraftProposal:
        # state.tokens: B x [T_b]; padded into one [B, T] batch (pad value never read).
        lengths = torch.tensor([len(t) for t in state.tokens], dtype=torch.int64)  # [B]
        tokens = torch.nn.utils.rnn.pad_sequence(
            [t.to(torch.int64) for t in state.tokens], batch_first=True, padding_value=0
        )  # [B, T]
        propose = ngram_propose_batch
        if self.impl == "triton":
            device = torch.device("cuda") if torch.cuda.is_available() else tokens.device
            propose = load("ngram", device, "drafter.impl").ngram_triton
            tokens = tokens.to(device)
        drafts, num = propose(tokens, lengths.to(tokens.device), self.min_n, self.max_n, state.k)
        return DraftProposal(tokens=drafts, num_tokens=num, probs=None)
