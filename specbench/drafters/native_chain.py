"""Batched chain drafting over the native engine: the B requests of a round drafted together.

The per-request path (specbench.drafters.expand with one LMStepper per request) costs B x k
draft forwards a round. Here a draft model (a `Transformer`, engines/native.py) runs over a
`NativeEngine` whose rows are assigned to request ids: a free row for a new id, freed again by
`release`. One chain round at batch B is then at most B prefills (new requests only), one
batched forward that brings every row to its request's history, and k - 1 batched
single-token forwards:

sync: a row holds the tokens it has read (its request's last history and the drafts fed after
    it). The common prefix with the new history stays; the rest (rejected drafts) is dropped by
    setting the row's length, with no copy. A new request's row is prefilled with its history
    less the last token. One forward then reads every row's remaining tokens (ragged, padded to
    the longest; at least the last one); the logits at each row's last real input give the
    first draft's distribution.
steps: k - 1 forwards of one token per row, each feeding the previous step's drafts.

`greedy` takes the argmax (q is the point mass: probs None); otherwise each step samples the B
requests from their q at the run's parameters (float32 q [B, k, V] is returned). The generator
is the drafter's: one multinomial draw over the batch per step, requests in batch order within
a step (the per-request path draws request by request, all k steps each; so sampled drafts of
B > 1 differ from it by the order of the draws, greedy ones do not differ).

Rows padded past a request's real inputs, and rows of no request in this round, write only
past their row's length: nothing they hold is touched. The cache grows (rows, length: doubling,
entries copied) when a round needs more than it was sized for; `attach(rows=, max_length=)`
sizes it for the run so that it never has to.

Letters: B requests, R engine rows, q inputs per row in one forward, k drafts, V vocabulary.
"""

from __future__ import annotations

import logging
from typing import Callable, Hashable, Iterable, Optional

import torch

from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.lm_stepper import common_prefix
from specbench.sampling import SamplingParams, probs_from_logits, sample

log = logging.getLogger(__name__)

ROWS, MAX_LENGTH = 8, 2048  # default sizes for callers that do not pass the run's


class RowCache:
    """A batched draft cache's rows, one per request id, and what each row holds.

    Subclasses hold the cache itself and provide `cache_rows`, `max_length` and `_resize(rows,
    max_length)` (a larger cache keeping every row's entries and length)."""

    def __init__(self):
        self.row_of: dict = {}  # request id -> row
        self.held: list = []  # per row: [n] int64 on the CPU, the tokens whose entries it holds, or None (free)

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
        row = self.held.index(None)
        self.row_of[request_id] = row
        self.held[row] = torch.empty(0, dtype=torch.int64)
        return row, True

    def release(self, request_ids: Iterable[Hashable]) -> None:
        """Free these requests' rows (unknown ids are ignored)."""
        for request_id in request_ids:
            row = self.row_of.pop(request_id, None)
            if row is not None:
                self.held[row] = None


class NativeChain(RowCache):
    """Chains for B requests at a time over one NativeEngine, a row per request id.

    `build` makes the draft `Transformer` at the first chain round (a run of trees never pays for
    the fused copy of the weights); if it raises (a family the native engine does not run),
    `ready()` is False and the caller keeps its per-request path."""

    def __init__(self, build: Callable[[], object], rows: int = ROWS, max_length: int = MAX_LENGTH,
                 *, cuda_graphs: bool = True):
        if rows < 1 or max_length < 1:
            raise ValueError(f"NativeChain needs rows >= 1 and max_length >= 1, got {rows}, {max_length}")
        super().__init__()
        self._build, self._rows, self._max_length, self.cuda_graphs = build, rows, max_length, cuda_graphs
        self.model = None  # the Transformer, once built
        self.engine = None  # the NativeEngine, once built
        self._failed = False

    def ready(self) -> bool:
        """Build the model and its cache on the first call -> whether chains can run here."""
        if self.engine is None and not self._failed:
            try:
                self.model = self._build()
            except (ValueError, AttributeError, KeyError) as e:
                self._failed = True
                log.warning("batched chain drafting is off, chains run request by request: %s", e)
                return False
            self._resized(self._rows, self._max_length)
        return self.engine is not None

    @property
    def max_length(self) -> int:
        return self.engine.capacity - 1

    @property
    def cache_rows(self) -> int:
        return self.engine.rows

    def _resize(self, rows: int, max_length: int) -> None:
        from specbench.engines.native import NativeEngine

        old = self.engine
        self.engine = NativeEngine(self.model, rows, max_length, cuda_graphs=self.cuda_graphs, compile=False)
        if old is not None:  # a grown cache keeps every row's entries and length
            R, S = old.rows, old.capacity
            self.engine.cache_k[:, :R, :, :S] = old.cache_k
            self.engine.cache_v[:, :R, :, :S] = old.cache_v
            self.engine.lengths[:R] = old.lengths

    @torch.inference_mode()
    def propose(self, state: DraftState, method: str, params: SamplingParams,
                generator: Optional[torch.Generator]) -> DraftProposal:
        """A chain of state.k drafts for each of the B requests (expand.is_chain(state))."""
        assert self.ready(), "NativeChain.propose before a successful ready()"
        B, k = len(state.tokens), state.k
        ids = state.request_ids or tuple(range(B))
        assert len(ids) == B and len(set(ids)) == B, ids
        greedy = method == "greedy" or params.greedy
        histories = [t.detach().cpu().view(-1) for t in state.tokens]  # B x [T_b]
        # A row ends the round holding its history and k - 1 drafts (slots 0 .. T + k - 2); the
        # last slot of the engine only takes clamped padding writes.
        self._fit(ids, max(h.shape[0] for h in histories) + k)
        engine = self.engine
        rows, new = zip(*(self._row(i) for i in ids))

        # sync: roll back to the common prefix (or prefill a new row), then read the rest.
        pending = []  # B x [n_b], n_b >= 1
        for row, fresh, history in zip(rows, new, histories):
            T, held = history.shape[0], self.held[row]
            if fresh:
                keep = T - 1
                if keep:
                    engine.prefill(row, history[:keep])
                else:
                    engine.lengths[row] = 0
            else:
                keep = min(common_prefix(held, history), T - 1)
                if keep != held.shape[0]:
                    engine.lengths[row] = keep  # drop what differs: no copy
            pending.append(history[keep:])
        R, q = engine.rows, max(p.shape[0] for p in pending)
        inputs = torch.zeros(R, q, dtype=torch.int64)  # padding and idle rows read token 0
        for row, p in zip(rows, pending):
            inputs[row, : p.shape[0]] = p
        index = torch.tensor(list(rows), device=engine.device)  # [B]
        last = torch.tensor([p.shape[0] - 1 for p in pending], device=engine.device)  # [B]
        logits = engine.forward(inputs)[index, last]  # [B, V] (a copy: a CUDA graph's output is reused)
        keep_inputs = [[] for _ in range(R)]
        for row, p in zip(rows, pending):
            keep_inputs[row] = list(range(p.shape[0]))
        engine.advance(keep_inputs)

        # k steps: draft from the logits, feed the draft (all but the last).
        drafts, probs = [], []
        step = torch.zeros(R, 1, dtype=torch.int64, device=engine.device)
        one = [[] for _ in range(R)]
        for row in rows:
            one[row] = [0]
        for i in range(k):
            if greedy:
                token = logits.argmax(-1)  # [B]
            else:
                q_i = probs_from_logits(logits, params)  # [B, V] float32
                token = sample(q_i, generator)  # one draw per request, in batch order
                probs.append(q_i)
            drafts.append(token)
            if i + 1 < k:
                step[index, 0] = token.to(engine.device)
                logits = engine.forward(step)[index, 0]  # [B, V]
                engine.advance(one)
        tokens = torch.stack(drafts, 1).cpu()  # [B, k]
        for b, row in enumerate(rows):
            self.held[row] = torch.cat([histories[b], tokens[b, : k - 1]])
        q = None if greedy else torch.stack(probs, 1)  # [B, k, V]
        return DraftProposal(tokens, torch.full((B,), k, dtype=torch.int64), q, None)
