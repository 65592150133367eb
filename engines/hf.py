"""The `hf` engine: a transformers causal LM as it is, with a DynamicCache rolled back by cropping.

It is the reference for breadth and correctness, not for speed. Batch size 1.

Invariant between calls: the cache holds every token of the sequence except the last one
emitted, which is the first input of the next `forward`.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


class HFEngine:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = DynamicCache()
        # transformers 5.2x renamed `past_key_values` to `cache`; 5.17 (the GPU host) has only the old name.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _call(self, input_ids: torch.Tensor, **kwargs):
        return self.model(input_ids=input_ids, use_cache=True, **{self._cache_arg: self.cache}, **kwargs)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [1, T] the prompt -> logits [1, V] for the first new token."""
        self.cache = DynamicCache()
        return self._call(input_ids, logits_to_keep=1).logits[:, -1]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [B, q] the last emitted token then q-1 drafts -> logits [B, q, V].

        Causal attention gives position i the prefix plus drafts 1..i, so one call yields the
        target distribution at every draft position and at the bonus position."""
        return self._call(input_ids).logits

    def expand(self, n: int) -> None:
        """Repeat a batch-1 cache n times (n continuations of one prompt)."""
        self.cache.batch_repeat_interleave(n)

    def rollback(self, length: int) -> None:
        """Drop cached entries past `length` (rejected drafts). No copy: the cache is cropped."""
        # A negative argument means "remove this many" both in transformers 4.x (where a
        # positive one is the new length) and in 5.2x (where a positive one is refused).
        if (surplus := self.length - length) > 0:
            self.cache.crop(-surplus)
