"""The serving-engine adapters (specbench.engines: translate, vllm, sglang, show, serving).

Neither vLLM nor SGLang can be installed here: the translation is held to a golden table
(tests/fixtures/engines/translations.json, rebuilt by make_translations.py beside it), the metric
parsing to fixtures written by hand from each engine's documented output formats, and the adapters'
plumbing to stand-in engine modules that return those fixtures."""

import functools
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from specbench import run as run_module
from specbench.analysis import load_results
from specbench.config import ConfigError, DatasetConfig, NgramConfig, SpecBenchConfig, TargetConfig, register, validate
from specbench.engines import serving, show
from specbench.engines import sglang as sglang_adapter
from specbench.engines import vllm as vllm_adapter
from specbench.engines.translate import sglang_spec, spec_dict, vllm_spec
from specbench.results import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engines"
GOLDEN = json.loads((FIXTURES / "translations.json").read_text())
register()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def namespace(value):
    """JSON fixture -> objects with attributes, as the engines return them."""
    if isinstance(value, dict):
        return SimpleNamespace(**{key: namespace(v) for key, v in value.items()})
    return [namespace(v) for v in value] if isinstance(value, list) else value


def approx_row(fields: dict, expected: dict) -> None:
    for key, want in expected.items():
        assert fields[key] == (pytest.approx(want) if want is not None else None), key


# --- golden translations -----------------------------------------------------------------------


def test_the_golden_table_covers_every_drafter_rule_and_tree():
    spec = importlib.util.spec_from_file_location("make_translations", FIXTURES / "make_translations.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    assert [case["overrides"] for case in GOLDEN["cases"]] == maker.cases()  # a new conf option: rebuild the table
    assert "no engine was run" in GOLDEN["_about"]


@functools.lru_cache(maxsize=1)
def golden_configs() -> dict:
    """Every golden case's config, composed in one Hydra context (one each costs seconds in all)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {tuple(case["overrides"]): compose("config", overrides=case["overrides"]) for case in GOLDEN["cases"]}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: " ".join(c["overrides"]) or "baseline")
def test_golden_translation(case):
    cfg = golden_configs()[tuple(case["overrides"])]
    for engine, translate in (("vllm", vllm_spec), ("sglang", sglang_spec)):
        try:
            validate(cfg)
            got = spec_dict(translate(cfg))
        except ConfigError as e:
            assert "\n" not in str(e)
            got = {"error": str(e)}
        assert got == case[engine], engine


def test_vllm_speculative_config_for_eagle3_onehot():
    spec = vllm_spec(cfg_of("+drafter=eagle3", "+rule=onehot", "k=3", "temperature=0.7", "top_k=20"))
    assert spec.speculative_config == {"method": "eagle3", "model": "specbench://checkpoints/smollm2_135m/eagle3",
                                       "num_speculative_tokens": 3, "draft_sample_method": "greedy"}
    assert spec.sampling == {"temperature": 0.7, "top_p": 1.0, "top_k": 20, "max_tokens": 64, "seed": 0}
    assert spec.engine_args == {"seed": 0, "max_num_seqs": 1, "tensor_parallel_size": 1}


def test_ngram_window_and_the_trie_arguments():
    assert vllm_spec(cfg_of("+drafter=ngram", "drafter.min_n=1", "drafter.max_n=3")).speculative_config == {
        "method": "ngram_gpu", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    args = sglang_spec(cfg_of("+drafter=ngram_trie", "drafter.max_bfs_breadth=6", "+tree=sglang_5_4_8")).engine_args
    assert args["speculative_algorithm"] == "NGRAM" and args["speculative_ngram_max_bfs_breadth"] == 6
    assert (args["speculative_num_steps"], args["speculative_num_draft_tokens"]) == (5, 8)
    assert "speculative_eagle_topk" not in args  # SGLang sets it from max_bfs_breadth


def test_rules_in_sglang_terms():
    tree = sglang_spec(cfg_of("+drafter=eagle3", "+tree=sglang_5_4_8", "+rule=thresholded", "rule.threshold_acc=0.5"))
    assert {key: tree.engine_args[key] for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
            "speculative_accept_threshold_single", "speculative_accept_threshold_acc")} == {
        "speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8,
        "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 0.5}
    sampled = cfg_of("+drafter=eagle3", "drafter.draft_sample_method=probabilistic", "temperature=0.7")
    assert sglang_spec(sampled).engine_args["speculative_use_rejection_sampling"] is True
    assert vllm_spec(sampled).speculative_config["draft_sample_method"] == "probabilistic"
    for rule in ("standard", "onehot", "target_only"):  # greedy drafts: SGLang's default kernel, no switch
        args = sglang_spec(cfg_of("+drafter=eagle3", f"+rule={rule}")).engine_args
        assert "speculative_use_rejection_sampling" not in args and "speculative_accept_threshold_acc" not in args


@pytest.mark.parametrize(
    "engine,overrides,message",
    [
        ("vllm", ["+drafter=eagle3", "+rule=target_only"], "rule=target_only: vLLM has no target-only rule"),
        ("vllm", ["+drafter=eagle3", "+rule=thresholded"], "rule=thresholded: vLLM has no acceptance thresholds"),
        ("vllm", ["+drafter=eagle3", "+tree=sglang_5_4_8"], "tree.topk=4: vLLM verifies chains only"),
        ("vllm", ["+drafter=ngram_trie"], "drafter=ngram_trie: vLLM's n-gram drafts a chain"),
        ("vllm", ["+drafter=layerskip"], "drafter=layerskip: vLLM v0.32.0 has no self-speculation"),
        ("sglang", ["+drafter=ngram"], "drafter=ngram: SGLang's NGRAM is the trie"),
        ("sglang", ["+drafter=synthetic"], "drafter=synthetic: specbench's timing control"),
        ("sglang", ["+drafter=draft_model", "drafter.draft_sample_method=probabilistic"], "drafter=draft_model: SGLang's rejection sampling takes"),
        ("sglang", ["+drafter=eagle3", "drafter.draft_sample_method=probabilistic", "+rule=onehot"],
         "drafter.draft_sample_method=probabilistic: SGLang samples drafts only under rejection sampling"),
        ("sglang", ["+drafter=eagle", "+tree=chain", "tree.num_draft_tokens=3"], "tree.num_draft_tokens=3: SGLang resets"),
    ],
)
def test_inexpressible_combinations_stop_with_one_line(engine, overrides, message):
    translate = vllm_spec if engine == "vllm" else sglang_spec
    with pytest.raises(ConfigError) as e:
        translate(cfg_of(*overrides))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_mtp_would_map_to_vllm_mtp_and_sglang_nextn():
    cfg = cfg_of("+drafter=eagle3", "k=2")
    cfg.drafter.name = "mtp"  # no MTP drafter in specbench yet: its mapping is ready for one
    assert vllm_spec(cfg).speculative_config == {"method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "greedy"}
    args = sglang_spec(cfg).engine_args
    assert args["speculative_algorithm"] == "NEXTN" and "speculative_draft_model_path" not in args


def test_a_dataclass_config_translates_as_the_composed_one():
    cfg = cfg_of("+drafter=ngram", "k=3")
    typed = SpecBenchConfig(target=TargetConfig(name=cfg.target.name, path=cfg.target.path),
                            dataset=DatasetConfig(name="mt_bench", source="x", format="mt_bench"), drafter=NgramConfig(), k=3)
    assert vllm_spec(typed) == vllm_spec(cfg)


def test_sglang_speculation_carries_the_48_request_warning():
    notes = sglang_spec(cfg_of("+drafter=eagle3", "batch_size=4")).notes
    assert any("48" in note and "batch_size=4" in note for note in notes)
    assert sglang_spec(cfg_of()).notes == ()  # no speculation, no cap


def test_validate_keeps_engine_only_settings_to_the_engines():
    with pytest.raises(ConfigError, match="engine.tensor_parallel_size=2: only engine=vllm or sglang"):
        validate(cfg_of("engine.tensor_parallel_size=2"))
    with pytest.raises(ConfigError, match="distcheck=True: samples specbench's own loop"):
        validate(cfg_of("engine=sglang", "+drafter=eagle3", "temperature=0.7", "distcheck=true"))
    validate(cfg_of("engine=vllm", "engine.tensor_parallel_size=8", "+drafter=eagle3"))


# --- metric parsing ----------------------------------------------------------------------------


def test_vllm_counters_and_request_timings_from_the_fixture():
    fx = json.loads((FIXTURES / "vllm_metrics.json").read_text())
    before, after = (vllm_adapter.spec_counters(namespace(fx[key])) for key in ("before", "after"))
    records = [vllm_adapter.request_record(str(i), out) for i, out in enumerate(namespace(fx["outputs"]))]
    counts = vllm_adapter.counts(before, after, [len(r.tokens) for r in records], fx["k"])
    approx_row(serving.row_fields(counts, records, fx["wall_s"]), fx["expected"])


def test_vllm_counters_sum_over_engines_and_accept_scraped_names():
    metrics = namespace([{"name": "vllm:spec_decode_num_drafts_total", "value": 3}, {"name": "vllm:spec_decode_num_drafts", "value": 2},
                         {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": [2, 1]},
                         {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": [1, 1, 1]}])
    assert vllm_adapter.spec_counters(metrics) == {"drafts": 5, "per_pos": [3, 2, 1]}


def test_vllm_baseline_and_missing_counters():
    assert vllm_adapter.counts({}, {}, [5, 7], None) == serving.Counts(2, 12, rounds=10)
    with pytest.raises(RuntimeError, match="no spec-decode counters"):
        vllm_adapter.counts({}, {}, [5, 7], 3)


@pytest.mark.parametrize("case", json.loads((FIXTURES / "sglang_outputs.json").read_text())["cases"], ids=lambda c: c["name"])
def test_sglang_meta_info_from_the_fixture(case):
    records = [sglang_adapter.request_record(str(i), 10, out) for i, out in enumerate(case["outputs"])]
    counts = sglang_adapter.counts(case["outputs"], case["k"], case["num_draft_tokens"])
    approx_row(serving.row_fields(counts, records, case["wall_s"]), case["expected"])


def test_sglang_without_speculation_fields():
    outputs = [{"output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}]
    assert sglang_adapter.counts(outputs, None, None) == serving.Counts(1, 3, rounds=2)
    with pytest.raises(RuntimeError, match="no spec_verify_ct"):
        sglang_adapter.counts(outputs, 3, 4)


# --- the command printer -----------------------------------------------------------------------


def test_show_prints_both_command_lines():
    proc = subprocess.run([sys.executable, "-m", "specbench.engines.show", "+drafter=eagle3", "+rule=onehot", "k=3"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    vllm_line = next(line for line in lines if line.startswith("vllm serve "))
    words = shlex.split(vllm_line)
    assert json.loads(words[words.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": str(ROOT / "specbench/checkpoints/smollm2_135m/eagle3"),
        "num_speculative_tokens": 3, "draft_sample_method": "greedy"}
    sglang_line = shlex.split(next(line for line in lines if line.startswith("python -m sglang.launch_server ")))
    flags = dict(zip(sglang_line[3::2], sglang_line[4::2]))
    assert flags["--speculative-algorithm"] == "EAGLE3" and flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-eagle-topk"] == "1" and flags["--speculative-num-draft-tokens"] == "4"
    assert any("48" in line for line in lines if line.startswith("# note:"))


def test_show_gives_the_reason_for_one_engine_and_prints_the_other():
    text, status = show.render(cfg_of("+drafter=eagle3", "+tree=sglang_5_4_8"))
    assert status == 0 and "python -m sglang.launch_server" in text and "vllm serve" not in text
    assert "# vLLM v0.32.0: cannot express this configuration: tree.topk=4: vLLM verifies chains only" in text
    text, status = show.render(cfg_of("+drafter=synthetic"))
    assert status == 2 and text.count("cannot express") == 2


def test_show_flags_and_notes():
    cfg = cfg_of("+drafter=eagle3", "drafter.draft_sample_method=probabilistic", "temperature=0.7",
                 "+engine.args.enforce_eager=false", "+engine.args.gpu_memory_utilization=0.8")
    text, _ = show.render(cfg)
    vllm_words = shlex.split(next(line for line in text.splitlines() if line.startswith("vllm serve")))
    assert "--no-enforce-eager" in vllm_words and vllm_words[vllm_words.index("--gpu-memory-utilization") + 1] == "0.8"
    sglang_words = shlex.split(next(line for line in text.splitlines() if line.startswith("python -m sglang")))
    assert "--speculative-use-rejection-sampling" in sglang_words and "--enforce-eager" not in sglang_words
    assert "is a GGUF file" in text  # the default target cannot be handed to an engine as it is
    assert "stores only its own layers" in show.render(cfg_of("+drafter=draft_model"))[0]


def test_show_stops_on_a_bad_config(capsys):
    assert show.main(["+drafter=ngram", "k=0"]) == 2
    assert capsys.readouterr().err.strip() == "error: k=0: must be >= 1"


# --- engines not installed, and the adapters' plumbing -----------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_missing_engine_stops_with_one_line_naming_the_extra(monkeypatch, engine):
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed")
    monkeypatch.setattr(run_module, "load_target", lambda *_: pytest.fail("model loaded"))
    monkeypatch.setattr("specbench.datasets.load_prompts", lambda *_: pytest.fail("prompts loaded"))
    with pytest.raises(ConfigError) as e:
        run_module.run(cfg_of(f"engine={engine}", "+drafter=eagle3"), {})
    message = str(e.value)
    assert message.startswith(f"engine={engine}: cannot import {engine}") and "\n" not in message
    assert message.endswith(f"pip install 'specbench[{engine}]'")
    with pytest.raises(ConfigError, match="^drafter=synthetic"):  # a refused combination stops first
        run_module.run(cfg_of(f"engine={engine}", "+drafter=synthetic"), {})


def test_cli_engine_vllm_not_installed_exits_nonzero(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    proc = subprocess.run([sys.executable, "-m", "specbench", "engine=vllm", "+drafter=ngram", f"results_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: engine=vllm: cannot import vllm") and line.endswith("pip install 'specbench[vllm]'")
    assert load_results(tmp_path).status.tolist() == ["failed"]


def test_a_draft_that_shares_the_target_embedding_cannot_go_to_an_engine(tiny_checkpoint):
    with pytest.raises(ConfigError, match="drafter.path=specbench://checkpoints/smollm2_135m/draft_model: stores only its own layers"):
        serving.weights(cfg_of(f"target.path={tiny_checkpoint}", "+drafter=draft_model"))
    target, draft = serving.weights(cfg_of(f"target.path={tiny_checkpoint}", "+drafter=eagle3"))
    assert target == str(tiny_checkpoint) and Path(draft, "config.json").is_file()


class FakeVllm:
    """Stands in for the vllm package: LLM returns the fixture's outputs and counters."""

    __version__ = "0.32.0"

    def __init__(self, fixture):
        self.fixture, self.calls = fixture, []
        fake = self

        class LLM:
            def __init__(self, **kwargs):
                fake.calls.append(("LLM", kwargs))
                self.reads = iter([fixture["before"], fixture["after"]])

            def generate(self, requests, params, use_tqdm=True):
                fake.calls.append(("generate", requests, params))
                return namespace(fixture["outputs"][: len(requests)])

            def get_metrics(self):
                return namespace(next(self.reads))

        self.LLM, self.SamplingParams = LLM, lambda **kw: kw


class FakeSglang:
    __version__ = "0.5.22"

    def __init__(self, outputs):
        self.calls = []
        fake = self

        class Engine:
            def __init__(self, **kwargs):
                fake.calls.append(("Engine", kwargs))

            def generate(self, input_ids, sampling_params):
                fake.calls.append(("generate", input_ids, sampling_params))
                return outputs[: len(input_ids)]

            def shutdown(self):
                fake.calls.append(("shutdown",))

        self.Engine = Engine


def _engine_run(monkeypatch, tmp_path, checkpoint, fake, *overrides):
    monkeypatch.setattr(serving, "require", lambda module: fake)  # prepare() imports the engine through it
    monkeypatch.setattr(run_module, "load_target", lambda *_: pytest.fail("the native path loaded the target"))
    cfg = cfg_of(f"target.path={checkpoint}", "target.name=tiny", f"results_dir={tmp_path}", "dataset.num_prompts=2", *overrides)
    rows = run_module.run_and_record(cfg)
    assert rows[0]["status"] == "ok", rows[0]["error"]
    row = load_results(tmp_path).iloc[0]
    assert list(row.index[: len(COLUMNS)]) == list(COLUMNS)
    return rows[0]


def test_the_vllm_adapter_runs_the_prompts_and_fills_the_row(monkeypatch, tmp_path, tiny_checkpoint):
    fixture = json.loads((FIXTURES / "vllm_metrics.json").read_text())
    fake = FakeVllm(fixture)
    row = _engine_run(monkeypatch, tmp_path, tiny_checkpoint, fake, "engine=vllm", "+drafter=ngram", "k=3", "batch_size=1")
    (_, init), (_, warm, warm_params), (_, requests, params) = fake.calls
    assert init["model"] == str(tiny_checkpoint) and init["disable_log_stats"] is False and init["max_num_seqs"] == 1
    assert init["speculative_config"] == {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert len(warm) == 1 and warm_params["max_tokens"] == 8 and params["max_tokens"] == 64
    assert len(requests) == 2 and all(r["prompt_token_ids"] for r in requests)  # specbench's token ids, chat template applied
    approx_row(row, {key: value for key, value in fixture["expected"].items() if key != "throughput_tok_s"})
    assert row["engine"] == "vllm" and row["engine_version"] == "0.32.0" and row["num_prompts"] == 2 and row["speedup"] is None
    assert row["warmup"] == "short" and row["repeats"] == 1  # what ran: one measured generate call (cfg says 3)


def test_the_sglang_adapter_runs_the_prompts_and_fills_the_row(monkeypatch, tmp_path, tiny_checkpoint):
    case = json.loads((FIXTURES / "sglang_outputs.json").read_text())["cases"][0]
    fake = FakeSglang(case["outputs"])
    row = _engine_run(monkeypatch, tmp_path, tiny_checkpoint, fake, "engine=sglang", "+drafter=eagle3", "k=3", "batch_size=2")
    (_, init), (_, warm, _), (_, inputs, sampling), shutdown = fake.calls
    assert init["model_path"] == str(tiny_checkpoint) and init["max_running_requests"] == 2
    assert init["speculative_algorithm"] == "EAGLE3" and init["speculative_draft_model_path"].endswith("checkpoints/smollm2_135m/eagle3")
    assert len(warm) == 2 and len(inputs) == 2 and sampling == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64}
    assert shutdown == ("shutdown",)
    approx_row(row, {key: value for key, value in case["expected"].items() if key != "throughput_tok_s"})
    assert row["engine"] == "sglang" and row["rule"] == "standard"
