"""Distribution checks: does speculative decoding sample what the target samples?

Chi-square tests (scipy.stats underneath) with sparse categories pooled, total-variation distance
with a bootstrap confidence interval, a power calculator, and the Cauchy combination of
p-values over dependent tests (positions of one sequence).

Power. A chi-square test with C categories at level alpha detects an alternative with
non-centrality lambda = n * sum_i (p1_i - p0_i)^2 / p0_i. For a given total-variation distance
TV = sum |p1 - p0| / 2, Cauchy-Schwarz gives sum (d^2 / p0) >= (sum |d|)^2 / sum p0 = 4 TV^2,
so n = lambda* / (4 TV^2) samples detect *every* alternative at distance TV with at least the
power that lambda* gives (the worst case: the shift spread in proportion to p0). Two samples of
n each have half that non-centrality, n * sum d^2 / (2 pbar): they need twice as many each.
The bound holds over the categories the test sees, after sparse ones are pooled: a shift that
stays inside the pooled "other" bin is invisible to it (the write-up's toy pools nothing; real
vocabularies do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import optimize, stats


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    pvalue: float
    dof: int
    categories: int  # after pooling
    samples: int


def _as_counts(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def pool_sparse(expected: np.ndarray, min_expected: float = 5.0) -> np.ndarray:
    """Bin index for each category: categories with expected count >= min_expected keep their own
    bin, the rest share one "other" bin (the last). If "other" is itself below min_expected (or
    expects nothing: categories outside the support, whose observations are then evidence in that
    bin) it is merged into the smallest kept bin. -> [C] int bin ids in 0..bins-1."""
    expected = _as_counts(expected)
    keep = expected >= min_expected
    bins = np.full(expected.shape, -1)
    bins[keep] = np.arange(int(keep.sum()))
    other = expected[~keep].sum()
    if not keep.any():
        return np.zeros_like(bins)
    if other >= min_expected:
        bins[~keep] = int(keep.sum())
    else:
        kept = np.flatnonzero(keep)
        bins[~keep] = bins[kept[np.argmin(expected[kept])]]
    return bins


def _binned(x: np.ndarray, bins: np.ndarray) -> np.ndarray:
    return np.bincount(bins, weights=x, minlength=int(bins.max()) + 1)


def chisquare_gof(counts, probs, min_expected: float = 5.0) -> ChiSquare:
    """Goodness of fit of observed counts [C] to a known distribution probs [C]."""
    counts, probs = _as_counts(counts), _as_counts(probs)
    n = counts.sum()
    expected = probs / probs.sum() * n
    bins = pool_sparse(expected, min_expected)
    observed, expected = _binned(counts, bins), _binned(expected, bins)
    if len(observed) < 2:
        return ChiSquare(0.0, 1.0, 0, len(observed), int(n))
    # Mass outside the support of probs cannot be expected: it is evidence, not an error.
    statistic, pvalue = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    return ChiSquare(float(statistic), float(pvalue), len(observed) - 1, len(observed), int(n))


def chisquare_homogeneity(counts_a, counts_b, min_expected: float = 5.0) -> ChiSquare:
    """Two-sample test that counts_a [C] and counts_b [C] come from one distribution."""
    a, b = _as_counts(counts_a), _as_counts(counts_b)
    na, nb = a.sum(), b.sum()
    pooled = (a + b) / (na + nb)
    # A category is kept when both samples expect at least min_expected of it.
    bins = pool_sparse(pooled * min(na, nb), min_expected)
    table = np.stack([_binned(a, bins), _binned(b, bins)])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return ChiSquare(0.0, 1.0, 0, table.shape[1], int(na + nb))
    result = stats.chi2_contingency(table, correction=False)
    return ChiSquare(float(result.statistic), float(result.pvalue), int(result.dof), table.shape[1], int(na + nb))


def tv_distance(p, q) -> float:
    p, q = _as_counts(p), _as_counts(q)
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


@dataclass(frozen=True)
class TV:
    """Plug-in TV and a confidence interval for the true TV.

    The plug-in estimate is biased upwards: even two samples of one distribution differ, by
    about sqrt(C / (2 pi n)) for C equally likely categories. The interval is the basic
    (reverse-percentile) bootstrap, which corrects that bias only in part. At a true TV of 0 (a
    lossless rule) TV sits on its boundary, where the bootstrap is not valid: under the exact
    null the 95 % interval excludes 0 far more often than 5 % of the time, the more so the more
    categories (the rules' Markov check has 64). Decide losslessness with the chi-square test;
    read the interval as the size of a shift the test found."""

    value: float
    low: float
    high: float


def tv_with_ci(counts, reference, *, two_sample: bool = False, level: float = 0.95,
               resamples: int = 1000, seed: int = 0) -> TV:
    """TV between observed counts [C] and a reference: a known distribution [C], or a second
    sample's counts when two_sample. Basic bootstrap (multinomial resampling; see TV)."""
    counts, reference = _as_counts(counts), _as_counts(reference)
    rng = np.random.default_rng(seed)
    n = int(counts.sum())
    p_hat = counts / n
    boot = rng.multinomial(n, p_hat, size=resamples) / n  # [R, C]
    if two_sample:
        m = int(reference.sum())
        ref = rng.multinomial(m, reference / m, size=resamples) / m
    else:
        ref = reference / reference.sum()
    values = 0.5 * np.abs(boot - ref).sum(-1)
    tail = (1 - level) / 2
    value = tv_distance(counts, reference)
    low = 2 * value - float(np.quantile(values, 1 - tail))
    high = 2 * value - float(np.quantile(values, tail))
    return TV(value, float(np.clip(low, 0, 1)), float(np.clip(high, 0, 1)))


def power(samples: int, tv: float, alpha: float, categories: int, *, two_sample: bool = False) -> float:
    """Worst-case power of the chi-square test with `samples` draws (per sample when
    two_sample) against any alternative at total-variation distance tv."""
    dof = categories - 1
    noncentrality = (2 if two_sample else 4) * samples * tv**2
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, dof), dof, noncentrality))


def samples_for_power(tv: float, alpha: float = 1e-3, power_target: float = 0.99, categories: int = 6,
                      *, two_sample: bool = False) -> int:
    """Draws (per sample when two_sample) that detect any shift of total variation >= tv at
    level alpha with probability >= power_target, whatever its direction (see module doc)."""
    dof = categories - 1
    critical = stats.chi2.isf(alpha, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, dof, x) - power_target, 1e-9, 1e7)
    return math.ceil(lam / ((2 if two_sample else 4) * tv**2))


def cauchy_combination(pvalues, weights: Optional[np.ndarray] = None) -> float:
    """Combine p-values of dependent tests (Liu & Xie 2020, "Cauchy combination test").

    T = sum w_i tan((1/2 - p_i) pi) is standard Cauchy under the null when the tests are
    independent, and also when they are identical; for small levels its tail stays close to
    Cauchy under dependence (shown for bivariate-normal test statistics). Token positions of one
    sequence are dependent, so this is the method used to combine positions (Fisher's would be
    anti-conservative there). A p-value of 1 adds -inf: leave out tests with nothing to test
    (`ChiSquare.dof` 0, whose p-value is 1 by convention), or one of them outweighs every other."""
    p = np.clip(_as_counts(pvalues), 1e-300, 1.0)
    w = np.full(p.shape, 1.0 / len(p)) if weights is None else _as_counts(weights) / np.sum(weights)
    # tan((1/2 - p) pi) = 1 / tan(p pi); for tiny p use 1 / (p pi) to keep precision.
    terms = np.where(p < 1e-15, 1.0 / (p * np.pi), 1.0 / np.tan(p * np.pi))
    t = float(np.sum(w * terms))
    if t > 1e15:
        return min(1.0, 1.0 / (t * np.pi))
    return float(stats.cauchy.sf(t))
