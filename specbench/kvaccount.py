"""KV-slot accounting under vLLM's and SGLang's policies, replayed from a run's rounds.

One slot holds one token's keys and values in every layer. Per request, with prompt length T,
and round r drafting d_r tokens and accepting a_r of them (the cache holds T + sum (a + 1)
tokens after the rounds so far, call it L_r before round r):

vLLM (v1 scheduler): a round schedules 1 + d_r new tokens and reserves `lookahead` more slots
    for the draft's own KV (k for draft models and EAGLE heads, 0 for n-gram drafters), so it
    needs L_r + 1 + d_r + lookahead slots. Rejected slots are not returned: the next round
    overwrites them. Reserved = the maximum over rounds.
SGLang: before each round the allocated length is raised to at least L_r + 2 x max(steps x
    topk, num_draft_tokens) (the factor 2 double-buffers the overlap scheduler); what lies past
    the committed length is returned when the request ends. Reserved = the peak allocation.

Used = what a cache without speculation holds for the same text: T + n - 1 for n generated
tokens (the last one is never fed), which is T + sum (a_r + 1) unless the last round's tokens
were cut at EOS or max_new_tokens. Pages are taken as one slot (page_size 1); real allocators
round up.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Optional


@dataclass(frozen=True)
class Policy:
    k: int  # draft depth (steps)
    topk: int = 1
    num_draft_tokens: Optional[int] = None  # None: k * topk + 1
    lookahead: int = 0  # vLLM's num_lookahead_tokens: k when the draft keeps KV of its own

    @property
    def sglang_per_round(self) -> int:
        return 2 * max(self.k * self.topk, self.num_draft_tokens or self.k * self.topk + 1)


def request_slots(prompt_tokens: int, generated: int, drafted: list, accepted: list, policy: Policy) -> dict:
    """One request of `generated` tokens -> {"used", "vllm", "sglang"} slot counts (peaks for
    the reservations)."""
    length = prompt_tokens  # the prefill's slots
    vllm = sglang = length
    for d, a in zip(drafted, accepted):
        vllm = max(vllm, length + 1 + d + policy.lookahead)
        sglang = max(sglang, length + policy.sglang_per_round)
        length += a + 1
    return {"used": prompt_tokens + generated - 1, "vllm": vllm, "sglang": sglang}


def summarize_slots(records: list, policy: Optional[Policy]) -> dict:
    """Results columns, means over requests. None for the baseline (no speculation)."""
    if policy is None or not records:
        return {"kv_slots_used": None, "kv_slots_reserved_vllm": None, "kv_slots_reserved_sglang": None}
    per = [request_slots(r.prompt_tokens, len(r.tokens), r.drafted, r.accepted, policy) for r in records]
    return {
        "kv_slots_used": mean(p["used"] for p in per),
        "kv_slots_reserved_vllm": mean(p["vllm"] for p in per),
        "kv_slots_reserved_sglang": mean(p["sglang"] for p in per),
    }
