"""python -m specbench [+drafter=NAME] [+rule=NAME] [key=value ...] [-m key=a,b,c]"""

import re
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


def check_overrides(argv: list) -> None:
    """A value of the wrong type, or a key the config does not have: one line naming the override
    and why, exit 2, before any job starts (Hydra's message spans several lines, and in a sweep
    it comes when the job that has the bad value starts). Each value of a sweep is composed in
    turn. Command lines with other flags than -m are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, HydraException

    args = [a for a in argv if a not in ("-m", "--multirun")]
    if any(a.startswith("-") for a in args):
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return  # a syntax error: Hydra's message shows where
    # [(the override as given, the command line to compose)]: the first values, then each sweep value
    first = [f"{a.partition('=')[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else a
             for a, o in zip(args, overrides)]
    lines = [(None, first)]
    for i, (a, o) in enumerate(zip(args, overrides)):
        if o.is_sweep_override():
            lines += [(f"{a.partition('=')[0]}={v}", first[:i] + [f"{a.partition('=')[0]}={v}"] + first[i + 1:])
                      for v in list(o.sweep_string_iterator())[1:]]
    for given, line in lines:
        try:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                compose("config", overrides=[x for x in line if not x.lstrip("+~").startswith("hydra")])
        except ConfigCompositionException as e:
            print(f"error: {given or _culprit(str(e), line)}: {str(e.__cause__ or e).splitlines()[0]}", file=sys.stderr)
            sys.exit(2)
        except HydraException:
            return  # not a value or key error: Hydra reports it


def _culprit(message: str, line: list) -> str:
    """The override a composition error names: "Error merging override KEY=VALUE", or "Could not
    override 'KEY'" (a key the config lacks)."""
    if merging := re.search(r"Error merging override (\S+)", message):
        return merging.group(1)
    if missing := re.search(r"Could not override '([^']+)'", message):
        return next((x for x in line if x.lstrip("+~").partition("=")[0] == missing.group(1)), missing.group(1))
    return message.splitlines()[0]


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
    check_overrides(sys.argv[1:])
    main()
