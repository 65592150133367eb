"""EAGLE (EAGLE-1/2) and EAGLE-3 draft heads, in the parameter layout of the published checkpoints.

Letters: B batch rows, S new positions, P cached positions, H hidden size, D feature width,
V the target's vocabulary, Vd the draft vocabulary (EAGLE-3), Hq / Hkv query / key-value heads,
hd head dim, L the target's decoder layers.

Both heads are one Llama decoder layer over (token embedding, feature) pairs: position t pairs
the target's feature at t with the embedding of token t+1 and predicts token t+2. They read the
target's `embed_tokens` (and EAGLE-1 its `lm_head`), passed in at construction and neither
saved nor trained.

EAGLE-1 (`kind="eagle"`): feature = the target's final-norm hidden state (hidden_states[L]).
    x = fc(cat(embed(token), feature)); one decoder layer whose layer 0 has no input_layernorm;
    the output is a predicted *feature*, turned into logits by the target's lm_head.
EAGLE-3 (`kind="eagle3"`): feature = cat(hidden_states[i] for i in feature_layers), fused by
    fc (3H -> H), or the head's own previous output when drafting step 2+ (width H, no fc).
    x = cat(input_layernorm(embed(token)), hidden_norm(feature)), q/k/v read 2H, the residual
    is the (fused) feature; the output is the pre-norm residual stream, fed back as the next
    feature; logits = lm_head(norm(.)) over the draft vocabulary, placed into the target's
    vocabulary by d2t (target_id = draft_id + d2t[draft_id]), -inf at every other token.

Checkpoint layout (model.safetensors, plus config.json):

    eagle3  fc.weight [H, 3H]; midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight
            [H]; midlayer.self_attn.{q,k,v}_proj.weight [Hq*hd | Hkv*hd, 2H]; midlayer.self_attn.
            o_proj.weight [H, Hq*hd]; midlayer.mlp.{gate,up}_proj.weight [I, H]; midlayer.mlp.
            down_proj.weight [H, I]; norm.weight [H]; lm_head.weight [Vd, H]; d2t [Vd] int64;
            t2d [V] bool. config.json: architectures ["LlamaForCausalLMEagle3"], draft_vocab_size,
            eagle_config.eagle_aux_hidden_state_layer_ids.
    eagle   fc.weight [H, 2H] (fc.bias [H] when the config says "bias": true);
            layers.0.self_attn.{q,k,v,o}_proj.weight (q/k/v biases for heads with qkv_bias);
            layers.0.mlp.{gate,up,down}_proj.weight; layers.0.post_attention_layernorm.weight
            (no layers.0.input_layernorm). Published files also hold embed_tokens.weight (a
            copy of the target's): it is ignored on load and not written.

What was verified against public sources, and what is assumed:
- Verified (SafeAILab/EAGLE eagle/model/cnets.py and eagle/traineagle3/cnets.py, main.py): the
  EAGLE-3 module names above, q/k/v over 2H, fc without bias over 3H, the concat order
  (embedding first), residual = fused feature, hidden output pre-norm, logits through norm +
  lm_head [Vd, H], d2t int64 [Vd] / t2d bool [V] buffers with target = draft + d2t[draft]; the
  training-time-test loss weights 0.8^j and the soft cross-entropy against the target's
  softmax restricted to the draft vocabulary; the draft vocabulary = the most frequent target
  tokens; the 15 tensors and their shapes of a published EAGLE-3 model.safetensors (a
  third-party loader's notes list them with shapes, e.g. fc [4096, 12288], q_proj
  [4096, 8192], d2t I64 [32000], t2d BOOL); config fields (eagle/traineagle3/config.json:
  draft_vocab_size, no rope_theta, so EAGLE's own code runs RoPE at the Llama default 10000).
  Feature layers: EAGLE's modeling_llama_kv.py records the *input* of decoder layers 2, L//2,
  L-3, i.e. hidden_states[2], [L//2], [L-3] in transformers' convention; vLLM's
  eagle_aux_hidden_state_layer_ids use the same convention and default.
- Verified (eagle/model/cnets1.py, ea_model.py, eagle/train/EAGLE-LLaMA3-Instruct-8B.json):
  EAGLE-1's fc over cat(embedding, feature), its bias taken from the config's "bias" (false
  for the LLaMA3-8B head, and loaded strictly, so that file has no fc.bias but does have
  embed_tokens.weight), layers.0 without input_layernorm, the feature is the target's
  final-norm output and the head's output goes straight into the target's lm_head.
- Assumed: every head's attention is plain Llama RoPE (optionally llama3-scaled) with silu MLPs;
  one decoder layer (all published EAGLE heads have num_hidden_layers = 1); EAGLE-3 heads
  whose hidden size equals the target's (no target_hidden_size); some EAGLE-3 exports name
  the layer "layers.0." instead of "midlayer." and are renamed on load; weights may come as
  pytorch_model.bin instead of model.safetensors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specbench.config import ConfigError
from specbench.kernels.attention import aligned_slots

KINDS = ("eagle", "eagle3")
DEFAULT_ROPE_THETA = 10000.0  # LlamaConfig's default: what a config without rope_theta runs at


@dataclass
class EagleHeadConfig:
    """A head's shape, in the published config.json's terms, plus the target layers it reads."""

    kind: str  # eagle | eagle3
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # == vocab_size for eagle
    # Target hidden-state indices (transformers' output_hidden_states: 0 = embeddings,
    # i = output of decoder layer i, L = the final-norm output), concatenated in this order.
    feature_layers: tuple = ()
    rope_scaling: Optional[dict] = None  # None, or {"rope_type": "llama3", "factor", ...}
    fc_bias: bool = False  # eagle only
    qkv_bias: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.feature_layers = tuple(int(i) for i in self.feature_layers)
        if self.kind == "eagle" and (len(self.feature_layers) != 1 or self.draft_vocab_size != self.vocab_size):
            raise ValueError("an EAGLE-1 head reads one feature layer and predicts over the target's vocabulary")
        if self.kind == "eagle3" and len(self.feature_layers) < 2:
            raise ValueError("an EAGLE-3 head fuses two or more feature layers")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_target(cls, target_config: Any, kind: str, draft_vocab_size: Optional[int] = None) -> EagleHeadConfig:
        """The head shape for a transformers Llama / Qwen2 / Mistral config: the target's own
        layer width, heads and RoPE; feature layers by default_feature_layers."""
        text = text_config(target_config)
        heads = text.num_attention_heads
        theta, scaling = rope_of(text.to_dict())
        return cls(
            kind=kind, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
            num_attention_heads=heads, num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            rms_norm_eps=text.rms_norm_eps, rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=text.max_position_embeddings, vocab_size=text.vocab_size,
            draft_vocab_size=text.vocab_size if kind == "eagle" or draft_vocab_size is None else draft_vocab_size,
            feature_layers=default_feature_layers(kind, text.num_hidden_layers),
        )


def default_feature_layers(kind: str, num_layers: int) -> tuple:
    """EAGLE-1: (L,) the final-norm output; EAGLE-3: (2, L//2, L-3), EAGLE's low / mid / high
    layers, clamped into 0..L for targets of fewer than 6 layers."""
    L = num_layers
    return (L,) if kind == "eagle" else tuple(min(max(i, 0), L) for i in (2, L // 2, L - 3))


def text_config(config: Any) -> Any:
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rope_of(config: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, llama3 scaling or None) from a config dict of either transformers
    generation: 4.x (rope_theta, rope_scaling) or 5.x (rope_parameters)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = params.get("rope_theta") or config.get("rope_theta") or DEFAULT_ROPE_THETA
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind not in (None, "default", "llama3"):
        raise ValueError(f"unsupported rope scaling {kind!r} (default and llama3 are)")
    return float(theta), (dict(scaling) if kind == "llama3" else None)


# --- the head's KV cache -----------------------------------------------------------------------


@dataclass
class HeadCache:
    """Keys and values of the head's one attention layer, after RoPE: [B, Hkv, P, hd] each."""

    keys: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values: [B, Hkv, S, hd] -> the whole cache [B, Hkv, P + S, hd] (a new tensor:
        autograd through earlier entries keeps working)."""
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], 2), torch.cat([self.values, values], 2)
        self.keys, self.values = keys, values
        return keys, values

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (rejected drafts are dropped)."""
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if self.keys is not None and length < self.length:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    def select(self, index: torch.Tensor) -> None:
        """index: [B'] int64 rows of the batch to keep, in order (beams, tree branches)."""
        if self.keys is not None:
            index = index.to(self.keys.device)
            self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)

    def repeat(self, n: int) -> None:
        """Each batch row n times in a row (repeat_interleave): n continuations of one prefix."""
        if self.keys is not None:
            self.keys, self.values = self.keys.repeat_interleave(n, 0), self.values.repeat_interleave(n, 0)


class StaticHeadCache:
    """The head's keys and values for R requests at once, a row each (batched chains):
    keys / values [R, Hkv, S, hd] after RoPE (S slots: the capacity), lengths [R] int64 on the
    CPU. Slots 0 .. length - 1 of a row are its cached pairs (slot = position); what lies past
    a row's length is free, so setting the length rolls a row back with no copy."""

    def __init__(self, config: EagleHeadConfig, rows: int, capacity: int, device, dtype: torch.dtype):
        self._shape(rows, config.num_key_value_heads, capacity, config.head_dim, device, dtype)

    def _shape(self, rows, kv_heads, capacity, head_dim, device, dtype) -> None:
        capacity = aligned_slots(capacity)  # at least the slots asked for (see aligned_slots)
        shape = (rows, kv_heads, capacity, head_dim)
        # Zeros, not empty: masked slots are still multiplied by the queries (NaN would leak).
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(rows, dtype=torch.int64)
        # Made once: the row and slot indices every forward needs, on the cache's device.
        self.row_range = torch.arange(rows, device=device)  # [R]
        self.slot_range = torch.arange(capacity, device=device)  # [S]

    @property
    def rows(self) -> int:
        return self.keys.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def grown(self, rows: int, capacity: int) -> StaticHeadCache:
        """A larger cache (rows, capacity >= these) holding every row's entries and length."""
        R, S = self.rows, self.capacity
        assert rows >= R and aligned_slots(capacity) >= S, (rows, capacity, R, S)
        new = StaticHeadCache.__new__(StaticHeadCache)
        new._shape(rows, self.keys.shape[1], capacity, self.keys.shape[3], self.keys.device, self.keys.dtype)
        new.keys[:R, :, :S] = self.keys
        new.values[:R, :, :S] = self.values
        new.lengths[:R] = self.lengths
        return new


class _RowsView:
    """One forward's view of a StaticHeadCache with HeadCache's interface (what Attention calls):
    input j of batch row b is written at slot starts[b] + j of cache row rows[b] (clamped to the
    last slot, which only padding reaches), and `append` returns every slot of the batch rows
    [B, Hkv, S, hd]: attention always spans the cache's whole capacity S, masked, so that its
    shapes do not change from one forward to the next. rows: a device tensor [B], or None when
    batch row b is cache row b (then the cache rows are a view, not a gather). Attention is
    given an explicit mask, so `length` is unused."""

    def __init__(self, cache: StaticHeadCache, rows: Optional[torch.Tensor], starts: torch.Tensor):
        self.cache, self.rows, self.starts = cache, rows, starts

    @property
    def length(self) -> int:
        return self.cache.capacity

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cache
        B, _, q, _ = keys.shape
        slots = (self.starts[:, None] + c.slot_range[:q]).clamp_(max=c.capacity - 1)  # [B, q]
        rows = (c.row_range[:B] if self.rows is None else self.rows)[:, None].expand(B, q)
        c.keys[rows, :, slots] = keys.transpose(1, 2).to(c.keys.dtype)  # [B, q, Hkv, hd]
        c.values[rows, :, slots] = values.transpose(1, 2).to(c.values.dtype)
        if self.rows is None:
            return (c.keys, c.values) if B == c.rows else (c.keys[:B], c.values[:B])
        return c.keys[self.rows], c.values[self.rows]


def static_width(q: int, capacity: int) -> int:
    """The inputs per row a forward over a StaticHeadCache is padded to: the next power of two
    (at most the capacity), so that a run sees a handful of distinct input shapes, not one per
    round (eager attention may plan per shape: cuDNN builds a graph for each one it meets)."""
    return max(q, min(1 << max(q - 1, 0).bit_length(), capacity))


def forward_rows(head: nn.Module, features: torch.Tensor, input_ids: torch.Tensor, cache: StaticHeadCache,
                 starts: torch.Tensor, rows: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                 mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The head's forward (either kind: its own hidden_states, weights and RoPE) for B rows of a
    StaticHeadCache, with no host synchronization. features: [B, q, D], input_ids: [B, q] on the
    cache's device; starts: [B] int64 on the cache's device, the slot of each row's first input
    (its cached pairs lie before it); rows: [B] the cache row of each batch row, None for cache
    rows 0 .. B - 1. Input j of row b is read at position starts[b] + j and written into the
    cache there; it sees its row's slots before starts[b] and its own row's earlier inputs.
    The rows' lengths (cache.lengths, on the CPU) are the caller's to advance. Trees give both
    positions [B, q] (RoPE's, in place of starts[b] + j; inputs are still written at starts[b] + j)
    and mask [B, q, S] bool (the slots of its cache row each input sees: its ancestors', not the
    slots before it). -> hidden [B, q, H]."""
    assert (positions is None) == (mask is None), "forward_rows: positions and mask come together"
    if positions is None:
        positions = starts[:, None] + cache.slot_range[: input_ids.shape[1]]  # [B, q]
        mask = cache.slot_range[None, None, :] <= positions[:, :, None]  # [B, q, S]
    view = _RowsView(cache, rows, starts)
    return head.hidden_states(features, input_ids, positions, view, mask[:, None])


def hidden_states_rows(head: nn.Module, features: torch.Tensor, input_ids: torch.Tensor, cache: StaticHeadCache,
                       rows: list, counts: list) -> torch.Tensor:
    """forward_rows for B requests at rows `rows` (a list, any order) read after their cached
    pairs: features: [B, q, D], input_ids: [B, q]: batch row b holds counts[b] real pairs, then
    padding, read at positions length + j. Every input is written into the cache; the rows'
    lengths then advance by counts (padding stays past them). -> hidden [B, q, H] (the real
    ones: [b, :counts[b]])."""
    device = cache.keys.device
    rows = list(rows)
    starts = cache.lengths[rows].to(device)  # [B]
    index = None if rows == list(range(len(rows))) else torch.tensor(rows, dtype=torch.int64, device=device)
    hidden = forward_rows(head, features.to(device), input_ids.to(device), cache, starts, index)
    cache.lengths[rows] += torch.as_tensor(list(counts), dtype=torch.int64)
    return hidden


# --- building blocks ---------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 as Llama does, back to the input dtype before the weight.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def inverse_frequencies(config: EagleHeadConfig, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies [hd / 2] in float32, llama3-scaled when configured."""
    hd = config.head_dim
    inv = 1.0 / config.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
    s = config.rope_scaling
    if not s:
        return inv
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    original = s["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelength > original / low, inv / factor, inv)
    blend = (original / wavelength - low) / (high - low)
    between = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(between, (1 - blend) * inv / factor + blend * inv, scaled)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotate-half RoPE. x: [B, heads, S, hd]; cos, sin: [B, 1, S, hd] float32."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def causal_mask(S: int, P: int, device: torch.device) -> torch.Tensor:
    """[S, P + S] bool: new position i sees every cached position and new positions <= i."""
    return torch.ones(S, P + S, dtype=torch.bool, device=device).tril(P)


class Attention(nn.Module):
    """GQA self-attention with RoPE, reading `in_features` (H for EAGLE-1, 2H for EAGLE-3)."""

    def __init__(self, config: EagleHeadConfig, in_features: int):
        super().__init__()
        self.config = config
        hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(in_features, hq * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(in_features, hkv * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(in_features, hkv * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(hq * hd, config.hidden_size, bias=False)
        self._inverse_frequencies: dict = {}  # device -> inverse_frequencies(config, device), made once

    def inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        inv = self._inverse_frequencies.get(device)
        if inv is None:
            with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor: training reads it too
                self._inverse_frequencies[device] = inv = inverse_frequencies(self.config, device)
        return inv

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, cache: HeadCache,
                attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """x: [B, S, in_features] -> [B, S, H]; appends this call's keys and values to `cache`."""
        c = self.config
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, c.num_attention_heads, c.head_dim).transpose(1, 2)  # [B, Hq, S, hd]
        k = self.k_proj(x).view(B, S, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B, Hkv, S, hd]
        v = self.v_proj(x).view(B, S, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        angles = position_ids.to(x.device, torch.float32)[..., None] * self.inverse_frequencies(x.device)
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, S, hd]
        cos, sin = angles.cos(), angles.sin()
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        P = cache.length
        k, v = cache.append(k, v)  # [B, Hkv, P + S, hd]
        groups = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        if attention_mask is None:
            mask = None if P == 0 else causal_mask(S, P, x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=P == 0 and S > 1)
        else:
            mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.to(q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, config: EagleHeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """EAGLE-1's layers.0: a Llama decoder layer without input_layernorm."""

    def __init__(self, config: EagleHeadConfig):
        super().__init__()
        self.self_attn = Attention(config, config.hidden_size)
        self.mlp = MLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, position_ids, cache, attention_mask):
        x = x + self.self_attn(x, position_ids, cache, attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Layer(nn.Module):
    """EAGLE-3's midlayer: attention over cat(normed embedding, normed feature), residual = feature."""

    def __init__(self, config: EagleHeadConfig):
        super().__init__()
        self.self_attn = Attention(config, 2 * config.hidden_size)
        self.mlp = MLP(config)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeds, feature, position_ids, cache, attention_mask):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)  # [B, S, 2H]
        h = feature + self.self_attn(x, position_ids, cache, attention_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass(frozen=True)
class TargetParts:
    """The target's modules a head reads; a plain holder so that they are not submodules (not
    saved, not trained, not moved by head.to())."""

    embed_tokens: nn.Module
    lm_head: Optional[nn.Module] = None


# --- the heads ---------------------------------------------------------------------------------


class EagleHead(nn.Module):
    """EAGLE-1 / EAGLE-2: predicts the target's next final-norm feature."""

    def __init__(self, config: EagleHeadConfig, embed_tokens: nn.Module, lm_head: nn.Module):
        super().__init__()
        assert config.kind == "eagle", config.kind
        self.config = config
        self.target = TargetParts(embed_tokens, lm_head)
        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=config.fc_bias)
        self.layers = nn.ModuleList([EagleLayer(config)])

    def hidden_states(self, features, input_ids, position_ids, cache, attention_mask=None) -> torch.Tensor:
        """features: [B, S, H] (target feature or the head's own output); -> [B, S, H]."""
        dtype = self.fc.weight.dtype
        embeds = self.target.embed_tokens(input_ids).to(dtype)
        x = self.fc(torch.cat([embeds, features.to(dtype)], dim=-1))
        return self.layers[0](x, position_ids, cache, attention_mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, S, V] through the target's lm_head."""
        weight = self.target.lm_head.weight
        return F.linear(hidden.to(weight.dtype), weight)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, S] the target id of each row's most likely token (greedy drafts)."""
        return self.logits(hidden).argmax(-1)

    def forward(self, features, input_ids, position_ids, cache, attention_mask=None):
        """-> (hidden [B, S, H]: the predicted feature, fed back as the next feature;
        logits [B, S, V])."""
        hidden = self.hidden_states(features, input_ids, position_ids, cache, attention_mask)
        return hidden, self.logits(hidden)


class Eagle3Head(nn.Module):
    """EAGLE-3: fuses low / mid / high target features, predicts over a draft vocabulary."""

    def __init__(self, config: EagleHeadConfig, embed_tokens: nn.Module):
        super().__init__()
        assert config.kind == "eagle3", config.kind
        self.config = config
        self.target = TargetParts(embed_tokens)
        H = config.hidden_size
        self.fc = nn.Linear(len(config.feature_layers) * H, H, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        # The identity map until set_draft_vocab: draft id i is target id i.
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """target_ids: [Vd] distinct target token ids, ascending: draft id i is target_ids[i]."""
        target_ids = target_ids.to(self.d2t.device, torch.int64)
        if target_ids.shape != self.d2t.shape or not bool((target_ids[1:] > target_ids[:-1]).all()):
            raise ValueError(f"need {self.d2t.shape[0]} ascending distinct target ids")
        self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    @property
    def draft_ids(self) -> torch.Tensor:
        """[Vd] the target id of each draft id."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def _draft_map(self) -> tuple[torch.Tensor, bool]:
        """(draft_ids, whether they ascend), computed once per d2t: again only when d2t is
        replaced or written in place (set_draft_vocab, load_state_dict, .to)."""
        d2t = self.d2t
        try:
            version = d2t._version
        except RuntimeError:  # an inference tensor keeps no version: no caching
            ids = self.draft_ids
            return ids, bool((ids[1:] > ids[:-1]).all())
        cached = getattr(self, "_draft_map_cache", None)
        if cached is None or cached[0] is not d2t or cached[1] != version:
            with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor: training indexes with it
                ids = self.draft_ids
                cached = (d2t, version, ids, bool((ids[1:] > ids[:-1]).all()))
            self._draft_map_cache = cached
        return cached[2], cached[3]

    def hidden_states(self, features, input_ids, position_ids, cache, attention_mask=None) -> torch.Tensor:
        """features: [B, S, len(feature_layers) * H] target features, or [B, S, H] the head's
        own previous output; -> the pre-norm residual stream [B, S, H]."""
        dtype = self.fc.weight.dtype
        features = features.to(dtype)
        H = self.config.hidden_size
        if features.shape[-1] == self.fc.in_features:
            features = self.fc(features)
        elif features.shape[-1] != H:
            raise ValueError(f"features of width {features.shape[-1]}: expected {self.fc.in_features} or {H}")
        embeds = self.target.embed_tokens(input_ids).to(dtype)
        return self.midlayer(embeds, features, position_ids, cache, attention_mask)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, S, Vd] over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, S, V]: draft logits at their target ids, -inf elsewhere."""
        draft = self.draft_logits(hidden)
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy(-1, self._draft_map()[0], draft)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, S] the target id of each row's most likely token: logits(hidden).argmax(-1)
        without the [.., V] tensor (draft ids ascend, so the first maximum maps to the first one)."""
        ids, ascending = self._draft_map()
        if not ascending:
            return self.logits(hidden).argmax(-1)
        return ids[self.draft_logits(hidden).argmax(-1)]

    def forward(self, features, input_ids, position_ids, cache, attention_mask=None):
        """-> (hidden [B, S, H] pre-norm, fed back as the next feature; logits [B, S, V])."""
        hidden = self.hidden_states(features, input_ids, position_ids, cache, attention_mask)
        return hidden, self.logits(hidden)


def build_head(config: EagleHeadConfig, target_model: nn.Module) -> nn.Module:
    """A freshly initialised head reading `target_model`'s embeddings (and lm_head for EAGLE-1),
    on the target's device, in float32."""
    embed = target_model.get_input_embeddings()
    if config.kind == "eagle":
        head = EagleHead(config, embed, target_model.get_output_embeddings())
    else:
        head = Eagle3Head(config, embed)
    return head.to(embed.weight.device)


# --- checkpoints -------------------------------------------------------------------------------

WEIGHTS = "model.safetensors"
ARCHITECTURES = {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}


def head_config_json(config: EagleHeadConfig, dtype: torch.dtype) -> dict:
    """config.json in the published field names (Llama's, plus EAGLE's)."""
    out = {
        "architectures": [ARCHITECTURES[config.kind]], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "num_hidden_layers": 1, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if config.qkv_bias:
        out["qkv_bias"] = True
    if config.kind == "eagle":
        out["bias"] = config.fc_bias  # EAGLE's name for fc's bias
    else:
        out["draft_vocab_size"] = config.draft_vocab_size
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
                               "use_aux_hidden_state": True}
    return out


def save_head(head: nn.Module, path, dtype: Optional[torch.dtype] = None) -> Path:
    """Write config.json + model.safetensors (the head's own weights only; floating tensors
    cast to `dtype` when given) into the directory `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
    saved_dtype = dtype or head.fc.weight.dtype
    (path / "config.json").write_text(json.dumps(head_config_json(head.config, saved_dtype), indent=2) + "\n")
    return path


def _read_weights(directory: Path) -> dict:
    if (directory / WEIGHTS).exists():
        from safetensors.torch import load_file

        return load_file(str(directory / WEIGHTS))
    if (directory / "pytorch_model.bin").exists():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConfigError("drafter.path", directory, f"no {WEIGHTS} or pytorch_model.bin")


def _local_dir(path: str) -> Path:
    """A local directory, or a Hugging Face id ("org/name") fetched with snapshot_download."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if path.startswith(("/", ".", "~")) or local.exists():
        raise ConfigError("drafter.path", path, "no such directory")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path))


def _kind_of(raw: dict, state: dict) -> str:
    eagle3 = any("Eagle3" in a for a in raw.get("architectures") or []) or "draft_vocab_size" in raw
    return "eagle3" if eagle3 or any(k.startswith("midlayer.") for k in state) else "eagle"


def config_from_json(raw: dict, state: dict, target_config: Any) -> EagleHeadConfig:
    """An EagleHeadConfig from a (published or saved) config.json and its weights; feature
    layers default from the target's depth when the file does not name them."""
    kind = _kind_of(raw, state)
    H, heads = raw["hidden_size"], raw["num_attention_heads"]
    aux = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(aux) if aux and kind == "eagle3" else default_feature_layers(kind, text_config(target_config).num_hidden_layers)
    theta, scaling = rope_of(raw)
    return EagleHeadConfig(
        kind=kind, hidden_size=H, intermediate_size=raw["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads, head_dim=raw.get("head_dim") or H // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=raw.get("max_position_embeddings", 2048), vocab_size=raw["vocab_size"],
        draft_vocab_size=raw["vocab_size"] if kind == "eagle" else raw.get("draft_vocab_size") or raw["vocab_size"],
        feature_layers=layers, fc_bias="fc.bias" in state,
        qkv_bias=any(k.endswith("q_proj.bias") for k in state),
    )


def _head_state(kind: str, state: dict, config: EagleHeadConfig) -> dict:
    """The published tensors under this module's names: drop the target's embedding copy,
    rename layers.0. to midlayer. (EAGLE-3), give a full-vocabulary EAGLE-3 head its identity map."""
    state = {k: v for k, v in state.items() if not k.startswith("embed_tokens.")}
    if kind == "eagle3":
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        if "d2t" not in state and config.draft_vocab_size == config.vocab_size:
            state["d2t"] = torch.zeros(config.vocab_size, dtype=torch.int64)
            state["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    return state


def _layout_problem(expected: dict, state: dict) -> Optional[str]:
    """A one-line description of missing, unexpected or misshapen tensors, None if they match."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        return f"missing {missing[:4]}, unexpected {unexpected[:4]}"
    shapes = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items() if state[k].shape != v.shape]
    return ", ".join(shapes[:4]) or None


def load_head(path, target_model: nn.Module) -> nn.Module:
    """A head from a directory (config.json + model.safetensors or pytorch_model.bin) or a
    Hugging Face id, on the target's device and in its dtype. Raises ConfigError("drafter.path")
    when the head does not fit the target."""
    directory = _local_dir(str(path))
    if not (directory / "config.json").is_file():
        raise ConfigError("drafter.path", path, "no config.json")
    raw = json.loads((directory / "config.json").read_text())
    state = _read_weights(directory)
    text = text_config(target_model.config)
    if raw.get("vocab_size") != text.vocab_size:
        raise ConfigError("drafter.path", path, f"head vocab_size {raw.get('vocab_size')} differs from the target's ({text.vocab_size})")
    if raw.get("hidden_size") != text.hidden_size or raw.get("target_hidden_size", text.hidden_size) != text.hidden_size:
        raise ConfigError("drafter.path", path, f"head hidden_size {raw.get('hidden_size')} differs from the target's ({text.hidden_size})")
    if raw.get("num_hidden_layers", 1) != 1:
        raise ConfigError("drafter.path", path, f"heads of {raw['num_hidden_layers']} layers are not supported (1)")
    config = config_from_json(raw, state, target_model.config)
    head = build_head(config, target_model)
    state = _head_state(config.kind, state, config)
    if problem := _layout_problem(head.state_dict(), state):
        raise ConfigError("drafter.path", path, f"not an {config.kind} head of this shape: {problem}")
    head.load_state_dict(state, strict=True)
    return head.to(next(target_model.parameters()).dtype).eval()
