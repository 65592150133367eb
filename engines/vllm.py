"""engine=vllm: the run's prompts through `vllm.LLM` with the translated speculative_config
(engines/translate.py); vLLM's spec-decode counters and request timings fill the results row
(engines/serving.py). `pip install 'specbench[vllm]'`; imported only when selected.

Metrics. `LLM(..., disable_log_stats=False).get_metrics()` returns vLLM's Prometheus metrics as
objects, counters with `.name` and `.value`, vectors with `.name` and `.values`. Speculation has:

    vllm:spec_decode_num_drafts                   rounds that verified a draft
    vllm:spec_decode_num_draft_tokens             draft tokens verified
    vllm:spec_decode_num_accepted_tokens          draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos  [k] drafts whose position i was accepted

(names and shapes as in vLLM's examples/offline_inference/spec_decode.py and
vllm/v1/spec_decode/metrics.py: the write-up leaves these measurements open [待实测]; a scraped
/metrics page adds "_total", which is dropped). Counters are cumulative over the LLM's life, so the
run takes differences around the measured generate call. Each RequestOutput's `.metrics` carries
`first_token_latency` (TTFT) and the engine core's `first_token_ts` / `last_token_ts` (decode time).

specbench's terms from them:
  * rounds = new tokens - requests - accepted: every verify step emits its accepted drafts and one
    token more, and vLLM counts only the steps that had a draft (an n-gram without a match makes a
    plain step). Exact unless EOS or max_new_tokens cut a round's tokens short.
  * per position: a draft tested depth i when it accepted 0..i-1, so reached[0] = drafts and
    reached[i] = accepted_per_pos[i-1]; this assumes every draft has k tokens (warned otherwise).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from omegaconf import DictConfig

from specbench.engines.serving import WARMUP_TOKENS, Counts, EngineRun, device_and_dtype, prepare, record, row_fields
from specbench.engines.translate import VLLM_VERSION, VllmSpec, vllm_spec

log = logging.getLogger(__name__)

MODULE = "vllm"
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def translate(cfg: DictConfig) -> VllmSpec:
    return vllm_spec(cfg)


def _padded(values: list, n: int) -> list:
    """values cut or padded with zeros to length n."""
    return (list(values) + [0] * n)[:n]


def spec_counters(metrics: list) -> dict:
    """vLLM's metrics -> {"drafts", "draft_tokens", "accepted", "per_pos"} summed over engines,
    or {} when it reported none (no speculation, or stats logging off)."""
    scalar = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED: "accepted"}
    out: dict = {}
    for metric in metrics:
        name = metric.name.removesuffix("_total")
        if name in scalar:
            out[scalar[name]] = out.get(scalar[name], 0) + metric.value
        elif name == PER_POS:
            seen = out.get("per_pos", [])
            n = max(len(seen), len(metric.values))
            out["per_pos"] = [a + b for a, b in zip(_padded(seen, n), _padded(metric.values, n))]
    return out


def counts(before: dict, after: dict, tokens_per_request: list, k: Optional[int]) -> Counts:
    """Counter differences and the generated token counts -> Counts. k: None without a drafter."""
    requests, new_tokens = len(tokens_per_request), sum(tokens_per_request)
    if k is None:
        return Counts(requests, new_tokens, rounds=new_tokens - requests)
    if not all(key in after for key in ("drafts", "draft_tokens", "accepted")):
        raise RuntimeError(f"vLLM reported no spec-decode counters ({DRAFTS}, ...): is stats logging off?")
    delta = {key: int(after[key] - before.get(key, 0)) for key in ("drafts", "draft_tokens", "accepted")}
    drafts, drafted, accepted = delta["drafts"], delta["draft_tokens"], delta["accepted"]
    per_pos = [int(a - b) for a, b in zip(_padded(after.get("per_pos", []), k), _padded(before.get("per_pos", []), k))]
    if drafted != k * drafts:
        log.warning("vLLM drafted %d tokens in %d drafts (k=%d): per-position rates assume full drafts", drafted, drafts, k)
    return Counts(
        requests, new_tokens, rounds=new_tokens - requests - accepted, drafted=drafted, accepted=accepted,
        accepted_at=per_pos, reached=[drafts, *per_pos[: k - 1]],
        engine_accept_length=1 + accepted / drafts if drafts else None,
    )


def request_record(prompt_id: str, output: Any):
    """A RequestOutput -> RequestRecord (TTFT and decode time from its metrics, when present)."""
    tokens = list(output.outputs[0].token_ids)
    stats = getattr(output, "metrics", None)
    ttft = getattr(stats, "first_token_latency", None) or None
    first, last = getattr(stats, "first_token_ts", 0.0), getattr(stats, "last_token_ts", 0.0)
    decode = last - first if stats is not None and first and last else None
    return record(prompt_id, len(output.prompt_token_ids), tokens, ttft, decode)


def run(cfg: DictConfig, prompts: list) -> EngineRun:
    """Every prompt through vLLM -> the row's metric fields and per-request records."""
    vllm, spec, inputs = prepare(cfg, prompts, MODULE, VLLM_VERSION, vllm_spec, logging.INFO)
    requests = [{"prompt_token_ids": x.tolist()} for x in inputs]
    llm = vllm.LLM(model=spec.model, speculative_config=spec.speculative_config, disable_log_stats=False, **spec.engine_args)
    try:
        warm = vllm.SamplingParams(**{**spec.sampling, "max_tokens": min(WARMUP_TOKENS, cfg.max_new_tokens)})
        llm.generate(requests[: cfg.batch_size], warm, use_tqdm=False)
        before = spec_counters(llm.get_metrics())
        started = time.perf_counter()
        outputs = llm.generate(requests, vllm.SamplingParams(**spec.sampling), use_tqdm=False)
        wall_s = time.perf_counter() - started
        after = spec_counters(llm.get_metrics())
    finally:
        del llm
    records = [request_record(p.id, out) for p, out in zip(prompts, outputs)]
    k = cfg.k if cfg.drafter is not None else None
    fields = row_fields(counts(before, after, [len(r.tokens) for r in records], k), records, wall_s)
    return EngineRun({**fields, **device_and_dtype(cfg)}, records)
