"""The one place each metric is defined.

A *round* is one target forward after the prefill: a plain decode step for the baseline, a
verify step for speculation. The prefill emits the first token; every later token comes from a
round, so tokens_per_round = (new_tokens - requests) / rounds, which is exactly 1 for the
baseline and (1 - a^(k+1)) / (1 - a) in expectation for i.i.d. per-position acceptance a.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SpecStats:
    """Acceptance counters, in the spirit of vLLM's SpecDecodingStats."""

    k: int  # draft depth: chain length, or tree steps
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list = field(default_factory=list)  # [k] rounds that tested depth i with 0..i-1 accepted
    accepted_at: list = field(default_factory=list)  # [k] rounds that accepted depth i

    def __post_init__(self):
        self.reached = self.reached or [0] * self.k
        self.accepted_at = self.accepted_at or [0] * self.k

    def observe(self, num_drafted: int, num_accepted: int, tried: Optional[int] = None) -> None:
        """One round: num_drafted tokens (chain) or nodes (tree), num_accepted along the path, and
        tried, the depths at which a draft was tested (a chain: min(accepted + 1, drafted))."""
        tried = min(num_accepted + 1, num_drafted) if tried is None else tried
        assert 0 <= num_accepted <= tried <= min(num_drafted, self.k), (num_drafted, num_accepted, tried, self.k)
        self.rounds += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        for i in range(tried):
            self.reached[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def accept_pos(self) -> list:
        """Conditional acceptance per draft position: P(accept i | drafted i, accepted 0..i-1)."""
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached)]


@dataclass
class RoundClock:
    """Wall time per batched round, split in three: drafting (the proposal and the verify inputs
    built from it, a tree's mask included), the target's forward (at temperature 0 with its
    argmaxes on the host; above it with the round's sampled step launched behind it, so its host
    work overlaps the forward and its device time counts here), and the rest (the sampled step's
    results read back, the rule's host part, KV bookkeeping and cache moves, history updates).

    Each round also counts its live requests. While a batch drains (its last requests finishing
    with no prompt left to admit) rounds have fewer live requests, and drafting and bookkeeping
    cost less in them. A request, though, spends most of its rounds in full batches. The mean
    over request-rounds (each round weighted by its live requests) is what a request's rounds
    cost it."""

    steps: int = 0  # batched rounds: target forwards after the prefills
    draft_s: float = 0.0
    forward_s: float = 0.0
    other_s: float = 0.0
    prefill_s: float = 0.0  # the admissions' prefills (requests admitted together: once)
    elapsed_s: float = 0.0  # the decode loop, prefills included
    request_rounds: int = 0  # the rounds' live requests, summed
    request_round_s: float = 0.0  # each round's time (the three parts) times its live requests, summed

    def observe(self, draft_s: float, forward_s: float, other_s: float, live: int = 1) -> None:
        self.steps += 1
        self.draft_s += draft_s
        self.forward_s += forward_s
        self.other_s += other_s
        self.request_rounds += live
        self.request_round_s += (draft_s + forward_s + other_s) * live

    def per_step_ms(self, seconds: float) -> Optional[float]:
        return 1e3 * seconds / self.steps if self.steps else None


@dataclass
class RequestRecord:
    prompt_id: str
    prompt_tokens: int
    tokens: list  # generated token ids, EOS included when it was emitted
    ttft_s: float  # prompt in -> first token out
    decode_s: float  # first token out -> last token out
    drafted: list = field(default_factory=list)  # per round
    accepted: list = field(default_factory=list)  # per round
    prefill_wait_s: float = 0.0  # other requests' prefills run between its first and last token

    @property
    def rounds(self) -> int:
        return len(self.drafted)

    @property
    def tpot_s(self) -> Optional[float]:
        return self.decode_s / (len(self.tokens) - 1) if len(self.tokens) > 1 else None


def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _median_ms(values) -> Optional[float]:
    median = _median(values)
    return None if median is None else 1e3 * median


def tpot_ms(records: list) -> Optional[float]:
    """A run's TPOT: the median over its requests of each one's decode time per token after the first."""
    return _median_ms(r.tpot_s for r in records)


def summarize(records: list, stats: SpecStats, wall_s: float, clock: Optional[RoundClock] = None) -> dict:
    """Per-run metrics for the results row (speculative columns are None for the baseline).
    Throughput is generated tokens over the decode loop's wall time (all requests together)."""
    clock = clock or RoundClock()
    new_tokens = sum(len(r.tokens) for r in records)
    rounds = sum(r.rounds for r in records)
    speculative = stats.k > 0
    return {
        "new_tokens": new_tokens,
        "rounds": rounds,
        "drafted_tokens": stats.drafted if speculative else None,
        "accepted_tokens": stats.accepted if speculative else None,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_round": (new_tokens - len(records)) / rounds if rounds else None,
        # each request's own, the median over requests: the tau that tpot_ms, a median over
        # requests of round time / tau, sees (analysis.cost_model)
        "median_tokens_per_round": _median((len(r.tokens) - 1) / r.rounds for r in records if r.rounds),
        "accept_pos": stats.accept_pos if speculative else None,
        "accept_reached": list(stats.reached) if speculative else None,  # denominators of accept_pos
        "tpot_ms": tpot_ms(records),
        "ttft_ms": _median_ms(r.ttft_s for r in records),
        "throughput_tok_s": new_tokens / clock.elapsed_s if clock.elapsed_s else None,
        "draft_ms": clock.per_step_ms(clock.draft_s) if speculative else None,
        "verify_ms": clock.per_step_ms(clock.forward_s),
        "other_ms": clock.per_step_ms(clock.other_s),
        # draft + verify + other a round, over request-rounds: above their sum where a batch drains
        "request_round_ms": 1e3 * clock.request_round_s / clock.request_rounds if clock.request_rounds else None,
        # Prefill time per batched round: at batch > 1 a new request's prefill stalls the others
        # (continuous batching), a cost the per-round split above does not hold.
        "prefill_ms": clock.per_step_ms(clock.prefill_s),
        # What one request waits for: the prefills admitted while it decodes, per round of its
        # own, the median over requests (as tpot_ms is): the cost model's prefill term.
        "prefill_wait_ms": _median_ms(r.prefill_wait_s / r.rounds if r.rounds else None for r in records),
        "wall_s": wall_s,
    }
