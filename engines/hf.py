"""The `hf` engine: a transformers causal LM as it is, with a DynamicCache rolled back by cropping.

It is the reference for breadth and correctness, not for speed: one request at a time.

Invariant between calls: the cache holds every token of the sequence except the last one
emitted, which is the first input of the next `forward`.

Letters: B requests, q positions in one forward, P cached positions, V vocabulary, D features.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from transformers import DynamicCache

from specbench.tree import attention_mask


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
    """One request at a time (rows = 1) over a DynamicCache; the engine API of engines/native.py.

    Invariant between calls: the cache holds every token of the sequence except the last one
    emitted, which is the first input of the next `forward`."""

    rows = 1

    def __init__(self, model, rows: int = 1, *, feature_layers: tuple = ()):
        if rows != 1:
            raise ValueError(f"engine=hf runs one request at a time, not batch_size={rows}; engine=native batches")
        self.model, self.feature_layers = model, tuple(feature_layers)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = DynamicCache()
        self._cache_arg = cache_kwarg(model)
        self._last_q = 0  # inputs of the last forward, not yet kept or dropped
        # A tree's 4D mask replaces transformers' own, sliding windows included: the window a
        # tree mask must apply, and whether only some layers slide (Qwen2 past max_window_layers:
        # then a mask per layer type). Chains pass no mask, so transformers applies the window.
        config = getattr(model.config, "text_config", model.config)
        types = set(getattr(config, "layer_types", None) or ())
        window = getattr(config, "sliding_window", None)
        self._window = window if window and types != {"full_attention"} else None
        self._mixed = self._window is not None and "full_attention" in types

    def _tree_mask(self, prefix: int, depth: torch.Tensor, ancestors: torch.Tensor):
        """The 4D mask of a tree forward after `prefix` cached tokens (specbench.tree), windowed
        where the model's layers slide, or one per layer type where only some do."""
        if self._window is None:
            return attention_mask(prefix, ancestors, self.dtype, self.device)  # [1, 1, q, P + q]
        windowed = attention_mask(prefix, ancestors, self.dtype, self.device, depth, self._window)
        if not self._mixed:
            return windowed
        return {"full_attention": attention_mask(prefix, ancestors, self.dtype, self.device),
                "sliding_attention": windowed}

    def _call(self, input_ids: torch.Tensor, **kwargs):
        layers = self.feature_layers
        out = self.model(
            input_ids=input_ids, use_cache=True, output_hidden_states=bool(layers),
            **{self._cache_arg: self.cache}, **kwargs,
        )
        features = torch.cat([out.hidden_states[i] for i in layers], -1) if layers else None
        return out.logits, features

    @property
    def length(self) -> list:
        return [self.cache.get_seq_length()]

    @torch.inference_mode()
    def prefill(self, row: int, input_ids: torch.Tensor):
        """input_ids: [T] the prompt -> logits [V] for the first new token, and with
        feature_layers the features [T, D] at every prompt position."""
        self.cache = DynamicCache()
        logits, features = self._call(input_ids[None].to(self.device), logits_to_keep=1)
        return (logits[0, -1], features[0]) if self.feature_layers else logits[0, -1]

    def prefill_rows(self, rows: list, prompts: list) -> list:
        """`prefill` for each (row, prompt): native's batched admission, here one at a time."""
        return [self.prefill(row, prompt) for row, prompt in zip(rows, prompts)]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depth: Optional[torch.Tensor] = None,
                ancestors: Optional[torch.Tensor] = None):
        """tokens: [1, q] the last emitted token then q-1 drafts -> logits [1, q, V] (and
        features [1, q, D] with feature_layers).

        A chain needs no mask: causal attention gives position i the prefix plus drafts 1..i,
        so one call yields the target distribution at every draft position and at the bonus
        position. A tree passes depth [1, q] and ancestors [1, q, q]: each node then sees the
        prefix and its ancestors, at position P + depth (a 4D mask, specbench.tree)."""
        kwargs = {}
        if depth is not None:
            P = self.cache.get_seq_length()
            mask = self._tree_mask(P, depth[0], ancestors[0])
            kwargs = dict(attention_mask=mask, position_ids=(P + depth.to(self.device)))
        self._last_q = tokens.shape[1]
        logits, features = self._call(tokens.to(self.device), **kwargs)
        return (logits, features) if self.feature_layers else logits

    @torch.inference_mode()
    def advance(self, keep: list) -> None:
        """After a forward from cache length P: keep the inputs keep[0] (ascending, 0 first) at
        positions P, P+1, ... and drop the others. A chain is cropped; a tree path is compacted."""
        P = self.cache.get_seq_length() - self._last_q
        compact(self.cache, P, torch.as_tensor(keep[0], dtype=torch.int64))
