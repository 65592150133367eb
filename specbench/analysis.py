"""Results rows -> pandas: loading, pivots, speedup against the matching baseline, and the
expected tokens per round beside the measured value. For notebooks, figures and summaries."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from specbench.results import COLUMNS, read_jsonl

# A speculative run is compared with the baseline run that shares all of these.
BASELINE_MATCH = ("target", "dataset", "num_prompts", "max_new_tokens", "temperature", "batch_size", "device", "dtype")


def load_results(results_dir: str | Path, *, ok_only: bool = False) -> pd.DataFrame:
    """Every row under results_dir/runs/*/rows.jsonl, COLUMNS first (decode runs have one row;
    a rule check has one per rule: filter on `task`).

    Runs still in progress have no rows.jsonl yet and are not listed."""
    rows = [row for p in sorted(Path(results_dir).glob("runs/*/rows.jsonl")) for row in read_jsonl(p)]
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    extra = [c for c in frame.columns if c not in COLUMNS]
    frame = frame[list(COLUMNS) + extra]
    return frame[frame.status == "ok"].reset_index(drop=True) if ok_only else frame


def decode_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful decode runs only (drops rule checks and failures)."""
    return frame[(frame.task == "decode") & (frame.status == "ok")].copy()


def pivot(frame: pd.DataFrame, values: str = "acceptance_rate", index: Sequence[str] = ("drafter", "rule"),
          columns: str = "k", aggfunc: str = "mean") -> pd.DataFrame:
    """e.g. acceptance by drafter x rule (rows) and k (columns), over successful decode runs."""
    runs = decode_runs(frame).dropna(subset=[values])
    return runs.pivot_table(values=values, index=list(index), columns=columns, aggfunc=aggfunc)


def with_speedup(frame: pd.DataFrame, match: Sequence[str] = BASELINE_MATCH) -> pd.DataFrame:
    """Adds baseline_tpot_ms (the median over matching baseline runs) and speedup_vs_baseline
    = baseline_tpot_ms / tpot_ms, for decode runs; NaN where no baseline matches."""
    runs = decode_runs(frame)
    keys = [m for m in match if m in runs.columns]
    base = runs[runs.drafter.isna()].groupby(keys, dropna=False)["tpot_ms"].median().rename("baseline_tpot_ms")
    out = runs.merge(base.reset_index(), on=keys, how="left")
    out["speedup_vs_baseline"] = out.baseline_tpot_ms / out.tpot_ms
    return out


def expected_tokens_per_round(a, k):
    """(1 - a^(k+1)) / (1 - a): tokens per round for i.i.d. per-position acceptance a."""
    a, k = np.asarray(a, dtype=float), np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (1 - a ** (k + 1)) / (1 - a)
    return np.where(a >= 1, k + 1, value)


def pooled_acceptance(accept_pos, accept_reached) -> float:
    """a from the measured per-position acceptance: accepted / reached, summed over positions."""
    if not isinstance(accept_pos, (list, tuple)) or not isinstance(accept_reached, (list, tuple)):
        return float("nan")
    reached = np.asarray(accept_reached, dtype=float)
    rates = np.asarray([np.nan if r is None else r for r in accept_pos], dtype=float)
    seen = reached > 0
    return float((rates[seen] * reached[seen]).sum() / reached[seen].sum()) if seen.any() else float("nan")


def with_expected_tokens_per_round(frame: pd.DataFrame) -> pd.DataFrame:
    """Adds a_hat (pooled per-position acceptance) and tokens_per_round_expected beside the
    measured tokens_per_round, for speculative decode runs."""
    runs = decode_runs(frame)
    runs = runs[runs.drafter.notna()].copy()
    runs["a_hat"] = [pooled_acceptance(p, r) for p, r in zip(runs.accept_pos, runs.get("accept_reached", [None] * len(runs)))]
    runs["tokens_per_round_expected"] = expected_tokens_per_round(runs.a_hat, runs.k)
    return runs
