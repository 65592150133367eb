"""From target (or draft) logits to the distribution p that the rules and the baseline sample from.

temperature, top_k and top_p shape p the same way for the baseline, the target in verification
and a drafter that has a distribution of its own. Temperature 0 is greedy: p is the point mass
on the argmax, which makes every acceptance rule reduce to "accept iff draft == argmax".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [..., V] -> probabilities [..., V] in float32."""
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass
        # strictly before it already does. The most likely token is always kept.
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop[..., 0].fill_(False)  # a scalar fill: no tensor from Python data (capturable)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """probs: [B, V] (need not be normalised) -> [B] int64 tokens.

    torch.multinomial's own draw for one sample, the same tokens from the same generator: an
    Exp(1) variable E_v per entry, then argmax_v p_v / E_v, which is v with probability p_v / sum p.
    multinomial first checks its input (no negative, inf or nan entries, no zero row), which on
    CUDA is two host syncs and about eight more kernels in every round. Here a row of zeros draws
    token 0 and a nan row an arbitrary token, unchecked."""
    return probs.div(torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)
