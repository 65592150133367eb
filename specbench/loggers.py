"""Where rows go besides results_dir: nowhere (default), a CSV view, or Weights & Biases.

A logger is imported only when selected: wandb is an optional extra."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from omegaconf import DictConfig

from specbench.config import ConfigError, to_container
from specbench.results import atomic_write

LOGGERS = ("none", "csv", "wandb")


def check(cfg: DictConfig) -> None:
    """Before any work: the logger exists and its package is installed."""
    name = cfg.logger.name
    if name not in LOGGERS:
        raise ConfigError("logger", name, f"valid loggers: {', '.join(LOGGERS)}")
    if name == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger", name, "needs the wandb package: pip install -e '.[wandb]'")


def log_rows(cfg: DictConfig, rows: list) -> None:
    name = cfg.logger.name
    if name == "csv":
        from specbench.analysis import load_results

        atomic_write(Path(cfg.results_dir) / "results.csv", load_results(cfg.results_dir).to_csv(index=False))
    elif name == "wandb":
        _wandb(cfg, rows)


def _scalar(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _wandb(cfg: DictConfig, rows: list) -> None:
    import wandb

    lg = cfg.logger
    run = wandb.init(
        project=lg.project, entity=lg.entity, mode=lg.mode, tags=list(lg.tags),
        dir=lg.dir or os.path.join(cfg.results_dir, "wandb"), name=rows[0]["run_id"],
        config=to_container(cfg), reinit=True,
    )
    try:
        for row in rows:
            run.log({key: value for key, value in row.items() if _scalar(value)})
        run.summary.update({key: value for key, value in rows[0].items() if isinstance(value, str)})
    finally:
        run.finish()
