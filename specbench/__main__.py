"""python -m specbench [+drafter=NAME] [+rule=NAME] [key=value ...] [-m key=a,b,c]"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from specbench.config import register
from specbench.report import table
from specbench import tasks
from specbench.run import run_and_record

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("target", "drafter", "rule", "tree", "dataset", "experiment", "logger")
TASKS = {"decode": None, "toy_rules": tasks.toy_rules, "real_rules": tasks.real_rules}


def check_group_choices(argv: list) -> None:
    """An unknown option of a config group: one line listing the valid ones, exit 2 (Hydra's own
    message for this spans several lines and a stack of search paths)."""
    for arg in argv:
        key, eq, value = arg.lstrip("+~").partition("=")
        if not eq or key not in GROUPS:
            continue
        valid = sorted(p.stem for p in (CONF / key).glob("*.yaml"))
        for choice in value.split(","):
            if choice and choice != "null" and choice not in valid:
                print(f"error: {key}={choice}: unknown {key}; valid: {', '.join(valid)}", file=sys.stderr)
                sys.exit(2)


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> list:
    rows = run_and_record(cfg, TASKS.get(cfg.task))
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return rows  # the sweep goes on; SweepSummary reports failures at its end
    if rows[0]["status"] != "ok":
        print(f"error: {rows[0]['error']}", file=sys.stderr)
        sys.exit(2)
    if cfg.task == "decode":
        print("\n" + table(rows), flush=True)
    return rows


def flags_first(argv: list) -> list:
    """Move -m/--multirun before the overrides: argparse refuses overrides on both sides of a
    flag, and `python -m specbench +drafter=ngram -m k=2,4,8` is how people type a sweep."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags]


if __name__ == "__main__":
    sys.argv[1:] = flags_first(sys.argv[1:])
    check_group_choices(sys.argv[1:])
    register()
    main()
