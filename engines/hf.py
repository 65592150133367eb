"""The `hf` engine: a transformers causal LM as it is, with a DynamicCache rolled back by cropping.

It is the reference for breadth and correctness, not for speed. Batch size 1.

Invariant between calls: the cache holds every token of the sequence except the last one
emitted, which is the first input of the next `forward`.

Letters: B requests, q positions in one forward, P cached positions, V vocabulary, D features.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from transformers import DynamicCache


def cache_kwarg(model) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache`; 5.17 (the GPU host) has only the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop(cache: DynamicCache, length: int) -> None:
    """Drop entries past `length`. A negative argument means "remove this many" both in
    transformers 4.x (where a positive one is the new length) and in 5.2x (which refuses a positive one)."""
    if (surplus := cache.get_seq_length() - length) > 0:
        cache.crop(-surplus)


def compact(cache: DynamicCache, start: int, keep: torch.Tensor) -> None:
    """Move the entries at start + keep (ascending offsets) to start, start+1, ... and drop the
    rest: the accepted path of a verified tree becomes contiguous, as SGLang's move_kv_cache does."""
    n = keep.shape[0]
    if bool((keep == torch.arange(n, device=keep.device)).all()):
        crop(cache, start + n)  # already in place: a chain, or a path along first children
        return
    for layer in cache.layers:
        index = (start + keep).to(layer.keys.device)
        layer.keys[:, :, start : start + n] = layer.keys[:, :, index]  # [B, H, n, d]; gather copies first
        layer.values[:, :, start : start + n] = layer.values[:, :, index]
    crop(cache, start + n)


class HFEngine:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = DynamicCache()
        self._cache_arg = cache_kwarg(model)

    def _call(self, input_ids: torch.Tensor, feature_layers: tuple = (), **kwargs):
        out = self.model(
            input_ids=input_ids, use_cache=True, output_hidden_states=bool(feature_layers),
            **{self._cache_arg: self.cache}, **kwargs,
        )
        features = torch.cat([out.hidden_states[i] for i in feature_layers], -1) if feature_layers else None
        return out.logits, features

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, feature_layers: tuple = ()):
        """input_ids: [1, T] the prompt -> logits [1, V] for the first new token, and with
        feature_layers the features [1, T, D] at every prompt position."""
        self.cache = DynamicCache()
        logits, features = self._call(input_ids, feature_layers, logits_to_keep=1)
        return (logits[:, -1], features) if feature_layers else logits[:, -1]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        tree_mask: Optional[torch.Tensor] = None,
        depth: Optional[torch.Tensor] = None,
        feature_layers: tuple = (),
    ):
        """input_ids: [B, q] the last emitted token then q-1 drafts -> logits [B, q, V] (and
        features [B, q, D] with feature_layers).

        A chain needs no mask: causal attention gives position i the prefix plus drafts 1..i,
        so one call yields the target distribution at every draft position and at the bonus
        position. A tree passes tree_mask [1, 1, q, P + q] (specbench.tree.attention_mask) and
        depth [q]: each node then sees the prefix and its ancestors, at position P + depth."""
        kwargs = {}
        if tree_mask is not None:
            positions = (self.length + depth.to(self.device)).unsqueeze(0)  # [1, q]
            kwargs = dict(attention_mask=tree_mask, position_ids=positions)
        logits, features = self._call(input_ids, feature_layers, **kwargs)
        return (logits, features) if feature_layers else logits

    def expand(self, n: int) -> None:
        """Repeat a batch-1 cache n times (n continuations of one prompt)."""
        self.cache.batch_repeat_interleave(n)

    def rollback(self, length: int) -> None:
        """Drop cached entries past `length` (rejected drafts). No copy: the cache is cropped."""
        crop(self.cache, length)

    @torch.inference_mode()
    def keep_path(self, start: int, path: torch.Tensor) -> None:
        """After a tree verify from cache length `start`: keep the accepted nodes `path` (tree
        node indices, root first, ascending) at contiguous positions and drop the others."""
        compact(self.cache, start, path)
