"""specbench.graphs, and batched drafting replayed from CUDA graphs: EAGLE chains and trees
(drafters/eagle_chain.py), a draft model's greedy chains (drafters/native_chain.py).

Off CUDA a graph is stood in for by FakeGraph, which keeps a CUDA graph's contract: the captured
call runs once more at each replay over the same static inputs and writes its outputs into the
captured ones, in place. The captured call and every replay run under NoHostSync, which fails on
what a real capture cannot hold (a host synchronization, a tensor made from Python data): on
CUDA those fail the capture or freeze one round's values into every replay. And a replay must
find the cache it was captured over. On CUDA the same rounds run through real graphs."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import random_head, tiny_llama
from tree_rounds import chain_state, grow, tree_state
from specbench import graphs
from specbench.drafters import eagle_chain, native_chain
from specbench.drafters.base import DraftState
from specbench.drafters.eagle_chain import GRAPHED_WIDTH, EagleChain
from specbench.drafters.native_chain import NativeChain
from specbench.heads import static_width
from specbench.sampling import SamplingParams

K = 4
KINDS = ("eagle", "eagle3")
SIZINGS = [{}, {"rows": 1, "max_length": 8}]  # the defaults; too small: the cache grows mid-run
SAMPLED = SamplingParams(0.8, 0, 1.0)
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest


class NoHostSync(TorchDispatchMode):
    """Fails on an operation a CUDA graph cannot capture or would freeze: reading a tensor's
    value on the host (.item(), bool(), int(), data-dependent shapes) or a tensor made from
    Python data (copied from the host at capture, the same values at every replay)."""

    FORBIDDEN = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal", "aten::lift_fresh",
                 "aten::nonzero", "aten::masked_select"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func._schema.name not in self.FORBIDDEN, f"{func} inside a captured call"
        return func(*args, **(kwargs or {}))


class FakeGraph:
    replaying = False  # while a replay runs its call (what a real replay runs on the device)

    def __init__(self, run, out, check):
        self.run, self.out, self.check = run, out, check

    def replay(self):
        self.check()
        FakeGraph.replaying = True
        try:
            with NoHostSync():
                new = self.run()
            for o, n in zip(self.out, new):
                if o is not None:  # an engine without feature layers returns (logits, None)
                    o.copy_(n)
        finally:
            FakeGraph.replaying = False


class HostOps(graphs.HostOps):
    """graphs.HostOps, a FakeGraph's replay excluded (a real one dispatches nothing)."""

    def counts(self, func) -> bool:
        return not FakeGraph.replaying


@pytest.fixture
def fake_graphs(monkeypatch):
    """Graphs on the CPU: -> bind(chain), after which every capture records the chain's cache and
    each replay asserts that it is still the chain's; the count of captures so far."""
    captures = []
    chains = []

    def bound_cache():  # what the bound chain's graphs are captured over (None: no chain bound)
        if not chains:
            return None
        return chains[0].engine if isinstance(chains[0], NativeChain) else chains[0].cache

    def capture(run, warmups=2, generators=()):
        for _ in range(warmups):  # warm-up, as on a side stream: may synchronize (lazy caches)
            run()
        with NoHostSync():
            out = run()
        cache = bound_cache()
        captures.append(cache)

        def check():
            assert bound_cache() is cache, "a graph replayed over a replaced cache"

        return FakeGraph(run, out, check), out

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(eagle_chain, "graphs_supported", lambda device: True)
    monkeypatch.setattr(native_chain, "graphs_supported", lambda device: True)
    return chains.append, captures


def test_the_engine_captures_through_graphs_capture_as_it_is_when_called(monkeypatch):
    """NativeEngine looks graphs.capture up at each capture. It used to bind it at import, so
    the first test to import the engine under fake_graphs left every later test, the CUDA ones
    included, capturing stand-ins (test_draft_model_greedy_chains_through_cuda_graphs failed so
    on an H100, 2026-12-05)."""
    from specbench.engines.native import NativeEngine, Transformer

    engine = NativeEngine(Transformer.from_hf(tiny_llama(seed=1, scale=4.0)), 1, 16)
    seen = []
    monkeypatch.setattr(graphs, "capture", lambda run: seen.append(run) or ("graph", run()))
    graph, _, out = engine._capture((torch.zeros(1, 1, dtype=torch.int64), engine.lengths, *engine._chain(1, 1)))
    assert graph == "graph" and len(seen) == 1 and out[0].shape == (1, 1, 96)


def test_graphed_keeps_a_graph_per_key_and_shapes(fake_graphs):
    """The first call of a key and input shapes captures over clones of its inputs; later calls
    copy theirs in and get the same output tensors, rewritten; a new key, shape or dtype
    captures again; clear() drops them all; disabled, fn runs directly."""
    _, captures = fake_graphs
    calls = []

    def fn(key, x, y):
        calls.append(key)
        return (x * key + y,)

    graphed = graphs.Graphed(fn, enabled=True)
    x, y = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])
    out, = graphed(3, x, y)
    assert out.tolist() == [13.0, 26.0] and len(graphed) == 1 and len(captures) == 1
    x += 1  # the caller's tensor, not the graph's: the output stays until the next replay
    assert out.tolist() == [13.0, 26.0]
    again, = graphed(3, x, torch.tensor([0.0, 0.0]))
    assert again is out and out.tolist() == [6.0, 9.0] and len(captures) == 1
    graphed(2, x, y)
    graphed(3, torch.ones(3), torch.ones(3))
    graphed(3, x.double(), y.double())
    assert len(graphed) == len(captures) == 4
    graphed.clear()
    assert len(graphed) == 0
    graphed(3, x, y)
    assert len(captures) == 5
    eager = graphs.Graphed(fn, enabled=False)
    calls.clear()
    first, = eager(3, x, y)
    second, = eager(3, x, y)
    assert first is not second and calls == [3, 3] and len(eager) == 0 and len(captures) == 5


def test_no_host_sync_fails_a_captured_call_that_reads_a_value(fake_graphs):
    graphed = graphs.Graphed(lambda key, x: (x * float(x.sum()),), enabled=True)
    with pytest.raises(AssertionError, match="_local_scalar_dense"):
        graphed(None, torch.ones(2))
    graphed = graphs.Graphed(lambda key, x: (x + torch.tensor([1.0, 2.0]),), enabled=True)
    with pytest.raises(AssertionError, match="lift_fresh"):
        graphed(None, torch.ones(2))


def drive(chain, target, head, generator):
    """Rounds of chains (greedy and sampled) and trees over three requests and a fourth: rows
    left idle for a round, a request released and its row taken by a new id, a history cut back
    past the pairs its row holds. -> every proposal, and each round's (captures of the sync's
    graphs, whether the cache was replaced)."""
    histories = {7: torch.tensor([0, 5, 6, 7, 5, 6]), 3: torch.tensor([0, 9]),
                 11: torch.tensor([0, 3, 4, 3, 4, 3, 9, 10, 11, 12])}
    proposals, rounds = [], []

    def chain_round(order, accepted, sampled=False):
        state = chain_state(target, head, histories, order, K)
        cache = chain.cache
        if sampled:
            got = chain.propose(state, "probabilistic", SAMPLED, generator)
        else:
            got = chain.propose(state, "greedy", SamplingParams(0.0, 0, 1.0), None)
        proposals.append(got)
        rounds.append((len(chain._read), cache is not None and chain.cache is not cache))
        for b, i in enumerate(order):
            histories[i] = torch.cat([histories[i], got.tokens[b, : accepted[i]], torch.tensor([40 + i])])

    def tree_round(order, accepted):
        state = tree_state(target, head, histories, order, 3, 2, 5)
        cache = chain.cache
        got = chain.propose_tree(state)
        proposals.append(got)
        rounds.append((len(chain._read), cache is not None and chain.cache is not cache))
        grow(histories, got, order, accepted)

    chain_round((7, 3, 11), {7: 0, 3: K, 11: 2})
    tree_round((11, 7, 3), {11: None, 7: -1, 3: 1})
    chain_round((11,), {11: 1}, sampled=True)  # 7's and 3's rows idle
    chain.release([3])
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new id, in 3's row
    del histories[3]
    chain_round((12, 11, 7), {12: 3, 11: 0, 7: K}, sampled=True)
    histories[7] = histories[7][:-3]  # lost pairs its row holds: rolled back, the last read again
    tree_round((7, 12, 11), {7: 0, 12: None, 11: -1})
    chain_round((7, 12, 11), {7: 1, 12: 2, 11: K})
    chain_round((11, 7), {11: 0, 7: 0})
    return proposals, rounds


def same_proposals(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tokens.tolist() == w.tokens.tolist() and g.num_tokens.tolist() == w.num_tokens.tolist()
        assert (g.parents is None) == (w.parents is None)
        if g.parents is not None:
            assert g.parents.tolist() == w.parents.tolist()
        assert (g.probs is None) == (w.probs is None)
        if g.probs is not None:
            assert torch.equal(g.probs, w.probs)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=1, scale=4.0).requires_grad_(False)


@pytest.mark.parametrize("sizing", SIZINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_eagle_rounds_through_graphs_draft_what_eager_rounds_draft(kind, sizing, target, fake_graphs):
    """Chains (greedy: one graph for k argmaxes and k - 1 steps; sampled: a graph a step) and
    trees (a graph a step) replayed from graphs draft token for token, and q for q, what the same
    rounds draft eagerly. Every sync width a later round can need (accepted + 1 <= k + 1 pairs)
    is captured at the first round, so no later round captures one but where the cache grew
    (which drops the graphs: no replay finds a replaced cache, FakeGraph checks)."""
    bind, captures = fake_graphs
    head = random_head(target, kind, 40)
    eager = EagleChain(head, **sizing, cuda_graphs=False)
    graphed = EagleChain(head, **sizing)
    bind(graphed)
    want, _ = drive(eager, target, head, torch.Generator().manual_seed(5))
    assert not captures and len(eager._read) == 0
    got, rounds = drive(graphed, target, head, torch.Generator().manual_seed(5))
    same_proposals(got, want)
    assert len(graphed._greedy) > 0 and len(graphed._step) > 0 and len(graphed._tree) > 0
    later = {static_width(c, graphed.cache.capacity) for c in range(1, K + 2)}
    assert later <= graphed._widths and max(later) <= GRAPHED_WIDTH
    for (before, _), (after, grew) in zip(rounds, rounds[1:]):
        assert after == before or grew  # a capture after the first round: only over a new cache
    assert any(grew for _, grew in rounds) == bool(sizing)


@pytest.mark.parametrize("kind", KINDS)
def test_a_greedy_round_through_graphs_leaves_the_host_a_fifth_of_its_eager_work(kind, target, fake_graphs):
    """What a graph saves is host work: eagerly a greedy EAGLE chain round at k = 4 dispatches
    about 400 (EAGLE) to 500 (EAGLE-3) aten operations, one by one; through graphs the host
    dispatches under a fifth of that (about 65) beside its two replays (the sync's and the chain's)."""
    bind, _ = fake_graphs
    head = random_head(target, kind, 40)
    histories = {0: torch.tensor([0, 5, 6, 7, 5, 6, 9, 3]), 1: torch.tensor([0, 9, 4, 4])}
    greedy = SamplingParams(0.0, 0, 1.0)
    counts = {}
    for graphs_on in (False, True):
        chain = EagleChain(head, cuda_graphs=graphs_on)
        if graphs_on:
            bind(chain)
        chain.propose(chain_state(target, head, histories, (0, 1), K), "greedy", greedy, None)  # first: captures
        state = chain_state(target, head, {i: torch.cat([h, torch.tensor([11, 12])]) for i, h in histories.items()},
                            (0, 1), K)
        with HostOps() as ops:
            chain.propose(state, "greedy", greedy, None)
        counts[graphs_on] = ops.n
    assert counts[False] > 300 and counts[True] * 5 < counts[False], counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("sizing", SIZINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_eagle_rounds_through_cuda_graphs_draft_what_eager_rounds_draft(kind, sizing):
    """The same rounds on CUDA, real graphs against eager, fp32: the same drafts and q."""
    target = tiny_llama(seed=1, scale=4.0).requires_grad_(False).cuda()
    head = random_head(target, kind, 40).cuda()
    eager = EagleChain(head, **sizing, cuda_graphs=False)
    graphed = EagleChain(head, **sizing)
    want, _ = drive(eager, target, head, torch.Generator("cuda").manual_seed(5))
    got, _ = drive(graphed, target, head, torch.Generator("cuda").manual_seed(5))
    assert len(graphed._greedy) > 0 and len(graphed._tree) > 0 and len(eager._greedy) == 0
    same_proposals(got, want)


def drive_native(chain):
    """drive's rounds for a draft model (NativeChain), greedy chains and trees: idle rows, a row
    released and taken by a new id, a history cut back. -> every proposal, and the engine of
    each round (a new one: the cache grew)."""
    histories = {7: torch.tensor([0, 5, 6, 7, 5, 6]), 3: torch.tensor([0, 9]),
                 11: torch.tensor([0, 3, 4, 3, 4, 3, 9, 10, 11, 12])}
    proposals, engines = [], []

    def chain_round(order, accepted):
        state = DraftState(tokens=[histories[i] for i in order], k=K, request_ids=tuple(order))
        proposals.append(got := chain.propose(state, "greedy", SamplingParams(0.0, 0, 1.0), None))
        engines.append(chain.engine)
        for b, i in enumerate(order):
            histories[i] = torch.cat([histories[i], got.tokens[b, : accepted[i]], torch.tensor([40 + i])])

    def tree_round(order, accepted):
        state = DraftState(tokens=[histories[i] for i in order], k=3, topk=2, num_draft_tokens=6,
                           request_ids=tuple(order))
        proposals.append(got := chain.propose_tree(state))
        engines.append(chain.engine)
        grow(histories, got, order, accepted)

    chain_round((7, 3, 11), {7: 0, 3: K, 11: 2})
    tree_round((11, 7, 3), {11: None, 7: -1, 3: 1})
    chain_round((11,), {11: 1})  # 7's and 3's rows idle
    chain.release([3])
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new id, in 3's row
    del histories[3]
    chain_round((12, 11, 7), {12: 3, 11: 0, 7: K})
    histories[7] = histories[7][:-3]  # lost tokens its row holds: rolled back, read again
    tree_round((7, 12, 11), {7: 0, 12: None, 11: -1})
    chain_round((7, 12, 11), {7: 1, 12: 2, 11: K})
    chain_round((11, 7), {11: 0, 7: 0})
    return proposals, engines


def draft_model_builder(target):
    from specbench.engines.native import Transformer

    return lambda: Transformer.from_hf(target)


@pytest.mark.parametrize("sizing", SIZINGS)
def test_draft_model_greedy_chains_through_graphs_draft_what_eager_chains_draft(sizing, target, fake_graphs):
    """A draft model's greedy chains (k - 1 steps and their argmaxes, one graph over every row)
    replayed from graphs draft token for token what the same rounds draft eagerly, trees between
    them included. One capture per cache: a cache that grows drops its graphs (no replay finds a
    replaced engine, FakeGraph checks)."""
    bind, captures = fake_graphs
    eager = NativeChain(draft_model_builder(target), **sizing, cuda_graphs=False)
    graphed = NativeChain(draft_model_builder(target), **sizing)
    bind(graphed)
    want, _ = drive_native(eager)
    assert not captures
    got, engines = drive_native(graphed)
    same_proposals(got, want)
    assert len(graphed._greedy) == 1 and len(eager._greedy) == 0
    assert len(captures) == len({id(e) for e in engines}) > 0  # a capture for each engine the rounds saw
    assert (len(captures) > 1) == bool(sizing)


def test_a_draft_model_greedy_round_through_graphs_leaves_the_host_the_sync(target, fake_graphs):
    """Eagerly a greedy chain round at k = 4 dispatches its sync and k - 1 steps of forwards,
    argmaxes and bookkeeping; through a graph the host keeps the sync (the engine's own graph on
    CUDA; eager on this CPU) and a handful of operations around one replay: under half."""
    bind, _ = fake_graphs
    histories = {0: torch.tensor([0, 5, 6, 7, 5, 6, 9, 3]), 1: torch.tensor([0, 9, 4, 4])}
    greedy = SamplingParams(0.0, 0, 1.0)
    counts = {}
    for graphs_on in (False, True):
        chain = NativeChain(draft_model_builder(target), cuda_graphs=graphs_on)
        if graphs_on:
            bind(chain)
        chain.propose(DraftState(tokens=list(histories.values()), k=K, request_ids=(0, 1)), "greedy", greedy, None)
        grown = [torch.cat([h, torch.tensor([11, 12])]) for h in histories.values()]
        with HostOps() as ops:
            chain.propose(DraftState(tokens=grown, k=K, request_ids=(0, 1)), "greedy", greedy, None)
        counts[graphs_on] = ops.n
    assert counts[True] * 2 < counts[False], counts


@pytest.mark.parametrize("tree", [False, True], ids=["chains", "trees"])
def test_a_draft_model_captures_every_sync_width_at_its_first_round(tree, target, fake_graphs):
    """How many tokens a row's sync reads depends on what the last round accepted (a chain's
    row 1 or 2, a tree's 1 .. k + 1), and each width is an engine graph of its own. Every one a
    run can meet is captured at the first round: later rounds, whatever they accept, capture
    nothing (a capture inside a measured decode is a stall of tens to hundreds of ms; the
    synthetic control's rows on an H100, 2026-12-05, drafted 3 to 6 ms a round more than their
    TPOT held, k >= 3). The padded sync drafts what the eager one drafts."""
    bind, captures = fake_graphs
    k = 3
    runs = {}
    for graphs_on in (False, True):
        chain = NativeChain(draft_model_builder(target), cuda_graphs=graphs_on)
        assert chain.ready()
        chain.engine.cuda_graphs = graphs_on  # the engine's own graphs, as on CUDA
        if graphs_on:
            bind(chain)
        histories = {7: torch.tensor([0, 5, 6, 7, 5, 6]), 3: torch.tensor([0, 9]), 11: torch.tensor([0, 3, 4, 3])}
        proposals, after_first = [], None
        for accepted in ({7: 0, 3: k, 11: 1}, {7: k, 3: 0, 11: 2}, {7: 1, 3: k, 11: k}, {7: 0, 3: 0, 11: 0}):
            order = tuple(histories)
            if tree:
                state = DraftState(tokens=[histories[i] for i in order], k=k, topk=2, num_draft_tokens=6,
                                   request_ids=order)
                proposals.append(got := chain.propose_tree(state))
                grow(histories, got, order, {i: min(accepted[i], int(got.num_tokens[b])) - 1 for b, i in enumerate(order)})
            else:
                state = DraftState(tokens=[histories[i] for i in order], k=k, request_ids=order)
                proposals.append(got := chain.propose(state, "greedy", SamplingParams(0.0, 0, 1.0), None))
                for b, i in enumerate(order):
                    histories[i] = torch.cat([histories[i], got.tokens[b, : accepted[i]], torch.tensor([40 + i])])
            after_first = len(captures) if after_first is None else after_first
        runs[graphs_on] = proposals
    same_proposals(runs[True], runs[False])
    assert after_first > 0 and len(captures) == after_first, (after_first, len(captures))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("sizing", SIZINGS)
def test_draft_model_greedy_chains_through_cuda_graphs_draft_what_eager_chains_draft(sizing):
    """The same rounds on CUDA, real graphs (the chain's and the engine's) against eager, fp32."""
    target = tiny_llama(seed=1, scale=4.0).requires_grad_(False).cuda()
    eager = NativeChain(draft_model_builder(target), **sizing, cuda_graphs=False)
    graphed = NativeChain(draft_model_builder(target), **sizing)
    want, _ = drive_native(eager)
    got, _ = drive_native(graphed)
    assert len(graphed._greedy) == 1 and len(eager._greedy) == 0
    same_proposals(got, want)


def test_draft_bench_runs_tiny(tmp_path):
    """experiments/draft_bench.py on a toy shape on the CPU (both variants eager there): a row per
    drafter, mode and batch with both timings, drafts identical between the variants (the same
    weights, requests and seeds), and the provenance."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "draft_bench.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--tiny", "--batches", "1,3"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    bench = json.loads((tmp_path / "draft_bench.json").read_text())
    assert {"device", "torch", "transformers", "git_sha", "date"} <= set(bench)
    assert [(r["drafter"], r["mode"], r["B"]) for r in bench["rows"]] == [
        (d, m, B) for d in ("eagle3", "eagle", "draft_model") for m in ("greedy", "sampled", "tree") for B in (1, 3)]
    assert all(r["graphs_ms"] > 0 and r["eager_ms"] > 0 and r["same_drafts"] and r["rounds"] == 4
               for r in bench["rows"])


def test_a_timed_region_counts_the_captures_inside_it_with_the_heap_frozen(monkeypatch):
    """The runner's measured decodes run in run.timed_region: the graphs captured inside are
    counted (the row's graph_captures), and the heap is frozen while it runs, then not. Objects
    frozen before it are thawed with the rest (gc has no partial unfreeze): the GPU host's Python
    starts with 375 frozen (H100, 2026-12-06), which this test first assumed it would keep."""
    import gc

    from specbench.run import timed_region

    counter = iter([5, 8])  # graphs.captures() before and after
    monkeypatch.setattr(graphs, "captures", lambda: next(counter))
    frozen = gc.get_freeze_count()
    with timed_region() as counted:
        inside = gc.get_freeze_count()
        assert counted == {}
    assert inside > frozen and gc.get_freeze_count() == 0 and counted == {"graph_captures": 3}


def test_every_capture_warms_up_on_one_side_stream_per_device(monkeypatch):
    """graphs.capture warms up on the device's one side stream, not a new stream per capture:
    PyTorch keeps a cuBLAS workspace (32 MiB on Hopper) per stream for the life of the process.
    torch.cuda stood in for, as on a CPU: two captures on device 0 and one on device 1 make two
    streams; each capture's warm-ups ran on its device's stream, then one call was captured."""
    made, entered, device = [], [], [0]

    class Stream:
        def __init__(self):
            made.append(self)

        def wait_stream(self, other):
            pass

    class Graph:
        def __enter__(self):
            entered.append("capture")

        def __exit__(self, *exc):
            return False

    class Context:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            entered.append(self.stream)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(graphs, "_warmup_streams", {})
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", Context)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream.__new__(Stream))  # not made by capture
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: Graph())
    calls = []
    for d in (0, 0, 1):
        device[0] = d
        graph, out = graphs.capture(lambda: calls.append(d) or len(calls))
        assert graph == "graph" and out == len(calls)
    assert len(made) == 2 and calls == [0, 0, 0, 0, 0, 0, 1, 1, 1]  # 2 warm-ups and the capture, each
    assert entered == [made[0], "capture", made[0], "capture", made[1], "capture"]


def test_capture_memory_runs_on_cuda_and_says_it_needs_it_elsewhere(tmp_path):
    """experiments/capture_memory.py: on CUDA, both warm-up streams measured after every capture;
    on a CPU, one line, exit 2, nothing written."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "capture_memory.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), "--captures", "2", "--width", "64"],
                         capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():
        assert out.returncode == 0, out.stderr[-2000:]
        record = json.loads((tmp_path / "out" / "capture_memory.json").read_text())
        assert {name: len(grown) for name, grown in record["rows"].items()} == {"new_stream": 2, "shared": 2}
    else:
        assert out.returncode == 2 and out.stderr.strip() == "capture_memory: needs CUDA (graphs are captured on a GPU only)"
        assert not (tmp_path / "out").exists()
