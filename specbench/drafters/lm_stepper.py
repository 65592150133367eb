"""A stepper over a transformers causal LM with a DynamicCache of its own (specbench.drafters.expand).

Used by the draft-model, layer-skip and synthetic drafters, one stepper per request. The cache
is keyed by the tokens it has read: `sync` crops it to the common prefix with the request's
history and reads the rest, which is how rejected drafts are rolled back and accepted ones are
kept (a chain's accepted drafts are already in the cache; a tree's rows are dropped after
drafting and its path is read again).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from specbench.engines.hf import cache_kwarg, crop


class LMStepper:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self._cache_arg = cache_kwarg(model)
        self.cache = DynamicCache()
        self.seen = torch.empty(0, dtype=torch.int64)  # [P] tokens in the cache (row 0)
        self._synced = 0

    def _read(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [W, s] -> logits [W, s, V], appended to the cache."""
        out = self.model(input_ids=input_ids.to(self.device), use_cache=True, **{self._cache_arg: self.cache})
        return out.logits

    def sync(self, tokens: torch.Tensor, features=None) -> torch.Tensor:
        """tokens: [T] the request's history -> logits [1, V] (features unused)."""
        history = tokens.cpu()  # [T]
        common = common_prefix(self.seen, history)
        # Read at least the last token: its logits are the first draft's distribution.
        keep = min(common, history.shape[0] - 1)
        crop(self.cache, keep)
        logits = self._read(history[keep:].unsqueeze(0))[:, -1]  # [1, V]
        self.seen = history.clone()
        self._synced = history.shape[0]
        return logits

    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [W] -> [W, V]. With one row the fed tokens extend `seen` (a chain)."""
        logits = self._read(tokens.view(-1, 1))[:, -1]
        if tokens.numel() == 1:
            self.seen = torch.cat([self.seen, tokens.view(-1).cpu()])
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows.to(self.device))
        self.seen = self.seen[: self._synced]  # rows may diverge: only the history is shared

    def restart(self) -> None:
        self.select(torch.zeros(1, dtype=torch.int64))
        crop(self.cache, self._synced)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens a and b ([n] and [m] int64) share."""
    return shared_prefix(a.detach().cpu().numpy(), b.detach().cpu().numpy())


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """common_prefix on numpy arrays (the batched drafters' host bookkeeping)."""
    n = min(a.shape[0], b.shape[0])
    differ = a[:n] != b[:n]
    first = int(differ.argmax()) if n else 0
    return first if n and differ[first] else n
