"""Results rows -> pandas, for notebooks, figures and the sweep summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.results import COLUMNS, read_jsonl


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every row under results_dir/runs/*/rows.jsonl, COLUMNS first (decode runs have one row;
    a rule check has one per rule: filter on `task`).

    Runs still in progress have no rows.jsonl yet and are not listed."""
    rows = [row for p in sorted(Path(results_dir).glob("runs/*/rows.jsonl")) for row in read_jsonl(p)]
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    extra = [c for c in frame.columns if c not in COLUMNS]
    return frame[list(COLUMNS) + extra]


def expected_tokens_per_round(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens per round for i.i.d. per-position acceptance a."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)
