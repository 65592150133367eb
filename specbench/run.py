"""One run: build target, drafter and rule -> decode every prompt -> metrics -> one results row."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import time
import traceback
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig, OmegaConf

from specbench import graphs, loggers, provenance
from specbench.config import SERVING_ENGINES, ConfigError, engine_options, proposes_trees, to_container, validate
from specbench.datasets import encode_prompts, load_prompts
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.layerskip import LayerSkipDrafter
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.ngram_trie import NgramTrieDrafter
from specbench.drafters.synthetic import SyntheticDrafter
from specbench.kvaccount import Policy, summarize_slots
from specbench.e2e import end_to_end
from specbench.metrics import RoundClock, SpecStats, summarize, tpot_ms
from specbench.models import check_path, checkpoint_dir, load_target
from specbench.results import COLUMNS, atomic_write, config_hash, finished_rows, new_run_id, read_json, write_run
from specbench.rules import resolve_impl
from specbench.runner import Speculation, decode_requests
from specbench.sampled import Sampler
from specbench.sampling import SamplingParams

log = logging.getLogger(__name__)

DRAFTERS = {
    "ngram": NgramDrafter.from_config,
    "ngram_trie": NgramTrieDrafter.from_config,
    "draft_model": DraftModelDrafter.from_config,
    "layerskip": LayerSkipDrafter.from_config,
    "eagle": EagleDrafter.from_config,
    "eagle3": EagleDrafter.from_config,
    "synthetic": SyntheticDrafter.from_config,
}
MODEL_FREE = ("ngram", "ngram_trie")  # drafters without a model: no draft KV, no lookahead slots
WARMUP_TOKENS = 8
# The drafter's generator is seeded with seed ^ DRAFTER_SEED, the runner's (acceptance coins,
# residual and bonus draws) with seed: two generators seeded alike on one device give the same
# stream, and a draft drawn from the numbers that then decide its acceptance breaks the rules'
# independence (the losslessness argument needs the coin independent of the draft).
DRAFTER_SEED = 0x5EED_D8AF


def build_drafter(cfg: DictConfig, params: SamplingParams, seed: int):
    """The drafter, its parameters checked; model weights load later, in `attach`. seed: the
    run's; the drafter draws from a stream of its own (DRAFTER_SEED)."""
    if cfg.name not in DRAFTERS:
        raise ConfigError("drafter", cfg.name, f"valid drafters: {', '.join(DRAFTERS)}")
    if cfg.name in MODEL_FREE:
        return DRAFTERS[cfg.name](cfg)
    return DRAFTERS[cfg.name](cfg, params=params, seed=seed ^ DRAFTER_SEED)


def tree_shape(cfg: DictConfig) -> tuple[int, Optional[int]]:
    """(topk, num_draft_tokens) of the run: a chain of k without a tree config."""
    if cfg.get("tree") is None:
        return 1, None
    return cfg.tree.topk, cfg.tree.num_draft_tokens


def kv_policy(cfg: DictConfig) -> Optional[Policy]:
    if cfg.drafter is None:
        return None
    topk, tokens = tree_shape(cfg)
    lookahead = 0 if cfg.drafter.name in MODEL_FREE else cfg.k
    return Policy(k=cfg.k, topk=topk, num_draft_tokens=tokens, lookahead=lookahead)


def check_vocab(cfg: DictConfig, drafter) -> None:
    """A drafter with a vocabulary of its own (a draft model) must share the target's: the rules
    compare p and q token by token. Read from the target's config, before its weights load."""
    draft_vocab = getattr(drafter, "vocab_size", None)
    if draft_vocab is None:
        return  # model-free drafters (n-gram) propose the target's own token ids
    from transformers import AutoConfig

    target_vocab = AutoConfig.from_pretrained(checkpoint_dir(cfg.target)).vocab_size
    if draft_vocab != target_vocab:
        raise ConfigError("drafter.vocab_size", draft_vocab, f"differs from the target's vocabulary ({target_vocab})")


def rule_of(cfg: DictConfig) -> tuple[str, dict]:
    """The rule name and its parameters; a drafter without a rule uses standard."""
    if cfg.rule is None:
        return "standard", {}
    params = {key: cfg.rule[key] for key in ("threshold_single", "threshold_acc") if key in cfg.rule}
    return cfg.rule.name, params


def eos_ids(tokenizer, model) -> frozenset:
    ids = {tokenizer.eos_token_id, *([model.generation_config.eos_token_id] if model.generation_config else [])}
    flat = set()
    for i in ids:
        flat.update(i if isinstance(i, (list, tuple)) else [i])
    return frozenset(i for i in flat if i is not None)


def make_sampler(engine, params: SamplingParams) -> Sampler:
    """An engine's sampled draws (specbench.sampled): one generator for all its decodes, seeded
    afresh in each, and CUDA graphs where the engine replays its own forwards."""
    return Sampler(params, torch.Generator(engine.device), graphs=getattr(engine, "cuda_graphs", False))


def decode_all(engine, inputs, prompts, *, cfg, params, eos, sampler, spec, desc) -> tuple[list, SpecStats, RoundClock]:
    """Every prompt through the engine, engine.rows at a time, the sampler's generator seeded by cfg.seed."""
    stats, clock = SpecStats(spec.k if spec else 0), RoundClock()
    log.info("%s: %d requests, %d at a time", desc, len(inputs), engine.rows)
    records = decode_requests(
        engine, inputs, params=params, max_new_tokens=cfg.max_new_tokens, eos_ids=eos,
        generator=sampler.generator.manual_seed(cfg.seed), sampler=sampler, spec=spec, stats=stats, clock=clock,
        prompt_ids=[p.id for p in prompts],
    )
    return records, stats, clock


def warm_up(engine, inputs, prompts, kw: dict, spec) -> None:
    """An untimed decode before the measured one: first-call allocations, module loads, kernel
    selection, compilation and CUDA-graph capture of every shape the measured decode uses.
    cfg.warmup "full": every prompt, as the measured decode (its prefills of each length and
    group, its verify and drafter shapes); "short": the first engine.rows prompts for
    WARMUP_TOKENS tokens, every row busy (every forward shape, not every prefill)."""
    cfg = kw["cfg"]
    if cfg.warmup == "full":
        decode_all(engine, inputs, prompts, **kw, spec=spec, desc="warm-up")
    else:
        warm = OmegaConf.merge(cfg, {"max_new_tokens": min(WARMUP_TOKENS, cfg.max_new_tokens)})
        decode_all(engine, inputs[: engine.rows], prompts[: engine.rows], **{**kw, "cfg": warm}, spec=spec,
                   desc="warm-up")


@contextlib.contextmanager
def timed_region():
    """Around a measured decode -> a dict that gets graph_captures: the CUDA graphs captured
    inside (a shape the warm-up did not meet; each a stall no steady round has, so a row with
    any is flagged, not trusted). Before it, cyclic garbage is collected (an earlier job's
    engines and graphs: freeing them mid-decode would stall it) and the heap is frozen, so that
    a collection the decode triggers scans only what the decode made, not the whole process.
    After it the whole heap is unfrozen, objects frozen before it too (gc has no partial
    unfreeze; the GPU host's Python starts with 375 frozen): they rejoin the collected heap."""
    gc.collect()
    gc.freeze()
    counted, start = {}, graphs.captures()
    try:
        yield counted
    finally:
        gc.unfreeze()
        counted["graph_captures"] = graphs.captures() - start


@dataclasses.dataclass
class Timed:
    """The measured decodes of one engine: the run whose TPOT is the median of cfg.repeats."""

    records: list
    stats: SpecStats
    clock: RoundClock
    graph_captures: int  # over every repeat: a capture in any of them flags the row
    tpot_runs_ms: list  # each repeat's TPOT, in the order they ran


def afresh(spec: Speculation) -> Speculation:
    """spec, its drafter as it was before the warm-up drafted (drafters/base.py: restart); its
    weights and graphs are kept."""
    restart = getattr(spec.drafter, "restart", None)
    if restart is not None:
        restart()
    return spec


def timed_decodes(engine, inputs, prompts, kw: dict, spec_of, desc: str) -> Timed:
    """cfg.repeats measured decodes, each in a timed_region -> the median-TPOT one.

    One decode of a batch of 48 is about 0.1 s on a GPU, and every request of it is in flight at
    once: a stall of 45 ms (a host hiccup) lifts every request's TPOT, so the median over
    requests does not filter it. A batch-48 baseline once read 2.96 ms where the same baseline
    in another process read 1.98 (results/2026-12-07-h100-b48), and the one baseline is every
    drafter's denominator. The repeats are the same computation (the runner's generator is
    seeded afresh in each, and spec_of() gives each its drafter afresh): the whole row comes
    from one run, so its costs and TPOT stay consistent for the cost model.
    spec_of: () -> Speculation or None."""
    cfg, runs, captures = kw["cfg"], [], 0
    for _ in range(cfg.repeats):
        with timed_region() as counted:
            runs.append(decode_all(engine, inputs, prompts, **kw, spec=spec_of(), desc=desc))
        captures += counted["graph_captures"]
    tpots = [tpot_ms(records) for records, _, _ in runs]
    order = sorted(range(len(runs)), key=lambda i: (tpots[i] is None, tpots[i]))
    records, stats, clock = runs[order[(len(runs) - 1) // 2]]
    return Timed(records, stats, clock, captures, tpots)


def build_engine(cfg: DictConfig, model, inputs: list, feature_layers: tuple, speculative: bool = True):
    """The target's engine, sized for the run: batch_size rows of the longest request (and, for a
    speculative run, room for its verify inputs)."""
    if cfg.engine.name == "hf":
        from specbench.engines.hf import HFEngine

        return HFEngine(model, cfg.batch_size, feature_layers=feature_layers)
    from specbench.engines.native import NativeEngine, Transformer

    topk, tokens = tree_shape(cfg)
    q = 1 + max(cfg.k * topk, tokens or 0) if speculative and cfg.drafter is not None else 1
    longest = max(x.shape[0] for x in inputs)
    try:  # a model the native engine does not run (its family, RoPE, a sliding window the run would pass)
        return NativeEngine(
            Transformer.from_hf(model), cfg.batch_size, longest + cfg.max_new_tokens + q + 1,
            feature_layers=feature_layers, cuda_graphs=cfg.engine.cuda_graphs, compile=cfg.engine.compile,
            compile_mode=cfg.engine.compile_mode, compile_scope=cfg.engine.compile_scope,
            compile_dynamic=cfg.engine.compile_dynamic, kernels=cfg.engine.kernels,
            compile_prefill=cfg.engine.compile_prefill,
        )
    except ValueError as e:
        raise ConfigError("engine", cfg.engine.name, str(e)) from None


def baseline_path(cfg: DictConfig, device: str, dtype: torch.dtype, num_prompts: int, code: str | None) -> Path:
    """Baselines are shared by every run with the same target, prompts, length, sampling, batch
    size, engine (its settings too), warm-up, device and code (git SHA): a baseline's timing is
    the code's, and a results folder that outlives a commit must not compare new runs with it."""
    sampling = [cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed] if cfg.temperature > 0 else [0.0]
    key = {
        "target": [cfg.target.path, cfg.target.sha256, str(dtype)],
        "dataset": [cfg.dataset.source, cfg.dataset.format, num_prompts],
        "max_new_tokens": cfg.max_new_tokens, "sampling": sampling, "device": device,
        "batch_size": cfg.batch_size, "engine": cfg.engine.name, "engine_options": engine_options(cfg.engine),
        "warmup": cfg.warmup, "repeats": cfg.repeats, "code": code,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.results_dir) / "baselines" / f"{cfg.target.name}-{cfg.dataset.name}-{digest}.json"


def _base_row(cfg: DictConfig, run_id: str, chash: str, git_sha: str | None) -> dict:
    speculative = cfg.drafter is not None
    rule, rule_params = rule_of(cfg) if speculative else (None, {})
    row = dict.fromkeys(COLUMNS)
    row.update(
        run_id=run_id, task="decode", target=cfg.target.name,
        drafter=cfg.drafter.name if speculative else None, rule=rule, k=cfg.k if speculative else None,
        topk=tree_shape(cfg)[0] if speculative else None, num_draft_tokens=tree_shape(cfg)[1] if speculative else None,
        temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, batch_size=cfg.batch_size, warmup=cfg.warmup,
        repeats=cfg.repeats,
        dataset=cfg.dataset.name, git_sha=git_sha, config_hash=chash,
        max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, target_path=cfg.target.path,
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"), hydra_dir=_hydra_dir(), **rule_params,
        engine=cfg.engine.name, engine_options=engine_options(cfg.engine),
        draft_sample_method=cfg.drafter.get("draft_sample_method") if speculative else None,
        synthetic_rate=_synthetic_rate(cfg),
        synthetic_coins=cfg.drafter.get("coins") if speculative and cfg.drafter.name == "synthetic" else None,
        **provenance.versions(),
    )
    return row


def _synthetic_rate(cfg: DictConfig) -> Optional[float]:
    """The synthetic control's per-position acceptance, when it is one number."""
    rates = cfg.drafter.get("acceptance_rates") if cfg.drafter is not None and cfg.drafter.name == "synthetic" else None
    return rates[0] if rates is not None and len(rates) == 1 else None


def _hydra_dir() -> Optional[str]:
    """This job's Hydra output directory: how a sweep finds its own rows, whatever the launcher."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None


def run(cfg: DictConfig, row: dict) -> tuple[list, list]:
    """The decode task: fill `row` with the run's results -> ([row], per-request records).
    Raises ConfigError on bad input before any model work."""
    started = time.perf_counter()
    _release_memory()  # what an earlier job of the sweep left must not count in this one's peak
    held = _allocated()  # what it could not free (compiled graphs' pools, caches) is subtracted from the peak
    validate(cfg)
    if cfg.engine.name in SERVING_ENGINES:  # vLLM / SGLang decode the prompts themselves
        from specbench.engines.serving import run_on_engine

        return run_on_engine(cfg, row)
    check_path(cfg.target)
    prompts = load_prompts(cfg.dataset)
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    drafter = build_drafter(cfg.drafter, params, cfg.seed) if cfg.drafter is not None else None
    check_vocab(cfg, drafter)
    rule, rule_params = rule_of(cfg)

    model, tokenizer = load_target(cfg.target)
    inputs = encode_prompts(prompts, tokenizer)
    topk, num_draft_tokens = tree_shape(cfg)
    if hasattr(drafter, "attach"):  # model drafters: their batched chains' cache sized like the target's
        longest = max(x.shape[0] for x in inputs)
        ahead = max(cfg.k, (cfg.k - 1) * topk + 1)  # a chain's k - 1 drafts, a tree's k - 1 frontiers
        drafter.attach(model, rows=cfg.batch_size, max_length=longest + cfg.max_new_tokens + ahead + 2,
                       cuda_graphs=cfg.engine.cuda_graphs, compile=cfg.engine.name == "native" and cfg.engine.compile)
    device = provenance.device_name(next(model.parameters()).device)
    eos = eos_ids(tokenizer, model)
    impl = resolve_impl(cfg.rule.impl if cfg.rule is not None else "auto", next(model.parameters()).device, rule,
                        proposes_trees(cfg))
    spec = Speculation(drafter, rule, cfg.k, rule_params, topk, num_draft_tokens, impl) if drafter is not None else None
    # what verified the sampled rounds (greedy rounds walk the argmaxes on the host; the control dictates)
    row["rule_impl"] = impl if spec is not None and not params.greedy and not hasattr(drafter, "forced_acceptance") else None
    row["drafter_impl"] = getattr(drafter, "impl", None)  # what drafted (ngram: torch / triton; ngram_trie: python / native)
    kw = dict(cfg=cfg, params=params, eos=eos)

    base_file = baseline_path(cfg, device, next(model.parameters()).dtype, len(prompts), row["git_sha"])
    baseline = read_json(base_file) if base_file.exists() else None
    records = None
    if baseline is None or spec is None:
        # The baseline runs on an engine of its own: one token a step, no target features kept
        # for a drafter, so that its timings are the target's alone, whichever run caches it.
        engine = build_engine(cfg, model, inputs, (), speculative=False)
        kw["sampler"] = make_sampler(engine, params)
        warm_up(engine, inputs, prompts, kw, None)
        _reset_peak_memory(engine.device)
        timed = timed_decodes(engine, inputs, prompts, kw, lambda: None, "baseline")
        if baseline is None:
            base_summary = summarize(timed.records, SpecStats(0), wall_s=0.0, clock=timed.clock)
            baseline = {"tokens": [r.tokens for r in timed.records], "device": device, "git_sha": row["git_sha"],
                        "run_id": row["run_id"], "graph_captures": timed.graph_captures,
                        "tpot_runs_ms": timed.tpot_runs_ms,
                        **{key: base_summary[key] for key in ("tpot_ms", "throughput_tok_s", "verify_ms")}}
            atomic_write(base_file, json.dumps(baseline) + "\n")
        if spec is None:  # the baseline run is this computation: report it, do not decode twice
            records = timed.records
        else:
            del engine, kw["sampler"]  # the sampler: its graphs
            _release_memory()  # the baseline's engine must not count in the speculative run's peak
    if records is None:
        engine = build_engine(cfg, model, inputs, tuple(getattr(drafter, "feature_layers", ())))
        kw["sampler"] = make_sampler(engine, params)
        warm_up(engine, inputs, prompts, kw, spec)
        _reset_peak_memory(engine.device)
        timed = timed_decodes(engine, inputs, prompts, kw, lambda: afresh(spec), row["run_id"])
        records = timed.records

    row.update(summarize(records, timed.stats, wall_s=time.perf_counter() - started, clock=timed.clock))
    row.update(summarize_slots(records, kv_policy(cfg)))
    divergence = [first_difference(r.tokens, ref) for r, ref in zip(records, baseline["tokens"])]
    # The synthetic control dictates acceptance: its text is not the target's by design.
    compared = spec is not None and params.greedy and not hasattr(drafter, "forced_acceptance")
    # A run without a drafter is a baseline: its speedup is 1. Where the baseline came from the
    # cache, baseline_tpot_ms / tpot_ms is the drift between the two runs, not a speedup.
    speedup = None
    if baseline["tpot_ms"] and row["tpot_ms"]:
        speedup = 1.0 if spec is None else baseline["tpot_ms"] / row["tpot_ms"]
    row.update(
        num_prompts=len(prompts), device=device, dtype=str(next(model.parameters()).dtype), baseline=str(base_file.name),
        greedy_mismatches=sum(d is not None for d in divergence) if compared else None,
        first_divergence=divergence if compared else None,
        speedup=speedup,
        baseline_tpot_ms=baseline["tpot_ms"], baseline_throughput_tok_s=baseline.get("throughput_tok_s"),
        baseline_step_ms=baseline.get("verify_ms"), graph_captures=timed.graph_captures,
        baseline_graph_captures=baseline.get("graph_captures"), tpot_runs_ms=timed.tpot_runs_ms,
        baseline_tpot_runs_ms=baseline.get("tpot_runs_ms"),
        kv_bytes_per_token=getattr(engine, "kv_bytes_per_token", None), peak_memory_gb=_peak_memory_gb(engine.device, held),
        status="ok",
    )
    if cfg.distcheck:
        row.update(end_to_end(
            model, engine, inputs[: cfg.distcheck_prompts], params=params, eos_ids=eos, spec=spec,
            samples=cfg.distcheck_samples, length=cfg.distcheck_length, seed=cfg.seed,
        ))
    return [row], records


def first_difference(tokens: list, reference: list):
    """Index of the first generated token that differs from the reference, None if equal."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def run_and_record(cfg: DictConfig, task=None) -> list:
    """Run a task, and write its rows whatever happens: a failure is one row with status
    "failed" and the error. task(cfg, row) -> (rows, records); default: a decode run.

    With resume (the default) a config whose rows already ended "ok" in results_dir, at the
    same git SHA, is not run again: its earlier rows are returned."""
    config = to_container(cfg)
    chash, sha = config_hash(config), provenance.git_sha()  # the SHA once: two git processes
    if cfg.resume and (done := finished_rows(cfg.results_dir, chash, sha)):
        log.info("skip: config %s already has ok rows (run %s); resume=false reruns it", chash, done[0]["run_id"])
        return done
    row = _base_row(cfg, new_run_id(chash), chash, sha)
    rows, records = [row], []
    try:
        loggers.check(cfg)
        rows, records = (task or run)(cfg, row)
    except ConfigError as e:
        row.update(status="failed", error=str(e))
    except KeyboardInterrupt:  # an interrupted job is recorded before the interrupt goes on
        row.update(status="failed", error="KeyboardInterrupt: interrupted")
        write_run(cfg.results_dir, row["run_id"], [row], OmegaConf.to_yaml(cfg), [])
        raise
    except Exception as e:  # recorded, not swallowed: the caller decides the exit status
        log.error("run %s failed:\n%s", row["run_id"], traceback.format_exc())
        row.update(status="failed", error=f"{type(e).__name__}: {e}".splitlines()[0])
        _release_memory()
    write_run(cfg.results_dir, row["run_id"], rows, OmegaConf.to_yaml(cfg), records)
    if rows[0]["status"] == "ok":
        loggers.log_rows(cfg, rows)
    return rows


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _allocated() -> int:
    """Bytes the process has allocated on its CUDA device (0 without one)."""
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def _peak_memory_gb(device: torch.device, held: int = 0) -> Optional[float]:
    """Peak GPU memory allocated during the measured decode (weights and caches included), less
    `held`: what the process held before the job began. In a sweep that is an earlier job's
    leftovers, which peaked the same configuration 0.37 to 0.64 GB higher than a process of its
    own did (results/2026-12-05-h100-evening)."""
    return (torch.cuda.max_memory_allocated(device) - held) / 1e9 if device.type == "cuda" else None


def _release_memory() -> None:
    """After a failure (CUDA out of memory, say), let the next job of the sweep start clean."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
