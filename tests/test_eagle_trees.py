"""Batched EAGLE-2 trees over EAGLE / EAGLE-3 heads (EagleChain.propose_tree) against the
per-request path (expand.draft over one EagleStepper per request)."""

import pytest
import torch

from conftest import random_head, tiny_llama
from tree_rounds import assert_same, chain_state, grow, tree_state
from specbench.drafters import eagle_chain, expand
from specbench.drafters.eagle import EagleDrafter, EagleStepper
from specbench.drafters.eagle_chain import EagleChain
from specbench.drafters.expand import Steppers, draft
from specbench.heads import save_head
from specbench.sampling import SamplingParams

GREEDY = SamplingParams(0.0, 0, 1.0)
KINDS = ("eagle", "eagle3")
TREES = [(3, 2, 6), (4, 3, 10), (2, 4, 5), (5, 4, 8), (1, 3, 3)]  # (k, topk, max_nodes)
SIZINGS = [{}, {"rows": 1, "max_length": 8}]  # the defaults; too small: the cache grows mid-run
VD = 40  # EAGLE-3's draft vocabulary (of the target's 96 tokens)
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=1, scale=4.0).requires_grad_(False)


@pytest.fixture(scope="module")
def heads(target):
    heads = {kind: random_head(target, kind, VD) for kind in KINDS}
    assert bool(heads["eagle3"].d2t.ne(0).any())  # EAGLE-3's draft vocabulary is not the identity map
    return heads


@pytest.fixture
def forwards(monkeypatch):
    """Every batched head forward of EagleChain: (input_ids' shape, whether it ran tree inputs)."""
    calls = []
    real = eagle_chain.forward_rows

    def counted(head, features, input_ids, cache, starts, rows=None, positions=None, mask=None):
        calls.append((tuple(input_ids.shape), positions is not None))
        return real(head, features, input_ids, cache, starts, rows, positions, mask)

    monkeypatch.setattr(eagle_chain, "forward_rows", counted)
    return calls


def check_rows(chain, histories, order):
    """After a tree round a row holds exactly its request's pairs, and its length is there: the
    tree entries past it are not kept."""
    for i in order:
        row = chain.row_of[i]
        assert chain.held[row].tolist() == histories[i][1:].tolist()
        assert int(chain.cache.lengths[row]) == len(histories[i]) - 1


def depths_of(proposal, b):
    """The depths of request b's tree nodes (1 for the root's children)."""
    depths = []
    for column in range(int(proposal.num_tokens[b])):
        parent = int(proposal.parents[b, column])
        depths.append(1 if parent == 0 else depths[parent - 1] + 1)
    return depths


@pytest.mark.parametrize("sizing", SIZINGS)
@pytest.mark.parametrize("shape", TREES)
@pytest.mark.parametrize("kind", KINDS)
def test_batched_eagle_trees_propose_what_the_per_request_path_proposes(kind, shape, sizing, target, heads, forwards):
    """Three requests of different lengths over six rounds (a fully rejected tree, an accepted
    deep branch, a round of one request while the others' rows idle, a history cut back past the
    pairs its row holds, a request released and its id reused by a new history, a new id taking
    a freed row): the batched trees equal expand.draft
    over one EagleStepper per request; a known row reads only the pairs it gained; each round is
    one sync over every cache row and k - 1 tree forwards of topk nodes per row."""
    k, topk, max_nodes = shape
    head = heads[kind]
    chain = EagleChain(head, **sizing)
    steppers = Steppers(lambda: EagleStepper(head))
    histories = {7: torch.tensor([0, 5, 6, 7, 5, 6]), 3: torch.tensor([0, 9]),
                 11: torch.tensor([0, 3, 4, 3, 4, 3, 9, 10, 11, 12])}

    def propose(order):
        forwards.clear()
        state = tree_state(target, head, histories, order, k, topk, max_nodes)
        got = chain.propose_tree(state)
        assert_same(got, draft(steppers, state, "greedy", GREEDY, None))
        assert got.num_tokens.tolist() == [min(max_nodes, topk + (k - 1) * topk * topk)] * len(order)
        if k > 1:  # some node of each tree hangs below the root's children
            assert all(max(depths_of(got, b)) > 1 for b in range(len(order)))
        R = chain.cache_rows
        assert forwards[0][0][0] == R and not forwards[0][1]  # one sync over every cache row
        assert forwards[1:] == [((R, topk), True)] * (k - 1)  # k - 1 tree forwards of one frontier each
        check_rows(chain, histories, order)
        return got

    got = propose((7, 3, 11))
    assert chain.last_counts == {i: len(h) - 1 for i, h in histories.items()}  # new rows read every pair
    added = grow(histories, got, (7, 3, 11), {7: -1, 3: None, 11: 0})  # 7: the tree rejected; 3: a deepest leaf
    got = propose((11, 7, 3))
    assert chain.last_counts == added  # accepted + 1 pairs: the tree entries were dropped
    assert chain.last_counts[7] == 1
    propose((11,))  # a round without 7 and 3: their rows (read again next round) are not touched
    assert chain.last_counts == {11: 1}
    held = len(histories[11]) - 1  # the pairs 11's row holds
    added = grow(histories, got, (11, 7, 3), {11: None, 7: 1, 3: -1})
    histories[11] = histories[11][: held - 1]  # lost pairs its row holds: rolled back, the last read again
    got = propose((3, 11, 7))
    assert chain.last_counts == {3: 1, 11: 1, 7: added[7]}
    chain.release([3, 99])  # 3 finished; 99 was never seen
    steppers.release([3, 99])
    assert set(chain.row_of) == {7, 11}
    grow(histories, got, (3, 11, 7), {3: 0, 11: -1, 7: None})
    histories[3] = torch.tensor([0, 9, 10, 11, 30, 31])  # id 3 again: a new request, same prefix
    got = propose((11, 3, 7))
    assert chain.last_counts[3] == len(histories[3]) - 1  # a clean row: every pair read again
    grow(histories, got, (11, 3, 7), {11: 2, 3: -1, 7: 0})
    chain.release([7])
    steppers.release([7])
    del histories[7]
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new id, in 7's row
    propose((12, 11, 3))
    assert set(chain.row_of) == {3, 11, 12}
    if sizing:  # grown, and no node was a clamped write past the rows' capacity
        assert chain.cache_rows >= 3
        assert chain.max_length >= max(len(h) for h in histories.values()) - 1 + (k - 1) * topk


@pytest.mark.parametrize("first", ["chain", "tree"])
@pytest.mark.parametrize("kind", KINDS)
def test_chains_and_trees_share_the_rows(kind, first, target, heads, forwards):
    """Chain and tree rounds alternating on one EagleChain (a row holds its synced pairs and k - 1
    drafted ones after a chain, its synced pairs after a tree) stay equal to the per-request path."""
    head = heads[kind]
    chain = EagleChain(head, rows=2, max_length=16)
    steppers = Steppers(lambda: EagleStepper(head))
    histories = {1: torch.tensor([0, 5, 6, 7]), 2: torch.tensor([0, 9, 10, 11, 12, 13])}
    kinds = ["chain", "tree", "chain", "tree", "tree", "chain"]
    if first == "tree":
        kinds = kinds[1:] + kinds[:1]
    order = (1, 2)
    for kind_of_round in kinds:
        if kind_of_round == "chain":
            k = 4
            state = chain_state(target, head, histories, order, k)
            got = chain.propose(state, "greedy", GREEDY, None)
            want = draft(steppers, state, "greedy", GREEDY, None)
            assert got.is_chain and got.tokens.tolist() == want.tokens.tolist()
            for i in order:
                assert int(chain.cache.lengths[chain.row_of[i]]) == len(histories[i]) - 1 + k - 1
        else:
            state = tree_state(target, head, histories, order, 3, 3, 7)
            got = chain.propose_tree(state)
            assert_same(got, draft(steppers, state, "greedy", GREEDY, None))
            check_rows(chain, histories, order)
        # one request takes part of its drafts, the other none (its row rolls back)
        grow(histories, got, order, {order[0]: 1, order[1]: -1})
        order = order[::-1]
    assert any(tree for _, tree in forwards) and any(not tree for shape, tree in forwards if shape[1] == 1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_tree_round_makes_room_for_every_node_it_feeds(kind, target, heads, forwards):
    """The last step writes its frontier (k - 1) topk slots past the synced pairs: a cache sized
    for less grows to hold every node (none is a clamped write), and the tree is still the
    per-request one."""
    k, topk, max_nodes = 4, 4, 10
    head = heads[kind]
    chain = EagleChain(head, rows=1, max_length=8)
    histories = {0: torch.tensor([0, 5, 6, 7, 5, 6])}
    state = tree_state(target, head, histories, (0,), k, topk, max_nodes)
    got = chain.propose_tree(state)
    assert chain.cache.capacity > 9  # grown
    assert chain.max_length >= 5 + (k - 1) * topk  # slots 0 .. 4 + 12 real, the last one spare
    assert forwards[-1] == ((1, topk), True)
    assert_same(got, draft(Steppers(lambda: EagleStepper(head)), state, "greedy", GREEDY, None))


@pytest.mark.parametrize("kind", KINDS)
def test_tree_nodes_see_their_ancestors_only(kind, target, heads):
    """Every node's distribution in the batched feed is what a fresh EagleStepper gives after
    reading the request's pairs and then, one by one, the node's path from the root (its
    ancestors and itself, as a chain): no node sees a sibling's or a cousin's entries."""
    head = heads[kind]
    k, topk = 3, 3
    chain = EagleChain(head, rows=3, max_length=32)
    histories = {0: torch.tensor([0, 5, 6, 7, 5, 6]), 1: torch.tensor([0, 9, 10])}
    state = tree_state(target, head, histories, (0, 1), k, topk, 1 + k * topk * topk)
    fed = []  # per step: the frontier's tokens [B, W], parents [B, W] and logits [B, W, V]
    real = expand.expand_trees

    def recording(logits, state, feed):
        def recorded(tokens, parents):
            out = feed(tokens, parents)
            fed.append((tokens.clone(), parents.clone(), out.clone()))
            return out
        return real(logits, state, recorded)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eagle_chain, "expand_trees", recording)
        chain.propose_tree(state)
    assert len(fed) == k - 1
    with torch.inference_mode():
        for b, i in enumerate((0, 1)):
            # each frontier node's path: its parent's path plus its token
            paths = [[]] * topk
            for tokens, parents, logits in fed:
                paths = [paths[int(parents[b, j])] + [int(tokens[b, j])] for j in range(topk)]
                assert len({tuple(p) for p in paths}) == topk  # distinct nodes
                for j, path in enumerate(paths):
                    stepper = EagleStepper(head)
                    out = stepper.sync(histories[i], state.features[b])
                    for token in path:
                        out = stepper.feed(torch.tensor([token]))
                    finite = torch.isfinite(out[0])
                    assert torch.equal(finite, torch.isfinite(logits[b, j]))
                    # fp32 noise only: this random EAGLE head moves some logits by ~5e-4 for a
                    # 1e-6 relative change of its input feature; a wrong entry moves them by ~1
                    scale = float(out[0][finite].abs().max())
                    torch.testing.assert_close(logits[b, j][finite], out[0][finite], atol=5e-4 * scale, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_drafter_proposes_trees_through_its_batched_chain(kind, target, heads, tmp_path, monkeypatch, forwards):
    """EagleDrafter.propose (ChainsAndTrees) sends trees to EagleChain.propose_tree: no
    per-request stepper is made and expand.draft is not called; the trees equal the per-request
    path over the drafter's own head; chains stay batched too, and release frees the rows."""
    drafter = EagleDrafter(kind, str(save_head(heads[kind], tmp_path)), "greedy", GREEDY)
    drafter.attach(target)
    reference = Steppers(lambda: EagleStepper(drafter.head))  # made before the stepper class is patched
    monkeypatch.setattr(expand, "draft", lambda *a, **kw: pytest.fail("drafted request by request"))

    class NoStepper:
        def __init__(self, *a):
            pytest.fail("a per-request EagleStepper was made")

    monkeypatch.setattr("specbench.drafters.eagle.EagleStepper", NoStepper)
    histories = {4: torch.tensor([0, 5, 6, 7, 5, 6]), 8: torch.tensor([0, 3, 4])}
    for _ in range(2):
        state = tree_state(target, drafter.head, histories, (4, 8), 3, 2, 5)
        got = drafter.propose(state)
        assert_same(got, draft(reference, state, "greedy", GREEDY, None))  # the module's own draft, unpatched
        grow(histories, got, (4, 8), {4: None, 8: -1})
    assert [tree for _, tree in forwards] == [False, True, True] * 2
    state = chain_state(target, drafter.head, histories, (4, 8), 3)
    got = drafter.propose(state)
    assert got.is_chain and got.tokens.tolist() == draft(reference, state, "greedy", GREEDY, None).tokens.tolist()
    assert len(drafter.steppers) == 0 and set(drafter.chain.row_of) == {4, 8}
    drafter.release([4])
    assert set(drafter.chain.row_of) == {8}
