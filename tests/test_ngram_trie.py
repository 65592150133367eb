"""SGLang's shared n-gram trie drafter on tiny hand-made histories, each with its exact expected tree."""

import json
import random
from pathlib import Path

import pytest
import torch

from specbench.config import ConfigError, NgramTrieConfig
from specbench.drafters.base import DraftState
from specbench.drafters.ngram_trie import NgramTrieDrafter
from specbench.tree import compile_tree, with_root


def drafter(impl: str = "python", **overrides) -> NgramTrieDrafter:
    """Small defaults: short trie, breadth 1 (chains) unless a test asks for more."""
    params = dict(capacity=10_000, max_trie_depth=6, min_match_window=1, max_match_window=4,
                  min_bfs_breadth=1, max_bfs_breadth=1, impl=impl)
    params.update(overrides)
    return NgramTrieDrafter(**params)


@pytest.fixture(params=["python", "native"])
def impl(request) -> str:
    """Both tries, where a test reads only what they share (proposals, counts, sizes): the
    compiled one (ngram_trie.cpp) must draft exactly what the Python one does."""
    return request.param


def propose(d: NgramTrieDrafter, histories: list[list[int]], k: int, num_draft_tokens: int, ids=()):
    """Returns [(tokens, parents)] per request, cut to its num_tokens, and the raw proposal."""
    p = d.propose(DraftState(tokens=[torch.tensor(h) for h in histories], k=k,
                             num_draft_tokens=num_draft_tokens, request_ids=tuple(ids)))
    out = []
    for b in range(len(histories)):
        n = int(p.num_tokens[b])
        out.append((p.tokens[b, :n].tolist(), p.parents[b, :n].tolist()))
    return out, p


def one(d, history, k, num_draft_tokens, rid="r"):
    return propose(d, [history], k, num_draft_tokens, ids=[rid])[0][0]


# (1) one request copying itself -------------------------------------------------------------


def test_repeated_phrase_gives_its_continuation_as_a_chain(impl):
    # [1, 2, 3] occurred before, followed by 4 5 9.
    assert one(drafter(impl), [1, 2, 3, 4, 5, 9, 1, 2, 3], k=3, num_draft_tokens=4) == ([4, 5, 9], [0, 1, 2])


def test_shorter_windows_extend_the_chain_past_the_trie_depth(impl):
    # From the window [1, 2, 3] the 6-deep trie only reaches 4 5 9; the windows [2, 3] and [3]
    # reuse those nodes and add 1, then 2, below them (SGLang merges every matched window).
    assert one(drafter(impl), [1, 2, 3, 4, 5, 9, 1, 2, 3], k=6, num_draft_tokens=7) == ([4, 5, 9, 1, 2], [0, 1, 2, 3, 4])
    # With only the longest window allowed, the chain stops at the trie's depth.
    d = drafter(impl, min_match_window=3)
    assert one(d, [1, 2, 3, 4, 5, 9, 1, 2, 3], k=6, num_draft_tokens=7) == ([4, 5, 9], [0, 1, 2])


def test_no_continuation_proposes_nothing(impl):
    (rows, p) = propose(drafter(impl), [[1, 2, 3, 4, 5]], k=3, num_draft_tokens=4)
    assert rows == [([], [])]
    assert p.tokens.tolist() == [[-1, -1, -1]] and p.parents.tolist() == [[0, 0, 0]]
    assert p.probs is None


def test_min_match_window_respected(impl):
    # The suffix [7, 3] never occurred; only the 1-gram [3] has a continuation.
    history = [1, 2, 3, 4, 7, 3]
    assert one(drafter(impl, min_match_window=1), history, k=2, num_draft_tokens=3) == ([4, 7], [0, 1])
    assert one(drafter(impl, min_match_window=2), history, k=2, num_draft_tokens=3) == ([], [])


# (2) across requests ------------------------------------------------------------------------


def test_request_b_drafts_what_request_a_said(impl):
    d = drafter(impl)
    assert one(d, [10, 5, 6, 7, 8, 9, 11], k=3, num_draft_tokens=4, rid="A") == ([], [])
    assert one(d, [20, 21, 5, 6], k=3, num_draft_tokens=4, rid="B") == ([7, 8, 9], [0, 1, 2])
    # B alone never said it: a fresh trie has nothing.
    assert one(drafter(impl), [20, 21, 5, 6], k=3, num_draft_tokens=4, rid="B") == ([], [])


def test_one_batch_inserts_every_request_before_matching(impl):
    # request_ids empty: the batch index names the request. Row 1 copies row 0 of the same call;
    # row 0's own history has no repeat, so it proposes nothing, padded with -1 / parent 0.
    (rows, p) = propose(drafter(impl), [[10, 5, 6, 7, 8], [30, 5, 6]], k=3, num_draft_tokens=4)
    assert rows == [([], []), ([7, 8], [0, 1])]
    assert p.tokens.tolist() == [[-1, -1, -1], [7, 8, -1]]
    assert p.parents.tolist() == [[0, 0, 0], [0, 1, 0]]
    assert p.num_tokens.tolist() == [0, 2]
    assert p.tokens.dtype == p.parents.dtype == p.num_tokens.dtype == torch.int64


# (3) branching ------------------------------------------------------------------------------


def test_siblings_ordered_by_count(impl):
    # After [1, 2]: 4 twice, 3 once (3 is the more recent one only in the second history).
    d = drafter(impl, max_trie_depth=4, min_match_window=2, max_match_window=3, min_bfs_breadth=2, max_bfs_breadth=2)
    assert one(d, [1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2], k=1, num_draft_tokens=3) == ([4, 3], [0, 0])
    d = drafter(impl, max_trie_depth=4, min_match_window=2, max_match_window=3, min_bfs_breadth=2, max_bfs_breadth=2)
    assert one(d, [1, 2, 4, 1, 2, 4, 1, 2, 3, 1, 2], k=1, num_draft_tokens=3) == ([4, 3], [0, 0])


def test_equal_counts_ordered_by_recency(impl):
    d = drafter(impl, max_trie_depth=4, min_match_window=2, max_match_window=3, min_bfs_breadth=2, max_bfs_breadth=2)
    assert one(d, [1, 2, 3, 1, 2, 4, 1, 2], k=1, num_draft_tokens=3) == ([4, 3], [0, 0])
    d = drafter(impl, max_trie_depth=4, min_match_window=2, max_match_window=3, min_bfs_breadth=2, max_bfs_breadth=2)
    assert one(d, [1, 2, 4, 1, 2, 3, 1, 2], k=1, num_draft_tokens=3) == ([3, 4], [0, 0])


@pytest.mark.parametrize("fanout", [7, 300])  # ranked_children sorts up to 256 children, uses a heap beyond
def test_ranked_children_match_a_full_sort(fanout):
    """Against sorting every child by (count desc, last touch desc), for every width, with
    many equal counts; seed 0."""
    from specbench.drafters.ngram_trie import NgramTrie

    rng = random.Random(0)
    trie = NgramTrie(capacity=100_000, max_depth=2)
    followers = list(range(1, fanout + 1)) + [rng.randrange(1, fanout + 1) for _ in range(3 * fanout)]
    rng.shuffle(followers)
    text = [t for x in followers for t in (0, x)]  # bigrams (0, x): counts 1 to about 9, many ties
    trie.insert(text, 0)
    kids = list(trie.children(trie.find([0])).values())
    assert len(kids) == fanout and len({trie.node_count(c) for c in kids}) > 3
    full = sorted(kids, key=lambda c: (-trie.node_count(c), -trie._stamp[c]))
    for width in (1, 2, 9, fanout - 1, fanout, fanout + 5):
        assert trie.ranked_children(trie.find([0]), width) == full[:width]


def test_two_level_tree_laid_out_level_by_level(impl):
    # After [1, 2]: 4 (twice) then 3; after [1, 2, 4]: 7 (more recent) then 6; after [1, 2, 3]: 5.
    d = drafter(impl, max_trie_depth=4, min_match_window=2, max_match_window=3, min_bfs_breadth=2, max_bfs_breadth=2)
    history = [1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 4, 7, 1, 2]
    assert one(d, history, k=2, num_draft_tokens=6) == ([4, 3, 7, 6, 5], [0, 0, 1, 1, 2])
    # Fewer nodes: the walk is breadth-first, so the last one drafted (5) goes first.
    assert one(d, history, k=2, num_draft_tokens=5) == ([4, 3, 7, 6], [0, 0, 1, 1])
    assert one(d, history, k=1, num_draft_tokens=6) == ([4, 3], [0, 0])


def test_longer_window_first_then_merged_level_by_level(impl):
    # breadth(1) = 2, breadth(2+) = 1. The window [7, 3] drafts 1 -> 2 first; the window [3]
    # then adds 4 (after [3]: 4 twice, 1 once) as the root's second child, reuses 1, and
    # hangs 7 (after [3, 4]: 8 and 7 once each, 7 more recent) under 4. Drafted in the order
    # 1 2 4 7, laid out level by level as 1 4 | 2 7.
    d = drafter(impl, max_trie_depth=4, min_match_window=1, max_match_window=2, min_bfs_breadth=1, max_bfs_breadth=3)
    history = [7, 3, 1, 2, 8, 3, 4, 8, 3, 4, 7, 3]
    assert one(d, history, k=2, num_draft_tokens=11) == ([1, 4, 2, 7], [0, 0, 1, 2])
    assert one(d, history, k=2, num_draft_tokens=3) == ([1, 2], [0, 1])


# (4) node, depth and breadth bounds --------------------------------------------------------


def test_breadth_follows_sglang_rule(impl):
    # (max_bfs - min_bfs) / (max_match - min_match + 1) = 3 / 3 = 1 per trie level:
    # depth 1 keeps 3 children, depth 2 keeps 2, depth 3 and deeper keep 1.
    d = drafter(impl, max_trie_depth=5, min_match_window=1, max_match_window=3, min_bfs_breadth=1, max_bfs_breadth=4)
    assert [d.breadth(depth) for depth in range(1, 6)] == [3, 2, 1, 1, 1]
    # SGLang defaults: 1 + 9 * (12 - depth) / 12, floored.
    assert [NgramTrieDrafter().breadth(depth) for depth in (1, 2, 5, 11, 12, 18)] == [9, 8, 6, 1, 1, 1]
    # Equal bounds: a constant breadth.
    assert {drafter(impl, min_bfs_breadth=3, max_bfs_breadth=3).breadth(depth) for depth in range(1, 7)} == {3}


def test_breadth_depth_and_node_bounds(impl):
    # Only the 1-gram [9] has continuations: 1 2 3 4 5, all once, 5 the most recent. Depth 1
    # keeps 3 of them (5 4 3), depth 2 keeps 2 (each has one: 9), depth 3+ keeps 1.
    history = [9, 1, 9, 2, 9, 3, 9, 4, 9, 5, 9]
    d = drafter(impl, max_trie_depth=5, min_match_window=1, max_match_window=3, min_bfs_breadth=1, max_bfs_breadth=4)
    assert one(d, history, k=1, num_draft_tokens=11) == ([5, 4, 3], [0, 0, 0])
    assert one(d, history, k=2, num_draft_tokens=11) == ([5, 4, 3, 9, 9, 9], [0, 0, 0, 1, 2, 3])
    assert one(d, history, k=4, num_draft_tokens=11) == (
        [5, 4, 3, 9, 9, 9, 5, 4, 9, 9], [0, 0, 0, 1, 2, 3, 5, 6, 7, 8])
    assert one(d, history, k=4, num_draft_tokens=5) == ([5, 4, 3, 9], [0, 0, 0, 1])
    # num_draft_tokens None: k * topk + 1 nodes, the root included.
    (rows, p) = propose(d, [history], k=4, num_draft_tokens=None)
    assert p.tokens.shape == (1, 4) and rows[0] == ([5, 4, 3, 9], [0, 0, 0, 1])


def test_no_draft_nodes_wanted(impl):
    (rows, p) = propose(drafter(impl), [[1, 2, 1]], k=3, num_draft_tokens=1)
    assert p.tokens.shape == (1, 0) and rows == [([], [])]


# (5) capacity -------------------------------------------------------------------------------


def check_trie(d: NgramTrieDrafter) -> None:
    """Every node is reachable from the root once and knows its parent (the Python trie's
    structure; the compiled one shows only counts and its size, checked by the callers)."""
    if d.impl != "python":
        return
    trie = d.trie
    seen, stack = 0, [trie.root]
    while stack:
        node = stack.pop()
        for token, child in trie.children(node).items():
            assert trie.parent(child) == node and trie.token(child) == token and trie.node_count(child) >= 1
            seen += 1
            stack.append(child)
    assert seen == len(trie)


def test_capacity_evicts_least_recently_used_leaves(impl):
    d = drafter(impl, capacity=12, max_trie_depth=3, max_match_window=2)
    a = list(range(100, 110))  # 10 + 9 + 8 = 27 distinct n-grams of length <= 3
    one(d, a, k=2, num_draft_tokens=3, rid="A")
    assert len(d.trie) == 12
    check_trie(d)
    # The newest n-grams stay, the oldest are gone.
    assert d.trie.count([107, 108, 109]) == 1 and d.trie.count([108, 109]) == 1 and d.trie.count([109]) == 1
    assert d.trie.count([100]) == 0 and d.trie.count([100, 101]) == 0
    assert one(d, [50, 108], k=2, num_draft_tokens=3, rid="B") == ([109], [0])
    assert one(d, [51, 100], k=2, num_draft_tokens=3, rid="C") == ([], [])
    assert len(d.trie) <= 12
    check_trie(d)


def test_capacity_holds_over_many_rounds(impl):
    rng = random.Random(0)
    d = drafter(impl, capacity=40, max_trie_depth=4, max_match_window=3)
    history = [rng.randrange(20) for _ in range(5)]
    for _ in range(60):
        history += [rng.randrange(20) for _ in range(rng.randint(1, 3))]
        one(d, history, k=3, num_draft_tokens=5)
        assert len(d.trie) <= 40
    check_trie(d)
    assert len(d.trie) == 40
    # The last 4-gram was just inserted: it survives, so its first 3 tokens have a continuation.
    assert d.trie.count(history[-4:]) >= 1
    tokens, _ = one(d, history[-4:-1], k=1, num_draft_tokens=2, rid="probe")
    assert len(tokens) == 1


# counts and request tracking ----------------------------------------------------------------


def brute_count(text: list[int], ngram: list[int]) -> int:
    n = len(ngram)
    return sum(text[i : i + n] == ngram for i in range(len(text) - n + 1))


def test_counts_are_occurrences_whether_inserted_at_once_or_in_steps(impl):
    rng = random.Random(1)
    history = [rng.randrange(3) for _ in range(40)]
    whole, steps = drafter(impl), drafter(impl)
    whole.observe("r", torch.tensor(history))
    t = 1
    while t < len(history):
        steps.observe("r", torch.tensor(history[:t]))
        t += rng.randint(1, 4)
    steps.observe("r", torch.tensor(history))
    for n in range(1, 7):
        for i in range(len(history) - n + 1):
            ngram = history[i : i + n]
            assert whole.trie.count(ngram) == steps.trie.count(ngram) == brute_count(history, ngram), ngram
    assert whole.trie.count(history[:7]) == 0  # longer than max_trie_depth


def test_reused_id_with_a_new_history_starts_over(impl):
    d = drafter(impl)
    d.observe("r", torch.tensor([1, 2, 3]))
    d.observe("r", torch.tensor([1, 2, 3]))  # nothing new: no count
    assert d.trie.count([1, 2]) == 1
    d.observe("r", torch.tensor([1, 2, 3, 1, 2]))  # an extension: only the tail counts
    assert d.trie.count([1, 2]) == 2 and d.trie.count([2, 3]) == 1
    d.observe("r", torch.tensor([1, 2]))  # not an extension: a new request said [1, 2] again
    assert d.trie.count([1, 2]) == 3 and d.trie.count([2, 3]) == 1


def test_a_released_request_keeps_its_ngrams_and_drops_its_tracking(impl):
    """release forgets what a finished request inserted (its history copy), not its n-grams: a
    later request still drafts from them, and the released id counts afresh if it comes back."""
    d = drafter(impl)
    d.observe("A", torch.tensor([10, 5, 6, 7, 8]))
    d.release(["A", "never seen"])
    assert d._inserted == {}
    assert one(d, [20, 5, 6], k=2, num_draft_tokens=3, rid="B") == ([7, 8], [0, 1])
    d.observe("A", torch.tensor([10, 5, 6, 7, 8]))  # the id reused: inserted again, not skipped
    assert d.trie.count([5, 6, 7]) == 2


def test_the_runner_releases_finished_requests(impl):
    """Through the runner (the BigramEngine stand-in of test_runner), every finished request is
    released: nothing is tracked after the run."""
    from test_runner import BigramEngine

    from specbench.runner import Speculation, decode_requests
    from specbench.sampling import SamplingParams

    d = drafter(impl, max_bfs_breadth=2)
    prompts = [torch.tensor([0, 5, 6, 5, 6, 5]), torch.tensor([0, 7, 7, 7]), torch.tensor([0, 3, 4, 3])]
    decode_requests(BigramEngine(rows=2), prompts, params=SamplingParams(0.0), max_new_tokens=6,
                    eos_ids=frozenset(), generator=torch.Generator(), spec=Speculation(d, "standard", 3, {}, 2, 5))
    assert d._inserted == {} and len(d.trie) > 0


def test_caller_reusing_its_buffer_does_not_confuse_tracking(impl):
    # The runner passes views of one buffer: what was inserted must be copied, not aliased.
    buf = torch.tensor([1, 2, 3, 4, 0, 0])
    d = drafter(impl)
    d.observe("r", buf[:4])
    buf[4:] = torch.tensor([1, 2])
    d.observe("r", buf[:6])  # an extension
    assert d.trie.count([1, 2]) == 2 and d.trie.count([4, 1, 2]) == 1
    buf[:] = torch.tensor([5, 6, 7, 8, 9, 5])
    d.observe("r", buf)  # the same id, overwritten: a new history, inserted whole
    assert d.trie.count([5, 6]) == 1 and d.trie.count([9, 5]) == 1 and d.trie.count([5]) == 2


# (6) every proposal is a valid tree of real continuations ----------------------------------


def occurs(texts: list[list[int]], seq: list[int]) -> bool:
    return any(brute_count(text, seq) for text in texts)


@pytest.mark.parametrize("capacity", [10_000, 30])
def test_random_proposals_are_valid_trees(capacity, impl):
    rng = random.Random(capacity)
    d = drafter(impl, capacity=capacity, max_trie_depth=5, min_match_window=1, max_match_window=3,
                min_bfs_breadth=1, max_bfs_breadth=4)
    histories = {rid: [rng.randrange(6) for _ in range(rng.randint(1, 6))] for rid in "abc"}
    texts = list(histories.values())  # every history ever inserted (a restart adds one)
    nonempty = 0
    for step in range(40):
        for rid in histories:
            histories[rid] += [rng.randrange(6) for _ in range(rng.randint(1, 3))]
        if step == 20:  # reuse an id for a new prompt
            histories["b"] = [rng.randrange(6) for _ in range(4)]
            texts.append(histories["b"])
        k, N = rng.randint(1, 4), rng.randint(2, 9)
        ids = list(histories)
        rows, p = propose(d, [histories[r] for r in ids], k=k, num_draft_tokens=N, ids=ids)
        assert p.tokens.shape == p.parents.shape == (3, N - 1)
        for b, (tokens, parents) in enumerate(rows):
            n = len(tokens)
            nonempty += n > 0
            assert (p.tokens[b, n:] == -1).all() and (p.parents[b, n:] == 0).all()
            tree = compile_tree(with_root(torch.tensor(parents, dtype=torch.int64)))
            assert int(tree.depth.max()) <= k
            full = [histories[ids[b]][-1]] + tokens  # tree node i's token
            for node in range(n + 1):
                kids = [full[c] for c in tree.children(node)]
                assert len(kids) == len(set(kids)), "siblings must differ"
            for node in range(1, n + 1):  # root ... node is a stretch of something said
                path, at = [], node
                while at >= 0:
                    path.append(full[at])
                    at = int(tree.parents[at])
                assert occurs(texts, path[::-1]), path[::-1]
        assert len(d.trie) <= capacity
    assert nonempty > 20  # the check above ran on real trees


def growing_rounds(rng: random.Random, drafters, rounds: int = 60):
    """Each round's histories {id: tokens} of 5 requests over 12 tokens, growing by 1 to 4
    tokens a round; id 1 starts over at round 25, id 2 is released by every drafter and reused
    at round 40."""
    histories = {rid: [rng.randrange(12) for _ in range(rng.randint(1, 9))] for rid in range(5)}
    for step in range(rounds):
        for rid in histories:
            histories[rid] += [rng.randrange(12) for _ in range(rng.randint(1, 4))]
        if step == 25:
            histories[1] = [rng.randrange(12) for _ in range(5)]  # the id starts over
        if step == 40:
            for d in drafters:
                d.release([2])
            histories[2] = [rng.randrange(12) for _ in range(3)]
        yield histories


@pytest.mark.parametrize("capacity", [10_000, 400])
def test_known_paths_leave_the_trie_as_walking_every_path_does(capacity):
    """NgramTrie.insert with the previous insert's node lists (`known`, kept per request by the
    drafter) against the same drafter walking every path (known dropped): token, parent, count,
    stamp and children of every node, the clock, and the proposals are equal after each of 60
    rounds of 5 requests growing by 1 to 4 tokens (one id restarting, one released and reused).
    Capacity 400 starts the LRU list partway, from where every path is walked."""
    fast = drafter(capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    slow = drafter(capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    walk = type(slow.trie).insert
    slow.trie.insert = lambda tokens, first_new, known=None: walk(slow.trie, tokens, first_new)
    used_known = 0
    for histories in growing_rounds(random.Random(capacity), (fast, slow)):
        used_known += len(fast._paths)
        ids = list(histories)
        got = propose(fast, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        want = propose(slow, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        assert got == want
        a, b = fast.trie, slow.trie
        assert (a._token, a._parent, a._count, a._stamp, a._children, a._clock, len(a)) == \
               (b._token, b._parent, b._count, b._stamp, b._children, b._clock, len(b))
    assert used_known > (250 if capacity == 10_000 else 20), used_known  # the fast drafter used its node lists
    assert fast.trie.evicting == (capacity == 400)


@pytest.mark.parametrize("capacity", [10_000, 400])
def test_window_nodes_from_the_insert_draft_what_finding_them_drafts(capacity):
    """The drafter takes each window's trie node from its insert's growing paths
    (window_nodes); the same drafter finding every window from the root proposes the same trees
    over 60 rounds of 5 requests (one id restarting, one released and reused). Every window
    node given is find's node. With capacity 400 the LRU list starts partway and the windows
    are found from the root from then on."""
    fast = drafter(capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    slow = drafter(capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    slow.window_nodes = lambda request_id: None
    given = 0
    for histories in growing_rounds(random.Random(capacity + 1), (fast, slow)):
        ids = list(histories)
        got = propose(fast, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        want = propose(slow, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        assert got == want
        for rid in ids:
            windows = fast.window_nodes(rid)
            if windows is not None:
                given += 1
                assert windows == [fast.trie.find(histories[rid][-n:]) for n in range(1, len(windows) + 1)]
                assert len(windows) >= min(len(histories[rid]), fast.max_match_window)
    assert given > (250 if capacity == 10_000 else 20), given
    assert fast.trie.evicting == (capacity == 400)


# (7) configuration --------------------------------------------------------------------------


def test_from_config_uses_sglang_defaults():
    d = NgramTrieDrafter.from_config(NgramTrieConfig())
    assert d.name == "ngram_trie" and d.feature_layers == ()
    assert (d.trie.capacity, d.trie.max_depth, d.min_match_window, d.max_match_window) == (10_000_000, 18, 1, 12)
    assert (d.min_bfs_breadth, d.max_bfs_breadth) == (1, 10)


@pytest.mark.parametrize(
    "key, value",
    [
        ("max_trie_depth", 1),
        ("min_match_window", 0),
        ("max_match_window", 0),  # below min_match_window
        ("max_match_window", 6),  # not below max_trie_depth
        ("min_bfs_breadth", 0),
        ("max_bfs_breadth", 0),  # below min_bfs_breadth
        ("capacity", 5),  # a path of max_trie_depth nodes must fit
        ("impl", "triton"),  # ngram's impls are not the trie's
    ],
)
def test_bad_config_names_the_key(key, value):
    cfg = NgramTrieConfig(capacity=100, max_trie_depth=6, min_match_window=1, max_match_window=4,
                          min_bfs_breadth=1, max_bfs_breadth=2)
    setattr(cfg, key, value)
    with pytest.raises(ConfigError) as err:
        NgramTrieDrafter.from_config(cfg)
    assert err.value.key == f"drafter.{key}" and err.value.value == value


# (8) frozen proposals -------------------------------------------------------------------------
# tests/fixtures/ngram_trie_proposals.json holds the proposals of the implementation before the
# flat-list trie (per-node objects, a global LRU list kept on every touch), recorded over
# FROZEN_CASES; the current one must propose exactly the same trees, in the same order.

FROZEN = Path(__file__).parent / "fixtures" / "ngram_trie_proposals.json"
FROZEN_CASES = {  # name: (drafter params, batch, rounds, k, num_draft_tokens, seed)
    "defaults": (dict(), 6, 30, 4, None, 0),
    "bushy": (dict(capacity=10_000, max_trie_depth=8, max_match_window=5, max_bfs_breadth=5), 5, 30, 3, 10, 1),
    "evicting": (dict(capacity=300, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3), 5, 30, 3, 8, 2),
}


def frozen_workload(batch: int, rounds: int, seed: int):
    """Histories growing by 1-3 tokens a round, from a small vocabulary with shared phrases."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(40) for _ in range(rng.randint(3, 8))] for _ in range(12)]
    histories = []
    for _ in range(batch):
        h: list[int] = []
        while len(h) < rng.randint(20, 60):
            h += rng.choice(phrases) if rng.random() < 0.6 else [rng.randrange(40)]
        histories.append(h)
    for _ in range(rounds):
        yield [list(h) for h in histories]
        for h in histories:
            for _ in range(rng.randint(1, 3)):
                h += rng.choice(phrases)[:1] if rng.random() < 0.3 else [rng.randrange(40)]


def frozen_proposals(params: dict, batch: int, rounds: int, k: int, num_draft_tokens, seed: int,
                     impl: str = "python") -> list:
    d = NgramTrieDrafter(**params, impl=impl)
    out = []
    for histories in frozen_workload(batch, rounds, seed):
        rows, _ = propose(d, histories, k=k, num_draft_tokens=num_draft_tokens, ids=range(batch))
        out.append([[tokens, parents] for tokens, parents in rows])
    return out


@pytest.mark.parametrize("name", sorted(FROZEN_CASES))
def test_proposals_match_the_frozen_fixture(name, impl):
    expected = json.loads(FROZEN.read_text())[name]
    got = frozen_proposals(*FROZEN_CASES[name], impl=impl)
    assert got == expected
    assert sum(len(tokens) for rnd in got for tokens, _ in rnd) > 50  # real trees were compared


def test_level_order_against_a_breadth_first_walk():
    """_level_order (with its shortcut for creation orders that are already breadth-first) against
    a plain breadth-first renumbering, on 500 random trees (seed 0), half of them drafted level
    by level (non-decreasing parents) as one window's walk drafts them."""
    from collections import deque

    from specbench.drafters.ngram_trie import _level_order

    rng = random.Random(0)
    shortcut = 0
    for trial in range(500):
        m = rng.randint(1, 9)
        parents = [rng.randrange(i) for i in range(1, m + 1)]  # creation node i's parent, < i
        if trial % 2:
            parents.sort()
        drafted = [(100 + i, p) for i, p in enumerate(parents, start=1)]
        order, queue = [], deque([0])  # creation nodes, breadth-first, siblings in creation order
        while queue:
            kids = [c for c in range(1, m + 1) if parents[c - 1] == queue[0]]
            queue.popleft()
            order += kids
            queue.extend(kids)
        new = {0: 0, **{c: i for i, c in enumerate(order, start=1)}}
        want = ([100 + c for c in order], [new[parents[c - 1]] for c in order])
        assert _level_order(drafted) == want, drafted
        shortcut += order == list(range(1, m + 1))
    assert shortcut >= 250  # the sorted half takes the shortcut


def test_trie_bench_runs_variants_side_by_side(tmp_path):
    """experiments/trie_bench.py at a tiny size, with the drafter as it is at HEAD loaded from git:
    every variant timed in every block, all proposing the same trees; a revision git does not know
    is a one-line error before anything is written."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = [sys.executable, str(root / "experiments" / "trie_bench.py")]
    out = subprocess.run(script + [str(tmp_path / "ok"), "--batches", "2", "--rounds", "2", "--blocks", "3",
                                   "--variants", "find,native", "--against", "HEAD"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads((tmp_path / "ok" / "trie_bench.json").read_text())
    (result,) = record["results"]
    assert list(result["ms"]) == ["known", "find", "native", "@HEAD"] and result["trie_nodes"] > 0
    assert result["same_trees"] and all(len(ms) == 3 and min(ms) > 0 for ms in result["ms"].values())
    assert {"git_sha", "date", "torch_version", "against"} <= set(record)
    bad = subprocess.run(script + [str(tmp_path / "bad"), "--against", "no-such-revision"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert bad.returncode == 2 and "--against" in bad.stderr.splitlines()[-1] and not (tmp_path / "bad").exists()


# (9) the compiled trie ------------------------------------------------------------------------


def test_the_compiled_trie_builds_into_the_cache_and_says_why_when_it_cannot(tmp_path, monkeypatch):
    """ngram_trie.cpp is built with the host's C++ compiler into $SPECBENCH_CACHE/build and
    loaded; a compiler that fails gives the reason, which impl=native turns into a one-line
    ConfigError and impl=auto into the Python trie."""
    from specbench.drafters import ngram_trie

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    library = ngram_trie._compiled.__wrapped__()
    assert hasattr(library, "trie_draft"), library
    assert len(list((tmp_path / "cache" / "build").glob("ngram_trie-*.so"))) == 1

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    reason = ngram_trie._compiled.__wrapped__()
    assert isinstance(reason, str) and "no-such-compiler" in reason and "\n" not in reason
    assert not list((tmp_path / "empty").rglob("*.so"))
    monkeypatch.setattr(ngram_trie, "_compiled", lambda: reason)
    with pytest.raises(ConfigError) as err:
        drafter("native")
    assert err.value.key == "drafter.impl" and err.value.value == "native" and "no-such-compiler" in str(err.value)
    assert drafter("auto").impl == "python" and drafter("auto").trie.count([1]) == 0


def test_auto_picks_the_compiled_trie_where_it_builds():
    d = NgramTrieDrafter.from_config(NgramTrieConfig())
    assert NgramTrieConfig().impl == "auto" and d.impl == "native"


@pytest.mark.parametrize("capacity", [10_000, 400, 40])
def test_compiled_trie_drafts_what_the_python_trie_drafts(capacity):
    """Both tries over 60 rounds of 5 requests (one id restarting, one released and reused),
    the compiled one from its kept paths and, on the same trie, every window found from the
    root (draft() with no slot): the same trees every round, the same counts for every n-gram
    of every history, and every node of the compiled trie found through its edge map.
    Capacity 400 evicts from partway, 40 nearly every path (seed: the capacity)."""
    native = drafter("native", capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    python = drafter("python", capacity=capacity, max_trie_depth=6, max_match_window=4, max_bfs_breadth=3)
    nonempty = 0
    for histories in growing_rounds(random.Random(capacity), (native, python)):
        ids = list(histories)
        got = propose(native, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        assert got == propose(python, [histories[r] for r in ids], k=3, num_draft_tokens=6, ids=ids)[0]
        assert got == [native.draft(histories[r][-4:], 3, 5) for r in ids]  # windows found from the root
        nonempty += sum(len(tokens) > 0 for tokens, _ in got)
        for h in histories.values():
            for n in range(1, 7):
                for i in range(len(h) - n + 1):
                    assert native.trie.count(h[i : i + n]) == python.trie.count(h[i : i + n])
        assert len(native.trie) == len(python.trie) and native.trie.check() == 0
    assert nonempty > (100 if capacity > 40 else 20) and python.trie.evicting == (capacity <= 400)
