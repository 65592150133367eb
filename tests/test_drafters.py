"""The model drafters and the synthetic control: proposals on known inputs, greedy equality with
the baseline for every drafter and tree shape, batches of requests, KV accounting, and clear errors."""

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from conftest import make_engine
from tree_rounds import features_of

from specbench.config import ConfigError
from specbench.drafters.base import DraftState
from specbench.drafters.draft_model import DraftModelDrafter, save_draft_model
from specbench.drafters.eagle import EagleDrafter, EagleStepper
from specbench.drafters.layerskip import LayerSkipDrafter, truncated
from specbench.drafters.lm_stepper import LMStepper
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.ngram_trie import NgramTrieDrafter
from specbench.drafters.synthetic import SyntheticDrafter
from specbench.engines.native import block as native_block
from specbench.heads import EagleHeadConfig, build_head, save_head
from specbench.kvaccount import Policy, request_slots
from specbench.runner import Speculation, decode_requests
from specbench.sampling import SamplingParams, probs_from_logits
from specbench.tree import compile_tree, with_root

GREEDY = SamplingParams(0.0, 0, 1.0)
PROMPTS = [torch.tensor([0, 5, 6, 7, 5, 6]), torch.tensor([0, 9, 10, 11, 12]), torch.tensor([0, 3, 4, 3, 4, 3])]
NATIVE_CHAIN = ("draft_model", "layerskip")  # drafters whose chains run batched on the native engine
BATCHED_CHAIN = NATIVE_CHAIN + ("eagle", "eagle3")  # drafters whose chains run batched over cache rows
SHAPES = {"chain3": (3, 1, None), "3_1_4": (3, 1, 4), "2_2_4": (2, 2, 4), "5_4_8": (5, 4, 8)}


@pytest.fixture(scope="module")
def target(tiny_model):
    return tiny_model


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    """A 1-layer draft sharing the target's embedding and LM head, its layer copied from the
    target's first: plausible, not exact."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    draft = LlamaForCausalLM(config)
    draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    path = tmp_path_factory.mktemp("draft")
    save_draft_model(draft, path, dtype=torch.float32)
    return str(path)


@pytest.fixture(scope="module")
def head_dirs(target, tmp_path_factory):
    """Random (untrained) EAGLE and EAGLE-3 heads for the tiny target."""
    dirs = {}
    for kind in ("eagle", "eagle3"):
        torch.manual_seed(0)
        head = build_head(EagleHeadConfig.from_target(target.config, kind, draft_vocab_size=64), target)
        dirs[kind] = str(save_head(head, tmp_path_factory.mktemp(kind)))
    return dirs


def make_drafter(name, target, draft_dir, head_dirs, params=GREEDY):
    drafter = {
        "ngram": lambda: NgramDrafter(2, 3),
        "ngram_trie": lambda: NgramTrieDrafter(capacity=10_000, max_trie_depth=8, min_match_window=1,
                                               max_match_window=4, min_bfs_breadth=1, max_bfs_breadth=3),
        "draft_model": lambda: DraftModelDrafter(draft_dir, "greedy", params),
        "layerskip": lambda: LayerSkipDrafter(1, "greedy", params),
        "eagle": lambda: EagleDrafter("eagle", head_dirs["eagle"], "greedy", params),
        "eagle3": lambda: EagleDrafter("eagle3", head_dirs["eagle3"], "greedy", params),
    }[name]()
    if hasattr(drafter, "attach"):
        drafter.attach(target)
    return drafter


def run(target, spec, prompts=PROMPTS, tokens=24, params=GREEDY, seed=0, engine="hf", rows=1):
    """Every prompt through the runner: the hf engine one at a time, or native in a batch."""
    layers = tuple(getattr(spec.drafter, "feature_layers", ())) if spec else ()
    return decode_requests(make_engine(engine, target, rows, feature_layers=layers), prompts, params=params,
                           max_new_tokens=tokens, eos_ids=frozenset(), generator=torch.Generator().manual_seed(seed), spec=spec)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["ngram_trie", "draft_model", "layerskip", "eagle", "eagle3"])
def test_greedy_equality_every_drafter_and_tree(name, shape, target, draft_dir, head_dirs):
    """The hf engine's baseline, one request at a time, against speculation on the native
    engine with every prompt in one batch (ragged acceptance, batched drafting)."""
    k, topk, tokens = SHAPES[shape]
    base = [r.tokens for r in run(target, None)]
    drafter = make_drafter(name, target, draft_dir, head_dirs)
    records = run(target, Speculation(drafter, "standard", k, {}, topk, tokens), engine="native", rows=len(PROMPTS))
    assert [r.tokens for r in records] == base
    assert sum(sum(r.drafted) for r in records) > 0  # the drafter did propose
    most = (tokens or k * topk + 1) - 1
    assert all(d <= most for r in records for d in r.drafted)


def grow_histories(histories: dict, got, order, accepted: dict) -> dict:
    """Request i keeps accepted[i] of its drafts in `got`, then gains one more token (40 + i),
    in place -> the tokens each request gained."""
    added = {}
    for b, i in enumerate(order):
        path = got.tokens[b, : accepted[i]].tolist() + [40 + i]
        histories[i] = torch.cat([histories[i], torch.tensor(path)])
        added[i] = len(path)
    return added


def batch_state(drafter, target, histories, ids, shape):
    """The runner's state for these requests; EAGLE drafters get the target's real features."""
    k, topk, tokens = SHAPES[shape]
    features = None
    if drafter.feature_layers:
        with torch.inference_mode():
            hidden = [target(h[None], output_hidden_states=True).hidden_states for h in histories]
        features = [torch.cat([hs[i][0, :-1] for i in drafter.feature_layers], -1) for hs in hidden]  # [T - 1, D]
    return DraftState(tokens=list(histories), k=k, topk=topk, num_draft_tokens=tokens, features=features,
                      request_ids=tuple(ids))


def draft_path(proposal, b, column):
    """Request b's draft tokens from the root down to `column` (none for -1): an accepted path."""
    M = proposal.tokens.shape[1]
    parents = torch.arange(M) if proposal.is_chain else proposal.parents[b]  # a chain's column i hangs on node i
    path = []
    while column >= 0:
        path.append(int(proposal.tokens[b, column]))
        column = int(parents[column]) - 1
    return path[::-1]


@pytest.mark.parametrize("shape", ["chain3", "5_4_8"])
@pytest.mark.parametrize("name", ["draft_model", "layerskip", "eagle", "eagle3"])
def test_a_batch_drafts_each_request_as_a_drafter_of_its_own(name, shape, target, draft_dir, head_dirs, monkeypatch):
    """Three requests of different lengths, drafted together over rounds in which their histories
    grow by different amounts and the batch order changes, propose exactly what a batch-1 drafter
    per request proposes; each request's cache reads only its new tokens; `release` forgets a
    request, and its id, reused for a new prompt, starts from an empty cache. (Chains of the
    draft_model / layerskip drafters run batched on the native engine, EAGLE's over one head
    cache: their caches are rows, and their reads are checked in
    test_batched_native_chains_propose_what_the_per_request_path_proposes and
    test_batched_eagle_chains_propose_what_the_per_request_path_proposes.)"""
    reads = []  # (stepper, tokens read) for every forward of a stepper
    for cls, arg in ((LMStepper, 0), (EagleStepper, 1)):  # the tokens argument of _read
        def counted(self, *args, _read=cls._read, _arg=arg):
            reads.append((self, args[_arg].shape[1]))
            return _read(self, *args)
        monkeypatch.setattr(cls, "_read", counted)

    def first_read(stepper):
        return next(n for s, n in reads if s is stepper)

    k, topk, tokens = SHAPES[shape]
    M = k if tokens is None else tokens - 1
    # caches: rows of one cache, not steppers (chains and trees of every model drafter)
    native = name in BATCHED_CHAIN
    batch = make_drafter(name, target, draft_dir, head_dirs)
    alone = {i: make_drafter(name, target, draft_dir, head_dirs) for i in (7, 3, 11)}
    histories = {7: PROMPTS[0], 3: PROMPTS[1], 11: PROMPTS[2]}

    def propose(order):
        reads.clear()
        got = batch.propose(batch_state(batch, target, [histories[i] for i in order], order, shape))
        assert got.tokens.shape == (3, M) and got.num_tokens.shape == (3,) and got.probs is None
        assert got.is_chain == (shape == "chain3")
        for b, i in enumerate(order):
            want = alone[i].propose(batch_state(alone[i], target, [histories[i]], (), shape))
            m = int(want.num_tokens[0])
            assert int(got.num_tokens[b]) == m > 0
            assert got.tokens[b, :m].tolist() == want.tokens[0, :m].tolist()
            assert got.tokens[b, m:].eq(-1).all()
            if not got.is_chain:
                assert got.parents[b, :m].tolist() == want.parents[0, :m].tolist()
                assert got.parents[b, m:].eq(0).all()
        return got, {i: (batch.chain.row_of if native else batch.steppers).get(i) for i in order}

    def grow(got, order, accepted):
        """Append to each request its path to draft column accepted[i] (-1: none, None: its last)
        and one more token -> the tokens each request gained."""
        added = {}
        for b, i in enumerate(order):
            column = int(got.num_tokens[b]) - 1 if accepted[i] is None else accepted[i]
            path = draft_path(got, b, column) + [20 + i]
            histories[i] = torch.cat([histories[i], torch.tensor(path)])
            added[i] = len(path)
        return added

    got, steppers = propose((7, 3, 11))
    assert len({c if native else id(c) for c in steppers.values()}) == 3
    added = grow(got, (7, 3, 11), {7: -1, 3: 0, 11: None})
    got, again = propose((11, 7, 3))
    assert all(again[i] is steppers[i] or (native and again[i] == steppers[i]) for i in steppers)  # the same cache per request
    if not native:
        assert all(1 <= first_read(steppers[i]) <= added[i] for i in added)  # no request read its prefix again

    batch.release([3, 99])  # 3 finished; 99 was never seen
    assert set(batch.chain.row_of if native else batch.steppers) == {7, 11}
    grow(got, (11, 7, 3), {11: -1, 7: None, 3: -1})
    histories[3] = torch.tensor([0, 9, 10, 11, 30, 31])  # a new request under the old id, same prefix
    alone[3] = make_drafter(name, target, draft_dir, head_dirs)
    got, steppers = propose((3, 11, 7))
    if not native:
        assert steppers[3] is not again[3]
        assert first_read(steppers[3]) == len(histories[3]) - bool(batch.feature_layers)  # every token (pair): a clean cache


# defaults; too small: the cache grows; compiled layers (engine.compile)
@pytest.mark.parametrize("sizing", [{}, {"rows": 1, "max_length": 8}, {"compile": True}])
@pytest.mark.parametrize("name", NATIVE_CHAIN)
def test_batched_native_chains_propose_what_the_per_request_path_proposes(name, sizing, target, draft_dir, monkeypatch):
    """Three requests of different lengths over three rounds of ragged growth (a fully rejected
    chain rolled back, a fully accepted one, a request released and its slot taken by a new id):
    the batched chains equal expand.draft over one LMStepper per request, token for token, with
    eager or compiled layers; a new request is prefilled with its history less the last token,
    and a known one reads only what it gained."""
    from specbench.drafters.expand import Steppers, draft
    from specbench.engines.native import NativeEngine

    prefills, forwards = [], []
    monkeypatch.setattr(NativeEngine, "prefill_rows", lambda self, rows, ids, _f=NativeEngine.prefill_rows:
                        prefills.append([len(x) for x in ids]) or _f(self, rows, ids))  # a call a round: new requests together
    monkeypatch.setattr(NativeEngine, "forward", lambda self, tokens, *a, _f=NativeEngine.forward: forwards.append(tokens.shape[1]) or _f(self, tokens, *a))
    monkeypatch.setattr(NativeEngine, "forward_at", lambda self, tokens, *a, _f=NativeEngine.forward_at:
                        forwards.append(tokens.shape[1]) or _f(self, tokens, *a))  # a greedy chain's steps

    k = 4
    batch = make_drafter(name, target, draft_dir, None)
    if sizing:
        batch.attach(target, **sizing)
    steppers = Steppers(lambda: LMStepper(batch.model))
    if sizing.get("compile"):
        assert batch.chain.ready() and batch.chain.engine._layer is not native_block
    histories = {7: PROMPTS[0], 3: torch.tensor([0, 9]), 11: torch.cat([PROMPTS[2], PROMPTS[1]])}

    def propose(order):
        prefills.clear()
        forwards.clear()
        state = DraftState(tokens=[histories[i] for i in order], k=k, request_ids=tuple(order))
        got = batch.propose(state)
        want = draft(steppers, state, "greedy", GREEDY, None)
        assert got.is_chain and got.probs is None and got.num_tokens.tolist() == [k] * len(order)
        assert got.tokens.dtype == torch.int64 and got.tokens.tolist() == want.tokens.tolist()
        assert len(forwards) == k  # one batched sync, k - 1 batched steps
        return got

    def grow(got, order, accepted):
        return grow_histories(histories, got, order, accepted)

    got = propose((7, 3, 11))
    assert [sorted(p) for p in prefills] == [sorted(len(h) - 1 for h in histories.values())] and forwards[0] == 1
    added = grow(got, (7, 3, 11), {7: 0, 3: k, 11: 2})  # 7: all rejected (rolled back); 3: all accepted
    got = propose((11, 7, 3))
    assert prefills == [] and forwards[0] == 2  # 3 read its last draft and the bonus token; 7 and 11 one token
    assert forwards[0] <= max(added.values())

    batch.release([3, 99])  # 3 finished; 99 was never seen
    steppers.release([3, 99])
    grow(got, (11, 7), {11: 1, 7: k})
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new request, in 3's row
    got = propose((12, 11, 7))
    assert prefills == [[len(histories[12]) - 1]]
    grow(got, (12, 11, 7), {12: 3, 11: 0, 7: 1})
    histories[7] = histories[7][:-3]  # a history that lost tokens the row holds: cut back, read again
    propose((7, 12, 11))


def test_ngram_chain_greedy_equality(target):
    base = [r.tokens for r in run(target, None)]
    records = run(target, Speculation(NgramDrafter(2, 3), "onehot", 4))
    assert [r.tokens for r in records] == base


def test_a_draft_equal_to_the_target_proposes_its_greedy_continuation(target):
    """Layer-skip at full depth is the target itself: its chain is the target's own greedy
    continuation, and its tree's first child under the root is the target's argmax."""
    history = torch.tensor([0, 5, 6, 7])
    L = target.config.num_hidden_layers
    drafter = make_drafter("layerskip", target, None, None)
    drafter.layers = L
    drafter.attach(target)
    expected = [r.tokens for r in run(target, None, prompts=[history], tokens=5)][0]
    # the runner's first token comes from the prefill; the drafter continues after it
    state = DraftState(tokens=[torch.cat([history, torch.tensor(expected[:1])])], k=4)
    proposal = drafter.propose(state)
    assert proposal.is_chain and proposal.tokens[0].tolist() == expected[1:5]
    tree = drafter.propose(DraftState(tokens=state.tokens, k=3, topk=2, num_draft_tokens=6))
    m = int(tree.num_tokens[0])
    assert m == 5
    buffers = compile_tree(with_root(tree.parents[0, :m]))
    first_child = int(buffers.next_token[0]) - 1  # tree node -> draft column
    assert int(tree.tokens[0, first_child]) == expected[1]


def test_truncated_view_shares_weights_and_leaves_the_target_whole(target):
    L = target.config.num_hidden_layers
    view = truncated(target, 1)
    assert view.model.layers[0] is target.model.layers[0] and len(view.model.layers) == 1
    assert len(target.model.layers) == L and target.config.num_hidden_layers == L
    with pytest.raises(ConfigError, match="drafter.layers=9"):
        truncated(target, 9)


def test_probabilistic_chain_returns_the_distributions_it_sampled(target, draft_dir):
    params = SamplingParams(1.0, 0, 1.0)
    drafter = DraftModelDrafter(draft_dir, "probabilistic", params)
    drafter.attach(target)
    proposal = drafter.propose(DraftState(tokens=[torch.tensor([0, 5, 6])], k=3))
    assert proposal.probs.shape == (1, 3, target.config.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(1, 3))
    q_x = proposal.probs[0].gather(-1, proposal.tokens[0].unsqueeze(-1))
    assert bool((q_x > 0).all())  # every token was drawn from its q


@pytest.mark.parametrize("name", NATIVE_CHAIN)
def test_a_probabilistic_batch_samples_each_step_in_batch_order(name, target, draft_dir):
    """One generator per drafter, one draw per step for the whole batch (requests in batch order):
    the batch's tokens are what that generator draws from the q it returns, step by step, and
    each request's q is the draft model's distribution after its history and its earlier drafts."""
    params = SamplingParams(4.0, 0, 1.0)  # hot: the draws depend on the generator's state
    ctor = {"draft_model": lambda: DraftModelDrafter(draft_dir, "probabilistic", params, seed=3),
            "layerskip": lambda: LayerSkipDrafter(1, "probabilistic", params, seed=3)}[name]
    batch = ctor()
    batch.attach(target)
    got = batch.propose(DraftState(tokens=PROMPTS, k=3, request_ids=(5, 6, 7)))
    assert got.probs.shape == (3, 3, target.config.vocab_size) and got.num_tokens.tolist() == [3, 3, 3]
    assert got.probs.dtype == torch.float32 and got.is_chain
    torch.testing.assert_close(got.probs.sum(-1), torch.ones(3, 3))
    assert bool((got.probs.gather(-1, got.tokens.unsqueeze(-1)) > 0).all())  # every token was drawn from its q
    g = torch.Generator().manual_seed(3)
    for i in range(3):
        assert torch.multinomial(got.probs[:, i], 1, generator=g).squeeze(-1).tolist() == got.tokens[:, i].tolist()
    with torch.inference_mode():
        for b, history in enumerate(PROMPTS):
            ids = torch.cat([history, got.tokens[b, :2]])[None]
            want = probs_from_logits(batch.model(ids).logits[0, -3:], params)  # [k, V]
            torch.testing.assert_close(got.probs[b], want, atol=1e-5, rtol=1e-4)


def test_probabilistic_draft_model_under_standard_keeps_the_text_distribution_at_temperature_zero(target, draft_dir):
    """At temperature 0 every rule is the argmax test, whatever the drafting method."""
    base = [r.tokens for r in run(target, None)]
    drafter = DraftModelDrafter(draft_dir, "probabilistic", GREEDY)
    drafter.attach(target)
    assert [r.tokens for r in run(target, Speculation(drafter, "standard", 3))] == base


def test_bad_drafter_inputs_name_the_key(draft_dir, head_dirs):
    with pytest.raises(ConfigError, match="drafter.draft_sample_method=sometimes"):
        DraftModelDrafter(draft_dir, "sometimes", GREEDY)
    with pytest.raises(ConfigError, match="drafter.path=specbench://checkpoints/nope"):
        DraftModelDrafter("specbench://checkpoints/nope", "greedy", GREEDY)
    with pytest.raises(ConfigError, match="holds an eagle3 head, not eagle"):
        EagleDrafter("eagle", head_dirs["eagle3"], "greedy", GREEDY)
    with pytest.raises(ConfigError, match="drafter.acceptance_rates"):
        SyntheticDrafter([1.5], 1, GREEDY)
    with pytest.raises(ConfigError, match="drafter.coins=sobol"):
        SyntheticDrafter([0.5], 1, GREEDY, coins="sobol")


def test_synthetic_control_gives_the_prescribed_tokens_per_round(target):
    """a = 0.6, k = 4: E[tokens per round] = (1 - a^5) / (1 - a) = 2.3056. Seed 0, 3 prompts
    x 200 tokens (about 260 rounds); per-round sd is about 1.3, so the mean's sd is about
    0.08 and the 0.3 tolerance is about 4 sd."""
    drafter = SyntheticDrafter([0.6], 1, GREEDY, seed=0)
    drafter.attach(target)
    records = run(target, Speculation(drafter, "standard", 4), tokens=200)
    rounds = sum(r.rounds for r in records)
    per_round = (sum(len(r.tokens) for r in records) - len(records)) / rounds
    assert abs(per_round - (1 - 0.6**5) / 0.4) < 0.3
    accepted = [a for r in records for a in r.accepted]
    # position 1 is accepted in a fraction a of the rounds
    assert abs(sum(a >= 1 for a in accepted) / len(accepted) - 0.6) < 0.1


def test_synthetic_coins_stop_each_prefix_at_its_first_failure():
    """forced_acceptance over a batch: certain rates give every draft or none; a request never
    accepts more than it drafted. Per-position rates 0.9 then 0.5, 20000 requests of 3 drafts,
    seed 0: the three conditional shares' sd are 0.002, 0.004 and 0.005, so the tolerance 0.03
    is over 5 sd; a rule off by 0.1 at any position fails it."""
    num = [0, 1, 3, 2, 3]
    assert SyntheticDrafter([1.0], 1, GREEDY).forced_acceptance(num) == num
    assert SyntheticDrafter([0.0], 1, GREEDY).forced_acceptance(num) == [0] * 5
    assert SyntheticDrafter([1.0], 1, GREEDY).forced_acceptance([]) == []
    accepted = np.array(SyntheticDrafter([0.9, 0.5], 1, GREEDY, seed=0).forced_acceptance([3] * 20000))
    assert accepted.min() >= 0 and accepted.max() <= 3
    assert abs((accepted >= 1).mean() - 0.9) < 0.03
    assert abs((accepted >= 2).sum() / (accepted >= 1).sum() - 0.5) < 0.03
    assert abs((accepted >= 3).sum() / (accepted >= 2).sum() - 0.5) < 0.03  # the last rate repeats


@pytest.mark.parametrize("a", [0.6, 0.7, 0.8, 0.9])
def test_quasi_coins_realise_the_prescribed_rates_in_a_few_hundred_rounds(a):
    """coins="quasi": over about 300 requests' rounds (batches of 1, 8 and 48; k = 1, 4, 8;
    seeds 0 .. 4), tokens per round are within 2 % of (1 - a^(k+1)) / (1 - a) and position 1 is
    accepted in a share within 0.01 of a. It is deterministic given the seed, so there is no
    power to state; i.i.d. coins at this size scatter by 2.8 % (sd) and fail the first bound in
    93 of these 180 cases. The same law as "random": 20000 requests of 3 drafts at
    rates 0.9 then 0.5 give conditional shares within 0.002."""
    for k in (1, 4, 8):
        expected = (1 - a ** (k + 1)) / (1 - a)
        for seed in range(5):
            for batch in (1, 8, 48):
                drafter = SyntheticDrafter([a], 1, GREEDY, seed=seed, coins="quasi")
                accepted = np.concatenate([drafter.forced_acceptance([k] * batch) for _ in range(300 // batch)])
                assert abs((accepted.mean() + 1) / expected - 1) < 0.02, (k, seed, batch)
                assert abs((accepted >= 1).mean() - a) < 0.01
    accepted = np.array(SyntheticDrafter([0.9, 0.5], 1, GREEDY, coins="quasi").forced_acceptance([3] * 20000))
    assert abs((accepted >= 1).mean() - 0.9) < 0.002
    assert abs((accepted >= 2).sum() / (accepted >= 1).sum() - 0.5) < 0.002
    assert abs((accepted >= 3).sum() / (accepted >= 2).sum() - 0.5) < 0.002
    num = [0, 2, 1, 8]
    assert all(0 <= got <= n for got, n in zip(SyntheticDrafter([a], 1, GREEDY, coins="quasi").forced_acceptance(num), num))


def test_kv_slots_under_both_policies_by_hand():
    # prompt 10; round 1 drafts 4 accepts 2; round 2 drafts 4 accepts 4; round 3 drafts 0
    p = Policy(k=4, topk=1, num_draft_tokens=None, lookahead=4)
    slots = request_slots(10, 10, [4, 4, 0], [2, 4, 0], p)
    # used: 10 + 3 + 5 + 1 = 19, the prompt and the 10 tokens (the prefill's and 3 + 5 + 1) but the last
    # vLLM: round 1 needs 10 + 1 + 4 + 4 = 19, round 2 13 + 9 = 22, round 3 18 + 1 + 0 + 4 = 23
    # SGLang: 2 x max(4, 5) = 10 ahead of the committed length: 10, 13, 18 -> peak 28
    assert slots == {"used": 19, "vllm": 23, "sglang": 28}
    # EOS at the second of round 2's five tokens: 1 + 3 + 2 = 6 generated; round 2 reserved its slots all the same
    assert request_slots(10, 6, [4, 4], [2, 4], p) == {"used": 15, "vllm": 22, "sglang": 23}
    # SGLang's Llama default (5, 4, 8): 2 x max(20, 8) = 40 slots ahead of the committed length
    assert Policy(k=5, topk=4, num_draft_tokens=8).sglang_per_round == 40
    assert Policy(k=3, topk=1, num_draft_tokens=4).sglang_per_round == 8


EAGLE_KINDS = ("eagle", "eagle3")


@pytest.mark.parametrize("name", EAGLE_KINDS)
def test_head_forward_over_rows_matches_the_head_forward(name, target, head_dirs):
    """heads.hidden_states_rows over a StaticHeadCache (ragged rows, rows out of order, padding,
    a rolled-back row) gives the head's own forward over a HeadCache, in fp32."""
    from specbench.heads import HeadCache, StaticHeadCache, hidden_states_rows, load_head

    head = load_head(head_dirs[name], target)
    D = head.fc.in_features if name == "eagle3" else head.config.hidden_size
    torch.manual_seed(1)
    lengths = (5, 2, 7)
    feats = [torch.randn(n, D) for n in lengths]
    toks = [torch.randint(0, 96, (n,)) for n in lengths]
    cache = StaticHeadCache(head.config, 4, 16, "cpu", torch.float32)
    rows = [2, 0, 3]
    with torch.inference_mode():
        # round 1: the first 3 (or fewer) pairs of each; round 2: roll row 0 back to 1, read the rest
        first = [min(3, n) for n in lengths]
        q = max(first)
        F_ = torch.zeros(3, q, D)
        T_ = torch.zeros(3, q, dtype=torch.int64)
        for b, n in enumerate(first):
            F_[b, :n], T_[b, :n] = feats[b][:n], toks[b][:n]
        hidden_states_rows(head, F_, T_, cache, rows, first)
        assert cache.lengths[rows].tolist() == first
        cache.lengths[0] = 1  # batch row 1 (cache row 0) keeps 1 pair
        starts = [3, 1, 3]
        counts = [n - s for n, s in zip(lengths, starts)]
        q = max(counts)
        F_ = torch.zeros(3, q, D)
        T_ = torch.zeros(3, q, dtype=torch.int64)
        for b, (s, n) in enumerate(zip(starts, counts)):
            F_[b, :n], T_[b, :n] = feats[b][s:], toks[b][s:]
        got = hidden_states_rows(head, F_, T_, cache, rows, counts)
        assert cache.lengths[rows].tolist() == list(lengths)
        for b, (s, n) in enumerate(zip(starts, counts)):
            want = head.hidden_states(feats[b][None], toks[b][None], torch.arange(lengths[b])[None], HeadCache())
            torch.testing.assert_close(got[b, :n], want[0, s:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sizing", [{}, {"rows": 1, "max_length": 8}])  # defaults; too small: the cache grows
@pytest.mark.parametrize("name", EAGLE_KINDS)
def test_batched_eagle_chains_propose_what_the_per_request_path_proposes(name, sizing, target, head_dirs, monkeypatch):
    """Three requests of different lengths over four rounds of ragged growth (a fully rejected
    chain rolled back, a fully accepted one, a request released and its row taken by a new id, a
    history cut back): the batched EAGLE chains equal expand.draft over one EagleStepper per
    request, token for token; a new request reads all its pairs, a known one only what it gained
    (accepted + 1); every round is one sync and k - 1 single-input steps over every cache row."""
    import specbench.drafters.eagle_chain as eagle_chain
    from specbench.drafters.expand import Steppers, draft

    shapes = []  # input_ids' shape of each batched head forward
    real = eagle_chain.forward_rows
    monkeypatch.setattr(eagle_chain, "forward_rows", lambda head, f, ids, *a: shapes.append(tuple(ids.shape)) or real(head, f, ids, *a))

    k = 4
    batch = make_drafter(name, target, None, head_dirs)
    if sizing:
        batch.attach(target, **sizing)
    steppers = Steppers(lambda: EagleStepper(batch.head))
    histories = {7: PROMPTS[0], 3: torch.tensor([0, 9]), 11: torch.cat([PROMPTS[2], PROMPTS[1]])}

    def propose(order):
        shapes.clear()
        hs = [histories[i] for i in order]
        state = DraftState(tokens=hs, k=k, features=features_of(target, hs, batch.feature_layers),
                           request_ids=tuple(order))
        got = batch.propose(state)
        want = draft(steppers, state, "greedy", GREEDY, None)
        assert got.is_chain and got.probs is None and got.num_tokens.tolist() == [k] * len(order)
        assert got.tokens.dtype == torch.int64 and got.tokens.device.type == "cpu"
        assert got.tokens.tolist() == want.tokens.tolist()
        R = batch.chain.cache_rows
        assert len(shapes) == k and shapes[1:] == [(R, 1)] * (k - 1)  # one batched sync, k - 1 batched steps
        assert shapes[0][0] == R and shapes[0][1] >= max(batch.chain.last_counts.values())
        return got

    def grow(got, order, accepted):
        return grow_histories(histories, got, order, accepted)

    got = propose((7, 3, 11))
    assert batch.chain.last_counts == {i: len(h) - 1 for i, h in histories.items()}  # new rows read every pair
    added = grow(got, (7, 3, 11), {7: 0, 3: k, 11: 2})  # 7: all rejected (rolled back); 3: all accepted
    got = propose((11, 7, 3))
    assert batch.chain.last_counts == added == {7: 1, 3: k + 1, 11: 3}  # each row reads only the pairs it gained
    batch.release([3, 99])  # 3 finished; 99 was never seen
    steppers.release([3, 99])
    assert set(batch.chain.row_of) == {7, 11}
    added = grow(got, (11, 7), {11: 1, 7: k})
    histories[12] = torch.tensor([0, 9, 10, 11, 30, 31, 32])  # a new request, in 3's row
    got = propose((12, 11, 7))
    assert batch.chain.last_counts == {12: len(histories[12]) - 1, **added}
    grow(got, (12, 11, 7), {12: 3, 11: 0, 7: 1})
    histories[7] = histories[7][:-3]  # a history that lost pairs the row holds: cut back, read again
    propose((7, 12, 11))
    assert batch.chain.last_counts[7] == 1  # its pairs up to the cut are kept: only the last is read again
    if sizing:
        assert batch.chain.cache.rows >= 3 and batch.chain.max_length >= max(len(h) for h in histories.values()) + k


def test_eagle_chains_in_the_runner_read_new_pairs_only_over_one_attention_shape(target, head_dirs, monkeypatch):
    """EAGLE-3 chains through the runner, five prompts over three rows (requests admitted as
    others finish): every round takes the batched chain path, never the per-request steppers;
    after its first round a request's row reads accepted + 1 pairs (before it, its prompt's);
    the head cache sized by attach never grows; the features each round hands the drafter are
    the target's hidden states over each history (kept by the runner, a row's buffer a request);
    and the head's attention runs over one key shape and a few query widths however many rounds
    there are. (Eager attention may plan per
    shape: on sm90 torch picks cuDNN for this masked bf16 attention, which builds a graph for
    each new shape; with a key length that grew every round, that was a build nearly every round.)"""
    import collections

    import specbench.drafters.expand as expand
    import specbench.heads as heads

    k, tokens, rows = 4, 24, 3
    prompts = PROMPTS + [torch.tensor([0, 7, 8, 9, 10, 11, 12, 13, 14]), torch.tensor([0, 4, 4])]
    monkeypatch.setattr(expand, "draft", lambda *a, **kw: pytest.fail("a chain was drafted request by request"))
    monkeypatch.setattr(heads.StaticHeadCache, "grown", lambda *a: pytest.fail("the head cache grew"))
    shapes = collections.Counter()  # (query shape, key shape) of every attention the head runs

    class Recorded:
        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

        @staticmethod
        def scaled_dot_product_attention(q, k, v, **kw):
            shapes[tuple(q.shape), tuple(k.shape)] += 1
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

    monkeypatch.setattr(heads, "F", Recorded())
    drafter = EagleDrafter("eagle3", head_dirs["eagle3"], "greedy", GREEDY)
    drafter.attach(target, rows=rows, max_length=max(len(p) for p in prompts) + tokens + k + 2)
    reads = collections.defaultdict(list)  # request id -> pairs its row read, round by round
    rounds = []
    chain_propose = drafter.chain.propose

    def propose(state, *args):
        want = features_of(target, state.tokens, drafter.feature_layers)
        for got, ref in zip(state.features, want):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        out = chain_propose(state, *args)
        rounds.append(len(state.request_ids))
        for i in state.request_ids:
            reads[i].append(drafter.chain.last_counts[i])
        return out

    monkeypatch.setattr(drafter.chain, "propose", propose)
    records = run(target, Speculation(drafter, "standard", k), prompts=prompts, tokens=tokens, engine="native", rows=rows)
    assert [r.tokens for r in records] == [r.tokens for r in run(target, None, prompts=prompts, tokens=tokens)]
    for i, (prompt, record) in enumerate(zip(prompts, records)):
        assert reads[i] == [len(prompt)] + [a + 1 for a in record.accepted[:-1]]
    assert sum(sum(r.accepted) for r in records) > 0  # some rounds read more than one pair
    assert sum(shapes.values()) == k * len(rounds) and len(rounds) >= 20 and min(rounds) < rows
    assert len({key for _, key in shapes}) == 1  # every key shape: all rows x the whole cache
    assert len(shapes) <= 5  # a few query widths (1 and powers of two), not one shape per round


@pytest.mark.parametrize("name", EAGLE_KINDS)
def test_eagle_chains_gather_new_features_from_the_runners_buffer(name, target, head_dirs):
    """Given the runner's feature buffer (DraftState.feature_buffer, a row per request, rows out
    of batch order), the batched chains read each request's new pairs from it with one gather,
    and propose what they propose from the per-request feature list. The list handed beside
    the buffer is zeros here, so equal drafts mean the buffer was read, over two rounds (the
    second reads only what each request gained)."""
    histories = {7: PROMPTS[0], 3: torch.tensor([0, 9, 10, 4]), 11: torch.cat([PROMPTS[2], PROMPTS[1]])}
    order, buffer_rows, k = (7, 3, 11), (2, 0, 3), 3
    plain, gathered = (EagleDrafter(name, head_dirs[name], "greedy", GREEDY) for _ in range(2))
    for drafter in (plain, gathered):
        drafter.attach(target, rows=3, max_length=64)
    for accepted in ({7: 1, 3: 0, 11: 2}, None):
        tokens = [histories[i] for i in order]
        features = features_of(target, tokens, plain.feature_layers)  # B x [T_b - 1, D]
        buffer = features[0].new_full((4, 64, features[0].shape[-1]), float("nan"))  # unread slots: nan
        for row, f in zip(buffer_rows, features):
            buffer[row, : f.shape[0]] = f
        want = plain.propose(DraftState(tokens=tokens, k=k, features=features, request_ids=order))
        got = gathered.propose(DraftState(tokens=tokens, k=k, features=[torch.zeros_like(f) for f in features],
                                          feature_buffer=buffer, feature_rows=buffer_rows, request_ids=order))
        assert got.tokens.tolist() == want.tokens.tolist()
        if accepted is not None:
            grow_histories(histories, want, order, accepted)


@pytest.mark.parametrize("name", EAGLE_KINDS)
def test_a_probabilistic_eagle_batch_returns_the_distributions_it_sampled(name, target, head_dirs):
    """Batched probabilistic EAGLE chains: q [B, k, V] float32, rows summing to 1, every token
    drawn from its q, and each request's q is the head's distribution after its history and its
    earlier drafts (an EagleStepper fed the same drafts)."""
    params = SamplingParams(1.0, 0, 1.0)
    batch = EagleDrafter(name, head_dirs[name], "probabilistic", params, seed=3)
    batch.attach(target)
    k = 3
    features = features_of(target, PROMPTS, batch.feature_layers)
    got = batch.propose(DraftState(tokens=PROMPTS, k=k, features=features, request_ids=(5, 6, 7)))
    V = target.config.vocab_size
    assert got.probs.shape == (3, k, V) and got.probs.dtype == torch.float32 and got.is_chain
    assert got.num_tokens.tolist() == [k] * 3
    torch.testing.assert_close(got.probs.sum(-1), torch.ones(3, k))
    assert bool((got.probs.gather(-1, got.tokens.unsqueeze(-1)) > 0).all())
    with torch.inference_mode():
        for b, history in enumerate(PROMPTS):
            stepper = EagleStepper(batch.head)
            logits = stepper.sync(history, features[b])
            for i in range(k):
                torch.testing.assert_close(got.probs[b, i], probs_from_logits(logits, params)[0], atol=1e-5, rtol=1e-4)
                logits = stepper.feed(got.tokens[b, i : i + 1])
