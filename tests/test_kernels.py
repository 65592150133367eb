"""The Triton kernels (specbench.kernels) against their torch references, token for token, the
references against the rules' distributions, and impl=triton selected from config.

Where there is no GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py before triton is imported). It runs a program in about 10 ms, so shapes stay tiny
there (B <= 4, V <= 300). With CUDA the same tests run compiled, at every shape including
B = 256, k = 8, V = 128256.

Statistical tests (fixed seeds, alpha = 1e-3, as in test_rules.py): the torch references draw
N = 200,000 samples over the write-up's 6-category toy, which detects a total-variation shift
of 0.01 with power > 0.99 (specbench.distcheck.power). The kernels' own draws: N = 200,000 on a
GPU; N = 500 in the interpreter, which detects a shift of 0.15 with power 0.99 (0.48 at 0.1):
a check of the plumbing; exactness comes from the token-for-token tests against the reference.
"""

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import TOY_P as P, chi2_pvalue
from specbench.config import ConfigError, NgramConfig, register, validate
from specbench.drafters.base import DraftState
from specbench.drafters.ngram import NgramDrafter, ngram_propose_batch
from specbench.distcheck import power
from specbench.rules import resolve_impl, verify_chain, verify_tree, verify_trees
from specbench.tree import chain_parents, compile_tree, with_root

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


if HAS_TRITON:
    from specbench.kernels import chain as kchain, ngram as kngram, tree as ktree
    if not CUDA and not kchain.INTERPRETED:
        raise RuntimeError("no GPU and triton was imported without TRITON_INTERPRET=1 (see conftest.py)")

Q = torch.tensor([0.20, 0.35, 0.05, 0.25, 0.10, 0.05])  # and draft
N = 200_000
N_KERNEL = N if CUDA else 500

# (B, k, V): tiny ones everywhere, the grid corners on a GPU only.
CHAIN_SHAPES = [(4, 3, 97), (3, 1, 64), (2, 4, 300)] + ([(48, 4, 49152), (256, 8, 128256), (8, 8, 151936)] if CUDA else [])
RULES = ("standard", "onehot", "target_only", "thresholded", "greedy")
THRESHOLDS = {"thresholded": dict(threshold_acc=0.5, threshold_single=0.3)}


@pytest.fixture(autouse=True)
def _quiet_interpreter():
    with warnings.catch_warnings():  # the interpreter's numpy log(0) = -inf, as on the GPU
        warnings.filterwarnings("ignore", "divide by zero", RuntimeWarning)
        yield


def chain_inputs(B, k, V, seed, scale=3.0):
    """p and q over V, drafts half from q and half the argmax of p (so both paths are taken),
    short drafts (-1 padded) in some rows, and the rule's randomness."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    p = torch.softmax(torch.randn(B, k + 1, V, generator=g, device=DEVICE) * scale, -1)
    q = torch.softmax(torch.randn(B, k, V, generator=g, device=DEVICE) * scale, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, k)
    greedy = torch.rand(B, k, generator=g, device=DEVICE) < 0.5
    drafts = torch.where(greedy, p[:, :k].argmax(-1), drafts)
    keep = torch.randint(0, k + 1, (B, 1), generator=g, device=DEVICE)
    short = torch.rand(B, 1, generator=g, device=DEVICE) < 0.3
    drafts = torch.where(torch.arange(k, device=DEVICE) < torch.where(short, keep, k), drafts, -1)
    uniforms, noise = kchain.draw_noise(B, k, V, g, DEVICE)
    return p, drafts, q, uniforms, noise


def both_chains(rule, p, drafts, q, uniforms, noise, **launch):
    kw = THRESHOLDS.get(rule, {})
    q = q if rule == "standard" else None
    ref = kchain.chain_torch(rule, p, drafts, q, uniforms, noise, **kw)
    out = kchain.launch(rule, p, drafts, q, uniforms, noise, **kw, **launch)
    return ref, out


def counts_left_zero(B: int, V: int, block_v=None, splits=None) -> bool:
    """A split launch's merge counts are zero after it (the last program to count resets its
    request's), as the next launch of that shape needs them: a count left over would make no
    program of that request the last, and its drawn token would never be written."""
    from specbench.kernels.vocab import launch_shape, partials

    S = launch_shape(B, V, torch.device(DEVICE), block_v, splits)[1]
    return S == 1 or not partials(B, S, DEVICE)[3].any()


# --- chain: the kernel is its reference --------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", CHAIN_SHAPES, ids=str)
def test_chain_kernel_equals_reference(rule, shape):
    B, k, V = shape
    small = V <= 512
    for seed in range(3 if small else 1):
        inputs = chain_inputs(B, k, V, seed)
        # the interpreter: several tiles and splits of a tiny row; a GPU: its own launch shape, and one split
        for launch in ([dict(block_v=32, splits=1), dict(block_v=32, splits=3)] if small else [{}, dict(splits=1)]):
            (ref_tokens, ref_num), (tokens, num) = both_chains(rule, *inputs, **launch)
            assert torch.equal(num, ref_num) and torch.equal(tokens, ref_tokens), (rule, shape, seed, launch)
            assert counts_left_zero(B, V, **launch)


@needs_triton
def test_chain_edge_cases():
    V = 16
    p = torch.softmax(torch.randn(2, 3, V, generator=torch.Generator().manual_seed(0)), -1).to(DEVICE)
    x = p[:, :2].argmax(-1)
    u, w = kchain.draw_noise(2, 2, V, torch.Generator(DEVICE).manual_seed(1), DEVICE)
    # p == q: every draft accepted, the bonus drawn from p at position k
    ref, out = both_chains("standard", p, x, p[:, :2].clone(), u, w)
    assert ref[1].tolist() == [2, 2] and torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert out[0][:, 2].tolist() == (p[:, 2] * w).argmax(-1).tolist()
    # ... and a coin of 1 refuses at 0, where the residual max(0, p - q) is empty: the draw falls back to p
    ones = torch.ones_like(u)
    ref, out = both_chains("standard", p, x, p[:, :2].clone(), ones, w)
    assert out[1].tolist() == [0, 0] and torch.equal(out[0], ref[0])
    assert out[0][:, 0].tolist() == (p[:, 0] * w).argmax(-1).tolist()
    # A point-mass target: onehot accepts surely; p(x) = 0 is refused surely, and p with x zeroed
    # has no mass, so the fall-back draws from p: its point mass again
    point = torch.zeros(1, 2, V, device=DEVICE)
    point[0, 0, 5] = point[0, 1, 7] = 1.0
    for rule in ("onehot", "target_only", "greedy"):
        for draft, expected in ((5, [5, 7]), (3, [5, -1])):
            ref, out = both_chains(rule, point, torch.tensor([[draft]], device=DEVICE), None, u[:1, :1], w[:1])
            assert out[0].tolist() == [expected] and torch.equal(out[0], ref[0]), (rule, draft)
    # Every draft -1: the bonus from p at position 0
    ref, out = both_chains("onehot", p, torch.full_like(x, -1), None, u, w)
    assert out[1].tolist() == [0, 0] and out[0][:, 1:].eq(-1).all() and torch.equal(out[0], ref[0])


@needs_triton
def test_greedy_kernel_is_the_rules_greedy():
    p, drafts, *_ = chain_inputs(4, 3, 97, seed=5)
    res = verify_chain("greedy", p, drafts)
    tokens, num = kchain.chain_triton("greedy", p, drafts, None, None, None)
    assert torch.equal(tokens, res.tokens) and torch.equal(num, res.num_accepted)


# --- chain: distributions -------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("rule", ["standard", "onehot", "thresholded"])
def test_chain_reference_with_supplied_noise_is_lossless(rule):
    """k = 1, the same p at both positions: the first emitted token is distributed as p, and the
    acceptance rate is sum min(p, q) = 0.70 (standard) or p(x) = 0.25 (onehot); the thresholded
    rule at threshold_acc 0.5 accepts 0.50 and is far from p (the negative control)."""
    g = torch.Generator().manual_seed(11)
    drafts = torch.multinomial(Q, N, replacement=True, generator=g) if rule == "standard" else torch.full((N,), 1)
    uniforms, noise = kchain.draw_noise(N, 1, 6, g, "cpu")
    kw = dict(threshold_acc=0.5) if rule == "thresholded" else {}
    tokens, num = kchain.chain_torch(rule, P.expand(N, 2, 6), drafts.view(N, 1), Q.expand(N, 1, 6), uniforms, noise, **kw)
    expected = {"standard": 0.70, "onehot": 0.25, "thresholded": 0.50}[rule]
    assert abs(num.double().mean().item() - expected) < 0.005  # sd of the mean <= 0.0012
    if rule == "thresholded":
        assert chi2_pvalue(tokens[:, 0], P) < 1e-100
    else:
        assert chi2_pvalue(tokens[:, 0], P) > 1e-3


@needs_triton
@pytest.mark.parametrize("rule", ["standard"] if not CUDA else ["standard", "onehot"])
def test_chain_kernel_draws_p_through_the_rules(rule):
    """rules.verify_chain(impl="triton"): coins and noise from the generator, the kernel's draw.
    N_KERNEL draws (module docstring for the power); onehot on a GPU only (5 s in the
    interpreter: its exactness against the reference is tested above)."""
    n = N_KERNEL
    assert power(n, 0.15, 1e-3, 6) > 0.99
    g = torch.Generator(DEVICE).manual_seed(12)
    Pd, Qd = P.to(DEVICE), Q.to(DEVICE)
    drafts = torch.multinomial(Qd, n, replacement=True, generator=g) if rule == "standard" else torch.full((n,), 1, device=DEVICE)
    q = Qd.expand(n, 1, 6) if rule == "standard" else None
    res = verify_chain(rule, Pd.expand(n, 2, 6), drafts.view(n, 1), q, generator=g, impl="triton")
    assert chi2_pvalue(res.tokens[:, 0], P) > 1e-3
    expected = 0.70 if rule == "standard" else 0.25
    assert abs(res.num_accepted.double().mean().item() - expected) < 5 * (expected * (1 - expected) / n) ** 0.5


# --- tree -------------------------------------------------------------------------------------


def random_trees(B, N, seed):
    g = torch.Generator().manual_seed(seed)
    return [compile_tree(torch.tensor([-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, N)]))
            for _ in range(B)]


def sglang_tree() -> torch.Tensor:
    """topk 4, depth 5, 8 draft tokens: the root's 4 children, then a chain of 4 below the first."""
    return compile_tree(torch.tensor([-1, 0, 0, 0, 0, 1, 5, 6, 7]))


def tree_inputs(trees, V, seed, scale):
    """Children drawn from their parent's p (some accepted, some not)."""
    B, Nn = len(trees), trees[0].parents.shape[0]
    g = torch.Generator(DEVICE).manual_seed(seed)
    p = torch.softmax(torch.randn(B, Nn, V, generator=g, device=DEVICE) * scale, -1)
    parents, first, sibling = (torch.stack([getattr(t, f) for t in trees]).to(DEVICE)
                               for f in ("parents", "next_token", "next_sibling"))
    rows = torch.arange(B, device=DEVICE)
    tokens = torch.zeros(B, Nn, dtype=torch.int64, device=DEVICE)
    for i in range(1, Nn):
        tokens[:, i] = torch.multinomial(p[rows, parents[:, i]], 1, generator=g).squeeze(-1)
    D = max(int(t.depth.max()) for t in trees)
    uniforms, noise = ktree.draw_noise(B, D, V, g, DEVICE)
    return p, tokens, first, sibling, uniforms, noise


TREE_CASES = [("random", 3, 7, 64), ("random", 4, 9, 200), ("sglang", 2, 9, 130)]
TREE_CASES += [("sglang", 48, 9, 128256), ("sglang", 256, 9, 49152)] if CUDA else []


@needs_triton
@pytest.mark.parametrize("rule", ktree.RULES if HAS_TRITON else [])
@pytest.mark.parametrize("case", TREE_CASES, ids=str)
def test_tree_kernel_equals_reference(rule, case):
    kind, B, Nn, V = case
    small = V <= 512
    for seed in range(2 if small else 1):
        trees = random_trees(B, Nn, seed) if kind == "random" else [sglang_tree()] * B
        inputs = tree_inputs(trees, V, seed, scale=2.0 + 2 * seed)
        Z = ktree.most_children(inputs[2], inputs[3])
        kw = dict(THRESHOLDS.get(rule, {}), max_children=Z)
        ref = ktree.tree_torch(rule, *inputs, **kw)
        for launch in ([dict(block_v=32, splits=1), dict(block_v=32, splits=4)] if small else [{}]):
            out = ktree.launch(rule, *inputs, **kw, **launch)
            for field in ("tokens", "path", "num_accepted", "tried"):
                assert torch.equal(getattr(out, field), getattr(ref, field)), (rule, case, seed, launch, field)
            assert counts_left_zero(B, V, **launch)


@needs_triton
def test_tree_greedy_and_walk_agree_with_rules_verify_tree():
    """Greedy is deterministic: the kernel's path, tokens and tried equal rules.verify_tree's,
    request by request, through rules.verify_tree(impl="triton") too."""
    trees = random_trees(4, 8, seed=3)
    p, tokens, *_ = tree_inputs(trees, 64, seed=3, scale=2.0)
    for b, t in enumerate(trees):
        ref = verify_tree("greedy", p[b], tokens[b], t)
        out = verify_tree("greedy", p[b], tokens[b], t, impl="triton")
        assert (out.path, out.tokens, out.tried) == (ref.path, ref.tokens, ref.tried)
    gen = torch.Generator(DEVICE).manual_seed(0)
    out = verify_tree("target_only", p[0], tokens[0], trees[0], generator=gen, impl="triton")
    assert out.path[0] == 0 and len(out.tokens) == len(out.path) and out.tried in (len(out.path) - 1, len(out.path))
    with pytest.raises(ValueError, match=r"^rule=onehot: impl=triton verifies trees with target_only"):
        verify_tree("onehot", p[0], tokens[0], trees[0], generator=gen, impl="triton")


@needs_triton
def test_tree_reference_is_lossless_and_accepts_the_candidates_mass():
    """The write-up's tree: the root's children 1, 3, 0 (the top 3 of Q) under one p: the emitted
    first token is distributed as p and a child is accepted with p(1) + p(3) + p(0) = 0.75;
    threshold_acc = 0.5 always accepts (the negative control)."""
    tree = compile_tree(torch.tensor([-1, 0, 0, 0]))
    g = torch.Generator().manual_seed(13)
    uniforms, noise = ktree.draw_noise(N, 1, 6, g, "cpu")
    links = [x.expand(N, 4) for x in (torch.tensor([0, 1, 3, 0]), tree.next_token, tree.next_sibling)]
    out = ktree.tree_torch("target_only", P.expand(N, 4, 6), *links, uniforms, noise)
    assert chi2_pvalue(out.tokens[:, 0], P) > 1e-3
    assert abs(out.num_accepted.double().mean().item() - 0.75) < 0.005
    relaxed = ktree.tree_torch("thresholded", P.expand(N, 4, 6), *links, uniforms, noise, threshold_acc=0.5)
    assert (relaxed.num_accepted == 1).all() and chi2_pvalue(relaxed.tokens[:, 0], P) < 1e-100


def ragged_trees():
    """One batch of different trees: sizes 7, 5, 1, 5, 9 and depths 3, 4, 0, 1, 5."""
    return [
        compile_tree(torch.tensor([-1, 0, 0, 1, 1, 2, 4])),  # bushy: two children at the root and at node 1
        compile_tree(with_root(chain_parents(4))),  # a chain of 4 drafts
        compile_tree(torch.tensor([-1])),  # the root alone: nothing proposed
        compile_tree(torch.tensor([-1, 0, 0, 0, 0])),  # 4 siblings and nothing below
        sglang_tree(),
    ]


def ragged_inputs(trees, V, seed, scale=3.0):
    """p [A, q, V] and node tokens [A, q] for trees of m_a <= q nodes: each child is its parent's
    argmax with probability 0.6, else drawn from p there (greedy accepts along some paths and
    refuses others). Rows and tokens past m_a are random: never read."""
    A, q = len(trees), max(t.parents.shape[0] for t in trees)
    g = torch.Generator(DEVICE).manual_seed(seed)
    p = torch.softmax(torch.randn(A, q, V, generator=g, device=DEVICE) * scale, -1)
    tokens = torch.randint(0, V, (A, q), generator=g, device=DEVICE)
    for a, t in enumerate(trees):
        for i in range(1, t.parents.shape[0]):
            parent = p[a, int(t.parents[i])]
            drawn = torch.multinomial(parent, 1, generator=g)[0]
            argmax = torch.rand((), generator=g, device=DEVICE) < 0.6
            tokens[a, i] = parent.argmax() if argmax else drawn
    return p, tokens


@needs_triton
def test_verify_trees_greedy_is_the_walk_request_by_request():
    """One launch for a batch of different trees (a chain, the root alone, siblings only, the
    SGLang shape) gives each request what verify_tree gives it alone, in both impls."""
    trees = ragged_trees()
    accepted = set()
    for seed in range(3):
        p, tokens = ragged_inputs(trees, 64, seed)
        batched = verify_trees("greedy", p, tokens, trees, impl="triton")
        reference = verify_trees("greedy", p, tokens, trees)
        assert len(batched) == len(trees)
        for a, (t, out, ref) in enumerate(zip(trees, batched, reference)):
            m = t.parents.shape[0]
            alone = verify_tree("greedy", p[a, :m], tokens[a, :m], t, impl="triton")
            assert (out.path, out.tokens, out.tried) == (ref.path, ref.tokens, ref.tried), (seed, a)
            assert (alone.path, alone.tokens, alone.tried) == (ref.path, ref.tokens, ref.tried), (seed, a)
            accepted.add(out.num_accepted)
    assert {0, 1} <= accepted and max(accepted) >= 3  # refusals, and walks deep into a tree


@needs_triton
def test_one_tree_for_every_request_is_packed_as_many():
    """A batch whose requests share one tree object (a fixed tree shape: the runner caches trees
    by shape) is packed by broadcasting its links; each request still gets its own walk, and
    the links are the tree's next_token, next_sibling and depth, in the same memory."""
    tree = sglang_tree()
    assert tree.host.links.shape == (3, tree.parents.shape[0])
    assert np.shares_memory(tree.host.links, tree.host.depth) and np.shares_memory(tree.host.links, tree.host.next_token)
    assert tree.host.links[2].tolist() == tree.depth.tolist() and tree.host.links[1].tolist() == tree.next_sibling.tolist()
    copies = [compile_tree(tree.parents) for _ in range(6)]  # the same shape, six objects: the per-tree packing
    p, tokens = ragged_inputs(copies, 64, seed=3)
    shared = verify_trees("greedy", p, tokens, [tree] * 6, impl="triton")
    assert shared == verify_trees("greedy", p, tokens, copies, impl="triton") == verify_trees("greedy", p, tokens, copies)
    assert len({r.num_accepted for r in shared}) > 1  # the requests' walks differ


def half_on_the_children(trees, V, seed):
    """p [A, q, V] and node tokens [A, q] where every node with children gives them half its
    mass, evenly, over distinct tokens: a level is refused half the time, and the closing draw
    lands on a refused child unless every one of them is zeroed."""
    A, q = len(trees), max(t.parents.shape[0] for t in trees)
    g = torch.Generator(DEVICE).manual_seed(seed)
    p = torch.softmax(torch.randn(A, q, V, generator=g, device=DEVICE), -1)
    tokens = torch.randint(0, V, (A, q), generator=g, device=DEVICE)
    for a, t in enumerate(trees):
        for node in range(t.parents.shape[0]):
            children = t.children(node)
            if children:
                picks = torch.randperm(V, generator=g, device=DEVICE)[: len(children)]
                tokens[a, children] = picks
                p[a, node] *= 0.5
                p[a, node, picks] += 0.5 / len(children)
    return p, tokens


@needs_triton
@pytest.mark.parametrize("rule", ["target_only", "thresholded"])
def test_verify_trees_draws_once_for_the_batch_and_pads_nothing_in(rule):
    """Sampled: verify_trees(impl="triton") draws coins [A, D] and noise [A, V] once from the
    generator; request a then gets exactly the torch reference walk of its own unpadded tree on
    row a of those draws (its first D_a coins). Padding to the largest tree and the deepest
    level changes nothing, and every refused sibling is zeroed (the batch's max_children)."""
    trees = ragged_trees() * 3
    kw = dict(threshold_acc=0.8, threshold_single=0.3) if rule == "thresholded" else {}  # refuses when u > 0.625
    V, A = 96, len(trees)
    D = max(int(t.depth.max()) for t in trees)
    refused = 0
    for seed in range(2):
        p, tokens = half_on_the_children(trees, V, seed)
        out = verify_trees(rule, p, tokens, trees, generator=torch.Generator(DEVICE).manual_seed(seed), impl="triton", **kw)
        uniforms, noise = ktree.draw_noise(A, D, V, torch.Generator(DEVICE).manual_seed(seed), DEVICE)
        for a, t in enumerate(trees):
            m, D_a = t.parents.shape[0], int(t.depth.max())
            links = [x.to(DEVICE)[None] for x in (t.next_token, t.next_sibling)]
            ref = ktree.tree_torch(rule, p[a : a + 1, :m], tokens[a : a + 1, :m], *links,
                                   uniforms[a : a + 1, :D_a], noise[a : a + 1], **kw)
            n = int(ref.num_accepted[0])
            assert out[a].path == ref.path[0, : n + 1].tolist(), (rule, seed, a)
            assert out[a].tokens == ref.tokens[0, : n + 1].tolist(), (rule, seed, a)
            assert out[a].tried == int(ref.tried[0]), (rule, seed, a)
            refused += out[a].tried > out[a].num_accepted
    assert refused >= 5


@needs_triton
def test_verify_trees_kernel_draws_p_in_a_batch_of_different_trees():
    """target_only over n requests in one launch, cycling through the 5 trees of ragged_trees
    with the write-up's toy p at every node (seed 14): the first emitted token is distributed as
    p, as the torch walk's is (test_tree_reference_is_lossless_and_accepts_the_candidates_mass),
    whatever the tree. n = N on a GPU; n = 300 in the interpreter (a tree program costs it
    20-40 ms), which detects a TV shift of 0.2 with power 0.997 (0.86 at 0.15). The first level
    is accepted with the mass of the root's children, 0.35, 0.25, 0, 0.9, 0.9 by tree: the mean
    is checked to 5 standard deviations."""
    n = N if CUDA else 300
    assert power(n, 0.2, 1e-3, 6) > 0.99
    shapes = ragged_trees()
    trees = [shapes[a % len(shapes)] for a in range(n)]
    labels = torch.tensor([0, 1, 3, 0, 2, 5, 4, 1, 2])  # node i's token; siblings differ in every tree
    out = verify_trees("target_only", P.to(DEVICE).expand(n, 9, 6), labels.to(DEVICE).expand(n, 9), trees,
                       generator=torch.Generator(DEVICE).manual_seed(14), impl="triton")
    first = torch.tensor([r.tokens[0] for r in out])
    assert chi2_pvalue(first, P) > 1e-3
    by_shape = torch.tensor([float(P[labels[t.children(0)]].sum()) if t.children(0) else 0.0 for t in shapes],
                            dtype=torch.float64)
    assert by_shape.tolist() == pytest.approx([0.35, 0.25, 0.0, 0.9, 0.9])
    mass = by_shape[torch.arange(n) % len(shapes)]
    accepted = torch.tensor([r.num_accepted >= 1 for r in out], dtype=torch.float64)
    assert abs(accepted.mean() - mass.mean()) < 5 * (mass * (1 - mass)).sum().sqrt() / n


@needs_triton
def test_verify_trees_checks_what_it_is_given():
    trees = ragged_trees()
    p, tokens = ragged_inputs(trees, 32, seed=0)
    with pytest.raises(ValueError, match="must agree"):
        verify_trees("greedy", p, tokens, trees[:-1], impl="triton")
    with pytest.raises(ValueError, match="do not fit"):
        verify_trees("greedy", p[:, :5], tokens[:, :5], trees, impl="triton")
    with pytest.raises(ValueError, match=r"^rule=onehot: impl=triton verifies trees with target_only"):
        verify_trees("onehot", p, tokens, trees, impl="triton")
    with pytest.raises(ValueError, match="takes no thresholds"):
        verify_trees("target_only", p, tokens, trees, impl="triton", threshold_acc=0.5)
    assert verify_trees("greedy", p[:0], tokens[:0], [], impl="triton") == []


# --- n-gram -----------------------------------------------------------------------------------


def histories(B, T, symbols, seed):
    """Random rows over few symbols (many repeats), right-padded to T; a few empty or short."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, symbols, (B, T), generator=g)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    return tokens, lengths


NGRAM_CASES = [(4, 40, 3), (3, 64, 5), (2, 1, 3)] + ([(48, 1024, 50), (256, 4096, 1000)] if CUDA else [])


@needs_triton
@pytest.mark.parametrize("case", NGRAM_CASES, ids=str)
def test_ngram_kernel_equals_reference(case):
    B, T, symbols = case
    for seed in range(3):
        tokens, lengths = (t.to(DEVICE) for t in histories(B, T, symbols, seed))
        for min_n, max_n, k in ((1, 3, 4), (2, 5, 3), (1, 1, 1), (3, 8, 8)):
            ref = ngram_propose_batch(tokens, lengths, min_n, max_n, k)
            out = kngram.launch(tokens, lengths, min_n, max_n, k, block=16 if T <= 64 else None)
            assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]), (case, seed, min_n, max_n, k)


@needs_triton
def test_ngram_drafter_with_impl_triton_proposes_the_same():
    state = DraftState(tokens=[torch.tensor(h) for h in ([1, 2, 3, 4, 1, 2, 3], [1, 2, 3, 4, 5], [4, 4])], k=3)
    torch_out = NgramDrafter(min_n=1, max_n=3).propose(state)
    triton_out = NgramDrafter.from_config(NgramConfig(min_n=1, max_n=3, impl="triton")).propose(state)
    assert triton_out.tokens.tolist() == torch_out.tokens.tolist() == [[4, 1, 2], [-1, -1, -1], [4, -1, -1]]
    assert triton_out.num_tokens.tolist() == [3, 0, 1]


# --- selection from config --------------------------------------------------------------------


def cfg_of(*overrides):
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_impl_is_chosen_in_config():
    assert cfg_of("+drafter=ngram", "+rule=onehot").rule.impl == "auto"
    assert cfg_of("+drafter=ngram", "+rule=onehot").drafter.impl == "torch"
    for overrides in (["rule.impl=triton"], ["drafter.impl=triton"]):
        cfg = cfg_of("+drafter=ngram", "+rule=thresholded", *overrides)
        if HAS_TRITON:
            validate(cfg)
        else:
            with pytest.raises(ConfigError, match="needs the triton package"):
                validate(cfg)
    for key in ("rule", "drafter"):
        with pytest.raises(ConfigError) as e:
            validate(cfg_of("+drafter=ngram", "+rule=onehot", f"{key}.impl=bogus"))
        assert str(e.value) == f"{key}.impl=bogus: valid impls: {'auto, ' if key == 'rule' else ''}torch, triton"
    with pytest.raises(ConfigError, match=r"^drafter.impl=auto: valid impls: torch, triton$"):
        validate(cfg_of("+drafter=ngram", "drafter.impl=auto"))  # auto is the rule's alone
    for impl in ("auto", "python", "native"):  # ngram_trie's impls pick its trie
        validate(cfg_of("+drafter=ngram_trie", f"drafter.impl={impl}"))
    with pytest.raises(ConfigError, match=r"^drafter.impl=triton: valid impls: auto, python, native$"):
        validate(cfg_of("+drafter=ngram_trie", "drafter.impl=triton"))
    with pytest.raises(ConfigError, match=r"^drafter.impl=cuda: valid impls"):
        NgramDrafter(1, 3, impl="cuda")
    with pytest.raises(ValueError, match=r"^impl=cuda: valid impls"):
        verify_chain("onehot", P.expand(1, 2, 6), torch.tensor([[1]]), impl="cuda")


def test_auto_impl_takes_the_kernel_where_it_runs_the_round(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_impl("auto", cpu, "standard", trees=False) == "torch"
    for rule in ("standard", "onehot", "target_only", "thresholded"):
        assert resolve_impl("auto", cuda, rule, trees=False) == ("triton" if HAS_TRITON else "torch")
    # the tree kernel walks SGLang's target-only rule, and onehot / standard as it (the same law)
    for rule in ("standard", "onehot", "target_only", "thresholded"):
        assert resolve_impl("auto", cuda, rule, trees=True) == ("triton" if HAS_TRITON else "torch")
    assert resolve_impl("torch", cuda, "onehot", trees=False) == "torch"  # a named impl is kept
    assert resolve_impl("triton", cpu, "onehot", trees=False) == "triton"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no triton installed
    assert resolve_impl("auto", cuda, "onehot", trees=False) == "torch"
    with pytest.raises(ValueError, match=r"^impl=auto: valid impls: torch, triton \(resolve auto"):
        verify_chain("onehot", P.expand(1, 2, 6), torch.tensor([[1]]), impl="auto")


@needs_triton
def test_every_sampled_tree_rule_takes_the_tree_kernel_at_config_time():
    """onehot and standard trees run as target_only (rules.TARGET_ONLY_LAW), so rule.impl=triton
    is valid for every rule on trees."""
    tree = ["+drafter=eagle3", "+tree=sglang_5_4_8", "rule.impl=triton", "temperature=0.7"]
    for rule in ("standard", "onehot", "target_only", "thresholded"):
        validate(cfg_of(f"+rule={rule}", *tree))


@needs_triton
def test_impl_triton_where_it_cannot_run_is_one_line(monkeypatch):
    """Compiled kernels on CPU tensors, or no triton at all: one line naming the key."""
    monkeypatch.setattr(kchain, "INTERPRETED", False)
    with pytest.raises(ConfigError) as e:
        verify_chain("onehot", P.expand(1, 2, 6), torch.tensor([[1]]), impl="triton")
    assert str(e.value).startswith("rule.impl=triton: tensors on cpu") and "\n" not in str(e.value)
    monkeypatch.setitem(sys.modules, "specbench.kernels.ngram", None)  # what an import without triton raises
    with pytest.raises(ConfigError, match=r"^drafter.impl=triton: needs the triton package"):
        NgramDrafter(1, 2, impl="triton").propose(DraftState(tokens=[torch.tensor([1, 2, 1])], k=2))


# --- the GPU path compiles; the benchmark runs -------------------------------------------------


COMPILE_FOR_H200 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specbench.kernels import chain, ngram, tree

def build(fn, consts, ints=(), floats=()):
    sig = {a: "constexpr" if a in consts else "i32" if a in ints else "fp32" if a in floats else
           "*i64" if a in ("X", "TOK", "FC", "NS", "tokens", "path", "num", "tried", "part_r", "part_p",
                          "TOKENS", "LENGTHS", "drafts", "out") else "*i32" if a == "counts" else "*fp32" for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
    triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})

for standard in (True, False):
    build(chain._chain_kernel, dict(V=128256, STANDARD=standard, KB=16, BLOCK=2048, TILES=32, SPLITS=2),
          ints=("k",), floats=("log_acc", "threshold_single"))
build(chain._chain_greedy_kernel, dict(V=128256, KB=16, BLOCK=4096), ints=("k",))
for greedy in (True, False):
    build(tree._tree_kernel, dict(V=128256, GREEDY=greedy, NB=16, DB=8, ZB=4, BLOCK=2048, TILES=32, SPLITS=2),
          ints=("N", "D"), floats=("threshold_single", "threshold_acc"))
build(ngram._ngram_kernel, dict(MAX_N=5, KB=8, BLOCK=1024), ints=("T", "min_n", "k"))
print("compiled")
"""


@needs_triton
@pytest.mark.skipif(CUDA, reason="a GPU compiles them in the tests above")
def test_kernels_compile_for_h200_without_a_gpu():
    """The interpreter does not type-check: compile every kernel for sm_90 (ptxas ships with triton)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE_FOR_H200], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]


@needs_triton
def test_kernel_bench_tiny(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "kernel_bench.py"), str(tmp_path), "--tiny",
                          "--kernels", "chain,tree,ngram,attention,attention_tiles,norm"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "kernel_bench.json").read_text())
    assert {"device", "torch", "triton", "git_sha", "date", "copy_bandwidth"} <= set(results)
    rows = [r for r in results["rows"] if "error" not in r]
    kinds = {"chain", "tree", "ngram", "attention", "norm"}
    assert {r["kernel"] for r in rows} == kinds and len(rows) == len(results["rows"])
    assert all(r["equal"] for r in rows if r["kernel"] in ("attention", "norm"))
    tiles = {r["launch"] for r in rows if r["kernel"] == "attention" and r["launch"]}  # attention_tiles' overrides
    assert {"num_warps=4 block_m=16", "num_warps=8 block_m=32", "num_warps=4"} <= tiles, tiles
    assert all(r["kernel_ms"] > 0 and r["floor_bytes"] > 0 and r["torch_ms"] > 0 for r in rows)


@needs_triton
def test_rule_host_bench_tiny(tmp_path):
    """experiments/rule_host_bench.py --tiny: every piece timed and its host operations counted
    at both batch sizes; the rule steps dispatch at least what their parts do."""
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "rule_host_bench.py"), str(tmp_path), "--tiny"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "rule_host_bench.json").read_text())
    assert {"device", "torch", "triton", "git_sha", "date", "k", "V"} <= set(results)
    assert [r["B"] for r in results["rows"]] == [1, 2]
    for row in results["rows"]:
        pieces = ("copy", "noise", "launch", "rule", "rule_torch", "tree", "tree_launch", "tree_torch")
        assert all(row[f"{p}_ms"] > 0 and row[f"{p}_ops"] > 0 for p in pieces), row
        assert all(row[f"{p}_p25_ms"] <= row[f"{p}_ms"] <= row[f"{p}_p75_ms"] for p in pieces), row
        assert row["sync_ops"] == 0 and row["rule_ops"] >= row["noise_ops"] + row["launch_ops"] + row["copy_ops"]
        assert row["tree_ops"] >= row["tree_launch_ops"] + row["noise_ops"]  # the tree step draws its own


def test_the_kernels_directory_hands_its_top_level_name_over(tmp_path):
    """Run from the repository root, `import kernels` finds kernels/ first; it must yield the
    Hugging Face `kernels` package that transformers (5.25 on) imports when there is one (here a
    stand-in on sys.path after the root); when there is none, the directory itself, as before."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("MARK = 'hub'\n")
    probe = "import kernels; print(getattr(kernels, 'MARK', kernels.__file__))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "hub", out.stderr[-2000:]
    env.pop("PYTHONPATH")  # and -S: no site-packages, so no hub package even where one is installed
    out = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.insert(0, ''); " + probe], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == str(ROOT / "kernels" / "__init__.py"), out.stderr[-2000:]
