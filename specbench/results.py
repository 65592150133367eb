"""Results rows: one per run, written atomically into the run's own directory.

    <results_dir>/runs/<run_id>/rows.jsonl      the results rows (COLUMNS, and a few more): one
                                                for a decode run, one per rule for a rule check
    <results_dir>/runs/<run_id>/config.yaml     the resolved config
    <results_dir>/runs/<run_id>/requests.jsonl  per request: tokens, rounds, accepted per round, timings
    <results_dir>/baselines/<key>.json          baseline outputs and timings, shared by runs

Each file is written to a temporary name and renamed, so a crash never leaves half a row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

COLUMNS = (
    "run_id", "task", "target", "drafter", "rule", "k", "topk", "num_draft_tokens", "temperature", "top_k", "top_p",
    "batch_size", "warmup", "repeats", "dataset", "num_prompts", "new_tokens", "rounds", "drafted_tokens",
    "accepted_tokens", "acceptance_rate", "tokens_per_round", "median_tokens_per_round", "accept_pos", "tpot_ms", "ttft_ms",
    "throughput_tok_s", "wall_s", "draft_ms", "verify_ms", "other_ms", "request_round_ms", "prefill_ms", "prefill_wait_ms", "baseline_tpot_ms",
    "baseline_throughput_tok_s", "baseline_step_ms", "peak_memory_gb", "kv_bytes_per_token", "engine", "engine_options", "rule_impl", "drafter_impl", "draft_sample_method", "synthetic_rate", "synthetic_coins", "kv_slots_used", "kv_slots_reserved_vllm", "kv_slots_reserved_sglang",
    "greedy_mismatches", "speedup", "graph_captures", "baseline_graph_captures", "tpot_runs_ms", "baseline_tpot_runs_ms", "device", "torch_version",
    "transformers_version", "git_sha", "config_hash", "status", "error",
)


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


NOT_HASHED = ("results_dir", "resume", "logger")  # where and how results go, not what is measured


def config_hash(config: dict) -> str:
    """Hash of what defines a run: the resolved config less where and how results are kept."""
    semantic = {key: value for key, value in config.items() if key not in NOT_HASHED}
    return hashlib.sha256(json.dumps(semantic, sort_keys=True).encode()).hexdigest()[:16]


def new_run_id(chash: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{chash[:8]}-{os.urandom(2).hex()}"


def jsonl(items) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def write_run(results_dir: str | Path, run_id: str, rows: list, config_yaml: str, records: list) -> Path:
    run_dir = Path(results_dir) / "runs" / run_id
    atomic_write(run_dir / "requests.jsonl", jsonl(dataclasses.asdict(r) for r in records))
    atomic_write(run_dir / "config.yaml", config_yaml)
    atomic_write(run_dir / "rows.jsonl", jsonl(rows))  # last: its presence marks the run complete
    return run_dir


def finished_rows(results_dir: str | Path, chash: str, git_sha: str | None) -> list:
    """The rows of an earlier run with this config_hash, at this code (git_sha), that ended "ok",
    or []. A run of other code is not this one: its timings are that code's."""
    for path in sorted(Path(results_dir).glob("runs/*/rows.jsonl")):
        rows = read_jsonl(path)
        if (rows and rows[0].get("config_hash") == chash and rows[0].get("git_sha") == git_sha
                and all(r.get("status") == "ok" for r in rows)):
            return rows
    return []


def read_jsonl(path: Path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)
