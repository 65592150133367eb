"""Batched chain and tree drafting for EAGLE / EAGLE-3 heads: the B requests of a round drafted together.

The per-request path (specbench.drafters.expand with one EagleStepper per request) costs B x k
head forwards a round. Here the head reads over a `StaticHeadCache` (specbench.heads) whose rows
are assigned to request ids: a free row for a new id, freed again by `release`. One chain round
at batch B is one batched forward that brings every row to its request's pairs, and k - 1
batched single-pair forwards; a tree round is the same sync, then k - 1 batched tree forwards
(the model is drafters/native_chain.py, for draft models):

sync: a row holds the pairs (target feature f_t, token x_{t+1}) of its request's last history:
    tokens history[1:] paired with features[:n - 1]. The common prefix with the new pairs stays
    (at most n - 2: the last pair is always read, it predicts the first draft); the rest is
    dropped by setting the row's length, with no copy. A row therefore reads accepted + 1 pairs
    a round after its first (`last_counts`), its whole history at its first. One forward then
    reads every row's remaining pairs (ragged, padded); the hidden state at each row's last real
    pair gives the first draft.
steps: k - 1 forwards of one pair per row: (the row's last output hidden state, its last draft)
    at the next position. These pairs lie past the row's synced length and the next sync drops
    them (pairs built from the head's own states are never kept, as in EagleStepper).
tree steps (`propose_tree`, EAGLE-2's expansion): step s feeds each row its step-s frontier, W
    nodes, written at slots synced + (s - 1) W + j past the row's synced pairs. A node's pair is
    (its parent's output hidden state: the root's is the sync's last one, its token) at
    position synced + s - 1 (its depth past the pairs), and a mask over the static cache lets
    it see its request's synced pairs, its ancestors' slots and its own (the parent's mask plus
    one slot): tree attention, with no per-node cache copy, which is EagleStepper's reorder by
    parent. The logits at the frontier [B, W, V] go to expand.expand_trees, which picks the
    nodes as the per-request path does. The lengths stay at the synced pairs: the next sync
    drops the tree entries.

Shapes are static, and a chain round synchronizes with the host twice (a tree round also once
a tree step, as NativeChain's: expand_trees copies each step's picks to the host): every
forward runs over all R cache rows (rows of no request in the round read padding past their
length; in a tree step, W padding nodes hanging on node 0) and attends over the cache's whole
capacity, masked ([R, q, S] for the sync and chains, [R, W, S] for tree steps), and the sync's
inputs are padded to a power of two (heads.static_width); a run thus meets a handful of
shapes, not one per round. Eager attention may plan per shape: on sm90 / sm100 torch gives
this masked bf16 attention to cuDNN, which builds (tens of ms) and caches a graph per shape,
and a key length that grew every round made that a build nearly every round. The sync's
indices are built on the CPU and copied to the device at once, a tree step's on the device;
the drafts come back in one copy at the end.

`greedy` takes the argmax (q is the point mass: probs None; EAGLE-3's over its draft vocabulary,
mapped to target ids, with no [B, V] tensor); otherwise each step samples the B requests from
their q at the run's parameters (float32 q [B, k, V] is returned), one draw over the batch per
step (the per-request path draws request by request, so sampled drafts of B > 1 differ from it
by the order of the draws; greedy ones do not differ). EAGLE-3's logits come from the head's own
`logits` (draft vocabulary placed at its target ids, -inf elsewhere).

Padded inputs write only past their row's length (or into the last slot, which no row reaches).
The cache is made at the first round and grows (rows, length: doubling, entries copied)
when a round needs more than it was sized for; `attach(rows=, max_length=)` sizes it for the
run so that it never has to.

Letters: B requests, R cache rows, q inputs per row in one forward, k drafts (tree steps), W
frontier nodes (topk), S cache slots, V vocabulary, H head width, D feature width.
"""

from __future__ import annotations

from typing import Optional

import torch

from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.expand import expand_trees, tree_proposal
from specbench.drafters.lm_stepper import common_prefix
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, RowCache
from specbench.heads import StaticHeadCache, forward_rows, static_width
from specbench.sampling import SamplingParams, probs_from_logits, sample


class EagleChain(RowCache):
    """Chains and trees for B requests at a time over one StaticHeadCache, a row per request id."""

    def __init__(self, head, rows: int = ROWS, max_length: int = MAX_LENGTH):
        if rows < 1 or max_length < 1:
            raise ValueError(f"EagleChain needs rows >= 1 and max_length >= 1, got {rows}, {max_length}")
        super().__init__()  # held: per row, the tokens of the pairs it keeps
        self.head, self._rows, self._max_length = head, rows, max_length
        self.cache: Optional[StaticHeadCache] = None  # made at the first round
        self.last_counts: dict = {}  # request id -> the pairs its row read in the last round's sync

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

    def _sync(self, state: DraftState, ids: tuple, histories: list, need: int) -> tuple:
        """Make room (`need` slots a row), then bring each request's row to its pairs (the
        module's sync) -> rows (B cache rows), rows_d [B] and synced_d [R] (each row's length
        after the sync) on the cache's device, and hidden [R, H]: each row's output at its last
        real pair (the first draft's; rows of no request: padding's)."""
        assert state.features is not None and len(state.features) == len(ids), "EAGLE drafting needs the target's features"
        assert all(h.shape[0] >= 2 for h in histories), "a history of one token has no feature to read"
        if self.cache is None:
            self._resized(self._rows, self._max_length)
        self._fit(ids, need)
        rows = [self._row(i)[0] for i in ids]
        cache, head = self.cache, self.head
        device, R, B = cache.keys.device, cache.rows, len(ids)

        # Roll each row back to the pairs it shares with its request (no copy), then read the
        # rest: accepted + 1 pairs a row after its first round.
        keeps = []
        for row, history in zip(rows, histories):
            pairs = history[1:]  # [n - 1] the token of each pair
            keep = min(kept_pairs(self.held[row], pairs), pairs.shape[0] - 1)
            cache.lengths[row] = keep
            self.held[row] = pairs
            keeps.append(keep)
        counts = [h.shape[0] - 1 - keep for h, keep in zip(histories, keeps)]  # B x n_b - 1 - keep >= 1
        self.last_counts = dict(zip(ids, counts))  # pairs each request's row read this round
        # Every cache row takes part in every forward (rows of no request read padding past their
        # length) and attention spans the whole cache: the shapes stay the same round after round.
        q = static_width(max(counts), cache.capacity)
        rows_t, counts_t = torch.tensor(rows), torch.tensor(counts)  # [B], [B]
        R_counts = torch.zeros(R, dtype=torch.int64)
        R_counts[rows_t] = counts_t
        starts = cache.lengths.clone()  # [R] the first slot each row writes
        # Where each real input goes in the padded [R * q] block: row * q + j, j < count.
        first = torch.repeat_interleave(rows_t * q - (counts_t.cumsum(0) - counts_t), counts_t)
        flat = first + torch.arange(first.shape[0])  # [sum counts]
        inputs = torch.zeros(R * q, dtype=torch.int64)  # padding reads token 0 (and a zero feature)
        inputs[flat] = torch.cat([h[keep + 1 :] for h, keep in zip(histories, keeps)])
        last = (R_counts - 1).clamp_(min=0)  # [R] each row's last real input
        synced = starts + R_counts  # [R] lengths after the sync: the drafts are written from there
        # One host-to-device copy for every index the round builds on the CPU.
        packed = torch.cat([starts, inputs, flat, last, rows_t, synced]).to(device)
        starts_d, inputs_d, flat_d, last_d, rows_d, synced_d = packed.split([R, R * q, flat.shape[0], R, B, R])
        features = torch.cat([f[keep:] for f, keep in zip(state.features, keeps)]).to(device)  # [sum counts, D]
        padded = features.new_zeros(R * q, features.shape[-1]).index_copy_(0, flat_d, features)
        hidden = forward_rows(head, padded.view(R, q, -1), inputs_d.view(R, q), cache, starts_d)  # [R, q, H]
        cache.lengths.copy_(synced)
        return rows, rows_d, synced_d, hidden[cache.row_range, last_d]  # [R, H] each row's last real input

    @torch.inference_mode()
    def propose(self, state: DraftState, method: str, params: SamplingParams,
                generator: Optional[torch.Generator]) -> DraftProposal:
        """A chain of state.k drafts for each of the B requests (expand.is_chain(state))."""
        B, k = len(state.tokens), state.k
        ids, histories = self._ids(state)  # B x [n_b]
        greedy = method == "greedy" or params.greedy
        # A row ends the round holding n - 1 pairs and k - 1 drafted ones (slots 0 .. n + k - 3);
        # the last slot only takes clamped padding writes.
        rows, rows_d, synced_d, hidden = self._sync(state, ids, histories, max(h.shape[0] for h in histories) + k)
        cache, head = self.cache, self.head
        R = cache.rows

        # k steps: draft from the requests' rows; feed every row (own hidden state, draft) for all but the last.
        drafts, probs = [], []
        step_ids = torch.zeros(R, 1, dtype=torch.int64, device=cache.keys.device)  # rows of no request read token 0
        for i in range(k):
            mine = hidden.index_select(0, rows_d)  # [B, H]
            if greedy:
                token = head.argmax(mine)  # [B]
            else:
                q_i = probs_from_logits(head.logits(mine), params)  # [B, V] float32
                token = sample(q_i, generator)  # one draw per request, in batch order
                probs.append(q_i)
            drafts.append(token)
            if i + 1 < k:
                step_ids.index_copy_(0, rows_d, token[:, None])
                hidden = forward_rows(head, hidden[:, None], step_ids, cache, synced_d + i)[:, 0]  # [R, H]
        cache.lengths[rows] += k - 1
        tokens = torch.stack(drafts, 1).cpu()  # [B, k]
        q_all = None if greedy else torch.stack(probs, 1)  # [B, k, V]
        return DraftProposal(tokens, torch.full((B,), k, dtype=torch.int64), q_all, None)

    @torch.inference_mode()
    def propose_tree(self, state: DraftState) -> DraftProposal:
        """EAGLE-2 trees for the B requests (not expand.is_chain(state)): the sync, k - 1 tree
        forwards of W nodes a row, then expand.expand_trees' bookkeeping, so the proposal is
        expand.draft's over one EagleStepper per request."""
        W = state.topk
        ids, histories = self._ids(state)  # B x [n_b]
        # Step s writes its frontier at slots n - 1 + (s - 1) W .. n - 2 + s W past the n - 1
        # synced pairs (the last at n - 2 + (k - 1) W); the last slot only takes clamped padding writes.
        need = max(h.shape[0] for h in histories) - 1 + (state.k - 1) * W
        rows, rows_d, synced_d, hidden = self._sync(state, ids, histories, need)
        cache, head = self.cache, self.head
        R, S, device = cache.rows, cache.capacity, cache.keys.device
        columns = cache.slot_range[:W]  # [W]
        # The previous frontier (the root at step 1) of every cache row: the slots each node sees
        # (its request's synced pairs, its ancestors and itself) and its output hidden state.
        seen = (cache.slot_range[None, :] < synced_d[:, None])[:, None]  # [R, 1, S]
        out = hidden[:, None]  # [R, 1, H]
        step = 0

        def feed(tokens, parent):  # [B, W] the new frontier, [B, W] its parents' rows in the previous one
            nonlocal seen, out, step
            # Rows of no request feed token 0 as children of node 0, past their length.
            inputs = torch.zeros(R, W, dtype=torch.int64, device=device).index_copy_(0, rows_d, tokens.to(device))
            parents = torch.zeros(R, W, dtype=torch.int64, device=device).index_copy_(0, rows_d, parent.to(device))
            starts = synced_d + step * W  # [R] the frontier's first slot
            slots = (starts[:, None] + columns).clamp_(max=S - 1)  # [R, W] where forward_rows writes each node
            # A node sees what its parent sees, and itself: no per-node cache copy.
            seen = seen.gather(1, parents[:, :, None].expand(R, W, S)).scatter_(2, slots[:, :, None], True)  # [R, W, S]
            features = out.gather(1, parents[:, :, None].expand(R, W, out.shape[-1]))  # [R, W, H] each parent's output
            positions = (synced_d + step)[:, None].expand(R, W)  # [R, W] depth step past the synced pairs
            out = forward_rows(head, features, inputs, cache, starts, None, positions, seen)  # [R, W, H]
            step += 1
            return head.logits(out.index_select(0, rows_d))  # [B, W, V]

        # The row keeps its length at its synced pairs: the tree entries past it are dropped at the next sync.
        root = head.logits(hidden.index_select(0, rows_d))  # [B, V]
        return tree_proposal(expand_trees(root, state, feed), state.max_nodes)


def kept_pairs(held: torch.Tensor, pairs: torch.Tensor) -> int:
    """How many leading pairs a row holds that the request still has: common_prefix, with one
    comparison in the usual case of a history that extends what the row holds."""
    m = held.shape[0]
    if m <= pairs.shape[0] and torch.equal(held, pairs[:m]):
        return m
    return common_prefix(held, pairs)
