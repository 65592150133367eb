"""What a person reads at the end of a run or a sweep: a short table of the results rows."""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback

SHOWN = (
    "drafter", "rule", "k", "dtype", "temperature", "dataset", "num_prompts", "new_tokens", "acceptance_rate",
    "tokens_per_round", "tpot_ms", "speedup", "greedy_mismatches", "chi2_pvalue", "tv", "tv_null", "status",
)


def table(rows: list, columns=SHOWN) -> str:
    """The given columns that some row fills, as a fixed-width table."""
    frame = pd.DataFrame(rows)
    frame = frame[[c for c in columns if c in frame.columns and frame[c].notna().any()]]
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        return frame.to_string(index=False, float_format=lambda v: f"{v:.4g}")


class SweepSummary(Callback):
    """Collects each job's row during a multirun and prints them as one table at the end.

    A sweep goes on past a failed job; the process exits with status 1 if any job failed."""

    def __init__(self) -> None:
        self.rows: list = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        value = getattr(job_return, "_return_value", None)
        if isinstance(value, list):
            self.rows += value

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not self.rows:
            return
        print("\n" + table(self.rows), flush=True)
        failed = [r for r in self.rows if r.get("status") != "ok"]
        for r in failed:
            print(f"error: job {r['run_id']}: {r['error']}", file=sys.stderr)
        if failed:
            sys.exit(1)
