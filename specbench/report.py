"""What a person reads at the end of a run or a sweep: a short table of the results rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from tqdm.auto import tqdm

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
    """At the end of a multirun, prints the rows of its jobs as one table.

    The rows are read back from results_dir (each carries its job's Hydra output directory), so
    this works for launchers that run jobs in other processes or on other machines (joblib,
    submitit). A sweep goes on past a failed job; the process exits with status 1 if any failed."""

    def __init__(self) -> None:
        self.jobs = None
        self.returned: list = []  # rows returned by in-process jobs, resumed ones included

    def __getstate__(self) -> dict:
        # Launchers that run jobs in other processes (joblib) pickle the callbacks: send an
        # empty one, the parent keeps the progress bar.
        return {"jobs": None, "returned": []}

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self.jobs = tqdm(desc="jobs", unit="job", leave=False)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if self.jobs is not None:  # in-process launchers only; others report at the end
            self.jobs.update()
        value = getattr(job_return, "_return_value", None)
        if isinstance(value, list):
            self.returned += value

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from specbench.analysis import load_results

        if self.jobs is not None:
            self.jobs.close()
        sweep_dir = str(Path(config.hydra.sweep.dir))
        frame = load_results(config.results_dir)
        frame = frame[frame.hydra_dir.fillna("").str.startswith(sweep_dir)] if "hydra_dir" in frame else frame[:0]
        rows = {r["run_id"]: r for r in self.returned + frame.to_dict("records")}
        if not rows:
            return
        rows = sorted(rows.values(), key=lambda r: r["run_id"])
        print("\n" + table(rows), flush=True)
        failed = [r for r in rows if r.get("status") != "ok"]
        for r in failed:
            print(f"error: job {r['run_id']}: {r['error']}", file=sys.stderr)
        if failed:
            sys.exit(1)
