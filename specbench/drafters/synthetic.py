"""The synthetic control for timing studies (vLLM's synthetic_acceptance_rates).

It drafts a real chain of k tokens with the target's first `draft_layers` layers (so the draft
costs what a small layer-skip draft costs) and the target runs its real verify forward, but
acceptance is dictated: draft position i is accepted with the prescribed conditional rate
a_i, given 0..i-1 accepted. The round then emits the accepted drafts and one token from the
target's p at the stopping position (the draft forwards run batched over the requests, as
layerskip's chains: specbench.drafters.native_chain). Tokens per round are
E = sum_{j=0..k} prod_{i<j} a_i: in expectation under i.i.d. coins (`coins="random"`: a row
of 1000 tokens realises E to within 3 to 4 %, sd), and to within 2 % in any 300 requests'
rounds under `coins="quasi"` (sd 0.3 %: one uniform per request and round from a golden-ratio
Weyl sequence, inverted through the law of the accepted count). The text is *not* the target's
(drafts are accepted whatever the target thinks), so its rows have no greedy-equality check.
Chains only, for B requests at a time, each with a row of the draft cache until `release`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from specbench.config import ConfigError, SyntheticConfig
from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.expand import ChainsAndTrees, Steppers, is_chain
from specbench.drafters.layerskip import truncated
from specbench.drafters.lm_stepper import LMStepper
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, NativeChain
from specbench.sampling import SamplingParams


COINS = ("random", "quasi")
GOLDEN = (5**0.5 - 1) / 2  # the Weyl step: frac(t * GOLDEN) is the most evenly spread sequence of its kind


class SyntheticDrafter(ChainsAndTrees):
    name = "synthetic"
    feature_layers = ()

    def __init__(self, acceptance_rates: list, draft_layers: int, params: SamplingParams, seed: int = 0,
                 coins: str = "random"):
        rates = [float(a) for a in acceptance_rates]
        if not rates or not all(0.0 <= a <= 1.0 for a in rates):
            raise ConfigError("drafter.acceptance_rates", acceptance_rates, "need one or more rates in [0, 1]")
        if coins not in COINS:
            raise ConfigError("drafter.coins", coins, f"valid coins: {', '.join(COINS)}")
        self.rates, self.draft_layers, self.params, self.coin_kind = rates, draft_layers, params, coins
        self.method, self.generator = "greedy", None  # the drafts' text does not matter: acceptance is dictated
        self.seed = seed
        self.restart()
        self.steppers: Optional[Steppers] = None  # request id -> LMStepper (if the native chain cannot run)
        self.chain: Optional[NativeChain] = None  # batched chains

    @classmethod
    def from_config(cls, cfg: SyntheticConfig, params: SamplingParams, seed: int = 0) -> SyntheticDrafter:
        return cls(list(cfg.acceptance_rates), cfg.draft_layers, params, seed, cfg.coins)

    def attach(self, target, rows: int = ROWS, max_length: int = MAX_LENGTH, *, cuda_graphs: bool = True,
               compile: bool = False) -> None:
        from specbench.engines.native import Transformer

        view = truncated(target, self.draft_layers)
        self.steppers = Steppers(lambda: LMStepper(view))
        self.chain = NativeChain(lambda: Transformer.from_hf(view), rows, max_length, cuda_graphs=cuda_graphs,
                                 compile=compile)

    def restart(self) -> None:
        """Back to the first of its coins: each measured decode of a run dictates the same acceptance."""
        self.coins = np.random.default_rng(self.seed)  # acceptance: a stream of its own, drawn on the host
        self.weyl = np.random.default_rng([self.seed, 1]).random()  # quasi: the start, then frac(start + t * GOLDEN)

    def rate(self, i: int) -> float:
        """Conditional acceptance of draft position i (0-based); the last rate repeats."""
        return self.rates[min(i, len(self.rates) - 1)]

    def propose(self, state: DraftState) -> DraftProposal:
        if not is_chain(state):
            raise ConfigError("tree.topk", state.topk, "the synthetic control drafts chains only (topk=1)")
        return super().propose(state)

    def forced_acceptance(self, num_drafted: list) -> list:
        """The accepted prefix length of each request's round of num_drafted[j] drafts: position
        i passes with probability rate(i) given 0..i-1 passed, and the prefix stops at the first
        that fails. random: a coin per position. quasi: one uniform u per request, and
        position i passes when u < rate(0) ... rate(i) (the chance of reaching past i), which
        is the same law."""
        width = max(num_drafted, default=0)
        rates = np.array([self.rate(i) for i in range(width)])
        if self.coin_kind == "random":
            passed = self.coins.random((len(num_drafted), width)) < rates  # [A, width], one draw for the batch
        else:
            u = (self.weyl + GOLDEN * np.arange(len(num_drafted))) % 1.0  # [A]
            self.weyl = (self.weyl + GOLDEN * len(num_drafted)) % 1.0
            passed = u[:, None] < np.cumprod(rates)  # [A, width]
        passed &= np.arange(width) < np.array(num_drafted)[:, None]  # past a request's drafts: a stop
        stopped = np.concatenate([~passed, np.ones((len(num_drafted), 1), dtype=bool)], axis=1)
        return stopped.argmax(1).tolist()  # the first stop: the accepted count
