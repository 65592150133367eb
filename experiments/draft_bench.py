"""Drafting cost per round of the batched model drafters, from CUDA graphs and eager (issue 6, d).

On the default model's shape (SmolLM2-135M, random bf16 weights: no carry) each batched drafter
proposes round after round for B requests whose histories grow by a random accepted count + 1
each round, as in the runner: EAGLE-3 and EAGLE heads (drafters/eagle_chain.py) and a 2-layer
draft model of the target's width (drafters/native_chain.py, as the shipped draft model), each
built twice over the same weights, with cuda_graphs on and off, and timed in alternating
blocks of rounds in one process. A round's time is what the runner's draft_ms measures: the
host's and the device's work until the drafts are on the host. One more round of each is
counted, not timed: the aten operations the host dispatches (a graph's replay dispatches none).

    python experiments/draft_bench.py OUT [--drafters eagle3,eagle,draft_model] [--batches 1,8,48]
        [--modes greedy,sampled,tree] [--k 4] [--tiny]

greedy and sampled: chains of k (T = 0.7 for sampled); tree: SGLang's 5-4-8 shape (k = 5, topk 4,
8 nodes). --tiny: a 2-layer toy shape, few rounds (CPU is fine): checks the script, not a
measurement (off CUDA both variants run eagerly). Writes OUT/draft_bench.json (every number,
with provenance) after each measurement and prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import SMOLLM2_135M, build_hf  # noqa: E402

from specbench import provenance  # noqa: E402
from specbench.graphs import HostOps  # noqa: E402
from specbench.drafters.base import DraftState  # noqa: E402
from specbench.drafters.eagle_chain import EagleChain  # noqa: E402
from specbench.drafters.native_chain import NativeChain  # noqa: E402
from specbench.heads import EagleHeadConfig, build_head  # noqa: E402
from specbench.sampling import SamplingParams  # noqa: E402

TINY = dict(SMOLLM2_135M, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2)
EAGLE3_DRAFT_VOCAB = 4096  # the shipped head's (specbench/checkpoints/smollm2_135m/eagle3)
TREE = (5, 4, 8)  # SGLang's 5-4-8: k, topk, num_draft_tokens
GREEDY, SAMPLED = SamplingParams(0.0, 0, 1.0), SamplingParams(0.7, 0, 1.0)
DRAFTERS, MODES = ("eagle3", "eagle", "draft_model"), ("greedy", "sampled", "tree")


def chain_makers(target, names, shape, device, dtype) -> dict:
    """name -> make(rows, max_length, graphs): that drafter's batched chain, with CUDA graphs or
    without, over weights made here once (random; both variants draft with the same ones)."""
    from specbench.engines.native import Transformer

    torch.manual_seed(0)
    makers = {}
    for kind in ("eagle", "eagle3"):
        if kind in names:
            vocab = min(EAGLE3_DRAFT_VOCAB, shape["vocab_size"] // 2) if kind == "eagle3" else None
            config = EagleHeadConfig.from_target(target.config, kind, draft_vocab_size=vocab)
            head = build_head(config, target).to(device, dtype).eval().requires_grad_(False)
            makers[kind] = lambda rows, length, graphs, head=head: EagleChain(head, rows, length, cuda_graphs=graphs)
    if "draft_model" in names:
        small = build_hf(dict(shape, num_hidden_layers=2), device, dtype)
        small.model.embed_tokens = target.model.embed_tokens  # shares the target's, as the shipped one
        small.lm_head = target.lm_head
        makers["draft_model"] = lambda rows, length, graphs: NativeChain(lambda: Transformer.from_hf(small), rows,
                                                                         length, cuda_graphs=graphs)
    return makers


class Requests:
    """B histories (and, for EAGLE heads, the target's features at each position) that grow by
    accepted + 1 tokens a round, accepted uniform in 0..k (seeded)."""

    def __init__(self, B: int, ctx: int, vocab: int, feature_width: int, device, dtype, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab, self.device, self.dtype = vocab, device, dtype
        self.tokens = [torch.randint(vocab, (ctx,), generator=self.g) for _ in range(B)]
        self.features = [self._features(ctx - 1, feature_width) for _ in range(B)] if feature_width else None

    def _features(self, n: int, width: int) -> torch.Tensor:
        return torch.randn(n, width, generator=self.g).to(self.device, self.dtype)

    def state(self, k: int, topk: int = 1, num_draft_tokens=None) -> DraftState:
        return DraftState(tokens=list(self.tokens), k=k, topk=topk, num_draft_tokens=num_draft_tokens,
                          features=self.features, request_ids=tuple(range(len(self.tokens))))

    def grow(self, k: int) -> None:
        for b, t in enumerate(self.tokens):
            n = int(torch.randint(k + 1, (), generator=self.g)) + 1
            self.tokens[b] = torch.cat([t, torch.randint(self.vocab, (n,), generator=self.g)])
            if self.features is not None:
                self.features[b] = torch.cat([self.features[b], self._features(n, self.features[b].shape[1])])


def propose(chain, requests: Requests, mode: str, k: int, generator):
    if mode == "tree":
        steps, topk, nodes = TREE
        return chain.propose_tree(requests.state(steps, topk, nodes))
    if mode == "sampled":
        return chain.propose(requests.state(k), "probabilistic", SAMPLED, generator)
    return chain.propose(requests.state(k), "greedy", GREEDY, None)


def per_round_ms(name, make, vocab, mode, B, k, ctx, rounds, blocks, feature_width, device, dtype) -> dict:
    """Both variants of one drafter (make: chain_makers'), in alternating blocks of rounds over
    their own copies of the same requests -> the median ms a round of each, the operations one
    round dispatches, and whether they drafted alike (the same weights, requests and seeds)."""
    most = k if mode != "tree" else TREE[0]
    max_length = ctx + (blocks * rounds + 2) * (most + 1) + 2 * most * 4 + 8
    timings = {}
    drafts = {}
    variants = {}
    for graphs in (True, False):
        chain = make(B, max_length, graphs)
        assert chain.ready(), f"{name}: its batched chain cannot run here"
        requests = Requests(B, ctx, vocab, feature_width, device, dtype, seed=B)
        generator = torch.Generator(device).manual_seed(0)
        propose(chain, requests, mode, k, generator)  # the first round reads every history (warm-up)
        requests.grow(most)
        variants[graphs] = (chain, requests, generator)
        timings[graphs] = []
        drafts[graphs] = []
    for _ in range(blocks):
        for graphs in (True, False):
            chain, requests, generator = variants[graphs]
            for _ in range(rounds):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                got = propose(chain, requests, mode, k, generator)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                timings[graphs].append(1e3 * (time.perf_counter() - t))
                drafts[graphs].append(got.tokens)
                requests.grow(most)
    same = all(torch.equal(a, b) for a, b in zip(drafts[True], drafts[False]))
    ops = {}
    for graphs in (True, False):  # one more round each, counted, not timed
        chain, requests, generator = variants[graphs]
        with HostOps() as count:
            propose(chain, requests, mode, k, generator)
        ops[graphs] = count.n
    del variants, chain  # their graphs and caches, before the next row's
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    graphs_ms, eager_ms = (statistics.median(timings[g]) for g in (True, False))
    return dict(drafter=name, mode=mode, B=B, k=TREE[0] if mode == "tree" else k, graphs_ms=graphs_ms,
                eager_ms=eager_ms, eager_over_graphs=eager_ms / graphs_ms, rounds=len(timings[True]),
                same_drafts=same, graphs_ops=ops[True], eager_ops=ops[False])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--drafters", default=",".join(DRAFTERS))
    ap.add_argument("--batches", default="1,8,48")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256, help="each request's history at the first round")
    ap.add_argument("--tiny", action="store_true", help="a toy shape, few rounds: checks the script")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else SMOLLM2_135M
    rounds, blocks = (2, 2) if args.tiny else (20, 3)
    ctx = 16 if args.tiny else args.ctx
    names, modes = args.drafters.split(","), args.modes.split(",")
    for flag, values, valid in (("--drafters", names, DRAFTERS), ("--modes", modes, MODES)):
        if set(values) - set(valid):
            ap.error(f"{flag}={','.join(values)}: valid: {', '.join(valid)}")
    import transformers

    results = {"device": provenance.device_name(device), "torch": torch.__version__,
               "transformers": transformers.__version__, "git_sha": provenance.git_sha(),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "shape_name": "tiny" if args.tiny else "smollm2",
               "dtype": str(dtype), "ctx": ctx, "rounds": rounds * blocks, "rows": []}
    target = build_hf(shape, device, dtype).requires_grad_(False)
    makers = chain_makers(target, names, shape, device, dtype)
    for name in names:
        # the target's features an EAGLE head reads: final norm (EAGLE), three layers (EAGLE-3)
        width = {"eagle": 1, "eagle3": 3}.get(name, 0) * shape["hidden_size"]
        for mode in modes:
            for B in (int(b) for b in args.batches.split(",")):
                t = time.perf_counter()
                try:
                    row = per_round_ms(name, makers[name], shape["vocab_size"], mode, B, args.k, ctx, rounds, blocks,
                                       width, device, dtype)
                except Exception as e:  # one failed measurement must not lose the others
                    traceback.print_exc()
                    row = dict(drafter=name, mode=mode, B=B, error=f"{type(e).__name__}: {e}".splitlines()[0])
                results["rows"].append(row)
                print(f"[{time.perf_counter() - t:6.1f} s] {row}", flush=True)
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "draft_bench.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(f"\n{r['device']}, torch {r['torch']}, git {r['git_sha']}, {r['date']}; {r['shape_name']} shape, "
          f"{r['dtype']}, histories from {r['ctx']} tokens, {r['rounds']} rounds a variant")
    print(f"{'drafter':<12} {'mode':<8} {'B':>3} {'k':>2} {'graphs ms':>10} {'eager ms':>9} {'eager/graphs':>13} "
          f"{'ops graphs':>10} {'ops eager':>9} same drafts")
    for row in r["rows"]:
        if "error" in row:
            print(f"{row['drafter']:<12} {row['mode']:<8} {row['B']:>3}  error: {row['error']}")
            continue
        print(f"{row['drafter']:<12} {row['mode']:<8} {row['B']:>3} {row['k']:>2} {row['graphs_ms']:>10.3f} "
              f"{row['eager_ms']:>9.3f} {row['eager_over_graphs']:>13.2f} {row['graphs_ops']:>10} "
              f"{row['eager_ops']:>9} {row['same_drafts']}")


if __name__ == "__main__":
    sys.exit(main())
