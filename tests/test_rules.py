"""Acceptance rules on hand-made distributions: exact cases, then statistics.

Statistical tests use fixed seeds and alpha = 1e-3 (so a correct rule fails about once in a
thousand seeds). Sample sizes are chosen for power: with N = 200,000 draws over 6 categories a
chi-square test at alpha = 1e-3 detects a total-variation shift of 0.01 with power > 0.99
(non-centrality N * sum (dp^2 / p) >= 4 N TV^2 = 80, critical value 20.5 at 5 dof;
specbench.distcheck.power); the negative
control below shifts TV by about 0.1 and is rejected with p far below 1e-100.
"""

import pytest
import torch
from scipy import stats

from conftest import TOY_P as P, chi2_pvalue  # P: the target
from specbench.rules import greedy_chain_host, verify_chain, verify_siblings
from specbench.sampling import sample

Q = torch.tensor([0.20, 0.35, 0.05, 0.25, 0.10, 0.05])  # draft
N = 200_000


def one_position(rule, draft_tokens, draft_probs=None, seed=0, **kw):
    """k = 1, the same p at both positions: returns (first emitted token [N], accepted [N])."""
    g = torch.Generator().manual_seed(seed)
    target = P.expand(N, 2, 6)
    res = verify_chain(rule, target, draft_tokens.view(N, 1), draft_probs, generator=g, **kw)
    return res.tokens[:, 0], res.num_accepted


# --- exact cases -------------------------------------------------------------------------------


@pytest.mark.parametrize("V", [6, 1000, 49152])
def test_sample_draws_what_multinomial_draws(V):
    """sample skips multinomial's input checks (host syncs on CUDA) but keeps its draw: the
    same tokens from the same seed, on unnormalised rows with zero entries too."""
    g = torch.Generator().manual_seed(V)
    probs = torch.softmax(3 * torch.randn(64, V, generator=g), -1) * torch.rand(64, 1, generator=g)
    probs[:, ::3] = 0.0  # never drawn
    tokens = sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(tokens, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(7)).squeeze(-1))
    assert (tokens % 3 != 0).all()



def test_greedy_accepts_prefix_and_emits_argmax():
    p = torch.zeros(2, 4, 5)
    p[0, [0, 1, 2, 3], [1, 2, 3, 4]] = 1.0  # argmax path 1, 2, 3 then bonus 4
    p[1, [0, 1, 2, 3], [1, 0, 0, 0]] = 1.0
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    res = verify_chain("greedy", p, drafts)
    assert res.num_accepted.tolist() == [3, 1]
    assert res.tokens.tolist() == [[1, 2, 3, 4], [1, 0, -1, -1]]


def test_greedy_matches_its_definition_on_random_ragged_drafts():
    """Seed 4, 300 requests, k = 4, 6 tokens (near-ties likely, so drafts often match): accept
    the drafts while each equals the argmax (a -1, no draft, never does, even where the argmax
    is token 0), then emit the argmax where the round ends; -1 after it."""
    g = torch.Generator().manual_seed(4)
    B, k, V = 300, 4, 6
    p = torch.softmax(torch.randn(B, k + 1, V, generator=g), -1)
    drafts = torch.randint(0, 3, (B, k), generator=g)  # tokens 0..2: argmaxes often
    for b, n in enumerate(torch.randint(0, k + 1, (B,), generator=g).tolist()):
        drafts[b, n:] = -1
    res = verify_chain("greedy", p, drafts)
    best = p.argmax(-1)
    for b in range(B):
        a = 0
        while a < k and int(drafts[b, a]) == int(best[b, a]):
            a += 1
        assert int(res.num_accepted[b]) == a
        assert res.tokens[b].tolist() == drafts[b, :a].tolist() + [int(best[b, a])] + [-1] * (k - a)
    assert 0 < res.num_accepted.float().mean() < k  # both acceptances and rejections were met
    for b in range(B):  # the runner's host form, request by request
        m = int((drafts[b] >= 0).sum())
        emitted, a = greedy_chain_host(best[b].tolist(), drafts[b, :m].tolist())
        assert (emitted, a) == (res.tokens[b, : a + 1].tolist(), int(res.num_accepted[b])), b


def test_point_mass_target_accepts_or_rejects_surely():
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    for rule in ("onehot", "target_only", "thresholded"):
        assert verify_chain(rule, p, torch.tensor([[1]])).tokens.tolist() == [[1, 2]]
        # p(x) = 0: rejected, and the recovered token comes from p with x zeroed
        assert verify_chain(rule, p, torch.tensor([[0]])).tokens.tolist() == [[1, -1]]


def test_standard_with_q_equal_p_always_accepts():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(64, 4, 10, generator=g), -1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 10), 1, generator=g).view(64, 3)
    res = verify_chain("standard", p, drafts, p[:, :3].clone(), generator=g)
    assert (res.num_accepted == 3).all()
    assert (res.tokens[:, :3] == drafts).all() and (res.tokens[:, 3] >= 0).all()


def test_standard_under_a_point_mass_q_is_onehot_draw_for_draw():
    """The runner verifies a deterministic drafter's chain with onehot where standard is asked
    for: the two must emit the same tokens from the same generator state, ragged drafts included."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        B, k, V = 16, 4, 12
        p = torch.softmax(2 * torch.randn(B, k + 1, V, generator=g), -1)
        drafts = torch.multinomial(p[:, :k].reshape(-1, V), 1, generator=g).view(B, k)
        drafts[torch.rand(B, k, generator=g) < 0.2] = -1  # a -1 ends a row's chain
        drafts = torch.where(torch.cumprod(drafts >= 0, 1) > 0, drafts, -1)
        q = torch.nn.functional.one_hot(drafts.clamp(min=0), V).float()
        seed = int(torch.randint(0, 2**31, (), generator=g))
        standard = verify_chain("standard", p, drafts, q, generator=torch.Generator().manual_seed(seed))
        onehot = verify_chain("onehot", p, drafts, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(standard.tokens, onehot.tokens) and torch.equal(standard.num_accepted, onehot.num_accepted)


def test_short_drafts_end_with_a_bonus_from_p_at_that_position():
    p = torch.zeros(1, 4, 5)
    p[0, 0, 1] = p[0, 1, 2] = p[0, 2, 4] = p[0, 3, 0] = 1.0
    res = verify_chain("onehot", p, torch.tensor([[1, 2, -1]]))
    assert res.num_accepted.tolist() == [2]
    assert res.tokens.tolist() == [[1, 2, 4, -1]]  # bonus from position 3, not a rejection
    res = verify_chain("onehot", p, torch.tensor([[-1, -1, -1]]))
    assert res.tokens.tolist() == [[1, -1, -1, -1]]


def test_thresholds_relax_acceptance():
    p = P.expand(1, 2, 6)
    x = torch.tensor([[1]])  # p(x) = 0.25
    res = verify_chain("thresholded", p, x, threshold_single=0.25)
    assert res.num_accepted.item() == 1  # p(x) >= threshold_single: accepted whatever the coin
    with pytest.raises(ValueError, match="takes no thresholds"):
        verify_chain("onehot", p, x, threshold_acc=0.5)


def test_standard_without_draft_probs_fails_clearly():
    with pytest.raises(ValueError, match="rule=standard needs draft_probs"):
        verify_chain("standard", P.expand(1, 2, 6), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="unknown rule"):
        verify_chain("typical", P.expand(1, 2, 6), torch.tensor([[1]]))


# --- statistics on the write-up's toy distributions ----------------------------------------


def test_standard_is_lossless_and_accepts_sum_min_p_q():
    g = torch.Generator().manual_seed(20261031)
    drafts = torch.multinomial(Q, N, replacement=True, generator=g)
    tokens, acc = one_position("standard", drafts, Q.expand(N, 1, 6), seed=1)
    assert chi2_pvalue(tokens, P) > 1e-3
    # E[accept] = sum min(p, q) = 0.70; sd of the mean is sqrt(.21 / N) = 0.001
    assert abs(acc.double().mean().item() - 0.70) < 0.005


@pytest.mark.parametrize("rule", ["onehot", "target_only", "thresholded"])
def test_point_mass_rules_are_lossless_and_accept_p_of_x(rule):
    drafts = torch.full((N,), 1)  # argmax Q
    tokens, acc = one_position(rule, drafts, seed=2)
    assert chi2_pvalue(tokens, P) > 1e-3
    assert abs(acc.double().mean().item() - 0.25) < 0.005


def test_relaxed_threshold_changes_the_distribution():
    tokens, acc = one_position("thresholded", torch.full((N,), 1), seed=3, threshold_acc=0.5)
    assert abs(acc.double().mean().item() - 0.50) < 0.005  # accept when u < 0.25 / 0.5
    assert chi2_pvalue(tokens, P) < 1e-100


def test_negative_control_missing_residual_is_detected():
    """Resampling from p instead of the residual (a classic bug) must fail the same check."""
    g = torch.Generator().manual_seed(4)
    drafts = torch.multinomial(Q, N, replacement=True, generator=g)
    tokens, acc = one_position("standard", drafts, Q.expand(N, 1, 6), seed=5)
    rejected = acc == 0
    tokens = tokens.clone()
    tokens[rejected] = torch.multinomial(P, int(rejected.sum()), replacement=True, generator=g)
    assert chi2_pvalue(tokens, P) < 1e-100


@pytest.mark.parametrize("rule,k", [("standard", 2), ("onehot", 3), ("target_only", 2)])
def test_decoding_loop_sequences_are_iid_from_p(rule, k):
    """Run whole rounds until every sequence has 3 tokens: with a context-free target the
    joint over the 216 outcomes must be P x P x P. Catches wrong bookkeeping after rejection
    (e.g. keeping drafts after the first rejection) that the one-position test cannot see.
    N = 100,000 sequences; expected counts >= 100,000 * 0.03^3 = 2.7, so the rarest cells are
    pooled below (expected < 5)."""
    n, L = 100_000, 3
    g = torch.Generator().manual_seed(7)
    out = torch.full((n, L + k + 1), -1)
    length = torch.zeros(n, dtype=torch.long)
    while (length < L).any():
        drafts = torch.multinomial(Q, n * k, replacement=True, generator=g).view(n, k)
        if rule != "standard":
            drafts = torch.full((n, k), 1)
        q = Q.expand(n, k, 6) if rule == "standard" else None
        res = verify_chain(rule, P.expand(n, k + 1, 6), drafts, q, generator=g)
        for j in range(k + 1):
            emit = (res.tokens[:, j] >= 0) & (length < L)
            out[emit, length[emit]] = res.tokens[emit, j]
            length += emit.long()
    codes = out[:, 0] * 36 + out[:, 1] * 6 + out[:, 2]
    p = P.double() / P.double().sum()
    joint = (p[:, None, None] * p[None, :, None] * p[None, None, :]).flatten()
    counts = torch.bincount(codes, minlength=216).double()
    expected = joint * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    assert stats.chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


# --- one tree level: sibling candidates ----------------------------------------------------


def test_siblings_exact_cases():
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    cands = torch.tensor([[1, 2, -1], [3, -1, -1], [-1, -1, -1]])
    res = verify_siblings("target_only", p, cands, generator=torch.Generator().manual_seed(0))
    assert res.accepted.tolist()[0] == 1 and res.token.tolist()[0] == 2  # the second sibling
    assert res.accepted.tolist()[1:] == [-1, -1]
    assert res.token[1].item() in (0, 1) and res.token[2].item() == 1  # padding never zeroes token 0
    greedy = verify_siblings("greedy", p, cands)
    assert greedy.accepted.tolist() == [1, -1, -1] and greedy.token.tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="tree level"):
        verify_siblings("typical", p, cands)


def test_recursive_rejection_decides_each_candidate_as_the_sequential_walk_does():
    """_recursive_choice makes the m tests at once; the definition walks the candidates one by
    one, zeroing each refused one in a residual over V. Seed 10, 2,000 rows of 5 candidates
    over 6 tokens (repeats and -1 padding among them), float64: the same accepted index, from
    torch tensors and from numpy arrays (verify_trees' host walk) alike."""
    from specbench.rules import _recursive_choice

    g = torch.Generator().manual_seed(10)
    B, m, V = 2000, 5, 6
    p = torch.softmax(2 * torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    p[torch.rand(B, V, generator=g) < 0.2] = 0.0  # tokens p never emits
    c = torch.randint(0, V, (B, m), generator=g)
    c[torch.rand(B, m, generator=g) < 0.2] = -1
    valid, coins = c >= 0, torch.rand(B, m, generator=g, dtype=torch.float64)
    args = (p.gather(-1, c.clamp(min=0)), p.sum(-1), c.clamp(min=0), valid, coins)
    got = _recursive_choice(*args)
    assert got.tolist() == _recursive_choice(*(x.numpy() for x in args)).tolist()  # the host walk's numpy form
    for b in range(B):
        residual, want = p[b].clone(), -1
        for j in range(m):
            if not valid[b, j]:
                continue
            if coins[b, j] * residual.sum() < residual[c[b, j]]:
                want = j
                break
            residual[c[b, j]] = 0.0
        assert int(got[b]) == want, (b, c[b].tolist(), p[b].tolist())
    assert (got >= 0).any() and (got < 0).any() and (got >= 2).any()


def test_target_only_choice_is_the_same_on_numpy_and_torch():
    """verify_trees' host walk runs SGLang's per-level test on numpy arrays (seed 11, 1,000
    levels of 4 candidates, some without mass, thresholds 1 and relaxed)."""
    from specbench.rules import _target_only_choice

    g = torch.Generator().manual_seed(11)
    p_c = torch.rand(1000, 4, generator=g, dtype=torch.float64) / 4
    p_c[torch.rand(1000, 4, generator=g) < 0.3] = 0.0
    coin = torch.rand(1000, generator=g, dtype=torch.float64)
    for single, acc in ((1.0, 1.0), (0.2, 0.5)):
        want = _target_only_choice(p_c, coin, single, acc)
        assert want.tolist() == _target_only_choice(p_c.numpy(), coin.numpy(), single, acc).tolist()
        assert (want >= 0).any() and (want < 0).any()


def test_siblings_tree_of_three_is_lossless_and_accepts_their_mass():
    """The write-up's tree: candidates 1, 3, 0 (the 3 most likely under Q); accept 0.75."""
    cands = torch.tensor([1, 3, 0]).expand(N, 3)
    res = verify_siblings("target_only", P.expand(N, 6), cands, generator=torch.Generator().manual_seed(8))
    assert chi2_pvalue(res.token, P) > 1e-3
    assert abs((res.accepted >= 0).double().mean().item() - 0.75) < 0.005


def test_siblings_thresholded_half_always_accepts_and_shifts_tv_by_035():
    cands = torch.tensor([1, 3, 0]).expand(N, 3)
    res = verify_siblings(
        "thresholded", P.expand(N, 6), cands, generator=torch.Generator().manual_seed(9), threshold_acc=0.5
    )
    assert (res.accepted >= 0).all()
    freq = torch.bincount(res.token, minlength=6).double() / N
    # u < 0.25/0.5 -> 1; u < 0.35/0.5 -> 3; else 0: [0.3, 0.5, 0, 0.2, 0, 0]
    assert torch.allclose(freq, torch.tensor([0.3, 0.5, 0, 0.2, 0, 0], dtype=torch.double), atol=0.005)
    assert abs(0.5 * (freq - P.double()).abs().sum().item() - 0.35) < 0.005
