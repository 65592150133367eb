"""The sweep layer: atomic rows, resume, failure isolation, loggers and a parallel launcher."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specbench import results as results_module
from specbench import run as run_module
from specbench.analysis import load_results
from specbench.config import register

CONF = Path(__file__).resolve().parents[1] / "conf"
register()


def cfg_of(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"results_dir={tmp_path}", *overrides])


def fake_task(calls):
    def task(cfg, row):
        calls.append(row["run_id"])
        return [{**row, "status": "ok", "new_tokens": 3}], []

    return task


def test_resume_skips_runs_that_ended_ok_and_resume_false_reruns(tmp_path):
    calls = []
    cfg = cfg_of(tmp_path, "+drafter=ngram", "k=2")
    first = run_module.run_and_record(cfg, fake_task(calls))
    again = run_module.run_and_record(cfg, fake_task(calls))
    assert len(calls) == 1 and again[0]["run_id"] == first[0]["run_id"]
    # results_dir, resume and logger do not change what a run measures: same hash
    run_module.run_and_record(cfg_of(tmp_path, "+drafter=ngram", "k=2", "logger=csv"), fake_task(calls))
    assert len(calls) == 1
    run_module.run_and_record(cfg_of(tmp_path, "+drafter=ngram", "k=2", "resume=false"), fake_task(calls))
    run_module.run_and_record(cfg_of(tmp_path, "+drafter=ngram", "k=3"), fake_task(calls))
    assert len(calls) == 3 and len(load_results(tmp_path)) == 3


def test_a_failed_run_is_recorded_and_rerun_on_resume(tmp_path):
    def out_of_memory(cfg, row):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    cfg = cfg_of(tmp_path, "+drafter=ngram")
    rows = run_module.run_and_record(cfg, out_of_memory)
    assert rows[0]["status"] == "failed"
    assert rows[0]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    calls = []
    run_module.run_and_record(cfg, fake_task(calls))  # not "ok" before: resume runs it again
    assert len(calls) == 1
    assert sorted(load_results(tmp_path).status) == ["failed", "ok"]


def test_an_interrupted_run_is_recorded_then_the_interrupt_goes_on(tmp_path):
    def interrupted(cfg, row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_module.run_and_record(cfg_of(tmp_path), interrupted)
    rows = load_results(tmp_path)
    assert rows.status.tolist() == ["failed"] and rows.error[0] == "KeyboardInterrupt: interrupted"


def test_a_crash_while_writing_leaves_no_half_row(tmp_path, monkeypatch):
    real_replace = os.replace

    def crash_on_rows(src, dst):
        if str(dst).endswith("rows.jsonl"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(results_module.os, "replace", crash_on_rows)
    with pytest.raises(OSError):
        run_module.run_and_record(cfg_of(tmp_path), fake_task([]))
    run_dir = next((tmp_path / "runs").iterdir())
    assert not (run_dir / "rows.jsonl").exists()
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # temporaries removed
    assert load_results(tmp_path).empty  # an incomplete run is not listed


def test_csv_logger_writes_a_view_of_every_row(tmp_path):
    run_module.run_and_record(cfg_of(tmp_path, "logger=csv", "k=2", "+drafter=ngram"), fake_task([]))
    run_module.run_and_record(cfg_of(tmp_path, "logger=csv", "k=3", "+drafter=ngram"), fake_task([]))
    text = (tmp_path / "results.csv").read_text().splitlines()
    assert text[0].startswith("run_id,task,target") and len(text) == 3


def test_wandb_logger_is_offline_by_default_and_imported_only_when_selected(tmp_path, monkeypatch):
    calls = {}

    class Run:
        summary = {}

        def log(self, values):
            calls.setdefault("log", []).append(values)

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.__spec__ = types.SimpleNamespace(name="wandb")

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "wandb" else None)
    run_module.run_and_record(cfg_of(tmp_path, "logger=wandb"), fake_task([]))
    assert calls["init"]["mode"] == "offline" and calls["init"]["project"] == "specbench"
    assert calls["log"][0]["new_tokens"] == 3 and calls["finished"]


def test_wandb_without_the_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    rows = run_module.run_and_record(cfg_of(tmp_path, "logger=wandb"), fake_task([]))
    assert rows[0]["status"] == "failed"
    assert rows[0]["error"] == "logger=wandb: needs the wandb package: pip install -e '.[wandb]'"


def test_joblib_launcher_runs_jobs_in_parallel_and_the_parent_reports(tiny_checkpoint, tmp_path):
    cmd = [sys.executable, "-m", "specbench", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           f"target.path={tiny_checkpoint}", "target.name=tiny", f"results_dir={tmp_path}",
           "dataset.num_prompts=1", "max_new_tokens=8", "+drafter=ngram", "k=1,2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = load_results(tmp_path)
    assert sorted(rows.k) == [1, 2] and (rows.status == "ok").all()
    assert proc.stdout.count(" ngram ") == 2  # the summary table, printed by the parent process


def runner_suite(tmp_path, prefix, datasets_ok=True):
    """experiments/runner_suite.sh PARTS=real under a stand-in PYTHON that records each call: the
    datasets' preflight (-m specbench.datasets) passes or fails, a sweep (-m specbench ...)
    writes its pid and sleeps, the collect step (python3 - RESULTS OUT) is logged."""
    fake = tmp_path / "py"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$2" = "specbench.datasets" ]; then {"exit 0" if datasets_ok else "echo no prompts >&2; exit 2"}; fi\n'
        f'if [ "$1" = "-m" ]; then echo $$ > {tmp_path}/job.pid; exec sleep 60; fi\n'
        f'cat > /dev/null; echo "collect $*" >> {tmp_path}/calls\n'
    )
    fake.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "experiments" / "runner_suite.sh"
    env = {**os.environ, "PYTHON": str(fake), "PARTS": "real"}
    return subprocess.run([*prefix, "bash", str(script), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=30)


def test_runner_suite_without_its_datasets_starts_no_job(tmp_path):
    """On a host that cannot fetch the prompt sets the suite stops before any sweep, non-zero."""
    proc = runner_suite(tmp_path, [], datasets_ok=False)
    assert proc.returncode == 2 and "no prompts" in proc.stderr
    assert not (tmp_path / "job.pid").exists() and not (tmp_path / "calls").exists()


def test_runner_suite_stopped_by_timeout_stops_its_sweep_and_collects(tmp_path):
    """experiments/runner_suite.sh under `timeout` (a device call's limit): the TERM must stop the
    running sweep at once (no job left holding the GPU) and still collect the rows so far."""
    proc = runner_suite(tmp_path, ["timeout", "3"])
    assert proc.returncode == 124, proc.stderr
    assert (tmp_path / "calls").read_text().split() == ["collect", "-", str(tmp_path / "out" / "results"),
                                                       str(tmp_path / "out" / "rows.csv")]
    pid = int((tmp_path / "job.pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def sweep_recorder(tmp_path):
    """A stand-in PYTHON for experiments/runner_suite.sh: the datasets' preflight passes, each
    sweep (-m specbench ...) appends its arguments to tmp_path/sweeps, the collect step is a no-op."""
    fake = tmp_path / "py"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$2" = "specbench.datasets" ]; then exit 0; fi\n'
        f'if [ "$1" = "-m" ]; then echo "$*" >> {tmp_path}/sweeps; exit 0; fi\n'
        "cat > /dev/null\n"
    )
    fake.chmod(0o755)
    return fake


def test_runner_suite_reruns_the_control_rates_and_sampling_batches_it_is_given(tmp_path):
    """SYN_RATES and SAMPLING_BATCHES narrow the synthetic and sampling parts to what a device
    call's limit cut: one sweep over a = 0.6 and 0.7 with quasi coins, and batch 48's two
    drafting methods per dataset."""
    fake, script = sweep_recorder(tmp_path), Path(__file__).resolve().parents[1] / "experiments" / "runner_suite.sh"
    env = {**os.environ, "PYTHON": str(fake), "PARTS": "synthetic sampling", "SYN_RATES": "0.6 0.7",
           "SAMPLING_BATCHES": "48"}
    proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    sweeps = (tmp_path / "sweeps").read_text().splitlines()
    assert len(sweeps) == 5 and "drafter.acceptance_rates=[0.6],[0.7] drafter.coins=quasi " in sweeps[0]
    assert [(s.split("dataset=")[1].split()[0], s.split("draft_sample_method=")[1].split()[0]) for s in sweeps[1:]] == [
        ("mt_bench", "greedy"), ("mt_bench", "probabilistic"), ("humaneval", "greedy"), ("humaneval", "probabilistic")]
    assert all("batch_size=48 " in s for s in sweeps[1:])


def test_runner_suite_runs_the_real_sizes_it_is_given(tmp_path):
    """REAL_SIZES narrows `real` to batch 48 alone (48 prompts): one sweep, with the drafters and
    temperatures it is given; by default batch 1 and 8 (16 prompts) come first, then 48."""
    fake, script = sweep_recorder(tmp_path), Path(__file__).resolve().parents[1] / "experiments" / "runner_suite.sh"
    sizes = []
    for real_sizes in ["48:48", None]:
        env = {**os.environ, "PYTHON": str(fake), "PARTS": "real", "DRAFTERS": "ngram,layerskip", "TEMPS": "0"}
        env.pop("REAL_SIZES", None)
        if real_sizes:
            env["REAL_SIZES"] = real_sizes
        (tmp_path / "sweeps").unlink(missing_ok=True)
        proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], env=env, capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0, proc.stderr
        sweeps = (tmp_path / "sweeps").read_text().splitlines()
        assert all("+drafter=ngram,layerskip temperature=0 " in s for s in sweeps)
        sizes.append([(s.split("batch_size=")[1].split()[0], s.split("num_prompts=")[1].split()[0]) for s in sweeps])
    assert sizes == [[("48", "48")], [("1,8", "16"), ("48", "48")]]


def test_runner_suite_profiles_the_control_and_ngram_at_batch_48(tmp_path):
    """PARTS=profiles runs experiments/round_profile.py three times, into OUT/profiles/NAME, with
    the engine arguments and the target path of the suite, keeps each one's round_profile.json as
    OUT/profiles/NAME.json (two folders deep under a device call's OUT: fetchable) and drops the
    rest, traces included."""
    fake = tmp_path / "py"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$2" = "specbench.datasets" ]; then exit 0; fi\n'
        f'case "$1" in *round_profile.py) echo "$*" >> {tmp_path}/profiles; mkdir -p "$2"; touch "$2/baseline.trace.json"; echo "{{\\"run\\": \\"$2\\"}}" > "$2/round_profile.json"; exit 0;; esac\n'
        "cat > /dev/null\n"
    )
    fake.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "experiments" / "runner_suite.sh"
    proc = subprocess.run(["bash", str(script), str(tmp_path / "out"), "/models/m.gguf"],
                          env={**os.environ, "PYTHON": str(fake), "PARTS": "profiles"}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "profiles").read_text().splitlines()
    names = ("synthetic", "ngram_mt_bench_b48", "ngram_mt_bench_t07")
    assert [c.split()[1] for c in calls] == [str(tmp_path / "out" / "profiles" / n) for n in names]
    assert "+drafter=synthetic" in calls[0] and "batch_size=48 dataset=mt_bench" in calls[1]
    assert "temperature=0.7" in calls[2]
    assert all("engine.compile=true" in c and c.endswith("target.path=/models/m.gguf") for c in calls)
    profiles = tmp_path / "out" / "profiles"
    assert sorted(p.name for p in profiles.iterdir()) == sorted(f"{n}.json" for n in names)
    assert json.loads((profiles / "synthetic.json").read_text()) == {"run": str(profiles / "synthetic")}



def test_runner_suite_first_job_runs_the_same_job_twice_a_process_under_each_warm_up(tmp_path):
    """PARTS=first_job: one sweep of two identical jobs (seed=0,1) per warm-up, full then short,
    each into results of its own, and each sweep's rows written to OUT/first_job_WARMUP.csv."""
    fake = tmp_path / "py"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$2" = "specbench.datasets" ]; then exit 0; fi\n'
        f'if [ "$1" = "-m" ]; then echo "$*" >> {tmp_path}/sweeps; exit 0; fi\n'
        f'if [ "$1" = "-" ]; then echo "$2 $3" >> {tmp_path}/tables; fi\n'
        "cat > /dev/null\n"
    )
    fake.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "experiments" / "runner_suite.sh"
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(script), str(out)], env={**os.environ, "PYTHON": str(fake), "PARTS": "first_job"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    sweeps = (tmp_path / "sweeps").read_text().splitlines()
    assert [s.split("warmup=")[1].split()[0] for s in sweeps] == ["full", "short"]
    assert all("seed=0,1 " in s and "batch_size=8 " in s for s in sweeps)
    assert [s.split("results_dir=")[1].split()[0] for s in sweeps] == [str(out / "results" / f"first_job_{w}") for w in ("full", "short")]
    assert (tmp_path / "tables").read_text().split() == [str(out / "results" / "first_job_full"), str(out / "first_job_full.csv"),
                                                         str(out / "results" / "first_job_short"), str(out / "first_job_short.csv")]


def test_round_profile_cuts_every_round_where_the_runner_clocks_it(tiny_checkpoint, tmp_path):
    """experiments/round_profile.py on the synthetic control (CPU: host operations, no kernels):
    both measured decodes are profiled, each round cut into its three phases, as many rounds as
    the job's row counts; and the control's rule and bookkeeping dispatch no more host
    operations a round than the baseline's own sampling and bookkeeping."""
    import json

    script = Path(__file__).resolve().parents[1] / "experiments" / "round_profile.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "+drafter=synthetic", "drafter.acceptance_rates=[0.7]", "k=3",
         f"target.path={tiny_checkpoint}", "target.name=tiny", "dataset.num_prompts=2", "max_new_tokens=16"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    decodes = json.loads((tmp_path / "round_profile.json").read_text())["decodes"]
    row = load_results(tmp_path / "results").iloc[0]
    assert decodes["speculative"]["rounds"] == row.rounds and decodes["baseline"]["rounds"] == 2 * 15
    for decode in decodes.values():
        assert set(decode["phases"]) == {"draft", "verify", "other"}
        assert decode["phases"]["verify"]["ops"] > 0 and decode["phases"]["verify"]["wall_ms"] > 0
    assert decodes["speculative"]["phases"]["other"]["ops"] <= decodes["baseline"]["phases"]["other"]["ops"]
    assert (tmp_path / "speculative.trace.json").exists() and "speculative  other" in done.stdout
