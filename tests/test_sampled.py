"""specbench.sampled: a sampled round's p, draws and rule for every engine row in one call,
replayed from a CUDA graph where the rule is a Triton kernel (the CPU runs the kernels in
Triton's interpreter, and stands a graph in with test_graphs' FakeGraph: the captured call
runs again at each replay, under NoHostSync)."""

import numpy as np
import pytest
import torch

from test_graphs import FakeGraph, NoHostSync
from test_runner import EOS, INTERPRETED_KERNELS, NEEDS_INTERPRETER, RAGGED, BigramEngine, OracleTreeDrafter
from specbench import graphs
from specbench.runner import Speculation, decode_requests
from specbench.sampled import Sampler
from specbench.sampling import SamplingParams
from specbench.tree import compile_tree, with_root

pytest.importorskip("triton", reason="the dev extra installs triton on Linux")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PARAMS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95)
B, K, V = 3, 3, 96


@pytest.fixture
def fake_capture(monkeypatch):
    """graphs.capture on the CPU: the warm-ups, then the captured call under NoHostSync; each
    replay runs it again (under NoHostSync). -> the captures so far, a list."""
    captures = []

    def capture(run, warmups=2, generators=()):
        for _ in range(warmups):
            run()
        with NoHostSync():
            out = run()
        captures.append(generators)
        return FakeGraph(run, out, check=lambda: None), out

    monkeypatch.setattr(graphs, "capture", capture)
    return captures


def logits_of(seed: int, q: int = K + 1, idle: float = 3.0) -> torch.Tensor:
    """[B, q, V]; row 1 (idle in these tests) drawn apart, times `idle`."""
    logits = torch.randn(B, q, V, generator=torch.Generator().manual_seed(seed)) * 3.0
    logits[1] = torch.randn(q, V, generator=torch.Generator().manual_seed(seed + 1000)) * idle
    return logits.to(DEVICE)


def chain_drafts(seed: int) -> torch.Tensor:
    """[B, K]: row 0 three drafts, row 1 idle (-1), row 2 one draft."""
    d = torch.randint(0, V, (B, K), generator=torch.Generator().manual_seed(seed))
    d[1] = -1
    d[2, 1:] = -1
    return d.to(DEVICE)


def draft_probs(seed: int) -> torch.Tensor:
    """[B, K, V] a draft's q (the standard rule's), row 1's zeros (idle)."""
    q = torch.randn(B, K, V, generator=torch.Generator().manual_seed(seed + 500)).mul(2.0).softmax(-1)
    q[1] = 0.0
    return q.to(DEVICE)


def tree_hosts():
    """[B] TreeHost: a 5-node tree (two children of the root, two under the first), idle, a chain of 2."""
    wide = compile_tree(with_root(torch.tensor([0, 0, 1, 1]))).host
    chain = compile_tree(with_root(torch.tensor([0, 1]))).host
    return [wide, None, chain]


def calls(sampler: Sampler, kind: str, rule: str, impl: str, seeds, idle: float = 3.0) -> list:
    """The sampler's results for one call a seed (fresh logits and drafts each; `idle` scales row 1's logits)."""
    node_tokens = np.arange(B * (K + 2)).reshape(B, K + 2) % V
    out = []
    for s in seeds:
        if kind == "token":
            out.append(sampler.tokens(logits_of(s, 1, idle)).result())
        elif kind == "chain":
            q = draft_probs(s) if rule == "standard" else None
            out.append(sampler.chain(rule, impl, logits_of(s, K + 1, idle), chain_drafts(s), q).result())
        else:
            out.append(sampler.trees(rule, logits_of(s, K + 2, idle), node_tokens, tree_hosts()).result())
    return out


CASES = [("token", None, "triton"), ("chain", "onehot", "triton"), ("chain", "thresholded", "triton"),
         ("chain", "standard", "triton"), ("chain", "onehot", "torch"), ("tree", "target_only", "triton")]


@pytest.mark.parametrize("kind, rule, impl", CASES)
def test_graphed_calls_draw_what_eager_calls_draw(fake_capture, kind, rule, impl):
    """A Sampler with graphs, its generator re-seeded after the capture, gives call for call
    what an eager Sampler gives from the same seed: every replay draws from the generator's
    offset of the moment (on the CPU the stand-in replays eagerly; on CUDA the real graphs are
    checked below). The first call captures, with the generator registered; no later call
    does. Torch rules are not graphed (they may synchronise), nor a chain with the draft's q (a
    graph's static copy of q would double its memory)."""
    graphed = Sampler(PARAMS, torch.Generator(DEVICE), graphs=True)
    calls(graphed, kind, rule, impl, [99])  # the warm-up's capture
    graphed.generator.manual_seed(7)
    got = calls(graphed, kind, rule, impl, range(4))
    want = calls(Sampler(PARAMS, torch.Generator(DEVICE).manual_seed(7)), kind, rule, impl, range(4))
    assert got == want
    eager = impl == "torch" or rule == "standard"
    assert [g[0] is graphed.generator for g in fake_capture] == ([] if eager else [True])


@pytest.mark.parametrize("kind, rule, impl", CASES)
def test_an_idle_rows_logits_do_not_change_the_live_rows_draws(kind, rule, impl):
    """Every engine row is drawn for, idle ones too: row 1's logits (idle: no drafts, no tree)
    may be anything, and the live rows' results stay those of the same seed."""
    results = [calls(Sampler(PARAMS, torch.Generator(DEVICE).manual_seed(3)), kind, rule, impl, range(3), idle)
               for idle in (3.0, -50.0)]
    keep = [0, 2]
    live = [[r[b] for b in keep] for r in results[0]]
    assert live == [[r[b] for b in keep] for r in results[1]]
    assert [r[1] for r in results[0]] != [r[1] for r in results[1]]  # the idle row's own draws did change


def test_a_chain_row_emits_its_accepted_drafts_then_one_token():
    """Sampler.chain's rows: (tokens, a) with tokens the a accepted drafts, then the drawn one;
    an idle row accepts nothing and still draws."""
    sampler = Sampler(PARAMS, torch.Generator(DEVICE).manual_seed(0))
    rows = sampler.chain("onehot", "triton", logits_of(0), chain_drafts(0)).result()
    drafts = chain_drafts(0).tolist()
    for (tokens, a), d in zip(rows, drafts):
        assert len(tokens) == a + 1 and tokens[:a] == d[:a] and 0 <= tokens[a] < V
    assert rows[1][1] == 0 and rows[2][1] <= 1


@pytest.mark.skipif(not INTERPRETED_KERNELS, reason=NEEDS_INTERPRETER)
def test_the_runner_decodes_through_graphs_what_it_decodes_eagerly(fake_capture):
    """Four prompts through three engine rows (the batch drains), sampled: the baseline and tree
    rounds (rule.impl=triton) through a graphed Sampler, re-seeded after a first decode that
    captured, give the tokens of an eager decode from the same seed. One graph a kind, whatever
    the live rows: every call covers the engine's rows."""
    def decode(sampler, spec):
        return [r.tokens for r in decode_requests(
            BigramEngine(rows=3), RAGGED, params=PARAMS, max_new_tokens=12, eos_ids=EOS, generator=sampler.generator,
            sampler=sampler, spec=spec)]

    reference = decode(Sampler(PARAMS, torch.Generator().manual_seed(1)), None)
    for spec_of in (lambda: None, lambda: Speculation(OracleTreeDrafter(RAGGED, reference, noise=0.3, seed=2),
                                                      "target_only", 3, topk=2, num_draft_tokens=7, impl="triton")):
        fake_capture.clear()
        graphed = Sampler(PARAMS, torch.Generator(), graphs=True)
        decode(graphed, spec_of())
        assert len(fake_capture) == 1
        graphed.generator.manual_seed(5)
        got = decode(graphed, spec_of())
        want = decode(Sampler(PARAMS, torch.Generator().manual_seed(5)), spec_of())
        assert got == want and len(fake_capture) == 1


def test_the_runner_launches_a_rounds_draws_before_it_waits_for_the_forward(monkeypatch):
    """At T > 0 a round's Sampler call is launched right after the target's forward, before
    the host synchronises (the forward's device time then hides the call's host work), and its
    results are read after: every forward is followed by a launch, then a synchronisation."""
    from specbench import runner as runner_module

    events = []
    monkeypatch.setattr(runner_module, "_synchronize", lambda device: events.append("sync"))
    launch, forward = Sampler._launch, BigramEngine.forward
    monkeypatch.setattr(Sampler, "_launch", lambda self, *a, **kw: events.append("launch") or launch(self, *a, **kw))
    monkeypatch.setattr(BigramEngine, "forward", lambda self, *a: events.append("forward") or forward(self, *a))
    sampler = Sampler(PARAMS, torch.Generator().manual_seed(0))
    decode_requests(BigramEngine(rows=2), RAGGED, params=PARAMS, max_new_tokens=6, eos_ids=frozenset(),
                    generator=sampler.generator, sampler=sampler)
    after = [events[i + 1 : i + 3] for i, e in enumerate(events) if e == "forward"]
    assert len(after) >= 5 and all(a == ["launch", "sync"] for a in after)


def test_a_sampler_must_draw_from_the_decodes_generator():
    with pytest.raises(ValueError, match="sampler draws from another generator"):
        decode_requests(BigramEngine(rows=1), RAGGED[:1], params=PARAMS, max_new_tokens=2, eos_ids=EOS,
                        generator=torch.Generator(), sampler=Sampler(PARAMS, torch.Generator()))


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU (the CPU's stand-in is checked above)")
@pytest.mark.parametrize("kind, rule, impl", CASES)
def test_cuda_graphs_draw_what_eager_calls_draw(kind, rule, impl):
    """test_graphed_calls_draw_what_eager_calls_draw through real CUDA graphs: a replay reads the
    registered generator's seed and offset of the moment and draws the eager call's numbers."""
    graphed = Sampler(PARAMS, torch.Generator(DEVICE), graphs=True)
    calls(graphed, kind, rule, impl, [99])
    for seed in (7, 8):  # re-seeded between replays, as every decode of a run is
        graphed.generator.manual_seed(seed)
        got = calls(graphed, kind, rule, impl, range(4))
        want = calls(Sampler(PARAMS, torch.Generator(DEVICE).manual_seed(seed)), kind, rule, impl, range(4))
        assert got == want, seed


def test_a_tree_walk_padded_to_the_runs_shape_is_the_tight_walk():
    """Sampler.trees pads every round's trees to q nodes, q - 1 levels and q - 1 children: the
    tree kernel given the padded inputs (p at padding nodes anything, coins past a tree's depth
    anything) walks exactly as on the tight ones, with the same coins and noise where both read."""
    from specbench.kernels import tree as ktree
    from specbench.rules import pack_trees, tree_kernel_results

    q = K + 3
    hosts = tree_hosts()[:1] * 2 + [tree_hosts()[2]]  # two 5-node trees and a chain of 2
    node_tokens = np.random.default_rng(0).integers(0, V, (B, q))
    g = torch.Generator().manual_seed(4)
    first, sibling, token = pack_trees(hosts, node_tokens, q)  # [B, q] each
    boost = torch.zeros(B, q, V)  # each node's children's tokens likely at the node
    for b in range(B):
        for n in range(q):
            c = first[b, n]
            while c >= 0:
                boost[b, n, token[b, c]] = 5.0
                c = sibling[b, c]
    walked = 0
    for trial in range(6):
        probs = torch.softmax(torch.randn(B, q, V, generator=g) + boost, -1).to(DEVICE)
        coins = torch.rand(B, q - 1, generator=g).to(DEVICE)
        noise = (1.0 / torch.empty(B, V).exponential_(generator=g)).to(DEVICE)
        N = max(h.links.shape[1] for h in hosts)
        D = max(h.levels for h in hosts)
        Z = max(h.child_table.shape[1] for h in hosts)
        walks = {}
        for name, (n, d, z) in {"tight": (N, D, Z), "padded": (q, q - 1, q - 1)}.items():
            w = torch.from_numpy(pack_trees(hosts, node_tokens, n)).to(DEVICE)
            out = ktree.tree_triton("target_only", probs[:, :n].contiguous(), w[2], w[0], w[1],
                                    coins[:, :d].contiguous(), noise, max_children=z)
            rows = torch.cat([out.path, out.tokens, out.num_accepted[:, None], out.tried[:, None]], 1).tolist()
            walks[name] = tree_kernel_results(rows, d)
        assert walks["tight"] == walks["padded"], trial
        walked += sum(r.num_accepted for r in walks["tight"])
    assert walked >= 6  # the walks went down the trees, where the coins and the padding matter
