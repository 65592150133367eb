"""Helpers of the batched-draft tests (test_native_trees.py, test_eagle_trees.py, test_graphs.py, test_drafters.py):
the states EAGLE heads draft from, compare a batched tree proposal with the per-request path's,
and grow histories as a verify would."""

import torch

from specbench.drafters.base import DraftState


def assert_same(got, want):
    """Token for token, parent for parent, with draft's layout (-1 / 0 past each tree)."""
    assert got.probs is None and want.probs is None and not got.is_chain and not want.is_chain
    assert got.tokens.dtype == got.parents.dtype == got.num_tokens.dtype == torch.int64
    assert got.tokens.device.type == got.parents.device.type == "cpu"
    assert got.tokens.shape == want.tokens.shape and got.parents.shape == want.parents.shape
    assert got.num_tokens.tolist() == want.num_tokens.tolist()
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.parents.tolist() == want.parents.tolist()


def path_to(proposal, b, column):
    """Request b's draft tokens from the root down to draft column `column` (none for -1)."""
    path = []
    while column >= 0:
        path.append(int(proposal.tokens[b, column]))
        column = int(proposal.parents[b, column]) - 1 if not proposal.is_chain else column - 1
    return path[::-1]


def grow(histories, got, order, accepted):
    """Request i accepts its path to draft column accepted[i] (-1: none; None: its last column),
    then gains a bonus token -> the tokens each request gained."""
    added = {}
    for b, i in enumerate(order):
        column = int(got.num_tokens[b]) - 1 if accepted[i] is None else accepted[i]
        path = path_to(got, b, column) + [50 + i % 40]
        histories[i] = torch.cat([histories[i], torch.tensor(path)])
        added[i] = len(path)
    return added


def features_of(target, histories, layers):
    """B x [T_b - 1, D]: the target's features at every position but the last (the runner's)."""
    with torch.inference_mode():
        hidden = [target(h[None].to(target.device), output_hidden_states=True).hidden_states for h in histories]
    return [torch.cat([hs[i][0, :-1] for i in layers], -1) for hs in hidden]


def tree_state(target, head, histories, ids, k, topk, max_nodes):
    hs = [histories[i] for i in ids]
    return DraftState(tokens=hs, k=k, topk=topk, num_draft_tokens=max_nodes + 1,
                      features=features_of(target, hs, head.config.feature_layers), request_ids=tuple(ids))


def chain_state(target, head, histories, ids, k):
    hs = [histories[i] for i in ids]
    return DraftState(tokens=hs, k=k, features=features_of(target, hs, head.config.feature_layers),
                      request_ids=tuple(ids))
