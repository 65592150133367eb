"""Tables and figures for issue 6 from a runner_suite.sh folder (and engine_bench.py's JSON).

    python experiments/runner_report.py OUT [ENGINE_BENCH_JSON]

Reads OUT/rows.csv; writes OUT/report.md (every table) and OUT/cost_model.png, and prints
the tables. The synthetic control (c) is compared with (1 - a^(k+1)) / ((1 - a)(k c + 1)),
c = draft_ms / (k * baseline step) measured in the same run, and with the cost model of
specbench.analysis (r = t_verify(k+1) / t_step measured too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from specbench import analysis, figures

REAL = ["drafter", "draft_sample_method", "dataset", "batch_size", "temperature"]


def synthetic_table(rows: pd.DataFrame) -> pd.DataFrame:
    runs = analysis.cost_model(rows[rows.drafter == "synthetic"])
    if runs.empty:
        return runs
    a = runs.synthetic_rate.astype(float)
    k = runs.k.astype(float)
    runs = runs.assign(
        a=a, formula=analysis.predicted_speedup(analysis.expected_tokens(a, k), k, runs.c_measured),
        measured=figures.measured_speedup(runs),
    )
    runs["measured/formula"] = runs.measured / runs.formula
    runs["measured/cost_model"] = runs.measured / runs.predicted_speedup
    cols = ["a", "k", "tokens_per_round", "c_measured", "r_measured", "measured", "formula", "measured/formula",
            "predicted_speedup", "measured/cost_model"]
    return runs[cols].sort_values(["a", "k"]).reset_index(drop=True)


def real_table(rows: pd.DataFrame) -> pd.DataFrame:
    runs = analysis.cost_model(rows[rows.drafter.notna() & (rows.drafter != "synthetic")])
    cols = REAL + ["acceptance_rate", "tokens_per_round", "tpot_ms", "baseline_tpot_ms", "speedup",
                   "throughput_tok_s", "baseline_throughput_tok_s", "draft_ms", "verify_ms", "other_ms",
                   "predicted_speedup", "greedy_mismatches", "peak_memory_gb"]
    return runs[[c for c in cols if c in runs.columns]].sort_values(REAL).reset_index(drop=True)


def sampling_table(rows: pd.DataFrame) -> pd.DataFrame:
    """draft_model at temperature 0.7, greedy against probabilistic drafting: acceptance and
    peak memory, beside the bytes of q that probabilistic drafting keeps (B x k x V fp32)."""
    runs = rows[(rows.drafter == "draft_model") & (rows.temperature > 0)]
    if runs.empty or runs.draft_sample_method.nunique() < 2:
        return pd.DataFrame()
    keys = ["dataset", "batch_size"]
    wide = runs.pivot_table(index=keys, columns="draft_sample_method",
                            values=["acceptance_rate", "tokens_per_round", "peak_memory_gb", "speedup"])
    wide.columns = [f"{v}_{m}" for v, m in wide.columns]
    wide = wide.reset_index()
    vocab = 49152  # SmolLM2's
    wide["q_bytes_mb"] = wide.batch_size * 4 * vocab * 4 / 1e6
    for value, diff in (("acceptance_rate", "acceptance_gain"), ("peak_memory_gb", "peak_memory_extra_gb")):
        if f"{value}_probabilistic" in wide and f"{value}_greedy" in wide:  # CPU rows have no peak memory
            wide[diff] = wide[f"{value}_probabilistic"] - wide[f"{value}_greedy"]
    return wide


def main(out: Path, bench: Path | None) -> int:
    rows = pd.read_csv(out / "rows.csv")
    rows = rows[rows.status == "ok"]
    rows["synthetic_rate"] = pd.to_numeric(rows.get("synthetic_rate"), errors="coerce")
    text = [f"# Issue 6 runs: {rows.device.iloc[0]}, torch {rows.torch_version.iloc[0]}, "
            f"transformers {rows.transformers_version.iloc[0]}, git {rows.git_sha.iloc[0]}, "
            f"{rows.timestamp.min()} .. {rows.timestamp.max()}\n"]
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    for title, table in (("c. synthetic control", synthetic_table(rows)), ("d. real weights", real_table(rows)),
                         ("d. greedy vs probabilistic drafting (draft_model, T = 0.7)", sampling_table(rows))):
        if table.empty:
            continue
        body = table.to_string(index=False, float_format=lambda v: f"{v:.3f}")
        text.append(f"## {title}\n\n```\n{body}\n```\n")
        print(f"\n{title}\n{body}")
    if bench is not None and bench.exists():
        text.append("## a, b, memory (experiments/engine_bench.py)\n\n```\n" + json.dumps(json.loads(bench.read_text()), indent=1)[:20000] + "\n```\n")
    (out / "report.md").write_text("\n".join(text))
    try:
        figures.cost_model_figure(rows).savefig(out / "cost_model.png", dpi=130)
    except figures.NoData as e:
        print(f"cost model figure skipped: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None))
