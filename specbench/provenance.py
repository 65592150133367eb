"""Where a number came from: device, library versions, git commit."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parent.parent


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"cpu: {model} x{torch.get_num_threads()} threads"


def git_sha() -> str | None:
    """HEAD of the specbench checkout; where tracked files have uncommitted changes, "-dirty-"
    and 8 hex digits of the changes' hash, so that two different edits of one commit are two
    codes (the SHA keys the cached baselines and the resumed rows). Untracked files are left out.
    A copy whose .git is missing or stale passes it in SPECBENCH_GIT_SHA: the device tool's GPU
    host kept the .git of the session's first commit and showed later commits as uncommitted
    changes ("9305401...-dirty" in results/2026-12-04-h200-afternoon)."""
    if os.environ.get("SPECBENCH_GIT_SHA"):
        return os.environ["SPECBENCH_GIT_SHA"]

    def git(*args):
        return subprocess.run(["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        if not dirty:
            return head.stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=_REPO, capture_output=True, timeout=30).stdout
        return f"{head.stdout.strip()}-dirty-{hashlib.sha256(diff).hexdigest()[:8]}"
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    import transformers

    return {"torch_version": torch.__version__, "transformers_version": transformers.__version__}
