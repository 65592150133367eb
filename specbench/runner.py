"""The decoding loop over a batch of requests: plain autoregressive or speculative.

The engine holds `rows` requests at once (continuous batching: a finished request's row takes
the next prompt; every free row is admitted at once, in one prefill call). Each round drafts,
for every live request, a chain of up to k tokens or a tree (k levels), verifies all of them
and their bonus positions in one target forward [rows, q] (trees under their ancestor masks),
accepts by the rule for all live requests in one call (ragged: each keeps its own accepted
prefix; with rule.impl=triton one kernel launch for the batch, chains or trees; a tree's
onehot or standard walked as target_only, the same law: rules.TARGET_ONLY_LAW), and keeps
each accepted path in the engine's KV cache. At temperature 0 every rule is the argmax: the
target's argmaxes come to the host in one copy and each request's round is walked there
(specbench.rules' greedy_*_host, equal to the batched rules under "greedy"), whatever rule.impl.
Above it, p, the rule's draws and the rule run for every engine row in one call of a
specbench.sampled.Sampler, on CUDA one graph replay where the rule is a Triton kernel. Baseline
and speculation share this loop, its clocks and its token counting (k = 0 is the baseline).

Letters: B engine rows, A live requests, q inputs per row, k draft depth, M draft nodes, V vocabulary.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from specbench.drafters.base import DraftState, Drafter
from specbench.metrics import RequestRecord, RoundClock, SpecStats
from specbench.rules import NEEDS_DRAFT_PROBS, greedy_chain_host, greedy_tree_host, tree_rule_for_round, verify_trees
from specbench.sampled import Sampler
from specbench.sampling import SamplingParams, probs_from_logits, sample
from specbench.tree import TreeBuffers, compile_tree, with_root


@dataclass(frozen=True)
class Speculation:
    drafter: Drafter
    rule: str
    k: int  # draft depth: chain length, tree steps
    rule_params: dict = field(default_factory=dict)  # threshold_single / threshold_acc
    topk: int = 1  # tree shape (specbench.tree); topk = 1 and no num_draft_tokens is a chain
    num_draft_tokens: Optional[int] = None
    impl: str = "torch"  # rule.impl resolved (rules.resolve_impl): sampled rounds' rules in torch, or the Triton kernels


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _next_token(probs: torch.Tensor, params: SamplingParams, generator) -> torch.Tensor:
    """probs: [A, V] -> [A]"""
    return probs.argmax(-1) if params.greedy else sample(probs, generator)


@dataclass
class Round:
    emitted: list  # tokens this round emits, before the length and EOS cut
    num_drafted: int
    num_accepted: int
    tried: int  # depths at which a draft was tested
    path: list  # verify inputs kept: the input token (0) and the accepted drafts


@dataclass
class _Request:
    index: int  # into the prompts
    prompt_tokens: int
    history: torch.Tensor  # [room] prompt + generated (written through `written`, its numpy view)
    n: int  # tokens in history; the engine holds n - 1 of them
    t0: float
    ttft_s: float = 0.0
    prefill_mark: float = 0.0  # the batch's prefill clock when this request's first token came out
    generated: list = field(default_factory=list)
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    features: Optional[torch.Tensor] = None  # [room, D]: features[t], the target's state after token t (its row's)
    written: np.ndarray = field(init=False, repr=False)  # history as numpy, the same memory

    def __post_init__(self):
        self.written = self.history.numpy()  # made once: writing through it dispatches nothing


class _Histories(Sequence):
    """DraftState.tokens (or, with features=True, .features) of a round's requests: each
    request's tensor view, history [n] or features [n - 1, D], is made when a drafter reads it,
    so that the drafters that read `host` (numpy) or `feature_buffer` dispatch nothing per request."""

    def __init__(self, reqs: list, features: bool = False):
        self._reqs, self._features = reqs, features

    def __len__(self) -> int:
        return len(self._reqs)

    def __getitem__(self, b):
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        r = self._reqs[b]
        return r.features[: r.n - 1] if self._features else r.history[: r.n]


class _Batch:
    """The live requests, by engine row; refilled from the queue as requests finish."""

    def __init__(self, engine, prompts, params, generator, room_extra: int):
        self.engine, self.prompts, self.params, self.generator = engine, prompts, params, generator
        self.room_extra = room_extra
        self.queue = deque(range(len(prompts)))
        self.live: dict[int, _Request] = {}  # row -> request
        # With features: [rows, room, D] on the device, a row's request's features (made at the
        # first admission), so that a round's kept features go in with one write for all rows.
        self.features: Optional[torch.Tensor] = None
        self.room = max(p.shape[0] for p in prompts) + room_extra
        self.prefill_s = 0.0  # every admission's prefill time so far: what live requests wait for

    def keep_features(self, step_features: torch.Tensor, rows: list, reqs: list, paths: list) -> None:
        """step_features [B, q, D] of a verify forward: each live request keeps its inputs
        paths[j] (the input token and the accepted drafts) at positions n - 1, n, ... of its row."""
        count = [len(p) for p in paths]
        src_row = np.repeat(rows, count)
        src_pos = np.concatenate(paths)
        dst_pos = np.concatenate([np.arange(r.n - 1, r.n - 1 + c) for r, c in zip(reqs, count)])
        index = torch.from_numpy(np.stack([src_row, src_pos, dst_pos])).to(step_features.device)  # [3, sum], one copy
        self.features[index[0], index[2]] = step_features[index[0], index[1]]

    def admit(self, rows: list) -> None:
        """Prefill the next prompts into these free rows, in one call to the engine (batched
        where it can), and emit their first tokens: one draw for them all. Each admitted
        request's TTFT is the whole admission's, as they come out together."""
        rows = rows[: len(self.queue)]
        if not rows:
            return
        indices = [self.queue.popleft() for _ in rows]
        prompts = [self.prompts[i] for i in indices]
        t0 = time.perf_counter()
        outs = self.engine.prefill_rows(rows, prompts)
        logits = torch.stack([out[0] if self.engine.feature_layers else out for out in outs])  # [n, V]
        first = _next_token(probs_from_logits(logits, self.params), self.params, self.generator).tolist()
        _synchronize(self.engine.device)
        ttft = time.perf_counter() - t0
        self.prefill_s += ttft
        for row, i, prompt, out, token in zip(rows, indices, prompts, outs, first):
            T = prompt.shape[0]
            history = torch.empty(T + self.room_extra, dtype=torch.long)
            history[:T] = prompt
            history[T] = token
            r = _Request(index=i, prompt_tokens=T, history=history, n=T + 1, t0=t0, ttft_s=ttft,
                         prefill_mark=self.prefill_s, generated=[token])
            if self.engine.feature_layers:
                prompt_features = out[1]  # [T, D]
                if self.features is None:
                    self.features = prompt_features.new_empty(self.engine.rows, self.room, prompt_features.shape[-1])
                r.features = self.features[row]
                r.features[:T] = prompt_features
            self.live[row] = r


def decode_requests(
    engine,
    prompts: list,
    *,
    params: SamplingParams,
    max_new_tokens: int,
    eos_ids: frozenset,
    generator: torch.Generator,
    spec: Optional[Speculation] = None,
    stats: Optional[SpecStats] = None,
    clock: Optional[RoundClock] = None,
    prompt_ids: Optional[list] = None,
    sampler: Optional[Sampler] = None,
) -> list[RequestRecord]:
    """prompts: list of [T_i] int64 -> each request's generated tokens and timings, in order.

    Requests run engine.rows at a time. One generator draws for the whole batch, so sampled
    outputs depend on the seed and the batch size; greedy outputs on neither. sampler: the
    rounds' sampled draws (specbench.sampled; a run keeps one an engine, for its graphs), drawing
    from `generator`; by default an eager one."""
    device = engine.device
    sampler = sampler if sampler is not None else Sampler(params, generator)
    if sampler.generator is not generator:
        raise ValueError("decode_requests: sampler draws from another generator than `generator`")
    k = spec.k if spec else 0
    q_max = 1 + max(k, (spec.num_draft_tokens or 0) if spec else 0, k * (spec.topk if spec else 1))
    batch = _Batch(engine, prompts, params, generator, room_extra=max_new_tokens + q_max + 1)
    records: list = [None] * len(prompts)
    clock = clock if clock is not None else RoundClock()

    @functools.lru_cache(maxsize=4096)
    def compiled(parents: tuple) -> TreeBuffers:
        """A tree's buffers by its shape (proposal-form parents): a run meets the same shapes
        round after round, and the buffers are only read."""
        return compile_tree(with_root(torch.tensor(parents, dtype=torch.int64)))

    def done(r: _Request) -> bool:
        return len(r.generated) >= max_new_tokens or r.generated[-1] in eos_ids

    def retire() -> None:
        """Record every finished request, then give its row to the next prompt; again while a
        new request is finished by its first token (EOS, or max_new_tokens = 1). Every request
        that finished in a round is stamped before any admission, so that no request's decode
        time or prefill wait holds the prefills that follow its last token."""
        while finished := [row for row, r in batch.live.items() if done(r)]:
            _synchronize(device)
            end = time.perf_counter()
            for row in finished:
                r = batch.live.pop(row)
                records[r.index] = RequestRecord(
                    prompt_id=prompt_ids[r.index] if prompt_ids else str(r.index), prompt_tokens=r.prompt_tokens,
                    tokens=r.generated, ttft_s=r.ttft_s, decode_s=end - r.t0 - r.ttft_s,
                    drafted=r.drafted, accepted=r.accepted, prefill_wait_s=batch.prefill_s - r.prefill_mark,
                )
                if spec is not None and hasattr(spec.drafter, "release"):
                    spec.drafter.release((r.index,))
            batch.admit(finished)

    _synchronize(device)
    start = time.perf_counter()
    batch.admit(list(range(engine.rows)))
    while batch.live:
        retire()
        if not batch.live:
            break
        _synchronize(device)  # the prefills of admitted requests finish outside the round's clocks
        rows = sorted(batch.live)
        reqs = [batch.live[row] for row in rows]
        t_draft = time.perf_counter()
        proposal, num = None, [0] * len(reqs)
        if spec is not None:
            proposal = spec.drafter.propose(DraftState(
                tokens=_Histories(reqs), k=k, topk=spec.topk, num_draft_tokens=spec.num_draft_tokens,
                features=_Histories(reqs, features=True) if engine.feature_layers else None,
                feature_buffer=batch.features, feature_rows=tuple(rows),
                request_ids=tuple(r.index for r in reqs), host=[r.written[: r.n] for r in reqs],
            ))
            num = proposal.num_tokens.tolist()

        # Inputs [B, q]: each live row's last token, then its drafts; idle rows and padding read 0.
        # Built on the host and counted as drafting (SGLang builds a tree's mask in its draft
        # step too), so that verify_ms is the target's forward.
        M = proposal.tokens.shape[1] if proposal is not None else 0
        inputs = np.zeros((engine.rows, 1 + M), dtype=np.int64)  # numpy: no dispatch per request
        inputs[rows, 0] = [r.generated[-1] for r in reqs]  # history[n - 1]
        if M:
            drafts = proposal.tokens.cpu().numpy()  # [A, M], one copy; -1 past each request's num
            inputs[rows, 1:] = np.where(np.arange(M) < np.asarray(num)[:, None], drafts, 0)
        tokens = torch.from_numpy(inputs)  # [B, 1 + M]
        trees, tree_inputs, parents = {}, (), None
        if proposal is not None and not proposal.is_chain:
            depth = np.zeros((engine.rows, 1 + M), dtype=np.int64)
            ancestors = np.tile(np.eye(1 + M, dtype=bool), (engine.rows, 1, 1))  # padding sees itself
            parents = proposal.parents.cpu().numpy()  # [A, M]
            for j, (row, m) in enumerate(zip(rows, num)):
                trees[row] = tree = compiled(tuple(parents[j, :m].tolist()))
                depth[row, : m + 1] = tree.host.depth
                ancestors[row, : m + 1, : m + 1] = tree.host.mask
            tree_inputs = (torch.from_numpy(depth), torch.from_numpy(ancestors))
        _synchronize(device)
        t_forward = time.perf_counter()
        out = engine.forward(tokens, *tree_inputs)
        logits, step_features = out if engine.feature_layers else (out, None)
        best = sampled = None
        if params.greedy:  # every rule is the argmax: one copy of them, the rounds on the host
            best_rows = logits.argmax(-1).tolist()  # [B, q]
            best = [best_rows[row] for row in rows]  # [A, q]
        else:  # launched behind the forward, so that its host work overlaps the forward's device time
            sampled = _launch_sampled(spec, sampler, logits, rows, inputs, num, proposal, trees, parents)
        _synchronize(device)
        t_rule = time.perf_counter()

        if sampled is not None:
            rounds = sampled()
        elif spec is None:
            rounds = [Round([b[0]], 0, 0, 0, [0]) for b in best]
        elif hasattr(spec.drafter, "forced_acceptance"):
            rounds = _forced(spec.drafter, None, best, inputs[rows], num, generator)
        else:
            rounds = _greedy_rounds(best, inputs[rows].tolist(), num, [trees.get(row) for row in rows])
        keep = [[] for _ in range(engine.rows)]
        for row, r, rd in zip(rows, reqs, rounds):
            keep[row] = rd.path
        engine.advance(keep)

        if step_features is not None:  # each request's kept inputs' features, one gather and one write for all
            batch.keep_features(step_features, rows, reqs, [rd.path for rd in rounds])
        for row, r, rd in zip(rows, reqs, rounds):
            if stats is not None:
                stats.observe(rd.num_drafted, rd.num_accepted, rd.tried)
            r.drafted.append(rd.num_drafted)
            r.accepted.append(rd.num_accepted)
            emitted = rd.emitted[: max_new_tokens - len(r.generated)]
            for i, token in enumerate(emitted):
                if token in eos_ids:
                    emitted = emitted[: i + 1]
                    break
            r.written[r.n : r.n + len(emitted)] = emitted
            r.n += len(emitted)
            r.generated += emitted
        _synchronize(device)  # the round's cache moves (a tree path's KV entries) count in it
        clock.observe(t_forward - t_draft, t_rule - t_forward, time.perf_counter() - t_rule, live=len(rows))
    _synchronize(device)
    clock.elapsed_s += time.perf_counter() - start
    clock.prefill_s += batch.prefill_s
    return records


def _greedy_rounds(best: list, step: list, num: list, trees: list) -> list[Round]:
    """Temperature 0, every request on the host: best [A, q] the target's argmaxes, step [A, q]
    the verify inputs (the last token, then the drafts), num [A] drafts, trees [A] each request's
    TreeBuffers (None: a chain). The same rounds as verify_chain / verify_trees under "greedy"."""
    rounds = []
    for b, inputs, m, tree in zip(best, step, num, trees):
        if tree is None:
            emitted, a = greedy_chain_host(b, inputs[1 : m + 1])
            rounds.append(Round(emitted, m, a, min(a + 1, m), list(range(a + 1))))
        else:
            rounds.append(_verify_tree(tree, greedy_tree_host(b, inputs, tree.host.children)))
    return rounds


def _launch_sampled(spec, sampler, logits, rows, inputs, num, proposal, trees, parents) -> Callable[[], list]:
    """A sampled round's draws for every live request, and its rule (spec None: the baseline's
    token), launched where they can be (a Sampler call for every engine row: p, the draws and the
    rule in one, graphed on CUDA) before the host waits for the forward. -> a function of no
    arguments that reads the A requests' Rounds.
    logits [B, q, V]; inputs [B, q] the verify inputs (numpy: each row's last token, then its
    drafts, 0 past its num and on idle rows); trees: row -> TreeBuffers, parents [A, M] the
    proposal's (numpy; trees only). The eager pieces draw from the sampler's generator too."""
    params, generator = sampler.params, sampler.generator
    if spec is None:
        pending = sampler.tokens(logits)
        return lambda: [Round([t], 0, 0, 0, [0]) for t in _rows(pending.result(), rows)]
    if hasattr(spec.drafter, "forced_acceptance"):  # the synthetic control: eager, from the live rows' p
        return lambda: _forced(spec.drafter, probs_from_logits(_live(logits, rows), params), None, inputs[rows], num,
                               generator)
    if trees:  # every live request's tree in one call (impl=triton: one kernel launch)
        live_trees = [trees[row] for row in rows]
        rule, impl = tree_rule_for_round(spec.rule, spec.impl, inputs[rows, 1:], parents, num)
        thresholds = spec.rule_params if rule == "thresholded" else {}
        if impl == "triton":
            hosts = [trees[row].host if row in trees else None for row in range(len(inputs))]
            pending = sampler.trees(rule, logits, inputs, hosts, _thresholds(thresholds))
            return lambda: [_verify_tree(t, res) for t, res in zip(live_trees, _rows(pending.result(), rows))]

        def walked() -> list[Round]:  # the torch walk (a repeated sibling under a recursive rule): eager
            probs = probs_from_logits(_live(logits, rows), params)  # [A, q, V]
            results = verify_trees(rule, probs, torch.from_numpy(inputs[rows]).to(probs.device), live_trees,
                                   generator=generator, impl=impl, **thresholds)
            return [_verify_tree(t, res) for t, res in zip(live_trees, results)]

        return walked
    rule, draft_probs = spec.rule, proposal.probs
    if draft_probs is None and rule in NEEDS_DRAFT_PROBS:
        # A deterministic drafter's q is the point mass on its token, under which standard is
        # onehot exactly: u q(x) < p(x) is u < p(x), and max(0, p - q) is p with x zeroed. The
        # same draws, without building q [B, k, V] (tests/test_rules.py checks it draw for draw).
        rule = "onehot"
    B, k = inputs.shape[0], inputs.shape[1] - 1
    mine = np.zeros(B, dtype=np.int64)  # [B] drafts a row verifies: 0 on idle rows
    mine[rows] = num
    drafts = np.where(np.arange(k) < mine[:, None], inputs[:, 1:], -1)  # [B, k]
    if rule not in NEEDS_DRAFT_PROBS:
        draft_probs = None
    elif len(rows) < B:  # idle rows: zeros (they verify no draft)
        padded = draft_probs.new_zeros((B, *draft_probs.shape[1:]))
        padded[torch.tensor(rows, device=padded.device)] = draft_probs
        draft_probs = padded
    pending = sampler.chain(rule, spec.impl, logits, torch.from_numpy(drafts).to(logits.device), draft_probs,
                            _thresholds(spec.rule_params if rule == "thresholded" else {}))
    return lambda: [Round(t, m, a, min(a + 1, m), list(range(a + 1)))
                    for (t, a), m in zip(_rows(pending.result(), rows), num)]


def _rows(values: list, rows: list) -> list:
    """Every engine row's values -> the live rows'."""
    return [values[row] for row in rows]


def _live(logits: torch.Tensor, rows: list) -> torch.Tensor:
    """logits [B, q, V] -> the live rows' [A, q, V] (a copy of the index to the device where rows are idle)."""
    return logits if len(rows) == logits.shape[0] else logits[torch.tensor(rows, device=logits.device)]


def _thresholds(rule_params: dict) -> tuple[float, float]:
    return (rule_params.get("threshold_single", 1.0), rule_params.get("threshold_acc", 1.0))


def _verify_tree(tree, result) -> Round:
    """One request's walk as its round: the tree's m nodes are the root and m - 1 drafts."""
    m = tree.parents.shape[0]
    return Round(result.tokens, m - 1, result.num_accepted, result.tried, result.path)


def _forced(drafter, probs, best, step, num, generator) -> list[Round]:
    """The synthetic control: the drafter dictates each accepted prefix; the target's p at the
    stopping position gives the last token (its text is not the target's). probs [A, q, V], or
    under greedy best [A, q] the argmaxes; step: the verify inputs [A, q] (numpy)."""
    accepted = drafter.forced_acceptance(num)
    if best is not None:
        last = [row[a] for row, a in zip(best, accepted)]
    else:
        rows = torch.arange(len(num), device=probs.device)
        last = sample(probs[rows, torch.tensor(accepted, device=probs.device)], generator).tolist()
    return [Round(inputs[1 : a + 1] + [t], m, a, min(a + 1, m), list(range(a + 1)))
            for inputs, a, m, t in zip(step.tolist(), accepted, num, last)]


def decode(engine, prompt: torch.Tensor, *, prompt_id: str = "", **kwargs) -> RequestRecord:
    """One request: prompt [T] int64 -> its record (decode_requests with a single prompt)."""
    return decode_requests(engine, [prompt], prompt_ids=[prompt_id], **kwargs)[0]
