"""Prompt-lookup (n-gram) drafting: copy what followed the last time the current suffix occurred.

For a history t[0..T-1] the drafter looks for the longest n in [min_n, max_n] whose suffix
t[T-n..T-1] occurs earlier, at some start i with i + n <= T - 1 (so not the suffix itself, and
at least one token follows the match), and proposes the up-to-k tokens that follow it,
t[i+n : min(i+n+k, T)]. Among matches of that longest n the rightmost (most recent) one wins:
vLLM v0.32.0's GPU speculator (v1/worker/gpu/spec_decode/ngram/speculator.py, which `ngram` and
`ngram_gpu` both select in the V2 model runner) packs (n, position) into one score and takes the
maximum. vLLM's older CPU proposer (v1/spec_decode/ngram_proposer.py, a KMP over the reversed
history) keeps the earliest of the longest matches instead. No match: no proposal this round.

Two implementations of the one search, tested against the rule read literally:
`ngram_propose_host` in numpy over the histories where the runner keeps them (the drafter's
path: about 25 numpy calls a round whatever B, no torch dispatch, no thread pool), and
`ngram_propose_batch` in torch over a padded batch on any device (the reference for the Triton
kernel, specbench.kernels.ngram, which `drafter.impl=triton` selects).

Letters: B requests, k draft tokens, T tokens so far, E candidate match end positions (T - 1),
N tokens of all B histories, C candidate ends.
"""

from __future__ import annotations

import numpy as np
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


def ngram_propose_host(histories: list, min_n: int, max_n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt-lookup drafts for B histories of any lengths, in numpy, with no padding.

    histories: B x [T_b] int64 numpy. Returns (drafts [B, k] int64 with -1 past each row's
    count, num_tokens [B] int64 in 0..k), what ngram_propose_batch returns for them.

    The same search as ngram_propose_batch on the B histories laid end to end ([N]): a
    candidate end e of row b lies in [start_b, last_b - 1] and holds t[last_b]; its run compares
    t[e - j] with t[last_b - j] while e - j stays in the row. The candidates come out of one
    nonzero in position order, so row by row, and each row's best key is one reduceat.
    """
    B = len(histories)
    drafts = np.full((B, k), -1, dtype=np.int64)
    flat = np.concatenate(histories).astype(np.int64, copy=False) if B else np.zeros(0, np.int64)  # [N]
    if flat.shape[0] < 2 or k < 1:  # a match needs one token before the suffix and one after it
        return drafts, np.zeros(B, dtype=np.int64)
    lengths = np.fromiter((h.shape[0] for h in histories), dtype=np.int64, count=B)  # [B]
    starts = np.cumsum(lengths) - lengths  # [B] each row's first index in flat
    last = starts + lengths - 1  # [B] each row's last token (start - 1 for an empty row: no candidates)
    row_of = np.repeat(np.arange(B), lengths)  # [N]
    positions = np.arange(flat.shape[0])  # [N]
    # e <= last - 1 leaves a token after the match inside the row
    cand = np.flatnonzero((flat == flat.take(last, mode="clip")[row_of]) & (positions < last[row_of]))  # [C]
    rows = row_of[cand]  # [C], ascending
    back = np.arange(max_n)  # [n]
    hist_idx = cand[:, None] - back  # [C, n]
    suf_idx = last[rows, None] - back  # [C, n]; > hist_idx, so inside the row wherever hist_idx is
    same = (flat.take(hist_idx, mode="clip") == flat.take(suf_idx, mode="clip")) & (hist_idx >= starts[rows, None])
    run = np.logical_and.accumulate(same, axis=1).sum(axis=1)  # [C] consecutive matches from j = 0
    T = int(lengths.max())
    key = np.where(run >= min_n, run * (T + 1) + (cand - starts[rows]), -1)  # [C] e counted in its row
    best = np.full(B, -1, dtype=np.int64)  # [B]
    if cand.shape[0]:
        with_cand, first = np.unique(rows, return_index=True)
        best[with_cand] = np.maximum.reduceat(key, first)

    pos = best[:, None] % (T + 1) + 1 + np.arange(k)  # [B, k] the tokens after the match end, in the row
    valid = (best[:, None] >= 0) & (pos < lengths[:, None])  # [B, k]
    drafts = np.where(valid, flat.take(starts[:, None] + pos, mode="clip"), drafts)
    return drafts, valid.sum(axis=1)


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
        self.impl = impl  # torch: ngram_propose_host on the host; triton: specbench.kernels.ngram, on the GPU when there is one

    @classmethod
    def from_config(cls, cfg: NgramConfig) -> NgramDrafter:
        return cls(min_n=cfg.min_n, max_n=cfg.max_n, impl=getattr(cfg, "impl", "torch"))

    def propose(self, state: DraftState) -> DraftProposal:
        if self.impl != "triton":
            drafts, num = ngram_propose_host(state.host_tokens(), self.min_n, self.max_n, state.k)  # [B, k], [B]
            return DraftProposal(tokens=torch.from_numpy(drafts), num_tokens=torch.from_numpy(num), probs=None)
        # state.tokens: B x [T_b]; padded into one [B, T] batch (pad value never read).
        lengths = torch.tensor([len(t) for t in state.tokens], dtype=torch.int64)  # [B]
        tokens = torch.nn.utils.rnn.pad_sequence(
            [t.to(torch.int64) for t in state.tokens], batch_first=True, padding_value=0
        )  # [B, T]
        device = torch.device("cuda") if torch.cuda.is_available() else tokens.device
        tokens = tokens.to(device)
        drafts, num = load("ngram", device, "drafter.impl").ngram_triton(
            tokens, lengths.to(device), self.min_n, self.max_n, state.k
        )
        return DraftProposal(tokens=drafts, num_tokens=num, probs=None)
