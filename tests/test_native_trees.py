"""Batched EAGLE-2 trees on the native engine (NativeChain.propose_tree) against the per-request
path (expand.draft over one LMStepper per request)."""

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from conftest import tiny_llama
from tree_rounds import assert_same, grow
from specbench.drafters import expand
from specbench.drafters.base import DraftState
from specbench.drafters.draft_model import DraftModelDrafter, save_draft_model
from specbench.drafters.expand import Steppers, draft, expand_trees
from specbench.drafters.layerskip import LayerSkipDrafter
from specbench.drafters.lm_stepper import LMStepper
from specbench.drafters.native_chain import NativeChain
from specbench.engines.native import NativeEngine, Transformer
from specbench.sampling import SamplingParams
from specbench.tree import select_nodes

GREEDY = SamplingParams(0.0, 0, 1.0)
TREES = [(3, 2, 6), (4, 3, 10), (2, 4, 5), (5, 4, 8), (1, 3, 3)]  # (k, topk, max_nodes)
SIZINGS = [{}, {"rows": 1, "max_length": 8}]  # the defaults; too small: the cache grows mid-run


@pytest.fixture(scope="module")
def draft_lm():
    """A tiny random fp32 Llama whose top-k children are well separated (scale 8)."""
    return tiny_llama(seed=1, scale=8.0)


@pytest.fixture
def forwards(monkeypatch):
    """Every NativeEngine.forward: (q, whether it ran tree inputs)."""
    calls = []

    def counted(self, tokens, depth=None, ancestors=None, _forward=NativeEngine.forward):
        calls.append((tokens.shape[1], depth is not None))
        return _forward(self, tokens, depth, ancestors)

    monkeypatch.setattr(NativeEngine, "forward", counted)
    return calls


def tree_state(histories, ids, k, topk, max_nodes):
    return DraftState(tokens=[histories[i] for i in ids], k=k, topk=topk, num_draft_tokens=max_nodes + 1,
                      request_ids=tuple(ids))


def check_rows(chain, histories, order):
    """After a tree round a row holds exactly its request's history, and its length is there."""
    for i in order:
        row = chain.row_of[i]
        assert chain.held[row].tolist() == histories[i].tolist()
        assert int(chain.engine.lengths[row]) == len(histories[i])


@pytest.mark.parametrize("sizing", SIZINGS)
@pytest.mark.parametrize("shape", TREES)
def test_batched_trees_propose_what_the_per_request_path_proposes(shape, sizing, draft_lm, forwards):
    """Three requests of different lengths over four rounds (a fully rejected tree, an accepted
    deep branch, a history cut back past what the row holds, a request released and its row
    taken by a new id): the batched trees equal expand.draft over one LMStepper per request;
    each round is one sync forward and k - 1 tree forwards of 1 .. k - 1 frontiers."""
    k, topk, max_nodes = shape
    chain = NativeChain(lambda: Transformer.from_hf(draft_lm), cuda_graphs=False, **sizing)
    assert chain.ready()
    steppers = Steppers(lambda: LMStepper(draft_lm))
    histories = {7: torch.tensor([0, 5, 6, 7, 5, 6]), 3: torch.tensor([0, 9]),
                 11: torch.tensor([0, 3, 4, 3, 4, 3, 9, 10, 11, 12])}

    def propose(order):
        forwards.clear()
        state = tree_state(histories, order, k, topk, max_nodes)
        got = chain.propose_tree(state)
        assert_same(got, draft(steppers, state, "greedy", GREEDY, None))
        assert got.num_tokens.tolist() == [min(max_nodes, topk + (k - 1) * topk * topk)] * len(order)
        assert forwards == [(forwards[0][0], False)] + [(s * topk, True) for s in range(1, k)]
        check_rows(chain, histories, order)
        return got

    got = propose((7, 3, 11))
    grow(histories, got, (7, 3, 11), {7: -1, 3: None, 11: 0})
    got = propose((11, 7, 3))
    grow(histories, got, (11, 7, 3), {11: None, 7: 1, 3: -1})
    histories[11] = histories[11][:-4]  # lost tokens its row holds: rolled back, read again
    got = propose((3, 11, 7))
    chain.release([3, 99])  # 3 finished; 99 was never seen
    steppers.release([3, 99])
    grow(histories, got, (3, 11, 7), {3: 0, 11: -1, 7: None})
    del histories[3]
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new request, in 3's row
    propose((12, 11, 7))
    assert set(chain.row_of) == {7, 11, 12}


@pytest.mark.parametrize("first", ["chain", "tree"])
def test_chains_and_trees_share_the_rows(first, draft_lm, forwards):
    """Chain and tree rounds alternating on one NativeChain (the row holds history + k - 1 drafts
    after a chain, the history after a tree) stay equal to the per-request path."""
    chain = NativeChain(lambda: Transformer.from_hf(draft_lm), rows=2, max_length=16, cuda_graphs=False)
    assert chain.ready()
    steppers = Steppers(lambda: LMStepper(draft_lm))
    histories = {1: torch.tensor([0, 5, 6, 7]), 2: torch.tensor([0, 9, 10, 11, 12, 13])}
    kinds = ["chain", "tree", "chain", "tree", "tree", "chain"]
    if first == "tree":
        kinds = kinds[1:] + kinds[:1]
    order = (1, 2)
    for n, kind in enumerate(kinds):
        if kind == "chain":
            state = DraftState(tokens=[histories[i] for i in order], k=4, request_ids=order)
            got = chain.propose(state, "greedy", GREEDY, None)
            want = draft(steppers, state, "greedy", GREEDY, None)
            assert got.is_chain and got.tokens.tolist() == want.tokens.tolist()
            for b, i in enumerate(order):
                assert chain.held[chain.row_of[i]].tolist() == histories[i].tolist() + got.tokens[b, :3].tolist()
        else:
            state = tree_state(histories, order, 3, 3, 7)
            got = chain.propose_tree(state)
            assert_same(got, draft(steppers, state, "greedy", GREEDY, None))
            check_rows(chain, histories, order)
        # one request takes part of its drafts, the other none (its row rolls back)
        grow(histories, got, order, {order[0]: 1, order[1]: -1})
        order = order[::-1]
    assert any(tree for _, tree in forwards) and any(not tree for _, tree in forwards)


class Stepper:
    """An LMStepper that records its selects, for the refactored _tree's path."""

    def __init__(self, model):
        self.inner, self.selects = LMStepper(model), []

    def sync(self, tokens, features=None):
        return self.inner.sync(tokens, features)

    def feed(self, tokens):
        return self.inner.feed(tokens)

    def select(self, rows):
        self.selects.append(rows.tolist())
        self.inner.select(rows)

    def restart(self):
        self.inner.restart()


def reference_tree(stepper, logits, state):
    """expand._tree as it was before expand_trees: one request, the frontier as beam rows."""
    topk = state.topk
    logp = torch.log_softmax(logits.float(), -1)
    scores, tokens = logp[0].topk(topk)
    all_tokens, all_scores = [tokens], [scores]
    all_parents = [torch.full((topk,), -1, dtype=torch.int64)]
    frontier = torch.arange(topk)
    stepper.select(torch.zeros(topk, dtype=torch.int64))
    for _ in range(state.k - 1):
        logp = torch.log_softmax(stepper.feed(tokens).float(), -1)
        child_logp, child_tokens = logp.topk(topk, dim=-1)
        child_scores = (scores[:, None] + child_logp).flatten()
        first = sum(t.shape[0] for t in all_tokens)
        all_tokens.append(child_tokens.flatten())
        all_scores.append(child_scores)
        all_parents.append(frontier.repeat_interleave(topk))
        scores, best = child_scores.topk(topk)
        tokens = child_tokens.flatten()[best]
        frontier = first + best.cpu()
        stepper.select(best // topk)
    stepper.restart()
    kept, parents = select_nodes(torch.cat(all_parents), torch.cat(all_scores).cpu(), state.max_nodes)
    return torch.cat(all_tokens).cpu()[kept], parents


@pytest.mark.parametrize("shape", TREES)
def test_the_per_request_tree_is_the_old_one(shape, draft_lm):
    """expand._tree (now one request through expand_trees) drafts what it drafted before, with the
    same beam reorders but the last (restart drops the rows anyway), and its stepper continues
    the same way afterwards."""
    k, topk, max_nodes = shape
    history = torch.tensor([0, 5, 6, 7, 5, 6, 8])
    state = tree_state({0: history}, (0,), k, topk, max_nodes)
    new, old = Stepper(draft_lm), Stepper(draft_lm)
    with torch.inference_mode():
        tokens, parents = expand._tree(new, new.sync(history), state)
        want_tokens, want_parents = reference_tree(old, old.sync(history), state)
        assert tokens.tolist() == want_tokens.tolist() and parents.tolist() == want_parents.tolist()
        assert new.selects == old.selects[:-1]  # the last reorder was of rows restart drops
        longer = torch.cat([history, tokens[:1], torch.tensor([3])])
        assert torch.equal(new.sync(longer), old.sync(longer))


def test_expand_trees_scores_by_cumulative_log_probability():
    """A hand-made feed over a vocabulary of 5: the nodes, their parents and order by hand."""
    root = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.05, 0.05]]))  # [1, V]
    children = {0: [0.1, 0.15, 0.6, 0.1, 0.05], 1: [0.05, 0.9, 0.02, 0.02, 0.01]}  # by parent token

    def feed(tokens, rows):
        assert rows.tolist() == [[0, 0]]  # step 1 expands the root
        return torch.log(torch.tensor([children[int(t)] for t in tokens[0]]))[None]  # [1, W, V]

    state = DraftState(tokens=[torch.tensor([0])], k=2, topk=2, num_draft_tokens=5)
    tokens, parents = expand_trees(root, state, feed)  # [1, 4] each
    # candidates: c0 = 0 (.5), c1 = 1 (.25); c0's children c2 = 2 (.3), c3 = 1 (.075); c1's
    # children c4 = 1 (.225), c5 = 0 (.0125). The best 4 in creation order: c0 c1 c2 c4.
    assert tokens.tolist() == [[0, 1, 2, 1]] and parents.tolist() == [[0, 0, 1, 2]]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    target = tiny_llama(seed=0, scale=8.0)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    lm = LlamaForCausalLM(config)
    lm.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    path = tmp_path_factory.mktemp("draft")
    save_draft_model(lm, path, dtype=torch.float32)
    return target, str(path)


@pytest.mark.parametrize("name", ["draft_model", "layerskip"])
def test_the_drafter_routes_trees_to_the_native_engine(name, draft_dir, forwards):
    """draft_model / layerskip propose trees through their NativeChain (tree forwards, no
    per-request stepper), equal to the per-request path over their own model; chains too."""
    target, path = draft_dir
    drafter = DraftModelDrafter(path, "greedy", GREEDY) if name == "draft_model" else LayerSkipDrafter(1, "greedy", GREEDY)
    drafter.attach(target)
    steppers = Steppers(lambda: LMStepper(drafter.model))
    histories = {4: torch.tensor([0, 5, 6, 7, 5, 6]), 8: torch.tensor([0, 3, 4])}
    state = tree_state(histories, (4, 8), 3, 2, 5)
    got = drafter.propose(state)
    assert_same(got, draft(steppers, state, "greedy", GREEDY, None))
    assert len(drafter.steppers) == 0 and set(drafter.chain.row_of) == {4, 8}
    assert [tree for _, tree in forwards] == [False, True, True]
    drafter.release([4])
    assert set(drafter.chain.row_of) == {8}


def test_a_tree_round_makes_room_for_every_node_it_feeds(draft_lm, forwards):
    """The last step writes (k - 1) topk nodes past the history: a cache sized for chains grows
    to hold them (none is a clamped write), and the tree is still the per-request one."""
    k, topk, max_nodes = 4, 4, 10
    chain = NativeChain(lambda: Transformer.from_hf(draft_lm), rows=1, max_length=8, cuda_graphs=False)
    assert chain.ready()
    histories = {0: torch.tensor([0, 5, 6, 7, 5, 6])}
    state = tree_state(histories, (0,), k, topk, max_nodes)
    got = chain.propose_tree(state)
    assert chain.max_length >= 6 + (k - 1) * topk  # slots 0 .. 6 + 11 real, the last one spare
    assert forwards[-1] == ((k - 1) * topk, True)
    assert_same(got, draft(Steppers(lambda: LMStepper(draft_lm)), state, "greedy", GREEDY, None))
