"""Batched chain and tree drafting over the native engine: the B requests of a round drafted together.

The per-request path (specbench.drafters.expand with one LMStepper per request) costs B x k
draft forwards a round. Here a draft model (a `Transformer`, engines/native.py) runs over a
`NativeEngine` whose rows are assigned to request ids: a free row for a new id, freed again by
`release`. One chain round at batch B is then the new requests' prefills (one forward for each
run of consecutive rows), one batched forward that brings every row to its request's history,
and k - 1 batched single-token forwards (a tree round: the same sync, then k - 1 batched tree
forwards):

sync: a row holds the tokens it has read (its request's last history and the drafts fed after
    it). The common prefix with the new history stays; the rest (rejected drafts) is dropped by
    setting the row's length, with no copy. New requests' rows are prefilled with their
    histories less the last token, together (NativeEngine.prefill_rows). One forward then
    reads every row's remaining tokens (ragged, padded to a power of two at or above the
    longest, heads.static_width; at least the last one); the logits at each row's last real
    input give the first draft's distribution. A chain row reads 1 or 2 tokens a round, a
    tree's up to k + 1 (its accepted path and the bonus): with CUDA graphs every sync width a
    round can meet is captured at the first round, so that no capture (tens to hundreds of ms)
    lands inside a measured decode, where the warm-up's few rounds may not have met it.
steps: k - 1 forwards of one token per row, each feeding the previous step's drafts. Greedy
    chains run them over every row at fixed shapes, step i at slot length + i - 1 (rows of no
    request draft from padding, past their length), and replay the k - 1 forwards and their
    argmaxes from one CUDA graph (on CUDA, unless cuda_graphs is off; the sync and sampled
    steps replay the engine's graph of each forward shape).
tree steps (`propose_tree`): k - 1 tree forwards; step s feeds each row the frontiers of steps
    1 .. s (q = s W nodes at depth = step - 1, each seeing its ancestors among them and the
    history) and reads the logits at the step-s frontier [B, W, V]; expand.expand_trees picks
    the nodes exactly as the per-request path does. The lengths stay at the histories: the
    nodes written past them are dropped, and the next round's sync overwrites them.

`greedy` takes the argmax (q is the point mass: probs None); otherwise each step samples the B
requests from their q at the run's parameters (float32 q [B, k, V] is returned). The generator
is the drafter's: one multinomial draw over the batch per step, requests in batch order within
a step (the per-request path draws request by request, all k steps each; so sampled drafts of
B > 1 differ from it by the order of the draws, greedy ones do not differ).

Rows padded past a request's real inputs, and rows of no request in this round, write only
past their row's length: nothing they hold is touched. The cache grows (rows, length: doubling,
entries copied) when a round needs more than it was sized for; `attach(rows=, max_length=)`
sizes it for the run so that it never has to.

Letters: B requests, R engine rows, q inputs per row in one forward, k drafts (tree steps), W
frontier nodes (topk), V vocabulary.
"""

from __future__ import annotations

import logging
from typing import Callable, Hashable, Iterable, Optional

import numpy as np
import torch

from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.expand import expand_trees, tree_proposal
from specbench.drafters.lm_stepper import shared_prefix
from specbench.graphs import Graphed, supported as graphs_supported
from specbench.heads import static_width
from specbench.sampling import SamplingParams, probs_from_logits, sample

log = logging.getLogger(__name__)

ROWS, MAX_LENGTH = 8, 2048  # default sizes for callers that do not pass the run's


class RowCache:
    """A batched draft cache's rows, one per request id, and what each row holds.

    The per-request bookkeeping (which tokens a row holds, what it shares with its request's
    new history, the ragged inputs) is numpy on the host: at batch 48 the same work as torch
    operations on small CPU tensors cost about 20 dispatches a request, some milliseconds a
    round. Subclasses hold the cache itself and provide `cache_rows`, `max_length` and
    `_resize(rows, max_length)` (a larger cache keeping every row's entries and length)."""

    def __init__(self):
        self.row_of: dict = {}  # request id -> row
        self.held: list = []  # per row: [n] int64 numpy, the tokens whose entries it holds, or None (free)

    def ready(self) -> bool:
        """Whether batched chains can run (NativeChain: once its draft model is built)."""
        return True

    def _resized(self, rows: int, max_length: int) -> None:
        self._resize(rows, max_length)
        self.held += [None] * (rows - len(self.held))

    def _fit(self, ids: tuple, need: int) -> None:
        """Grow (doubling) if these requests need more free rows, or a row more than `need` slots."""
        new = len({i for i in ids if i not in self.row_of})
        rows, free = self.cache_rows, sum(h is None for h in self.held)
        if new > free or need > self.max_length:
            grown_rows = rows if new <= free else max(2 * rows, rows + new - free)
            grown_length = self.max_length if need <= self.max_length else max(2 * self.max_length, need)
            log.info("%s grows to %d rows x %d slots", type(self).__name__, grown_rows, grown_length)
            self._resized(grown_rows, grown_length)

    def _row(self, request_id: Hashable) -> tuple[int, bool]:
        """-> the request's row, and whether it is new (then the row is taken, holding nothing)."""
        row = self.row_of.get(request_id)
        if row is not None:
            return row, False
        row = next(r for r, held in enumerate(self.held) if held is None)
        self.row_of[request_id] = row
        self.held[row] = np.empty(0, dtype=np.int64)
        return row, True

    @staticmethod
    def _ids(state: DraftState) -> tuple[tuple, list]:
        """-> the round's request ids (B, distinct) and histories B x [T_b] int64 numpy (views
        of CPU tensors: not to be written)."""
        return state.ids, state.host_tokens()

    def release(self, request_ids: Iterable[Hashable]) -> None:
        """Free these requests' rows (unknown ids are ignored)."""
        for request_id in request_ids:
            row = self.row_of.pop(request_id, None)
            if row is not None:
                self.held[row] = None


class NativeChain(RowCache):
    """Chains and trees for B requests at a time over one NativeEngine, a row per request id.

    `build` makes the draft `Transformer` at the first round; if it raises (a family the native
    engine does not run), `ready()` is False and the caller keeps its per-request path."""

    def __init__(self, build: Callable[[], object], rows: int = ROWS, max_length: int = MAX_LENGTH,
                 *, cuda_graphs: bool = True, compile: bool = False):
        if rows < 1 or max_length < 1:
            raise ValueError(f"NativeChain needs rows >= 1 and max_length >= 1, got {rows}, {max_length}")
        super().__init__()
        self._build, self._rows, self._max_length, self.cuda_graphs = build, rows, max_length, cuda_graphs
        # the draft's layers through torch.compile as the target's are (engine.compile): eager
        # layers replay every unfused elementwise kernel from their graphs
        self.compile = compile
        self.model = None  # the Transformer, once built
        self.engine = None  # the NativeEngine, once built
        self._failed = False
        # A greedy chain's k - 1 steps and argmaxes, replayed from one CUDA graph (enabled once
        # the model is built on CUDA) or called eagerly; the sync replays the engine's own graphs.
        self._greedy = Graphed(self._greedy_chain, False)
        self._widths: set = set()  # sync widths whose engine graphs are captured (this cache)

    def ready(self) -> bool:
        """Build the model and its cache on the first call -> whether chains and trees can run here."""
        if self.engine is None and not self._failed:
            try:
                self.model = self._build()
            except (ValueError, AttributeError, KeyError) as e:
                self._failed = True
                log.warning("batched drafting is off, chains and trees run request by request: %s", e)
                return False
            self._resized(self._rows, self._max_length)
            self._greedy.enabled = self.cuda_graphs and graphs_supported(self.engine.device)
        return self.engine is not None

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    @property
    def cache_rows(self) -> int:
        return self.engine.rows

    def _resize(self, rows: int, max_length: int) -> None:
        from specbench.engines.native import NativeEngine

        old = self.engine
        self.engine = NativeEngine(self.model, rows, max_length, cuda_graphs=self.cuda_graphs, compile=self.compile)
        self._greedy.clear()  # captured over the old cache
        self._widths.clear()  # the new engine has no graphs
        if old is not None:  # a grown cache keeps every row's entries and length
            R, S = old.rows, old.capacity
            self.engine.cache_k[:, :R, :, :S] = old.cache_k
            self.engine.cache_v[:, :R, :, :S] = old.cache_v
            self.engine.lengths[:R] = old.lengths

    def _sync(self, ids: tuple, histories: list, most: int) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        """Bring each request's row to its history (the module's sync) -> the rows [B], their
        index [B] on the engine's device, and the logits [B, V] of each request's first draft.
        most: the tokens a row that drafted last round can have to read (accepted + 1)."""
        engine = self.engine
        self._capture_widths(most)
        rows, new = zip(*(self._row(i) for i in ids))
        pending = []  # B x [n_b], n_b >= 1: what each row reads
        prefills, cut = [], []  # new rows' (row, history less its last token); cut-back rows' (row, length)
        for row, fresh, history in zip(rows, new, histories):
            T, held = history.shape[0], self.held[row]
            if fresh:
                keep = T - 1
                if keep:
                    prefills.append((row, torch.from_numpy(history[:keep])))
                else:
                    cut.append((row, 0))
            else:
                keep = min(shared_prefix(held, history), T - 1)
                if keep != held.shape[0]:
                    cut.append((row, keep))
            pending.append(history[keep:])
        if prefills:  # the new requests' rows together (consecutive ones in one forward)
            engine.prefill_rows(*map(list, zip(*prefills)))
        R, q = engine.rows, static_width(max(p.shape[0] for p in pending), engine.capacity)
        inputs = np.zeros((R, q), dtype=np.int64)  # padding and idle rows read token 0
        last = np.empty(len(rows), dtype=np.int64)
        for b, (row, p) in enumerate(zip(rows, pending)):
            inputs[row, : p.shape[0]] = p
            last[b] = p.shape[0] - 1
        # One host-to-device copy: the inputs, each request's row and last real input, then the
        # rows cut back and their lengths (rows no prefill touched).
        cut = np.asarray(cut, dtype=np.int64).reshape(-1, 2)  # [C, 2] (row, length)
        packed = torch.from_numpy(np.concatenate([inputs.ravel(), np.asarray(rows, dtype=np.int64), last, cut.T.ravel()]))
        B, C = len(rows), cut.shape[0]
        inputs_d, index, last_d, at_d, length_d = packed.to(engine.device).split([R * q, B, B, C, C])
        if C:
            engine.lengths[at_d] = length_d  # drop what differs: no copy
        logits = engine.forward(inputs_d.view(R, q))[index, last_d]  # [B, V] (a copy: a CUDA graph's output is reused)
        keep_inputs = [[] for _ in range(R)]
        for row, p in zip(rows, pending):
            keep_inputs[row] = list(range(p.shape[0]))
        engine.advance(keep_inputs)
        for row, history in zip(rows, histories):
            self.held[row] = history.copy()  # the row now holds its history (a tree keeps it so)
        return rows, index, logits

    def _capture_widths(self, most: int) -> None:
        """With CUDA graphs: capture the engine's graph for every sync width up to `most` tokens
        a row (padded as the sync pads them) that this cache has not met. Zeros are written past
        every row's length (free slots, rewritten before anything reads them); the logits are
        dropped and no length moves."""
        engine = self.engine
        if not engine.cuda_graphs:
            return
        for q in sorted({static_width(c, engine.capacity) for c in range(1, most + 1)} - self._widths):
            engine.forward(torch.zeros(engine.rows, q, dtype=torch.int64, device=engine.device))
            self._widths.add(q)

    @torch.inference_mode()
    def propose(self, state: DraftState, method: str, params: SamplingParams,
                generator: Optional[torch.Generator]) -> DraftProposal:
        """A chain of state.k drafts for each of the B requests (expand.is_chain(state))."""
        assert self.ready(), "NativeChain.propose before a successful ready()"
        B, k = len(state.tokens), state.k
        ids, histories = self._ids(state)  # B x [T_b]
        greedy = method == "greedy" or params.greedy
        # A row ends the round holding its history and k - 1 drafts (slots 0 .. T + k - 2); the
        # last slot of the engine only takes clamped padding writes.
        self._fit(ids, max(h.shape[0] for h in histories) + k)
        engine = self.engine
        rows, index, logits = self._sync(ids, histories, 2)  # the last draft and the bonus, at most
        R = engine.rows

        if greedy:  # k - 1 steps and their argmaxes over every row, one graph
            first = torch.zeros(R, dtype=torch.int64, device=engine.device).index_copy_(0, index, logits.argmax(-1))
            chains, = self._greedy(k, first, engine.lengths)  # [R, k]
            tokens, q = chains.index_select(0, index).cpu(), None  # [B, k]
            engine.lengths[index] += k - 1
        else:  # k steps: sample from the logits, feed the draft (all but the last)
            drafts, probs = [], []
            step = torch.zeros(R, 1, dtype=torch.int64, device=engine.device)
            one = [[] for _ in range(R)]
            for row in rows:
                one[row] = [0]
            for i in range(k):
                q_i = probs_from_logits(logits, params)  # [B, V] float32
                token = sample(q_i, generator)  # one draw per request, in batch order
                drafts.append(token)
                probs.append(q_i)
                if i + 1 < k:
                    step[index, 0] = token.to(engine.device)
                    logits = engine.forward(step)[index, 0]  # [B, V]
                    engine.advance(one)
            tokens, q = torch.stack(drafts, 1).cpu(), torch.stack(probs, 1)  # [B, k], [B, k, V]
        fed = tokens[:, : k - 1].numpy()
        for b, row in enumerate(rows):
            self.held[row] = np.concatenate([histories[b], fed[b]])
        return DraftProposal(tokens, torch.full((B,), k, dtype=torch.int64), q, None)

    def _greedy_chain(self, k: int, first: torch.Tensor, lengths: torch.Tensor) -> tuple:
        """A greedy chain for every row, with fixed shapes and no host synchronization (a graph):
        first [R] each row's first draft, lengths [R] the rows' lengths after the sync ->
        (drafts [R, k],). Step i feeds draft i at slot lengths + i - 1 and leaves the lengths
        alone (propose moves them). Rows of no request draft from padding, past their length."""
        token, drafts = first, [first]
        for i in range(1, k):
            token = self.engine.forward_at(token[:, None], lengths + (i - 1))[:, 0].argmax(-1)  # [R]
            drafts.append(token)
        return (torch.stack(drafts, 1),)

    @torch.inference_mode()
    def propose_tree(self, state: DraftState) -> DraftProposal:
        """EAGLE-2 trees for the B requests (not expand.is_chain(state)): the sync, k - 1 tree
        forwards, then expand.expand_trees' bookkeeping, so the proposal is expand.draft's."""
        assert self.ready(), "NativeChain.propose_tree before a successful ready()"
        B, W = len(state.tokens), state.topk
        ids, histories = self._ids(state)  # B x [T_b]
        # The last step feeds (k - 1) W nodes at slots T .. T + (k - 1) W - 1 past the history;
        # the last slot of the engine only takes clamped padding writes.
        self._fit(ids, max(h.shape[0] for h in histories) + (state.k - 1) * W + 1)
        engine = self.engine
        rows, index, logits = self._sync(ids, histories, state.k + 1)  # the accepted path and the bonus
        R, device = engine.rows, engine.device
        fed = torch.zeros(B, 0, dtype=torch.int64, device=device)  # [B, n] the frontiers fed so far
        seen = torch.zeros(B, 0, 0, dtype=torch.bool, device=device)  # [B, n, n] their ancestors

        def feed(tokens, parent):  # [B, W] the new frontier, [B, W] its parents' frontier rows
            nonlocal fed, seen
            n = fed.shape[1]
            q = n + W  # every frontier so far: the new one attends to its ancestors among them
            ancestors = torch.eye(q, dtype=torch.bool, device=device).repeat(B, 1, 1)  # [B, q, q]
            ancestors[:, :n, :n] = seen
            if n:  # a new node sees what its parent (in the previous frontier) sees
                index_n = (n - W + parent.to(device))[:, :, None].expand(B, W, n)
                ancestors[:, n:, :n] = seen.gather(1, index_n)
            fed, seen = torch.cat([fed, tokens.to(device)], 1), ancestors
            inputs = torch.zeros(R, q, dtype=torch.int64, device=device)  # idle rows: token 0,
            depth = torch.zeros(R, q, dtype=torch.int64, device=device)  # depth 0, themselves only
            mask = torch.eye(q, dtype=torch.bool, device=device).repeat(R, 1, 1)  # [R, q, q]
            inputs[index], mask[index] = fed, seen
            depth[index] = torch.arange(q, device=device) // W  # step s's frontier at depth s - 1
            return engine.forward(inputs, depth, mask)[index, n:]  # [B, W, V] (a copy)

        # The row keeps its length at the history: the tree entries past it are overwritten next round.
        return tree_proposal(expand_trees(logits, state, feed), state.max_nodes)
