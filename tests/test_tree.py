"""Draft trees: exact buffers for hand-made shapes, node selection, the tree verify forward
against separate branch forwards, KV compaction, and the rules walking a tree."""

import numpy as np
import pytest
import torch

from conftest import ENGINES, TOY_P, chi2_pvalue, make_engine
from specbench.rules import greedy_tree_host, verify_siblings, verify_tree, verify_trees
from specbench.tree import compile_tree, select_nodes, with_root


def test_three_node_tree_buffers():
    # root 0 with two children 1 and 2, tried in that order
    t = compile_tree(torch.tensor([-1, 0, 0]))
    assert t.depth.tolist() == [0, 1, 1]
    assert t.mask.int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert t.next_token.tolist() == [1, -1, -1]
    assert t.next_sibling.tolist() == [-1, 2, -1]
    assert t.index.tolist() == [0, 1, 2]
    assert t.children(0) == [1, 2] and t.children(1) == []


def test_sglang_2_2_4_shape_from_expansion_scores():
    # steps 2, topk 2, num_draft_tokens 4. Step 1 expands the root into a, b; step 2 expands
    # both into a1, a2, b1, b2. Candidates in creation order with cumulative log-probs:
    #            a     b     a1    a2    b1    b2
    parents = torch.tensor([-1, -1, 0, 0, 1, 1])
    scores = torch.tensor([-0.1, -0.5, -0.3, -1.0, -0.7, -0.9])
    kept, tree_parents = select_nodes(parents, scores, max_nodes=3)
    assert kept.tolist() == [0, 1, 2]  # a, b, a1: the 3 best, in creation order
    assert tree_parents.tolist() == [0, 0, 1]  # a, b under the root; a1 under a (node 1)
    t = compile_tree(with_root(tree_parents), offset=8)  # request 2 of a batch with N = 4
    assert t.parents.tolist() == [-1, 0, 0, 1]
    assert t.depth.tolist() == [0, 1, 1, 2]
    assert t.mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert t.next_token.tolist() == [1, 3, -1, -1]
    assert t.next_sibling.tolist() == [-1, 2, -1, -1]
    assert t.index.tolist() == [8, 9, 10, 11]


def test_select_nodes_keeps_ancestors_on_ties_and_refuses_orphans():
    kept, parents = select_nodes(torch.tensor([-1, 0, 1]), torch.tensor([-1.0, -1.0, -1.0]), 2)
    assert kept.tolist() == [0, 1] and parents.tolist() == [0, 1]
    with pytest.raises(ValueError, match="without its parent"):
        select_nodes(torch.tensor([-1, 0]), torch.tensor([-2.0, -1.0]), 1)


def test_select_nodes_over_a_batch_picks_what_each_tree_picks_alone():
    """B trees at once (one stable sort) keep, per tree, what select_nodes keeps for it alone:
    random trees of 40 candidates built as expansion builds them (a child scores its parent's
    score plus a log-probability), ties included (scores rounded to a coarse grid)."""
    g = torch.Generator().manual_seed(0)
    B, C = 16, 40
    parents = torch.full((B, C), -1, dtype=torch.int64)
    scores = torch.zeros(B, C)
    for c in range(C):
        if c >= 3:  # the first three hang on the root
            parents[:, c] = torch.randint(c, (B,), generator=g)
        step = -torch.rand(B, generator=g).mul(4).round() / 4  # log-probabilities on a grid: ties
        above = scores.gather(1, parents[:, c : c + 1].clamp(min=0))[:, 0]
        scores[:, c] = torch.where(parents[:, c] >= 0, above, 0.0) + step
    for max_nodes in (1, 5, 17, 40, 60):
        kept, tree_parents = select_nodes(parents, scores, max_nodes)
        assert kept.shape == tree_parents.shape == (B, min(max_nodes, C))
        for b in range(B):
            alone = select_nodes(parents[b], scores[b], max_nodes)
            order = sorted(range(C), key=lambda c: (-float(scores[b, c]), c))[:max_nodes]  # the rule, by hand
            assert kept[b].tolist() == alone[0].tolist() == sorted(order)
            assert tree_parents[b].tolist() == alone[1].tolist()
            assert all(p == 0 or p <= j for j, p in enumerate(tree_parents[b].tolist()))  # parents come first


def test_compile_tree_on_random_trees_against_the_definitions():
    """Every buffer of 200 random trees (1 to 30 nodes) against its definition, node by node:
    depth the number of ancestors, mask the ancestors and the node itself, next_token the first
    child, next_sibling the next child of the same parent, index offset + node."""
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        N = int(torch.randint(1, 31, (), generator=g))
        parents = [-1] + [int(torch.randint(i, (), generator=g)) for i in range(1, N)]
        t = compile_tree(torch.tensor(parents), offset=5)

        def ancestors(i):
            return set() if parents[i] < 0 else {parents[i]} | ancestors(parents[i])

        for i in range(N):
            children = [c for c in range(N) if parents[c] == i]
            siblings = [c for c in range(N) if parents[c] == parents[i] and c > i] if i else []
            assert int(t.depth[i]) == len(ancestors(i))
            assert t.mask[i].nonzero().flatten().tolist() == sorted(ancestors(i) | {i})
            assert int(t.next_token[i]) == (children[0] if children else -1)
            assert int(t.next_sibling[i]) == (siblings[0] if siblings else -1)
            assert t.children(i) == children
        assert t.index.tolist() == list(range(5, 5 + N)) and t.parents.tolist() == parents


def test_compile_tree_rejects_bad_parents():
    with pytest.raises(ValueError, match="root"):
        compile_tree(torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="come before"):
        compile_tree(torch.tensor([-1, 2, 0]))


@pytest.mark.parametrize("kind", ENGINES)
def test_tree_forward_matches_each_branch_and_compaction_keeps_the_path(tiny_model, kind):
    """One masked forward over a tree gives, at every node, the logits of running its branch
    alone; keeping a path that is not the first children leaves the cache equal to a plain
    forward over the path."""
    prefix = torch.tensor([5, 6, 7])
    # root 8; children 9, 10; 10 has child 11; 9 has child 12
    tokens = torch.tensor([[8, 9, 10, 11, 12]])
    tree = compile_tree(torch.tensor([-1, 0, 0, 2, 1]))
    engine = make_engine(kind, tiny_model)
    engine.prefill(0, prefix)
    assert engine.length == [3]  # the prefill reads the prompt; its last token's logits come back
    logits = engine.forward(tokens, tree.depth[None], tree.mask[None])[0]  # [5, V]
    with torch.no_grad():
        for node, branch in enumerate([[8], [8, 9], [8, 10], [8, 10, 11], [8, 9, 12]]):
            alone = tiny_model(torch.cat([prefix, torch.tensor(branch)])[None]).logits[0, -1]
            torch.testing.assert_close(logits[node], alone, rtol=1e-4, atol=1e-4)
    engine.advance([[0, 2, 3]])  # root, 10, 11
    assert engine.length == [6]
    after = engine.forward(torch.tensor([[13]]))[0, -1]
    with torch.no_grad():
        plain = tiny_model(torch.tensor([[5, 6, 7, 8, 10, 11, 13]])).logits[0, -1]
    torch.testing.assert_close(after, plain, rtol=1e-4, atol=1e-4)


def test_advance_moves_every_rows_tree_path_as_one_row_at_a_time_would(tiny_model):
    """Rows of different lengths keep tree paths of different lengths (and a chain row, an idle
    row): the batched move (one gather, one write, no host sync) leaves every slot as moving
    each row's path alone would, and each length past its path."""
    engine = make_engine("native", tiny_model, rows=5, max_length=32)
    g = torch.Generator().manual_seed(3)
    engine.cache_k.copy_(torch.randn(engine.cache_k.shape, generator=g))
    engine.cache_v.copy_(torch.randn(engine.cache_v.shape, generator=g))
    engine.lengths.copy_(torch.tensor([4, 9, 0, 6, 2]))
    keep = [[0, 2, 5], [0, 1, 2], [], [0, 3], [0, 1, 4, 6]]  # row 1 a chain, row 2 idle
    want_k, want_v = engine.cache_k.clone(), engine.cache_v.clone()
    for b, k in enumerate(keep):
        start = int(engine.lengths[b])
        for j, i in enumerate(k):  # ascending, i >= j: slot start + j is read before it is written
            want_k[:, b, :, start + j] = want_k[:, b, :, start + i]
            want_v[:, b, :, start + j] = want_v[:, b, :, start + i]
    engine.advance(keep)
    assert engine.lengths.tolist() == [7, 12, 0, 8, 6]
    assert torch.equal(engine.cache_k, want_k) and torch.equal(engine.cache_v, want_v)


P = torch.tensor([0.1, 0.4, 0.3, 0.2])


@pytest.mark.parametrize("rule", ["onehot", "standard", "target_only"])
def test_sibling_rules_are_lossless(rule):
    """Seed 0, 200k draws, 4 categories: a chi-square test at alpha 1e-3 detects a TV of 0.01
    with power > 0.99 at this size; the lossless rules must not be flagged."""
    from scipy.stats import chisquare

    n = 200_000
    g = torch.Generator().manual_seed(0)
    candidates = torch.tensor([[1, 3]]).expand(n, 2)  # two siblings: 1 then 3
    res = verify_siblings(rule, P.expand(n, 4), candidates, generator=g)
    counts = torch.bincount(res.token, minlength=4).numpy()
    assert chisquare(counts, [0.1 * n, 0.4 * n, 0.3 * n, 0.2 * n]).pvalue > 1e-3
    # P(accept sibling j) = p(c_j): 0.4 and 0.2
    accepted = torch.bincount(res.accepted + 1, minlength=3).numpy() / n
    assert abs(accepted[1] - 0.4) < 0.005 and abs(accepted[2] - 0.2) < 0.005


def test_verify_tree_walks_accepted_children_and_ends_with_a_bonus():
    # root 0 -> {1: token 2, 2: token 1}; node 2 -> {3: token 0}. Greedy target: argmax 1 at
    # the root, then 0 at node 2, then 3 at node 3.
    probs = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25] * 4, [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    tree = compile_tree(torch.tensor([-1, 0, 0, 2]))
    res = verify_tree("greedy", probs, torch.tensor([9, 2, 1, 0]), tree)
    assert res.path == [0, 2, 3] and res.tokens == [1, 0, 3] and res.tried == 2
    # a refusal at the first level: no child equals the argmax
    res = verify_tree("greedy", probs, torch.tensor([9, 2, 3, 0]), tree)
    assert res.path == [0] and res.tokens == [1] and res.tried == 1


# --- the batched walk: every request's tree at once ------------------------------------------


def random_trees(n, g, max_nodes=12):
    """n random trees of 1 to max_nodes nodes (roots alone, chains and bushes among them)."""
    trees = []
    for _ in range(n):
        m = int(torch.randint(1, max_nodes + 1, (), generator=g))
        trees.append(compile_tree(torch.tensor([-1] + [int(torch.randint(i, (), generator=g)) for i in range(1, m)])))
    return trees


def walk_one(tree, labels, choose, emit):
    """The walk by its definition, one node at a time: labels [N] the nodes' tokens,
    choose(node, children) the accepted child or None, emit(node) the token a refusal or a leaf
    emits there."""
    path, tokens, node = [0], [], 0
    while True:
        children = tree.children(node)
        child = choose(node, children) if children else None
        if child is None:
            return path, tokens + [emit(node)], len(path) - (not children)
        path.append(child)
        tokens.append(int(labels[child]))
        node = child


def test_batched_greedy_walk_is_each_tree_walked_alone():
    """60 random trees in one call (seed 5), each node's token its parent's argmax with
    probability 0.6, so that greedy both accepts and refuses: each request's path, tokens and
    tried levels are its own tree's walk by definition, and the runner's host walk's."""
    g = torch.Generator().manual_seed(5)
    trees = random_trees(60, g)
    q, V = max(t.parents.shape[0] for t in trees), 8
    probs = torch.softmax(3 * torch.randn(60, q, V, generator=g), -1)
    tokens = torch.randint(0, V, (60, q), generator=g)
    parents = torch.stack([torch.cat([t.parents, t.parents.new_zeros(q - t.parents.shape[0])]) for t in trees])
    hits = torch.rand(60, q, generator=g) < 0.6
    tokens = torch.where(hits, probs.argmax(-1).gather(1, parents.clamp(min=0)), tokens)
    out = verify_trees("greedy", probs, tokens, trees)
    depths = []
    for a, (t, res) in enumerate(zip(trees, out)):
        best = probs[a].argmax(-1)
        hit = lambda node, children: next((c for c in children if tokens[a, c] == best[node]), None)  # noqa: E731
        assert (res.path, res.tokens, res.tried) == walk_one(t, tokens[a], hit, lambda node: int(best[node])), a
        host = greedy_tree_host(best.tolist(), tokens[a].tolist(), t.host.children)
        assert (host.path, host.tokens, host.tried) == (res.path, res.tokens, res.tried), a
        depths.append(res.num_accepted)
    assert min(depths) == 0 and max(depths) >= 3  # refusals, and walks deep into a tree


@pytest.mark.parametrize("rule", ["standard", "onehot", "target_only", "thresholded"])
def test_batched_sampled_walk_follows_each_request_point_masses(rule):
    """p a point mass at every node: on one child's token (the walk must take that child, the
    other siblings tried first and refused) or on a token no child holds (the walk must stop
    there and emit it). Every lossless rule is then deterministic, so 60 random trees in one call
    (seed 6) check that each request walks its own tree on its own rows."""
    g = torch.Generator().manual_seed(6)
    trees = random_trees(60, g)
    q, V = max(t.parents.shape[0] for t in trees), 64
    tokens = torch.full((60, q), 0, dtype=torch.int64)
    probs = torch.zeros(60, q, V)
    target = {}  # (request, node) -> the child p points at, or None
    for a, t in enumerate(trees):
        for node in range(t.parents.shape[0]):
            children = t.children(node)
            picks = torch.randperm(V - 1, generator=g)[: len(children) + 1] + 1  # distinct, never 0
            tokens[a, children] = picks[:-1]
            pick = int(torch.randint(len(children) + 1, (), generator=g))  # len(children): none of them
            target[a, node] = children[pick] if pick < len(children) else None
            probs[a, node, picks[pick]] = 1.0
    out = verify_trees(rule, probs, tokens, trees, generator=torch.Generator().manual_seed(0))
    depths = []
    for a, (t, res) in enumerate(zip(trees, out)):
        emit = lambda node: int(probs[a, node].argmax())  # noqa: E731
        assert (res.path, res.tokens, res.tried) == walk_one(t, tokens[a], lambda node, _: target[a, node], emit), (rule, a)
        depths.append(res.num_accepted)
    assert min(depths) == 0 and max(depths) >= 3


@pytest.mark.parametrize("rule", ["standard", "onehot", "target_only"])
def test_batched_sampled_walk_is_lossless_at_two_levels(rule):
    """n = 100,000 requests cycling through five trees, the write-up's toy p at every node, one
    call (seed 7). The first emitted token must be distributed as p, and so must the second
    among the walks that accepted a first-level child (that acceptance reads the first level's
    draws only): about 35,000 of them, the trees' first-level mass being 0.35 on average. A
    chi-square test at alpha 1e-3 over 6 categories detects a TV of 0.02 with power > 0.99 at
    30,000 draws (asserted with the sample actually drawn)."""
    from specbench.distcheck import power

    shapes = [compile_tree(torch.tensor(p)) for p in
              ([-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2], [-1], [-1, 0, 0, 0, 1, 4], [-1, 0, 1, 1, 0])]
    labels = torch.tensor([0, 1, 3, 0, 2, 5])  # node i's token; siblings differ in every tree
    n = 100_000
    trees = [shapes[a % 5] for a in range(n)]
    out = verify_trees(rule, TOY_P.expand(n, 6, 6), labels.expand(n, 6), trees,
                       generator=torch.Generator().manual_seed(7))
    assert chi2_pvalue(torch.tensor([r.tokens[0] for r in out]), TOY_P) > 1e-3
    second = torch.tensor([r.tokens[1] for r in out if r.num_accepted >= 1])
    assert power(len(second), 0.02, 1e-3, 6) > 0.99
    assert chi2_pvalue(second, TOY_P) > 1e-3
    # The first level is accepted with its children's mass: 0.35, 0.25, 0, 0.75, 0.40 by tree.
    mass = torch.tensor([float(TOY_P[labels[t.children(0)]].sum()) if t.children(0) else 0.0 for t in shapes])
    assert mass.tolist() == pytest.approx([0.35, 0.25, 0.0, 0.75, 0.40])
    expected = mass.repeat(n // 5).double()
    accepted = torch.tensor([r.num_accepted >= 1 for r in out], dtype=torch.float64)
    assert abs(accepted.mean() - expected.mean()) < 5 * (expected * (1 - expected)).sum().sqrt() / n


def _outcomes(results) -> list:
    """Each walk's whole outcome, (accepted path, emitted tokens), as one hashable category."""
    return [(tuple(r.path), tuple(r.tokens)) for r in results]


def test_onehot_and_standard_trees_have_target_onlys_law_and_run_as_it():
    """rules.TARGET_ONLY_LAW. One 6-node tree (root children 1, 2; node 1's children 3, 4; node
    2's child 5; siblings distinct tokens) under a random p at every node (V = 5, Dirichlet(1),
    seed 3), n = 60,000 walks a rule, generators seeded 11 and 12. The outcomes (accepted path
    and emitted tokens: 25 categories drawn) of onehot and of target_only pass a chi-square test
    of homogeneity at alpha 1e-3 (p = 0.63 here), whose power against any law at total variation
    0.03 is > 0.99 with these samples (asserted). The same test tells thresholded
    (threshold_acc 0.5, lossy) apart from onehot (p < 1e-10): it can fail. The runner's mapping
    (tree_rule_for_round) walks onehot and standard as target_only, and keeps them, in torch,
    when a node has two children with one token."""
    from specbench.distcheck import chisquare_homogeneity, power
    from specbench.rules import distinct_siblings, tree_rule_for_round

    tree = compile_tree(torch.tensor([-1, 0, 0, 1, 1, 2]))
    labels = torch.tensor([0, 1, 3, 0, 2, 4])
    torch.manual_seed(3)
    p = torch.distributions.Dirichlet(torch.ones(5)).sample((6,))  # [6 nodes, V]
    n = 60_000

    def walk(rule, seed, **kw):
        return _outcomes(verify_trees(rule, p.expand(n, 6, 5), labels.expand(n, 6), [tree] * n,
                                      generator=torch.Generator().manual_seed(seed), **kw))

    def counts(*samples):
        keys = sorted(set().union(*samples))
        return [[s.count(key) for key in keys] for s in samples]

    onehot, target_only = walk("onehot", 11), walk("target_only", 12)
    same = chisquare_homogeneity(*counts(onehot, target_only))
    categories = len(set(onehot) | set(target_only))
    assert categories >= 15 and power(n, 0.03, 1e-3, categories, two_sample=True) > 0.99
    assert same.pvalue > 1e-3, same
    lossy = chisquare_homogeneity(*counts(onehot, walk("thresholded", 12, threshold_acc=0.5)))
    assert lossy.pvalue < 1e-10, lossy

    drafts = np.array([[1, 3, 0, 2, 4], [7, 7, 0, 0, 0]])  # request 1: two root children of token 7
    parents = np.array([[0, 0, 1, 1, 2], [0, 0, 0, 0, 0]])
    assert distinct_siblings(drafts[:1], parents[:1], [5]) and distinct_siblings(drafts, parents, [5, 1])
    assert not distinct_siblings(drafts, parents, [5, 2])
    for rule in ("onehot", "standard"):
        assert tree_rule_for_round(rule, "triton", drafts, parents, [5, 1]) == ("target_only", "triton")
        assert tree_rule_for_round(rule, "triton", drafts, parents, [5, 2]) == (rule, "torch")
    for rule in ("target_only", "thresholded"):  # as asked, repeated siblings or not
        assert tree_rule_for_round(rule, "triton", drafts, parents, [5, 2]) == (rule, "triton")
