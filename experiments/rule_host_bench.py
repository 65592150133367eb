"""Issue 6 d: what a sampled round's rule costs the host, piece by piece.

    python experiments/rule_host_bench.py OUT [--batches 1,8,48] [--k 4] [--vocab 49152] [--reps 200] [--tiny]

At T = 0.7 a chain round's `other_ms` was 0.32 ms above a greedy round's at batch 1, 8 and 48,
with the GPU busy for 0.016 ms of a round's "other" phase (H100, results/2026-12-06-h100-fullwarmup).
This times the pieces of the runner's rule step (specbench.runner._verify_chain) side by side in
one process. The device is synchronised after every call, so each time is what the host waits
for, dispatch and launch included:

    sync        torch.cuda.synchronize() alone (what every piece below includes once)
    copy        the tokens and counts to the host in one copy (torch.cat + tolist), as the runner
    noise       kernels.chain.draw_noise: the coins [B, k] and the noise [B, V]
    launch      kernels.chain.launch on drawn noise: the chain kernel, one launch (a second, the
                split merge, when a request's vocabulary was split over several programs, until
                the merge moved into the kernel: 0.15 to 0.17 ms for the two against 0.12 to
                0.15 for one, on one H100 host, results/2026-12-07-h100-merged-split)
    rule        rules.verify_chain(onehot, impl=triton) then the copy: the runner's whole rule step
                for a deterministic drafter (ngram, layerskip, draft_model greedy, eagle3)
    rule_torch  the same with impl=torch
    tree        rules.verify_trees(target_only, impl=triton): a 9-node tree a request (the root's 4
                children, a chain of 4 under the first: kernel_bench's), tokens and paths back on the host
    tree_launch kernels.tree.launch on inputs made beforehand (links, coins, noise): the tree kernel
                alone (with its split merge, as `launch`). tree less this, noise and a copy is the host's packing
                of the trees and their results (0.92 ms against 0.31 at batch 48 and 1 on an H100,
                results/2026-12-06-h100-native-trie; 0.45 against 0.59 on another H100 the next
                day, the launch 0.09 to 0.11 throughout: results/2026-12-07-h100-b48)
    tree_torch  the same with impl=torch (numpy walks: what ngram_trie's sampled rounds ran before
                they were walked as target_only)
    token       specbench.sampled.Sampler.tokens: the baseline's sampled step from the target's
                logits (bf16 [B, 1, V], T = 0.7): p, the draw, the tokens on the host; eagerly
    token_graph the same replayed from a CUDA graph (what the runner runs on CUDA)
    sampled     Sampler.chain (onehot, triton) from the logits [B, k + 1, V]: p, coins, noise, the
                kernel, the copy back, eagerly: the runner's sampled chain step
    sampled_graph  the same replayed from a CUDA graph
    sampled_tree, sampled_tree_graph  Sampler.trees (target_only) on `tree`'s trees, padded to
                N nodes, eagerly and from a graph

Per piece: the median wall time a call over `reps` calls, with its quartiles, the pieces taking
turns (a call of each a rep), and the aten operations one call dispatches
(specbench.graphs.HostOps). Inputs: kernel_bench's (chain_inputs, tree_inputs: p = softmax(3 z),
a draft the argmax of p with probability 0.7, else a draw). Writes OUT/rule_host_bench.json
(provenance: device, versions, git SHA, date) and prints a table.

--tiny: B in {1, 2}, V = 96, 3 reps, on the CPU under TRITON_INTERPRET=1 (set here before the
kernels are imported) to check the script, not to time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the interpreter: chosen when triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_bench import SGLANG_TREE, chain_inputs, tree_inputs  # noqa: E402  (experiments/ is on sys.path)
from specbench import provenance  # noqa: E402
from specbench.graphs import HostOps  # noqa: E402
from specbench.kernels import chain  # noqa: E402
from specbench.kernels import tree as ktree  # noqa: E402
from specbench.rules import verify_chain, verify_trees  # noqa: E402
from specbench.sampled import Sampler  # noqa: E402
from specbench.sampling import SamplingParams  # noqa: E402
from specbench.tree import compile_tree  # noqa: E402

PARAMS = SamplingParams(temperature=0.7)  # the runner's T = 0.7 rows
PIECES = ("sync", "copy", "noise", "launch", "rule", "rule_torch", "tree", "tree_launch", "tree_torch",
          "token", "token_graph", "sampled", "sampled_graph", "sampled_tree", "sampled_tree_graph")


def per_call_ms(calls: dict, sync, reps: int) -> dict:
    """name -> (median, 25th, 75th percentile) wall ms of calls[name]() followed by a device
    synchronisation, after 3 untimed calls each. The pieces take turns, one call each a rep, so
    that a drift of the shared host (its clock, other tenants) weighs on every piece alike: timed
    piece after piece, the tree step read 0.31 / 0.54 / 0.92 ms at batch 1 / 8 / 48 on one H100
    and 0.59 / 0.51 / 0.45 on another (results/2026-12-07-h100-b48)."""
    for fn in calls.values():
        for _ in range(3):
            fn()
            sync()
    times = {name: [] for name in calls}
    for _ in range(reps):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    spread = {}
    for name, t in times.items():
        q1, median, q3 = statistics.quantiles(t, n=4, method="inclusive")
        spread[name] = (1e3 * median, 1e3 * q1, 1e3 * q3)
    return spread


def host_ops(fn) -> int:
    with HostOps() as count:
        fn()
    return count.n


def pieces(B: int, k: int, V: int, device: torch.device) -> dict:
    """The calls to time at batch B: name -> a function of no arguments."""
    g = torch.Generator(device).manual_seed(B)
    p, drafts, _, uniforms, noise = chain_inputs(B, k, V, device, seed=B)  # [B, k+1, V], [B, k], ...
    tokens, num = chain.launch("onehot", p, drafts, None, uniforms, noise)

    def copy(tokens, num):
        return torch.cat([tokens, num[:, None]], 1).tolist()  # [B, k + 2] on the host

    def rule(impl):
        result = verify_chain("onehot", p, drafts, None, generator=g, impl=impl)
        return copy(result.tokens, result.num_accepted)

    tree = compile_tree(torch.tensor(SGLANG_TREE))
    p_tree, node_tokens, first_child, next_sibling, coins, tree_noise = tree_inputs(B, V, device, seed=B)  # [B, N, V], [B, N] ...

    def trees(impl):
        return verify_trees("target_only", p_tree, node_tokens, [tree] * B, generator=g, impl=impl)

    # specbench.sampled, the runner's sampled step from the target's logits (bf16, as the engine's),
    # eager and replayed from a CUDA graph (eager off CUDA)
    logits = torch.randn(B, k + 1, V, generator=g, device=device).to(torch.bfloat16)  # [B, k+1, V]
    tree_logits = torch.randn(B, p_tree.shape[1], V, generator=g, device=device).to(torch.bfloat16)  # [B, N, V]
    host_tokens = node_tokens.cpu().numpy()  # [B, N]: the runner's verify inputs are on the host
    samplers = {graphs: Sampler(PARAMS, torch.Generator(device).manual_seed(B), graphs=graphs and device.type == "cuda")
                for graphs in (False, True)}

    def sampled(graphs: bool, kind: str):
        sampler = samplers[graphs]
        if kind == "token":
            return sampler.tokens(logits[:, :1]).result()
        if kind == "chain":
            return sampler.chain("onehot", "triton", logits, drafts).result()
        return sampler.trees("target_only", tree_logits, host_tokens, [tree.host] * B).result()

    return {
        "sync": lambda: None,
        "copy": lambda: copy(tokens, num),
        "noise": lambda: chain.draw_noise(B, k, V, g, device),
        "launch": lambda: chain.launch("onehot", p, drafts, None, uniforms, noise),
        "rule": lambda: rule("triton"),
        "rule_torch": lambda: rule("torch"),
        "tree": lambda: trees("triton"),
        "tree_launch": lambda: ktree.launch("target_only", p_tree, node_tokens, first_child, next_sibling, coins, tree_noise),
        "tree_torch": lambda: trees("torch"),
        "token": lambda: sampled(False, "token"),
        "token_graph": lambda: sampled(True, "token"),
        "sampled": lambda: sampled(False, "chain"),
        "sampled_graph": lambda: sampled(True, "chain"),
        "sampled_tree": lambda: sampled(False, "tree"),
        "sampled_tree_graph": lambda: sampled(True, "tree"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--batches", default="1,8,48")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=49152, help="the default model's vocabulary")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = (1, 2) if args.tiny else tuple(int(b) for b in args.batches.split(","))
    V, reps = (96, 3) if args.tiny else (args.vocab, args.reps)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    results = dict(device=provenance.device_name(device), torch=torch.__version__,
                   triton=importlib.metadata.version("triton"), git_sha=provenance.git_sha(),
                   date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interpreted=chain.INTERPRETED, k=args.k, V=V,
                   reps=reps, rows=[])
    args.out.mkdir(parents=True, exist_ok=True)
    for B in batches:
        calls = pieces(B, args.k, V, device)
        row = {"B": B}
        for name, (median, low, high) in per_call_ms(calls, sync, reps).items():
            row.update({f"{name}_ms": median, f"{name}_p25_ms": low, f"{name}_p75_ms": high,
                        f"{name}_ops": host_ops(calls[name])})
        results["rows"].append(row)
        print(row, flush=True)
        (args.out / "rule_host_bench.json").write_text(json.dumps(results, indent=1) + "\n")
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(f"\n{r['device']}  torch {r['torch']}  triton {r['triton']}  {r['date']}  sha {r['git_sha']}"
          f"  k {r['k']}  V {r['V']}  (ms a call, synchronised; aten ops a call)")
    print(f"{'B':>3s} " + " ".join(f"{name:>13s}" for name in PIECES))
    for row in r["rows"]:
        print(f"{row['B']:3d} " + " ".join(f"{row[f'{n}_ms']:7.3f} ({row[f'{n}_ops']:3d})" for n in PIECES))


if __name__ == "__main__":
    raise SystemExit(main())
