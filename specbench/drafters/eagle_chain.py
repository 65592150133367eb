"""Batched chain drafting for EAGLE / EAGLE-3 heads: the B requests of a round drafted together.

The per-request path (specbench.drafters.expand with one EagleStepper per request) costs B x k
head forwards a round. Here the head reads over a `StaticHeadCache` (specbench.heads) whose rows
are assigned to request ids: a free row for a new id, freed again by `release`. One chain round
at batch B is one batched forward that brings every row to its request's pairs, and k - 1
batched single-pair forwards (the model is drafters/native_chain.py, for draft models):

sync: a row holds the pairs (target feature f_t, token x_{t+1}) of its request's last history:
    tokens history[1:] paired with features[:n - 1]. The common prefix with the new pairs stays
    (at most n - 2: the last pair is always read, it predicts the first draft); the rest is
    dropped by setting the row's length, with no copy. One forward then reads every row's
    remaining pairs (ragged, padded to the longest); the logits and hidden state at each row's
    last real pair give the first draft.
steps: k - 1 forwards of one pair per row: (the row's last output hidden state, its last draft)
    at the next position. These pairs lie past the row's synced length and the next sync drops
    them (pairs built from the head's own states are never kept, as in EagleStepper).

`greedy` takes the argmax (q is the point mass: probs None); otherwise each step samples the B
requests from their q at the run's parameters (float32 q [B, k, V] is returned), one draw over
the batch per step (the per-request path draws request by request, so sampled drafts of B > 1
differ from it by the order of the draws; greedy ones do not differ). EAGLE-3's logits come
from the head's own `logits` (draft vocabulary placed at its target ids, -inf elsewhere).

Padded inputs write only past their row's length (or into the last slot, which no row reaches).
The cache is made at the first chain round and grows (rows, length: doubling, entries copied)
when a round needs more than it was sized for; `attach(rows=, max_length=)` sizes it for the
run so that it never has to.

Letters: B requests, R cache rows, q inputs per row in one forward, k drafts, V vocabulary,
H head width, D feature width.
"""

from __future__ import annotations

from typing import Optional

import torch

from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.lm_stepper import common_prefix
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, RowCache
from specbench.heads import StaticHeadCache, hidden_states_rows
from specbench.sampling import SamplingParams, probs_from_logits, sample


class EagleChain(RowCache):
    """Chains for B requests at a time over one StaticHeadCache, a row per request id."""

    def __init__(self, head, rows: int = ROWS, max_length: int = MAX_LENGTH):
        if rows < 1 or max_length < 1:
            raise ValueError(f"EagleChain needs rows >= 1 and max_length >= 1, got {rows}, {max_length}")
        super().__init__()  # held: per row, the tokens of the pairs it keeps
        self.head, self._rows, self._max_length = head, rows, max_length
        self.cache: Optional[StaticHeadCache] = None  # made at the first chain round

    @property
    def max_length(self) -> int:
        return self.cache.capacity - 1

    @property
    def cache_rows(self) -> int:
        return self.cache.rows

    def _resize(self, rows: int, max_length: int) -> None:
        if self.cache is None:
            weight = self.head.fc.weight
            self.cache = StaticHeadCache(self.head.config, rows, max_length + 1, weight.device, weight.dtype)
        else:  # a grown cache keeps every row's entries and length
            self.cache = self.cache.grown(rows, max_length + 1)

    @torch.inference_mode()
    def propose(self, state: DraftState, method: str, params: SamplingParams,
                generator: Optional[torch.Generator]) -> DraftProposal:
        """A chain of state.k drafts for each of the B requests (expand.is_chain(state))."""
        B, k = len(state.tokens), state.k
        ids = state.request_ids or tuple(range(B))
        assert len(ids) == B and len(set(ids)) == B, ids
        assert state.features is not None and len(state.features) == B, "EAGLE drafting needs the target's features"
        greedy = method == "greedy" or params.greedy
        histories = [t.detach().cpu().view(-1) for t in state.tokens]  # B x [n_b]
        assert all(h.shape[0] >= 2 for h in histories), "a history of one token has no feature to read"
        if self.cache is None:
            self._resized(self._rows, self._max_length)
        # A row ends the round holding n - 1 pairs and k - 1 drafted ones (slots 0 .. n + k - 3);
        # the last slot only takes clamped padding writes.
        self._fit(ids, max(h.shape[0] for h in histories) + k)
        rows = [self._row(i)[0] for i in ids]
        cache, head = self.cache, self.head
        device = cache.keys.device

        # sync: roll each row back to the pairs it shares with its request, then read the rest.
        keeps = []
        for row, history in zip(rows, histories):
            pairs = history[1:]  # [n - 1] the token of each pair
            keep = min(common_prefix(self.held[row], pairs), history.shape[0] - 2)
            cache.lengths[row] = keep  # drop what differs: no copy
            self.held[row] = pairs
            keeps.append(keep)
        counts = [h.shape[0] - 1 - keep for h, keep in zip(histories, keeps)]  # B x n_b - 1 - keep >= 1
        q, D = max(counts), state.features[0].shape[-1]
        features = torch.zeros(B, q, D, dtype=state.features[0].dtype, device=device)  # padding reads zeros
        inputs = torch.zeros(B, q, dtype=torch.int64)  # and token 0
        for b, (history, keep, n) in enumerate(zip(histories, keeps, counts)):
            features[b, :n] = state.features[b][keep:].to(device)
            inputs[b, :n] = history[keep + 1 :]
        hidden = hidden_states_rows(head, features, inputs.to(device), cache, rows, counts)  # [B, q, H]
        batch = torch.arange(B, device=device)
        last = hidden[batch, torch.tensor([n - 1 for n in counts], device=device)]  # [B, H]
        logits = head.logits(last)  # [B, V]

        # k steps: draft from the logits, feed (own hidden state, draft) for all but the last.
        drafts, probs = [], []
        for i in range(k):
            if greedy:
                token = logits.argmax(-1)  # [B]
            else:
                q_i = probs_from_logits(logits, params)  # [B, V] float32
                token = sample(q_i, generator)  # one draw per request, in batch order
                probs.append(q_i)
            drafts.append(token)
            if i + 1 < k:
                last = hidden_states_rows(head, last[:, None], token.to(device)[:, None], cache, rows, [1] * B)[:, 0]
                logits = head.logits(last)  # [B, V]
        tokens = torch.stack(drafts, 1).cpu()  # [B, k]
        q_all = None if greedy else torch.stack(probs, 1)  # [B, k, V]
        return DraftProposal(tokens, torch.full((B,), k, dtype=torch.int64), q_all, None)
