"""CUDA graphs for forwards whose shapes repeat: capture once per shape, then replay.

Eager PyTorch issues one launch per operation, each after the host has run the Python that
leads to it; a small model's forward is then host-bound. A forward over tensors of fixed shapes
that never waits for the host can be captured once in a CUDA graph and replayed: one launch
from the host however many kernels it holds. The native engine replays its decode and verify
forwards so (engines/native.py); EAGLE heads their draft steps (drafters/eagle_chain.py), where
an eager chain round of a one-layer head at k = 4 dispatches about 500 aten operations.

`capture` warms a callable up on a side stream (lazy allocations and caches, compilation,
cuDNN plans) and captures one call. `Graphed` keeps a graph per key and input shapes for one
function of device tensors. A captured function must not synchronize with the host (no
`.item()`, no `.cpu()`, no tensor made from Python data) and must not read host state that
changes between calls: a replay repeats the kernels captured, with the addresses and launch
constants of the capture. Its side effects (cache writes) happen at every warm-up and replay,
so they must be idempotent for the same inputs, as writing keys and values at given slots is.
"""

from __future__ import annotations

import gc
from typing import Callable, Hashable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_captures = 0  # graphs captured by this process (through `capture`)
_warmup_streams: dict = {}  # CUDA device index -> the side stream every capture warms up on


def captures() -> int:
    """Graphs this process has captured so far: a runner reads it around a timed region, where
    a capture (a shape met for the first time) is a stall that no round of steady decoding has."""
    return _captures


class HostOps(TorchDispatchMode):
    """Counts the aten operations the host dispatches inside it (a graph's replay dispatches
    none of its own): a device-independent measure of a round's host work."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def counts(self, func) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += self.counts(func)
        return func(*args, **(kwargs or {}))


def supported(device: torch.device) -> bool:
    """Whether forwards on `device` can be captured (CUDA only)."""
    return device.type == "cuda"


def capture(run: Callable[[], object], warmups: int = 2, generators: tuple = ()) -> tuple[object, object]:
    """Run `run` `warmups` times on a side stream, then capture one call -> (graph, its outputs).
    The outputs are the graph's: every replay writes them again, in place.

    generators: the CUDA torch.Generators that `run` draws from, registered with the graph (the
    default one always is): a replay then draws from each at its offset of the moment and moves
    it on by what the capture drew, the numbers an eager call would draw (re-seeding it between
    replays is fine; a new generator object needs a graph of its own).

    The garbage collector is run first and kept off during the capture: a graph it frees inside
    another's capture (a dropped EagleChain's: its Graphed holds bound methods, a reference cycle)
    invalidates that capture. torch.cuda.graph collected before capturing until torch 2.8."""
    global _captures
    _captures += 1
    stream = _warmup_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (and compilation) outside the capture
        for _ in range(warmups):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        for generator in generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph):
            out = run()
    finally:
        if collecting:
            gc.enable()
    return graph, out


class Graphed:
    """fn(key, *inputs) -> a tuple of tensors, replayed from a CUDA graph per (key, input shapes).

    key: the call's non-tensor arguments (e.g. a number of steps), hashable. inputs: device
    tensors; the first call of a key clones them as the graph's static inputs, later calls copy
    theirs into those. The outputs returned are the graph's static outputs: the next call of the
    same key and shapes overwrites them, so consume or copy them first. Disabled, it calls fn
    directly: the eager and the graphed path run one function. generators: those fn draws
    from (`capture`)."""

    def __init__(self, fn: Callable[..., tuple], enabled: bool, generators: tuple = ()):
        self.fn, self.enabled, self.generators = fn, enabled, generators
        self._graphs: dict = {}  # (key, shapes, dtypes) -> (graph, static inputs, static outputs)

    def __call__(self, key: Hashable, *inputs: torch.Tensor) -> tuple:
        if not self.enabled:
            return self.fn(key, *inputs)
        slot = (key, tuple(x.shape for x in inputs), tuple(x.dtype for x in inputs))
        entry = self._graphs.get(slot)
        if entry is None:
            static = tuple(x.clone() for x in inputs)
            graph, out = capture(lambda: self.fn(key, *static), generators=self.generators)
            entry = self._graphs[slot] = (graph, static, out)
        else:
            for s, x in zip(entry[1], inputs):
                s.copy_(x)
        entry[0].replay()
        return entry[2]

    def __len__(self) -> int:
        """Graphs captured."""
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every graph: they hold the addresses of the tensors they were captured over (a
        cache that is replaced must not be written through its old graphs)."""
        self._graphs.clear()


def _warmup_stream() -> torch.cuda.Stream:
    """The current device's side stream for warm-ups, one for every capture. PyTorch keeps a
    cuBLAS workspace per (handle, stream), from the caching allocator and for the life of the
    process (32 MiB on Hopper): a new stream per capture left one behind for each capture that
    ran a matrix product (measured: 32 MiB more a capture, results/2026-12-06-h100-native-trie).
    It is why a draft model's greedy drafting, which captures more graphs than sampled drafting,
    peaked 0.06 to 0.07 GB higher (results/2026-12-06-h100-fullwarmup): with one stream both
    peaks fell, by 0.134 and 0.067 GB: 4 and 2 workspaces."""
    device = torch.cuda.current_device()
    if device not in _warmup_streams:
        _warmup_streams[device] = torch.cuda.Stream()
    return _warmup_streams[device]
