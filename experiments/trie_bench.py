"""ngram_trie's host cost per round, three ways side by side (issue 6, d).

ngram_trie drafts on the host in Python: each round inserts every request's new tokens into the
shared trie, then matches and expands. A round at batch 48 cost 3.5 to 3.9 ms of drafting on an
H100 host (results/2026-12-05-h100-night). Here three variants run side by side in one process,
in alternating blocks of rounds over the same histories:
  walk   every path inserted from the root (about max_trie_depth^2 / 2 node visits per new
         token), every window found from the root (the code before 87daf79)
  find   each request's growing paths kept from its previous insert (max_trie_depth lookups per
         new token; NgramTrie.insert), every window found from the root (87daf79)
  known  the same insert, each window's node taken from the paths it just extended
         (NgramTrieDrafter.window_nodes: no walk)
All three leave the same trie and propose the same trees (tests/test_ngram_trie.py).

The histories are synthetic, with no model: requests of 60 to 400 tokens from a Zipf-distributed
vocabulary of 49152, 70 % of them phrases drawn from a shared bank (repeats, as real text has),
growing by 1 to 4 tokens a round (an accepted prefix and a bonus token). Host code only, so a
CPU measures it; ratios are the result, not the absolute times of another host.

    python experiments/trie_bench.py OUT [--batches 1,8,48] [--rounds 40] [--blocks 5]

Writes OUT/trie_bench.json (every block, with provenance) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specbench import provenance
from specbench.drafters.base import DraftState
from specbench.drafters.ngram_trie import NgramTrie, NgramTrieDrafter

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


def bench(batch: int, rounds: int, blocks: int, seed: int = 0) -> dict:
    """ms a round of propose() for each variant, blocks of `rounds` rounds alternating."""
    variants = {"walk": walking(NgramTrieDrafter()), "find": finding(NgramTrieDrafter()), "known": NgramTrieDrafter()}
    texts = Texts(seed)
    histories = [texts.tokens(int(texts.rng.integers(60, 400))) for _ in range(batch)]
    times = {name: [] for name in variants}
    for drafter in variants.values():  # the prompts inserted untimed: a round's cost is its new tokens'
        drafter.propose(DraftState(tokens=[torch.tensor(h) for h in histories], k=4, request_ids=tuple(range(batch)),
                                   host=[np.array(h, dtype=np.int64) for h in histories]))
    for _ in range(blocks):
        growth = [[texts.tokens(int(texts.rng.integers(1, 5))) for _ in range(batch)] for _ in range(rounds)]
        start = [list(h) for h in histories]
        for name, drafter in variants.items():  # the same rounds for each
            hist = [list(h) for h in start]
            elapsed = 0.0
            for grow in growth:
                state = DraftState(tokens=[torch.tensor(h) for h in hist], k=4, request_ids=tuple(range(batch)),
                                   host=[np.array(h, dtype=np.int64) for h in hist])
                t = time.perf_counter()
                drafter.propose(state)
                elapsed += time.perf_counter() - t
                for h, g in zip(hist, grow):
                    h += g
            times[name].append(elapsed / rounds * 1e3)
        histories = hist
    same = variants["walk"].trie._count == variants["find"].trie._count == variants["known"].trie._count
    return {"batch": batch, "rounds": rounds, "blocks": blocks, "ms": times, "same_trie": same,
            "trie_nodes": len(variants["known"].trie)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--batches", default="1,8,48")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=5)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        results.append(bench(batch, args.rounds, args.blocks))
        record = {"results": results, "device": "cpu", "host": platform.platform(), "cpu_cores": os.cpu_count(),
                  "python": platform.python_version(), "git_sha": provenance.git_sha(),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **provenance.versions()}
        (args.out / "trie_bench.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'batch':>5} {'walk ms':>9} {'find ms':>9} {'known ms':>9} {'walk/known':>10} {'find/known':>10} "
          f"{'same trie':>9} {'nodes':>8}")
    for r in results:
        walk, find, known = (statistics.median(r["ms"][n]) for n in ("walk", "find", "known"))
        print(f"{r['batch']:>5} {walk:>9.3f} {find:>9.3f} {known:>9.3f} {walk / known:>10.2f} {find / known:>10.2f} "
              f"{str(r['same_trie']):>9} {r['trie_nodes']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
