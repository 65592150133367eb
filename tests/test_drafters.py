"""The model drafters and the synthetic control: proposals on known inputs, greedy equality with
the baseline for every drafter and tree shape, KV accounting, and clear errors."""

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from specbench.config import ConfigError
from specbench.drafters.base import DraftState
from specbench.drafters.draft_model import DraftModelDrafter, save_draft_model
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.layerskip import LayerSkipDrafter, truncated
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.ngram_trie import NgramTrieDrafter
from specbench.drafters.synthetic import SyntheticDrafter
from specbench.engines.hf import HFEngine
from specbench.heads import EagleHeadConfig, build_head, save_head
from specbench.kvaccount import Policy, request_slots
from specbench.runner import Speculation, decode
from specbench.sampling import SamplingParams
from specbench.tree import compile_tree, with_root

GREEDY = SamplingParams(0.0, 0, 1.0)
PROMPTS = [torch.tensor([0, 5, 6, 7, 5, 6]), torch.tensor([0, 9, 10, 11, 12]), torch.tensor([0, 3, 4, 3, 4, 3])]
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


def run(target, spec, prompts=PROMPTS, tokens=24, params=GREEDY, seed=0):
    engine = HFEngine(target)
    out = []
    for i, prompt in enumerate(prompts):
        g = torch.Generator().manual_seed(seed + i)
        out.append(decode(engine, prompt, params=params, max_new_tokens=tokens, eos_ids=frozenset(),
                          generator=g, spec=spec, request_id=i))
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["ngram_trie", "draft_model", "layerskip", "eagle", "eagle3"])
def test_greedy_equality_every_drafter_and_tree(name, shape, target, draft_dir, head_dirs):
    k, topk, tokens = SHAPES[shape]
    base = [r.tokens for r in run(target, None)]
    drafter = make_drafter(name, target, draft_dir, head_dirs)
    records = run(target, Speculation(drafter, "standard", k, {}, topk, tokens))
    assert [r.tokens for r in records] == base
    assert sum(sum(r.drafted) for r in records) > 0  # the drafter did propose
    most = (tokens or k * topk + 1) - 1
    assert all(d <= most for r in records for d in r.drafted)


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


def test_kv_slots_under_both_policies_by_hand():
    # prompt 10; round 1 drafts 4 accepts 2; round 2 drafts 4 accepts 4; round 3 drafts 0
    p = Policy(k=4, topk=1, num_draft_tokens=None, lookahead=4)
    slots = request_slots(10, [4, 4, 0], [2, 4, 0], p)
    # used: 10 + 3 + 5 + 1 = 19
    # vLLM: round 1 needs 10 + 1 + 4 + 4 = 19, round 2 13 + 9 = 22, round 3 18 + 1 + 0 + 4 = 23
    # SGLang: 2 x max(4, 5) = 10 ahead of the committed length: 10, 13, 18 -> peak 28
    assert slots == {"used": 19, "vllm": 23, "sglang": 28}
    # SGLang's Llama default (5, 4, 8): 2 x max(20, 8) = 40 slots ahead of the committed length
    assert Policy(k=5, topk=4, num_draft_tokens=8).sglang_per_round == 40
    assert Policy(k=3, topk=1, num_draft_tokens=4).sglang_per_round == 8
