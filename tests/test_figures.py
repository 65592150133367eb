"""specbench.figures over the committed fixture results (tests/fixtures/results, made by real runs:
see tests/fixtures/make_results.py), always copied into tmp_path first: figures are written
into RESULTS_DIR/figures and the fixture must stay as committed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specbench import figures, rulecheck
from specbench.analysis import load_results
from specbench.results import read_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "results"
DECODE_FIGURES = ("acceptance_vs_k", "tokens_per_round", "tpot_speedup", "accept_pos", "decode_distcheck")


@pytest.fixture
def results(tmp_path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    return out


def _toy_rows(results: Path) -> tuple[Path, list]:
    for path in results.glob("runs/*/rows.jsonl"):
        rows = read_jsonl(path)
        if rows[0]["task"] == "toy_rules":
            return path, rows
    raise AssertionError("the fixture has no toy_rules run")


def _add_real_rules(results: Path) -> list:
    """The fixture has no real rule check (that needs the real model). The toy rows stand in as
    two positions of one; at the second every p-value is a tenth: the worst position per rule."""
    _, toy = _toy_rows(results)
    rows = [
        {**r, "task": "real_rules", "drafter": "layerskip1", "target": "tiny", "position": position,
         "chi2_pvalue": r["chi2_pvalue"] * scale, "run_id": f"real-{position}-{i}"}
        for position, scale in ((3, 1.0), (9, 0.1)) for i, r in enumerate(toy)
    ]
    run = results / "runs" / "real"
    run.mkdir()
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_every_figure_is_written_as_png_and_pdf(results, capsys):
    _add_real_rules(results)
    assert figures.main([str(results)]) == 0
    printed = capsys.readouterr().out
    for name in figures.FIGURES:
        png, pdf = results / "figures" / f"{name}.png", results / "figures" / f"{name}.pdf"
        assert png.stat().st_size > 10_000 and pdf.stat().st_size > 5_000, name
        assert str(png) in printed and str(pdf) in printed
    assert "skipped" not in printed


def test_rule_checks_only_skips_the_decode_figures(tmp_path, capsys):
    toy, _ = _toy_rows(FIXTURE)
    shutil.copytree(toy.parent, tmp_path / "runs" / toy.parent.name)
    assert figures.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    for name in DECODE_FIGURES + ("real_rules",):
        assert sum(line.startswith(f"skipped {name}: ") for line in printed) == 1, name
        assert not (tmp_path / "figures" / f"{name}.png").exists()
    assert (tmp_path / "figures" / "toy_rules.png").stat().st_size > 10_000
    assert (tmp_path / "figures" / "toy_rules.pdf").exists()


def test_a_baseline_alone_skips_every_figure(tmp_path, capsys):
    # Its rows lack the columns that only distcheck and the rule checks write: skipped, not KeyError.
    baseline = next(p for p in FIXTURE.glob("runs/*/rows.jsonl") if read_jsonl(p)[0]["drafter"] is None)
    shutil.copytree(baseline.parent, tmp_path / "runs" / baseline.parent.name)
    assert figures.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [line for line in printed if line.startswith("skipped ")] + ["wrote no figures"]
    assert len(printed) == len(figures.FIGURES) + 1


def test_missing_results_dir_is_one_line_and_exit_status_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specbench.figures", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: no results directory at {tmp_path / 'nope'}"]
    assert not (tmp_path / "nope").exists()


def test_tokens_per_round_draws_the_formula_at_the_pooled_acceptance():
    # ngram / onehot at k = 2 and 4 (the same drafts at temperature 0): accept_pos [8/19, 5/8],
    # reached [19, 8] -> a = 13 / 27, and (1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k.
    fig = figures.tokens_per_round(figures.load_rows(FIXTURE))
    formula = [line for line in fig.axes[0].lines if line.get_linestyle() == "--" and len(line.get_xdata())]
    a = 13 / 27
    np.testing.assert_allclose(formula[0].get_xdata(), [2, 4])
    np.testing.assert_allclose(formula[0].get_ydata(), [1 + a + a**2, 1 + a + a**2 + a**3 + a**4], rtol=1e-5)


def test_acceptance_lines_hold_the_rows_values():
    fig = figures.acceptance_vs_k(figures.load_rows(FIXTURE))
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    assert set(lines) == {"ngram / onehot, T=0", "ngram / standard, T=0", "ngram / thresholded, T=0.8"}
    np.testing.assert_allclose(lines["ngram / standard, T=0"].get_ydata(), [13 / 38, 13 / 54])


def test_real_rules_draws_the_worst_position_per_rule(results):
    """Per rule the smaller of its two positions' p-values, Šidák-corrected for 2: 1 - (1 - p)^2."""
    rows = _add_real_rules(results)
    fig = figures.real_rules(figures.load_rows(results))
    worst = [r["chi2_pvalue"] for r in rows if r["position"] == 9]
    bars = [patch.get_width() for patch in fig.axes[0].patches]
    np.testing.assert_allclose(bars, [-np.log10(max(1 - (1 - p) ** 2, 1e-300)) for p in worst], rtol=1e-6)
    assert "worst of 2 positions" in fig.texts[0].get_text() and "Šidák" in fig.texts[0].get_text()


def test_sidak_corrects_the_smallest_of_n_p_values():
    """rulecheck.sidak: exact where (1 - p)^n is, n p where p is below fp64's resolution of 1 - p;
    worst_positions keeps each rule's smallest beside the corrected value and counts positions."""
    assert rulecheck.sidak(0.05, 1) == pytest.approx(0.05)
    assert rulecheck.sidak(0.01, 8) == pytest.approx(1 - 0.99**8)
    assert rulecheck.sidak(1e-20, 8) == pytest.approx(8e-20, rel=1e-9, abs=0) and rulecheck.sidak(1.0, 8) == 1.0
    assert np.isnan(rulecheck.sidak(float("nan"), 8))
    rows = [{"rule_label": label, "chi2_pvalue": p} for label, p in
            (("a", 0.3), ("b", 0.02), ("a", 0.01), ("b", 0.5), ("a", 0.9))]
    worst = {r["rule_label"]: r for r in rulecheck.worst_positions(rows)}
    assert (worst["a"]["positions"], worst["a"]["chi2_pvalue_min"]) == (3, 0.01)
    assert worst["a"]["chi2_pvalue"] == pytest.approx(1 - 0.99**3)
    assert (worst["b"]["positions"], worst["b"]["chi2_pvalue"]) == (2, pytest.approx(1 - 0.98**2))


def test_load_rows_reads_a_committed_rows_csv(tmp_path):
    """Committed results folders keep rows.csv, where lists are written as their repr."""
    frame = load_results(FIXTURE, ok_only=True)
    frame.to_csv(tmp_path / "rows.csv", index=False)
    back = figures.load_rows(tmp_path)
    assert list(back.accept_pos) == list(frame.accept_pos)  # e.g. [0.42, 0.625, None, None]
    assert len(back) == len(frame)
