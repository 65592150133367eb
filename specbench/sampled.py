"""A sampled round's target side in one call, for every engine row: p from the target's logits
(temperature, top-k, top-p: specbench.sampling), the rule's draws from the run's generator, the
rule, and its results packed for one copy to the host.

Eagerly that is about twenty host operations a round (the softmax's, the coins and the noise,
the kernel's launch and its outputs), each a dispatch of several microseconds on a GPU host,
around a few microseconds of GPU work at the default model's size: a sampled chain round's
rule and bookkeeping took 0.29 ms more than a greedy one's on an H100
(results/2026-12-07-h100-realweights).

On CUDA with the engine's graphs on, a call replays a CUDA graph instead (specbench.graphs.
Graphed: one per kind and input shapes), with the run's generator registered with it, so that a
replay draws the numbers the eager call would. Graphed are the baseline's draw and the rules
that run as Triton kernels (rule.impl=triton: one launch, no host synchronisation), but for a
chain checked against the draft's q (Sampler.chain); the torch rules run eagerly through the
same function. On an H100 (experiments/rule_host_bench.py,
results/2026-12-07-h100-sampled-graphs) a chain step from the logits took 0.16 to 0.18 ms
graphed against 0.53 to 0.55 eagerly at batch 1 and 8 (0.25 against 0.35 at 48), a tree step
0.27 to 0.31 against 0.69 to 0.70 (no gain at 48).

A call returns a Pending: the runner launches it right behind the target's forward, before it
waits for the forward, so that the host work of the call overlaps the forward's device time,
and reads the results after.

Every engine row is computed, idle ones too (their results are dropped): the shapes are then
the engine's, one graph a run, captured in the warm-up, not one for every number of live
requests that a draining batch meets inside a timed decode. Sampled outputs depend on the batch
size as they did, and at a given batch size, whether or not graphs replay them.

Letters: B engine rows, q verify positions, k chain drafts, V vocabulary.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from specbench.graphs import Graphed
from specbench.rules import pack_trees, tree_kernel_results, tree_kernel_step, verify_chain
from specbench.sampling import SamplingParams, probs_from_logits, sample

NO_THRESHOLDS = (1.0, 1.0)


class Sampler:
    """The runner's draws at temperature > 0 for one engine: `generator` is the run's (re-seeded
    for every decode; a graph is bound to this object), `graphs` whether calls replay CUDA graphs."""

    def __init__(self, params: SamplingParams, generator: torch.Generator, graphs: bool = False):
        self.params, self.generator = params, generator
        self._graphed = Graphed(self._run, enabled=graphs, generators=(generator,))

    def _run(self, key: tuple, logits: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        """key: (kind, rule, impl, thresholds, D, Z); logits [B, q, V] -> (one int64 tensor [B, ...],)"""
        kind, rule, impl, (threshold_single, threshold_acc), D, Z = key
        probs = probs_from_logits(logits, self.params)  # [B, q, V] fp32
        if kind == "token":
            return (sample(probs[:, 0], self.generator),)  # [B]
        thresholds = dict(threshold_single=threshold_single, threshold_acc=threshold_acc)
        if kind == "chain":
            drafts, *draft_probs = inputs  # [B, k]; [B, k, V] for standard
            result = verify_chain(rule, probs, drafts, draft_probs[0] if draft_probs else None,
                                  generator=self.generator, impl=impl, **thresholds)
            return (torch.cat([result.tokens, result.num_accepted[:, None]], 1),)  # [B, k + 2]
        (walks,) = inputs  # [3, B, q]
        return (tree_kernel_step(rule, probs, walks, D, Z, self.generator, **thresholds),)  # [B, 2 (D + 1) + 2]

    def _launch(self, key: tuple, parse: Callable[[list], list], *inputs: torch.Tensor, graphed: bool) -> Pending:
        """The key's call, launched (graphed: replayed, where the Sampler has graphs), not waited for."""
        return Pending((self._graphed if graphed else self._run)(key, *inputs)[0], parse)

    def tokens(self, logits: torch.Tensor) -> Pending:
        """logits [B, q, V] -> [B] a token drawn from p at each row's first position."""
        return self._launch(("token", None, None, NO_THRESHOLDS, 0, 0), list, logits, graphed=True)

    def chain(self, rule: str, impl: str, logits: torch.Tensor, drafts: torch.Tensor,
              draft_probs: Optional[torch.Tensor] = None, thresholds: tuple = NO_THRESHOLDS) -> Pending:
        """specbench.rules.verify_chain for every row: logits [B, k + 1, V], drafts [B, k] (-1
        past each row's drafts; an idle row's all -1), draft_probs [B, k, V] (standard) ->
        [B] (emitted tokens, num accepted): a row's tokens[: a + 1]. Graphed with impl=triton
        and no q: a graph would keep a static copy of q, as large as q itself (B k V floats), and
        double what keeping draft probabilities costs in memory, a measurement of its own
        (vLLM's draft_sample_method, issue 6 d); with q the call runs eagerly."""
        inputs = (drafts,) if draft_probs is None else (drafts, draft_probs)
        return self._launch(("chain", rule, impl, tuple(thresholds), 0, 0),
                            lambda rows: [(row[: row[-1] + 1], row[-1]) for row in rows], logits, *inputs,
                            graphed=impl == "triton" and draft_probs is None)

    def trees(self, rule: str, logits: torch.Tensor, node_tokens: np.ndarray, hosts: list,
              thresholds: tuple = NO_THRESHOLDS) -> Pending:
        """The tree kernel's walk (rule.impl=triton) for every row: logits [B, q, V], node_tokens
        [B, q] (numpy; column 0 each row's root), hosts [B] each row's specbench.tree.TreeHost
        (None: an idle row) -> [B] TreeResult. Padded to q nodes, q - 1 levels and q - 1
        children, whatever this round's trees: one kernel variant and one graph a run."""
        B, q = node_tokens.shape
        walks = torch.from_numpy(pack_trees(hosts, node_tokens, q)).to(logits.device)  # [3, B, q], one copy
        D = Z = max(1, q - 1)
        return self._launch(("tree", rule, "triton", tuple(thresholds), D, Z),
                            lambda rows: tree_kernel_results(rows, D), logits, walks, graphed=True)


class Pending(NamedTuple):
    """A Sampler call launched on the device and not waited for: the runner launches it behind
    the target's forward, so that its host work overlaps the forward's device time, and reads
    it after. out: a graph's static output when replayed (read it before the next call)."""

    out: torch.Tensor  # [B, ...] int64
    parse: Callable[[list], list]  # out on the host, a list per row -> the call's results, a row each

    def result(self) -> list:
        """The results, a row each (the copy to the host waits for the call)."""
        return self.parse(self.out.tolist())
