"""The decoding loop on a tiny random-weight model: greedy speculation equals the baseline."""

import pytest
import torch

from conftest import ScriptedDrafter
from specbench.engines.hf import HFEngine
from specbench.metrics import SpecStats
from specbench.runner import Speculation, decode
from specbench.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
EOS = frozenset({1})
PROMPTS = [torch.tensor([0, 5, 17, 42, 7, 9]), torch.tensor([0, 88, 3, 3, 60])]


def run(model, prompt, spec=None, params=GREEDY, max_new=40, seed=0, stats=None):
    g = torch.Generator().manual_seed(seed)
    return decode(
        HFEngine(model), prompt, params=params, max_new_tokens=max_new, eos_ids=EOS, generator=g,
        spec=spec, stats=stats,
    )


def test_baseline_matches_transformers_generate(tiny_model):
    for prompt in PROMPTS:
        ours = run(tiny_model, prompt).tokens
        ref = tiny_model.generate(prompt[None], max_new_tokens=40, do_sample=False, eos_token_id=1, pad_token_id=1)
        assert ours == ref[0, prompt.shape[0] :].tolist()


@pytest.mark.parametrize("rule", ["standard", "onehot", "target_only", "thresholded"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculation_equals_baseline(tiny_model, rule, k):
    for prompt in PROMPTS:
        baseline = run(tiny_model, prompt).tokens
        drafter = ScriptedDrafter(len(prompt), baseline, noise=0.3, vocab=96, seed=k)
        stats = SpecStats(k)
        out = run(tiny_model, prompt, Speculation(drafter, rule, k), stats=stats)
        assert out.tokens == baseline
        # both paths ran: some drafts accepted, some rejected
        assert 0 < stats.accepted < stats.drafted
        assert stats.rounds == out.rounds < len(baseline)


def test_perfect_drafter_emits_k_plus_one_per_round(tiny_model):
    prompt = PROMPTS[0]
    baseline = run(tiny_model, prompt, max_new=33).tokens
    assert len(baseline) == 33, "needs a continuation without EOS"
    drafter = ScriptedDrafter(len(prompt), baseline, noise=0.0, vocab=96)
    stats = SpecStats(4)
    out = run(tiny_model, prompt, Speculation(drafter, "onehot", 4), max_new=33, stats=stats)
    assert out.tokens == baseline
    assert out.drafted[:-1] == [4] * (out.rounds - 1) and stats.accept_pos == [1.0] * 4
    assert out.rounds == 32 // 5 + 1  # 32 tokens after the prefill, 5 per round, the last short


def test_sampled_speculation_is_well_formed(tiny_model):
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
    prompt = PROMPTS[1]
    ref = run(tiny_model, prompt, params=params, seed=1).tokens
    drafter = ScriptedDrafter(len(prompt), ref, noise=0.2, vocab=96)
    stats = SpecStats(3)
    out = run(tiny_model, prompt, Speculation(drafter, "standard", 3), params=params, seed=2, stats=stats)
    assert 1 <= len(out.tokens) <= 40 and all(0 <= t < 96 for t in out.tokens)
    assert (1 in out.tokens) == (out.tokens[-1] == 1)  # EOS only ever last
    assert sum(out.accepted) == stats.accepted and sum(out.drafted) == stats.drafted
