"""SGLang's NGRAM drafter: one n-gram trie shared by every request of the run.

vLLM's ``ngram`` drafter (specbench.drafters.ngram) searches a request's own history and proposes
one chain. SGLang's NGRAM keeps a single trie of everything any request has said: it can draft
what *another* request wrote (shared boilerplate, repeated answers, code), and it proposes a
tree, several continuations at once, which the target verifies in one forward.

Letters: B requests, M draft nodes (state.max_nodes), k draft depth, T tokens so far,
L max_trie_depth, n a match window (suffix length).

Insertion. The trie holds, for every start position of every history, the path of the next up
to L tokens: every n-gram of length <= L is a path from the root, and each node counts how often
its n-gram occurred (so a child's count is how often that continuation followed its context).
Each call first inserts, for every request, the tokens it has not inserted yet: every n-gram
ending at a new position gets one count. Requests are told apart by `state.request_ids` (the
batch index when it is empty); a request whose history is not an extension of what it inserted
before (an id reused for a new prompt) starts over: its whole history counts again, as a new
request saying it again would. Every request of the batch is inserted before any is matched.

Matching and drafting (SGLang's BFS match type, with the differences listed below). For every
window n from min(T, max_match_window) down to min_match_window, walk the trie along the last n
tokens of the history (or, until eviction is possible, take the node the insert just reached at
the end of that path: the same node, no walk); every window that is found (the history's own
suffix always is, so only windows whose node has children add anything) is expanded
breadth-first into one shared draft
tree, longest window first. Node 0 of the tree is the last token, so each window's node stands
for the root; a token already present under the same draft parent is reused, so shorter windows
add siblings and extend branches the longer ones started. A trie node at depth D (the window
plus the levels below it) keeps its first
    breadth(D) = max(1, floor(min_bfs_breadth + (max_bfs - min_bfs) * (max_match_window - D)
                                                / (max_match_window - min_match_window + 1)))
children, SGLang's rule: long, specific contexts give narrow trees (min_bfs_breadth at D =
max_match_window), short ones bushy trees (max_bfs_breadth itself is approached, never reached). Drafting stops at M nodes; nodes deeper than k are
not drafted. The tree is then laid out level by level (as SGLang's fillResult does), siblings
in the order they were drafted, which is the order the acceptance rules try them.

Differences from SGLang's v0.5-series ngram cache (python/sglang/srt/speculative/cpp_ngram/ngram.cpp
and speculative/ngram_worker.py), whose defaults NgramTrieConfig copies:
  * Children are ranked by count, most frequent first, ties to the most recently touched. SGLang's
    default BFS match type ranks by recency alone (its per-parent LRU list); counts rank children
    only in its PROB match type, which also expands best-first by normalised count instead.
  * Every token is inserted once, the prompt included. SGLang re-inserts the last L tokens after
    each verify step (so counts grow with the number of steps a context stays in that window)
    and leaves the rest of the prompt out.
  * Depth is bounded by state.k (SGLang bounds it by the trie depth only), and a request with no
    continuation proposes nothing instead of padding to num_draft_tokens.

Two tries, one behaviour (drafter.impl). `python` is NgramTrie below, the reference. `native`
is ngram_trie.cpp, built at first use with the host's C++ compiler into $SPECBENCH_CACHE/build
and called through ctypes: one call a round inserts every request's new tokens, one drafts every
request's tree, as SGLang's C++ cache does the work off the Python loop. Both draft the same
trees and count the same n-grams (tests/test_ngram_trie.py runs the hand-made cases, the frozen
proposals and random rounds on both). `auto`, the default, is native where it builds.

Capacity. `capacity` bounds the trie's nodes, the root excluded (SGLang counts its root too).
Inserting a path touches every node on it, deepest first, so a node is always touched more
recently than its descendants and the least recently used node is a leaf, as in SGLang's global
LRU list. Before a path is inserted its existing nodes are touched, then least recently used
leaves are evicted until the nodes it creates fit, so the path being inserted never loses a node
(capacity >= L is required). An evicted n-gram that occurs again restarts at count 1.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import heapq
import itertools
import logging
import os
import platform
import shutil
import subprocess
import weakref
from collections import OrderedDict, deque
from pathlib import Path
from typing import Hashable, Optional, Sequence, Union

import numpy as np
import torch

from specbench.config import TRIE_IMPLS, ConfigError, NgramTrieConfig
from specbench.drafters.base import DraftProposal, DraftState, host_array

log = logging.getLogger(__name__)


class NgramTrie:
    """The shared trie: counted n-grams of length <= max_depth, at most `capacity` nodes.

    Nodes are ints (0 the root) indexing flat lists of ints (token, parent, count, stamp) and a
    list of children dicts {token: node}. Nothing here is a container of Python objects that the
    cyclic garbage collector has to walk (a dict of ints is untracked), so a trie of millions of
    nodes costs the collector nothing; per-node objects made its full passes grow with the trie.

    Recency lives in the stamps. The global LRU list that eviction needs is only built (from the
    stamps, which order the nodes exactly as that list would) once an insertion could reach
    `capacity`; until then inserting a path is one walk down it and nothing else.
    """

    root = 0

    def __init__(self, capacity: int, max_depth: int):
        assert capacity >= max_depth >= 1, (capacity, max_depth)
        self.capacity = capacity
        self.max_depth = max_depth
        self._token = [-1]  # node -> its last token
        self._parent = [-1]  # node -> parent node
        self._count = [0]  # node -> occurrences of its n-gram in the inserted text
        self._stamp = [0]  # node -> clock value of its last touch; larger is more recent
        self._children: list[Optional[dict[int, int]]] = [None]  # node -> {token: child}, made on the first child
        self._free: list[int] = []  # ids of evicted nodes, reused
        self._size = 0  # nodes held, the root excluded
        self._lru: Optional[OrderedDict[int, None]] = None  # every node but the root, least recent first
        self._clock = 0

    def __len__(self) -> int:
        """Nodes held, the root excluded."""
        return self._size

    @property
    def evicting(self) -> bool:
        """Whether nodes may be evicted from now on (an insertion could reach capacity). Until
        then a node, once made, stays with its id."""
        return self._lru is not None

    def children(self, node: int) -> dict[int, int]:
        """{token: child node} under a node (empty when it has none)."""
        return self._children[node] or {}

    def token(self, node: int) -> int:
        return self._token[node]

    def parent(self, node: int) -> int:
        return self._parent[node]

    def node_count(self, node: int) -> int:
        return self._count[node]

    def find(self, ngram: Sequence[int]) -> Optional[int]:
        """The node of an n-gram, or None when it is not in the trie."""
        children_of = self._children
        node = 0
        for token in ngram:
            children = children_of[node]
            if children is None:
                return None
            node = children.get(token)
            if node is None:
                return None
        return node

    def count(self, ngram: Sequence[int]) -> int:
        """How often the n-gram occurred in the inserted text (0 when absent or evicted)."""
        node = self.find(ngram)
        return 0 if node is None else self._count[node]

    def insert(self, tokens: Sequence[int], first_new: int, known: Optional[list] = None) -> Optional[list]:
        """Count every n-gram (length <= max_depth) of `tokens` that ends at a position >= first_new.

        tokens: [t] ints, the tail of a history; positions before first_new were inserted before.
        The n-grams starting at s are the prefixes of tokens[s : s + max_depth], one path.

        known: what the previous insert of this history returned (tokens then ended at
        first_new, and its tail started where this one does), or None. Its s-th entry lists the
        nodes of tokens[s : first_new], so those paths' old parts are re-stamped from it instead
        of walked again: per new token, max_depth lookups where the walk made about
        max_depth^2 / 2. The trie ends the same, node for node. Returns the node lists of the
        paths that may still grow, tokens[s:] for s > t - max_depth, for the next insert of the
        same history; None once eviction is possible (nodes can disappear; every path is walked).
        """
        L, T = self.max_depth, len(tokens)
        first_s = max(0, first_new - L + 1)
        if known is not None:
            assert len(known) == first_new - first_s, (len(known), first_new, first_s)
        if self._lru is None:
            full = max(0, T - L + 1 - first_s)  # paths of L tokens; the m after them are 1 .. m long
            m = T - max(first_s, T - L + 1)
            if self._size + full * L + m * (m + 1) // 2 <= self.capacity:  # no path can reach capacity
                return self._extend(tokens, first_new, first_s, T, known)
        growing = []  # node lists of the paths from s > T - L, in start order
        for s in range(first_s, T):  # capacity is near: the LRU list may start at any path
            end = min(s + L, T)
            if self._lru is None and self._size + (end - s) > self.capacity:
                self._start_lru()
            if self._lru is not None:
                self._insert_path(tokens[s:end], max(1, first_new - s + 1))
                growing = None
            else:
                grown = self._extend(tokens, first_new, s, s + 1, None if known is None else known[s - first_s :])
                if growing is not None:
                    growing += grown
        return growing

    def _extend(self, tokens: Sequence[int], first_new: int, s_from: int, s_to: int,
                known: Optional[list]) -> list:
        """insert's paths from s_from to s_to, while no eviction can happen (no LRU list, so no
        id is free): each path walked and extended once, its nodes touched deepest first, as
        _touch does (depth d of an n-node path gets clock + n - d + 1). known: the node lists
        of the old parts of these paths, from s_from on. Returns the node lists of the paths
        that may still grow (those that end at the last token with fewer than max_depth)."""
        L, T = self.max_depth, len(tokens)
        children_of, count, stamps = self._children, self._count, self._stamp
        token_of, parent_of = self._token, self._parent
        clock, fresh = self._clock, len(token_of)  # fresh: the next new node's id
        growing = []
        for s in range(s_from, s_to):
            end = min(s + L, T)
            clock += end - s
            stamp = clock
            if known is not None and s < first_new:  # the old part: nodes known, only touched
                path = known[s - s_from]  # grown in place: the caller's copy is replaced by what insert returns
                for old in path:
                    stamps[old] = stamp
                    stamp -= 1
                node, start = path[-1], first_new
            else:
                path, node, start = [], 0, s
            counted = max(s, first_new)  # tokens[i] for i >= counted end a new occurrence
            for i in range(start, end):
                token = tokens[i]
                children = children_of[node]
                if children is None:
                    children_of[node] = children = {}
                    child = None
                else:
                    child = children.get(token)
                if child is None:
                    children[token] = child = fresh
                    fresh += 1
                    token_of.append(token)
                    parent_of.append(node)
                    count.append(1)
                    stamps.append(stamp)
                    children_of.append(None)
                else:
                    if i >= counted:
                        count[child] += 1
                    stamps[child] = stamp
                stamp -= 1
                node = child
                path.append(child)
            if end - s < L:  # it ends at the last token, short of max_depth: it may grow
                growing.append(path)
        self._clock = clock
        self._size = fresh - 1  # every node but the root: none was freed
        return growing

    def _start_lru(self) -> None:
        """Build the LRU list from the stamps: every touch gave a fresh, larger stamp."""
        nodes, stack = [], [0]
        while stack:
            children = self._children[stack.pop()]
            if children:
                nodes.extend(children.values())
                stack.extend(children.values())
        nodes.sort(key=self._stamp.__getitem__)
        self._lru = OrderedDict.fromkeys(nodes)

    def _new_node(self, token: int, parent: int) -> int:
        """A node with count 1 (a new occurrence, or an evicted n-gram restarting)."""
        if self._free:
            node = self._free.pop()
            self._token[node], self._parent[node], self._count[node] = token, parent, 1
            self._children[node] = None
        else:
            node = len(self._token)
            self._token.append(token)
            self._parent.append(parent)
            self._count.append(1)
            self._stamp.append(0)
            self._children.append(None)
        self._size += 1
        return node

    def _insert_path(self, path: Sequence[int], new_depth: int) -> None:
        """Walk `path` from the root, creating missing nodes; nodes at depth >= new_depth
        (1-based) are new occurrences and get one count. A node created above new_depth (its
        n-gram was evicted) restarts at count 1. Used once the LRU list is kept."""
        nodes: list[int] = []  # the path's nodes: the existing prefix, then the created ones
        node = 0
        for token in path:
            children = self._children[node]
            node = children.get(token) if children else None
            if node is None:
                break
            nodes.append(node)
        self._touch(nodes)  # most recent now: eviction below cannot pick them
        while self._size + len(path) - len(nodes) > self.capacity:
            self._evict()
        for depth, node in enumerate(nodes, start=1):
            if depth >= new_depth:
                self._count[node] += 1
        parent = nodes[-1] if nodes else 0
        for token in path[len(nodes):]:
            child = self._new_node(token, parent)
            if self._children[parent] is None:
                self._children[parent] = {}
            self._children[parent][token] = child
            nodes.append(child)
            parent = child
        self._touch(nodes)

    def _touch(self, nodes: list[int]) -> None:
        """Mark a root-to-node path used, deepest first, so ancestors end up the most recent."""
        lru = self._lru
        for node in reversed(nodes):
            self._clock += 1
            self._stamp[node] = self._clock
            lru[node] = None
            lru.move_to_end(node)

    def _evict(self) -> None:
        """Drop the least recently used node, always a leaf (see _touch)."""
        node, _ = self._lru.popitem(last=False)
        assert not self._children[node], "the least recently used node must be a leaf"
        self._size -= 1
        parent = self._parent[node]
        siblings = self._children[parent]
        del siblings[self._token[node]]
        if not siblings:
            self._children[parent] = None
        self._free.append(node)

    def ranked_children(self, node: int, width: int) -> list[int]:
        """The `width` best children: highest count first, ties to the most recently touched."""
        children = self._children[node]
        if not children:
            return []
        if len(children) == 1:
            return list(children.values())
        count, stamp = self._count, self._stamp
        # One int a child, count first: stamps are distinct (every touch takes a new clock
        # value) and far below 2^48, so the order is exact. Sorting them all is the quicker
        # way up to a few hundred children; a heap beyond (tries of frequent tokens).
        key = lambda c: (count[c] << 48) + stamp[c]  # noqa: E731
        if width == 1:
            return [max(children.values(), key=key)]
        if len(children) <= 256:
            return sorted(children.values(), key=key, reverse=True)[:width]
        return heapq.nlargest(width, children.values(), key=key)


class NgramTrieDrafter:
    """SGLang's ``--speculative-algorithm NGRAM``: a draft tree from an n-gram trie shared by all
    requests (see the module docstring)."""

    name = "ngram_trie"
    feature_layers = ()

    def __init__(
        self,
        capacity: int = 10_000_000,
        max_trie_depth: int = 18,
        min_match_window: int = 1,
        max_match_window: int = 12,
        min_bfs_breadth: int = 1,
        max_bfs_breadth: int = 10,
        impl: str = "auto",
    ):
        if impl not in TRIE_IMPLS:
            raise ConfigError("drafter.impl", impl, f"valid impls: {', '.join(TRIE_IMPLS)}")
        if max_trie_depth < 2:
            raise ConfigError("drafter.max_trie_depth", max_trie_depth, "need >= 2 (a context and a continuation)")
        if min_match_window < 1:
            raise ConfigError("drafter.min_match_window", min_match_window, "need >= 1")
        if max_match_window < min_match_window:
            raise ConfigError(
                "drafter.max_match_window", max_match_window, f"need >= min_match_window ({min_match_window})"
            )
        if max_match_window >= max_trie_depth:
            raise ConfigError(
                "drafter.max_match_window", max_match_window,
                f"need < max_trie_depth ({max_trie_depth}): a matched window must leave room for a continuation",
            )
        if min_bfs_breadth < 1:
            raise ConfigError("drafter.min_bfs_breadth", min_bfs_breadth, "need >= 1")
        if max_bfs_breadth < min_bfs_breadth:
            raise ConfigError(
                "drafter.max_bfs_breadth", max_bfs_breadth, f"need >= min_bfs_breadth ({min_bfs_breadth})"
            )
        if capacity < max_trie_depth:
            raise ConfigError(
                "drafter.capacity", capacity, f"need >= max_trie_depth ({max_trie_depth}): one path must fit"
            )
        self.min_match_window = min_match_window
        self.max_match_window = max_match_window
        self.min_bfs_breadth = min_bfs_breadth
        self.max_bfs_breadth = max_bfs_breadth
        library = _compiled() if impl != "python" else None
        if impl == "native" and not isinstance(library, ctypes.CDLL):
            raise ConfigError("drafter.impl", impl, f"the compiled trie is not available: {library}")
        if impl == "auto" and not isinstance(library, ctypes.CDLL):
            log.warning("ngram_trie: drafter.impl=auto runs the Python trie: %s", library)
        self.impl = "native" if isinstance(library, ctypes.CDLL) else "python"  # what runs
        self._new_trie = (
            functools.partial(CompiledTrie, library, capacity, max_trie_depth) if self.impl == "native"
            else functools.partial(NgramTrie, capacity, max_trie_depth)
        )
        self.restart()

    def restart(self) -> None:
        """An empty trie and no requests: the drafter as it was built, before a run's warm-up
        told it anything (each measured decode of a run starts here: run.timed_decodes)."""
        self.trie: Union[NgramTrie, CompiledTrie] = self._new_trie()
        self._inserted: dict[Hashable, bytes] = {}  # request id -> the history inserted so far, [T] int64 as bytes
        self._paths: dict[Hashable, list] = {}  # request id -> its growing paths' nodes (NgramTrie.insert)
        self._slots: dict[Hashable, int] = {}  # request id -> its number in the compiled trie (which keeps its paths)
        self._slot_numbers = itertools.count()  # never reused: a released request's number stays unknown

    @classmethod
    def from_config(cls, cfg: NgramTrieConfig) -> NgramTrieDrafter:
        return cls(
            capacity=cfg.capacity,
            max_trie_depth=cfg.max_trie_depth,
            min_match_window=cfg.min_match_window,
            max_match_window=cfg.max_match_window,
            min_bfs_breadth=cfg.min_bfs_breadth,
            max_bfs_breadth=cfg.max_bfs_breadth,
            impl=cfg.impl,
        )

    def breadth(self, depth: int) -> int:
        """Children kept under a trie node at `depth` (SGLang's linear rule, floored, >= 1)."""
        span = self.max_match_window - self.min_match_window + 1
        step = (self.max_bfs_breadth - self.min_bfs_breadth) * (self.max_match_window - depth)
        return max(1, self.min_bfs_breadth + step // span)  # floor division: exact, no float drift

    def observe(self, request_id: Hashable, history) -> None:
        """Insert the tokens of a request's history [T] (tensor or numpy) that it has not inserted yet."""
        self._insert([(request_id, history)])

    def _insert(self, requests: list) -> None:
        """observe() for [(request id, history [T])], in order (the compiled trie: one call)."""
        news = []  # (request id, tail [t], first_new): tokens from first_new on are new
        for request_id, history in requests:
            history = host_array(history)  # [T] int64
            seen = self._inserted.get(request_id, b"")
            old = 0
            if 0 < len(seen) <= history.nbytes and history[: len(seen) // 8].tobytes() == seen:
                old = len(seen) // 8  # an extension: only the tail is new
            if old == history.shape[0]:
                continue
            start = max(0, old - self.trie.max_depth + 1)  # the earliest n-gram ending at a new position
            news.append((request_id, history[start:], old - start))  # first_new 0: the history starts over
            if self.impl == "native" and request_id not in self._slots:
                self._slots[request_id] = next(self._slot_numbers)
            self._inserted[request_id] = history.tobytes()  # a copy: the caller may reuse its buffer
        if self.impl == "native":
            if news:
                self.trie.insert([tail for _, tail, _ in news], [first_new for _, _, first_new in news],
                                 [self._slots[request_id] for request_id, _, _ in news])
            return
        for request_id, tail, first_new in news:
            known = self._paths.pop(request_id, None)
            known = known if first_new else None  # a history that starts over walks every path
            paths = self.trie.insert(tail.tolist(), first_new=first_new, known=known)
            if paths is not None:
                self._paths[request_id] = paths

    def release(self, request_ids) -> None:
        """Forget what these finished requests inserted (unknown ids are ignored); their n-grams
        stay in the trie, for the requests after them, as in SGLang's shared cache."""
        for request_id in request_ids:
            self._inserted.pop(request_id, None)
            self._paths.pop(request_id, None)
            slot = self._slots.pop(request_id, None)
            if slot is not None:
                self.trie.forget(slot)

    def window_nodes(self, request_id: Hashable) -> Optional[list[int]]:
        """The trie node of each window of the request's history as last inserted, [n - 1] for
        the last n tokens: the last node of each growing path its insert extended (shortest
        path last), which `find` would walk down to again. None when the trie may have evicted
        since (the LRU list is kept) or the request keeps no paths."""
        paths = self._paths.get(request_id)
        if paths is None or self.trie.evicting:
            return None
        return [path[-1] for path in reversed(paths)]

    def draft(self, history: Sequence[int], k: int, max_nodes: int,
              windows: Optional[Sequence[int]] = None) -> tuple[list[int], list[int]]:
        """The draft tree after a history (its last token is the root), from the trie as it is.
        windows: the trie node of each window, [n - 1] for the last n tokens (window_nodes), or
        None: each window is found from the root.

        Returns (tokens [m], parents [m] in 0..m, 0 = root), m <= max_nodes, laid out level by level.
        """
        if self.impl == "native":  # windows are found in the compiled trie
            tokens, parents, num = self._draft_native([np.asarray(history, dtype=np.int64)], [-1], k, max_nodes)
            return tokens[0, : num[0]].tolist(), parents[0, : num[0]].tolist()
        # Draft nodes in creation order: (token, parent), parent 0 the root, i the node drafted[i - 1].
        drafted: list[tuple[int, int]] = []
        index: dict[tuple[int, int], int] = {}  # (draft parent, token) -> draft node
        if k < 1 or max_nodes < 1:
            return [], []
        token_of = self.trie._token
        longest = min(len(history), self.max_match_window)
        for n in range(longest, self.min_match_window - 1, -1):
            if windows is not None and n <= len(windows):
                matched = windows[n - 1]
            else:
                matched = self.trie.find(history[len(history) - n :])
            if matched is None:
                continue
            queue = deque([(0, matched, n, 0)])  # draft node, trie node, trie depth, draft depth
            while queue and len(drafted) < max_nodes:
                parent, node, depth, level = queue.popleft()
                if level >= k:
                    continue
                # no more than max_nodes children are taken: each is a new draft node or one
                # already under the same draft parent
                for child in self.trie.ranked_children(node, min(self.breadth(depth), max_nodes)):
                    if len(drafted) >= max_nodes:
                        break
                    token = token_of[child]
                    at = index.get((parent, token))
                    if at is None:
                        drafted.append((token, parent))
                        at = index[(parent, token)] = len(drafted)
                    queue.append((at, child, depth + 1, level + 1))
            if len(drafted) >= max_nodes:
                break
        return _level_order(drafted)

    def propose(self, state: DraftState) -> DraftProposal:
        B, M, ids = len(state.tokens), state.max_nodes, state.ids
        histories = state.host_tokens()  # [T_b] each
        self._insert(list(zip(ids, histories)))  # everyone's new tokens first, then matching
        if self.impl == "native":
            slots = [self._slots.get(rid, -1) for rid in ids]  # each just inserted this history: windows kept
            drafts, parents, num = self._draft_native([h[-self.max_match_window :] for h in histories], slots,
                                                      state.k, M)
        else:
            flat_tokens = [-1] * (B * M)  # [B * M], filled row by row, one tensor per batch below
            flat_parents = [0] * (B * M)  # 0 in unused columns
            counts = [0] * B
            for b, (rid, history) in enumerate(zip(ids, histories)):
                tail = history[-self.max_match_window :].tolist()  # [<= max_match_window] the windows
                toks, pars = self.draft(tail, state.k, M, self.window_nodes(rid))
                m = len(toks)
                flat_tokens[b * M : b * M + m] = toks
                flat_parents[b * M : b * M + m] = pars
                counts[b] = m
            drafts = np.array(flat_tokens, dtype=np.int64).reshape(B, M)  # [B, M]
            parents = np.array(flat_parents, dtype=np.int64).reshape(B, M)  # [B, M]
            num = np.array(counts, dtype=np.int64)  # [B]
        # on the host, where the runner reads them (one torch op each)
        return DraftProposal(tokens=torch.from_numpy(drafts), num_tokens=torch.from_numpy(num), probs=None,
                             parents=torch.from_numpy(parents))

    def _draft_native(self, tails: list, slots: list, k: int, max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every request's tree in one call of the compiled trie: tails B x [<= max_match_window],
        slots [B] (CompiledTrie.draft) -> tokens [B, M] (-1 past each row's count), parents [B, M]
        (0 there), counts [B]."""
        return self.trie.draft(tails, slots, k, max_nodes, self.min_match_window, self.max_match_window,
                               self.min_bfs_breadth, self.max_bfs_breadth)


def _level_order(drafted: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Renumber draft nodes (token, parent), given in creation order, breadth-first from the root,
    siblings in creation order. Returns (tokens [m], parents [m]) in proposal form."""
    parents = [parent for _, parent in drafted]
    if all(a <= b for a, b in zip(parents, parents[1:])):
        # Already breadth-first (one window's BFS, the usual case): the root's children come
        # first, then node 1's, node 2's, ..., so the renumbering below is the identity.
        return [token for token, _ in drafted], parents
    children: list[list[int]] = [[] for _ in range(len(drafted) + 1)]  # creation node -> its children
    for i, (_, parent) in enumerate(drafted, start=1):
        children[parent].append(i)
    order, new = [], {0: 0}  # creation nodes in level order; creation node -> level-order node
    queue = deque([0])
    while queue:
        for child in children[queue.popleft()]:
            order.append(child)
            new[child] = len(order)
            queue.append(child)
    return [drafted[c - 1][0] for c in order], [new[drafted[c - 1][1]] for c in order]


class CompiledTrie:
    """The trie of ngram_trie.cpp behind ctypes: NgramTrie's counts and the drafter's trees,
    with every request's inserts in one call and every request's tree in another."""

    def __init__(self, library: ctypes.CDLL, capacity: int, max_depth: int):
        assert capacity >= max_depth >= 1, (capacity, max_depth)
        self.capacity, self.max_depth = capacity, max_depth
        self._lib = library
        self._handle = library.trie_new(capacity, max_depth)
        weakref.finalize(self, library.trie_free, self._handle)

    def __len__(self) -> int:
        """Nodes held, the root excluded."""
        return self._lib.trie_size(self._handle)

    def count(self, ngram: Sequence[int]) -> int:
        """How often the n-gram occurred in the inserted text (0 when absent or evicted)."""
        ngram = np.ascontiguousarray(ngram, dtype=np.int64)
        return self._lib.trie_count(self._handle, ngram.ctypes.data, ngram.shape[0])

    def insert(self, tails: list, first_new: list, slots: list) -> None:
        """B inserts in order: tails B x [t_b] int64, of which the tokens from first_new[b] on are
        new (NgramTrie.insert for each; 0: the history starts over); slots [B]: a number per
        request, under which the trie keeps its growing paths (NgramTrie.insert's `known`)."""
        args = _packed(tails, first_new, slots)
        self._lib.trie_insert(self._handle, args.ctypes.data, len(tails))

    def draft(self, tails: list, slots: list, k: int, max_nodes: int, min_window: int, max_window: int,
              min_breadth: int, max_breadth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """B trees (NgramTrieDrafter.draft for each tail) -> tokens [B, M] (-1 padding),
        parents [B, M] (0 padding), counts [B]. slots [B]: the request's slot where its last
        insert was of this very history (its windows' nodes are then the ends of the paths kept,
        as window_nodes), else -1 (every window found from the root)."""
        B, M = len(tails), max_nodes
        args = _packed(tails, slots)
        out = np.empty(B * (2 * M + 1), dtype=np.int64)  # tokens [B, M], parents [B, M], counts [B]
        self._lib.trie_draft(self._handle, args.ctypes.data, B, k, M, min_window, max_window, min_breadth,
                             max_breadth, out.ctypes.data)
        return out[: B * M].reshape(B, M), out[B * M : 2 * B * M].reshape(B, M), out[2 * B * M :]

    def check(self) -> int:
        """Nodes the edge map or their parent's children do not lead to: 0 for a sound trie."""
        return self._lib.trie_check(self._handle)

    def forget(self, slot: int) -> None:
        """Drop a finished request's kept paths (its n-grams stay)."""
        self._lib.trie_forget(self._handle, slot)


def _packed(rows: list, *columns: list) -> np.ndarray:
    """One int64 array for a call: the rows' offsets [B + 1], each column [B], then the rows
    B x [t_b] int64 end to end (one pointer to pass, however many requests)."""
    head = list(itertools.accumulate((row.shape[0] for row in rows), initial=0))
    for column in columns:
        head += column
    return np.concatenate([np.array(head, dtype=np.int64), *rows])


@functools.lru_cache(maxsize=None)
def _compiled() -> Union[ctypes.CDLL, str]:
    """ngram_trie.cpp built with the host's C++ compiler ($CXX, else c++ or g++) into the cache
    ($SPECBENCH_CACHE/build, keyed by the source's hash) and loaded; or why it could not be."""
    from specbench.fetch import cache_dir

    source = Path(__file__).with_suffix(".cpp")
    if not source.exists():
        return f"{source} is missing"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = cache_dir() / "build" / f"ngram_trie-{digest}-{platform.system()}-{platform.machine()}.so"
    if not target.exists():
        compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if compiler is None:
            return "no C++ compiler (set CXX, or install g++)"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}")
        command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(partial), str(source)]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            lines = (getattr(e, "stderr", None) or str(e)).strip().splitlines() or [repr(e)]
            first_error = next((line for line in lines if "error" in line), lines[-1])
            return f"{' '.join(command)} failed: {first_error.strip()}"
        os.replace(partial, target)  # whole or not at all, whoever builds it at the same time
    try:
        library = ctypes.CDLL(str(target))
    except OSError as e:
        return f"cannot load {target}: {e}"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.trie_new.restype, library.trie_new.argtypes = ptr, [i64, i64]
    library.trie_free.restype, library.trie_free.argtypes = None, [ptr]
    library.trie_size.restype, library.trie_size.argtypes = i64, [ptr]
    library.trie_count.restype, library.trie_count.argtypes = i64, [ptr, ptr, i64]
    library.trie_insert.restype, library.trie_insert.argtypes = None, [ptr, ptr, i64]
    library.trie_forget.restype, library.trie_forget.argtypes = None, [ptr, i64]
    library.trie_check.restype, library.trie_check.argtypes = i64, [ptr]
    library.trie_draft.restype, library.trie_draft.argtypes = None, [ptr, ptr] + [i64] * 7 + [ptr]
    return library
