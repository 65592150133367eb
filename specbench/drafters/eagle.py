"""EAGLE and EAGLE-3 drafters: a one-layer head over the target's hidden states (specbench.heads).

The head reads pairs: the target's feature at position t (its state after reading token t)
with the embedding of token t+1, and predicts token t+2. After a verify the runner hands over
the features of every verified position, so the first draft comes from the pair (f_{n-2},
x_{n-1}); each later draft feeds the head's own output hidden state back in place of the
target's feature (EAGLE's feature-level autoregression). Pairs built from the head's own
states are never kept: the next round replaces them with the target's real features.

EAGLE reads the target's final-norm output; EAGLE-3 three hidden states (low, middle, high),
concatenated and projected by its `fc`. Both draft chains or EAGLE-2 trees (drafters.expand) for
B requests at a time, the whole batch together over one head cache with a row per request
(drafters/eagle_chain.py), until `release`. EagleStepper, a head cache of its own per request,
is the per-request path those batched proposals are tested against.

Letters: B requests, W rows (1, or the tree's frontier), V vocabulary, H head width, D feature width.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from specbench import fetch
from specbench.config import ConfigError, EagleConfig
from specbench.drafters.eagle_chain import EagleChain
from specbench.drafters.expand import ChainsAndTrees, Steppers, check_sample_method
from specbench.drafters.lm_stepper import common_prefix
from specbench.drafters.native_chain import MAX_LENGTH, ROWS
from specbench.heads import HeadCache, load_head
from specbench.models import looks_local
from specbench.sampling import SamplingParams


class EagleStepper:
    def __init__(self, head):
        self.head = head
        self.cache = HeadCache()
        self.seen = torch.empty(0, dtype=torch.int64)  # [P] token of each cached pair (x_{j+1})
        self.synced = 0  # pairs built from the target's features
        self.last: Optional[torch.Tensor] = None  # [W, H] the head's output at each row's last pair

    def _read(self, features, tokens, start: int) -> torch.Tensor:
        """features: [W, s, D], tokens: [W, s] paired, at positions start.. -> logits [W, s, V]."""
        W, s = tokens.shape
        positions = torch.arange(start, start + s, device=tokens.device).expand(W, s)
        hidden, logits = self.head(features, tokens, positions, self.cache)
        self.last = hidden[:, -1]
        return logits

    def sync(self, history: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """history: [n], features: [n - 1, D] -> logits [1, V] of the first draft."""
        n = history.shape[0]
        targets = history[1:].cpu()  # [n - 1] token paired with each feature
        common = common_prefix(self.seen, targets)
        keep = min(common, n - 2)  # read at least the last pair: it predicts the first draft
        self.cache.crop(keep)
        device = features.device
        logits = self._read(features[keep:].unsqueeze(0), history[keep + 1 :].to(device).unsqueeze(0), keep)
        self.seen, self.synced = targets.clone(), n - 1
        return logits[:, -1]

    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [W] -> [W, V]; the feature is each row's own last output."""
        return self._read(self.last.unsqueeze(1), tokens.view(-1, 1), self.cache.length)[:, -1]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.select(rows)
        self.last = self.last[rows.to(self.last.device)]

    def restart(self) -> None:
        self.select(torch.zeros(1, dtype=torch.int64))
        self.cache.crop(self.synced)


def _local(path: str) -> Path:
    local = fetch.fetch(path)
    if (path.startswith(fetch.PACKAGE) or looks_local(path)) and not local.is_dir():
        raise ConfigError("drafter.path", path, "no such checkpoint (python -m specbench.train makes one)")
    return local


class EagleDrafter(ChainsAndTrees):
    def __init__(self, kind: str, path: str, draft_sample_method: str, params: SamplingParams, seed: int = 0):
        if kind not in ("eagle", "eagle3"):
            raise ConfigError("drafter.name", kind, "valid EAGLE drafters: eagle, eagle3")
        check_sample_method(draft_sample_method)
        self.name, self.path, self.method, self.params, self.seed = kind, path, draft_sample_method, params, seed
        self.local = _local(path)
        raw = json.loads((self.local / "config.json").read_text()) if self.local.is_dir() else {}
        if raw:  # a local head is checked before any weights load; a Hub id when it loads
            found = "eagle3" if "draft_vocab_size" in raw or "Eagle3" in str(raw.get("architectures")) else "eagle"
            if found != kind:
                raise ConfigError("drafter.path", path, f"holds an {found} head, not {kind}")
        self.vocab_size = raw.get("vocab_size")
        self.feature_layers: tuple = ()  # known once the head is attached to its target
        self.head = None  # the head, once attached
        self.steppers: Optional[Steppers] = None  # request id -> EagleStepper (the per-request path)
        self.chain: Optional[EagleChain] = None  # chains and trees, batched
        self.generator: Optional[torch.Generator] = None

    @classmethod
    def from_config(cls, cfg: EagleConfig, params: SamplingParams, seed: int = 0) -> EagleDrafter:
        return cls(cfg.name, cfg.path, cfg.draft_sample_method, params, seed)

    def attach(self, target, rows: int = ROWS, max_length: int = MAX_LENGTH, *, cuda_graphs: bool = True,
               compile: bool = False) -> None:
        """Load the head next to the target. rows, max_length: the batched chains' head cache
        (the run's batch size and longest request; it grows if short); cuda_graphs: its forwards
        replayed from CUDA graphs on CUDA (the run's engine.cuda_graphs). compile is not used: the
        head's one layer runs its own step (specbench.drafters.eagle_chain)."""
        self.head = head = load_head(self.local if self.local.is_dir() else self.path, target)
        self.feature_layers = tuple(head.config.feature_layers)
        self.steppers = Steppers(lambda: EagleStepper(head))
        self.chain = EagleChain(head, rows, max_length, cuda_graphs=cuda_graphs)
        self.generator = torch.Generator(next(head.parameters()).device).manual_seed(self.seed)
