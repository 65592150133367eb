"""Figures from results rows. Matplotlib, PNG (and PDF), labelled axes with units."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def distcheck_figure(rows: list, path: Path, title: str) -> Path:
    """Per rule: -log10 p-value of the chi-square test against the target, and TV with its
    confidence interval. Lossless rules should sit below the alpha line and near TV 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["rule_label"] for r in rows]
    logp = [-np.log10(max(r["chi2_pvalue"], 1e-300)) for r in rows]
    tv = np.array([r["tv"] for r in rows])
    err = np.array([[r["tv"] - r["tv_low"] for r in rows], [r["tv_high"] - r["tv"] for r in rows]]).clip(min=0)
    colors = ["tab:blue" if r["lossless"] else "tab:red" for r in rows]
    y = np.arange(len(rows))

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.6), sharey=True)
    a.barh(y, logp, color=colors)
    a.axvline(3, color="k", ls="--", lw=1, label="p = 1e-3")
    a.set_xscale("symlog", linthresh=10)
    a.set_xlabel("-log10 chi-square p-value (higher = distribution changed)")
    a.set_yticks(y, labels)
    a.invert_yaxis()
    a.legend(loc="lower right", fontsize=8)
    b.barh(y, tv, xerr=err, color=colors, capsize=3)
    b.set_xlabel("total-variation distance to the target (95% CI)")
    fig.suptitle(title + "  (blue: lossless in theory, red: lossy or wrong)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path
