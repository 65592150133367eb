"""Figures from results rows: one function per figure, rows -> matplotlib Figure, all named in
FIGURES; `write_figures` saves each as PNG and PDF. Axes are labelled with their units.

    python -m specbench.figures RESULTS_DIR        # every figure into RESULTS_DIR/figures

A figure whose rows are not in the results raises NoData, and `draw` / `write_figures` turn
that into a one-line "skipped" message. Figures are built on matplotlib.figure.Figure, not
pyplot: no global figure state, nothing to close, no backend needed to save, and a notebook
shows the returned Figure inline.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specbench import analysis, rulecheck

# A line is one drafter x rule; each of these splits it further only where it takes several
# values among the runs drawn (two temperatures: two lines; one: no clutter in the legend).
SERIES = ("drafter", "rule")
SPLIT_BY = ("target", "dataset", "temperature", "dtype", "batch_size")
SHORT_NAMES = {"temperature": "T"}
# rows.csv of a committed results folder stores these as their Python repr.
LIST_COLUMNS = ("accept_pos", "accept_reached", "first_divergence", "distcheck_pvalues")
K_STYLES = ("-", "--", ":", "-.")  # accept_pos: colour = drafter x rule, line style = k
ALPHA = 1e-3  # the p-value line drawn on the distribution checks
RULE_CHECK_COLUMNS = ("rule_label", "chi2_pvalue", "tv", "tv_low", "tv_high", "lossless")


class NoData(Exception):
    """The rows a figure needs are not in these results: skip the figure, do not fail."""


def load_rows(results_dir: str | Path) -> pd.DataFrame:
    """Successful rows of a results directory: runs/*/rows.jsonl as runs write them
    (analysis.load_results), or else the rows.csv of a committed results folder."""
    results_dir = Path(results_dir)
    csv = results_dir / "rows.csv"
    if any(results_dir.glob("runs/*/rows.jsonl")) or not csv.exists():
        return analysis.load_results(results_dir, ok_only=True)
    frame = pd.read_csv(csv)
    for column in LIST_COLUMNS:
        if column in frame.columns:
            frame[column] = [ast.literal_eval(v) if isinstance(v, str) else None for v in frame[column]]
    return frame[frame.status == "ok"].reset_index(drop=True)


# --- selecting and grouping rows --------------------------------------------------------------


def speculative_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful decode runs with a drafter (the baseline has none)."""
    runs = analysis.decode_runs(frame)
    return runs[runs.drafter.notna() & runs.k.notna()]


def baseline_runs(frame: pd.DataFrame) -> pd.DataFrame:
    runs = analysis.decode_runs(frame)
    return runs[runs.drafter.isna()]


def _require(rows: pd.DataFrame, what: str, needed: Sequence[str] = ()) -> pd.DataFrame:
    """The rows with a value in every `needed` column; NoData if there are none. Columns beyond
    results.COLUMNS (distcheck's, a rule check's) are absent from results that never wrote them."""
    if rows.empty or any(column not in rows.columns for column in needed):
        raise NoData(f"no {what} in these results")
    rows = rows.dropna(subset=list(needed))
    if rows.empty:
        raise NoData(f"no {what} in these results")
    return rows


def series_keys(runs: pd.DataFrame) -> list:
    """drafter, rule, and whichever SPLIT_BY columns vary among `runs`."""
    return list(SERIES) + [c for c in SPLIT_BY if c in runs.columns and runs[c].nunique(dropna=False) > 1]


def series_label(keys: Sequence[str], values: Sequence) -> str:
    """("drafter", "rule", "temperature"), ("ngram", "onehot", 0.8) -> "ngram / onehot, T=0.8"."""
    named = dict(zip(keys, values))
    label = " / ".join(str(named[k]) for k in SERIES if k in named)
    return ", ".join([label] + _split_label(named))


def _split_label(named: dict) -> list:
    return [f"{SHORT_NAMES.get(k, k)}={_fmt(v)}" for k, v in named.items() if k not in SERIES]


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, (float, np.floating)) else str(value).removeprefix("torch.")


def _series(runs: pd.DataFrame, columns: Sequence[str]) -> Iterator[tuple[str, pd.DataFrame]]:
    """Per line: its label and the mean of `columns` over repeated runs, indexed by k."""
    keys = series_keys(runs)
    for values, group in runs.groupby(keys, dropna=False, sort=True):
        means = group[list(columns)].apply(pd.to_numeric, errors="coerce").groupby(group.k).mean()
        yield series_label(keys, values), means


def _unique(rows: pd.DataFrame, column: str):
    """The value `column` takes in every row, None if it varies or is missing."""
    values = rows[column].dropna().unique() if column in rows.columns else []
    return values[0] if len(values) == 1 else None


def _context(rows: pd.DataFrame) -> str:
    """What all the rows share, for a title: target, dataset and prompts, temperature, device."""
    target, dataset, prompts, temperature, device = (
        _unique(rows, c) for c in ("target", "dataset", "num_prompts", "temperature", "device")
    )
    if dataset is not None and prompts is not None:
        dataset = f"{dataset} ({prompts:g} prompt{'' if prompts == 1 else 's'})"
    temperature = None if temperature is None else f"T={temperature:g}"
    return ", ".join(str(part) for part in (target, dataset, temperature, device) if part is not None)


def _k_axis(ax, runs: pd.DataFrame) -> None:
    ax.set_xlabel("k (draft tokens per round)")
    ax.set_xticks(sorted(int(k) for k in runs.k.unique()))
    ax.grid(alpha=0.3)


# --- the figures ------------------------------------------------------------------------------


def acceptance_vs_k(frame: pd.DataFrame) -> Figure:
    """Acceptance rate (accepted / drafted) against k, one line per drafter x rule."""
    runs = _require(speculative_runs(frame), "speculative decode runs", ["acceptance_rate"])
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, (label, means) in enumerate(_series(runs, ["acceptance_rate"])):
        ax.plot(means.index, means.acceptance_rate, marker="o", color=f"C{i}", label=label)
    _k_axis(ax, runs)
    ax.set_ylabel("acceptance rate (accepted / drafted tokens)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(f"Acceptance rate vs k\n{_context(runs)}", fontsize=10)
    return fig


def tokens_per_round(frame: pd.DataFrame) -> Figure:
    """Measured tokens per round against k, beside (1 - a^(k+1)) / (1 - a) with a the pooled
    per-position acceptance of the same run: the gap shows how far acceptance is from i.i.d."""
    runs = analysis.with_expected_tokens_per_round(frame)
    runs = _require(runs, "speculative decode runs", ["k", "tokens_per_round"])
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    ax.plot([], [], color="k", marker="o", label="measured")
    ax.plot([], [], color="k", ls="--", marker="x", label="(1 - a^(k+1)) / (1 - a), a = pooled acceptance")
    for i, (label, means) in enumerate(_series(runs, ["tokens_per_round", "tokens_per_round_expected"])):
        ax.plot(means.index, means.tokens_per_round, marker="o", color=f"C{i}", label=label)
        ax.plot(means.index, means.tokens_per_round_expected, ls="--", marker="x", color=f"C{i}")
    ax.axhline(1, color="0.5", lw=1, ls=":", label="baseline (1 token per forward)")
    _k_axis(ax, runs)
    ax.set_ylabel("tokens per round (new tokens / target forward)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Tokens per round: measured and expected\n{_context(runs)}", fontsize=10)
    return fig


def tpot_speedup(frame: pd.DataFrame) -> Figure:
    """TPOT and speedup over the matching baseline (the run's own `speedup`) against k."""
    runs = _require(speculative_runs(frame), "speculative decode runs with a TPOT", ["tpot_ms"])
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for i, (label, means) in enumerate(_series(runs, ["tpot_ms", "speedup"])):
        left.plot(means.index, means.tpot_ms, marker="o", color=f"C{i}", label=label)
        right.plot(means.index, means.speedup, marker="o", color=f"C{i}", label=label)
    base = baseline_runs(frame).dropna(subset=["tpot_ms"])
    keys = [c for c in series_keys(runs) if c not in SERIES]  # one baseline per such split
    for j, (values, group) in enumerate(base.groupby(keys, dropna=False) if keys else [((), base)]):
        label = ", ".join(["baseline"] + _split_label(dict(zip(keys, values))))
        left.axhline(group.tpot_ms.median(), color="0.4", lw=1, ls=("--", "-.", ":")[j % 3], label=label)
    right.axhline(1, color="0.5", lw=1, ls=":", label="break-even")
    _k_axis(left, runs)
    _k_axis(right, runs)
    left.set_ylabel("TPOT (ms per output token)")
    left.set_ylim(bottom=0)
    right.set_ylabel("speedup (baseline TPOT / TPOT, x)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"Time per output token and speedup vs k\n{_context(runs)}", fontsize=10)
    return fig


def accept_pos(frame: pd.DataFrame) -> Figure:
    """P(accept draft position i | positions 1..i-1 accepted), one line per drafter x rule x k
    (the mean over repeated runs; a position never reached leaves a gap)."""
    runs = speculative_runs(frame)
    runs = _require(runs[runs.accept_pos.map(lambda v: isinstance(v, (list, tuple)))], "per-position acceptance")
    keys = series_keys(runs)
    colours = {values: f"C{i}" for i, (values, _) in enumerate(runs.groupby(keys, dropna=False, sort=True))}
    ks = sorted(runs.k.unique())
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for values, group in runs.groupby(keys + ["k"], dropna=False, sort=True):
        *series, k = values
        rates = pd.DataFrame([[np.nan if r is None else r for r in p] for p in group.accept_pos], dtype=float)
        mean = rates.mean()  # [k] over runs, NaN where no run reached the position
        ax.plot(np.arange(1, len(mean) + 1), mean, marker="o", color=colours[tuple(series)],
                ls=K_STYLES[ks.index(k) % len(K_STYLES)], label=f"{series_label(keys, series)}, k={int(k)}")
    ax.set_xlabel("draft position i (1 = first drafted token)")
    ax.set_xticks(range(1, int(max(ks)) + 1))
    ax.set_ylabel("P(accept position i | 1..i-1 accepted)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Per-position conditional acceptance\n{_context(runs)}", fontsize=10)
    return fig


def toy_rules(frame: pd.DataFrame) -> Figure:
    """The rule check on the write-up's toy P, Q: p-value and TV per rule (and Markov chain)."""
    rows = _require(_rule_checks(frame, "toy_rules"), "toy rule-check rows (task toy_rules)", RULE_CHECK_COLUMNS)
    return distcheck_plot(rows.to_dict("records"), f"Toy rules: P, Q over 6 tokens{_draws(rows)}")


def real_rules(frame: pd.DataFrame) -> Figure:
    """The rule check on a real target's p and a layer-skip q: per rule, its worst position
    (smallest p-value) over the positions checked, that p-value Šidák-corrected for their count
    (rulecheck.worst_positions)."""
    rows = _require(_rule_checks(frame, "real_rules"), "real rule-check rows (task real_rules)", RULE_CHECK_COLUMNS)
    worst = rulecheck.worst_positions(rows.to_dict("records"))
    positions = max(r["positions"] for r in worst)
    title = (f"Real rules: p vs {_unique(rows, 'drafter')} q, worst of {positions} positions per rule "
             f"(p-value Šidák-corrected)\n{_context(rows)}")
    return distcheck_plot(worst, title)


def decode_distcheck(frame: pd.DataFrame) -> Figure:
    """End-to-end check of decode runs: speculative samples against baseline samples, the
    combined chi-square p-value and the mean TV beside its noise floor (baseline vs baseline)."""
    runs = _require(analysis.decode_runs(frame), "decode runs with distcheck", ["chi2_pvalue", "tv", "tv_null"])
    keys = series_keys(runs)
    labels = [f"{series_label(keys, [r[k] for k in keys])}, k={r['k']:g}" for _, r in runs.iterrows()]
    y = np.arange(len(runs))
    fig = Figure(figsize=(11, 0.45 * len(runs) + 2.0), layout="constrained")
    a, b = fig.subplots(1, 2, sharey=True)
    _pvalue_panel(a, labels, runs.chi2_pvalue, ["tab:gray"] * len(runs))
    a.set_xlabel("-log10 combined chi-square p-value (Cauchy over positions)")
    b.barh(y, runs.tv, color="tab:gray", label="speculative vs baseline")
    b.scatter(runs.tv_null, y, marker="|", s=300, color="k", zorder=3, label="baseline vs baseline (noise floor)")
    b.set_xlabel("mean total-variation distance per position")
    b.legend(fontsize=8, loc="lower right")
    samples = _unique(runs, "distcheck_samples")
    n = "" if samples is None else f", {samples:,.0f} samples"
    fig.suptitle(f"End-to-end distribution check{n}\n{_context(runs)}", fontsize=10)
    return fig


def _rule_checks(frame: pd.DataFrame, task: str) -> pd.DataFrame:
    return frame[(frame.task == task) & (frame.status == "ok")]


def _draws(rows: pd.DataFrame) -> str:
    draws, seed = _unique(rows, "distcheck_samples"), _unique(rows, "seed")
    return (f", {draws:,.0f} draws" if draws is not None else "") + (f", seed {seed}" if seed is not None else "")


def _pvalue_panel(ax, labels: Sequence[str], pvalues, colors: Sequence[str]) -> None:
    """Horizontal bars of -log10 p (p = 0 drawn at 300) with the ALPHA line."""
    y = np.arange(len(labels))
    logp = [-np.log10(max(float(p), 1e-300)) for p in pvalues]
    ax.barh(y, logp, color=colors)
    ax.axvline(-np.log10(ALPHA), color="k", ls="--", lw=1, label=f"p = {ALPHA:g}")
    ax.set_xscale("symlog", linthresh=10)  # linear up to p = 1e-10, then by decades down to 1e-300
    ax.set_xlim(0, max(10, 1.1 * max(logp)))
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)


def distcheck_plot(rows: list, title: str) -> Figure:
    """Per rule: -log10 p-value of the chi-square test against the target, and TV with its
    confidence interval. Lossless rules should sit below the alpha line and near TV 0."""
    tv = np.array([r["tv"] for r in rows], dtype=float)
    low = np.array([r["tv_low"] for r in rows], dtype=float)
    high = np.array([r["tv_high"] for r in rows], dtype=float)
    err = np.stack([tv - low, high - tv]).clip(min=0)  # [2, rules]: the plug-in TV can sit outside its CI
    colors = ["tab:blue" if r["lossless"] else "tab:red" for r in rows]
    fig = Figure(figsize=(11, 0.45 * len(rows) + 1.6), layout="constrained")
    a, b = fig.subplots(1, 2, sharey=True)
    _pvalue_panel(a, [r["rule_label"] for r in rows], [r["chi2_pvalue"] for r in rows], colors)
    a.set_xlabel("-log10 chi-square p-value (higher = distribution changed)")
    b.barh(np.arange(len(rows)), tv, xerr=err, color=colors, capsize=3)
    b.set_xlabel("total-variation distance to the target (95% CI)")
    fig.suptitle(title + "  (blue: lossless in theory, red: lossy or wrong)", fontsize=10)
    return fig


def distcheck_figure(rows: list, path: Path, title: str) -> Path:
    """distcheck_plot saved to `path` (PNG) and beside it as PDF, for the rule-check tasks."""
    path = Path(path)
    save(distcheck_plot(rows, title), path)
    return path


# --- the cost model (analysis.cost_model) -----------------------------------------------------
# Not in FIGURES: it needs the runner's draft_ms / verify_ms / baseline_tpot_ms columns, which
# older results lack. Call it directly: save(cost_model_figure(rows), path).

SYNTHETIC_RATES = (0.6, 0.7, 0.8, 0.9)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def measured_speedup(frame: pd.DataFrame) -> pd.Series:
    """The run's `speedup` (baseline TPOT / TPOT), else baseline_tpot_ms / tpot_ms."""
    fallback = analysis._numeric(frame, "baseline_tpot_ms") / analysis._numeric(frame, "tpot_ms")
    return analysis._numeric(frame, "speedup").fillna(fallback)


def cost_model_figure(frame: pd.DataFrame, verify_curve=None, rates: Sequence[float] = SYNTHETIC_RATES,
                      c: float | None = None) -> Figure:
    """Left: measured speedup against analysis.cost_model's prediction tau / (k c + r + o + p), one
    point per speculative run (colour and marker per drafter), with y = x and a +-10 % band.
    Right: the synthetic control's measured speedup against k at a in `rates`, beside the
    formula (see synthetic_speedup_panel). A panel without rows is left out (a sweep of real
    drafters alone is one panel); NoData where neither has rows."""
    runs = analysis.cost_model(speculative_runs(frame), verify_curve)
    panels = []
    if not _scatter_rows(runs).empty:
        panels.append(lambda ax: cost_scatter_panel(ax, runs))
    if not _synthetic_rows(runs, rates).empty:
        panels.append(lambda ax: synthetic_speedup_panel(ax, runs, verify_curve, rates, c))
    if not panels:
        raise NoData("no speculative decode runs with draft_ms / verify_ms / baseline_tpot_ms or synthetic runs")
    fig = Figure(figsize=(5.5 * len(panels), 4.6), layout="constrained")
    for ax, draw in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        draw(ax)
    fig.suptitle(f"Cost model: speedup = tau / (k c + r + o + p)\n{_context(runs)}", fontsize=10)
    return fig


def synthetic_speedup_figure(frame: pd.DataFrame, verify_curve=None, rates: Sequence[float] = SYNTHETIC_RATES,
                             c: float | None = None) -> Figure:
    """The right panel of cost_model_figure alone; NoData without synthetic-control runs."""
    runs = analysis.cost_model(speculative_runs(frame), verify_curve)
    fig = Figure(figsize=(6.4, 4.6), layout="constrained")
    ax = fig.subplots()
    if not synthetic_speedup_panel(ax, runs, verify_curve, rates, c):
        raise NoData(f"no synthetic-control runs at a in {list(rates)}")
    fig.suptitle(_context(runs), fontsize=10)
    return fig


def cost_scatter_panel(ax, runs: pd.DataFrame) -> int:
    """Measured vs predicted speedup for rows of analysis.cost_model -> the points drawn."""
    runs = _scatter_rows(runs)
    if runs.empty:
        _empty(ax, "no runs with draft_ms, verify_ms and a baseline TPOT")
        return 0
    for i, (drafter, group) in enumerate(runs.groupby("drafter", sort=True)):
        ax.scatter(group.predicted_speedup, group.measured, color=f"C{i}", marker=MARKERS[i % len(MARKERS)],
                   label=drafter, zorder=3)
    values = np.concatenate([runs.predicted_speedup, runs.measured])
    low, high = 0.9 * min(values.min(), 1.0), 1.1 * values.max()
    line = np.linspace(low, high, 2)
    ax.plot(line, line, color="k", lw=1, label="y = x")
    ax.fill_between(line, 0.9 * line, 1.1 * line, color="0.5", alpha=0.2, lw=0, label="±10 %")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("predicted speedup, tau / (k c + r + o + p) (x)")
    ax.set_ylabel("measured speedup (baseline TPOT / TPOT, x)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Predicted vs measured, one point per run", fontsize=10)
    return len(runs)


def synthetic_speedup_panel(ax, runs: pd.DataFrame, verify_curve=None, rates: Sequence[float] = SYNTHETIC_RATES,
                            c: float | None = None) -> int:
    """The synthetic control (drafter "synthetic") at each a in `rates`: measured speedup
    against k (mean over repeated runs: one marker per a x k), and the formula
    (1 - a^(k+1)) / ((1 - a) (k c + r(k+1))) as a line. a is analysis.synthetic_rate, matched
    to the nearest of `rates` within 0.025. c: the argument, else the median c_measured of these
    runs; r: verify_curve at k + 1, else the median r_measured per k (linear between ks), else 1.
    No curves where c is unknown. -> the points drawn."""
    rows = _synthetic_rows(runs, rates)
    grid = np.asarray(rates, dtype=float)
    if rows.empty:
        _empty(ax, f"no synthetic-control runs at a in {', '.join(f'{a:g}' for a in rates)}")
        return 0
    ks = np.arange(1, int(rows.k.max()) + 1)
    c = float(np.nanmedian(rows.c_measured)) if c is None and rows.c_measured.notna().any() else c
    r, r_label = _r_of_k(rows, ks, verify_curve)
    ax.plot([], [], ls="none", marker="o", color="k", label="measured (mean over runs)")
    if c is not None:
        ax.plot([], [], color="k", lw=1.2, label="formula")
    points = 0
    for i, a in enumerate(grid):
        group = rows[rows.a_nominal == a]
        colour = f"C{i}"
        if not group.empty:
            means = group.groupby("k").measured.mean()
            ax.plot(means.index, means, ls="none", marker="o", color=colour)
            points += len(means)
        if c is not None:
            ax.plot(ks, analysis.predicted_speedup(analysis.expected_tokens(a, ks), ks, c, r), color=colour,
                    lw=1.2, alpha=0.8)
        ax.plot([], [], ls="-" if c is not None else "none", marker="o", color=colour, label=f"a = {a:g}")
    ax.axhline(1, color="0.5", lw=1, ls=":", label="break-even")
    _k_axis(ax, rows)
    ax.set_ylabel("speedup (baseline TPOT / TPOT, x)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    model = "no formula: c unknown" if c is None else f"formula: c = {c:.3g}, {r_label}"
    ax.set_title(f"Synthetic control: speedup vs k\n{model}", fontsize=10)
    return points


def _scatter_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of analysis.cost_model with a finite prediction and measured speedup (`measured`)."""
    runs = runs.assign(measured=measured_speedup(runs))
    return runs[np.isfinite(runs.predicted_speedup) & np.isfinite(runs.measured)]


def _synthetic_rows(runs: pd.DataFrame, rates: Sequence[float]) -> pd.DataFrame:
    """The synthetic control's rows whose rate a is within 0.025 of one of `rates` (`a_nominal`),
    with a finite measured speedup (`measured`)."""
    rows = runs[runs.drafter == "synthetic"] if "drafter" in runs.columns else runs.iloc[:0]
    rows = rows.assign(a=analysis.synthetic_rate(rows), measured=measured_speedup(rows))
    grid = np.asarray(rates, dtype=float)
    nearest = grid[np.abs(rows.a.to_numpy()[:, None] - grid[None, :]).argmin(axis=1)] if len(rows) else []
    rows = rows.assign(a_nominal=nearest)
    return rows[(np.abs(rows.a - rows.a_nominal) <= 0.025) & np.isfinite(rows.measured)]


def _r_of_k(rows: pd.DataFrame, ks: np.ndarray, verify_curve) -> tuple[np.ndarray, str]:
    """r(k+1) for the formula curves, and how it was obtained."""
    if verify_curve is not None:
        batch = _unique(rows, "batch_size")
        r = analysis.verify_ratio(verify_curve, ks + 1, batch)
        return r, "r(k+1) from the verify-cost curve"
    measured = rows.dropna(subset=["r_measured"]).groupby("k").r_measured.median()
    if not measured.empty:
        return np.interp(ks, measured.index.to_numpy(float), measured.to_numpy(float)), "r = median r_measured per k"
    return np.ones(len(ks)), "r = 1"


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
    ax.set_axis_off()


FIGURES: dict[str, Callable[[pd.DataFrame], Figure]] = {
    "acceptance_vs_k": acceptance_vs_k,
    "tokens_per_round": tokens_per_round,
    "tpot_speedup": tpot_speedup,
    "accept_pos": accept_pos,
    "toy_rules": toy_rules,  # the same file names the rule-check tasks write
    "real_rules": real_rules,
    "decode_distcheck": decode_distcheck,
}


# --- drawing and saving -----------------------------------------------------------------------


def draw(name: str, frame: pd.DataFrame) -> Figure | None:
    """FIGURES[name] over `frame`, or None with a one-line message when its rows are missing."""
    try:
        return FIGURES[name](frame)
    except NoData as missing:
        print(f"skipped {name}: {missing}")
        return None


def save(fig: Figure, path: Path) -> list:
    """`path` as PNG and the same name as PDF -> both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    return [path, path.with_suffix(".pdf")]


def write_figures(frame: pd.DataFrame, out_dir: str | Path, names: Sequence[str] | None = None) -> list:
    """Every figure (or those named) whose rows are in `frame`, into out_dir -> files written."""
    written = []
    for name in names or FIGURES:
        fig = draw(name, frame)
        if fig is not None:
            written += save(fig, Path(out_dir) / f"{name}.png")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specbench.figures",
        description="Regenerate every figure of a results directory into RESULTS_DIR/figures, as PNG and PDF.",
    )
    parser.add_argument("results_dir", type=Path, metavar="RESULTS_DIR")
    parser.add_argument("--only", nargs="+", choices=list(FIGURES), metavar="NAME",
                        help=f"draw only these: {', '.join(FIGURES)}")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: no results directory at {args.results_dir}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")  # headless; the figures themselves need no backend to be saved
    written = write_figures(load_rows(args.results_dir), args.results_dir / "figures", args.only)
    print(f"wrote {len(written)} files:" if written else "wrote no figures")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
