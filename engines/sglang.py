"""engine=sglang: the run's prompts through `sglang.Engine` with the translated --speculative-*
arguments (engines/translate.py); SGLang's per-request meta_info fills the results row
(engines/serving.py). `pip install 'specbench[sglang]'`; imported only when selected.

With speculation on, SGLang sets max_running_requests to 48 unless it is given [怎么配置]; the
translation always gives it (the run's batch_size) and the run logs the write-up's warning.

Metrics. `Engine.generate(input_ids=[...], sampling_params={...})` returns one dict per prompt,
"output_ids" and "meta_info"; with speculation meta_info holds

    completion_tokens        tokens generated, the prefill's included
    spec_verify_ct           verify steps
    spec_accept_token_num    draft tokens accepted  (newer releases: spec_num_correct_drafts)
    spec_draft_token_num     draft tokens verified  (newer releases: spec_num_proposed_drafts)
    spec_accept_histogram    [j] verify steps that accepted j drafts
    spec_accept_length       completion_tokens / spec_verify_ct, SGLang's accept length
    decode_throughput        (completion_tokens - 1) / decode time, tokens/s

(names as SGLang's tokenizer manager and its benchmark scripts write them; the write-up leaves
these measurements open [待实测]). Where a count is missing it is derived: accepted = completion
- 1 - verify steps (each step emits its accepted drafts and one token more); drafted = verify
steps x (num_draft_tokens - 1). Without a histogram accept_pos is None. SGLang does not report a
time to first token per request: ttft_ms is None.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from omegaconf import DictConfig

from specbench.engines.serving import (
    WARMUP_TOKENS, Counts, EngineRun, device_and_dtype, positions_from_histogram, prepare, record, row_fields,
)
from specbench.engines.translate import SGLANG_VERSION, SglangSpec, sglang_spec

log = logging.getLogger(__name__)

MODULE = "sglang"
ACCEPTED_KEYS = ("spec_accept_token_num", "spec_num_correct_drafts", "spec_accepted_drafts")
DRAFTED_KEYS = ("spec_draft_token_num", "spec_num_proposed_drafts", "spec_proposed_drafts")
HISTOGRAM_KEYS = ("spec_accept_histogram", "spec_correct_drafts_histogram")


def translate(cfg: DictConfig) -> SglangSpec:
    return sglang_spec(cfg)


def _first(meta: dict, keys: tuple, default=None):
    return next((meta[key] for key in keys if meta.get(key) is not None), default)


def counts(outputs: list, k: Optional[int], num_draft_tokens: Optional[int]) -> Counts:
    """Engine.generate's outputs -> Counts. k: None without a drafter; num_draft_tokens: tokens
    verified per step, the root included (for the drafted count when SGLang does not report it)."""
    metas = [out["meta_info"] for out in outputs]
    requests, new_tokens = len(metas), sum(m["completion_tokens"] for m in metas)
    if k is None:
        return Counts(requests, new_tokens, rounds=new_tokens - requests)
    if any("spec_verify_ct" not in m for m in metas):
        raise RuntimeError("SGLang's meta_info has no spec_verify_ct: was speculation on?")
    rounds = sum(m["spec_verify_ct"] for m in metas)
    accepted = sum(_first(m, ACCEPTED_KEYS, m["completion_tokens"] - 1 - m["spec_verify_ct"]) for m in metas)
    drafted = sum(_first(m, DRAFTED_KEYS, m["spec_verify_ct"] * (num_draft_tokens - 1)) for m in metas)
    histograms = [_first(m, HISTOGRAM_KEYS) for m in metas]
    accepted_at = reached = None
    if all(h is not None for h in histograms):
        width = max(len(h) for h in histograms)
        total = [sum(h[j] for h in histograms if j < len(h)) for j in range(width)]
        accepted_at, reached = positions_from_histogram(total, k)
    return Counts(requests, new_tokens, rounds, drafted, accepted, accepted_at, reached,
                  engine_accept_length=new_tokens / rounds if rounds else None)


def request_record(prompt_id: str, prompt_tokens: int, output: dict):
    """One output -> RequestRecord: decode time from decode_throughput, no TTFT."""
    meta, tokens = output["meta_info"], output["output_ids"]
    rate = meta.get("decode_throughput")
    decode = (len(tokens) - 1) / rate if rate and len(tokens) > 1 else None
    return record(prompt_id, prompt_tokens, tokens, None, decode)


def run(cfg: DictConfig, prompts: list) -> EngineRun:
    """Every prompt through SGLang -> the row's metric fields and per-request records."""
    sglang, spec, tokens = prepare(cfg, prompts, MODULE, SGLANG_VERSION, sglang_spec, logging.WARNING)
    inputs = [x.tolist() for x in tokens]
    engine = sglang.Engine(model_path=spec.model_path, **spec.engine_args)
    try:
        warm = {**spec.sampling, "max_new_tokens": min(WARMUP_TOKENS, cfg.max_new_tokens)}
        engine.generate(input_ids=inputs[: cfg.batch_size], sampling_params=warm)
        started = time.perf_counter()
        outputs = engine.generate(input_ids=inputs, sampling_params=spec.sampling)
        wall_s = time.perf_counter() - started
    finally:
        engine.shutdown()
    records = [request_record(p.id, len(x), out) for p, x, out in zip(prompts, inputs, outputs)]
    k = cfg.k if cfg.drafter is not None else None
    fields = row_fields(counts(outputs, k, spec.engine_args.get("speculative_num_draft_tokens")), records, wall_s)
    return EngineRun({**fields, **device_and_dtype(cfg)}, records)
