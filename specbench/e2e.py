"""End-to-end distribution check: speculative decoding against the baseline sampler.

For each prompt, draw N continuations of 1 + L tokens with the baseline sampler and N with
speculative decoding (the runner's loop, any drafter and rule, temperature > 0), and compare
the token distributions at the L positions after the first, position by position, with a
two-sample chi-square test over pooled categories. (The first token comes from the prefill in
both samplers: no rule touches it, so it is not tested.) Positions of one continuation are dependent, so their p-values (over all prompts
and positions) are combined with the Cauchy combination test (specbench.distcheck).

TV is reported beside its noise floor: the same statistic between two independent baseline
samples of N each (plug-in TV over tens of thousands of tokens is far from 0 even when the
distributions are equal).

Letters: N samples, L positions, V vocabulary (category V = "ended": after EOS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from specbench import distcheck
from specbench.engines.hf import cache_kwarg
from specbench.runner import Speculation, decode_requests
from specbench.sampling import SamplingParams, probs_from_logits, sample

BATCH = 256  # baseline continuations per forward


@torch.inference_mode()
def baseline_samples(model, prompt, n: int, length: int, params: SamplingParams, eos_ids, generator) -> torch.Tensor:
    """n continuations of `prompt` [T] from the plain sampler over the transformers model,
    batched -> [n, L], V after EOS."""
    device = next(model.parameters()).device
    arg = cache_kwarg(model)
    out = []
    for lo in range(0, n, BATCH):
        b = min(BATCH, n - lo)
        cache = DynamicCache()
        logits = model(input_ids=prompt[None].to(device), use_cache=True, **{arg: cache}).logits[:, -1]  # [1, V]
        cache.batch_repeat_interleave(b)
        token = sample(probs_from_logits(logits, params).expand(b, -1), generator)  # [b]
        tokens = [token]
        for _ in range(length - 1):
            logits = model(input_ids=token[:, None], use_cache=True, **{arg: cache}).logits[:, -1]  # [b, V]
            token = sample(probs_from_logits(logits, params), generator)
            tokens.append(token)
        out.append(torch.stack(tokens, 1).cpu())
    return _mark_ended(torch.cat(out), eos_ids, model.get_output_embeddings().weight.shape[0])


def speculative_samples(engine, prompt, n: int, length: int, params, eos_ids, spec: Speculation, seed: int) -> torch.Tensor:
    """n continuations from the runner's speculative loop, engine.rows at a time -> [n, L]."""
    g = torch.Generator(engine.device).manual_seed(seed)
    records = decode_requests(engine, [prompt] * n, params=params, max_new_tokens=length, eos_ids=eos_ids,
                              generator=g, spec=spec)
    out = torch.full((n, length), engine.vocab_size, dtype=torch.long)
    for i, record in enumerate(records):
        out[i, : len(record.tokens)] = torch.tensor(record.tokens)
    return _mark_ended(out, eos_ids, engine.vocab_size)


def _mark_ended(samples: torch.Tensor, eos_ids, vocab_size: int) -> torch.Tensor:
    """Positions after an EOS become category V ("ended"); the EOS itself stays."""
    is_eos = torch.zeros_like(samples, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= samples == e
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    return samples.masked_fill(after, vocab_size)


@dataclass(frozen=True)
class Comparison:
    pvalues: list  # per position with something to test (a position that pools to one bin has none)
    tv: list  # per position, speculative vs baseline
    tv_null: list  # per position, baseline vs an independent baseline sample


def compare(spec: torch.Tensor, base: torch.Tensor, base2: torch.Tensor, categories: int) -> Comparison:
    """spec, base, base2: [N, L] token samples -> per-position tests."""
    pvalues, tv, tv_null = [], [], []
    for j in range(spec.shape[1]):
        a, b, c = (np.bincount(x[:, j].numpy(), minlength=categories) for x in (spec, base, base2))
        test = distcheck.chisquare_homogeneity(a, b)
        if test.dof > 0:  # left out of the combination: a p-value of 1 would outweigh every other
            pvalues.append(test.pvalue)
        tv.append(distcheck.tv_distance(a, b))
        tv_null.append(distcheck.tv_distance(c, b))
    return Comparison(pvalues, tv, tv_null)


def end_to_end(model, engine, inputs: list, *, params: SamplingParams, eos_ids, spec: Speculation,
               samples: int, length: int, seed: int) -> dict:
    """The check over prompts `inputs` (each [T]) -> the columns it adds to a results row.
    The baseline samples come from the transformers model itself, the speculative ones from
    the run's engine (hf or native)."""
    categories = engine.vocab_size + 1
    pvalues, tv, tv_null = [], [], []
    for i, prompt in enumerate(inputs):
        g = torch.Generator(engine.device).manual_seed(seed + 1_000_003 * (i + 1))
        base = baseline_samples(model, prompt, 2 * samples, 1 + length, params, eos_ids, g)[:, 1:]
        ours = speculative_samples(engine, prompt, samples, 1 + length, params, eos_ids, spec, seed + 7919 * (i + 1))[:, 1:]
        result = compare(ours, base[:samples], base[samples:], categories)
        pvalues += result.pvalues
        tv += result.tv
        tv_null += result.tv_null
    return {
        "chi2_pvalue": distcheck.cauchy_combination(pvalues) if pvalues else None,  # None: nothing to test
        "tv": float(np.mean(tv)),
        "tv_null": float(np.mean(tv_null)),
        "distcheck_samples": samples,
        "distcheck_length": length,
        "distcheck_prompts": len(inputs),
        "distcheck_pvalues": pvalues,
        "distcheck_combine": "cauchy",
    }
