"""The decoding loop, one request at a time: plain autoregressive or speculative.

Each round drafts up to k tokens, verifies them and the bonus position in one target forward,
accepts by the rule, and rolls the target's KV cache back to the accepted length. Baseline and
speculation share this loop, its clocks and its token counting (k = 0 is the baseline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from specbench.drafters.base import DraftState, Drafter
from specbench.metrics import RequestRecord, SpecStats
from specbench.rules import NEEDS_DRAFT_PROBS, verify_chain
from specbench.sampling import SamplingParams, probs_from_logits, sample


@dataclass(frozen=True)
class Speculation:
    drafter: Drafter
    rule: str
    k: int
    rule_params: dict = field(default_factory=dict)  # threshold_single / threshold_acc


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _next_token(probs: torch.Tensor, params: SamplingParams, generator) -> torch.Tensor:
    """probs: [1, V] -> [1]"""
    return probs.argmax(-1) if params.greedy else sample(probs, generator)


def decode(
    engine,
    prompt: torch.Tensor,
    *,
    params: SamplingParams,
    max_new_tokens: int,
    eos_ids: frozenset,
    generator: torch.Generator,
    spec: Optional[Speculation] = None,
    stats: Optional[SpecStats] = None,
    prompt_id: str = "",
) -> RequestRecord:
    """prompt: [T] int64 -> the request's generated tokens and timings."""
    device = engine.device
    k = spec.k if spec else 0
    # A greedy target is a point mass, so every rule reduces to the argmax test there.
    rule = None if spec is None else ("greedy" if params.greedy else spec.rule)
    T = prompt.shape[0]
    history = torch.empty(T + max_new_tokens + k + 1, dtype=torch.long)  # prompt + generated
    history[:T] = prompt

    _synchronize(device)
    t0 = time.perf_counter()
    logits = engine.prefill(prompt.unsqueeze(0).to(device))  # [1, V]
    first = int(_next_token(probs_from_logits(logits, params), params, generator))
    _synchronize(device)
    t1 = time.perf_counter()

    history[T] = first
    n = T + 1  # tokens in history; the cache holds n - 1 of them
    generated = [first]
    drafted, accepted = [], []
    while len(generated) < max_new_tokens and generated[-1] not in eos_ids:
        num_drafted = 0
        if spec is not None:
            proposal = spec.drafter.propose(DraftState(tokens=[history[:n]], k=k))
            num_drafted = int(proposal.num_tokens[0])
        drafts = proposal.tokens[0, :num_drafted] if num_drafted else history[:0]  # [m]
        step = torch.cat([history[n - 1 : n], drafts]).unsqueeze(0).to(device)  # [1, m+1]
        cached = engine.length
        probs = probs_from_logits(engine.forward(step), params)  # [1, m+1, V]
        if num_drafted:
            draft_probs = proposal.probs[:, :num_drafted] if proposal.probs is not None else None
            if draft_probs is None and rule in NEEDS_DRAFT_PROBS:
                # A deterministic drafter's q is exactly the point mass on its token.
                draft_probs = F.one_hot(step[:, 1:], probs.shape[-1]).to(probs.dtype)
            result = verify_chain(
                rule, probs, step[:, 1:], draft_probs, generator=generator,
                **(spec.rule_params if rule == "thresholded" else {}),
            )
            num_accepted = int(result.num_accepted[0])
            emitted = result.tokens[0, : num_accepted + 1].tolist()
        else:
            num_accepted = 0
            emitted = [int(_next_token(probs[:, 0], params, generator))]
        engine.rollback(cached + 1 + num_accepted)  # keep the input token and the accepted drafts
        if stats is not None:
            stats.observe(num_drafted, num_accepted)
        drafted.append(num_drafted)
        accepted.append(num_accepted)

        emitted = emitted[: max_new_tokens - len(generated)]
        for i, token in enumerate(emitted):
            if token in eos_ids:
                emitted = emitted[: i + 1]
                break
        history[n : n + len(emitted)] = torch.tensor(emitted)
        n += len(emitted)
        generated += emitted
    _synchronize(device)
    t2 = time.perf_counter()
    return RequestRecord(
        prompt_id=prompt_id, prompt_tokens=T, tokens=generated, ttft_s=t1 - t0, decode_s=t2 - t1,
        drafted=drafted, accepted=accepted,
    )
