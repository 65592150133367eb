"""Results rows -> pandas: loading, pivots, speedup against the matching baseline, and the
expected tokens per round beside the measured value. For notebooks, figures and summaries."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from specbench.results import COLUMNS, read_jsonl

# A speculative run is compared with the baseline run that shares all of these. `sampling` is
# "greedy" at temperature 0 (whatever top_k, top_p and seed), else temperature, top_k, top_p and
# seed: as run.baseline_path keys the cached baseline, code (git_sha) included.
BASELINE_MATCH = ("target", "dataset", "num_prompts", "max_new_tokens", "sampling", "batch_size", "device", "dtype",
                  "engine", "engine_options", "warmup", "repeats", "git_sha")


def load_results(results_dir: str | Path, *, ok_only: bool = False) -> pd.DataFrame:
    """Every row under results_dir/runs/*/rows.jsonl, COLUMNS first (decode runs have one row;
    a rule check has one per rule: filter on `task`).

    Runs still in progress have no rows.jsonl yet and are not listed."""
    rows = [row for p in sorted(Path(results_dir).glob("runs/*/rows.jsonl")) for row in read_jsonl(p)]
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    frame["engine"] = frame["engine"].fillna("hf")  # rows from before the native engine ran on hf
    # rows from before engine_options: their settings unknown, matched to baselines as they were
    # then, by the engine's name alone
    frame["engine_options"] = frame["engine_options"].fillna("")
    extra = [c for c in frame.columns if c not in COLUMNS]
    frame = frame[list(COLUMNS) + extra]
    return frame[frame.status == "ok"].reset_index(drop=True) if ok_only else frame


def decode_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful decode runs only (drops rule checks and failures)."""
    return frame[(frame.task == "decode") & (frame.status == "ok")].copy()


def pivot(frame: pd.DataFrame, values: str = "acceptance_rate", index: Sequence[str] = ("drafter", "rule"),
          columns: str = "k", aggfunc: str = "mean") -> pd.DataFrame:
    """e.g. acceptance by drafter x rule (rows) and k (columns), over successful decode runs."""
    runs = decode_runs(frame).dropna(subset=[values])
    return runs.pivot_table(values=values, index=list(index), columns=columns, aggfunc=aggfunc)


def with_speedup(frame: pd.DataFrame, match: Sequence[str] = BASELINE_MATCH) -> pd.DataFrame:
    """Adds baseline_tpot_ms (the median over matching baseline runs) and speedup_vs_baseline
    = baseline_tpot_ms / tpot_ms, for decode runs; NaN where no baseline matches."""
    runs = decode_runs(frame).drop(columns=["baseline_tpot_ms"], errors="ignore")
    runs["sampling"] = sampling_key(runs)
    keys = [m for m in match if m in runs.columns and runs[m].notna().any()]  # a column no row records tells none apart
    base = runs[runs.drafter.isna()].groupby(keys, dropna=False)["tpot_ms"].median().rename("baseline_tpot_ms")
    out = runs.merge(base.reset_index(), on=keys, how="left")
    out["speedup_vs_baseline"] = out.baseline_tpot_ms / out.tpot_ms
    return out


def sampling_key(runs: pd.DataFrame) -> pd.Series:
    """What of the sampling parameters a run's outputs and timings depend on, one string a run:
    "greedy" at temperature 0, else "temperature top_k top_p seed"."""
    params = [runs[c].astype(str) if c in runs.columns else pd.Series("?", index=runs.index)
              for c in ("temperature", "top_k", "top_p", "seed")]
    sampled = params[0].str.cat(params[1:], sep=" ")
    return sampled.where(runs.temperature != 0, "greedy")


def pooled_acceptance(accept_pos, accept_reached) -> float:
    """a from the measured per-position acceptance: accepted / reached, summed over positions."""
    if not isinstance(accept_pos, (list, tuple)) or not isinstance(accept_reached, (list, tuple)):
        return float("nan")
    reached = np.asarray(accept_reached, dtype=float)
    rates = np.asarray([np.nan if r is None else r for r in accept_pos], dtype=float)
    seen = reached > 0
    return float((rates[seen] * reached[seen]).sum() / reached[seen].sum()) if seen.any() else float("nan")


def with_expected_tokens_per_round(frame: pd.DataFrame) -> pd.DataFrame:
    """Adds a_hat (pooled per-position acceptance) and tokens_per_round_expected beside the
    measured tokens_per_round, for speculative decode runs."""
    runs = decode_runs(frame)
    runs = runs[runs.drafter.notna()].copy()
    runs["a_hat"] = [pooled_acceptance(p, r) for p, r in zip(runs.accept_pos, runs.get("accept_reached", [None] * len(runs)))]
    runs["tokens_per_round_expected"] = expected_tokens(runs.a_hat, runs.k)
    return runs


# --- the cost model ---------------------------------------------------------------------------
#
# One round of chain speculation drafts k tokens and verifies them in one target forward:
#
#     round time   = k * c * t1  +  r(q) * t1
#     tokens/round = tau
#     speedup      = baseline TPOT / TPOT = t1 / (round time / tau) = tau / (k * c + r(q))
#
# t1 is the target's plain decode step (the baseline TPOT at the same batch size), c the cost of
# one draft step relative to t1, q the positions verified (k + 1 for a chain, num_draft_tokens for
# a tree, the root included) and r(q) = t_verify(q) / t_verify(1) the verify forward's cost
# relative to a decode step. With r = 1 (verify as cheap as a decode step: memory-bound, small q)
# and i.i.d. acceptance a this is the textbook (1 - a^(k+1)) / ((1 - a) (k c + 1)).
# What it leaves out (sampling, the rule, KV bookkeeping, tree masks) shows up as the gap between
# predicted and measured speedup.

COST_COLUMNS = ("draft_ms", "verify_ms", "baseline_tpot_ms")  # per run, written by the runner


def expected_tokens(a, k):
    """Expected tokens per round for i.i.d. per-position acceptance a and draft length k:

        tau = sum_{j=0..k} a^j = (1 - a^(k+1)) / (1 - a),   tau = k + 1 at a = 1 exactly.

    The accepted drafts plus the one token the target always emits (the correction or the
    bonus). a and k broadcast (scalars or arrays); a float for scalar inputs. Computed as
    -expm1((k+1) log a) / (1 - a), accurate as a -> 1; NaN in a or k gives NaN."""
    a, k = np.asarray(a, dtype=float), np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = -np.expm1((k + 1) * np.log1p(a - 1)) / (1 - a)
    return _scalar(np.where((a == 1) | (k == 0), k + 1, value))


def expected_tokens_from_positions(accept_pos):
    """Expected tokens per round from the measured per-position acceptance of a run:

        tau = 1 + sum_{i=1..k} prod_{j<=i} a_j

    where a_j = P(accept draft position j | position j drafted and 1..j-1 accepted): the
    *conditional* rate, as metrics.SpecStats.accept_pos records it (the row's `accept_pos`).
    prod_{j<=i} a_j is then P(at least i drafts accepted), and their sum the expected accepted
    length; the same holds along the accepted path of a tree. [0.5, 0.5] -> 1 + 0.5 + 0.25 = 1.75.

    A position no round reached is recorded as None: it adds nothing when the product before it
    is already 0 (as it is for a chain: nothing reached it because its parent was never
    accepted), and makes the result NaN otherwise. One list -> a float; a sequence or Series of
    lists (one per run; None or a non-list for a run without one -> NaN) -> an array."""
    if _is_list_of_lists(accept_pos):
        return np.array([expected_tokens_from_positions(p) if isinstance(p, (list, tuple, np.ndarray)) else np.nan
                         for p in accept_pos], dtype=float)
    rates = np.array([np.nan if v is None else v for v in accept_pos], dtype=float)
    reach = np.cumprod(np.nan_to_num(rates, nan=0.0))  # P(>= i accepted), treating gaps as 0
    before = np.concatenate([[1.0], reach[:-1]])  # P(>= i-1 accepted)
    if np.any(np.isnan(rates) & (before > 0)):
        return float("nan")
    return float(1 + reach.sum())


def predicted_speedup(tau, k, c, r=1.0, p=0.0):
    """speedup = tau / (k c + r + p): tau tokens per round against a round costing k draft
    steps of c target decode steps each, one verify forward of r decode steps, and p decode
    steps of other requests' prefills (0 at batch 1). Broadcasts; a float for scalar inputs.
    e.g. tau 1.75, k 2, c 0.1, r 1 -> 1.75 / 1.2 = 1.4583; with p 1 -> 1.75 / 2.2 = 0.7955."""
    tau, k, c, r, p = (np.asarray(x, dtype=float) for x in (tau, k, c, r, p))
    with np.errstate(divide="ignore", invalid="ignore"):
        return _scalar(tau / (k * c + r + p))


def verify_positions(frame: pd.DataFrame) -> pd.Series:
    """q, the positions one verify forward scores: num_draft_tokens where recorded (a tree, the
    root included), else k * topk + 1 (k + 1 for a chain); NaN for the baseline."""
    k = _numeric(frame, "k")
    topk = _numeric(frame, "topk").fillna(1.0)
    return _numeric(frame, "num_draft_tokens").fillna(k * topk + 1)


def verify_ratio(curve, q, batch_size=None) -> np.ndarray:
    """r(q) = t(q) / t(1) from a verify-cost benchmark, at each q (linear between the q's it
    measured, NaN outside them). `curve` is one of:

      - a mapping or Series q -> r(q);
      - a DataFrame with a `q` column and either `r` (already relative) or a time column
        (`t_ms`, `verify_ms` or `time_ms`, divided here by its value at q = 1), and optionally
        `batch_size`: then each q is looked up among the curve's rows at its own batch_size
        (NaN where that batch size was not benchmarked)."""
    q = np.asarray(q, dtype=float)
    if not isinstance(curve, pd.DataFrame):
        series = pd.Series(curve, dtype=float)
        curve = pd.DataFrame({"q": series.index.astype(float), "r": series.to_numpy()})
    if "r" not in curve.columns:
        time = next((c for c in ("t_ms", "verify_ms", "time_ms") if c in curve.columns), None)
        if time is None:
            raise ValueError(f"verify_curve needs a column r or t_ms, got {list(curve.columns)}")
        curve = curve.assign(r=curve[time] / _at_q1(curve, time))
    if "batch_size" not in curve.columns or batch_size is None:
        return _interp(curve, q)
    batch = np.broadcast_to(np.asarray(batch_size, dtype=float), q.shape)
    out = np.full(q.shape, np.nan)
    for b, group in curve.groupby("batch_size"):
        at = batch == float(b)
        out[at] = _interp(group, q[at])
    return out


def cost_model(df: pd.DataFrame, verify_curve=None) -> pd.DataFrame:
    """A copy of `df` (results rows) with the cost model beside the measured speedup:

        c_measured        = draft_ms / (k * baseline_tpot_ms)    draft step / target decode step
        r_measured        = verify_ms / baseline_tpot_ms         verify forward / decode step
        o_measured        = other_ms / baseline_tpot_ms          rules and bookkeeping / decode step
        p_measured        = prefill_wait_ms / baseline_tpot_ms   prefills waited per round / decode step
        d_measured        = request_round_ms / (draft_ms + verify_ms + other_ms)   the drain factor
        predicted_speedup = tau / ((k * c_measured + r + o_measured) * d + p)

with tau = median_tokens_per_round: each request's tokens per round, the median over requests.
tpot_ms is a median over requests too, and a request's TPOT is the round time over its own tau,
so the median TPOT is the round time over the median tau. tokens_per_round, pooled over all
rounds, is the requests' harmonic mean (every request the same length): it leans to those that
accept little. Where the requests' tau spread (n-gram drafting: most accept nothing, a few copy
whole spans) the two part: 1.088 pooled against 1.0 median for ngram on 16 MT-Bench prompts in
one batch, whose TPOT the median predicted within 0.3 % and the pooled one 8 % low
(results/2026-12-07-cpu-median-tau). Rows without the column (before 2026-12-07) use
tokens_per_round.

p is the prefill term of continuous batching: a request's TPOT
holds the prefills of the requests admitted while it decodes. Over N tokens a request waits
for the same prefill time P with or without speculation, so the baseline's TPOT is
t1 = s + P/N (s its step), and speculation's is (round + P/R) / tau with R = N / tau rounds:
speedup = tau t1 / (round + P/R). P/R is the row's prefill_wait_ms: per request, the prefills
admitted between its first and last token over its rounds, the median over requests (older rows
without it fall back to prefill_ms, all of the run's prefills per round, which over-counts: a
request admitted early waits for the later admissions only). The baseline's share is already in
t1, so p appears in the denominator only. At batch 1 a TPOT holds no prefill and p = 0.

d is the drain factor. c, r and o are means over batched rounds, but a request's TPOT holds its
own rounds. While a batch drains, its last rounds have few live requests and cost less where a
cost follows the requests (drafting, bookkeeping).
request_round_ms is the round's time averaged over request-rounds, so d = 1 where every round
has as many live requests (always at batch 1), and d > 1 where a batch drains. Rows without
request_round_ms (before 2026-12-06) get d = 1. d scales a verify curve's r too, although a
verify's cost follows the requests less than drafting does.

    with r = r_measured, or, where `verify_curve` is given (see verify_ratio: q -> t(q)/t(1)
    from a separate verify-cost benchmark, optionally per batch_size), r = the curve at
    q = verify_positions (k + 1 for a chain), also written as r_curve. tau is the run's
    measured value, so the prediction isolates the timing model from acceptance.

    baseline_tpot_ms falls back to speedup * tpot_ms (the run's own baseline TPOT) where it is
    missing. Rows without the cost columns (older runs), and baseline rows (k NaN), get NaN;
    nothing raises for missing columns or None values."""
    out = df.copy()
    k = _numeric(out, "k").where(lambda v: v > 0)
    t1 = _numeric(out, "baseline_tpot_ms").fillna(_numeric(out, "speedup") * _numeric(out, "tpot_ms"))
    t1 = t1.where(t1 > 0)
    out["c_measured"] = _numeric(out, "draft_ms") / (k * t1)
    out["r_measured"] = (_numeric(out, "verify_ms") / t1).where(k.notna())
    out["o_measured"] = (_numeric(out, "other_ms").fillna(0.0) / t1).where(k.notna())  # 0 for rows before it
    batched = _numeric(out, "batch_size").fillna(1.0) > 1
    # The prefills one request waits for per round (rows since prefill_wait_ms), else every
    # prefill of the run per round (older rows: an upper bound, as not every request waits for all).
    prefill = _numeric(out, "prefill_wait_ms").fillna(_numeric(out, "prefill_ms")).fillna(0.0).where(batched, 0.0)
    out["p_measured"] = (prefill / t1).where(k.notna())
    split = _numeric(out, "draft_ms") + _numeric(out, "verify_ms") + _numeric(out, "other_ms").fillna(0.0)
    out["d_measured"] = (_numeric(out, "request_round_ms") / split).fillna(1.0).where(k.notna())
    r = out["r_measured"]
    if verify_curve is not None:
        batch = _numeric(out, "batch_size") if "batch_size" in out.columns else None
        out["r_curve"] = verify_ratio(verify_curve, verify_positions(out).where(k.notna()), batch)
        r = out["r_curve"]
    d = out["d_measured"]
    out["predicted_speedup"] = predicted_speedup(request_tau(out), k, out["c_measured"] * d,
                                                 (r + out["o_measured"]) * d, out["p_measured"])
    return out


def request_tau(df: pd.DataFrame) -> pd.Series:
    """The tokens per round a row's TPOT sees: median_tokens_per_round (the median request's),
    else, in rows before it, the pooled tokens_per_round (see cost_model)."""
    return _numeric(df, "median_tokens_per_round").fillna(_numeric(df, "tokens_per_round"))


def synthetic_rate(df: pd.DataFrame) -> pd.Series:
    """The constant per-position acceptance a of synthetic-control rows (NaN for other rows).

    The row does not record drafter.acceptance_rates (only config.yaml does), so in order:
    a `synthetic_rate` column where present; else the pooled conditional acceptance of
    accept_pos / accept_reached (pooled_acceptance: an estimate of a); else a solved from the
    row's acceptance_rate = accepted / drafted, which for i.i.d. a and a chain of k is
    (tau(a, k) - 1) / k, *not* a itself (a = 0.8, k = 4 -> 0.59)."""
    synthetic = (df["drafter"] == "synthetic") if "drafter" in df.columns else pd.Series(False, index=df.index)
    rate = _numeric(df, "synthetic_rate")
    if "accept_pos" in df.columns:
        reached = df["accept_reached"] if "accept_reached" in df.columns else [None] * len(df)
        pooled = pd.Series([pooled_acceptance(p, n) for p, n in zip(df["accept_pos"], reached)], index=df.index)
        rate = rate.fillna(pooled)
    rate = rate.fillna(pd.Series(iid_rate_from_acceptance(_numeric(df, "acceptance_rate"), _numeric(df, "k")),
                                 index=df.index))
    return rate.where(synthetic)


def iid_rate_from_acceptance(acceptance_rate, k) -> np.ndarray:
    """The per-position a with (tau(a, k) - 1) / k = acceptance_rate (accepted / drafted for a
    chain), by bisection: the inverse of the i.i.d. model, increasing in a. NaN in, NaN out."""
    target, k = np.broadcast_arrays(np.asarray(acceptance_rate, dtype=float), np.asarray(k, dtype=float))
    low, high = np.zeros(target.shape), np.ones(target.shape)
    for _ in range(60):
        mid = (low + high) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            below = (expected_tokens(mid, k) - 1) / k < target
        low, high = np.where(below, mid, low), np.where(below, high, mid)
    return np.where(np.isnan(target) | np.isnan(k) | (k <= 0), np.nan, (low + high) / 2)


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """`column` as floats (None -> NaN), or all NaN where the frame lacks it."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def _scalar(value: np.ndarray):
    return float(value) if np.ndim(value) == 0 else value


def _is_list_of_lists(values) -> bool:
    if isinstance(values, pd.Series):
        return True
    first = next((v for v in values if v is not None), None)
    return isinstance(first, (list, tuple, np.ndarray))


def _at_q1(curve: pd.DataFrame, time: str):
    """t(1) for each row of the curve: per batch_size where the curve has one."""
    ones = curve[curve.q == 1]
    if ones.empty:
        raise ValueError("verify_curve has times but no q = 1 to normalise them by")
    if "batch_size" in curve.columns:
        return curve.batch_size.map(ones.groupby("batch_size")[time].mean())
    return float(ones[time].mean())


def _interp(curve: pd.DataFrame, q: np.ndarray) -> np.ndarray:
    points = curve.groupby("q")["r"].mean().sort_index()
    xs, ys = points.index.to_numpy(dtype=float), points.to_numpy(dtype=float)
    return np.interp(q, xs, ys, left=np.nan, right=np.nan) if len(xs) else np.full(np.shape(q), np.nan)
