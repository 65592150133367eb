"""ngram_trie's host cost per round, several drafters side by side (issue 6, d).

ngram_trie drafts on the host: each round inserts every request's new tokens into the shared
trie, then matches and expands. A round at batch 48 cost 3.5 to 3.9 ms of drafting on an
H100 host (results/2026-12-05-h100-night). Here several variants run side by side in one
process, in alternating blocks of rounds over the same histories:
  native the compiled trie (drafter.impl=native, ngram_trie.cpp), the same method as known,
         one call a round for the inserts and one for the trees
  known  the Python trie as it is (drafter.impl=python): each request's growing paths kept from
         its previous insert (max_trie_depth lookups per new token; NgramTrie.insert), each
         window's node taken from the paths the insert just extended (window_nodes: no walk)
  find   the same insert, every window found from the root (the code at 87daf79)
  walk   every path inserted from the root (about max_trie_depth^2 / 2 node visits per new
         token), every window found from the root (the code before 87daf79)
  @REV   (--against REV) the drafter module as it was at git revision REV, loaded from git
         (its Python trie)
All of them propose the same trees (tests/test_ngram_trie.py; here `same_trees` compares
every round's proposals).

The histories are synthetic, with no model: requests of 60 to 400 tokens from a Zipf-distributed
vocabulary of 49152, 70 % of them phrases drawn from a shared bank (repeats, as real text has),
growing by 1 to 4 tokens a round (an accepted prefix and a bonus token). Each round drafts
k = 4 with a budget of --num-draft-tokens nodes (the root included; default k + 1, the runner
suite's chains). Host code only, so a CPU measures it; ratios are the result, not the absolute
times of another host.

    python experiments/trie_bench.py OUT [--batches 1,8,48] [--rounds 40] [--blocks 5]
        [--variants known,native,find,walk] [--against REV] [--num-draft-tokens N]

Writes OUT/trie_bench.json (every block, with provenance) and prints the table: median ms a
round of each variant and `known`'s time over it (its speedup over the Python trie).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from specbench import provenance
from specbench.drafters.base import DraftState
from specbench.drafters.ngram_trie import NgramTrie, NgramTrieDrafter
from specbench.run import timed_region

VOCAB = 49152


class Texts:
    """Token streams with repeats: phrases from a shared bank (70 %) or fresh Zipf tokens."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.bank = [self.zipf(int(self.rng.integers(3, 12))) for _ in range(400)]

    def zipf(self, n: int) -> list:
        return (self.rng.zipf(1.2, n) % VOCAB).tolist()

    def tokens(self, n: int) -> list:
        out = []
        while len(out) < n:
            out += self.bank[int(self.rng.integers(len(self.bank)))] if self.rng.random() < 0.7 else self.zipf(3)
        return out[:n]


def python() -> NgramTrieDrafter:
    return NgramTrieDrafter(impl="python")


def finding(drafter: NgramTrieDrafter) -> NgramTrieDrafter:
    """The drafter finding every window from the root."""
    drafter.window_nodes = lambda request_id: None
    return drafter


def walking(drafter: NgramTrieDrafter) -> NgramTrieDrafter:
    """The drafter with its known paths dropped: every insert walks every path, and every
    window is found from the root."""
    walk = NgramTrie.insert
    drafter.trie.insert = lambda tokens, first_new, known=None: walk(drafter.trie, tokens, first_new)
    return finding(drafter)


def at_revision(rev: str) -> types.ModuleType:
    """specbench.drafters.ngram_trie as it was at git revision `rev` (run against today's
    specbench otherwise)."""
    path = "specbench/drafters/ngram_trie.py"
    source = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout
    module = types.ModuleType(f"ngram_trie_at_{rev}")
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


VARIANTS = {"known": python, "native": lambda: NgramTrieDrafter(impl="native"),
            "find": lambda: finding(python()), "walk": lambda: walking(python())}


def bench(batch: int, rounds: int, blocks: int, variants: dict, num_draft_tokens=None, seed: int = 0) -> dict:
    """ms a round of propose() for each variant {name: drafter}, blocks of `rounds` rounds alternating."""
    texts = Texts(seed)
    histories = [texts.tokens(int(texts.rng.integers(60, 400))) for _ in range(batch)]

    def state(hist):
        return DraftState(tokens=[torch.tensor(h) for h in hist], k=4, num_draft_tokens=num_draft_tokens,
                          request_ids=tuple(range(batch)), host=[np.array(h, dtype=np.int64) for h in hist])

    times = {name: [] for name in variants}
    trees = {name: [] for name in variants}  # every round's proposal, as bytes
    for drafter in variants.values():  # the prompts inserted untimed: a round's cost is its new tokens'
        drafter.propose(state(histories))
    with timed_region():  # as the runner's decodes: a collection in a round scans only what the rounds made
        for block in range(blocks):
            growth = [[texts.tokens(int(texts.rng.integers(1, 5))) for _ in range(batch)] for _ in range(rounds)]
            start = [list(h) for h in histories]
            names = list(variants)
            for name in names[block % len(names):] + names[: block % len(names)]:  # the same rounds for each, first in turn
                drafter, hist, elapsed = variants[name], [list(h) for h in start], 0.0
                for grow in growth:
                    round_state = state(hist)
                    t = time.perf_counter()
                    proposal = drafter.propose(round_state)
                    elapsed += time.perf_counter() - t
                    trees[name].append(b"".join(x.numpy().tobytes() for x in (proposal.tokens, proposal.parents,
                                                                              proposal.num_tokens)))
                    for h, g in zip(hist, grow):
                        h += g
                times[name].append(elapsed / rounds * 1e3)
            histories = hist
    first = next(iter(trees.values()))
    return {"batch": batch, "rounds": rounds, "blocks": blocks, "num_draft_tokens": num_draft_tokens, "ms": times,
            "same_trees": all(t == first for t in trees.values()),
            "trie_nodes": len(next(iter(variants.values())).trie)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--batches", default="1,8,48")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--variants", default="known,native,find,walk", help=f"some of {','.join(VARIANTS)}; known is always run")
    ap.add_argument("--against", metavar="REV", help="also the drafter at this git revision")
    ap.add_argument("--num-draft-tokens", type=int, help="the tree budget, the root included (default k + 1)")
    args = ap.parse_args(argv)
    names = ["known"] + [v for v in args.variants.split(",") if v != "known"]
    for name in names:
        if name not in VARIANTS:
            ap.error(f"--variants: unknown variant {name!r}; known ones: {', '.join(VARIANTS)}")
    try:  # fails before anything is written
        old = at_revision(args.against) if args.against else None
    except subprocess.CalledProcessError as e:
        ap.error(f"--against: {args.against!r}: {e.stderr.strip().splitlines()[-1] if e.stderr.strip() else 'git show failed'}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        variants = {name: VARIANTS[name]() for name in names}
        if old is not None:
            takes_impl = "impl" in inspect.signature(old.NgramTrieDrafter).parameters  # from 2026-12-06 on
            variants[f"@{args.against}"] = old.NgramTrieDrafter(**({"impl": "python"} if takes_impl else {}))
        results.append(bench(batch, args.rounds, args.blocks, variants, args.num_draft_tokens))
        record = {"results": results, "against": args.against, "device": "cpu", "host": platform.platform(),
                  "cpu_cores": os.cpu_count(), "python": platform.python_version(), "git_sha": provenance.git_sha(),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **provenance.versions()}
        (args.out / "trie_bench.json").write_text(json.dumps(record, indent=1) + "\n")
    columns = list(results[0]["ms"])
    print(f"{'batch':>5} " + " ".join(f"{name + ' ms':>14}" for name in columns)
          + " ".join(f" {'known/' + name:>15}" for name in columns[1:]) + f" {'same trees':>10} {'nodes':>8}")
    for r in results:
        ms = {name: statistics.median(r["ms"][name]) for name in columns}
        print(f"{r['batch']:>5} " + " ".join(f"{ms[name]:>14.3f}" for name in columns)
              + " ".join(f" {ms['known'] / ms[name]:>15.2f}" for name in columns[1:])
              + f" {str(r['same_trees']):>10} {r['trie_nodes']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
