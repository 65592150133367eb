"""The command line: composition, bad input, single runs and sweeps, on a tiny local checkpoint."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench import run as run_module
from specbench.analysis import load_results, with_speedup
from specbench.config import ConfigError, register
from specbench.results import COLUMNS

CONF = Path(__file__).resolve().parents[1] / "conf"
register()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def cli(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specbench", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
        env=None if env is None else {**os.environ, **env},
    )


def tiny(checkpoint, results, *more):
    return [f"target.path={checkpoint}", "target.name=tiny", f"results_dir={results}",
            "dataset.num_prompts=2", "max_new_tokens=12", *more]


# --- composition -------------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["target", "dataset", "drafter", "rule", "tree"])
def test_every_option_of_every_group_composes(group):
    for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
        extra = {"rule": ["+drafter=ngram"], "tree": ["+drafter=eagle3"]}.get(group, [])
        prefix = "+" if group in ("drafter", "rule", "tree") else ""
        cfg = cfg_of(*extra, f"{prefix}{group}={option}")
        node = cfg[group]
        assert OmegaConf.get_type(node) is not dict, f"{group}={option} has no typed schema"
        assert node.name if group != "tree" else node.steps == cfg.k


def test_misspelt_keys_fail_at_compose_time():
    for bad in (["kk=3"], ["+drafter=ngram", "drafter.max_nn=3"], ["+drafter=ngram", "+rule=onehot", "rule.threshold_acc=0.5"]):
        with pytest.raises(Exception, match="Could not override"):
            cfg_of(*bad)
    with pytest.raises(Exception):
        cfg_of("temperature=hot")


@pytest.mark.parametrize("warmup, prompts, tokens", [("full", 5, 12), ("short", 2, 8)])
def test_the_warm_up_decodes_every_prompt_unless_short(monkeypatch, warmup, prompts, tokens):
    """warmup=full decodes all 5 prompts for all 12 tokens, as the measured decode will; short
    the first batch_size (2) for 8 tokens (run.WARMUP_TOKENS)."""
    seen = []
    monkeypatch.setattr(run_module, "decode_all",
                        lambda engine, inputs, prompts, cfg, **kw: seen.append((len(inputs), cfg.max_new_tokens)))
    cfg = cfg_of(f"warmup={warmup}", "batch_size=2", "max_new_tokens=12")
    engine = type("Engine", (), {"rows": 2})()
    run_module.warm_up(engine, list(range(5)), list(range(5)), dict(cfg=cfg, params=None, eos=()), None)
    assert seen == [(prompts, tokens)]
    other = cfg_of(f"warmup={'short' if warmup == 'full' else 'full'}", "batch_size=2", "max_new_tokens=12")
    paths = [run_module.baseline_path(c, "cpu", "float32", 5, "sha") for c in (cfg, other)]
    assert paths[0] != paths[1]  # a baseline is timed under one warm-up, and compared under it only


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["+drafter=ngram", "k=0"], "k=0: must be >= 1"),
        (["+drafter=ngram", "+rule=thresholded", "rule.threshold_acc=0"], "rule.threshold_acc=0.0: must be in (0, 1]"),
        (["+drafter=ngram", "+rule=thresholded", "rule.threshold_single=1.5"], "rule.threshold_single=1.5: must be in (0, 1]"),
        (["top_p=0"], "top_p=0.0: must be in (0, 1]"),
        (["top_p=1.2"], "top_p=1.2: must be in (0, 1]"),
        (["temperature=-1"], "temperature=-1.0"),
        (["temperature=1e-37"], "temperature=1e-37: below 1e-05 sample with 0 (greedy)"),
        (["+drafter=ngram", "engine=hf", "batch_size=4"], "batch_size=4: engine=hf runs one request at a time"),
        (["engine.name=tensorrt"], "engine=tensorrt: valid engines: hf, native, sglang, vllm"),
        (["engine.compile_scope=graph"], "engine.compile_scope=graph: valid scopes: layer, model"),
        (["target.path=/no/such/model"], "target.path=/no/such/model: no such file or directory"),
        (["target.path=./missing.gguf"], "target.path=./missing.gguf: no such file"),
        (["dataset.num_prompts=0"], "dataset.num_prompts=0"),
        (["+rule=onehot"], "rule=onehot: a rule needs a drafter"),
        (["+drafter=ngram", "drafter.min_n=4", "drafter.max_n=2"], "drafter.min_n=4"),
        (["+drafter=ngram", "+tree=sglang_5_4_8"], "tree.topk=4: drafter ngram proposes chains only"),
        (["+drafter=ngram", "k=3", "+tree=chain", "tree.steps=3", "tree.num_draft_tokens=3"],
         "tree.num_draft_tokens=3: drafter ngram drafts chains of k=3"),
        (["+drafter=eagle3", "+tree=chain", "tree.steps=3"], "tree.steps=3: the depth is k (k=4)"),
        (["+drafter=layerskip", "+tree=sglang_5_4_8", "tree.num_draft_tokens=99"], "tree.num_draft_tokens=99: must be in [2, 69]"),
        (["+drafter=draft_model", "drafter.draft_sample_method=probabilistic", "+tree=sglang_5_4_8"],
         "drafter.draft_sample_method=probabilistic: a tree (topk > 1"),
        (["+drafter=draft_model", "drafter.draft_sample_method=probabilistic", "+tree=chain", "tree.num_draft_tokens=3"],
         "drafter.draft_sample_method=probabilistic: a tree (topk > 1, or fewer than k + 1 tokens)"),
        (["+drafter=draft_model", "drafter.draft_sample_method=often"], "drafter.draft_sample_method=often"),
        (["+drafter=draft_model", "drafter.path=/no/draft"], "drafter.path=/no/draft: no such checkpoint"),
        (["+drafter=eagle", "drafter.path=specbench://checkpoints/smollm2_135m/eagle3"], "holds an eagle3 head, not eagle"),
        (["+drafter=synthetic", "drafter.acceptance_rates=[1.5]"], "drafter.acceptance_rates"),
        (["+drafter=synthetic", "drafter.coins=sobol"], "drafter.coins=sobol: valid coins: random, quasi"),
        (["warmup=none"], "warmup=none: valid warm-ups: full, short"),
        (["repeats=0"], "repeats=0: must be >= 1"),
        (["+tree=chain"], "drafter=None: a tree shape needs a drafter"),
    ],
)
def test_bad_input_stops_before_any_model_work(monkeypatch, overrides, message):
    def no_model(*_):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(run_module, "load_target", no_model)
    with pytest.raises(ConfigError) as e:
        run_module.run(cfg_of(*overrides), {})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_empty_prompt_set_stops_before_any_model_work(monkeypatch, tmp_path):
    monkeypatch.setattr(run_module, "load_target", lambda *_: pytest.fail("model loaded"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="dataset.source="):
        run_module.run(cfg_of(f"dataset.source={empty}", "dataset.sha256=null"), {})


# --- the command line --------------------------------------------------------------------------


def test_unknown_group_option_lists_the_valid_ones(tmp_path):
    for arg, valid in (("+drafter=medusa", "draft_model, eagle, eagle3, layerskip, ngram, ngram_trie, synthetic"), ("dataset=gsm8k", "alpaca_eval, humaneval, mt_bench"),
                       ("experiment=nope", "greedy_equality, ngram_k, real_rules, toy_rules")):
        proc = cli(arg, f"results_dir={tmp_path}")
        assert proc.returncode == 2
        line = proc.stderr.strip()
        assert "\n" not in line and line.endswith(f"valid: {valid}") and arg.lstrip("+") in line
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.parametrize("args,line", [
    (["k=abc"], "error: k=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["k=4", "kk=4"], "error: kk=4: Key 'kk' not in 'SpecBenchConfig'"),
    (["+drafter=ngram", "engine.cuda_graphs=maybe"], "error: engine.cuda_graphs=maybe: Value 'maybe' is not a valid bool"),
    (["+drafter=ngram,ngram_trie", "-m", "k=2,4,x"], "error: k=x: Value 'x' of type 'str' could not be converted"),
    (["+drafter=ngram", "drafter.max_nn=3"], "error: drafter.max_nn=3: Key 'max_nn' not in 'NgramConfig'"),
])
def test_a_mistyped_value_or_unknown_key_is_one_line_before_any_job(tmp_path, args, line):
    """Hydra's own message spans several lines, and in a sweep it comes only when the job with
    the bad value starts (k=x is the sweep's third value here): one line, exit 2, nothing run."""
    proc = cli(*args, f"results_dir={tmp_path}")
    assert proc.returncode == 2 and proc.stderr.strip().startswith(line) and "\n" not in proc.stderr.strip()
    assert not any(tmp_path.iterdir())  # no job, no results folder


def test_bad_value_exits_nonzero_with_one_line_and_a_failed_row(tmp_path):
    proc = cli("+drafter=ngram", "k=0", f"results_dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: k=0: must be >= 1"
    rows = load_results(tmp_path)
    assert rows.status.tolist() == ["failed"] and rows.error[0] == "k=0: must be >= 1"


def test_a_bad_trie_impl_is_one_line_and_a_failed_row(tmp_path):
    """ngram_trie's drafter.impl names a trie (auto, python, native), not where a search runs: config.validate
    checks it against those, before any model work."""
    proc = cli("+drafter=ngram_trie", "drafter.impl=triton", f"results_dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: drafter.impl=triton: valid impls: auto, python, native"
    assert load_results(tmp_path).status.tolist() == ["failed"]


def test_baseline_then_speculative_runs_on_a_local_checkpoint(tiny_checkpoint, tmp_path):
    base = cli(*tiny(tiny_checkpoint, tmp_path))
    assert base.returncode == 0, base.stderr
    spec = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "+rule=target_only", "k=3"))
    assert spec.returncode == 0, spec.stderr
    rows = load_results(tmp_path).sort_values("drafter", na_position="first")
    assert list(rows.columns[: len(COLUMNS)]) == list(COLUMNS)
    baseline, speculative = rows.iloc[0], rows.iloc[1]
    assert pd.isna(baseline.drafter) and baseline.tokens_per_round == 1.0 and baseline.status == "ok"
    assert speculative.rule == "target_only" and speculative.k == 3 and speculative.status == "ok"
    assert speculative.greedy_mismatches == 0  # temperature 0: token-for-token the baseline
    assert pd.isna(speculative.rule_impl)  # greedy rounds walk the argmaxes on the host: no rule impl ran
    assert speculative.drafter_impl == "torch" and pd.isna(baseline.drafter_impl)  # ngram searched in numpy
    assert speculative.speedup > 0 and speculative.new_tokens == baseline.new_tokens
    assert len(speculative.accept_pos) == 3
    assert speculative.graph_captures == 0 and speculative.baseline_graph_captures == 0  # no graphs on a CPU
    # the baseline was computed once (by the baseline run) and reused
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 1
    run_dir = tmp_path / "runs" / speculative.run_id
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 and sum(len(r["tokens"]) for r in records) == speculative.new_tokens
    assert "drafter:" in (run_dir / "config.yaml").read_text()
    # Another engine setting is another baseline: its timings are not these.
    other = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "+rule=target_only", "k=3", "engine.cuda_graphs=false"))
    assert other.returncode == 0, other.stderr
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 2
    rows = with_speedup(load_results(tmp_path)).set_index("run_id")
    assert rows.engine_options.tolist().count("") == 2 and rows.engine_options.tolist().count("cuda_graphs=false") == 1
    (other_id,) = rows.index[rows.engine_options == "cuda_graphs=false"]
    assert rows.baseline_tpot_ms[speculative.run_id] == baseline.tpot_ms
    assert rows[rows.engine_options != ""].baseline_tpot_ms.isna().all()  # no baseline row with its setting
    # Other code is another baseline as well: a results folder outlives commits.
    later = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "+rule=target_only", "k=3"),
                env={"SPECBENCH_GIT_SHA": "a-later-commit"})
    assert later.returncode == 0, later.stderr
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 3
    rows = with_speedup(load_results(tmp_path))
    assert rows[rows.git_sha == "a-later-commit"].baseline_tpot_ms.isna().all()
    # A baseline run whose baseline a speculative run cached re-decodes: its speedup is 1, not
    # the ratio of its TPOT to the cached one (that stays readable from baseline_tpot_ms).
    late = cli(*tiny(tiny_checkpoint, tmp_path, "engine.cuda_graphs=false"))
    assert late.returncode == 0, late.stderr
    rows = load_results(tmp_path).set_index("run_id")
    (late_id,) = rows.index[rows.drafter.isna() & (rows.engine_options == "cuda_graphs=false")]
    assert rows.speedup[late_id] == 1.0 and rows.baseline_tpot_ms[late_id] == rows.baseline_tpot_ms[other_id]
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 3


def test_sweep_records_a_failed_job_and_goes_on(tiny_checkpoint, tmp_path):
    proc = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "temperature=0.7"), "-m", "k=0,2")
    assert proc.returncode == 1  # a job failed
    rows = load_results(tmp_path).sort_values("k")
    assert rows.status.tolist() == ["failed", "ok"]
    assert rows.error.iloc[0] == "k=0: must be >= 1"
    assert rows.rule.iloc[1] == "standard"  # a drafter without a rule
    assert rows.rule_impl.iloc[1] == "torch"  # rule.impl=auto on a CPU
    assert rows.greedy_mismatches.isna().iloc[1]  # only defined at temperature 0
    assert "tokens_per_round" in proc.stdout  # the summary table


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the dev extra installs triton on Linux")
def test_a_kernel_impl_verifies_sampled_rounds_and_the_row_says_so(tiny_checkpoint, tmp_path):
    """rule.impl=triton through the CLI (Triton's interpreter on a CPU): a batched sampled run,
    its warm-up warming the chain kernel too, ends ok, and the row names the impl that ran."""
    proc = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "drafter.min_n=1", "k=2", "batch_size=2",
                     "temperature=0.8", "+rule=onehot", "rule.impl=triton"))
    assert proc.returncode == 0, proc.stderr
    row = load_results(tmp_path).iloc[0]
    assert row.status == "ok" and row.rule_impl == "triton" and row.new_tokens == 24


def test_distcheck_adds_its_columns_to_the_row(tiny_checkpoint, tmp_path):
    # 200 samples a position: with 40 the tiny model's peaked positions each pooled into one
    # category, with nothing to test (left out: no p-value)
    proc = cli(*tiny(tiny_checkpoint, tmp_path, "+drafter=ngram", "drafter.min_n=1", "temperature=0.8",
                     "distcheck=true", "distcheck_samples=200", "distcheck_length=2", "distcheck_prompts=1"))
    assert proc.returncode == 0, proc.stderr
    row = load_results(tmp_path).iloc[0]
    assert 0 <= row.chi2_pvalue <= 1 and 0 <= row.tv <= 1 and row.distcheck_samples == 200
    assert len(row.distcheck_pvalues) == 2 and row.distcheck_combine == "cauchy"


def test_distcheck_needs_sampling(tmp_path):
    proc = cli("+drafter=ngram", "distcheck=true", f"results_dir={tmp_path}")
    assert proc.returncode == 2 and "distcheck=True: compares sampled outputs" in proc.stderr


def test_toy_rules_experiment_prints_writes_rows_and_a_figure(tmp_path):
    proc = cli("experiment=toy_rules", "rulecheck.draws=20000", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "control: missing residual" in proc.stdout and "20,000 draws" in proc.stdout
    rows = load_results(tmp_path)
    assert (rows.task == "toy_rules").all() and len(rows) == 8  # 5 rules + 3 Markov chains
    assert rows.run_id.is_unique and (rows.seed == 20261031).all()
    assert (tmp_path / "figures" / "toy_rules.png").stat().st_size > 10_000


def test_a_draft_vocabulary_that_differs_stops_before_the_target_loads(monkeypatch, tiny_checkpoint, tmp_path):
    class DraftModel:  # stands in for a draft model whose tokenizer is not the target's
        name, vocab_size = "draft_model", 100

    monkeypatch.setitem(run_module.DRAFTERS, "ngram", lambda cfg: DraftModel())
    monkeypatch.setattr(run_module, "load_target", lambda *_: pytest.fail("model loaded"))
    cfg = cfg_of(f"target.path={tiny_checkpoint}", "+drafter=ngram", f"results_dir={tmp_path}")
    with pytest.raises(ConfigError) as e:
        run_module.run(cfg, {})
    assert str(e.value) == "drafter.vocab_size=100: differs from the target's vocabulary (96)"
    DraftModel.vocab_size = 96  # the same vocabulary passes the check and goes on to load
    with pytest.raises(pytest.fail.Exception, match="model loaded"):
        run_module.run(cfg, {})


def test_the_baseline_runs_on_an_engine_of_its_own(tiny_checkpoint, tmp_path):
    """An EAGLE-3 run caches the baseline on an engine with no target features to keep and room
    for one token a step, then decodes on an engine with its head's features and room for its
    verify: the baseline's timings are the target's alone. An n-gram run after it reuses that
    baseline and builds only its own engine."""
    from transformers import AutoModelForCausalLM

    from conftest import random_head
    from specbench.heads import save_head
    from specbench.results import new_run_id

    target = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    head = save_head(random_head(target, "eagle3", 40), tmp_path / "head")
    built = []
    build = run_module.build_engine

    def recorded(*args, **kwargs):
        engine = build(*args, **kwargs)
        built.append((engine.feature_layers, engine.max_length))
        return engine

    def run(*overrides):
        cfg = cfg_of(*tiny(tiny_checkpoint, tmp_path / "results", "k=3", *overrides))
        row = run_module._base_row(cfg, new_run_id("x"), "x", "sha")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(run_module, "build_engine", recorded)
            rows, _ = run_module.run(cfg, row)
        return rows[0]

    eagle = run("+drafter=eagle3", f"drafter.path={head}")
    (base_layers, base_slots), (layers, slots) = built
    assert base_layers == () and layers == tuple(random_head(target, "eagle3", 40).config.feature_layers) != ()
    assert slots - base_slots == 3  # a verify of 1 + k = 4 inputs against one token a step
    built.clear()
    ngram = run("+drafter=ngram")
    assert built == [((), slots)] and ngram["baseline_tpot_ms"] == eagle["baseline_tpot_ms"]
    assert len(list((tmp_path / "results" / "baselines").glob("*.json"))) == 1


def test_the_row_is_the_repeat_with_the_median_tpot(monkeypatch):
    """run.timed_decodes: cfg.repeats measured decodes, each with the Speculation spec_of() gives
    (a fresh drafter where it keeps state), each in a timed_region; the row's run is the one
    whose TPOT is the median (the lower middle of an even count), its graph captures those of
    every repeat, and every repeat's TPOT is kept in the order they ran."""
    from types import SimpleNamespace

    from specbench.metrics import RoundClock, SpecStats

    tpots = iter([3.0, 9.0, 1.0, 5.0])  # ms a token
    captures = iter([0, 0, 1, 2, 3, 3, 5, 7])  # graphs.captures() before and after each repeat
    monkeypatch.setattr(run_module.graphs, "captures", lambda: next(captures))
    specs = []

    def decode_all(engine, inputs, prompts, *, cfg, params, eos, spec, desc):
        specs.append(spec)
        tpot = next(tpots)
        record = SimpleNamespace(tpot_s=tpot / 1e3)
        return [record, SimpleNamespace(tpot_s=None)], SpecStats(0), RoundClock(steps=int(tpot))

    monkeypatch.setattr(run_module, "decode_all", decode_all)
    kw = dict(cfg=cfg_of("repeats=3"), params=None, eos=())
    fresh = iter(["spec 0", "spec 1", "spec 2"])
    timed = run_module.timed_decodes(None, [], [], kw, lambda: next(fresh), "x")
    assert specs == ["spec 0", "spec 1", "spec 2"]
    assert timed.tpot_runs_ms == pytest.approx([3.0, 9.0, 1.0]) and timed.clock.steps == 3  # the 3 ms repeat
    assert timed.graph_captures == 1 and timed.records[0].tpot_s == pytest.approx(3e-3)
    one = run_module.timed_decodes(None, [], [], {**kw, "cfg": cfg_of("repeats=1")}, lambda: None, "x")
    assert one.tpot_runs_ms == pytest.approx([5.0]) and one.graph_captures == 2
    assert run_module.baseline_path(cfg_of("repeats=1"), "cpu", "float32", 5, "sha") != run_module.baseline_path(
        cfg_of("repeats=3"), "cpu", "float32", 5, "sha")  # a baseline timed one way is compared that way only


@pytest.mark.parametrize("drafter", [
    ("+drafter=ngram_trie", "drafter.impl=python"),  # a trie that keeps what it was told: an empty one each repeat
    ("+drafter=synthetic", "drafter.coins=random", "temperature=0.8"),  # its coins: a stream of its own
    ("+drafter=layerskip", "drafter.layers=1", "drafter.draft_sample_method=probabilistic", "temperature=0.8"),
])
def test_repeats_decode_their_drafter_afresh(tiny_checkpoint, tmp_path, drafter):
    """The measured decodes of a run are one computation three times: each drafts, accepts and
    emits what the first did (ngram_trie from a trie of its own, the others from the start of
    their own streams: synthetic's coins, layerskip's sampled drafts), each one's TPOT is in the
    row (the baseline's too), and the row's TPOT is their median."""
    from specbench.results import new_run_id

    decodes, plain = [], run_module.decode_all

    def recorded(*args, spec, desc, **kwargs):
        records, stats, clock = plain(*args, spec=spec, desc=desc, **kwargs)
        trie = getattr(spec.drafter, "trie", None) if spec is not None else None  # the one this decode filled
        decodes.append((desc, trie, [(r.tokens, r.drafted, r.accepted) for r in records]))
        return records, stats, clock

    cfg = cfg_of(*tiny(tiny_checkpoint, tmp_path, *drafter, "k=3", "repeats=3"))
    row = run_module._base_row(cfg, new_run_id("x"), "x", "sha")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_module, "decode_all", recorded)
        row = run_module.run(cfg, row)[0][0]
    assert [desc for desc, _, _ in decodes] == ["warm-up", *["baseline"] * 3, "warm-up", *[row["run_id"]] * 3]
    measured = decodes[-3:]
    if "ngram_trie" in drafter[0]:
        tries = [trie for _, trie, _ in decodes[-4:]]  # the warm-up's, then each repeat's: four, each filled
        assert len({id(t) for t in tries}) == 4 and all(len(t) > 0 for t in tries)
        assert row["greedy_mismatches"] == 0  # T = 0: the lossless rule emits the baseline's text
    assert measured[0][2] == measured[1][2] == measured[2][2] and sum(sum(d) for _, d, _ in measured[0][2]) > 0
    assert decodes[1][2] == decodes[2][2] == decodes[3][2]  # the baseline's repeats: one stream (T = 0.8 too)
    assert len(row["tpot_runs_ms"]) == 3 and row["tpot_ms"] == sorted(row["tpot_runs_ms"])[1]
    assert len(row["baseline_tpot_runs_ms"]) == 3 and row["baseline_tpot_ms"] == sorted(row["baseline_tpot_runs_ms"])[1]


def test_the_drafter_draws_from_a_stream_of_its_own():
    """A model drafter's generator is not seeded like the runner's: two generators seeded alike
    give one stream, and a draft must not be drawn from the numbers that decide its acceptance."""
    params = run_module.SamplingParams(0.7, 0, 1.0)
    for name in ("layerskip", "eagle3"):
        drafter = run_module.build_drafter(cfg_of(f"+drafter={name}").drafter, params, 7)
        assert drafter.seed == 7 ^ run_module.DRAFTER_SEED != 7
    assert run_module.build_drafter(cfg_of("+drafter=synthetic").drafter, params, 7).seed == 7 ^ run_module.DRAFTER_SEED


def test_peak_memory_leaves_out_what_the_process_held_before_the_job(monkeypatch):
    """A sweep's earlier jobs leave allocations behind; a row's peak is its own job's."""
    monkeypatch.setattr(run_module.torch.cuda, "max_memory_allocated", lambda device=None: 5_500_000_000)
    assert run_module._peak_memory_gb(run_module.torch.device("cuda"), held=2_000_000_000) == 3.5
    assert run_module._peak_memory_gb(run_module.torch.device("cpu"), held=2_000_000_000) is None
