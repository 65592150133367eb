"""A specbench config in vLLM's and SGLang's terms: pure functions, no engine imported.

The reference write-up (../shared/seed/, pinned to vLLM v0.32.0 and SGLang v0.5.22; its section
titles are cited in brackets below) documents how each engine names and configures a method.

    drafter        vLLM speculative_config.method          SGLang speculative_algorithm
    ngram          "ngram_gpu", prompt_lookup_min/max      refused: SGLang's NGRAM is the trie (ngram_trie)
    ngram_trie     refused: vLLM's n-gram is per request   NGRAM, speculative_ngram_* from the drafter
    draft_model    "draft_model", model = drafter.path     STANDALONE, speculative_draft_model_path
    eagle, eagle3  "eagle" / "eagle3", model = the head    EAGLE / EAGLE3, speculative_draft_model_path
    (mtp)          "mtp" (the target's own heads)          NEXTN        (specbench has no MTP drafter yet)
    layerskip      refused: no self-speculation method     refused
    synthetic      refused: specbench's timing control     refused

    rule           vLLM                                    SGLang
    standard       draft_sample_method = the drafter's     greedy / model-free drafts (q a point mass):
                   ("greedy": q one-hot, "probabilistic":  the default TargetOnly kernel, the same rule;
                   q kept for the ratio test)              probabilistic drafts: --speculative-use-
                                                           rejection-sampling (EAGLE / EAGLE3 chains)
    onehot         draft_sample_method "greedy"            the default kernel (the same rule)
    target_only    refused (SGLang's rule)                 the default kernel
    thresholded    refused (SGLang's thresholds)           speculative_accept_threshold_single / _acc

    tree           vLLM                                    SGLang
    none / chain   num_speculative_tokens = k              num_steps = k, eagle_topk = 1, num_draft_tokens = k + 1
    topk > 1       refused: vLLM verifies chains           num_steps = k, eagle_topk, num_draft_tokens

Why the rules map as they do [接受规则为什么不改变分布]: vLLM's default drafts the argmax and
treats q as one-hot [默认路径：草稿当 one-hot], which is specbench's standard rule with a point-mass
q and its onehot rule alike; "probabilistic" samples the draft and keeps q, which is standard with
a real q. SGLang's default [SGLang 默认：只看目标概率] throws one coin per level against the
cumulative target mass of the candidates: candidate j is accepted with probability p(c_j), and a
miss resamples p with the candidates zeroed. The one-hot rule on deterministic candidates (tried in
turn by recursive rejection sampling) accepts c_j with p(c_j) too, so the two are the same rule;
the write-up says so for topk = 1. Thresholds below 1 exist only in SGLang; vLLM has neither them
nor a rule named target_only, so those are refused (on a chain target_only is onehot's rule).
SGLang samples drafts only with rejection sampling on [采样：标准拒绝采样], so a probabilistic
drafter needs the standard rule there.

Not in the write-up (read from the engines' sources, stated so a reviewer can check them against
the pinned versions): vLLM's prompt_lookup_min / prompt_lookup_max apply to "ngram_gpu" as to
"ngram"; SGLang's NGRAM arguments are speculative_ngram_{min,max}_match_window_size,
speculative_ngram_{min,max}_bfs_breadth, speculative_ngram_capacity and
speculative_ngram_branch_length (= ngram_trie.max_trie_depth), and SGLang sets eagle_topk to
max_bfs_breadth itself for NGRAM; SGLang resets num_draft_tokens to num_steps + 1 when topk = 1;
--speculative-use-rejection-sampling is accepted for EAGLE / EAGLE3 / NEXTN chains only; the
engine keyword arguments are the CLI flags with underscores (tp_size, random_seed,
max_running_requests; vLLM's max_num_seqs, tensor_parallel_size, seed).

Concurrency: the run's batch_size (requests decoded at once) becomes vLLM's max_num_seqs and
SGLang's max_running_requests, so an engine row is the same experiment as a native one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from specbench.config import ConfigError

VLLM_VERSION = "0.32.0"  # the versions the write-up and this mapping are pinned to
SGLANG_VERSION = "0.5.22"

# "ngram_gpu", not "ngram": the V2 runner runs both with the same GPU code, but "ngram" turns
# async scheduling off, which would make its timings unlike the other methods' [怎么配置].
VLLM_METHODS = {"ngram": "ngram_gpu", "draft_model": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp"}
SGLANG_ALGORITHMS = {"ngram_trie": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"}
WITH_WEIGHTS = ("draft_model", "eagle", "eagle3")  # drafters whose checkpoint the engine loads
SGLANG_REJECTION_SAMPLING = ("EAGLE", "EAGLE3", "NEXTN")

_NO_SELF_SPECULATION = "has no self-speculation (early-exit) method [两边支持哪些方法]"
_CONTROL = "specbench's timing control (acceptance dictated), not a drafting method: neither engine runs it"
REFUSED_DRAFTERS = {
    "vllm": {
        "ngram_trie": "vLLM's n-gram drafts a chain from the request's own history, not from a trie shared "
                      "by all requests [n-gram：不用模型]; use +drafter=ngram",
        "layerskip": f"vLLM v{VLLM_VERSION} {_NO_SELF_SPECULATION}",
        "synthetic": _CONTROL,
    },
    "sglang": {
        "ngram": "SGLang's NGRAM is the trie shared by all requests, not per-request prompt lookup "
                 "[n-gram：不用模型]; use +drafter=ngram_trie",
        "layerskip": f"SGLang v{SGLANG_VERSION} {_NO_SELF_SPECULATION}",
        "synthetic": _CONTROL,
    },
}


@dataclass(frozen=True)
class VllmSpec:
    """What `vllm.LLM(model, **engine_args, speculative_config=...)` and `SamplingParams(**sampling)`
    take; `vllm serve` takes the same engine arguments as flags."""

    model: str
    engine_args: dict  # seed, max_num_seqs, tensor_parallel_size, dtype (when not auto), engine.args
    speculative_config: Optional[dict]  # None: no speculation (the baseline)
    sampling: dict  # SamplingParams keyword arguments
    notes: tuple = ()  # what a reader of the row should know (one line each)


@dataclass(frozen=True)
class SglangSpec:
    """What `sglang.Engine(model_path=..., **engine_args)` and `Engine.generate(sampling_params=...)`
    take; `python -m sglang.launch_server` takes the same arguments as flags."""

    model_path: str
    engine_args: dict  # random_seed, max_running_requests, tp_size, dtype, speculative_*, engine.args
    sampling: dict  # the sampling_params dict
    notes: tuple = ()


def as_dictconfig(cfg: Any) -> DictConfig:
    """A composed DictConfig as it is; a SpecBenchConfig dataclass made into one."""
    return cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)


def tree_shape(cfg: DictConfig) -> tuple[int, Optional[int]]:
    """(topk, num_draft_tokens); a chain of k without a tree config."""
    tree = cfg.get("tree")
    return (1, None) if tree is None else (tree.topk, tree.num_draft_tokens)


def rule_name(cfg: DictConfig) -> str:
    return cfg.rule.name if cfg.rule is not None else "standard"  # a drafter without a rule: standard


def _check_drafter(cfg: DictConfig, engine: str) -> None:
    name = cfg.drafter.name
    if name in REFUSED_DRAFTERS[engine]:
        raise ConfigError("drafter", name, REFUSED_DRAFTERS[engine][name])
    known = VLLM_METHODS if engine == "vllm" else SGLANG_ALGORITHMS
    if name not in known:
        raise ConfigError("drafter", name, f"no {engine} equivalent known")


def _check_chain_budget(cfg: DictConfig, engine: str) -> None:
    """A chain verifies k + 1 tokens in both engines; fewer with topk = 1 is a shorter chain."""
    topk, tokens = tree_shape(cfg)
    if topk == 1 and tokens is not None and tokens != cfg.k + 1:
        why = "vLLM drafts num_speculative_tokens = k" if engine == "vllm" else "SGLang resets num_draft_tokens to num_steps + 1 when topk = 1"
        raise ConfigError("tree.num_draft_tokens", tokens, f"{why}; set k = {tokens - 1} instead")


def _checkpoint(cfg: DictConfig, draft_path: Optional[str]) -> Optional[str]:
    if cfg.drafter.name not in WITH_WEIGHTS:
        return None
    return draft_path or cfg.drafter.path


def _options(cfg: DictConfig) -> dict:
    """engine.args, passed through to the engine as they are (and printed as flags)."""
    extra = cfg.engine.get("args")
    return dict(OmegaConf.to_container(extra, resolve=True)) if extra else {}


def vllm_spec(cfg: Any, *, target_path: Optional[str] = None, draft_path: Optional[str] = None) -> VllmSpec:
    """The config in vLLM's terms. target_path / draft_path: where the engine finds the weights
    (default: target.path and drafter.path as written). Raises ConfigError for what vLLM cannot
    express, one line naming the key, the value and why."""
    cfg = as_dictconfig(cfg)
    engine_args: dict = {"seed": cfg.seed, "max_num_seqs": cfg.batch_size,
                         "tensor_parallel_size": cfg.engine.get("tensor_parallel_size", 1)}
    if cfg.target.get("dtype", "auto") != "auto":
        engine_args["dtype"] = cfg.target.dtype
    engine_args.update(_options(cfg))
    sampling: dict = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_new_tokens, "seed": cfg.seed}
    if cfg.top_k > 0:
        sampling["top_k"] = cfg.top_k
    model = target_path or cfg.target.path
    if cfg.drafter is None:
        return VllmSpec(model, engine_args, None, sampling)

    _check_drafter(cfg, "vllm")
    rule, method = rule_name(cfg), cfg.drafter.get("draft_sample_method")
    if rule in ("target_only", "thresholded"):
        why = ("vLLM has no target-only rule (SGLang's); on a chain it accepts with p(x) as +rule=onehot does "
               "[SGLang 默认：只看目标概率]" if rule == "target_only" else
               "vLLM has no acceptance thresholds (SGLang's threshold_single / threshold_acc)")
        raise ConfigError("rule", rule, why)
    topk, _ = tree_shape(cfg)
    if topk > 1:
        raise ConfigError("tree.topk", topk, "vLLM verifies chains only; a tree (topk > 1) is SGLang's [怎么配置]")
    _check_chain_budget(cfg, "vllm")
    if rule == "onehot" and method == "probabilistic":
        raise ConfigError("drafter.draft_sample_method", method, "vLLM keeps a sampled draft's q for the ratio test "
                          "(the standard rule); sampled drafts under the one-hot rule are not expressible")

    spec: dict = {"method": VLLM_METHODS[cfg.drafter.name], "num_speculative_tokens": cfg.k}
    if (path := _checkpoint(cfg, draft_path)) is not None:
        spec["model"] = path
    if cfg.drafter.name == "ngram":
        spec.update(prompt_lookup_min=cfg.drafter.min_n, prompt_lookup_max=cfg.drafter.max_n)
    if method is not None:  # model drafters; n-gram drafts have no distribution (greedy, vLLM's default)
        spec["draft_sample_method"] = method
    notes = ("method ngram_gpu, not ngram: the same GPU code under the V2 runner, without turning async "
             "scheduling off [怎么配置]",) if cfg.drafter.name == "ngram" else ()
    return VllmSpec(model, engine_args, spec, sampling, notes)


def sglang_spec(cfg: Any, *, target_path: Optional[str] = None, draft_path: Optional[str] = None) -> SglangSpec:
    """The config in SGLang's terms (same arguments and errors as vllm_spec)."""
    cfg = as_dictconfig(cfg)
    engine_args: dict = {"random_seed": cfg.seed, "max_running_requests": cfg.batch_size,
                         "tp_size": cfg.engine.get("tensor_parallel_size", 1)}
    if cfg.target.get("dtype", "auto") != "auto":
        engine_args["dtype"] = cfg.target.dtype
    sampling: dict = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens}
    if cfg.top_k > 0:
        sampling["top_k"] = cfg.top_k
    model = target_path or cfg.target.path
    if cfg.drafter is None:
        engine_args.update(_options(cfg))
        return SglangSpec(model, engine_args, sampling)

    _check_drafter(cfg, "sglang")
    rule, method, name = rule_name(cfg), cfg.drafter.get("draft_sample_method"), cfg.drafter.name
    algorithm = SGLANG_ALGORITHMS[name]
    notes = [f"SGLang sets max_running_requests to 48 when speculation is on and none is set [怎么配置]; "
             f"this run sets it to batch_size={cfg.batch_size}: keep --max-running-requests when serving"]
    rejection_sampling = rule == "standard" and method == "probabilistic"
    if method == "probabilistic" and not rejection_sampling:
        raise ConfigError("drafter.draft_sample_method", method, f"SGLang samples drafts only under rejection sampling "
                          f"(+rule=standard); with rule={rule} it drafts the top-k deterministically")
    if rejection_sampling and algorithm not in SGLANG_REJECTION_SAMPLING:
        raise ConfigError("drafter", name, f"SGLang's rejection sampling takes {', '.join(SGLANG_REJECTION_SAMPLING)} "
                          "only (its server-argument check); use greedy drafts")
    topk, tokens = tree_shape(cfg)
    if name != "ngram_trie":  # NGRAM's tree is shaped by its BFS breadth and the token budget
        _check_chain_budget(cfg, "sglang")

    spec: dict = {"speculative_algorithm": algorithm, "speculative_num_steps": cfg.k}
    if (path := _checkpoint(cfg, draft_path)) is not None:
        spec["speculative_draft_model_path"] = path
    if name == "ngram_trie":
        d = cfg.drafter
        spec.update(
            speculative_num_draft_tokens=tokens or cfg.k * topk + 1,  # ngram_trie's own budget
            speculative_ngram_min_match_window_size=d.min_match_window,
            speculative_ngram_max_match_window_size=d.max_match_window,
            speculative_ngram_min_bfs_breadth=d.min_bfs_breadth,
            speculative_ngram_max_bfs_breadth=d.max_bfs_breadth,
            speculative_ngram_branch_length=d.max_trie_depth,
            speculative_ngram_capacity=d.capacity,
        )
        notes.append("NGRAM: SGLang sets speculative_eagle_topk to max_bfs_breadth itself")
    else:
        spec.update(speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens or cfg.k * topk + 1)
    if rule == "thresholded":
        spec.update(speculative_accept_threshold_single=cfg.rule.threshold_single,
                    speculative_accept_threshold_acc=cfg.rule.threshold_acc)
    if rejection_sampling:
        spec["speculative_use_rejection_sampling"] = True
    elif rule in ("standard", "onehot"):
        notes.append(f"rule {rule} with drafts as point masses runs as SGLang's default TargetOnly kernel: "
                     "the same acceptance, p(candidate) [SGLang 默认：只看目标概率]")
    engine_args.update(spec)
    engine_args.update(_options(cfg))
    return SglangSpec(model, engine_args, sampling, tuple(notes))


def spec_dict(spec) -> dict:
    """A spec as plain data (the golden table, the command printer)."""
    return {key: value for key, value in dataclasses.asdict(spec).items() if key != "notes"}
