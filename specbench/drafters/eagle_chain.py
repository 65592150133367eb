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

CUDA graphs (on CUDA, unless `cuda_graphs=False`). Eagerly a one-layer head is host-bound: a
greedy chain round at k = 4 dispatches about 500 aten operations (SmolLM2-135M's EAGLE-3 head,
batch 1, counted on a CPU), and on an H200 host it cost 5 to 10 ms of drafting
(results/2026-12-03-h200-night), more than the 2-layer draft model that the native engine
replays from graphs. Through graphs the round dispatches about 60 outside two replays. So each of a round's head forwards is one function of
fixed-shape device tensors that never waits for the host, replayed from a graph per shape
(specbench.graphs.Graphed): the sync up to GRAPHED_WIDTH inputs a row (every width a request's
later rounds can need is captured at the first round), a greedy chain's k argmaxes and k - 1
steps as one graph, a sampled chain's step (the sampling stays eager), a tree step. Greedy
chains and tree steps run every cache row (rows of no request draft from padding, past their
length), so their graphs hold no per-round index. A cache that grows drops its graphs.

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

import numpy as np
import torch

from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.expand import expand_trees, tree_proposal
from specbench.drafters.lm_stepper import shared_prefix
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, RowCache
from specbench.graphs import Graphed, supported as graphs_supported
from specbench.heads import StaticHeadCache, forward_rows, static_width
from specbench.sampling import SamplingParams, probs_from_logits, sample

# The widest sync replayed from a CUDA graph. After its first round a request's row reads
# accepted + 1 <= k + 1 pairs; at its first it reads its whole prompt, which runs eagerly: a graph
# for each prompt width would keep that width's activations for the rest of the run.
GRAPHED_WIDTH = 16


class EagleChain(RowCache):
    """Chains and trees for B requests at a time over one StaticHeadCache, a row per request id."""

    def __init__(self, head, rows: int = ROWS, max_length: int = MAX_LENGTH, *, cuda_graphs: bool = True):
        if rows < 1 or max_length < 1:
            raise ValueError(f"EagleChain needs rows >= 1 and max_length >= 1, got {rows}, {max_length}")
        super().__init__()  # held: per row, the tokens of the pairs it keeps
        self.head, self._rows, self._max_length = head, rows, max_length
        self.cache: Optional[StaticHeadCache] = None  # made at the first round
        self.last_counts: dict = {}  # request id -> the pairs its row read in the last round's sync
        # The round's head forwards, each one function whether replayed from CUDA graphs (on CUDA
        # unless cuda_graphs is off) or called eagerly.
        on = cuda_graphs and graphs_supported(head.fc.weight.device)
        self._read = Graphed(self._read_rows, on)  # the sync, widths up to GRAPHED_WIDTH
        self._greedy = Graphed(self._greedy_chain, on)  # a greedy chain's k argmaxes and k - 1 steps
        self._step = Graphed(self._sampled_step, on)  # a sampled chain's step
        self._tree = Graphed(self._tree_step, on)  # a tree step
        self._widths: set = set()  # sync widths captured for the current cache

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
        for graphed in (self._read, self._greedy, self._step, self._tree):
            graphed.clear()  # captured over the old cache's tensors
        self._widths.clear()

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
        if self._read.enabled:
            self._capture_widths(state.k + 1, state.features[0])
        rows = [self._row(i)[0] for i in ids]
        cache = self.cache
        device, R, B = cache.keys.device, cache.rows, len(ids)

        # Roll each row back to the pairs it shares with its request (no copy), then read the
        # rest: accepted + 1 pairs a row after its first round. numpy on the host (RowCache).
        lengths = cache.lengths.numpy()  # [R] the CPU tensor's own memory
        keeps = []
        for row, history in zip(rows, histories):
            pairs = history[1:]  # [n - 1] the token of each pair
            keep = min(kept_pairs(self.held[row], pairs), pairs.shape[0] - 1)
            lengths[row] = keep
            self.held[row] = pairs.copy()
            keeps.append(keep)
        counts = [h.shape[0] - 1 - keep for h, keep in zip(histories, keeps)]  # B x n_b - 1 - keep >= 1
        self.last_counts = dict(zip(ids, counts))  # pairs each request's row read this round
        # Every cache row takes part in every forward (rows of no request read padding past their
        # length) and attention spans the whole cache: the shapes stay the same round after round.
        q = static_width(max(counts), cache.capacity)
        rows_n, counts_n = np.asarray(rows, dtype=np.int64), np.asarray(counts, dtype=np.int64)  # [B], [B]
        R_counts = np.zeros(R, dtype=np.int64)
        R_counts[rows_n] = counts_n
        starts = lengths.copy()  # [R] the first slot each row writes
        # Where each real input goes in the padded [R * q] block: row * q + j, j < count.
        first = np.repeat(rows_n * q - (counts_n.cumsum() - counts_n), counts_n)
        flat = first + np.arange(first.shape[0])  # [sum counts]
        inputs = np.zeros(R * q, dtype=np.int64)  # padding reads token 0 (and a zero feature)
        inputs[flat] = np.concatenate([h[keep + 1 :] for h, keep in zip(histories, keeps)])
        last = np.maximum(R_counts - 1, 0)  # [R] each row's last real input
        synced = starts + R_counts  # [R] lengths after the sync: the drafts are written from there
        # Where each real input's feature is in the runner's buffer (when it gives one): request
        # b's pairs keep .. keep + count - 1 of its buffer row.
        buffer = state.feature_buffer
        source = []
        if buffer is not None:
            keeps_n = np.asarray(keeps, dtype=np.int64)
            at = np.arange(flat.shape[0]) - np.repeat(counts_n.cumsum() - counts_n, counts_n)  # [sum counts] j
            source = [np.repeat(np.asarray(state.feature_rows, dtype=np.int64), counts_n), np.repeat(keeps_n, counts_n) + at]
        # One host-to-device copy for every index the round builds on the CPU.
        packed = torch.from_numpy(np.concatenate([starts, inputs, flat, last, rows_n, synced, *source])).to(device)
        starts_d, inputs_d, flat_d, last_d, rows_d, synced_d, *source_d = packed.split(
            [R, R * q, flat.shape[0], R, B, R] + [flat.shape[0]] * len(source))
        if buffer is not None:  # one gather from the buffer for every request
            features = buffer[source_d[0], source_d[1]].to(device)  # [sum counts, D]
        else:
            features = torch.cat([f[keep:] for f, keep in zip(state.features, keeps)]).to(device)  # [sum counts, D]
        padded = features.new_zeros(R * q, features.shape[-1]).index_copy_(0, flat_d, features)
        read = self._read if q <= GRAPHED_WIDTH else self._read.fn
        last_hidden, = read(None, padded.view(R, q, -1), inputs_d.view(R, q), starts_d, last_d)  # [R, H]
        lengths[:] = synced
        return rows, rows_d, synced_d, last_hidden

    def _capture_widths(self, most: int, like: torch.Tensor) -> None:
        """With CUDA graphs: capture the sync's graph for every width that a request's later
        rounds can need (accepted + 1 <= most pairs) before a round needs it, so that no capture
        lands in a measured round. Their inputs are zeros, written past every row's length (free
        slots, rewritten before anything reads them), and their outputs are dropped. like: a
        request's features [T, D], whose width and dtype the sync's inputs have."""
        cache = self.cache
        R, device = cache.rows, cache.keys.device
        widths = {static_width(c, cache.capacity) for c in range(1, most + 1)} - self._widths
        for q in sorted(w for w in widths if w <= GRAPHED_WIDTH):
            self._read(None, like.new_zeros(R, q, like.shape[-1], device=device),
                       torch.zeros(R, q, dtype=torch.int64, device=device), cache.lengths.to(device),
                       torch.zeros(R, dtype=torch.int64, device=device))
            self._widths.add(q)

    # --- the round's head forwards over every cache row: fixed shapes, no host synchronization,
    # so that each can be replayed from a CUDA graph (specbench.graphs.Graphed: fn(key, *inputs)).

    def _read_rows(self, _, features, inputs, starts, last) -> tuple:
        """The sync's forward: features [R, q, D] and inputs [R, q] read at slots starts [R] + j
        -> (hidden [R, H] at each row's input last [R],)"""
        hidden = forward_rows(self.head, features, inputs, self.cache, starts)  # [R, q, H]
        return (hidden[self.cache.row_range, last],)

    def _greedy_chain(self, k, hidden, synced) -> tuple:
        """A greedy chain for every row: hidden [R, H] the sync's output, synced [R] each row's
        length after it -> (drafts [R, k] target ids,). Step i feeds (state, draft) at synced + i.
        Rows of no request draft from padding, past their length."""
        head, cache, drafts = self.head, self.cache, []
        for i in range(k):
            token = head.argmax(hidden)  # [R]
            drafts.append(token)
            if i + 1 < k:
                hidden = forward_rows(head, hidden[:, None], token[:, None], cache, synced + i)[:, 0]  # [R, H]
        return (torch.stack(drafts, 1),)

    def _sampled_step(self, _, hidden, tokens, starts) -> tuple:
        """A sampled chain's step: (hidden [R, H], tokens [R]) at slots starts [R] -> (hidden [R, H],)"""
        return (forward_rows(self.head, hidden[:, None], tokens[:, None], self.cache, starts)[:, 0],)

    def _tree_step(self, _, seen, out, inputs, parents, starts, positions) -> tuple:
        """A tree step for every row: seen [R, P, S] and out [R, P, H] the previous frontier's
        visible slots and output states (the root's at step 1: P = 1); inputs [R, W] the new
        frontier, parents [R, W] each node's parent in the previous one; starts [R] the
        frontier's first slot, positions [R] its depth past the synced pairs -> (seen [R, W, S],
        out [R, W, H], logits [R, W, V]). A node sees what its parent sees, and itself: no
        per-node cache copy."""
        cache = self.cache
        (R, W), S = inputs.shape, cache.capacity
        slots = (starts[:, None] + cache.slot_range[:W]).clamp_(max=S - 1)  # [R, W] where forward_rows writes each node
        seen = seen.gather(1, parents[:, :, None].expand(R, W, S)).scatter_(2, slots[:, :, None], True)
        features = out.gather(1, parents[:, :, None].expand(R, W, out.shape[-1]))  # [R, W, H] each parent's output
        out = forward_rows(self.head, features, inputs, cache, starts, None, positions[:, None].expand(R, W), seen)
        return seen, out, self.head.logits(out)

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
        if greedy:  # k argmaxes and k - 1 steps, one graph
            drafts, = self._greedy(k, hidden, synced_d)  # [R, k]
            tokens, q_all = drafts.index_select(0, rows_d).cpu(), None  # [B, k]
        else:  # sampled from the requests' rows; every row fed (own hidden state, draft) for all but the last
            step_ids = torch.zeros(self.cache.rows, dtype=torch.int64, device=rows_d.device)  # no request's rows: 0
            drafts, probs = [], []
            for i in range(k):
                q_i = probs_from_logits(self.head.logits(hidden.index_select(0, rows_d)), params)  # [B, V] float32
                token = sample(q_i, generator)  # one draw per request, in batch order
                drafts.append(token)
                probs.append(q_i)
                if i + 1 < k:
                    step_ids.index_copy_(0, rows_d, token)
                    hidden, = self._step(None, hidden, step_ids, synced_d + i)  # [R, H]
            tokens, q_all = torch.stack(drafts, 1).cpu(), torch.stack(probs, 1)  # [B, k], [B, k, V]
        self.cache.lengths[rows] += k - 1
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
        cache = self.cache
        R, device = cache.rows, cache.keys.device
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
            # The frontier's first slot, and its depth past the synced pairs: [R] each.
            seen, out, logits = self._tree(None, seen, out, inputs, parents, synced_d + step * W, synced_d + step)
            step += 1
            return logits.index_select(0, rows_d)  # [B, W, V]

        # The row keeps its length at its synced pairs: the tree entries past it are dropped at the next sync.
        root = self.head.logits(hidden.index_select(0, rows_d))  # [B, V]
        return tree_proposal(expand_trees(root, state, feed), state.max_nodes)


def kept_pairs(held: np.ndarray, pairs: np.ndarray) -> int:
    """How many leading pairs a row holds that the request still has: shared_prefix, with one
    comparison in the usual case of a history that extends what the row holds."""
    m = held.shape[0]
    if m <= pairs.shape[0] and np.array_equal(held, pairs[:m]):
        return m
    return shared_prefix(held, pairs)
