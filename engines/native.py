"""The `native` engine: a compact Llama / Mistral / Qwen2 over a static KV cache, for speed.

It loads the same Hugging Face weights as the `hf` engine (q/k/v and gate/up fused into one
matrix each) and computes the same function; tests hold the two to fp32 logits within 1e-4.

The cache is one preallocated tensor per layer, [rows, Hkv, S, hd], with a length per row.
Every forward writes its q new entries at slots length .. length + q - 1 of each row and
attends through a boolean mask built from the lengths, so rows hold requests of any length
(ragged batches) and idle rows cost only compute. Nothing is copied to roll back: a row's
length is simply set past what it keeps, and later writes overwrite the rest. A tree's
accepted path is made contiguous by moving its few entries (SGLang's move_kv_cache).

A chain and a tree are one code path: the q inputs carry a depth (their position offset) and
an ancestor mask [q, q] (lower-triangular for a chain). On CUDA each forward shape [rows, q] is
captured once in a CUDA graph and replayed: the host then issues one launch per forward.

Letters: B rows (requests), q positions in one forward, S cache slots, L layers, H query
heads, Hkv key/value heads, G = H / Hkv, hd head size, D model width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specbench import graphs  # graphs.capture looked up at call time (tests stand in for it)
from specbench.kernels.attention import counters as attention_counters, decode as attention_kernel
from specbench.kernels.attention import aligned_slots, mask as attention_mask
from specbench.kernels.attention import places as attention_places, reference as attention_reference
from specbench.kernels.attention import supported as attention_supported
from specbench.kernels.gemv import project, rms_norm

FAMILIES = ("llama", "mistral", "qwen2")
COMPILE_SCOPES = ("layer", "model")


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int  # MLP intermediate size
    eps: float
    qkv_bias: bool = False  # Qwen2, Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias (its o_proj too; Qwen2's o_proj has none)
    sliding_window: Optional[int] = None  # Mistral's, or Qwen2's with use_sliding_window: the most keys a query sees

    @classmethod
    def of(cls, config) -> Shape:
        config = getattr(config, "text_config", config)
        if config.model_type not in FAMILIES:
            raise ValueError(f"engine=native runs the {', '.join(FAMILIES)} families, not model_type={config.model_type}")
        if getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError("engine=native: a biased or non-SiLU MLP is not supported; use engine=hf")
        heads = config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        window = getattr(config, "sliding_window", None)
        return cls(
            vocab_size=config.vocab_size, dim=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
            kv_heads=config.num_key_value_heads or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            hidden=config.intermediate_size, eps=config.rms_norm_eps,
            qkv_bias=config.model_type == "qwen2" or attention_bias,
            o_bias=config.model_type != "qwen2" and attention_bias,
            sliding_window=window if getattr(config, "use_sliding_window", config.model_type == "mistral") else None,
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


# Decode and verify shapes use `attend` (specbench.kernels.attention) while requests x key/value
# heads are fewer than this, the fused kernel from there on. Measured on an H200 (Llama-3.1-8B
# shape, 2026-12-03): at 1 x 8 the matmuls were faster (t(1) at context 4096: 6.46 ms against
# 7.63 ms), at 48 x 8 the fused kernel was (a batch-48 step at context 4096: 19.4 ms against
# 32.5 ms). About the SM count. With engine.kernels on CUDA both give way to
# specbench.kernels.attention.decode.
FUSED_FROM = 128

# The most inputs (rows x the longest prompt) one prefill forward takes: a bound on its
# activations and attention mask, not on the prompts (a longer one runs alone).
PREFILL_TOKENS = 16384


def fused_attend(xq: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`attend` with PyTorch's fused attention: for prefills (many query rows) and wide batches."""
    return F.scaled_dot_product_attention(xq, k, v, attn_mask=mask)


# The attention of a layer, from its qkv projection: RoPE, the cache write and attention, with
# one signature. matmul and sdpa are the torch composition (specbench.kernels.attention.reference)
# over `where` = (mask, (rows, slots)) built once per forward; kernel is its Triton kernel, which
# reads the lengths and ancestors instead, and takes `where` = its merge counts (zeroed once per
# forward, shared by the layers).
def matmul_attention(*args, where):
    return attention_reference(*args, mask=where[0], places=where[1])


def sdpa_attention(*args, where):
    return attention_reference(*args, mask=where[0], places=where[1], attend=fused_attend)


def kernel_attention(*args, where):
    return attention_kernel(*args, where)


def block(s: Shape, attention, x, squares, cos, sin, where, k_cache, v_cache, lengths, ancestors,
          attention_norm, wqkv, bqkv, wo, bo, ffn_norm, w13, w2, kernels: bool = False):
    """One decoder layer as a function of its weights, so that one compiled function serves
    every layer. x: [B, q, D]; cos, sin: [B, q, 1, hd]; where: (mask [B, 1, G*q, S] bool,
    (rows [B, 1], slots [B, q])) for the torch attentions, the merge counts for
    kernel_attention; k_cache, v_cache: [B, Hkv, S, hd]; lengths [B], ancestors [B, q, q]: where
    the new entries go and what they see; attention: one of the *_attention functions above.
    kernels: the projections through specbench.kernels.gemv where it applies (B q <=
    gemv.MAX_ROWS input rows: the MLP activation and the residual adds folded into them, and to
    16 rows the norms too; past 16 each norm is one launch of its own). -> the layer's output and its squares: with the kernels on several rows, each
    residual projection sums its output's squares for the next norm (gemv.project's squares),
    which then makes no pass over x; squares: x's (None: the norm makes its pass)."""
    qkv = project(x, wqkv, bqkv, norm=attention_norm, eps=s.eps, kernel=kernels, norm_squares=squares)
    o = attention(qkv, cos, sin, k_cache, v_cache, lengths, ancestors, s.heads, s.kv_heads, where=where)  # [B, q, H*hd]
    x, squares = project(o, wo, bo, residual=x, kernel=kernels, squares=True)
    h = project(x, w13, norm=ffn_norm, eps=s.eps, glu=True, kernel=kernels, norm_squares=squares)  # [B, q, hidden]
    return project(h, w2, residual=x, kernel=kernels, squares=True)


def prefill_block(*args, **kwargs):
    """`block` under a code object of its own. Dynamo keys compiled graphs by code object, so
    the prefill's dynamic-shape graph is never a candidate for a decode or verify shape (whose
    graphs are compiled per shape: EngineConfig.compile_dynamic)."""
    return block(*args, **kwargs)


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.attention_norm = RMSNorm(s.dim, s.eps)
        self.wqkv = nn.Linear(s.dim, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=s.qkv_bias)
        self.wo = nn.Linear(s.heads * s.head_dim, s.dim, bias=s.o_bias)
        self.ffn_norm = RMSNorm(s.dim, s.eps)
        self.w13 = nn.Linear(s.dim, 2 * s.hidden, bias=False)  # gate and up
        self.w2 = nn.Linear(s.hidden, s.dim, bias=False)

    @property
    def weights(self) -> tuple:
        return (self.attention_norm.weight, self.wqkv.weight, self.wqkv.bias, self.wo.weight, self.wo.bias,
                self.ffn_norm.weight, self.w13.weight, self.w2.weight)


class Transformer(nn.Module):
    def __init__(self, s: Shape, inv_freq: torch.Tensor, rope_scale: float = 1.0):
        super().__init__()
        self.s = s
        self.tok_embeddings = nn.Embedding(s.vocab_size, s.dim)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.dim, s.eps)
        self.output = nn.Linear(s.dim, s.vocab_size, bias=False)
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)  # [hd / 2]
        self.rope_scale = rope_scale  # transformers' attention_scaling (1.0 but for YaRN-like rope)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """RoPE's cos and sin at positions [...] (int) -> [..., 2, hd] in dtype, as transformers
        computes them: angles in fp32, scaled, then rounded."""
        freqs = positions.float()[..., None] * self.inv_freq  # [..., hd / 2]
        angles = torch.cat([freqs, freqs], -1)
        return (torch.stack([angles.cos(), angles.sin()], -2) * self.rope_scale).to(dtype)

    def forward(self, tokens, lengths, depth, ancestors, cache_k, cache_v, feature_layers=(), last=None,
                layer=block, attention=matmul_attention, kernels=False, rope=None):
        """tokens: [B, q] at depths depth [B, q] past each row's length [B], seeing the cache
        before it and the inputs in ancestors [B, q, q] (bool, diagonal set). cache_k, cache_v:
        [L, B, Hkv, S, hd]. -> logits [B, q, V] (or [B, V] at the positions `last` [B]), and
        the features [B, q, D * len(feature_layers)] (transformers' hidden_states indices:
        i < L the input of layer i, L the final-norm output) or None. `layer` computes each
        layer (`block`, or a compiled copy of it) with `attention`; `kernels`: see block.
        rope: `self.rope` of positions 0 .. P-1 ([P, 2, hd]), to gather from (positions past it
        read its last row: only clamped cache writes have them), or None to compute here."""
        s = self.s
        B, q = tokens.shape
        S = cache_k.shape[3]
        if attention is kernel_attention:  # the kernel reads lengths and ancestors (int8) for a mask
            where = attention_counters(B, q, s.kv_heads, s.heads // s.kv_heads, tokens.device)
            ancestors = ancestors.to(torch.int8)
        else:
            where = attention_mask(lengths, ancestors, S, s.heads // s.kv_heads), attention_places(lengths, q, S)
        x = self.tok_embeddings(tokens)
        positions = lengths[:, None] + depth  # [B, q]
        if rope is None:
            rope = self.rope(positions, x.dtype)  # [B, q, 2, hd]
        else:  # one gather where computing took about ten small kernels
            rope = rope[positions.clamp(max=rope.shape[0] - 1)]
        cos, sin = rope[:, :, 0:1], rope[:, :, 1:2]  # [B, q, 1, hd] each
        states = {}
        squares = None  # x's squares by gemv.SQUARES_GROUP columns [B q, D / 16], where a projection summed them
        for i, weights in enumerate(self.layers):
            if i in feature_layers:
                states[i] = x
            x, squares = layer(s, attention, x, squares, cos, sin, where, cache_k[i], cache_v[i], lengths, ancestors,
                               *weights.weights, kernels=kernels)
        norm = self.norm.weight  # folded into the output projection, after `last` picks the rows
        if s.layers in feature_layers:  # unless the normed states are a feature
            x, norm = self.norm(x), None
            states[s.layers] = x
        features = torch.cat([states[i] for i in feature_layers], -1) if feature_layers else None
        if last is not None:
            rows = torch.arange(B, device=x.device)
            x = x[rows, last]  # [B, D]
            if squares is not None:
                squares = squares.view(B, q, -1)[rows, last]  # [B, D / 16]
        return project(x, self.output.weight, norm=norm, eps=s.eps, kernel=kernels, norm_squares=squares), features

    @classmethod
    def from_hf(cls, model) -> Transformer:
        """The same weights as a transformers Llama / Mistral / Qwen2 model, fused (copies)."""
        config = getattr(model.config, "text_config", model.config)
        s = Shape.of(config)
        rotary = model.model.rotary_emb
        rope_type = getattr(rotary, "rope_type", "default")
        if "dynamic" in rope_type or rope_type == "longrope":  # transformers recomputes these with the length
            raise ValueError(f"engine=native keeps RoPE's frequencies fixed, not rope_type={rope_type} "
                             "(its frequencies change with the sequence length); use engine=hf")
        param = next(model.parameters())
        with torch.device("meta"):
            native = cls(s, torch.zeros(s.head_dim // 2), float(getattr(rotary, "attention_scaling", 1.0)))
        native = native.to_empty(device=param.device).to(param.dtype)
        native.inv_freq = rotary.inv_freq.detach().float().to(param.device).clone()
        hf = dict(model.state_dict())
        own = {"tok_embeddings.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"],
               "output.weight": hf.get("lm_head.weight", hf["model.embed_tokens.weight"])}
        for i in range(s.layers):
            p = f"model.layers.{i}."
            attn = [hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            own[f"layers.{i}.wqkv.weight"] = torch.cat(attn)
            if s.qkv_bias:
                own[f"layers.{i}.wqkv.bias"] = torch.cat([hf[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
            own[f"layers.{i}.wo.weight"] = hf[p + "self_attn.o_proj.weight"]
            if s.o_bias:
                own[f"layers.{i}.wo.bias"] = hf[p + "self_attn.o_proj.bias"]
            own[f"layers.{i}.w13.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
            own[f"layers.{i}.w2.weight"] = hf[p + "mlp.down_proj.weight"]
            own[f"layers.{i}.attention_norm.weight"] = hf[p + "input_layernorm.weight"]
            own[f"layers.{i}.ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        native.load_state_dict(own, strict=True)
        if config.tie_word_embeddings:
            native.output.weight = native.tok_embeddings.weight
        return native.eval()


def chain(q: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain's depth [q] and ancestor mask [q, q]: input i sees inputs 0..i."""
    return torch.arange(q, device=device), torch.ones(q, q, dtype=torch.bool, device=device).tril()


class NativeEngine:
    """rows requests of up to max_length tokens each, over one Transformer and its static cache.

    Invariant between calls, per row: the cache holds the row's sequence except its last
    emitted token, which is the first input of the row's next `forward`."""

    def __init__(self, model: Transformer, rows: int, max_length: int, *, feature_layers: tuple = (),
                 cuda_graphs: bool = True, compile: bool = False, compile_mode: Optional[str] = None,
                 compile_scope: str = "layer", compile_dynamic: Optional[bool] = False, kernels: bool = False,
                 compile_prefill: bool = True):
        s = model.s
        if s.sliding_window is not None and max_length > s.sliding_window:
            # within the window every query sees every key before it: full attention is exact
            raise ValueError(f"engine=native has no sliding-window attention: max_length {max_length} exceeds the "
                             f"model's sliding_window={s.sliding_window}; use engine=hf or shorter requests")
        param = next(model.parameters())
        self.model, self.rows, self.feature_layers = model, rows, tuple(feature_layers)
        self.device, self.dtype, self.vocab_size = param.device, param.dtype, s.vocab_size
        self.max_length = max_length
        # Slots: room for max_length and a last one for clamped writes past it, aligned (see aligned_slots)
        self.capacity = aligned_slots(max_length + 1)
        shape = (s.layers, rows, s.kv_heads, self.capacity, s.head_dim)
        self.cache_k = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [L, B, Hkv, S, hd]
        self.cache_v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.lengths = torch.zeros(rows, dtype=torch.int64, device=self.device)  # [B]
        self.kv_bytes_per_token = 2 * s.layers * s.kv_heads * s.head_dim * self.cache_k.element_size()  # K and V
        # RoPE's cos and sin for every position the cache holds, gathered by each forward
        self.rope_table = model.rope(torch.arange(self.capacity, device=self.device), self.dtype)  # [S, 2, hd]
        # compile_scope "layer": one layer's graph, reused by every layer (the weights are inputs),
        # quick to compile; "model": the whole forward, which can also fuse across layers and the
        # mask and RoPE tables. compile_dynamic: torch.compile's `dynamic` (EngineConfig says why
        # False is the default). compile_prefill: prefills, whose shapes change with every
        # prompt, run a copy of the layer compiled with dynamic shapes (one graph for every
        # length and row count, and one more for a single row); eager they dispatch about 70
        # host operations a layer. Without it, or without compile, they run eager.
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope={compile_scope}: valid scopes: {', '.join(COMPILE_SCOPES)}")
        whole = compile and compile_scope == "model"
        if compile and (kernels or compile_dynamic is not True):
            # One compile per shape (specbench.kernels.attention also takes q as a launch
            # constant; CUDA graphs are captured per shape anyway): a sweep over k, or t(q) for
            # q = 1..33, passes dynamo's default limits (8 a function, 256 in all), which
            # fullgraph makes an error.
            for limit in ("recompile_limit", "accumulated_recompile_limit"):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4096))
        options = dict(fullgraph=True, mode=compile_mode, dynamic=compile_dynamic)
        self._layer = torch.compile(block, **options) if compile and not whole else block
        self._forward = torch.compile(model.forward, **options) if whole else model.forward
        prefill = compile and compile_prefill
        self._prefill_layer = torch.compile(prefill_block, fullgraph=True, dynamic=True) if prefill else block
        self._prefill_cold = prefill  # its graphs not compiled yet: see _warm_prefill
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.kernels = kernels  # decode projections through specbench.kernels.gemv (see block)
        # Decode and verify attention: the Triton kernel with kernels on (where it runs: the cache
        # stands in for qkv, whose dtype and device it shares), else the torch composition.
        if kernels and attention_supported(self.cache_k[0], self.cache_k[0]):
            self._attention = kernel_attention
        else:
            self._attention = matmul_attention if rows * s.kv_heads < FUSED_FROM else sdpa_attention
        self._graphs: dict = {}  # (q, tree) -> (graph, static inputs, static outputs)
        self._chains: dict = {}  # q -> a chain's (depth [q], ancestors [q, q]) on the device

    @property
    def length(self) -> list:
        return self.lengths.tolist()

    def prefill(self, row: int, input_ids: torch.Tensor):
        """input_ids: [T] a new request's prompt, into row `row` (whatever it held) -> logits
        [V] for its first new token, and with feature_layers the features [T, D]."""
        return self.prefill_rows([row], [input_ids])[0]

    @torch.inference_mode()
    def prefill_rows(self, rows: list, prompts: list) -> list:
        """New requests' prompts prompts[i] ([T_i]) into rows[i] (distinct; whatever they held)
        -> per request, logits [V] for its first new token (with feature_layers: and the
        features [T_i, D]), as `prefill` gives them one by one.

        Rows that follow one another are prefilled together: one forward over the run's cache
        rows, prompts right-padded to the longest (padding lies past each row's length, where
        later writes overwrite it), at most PREFILL_TOKENS inputs a forward. At batch 48 that
        is a few forwards where one a request cost 48, and the requests that wait for them
        wait that much less (the runner admits every free row at once)."""
        for T in (p.shape[0] for p in prompts):
            if T == 0:  # its logits would be a padding position's
                raise ValueError("an empty prompt: a prefill needs at least one token")
            if T > self.max_length:
                raise ValueError(f"a prompt of {T} tokens does not fit the engine's max_length {self.max_length}")
        if self._prefill_cold:
            self._warm_prefill()
        return self._prefill(rows, prompts)

    def _prefill(self, rows: list, prompts: list) -> list:
        """prefill_rows after its checks: runs of consecutive rows, one forward each."""
        out, group, width = [None] * len(rows), [], 0
        for i in sorted(range(len(rows)), key=rows.__getitem__):
            T = prompts[i].shape[0]
            if group and (rows[i] != rows[group[-1]] + 1 or (len(group) + 1) * max(width, T) > PREFILL_TOKENS):
                self._prefill_run(group, rows, prompts, out)
                group, width = [], 0
            group.append(i)
            width = max(width, T)
        if group:
            self._prefill_run(group, rows, prompts, out)
        return out

    def _warm_prefill(self) -> None:
        """Compile every graph the dynamic-shape prefill will need, before the first request's
        prefill (a compile is seconds on a GPU: inside a timed decode it would be a stall).
        Dynamo specialises sizes of 1 (one row against several) and can specialise a cache
        view's offset of 0 (a run from row 0 against a later one): the four runs are prefilled,
        so that whatever graphs dynamo makes exist before a request comes (two on CPU; a
        first run from row 2 made a third there). The dummy prompts' length equals no size of
        the engine's tensors, so that no size is tied to it in the graphs (dynamo's duck
        sizing). Lengths are restored; the rows hold nothing yet."""
        self._prefill_cold = False
        sizes = {*self.cache_k.shape, self.rows, *(n for w in self.model.parameters() for n in w.shape)}
        T = next((t for t in range(5, self.max_length + 1) if t not in sizes), min(2, self.max_length))
        lengths = self.lengths.clone()
        dummy = torch.zeros(T, dtype=torch.int64, device=self.device)
        for first in range(min(2, self.rows)):
            for n in range(1, min(2, self.rows - first) + 1):
                self._prefill(list(range(first, first + n)), [dummy] * n)
        self.lengths.copy_(lengths)

    def _prefill_run(self, group: list, rows: list, prompts: list, out: list) -> None:
        """The requests `group` (indices into rows and prompts), whose rows follow one another
        in order: one forward -> out[i] for each i in group."""
        first, n = rows[group[0]], len(group)
        lengths = [prompts[i].shape[0] for i in group]
        Tmax = max(lengths)
        tokens = torch.zeros(n, Tmax, dtype=torch.int64, device=prompts[group[0]].device)  # padding reads token 0
        for j, i in enumerate(group):
            tokens[j, : lengths[j]] = prompts[i]
        depth, ancestors = chain(Tmax, self.device)
        last = torch.tensor(lengths, device=self.device) - 1  # [n]
        # The run's rows, and only the slots its prompts fill: views, written in place.
        cache_k, cache_v = (c[:, first : first + n, :, :Tmax] for c in (self.cache_k, self.cache_v))
        logits, features = self.model(
            tokens.to(self.device), self.lengths.new_zeros(n), depth.expand(n, Tmax), ancestors.expand(n, Tmax, Tmax),
            cache_k, cache_v, self.feature_layers, last=last, layer=self._prefill_layer, attention=sdpa_attention,
            rope=self.rope_table,
        )  # [n, V], [n, Tmax, D]
        self.lengths[first : first + n] = last + 1
        for j, i in enumerate(group):
            out[i] = (logits[j], features[j, : lengths[j]]) if self.feature_layers else logits[j]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depth: Optional[torch.Tensor] = None,
                ancestors: Optional[torch.Tensor] = None):
        """tokens: [B, q] per row its last emitted token, then drafts (a chain; or tree nodes
        with depth [B, q] and ancestors [B, q, q]) -> logits [B, q, V] (and features
        [B, q, D]). The lengths do not move: `advance` keeps what was accepted."""
        B, q = tokens.shape
        assert B == self.rows, (B, self.rows)
        tree = depth is not None
        if not tree:
            depth, ancestors = self._chain(B, q)
        inputs = (tokens.to(self.device), self.lengths, depth.to(self.device), ancestors.to(self.device))
        if not self.cuda_graphs:
            logits, features = self._run(inputs)
        else:
            logits, features = self._replay(inputs, tree)
        return (logits, features) if self.feature_layers else logits

    def forward_at(self, tokens: torch.Tensor, lengths: torch.Tensor):
        """A chain forward, eager, as if each row's length were lengths [B]: tokens [B, q] written
        from there, self.lengths untouched -> as `forward`. For a caller that captures several
        forwards in one graph of its own (drafters/native_chain.py's greedy chains)."""
        B, q = tokens.shape
        logits, features = self._run((tokens, lengths, *self._chain(B, q)))
        return (logits, features) if self.feature_layers else logits

    def _chain(self, B: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A chain's depth [B, q] and ancestors [B, q, q] on the device (made once per q)."""
        if q not in self._chains:
            self._chains[q] = chain(q, self.device)
        d, a = self._chains[q]
        return d.expand(B, q), a.expand(B, q, q)

    def _run(self, inputs):
        return self._forward(*inputs, self.cache_k, self.cache_v, self.feature_layers, layer=self._layer,
                             attention=self._attention, kernels=self.kernels, rope=self.rope_table)

    def _replay(self, inputs, tree: bool):
        """A chain's graph keeps its depth and mask from the capture: only the tokens change."""
        key = (inputs[0].shape[1], tree)
        if key not in self._graphs:
            self._graphs[key] = self._capture(inputs)
        graph, static, out = self._graphs[key]
        static[0].copy_(inputs[0])
        if tree:
            static[2].copy_(inputs[2])
            static[3].copy_(inputs[3])
        graph.replay()
        return out

    def _capture(self, inputs):
        static = [x.clone() for x in inputs]
        static[1] = self.lengths  # read in place: the graph always sees the current lengths
        graph, out = graphs.capture(lambda: self._run(static))
        return graph, static, out

    def _compact(self, moved: list) -> None:
        """Move each (row, kept input indices) path's entries to the slots from the row's length
        on: every row in one gather and one write, with no host synchronization (the lengths
        stay on the device). A path is padded with input 0 onto itself: the root, which every
        path keeps in place."""
        M, P = len(moved), max(len(k) for _, k in moved)
        index = np.zeros((M, 1 + 2 * P), dtype=np.int64)  # a path a line: its row, its inputs, then 0 .. n - 1
        for i, (b, k) in enumerate(moved):  # numpy: no torch dispatch per row
            index[i, 0] = b
            index[i, 1 : 1 + len(k)] = k
            index[i, 1 + P : 1 + P + len(k)] = range(len(k))
        index = torch.from_numpy(index)
        if self.device.type == "cuda":
            index = index.pin_memory()
        index = index.to(self.device, non_blocking=True)
        rows = index[:, :1]  # [M, 1]
        start = self.lengths[rows]  # [M, 1]
        src, dst = start + index[:, 1 : 1 + P], start + index[:, 1 + P :]  # [M, P] slots
        for cache in (self.cache_k, self.cache_v):  # [L, R, Hkv, S, hd]; the gather copies before the write
            cache[:, rows, :, dst] = cache[:, rows, :, src]

    @torch.inference_mode()
    def advance(self, keep: list) -> None:
        """After a forward: row b keeps the inputs keep[b] (ascending input indices, the first
        input 0 first; empty for an idle row) at contiguous positions. A chain's keep is
        0..a: no copy, the length moves. A tree path off the first branch moves a entries."""
        moved = [(b, k) for b, k in enumerate(keep) if len(k) and k[-1] != len(k) - 1]
        if moved:
            self._compact(moved)
        counts = [len(k) for k in keep]
        if len(set(counts)) == 1:  # every row keeps as many (a decode step: one each): no copy at all
            self.lengths += counts[0]
            return
        # From pinned memory, asynchronously: a pageable copy would wait for the GPU to drain. Still
        # a host-to-device copy in the stream, between two steps (0.02 to 0.07 ms a decode step
        # on H200 hosts, results/2026-12-04-h200-evening), which the branch above avoids.
        kept = torch.tensor(counts, pin_memory=self.device.type == "cuda")
        self.lengths += kept.to(self.device, non_blocking=True)
