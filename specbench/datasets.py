"""Prompt sets: read the raw benchmark file named by a DatasetConfig, and encode the prompts.

Each format keeps the upstream file as it ships (see conf/dataset/), so nothing is converted
or re-uploaded; the reader for a format knows where its instruction text lives:

    mt_bench     question.jsonl, one question per line; the first of its two "turns"
    humaneval    HumanEval.jsonl.gz, one problem per line; "prompt" is a Python stub, which
                 is wrapped in an instruction so chat models are asked to complete it
    alpaca_eval  outputs.json, a JSON list of records; "instruction"

Letters: T tokens.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specbench.config import ConfigError, DatasetConfig
from specbench.fetch import fetch


@dataclass(frozen=True)
class Prompt:
    id: str  # stable within its set: "81" (MT-Bench question_id), "HumanEval/0", "0" (AlpacaEval index)
    text: str  # the user-facing instruction, before any chat template


def _read_text(path: Path) -> str:
    # Sniff gzip by its magic bytes rather than the suffix, so an unpacked copy reads the same.
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """One record per non-blank line."""
    return [json.loads(line) for line in _read_text(path).splitlines() if line.strip()]


def _mt_bench(path: Path) -> list[Prompt]:
    # Each line: {"question_id": 81, "category": ..., "turns": [first, follow-up], "reference"?: ...}.
    # The follow-up turn only makes sense after the model's own first answer, so it is not used.
    return [Prompt(str(rec["question_id"]), rec["turns"][0]) for rec in _jsonl(path)]


# The stub already ends with a newline, so the fence closes on its own line.
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n\n```python\n{prompt}```"


def _humaneval(path: Path) -> list[Prompt]:
    # Each line: {"task_id": "HumanEval/0", "prompt": stub, "entry_point", "canonical_solution", "test"}.
    return [Prompt(rec["task_id"], HUMANEVAL_INSTRUCTION.format(prompt=rec["prompt"])) for rec in _jsonl(path)]


def _alpaca_eval(path: Path) -> list[Prompt]:
    # One JSON list of {"instruction", "output", "generator", "dataset", "datasplit"}; the
    # records carry no id, so the position in the list is the id.
    records = json.loads(_read_text(path))
    if not isinstance(records, list):
        raise ValueError(f"expected a JSON list, got {type(records).__name__}")
    return [Prompt(str(i), rec["instruction"]) for i, rec in enumerate(records)]


FORMATS: dict[str, Callable[[Path], list[Prompt]]] = {
    "mt_bench": _mt_bench,
    "humaneval": _humaneval,
    "alpaca_eval": _alpaca_eval,
}


def load_prompts(cfg: DatasetConfig) -> list[Prompt]:
    """The first ``cfg.num_prompts`` prompts of the set (all of them for -1), in file order."""
    read = FORMATS.get(cfg.format)
    if read is None:
        raise ConfigError("dataset.format", cfg.format, f"valid: {', '.join(FORMATS)}")
    if cfg.num_prompts == 0 or cfg.num_prompts < -1:
        raise ConfigError("dataset.num_prompts", cfg.num_prompts, "must be >= 1, or -1 for all")
    path = fetch(cfg.source, cfg.sha256)
    if not path.is_file():
        raise ConfigError("dataset.source", path, "no such file")
    try:
        prompts = read(path)
    except (ValueError, KeyError, IndexError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ConfigError("dataset.source", cfg.source, f"not a {cfg.format} file: {type(e).__name__}: {e}") from e
    if not prompts:
        raise ConfigError("dataset.source", cfg.source, f"no prompts in {path}")
    return prompts if cfg.num_prompts == -1 else prompts[: cfg.num_prompts]


def encode_prompts(prompts: list[Prompt], tokenizer: Any) -> list[torch.Tensor]:
    """Token ids for each prompt: B x [T_b] int64, ready to be the start of a DraftState history.

    With a chat template, each prompt becomes one user message followed by the assistant
    header (add_generation_prompt). The template is rendered to text and then encoded without
    special tokens, because templates write their own BOS, and because transformers 5 returns a
    BatchEncoding rather than a list from apply_chat_template(tokenize=True).
    """
    chat = getattr(tokenizer, "chat_template", None) is not None
    out = []
    for p in prompts:
        if chat:
            messages = [{"role": "user", "content": p.text}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False).input_ids
        else:
            ids = tokenizer(p.text).input_ids
        if len(ids) == 0:
            raise ValueError(f"prompt {p.id!r}: encodes to no tokens")
        out.append(torch.tensor(ids, dtype=torch.int64))
    return out


CONF = Path(__file__).resolve().parent.parent / "conf" / "dataset"


def main(argv: list[str]) -> int:
    """python -m specbench.datasets [NAME ...]: fetch the prompt sets of conf/dataset (every
    one, or those named) into the cache ($SPECBENCH_CACHE), a line each. For a host with no
    registry: fill a cache elsewhere and carry it (experiments/carry_datasets.sh), or check that
    one is there before a sweep (experiments/runner_suite.sh). One line and status 2 for a set
    that cannot be fetched."""
    import sys

    import yaml

    from specbench.fetch import FetchError

    for name in argv or sorted(p.stem for p in CONF.glob("*.yaml")):
        path = CONF / f"{name}.yaml"
        if not path.is_file():
            print(f"dataset={name}: no conf/dataset/{name}.yaml", file=sys.stderr)
            return 2
        cfg = yaml.safe_load(path.read_text())
        try:
            print(name, fetch(cfg["source"], cfg.get("sha256")))
        except FetchError as e:
            print(f"dataset={name}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
