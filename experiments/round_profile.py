"""Where a runner round's time goes, on the device's timeline (issue 6, c): draft, verify, other.

Runs one specbench job (the overrides of `python -m specbench`) with its two measured decodes,
the baseline's and the speculative one, under torch.profiler; warm-ups run as usual. Each round
is cut where the runner's own clocks cut it (its perf_counter calls at t_draft, t_forward,
t_rule and the round's end), and each phase gets, per round:

  wall      ms between the cuts. Under the profiler: every host operation costs more than
            in a row's timing, so compare phases and decodes, not these with a row's numbers
  busy      ms the device ran kernels or copies (the union of their intervals)
  idle      wall - busy: the device waiting on the host (launches, syncs, Python)
  kernels   device kernels and copies
  ops       top-level host operations (aten ops and CUDA runtime calls outside any op)
  top       the host's top-level operations by time, ms a round

    python experiments/round_profile.py OUT [overrides ...]
    python experiments/round_profile.py OUT +drafter=synthetic 'drafter.acceptance_rates=[0.8]' k=4 \\
        dataset.num_prompts=2 max_new_tokens=64 target.path=/root/models/SmolLM2-135M-Instruct.Q4_1.gguf

Writes OUT/round_profile.json (every number, with provenance), OUT/<decode>.trace.json (Chrome
traces) and OUT/results/ (the job's row: its timings are the profiler's, not a measurement; a
baseline cached there by an earlier call is dropped, so that the baseline is profiled again);
prints the table.
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from specbench import provenance, run, runner
from specbench.__main__ import CONF
from specbench.config import register

# The runner's clock reads that cut a round, by the statement that makes them.
CUTS = {"t_draft = time.perf_counter()": "draft", "t_forward = time.perf_counter()": "forward",
        "t_rule = time.perf_counter()": "rule", "clock.observe(": "end"}
PHASES = (("draft", "draft", "forward"), ("verify", "forward", "rule"), ("other", "rule", "end"))
MARK = "specbench.cut."


def cut_lines() -> dict:
    """Line number in runner.py -> cut name, found in decode_requests' source."""
    source, first = inspect.getsourcelines(runner.decode_requests)
    lines = {}
    for offset, text in enumerate(source):
        for statement, name in CUTS.items():
            if statement in text:
                lines[first + offset] = name
    if sorted(lines.values()) != sorted(CUTS.values()):
        raise SystemExit(f"error: runner.decode_requests: cuts found {sorted(lines.values())}, need {sorted(CUTS.values())}")
    return lines


class MarkingClock:
    """Stands in for runner's `time`: a clock read at a cut also leaves a marker in the trace."""

    def __init__(self, lines: dict):
        self.lines = lines

    def perf_counter(self) -> float:
        name = self.lines.get(sys._getframe(1).f_lineno)
        if name is not None:
            with record_function(MARK + name):
                pass
        return time.perf_counter()


def busy_us(intervals: list) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def phases(events) -> dict:
    """A profiled decode's events -> per phase: per-round means and the top host operations."""
    marks = defaultdict(list)
    device, host = [], []
    for e in events:
        if e.name.startswith(MARK):
            if e.device_type == DeviceType.CPU:
                marks[e.name[len(MARK):]].append(e.time_range.start)
        elif e.device_type == DeviceType.CUDA:
            if not e.is_user_annotation:  # a range's span on the device is not work done
                device.append((e.time_range.start, e.time_range.end))
        elif e.cpu_parent is None and not e.is_user_annotation:
            host.append((e.time_range.start, e.time_range.end, e.name))
    rounds = len(marks["end"])
    if not rounds or any(len(marks[c]) != rounds for c in CUTS.values()):
        raise SystemExit(f"error: the trace's cuts do not pair up: { {c: len(marks[c]) for c in CUTS.values()} }")
    out = {}
    for phase, a, b in PHASES:
        windows = list(zip(marks[a], marks[b]))
        wall = busy = kernels = ops = 0.0
        top = Counter()
        for lo, hi in windows:
            inside = [(max(s, lo), min(e, hi)) for s, e in device if s < hi and e > lo]
            wall += hi - lo
            busy += busy_us(inside)
            kernels += sum(lo <= s < hi for s, _ in device)
            for s, e, name in host:
                if lo <= s < hi:
                    ops += 1
                    top[name] += min(e, hi) - s
        out[phase] = {
            "wall_ms": wall / rounds / 1e3, "busy_ms": busy / rounds / 1e3, "idle_ms": (wall - busy) / rounds / 1e3,
            "kernels": kernels / rounds, "ops": ops / rounds,
            "top": [(name, us / rounds / 1e3) for name, us in top.most_common(6)],
        }
    return {"rounds": rounds, "phases": out}


def profiled_decode_all(out: Path, found: dict):
    """run.decode_all, with the measured decodes (not the warm-ups) under the profiler."""
    plain = run.decode_all

    def decode_all(*args, desc, **kwargs):
        if desc == "warm-up":
            return plain(*args, desc=desc, **kwargs)
        name = "baseline" if desc == "baseline" else "speculative"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            result = plain(*args, desc=desc, **kwargs)
        prof.export_chrome_trace(str(out / f"{name}.trace.json"))
        found[name] = phases(prof.events())
        return result

    return decode_all


def table(found: dict) -> str:
    lines = [f"{'decode':<12} {'phase':<7} {'wall':>7} {'busy':>7} {'idle':>7} {'kernels':>8} {'ops':>6}  top host operations (ms a round)"]
    for name, got in found.items():
        for phase, p in got["phases"].items():
            top = ", ".join(f"{op} {ms:.3f}" for op, ms in p["top"][:4])
            lines.append(f"{name:<12} {phase:<7} {p['wall_ms']:7.3f} {p['busy_ms']:7.3f} {p['idle_ms']:7.3f} "
                         f"{p['kernels']:8.1f} {p['ops']:6.1f}  {top}")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    overrides = sys.argv[2:]
    register()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            # one measured decode each (repeats=1): the profiler's, not a timing to pick a median from
            cfg = compose("config", overrides=[*overrides, f"results_dir={out / 'results'}", "resume=false", "repeats=1"])
    except Exception as e:  # hydra's composition errors span lines; the first names the override
        raise SystemExit(f"error: {str(e).splitlines()[0]}") from None
    # A results folder of its own, its cached baselines dropped: the baseline is decoded again,
    # under the profiler, not read from an earlier call's cache.
    shutil.rmtree(out / "results" / "baselines", ignore_errors=True)
    found: dict = {}
    plain = run.decode_all
    runner.time, run.decode_all = MarkingClock(cut_lines()), profiled_decode_all(out, found)
    try:
        rows = run.run_and_record(cfg)
    finally:
        runner.time, run.decode_all = time, plain
    if rows[0]["status"] != "ok":
        raise SystemExit(f"error: the job failed: {rows[0]['error']}")
    record = {
        "overrides": overrides, "decodes": found, "run_id": rows[0]["run_id"],
        "device": provenance.device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_sha": provenance.git_sha(), **provenance.versions(),
    }
    (out / "round_profile.json").write_text(json.dumps(record, indent=1) + "\n")
    print(table(found))


if __name__ == "__main__":
    main()
