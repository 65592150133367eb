"""Ad hoc (issue 6, a): which of the morning's three untested changes slowed the decode step with
engine.kernels from 4.24 ms (results/2026-12-04-h200, dc9410f) to 4.61 ms (this folder, bfdc9e5).

    git show abc8a2c^:kernels/attention.py > kernels/_attention_abc8a2c_parent.py
    python results/2026-12-04-h200-afternoon/decode_bisect.py OUT

Each change undone alone, side by side in one process, on the Llama-3.1-8B shape (random bf16
weights, context 512, eager layers with the kernels, CUDA graphs):
  merge   the attention kernel as before abc8a2c (its merge walking the splits one at a time)
  fold    the final norm apart from the LM head again, as before 4cdc766 (rms_norm, then project)
  rope    RoPE's cos and sin computed in each forward, as before a3eb9a7 (no table)
  all     the three undone together
  unsplit (q = 9 only) the rows kernel without split K (gemv.SPLIT_MAX_N = 0)
Per variant: the forward's median ms (graph replay), and the profiler's kernel table.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
from engine_bench import LLAMA_8B, build_hf, median_ms  # noqa: E402

from specbench import provenance  # noqa: E402
from specbench.engines import native as native_mod  # noqa: E402
from specbench.kernels import _attention_abc8a2c_parent as old_attention  # noqa: E402
from specbench.kernels import gemv  # noqa: E402


@contextmanager
def patched(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def unfolded_project(x, w, b=None, *, norm=None, eps=1e-6, **kw):
    if norm is not None and kw.get("glu") is None and "residual" not in kw and w.shape[0] > 100000:
        x, norm = gemv.rms_norm(x, norm, eps), None  # the LM head: the norm in torch first
    return gemv.project(x, w, b, norm=norm, eps=eps, **kw)


def undo(stack: ExitStack, what: set, engine_holder: list):
    if "merge" in what:
        stack.enter_context(patched(native_mod, "attention_kernel", old_attention.decode))
        stack.enter_context(patched(native_mod, "attention_counters", old_attention.counters))
    if "fold" in what:
        stack.enter_context(patched(native_mod, "project", unfolded_project))
    if "unsplit" in what:
        stack.enter_context(patched(gemv, "SPLIT_MAX_N", 0))


def table(prof) -> list:
    totals, counts = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time_total
            counts[e.name] += 1
    return sorted(((n[:60], t / 10, counts[n] / 10) for n, t in totals.items()), key=lambda r: -r[1])[:6]


def run(native, what: set, q: int, device) -> dict:
    with ExitStack() as stack:
        undo(stack, what, [])
        engine = native_mod.NativeEngine(native, 1, 512 + 128, kernels=True)
        if "rope" in what:
            engine.rope_table = None
        engine.prefill(0, torch.randint(0, native.s.vocab_size, (512,), device=device))
        tokens = torch.randint(0, native.s.vocab_size, (1, q), device=device)
        engine.forward(tokens)  # tunes and captures
        graph = engine._graphs[(q, False)][0]
        out = {"ms": median_ms(graph.replay, device, n=50)}
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
        out["top"] = table(prof)
    return out


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    results = {"device": provenance.device_name(device), **provenance.versions(), "git_sha": provenance.git_sha(),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ctx": 512}
    native = native_mod.Transformer.from_hf(build_hf(LLAMA_8B, device, torch.bfloat16))
    torch.cuda.empty_cache()
    variants = [("head", set()), ("merge", {"merge"}), ("fold", {"fold"}), ("rope", {"rope"}),
                ("all", {"merge", "fold", "rope"})]
    for q in (1, 9):
        for name, what in variants + ([("unsplit", {"unsplit"})] if q > 1 else []):
            key = f"q{q}_{name}"
            results[key] = run(native, what, q, device)
            print(f"{key:12s} {results[key]['ms']:.3f} ms  " +
                  "  ".join(f"{n[:14]} {t:.0f}us x{c:.0f}" for n, t, c in results[key]["top"][:3]), flush=True)
            (out / "decode_bisect.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
