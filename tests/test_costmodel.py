"""The speculative-decoding cost model (specbench.analysis) and its figure: hand-computed values,
cost_model over a small frame (with rows lacking costs), and the figure rendered headless."""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from specbench import figures
from specbench.analysis import (
    cost_model, expected_tokens, expected_tokens_from_positions, iid_rate_from_acceptance, predicted_speedup,
    synthetic_rate, verify_ratio,
)

matplotlib.use("Agg")


def test_expected_tokens_by_hand():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens(1.0, 4) == 5.0 and expected_tokens(1, 1) == 2.0  # exact at a = 1
    assert expected_tokens(0.0, 3) == 1.0 and expected_tokens(0.3, 0) == 1.0
    assert expected_tokens(1 - 1e-12, 3) == pytest.approx(4.0, abs=1e-9)  # no cancellation near 1
    out = expected_tokens(np.array([0.5, 1.0, np.nan]), np.array([2, 3, 2]))
    np.testing.assert_allclose(out, [1.75, 4.0, np.nan])


def test_expected_tokens_from_conditional_positions():
    # accept_pos is conditional (metrics.SpecStats.accept_pos): tau = 1 + a1 + a1 a2 + ...
    assert expected_tokens_from_positions([0.5, 0.5]) == pytest.approx(1.75)
    assert expected_tokens_from_positions([0.9, 0.5]) == pytest.approx(2.35)  # unconditional would be 2.4
    assert expected_tokens_from_positions([1.0, 1.0, 1.0]) == 4.0
    assert expected_tokens_from_positions([0.0, None]) == 1.0  # never reached behind a rejection
    assert math.isnan(expected_tokens_from_positions([0.5, None]))  # reachable but unrecorded
    np.testing.assert_allclose(expected_tokens_from_positions(pd.Series([[0.5, 0.5], None, [1, 1]])),
                               [1.75, np.nan, 3.0])
    # constant conditional rate a: the same as the i.i.d. formula
    assert expected_tokens_from_positions([0.7] * 5) == pytest.approx(expected_tokens(0.7, 5))


def test_predicted_speedup_by_hand():
    assert predicted_speedup(1.75, 2, 0.1) == pytest.approx(1.75 / 1.2)
    assert predicted_speedup(1.75, 2, 0.1, 1.1) == pytest.approx(1.75 / 1.3)
    # textbook: (1 - a^(k+1)) / ((1 - a)(k c + 1)), a = 0.8, k = 4, c = 0.05
    assert predicted_speedup(expected_tokens(0.8, 4), 4, 0.05) == pytest.approx(3.3616 / 1.2)
    np.testing.assert_allclose(predicted_speedup([2.0, 3.0], [1, 2], 0.5, [1.0, 1.0]), [2 / 1.5, 1.5])


def _row(**values) -> dict:
    return {"task": "decode", "status": "ok", "rule": "standard", "batch_size": 1, "dataset": "mt_bench", **values}


def test_cost_model_on_a_small_frame():
    frame = pd.DataFrame([
        _row(drafter="ngram", k=2, tokens_per_round=1.75, draft_ms=2.0, verify_ms=11.0, baseline_tpot_ms=10.0,
             speedup=1.3, tpot_ms=7.0),
        _row(drafter="ngram", k=2, tokens_per_round=1.75, draft_ms=None, verify_ms=None, baseline_tpot_ms=None,
             speedup=1.2, tpot_ms=8.0),  # an older run: no costs
        _row(drafter=None, k=None, tokens_per_round=1.0, draft_ms=None, verify_ms=None, baseline_tpot_ms=None,
             speedup=1.0, tpot_ms=10.0),  # the baseline
        _row(drafter="eagle", k=2, topk=2, tokens_per_round=2.0, draft_ms=4.0, verify_ms=12.0,
             baseline_tpot_ms=None, speedup=1.25, tpot_ms=8.0),  # a tree; t1 = speedup * tpot = 10
    ])
    out = cost_model(frame)
    np.testing.assert_allclose(out.c_measured, [0.1, np.nan, np.nan, 0.2])
    np.testing.assert_allclose(out.r_measured, [1.1, np.nan, np.nan, 1.2])
    np.testing.assert_allclose(out.predicted_speedup, [1.75 / 1.3, np.nan, np.nan, 2.0 / 1.6])
    assert "r_curve" not in out and "c_measured" not in frame  # a copy

    # r from a verify-cost curve at q = k + 1 (chain) and q = k * topk + 1 = 5 (tree)
    curved = cost_model(frame, verify_curve={1: 1.0, 3: 1.2, 5: 1.4})
    np.testing.assert_allclose(curved.r_curve, [1.2, 1.2, np.nan, 1.4])
    np.testing.assert_allclose(curved.predicted_speedup, [1.75 / 1.4, np.nan, np.nan, 2.0 / 1.8])

    # the rules' and bookkeeping's time per round, in decode steps, joins the verify's
    busy = cost_model(frame.assign(other_ms=[3.0, None, None, 2.0]))
    np.testing.assert_allclose(busy.o_measured, [0.3, 0.0, np.nan, 0.2])  # a missing other_ms counts as 0

    # prefills per round lengthen the round, but only in batches: a batch-1 TPOT holds none
    stalled = cost_model(frame.assign(prefill_ms=[10.0, None, None, 20.0], batch_size=[8, 8, 8, 1]))
    np.testing.assert_allclose(stalled.p_measured, [1.0, 0.0, np.nan, 0.0])
    np.testing.assert_allclose(stalled.predicted_speedup, [1.75 / 2.3, np.nan, np.nan, 2.0 / 1.6])
    assert predicted_speedup(1.75, 2, 0.1, 1.0, 1.0) == pytest.approx(1.75 / 2.2)
    # what a request waits for (prefill_wait_ms) wins over all of the run's prefills per round
    waited = cost_model(frame.assign(prefill_ms=[10.0, 10.0, None, 20.0], prefill_wait_ms=[4.0, None, None, 0.0],
                                     batch_size=[8, 8, 8, 1]))
    np.testing.assert_allclose(waited.p_measured, [0.4, 10.0 / 9.6, np.nan, 0.0])  # row 1: t1 = 1.2 x 8
    np.testing.assert_allclose(busy.predicted_speedup, [1.75 / 1.6, np.nan, np.nan, 2.0 / 1.8])
    # a draining batch: a round costs its requests 1.2 x the per-round mean (13 ms, draft + verify)
    drained = cost_model(frame.assign(request_round_ms=[15.6, None, None, None]))
    np.testing.assert_allclose(drained.d_measured, [1.2, 1.0, np.nan, 1.0])  # none recorded: 1
    np.testing.assert_allclose(drained.predicted_speedup, [1.75 / 1.56, np.nan, np.nan, 2.0 / 1.6])
    # the median request's tau, where recorded, in place of the pooled one
    median = cost_model(frame.assign(median_tokens_per_round=[1.5, None, None, None]))
    np.testing.assert_allclose(median.predicted_speedup, [1.5 / 1.3, np.nan, np.nan, 2.0 / 1.6])


def test_cost_model_without_cost_columns_gives_nan():
    frame = pd.DataFrame([_row(drafter="ngram", k=3, tokens_per_round=2.0, speedup=1.4, tpot_ms=5.0)])
    out = cost_model(frame)
    assert out[["c_measured", "r_measured", "predicted_speedup"]].isna().all().all()


def test_verify_ratio_from_times_per_batch_size():
    curve = pd.DataFrame({"batch_size": [1, 1, 1, 4, 4], "q": [1, 2, 4, 1, 4], "t_ms": [10, 10.5, 12, 20, 30]})
    np.testing.assert_allclose(verify_ratio(curve, [3, 4, 4, 2], [1, 1, 4, 8]), [1.125, 1.2, 1.5, np.nan])  # 3: between 1.05 and 1.2
    np.testing.assert_allclose(verify_ratio(pd.Series({1: 1.0, 2: 1.1}), [1, 2, 3]), [1.0, 1.1, np.nan])


def test_synthetic_rate_from_its_columns():
    # acceptance_rate = accepted / drafted = (tau - 1) / k for i.i.d. a: not a itself
    share = (expected_tokens(0.8, 4) - 1) / 4
    assert share == pytest.approx(0.5904)
    assert iid_rate_from_acceptance(share, 4) == pytest.approx(0.8, abs=1e-9)
    frame = pd.DataFrame([
        _row(drafter="synthetic", k=4, acceptance_rate=share, synthetic_rate=None),
        _row(drafter="synthetic", k=4, acceptance_rate=0.1, synthetic_rate=0.7),
        _row(drafter="synthetic", k=2, acceptance_rate=0.1, accept_pos=[0.6, 0.5], accept_reached=[10, 6]),
        _row(drafter="ngram", k=4, acceptance_rate=0.5, synthetic_rate=None),
    ])
    np.testing.assert_allclose(synthetic_rate(frame), [0.8, 0.7, (6 + 3) / 16, np.nan])


def _synthetic_frame(rates=(0.6, 0.7, 0.8, 0.9), ks=(1, 2, 3, 4), c=0.05, t1=10.0) -> pd.DataFrame:
    rows = []
    for i, a in enumerate(rates):
        for k in ks:
            r = 1 + 0.02 * k
            tau = expected_tokens(a, k)
            rows.append(_row(drafter="synthetic", k=k, acceptance_rate=(tau - 1) / k, tokens_per_round=tau,
                             draft_ms=k * c * t1, verify_ms=r * t1, baseline_tpot_ms=t1,
                             speedup=predicted_speedup(tau, k, c, r) * (0.95 if i % 2 else 1.02)))
    return pd.DataFrame(rows)


def _points(fig) -> tuple[int, int]:
    left, right = fig.axes
    scatter = sum(len(c.get_offsets()) for c in left.collections if isinstance(c, PathCollection))
    markers = sum(len(line.get_xdata()) for line in right.lines if line.get_linestyle() == "None")
    return scatter, markers


def _curves(ax) -> list:
    """The drawn lines, legend proxies (no data) left out."""
    return [line for line in ax.lines if line.get_linestyle() == "-" and len(line.get_xdata())]


def test_cost_model_figure_renders(tmp_path):
    others = pd.DataFrame([
        _row(drafter="ngram", k=3, tokens_per_round=2.2, draft_ms=0.3, verify_ms=10.5, baseline_tpot_ms=10.0,
             speedup=1.9, tpot_ms=5.3),
        _row(drafter="eagle", k=3, tokens_per_round=2.8, draft_ms=3.0, verify_ms=11.0, baseline_tpot_ms=10.0,
             speedup=2.0, tpot_ms=5.0),
        _row(drafter="eagle", k=3, tokens_per_round=2.8, speedup=2.0, tpot_ms=5.0),  # no costs: not drawn
        _row(drafter=None, k=None, tokens_per_round=1.0, speedup=1.0, tpot_ms=10.0),  # the baseline
    ])
    synthetic = _synthetic_frame()
    frame = pd.concat([others, synthetic], ignore_index=True)
    fig = figures.cost_model_figure(frame)
    assert _points(fig) == (2 + len(synthetic), 16)
    assert len(_curves(fig.axes[1])) == 4  # one formula curve per a
    written = figures.save(fig, tmp_path / "cost_model.png")
    assert all(p.stat().st_size > 5_000 for p in written)

    curve = {q: 1 + 0.02 * (q - 1) for q in range(1, 6)}
    fig = figures.synthetic_speedup_figure(synthetic, verify_curve=curve)
    (ax,) = fig.axes
    curve_k4 = _curves(ax)[-1].get_ydata()[-1]
    assert curve_k4 == pytest.approx(predicted_speedup(expected_tokens(0.9, 4), 4, 0.05, 1.08))


def test_cost_model_figure_leaves_out_a_panel_without_rows():
    """Real drafters alone (a runner_suite's real part) make one panel, the scatter; synthetic
    rows without their costs (no prediction to scatter) one panel, their speedups against k."""
    real = pd.DataFrame([
        _row(drafter="ngram", k=3, tokens_per_round=2.2, draft_ms=0.3, verify_ms=10.5, baseline_tpot_ms=10.0,
             speedup=1.9, tpot_ms=5.3),
    ])
    (ax,) = figures.cost_model_figure(real).axes
    assert sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)) == 1
    synthetic = _synthetic_frame().drop(columns=["draft_ms", "verify_ms", "baseline_tpot_ms"])
    (ax,) = figures.cost_model_figure(synthetic).axes
    assert sum(len(line.get_xdata()) for line in ax.lines if line.get_linestyle() == "None") == 16
    assert len(figures.cost_model_figure(_synthetic_frame()).axes) == 2  # with costs: both panels


def test_cost_model_figure_without_costs_or_synthetic_rows_is_no_data():
    frame = pd.DataFrame([_row(drafter="ngram", k=3, tokens_per_round=2.0, speedup=1.4, tpot_ms=5.0)])
    with pytest.raises(figures.NoData):
        figures.cost_model_figure(frame)
    with pytest.raises(figures.NoData):
        figures.synthetic_speedup_figure(frame)


def test_runner_report_tables_the_rows_with_their_repeats_spread(tmp_path):
    """experiments/runner_report.py on a runner_suite folder: the real-weight table holds each
    row's measured and predicted speedup and how far its repeats strayed (max / min TPOT, read
    back from the CSV's text of the lists; NaN for a row from before `repeats`), and the fit
    table their ratio by batch size."""
    import subprocess
    import sys
    from pathlib import Path

    base = dict(task="decode", k=4, topk=1, batch_size=48, num_prompts=48, max_new_tokens=48, dataset="mt_bench",
                status="ok", device="gpu", torch_version="t", transformers_version="x", git_sha="s",
                timestamp="2026-12-07T00:00:00+0000", draft_sample_method=None, synthetic_rate=None,
                graph_captures=0, baseline_graph_captures=0, baseline_step_ms=1.7, baseline_tpot_ms=2.0,
                draft_ms=0.4, verify_ms=1.8, other_ms=0.3, request_round_ms=2.5, tokens_per_round=1.2)
    rows = pd.DataFrame([
        {**base, "drafter": "ngram", "temperature": 0.0, "tpot_ms": 2.0, "speedup": 1.0, "median_tokens_per_round": 1.25,
         "tpot_runs_ms": "[2.4, 2.0, 2.0]", "baseline_tpot_runs_ms": "[2.0, 3.0, 1.5]"},
        {**base, "drafter": "ngram", "temperature": 0.7, "tpot_ms": 2.5, "speedup": 0.8, "baseline_step_ms": 1.8,
         "median_tokens_per_round": None, "tpot_runs_ms": None, "baseline_tpot_runs_ms": None},
        {**base, "drafter": "synthetic", "synthetic_rate": 0.8, "batch_size": 1, "temperature": 0.0, "tpot_ms": 1.2,
         "speedup": 1.5, "tokens_per_round": 2.0, "median_tokens_per_round": 2.5, "tpot_runs_ms": "[1.2]"},
    ])
    rows.to_csv(tmp_path / "rows.csv", index=False)
    script = Path(__file__).resolve().parents[1] / "experiments" / "runner_report.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    real = report.split("## d. real weights")[1].split("```")[1].splitlines()
    header, first, second = real[1].split(), real[2].split(), real[3].split()
    at = {name: header.index(name) for name in ("tpot_spread", "baseline_tpot_spread", "predicted_speedup")}
    assert first[at["tpot_spread"]] == "1.200" and first[at["baseline_tpot_spread"]] == "2.000"
    assert second[at["tpot_spread"]] == "NaN" and second[at["baseline_tpot_spread"]] == "NaN"
    # tau 1.25 (the median) in row 1, the pooled 1.2 in row 2 (no median column then): / (4 x 0.05 + 0.9 + 0.15) x 1.0
    assert float(first[at["predicted_speedup"]]) == pytest.approx(1.25 / 1.25, abs=1e-3)
    assert float(second[at["predicted_speedup"]]) == pytest.approx(1.2 / 1.25, abs=1e-3)
    assert "## e. cost model" in report and (tmp_path / "cost_model.png").exists()
    # the control against its formula at its own tau: the median request's 2.5, not the pooled 2.0
    control = report.split("## c. synthetic control")[1].split("```")[1].splitlines()
    header, row = control[1].split(), control[2].split()
    assert float(row[header.index("measured/formula(tau)")]) == pytest.approx(1.5 / (2.5 / 1.2), abs=1e-3)
