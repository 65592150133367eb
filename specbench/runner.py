"""The decoding loop, one request at a time: plain autoregressive or speculative.

Each round drafts a chain of up to k tokens or a tree (k levels), verifies it and the bonus
position in one target forward (a tree under its ancestor mask), accepts by the rule, and keeps
the accepted path in the target's KV cache: a chain is cropped, a tree's path is compacted to
contiguous positions. Baseline and
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
from specbench.rules import NEEDS_DRAFT_PROBS, verify_chain, verify_tree
from specbench.sampling import SamplingParams, probs_from_logits, sample
from specbench.tree import attention_mask, compile_tree, with_root


@dataclass(frozen=True)
class Speculation:
    drafter: Drafter
    rule: str
    k: int  # draft depth: chain length, tree steps
    rule_params: dict = field(default_factory=dict)  # threshold_single / threshold_acc
    topk: int = 1  # tree shape (specbench.tree); topk = 1 and no num_draft_tokens is a chain
    num_draft_tokens: Optional[int] = None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _next_token(probs: torch.Tensor, params: SamplingParams, generator) -> torch.Tensor:
    """probs: [1, V] -> [1]"""
    return probs.argmax(-1) if params.greedy else sample(probs, generator)


@dataclass
class Round:
    emitted: list  # tokens this round emits, before the length and EOS cut
    num_drafted: int
    num_accepted: int
    tried: int  # depths at which a draft was tested
    path: torch.Tensor  # [num_accepted + 1] verify rows kept: the input token and the accepted drafts


def _verify_chain(spec, rule, probs, step, proposal, num_drafted, generator) -> Round:
    """probs: [1, m+1, V]; step: [1, m+1] the input token then the drafts."""
    draft_probs = proposal.probs[:, :num_drafted] if proposal.probs is not None else None
    if draft_probs is None and rule in NEEDS_DRAFT_PROBS:
        # A deterministic drafter's q is exactly the point mass on its token.
        draft_probs = F.one_hot(step[:, 1:], probs.shape[-1]).to(probs.dtype)
    result = verify_chain(
        rule, probs, step[:, 1:], draft_probs, generator=generator,
        **(spec.rule_params if rule == "thresholded" else {}),
    )
    a = int(result.num_accepted[0])
    return Round(result.tokens[0, : a + 1].tolist(), num_drafted, a, min(a + 1, num_drafted), torch.arange(a + 1))


def _verify_tree(spec, rule, probs, step, tree, generator) -> Round:
    """probs: [1, N, V] under the tree mask; step: [1, N] the root then the draft nodes."""
    result = verify_tree(
        rule, probs[0], step[0], tree, generator=generator,
        **(spec.rule_params if rule == "thresholded" else {}),
    )
    return Round(result.tokens, step.shape[1] - 1, result.num_accepted, result.tried, torch.tensor(result.path))


def _forced(drafter, probs, step, num_drafted, params, generator) -> Round:
    """The synthetic control: the drafter dictates the accepted prefix; the target's p at the
    stopping position gives the last token (its text is not the target's)."""
    a = drafter.forced_acceptance(num_drafted)
    last = int(_next_token(probs[:, a], params, generator))
    return Round(step[0, 1 : a + 1].tolist() + [last], num_drafted, a, min(a + 1, num_drafted), torch.arange(a + 1))


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
    request_id: int = 0,
) -> RequestRecord:
    """prompt: [T] int64 -> the request's generated tokens and timings."""
    device = engine.device
    k = spec.k if spec else 0
    # A greedy target is a point mass, so every rule reduces to the argmax test there.
    rule = None if spec is None else ("greedy" if params.greedy else spec.rule)
    layers = tuple(getattr(spec.drafter, "feature_layers", ())) if spec else ()
    T = prompt.shape[0]
    room = T + max_new_tokens + max(k, (spec.num_draft_tokens or 0) if spec else 0) + 1
    history = torch.empty(room, dtype=torch.long)  # prompt + generated
    history[:T] = prompt

    _synchronize(device)
    t0 = time.perf_counter()
    logits = engine.prefill(prompt.unsqueeze(0).to(device), feature_layers=layers)  # [1, V]
    features = None
    if layers:  # features[t]: the target's state after reading token t, [room, D]
        logits, prompt_features = logits
        features = prompt_features.new_empty(room, prompt_features.shape[-1])
        features[:T] = prompt_features[0]
    first = int(_next_token(probs_from_logits(logits, params), params, generator))
    _synchronize(device)
    t1 = time.perf_counter()

    history[T] = first
    n = T + 1  # tokens in history; the cache holds n - 1 of them
    generated = [first]
    drafted, accepted = [], []
    while len(generated) < max_new_tokens and generated[-1] not in eos_ids:
        proposal, num_drafted = None, 0
        if spec is not None:
            proposal = spec.drafter.propose(DraftState(
                tokens=[history[:n]], k=k, topk=spec.topk, num_draft_tokens=spec.num_draft_tokens,
                features=[features[: n - 1]] if layers else None, request_ids=(request_id,),
            ))
            num_drafted = int(proposal.num_tokens[0])
        drafts = proposal.tokens[0, :num_drafted].cpu() if num_drafted else history[:0]  # [m]
        step = torch.cat([history[n - 1 : n], drafts]).unsqueeze(0).to(device)  # [1, m+1]
        cached = engine.length
        tree = None
        if num_drafted and not proposal.is_chain:
            tree = compile_tree(with_root(proposal.parents[0, :num_drafted]))
            mask = attention_mask(cached, tree.mask, engine.dtype, device)
            out = engine.forward(step, tree_mask=mask, depth=tree.depth, feature_layers=layers)
        else:
            out = engine.forward(step, feature_layers=layers)
        logits, step_features = out if layers else (out, None)
        probs = probs_from_logits(logits, params)  # [1, m+1, V]
        if tree is not None:
            r = _verify_tree(spec, rule, probs, step, tree, generator)
            engine.keep_path(cached, r.path)
        elif num_drafted and hasattr(spec.drafter, "forced_acceptance"):
            r = _forced(spec.drafter, probs, step, num_drafted, params, generator)
            engine.rollback(cached + 1 + r.num_accepted)
        elif num_drafted:
            r = _verify_chain(spec, rule, probs, step, proposal, num_drafted, generator)
            engine.rollback(cached + 1 + r.num_accepted)  # keep the input token and the accepted drafts
        else:
            r = Round([int(_next_token(probs[:, 0], params, generator))], 0, 0, 0, torch.arange(1))
        if layers:
            features[n - 1 : n + r.num_accepted] = step_features[0, r.path.to(device)]
        if stats is not None:
            stats.observe(r.num_drafted, r.num_accepted, r.tried)
        drafted.append(r.num_drafted)
        accepted.append(r.num_accepted)

        emitted = r.emitted[: max_new_tokens - len(generated)]
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
