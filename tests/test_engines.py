"""The native engine against transformers: logits in fp32 (relative error below 1e-4) for the
Llama, Mistral and Qwen2 families, greedy outputs, ragged batches, rollback without copies,
trees and features; and the batched runner against one request at a time."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import make_engine
from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.ngram_trie import NgramTrieDrafter
from specbench.engines.native import NativeEngine, Transformer, block as native_block
from specbench.runner import Speculation, decode_requests
from specbench.sampling import SamplingParams
from specbench.tree import compile_tree

GREEDY = SamplingParams(temperature=0.0)
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=True)),
    "llama3-rope": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64))),
    "llama-yarn": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=64))),
    "llama-attention-bias": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True)),  # o_proj's too
    "mistral": lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None)),
    # a window wider than the engine's 64 tokens never binds: the native engine takes the model
    "mistral-wide-window": lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=128)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, use_sliding_window=False)),
}


def random_model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        for p in model.parameters():  # default init gives near-uniform logits; sharpen them
            p.mul_(8.0 if p.dim() > 1 else 1.0)
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)  # norms and biases not at their init values
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", FAMILIES)
def test_native_logits_match_transformers(family):
    """Prefill, a chain of 5 and a tree of 5 in rows of different lengths, each against a
    plain transformers forward over the same tokens: relative error below 1e-4 in fp32."""
    model = random_model(family)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=g) for n in (7, 12, 3)]
    engine = NativeEngine(Transformer.from_hf(model), 3, 64)
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            last = engine.prefill(row, prompt)
            assert rel(last, model(prompt[None]).logits[0, -1]) < 1e-4
        step = torch.randint(0, 96, (3, 5), generator=g)
        logits = engine.forward(step)  # [3, 5, V]
        for row, prompt in enumerate(prompts):
            ref = model(torch.cat([prompt, step[row]])[None]).logits[0, -5:]
            assert rel(logits[row], ref) < 1e-4
        # Keep only each row's first input (no copy), then a tree: root, two children, grandchildren.
        engine.advance([[0]] * 3)
        tree = compile_tree(torch.tensor([-1, 0, 0, 1, 2]))
        logits = engine.forward(step, tree.depth.expand(3, 5), tree.mask.expand(3, 5, 5))
        for row, prompt in enumerate(prompts):
            history = torch.cat([prompt, step[row, :1]])
            for node, branch in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4]]):
                ref = model(torch.cat([history, step[row, branch]])[None]).logits[0, -1]
                assert rel(logits[row, node], ref) < 1e-4, (row, node)


@pytest.mark.parametrize("rope", [dict(rope_type="dynamic", factor=2.0),
                                  dict(rope_type="longrope", short_factor=[1.0] * 4, long_factor=[2.0] * 4,
                                       original_max_position_embeddings=64)])
def test_native_refuses_rope_whose_frequencies_follow_the_length(rope):
    """transformers recomputes dynamic and longrope frequencies as a sequence grows; the native
    engine's are fixed at load, so it refuses them in one line naming the rope_type."""
    model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling=rope)).eval()
    with pytest.raises(ValueError, match=f"rope_type={rope['rope_type']}"):
        Transformer.from_hf(model)


def test_native_refuses_a_sliding_window_its_requests_would_pass():
    model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=16)).eval()
    native = Transformer.from_hf(model)
    NativeEngine(native, 1, 16)  # within the window every key is seen: exact
    with pytest.raises(ValueError, match="max_length 17 exceeds the model's sliding_window=16"):
        NativeEngine(native, 1, 17)


def test_native_refuses_an_empty_prompt(tiny_model):
    engine = make_engine("native", tiny_model)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.prefill(0, torch.tensor([], dtype=torch.long))


@pytest.mark.parametrize("family", ["mistral", "qwen2-some-layers"])
def test_hf_tree_verify_keeps_the_sliding_window(family):
    """A tree forward on the hf engine past a sliding window (4 keys; 10 cached tokens) equals a
    plain transformers forward over each node's path: the tree's mask is windowed where the
    layers slide (Mistral: all of them; Qwen2 past max_window_layers: layers 1 and 2, a mask
    per layer type). A chain is checked beside it (no mask: transformers' own)."""
    torch.manual_seed(0)
    if family == "mistral":
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=4))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=4, max_window_layers=1))
        assert model.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 96, (10,), generator=g)
    step = torch.tensor([[17, 5, 6, 9]])  # the last emitted token, then drafts
    engine = make_engine("hf", model)
    tree = compile_tree(torch.tensor([-1, 0, 0, 1]))
    with torch.no_grad():
        engine.prefill(0, prefix)
        chain = engine.forward(step)
        ref = model(torch.cat([prefix, step[0]])[None]).logits[0, -4:]
        assert rel(chain[0], ref) < 1e-4
        engine.advance([[0]])
        engine.prefill(0, prefix)
        logits = engine.forward(step, tree.depth[None], tree.mask[None])
        for node, path in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
            ref = model(torch.cat([prefix, step[0, path]])[None]).logits[0, -1]
            assert rel(logits[0, node], ref) < 1e-4, node


def test_rollback_moves_lengths_not_memory(tiny_model):
    """A chain's rollback changes lengths only; rejected entries stay in memory, masked, and
    the next forward equals a plain forward over the kept tokens."""
    engine = make_engine("native", tiny_model, rows=2)
    for row in range(2):
        engine.prefill(row, torch.tensor([5, 6, 7]))
    before = engine.cache_k.clone()
    engine.forward(torch.tensor([[8, 9, 10], [8, 11, 12]]))
    written = engine.cache_k[:, :, :, 3:6].clone()
    engine.advance([[0, 1], [0]])  # row 0 keeps 8, 9; row 1 keeps 8
    assert engine.length == [5, 4]
    torch.testing.assert_close(engine.cache_k[:, :, :, 3:6], written)  # nothing moved, nothing erased
    assert not torch.equal(engine.cache_k, before)
    out = engine.forward(torch.tensor([[13], [14]]))[:, 0]
    with torch.no_grad():
        torch.testing.assert_close(out[0], tiny_model(torch.tensor([[5, 6, 7, 8, 9, 13]])).logits[0, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out[1], tiny_model(torch.tensor([[5, 6, 7, 8, 14]])).logits[0, -1], rtol=1e-4, atol=1e-4)


def test_features_match_transformers_hidden_states(tiny_model):
    layers = (0, 1, 2)  # the embedding output, layer 1's input, the final-norm output
    engine = make_engine("native", tiny_model, feature_layers=layers)
    prompt = torch.tensor([0, 5, 17, 42, 7, 9])
    _, features = engine.prefill(0, prompt)
    _, step_features = engine.forward(torch.tensor([[3, 4]]))
    with torch.no_grad():
        hidden = tiny_model(torch.cat([prompt, torch.tensor([3, 4])])[None], output_hidden_states=True).hidden_states
    ref = torch.cat([hidden[i][0] for i in layers], -1)  # [8, 3D]
    torch.testing.assert_close(torch.cat([features, step_features[0]]), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("budget", [16384, 12])
def test_batched_prefill_equals_one_row_at_a_time(tiny_model, monkeypatch, budget):
    """prefill_rows over rows given out of order, in two runs of consecutive rows (0-1 and 3-4),
    with prompts of different lengths, gives each request the logits and features of a prefill
    of its own, and leaves each row's cache and length as that prefill does. budget: the most
    inputs one forward takes (12 splits the runs further: a forward a row)."""
    import specbench.engines.native as native

    monkeypatch.setattr(native, "PREFILL_TOKENS", budget)
    layers = (0, 2)
    g = torch.Generator().manual_seed(3)
    rows, lengths = [4, 0, 3, 1], [5, 9, 2, 6]
    prompts = [torch.randint(0, 96, (n,), generator=g) for n in lengths]
    batched = make_engine("native", tiny_model, rows=5, feature_layers=layers)
    alone = make_engine("native", tiny_model, rows=5, feature_layers=layers)
    together = batched.prefill_rows(rows, prompts)
    for row, prompt, (logits, features) in zip(rows, prompts, together):
        ref_logits, ref_features = alone.prefill(row, prompt)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(features, ref_features, rtol=1e-5, atol=1e-5)
        assert features.shape[0] == prompt.shape[0]
    assert batched.length == alone.length == [9, 6, 0, 2, 5]
    for row, n in zip(rows, lengths):
        torch.testing.assert_close(batched.cache_k[:, row, :, :n], alone.cache_k[:, row, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.cache_v[:, row, :, :n], alone.cache_v[:, row, :, :n], rtol=1e-5, atol=1e-5)
    step = torch.randint(0, 96, (5, 3), generator=g)  # the next forward reads the same caches
    torch.testing.assert_close(batched.forward(step)[0][rows], alone.forward(step)[0][rows], rtol=1e-5, atol=1e-5)


def test_prompt_longer_than_the_cache_is_refused(tiny_model):
    engine = make_engine("native", tiny_model, max_length=8)
    with pytest.raises(ValueError, match="max_length 8"):
        engine.prefill(0, torch.arange(9))
    engine.prefill(0, torch.arange(8))  # exactly max_length fits


def test_cache_slots_are_aligned_and_hold_max_length(tiny_model):
    """A row's slots are a multiple of SLOT_ALIGN (aligned attention operands) with room for
    max_length and the clamped-write slot; a head cache rounds likewise, and grows past it."""
    from types import SimpleNamespace

    from specbench.heads import StaticHeadCache
    from specbench.kernels.attention import SLOT_ALIGN, aligned_slots

    assert [aligned_slots(n) for n in (1, 8, 9, 641)] == [8, 8, 16, 648]
    for max_length in (7, 8, 100, 640):
        engine = NativeEngine(Transformer.from_hf(tiny_model), 1, max_length)
        assert engine.max_length == max_length
        assert engine.capacity % SLOT_ALIGN == 0 and max_length + 1 <= engine.capacity < max_length + 1 + SLOT_ALIGN
        assert engine.cache_k.shape[3] == engine.capacity == engine.rope_table.shape[0]
    cache = StaticHeadCache(SimpleNamespace(num_key_value_heads=1, head_dim=8), 2, 10, "cpu", torch.float32)
    assert cache.capacity == 16 and cache.grown(3, cache.capacity).capacity == 16
    assert cache.grown(3, 17).capacity == 24


PROMPTS = [torch.tensor(p) for p in ([0, 5, 17, 42, 7, 9, 5, 17], [0, 88, 3, 3, 60], [0, 12, 13, 12, 13, 12],
                                     [0, 40, 41, 42], [0, 7, 7, 7, 7, 7, 7], [0, 3])]


def greedy(engine, spec=None, prompts=PROMPTS, max_new=24):
    records = decode_requests(engine, prompts, params=GREEDY, max_new_tokens=max_new, eos_ids=frozenset({1}),
                              generator=torch.Generator().manual_seed(0), spec=spec)
    return [r.tokens for r in records]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Greedy outputs of transformers' engine, one request at a time, no speculation."""
    return greedy(make_engine("hf", tiny_model))


@pytest.mark.parametrize("rows", [1, 4])
def test_native_greedy_equals_transformers_in_ragged_batches(tiny_model, reference, rows):
    """Six prompts of different lengths through 1 or 4 rows (finished rows take the next
    prompt): plain decoding, an n-gram chain and an n-gram trie's trees all give the
    reference tokens, request by request."""
    engine = lambda: make_engine("native", tiny_model, rows=rows)  # noqa: E731
    assert greedy(engine()) == reference
    chain = Speculation(NgramDrafter(1, 3), "standard", 4)
    assert greedy(engine(), chain) == reference
    tree = Speculation(NgramTrieDrafter(), "standard", 3, topk=2, num_draft_tokens=6)
    assert greedy(engine(), tree) == reference


class OracleDrafter:
    """Proposes each request's reference continuation, each token corrupted with probability
    `noise`: acceptance differs between requests and rounds."""

    name = "oracle"

    def __init__(self, prompts, references, noise: float, seed: int = 0):
        self.prompts, self.references, self.noise = prompts, references, noise
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, state: DraftState) -> DraftProposal:
        B = len(state.tokens)
        tokens = torch.full((B, state.k), -1, dtype=torch.long)
        num = torch.zeros(B, dtype=torch.long)
        for b, (i, history) in enumerate(zip(state.request_ids, state.tokens)):
            done = history.shape[0] - self.prompts[i].shape[0]
            guess = torch.tensor(self.references[i][done : done + state.k], dtype=torch.long)
            flip = torch.rand(guess.shape[0], generator=self.g) < self.noise
            tokens[b, : guess.shape[0]] = torch.where(flip, torch.randint(2, 96, guess.shape, generator=self.g), guess)
            num[b] = guess.shape[0]
        return DraftProposal(tokens=tokens, num_tokens=num)


@pytest.mark.parametrize("rule", ["standard", "onehot", "target_only"])
def test_batched_speculation_accepts_per_request(tiny_model, reference, rule):
    """Six requests in 3 rows: requests accept different numbers of drafts in the same round,
    and every request still decodes to its reference tokens."""
    engine = make_engine("native", tiny_model, rows=3)
    spec = Speculation(OracleDrafter(PROMPTS, reference, noise=0.3), rule, 4)
    records = decode_requests(engine, PROMPTS, params=GREEDY, max_new_tokens=24, eos_ids=frozenset({1}),
                              generator=torch.Generator().manual_seed(0), spec=spec)
    assert [r.tokens for r in records] == reference
    first = [r.accepted[0] for r in records[:3]]  # the first round of the first batch
    assert len(set(first)) > 1 and sum(sum(r.accepted) for r in records) > 0


def test_wide_batches_use_the_fused_attention_with_the_same_logits(tiny_model):
    """64 rows x 2 key/value heads reach FUSED_FROM: the fused kernel then serves decode
    shapes; rows 5 and 63 still match transformers."""
    from specbench.engines.native import FUSED_FROM

    engine = make_engine("native", tiny_model, rows=64)
    assert engine.rows * engine.model.s.kv_heads >= FUSED_FROM
    prompts = {5: torch.tensor([0, 5, 17, 42]), 63: torch.tensor([0, 88, 3])}
    for row, prompt in prompts.items():
        engine.prefill(row, prompt)
    step = torch.randint(0, 96, (64, 3), generator=torch.Generator().manual_seed(0))
    logits = engine.forward(step)
    with torch.no_grad():
        for row, prompt in prompts.items():
            ref = tiny_model(torch.cat([prompt, step[row]])[None]).logits[0]
            assert rel(logits[row], ref[-3:]) < 1e-4


def test_round_clock_counts_batched_rounds_and_prefills(tiny_model):
    """Six requests in 3 rows, plain decoding of 24 tokens: at least 23 batched rounds per
    request slot (fewer than 6 x 23: rows run together), one forward each; prefill_ms spreads
    the admissions' prefills over those rounds, each admission once."""
    from specbench.metrics import RoundClock, SpecStats, summarize

    clock = RoundClock()
    records = decode_requests(make_engine("native", tiny_model, rows=3), PROMPTS, params=GREEDY, max_new_tokens=24,
                              eos_ids=frozenset(), generator=torch.Generator(), clock=clock)
    assert 2 * 23 <= clock.steps < 6 * 23 and clock.elapsed_s > 0
    row = summarize(records, SpecStats(0), wall_s=1.0, clock=clock)
    # Requests 0 .. 2 are admitted together at the start (one TTFT), then 3 .. 5 as rows free
    # up: all three rows finish together (24 tokens each, no EOS), so the second admission also
    # takes them at once.
    assert records[0].ttft_s == records[1].ttft_s == records[2].ttft_s
    assert records[3].ttft_s == records[4].ttft_s == records[5].ttft_s
    assert clock.prefill_s == pytest.approx(records[0].ttft_s + records[3].ttft_s)
    assert row["prefill_ms"] == pytest.approx(1e3 * clock.prefill_s / clock.steps)
    assert row["verify_ms"] == pytest.approx(1e3 * clock.forward_s / clock.steps)
    assert row["throughput_tok_s"] == pytest.approx(6 * 24 / clock.elapsed_s)
    # Prefill waits: no request decodes through an admission (each finishes with its partners).
    assert all(r.prefill_wait_s == 0.0 for r in records) and row["prefill_wait_ms"] == 0.0
    # Request 0 stops at its first token (its EOS): request 2 takes its row at once, and request
    # 1, admitted with 0, decodes through that admission.
    with torch.no_grad():
        eos = int(tiny_model(PROMPTS[0][None]).logits[0, -1].argmax())
    records = decode_requests(make_engine("native", tiny_model, rows=2), PROMPTS[:3], params=GREEDY, max_new_tokens=8,
                              eos_ids=frozenset({eos}), generator=torch.Generator(), clock=RoundClock())
    assert records[0].tokens == [eos] and records[1].rounds > 0
    assert records[1].prefill_wait_s >= records[2].ttft_s > 0 and records[2].prefill_wait_s == 0.0
    alone = decode_requests(make_engine("native", tiny_model, rows=1), PROMPTS[:2], params=GREEDY, max_new_tokens=4,
                            eos_ids=frozenset(), generator=torch.Generator())
    assert [r.prefill_wait_s for r in alone] == [0.0, 0.0]  # one row: nobody is admitted mid-request


def test_round_clock_weights_each_round_by_its_live_requests(tiny_model):
    """request_round_ms: a round's draft + verify + other time over request-rounds, each batched
    round counted once per live request. Two hand-timed rounds (6 ms with 3 live requests, 3 ms
    with 1) give (3 x 6 + 3) / 4 = 5.25 ms, above the per-round mean (4.5 ms). The runner counts
    each request's rounds: 6 requests of 24 tokens in 3 rows, 23 rounds each."""
    from specbench.metrics import RoundClock, SpecStats, summarize

    clock = RoundClock()
    clock.observe(1e-3, 2e-3, 3e-3, live=3)
    clock.observe(1e-3, 1e-3, 1e-3, live=1)
    row = summarize([], SpecStats(0), wall_s=1.0, clock=clock)
    assert row["request_round_ms"] == pytest.approx(5.25)
    assert row["verify_ms"] + row["other_ms"] == pytest.approx(4.5 - 1.0)  # the baseline has no draft_ms
    clock = RoundClock()
    records = decode_requests(make_engine("native", tiny_model, rows=3), PROMPTS, params=GREEDY, max_new_tokens=24,
                              eos_ids=frozenset(), generator=torch.Generator(), clock=clock)
    assert [r.rounds for r in records] == [23] * 6 and clock.request_rounds == 6 * 23 == 3 * clock.steps
    assert summarize(records, SpecStats(0), wall_s=1.0, clock=clock)["request_round_ms"] == pytest.approx(
        1e3 * (clock.draft_s + clock.forward_s + clock.other_s) / clock.steps)  # every round has 3 live requests


def test_median_tokens_per_round_is_the_median_requests():
    """Three requests of 9 tokens after the first: in 9, 3 and 1 rounds (tau 1, 3, 9). Pooled,
    27 tokens in 13 rounds: 2.08, their harmonic mean; the median request's tau is 3, and the
    median TPOT at one round time R is R / 3. A request with no round (it ended at its prefill)
    has no tau."""
    from specbench.metrics import RequestRecord, RoundClock, SpecStats, summarize

    def request(rounds):
        return RequestRecord("p", 4, list(range(10)), ttft_s=0.0, decode_s=rounds * 6e-3,
                             drafted=[4] * rounds, accepted=[0] * rounds)

    records = [request(9), request(3), request(1), RequestRecord("p", 4, [7], ttft_s=0.0, decode_s=0.0)]
    row = summarize(records, SpecStats(4), wall_s=1.0, clock=RoundClock())
    assert row["tokens_per_round"] == pytest.approx(27 / 13) and row["median_tokens_per_round"] == 3.0
    assert row["tpot_ms"] == pytest.approx(6.0 / 3)


@pytest.mark.parametrize("scope", ["layer", "model"])
def test_compiled_forward_matches_the_eager_one(tiny_model, scope):
    """torch.compile of one layer (reused by all) or of the whole forward computes the same
    logits as the eager engine, for a chain and a tree, in rows of different lengths (CPU:
    no graphs; about half a minute of compilation each)."""
    engines = [NativeEngine(Transformer.from_hf(tiny_model), 2, 64, compile=c, compile_scope=scope) for c in (False, True)]
    tree = compile_tree(torch.tensor([-1, 0, 0, 1]))
    step = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    outs = []
    for engine in engines:
        engine.prefill(0, torch.tensor([0, 5, 17, 42, 7]))
        engine.prefill(1, torch.tensor([0, 88]))
        chain_logits = engine.forward(step)
        engine.advance([[0, 1], [0]])
        outs.append((chain_logits, engine.forward(step, tree.depth.expand(2, 4), tree.mask.expand(2, 4, 4))))
    for eager, compiled in zip(*outs):
        assert rel(compiled, eager) < 1e-5


@pytest.mark.parametrize("dynamic", [False, None])
def test_each_forward_shape_compiles_on_its_own_unless_asked(tiny_model, dynamic):
    """compile_dynamic=False (the config's default) compiles q = 1, 2, 3 into three graphs, so
    that a job's kernels do not depend on the shapes an earlier job compiled in its process;
    dynamo's default (None) makes q symbolic at the second shape and serves q = 3 with it."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    engine = NativeEngine(Transformer.from_hf(tiny_model), 1, 32, compile=True, compile_dynamic=dynamic)
    engine.prefill(0, torch.tensor([0, 5, 17]))
    before = counters["stats"]["unique_graphs"]
    for q in (1, 2, 3):
        engine.forward(torch.arange(q)[None])
    assert counters["stats"]["unique_graphs"] - before == (3 if dynamic is False else 2)


def test_compiled_prefill_matches_eager_in_the_graphs_its_warm_up_compiled(tiny_model):
    """compile=True prefills through the dynamic-shape layer: runs of one row and of several,
    from row 0 and from later rows, prompts of 2 to 12 tokens, give eager's logits, cache
    entries and lengths (fp32, within 1e-5), and compile nothing after the first prefill
    (its warm-up compiles every graph a later prefill needs). A decode step after them agrees too."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    native = Transformer.from_hf(tiny_model)
    eager, compiled = NativeEngine(native, 6, 64), NativeEngine(native, 6, 64, compile=True)
    g = torch.Generator().manual_seed(0)
    runs = [([0], [5]), ([2, 3], [5, 9]), ([1, 2, 3], [3, 4, 11]), ([5], [3]), ([0, 1, 3], [4, 4, 4]),
            ([1, 2], [2, 2]), (list(range(6)), [12, 2, 6, 8, 7, 6])]
    for i, (rows, lens) in enumerate(runs):
        prompts = [torch.randint(0, tiny_model.config.vocab_size, (n,), generator=g) for n in lens]
        for want, got in zip(eager.prefill_rows(rows, prompts), compiled.prefill_rows(rows, prompts)):
            assert rel(got, want) < 1e-5
        for row, n in zip(rows, lens):
            for cache in ("cache_k", "cache_v"):
                assert rel(getattr(compiled, cache)[:, row, :, :n], getattr(eager, cache)[:, row, :, :n]) < 1e-5
        assert compiled.length == eager.length
        if i == 0:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs
    step = torch.randint(0, tiny_model.config.vocab_size, (6, 3), generator=g)
    assert rel(compiled.forward(step), eager.forward(step)) < 1e-5
    assert NativeEngine(native, 6, 64, compile=True, compile_prefill=False)._prefill_layer is native_block


def test_unknown_compile_scope_is_refused(tiny_model):
    with pytest.raises(ValueError, match="compile_scope=graph"):
        NativeEngine(Transformer.from_hf(tiny_model), 1, 16, compile=True, compile_scope="graph")


def test_triton_rules_in_the_batched_runner(tiny_model, reference):
    """rule.impl=triton (on CPU through Triton's interpreter): the chain and tree kernels verify
    in the runner, and greedy decoding still gives the reference tokens, request by request."""
    pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
    engine = lambda: make_engine("native", tiny_model, rows=3)  # noqa: E731
    chain = Speculation(OracleDrafter(PROMPTS, reference, noise=0.3), "onehot", 4, impl="triton")
    assert greedy(engine(), chain) == reference
    tree = Speculation(NgramTrieDrafter(), "target_only", 3, topk=2, num_draft_tokens=6, impl="triton")
    assert greedy(engine(), tree) == reference


def test_attention_kernel_in_the_engine():
    """engine.kernels: decode and verify attention through specbench.kernels.attention (on CPU in
    Triton's interpreter; hd 16, the kernel's least head size). Ragged rows, a chain then a tree
    after a partial rollback: logits within 1e-4 of transformers, as the torch path is held."""
    pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
    from specbench.engines.native import kernel_attention, matmul_attention

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM(LlamaConfig(**{**COMMON, "num_hidden_layers": 2, "num_attention_heads": 4})).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    engine = NativeEngine(Transformer.from_hf(model), 2, 32, kernels=True)
    assert engine._attention is kernel_attention
    assert NativeEngine(Transformer.from_hf(model), 2, 32)._attention is matmul_attention
    prompts = [torch.tensor([0, 5, 17, 42, 7], device=device), torch.tensor([0, 88], device=device)]
    for row, prompt in enumerate(prompts):
        engine.prefill(row, prompt)
    step = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]], device=device)
    logits = engine.forward(step)
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            ref = model(torch.cat([prompt, step[row]])[None]).logits[0, -4:]
            assert rel(logits[row], ref) < 1e-4
    engine.advance([[0, 1], [0]])
    tree = compile_tree(torch.tensor([-1, 0, 0, 1]))
    logits = engine.forward(step, tree.depth.expand(2, 4), tree.mask.expand(2, 4, 4))
    with torch.no_grad():
        for row, (prompt, kept) in enumerate(zip(prompts, [[3, 4], [7]])):
            history = torch.cat([prompt, torch.tensor(kept, device=device)])
            for node, branch in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
                ref = model(torch.cat([history, step[row, branch]])[None]).logits[0, -1]
                assert rel(logits[row, node], ref) < 1e-4, (row, node)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the projection kernels (specbench.kernels.gemv) run on CUDA only")
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("early", [False, True], ids=["serial", "pdl"])
@pytest.mark.parametrize("width", [512, 576], ids=["tiled", "smollm2"])
def test_all_kernels_in_cuda_graphs_match_transformers(rows, early, width):
    """engine.kernels, every kernel in use: the projections with their folds, one row (decode at
    batch 1) or several (a chain, a batch), attention, all in CUDA graphs, launched one after
    another or with programmatic dependent launch where it applies (Hopper; every forward of up
    to 16 rows, specbench.kernels.pdl). Widths that the K tiles divide (512, 4 heads of 128,
    MLP 1024), and SmolLM2-135M's (576, 9 heads of 64 over 3 key/value heads, MLP 1536), whose
    last K tile is masked. fp32 logits within 1e-4 of transformers, after a decode, a chain and
    a rollback."""
    pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
    from specbench.kernels import pdl
    with pdl.enabled(early, rows=16):  # decided at capture; the chain's and batch's forwards too
        _all_kernels_match_transformers(rows, width)


def test_all_kernels_at_smollm2_widths_in_the_interpreter(monkeypatch):
    """The test above's path on CPU through Triton's interpreter, at SmolLM2-135M's widths (every
    projection's K tiles masked at the end), one row and two: gemv's autotuners, which need a
    GPU, stand in as one tile each (256-wide K tiles, unsplit); no CUDA graphs on CPU. On
    2 to 16 rows the residual projections sum their outputs' squares and the norms after them
    (every one but the first layer's) take their rstd from those, the LM head's included; on
    24 rows the norms run before the projections (gemv.norm_rows) and nothing sums squares."""
    pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
    from specbench.kernels import gemv

    class OneTile:  # an autotuner's launch with one configuration
        def __init__(self, tuner, **config):
            self.fn, self.config = tuner.fn, config

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append(kwargs)
                return self.fn[grid(self.config)](*args, **kwargs, **self.config)
            return launch

    calls = []

    one_row = OneTile(gemv._vector_kernel, BLOCK_N=8, BLOCK_K=256, LOOP_STAGES=0)
    rows_ = OneTile(gemv._rows_kernel, BLOCK_N=16, BLOCK_K=256, SPLIT_K=1)
    launched = []
    monkeypatch.setattr(gemv, "supported", lambda x, w: x.numel() // x.shape[-1] <= gemv.MAX_ROWS and x.dtype == w.dtype)
    monkeypatch.setattr(gemv, "tuner", lambda M, N, glu, K: launched.append((M, K)) or (one_row if M == 1 else rows_))
    for rows in (1, 2):
        _all_kernels_match_transformers(rows, 576, vocab=256)
    assert {K for _, K in launched} == {576, 1536}  # every projection: wqkv, wo, w13 and the head; w2
    assert {M for M, _ in launched} >= {1, 2, 4, 8, 12, 24}  # decode, chains of 4 and 12, at 1 and 2 rows
    wide = [c for c in calls if c.get("BLOCK_M", 16) > 16]  # 24 rows: the norms beforehand, no squares
    assert wide and not any(c["NORM"] or c["SQUARES"] for c in wide)
    rows_calls = [c for c in calls if c.get("BLOCK_M") == 16]  # the rows kernel at 16 rows (one-row calls: no BLOCK_M)
    norms = [c for c in rows_calls if c["NORM"]]
    # 2 layers a forward: wqkv's norm from the squares but in layer 0, w13's always, the head's too
    assert sum(c["NORM_SQUARES"] > 0 for c in norms) == 4 * len(norms) // 5
    assert all(c["SQUARES"] == c["RESIDUAL"] for c in rows_calls)


def _all_kernels_match_transformers(rows, width=512, vocab=1000):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    heads, kv_heads, mlp = (4, 2, 1024) if width == 512 else (9, 3, 1536)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=mlp, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512)
    model = LlamaForCausalLM(config).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    engine = NativeEngine(Transformer.from_hf(model), rows, 64, kernels=True)
    prompts = [torch.tensor([0, 5, 17, 42, 7], device=device), torch.tensor([0, 88], device=device)][:rows]
    for row, prompt in enumerate(prompts):
        engine.prefill(row, prompt)
    histories = [p.tolist() for p in prompts]
    # decode, chain (keep 2), decode, a chain of 12 (keep 2): at 2 rows 24 input rows, past the
    # rows kernel's 16-row tile (gemv's wide rows)
    for step in ([[3]] * rows, [[3, 4, 5, 6]] * rows, [[9]] * rows, [list(range(20, 32))] * rows):
        inputs = torch.tensor(step, device=device)
        logits = engine.forward(inputs)
        with torch.no_grad():
            for row in range(rows):
                ref = model(torch.tensor(histories[row] + step[row], device=device)[None]).logits[0, -len(step[row]):]
                assert rel(logits[row], ref) < 1e-4, (step, row)
        keep = min(2, len(step[0]))
        engine.advance([list(range(keep))] * rows)
        for row in range(rows):
            histories[row] += step[row][:keep]
