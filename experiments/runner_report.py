"""Tables and figures for issue 6 from a runner_suite.sh folder (and engine_bench.py's JSON).

    python experiments/runner_report.py OUT [ENGINE_BENCH_JSON]

Reads OUT/rows.csv; writes OUT/report.md (every table) and OUT/cost_model.png, and prints
the tables. The synthetic control (c) is compared with (1 - a^(k+1)) / ((1 - a)(k c + 1)),
c = draft_ms / (k * baseline step) measured in the same run; with the same formula at the run's
own tokens per round (what its acceptance coins gave); and with the cost model of
specbench.analysis (r = t_verify(k+1) / t_step measured too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from specbench import analysis, figures

REAL = ["drafter", "draft_sample_method", "k", "topk", "dataset", "batch_size", "temperature"]  # topk > 1: a tree
STALL = 2.0  # a baseline step this many times its twin's is a stall inside the timed region


def stalled(rows: pd.DataFrame) -> pd.Series:
    """Rows whose baseline took a stall (a compilation or graph capture) inside its timed
    region: its mean forward step is over STALL x that of the baseline at the other temperature
    with the same prompts and batch size (same engine shapes; only the sampling op differs).
    Their speedup and predicted speedup are not measurements of speculation."""
    key = ["dataset", "batch_size", "num_prompts", "max_new_tokens"]
    step = pd.to_numeric(rows.baseline_step_ms, errors="coerce")
    twin = step.groupby([rows[k] for k in key]).transform("min")
    return step > STALL * twin


def spread(cells: pd.Series | None) -> pd.Series | float:
    """max / min of each row's repeats (tpot_runs_ms, baseline_tpot_runs_ms: a list, or its text
    in a CSV), NaN for rows without them (before `repeats`): how far one decode of the run
    strayed from another, a stall's size where one repeat took it."""
    def one(cell):
        runs = json.loads(cell) if isinstance(cell, str) else cell
        runs = [v for v in runs if v is not None] if isinstance(runs, list) else []
        return max(runs) / min(runs) if runs and min(runs) > 0 else float("nan")

    return float("nan") if cells is None else cells.map(one)


def captured(rows: pd.DataFrame, column: str = "graph_captures") -> pd.Series:
    """Rows whose own timed decode (or, column baseline_graph_captures, their baseline's)
    captured a CUDA graph (a shape its warm-up did not meet): that stall counts in their means.
    Rows from before the runner counted captures (no such column) are not flagged."""
    return pd.to_numeric(rows.get(column, pd.Series(0, index=rows.index)), errors="coerce").fillna(0) > 0


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
    # The same with the tokens per round the coins gave in place of their expectation: of the gap
    # above, what is cost (this ratio) and what the sample's acceptance (the two ratios' quotient).
    # (tau: the median request's, which the median TPOT sees; the pooled one in older rows)
    tau = analysis.request_tau(runs)
    runs["measured/formula(tau)"] = runs.measured / analysis.predicted_speedup(tau, k, runs.c_measured)
    # The per-round split's means over the median TPOT's round (batch 1: no other request's
    # prefill in either): about 1, unless a stall (a capture) inflated the means of one request.
    runs["split/tpot"] = (runs.draft_ms + runs.verify_ms + runs.other_ms) / (runs.tpot_ms * tau)
    runs["measured/cost_model"] = runs.measured / runs.predicted_speedup
    cols = ["a", "k", "graph_captures", "split/tpot", "tokens_per_round", "c_measured", "r_measured", "measured", "formula", "measured/formula",
            "measured/formula(tau)", "predicted_speedup", "measured/cost_model"]
    return runs[[c for c in cols if c in runs.columns]].sort_values(["a", "k"]).reset_index(drop=True)


def real_table(rows: pd.DataFrame) -> pd.DataFrame:
    runs = analysis.cost_model(rows[rows.drafter.notna() & (rows.drafter != "synthetic")])
    runs = runs.assign(tpot_spread=spread(runs.get("tpot_runs_ms")),
                       baseline_tpot_spread=spread(runs.get("baseline_tpot_runs_ms")))
    cols = REAL + ["rule_impl", "drafter_impl", "baseline_stalled", "graph_captures", "acceptance_rate", "tokens_per_round", "median_tokens_per_round", "tpot_ms", "tpot_spread", "baseline_tpot_ms", "baseline_tpot_spread", "speedup",
                   "throughput_tok_s", "baseline_throughput_tok_s", "baseline_step_ms", "draft_ms", "verify_ms", "other_ms",
                   "d_measured", "predicted_speedup", "greedy_mismatches", "peak_memory_gb"]
    return runs[[c for c in cols if c in runs.columns]].sort_values(REAL).reset_index(drop=True)


def fit_table(rows: pd.DataFrame) -> pd.DataFrame:
    """measured / predicted speedup of the real-weight runs by batch size (valid baselines only)."""
    runs = real_table(rows)
    runs = runs[~runs.baseline_stalled & ~captured(runs) & runs.predicted_speedup.notna()]
    ratio = (runs.speedup / runs.predicted_speedup).groupby(runs.batch_size)
    return pd.DataFrame({"runs": ratio.size(), "min": ratio.min(), "median": ratio.median(),
                         "max": ratio.max()}).reset_index()


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
    rows["baseline_stalled"] = stalled(rows) | captured(rows, "baseline_graph_captures")
    text = [f"# Issue 6 runs: {rows.device.iloc[0]}, torch {rows.torch_version.iloc[0]}, "
            f"transformers {rows.transformers_version.iloc[0]}, git {rows.git_sha.iloc[0]}, "
            f"{rows.timestamp.min()} .. {rows.timestamp.max()}\n"]
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    for title, table in (("c. synthetic control", synthetic_table(rows)), ("d. real weights", real_table(rows)),
                         ("e. cost model: measured / predicted speedup by batch size", fit_table(rows)),
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
        figures.cost_model_figure(rows[~rows.baseline_stalled & ~captured(rows)]).savefig(out / "cost_model.png", dpi=130)
    except figures.NoData as e:
        print(f"cost model figure skipped: {e}")
    synthetic = synthetic_table(rows)
    if not synthetic.empty:
        synthetic_figure(synthetic).savefig(out / "synthetic_control.png", dpi=130)
    return 0


def synthetic_figure(table: pd.DataFrame):
    """Measured speedup against the formula with each run's own measured c: y = x, +-10 %."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 4.6), layout="constrained")
    ax = fig.subplots()
    top = 1.1 * max(table.measured.max(), table.formula.max())
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="0.9", label="+-10 %")
    ax.plot([0, top], [0, top], color="k", lw=1, label="y = x")
    for a, runs in table.groupby("a"):
        ax.scatter(runs.formula, runs.measured, label=f"a = {a:g}", s=22)
        for _, r in runs.iterrows():
            ax.annotate(f"{int(r.k)}", (r.formula, r.measured), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set(xlabel="formula (1 - a^(k+1)) / ((1 - a)(k c + 1)), c measured per run", ylabel="measured speedup",
           title="Synthetic control, k = 1..8 (labels)", xlim=(0, top), ylim=(0, top))
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None))
