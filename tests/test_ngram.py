"""Prompt-lookup drafting on tiny hand-made histories, each with its exact expected draft."""

import numpy as np
import pytest
import torch

from specbench.config import ConfigError, NgramConfig
from specbench.drafters.base import DraftState
from specbench.drafters.ngram import NgramDrafter, ngram_propose, ngram_propose_batch, ngram_propose_host
from specbench.graphs import HostOps


def propose(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The draft of the torch search, checked against the host (numpy) search's."""
    draft = ngram_propose(torch.tensor(tokens, dtype=torch.int64), min_n, max_n, k).tolist()
    drafts, num = ngram_propose_host([np.array(tokens, dtype=np.int64)], min_n, max_n, k)  # [1, k], [1]
    assert drafts[0, : num[0]].tolist() == draft and (drafts[0, num[0] :] == -1).all(), (tokens, drafts, draft)
    return draft


def test_no_match():
    assert propose([1, 2, 3, 4, 5], min_n=2, max_n=2, k=2) == []
    # [5, 6] never occurred before; the earlier [2, 3] does not matter.
    assert propose([1, 2, 3, 4, 1, 2, 3, 5, 6], min_n=2, max_n=2, k=2) == []


def test_exact_n():
    assert propose([1, 2, 3, 4, 1, 2, 3], min_n=2, max_n=2, k=3) == [4, 1, 2]
    assert propose([1, 2, 3, 4, 1, 2, 3], min_n=2, max_n=2, k=2) == [4, 1]
    assert propose([1, 2, 3, 4, 1, 2, 3], min_n=1, max_n=1, k=2) == [4, 1]


def test_min_n_respected():
    # Only [1, 2, 3] recurs, a 3-gram: a 4-gram-only drafter has nothing, a 3..4 one finds it.
    assert propose([1, 2, 3, 4, 1, 2, 3], min_n=4, max_n=4, k=2) == []
    assert propose([1, 2, 3, 4, 1, 2, 3], min_n=3, max_n=4, k=2) == [4, 1]
    # The suffix [9, 3] only recurs as the 1-gram [3] (at 2): found with min_n=1, not with 2.
    assert propose([1, 2, 3, 4, 9, 3], min_n=1, max_n=3, k=2) == [4, 9]
    assert propose([1, 2, 3, 4, 9, 3], min_n=2, max_n=3, k=2) == []


def test_longest_match_beats_shorter_and_more_recent():
    # The 4-gram [1, 2, 3, 4] at 4 beats the 3-gram [2, 3, 4] at 0 (which would give [5, 1]).
    assert propose([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], min_n=3, max_n=4, k=2) == [1, 2]
    # A 3-gram [2, 3, 4] at 3 beats the more recent 2-gram [3, 4] at 7 (which would give [0, 2]).
    assert propose([3, 4, 5, 2, 3, 4, 1, 3, 4, 0, 2, 3, 4], min_n=2, max_n=4, k=2) == [1, 3]


def test_rightmost_of_equal_length_wins():
    # [1, 2, 3] occurs at 0, 4 and 8 before the suffix; the most recent one (8) is followed by 300.
    tokens = [1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]
    assert propose(tokens, min_n=3, max_n=3, k=2) == [300, 1]
    # 1-gram [3] at 1 and 4: 4 wins.
    assert propose([1, 3, 6, 2, 3, 4, 1, 2, 3], min_n=1, max_n=1, k=2) == [4, 1]


def test_fewer_than_k_tokens_after_match():
    # The match [7, 8] at 2 is followed by only [9, 7, 8] before the history ends.
    assert propose([5, 6, 7, 8, 9, 7, 8], min_n=2, max_n=2, k=5) == [9, 7, 8]
    # The match overlaps the suffix: [1, 1] at 1 leaves only the last token to copy.
    assert propose([1, 1, 1, 1], min_n=2, max_n=2, k=3) == [1]


def test_suffix_itself_not_counted():
    # The only occurrence of [4, 5] is the suffix itself.
    assert propose([1, 2, 3, 4, 5], min_n=1, max_n=2, k=2) == []
    # A match must leave one token after it, so a lone repeated token in a 2-token history is
    # the suffix against itself; the 1-gram [7] at 0 is followed by the final 7.
    assert propose([7, 7], min_n=1, max_n=1, k=2) == [7]
    assert propose([7], min_n=1, max_n=1, k=2) == []
    assert propose([], min_n=1, max_n=1, k=2) == []


def test_max_n_longer_than_history():
    assert propose([1, 2, 1], min_n=1, max_n=8, k=2) == [2, 1]


def test_batch_with_padding():
    histories = [
        [1, 2, 3, 4, 1, 2, 3],  # 3-gram at 0 -> [4, 1, 2]
        [1, 2, 3, 4, 5],  # no match
        [5, 6, 7, 8, 9, 7, 8],  # 2-gram [7, 8] at 2 -> [9, 7, 8], exactly k
        [4, 4],  # 1-gram [4] at 0 -> [4]
    ]
    state = DraftState(tokens=[torch.tensor(h) for h in histories], k=3)
    out = NgramDrafter(min_n=1, max_n=3).propose(state)
    assert out.probs is None
    assert out.tokens.dtype == torch.int64 and out.tokens.shape == (4, 3)
    assert out.tokens.tolist() == [[4, 1, 2], [-1, -1, -1], [9, 7, 8], [4, -1, -1]]
    assert out.num_tokens.tolist() == [3, 0, 3, 1]


def test_padding_is_never_matched():
    # Row 1 is [5, 6, 5] padded with a continuation of its pattern: read as history, the pad
    # would give a longer match and a draft running past the row's end.
    tokens = torch.tensor([[1, 2, 1, 2, 1, 2, 1, 2], [5, 6, 5, 6, 5, 6, 5, 6]])
    drafts, num = ngram_propose_batch(tokens, torch.tensor([8, 3]), min_n=1, max_n=4, k=3)
    # Row 0: the 4-gram [1, 2, 1, 2] at 2 (at 4 it is the suffix itself) -> [1, 2], then the end.
    # Row 1: the 1-gram [5] at 0 -> [6, 5], then the row's end.
    assert drafts.tolist() == [[1, 2, -1], [6, 5, -1]]
    assert num.tolist() == [2, 2]


def test_from_config_and_bad_range():
    drafter = NgramDrafter.from_config(NgramConfig(min_n=2, max_n=4))
    assert (drafter.name, drafter.min_n, drafter.max_n) == ("ngram", 2, 4)
    with pytest.raises(ConfigError, match=r"^drafter.min_n=3: "):
        NgramDrafter(min_n=3, max_n=2)


def reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule read literally: longest n first, then the rightmost start i with i + n <= T - 1."""
    T = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        for i in range(T - n - 1, -1, -1):
            if tokens[i : i + n] == tokens[T - n :]:
                return tokens[i + n : i + n + k]
    return []


def test_matches_reference_on_random_histories():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        T = int(torch.randint(0, 24, (), generator=g))
        tokens = torch.randint(0, 3, (T,), generator=g).tolist()  # 3 symbols: many repeats
        min_n = int(torch.randint(1, 4, (), generator=g))
        max_n = min_n + int(torch.randint(0, 4, (), generator=g))
        k = int(torch.randint(1, 6, (), generator=g))
        assert propose(tokens, min_n, max_n, k) == reference(tokens, min_n, max_n, k), (tokens, min_n, max_n, k)


def test_batched_ragged_histories_match_the_reference():
    """ngram_propose_batch over right-padded rows of different lengths (the padding holds real
    symbols, which must never be matched) gives each row's reference draft."""
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        B = int(torch.randint(1, 7, (), generator=g))
        lengths = torch.randint(0, 30, (B,), generator=g)
        tokens = torch.randint(0, 3, (B, max(int(lengths.max()), 1)), generator=g)  # padding: symbols too
        min_n = int(torch.randint(1, 3, (), generator=g))
        max_n = min_n + int(torch.randint(0, 4, (), generator=g))
        k = int(torch.randint(1, 5, (), generator=g))
        drafts, num = ngram_propose_batch(tokens, lengths, min_n, max_n, k)
        for b in range(B):
            expected = reference(tokens[b, : lengths[b]].tolist(), min_n, max_n, k)
            assert drafts[b, : num[b]].tolist() == expected and (drafts[b, num[b]:] == -1).all()
        # The host search reads the same rows unpadded, laid end to end.
        host = ngram_propose_host([tokens[b, : lengths[b]].numpy() for b in range(B)], min_n, max_n, k)
        assert host[0].tolist() == drafts.tolist() and host[1].tolist() == num.tolist()


def test_host_search_dispatches_no_torch_op_per_request():
    """The drafter's round reads the runner's numpy histories: its torch dispatches (wrapping
    the two outputs) do not grow with the batch."""
    g = np.random.default_rng(2)

    def ops(B):
        histories = [g.integers(0, 5, 40) for _ in range(B)]
        state = DraftState(tokens=[torch.from_numpy(h) for h in histories], k=4, host=histories)
        with HostOps() as count:
            out = NgramDrafter(min_n=1, max_n=3).propose(state)
        assert out.num_tokens.shape == (B,) and int(out.num_tokens.sum()) > 0
        return count.n

    assert ops(48) == ops(1) <= 2
