"""Triton kernels, each beside its torch reference (installed as specbench.kernels).

    chain.py   chain rejection sampling: standard, onehot, target_only, thresholded, greedy
    tree.py    SGLang's target-only tree walk, with its thresholds, and greedy
    ngram.py   prompt lookup over a batch of histories (reference: specbench.drafters.ngram)
    vocab.py   what the verification kernels share: Gumbel-max over a vocabulary row in tiles
    gemv.py    skinny matrix products for decode (engines/native.py)

Rules and the n-gram drafter run them with impl=triton (rule.impl, drafter.impl); the default
impl=torch runs specbench.rules / specbench.drafters unchanged. Only impl=triton needs the
triton package. On CPU tensors the kernels run in Triton's interpreter, which TRITON_INTERPRET=1
selects when set before triton is first imported (specbench.kernels.vocab).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _hand_over() -> None:
    """Imported as a top-level `kernels`, this directory is only on sys.path because the
    repository root is (python -m from the root puts the working directory first), and it
    shadows the Hugging Face `kernels` package, which transformers (5.25 on) requires and
    imports. Put that package under the name instead: the import statement returns whatever
    sys.modules holds when this file finishes. Without it this module stays (no __version__:
    transformers' probe, which imports it, then takes the hub package as absent)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
    spec = importlib.machinery.PathFinder.find_spec("kernels", path)
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)


if __name__ == "kernels":
    _hand_over()


def load(name: str, device: torch.device, key: str):
    """The kernel module `name` for tensors on `device`; a one-line ConfigError naming the config
    `key` (rule.impl, drafter.impl) when triton is missing or cannot run there."""
    from specbench.config import ConfigError

    try:
        module = importlib.import_module(f"specbench.kernels.{name}")
    except ImportError as e:
        raise ConfigError(key, "triton", f"needs the triton package ({e}); pip install triton (Linux)") from None
    if device.type != "cuda" and not module.INTERPRETED:
        raise ConfigError(
            key, "triton",
            f"tensors on {device.type}: the kernels compile for CUDA; on CPU set TRITON_INTERPRET=1 "
            "before triton is imported (Triton's interpreter)",
        )
    return module
