"""Programmatic dependent launch (PDL) for the decode kernels (gemv.py, attention.py).

A decode step at batch 1 is about 200 short kernels in a row (6 per layer), and between two of
them the GPU idles: the next grid is launched only once the previous one has drained, and then
ramps up. With PDL (Hopper on), a kernel launched with the programmatic-serialization attribute
may start while its predecessor still runs, once every program of the predecessor has called
`griddepcontrol.launch_dependents`; it must then call `griddepcontrol.wait` before it touches
anything the predecessor writes (the wait returns when the predecessor has finished and its
writes are visible). Stream capture records the attribute into a CUDA graph (CUDA 12.3 on).

Each kernel here takes a constexpr PDL. First it does what depends on no earlier kernel (gemv:
load its first weight tile; attention: nothing), then `wait_and_release`: wait for the
predecessor, then let the successor launch. Waiting before releasing keeps at most two grids
in flight.

PDL is off unless switched on (ENABLED), and then applies to forwards of one token in all
(batch 1, q = 1) only, unless MAX_ROWS says more. On an H200 (8B shape, context 512, CUDA
graphs, side by side in one run):
- a decode step took 4.32 ms with PDL and 4.35 without (results/2026-12-03-h200-evening), then
  4.35 and 4.29 ms (results/2026-12-03-h200-night), then, with the attention in one launch,
  4.69 and 4.24 ms (results/2026-12-04-h200): never a gain, once a loss of a tenth; on an
  H100, 5.42 and 5.44 ms (results/2026-12-07-h100-attention-tiles);
- a verify forward of 9 positions took 7.20 ms with PDL and 5.32 without
  (results/2026-12-03-h200-night). There every projection runs gemv's rows kernel and the
  attention kernel tiles 9 x 4 query rows. Again on an H100 with the attention in one launch
  (`enabled(True, rows=16)`, results/2026-12-07-h100-short-cache): 7.04 against 5.94 ms at
  context 512, 7.31 against 6.27 at 4096.
Why the early launch costs time was not measured: the profiler's kernel times overlap under PDL, so
they do not say which grid waited for which. The kernels keep the hooks for that experiment.

`launch_options(device, rows)` is what a launch passes: {"launch_pdl": True} where PDL applies
(ENABLED, CUDA, compute capability 9 or more, at most MAX_ROWS rows (1), not under
torch.compile, which launches user kernels itself), else {}. `enabled(True)` switches it on for
a block, for benchmarks that time both ways (a CUDA graph keeps what held at its capture);
`enabled(True, rows=16)` for verify forwards and batches too, to time again what the 9-position
forward of 2026-12-03 lost (its attention has changed since: one launch, not two).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # CPU installs without triton
    triton = None

ENABLED = False  # see the module docstring
MAX_ROWS = 1  # PDL applies to forwards of at most this many tokens (batch x positions)
_CAPABLE: dict = {}  # device index -> compute capability >= 9


def applies(device: torch.device) -> bool:
    if not ENABLED or triton is None or device.type != "cuda" or torch.compiler.is_compiling():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABLE:
        _CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _CAPABLE[index]


@contextmanager
def enabled(on: bool, rows: int = 1):
    """PDL on or off (ENABLED) inside the block, for forwards of at most `rows` tokens
    (MAX_ROWS); both as they were after it."""
    global ENABLED, MAX_ROWS
    saved = ENABLED, MAX_ROWS
    ENABLED, MAX_ROWS = on, rows
    try:
        yield
    finally:
        ENABLED, MAX_ROWS = saved


def launch_options(device: torch.device, rows: int) -> dict:
    """Keyword arguments of a Triton launch of a forward over `rows` tokens (batch x positions):
    the PDL attribute where it applies (see the module docstring); pass PDL=bool(...) as the
    kernel's constexpr alongside."""
    return {"launch_pdl": True} if rows <= MAX_ROWS and applies(device) else {}


if triton is not None:

    @triton.jit
    def wait_and_release(PDL: tl.constexpr):
        """Wait for the previous kernel's writes, then let the next kernel launch (no-ops
        without PDL)."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
